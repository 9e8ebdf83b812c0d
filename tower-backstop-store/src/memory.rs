//! [`MemoryStore`]: records in a map, for tests and short-lived tools.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query::{
    Change, Claim, Counts, Filter, change_if_unchanged, claim, claimable, newest_first,
};
use super::record::{DEFAULT_HISTORY_LIMIT, Record};
use super::{AuditEntry, BoxFuture, Store, StoreError};

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
            for mut record in records {
                memory
                    .first_seen
                    .entry(record.code.clone())
                    .or_insert(record.last_failed_at);
                match memory.records.get_mut(&record.id) {
                    Some(existing) => existing.merge_bounded(record, limit),
                    None => {
                        record.bound_history(limit);
                        memory.records.insert(record.id.clone(), record);
                    }
                }
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

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let id = id.to_owned();
        self.with(move |memory| memory.records.get(&id).map(|r| r.budget_spent))
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
