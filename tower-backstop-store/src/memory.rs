//! [`MemoryStore`]: records in a map, for tests and short-lived tools.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query::{
    Change, Claim, Counts, Filter, change_if_unchanged, claim, claimable, newest_first,
};
use super::record::{DEFAULT_HISTORY_LIMIT, Record, Status};
use super::schedule::{from_micros, gap_micros, reserve, to_micros};
use super::{AuditEntry, BoxFuture, FleetNote, Lease, Store, StoreError, list_order};

/// A store in memory, for tests and short-lived tools. Clones share the records.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
    closed: Arc<AtomicBool>,
    history_limit: usize,
}

#[derive(Debug, Default)]
struct Memory {
    records: BTreeMap<String, Record>,
    first_seen: HashMap<String, SystemTime>,
    /// The audit trail, the oldest first.
    audit: Vec<AuditEntry>,
    /// The send schedules: each one's next free time, in microseconds.
    schedules: HashMap<String, i64>,
    /// The fleet's notes, by topic and author.
    notes: HashMap<(String, String), FleetNote>,
}

impl Memory {
    /// Merges `record` into the one with its id (or inserts it) and notes its code's first
    /// sighting.
    fn put(&mut self, mut record: Record, limit: usize) {
        self.first_seen
            .entry(record.code.clone())
            .or_insert(record.last_failed_at);
        match self.records.get_mut(&record.id) {
            Some(existing) => existing.merge_bounded(record, limit),
            None => {
                record.bound_history(limit);
                self.records.insert(record.id.clone(), record);
            }
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            inner: Arc::default(),
            closed: Arc::default(),
            history_limit: DEFAULT_HISTORY_LIMIT,
        }
    }
}

impl MemoryStore {
    /// An empty store that keeps the last [`DEFAULT_HISTORY_LIMIT`] errors per record.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Keeps the last `limit` errors per record (at least one).
    pub fn with_history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// Closes the store: every later call fails with [`StoreError::closed`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Memory) -> T,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let result = if self.closed.load(Ordering::SeqCst) {
            Err(StoreError::closed())
        } else {
            match self.inner.lock() {
                Ok(mut memory) => Ok(f(&mut memory)),
                Err(_) => Err(StoreError::new("memory store lock poisoned")),
            }
        };
        Box::pin(std::future::ready(result))
    }
}

impl Store for MemoryStore {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        let limit = self.history_limit;
        self.with(move |memory| {
            for record in records {
                memory.put(record, limit);
            }
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.with(move |memory| memory.records.get(&id).cloned())
    }

    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let filter = filter.clone();
        self.with(move |memory| {
            let mut all: Vec<Record> = memory
                .records
                .values()
                .filter(|r| filter.matches(r))
                .cloned()
                .collect();
            newest_first(&mut all);
            all.into_iter().skip(page.start).take(page.len()).collect()
        })
    }

    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let filter = filter.clone();
        self.with(move |memory| {
            let mut waiting: Vec<Record> = memory
                .records
                .values()
                .filter(|r| {
                    matches!(r.status, Status::Deferred | Status::InFlight) && r.retry_at.is_some()
                })
                .filter(|r| filter.matches(r))
                .cloned()
                .collect();
            waiting.sort_by(list_order);
            waiting
                .into_iter()
                .skip(page.start)
                .take(page.len())
                .collect()
        })
    }

    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.with(move |memory| {
            memory
                .records
                .values()
                .filter(|r| filter.matches(r))
                .count() as u64
        })
    }

    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.with(move |memory| {
            Counts::tally(
                since,
                memory.records.values(),
                memory.first_seen.iter().map(|(code, t)| (code.clone(), *t)),
            )
        })
    }

    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.with(move |memory| {
            memory.records.get_mut(&id).map(|record| {
                change.apply(record);
                record.clone()
            })
        })
    }

    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let breaker = breaker.to_owned();
        self.with(move |memory| {
            let mut released = 0;
            for record in memory.records.values_mut() {
                if record.status == Status::Deferred
                    && record.breaker.as_deref() == Some(breaker.as_str())
                    && record.retry_at.is_some_and(|at| at > now)
                {
                    record.retry_at = Some(super::record::truncate(now));
                    released += 1;
                }
            }
            Some(released)
        })
    }

    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.with(move |memory| {
            let mut due: Vec<(SystemTime, String)> = memory
                .records
                .values()
                .filter(|r| claimable(r, now))
                .map(|r| (r.retry_at.unwrap_or(UNIX_EPOCH), r.id.clone()))
                .collect();
            due.sort();
            due.truncate(limit);
            due.into_iter()
                .filter_map(|(_, id)| {
                    let record = memory.records.get_mut(&id)?;
                    claim(record, now, lease);
                    Some(record.clone())
                })
                .collect()
        })
    }

    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let seen = seen.clone();
        self.with(move |memory| {
            change_if_unchanged(memory.records.get_mut(&seen.id), &seen, change)
        })
    }

    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        if let Err(e) = lease.check_id(&record) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let (lease, limit) = (lease.clone(), self.history_limit);
        self.with(move |memory| match memory.records.get(&lease.id) {
            None => Claim::Missing,
            Some(current) if !lease.holds(current) => Claim::ClaimedElsewhere {
                status: current.status,
                resends: current.resends,
            },
            Some(_) => {
                memory.put(record, limit);
                match memory.records.get(&lease.id) {
                    Some(written) => Claim::Claimed(Box::new(written.clone())),
                    None => Claim::Missing,
                }
            }
        })
    }

    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.with(|memory| {
            memory
                .records
                .values()
                .filter(|r| {
                    matches!(r.status, Status::Deferred | Status::InFlight) && r.retry_at.is_some()
                })
                .filter_map(|r| r.retry_at)
                .min()
        })
    }

    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        let schedule = schedule.to_owned();
        self.with(move |memory| {
            let next = memory.schedules.get(&schedule).copied();
            let (slot, after) = reserve(next, to_micros(now), gap_micros(gap));
            memory.schedules.insert(schedule, after);
            from_micros(slot)
        })
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let id = id.to_owned();
        self.with(move |memory| memory.records.get(&id).map(|r| r.budget_spent))
    }

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.with(move |memory| {
            let now = note.written_at;
            memory.notes.retain(|_, n| n.expires_at > now);
            memory
                .notes
                .insert((note.topic.clone(), note.author.clone()), note);
        })
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.with(move |memory| {
            memory
                .notes
                .values()
                .filter(|n| n.expires_at > now)
                .cloned()
                .collect()
        })
    }

    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.with(move |memory| memory.audit.push(entry))
    }

    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.with(move |memory| {
            memory
                .audit
                .iter()
                .rev()
                .skip(page.start)
                .take(page.len())
                .cloned()
                .collect()
        })
    }

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.with(move |memory| {
            let before = memory.records.len();
            memory.records.retain(|_, r| !filter.matches(r));
            (before - memory.records.len()) as u64
        })
    }
}
