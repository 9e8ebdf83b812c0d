//! The retry policy: a matrix of classes to attempt caps and delay rules, the server's hints, the
//! budget, the deadline and the idempotency rules.

use crate::request::TimeLeft;
use crate::request::replay::Encoded;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::backoff::Backoff;
use super::budget::Budget;
use super::reconcile::{Reconcile, ReconciledResponse, StatusCheck};
use crate::build_error::BuildError;
use crate::failure::{Class, Failure, Sent};
use crate::observe::{Hook, Listener};
use crate::status::{DelaySource, GiveUp};

/// How one class of failures is retried: a cap on the attempts that failed with that class, and
/// a delay rule. Built with [`ClassPolicy::retry`] or [`ClassPolicy::never`] and given to
/// [`RetryPolicy::class`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassPolicy {
    retried: bool,
    max_attempts: Option<u32>,
    backoff: Option<Backoff>,
    slow_down: bool,
}

impl ClassPolicy {
    /// Retried, within the policy's [`max_attempts`](RetryPolicy::max_attempts), with the
    /// policy's [`backoff`](RetryPolicy::backoff), until changed below.
    pub const fn retry() -> Self {
        ClassPolicy {
            retried: true,
            max_attempts: None,
            backoff: None,
            slow_down: false,
        }
    }

    /// Never retried: a failure of this class is returned at once (to the dead-letter layer,
    /// when there is one) with [`GiveUp::NotRetryable`].
    pub const fn never() -> Self {
        ClassPolicy {
            retried: false,
            max_attempts: None,
            backoff: None,
            slow_down: false,
        }
    }

    /// At most `attempts` attempts may fail with this class (a count of attempts, not of
    /// retries): after the `attempts`-th failure of this class the layer stops with
    /// [`GiveUp::AttemptsExhausted`]. Failures of other classes do not count. At least 1:
    /// [`RetryPolicy::build`] rejects 0.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// The delay rule for this class, instead of the policy's.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// When the server gives no hint, wait at least twice the previous delay (or the backoff's
    /// own delay, if longer), capped at the larger of the backoff's cap and the previous delay: a
    /// provider that asked us to slow down once is not hit sooner the next time. With a previous
    /// delay `p` and a backoff delay `b` (capped at `c`), the delay is
    /// `max(b, min(2 × p, max(c, p)))`, never less than `p`. On by default for
    /// [`Class::THROTTLED`] ("the server's delay first, then slower").
    pub fn slow_down(mut self, enabled: bool) -> Self {
        self.slow_down = enabled;
        self
    }

    /// Retried or never, keeping the other settings.
    #[cfg(feature = "serde")]
    pub(crate) fn set_retried(mut self, retried: bool) -> Self {
        self.retried = retried;
        self
    }
}

#[derive(Clone)]
struct Inner {
    max_attempts: u32,
    backoff: Backoff,
    max_delay: Duration,
    /// The longest server hint slept in process, when lower than `max_delay`.
    max_hint_delay: Option<Duration>,
    /// Whether the user chose `max_delay` or `max_hint_delay` (a preset's own bound then leaves
    /// them alone).
    delay_bounds_chosen: bool,
    /// Whether a delay above `max_delay` gives the request up rather than deferring it.
    give_up_long_delays: bool,
    breaker_wait: Duration,
    rules: Vec<(Class, ClassPolicy)>,
    budget: Option<Budget>,
    deadline: Option<Duration>,
    /// The per-attempt timeout below, for the time left written into each attempt, encoded.
    attempt_timeout: Option<Encoded>,
    /// The deadline's wire forms, for a first attempt that has all of it.
    deadline_encoded: Option<Encoded>,
    /// The HTTP header that carries the time left (`grpc-timeout` needs none).
    time_left_header: Option<http::HeaderName>,
    /// The hedging delay and the most extra copies.
    hedge: Option<(Duration, u32)>,
    retry_unprocessed: bool,
    assume_idempotent: bool,
    rng: Option<Arc<Mutex<SmallRng>>>,
    listener: Hook,
    reconcile: Option<Reconcile>,
}

