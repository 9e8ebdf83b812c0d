//! Breakers as the board and the command line see them: what the store knows (the records an
//! open breaker rejected and deferred, of class `circuit_open`, carry its key and their
//! retry-at), what the live breakers of
//! the app say ([`Board::breakers`](super::Board::breakers)), the overview's panel (with what
//! the fleet's notes say, from `fleet`), and the warning of a re-drive into an open breaker.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use maud::{Markup, html};
use tower_backstop::Class;
use tower_backstop::breaker::State;
use tower_backstop::observe::{BreakerHealth, Health};
use tower_backstop::store::{Filter, Record, Status, Store, StoreError};

use super::fleet::{self, Notes};
use super::host;
use super::html::{Ctx, cut, time};
use super::{BREAKER_SCAN, FLEET_PROCESSES};

/// What the store says of one breaker: the deferred records it rejected, which carry its key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stored {
    /// How many deferred records carry its key (of those read).
    pub(crate) deferred: u64,
    /// The latest retry-at among them: until when the store holds them back.
    pub(crate) until: Option<SystemTime>,
    /// The root cause of the most recently failed of them.
    pub(crate) cause: Option<String>,
    /// When that one failed.
    last: Option<SystemTime>,
}

/// One breaker, as the live process and the store know it.
#[derive(Clone, Debug)]
pub(crate) struct Breaker {
    /// Its key (`host:port` for a per-host breaker).
    pub(crate) name: String,
    /// The live breaker's health, when the board has the app's breakers.
    pub(crate) live: Option<BreakerHealth>,
    /// What the store's deferred records say.
    pub(crate) stored: Option<Stored>,
}

impl Breaker {
    /// Open or forced open in the live process.
    pub(crate) fn live_open(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|h| matches!(h.state, State::Open | State::ForcedOpen))
    }

    /// Open as the store knows it: records it deferred wait past `now`.
    pub(crate) fn stored_open(&self, now: SystemTime) -> bool {
        self.stored
            .as_ref()
            .and_then(|s| s.until)
            .is_some_and(|t| t > now)
    }

    /// Open, live or by the store.
    pub(crate) fn open(&self, now: SystemTime) -> bool {
        self.live_open() || self.stored_open(now)
    }

    /// The state word: the live one, else the store's (`open` while its records wait, else
    /// `probe due`).
    pub(crate) fn state(&self, now: SystemTime) -> &'static str {
        match &self.live {
            Some(live) => live.state.as_str(),
            None if self.stored_open(now) => "open",
            None => "probe due",
        }
    }

    /// Why it opened: the live breaker's cause, else the store's root cause.
    pub(crate) fn cause(&self) -> Option<&str> {
        self.live
            .as_ref()
            .and_then(|h| h.cause.as_deref())
            .or_else(|| self.stored.as_ref().and_then(|s| s.cause.as_deref()))
    }

    /// When it may let calls through again, in words: the live time to half-open, and the
    /// store's retry-at.
    pub(crate) fn until(&self, now: SystemTime) -> String {
        let mut parts = Vec::new();
        if let Some(left) = self.live.as_ref().and_then(|h| h.half_open_in) {
            parts.push(format!("half-opens in {}", seconds(left)));
        }
        if let Some(until) = self.stored.as_ref().and_then(|s| s.until) {
            if until > now {
                parts.push(format!("the store holds its records until {}", time(until)));
            } else {
                parts.push(format!("its records were due at {}", time(until)));
            }
        }
        parts.join("; ")
    }

    /// The live breaker's adaptive send rate while a throttling provider limits it, in words
    /// (`paced at 35.0/s of 50.0/s peak`, requests a second to one decimal); `None` while not
    /// limited or without the live breaker.
    pub(crate) fn pace(&self) -> Option<String> {
        let live = self.live.as_ref()?;
        let rate = live.send_rate?;
        Some(match live.send_rate_peak {
            Some(peak) => format!("paced at {rate:.1}/s of {peak:.1}/s peak"),
            None => format!("paced at {rate:.1}/s"),
        })
    }

    /// The live breaker's adaptive concurrency limit while a provider that signalled overload
    /// is limited, in words (`at most 8 in flight`); `None` while not limited or without the
    /// live breaker.
    pub(crate) fn limit(&self) -> Option<String> {
        let limit = self.live.as_ref()?.concurrency_limit?;
        Some(format!("at most {limit} in flight"))
    }
}

