//! Where the retry layer and the breaker stand, in the fixed words that their notes, events,
//! metrics and health reports share: a breaker's [`State`], why the retry layer gave up
//! ([`GiveUp`]), where a retry's delay came from ([`DelaySource`]). Each has a lower-case name
//! (`as_str`) fit for a log field or a metric label. Inside the crate, a breaker's snapshot
//! too: what a health report reads of it.

use std::fmt;
use std::time::Duration;

/// Why the retry layer stopped trying and handed the failure up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// The failure's class is not retried by the policy (a permanent 4xx, poison).
    NotRetryable,
    /// The attempt cap of the failure's class was reached.
    AttemptsExhausted,
    /// The delay before the next attempt (a server hint such as `Retry-After`, the breaker's time
    /// left until half-open, or the class's own schedule) is longer than the policy's maximum
    /// in-process delay, and the policy is set to give up rather than defer
    /// ([`RetryPolicy::give_up_long_delays`](crate::retry::RetryPolicy::give_up_long_delays)).
    /// Also the reason a dead-letter layer gives for a deferred request whose retry-at time is
    /// more than [`MAX_DEFERRAL`](crate::dead_letter::MAX_DEFERRAL) ahead: it is stored dead,
    /// and the caller's failure says so.
    HintTooLong,
    /// The delay before the next attempt is longer than the policy's maximum in-process delay, so
    /// the request is deferred rather than slept: [`Attempts::retry_at`](crate::retry::Attempts::retry_at) says when to send it
    /// again (the default). Unlike the
    /// other reasons this is not the end of the request: a dead-letter store keeps it with that
    /// retry-at time.
    Deferred,
    /// The retry budget (token bucket or ratio) had nothing left, so the failure was returned at
    /// once instead of retried.
    BudgetExhausted,
    /// The overall deadline of the request ended the series of attempts: the next delay would
    /// have ended after it, or it expired during an attempt. The failure is the last real one.
    DeadlineExceeded,
    /// The server said not to retry (`grpc-retry-pushback-ms` negative or unparseable, gRFC A6).
    ServerSaidNo,
    /// The request is not idempotent (RFC 9110 §9.2.2) and carries no `Idempotency-Key`, so
    /// sending it again could repeat its effect.
    NotIdempotent,
    /// The request could not be copied for another attempt (for example a streaming body).
    NotReplayable,
    /// The inner service failed while the retry layer waited for it to become ready.
    NotReady,
    /// A dead-letter layer was to keep the request for a later re-send (the retry layer had
    /// deferred it), but its store did not take the record (it failed, or did not answer
    /// within [`DeadLetterLayer::store_timeout`](crate::dead_letter::DeadLetterLayer::store_timeout)):
    /// nothing will send it again, and the failure's
    /// [`DeadLetterStatus::NotStored`](crate::dead_letter::DeadLetterStatus::NotStored) says
    /// why. The caller still has the request, and may keep it and send it again itself.
    NotStored,
}

impl GiveUp {
    /// A short lower-case description, as used in `Display`.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotRetryable => "class not retried",
            GiveUp::AttemptsExhausted => "attempts exhausted",
            GiveUp::HintTooLong => "delay above the maximum in-process delay",
            GiveUp::Deferred => "deferred",
            GiveUp::BudgetExhausted => "retry budget exhausted",
            GiveUp::DeadlineExceeded => "deadline exceeded",
            GiveUp::ServerSaidNo => "server said not to retry",
            GiveUp::NotIdempotent => "request not idempotent and has no idempotency key",
            GiveUp::NotReplayable => "request cannot be replayed",
            GiveUp::NotReady => "service failed while becoming ready",
            GiveUp::NotStored => "to be deferred, but the dead-letter store did not take it",
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where a retry's delay came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DelaySource {
    /// The server's hint: `Retry-After` (RFC 9110 §10.2.3), `grpc-retry-pushback-ms` (gRFC A6),
    /// or a rate-limit reset header. Never shortened by jitter.
    ServerHint,
    /// The class's [`Backoff`](crate::retry::Backoff) (the policy's, unless the class has its own).
    Backoff,
    /// Our own breaker's time left until half-open, waited in process only when the policy
    /// opted in with [`RetryPolicy::wait_for_breaker`](crate::retry::RetryPolicy::wait_for_breaker).
    Breaker,
    /// The wait until the slot the breaker's adaptive send rate reserved for the request
    /// ([`AdaptiveRate`](crate::breaker::AdaptiveRate)): the provider answered throttled, and
    /// calls to it are spaced.
    SendRate,
    /// The wait until the call's turn in the queue of the breaker's adaptive concurrency limit
    /// ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency)): the provider signalled
    /// overload, and the calls in flight to it are bounded.
    ConcurrencyLimit,
}

impl DelaySource {
    /// A short lower-case name, as logged.
    pub const fn as_str(self) -> &'static str {
        match self {
            DelaySource::ServerHint => "server hint",
            DelaySource::Backoff => "backoff",
            DelaySource::Breaker => "breaker half-opens",
            DelaySource::SendRate => "send rate",
            DelaySource::ConcurrencyLimit => "concurrency limit",
        }
    }
}

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls are rejected at once until the open duration has passed.
    Open,
    /// A fixed number of probes is admitted; their outcomes close or re-open the breaker.
    HalfOpen,
    /// Opened by an operator ([`BreakerHandle::force_open`](crate::breaker::BreakerHandle::force_open)):
    /// every call is rejected until [`reset`](crate::breaker::BreakerHandle::reset).
    ForcedOpen,
    /// Disabled by an operator ([`BreakerHandle::disable`](crate::breaker::BreakerHandle::disable)):
    /// every call goes through and nothing is counted until
    /// [`reset`](crate::breaker::BreakerHandle::reset).
    Disabled,
}

impl State {
    /// A lower-case name: `closed`, `open`, `half_open`, `forced_open`, `disabled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
            State::ForcedOpen => "forced_open",
            State::Disabled => "disabled",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where one breaker stands now, as the breaker reads itself for a health report: the breaker's
/// read API, so that a reader of breakers needs none of its internals.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BreakerSnapshot<'a> {
    /// The breaker's name (a keyed breaker's key; `unkeyed` for a keyed layer's requests
    /// without a key).
    pub(crate) name: &'a str,
    /// Its state word, as read.
    pub(crate) state: State,
    /// The time left until it half-opens: `Some` when open (zero once the open duration is
    /// over: it half-opens at its next call) or half-open (the next open duration); `None`
    /// otherwise.
    pub(crate) retry_after: Option<Duration>,
    /// Failed calls ÷ calls in the current window: `None` without a failure-rate rule, or
    /// while the window holds no call.
    pub(crate) failure_rate: Option<f64>,
    /// Calls in the current window (rate rules only; 0 otherwise).
    pub(crate) window_calls: u64,
    /// Failed calls in the current window (rate rules only; 0 otherwise).
    pub(crate) window_failures: u64,
    /// Failures in a row towards a consecutive-failures rule.
    pub(crate) consecutive_failures: u32,
    /// Why it last opened, as its rejections say it; `None` while closed or disabled, and when
    /// it opened on no failure.
    pub(crate) cause: Option<String>,
    /// Times it opened since it was built (trips and failed probes, not forced opens).
    pub(crate) opened: u64,
    /// Calls it rejected since it was built.
    pub(crate) rejected: u64,
    /// The adaptive send rate and its peak, requests a second, while limited.
    pub(crate) send_rate: Option<(f64, f64)>,
    /// The adaptive concurrency limit, in calls in flight at once, while limited.
    pub(crate) concurrency_limit: Option<u32>,
}