/// What [`Retry`](super::Retry) does with each failure: which classes it retries, how many
/// attempts it makes (the first call counts as one), how long it waits, and within which
/// budget and deadline.
///
/// Defaults, from the field's practice (the AWS SDKs' standard mode, gRFC A6), per setting and
/// per class:
///
/// | setting | default |
/// |---|---|
/// | [`max_attempts`](Self::max_attempts) | 3 calls in all |
/// | [`backoff`](Self::backoff) | exponential from 100 ms, capped at 20 s, full jitter |
/// | [`max_delay`](Self::max_delay) | 60 s: the longest delay the layer sleeps in process |
/// | [`max_hint_delay`](Self::max_hint_delay) | none: server hints bounded by `max_delay` (in a [`BackstopLayer`](crate::BackstopLayer) with a dead-letter store: one per-attempt timeout) |
/// | [`give_up_long_delays`](Self::give_up_long_delays) | off: a delay above `max_delay` is deferred |
/// | [`budget`](Self::budget) | none |
/// | [`deadline`](Self::deadline) | none |
/// | [`retry_unprocessed`](Self::retry_unprocessed) | on |
/// | [`assume_idempotent`](Self::assume_idempotent) | off |
/// | [`wait_for_breaker`](Self::wait_for_breaker) | off: an open breaker's rejection comes back at once, deferred to the half-open instant |
/// | [`reconcile`](Self::reconcile) | none: an outcome-unknown failure is given up, [`Class::OUTCOME_UNKNOWN`] |
/// | retried classes | [`Class::TRANSIENT`] and [`Class::THROTTLED`] within `max_attempts` with the policy's backoff; throttled waits the server's delay first, then slower ([`ClassPolicy::slow_down`]) |
/// | [`Class::UNKNOWN`] | cautiously: at most 2 attempts failed with it (one retry), with the throttled class's slower backoff (see below) |
/// | [`Class::CIRCUIT_OPEN`] | not an attempt; deferred (see [`wait_for_breaker`](Self::wait_for_breaker)), at most 3 rejections waited per request when waiting is on |
/// | never retried | [`Class::PERMANENT`], [`Class::POISON`], [`Class::OUTCOME_UNKNOWN`], and any class the policy does not name |
///
/// # Counting attempts
///
/// Two caps apply, and the first reached ends the series:
///
/// - [`max_attempts`](Self::max_attempts) caps the **calls** this layer makes to the service
///   below it for one request, whatever their outcome: with `max_attempts(4)` a service that
///   always fails is called exactly 4 times. A breaker rejection below the layer does not count
///   toward it: the request never left (see [`wait_for_breaker`](Self::wait_for_breaker)).
/// - A class's [`ClassPolicy::max_attempts`] caps the attempts that **failed with that class**.
///   With `max_attempts(8)`, `class(Class::TRANSIENT, ClassPolicy::retry().max_attempts(4))` and
///   `wait_for_breaker` on, a request that sees two [`Class::CIRCUIT_OPEN`] rejections and then
///   only 503s reaches the provider 4 times: the rejections eat into neither cap.
///
/// A request the scheduler sends again ([`Scheduler`](crate::resend::Scheduler)) starts a
/// new series: `max_attempts` counts the calls of one pass, and the scheduler's
/// `max_resends` bounds the passes.
///
/// # Delays
///
/// The delay is the server's hint when it gave one, never shortened by jitter; else the class's [`Backoff`], computed from the number of attempts that failed with that
/// class. A delay above [`max_delay`](Self::max_delay) is never slept: the request is deferred
/// or given up ([`give_up_long_delays`](Self::give_up_long_delays)).
///
/// # Why `unknown` is cautious
///
/// An [`Class::UNKNOWN`] failure (HTTP 500, an unmapped code, gRPC `UNKNOWN` or `INTERNAL`)
/// says nothing about whether trying again helps: it is as often a bug that fails every time
/// (a payload the provider cannot handle) as a passing fault, so it is retried a few times,
/// cautiously: the default is one retry (2 attempts failed with it, a count of
/// attempts, not retries) and [`ClassPolicy::slow_down`], the throttled class's rule: after
/// an earlier delay, wait twice that long (within the backoff's cap, and never less than the
/// earlier delay). A request that keeps failing with 500 is then handed to the dead-letter
/// layer after 2 calls instead of 3, and a provider that crashes on it is hit once more, not
/// twice. Give it more with
/// `retry_at_most(Class::UNKNOWN, n)` (which keeps the slow-down).
///
/// # Safety to resend
///
/// A request that is not [`retry_safe`](crate::Replay::retry_safe) (a POST without an
/// `Idempotency-Key`) is retried only after a failure that proves it was not processed (see
/// [`retry_unprocessed`](Self::retry_unprocessed)). A timeout or a connection reset after such a
/// request is reclassified [`Class::OUTCOME_UNKNOWN`] and never retried, unless a status check
/// set with [`reconcile`](Self::reconcile) settles it first.
///
/// The policy is built once and shared by clones behind an `Arc`; deciding allocates nothing on
/// the success path. [`build`](Self::build) checks it and makes the
/// [`RetryLayer`](super::RetryLayer): settings that cannot work are an error there, never at call
/// time.
#[derive(Clone)]
pub struct RetryPolicy {
    inner: Arc<Inner>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            inner: Arc::new(Inner {
                max_attempts: 3,
                backoff: Backoff::default(),
                max_delay: Duration::from_secs(60),
                max_hint_delay: None,
                delay_bounds_chosen: false,
                give_up_long_delays: false,
                breaker_wait: Duration::ZERO,
                rules: vec![
                    (Class::TRANSIENT, ClassPolicy::retry()),
                    (Class::THROTTLED, ClassPolicy::retry().slow_down(true)),
                    (
                        Class::UNKNOWN,
                        ClassPolicy::retry().max_attempts(2).slow_down(true),
                    ),
                    (Class::CIRCUIT_OPEN, ClassPolicy::retry().max_attempts(3)),
                    (Class::PERMANENT, ClassPolicy::never()),
                    (Class::POISON, ClassPolicy::never()),
                    (Class::OUTCOME_UNKNOWN, ClassPolicy::never()),
                ],
                budget: None,
                deadline: None,
                attempt_timeout: None,
                deadline_encoded: None,
                time_left_header: None,
                hedge: None,
                retry_unprocessed: true,
                assume_idempotent: false,
                rng: None,
                listener: Hook::default(),
                reconcile: None,
            }),
        }
    }
}

/// The most hedged copies of a call (gRFC A6 caps an RPC at 5 attempts): the retry future keeps
/// this many slots.
pub(crate) const MAX_COPIES: usize = 4;

pub(crate) enum Decision {
    Retry(Duration, DelaySource),
    Defer(SystemTime, Duration),
    Stop(GiveUp),
}

/// Whether the retry future holds a copy of the request for another attempt, and whether the
/// request is safe to send twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spare {
    /// A copy is held; the request is idempotent or keyed.
    Ready,
    /// A copy is held; the request is not safe to send twice.
    NotSafe,
    /// The request could not be copied.
    NotReplayable,
}

/// What the retry future knows when it asks for a decision.
pub(crate) struct Attempted {
    /// Calls made so far, the failed one included.
    pub(crate) attempts: u32,
    /// Attempts that failed with the failure's class, this one included.
    pub(crate) class_failures: u32,
    pub(crate) spare: Spare,
    pub(crate) previous_delay: Option<Duration>,
}

