//! The retry policy: which classes are retried, how many attempts, how long to wait.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::backoff::Backoff;
use crate::failure::{Class, Code, Failure, GiveUp};

/// Where a retry's delay came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DelaySource {
    /// The server's hint: `Retry-After` (RFC 9110 §10.2.3), or the breaker's time left open.
    ServerHint,
    /// The policy's computed [`Backoff`].
    Backoff,
}

/// One retry about to happen, as given to [`RetryPolicy::on_retry`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RetryEvent {
    /// The number of the attempt that failed (1 for the first call).
    pub attempt: u32,
    /// Its class.
    pub class: Class,
    /// Its original code.
    pub code: Code,
    /// How long the layer sleeps before the next attempt.
    pub delay: Duration,
    /// Why that delay.
    pub source: DelaySource,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Retried, within the policy's attempt cap and, if set, this class's own cap.
    Retry(Option<u32>),
    Never,
}

type OnRetry = Arc<dyn Fn(&RetryEvent) + Send + Sync>;

struct Inner {
    max_attempts: u32,
    backoff: Backoff,
    max_delay: Duration,
    rules: Vec<(Class, Rule)>,
    on_retry: Option<OnRetry>,
}

/// What [`Retry`](super::Retry) does with each failure: which classes it retries, how many
/// attempts it makes (the first call counts as one), and how long it waits.
///
/// Defaults, from the field's practice (the AWS SDKs' standard mode, gRFC A6):
///
/// | setting | default |
/// |---|---|
/// | [`max_attempts`](Self::max_attempts) | 3 attempts |
/// | [`backoff`](Self::backoff) | exponential from 100 ms, capped at 20 s, full jitter |
/// | [`max_delay`](Self::max_delay) | 60 s: the longest server hint the layer sleeps in process |
/// | retried classes | [`Class::TRANSIENT`], [`Class::THROTTLED`], [`Class::UNKNOWN`], [`Class::CIRCUIT_OPEN`] |
/// | never retried | [`Class::PERMANENT`], [`Class::POISON`], and any class the policy does not name |
///
/// The delay is the server's hint when it gave one (`Retry-After`, the breaker's time left
/// open), else the backoff. A hint above `max_delay` is not slept: the layer returns the failure
/// at once, with [`GiveUp::HintTooLong`] and the hint kept in
/// [`Failure::retry_after`].
///
/// The policy is built once and shared by clones behind an `Arc`; deciding allocates nothing.
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
                rules: vec![
                    (Class::TRANSIENT, Rule::Retry(None)),
                    (Class::THROTTLED, Rule::Retry(None)),
                    (Class::UNKNOWN, Rule::Retry(None)),
                    (Class::CIRCUIT_OPEN, Rule::Retry(None)),
                    (Class::PERMANENT, Rule::Never),
                    (Class::POISON, Rule::Never),
                ],
                on_retry: None,
            }),
        }
    }
}

pub(crate) enum Decision {
    Retry(Duration, DelaySource),
    Stop(GiveUp),
}

/// Whether the retry future holds a copy of the request for another attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spare {
    Ready,
    NotSafe,
    NotReplayable,
}

