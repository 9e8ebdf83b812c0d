//! The retry budget: how many retries the layer may add on top of first attempts, so that a
//! failing provider does not get a retry storm (the Google SRE book, "Handling Overload"; gRFC A6
//! retry throttling; Finagle's and tower's retry budgets).

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::build_error::BuildError;

/// One token, in thousandths: gRFC A6 gives `token_ratio` three decimal places, so integer
/// milli-tokens are exact.
const TOKEN: i64 = 1000;

/// A retry budget, shared by every clone of the policy (and so of the layer and the service).
///
/// Two kinds:
///
/// - [`Budget::token_bucket`]: gRFC A6 retry throttling. The bucket starts full at `max_tokens`;
///   every failed attempt of a retried class takes one token, every success gives back
///   `token_ratio`; retries are allowed while the bucket holds more than half of `max_tokens`.
/// - [`Budget::ratio`]: retries at most `ratio` × the first attempts seen over a sliding
///   `window`, plus a floor of `min_per_second` retries per second so that a quiet client can
///   still retry (tower's `TpsBudget`, Finagle's `RetryBudget`). A ratio of 0.6 allows at most 6
///   retries per 10 first attempts.
///
/// Only requests the layer could retry (a copy was taken) feed the token bucket: a request that
/// cannot be retried at all (`max_attempts(1)`, not replayable) is passed through without
/// touching it. Every request is a first attempt for the ratio budget.
///
/// A retry is withdrawn from the budget when it is **scheduled**, before its delay is slept, so
/// retries waiting in backoff count. When the budget is empty the failure is returned at once,
/// marked [`GiveUp::BudgetExhausted`](crate::retry::GiveUp::BudgetExhausted).
#[derive(Clone)]
pub struct Budget {
    kind: Arc<Kind>,
}

enum Kind {
    TokenBucket {
        max: i64,
        ratio: i64,
        tokens: AtomicI64,
    },
    Ratio(RatioBudget),
}

struct RatioBudget {
    /// Milli-tokens deposited per first attempt.
    ratio: i64,
    /// Milli-tokens always available in the window: `min_per_second × window`.
    reserve: i64,
    start: Instant,
    slot_nanos: u64,
    /// The slot index (since `start`) that `slots[index % len]` currently holds.
    current: AtomicU64,
    /// Deposits minus withdrawals per slot, in milli-tokens.
    slots: Box<[AtomicI64]>,
    /// Serialises withdrawals (the failure path), so two cannot spend the same token.
    withdraw: Mutex<()>,
}

/// Number of slots a ratio budget's window is split into.
const SLOTS: u64 = 10;

impl Budget {
    /// A gRFC A6 token bucket: `max_tokens` in `1..=1000`, `token_ratio` > 0, kept to three
    /// decimal places (as A6 specifies). Starts full.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the argument (`"Budget::token_bucket(max_tokens)"`,
    /// `"Budget::token_bucket(token_ratio)"`) when `max_tokens` is 0 or above 1000, or
    /// `token_ratio` is not a finite number of at least 0.001.
    pub fn token_bucket(max_tokens: u32, token_ratio: f64) -> Result<Self, BuildError> {
        if !(1..=1000).contains(&max_tokens) {
            return Err(BuildError::new(
                "Budget::token_bucket(max_tokens)",
                max_tokens,
                "a token bucket holds 1..=1000 tokens (gRFC A6)",
            ));
        }
        if !token_ratio.is_finite() || token_ratio < 0.001 {
            return Err(BuildError::new(
                "Budget::token_bucket(token_ratio)",
                token_ratio,
                "the token ratio must be a finite number of at least 0.001",
            ));
        }
        let max = i64::from(max_tokens) * TOKEN;
        let ratio = ((token_ratio * TOKEN as f64).floor() as i64).min(max);
        Ok(Budget {
            kind: Arc::new(Kind::TokenBucket {
                max,
                ratio,
                tokens: AtomicI64::new(max),
            }),
        })
    }