impl RetryPolicy {
    /// The default policy (see the table above).
    pub fn new() -> Self {
        RetryPolicy::default()
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::make_mut(&mut self.inner));
        self
    }

    /// The most calls for one request, the first included (a count of attempts, not retries),
    /// whatever the classes of their failures. 1 means never retry; [`build`](Self::build)
    /// rejects 0.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.edit(|p| p.max_attempts = attempts)
    }

    /// The delay rule for classes that have none of their own.
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.edit(|p| p.backoff = backoff)
    }

    /// The longest delay (server hint or backoff) the layer sleeps in process. A longer one is
    /// not slept: see [`give_up_long_delays`](Self::give_up_long_delays). Default 60 s.
    pub fn max_delay(self, max_delay: Duration) -> Self {
        self.edit(|p| {
            p.max_delay = max_delay;
            p.delay_bounds_chosen = true;
        })
    }

    /// The longest **server hint** (`Retry-After`, a rate-limit reset, `grpc-retry-pushback-ms`)
    /// the layer sleeps in process; a longer hint is not slept but handled as a delay above
    /// [`max_delay`](Self::max_delay) (deferred by default, see
    /// [`give_up_long_delays`](Self::give_up_long_delays)). Backoff delays are not affected, so
    /// [`max_attempts`](Self::max_attempts) still caps the calls of one pass. Default: none
    /// (hints are bounded by `max_delay` alone); in a [`BackstopLayer`](crate::BackstopLayer)
    /// with a dead-letter store, one per-attempt timeout unless this or `max_delay` is set.
    ///
    /// With a dead-letter store above the layer and its
    /// [`Scheduler`](crate::resend::Scheduler) running, a short bound is the better choice:
    /// the request is kept in the store, deferred to the instant the server named (never
    /// earlier), and sent again then, while the caller's slot (a worker, a place in a
    /// concurrency limit) goes on to the next request instead of sitting idle through the wait.
    /// In the soak (`examples/soak.rs`, the README's soak table) a bound of one per-attempt
    /// timeout (500 ms) deferred the messages answered `503` with `Retry-After: 1` instead of
    /// holding a caller for each second, and every message was settled sooner. Without a store a
    /// deferred request is a failure the caller handles, so leave it unset there.
    pub fn max_hint_delay(self, max: Duration) -> Self {
        self.edit(|p| {
            p.max_hint_delay = Some(max);
            p.delay_bounds_chosen = true;
        })
    }

    /// Bounds server hints slept in process by `bound` unless [`max_delay`](Self::max_delay) or
    /// [`max_hint_delay`](Self::max_hint_delay) was chosen: the rule of a
    /// [`BackstopLayer`](crate::BackstopLayer) with a dead-letter store.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn max_hint_delay_unless_chosen(self, bound: Duration) -> Self {
        if self.inner.delay_bounds_chosen {
            return self;
        }
        self.edit(|p| p.max_hint_delay = Some(bound))
    }

    /// The bound on server hints slept in process, if any (see
    /// [`max_hint_delay`](Self::max_hint_delay)).
    fn hint_limit(&self) -> Option<Duration> {
        self.inner.max_hint_delay
    }

    /// Lets the layer wait in process for an open breaker below it, when the breaker half-opens
    /// within `max` (a [`Duration`]; keep it small, such as 1 or 2 s). Off by default
    /// ([`Duration::ZERO`]): a rejection comes back at once.
    ///
    /// A breaker rejection ([`Class::CIRCUIT_OPEN`]) is not an attempt: the request never left.
    /// By default it is returned at once, marked [`GiveUp::Deferred`] with
    /// [`Attempts::retry_at`](super::Attempts::retry_at) at the instant the breaker half-opens (rounded up to the millisecond), so
    /// that a [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) keeps it as a deferred
    /// record and its [`Scheduler`](crate::resend::Scheduler) sends it again then; a
    /// [`FailoverLayer`](crate::failover::FailoverLayer) below this layer takes the call instead
    /// and never rejects. Sleeping out an open period in process is what makes callers pile up
    /// behind an outage and wake together; an open breaker is there to fail fast.
    ///
    /// With `wait_for_breaker(max)`, a rejection whose time left is at most `max` is waited out
    /// in process (spread by up to +25 %, within `max`, so that the callers it rejected do not
    /// wake together), then the call is made again; a longer one is deferred as above (or given
    /// up under [`give_up_long_delays`](Self::give_up_long_delays)). The rejections waited per request are capped by the
    /// class's attempts ([`ClassPolicy::max_attempts`] of [`Class::CIRCUIT_OPEN`], 3 by default).
    /// A rejection that says nothing of when the breaker half-opens (forced open by an operator)
    /// is never waited: the request stops with [`GiveUp::NotRetryable`].
    pub fn wait_for_breaker(self, max: Duration) -> Self {
        self.edit(|p| p.breaker_wait = max)
    }

    /// Gives a request up when the delay before its next attempt is above
    /// [`max_delay`](Self::max_delay), the longest the layer waits in process: the failure is
    /// returned at once, marked [`GiveUp::HintTooLong`], and the request is over.
    ///
    /// Off by default: such a request is deferred, that is, returned at once marked
    /// [`GiveUp::Deferred`], with [`Attempts::retry_at`](super::Attempts::retry_at) set to when
    /// to send it again; a dead-letter store keeps it with that retry-at time for its scheduler.
    pub fn give_up_long_delays(self) -> Self {
        self.edit(|p| p.give_up_long_delays = true)
    }

    /// How failures of `class` are retried, replacing any earlier setting for it. For example a
    /// soft bounce retried after 15 min, 1 h and 6 h (deferred, since those are above
    /// [`max_delay`](Self::max_delay)), or a rendering failure never retried.
    pub fn class(self, class: Class, policy: ClassPolicy) -> Self {
        self.edit(|p| {
            p.rules.retain(|(c, _)| *c != class);
            p.rules.push((class, policy));
        })
    }

    /// Retries failures of `class`, within [`max_attempts`](Self::max_attempts); a class already
    /// retried keeps its settings.
    pub fn retry(self, class: Class) -> Self {
        if self.rule(class).is_some() {
            return self;
        }
        self.class(class, ClassPolicy::retry())
    }

    /// Retries failures of `class` until `attempts` attempts have failed with that class (see
    /// [`ClassPolicy::max_attempts`]), never beyond [`max_attempts`](Self::max_attempts) calls.
    /// The class keeps its other settings (delay rule, slow-down).
    pub fn retry_at_most(self, class: Class, attempts: u32) -> Self {
        let rule = self.rule(class).cloned().unwrap_or(ClassPolicy::retry());
        self.class(class, rule.max_attempts(attempts))
    }

    /// Never retries failures of `class`.
    pub fn never_retry(self, class: Class) -> Self {
        self.class(class, ClassPolicy::never())
    }

    /// Changes the rule of `class` with `f`: the policy's rule for it (retried or not), or a
    /// retried class when it has none; `f`'s error, if it fails.
    #[cfg(feature = "serde")]
    pub(crate) fn try_edit_class<E>(
        self,
        class: Class,
        f: impl FnOnce(ClassPolicy) -> Result<ClassPolicy, E>,
    ) -> Result<Self, E> {
        let rule = self
            .inner
            .rules
            .iter()
            .find(|(c, _)| *c == class)
            .map_or(ClassPolicy::retry(), |(_, r)| r.clone());
        Ok(self.class(class, f(rule)?))
    }

    /// Whether a delay above the in-process bound gives the request up instead of deferring it.
    pub(crate) fn gives_up_long_delays(&self) -> bool {
        self.inner.give_up_long_delays
    }

    /// [`give_up_long_delays`](Self::give_up_long_delays), or back to deferring.
    #[cfg(feature = "serde")]
    pub(crate) fn set_give_up_long_delays(self, give_up: bool) -> Self {
        self.edit(|p| p.give_up_long_delays = give_up)
    }

    /// A retry budget shared by every clone of this policy (see [`Budget`]).
    pub fn budget(self, budget: Budget) -> Self {
        self.edit(|p| p.budget = Some(budget))
    }

    /// An overall deadline per request: no attempt starts and no delay is slept past it, and an
    /// attempt still running when it ends is dropped (so each attempt's timeout is the smaller
    /// of its own and the time remaining). The caller gets the last real failure, marked
    /// [`GiveUp::DeadlineExceeded`].
    ///
    /// The clock is read lazily: the deadline counts from the first attempt's first `Pending`
    /// (or its failure, when it fails without waiting), not from `call`. A first attempt that
    /// answers at its first poll never reads the clock; its synchronous first poll is not
    /// counted. A zero deadline lets only such an answer through: a first attempt that waits
    /// fails at once, with class [`Class::TRANSIENT`], code [`Code::Timeout`](crate::Code::Timeout) and a source that
    /// reads `retry deadline elapsed during the first attempt`; one that fails is not retried. A deadline too far to represent (`Duration::MAX`) is no deadline.
    pub fn deadline(self, deadline: Duration) -> Self {
        self.edit(|p| {
            p.deadline = Some(deadline);
            p.deadline_encoded = Some(Encoded::new(deadline));
        })
    }

    /// The per-attempt timeout of the [`TimeoutLayer`](crate::timeout::TimeoutLayer) below,
    /// so that the time left written into each attempt (gRPC's `grpc-timeout`, or the
    /// [`time_left_header`](Self::time_left_header)) is never above it: each attempt then
    /// carries the least of this, the [`deadline`](Self::deadline)'s time left and the caller's
    /// own value. It times nothing out itself. [`BackstopLayer`](crate::BackstopLayer) sets it
    /// to its own per-attempt timeout (the smaller of the two, when both are set).
    /// [`build`](Self::build) rejects zero.
    pub fn attempt_timeout(self, timeout: Duration) -> Self {
        self.edit(|p| p.attempt_timeout = Some(Encoded::new(timeout)))
    }

    /// Writes the time left (whole milliseconds, rounded down) into `header` of each HTTP
    /// attempt, and reads a value the caller put there as the caller's own deadline, never
    /// extended by a retry. Like Envoy's `x-envoy-expected-rq-timeout-ms`, for servers that
    /// stop work the caller has given up on. The time left is the least of the
    /// [`deadline`](Self::deadline)'s, the caller's and the
    /// [`attempt_timeout`](Self::attempt_timeout); with none of them, nothing is written.
    /// gRPC requests under `GrpcLayer` always carry `grpc-timeout` and need no header.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_backstop::retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default()
    ///     .deadline(Duration::from_secs(5))
    ///     .time_left_header(http::HeaderName::from_static("x-request-timeout-ms"));
    /// # policy.build().unwrap();
    /// ```
    pub fn time_left_header(self, header: http::HeaderName) -> Self {
        self.edit(|p| p.time_left_header = Some(header))
    }

    /// Hedging (gRFC A6's `hedgingPolicy`, tower's `Hedge`, Dean and Barroso's "The Tail at
    /// Scale"): when an attempt of a request that is safe to send twice (an idempotent method,
    /// or an `Idempotency-Key`) has not answered after `delay`, a copy is sent while the first
    /// is still out, and another after each further `delay`, at most `max_copies` copies in
    /// the call. The first success wins: the other attempts are cancelled (their futures
    /// dropped, so a breaker's permits go back).
    ///
    /// Each copy is an attempt (it counts toward [`max_attempts`](Self::max_attempts)) and
    /// withdraws from the [`budget`](Self::budget), which throttles hedges as it throttles
    /// retries. An attempt that fails while another is out is set aside: a class that is not
    /// retried, or a server that said not to retry, ends the call at once (A6's fatal status);
    /// a server's pushback (a `Retry-After` or `grpc-retry-pushback-ms` hint, a throttled
    /// class) stops further copies. When every attempt out has failed, the last failure goes
    /// through the retry rules as usual. A request that is not safe to send twice is never
    /// hedged. Off by default.
    ///
    /// `delay` must be above zero and below the [`deadline`](Self::deadline);
    /// `max_copies` within 1..=4 (A6 caps an RPC at 5 attempts): [`build`](Self::build)
    /// checks both.
    pub fn hedge(self, delay: Duration, max_copies: u32) -> Self {
        self.edit(|p| p.hedge = Some((delay, max_copies)))
    }

    /// Whether a request that is not safe to send twice (a POST without an `Idempotency-Key`) may
    /// still be retried after a failure that proves it was not processed
    /// ([`Failure::sent`] is [`Sent::No`](crate::Sent::No): by default a refused connection, an
    /// open breaker, a load-shed rejection, and HTTP 408, 425, 429 and 503, as the classifier
    /// decides; see [`HttpClassifier::not_sent_statuses`](crate::classify::HttpClassifier::not_sent_statuses)).
    /// Default on; it costs one copy of such requests per call.
    pub fn retry_unprocessed(self, enabled: bool) -> Self {
        self.edit(|p| p.retry_unprocessed = enabled)
    }

    /// Treats every request as safe to send twice, whatever its method and headers. For gRPC
    /// (every call is an HTTP POST; whether a method may be retried is the service config's
    /// business, gRFC A6) and for providers that deduplicate on their own. Default off.
    pub fn assume_idempotent(self, enabled: bool) -> Self {
        self.edit(|p| p.assume_idempotent = enabled)
    }

    /// Draws jitter from a random source seeded with `seed` and shared by clones, instead of the
    /// thread's: the delays become reproducible, for tests.
    pub fn rng_seed(self, seed: u64) -> Self {
        self.edit(|p| p.rng = Some(Arc::new(Mutex::new(SmallRng::seed_from_u64(seed)))))
    }

    /// Hands the retry layer's events to `listener`: every attempt's end
    /// ([`Event::AttemptEnded`], with its duration), every retry
    /// ([`Event::RetryScheduled`], with its delay and why), every timeout
    /// ([`Event::TimedOut`]) and the end of every call that failed ([`Event::GaveUp`], with
    /// why). See [`observe`](crate::observe). Without a listener (the default) the layer reads no
    /// clock for them and clones nothing; with one, each call clones one `Arc` and reads tokio's
    /// clock at each attempt's start and end.
    ///
    /// [`Event::AttemptEnded`]: crate::observe::Event::AttemptEnded
    /// [`Event::RetryScheduled`]: crate::observe::Event::RetryScheduled
    /// [`Event::TimedOut`]: crate::observe::Event::TimedOut
    /// [`Event::GaveUp`]: crate::observe::Event::GaveUp
    pub fn listener(self, listener: impl Listener) -> Self {
        let hook = Hook::new(listener);
        self.edit(|p| p.listener = hook)
    }

    /// The same listener as another layer's, for the preset.
    pub(crate) fn with_hook(self, hook: &Hook) -> Self {
        let hook = hook.clone();
        self.edit(|p| p.listener = hook)
    }

    /// Asks `check` about each outcome-unknown failure of a request that is not safe to send
    /// twice, before the retry layer decides what to do with it.
    ///
    /// A request that is not [`retry_safe`](crate::Replay::retry_safe) (a keyless POST) and
    /// that timed out or lost its connection after it was sent ([`Failure::sent`] is
    /// [`Sent::Maybe`]) may or may not have been acted on. The check (for example
    /// `GET /v1/messages/{id}`) decides:
    ///
    /// - [`Delivery::Delivered`](super::Delivery::Delivered): the call succeeds with a stand-in
    ///   response, `Res::reconciled(&envelope)` (for HTTP: `200 OK`, an empty body, and
    ///   [`Delivery::Delivered`](super::Delivery::Delivered) in the extensions); the request is not sent again.
    /// - [`Delivery::NotDelivered`](super::Delivery::NotDelivered): the failure is treated as
    ///   never sent ([`Failure::with_sent`] with [`Sent::No`]) and the policy's normal rules
    ///   apply: it is resent when [`retry_unprocessed`](Self::retry_unprocessed) is on and
    ///   attempts are left, else given up.
    /// - [`Delivery::Unknown`](super::Delivery::Unknown) (also when the check panics): as
    ///   without a check, the failure becomes [`Class::OUTCOME_UNKNOWN`] and is given up; a
    ///   dead-letter layer above records it, for a [`Reconciler`](crate::resend::Reconciler) to
    ///   settle later.
    ///
    /// `Req` and `Res` are the request and response types of the service the retry layer wraps:
    /// the policy is not generic, so the option names them once, and the retry layer matches
    /// them at run time (which is why its service needs `'static` request and response types).
    /// A retry layer whose service has other types never runs the check, and logs an error
    /// event for each failure it would have checked.
    ///
    /// The check is given the request's [`Envelope`](crate::Envelope), described from a copy
    /// ([`Replay`](crate::Replay); the copy and the boxed check are made on the failure path
    /// only), and runs within the attempt: the policy's [`deadline`](Self::deadline) bounds it,
    /// and a deadline that ends it returns the outcome-unknown failure. Safe requests, and
    /// failures whose request was surely sent or surely not, are not checked. The success path
    /// allocates nothing more: a request not safe to resend costs a counted reference, and a
    /// copy of it where the layer would keep none (its last attempt, or a request that cannot be
    /// retried).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_backstop::Envelope;
    /// use tower_backstop::retry::{Delivery, RetryPolicy};
    ///
    /// let layer = RetryPolicy::default()
    ///     .reconcile::<http::Request<Full<Bytes>>, http::Response<Full<Bytes>>>(
    ///         |_: Envelope| async {
    ///             // GET https://provider/v1/messages/{id}: 200 → delivered, 404 → not delivered.
    ///             Delivery::Unknown
    ///         },
    ///     )
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn reconcile<Req, Res>(self, check: impl StatusCheck) -> Self
    where
        Req: crate::request::Describe + Send + 'static,
        Res: ReconciledResponse + 'static,
    {
        let reconcile = Reconcile::new::<Req, Res>(Arc::new(check));
        self.edit(|p| p.reconcile = Some(reconcile))
    }

    /// The status check of [`reconcile`](Self::reconcile), if any.
    pub(crate) fn reconcile_ref(&self) -> Option<&Reconcile> {
        self.inner.reconcile.as_ref()
    }

    /// The overall cap on calls per request.
    pub fn attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// The cap on attempts failed with `class`, or `None` when the class is not retried.
    pub fn attempts_for(&self, class: Class) -> Option<u32> {
        let rule = self.rule(class)?;
        Some(
            rule.max_attempts
                .map_or(self.inner.max_attempts, |c| c.min(self.inner.max_attempts)),
        )
    }

    /// The delay rule used for failures of `class`.
    pub fn backoff_for(&self, class: Class) -> &Backoff {
        self.rule(class)
            .and_then(|r| r.backoff.as_ref())
            .unwrap_or(&self.inner.backoff)
    }

    fn rule(&self, class: Class) -> Option<&ClassPolicy> {
        self.inner
            .rules
            .iter()
            .find(|(c, _)| *c == class)
            .map(|(_, r)| r)
            .filter(|r| r.retried)
    }

    /// Checks the settings that cannot work together (see [`build`](Self::build)).
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let p = &*self.inner;
        if p.max_attempts == 0 {
            return Err(BuildError::new(
                "max_attempts",
                0,
                "a request needs at least 1 call (1 means never retry)",
            ));
        }
        if let Some(problem) = p.backoff.problem() {
            return Err(BuildError::new(
                "backoff",
                format_args!("{:?}", p.backoff),
                problem,
            ));
        }
        for (class, rule) in &p.rules {
            if rule.max_attempts == Some(0) {
                return Err(BuildError::new(
                    "ClassPolicy::max_attempts",
                    format_args!("0 for class `{class}`"),
                    "a retried class needs at least 1 attempt (use `never_retry` to retry it never)",
                ));
            }
            if let Some(backoff) = &rule.backoff
                && let Some(problem) = backoff.problem()
            {
                return Err(BuildError::new(
                    "ClassPolicy::backoff",
                    format_args!("{backoff:?} for class `{class}`"),
                    problem,
                ));
            }
        }
        if let Some(hint) = p.max_hint_delay
            && hint > p.max_delay
        {
            return Err(BuildError::new(
                "max_hint_delay",
                format_args!("{hint:?}"),
                "above `max_delay`, which bounds server hints too, so it would never apply",
            ));
        }
        if let Some((delay, copies)) = p.hedge {
            if delay.is_zero() {
                return Err(BuildError::new(
                    "hedge(delay)",
                    "0ns",
                    "a hedging delay must be above zero (every request would be sent twice at once)",
                ));
            }
            if let Some(deadline) = p.deadline
                && delay >= deadline
            {
                return Err(BuildError::new(
                    "hedge(delay)",
                    format_args!("{delay:?}"),
                    "not below the deadline, so no copy could ever be sent",
                ));
            }
            if copies == 0 || copies as usize > MAX_COPIES {
                return Err(BuildError::new(
                    "hedge(max_copies)",
                    copies,
                    "hedging sends 1..=4 copies (gRFC A6 caps an RPC at 5 attempts)",
                ));
            }
        }
        if p.attempt_timeout.as_ref().map(Encoded::left) == Some(Duration::ZERO) {
            return Err(BuildError::new(
                "attempt_timeout",
                "0ns",
                "an attempt with no time left would be given up before it is sent",
            ));
        }
        if p.breaker_wait > p.max_delay {
            return Err(BuildError::new(
                "wait_for_breaker",
                format_args!("{:?}", p.breaker_wait),
                "above `max_delay`, the longest delay slept in process, so it would never apply",
            ));
        }
        Ok(())
    }

    /// The hedging delay and the most extra copies, when hedging is on.
    #[inline]
    pub(crate) fn hedging(&self) -> Option<(Duration, u32)> {
        self.inner.hedge
    }

    pub(crate) fn budget_ref(&self) -> Option<&Budget> {
        self.inner.budget.as_ref()
    }

    #[inline]
    pub(crate) fn deadline_after(&self) -> Option<Duration> {
        self.inner.deadline
    }

    /// The per-attempt bound on the time left written into each attempt.
    #[inline]
    pub(crate) fn attempt_bound(&self) -> Option<Duration> {
        self.inner.attempt_timeout.as_ref().map(Encoded::left)
    }

    /// The time left `left` for one attempt, with the wire forms encoded with the policy when
    /// it is exactly the per-attempt timeout or the deadline.
    #[inline]
    pub(crate) fn time_left(&self, left: Duration) -> TimeLeft<'_> {
        let p = &*self.inner;
        let encoded = [p.attempt_timeout.as_ref(), p.deadline_encoded.as_ref()]
            .into_iter()
            .flatten()
            .find(|e| e.left() == left);
        TimeLeft::new(left, p.time_left_header.as_ref(), encoded)
    }

    /// The header of [`time_left_header`](Self::time_left_header), if any.
    #[inline]
    pub(crate) fn time_left_header_ref(&self) -> Option<&http::HeaderName> {
        self.inner.time_left_header.as_ref()
    }

    /// The policy with `timeout` as its attempt bound, or the smaller of it and the one set.
    pub(crate) fn with_attempt_bound(self, timeout: Duration) -> Self {
        match self.attempt_bound() {
            Some(set) if set <= timeout => self,
            _ => self.attempt_timeout(timeout),
        }
    }

    pub(crate) fn assumes_idempotent(&self) -> bool {
        self.inner.assume_idempotent
    }

    /// Whether the retry layer must keep a copy of a request of this safety.
    pub(crate) fn wants_copy(&self, safe: bool) -> bool {
        self.inner.max_attempts > 1 && (safe || self.inner.retry_unprocessed)
    }

    pub(crate) fn decide<R>(&self, failure: &Failure<R>, at: &Attempted) -> Decision {
        let class = failure.class();
        let Some(rule) = self.rule(class) else {
            return Decision::Stop(GiveUp::NotRetryable);
        };
        if let Some(budget) = &self.inner.budget
            && class != Class::CIRCUIT_OPEN
        {
            // A rejection is not an attempt: it costs the provider nothing.
            budget.failure();
        }
        if failure.no_retry() {
            return Decision::Stop(GiveUp::ServerSaidNo);
        }
        let class_cap = rule.max_attempts.unwrap_or(u32::MAX);
        if at.attempts >= self.inner.max_attempts || at.class_failures >= class_cap {
            return Decision::Stop(GiveUp::AttemptsExhausted);
        }
        match at.spare {
            Spare::Ready => {}
            Spare::NotSafe if self.inner.retry_unprocessed && failure.sent() == Sent::No => {}
            Spare::NotSafe => return Decision::Stop(GiveUp::NotIdempotent),
            Spare::NotReplayable => return Decision::Stop(GiveUp::NotReplayable),
        }
        if class == Class::CIRCUIT_OPEN {
            return self.decide_rejection(failure.retry_after());
        }
        let (delay, source) = match failure.retry_after() {
            Some(hint) if hint > Duration::ZERO => (hint, DelaySource::ServerHint),
            _ => {
                let backoff = rule.backoff.as_ref().unwrap_or(&self.inner.backoff);
                let mut delay = self
                    .with_rng(|rng| backoff.delay_with(at.class_failures, at.previous_delay, rng));
                if rule.slow_down
                    && let Some(previous) = at.previous_delay
                {
                    let slower = previous.saturating_mul(2).min(backoff.cap().max(previous));
                    delay = delay.max(slower);
                }
                (delay, DelaySource::Backoff)
            }
        };
        let limit = match (source, self.hint_limit()) {
            (DelaySource::ServerHint, Some(hint_limit)) => hint_limit.min(self.inner.max_delay),
            _ => self.inner.max_delay,
        };
        if delay > limit {
            return if self.inner.give_up_long_delays {
                Decision::Stop(GiveUp::HintTooLong)
            } else {
                Decision::Defer(retry_at(SystemTime::now(), delay), delay)
            };
        }
        Decision::Retry(delay, source)
    }

    /// A call the breaker's adaptive send rate (or concurrency limit: `source`) held back until
    /// its slot, `wait` from now, after `waited` already waited for slots: waited in process
    /// like a server's hint while the waits in all stay within the same bound, else deferred or
    /// given up like one. Not an attempt, so neither attempt cap applies; a request that cannot
    /// be sent again stops as for any failure.
    pub(crate) fn decide_paced(
        &self,
        wait: Duration,
        waited: Duration,
        spare: Spare,
        source: DelaySource,
    ) -> Decision {
        match spare {
            Spare::Ready => {}
            // Held back in this process: certainly not sent.
            Spare::NotSafe if self.inner.retry_unprocessed => {}
            Spare::NotSafe => return Decision::Stop(GiveUp::NotIdempotent),
            Spare::NotReplayable => return Decision::Stop(GiveUp::NotReplayable),
        }
        if waited.saturating_add(wait) > self.paced_bound() {
            return if self.inner.give_up_long_delays {
                Decision::Stop(GiveUp::HintTooLong)
            } else {
                Decision::Defer(retry_at(SystemTime::now(), wait), wait)
            };
        }
        Decision::Retry(wait, source)
    }

    /// The longest a call waits in process for send slots, in all: the bound on server hints.
    pub(crate) fn paced_bound(&self) -> Duration {
        match self.hint_limit() {
            Some(hint_limit) => hint_limit.min(self.inner.max_delay),
            None => self.inner.max_delay,
        }
    }

    /// A breaker rejection: deferred to the half-open instant, or waited in process when the
    /// policy opted in and the breaker half-opens soon enough.
    fn decide_rejection(&self, left: Option<Duration>) -> Decision {
        let Some(left) = left else {
            // Forced open: nobody knows when it closes.
            return Decision::Stop(GiveUp::NotRetryable);
        };
        let bound = self.inner.breaker_wait.min(self.inner.max_delay);
        if !bound.is_zero() && left <= bound {
            // Every caller the breaker rejected got the same time left: spread their wake-ups by
            // up to +25 % (never less than the time left, never more than the bound).
            let spread = self.with_rng(|rng| {
                Backoff::constant(left / 4)
                    .jitter(super::Jitter::Full)
                    .delay_with(1, None, rng)
            });
            return Decision::Retry(left.saturating_add(spread).min(bound), DelaySource::Breaker);
        }
        if self.inner.give_up_long_delays {
            Decision::Stop(GiveUp::HintTooLong)
        } else {
            Decision::Defer(retry_at(SystemTime::now(), left), left)
        }
    }

    fn with_rng<T>(&self, f: impl FnOnce(&mut SmallRng) -> T) -> T {
        match &self.inner.rng {
            Some(rng) => f(&mut rng.lock().unwrap_or_else(|e| e.into_inner())),
            None => f(&mut SmallRng::from_rng(&mut rand::rng())),
        }
    }

    /// The listener, if set.
    pub(crate) fn hook(&self) -> &Hook {
        &self.inner.listener
    }
}

