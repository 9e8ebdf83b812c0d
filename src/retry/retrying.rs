//! What a call that may be retried keeps between attempts (a clone of the service, the policy,
//! the counts, the failure path's record), and what the response future asks of it beside its
//! states: count a failure, set one aside while a hedged copy is out, send a hedged copy.

use std::future::Future;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tower_service::Service;

use super::hedge::{self, Ended, Hedges, Out};
use super::policy::{RetryPolicy, Spare};
use super::trace::Traced;
use crate::breaker::SendSlot;
use crate::failure::{Class, Code, Failure};
use crate::request::Replay;
use crate::status::{DelaySource, GiveUp};

/// What a call that may be retried keeps between attempts: built on the call, used on the
/// failure path only. Kept small: what only failures need is boxed on the first failure.
pub(super) struct Retrying<S, F, R> {
    pub(super) service: S,
    /// The layer's policy.
    pub(super) policy: RetryPolicy,
    pub(super) spare_state: Spare,
    /// Attempts sent, hedged copies included.
    pub(super) attempts: u32,
    history: Option<Box<History<F, R>>>,
}

/// The failure path's record, allocated on the first failure (or the first hedged copy).
struct History<F, R> {
    /// Attempts failed per class.
    failed: Vec<(Class, u32)>,
    first_failed_at: Option<SystemTime>,
    /// The last real failure, kept while the next attempt runs so the deadline can return it.
    last: Option<Failure<R>>,
    previous_delay: Option<Duration>,
    /// The last retry's delay and its source, from its scheduling until its attempt ends,
    /// for the listener's `Retried`.
    retry: PendingRetry,
    hedges: Hedges<F, R>,
    /// The place in its breaker's queue the next attempt waits with, looked at after each wait.
    slot: Option<SendSlot>,
    /// The time this call waited for its turn of a send rate so far.
    paced_for: Duration,
}

/// Where the last retry scheduled stands, for the listener's `Retried`: told once its attempt
/// went out and was not a breaker's rejection.
#[derive(Clone, Copy)]
enum PendingRetry {
    None,
    /// Scheduled: sleeping, or waiting for the service.
    Scheduled(Duration, DelaySource),
    /// Sent: its attempt is out.
    Out(Duration, DelaySource),
}

impl<F, R> History<F, R> {
    /// Counts a failure of `class`: the attempts failed with it, this one included.
    fn count(&mut self, class: Class) -> u32 {
        match self.failed.iter_mut().find(|(c, _)| *c == class) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.failed.push((class, 1));
                1
            }
        }
    }
}

impl<S, F, R> Retrying<S, F, R> {
    /// A call's state before its first attempt ends: one attempt sent, a copy held (`safe`:
    /// the request is safe to send twice).
    #[inline(always)]
    pub(super) fn new(service: S, policy: RetryPolicy, safe: bool) -> Self {
        Retrying {
            service,
            policy,
            spare_state: if safe { Spare::Ready } else { Spare::NotSafe },
            attempts: 1,
            history: None,
        }
    }

    /// The failure path's record, created at the first failure.
    fn history(&mut self) -> &mut History<F, R> {
        history_of(&mut self.history)
    }

    /// When the call's first attempt failed, if one did.
    pub(super) fn first_failed_at(&self) -> Option<SystemTime> {
        self.history.as_ref().and_then(|h| h.first_failed_at)
    }

    /// Counts a failure of `class`: the attempts failed with it (this one included) and the
    /// delay slept before this attempt, if any.
    pub(super) fn count(&mut self, class: Class) -> (u32, Option<Duration>) {
        let history = self.history();
        let class_failures = history.count(class);
        history.first_failed_at.get_or_insert_with(SystemTime::now);
        (class_failures, history.previous_delay)
    }

    /// Keeps `failure` as the last real one while another attempt is out.
    pub(super) fn keep_last(&mut self, failure: Failure<R>) {
        self.history().last = Some(failure);
    }

    /// A retry after `delay` (for `source`): `failure` is kept as the last real one while the
    /// call sleeps, and `delay` as the previous delay of the next decision.
    pub(super) fn retry_after(
        &mut self,
        mut failure: Failure<R>,
        delay: Duration,
        source: DelaySource,
    ) {
        let history = self.history();
        if matches!(
            source,
            DelaySource::SendRate | DelaySource::ConcurrencyLimit
        ) {
            // Held back until a slot: the slot is kept for the next attempt, and the last
            // real failure, if any, stays the last one; the wait is no backoff step.
            history.slot = failure.notes_mut().remove::<SendSlot>();
            history.last.get_or_insert(failure);
            history.retry = PendingRetry::Scheduled(delay, source);
            return;
        }
        // Answered throttled while the send rate is limited: its place at the front of the
        // queue, for after the delay.
        history.slot = failure.notes_mut().remove::<SendSlot>();
        history.last = Some(failure);
        history.previous_delay = Some(delay);
        history.retry = PendingRetry::Scheduled(delay, source);
    }

