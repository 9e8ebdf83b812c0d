//! Sliding windows of recent outcomes, for the failure-rate and slow-call-rate rules.
//!
//! Both windows are lock-free. The count window keeps one byte per call in a ring and a running
//! sum that every write adjusts by exactly what it replaced, so the sum always matches the ring
//! once writers are done. The time window keeps one packed `AtomicU64` per bucket (epoch and three
//! counters), updated by compare-and-swap, so a bucket is reset and counted in one step.

use std::time::Duration;

use super::sync::{AtomicI64, AtomicU8, AtomicU64, Ordering};

/// The call failed in a class that counts.
pub(crate) const FAILED: u8 = 0b01;
/// The call took longer than the slow-call threshold.
pub(crate) const SLOW: u8 = 0b10;

/// Calls, failures and slow calls in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) calls: u64,
    pub(crate) failures: u64,
    pub(crate) slow: u64,
}

/// Which window the rate rules use, as configured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum WindowKind {
    /// The last `n` calls.
    Count(u32),
    /// `buckets` buckets of `width` each.
    Time { width: Duration, buckets: u32 },
}

#[derive(Debug)]
pub(crate) enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Window {
    pub(crate) fn count(size: u32) -> Self {
        Window::Count(CountWindow::new(size))
    }

    pub(crate) fn time(bucket_nanos: u64, buckets: u32) -> Self {
        Window::Time(TimeWindow::new(bucket_nanos, buckets))
    }

    /// Records one call; `now` is read only by the time window.
    pub(crate) fn record(&self, bits: u8, now: impl FnOnce() -> u64) {
        match self {
            Window::Count(w) => w.record(bits),
            Window::Time(w) => w.record(now(), bits),
        }
    }

    pub(crate) fn counts(&self, now: impl FnOnce() -> u64) -> Counts {
        match self {
            Window::Count(w) => w.counts(),
            Window::Time(w) => w.counts(now()),
        }
    }

    pub(crate) fn clear(&self) {
        match self {
            Window::Count(w) => w.clear(),
            Window::Time(w) => w.clear(),
        }
    }
}

/// The last `n` calls.
#[derive(Debug)]
pub(crate) struct CountWindow {
    slots: Box<[AtomicU8]>,
    next: AtomicU64,
    failures: AtomicI64,
    slow: AtomicI64,
}

impl CountWindow {
    fn new(size: u32) -> Self {
        CountWindow {
            slots: (0..size.max(1)).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU64::new(0),
            failures: AtomicI64::new(0),
            slow: AtomicI64::new(0),
        }
    }

    fn record(&self, bits: u8) {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[(i % self.slots.len() as u64) as usize];
        let old = slot.swap(bits, Ordering::AcqRel);
        self.adjust(old, bits);
    }

    fn adjust(&self, old: u8, new: u8) {
        let delta = |flag: u8| i64::from(new & flag != 0) - i64::from(old & flag != 0);
        let failed = delta(FAILED);
        if failed != 0 {
            self.failures.fetch_add(failed, Ordering::AcqRel);
        }
        let slow = delta(SLOW);
        if slow != 0 {
            self.slow.fetch_add(slow, Ordering::AcqRel);
        }
    }

    fn counts(&self) -> Counts {
        let calls = self
            .next
            .load(Ordering::Acquire)
            .min(self.slots.len() as u64);
        // A sum may be briefly negative while another writer is between its swap and its
        // adjustment; it is never below the true count once the writers are done.
        Counts {
            calls,
            failures: self.failures.load(Ordering::Acquire).max(0) as u64,
            slow: self.slow.load(Ordering::Acquire).max(0) as u64,
        }
    }

    fn clear(&self) {
        for slot in self.slots.iter() {
            let old = slot.swap(0, Ordering::AcqRel);
            self.adjust(old, 0);
        }
        self.next.store(0, Ordering::Release);
    }
}

/// `n` buckets of a fixed width; a bucket holds its epoch (the bucket's start, counted in widths,
/// modulo 2^16) and three 16-bit counters.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    buckets: Box<[AtomicU64]>,
    width: u64,
}

const EPOCH_BITS: u32 = 16;
const FIELD: u64 = 0xFFFF;

fn pack(epoch: u64, calls: u64, failures: u64, slow: u64) -> u64 {
    (epoch & FIELD) | (calls & FIELD) << 16 | (failures & FIELD) << 32 | (slow & FIELD) << 48
}

fn unpack(word: u64) -> (u64, u64, u64, u64) {
    (
        word & FIELD,
        (word >> 16) & FIELD,
        (word >> 32) & FIELD,
        (word >> 48) & FIELD,
    )
}

impl TimeWindow {
    fn new(width: u64, buckets: u32) -> Self {
        TimeWindow {
            buckets: (0..buckets.max(1)).map(|_| AtomicU64::new(0)).collect(),
            width: width.max(1),
        }
    }

    fn record(&self, now: u64, bits: u8) {
        let tick = now / self.width;
        let epoch = tick & FIELD;
        let bucket = &self.buckets[(tick % self.buckets.len() as u64) as usize];
        let failed = u64::from(bits & FAILED != 0);
        let slow = u64::from(bits & SLOW != 0);
        let mut current = bucket.load(Ordering::Acquire);
        loop {
            let (e, calls, f, s) = unpack(current);
            let next = if e != epoch || calls == 0 {
                pack(epoch, 1, failed, slow)
            } else if calls == FIELD {
                // A full bucket keeps the sample of its first 65,535 calls.
                return;
            } else {
                pack(epoch, calls + 1, f + failed, s + slow)
            };
            match bucket.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    fn counts(&self, now: u64) -> Counts {
        let tick = now / self.width;
        let n = self.buckets.len() as u64;
        let mut counts = Counts::default();
        for bucket in self.buckets.iter() {
            let (e, calls, f, s) = unpack(bucket.load(Ordering::Acquire));
            // The bucket's age in widths, modulo 2^16: only the last `n` count.
            let age = (tick.wrapping_sub(e)) & ((1 << EPOCH_BITS) - 1);
            if age < n {
                counts.calls += calls;
                counts.failures += f;
                counts.slow += s;
            }
        }
        counts
    }

    fn clear(&self) {
        for bucket in self.buckets.iter() {
            bucket.store(0, Ordering::Release);
        }
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    #[test]
    fn count_window_keeps_the_last_n() {
        let w = Window::count(4);
        for bits in [FAILED, FAILED, 0, SLOW, 0, 0] {
            w.record(bits, || 0);
        }
        // The last four: 0, SLOW, 0, 0.
        assert_eq!(
            w.counts(|| 0),
            Counts {
                calls: 4,
                failures: 0,
                slow: 1
            }
        );
        w.clear();
        assert_eq!(w.counts(|| 0), Counts::default());
    }

    #[test]
    fn time_window_forgets_old_buckets() {
        let w = Window::time(1_000, 3);
        w.record(FAILED, || 0);
        w.record(0, || 999);
        w.record(FAILED | SLOW, || 1_500);
        assert_eq!(
            w.counts(|| 2_000),
            Counts {
                calls: 3,
                failures: 2,
                slow: 1
            }
        );
        // At 3,000 the first bucket (0..1,000) has left the window.
        assert_eq!(
            w.counts(|| 3_000),
            Counts {
                calls: 1,
                failures: 1,
                slow: 1
            }
        );
        // A bucket reused after a full turn starts from zero.
        w.record(0, || 3_100);
        assert_eq!(w.counts(|| 3_100).calls, 2);
        assert_eq!(w.counts(|| 10_000), Counts::default());
    }
}
