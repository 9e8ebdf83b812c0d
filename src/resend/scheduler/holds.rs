//! What the scheduler knows of the breakers of its stack: which are open, until when, and
//! which of their records it holds; the probe it sends when one half-opens.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use crate::store::{Record, add_clamped};

/// What a re-send task tells the scheduler's loop.
#[derive(Debug)]
pub(super) enum Report {
    /// An open breaker rejected it locally; it half-opens at `until`.
    Open {
        breaker: String,
        until: SystemTime,
        cause: Option<String>,
        id: String,
    },
    /// Sent and delivered: its breaker (if it named one) is closed.
    Delivered { breaker: Option<String> },
    /// Sent and failed.
    Failed { breaker: Option<String> },
    /// Not sent after all: its claim had passed to another sender.
    NotSent { breaker: Option<String> },
}

/// The breakers the scheduler knows to be open, and what it holds for each.
#[derive(Debug, Default)]
pub(super) struct Holds(HashMap<String, Hold>);

#[derive(Debug)]
struct Hold {
    /// When the breaker half-opens.
    until: SystemTime,
    /// Whether a probe of it is in flight.
    probing: bool,
    /// Whether a rejection showed it open (else it is only named by a record, and its first
    /// record is sent alone to find out).
    open: bool,
    /// The records held for it.
    held: HashSet<String>,
}

impl Holds {
    pub(super) fn learn(&mut self, report: Report, rate: u32) {
        match report {
            Report::Open {
                breaker,
                until,
                cause,
                id,
            } => {
                let hold = self.0.entry(breaker.clone()).or_insert_with(|| Hold {
                    until,
                    probing: false,
                    open: false,
                    held: HashSet::new(),
                });
                if !hold.open {
                    hold.open = true;
                    tracing::warn!(
                        breaker = %breaker,
                        half_opens_at = %humantime::format_rfc3339_millis(until),
                        cause = cause.as_deref().unwrap_or("unknown"),
                        "breaker open: holding its deferred records until it closes"
                    );
                }
                hold.until = until;
                hold.probing = false;
                hold.held.insert(id);
            }
            Report::Delivered {
                breaker: Some(breaker),
            } => {
                if let Some(hold) = self.0.remove(&breaker)
                    && hold.open
                {
                    tracing::info!(
                        breaker = %breaker,
                        held = hold.held.len(),
                        per_second = rate,
                        "breaker closed: draining its held records"
                    );
                }
            }
            Report::Failed {
                breaker: Some(breaker),
            } => {
                if let Some(hold) = self.0.get_mut(&breaker) {
                    // The probe reached the provider and failed: the next one learns when the
                    // breaker half-opens again.
                    hold.probing = false;
                }
            }
            Report::NotSent { breaker } => self.not_sent(breaker.as_deref()),
            Report::Delivered { breaker: None } | Report::Failed { breaker: None } => {}
        }
    }

    /// The breakers shown open that hold records.
    pub(super) fn holding(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, h)| h.open && !h.held.is_empty())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Forgets the breaker `name` (it closed) and returns the records held for it.
    pub(super) fn release(&mut self, name: &str) -> Vec<String> {
        self.0
            .remove(name)
            .map(|h| h.held.into_iter().collect())
            .unwrap_or_default()
    }

    /// A record chosen as a probe was not sent after all (dead-lettered instead).
    pub(super) fn not_sent(&mut self, breaker: Option<&str>) {
        if let Some(hold) = breaker.and_then(|b| self.0.get_mut(b)) {
            hold.probing = false;
        }
    }

    /// Whether to hold `record` now, and until when; `None`: send it. The first record of a
    /// breaker the scheduler has not seen yet, and the first due once an open breaker
    /// half-opens, is sent alone, as the probe; the others wait for its outcome.
    pub(super) fn hold(
        &mut self,
        record: &Record,
        now: SystemTime,
        poll: Duration,
    ) -> Option<SystemTime> {
        let breaker = record.breaker.as_deref()?;
        let hold = self.0.entry(breaker.to_owned()).or_insert_with(|| Hold {
            until: now,
            probing: false,
            open: false,
            held: HashSet::new(),
        });
        if now < hold.until {
            hold.held.insert(record.id.clone());
            return Some(hold.until);
        }
        if hold.probing {
            hold.held.insert(record.id.clone());
            return Some(add_clamped(now, poll));
        }
        hold.probing = true;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Class, Code, Failure};

    fn record(id: &str, breaker: &str) -> Record {
        let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
        let mut r = crate::dead_letter::record_of(id.to_owned(), crate::Envelope::new("{}"), &f);
        r.breaker = Some(breaker.to_owned());
        r
    }

    fn open(holds: &mut Holds, breaker: &str, until: SystemTime) {
        holds.learn(
            Report::Open {
                breaker: breaker.to_owned(),
                until,
                cause: None,
                id: "rejected".to_owned(),
            },
            50,
        );
    }

    /// A breaker half-opens at its half-open instant: a record due then is the probe, one due a
    /// moment before is held to that instant, and one due while the probe is out waits a poll.
    #[test]
    fn the_probe_goes_at_the_half_open_instant_and_alone() {
        let poll = Duration::from_secs(1);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut holds = Holds::default();
        open(&mut holds, "a", t);
        let early = t - Duration::from_nanos(1);
        assert_eq!(holds.hold(&record("r-0", "a"), early, poll), Some(t));
        assert_eq!(holds.hold(&record("r-1", "a"), t, poll), None, "the probe");
        assert_eq!(holds.hold(&record("r-2", "a"), t, poll), Some(t + poll));
        // Another breaker's record is not held by this one.
        assert_eq!(holds.hold(&record("r-3", "b"), early, poll), None);
        // The probe failed: the next record is the next probe.
        holds.learn(
            Report::Failed {
                breaker: Some("a".to_owned()),
            },
            50,
        );
        assert_eq!(holds.hold(&record("r-4", "a"), t, poll), None);
    }
}
