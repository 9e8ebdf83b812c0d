//! The retry layer's note on a failure: how many attempts, why it stopped, when to send again.

use std::fmt;
use std::time::SystemTime;

use crate::failure::{Note, Notes};

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
    /// ([`RetryPolicy::give_up_long_delays`](super::RetryPolicy::give_up_long_delays)).
    HintTooLong,
    /// The delay before the next attempt is longer than the policy's maximum in-process delay, so
    /// the request is deferred rather than slept: [`Attempts::retry_at`] says when to send it
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
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the retry layer says about a failure it hands up: the number of attempts, why it
/// stopped ([`GiveUp`]), when the first attempt failed, and, for a deferred request, when to send
/// it again. A [`Note`] on the failure, read with `failure.note::<Attempts>()`:
///
/// ```
/// use tower_backstop::retry::{Attempts, GiveUp};
/// use tower_backstop::{Class, Code, Failure};
///
/// let failure: Failure = Failure::new(Class::TRANSIENT, Code::Timeout)
///     .with_note(Attempts::new(4, GiveUp::AttemptsExhausted));
/// let attempts = failure.note::<Attempts>().unwrap();
/// assert_eq!((attempts.count(), attempts.give_up()), (4, GiveUp::AttemptsExhausted));
/// assert_eq!(
///     failure.to_string(),
///     "transient failure (timeout) after 4 attempts, attempts exhausted"
/// );
/// ```
///
/// In the failure's `Display` it reads ` after 4 attempts, attempts exhausted` after the code,
/// and ` until {HTTP-date}` (RFC 9110 §5.6.7) for a deferred request. It is kept when a failure
/// is found again inside a boxed error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempts {
    count: u32,
    give_up: GiveUp,
    first_failed_at: Option<SystemTime>,
    retry_at: Option<SystemTime>,
}

impl Attempts {
    /// `count` attempts (the first call included), stopped for `give_up`; no times.
    pub const fn new(count: u32, give_up: GiveUp) -> Self {
        Attempts {
            count,
            give_up,
            first_failed_at: None,
            retry_at: None,
        }
    }

    /// The same note, with the time the first attempt failed.
    pub const fn with_first_failed_at(mut self, at: SystemTime) -> Self {
        self.first_failed_at = Some(at);
        self
    }

    /// The same note, with the time to send a deferred request again.
    pub const fn with_retry_at(mut self, at: SystemTime) -> Self {
        self.retry_at = Some(at);
        self
    }

    /// The number of attempts made, the first call included; zero when the request was never
    /// sent (the inner service failed while becoming ready, for example).
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// Why the retry layer stopped.
    pub const fn give_up(&self) -> GiveUp {
        self.give_up
    }

    /// When the first attempt of the request failed.
    pub const fn first_failed_at(&self) -> Option<SystemTime> {
        self.first_failed_at
    }

    /// When the request should be sent again, for a failure the retry layer deferred
    /// ([`GiveUp::Deferred`]): an absolute time, rounded up to the next whole millisecond and
    /// never before the instant the server named (`Retry-After`, RFC 9110 §10.2.3). `None` for
    /// any other failure.
    ///
    /// A dead-letter layer stores the record with this retry-at time, so that a scheduler sends
    /// it again then.
    pub const fn retry_at(&self) -> Option<SystemTime> {
        self.retry_at
    }

    /// Whether the retry layer deferred the request rather than giving up on it.
    pub const fn is_deferred(&self) -> bool {
        matches!(self.give_up, GiveUp::Deferred)
    }
}

impl Note for Attempts {
    fn fmt_outcome(&self, _: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count > 0 {
            write!(f, " after {} attempt", self.count)?;
            if self.count > 1 {
                f.write_str("s")?;
            }
        }
        write!(f, ", {}", self.give_up)?;
        if let Some(at) = self.retry_at {
            write!(f, " until {}", httpdate::fmt_http_date(at))?;
        }
        Ok(())
    }

    fn duplicate(&self) -> Option<Box<dyn Note>> {
        Some(Box::new(*self))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;
    use crate::{Class, Code, Failure};

    #[test]
    fn display_is_lower_case_and_complete() {
        let mut f: Failure = Failure::new(
            Class::TRANSIENT,
            Code::Http(StatusCode::SERVICE_UNAVAILABLE),
        )
        .with_retry_after(Duration::from_secs(3));
        f.notes_mut()
            .insert(Attempts::new(4, GiveUp::AttemptsExhausted));
        let s = f.to_string();
        assert_eq!(
            s,
            "transient failure (http 503) after 4 attempts, attempts exhausted, server asked to retry after 3s"
        );
    }
}