/// `d` to the second (rounded up), in words (`25s`, `1m 5s`).
pub(crate) fn seconds(d: Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// Every breaker the board knows: the live ones in the health report's order, then those only
/// the store knows, by name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Breakers {
    pub(crate) list: Vec<Breaker>,
    /// Whether the board has live breakers.
    pub(crate) live: bool,
    /// The records read of those an open breaker deferred (the newest [`BREAKER_SCAN`]).
    pub(crate) read: usize,
    /// The records an open breaker deferred, in the store.
    pub(crate) deferred: u64,
}

impl Breakers {
    /// The live breakers of `health` (when there is one) and the breakers the newest
    /// [`BREAKER_SCAN`] records an open breaker deferred name (deferred, of class
    /// `circuit_open`: a count and a page of the stores' status and class index).
    pub(crate) async fn read(
        store: &dyn Store,
        health: Option<&Health>,
    ) -> Result<Self, StoreError> {
        let deferred = deferred_by_a_breaker();
        let total = store.count(&deferred).await?;
        let records = store.search(&deferred, 0..BREAKER_SCAN).await?;
        let mut stored: BTreeMap<String, Stored> = BTreeMap::new();
        for r in &records {
            if let Some(name) = &r.breaker {
                stored.entry(name.clone()).or_default().add(r);
            }
        }
        let mut list = Vec::new();
        if let Some(health) = health {
            for live in health.report().breakers {
                let stored = stored.remove(&live.name);
                list.push(Breaker {
                    name: live.name.clone(),
                    live: Some(live),
                    stored,
                });
            }
        }
        list.extend(stored.into_iter().map(|(name, stored)| Breaker {
            name,
            live: None,
            stored: Some(stored),
        }));
        Ok(Breakers {
            list,
            live: health.is_some(),
            read: records.len(),
            deferred: total,
        })
    }

    /// The breaker named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Breaker> {
        self.list.iter().find(|b| b.name == name)
    }
}

impl Stored {
    fn add(&mut self, r: &Record) {
        self.deferred += 1;
        self.until = self.until.max(r.retry_at);
        if self.last.is_none_or(|t| r.last_failed_at > t) {
            self.last = Some(r.last_failed_at);
            self.cause = Some(match &r.cause {
                Some(c) => format!("{} ({}): {}", c.class, c.code, c.message),
                None => r.message.clone(),
            });
        }
    }
}

/// The records an open breaker rejected and deferred: deferred, of class `circuit_open`.
fn deferred_by_a_breaker() -> Filter {
    Filter::new()
        .status(Status::Deferred)
        .class(Class::CIRCUIT_OPEN.name())
}

/// Planned records that go to a breaker that is open.
#[derive(Clone, Debug)]
pub(crate) struct Warning {
    /// The breaker, as known (its name alone when only the records say it is open).
    pub(crate) breaker: Breaker,
    /// How many of the planned records go to it.
    pub(crate) records: usize,
}

impl Warning {
    /// The warning in words: how many records, which breaker, what is known of it.
    pub(crate) fn describe(&self, planned: usize, now: SystemTime) -> String {
        let b = &self.breaker;
        let mut text = format!(
            "{} of these {planned} records go to {}, whose breaker is open",
            self.records, b.name
        );
        let mut known = Vec::new();
        if b.live_open() {
            known.push(format!("{} in this process", b.state(now)));
        }
        let until = b.until(now);
        if !until.is_empty() {
            known.push(until);
        }
        if !known.is_empty() {
            text.push_str(&format!(" ({})", known.join("; ")));
        }
        if let Some(cause) = b.cause() {
            text.push_str(&format!(", cause: {}", cut(cause, 200)));
        }
        text.push_str(
            ". Re-sent now they would likely be rejected at once or fail again: wait until it \
             half-opens, or let the scheduler send them.",
        );
        text
    }
}

