//! Delay rules (constant, linear, exponential, explicit schedule) and jitter.
//!
//! All arithmetic is done on whole nanoseconds in `u128` and saturates: no delay overflows, turns
//! NaN or panics, at attempt 1 or at attempt `u32::MAX`, whatever the base and the cap.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::build_error::BuildError;

/// How the computed delay is randomised, so that many clients that failed together do not retry
/// together. The forms are those of Marc Brooker's "Exponential Backoff And Jitter" (AWS
/// Architecture Blog, 2015), plus a bounded additive spread. The cap of the [`Backoff`] applies
/// after jitter, so no jittered delay is ever above it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: the delay is exactly the rule's value.
    None,
    /// "Full jitter": uniform in `[0, d]`. The default: the least total work in Brooker's
    /// measurements.
    #[default]
    Full,
    /// "Equal jitter": `d/2` plus uniform in `[0, d/2]`, so the delay is never below half.
    Equal,
    /// "Decorrelated jitter": uniform in `[base, 3 × previous delay]` (the first time, the
    /// previous delay is the base), where `base` is the rule's first delay. The rule's later
    /// values are not used: the delay grows from the previous one.
    Decorrelated,
    /// Bounded additive: `d` plus uniform in `[0, d/4]`, so the delay is never below the rule's
    /// value and at most 25 % above it (before the cap).
    Additive,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Rule {
    Constant(Duration),
    Linear { base: Duration, step: Duration },
    Exponential { base: Duration },
    Schedule(Arc<[Duration]>),
}

/// A delay rule with its jitter and its cap: how long to wait after the `n`-th failed attempt.
///
/// | rule | delay after failed attempt `n` (`n` ≥ 1), before jitter |
/// |---|---|
/// | [`constant(d)`](Self::constant) | `d` |
/// | [`linear(base, step, cap)`](Self::linear) | `base + step × (n-1)` |
/// | [`exponential(base, cap)`](Self::exponential) | `base × 2^(n-1)` |
/// | [`schedule([d1, d2, …])`](Self::schedule) | `d_n`, the last one repeated |
///
/// Then the [`Jitter`] is applied, then the cap, so no delay exceeds the cap. The default is
/// exponential from 100 ms, capped at 20 s, with full jitter (the AWS SDKs' standard retry mode
/// uses the same base and cap).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Backoff {
    rule: Rule,
    cap: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(20))
    }
}