    /// The retry whose attempt is out (its delay and source), if the current attempt is one.
    #[inline]
    pub(super) fn retry_out(&self) -> Option<(Duration, DelaySource)> {
        match self.history.as_ref()?.retry {
            PendingRetry::Out(delay, source) => Some((delay, source)),
            _ => None,
        }
    }

    /// As [`retry_out`](Self::retry_out), and forgotten: its attempt ended.
    pub(super) fn take_retry_out(&mut self) -> Option<(Duration, DelaySource)> {
        let out = self.retry_out();
        if let Some(history) = self.history.as_deref_mut()
            && out.is_some()
        {
            history.retry = PendingRetry::None;
        }
        out
    }

    /// A call the breaker's send rate held back: not an attempt.
    pub(super) fn paced(&mut self) {
        self.attempts -= 1;
    }

    /// The time this call waited for its turn of a send rate so far.
    pub(super) fn paced_for(&self) -> Duration {
        self.history
            .as_ref()
            .map_or(Duration::ZERO, |h| h.paced_for)
    }

    /// Adds `wait` to the time this call waited for its turn.
    pub(super) fn add_paced(&mut self, wait: Duration) {
        let history = self.history();
        history.paced_for = history.paced_for.saturating_add(wait);
    }

    /// The send slot of the next attempt, taken out.
    pub(super) fn take_slot(&mut self) -> Option<SendSlot> {
        self.history.as_mut().and_then(|h| h.slot.take())
    }

    /// After a wait for a send slot: `None` when the turn came (or there is no slot), else the
    /// time until it comes, at the rate now, when that more still fits the policy's bound on
    /// waits for slots (beyond it, the call goes on, and the breaker's answer decides).
    pub(super) fn slot_wait(&mut self) -> Option<Duration> {
        let bound = self.policy.paced_bound();
        let history = self.history.as_deref_mut()?;
        let more = history.slot.as_mut()?.ready()?;
        let total = history.paced_for.saturating_add(more);
        (total <= bound).then(|| {
            history.paced_for = total;
            more
        })
    }

    /// The last real failure, taken out.
    pub(super) fn take_last(&mut self) -> Option<Failure<R>> {
        self.history.as_mut().and_then(|h| h.last.take())
    }

    /// The current attempt's number (`attempts` counts the hedged copies too).
    #[inline]
    pub(super) fn current(&self) -> u32 {
        self.history
            .as_ref()
            .and_then(|h| h.hedges.primary())
            .unwrap_or(self.attempts)
    }

    /// The next attempt is sent: it is the current one, and counts the copies from there.
    pub(super) fn next_attempt(&mut self) {
        self.attempts += 1;
        if let Some(history) = self.history.as_deref_mut() {
            history.hedges.next_primary();
            if let PendingRetry::Scheduled(delay, source) = history.retry {
                history.retry = PendingRetry::Out(delay, source);
            }
        }
    }

    /// Whether hedged copies are still out.
    #[inline]
    pub(super) fn hedges_out(&self) -> bool {
        self.history.as_ref().is_some_and(|h| h.hedges.out())
    }

    /// The hedging delay, when a copy may be sent beside the attempts out: hedging is on, the
    /// request is safe to send twice and copied (`spare`), and neither the copies nor the
    /// attempts are used up.
    #[inline]
    pub(super) fn hedge_delay(&self, spare: bool) -> Option<Duration> {
        let (delay, max_copies) = self.policy.hedging()?;
        let allowed = hedge::allowed(
            self.history.as_ref().map(|h| &h.hedges),
            self.spare_state == Spare::Ready && spare,
            self.attempts < self.policy.attempts(),
            max_copies,
        );
        allowed.then_some(delay)
    }