/// `now + delay`, rounded up to the next whole millisecond: never before the instant the server
/// named, and a plain value for a store to index (the stores keep milliseconds). Not to the
/// second: a deferral of 1 s would wait up to 2 s for the scheduler.
pub(crate) fn retry_at(now: SystemTime, delay: Duration) -> SystemTime {
    let at = now
        .checked_add(delay)
        .unwrap_or(now + Duration::from_secs(u32::MAX.into()));
    match at.duration_since(UNIX_EPOCH) {
        Ok(since) if since.subsec_nanos() % 1_000_000 > 0 => {
            let up = since.as_millis().saturating_add(1);
            UNIX_EPOCH + Duration::from_millis(u64::try_from(up).unwrap_or(u64::MAX))
        }
        _ => at,
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.inner.max_attempts)
            .field("backoff", &self.inner.backoff)
            .field("max_delay", &self.inner.max_delay)
            .field("give_up_long_delays", &self.inner.give_up_long_delays)
            .field("breaker_wait", &self.inner.breaker_wait)
            .field("rules", &self.inner.rules)
            .field("budget", &self.inner.budget)
            .field("deadline", &self.inner.deadline)
            .field("attempt_timeout", &self.attempt_bound())
            .field("time_left_header", &self.inner.time_left_header)
            .field("hedge", &self.inner.hedge)
            .field("retry_unprocessed", &self.inner.retry_unprocessed)
            .field("assume_idempotent", &self.inner.assume_idempotent)
            .field("seeded", &self.inner.rng.is_some())
            .field("listener", &self.inner.listener.is_set())
            .field("reconcile", &self.inner.reconcile)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Code;

    fn failure(class: Class, hint: Option<Duration>) -> Failure {
        let f = Failure::new(class, Code::Error);
        match hint {
            Some(h) => f.with_retry_after(h),
            None => f,
        }
    }

    fn at(attempts: u32, class_failures: u32, spare: Spare) -> Attempted {
        Attempted {
            attempts,
            class_failures,
            spare,
            previous_delay: None,
        }
    }

    #[test]
    fn classes_and_caps() {
        let p = RetryPolicy::new()
            .max_attempts(4)
            .retry_at_most(Class::UNKNOWN, 2);
        assert_eq!(p.attempts_for(Class::TRANSIENT), Some(4));
        assert_eq!(p.attempts_for(Class::UNKNOWN), Some(2));
        assert_eq!(p.attempts_for(Class::PERMANENT), None);
        assert_eq!(p.attempts_for(Class::new("custom")), None);
        assert!(matches!(
            p.decide(&failure(Class::UNKNOWN, None), &at(2, 2, Spare::Ready)),
            Decision::Stop(GiveUp::AttemptsExhausted)
        ));
        // Two earlier calls failed with another class: the unknown cap is not reached.
        assert!(matches!(
            p.decide(&failure(Class::UNKNOWN, None), &at(3, 1, Spare::Ready)),
            Decision::Retry(..)
        ));
        // The overall cap is.
        assert!(matches!(
            p.decide(&failure(Class::UNKNOWN, None), &at(4, 1, Spare::Ready)),
            Decision::Stop(GiveUp::AttemptsExhausted)
        ));
        assert!(matches!(
            p.decide(&failure(Class::PERMANENT, None), &at(1, 1, Spare::Ready)),
            Decision::Stop(GiveUp::NotRetryable)
        ));
    }

    #[test]
    fn max_hint_delay_bounds_hints_not_backoff() {
        let p = RetryPolicy::new()
            .max_hint_delay(Duration::from_millis(500))
            .backoff(Backoff::constant(Duration::from_secs(2)).jitter(super::super::Jitter::None));
        // A 1 s hint is above the hint bound: deferred, to the server's instant.
        let hinted = failure(Class::THROTTLED, Some(Duration::from_secs(1)));
        assert!(matches!(
            p.decide(&hinted, &at(1, 1, Spare::Ready)),
            Decision::Defer(_, d) if d == Duration::from_secs(1)
        ));
        // A hint within it is slept.
        let short = failure(Class::THROTTLED, Some(Duration::from_millis(500)));
        assert!(matches!(
            p.decide(&short, &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::ServerHint) if d == Duration::from_millis(500)
        ));
        // A 2 s backoff is above it too, but only hints are bounded: slept.
        assert!(matches!(
            p.decide(&failure(Class::TRANSIENT, None), &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::Backoff) if d == Duration::from_secs(2)
        ));
        // `max_delay` still bounds everything, hints included.
        let p = p.max_delay(Duration::from_millis(100));
        assert!(matches!(
            p.decide(&short, &at(1, 1, Spare::Ready)),
            Decision::Defer(..)
        ));
        // The preset's bound applies to a policy that chose none.
        let preset = RetryPolicy::new().max_hint_delay_unless_chosen(Duration::from_millis(500));
        assert!(matches!(
            preset.decide(&hinted, &at(1, 1, Spare::Ready)),
            Decision::Defer(_, d) if d == Duration::from_secs(1)
        ));
        assert!(matches!(
            preset.decide(&failure(Class::TRANSIENT, None), &at(1, 1, Spare::Ready)),
            Decision::Retry(_, DelaySource::Backoff)
        ));
        // And to an edited one.
        let edited = RetryPolicy::new()
            .max_attempts(5)
            .max_hint_delay_unless_chosen(Duration::from_millis(500));
        assert!(matches!(
            edited.decide(&hinted, &at(1, 1, Spare::Ready)),
            Decision::Defer(..)
        ));
        // The preset's bound leaves a chosen one alone.
        let chosen = RetryPolicy::new().max_hint_delay(Duration::from_secs(5));
        let kept = chosen.max_hint_delay_unless_chosen(Duration::from_millis(500));
        assert!(matches!(
            kept.decide(&hinted, &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::ServerHint) if d == Duration::from_secs(1)
        ));
    }

    #[test]
    fn hints_within_and_above_max_delay() {
        let p = RetryPolicy::new().max_delay(Duration::from_secs(30));
        let long = failure(Class::THROTTLED, Some(Duration::from_secs(3600)));
        let before = SystemTime::now();
        match p.decide(&long, &at(1, 1, Spare::Ready)) {
            Decision::Defer(when, delay) => {
                assert_eq!(delay, Duration::from_secs(3600));
                assert!(when >= before + Duration::from_secs(3600));
                assert!(when <= SystemTime::now() + Duration::from_secs(3601));
                assert_eq!(
                    when.duration_since(UNIX_EPOCH).unwrap().subsec_nanos() % 1_000_000,
                    0
                );
            }
            _ => panic!("expected a deferral"),
        }
        let p = p.give_up_long_delays();
        assert!(matches!(
            p.decide(&long, &at(1, 1, Spare::Ready)),
            Decision::Stop(GiveUp::HintTooLong)
        ));
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, Some(Duration::from_secs(5))), &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::ServerHint) if d == Duration::from_secs(5)
        ));
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, None), &at(1, 1, Spare::NotSafe)),
            Decision::Stop(GiveUp::NotIdempotent)
        ));
    }

    #[test]
    fn retry_at_rounds_up_to_the_millisecond() {
        let now = UNIX_EPOCH + Duration::new(1_000, 1);
        assert_eq!(
            retry_at(now, Duration::from_secs(86_400)),
            UNIX_EPOCH + Duration::from_millis(87_400_001)
        );
        let now = UNIX_EPOCH + Duration::new(1_000, 2_000_000);
        assert_eq!(
            retry_at(now, Duration::from_secs(1)),
            UNIX_EPOCH + Duration::from_millis(1_001_002)
        );
        let whole = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            retry_at(whole, Duration::from_secs(5)),
            UNIX_EPOCH + Duration::from_secs(1_005)
        );
        // Absurd delays do not overflow: they are cut to about 136 years.
        assert_eq!(
            retry_at(whole, Duration::MAX),
            whole + Duration::from_secs(u32::MAX.into())
        );
    }

    #[test]
    fn refused_requests_are_retried_for_any_method() {
        let p = RetryPolicy::new();
        for code in [
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
            Code::Io(std::io::ErrorKind::ConnectionRefused),
        ] {
            let f: Failure = Failure::new(Class::TRANSIENT, code);
            assert!(
                matches!(p.decide(&f, &at(1, 1, Spare::NotSafe)), Decision::Retry(..)),
                "{code}"
            );
        }
        let p = p.retry_unprocessed(false);
        let f: Failure = Failure::new(
            Class::THROTTLED,
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
        );
        assert!(matches!(
            p.decide(&f, &at(1, 1, Spare::NotSafe)),
            Decision::Stop(GiveUp::NotIdempotent)
        ));
    }

    #[test]
    fn schedule_per_class_and_seeded_jitter() {
        let soft_bounce = Class::new("soft_bounce");
        let p = RetryPolicy::new()
            .max_attempts(10)
            .max_delay(Duration::from_secs(7 * 3600))
            .class(
                soft_bounce,
                ClassPolicy::retry().max_attempts(4).backoff(
                    Backoff::schedule([900, 3600, 21600].map(Duration::from_secs)).unwrap(),
                ),
            );
        let f: Failure = Failure::new(soft_bounce, Code::Smtp(450));
        let delays: Vec<_> = (1..4)
            .map(|n| match p.decide(&f, &at(n, n, Spare::Ready)) {
                Decision::Retry(d, DelaySource::Backoff) => d.as_secs(),
                _ => panic!("expected a retry"),
            })
            .collect();
        assert_eq!(delays, [900, 3600, 21600]);
        assert!(matches!(
            p.decide(&f, &at(4, 4, Spare::Ready)),
            Decision::Stop(GiveUp::AttemptsExhausted)
        ));

        let seeded = |seed| {
            let p = RetryPolicy::new().rng_seed(seed);
            (1..10)
                .map(|n| {
                    match p.decide(&failure(Class::TRANSIENT, None), &at(1, n, Spare::Ready)) {
                        Decision::Retry(d, _) => d,
                        _ => panic!("expected a retry"),
                    }
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(seeded(3), seeded(3));
        assert_ne!(seeded(3), seeded(4));
    }

    #[test]
    fn each_edit_changes_its_class_only() {
        let p = RetryPolicy::new()
            .never_retry(Class::TRANSIENT)
            .retry(Class::PERMANENT)
            .retry_at_most(Class::UNKNOWN, 1)
            .retry(Class::UNKNOWN);
        assert_eq!(p.attempts_for(Class::TRANSIENT), None);
        assert!(matches!(
            p.decide(&failure(Class::TRANSIENT, None), &at(1, 1, Spare::Ready)),
            Decision::Stop(GiveUp::NotRetryable)
        ));
        assert_eq!(p.attempts_for(Class::PERMANENT), Some(3));
        // A class already retried keeps its cap.
        assert_eq!(p.attempts_for(Class::UNKNOWN), Some(1));
        assert_eq!(p.attempts_for(Class::THROTTLED), Some(3));

        let two = Backoff::constant(Duration::from_secs(2));
        let hourly = Backoff::constant(Duration::from_secs(3600));
        let soft_bounce = Class::new("soft_bounce");
        let p = RetryPolicy::new()
            .backoff(two.clone())
            .class(soft_bounce, ClassPolicy::retry().backoff(hourly.clone()));
        assert_eq!(p.backoff_for(Class::TRANSIENT), &two);
        assert_eq!(p.backoff_for(soft_bounce), &hourly);
    }

    #[test]
    fn a_zero_hint_falls_back_to_backoff() {
        // `Retry-After: 0` says "now", which is no reason to skip the backoff.
        let p = RetryPolicy::new().backoff(
            Backoff::constant(Duration::from_millis(200)).jitter(super::super::Jitter::None),
        );
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, Some(Duration::ZERO)), &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::Backoff) if d == Duration::from_millis(200)
        ));
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, Some(Duration::from_nanos(1))), &at(1, 1, Spare::Ready)),
            Decision::Retry(d, DelaySource::ServerHint) if d == Duration::from_nanos(1)
        ));
    }

    #[test]
    fn delay_sources_and_debug_read_as_logged() {
        assert_eq!(DelaySource::ServerHint.as_str(), "server hint");
        assert_eq!(DelaySource::Backoff.as_str(), "backoff");
        assert_eq!(DelaySource::Breaker.as_str(), "breaker half-opens");
        let debug = format!("{:?}", RetryPolicy::new().max_attempts(5));
        assert!(
            debug.starts_with("RetryPolicy { max_attempts: 5, backoff: "),
            "{debug}"
        );
        assert!(debug.contains("retry_unprocessed: true"), "{debug}");
    }

    #[test]
    fn editing_a_shared_policy_leaves_the_original() {
        let a = RetryPolicy::new();
        let b = a.clone().max_attempts(7);
        assert_eq!(a.attempts(), 3);
        assert_eq!(b.attempts(), 7);
    }
}
