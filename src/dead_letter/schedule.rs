//! The second tier of retries: a request that used up its attempts in the process is deferred
//! to the [`Scheduler`](crate::resend::Scheduler) on a slower schedule before it is dead.

use std::fmt;
use std::time::{Duration, SystemTime};

use rand::Rng;

use crate::failure::{Class, Failure, Sent};
use crate::request::Replay;
use crate::retry::{Attempts, GiveUp};
use crate::store::Status;

/// The delays of the second tier, per class: how long after its in-process attempts were used up
/// a request is re-sent by the [`Scheduler`](crate::resend::Scheduler), re-send after re-send,
/// before it becomes a dead letter.
///
/// Retries come in two tiers. The [`RetryLayer`](crate::retry::RetryLayer) tries a request a
/// few times within the process, milliseconds to seconds apart; when those attempts are used up
/// ([`GiveUp::AttemptsExhausted`], or [`GiveUp::BudgetExhausted`] when the retry budget ran
/// dry), a [`DeadLetterLayer`](super::DeadLetterLayer) with a schedule stores the request
/// **deferred** instead of dead, due after the schedule's first delay; the scheduler re-sends it
/// then, through the same stack, and if that pass fails the same way it is deferred by the
/// second delay, and so on. When the class's delays are used up the request is a dead letter.
/// A blip of a second (a refused port in the moment before the breaker opens, a deploy of the
/// provider) then costs a re-send a few seconds later, not a person re-driving by hand.
///
/// [`new`](Self::new) is the default: the seed design of a mail pipeline's retry queue ("retry in
/// 5 s, 1 min, 15 min, then the dead-letter queue"):
///
/// | Class | Delays after the in-process attempts |
/// |---|---|
/// | [`Class::TRANSIENT`] | 5 s, 1 min, 15 min |
/// | [`Class::THROTTLED`] | 5 s, 1 min, 15 min, or the server's hint (`Retry-After`) when longer |
/// | [`Class::UNKNOWN`] | 1 min (once: an unknown failure is as often a bug that fails every time) |
/// | [`Class::PERMANENT`], [`Class::POISON`] | never: they fail again whenever they are sent |
/// | [`Class::OUTCOME_UNKNOWN`] | never: the request may have been acted on |
/// | [`Class::CIRCUIT_OPEN`] | not concerned: a rejection is deferred to the half-open time anyway |
/// | any class of your own | never, unless you set it with [`class`](Self::class) |
///
/// Each delay gets up to 25 % more, at random (jitter, as the seed's
/// `delay + random(0, delay / 4)`), so that the requests of one outage do not all come due at
/// once; the scheduler's rate and its pacing by breaker spread them further.
///
/// A request is deferred this way only if it can be sent again: its copy was kept (not a
/// streaming body), and it is safe to send twice ([`Replay::retry_safe`]: an idempotent method or
/// an `Idempotency-Key`) or its last attempt certainly did not reach the provider
/// ([`Sent::No`]). The pass is counted by the record's re-sends
/// ([`Record::resends`](crate::store::Record::resends)): the first failure uses the first
/// delay, the failure of the first re-send the second, and so on; a re-drive on purpose of a
/// dead letter that fails again stays dead. The scheduler's
/// [`max_resends`](crate::resend::Scheduler::max_resends) (5 by default) still bounds the
/// re-sends of a record, whatever deferred it.
///
/// [`BackstopLayer`](crate::BackstopLayer) turns the default schedule on when it is given a
/// dead-letter layer whose schedule was not chosen; a bare
/// [`DeadLetterLayer`](super::DeadLetterLayer) has none ([`none`](Self::none)) unless you set it
/// with [`retry_schedule`](super::DeadLetterLayer::retry_schedule), because a deferred record
/// waits for a [`Scheduler`](crate::resend::Scheduler): run one over the same store.
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::Class;
/// use tower_backstop::dead_letter::RetrySchedule;
///
/// let schedule = RetrySchedule::new()
///     .class(Class::TRANSIENT, [Duration::from_secs(30), Duration::from_secs(600)])
///     .class(Class::UNKNOWN, []);
/// assert_eq!(schedule.delays(Class::TRANSIENT).len(), 2);
/// assert!(schedule.delays(Class::UNKNOWN).is_empty());
/// assert!(RetrySchedule::none().delays(Class::TRANSIENT).is_empty());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    classes: Vec<(Class, Vec<Duration>)>,
}

impl RetrySchedule {
    /// The default schedule (the table above): transient and throttled 5 s, 1 min, 15 min;
    /// unknown 1 min; no other class.
    pub fn new() -> Self {
        let steps = vec![
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(15 * 60),
        ];
        RetrySchedule {
            classes: vec![
                (Class::TRANSIENT, steps.clone()),
                (Class::THROTTLED, steps),
                (Class::UNKNOWN, vec![Duration::from_secs(60)]),
            ],
        }
    }