/// The warnings for a re-drive of `plan` (to `target` when set): one per open breaker that
/// planned records go to, live or by the store's retry-at, with how many go there.
pub(crate) fn warnings(
    plan: &[Record],
    target: Option<&http::Uri>,
    breakers: &Breakers,
    now: SystemTime,
) -> Vec<Warning> {
    let mut open: BTreeMap<String, Warning> = BTreeMap::new();
    for r in plan {
        let Some(name) = host::breaker_of(r, target) else {
            continue;
        };
        // The record's own retry-at, when the same breaker deferred it.
        let own_until = (deferred_by_a_breaker().matches(r) && r.breaker.as_deref() == Some(&name))
            .then_some(r.retry_at)
            .flatten()
            .filter(|t| *t > now);
        let known = breakers.get(&name);
        if !known.is_some_and(|b| b.open(now)) && own_until.is_none() {
            continue;
        }
        let w = open.entry(name.clone()).or_insert_with(|| Warning {
            breaker: known.cloned().unwrap_or(Breaker {
                name,
                live: None,
                stored: None,
            }),
            records: 0,
        });
        w.records += 1;
        if own_until.is_some() {
            let stored = w.breaker.stored.get_or_insert_with(Stored::default);
            stored.until = stored.until.max(own_until);
        }
    }
    open.into_values().collect()
}

/// The overview's panel: every breaker, its state, until when, why, its send rate while a
/// throttling provider limits it, its concurrency limit while an overloaded one limits it, the
/// records it holds, what each process of the fleet says of
/// it and the operator's override in force; with an actor, the override forms.
pub(crate) fn panel(ctx: &Ctx, breakers: &Breakers, fleet: &Notes, now: SystemTime) -> Markup {
    let said = fleet.by_breaker.as_ref().ok();
    // The breakers only the fleet's notes name, after the others.
    let fleet_only: Vec<&String> = said
        .map(|m| m.keys().filter(|n| breakers.get(n).is_none()).collect())
        .unwrap_or_default();
    let forms = ctx.actor.is_some() && said.is_some();
    let of = |name: &str| said.and_then(|m| m.get(name));
    html! {
        h2 { "Breakers" }
        @if breakers.list.is_empty() && fleet_only.is_empty() {
            p.note #no-breakers { "No breaker is known to be open or holding records." }
        } @else {
            table #breakers {
                thead { tr {
                    th { "breaker" } th { "state" } th { "until" } th { "cause" } th { "send rate" }
                    th { "concurrency limit" } th { "deferred records" } th { "the fleet" } th { "override" }
                    @if forms { th {} }
                } }
                tbody {
                    @for b in &breakers.list {
                        @let state = b.state(now);
                        tr data-breaker=(b.name) data-state=(state) data-open=(b.open(now)) {
                            td { code { (b.name) } }
                            td { span class=(state_class(b, now)) { (state) } }
                            td { (b.until(now)) }
                            td { (b.cause().map(|c| cut(c, 200)).unwrap_or_default()) }
                            td.rate { (b.pace().unwrap_or_default()) }
                            td.limit { (b.limit().unwrap_or_default()) }
                            td.n { (b.stored.as_ref().map_or(0, |s| s.deferred)) }
                            td.fleet { (fleet::processes_cell(of(&b.name), now)) }
                            td { (fleet::override_cell(of(&b.name))) }
                            @if forms { td { (fleet::form(ctx, Some(b.name.as_str()))) } }
                        }
                    }
                    @for name in &fleet_only {
                        tr data-breaker=(name) data-state="-" {
                            td { code { (name) } }
                            td.note { "not here" }
                            td {} td {} td {} td {} td.n { "0" }
                            td.fleet { (fleet::processes_cell(of(name), now)) }
                            td { (fleet::override_cell(of(name))) }
                            @if forms { td { (fleet::form(ctx, Some(name.as_str()))) } }
                        }
                    }
                }
            }
        }
        @if let Err(e) = &fleet.by_breaker {
            p.note #fleet-unavailable { "The fleet: its notes cannot be read (" (cut(e, 200)) "): no process's word and no override is shown." }
        } @else if forms {
            (fleet::form(ctx, None))
        }
        p.note {
            @if breakers.live {
                "Live: the breakers of the app this board is mounted in. "
            } @else {
                "No live breakers: the app that mounts the board can pass its breakers' health (Board::breakers). "
            }
            "A send rate shows while a provider's throttled answers (429) limit it: the breaker \
             stays closed and sends at most that many requests a second, against the rate the \
             provider took before it throttled (its peak). "
            "A concurrency limit shows while a provider's overload answers (429, 503) limit it: \
             the breaker sends at most that many requests at once, learnt from its answers. "
            "The store: the records an open breaker rejected and deferred, with their retry-at ("
            (breakers.read) " of " (breakers.deferred) " read). "
            "The fleet: what each process that shares its breakers through this store said in \
             its last seconds (at most " (FLEET_PROCESSES) " shown a breaker), and an operator's \
             override in force; an override applies to every such process within a second."
        }
    }
}

