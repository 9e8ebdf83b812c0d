//! The shared send schedules of [`Store::reserve_slot`](super::Store::reserve_slot): one time
//! per schedule, the earliest the next slot may start, kept to the microsecond.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `t` as whole microseconds since the Unix epoch (0 before it, `i64::MAX` past year 294,000).
pub(crate) fn to_micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time `us` microseconds after the Unix epoch (the epoch for a negative count).
pub(crate) fn from_micros(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// `gap` in whole microseconds, at least one.
pub(crate) fn gap_micros(gap: Duration) -> i64 {
    i64::try_from(gap.as_micros()).unwrap_or(i64::MAX).max(1)
}

/// Reserves a slot of a schedule whose next free time is `next` (`None`: never used): the slot
/// is the later of `next` and `now`, and the schedule's next free time becomes one `gap` after
/// it. Returns both, in microseconds.
pub(crate) fn reserve(next: Option<i64>, now: i64, gap: i64) -> (i64, i64) {
    let slot = next.map_or(now, |next| next.max(now));
    (slot, slot.saturating_add(gap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_schedule_starts_now_and_a_busy_one_queues() {
        assert_eq!(reserve(None, 1_000, 50), (1_000, 1_050));
        assert_eq!(reserve(Some(900), 1_000, 50), (1_000, 1_050));
        assert_eq!(reserve(Some(1_050), 1_000, 50), (1_050, 1_100));
        assert_eq!(reserve(Some(i64::MAX), 0, 50), (i64::MAX, i64::MAX));
    }

    #[test]
    fn micros_round_trip() {
        let t = UNIX_EPOCH + Duration::from_micros(1_780_000_000_123_456);
        assert_eq!(from_micros(to_micros(t)), t);
        assert_eq!(gap_micros(Duration::from_nanos(10)), 1);
        assert_eq!(gap_micros(Duration::from_millis(20)), 20_000);
    }
}