    /// No second tier: a request that used up its in-process attempts is a dead letter at once.
    pub fn none() -> Self {
        RetrySchedule {
            classes: Vec::new(),
        }
    }

    /// The delays for `class`, replacing those it had: after the in-process attempts, the first
    /// delay; after the first re-send, the second; and so on; none left: dead. An empty list
    /// means never. Delays for [`Class::PERMANENT`], [`Class::POISON`],
    /// [`Class::OUTCOME_UNKNOWN`] or [`Class::CIRCUIT_OPEN`] are kept but never used: those
    /// classes are never deferred by the schedule (see the table above).
    pub fn class(mut self, class: Class, delays: impl IntoIterator<Item = Duration>) -> Self {
        let delays: Vec<Duration> = delays.into_iter().collect();
        match self.classes.iter_mut().find(|(c, _)| *c == class) {
            Some((_, old)) => *old = delays,
            None => self.classes.push((class, delays)),
        }
        self
    }

    /// The delays for `class`, before jitter; empty when it is never deferred this way.
    pub fn delays(&self, class: Class) -> &[Duration] {
        self.classes
            .iter()
            .find(|(c, _)| *c == class)
            .map_or(&[], |(_, d)| d.as_slice())
    }

    /// Whether no class is deferred.
    pub(crate) fn is_none(&self) -> bool {
        self.classes.iter().all(|(_, d)| d.is_empty())
    }

    /// The delay for `class` on pass `pass` (0: the first failure), before jitter.
    fn step(&self, class: Class, pass: u32) -> Option<Duration> {
        if [
            Class::PERMANENT,
            Class::POISON,
            Class::OUTCOME_UNKNOWN,
            Class::CIRCUIT_OPEN,
        ]
        .contains(&class)
        {
            return None;
        }
        let index = usize::try_from(pass).ok()?;
        self.delays(class).get(index).copied()
    }
}

impl Default for RetrySchedule {
    /// [`RetrySchedule::new`].
    fn default() -> Self {
        RetrySchedule::new()
    }
}

impl fmt::Debug for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.classes.iter().map(|(c, d)| (c.name(), d)))
            .finish()
    }
}

/// Where a failure stands in the second tier: outside any re-send (`Fresh`), in the scheduler's
/// re-send number `n` of a deferred record, or in a re-drive of a dead letter (never deferred by
/// the schedule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Fresh,
    Resend(u32),
    Redrive,
}

impl Pass {
    /// The pass of the call running on this task: from the re-send it runs under, if any, and
    /// that re-send's claim (whose fencing token is the record's re-send count).
    pub(super) fn current() -> Pass {
        match super::resending::status() {
            None => Pass::Fresh,
            Some(Status::Deferred) => {
                Pass::Resend(super::claim::current().map_or(u32::MAX, |lease| lease.token))
            }
            Some(_) => Pass::Redrive,
        }
    }
}

/// Defers `failure` by `schedule` when it used up its in-process attempts and `request` (its
/// kept copy) can be sent again: its [`Attempts`] note becomes [`GiveUp::Deferred`] with a
/// retry-at time, so that the record is written deferred and the caller reads the same.
#[cold]
pub(super) fn defer_exhausted<Req: Replay, R>(
    schedule: &RetrySchedule,
    request: Option<&Req>,
    failure: &mut Failure<R>,
    pass: Pass,
    now: SystemTime,
) {
    let Some(noted) = failure.note::<Attempts>() else {
        return;
    };
    if !matches!(
        noted.give_up(),
        GiveUp::AttemptsExhausted | GiveUp::BudgetExhausted
    ) {
        return;
    }
    let Some(request) = request else { return };
    if !request.retry_safe() && failure.sent() != Sent::No {
        return;
    }
    let pass = match pass {
        Pass::Fresh => 0,
        Pass::Resend(n) => n,
        Pass::Redrive => return,
    };
    let Some(step) = schedule.step(failure.class(), pass) else {
        return;
    };
    let jitter = step.mul_f64(rand::rng().random_range(0.0..=0.25));
    let mut delay = step.saturating_add(jitter);
    if failure.class() == Class::THROTTLED
        && let Some(hint) = failure.retry_after()
    {
        delay = delay.max(hint);
    }
    let mut deferred = Attempts::new(noted.count(), GiveUp::Deferred)
        .with_retry_at(crate::retry::retry_at(now, delay));
    if let Some(at) = noted.first_failed_at() {
        deferred = deferred.with_first_failed_at(at);
    }
    failure.notes_mut().insert(deferred);
}
