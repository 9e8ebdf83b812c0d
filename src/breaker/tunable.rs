//! The thresholds of a breaker that a reload may change while it runs ([`Tunable`]), apart
//! from its state: a new rule takes effect at the breaker's next decision, its state (open or
//! closed, the window's counts, the failures in a row) untouched.
//!
//! The rule is a handful of words in atomics behind a sequence number (a seqlock): a reader
//! copies the words and reads the sequence again, so that it sees one rule whole, never half
//! of an old one and half of a new one; a writer, rare, bumps the sequence around its stores.
//! A read is a few plain loads of one cache line that only a reload writes: nothing on the
//! success path waits, writes or allocates.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::open::OpenDuration;
use super::state::{MAX_PROBES, Settings};
use super::sync::{AtomicU64, Ordering, fence};

/// The thresholds of a breaker, as it reads them at one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rule {
    /// Failures in a row that open it; `None`: no consecutive rule.
    pub(crate) consecutive: Option<u32>,
    pub(crate) failure_rate: Option<f64>,
    /// The slow-call threshold (nanoseconds) and rate.
    pub(crate) slow: Option<(u64, f64)>,
    pub(crate) minimum_calls: u64,
    pub(crate) open: OpenDuration,
    pub(crate) probes: u64,
    pub(crate) close_after: u64,
    /// Nanoseconds.
    pub(crate) max_half_open: Option<u64>,
}

pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Rule {
    /// The rule of `config` (checked by its builder).
    pub(crate) fn of(config: &Settings) -> Rule {
        let consecutive = match (config.consecutive, config.has_rates()) {
            (Some(n), _) => Some(n.max(1)),
            (None, false) => Some(5),
            (None, true) => None,
        };
        Rule {
            consecutive,
            failure_rate: config.failure_rate,
            slow: config.slow.map(|(d, r)| (saturating_nanos(d), r)),
            minimum_calls: u64::from(config.minimum().max(1)),
            open: config.open,
            probes: u64::from(config.probes.clamp(1, MAX_PROBES)),
            close_after: u64::from(config.close_after.clamp(1, MAX_PROBES)),
            max_half_open: config.max_half_open.map(saturating_nanos),
        }
    }
}

/// "None" in a word: no real value is `u64::MAX` (a rate is within (0, 1], whose bits are
/// below it; a count or a duration in nanoseconds that large is refused or saturated).
const NONE: u64 = u64::MAX;

fn opt(word: u64) -> Option<u64> {
    (word != NONE).then_some(word)
}

/// A breaker's [`Rule`], changeable while the breaker runs.
pub(crate) struct Tunable {
    /// Even: a rule is whole; odd: a writer is storing one.
    seq: AtomicU64,
    consecutive: AtomicU64,
    failure_rate: AtomicU64,
    slow_threshold: AtomicU64,
    slow_rate: AtomicU64,
    minimum_calls: AtomicU64,
    open_base: AtomicU64,
    open_cap: AtomicU64,
    open_growing: AtomicU64,
    open_jitter: AtomicU64,
    probes: AtomicU64,
    close_after: AtomicU64,
    max_half_open: AtomicU64,
    /// Writers one at a time.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    writer: Mutex<()>,
}

impl Tunable {
    pub(crate) fn new(rule: Rule) -> Self {
        let tunable = Tunable {
            seq: AtomicU64::new(0),
            consecutive: AtomicU64::new(NONE),
            failure_rate: AtomicU64::new(NONE),
            slow_threshold: AtomicU64::new(NONE),
            slow_rate: AtomicU64::new(NONE),
            minimum_calls: AtomicU64::new(0),
            open_base: AtomicU64::new(0),
            open_cap: AtomicU64::new(0),
            open_growing: AtomicU64::new(0),
            open_jitter: AtomicU64::new(0),
            probes: AtomicU64::new(1),
            close_after: AtomicU64::new(1),
            max_half_open: AtomicU64::new(NONE),
            writer: Mutex::new(()),
        };
        tunable.store(&rule);
        tunable
    }