    /// A ratio budget: retries ≤ `ratio` × first attempts over the last `window`, plus
    /// `min_per_second` × `window` retries always allowed. `ratio` is in `[0, 1000]`, kept to
    /// three decimal places; `window` is between 1 s and 1 h (tower's `TpsBudget` uses 10 s).
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the argument (`"Budget::ratio(ratio)"`,
    /// `"Budget::ratio(window)"`) when `ratio` is negative, not finite or above 1000, or `window`
    /// is outside 1 s ..= 1 h.
    pub fn ratio(ratio: f64, min_per_second: u32, window: Duration) -> Result<Self, BuildError> {
        if !ratio.is_finite() || !(0.0..=1000.0).contains(&ratio) {
            return Err(BuildError::new(
                "Budget::ratio(ratio)",
                ratio,
                "the ratio must be a finite number within [0, 1000]",
            ));
        }
        if window < Duration::from_secs(1) || window > Duration::from_secs(3600) {
            return Err(BuildError::new(
                "Budget::ratio(window)",
                format_args!("{window:?}"),
                "the window must be between 1 s and 1 h",
            ));
        }
        let window_nanos = window.as_nanos() as u64;
        let reserve = i64::from(min_per_second)
            .saturating_mul(TOKEN)
            .saturating_mul(window.as_millis() as i64)
            / 1000;
        Ok(Budget {
            kind: Arc::new(Kind::Ratio(RatioBudget {
                ratio: (ratio * TOKEN as f64).floor() as i64,
                reserve,
                start: Instant::now(),
                slot_nanos: window_nanos / SLOTS,
                current: AtomicU64::new(0),
                slots: (0..SLOTS).map(|_| AtomicI64::new(0)).collect(),
                withdraw: Mutex::new(()),
            })),
        })
    }

    /// A first attempt was made (a new logical request): the ratio budget deposits `ratio`.
    #[inline]
    pub(crate) fn first_attempt(&self) {
        if let Kind::Ratio(r) = &*self.kind
            && r.ratio > 0
        {
            r.slot().fetch_add(r.ratio, Ordering::Relaxed);
        }
    }

    /// An attempt succeeded: the token bucket gets `token_ratio` back, up to `max_tokens`.
    #[inline]
    pub(crate) fn success(&self) {
        if let Kind::TokenBucket { max, ratio, tokens } = &*self.kind {
            // Full in the steady state: a load, no write.
            if tokens.load(Ordering::Relaxed) < *max {
                let _ = tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some((t + ratio).min(*max))
                });
            }
        }
    }

    /// An attempt failed with a class the policy retries: the token bucket loses one token
    /// (gRFC A6 counts every such failure, the last one included).
    pub(crate) fn failure(&self) {
        if let Kind::TokenBucket { tokens, .. } = &*self.kind {
            let _ = tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some((t - TOKEN).max(0))
            });
        }
    }

    /// A retry is being scheduled: `true` if the budget allows it (and, for the ratio budget,
    /// one token is withdrawn).
    pub(crate) fn withdraw(&self) -> bool {
        match &*self.kind {
            Kind::TokenBucket { max, tokens, .. } => tokens.load(Ordering::Relaxed) > max / 2,
            Kind::Ratio(r) => {
                let _guard = r.withdraw.lock().unwrap_or_else(|e| e.into_inner());
                let slot = r.slot();
                if r.balance() >= TOKEN {
                    slot.fetch_sub(TOKEN, Ordering::Relaxed);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// The retries available now, in tokens (fractional): for the token bucket its content, for
    /// the ratio budget the window's balance plus the floor.
    pub fn available(&self) -> f64 {
        match &*self.kind {
            Kind::TokenBucket { tokens, .. } => {
                tokens.load(Ordering::Relaxed) as f64 / TOKEN as f64
            }
            Kind::Ratio(r) => {
                r.slot();
                r.balance() as f64 / TOKEN as f64
            }
        }
    }
}

impl RatioBudget {
    /// The slot for now, after clearing those that fell out of the window.
    fn slot(&self) -> &AtomicI64 {
        let now = (Instant::now() - self.start).as_nanos() as u64 / self.slot_nanos.max(1);
        let mut current = self.current.load(Ordering::Acquire);
        while now > current {
            match self
                .current
                .compare_exchange(current, now, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // Clear the slots between the old index and the new one (at most all).
                    let stale = (now - current).min(SLOTS);
                    for i in 0..stale {
                        self.slots[((now - i) % SLOTS) as usize].store(0, Ordering::Release);
                    }
                    break;
                }
                Err(seen) => current = seen,
            }
        }
        &self.slots[(now % SLOTS) as usize]
    }

    fn balance(&self) -> i64 {
        let sum: i64 = self.slots.iter().map(|s| s.load(Ordering::Acquire)).sum();
        sum.saturating_add(self.reserve)
    }
}

#[cfg(feature = "serde")]
impl Budget {
    /// Whether `other` was built with the same settings (its state aside): a reload that keeps
    /// the settings keeps the budget, and its tokens.
    pub(crate) fn same_settings(&self, other: &Budget) -> bool {
        match (&*self.kind, &*other.kind) {
            (
                Kind::TokenBucket { max, ratio, .. },
                Kind::TokenBucket {
                    max: max2,
                    ratio: ratio2,
                    ..
                },
            ) => max == max2 && ratio == ratio2,
            (Kind::Ratio(a), Kind::Ratio(b)) => {
                a.ratio == b.ratio && a.reserve == b.reserve && a.slot_nanos == b.slot_nanos
            }
            _ => false,
        }
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.kind {
            Kind::TokenBucket { max, ratio, tokens } => f
                .debug_struct("Budget::TokenBucket")
                .field("max_tokens", &(*max as f64 / TOKEN as f64))
                .field("token_ratio", &(*ratio as f64 / TOKEN as f64))
                .field(
                    "tokens",
                    &(tokens.load(Ordering::Relaxed) as f64 / TOKEN as f64),
                )
                .finish(),
            Kind::Ratio(r) => f
                .debug_struct("Budget::Ratio")
                .field("ratio", &(r.ratio as f64 / TOKEN as f64))
                .field("reserve", &(r.reserve as f64 / TOKEN as f64))
                .field("window", &Duration::from_nanos(r.slot_nanos * SLOTS))
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configuration_is_an_error() {
        assert!(Budget::token_bucket(0, 0.1).is_err());
        assert!(Budget::token_bucket(1001, 0.1).is_err());
        assert!(Budget::token_bucket(10, f64::NAN).is_err());
        assert!(Budget::token_bucket(10, 0.0).is_err());
        assert!(Budget::ratio(-0.1, 0, Duration::from_secs(10)).is_err());
        assert!(Budget::ratio(f64::INFINITY, 0, Duration::from_secs(10)).is_err());
        assert!(Budget::ratio(0.5, 0, Duration::ZERO).is_err());
        // Each error names the argument that is wrong, and its value.
        let setting = |r: Result<Budget, BuildError>| {
            let e = r.expect_err("an error");
            (e.setting(), e.to_string())
        };
        for (budget, name, value) in [
            (
                Budget::token_bucket(0, 0.1),
                "Budget::token_bucket(max_tokens)",
                "0",
            ),
            (
                Budget::token_bucket(1001, 0.1),
                "Budget::token_bucket(max_tokens)",
                "1001",
            ),
            (
                Budget::token_bucket(10, f64::NAN),
                "Budget::token_bucket(token_ratio)",
                "NaN",
            ),
            (
                Budget::token_bucket(10, 0.0),
                "Budget::token_bucket(token_ratio)",
                "0",
            ),
            (
                Budget::ratio(-0.1, 0, Duration::from_secs(10)),
                "Budget::ratio(ratio)",
                "-0.1",
            ),
            (
                Budget::ratio(f64::INFINITY, 0, Duration::from_secs(10)),
                "Budget::ratio(ratio)",
                "inf",
            ),
            (
                Budget::ratio(0.5, 0, Duration::ZERO),
                "Budget::ratio(window)",
                "0ns",
            ),
            (
                Budget::ratio(0.5, 0, Duration::from_secs(3601)),
                "Budget::ratio(window)",
                "3601s",
            ),
        ] {
            let (setting, message) = setting(budget);
            assert_eq!(setting, name, "{message}");
            assert!(
                message.starts_with(&format!("invalid configuration: `{name}` is {value}: ")),
                "{message}"
            );
        }
    }

    #[test]
    fn token_bucket_follows_grfc_a6() {
        // max 10, ratio 0.5: retries allowed while tokens > 5.
        let b = Budget::token_bucket(10, 0.5).unwrap();
        for _ in 0..4 {
            b.failure();
        }
        assert!(b.withdraw(), "6 tokens > 5");
        b.failure();
        assert!(!b.withdraw(), "5 tokens is not above half");
        b.success();
        assert!(b.withdraw(), "5.5 tokens > 5");
        for _ in 0..100 {
            b.success();
        }
        assert_eq!(b.available(), 10.0);
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_budget_allows_ratio_of_first_attempts_and_forgets_old_ones() {
        let b = Budget::ratio(0.6, 0, Duration::from_secs(10)).unwrap();
        for _ in 0..10 {
            b.first_attempt();
        }
        let allowed = (0..10).filter(|_| b.withdraw()).count();
        assert_eq!(allowed, 6);
        // After the window, the deposits are gone.
        for _ in 0..10 {
            b.first_attempt();
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!b.withdraw());
        // The floor: 2 per second over 10 s.
        let b = Budget::ratio(0.0, 2, Duration::from_secs(10)).unwrap();
        assert_eq!((0..30).filter(|_| b.withdraw()).count(), 20);
    }
}