fn state_class(b: &Breaker, now: SystemTime) -> &'static str {
    if b.open(now) {
        "firing"
    } else if b.live.as_ref().is_some_and(|h| h.state == State::Closed) {
        "ok"
    } else {
        "waiting"
    }
}

/// The re-drive preview's warning, when planned records go to an open breaker.
pub(crate) fn warning(warnings: &[Warning], planned: usize, now: SystemTime) -> Markup {
    html! {
        @if !warnings.is_empty() {
            div.warning #breaker-warning {
                @for w in warnings {
                    p data-breaker=(w.breaker.name) data-records=(w.records) {
                        strong { "Open breaker. " } (w.describe(planned, now))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_backstop::store::ErrorEntry;

    fn deferred(id: &str, uri: &str, breaker: &str, until: SystemTime) -> Record {
        let mut r = Record::new(
            id,
            ErrorEntry::new(SystemTime::now(), "circuit_open", "circuit open", "open", 1),
        );
        r.metadata.insert("uri".into(), uri.into());
        r.status = Status::Deferred;
        r.breaker = Some(breaker.into());
        r.retry_at = Some(until);
        r
    }

    #[test]
    fn a_plan_into_a_breaker_the_store_holds_open_is_warned_of() {
        let now = SystemTime::now();
        let later = now + Duration::from_secs(300);
        let b = deferred("b1", "http://b.test/v1", "b.test:80", later);
        let mut dead_b = b.clone();
        dead_b.id = "b2".into();
        dead_b.status = Status::Dead;
        dead_b.retry_at = None;
        let mut a = deferred("a1", "http://a.test/v1", "a.test:80", now);
        a.status = Status::Dead;
        let mut breakers = Breakers::default();
        let mut stored = Stored::default();
        stored.add(&b);
        breakers.list.push(Breaker {
            name: "b.test:80".into(),
            live: None,
            stored: Some(stored),
        });
        let plan = [b.clone(), dead_b, a.clone()];
        let w = warnings(&plan, None, &breakers, now);
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].breaker.name.as_str(), w[0].records), ("b.test:80", 2));
        let text = w[0].describe(3, now);
        assert!(
            text.starts_with("2 of these 3 records go to b.test:80"),
            "{text}"
        );
        assert!(text.contains(&time(later)), "{text}");
        // Sent to a target, they meet the target's breaker, which is not open.
        let target: http::Uri = "http://c.test".parse().unwrap();
        assert!(warnings(&plan, Some(&target), &breakers, now).is_empty());
        // Past its retry-at, the store no longer holds it open.
        assert!(warnings(&plan, None, &breakers, later + Duration::from_secs(1)).is_empty());
        // A deferred record alone says its breaker is open, even when the list does not know it.
        let own = deferred("x", "http://x.test/", "x.test:80", later);
        let w = warnings(&[own], None, &Breakers::default(), now);
        assert_eq!(w.len(), 1);
        assert!(w[0].breaker.stored_open(now));
    }
}