impl RetryPolicy {
    /// The default policy (see the table above).
    pub fn new() -> Self {
        RetryPolicy::default()
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => {
                let old = &self.inner;
                let mut inner = Inner {
                    max_attempts: old.max_attempts,
                    backoff: old.backoff,
                    max_delay: old.max_delay,
                    rules: old.rules.clone(),
                    on_retry: old.on_retry.clone(),
                };
                f(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// The most attempts for one request, the first call included (a count of attempts, not
    /// retries). Values below 1 are raised to 1; 1 means never retry.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.edit(|p| p.max_attempts = attempts.max(1))
    }

    /// The delay rule used when the server gave no hint.
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.edit(|p| p.backoff = backoff)
    }

    /// The longest server hint (`Retry-After`, the breaker's time left open) that the layer
    /// sleeps in process. A longer hint ends retrying: the failure is returned at once with the
    /// hint in it, instead of holding the request for an hour.
    pub fn max_delay(self, max_delay: Duration) -> Self {
        self.edit(|p| p.max_delay = max_delay)
    }

    fn set_rule(self, class: Class, rule: Rule) -> Self {
        self.edit(|p| {
            p.rules.retain(|(c, _)| *c != class);
            p.rules.push((class, rule));
        })
    }

    /// Retries failures of `class`, within [`max_attempts`](Self::max_attempts).
    pub fn retry(self, class: Class) -> Self {
        self.set_rule(class, Rule::Retry(None))
    }

    /// Retries failures of `class` for at most `attempts` attempts in all (never more than
    /// [`max_attempts`](Self::max_attempts)).
    pub fn retry_at_most(self, class: Class, attempts: u32) -> Self {
        self.set_rule(class, Rule::Retry(Some(attempts.max(1))))
    }

    /// Never retries failures of `class`.
    pub fn never_retry(self, class: Class) -> Self {
        self.set_rule(class, Rule::Never)
    }

    /// Calls `f` before every retry (on the failure path only), for metrics or logs.
    pub fn on_retry(self, f: impl Fn(&RetryEvent) + Send + Sync + 'static) -> Self {
        let f: OnRetry = Arc::new(f);
        self.edit(|p| p.on_retry = Some(f))
    }

    /// The attempt cap of the policy.
    pub fn attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// The attempt cap for failures of `class`, or `None` when the class is not retried.
    pub fn attempts_for(&self, class: Class) -> Option<u32> {
        match self.inner.rules.iter().find(|(c, _)| *c == class) {
            Some((_, Rule::Retry(cap))) => {
                Some(cap.map_or(self.inner.max_attempts, |c| c.min(self.inner.max_attempts)))
            }
            _ => None,
        }
    }

    pub(crate) fn decide<R>(&self, failure: &Failure<R>, attempts: u32, spare: Spare) -> Decision {
        let Some(cap) = self.attempts_for(failure.class()) else {
            return Decision::Stop(GiveUp::NotRetryable);
        };
        if attempts >= cap {
            return Decision::Stop(GiveUp::AttemptsExhausted);
        }
        match spare {
            Spare::Ready => {}
            Spare::NotSafe => return Decision::Stop(GiveUp::NotIdempotent),
            Spare::NotReplayable => return Decision::Stop(GiveUp::NotReplayable),
        }
        match failure.retry_after() {
            Some(hint) if hint > self.inner.max_delay => Decision::Stop(GiveUp::HintTooLong),
            Some(hint) if failure.class() == Class::CIRCUIT_OPEN => {
                // Our own breaker's time left: every caller it rejected got the same value, so
                // spread their wake-ups by up to +25 % (never less than the time left).
                let spread = hint.mul_f64(0.25 * rand::random::<f64>());
                let delay = hint
                    .saturating_add(spread)
                    .min(self.inner.max_delay.max(hint));
                Decision::Retry(delay, DelaySource::ServerHint)
            }
            Some(hint) if hint > Duration::ZERO => Decision::Retry(hint, DelaySource::ServerHint),
            _ => Decision::Retry(self.inner.backoff.delay(attempts), DelaySource::Backoff),
        }
    }

    pub(crate) fn notify(&self, event: &RetryEvent) {
        if let Some(f) = &self.inner.on_retry {
            f(event);
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.inner.max_attempts)
            .field("backoff", &self.inner.backoff)
            .field("max_delay", &self.inner.max_delay)
            .field("rules", &self.inner.rules)
            .field("on_retry", &self.inner.on_retry.is_some())
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
            p.decide(&failure(Class::UNKNOWN, None), 2, Spare::Ready),
            Decision::Stop(GiveUp::AttemptsExhausted)
        ));
        assert!(matches!(
            p.decide(&failure(Class::PERMANENT, None), 1, Spare::Ready),
            Decision::Stop(GiveUp::NotRetryable)
        ));
    }

    #[test]
    fn hints_within_and_above_max_delay() {
        let p = RetryPolicy::new().max_delay(Duration::from_secs(30));
        assert!(matches!(
            p.decide(
                &failure(Class::THROTTLED, Some(Duration::from_secs(3600))),
                1,
                Spare::Ready
            ),
            Decision::Stop(GiveUp::HintTooLong)
        ));
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, Some(Duration::from_secs(5))), 1, Spare::Ready),
            Decision::Retry(d, DelaySource::ServerHint) if d == Duration::from_secs(5)
        ));
        assert!(matches!(
            p.decide(&failure(Class::THROTTLED, None), 1, Spare::NotSafe),
            Decision::Stop(GiveUp::NotIdempotent)
        ));
    }

    #[test]
    fn editing_a_shared_policy_leaves_the_original() {
        let a = RetryPolicy::new();
        let b = a.clone().max_attempts(7);
        assert_eq!(a.attempts(), 3);
        assert_eq!(b.attempts(), 7);
    }
}