    /// Counts a failure of an attempt while another is still out. `Some` when it ends the call
    /// (gRFC A6's fatal status: a class never retried, a server that said not to retry).
    pub(super) fn set_aside(&mut self, failure: &Failure<R>) -> Option<GiveUp> {
        let class = failure.class();
        if failure.code() == Code::Paced {
            // Held back by the send rate: neither an attempt nor the provider's failure.
            self.paced();
            self.history().hedges.pushed_back(failure);
            return None;
        }
        if failure.code() == Code::CircuitOpen {
            // A rejection is not an attempt.
            self.attempts -= 1;
        } else if let Some(budget) = self.policy.budget_ref() {
            budget.failure();
        }
        self.count(class);
        self.history().hedges.pushed_back(failure);
        if failure.no_retry() {
            Some(GiveUp::ServerSaidNo)
        } else if self.policy.attempts_for(class).is_none() {
            Some(GiveUp::NotRetryable)
        } else {
            None
        }
    }

    /// Sends a hedged copy of `spare`: `Ready(true)` when sent, `Ready(false)` when hedging
    /// stops here (the budget, the service's readiness error, a copy that cannot be made),
    /// `Pending` while the service is not ready.
    #[cold]
    #[inline(never)]
    pub(super) fn send_hedge<Req>(
        &mut self,
        cx: &mut Context<'_>,
        spare: Option<&Req>,
        spans: &Traced,
        delay: Duration,
        deadline: Option<Instant>,
    ) -> Poll<bool>
    where
        S: Service<Req, Future = F, Response = R>,
        S::Error: Into<Failure<R>>,
        Req: Replay,
    {
        if let Err(e) = ready!(self.service.poll_ready(cx)) {
            let failure: Failure<R> = e.into();
            tracing::debug!(class = %failure.class(), "hedging stopped: the service is not ready");
            self.history().hedges.stop();
            return Poll::Ready(false);
        }
        let Some(mut request) = spare.and_then(Replay::replay) else {
            self.spare_state = Spare::NotReplayable;
            return Poll::Ready(false);
        };
        // As for a retry: the deadline read once, just before the call, and no copy sent with
        // less than `MIN_TIME_LEFT` (the call's deadline then ends it).
        let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left < MIN_TIME_LEFT) {
            return Poll::Ready(false);
        }
        if let Some(budget) = self.policy.budget_ref()
            && !budget.withdraw()
        {
            tracing::debug!("hedging stopped: retry budget exhausted");
            self.history().hedges.stop();
            return Poll::Ready(false);
        }
        write_time_left(&mut request, &self.policy, left);
        let primary = self.current();
        self.attempts += 1;
        let attempt = self.attempts;
        let span = spans.copy_span(&request, attempt);
        let started = self.policy.hook().attempt_start();
        let future = span.in_scope(|| self.service.call(request));
        let copy = Out::new(attempt, started, span);
        let hedges = &mut history_of(&mut self.history).hedges;
        hedges.sent(primary, copy, future, delay, self.policy.hook());
        Poll::Ready(true)
    }

    /// The first hedged copy that ended, taken out (see [`Hedges::poll`]).
    #[inline]
    pub(super) fn poll_hedges<E>(&mut self, cx: &mut Context<'_>) -> Option<Ended<R>>
    where
        F: Future<Output = Result<R, E>>,
        E: Into<Failure<R>>,
        R: 'static,
    {
        self.history.as_deref_mut()?.hedges.poll(cx)
    }
}

/// The failure path's record, created at the first failure.
fn history_of<F, R>(history: &mut Option<Box<History<F, R>>>) -> &mut History<F, R> {
    history.get_or_insert_with(|| {
        Box::new(History {
            failed: Vec::new(),
            first_failed_at: None,
            last: None,
            previous_delay: None,
            retry: PendingRetry::None,
            hedges: Hedges::new(),
            slot: None,
            paced_for: Duration::ZERO,
        })
    })
}

/// The least time left an attempt is started with under a deadline: one with less would end at
/// the deadline before a provider could answer (tokio's timers tick by the millisecond), so it
/// is not sent, and the call ends with the last real failure.
pub(super) const MIN_TIME_LEFT: Duration = Duration::from_millis(1);

/// Writes into `request` the time left for its attempt: the least of the deadline's `left`
/// (read on the clock just before the call) and the policy's per-attempt bound; nothing with
/// neither.
#[inline]
pub(super) fn write_time_left<Req: Replay>(
    request: &mut Req,
    policy: &RetryPolicy,
    left: Option<Duration>,
) {
    if let Some(left) = earlier(left, policy.attempt_bound()) {
        request.set_time_left(&policy.time_left(left));
    }
}

/// The smaller of two optional bounds.
#[inline]
pub(super) fn earlier(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
