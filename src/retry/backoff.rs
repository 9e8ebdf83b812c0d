//! Delay rules: exponential backoff with jitter and a cap.

use std::time::Duration;

use rand::Rng;

/// How the computed delay is randomised, so that many clients that failed together do not retry
/// together. The forms are those of Marc Brooker's "Exponential Backoff And Jitter" (AWS
/// Architecture Blog, 2015).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: the delay is exactly the exponential value.
    None,
    /// "Full jitter": uniform in `[0, d]`. The default: the least total work in Brooker's
    /// measurements.
    #[default]
    Full,
    /// "Equal jitter": `d/2` plus uniform in `[0, d/2]`, so the delay is never below half.
    Equal,
}

/// Exponential backoff: the delay before attempt `n + 1` is `base × 2^(n-1)`, randomised by the
/// [`Jitter`], then capped at `cap` (the cap applies after jitter, so no delay exceeds it).
///
/// The arithmetic saturates: at attempt 1,000 the delay is the cap, never an overflow or a panic.
/// Defaults: base 100 ms, cap 20 s, full jitter (the AWS SDKs use 100 ms and 20 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(20))
    }
}

impl Backoff {
    /// Exponential backoff from `base`, doubling per attempt, capped at `cap`, full jitter.
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            jitter: Jitter::Full,
        }
    }

    /// Sets the jitter.
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The largest delay this backoff returns.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The delay without jitter after `failed` failed attempts (`failed` ≥ 1): `base ×
    /// 2^(failed-1)`, capped.
    pub fn nominal(&self, failed: u32) -> Duration {
        let doublings = failed.saturating_sub(1);
        if doublings >= 32 {
            return self.cap;
        }
        self.base
            .checked_mul(1u32 << doublings)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The delay to sleep after `failed` failed attempts, jittered with `rng` and capped.
    pub fn delay_with(&self, failed: u32, rng: &mut impl Rng) -> Duration {
        let d = self.nominal(failed);
        let jittered = match self.jitter {
            Jitter::None => d,
            Jitter::Full => d.mul_f64(rng.random::<f64>()),
            Jitter::Equal => d / 2 + (d / 2).mul_f64(rng.random::<f64>()),
        };
        jittered.min(self.cap)
    }

    /// [`delay_with`](Self::delay_with) using the thread's random source.
    pub fn delay(&self, failed: u32) -> Duration {
        self.delay_with(failed, &mut rand::rng())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn doubles_then_caps_without_overflow() {
        let b = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(5))
            .jitter(Jitter::None);
        assert_eq!(b.nominal(1), Duration::from_millis(100));
        assert_eq!(b.nominal(2), Duration::from_millis(200));
        assert_eq!(b.nominal(4), Duration::from_millis(800));
        assert_eq!(b.nominal(7), Duration::from_secs(5));
        for n in [31, 32, 33, 64, 65, 1000, 1025, u32::MAX] {
            assert_eq!(b.nominal(n), Duration::from_secs(5), "attempt {n}");
        }
        let huge = Backoff::exponential(Duration::MAX, Duration::MAX);
        assert_eq!(huge.nominal(3), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let mut rng = SmallRng::seed_from_u64(7);
        let cap = Duration::from_secs(3);
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
            let b = Backoff::exponential(Duration::from_millis(50), cap).jitter(jitter);
            for n in 1..2000 {
                let d = b.delay_with(n, &mut rng);
                assert!(d <= cap);
                if jitter == Jitter::Equal {
                    assert!(d >= b.nominal(n) / 2);
                }
            }
        }
    }
}