    /// The rule now, whole.
    #[inline]
    pub(crate) fn get(&self) -> Rule {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let rule = self.load();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return rule;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Replaces the rule: the breaker's next decision reads the new one.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn set(&self, rule: &Rule) {
        let _one = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.store(rule);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    #[inline]
    fn load(&self) -> Rule {
        let r = Ordering::Relaxed;
        let (threshold, rate) = (self.slow_threshold.load(r), self.slow_rate.load(r));
        let (base, cap) = (self.open_base.load(r), self.open_cap.load(r));
        let jitter = f64::from_bits(self.open_jitter.load(r));
        let open = if self.open_growing.load(r) == 1 {
            OpenDuration::doubling(Duration::from_nanos(base), Duration::from_nanos(cap))
        } else {
            OpenDuration::fixed(Duration::from_nanos(base))
        };
        Rule {
            consecutive: opt(self.consecutive.load(r)).map(|n| n as u32),
            failure_rate: opt(self.failure_rate.load(r)).map(f64::from_bits),
            slow: opt(threshold).map(|t| (t, f64::from_bits(rate))),
            minimum_calls: self.minimum_calls.load(r),
            open: open.jitter(jitter),
            probes: self.probes.load(r),
            close_after: self.close_after.load(r),
            max_half_open: opt(self.max_half_open.load(r)),
        }
    }

    fn store(&self, rule: &Rule) {
        let r = Ordering::Relaxed;
        self.consecutive
            .store(rule.consecutive.map_or(NONE, u64::from), r);
        self.failure_rate
            .store(rule.failure_rate.map_or(NONE, f64::to_bits), r);
        let (threshold, rate) = rule
            .slow
            .map_or((NONE, NONE), |(t, rate)| (t.min(NONE - 1), rate.to_bits()));
        self.slow_threshold.store(threshold, r);
        self.slow_rate.store(rate, r);
        self.minimum_calls.store(rule.minimum_calls, r);
        let (base, cap, growing, jitter) = rule.open.parts();
        self.open_base.store(saturating_nanos(base), r);
        self.open_cap.store(saturating_nanos(cap), r);
        self.open_growing.store(u64::from(growing), r);
        self.open_jitter.store(jitter.to_bits(), r);
        self.probes.store(rule.probes, r);
        self.close_after.store(rule.close_after, r);
        self.max_half_open
            .store(rule.max_half_open.map_or(NONE, |n| n.min(NONE - 1)), r);
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    fn rule(n: u32) -> Rule {
        Rule {
            consecutive: Some(n),
            failure_rate: Some(0.5),
            slow: Some((1_000, 0.25)),
            minimum_calls: 20,
            open: OpenDuration::doubling(Duration::from_secs(1), Duration::from_secs(30))
                .jitter(0.5),
            probes: 3,
            close_after: 2,
            max_half_open: None,
        }
    }

    #[test]
    fn a_rule_reads_back_as_stored() {
        let tunable = Tunable::new(rule(5));
        assert_eq!(tunable.get(), rule(5));
        let other = Rule {
            consecutive: None,
            slow: None,
            open: OpenDuration::fixed(Duration::from_millis(250)),
            max_half_open: Some(7),
            ..rule(1)
        };
        tunable.set(&other);
        assert_eq!(tunable.get(), other);
    }

    #[test]
    fn readers_never_see_half_a_rule() {
        // Two rules whose every word differs: a reader racing the writer sees one or the other.
        let (a, b) = (rule(1), {
            let mut b = rule(2);
            b.failure_rate = Some(0.9);
            b.minimum_calls = 50;
            b.probes = 7;
            b
        });
        let tunable = std::sync::Arc::new(Tunable::new(a));
        let reader = {
            let tunable = tunable.clone();
            std::thread::spawn(move || {
                for _ in 0..100_000 {
                    let seen = tunable.get();
                    assert!(seen == a || seen == b, "{seen:?}");
                }
            })
        };
        for i in 0..10_000 {
            tunable.set(if i % 2 == 0 { &b } else { &a });
        }
        reader.join().unwrap();
    }
}
