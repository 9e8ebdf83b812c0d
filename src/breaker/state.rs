//! The breaker's state machine, in atomics.
//!
//! One `AtomicU64` word holds the state (low 2 bits) and a generation number (the rest); every
//! transition bumps the generation with a compare-and-swap, so an outcome from an earlier period
//! (a slow call started before the last trip) cannot change a later one. The closed-state success
//! path is one atomic load at admission and one at completion: no lock, no clock read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::failure::Class;

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const STATE_MASK: u64 = 0b11;

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls are rejected at once until the open duration has passed.
    Open,
    /// One probe is admitted; its outcome closes or re-opens the breaker.
    HalfOpen,
}

/// Counters of a breaker since it was built, read through
/// [`BreakerHandle::stats`](super::BreakerHandle::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Transitions to open (trips, and failed probes).
    pub opened: u64,
    /// Transitions from open to half-open.
    pub half_opened: u64,
    /// Transitions from half-open to closed (successful probes).
    pub closed: u64,
    /// Calls rejected without reaching the inner service.
    pub rejected: u64,
    /// Probes admitted in half-open.
    pub probes: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: &'static str,
    threshold: u32,
    open_for: Duration,
    failure_classes: Box<[Class]>,
    word: AtomicU64,
    failures: AtomicU32,
    opened_at: AtomicU64,
    probe: AtomicBool,
    base: Instant,
    opened: AtomicU64,
    half_opened: AtomicU64,
    closed: AtomicU64,
    rejected: AtomicU64,
    probes: AtomicU64,
}

fn state_of(word: u64) -> u64 {
    word & STATE_MASK
}

fn next(word: u64, state: u64) -> u64 {
    ((word >> 2).wrapping_add(1) << 2) | state
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What `admit` granted.
#[derive(Debug)]
pub(crate) struct Permit {
    shared: Arc<Shared>,
    word: u64,
    probe: bool,
    done: bool,
}

/// How one call ended, as the breaker counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
    /// A class that does not count (a permanent 4xx, a nested breaker's rejection).
    Ignored,
}

impl Shared {
    pub(crate) fn new(
        name: &'static str,
        threshold: u32,
        open_for: Duration,
        failure_classes: Box<[Class]>,
    ) -> Self {
        Shared {
            name,
            threshold: threshold.max(1),
            open_for,
            failure_classes,
            word: AtomicU64::new(CLOSED),
            failures: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
            probe: AtomicBool::new(false),
            base: Instant::now(),
            opened: AtomicU64::new(0),
            half_opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            probes: AtomicU64::new(0),
        }
    }

    pub(crate) fn threshold(&self) -> u32 {
        self.threshold
    }

    pub(crate) fn open_for(&self) -> Duration {
        self.open_for
    }

    pub(crate) fn counts(&self, class: Class) -> bool {
        self.failure_classes.contains(&class)
    }

    pub(crate) fn classes(&self) -> Box<[Class]> {
        self.failure_classes.clone()
    }

    fn now(&self) -> u64 {
        saturating_nanos(Instant::now().saturating_duration_since(self.base))
    }

    pub(crate) fn state(&self) -> State {
        match state_of(self.word.load(Ordering::Acquire)) {
            CLOSED => State::Closed,
            OPEN => State::Open,
            _ => State::HalfOpen,
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            opened: self.opened.load(Ordering::Relaxed),
            half_opened: self.half_opened.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }

    /// Time left until half-open, when open.
    fn remaining(&self) -> Duration {
        let until = self
            .opened_at
            .load(Ordering::Acquire)
            .saturating_add(saturating_nanos(self.open_for));
        Duration::from_nanos(until.saturating_sub(self.now()))
    }

    fn reject(&self, left: Duration) -> Duration {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(breaker = self.name, time_left = ?left, "call rejected: circuit open");
        left
    }

    /// Admits a call, or says how long until half-open.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Permit, Duration> {
        let word = self.word.load(Ordering::Acquire);
        match state_of(word) {
            CLOSED => Ok(Permit {
                shared: Arc::clone(self),
                word,
                probe: false,
                done: false,
            }),
            OPEN => {
                let left = self.remaining();
                if left > Duration::ZERO {
                    return Err(self.reject(left));
                }
                let half = next(word, HALF_OPEN);
                if self
                    .word
                    .compare_exchange(word, half, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.half_opened.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(breaker = self.name, "circuit half-open");
                }
                self.try_probe()
            }
            _ => self.try_probe(),
        }
    }

    fn try_probe(self: &Arc<Self>) -> Result<Permit, Duration> {
        if self
            .probe
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // A probe is in flight. If it fails, the breaker opens for the open duration again;
            // that is the longest a caller may have to wait, and the honest hint to give.
            return Err(self.reject(self.open_for));
        }
        let word = self.word.load(Ordering::Acquire);
        if state_of(word) != HALF_OPEN {
            // The period ended while we took the flag (the last probe re-opened or closed it).
            self.probe.store(false, Ordering::Release);
            return match state_of(word) {
                CLOSED => Ok(Permit {
                    shared: Arc::clone(self),
                    word,
                    probe: false,
                    done: false,
                }),
                _ => Err(self.reject(self.remaining())),
            };
        }
        self.probes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(breaker = self.name, "probe admitted");
        Ok(Permit {
            shared: Arc::clone(self),
            word,
            probe: true,
            done: false,
        })
    }

    fn trip(&self, from: u64, why: &'static str) {
        self.opened_at.store(self.now(), Ordering::Release);
        if self
            .word
            .compare_exchange(from, next(from, OPEN), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.failures.store(0, Ordering::Relaxed);
            self.opened.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(breaker = self.name, open_for = ?self.open_for, reason = why, "circuit opened");
        }
    }
}

impl Permit {
    pub(crate) fn counts(&self, class: Class) -> bool {
        self.shared.counts(class)
    }

    /// Records how the call ended.
    pub(crate) fn complete(mut self, outcome: Outcome) {
        self.done = true;
        let shared = &*self.shared;
        if self.probe {
            match outcome {
                Outcome::Success => {
                    if shared
                        .word
                        .compare_exchange(
                            self.word,
                            next(self.word, CLOSED),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        shared.failures.store(0, Ordering::Relaxed);
                        shared.closed.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(breaker = shared.name, "circuit closed: probe succeeded");
                    }
                }
                Outcome::Failure => shared.trip(self.word, "probe failed"),
                Outcome::Ignored => {}
            }
            shared.probe.store(false, Ordering::Release);
            return;
        }
        match outcome {
            Outcome::Success => {
                if shared.failures.load(Ordering::Relaxed) != 0 {
                    shared.failures.store(0, Ordering::Relaxed);
                }
            }
            Outcome::Failure => {
                if shared.word.load(Ordering::Acquire) != self.word {
                    // An outcome from an earlier period: it must not change this one.
                    return;
                }
                let n = shared.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= shared.threshold {
                    shared.trip(self.word, "consecutive failures");
                }
            }
            Outcome::Ignored => {}
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done && self.probe {
            // A probe whose future was dropped gives its permit back without counting.
            self.shared.probe.store(false, Ordering::Release);
            tracing::debug!(breaker = self.shared.name, "probe dropped; permit returned");
        }
    }
}