impl Backoff {
    /// Exponential backoff from `base`, doubling per failed attempt, capped at `cap`, full jitter.
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Backoff {
            rule: Rule::Exponential { base },
            cap,
            jitter: Jitter::Full,
        }
    }

    /// The same delay `delay` after every failed attempt, no jitter, capped at `delay`.
    pub const fn constant(delay: Duration) -> Self {
        Backoff {
            rule: Rule::Constant(delay),
            cap: delay,
            jitter: Jitter::None,
        }
    }

    /// `base`, then `step` more after each failed attempt, capped at `cap`, no jitter.
    pub const fn linear(base: Duration, step: Duration, cap: Duration) -> Self {
        Backoff {
            rule: Rule::Linear { base, step },
            cap,
            jitter: Jitter::None,
        }
    }

    /// An explicit schedule: the `n`-th delay after the `n`-th failed attempt, the last one
    /// repeated; no jitter; capped at the largest delay of the schedule. For example
    /// `[5 s, 15 s, 30 s, 60 s, 120 s]`, or a soft bounce's `[15 min, 1 h, 6 h]`.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming `"Backoff::schedule"` when `delays` is empty.
    pub fn schedule(delays: impl IntoIterator<Item = Duration>) -> Result<Self, BuildError> {
        let delays: Arc<[Duration]> = delays.into_iter().collect();
        let cap = delays.iter().copied().max().ok_or_else(|| {
            BuildError::new(
                "Backoff::schedule",
                "[]",
                "a backoff schedule needs at least one delay",
            )
        })?;
        Ok(Backoff {
            rule: Rule::Schedule(delays),
            cap,
            jitter: Jitter::None,
        })
    }

    /// Sets the jitter.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the cap: the largest delay returned, applied after jitter.
    pub fn capped_at(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// The largest delay this backoff returns.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The jitter.
    pub fn jitter_kind(&self) -> Jitter {
        self.jitter
    }

    /// The rule's delay without jitter after `failed` failed attempts (`failed` ≥ 1; 0 counts as
    /// 1), capped.
    pub fn nominal(&self, failed: u32) -> Duration {
        let n = failed.max(1);
        let cap = self.cap.as_nanos();
        let nanos = match &self.rule {
            Rule::Constant(d) => d.as_nanos(),
            Rule::Linear { base, step } => base
                .as_nanos()
                .saturating_add(step.as_nanos().saturating_mul(u128::from(n - 1))),
            Rule::Exponential { base } => {
                let doublings = n - 1;
                if doublings >= 127 {
                    if base.is_zero() { 0 } else { u128::MAX }
                } else {
                    base.as_nanos().saturating_mul(1u128 << doublings)
                }
            }
            Rule::Schedule(delays) => {
                let i = usize::try_from(n - 1).unwrap_or(usize::MAX);
                delays[i.min(delays.len() - 1)].as_nanos()
            }
        };
        from_nanos(nanos.min(cap))
    }

    /// The rule's first delay (after one failed attempt), uncapped: the `base` of decorrelated
    /// jitter.
    fn base(&self) -> Duration {
        match &self.rule {
            Rule::Constant(d) => *d,
            Rule::Linear { base, .. } | Rule::Exponential { base } => *base,
            Rule::Schedule(delays) => delays[0],
        }
    }

    /// What makes this backoff unable to work as written, if anything: an exponential rule from
    /// zero (it never grows), or a cap below the rule's first delay (every delay would be the
    /// cap). Checked by [`RetryPolicy::build`](super::RetryPolicy::build).
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if matches!(self.rule, Rule::Exponential { base } if base.is_zero()) {
            return Some(
                "an exponential backoff from zero never waits; use `Backoff::constant(Duration::ZERO)` for immediate retries",
            );
        }
        if self.cap < self.base() {
            return Some(
                "the backoff's cap is below its first delay, so every delay would be the cap",
            );
        }
        None
    }

    /// The delay to sleep after `failed` failed attempts, jittered with `rng`, then capped.
    /// `previous` is the delay slept before this one (`None` the first time); only
    /// [`Jitter::Decorrelated`] uses it.
    pub fn delay_with(
        &self,
        failed: u32,
        previous: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Duration {
        let cap = self.cap.as_nanos();
        let d = self.nominal(failed).as_nanos();
        let jittered = match self.jitter {
            Jitter::None => d,
            Jitter::Full => uniform(rng, 0, d),
            Jitter::Equal => {
                let half = d / 2;
                half + uniform(rng, 0, d - half)
            }
            Jitter::Additive => d.saturating_add(uniform(rng, 0, d / 4)),
            Jitter::Decorrelated => {
                let base = self.base().as_nanos().min(cap);
                let previous = previous.map_or(base, |p| p.as_nanos());
                let high = previous.saturating_mul(3).max(base);
                uniform(rng, base, high)
            }
        };
        from_nanos(jittered.min(cap))
    }

    /// [`delay_with`](Self::delay_with) using the thread's random source.
    pub fn delay(&self, failed: u32, previous: Option<Duration>) -> Duration {
        self.delay_with(failed, previous, &mut rand::rng())
    }
}

/// Uniform in `[low, high]` (`low` when `high <= low`), exact in integers: no float, no NaN.
fn uniform(rng: &mut impl Rng, low: u128, high: u128) -> u128 {
    if high <= low {
        low
    } else {
        rng.random_range(low..=high)
    }
}

