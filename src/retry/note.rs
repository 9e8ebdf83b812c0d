//! The retry layer's note on a failure: how many attempts, why it stopped, when to send again.

use std::fmt;
use std::time::SystemTime;

use crate::failure::{Note, Notes};
use crate::status::GiveUp;

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
