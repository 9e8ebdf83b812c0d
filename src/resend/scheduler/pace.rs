//! The pace of the re-sends: this process's own gaps, or slots of one schedule the whole fleet
//! shares through the store.

use std::time::Duration;

use tokio::time::Instant;

use super::health::Health;
use crate::clock::Clock;
use crate::store::Store;

/// The name of the send schedule the schedulers of one store share
/// ([`Store::reserve_slot`]).
pub(super) const FLEET_SCHEDULE: &str = "scheduler";

/// When each re-send may go: `1 s / rate` apart, each gap jittered by ±50 %, counted from the
/// later of the last send and now (an idle scheduler does not save up a burst); or, with a
/// fleet-wide rate, at the slot the store's shared schedule gives.
#[derive(Debug)]
pub(super) struct Pace {
    gap: Duration,
    next: Option<Instant>,
    /// The gap of the fleet's shared schedule, when the scheduler has a fleet-wide rate.
    fleet: Option<Duration>,
}

impl Pace {
    pub(super) fn new(rate: u32, fleet_rate: Option<u32>) -> Self {
        Pace {
            gap: Duration::from_secs(1) / rate.max(1),
            next: None,
            fleet: fleet_rate.map(|rate| Duration::from_secs(1) / rate.max(1)),
        }
    }

    /// Reserves the next send and returns when it may go. A fleet's schedule that cannot be
    /// reached falls back to this process's own pace, and `health` hears of it.
    pub(super) async fn reserve(
        &mut self,
        store: &dyn Store,
        clock: &Clock,
        health: &mut Health,
    ) -> Instant {
        if let Some(gap) = self.fleet {
            let now = clock.now();
            match store.reserve_slot(FLEET_SCHEDULE, gap, now).await {
                Ok(slot) => {
                    health.ok();
                    let wait = slot.duration_since(now).unwrap_or(Duration::ZERO);
                    return Instant::now() + wait;
                }
                Err(e) => health.failed("slot", &e),
            }
        }
        self.own()
    }

    /// The next slot of this process's own pace.
    fn own(&mut self) -> Instant {
        let now = Instant::now();
        let slot = self.next.map_or(now, |next| next.max(now));
        let jitter = rand::random::<f64>() + 0.5;
        self.next = Some(slot + self.gap.mul_f64(jitter));
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first send goes at once; each later one between half and one and a half gaps after
    /// the one before.
    #[tokio::test(start_paused = true)]
    async fn own_gaps_are_jittered_around_the_rate() {
        let mut pace = Pace::new(10, None);
        let start = Instant::now();
        assert_eq!(pace.own(), start);
        let mut last = start;
        for _ in 0..50 {
            let slot = pace.own();
            let gap = slot - last;
            assert!(
                gap >= Duration::from_millis(50) && gap <= Duration::from_millis(150),
                "{gap:?}"
            );
            last = slot;
        }
    }
}