/// A `Duration` of `nanos` nanoseconds, saturating at [`Duration::MAX`].
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Backoff");
        match &self.rule {
            Rule::Constant(delay) => d.field("constant", delay),
            Rule::Linear { base, step } => d.field("linear_base", base).field("linear_step", step),
            Rule::Exponential { base } => d.field("exponential_base", base),
            Rule::Schedule(delays) => d.field("schedule", delays),
        };
        d.field("cap", &self.cap)
            .field("jitter", &self.jitter)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn doubles_then_caps_without_overflow() {
        let b = Backoff::exponential(Duration::from_millis(100), S(5)).jitter(Jitter::None);
        assert_eq!(b.nominal(1), Duration::from_millis(100));
        assert_eq!(b.nominal(2), Duration::from_millis(200));
        assert_eq!(b.nominal(4), Duration::from_millis(800));
        assert_eq!(b.nominal(7), S(5));
        for n in [31, 32, 33, 64, 65, 128, 1000, 1025, u32::MAX] {
            assert_eq!(b.nominal(n), S(5), "attempt {n}");
        }
        let huge = Backoff::exponential(Duration::MAX, Duration::MAX);
        assert_eq!(huge.nominal(3), Duration::MAX);
        assert_eq!(
            Backoff::exponential(Duration::ZERO, S(1)).nominal(u32::MAX),
            Duration::ZERO
        );
    }

    #[test]
    fn constant_linear_and_schedule() {
        let c = Backoff::constant(S(2));
        assert_eq!([1, 2, 50].map(|n| c.nominal(n)), [S(2); 3]);
        let l = Backoff::linear(S(1), S(2), S(6));
        assert_eq!(
            [1, 2, 3, 4, 99].map(|n| l.nominal(n)),
            [1, 3, 5, 6, 6].map(S)
        );
        let s = Backoff::schedule([5, 15, 30, 60, 120].map(S)).unwrap();
        assert_eq!(
            [1, 2, 3, 4, 5, 6, u32::MAX].map(|n| s.nominal(n)),
            [5, 15, 30, 60, 120, 120, 120].map(S)
        );
        let empty = Backoff::schedule([]).unwrap_err();
        assert_eq!(empty.setting(), "Backoff::schedule");
        assert_eq!(
            empty.to_string(),
            "invalid configuration: `Backoff::schedule` is []: a backoff schedule needs at least one delay"
        );
    }

    #[test]
    fn jitter_stays_within_bounds_and_cap_applies_after_it() {
        let mut rng = SmallRng::seed_from_u64(7);
        let cap = S(3);
        for jitter in [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Additive,
        ] {
            let b = Backoff::exponential(Duration::from_millis(50), cap).jitter(jitter);
            let mut previous = None;
            for n in 1..2000 {
                let d = b.delay_with(n, previous, &mut rng);
                assert!(d <= cap, "{jitter:?} {n} {d:?}");
                match jitter {
                    Jitter::Equal => assert!(d >= b.nominal(n) / 2),
                    Jitter::Additive => assert!(d >= b.nominal(n)),
                    Jitter::Decorrelated => assert!(d >= Duration::from_millis(50)),
                    _ => {}
                }
                previous = Some(d);
            }
        }
        // Additive jitter on a delay at the cap stays at the cap, never 25 % above it.
        let b = Backoff::constant(S(10)).jitter(Jitter::Additive);
        for _ in 0..100 {
            assert_eq!(b.delay_with(1, None, &mut rng), S(10));
        }
    }

    #[test]
    fn the_cap_setter_and_the_jitter_are_kept() {
        // A cap set after the rule bounds every delay: a linear rule that would reach 9 s stops
        // at 2 s, and the cap reads back.
        let b = Backoff::linear(S(1), S(2), S(100)).capped_at(S(2));
        assert_eq!(b.cap(), S(2));
        assert_eq!([1, 2, 5].map(|n| b.nominal(n)), [1, 2, 2].map(S));
        let raised = Backoff::constant(S(1)).capped_at(S(4));
        assert_eq!(raised.cap(), S(4));
        assert_eq!(raised.nominal(3), S(1));
        // The jitter set is the one read back, and the defaults are as documented.
        assert_eq!(Backoff::constant(S(1)).jitter_kind(), Jitter::None);
        assert_eq!(Backoff::default().jitter_kind(), Jitter::Full);
        let equal = Backoff::constant(S(1)).jitter(Jitter::Equal);
        assert_eq!(equal.jitter_kind(), Jitter::Equal);
    }

    #[test]
    fn delay_uses_the_rule_and_the_threads_random_source() {
        // No jitter: `delay` is exactly the rule's value, never zero.
        let c = Backoff::constant(Duration::from_millis(1_500));
        assert_eq!(c.delay(1, None), Duration::from_millis(1_500));
        let l = Backoff::linear(S(1), S(1), S(10));
        assert_eq!(l.delay(3, Some(S(2))), S(3));
        // Full jitter: within `[0, d]`, and not always the same value.
        let full = Backoff::exponential(S(1), S(60));
        let picks: Vec<_> = (0..64).map(|_| full.delay(4, None)).collect();
        assert!(picks.iter().all(|d| *d <= S(8)), "{picks:?}");
        assert!(picks.iter().any(|d| *d != picks[0]), "no spread: {picks:?}");
    }

    #[test]
    fn equal_and_additive_jitter_spread_over_their_whole_band() {
        let mut rng = SmallRng::seed_from_u64(11);
        // Equal: in `[d/2, d]`, reaching both halves of that band.
        let equal = Backoff::constant(S(8)).jitter(Jitter::Equal);
        let picks: Vec<_> = (0..400)
            .map(|_| equal.delay_with(1, None, &mut rng))
            .collect();
        assert!(picks.iter().all(|d| *d >= S(4) && *d <= S(8)), "{picks:?}");
        assert!(picks.iter().any(|d| *d < S(5)) && picks.iter().any(|d| *d > S(7)));
        // Additive: in `[d, 1.25 d]` (under a cap that leaves room), reaching the top quarter.
        let additive = Backoff::constant(S(8))
            .capped_at(S(100))
            .jitter(Jitter::Additive);
        let picks: Vec<_> = (0..400)
            .map(|_| additive.delay_with(1, None, &mut rng))
            .collect();
        assert!(picks.iter().all(|d| *d >= S(8) && *d <= S(10)), "{picks:?}");
        assert!(
            picks.iter().any(|d| *d > Duration::from_millis(9_500)),
            "{picks:?}"
        );
        // Decorrelated: in `[base, 3 × previous]`.
        let dec = Backoff::exponential(S(1), S(100)).jitter(Jitter::Decorrelated);
        let picks: Vec<_> = (0..400)
            .map(|_| dec.delay_with(2, Some(S(10)), &mut rng))
            .collect();
        assert!(picks.iter().all(|d| *d >= S(1) && *d <= S(30)), "{picks:?}");
        assert!(picks.iter().any(|d| *d > S(25)), "{picks:?}");
    }

    #[test]
    fn sub_second_and_multi_second_delays_keep_both_parts() {
        let b = Backoff::constant(Duration::new(3, 250_000_000));
        assert_eq!(b.nominal(1), Duration::new(3, 250_000_000));
        assert_eq!(from_nanos(u128::MAX), Duration::MAX);
        assert_eq!(from_nanos(2_000_000_001), Duration::new(2, 1));
    }

    #[test]
    fn debug_names_the_rule_the_cap_and_the_jitter() {
        let b = Backoff::exponential(Duration::from_millis(100), S(20));
        assert_eq!(
            format!("{b:?}"),
            "Backoff { exponential_base: 100ms, cap: 20s, jitter: Full }"
        );
        let l = Backoff::linear(S(1), S(2), S(6));
        assert_eq!(
            format!("{l:?}"),
            "Backoff { linear_base: 1s, linear_step: 2s, cap: 6s, jitter: None }"
        );
        let s = Backoff::schedule([S(5), S(15)]).unwrap();
        assert_eq!(
            format!("{s:?}"),
            "Backoff { schedule: [5s, 15s], cap: 15s, jitter: None }"
        );
        assert_eq!(
            format!("{:?}", Backoff::constant(S(2))),
            "Backoff { constant: 2s, cap: 2s, jitter: None }"
        );
    }

    #[test]
    fn seeded_sources_give_the_same_delays() {
        let b = Backoff::default();
        let a: Vec<_> = {
            let mut rng = SmallRng::seed_from_u64(42);
            (1..20).map(|n| b.delay_with(n, None, &mut rng)).collect()
        };
        let c: Vec<_> = {
            let mut rng = SmallRng::seed_from_u64(42);
            (1..20).map(|n| b.delay_with(n, None, &mut rng)).collect()
        };
        assert_eq!(a, c);
    }
}
