use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query::{Change, Claim, Counts, Filter, Page, change_if_unchanged, claim, claimable};
use super::record::{DEFAULT_HISTORY_LIMIT, Record};
use crate::failure::BoxError;

/// A boxed, `Send` future, the return type of [`Store`] methods (the failure path only).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A dead-letter store could not do what was asked: it is closed, its file cannot be opened or
/// written, a record cannot be decoded.
#[derive(Debug)]
pub struct StoreError {
    message: String,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error with `message` (lower case, no final period).
    pub fn new(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            source: None,
        }
    }

    /// An error with `message`, caused by `source`.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        StoreError {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The store was closed.
    pub fn closed() -> Self {
        StoreError::new("dead-letter store is closed")
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|s| &**s as &(dyn std::error::Error + 'static))
    }
}

/// `url` with its credentials hidden, for `Debug`, `Display`, errors and logs: everything between
/// the scheme's `//` and the last `@` before the path becomes `***`
/// (`redis://:secret@db:6379/2` → `redis://***@db:6379/2`). Text that is not a well-formed URL is
/// redacted the same way, so a malformed URL with a password never prints it either.
///
/// ```
/// use tower_backstop::dead_letter::redact_url;
///
/// assert_eq!(redact_url("redis://user:pw@db:6379/2"), "redis://***@db:6379/2");
/// assert_eq!(redact_url("redis://db:6379"), "redis://db:6379");
/// assert_eq!(redact_url("redis//:pw@db"), "***@db");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}***{}", &rest[at..]),
        None if scheme.is_empty() && url.contains('@') => {
            // No scheme to anchor on: hide everything up to the last `@`.
            let at = url.rfind('@').unwrap_or(0);
            format!("***{}", &url[at..])
        }
        None => url.to_owned(),
    }
}

/// Where dead letters are kept. One trait, one behaviour, whatever the backend:
/// [`MemoryStore`] for tests, [`SqliteStore`](super::SqliteStore) (feature `sqlite`) as the
/// durable default, `RedisStore` (feature `redis`) for many instances. The
/// crate's conformance suite (`tests/store_conformance.rs`) runs the same cases against all three.
///
/// Methods return boxed `'static` futures so that the trait is object-safe and a layer can hold
/// any store; the request path calls only [`put`](Store::put), on failure. Implementations are
/// cheap to clone handles over shared state.
///
/// Every write of a record is atomic (one SQLite transaction, one Redis script): the record, its
/// attempt count and budget, its history and its indexes change together or not at all.
///
/// Something that is not a store (here a `Result` whose `?` was forgotten) is a compile error
/// that names the stores there are:
///
/// ```compile_fail,E0277
/// use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore};
///
/// let _layer = DeadLetterLayer::new(Ok::<_, std::io::Error>(MemoryStore::new()));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a dead-letter store",
    label = "DeadLetterLayer needs a `tower_backstop::dead_letter::Store`",
    note = "use `MemoryStore` (tests), `SqliteStore::open(path)?` (feature `sqlite`, on by default; note the `?`) or `RedisStore` (feature `redis`), or implement `Store`; a store you share as an `Arc` (for a `Scheduler`) goes in with `DeadLetterLayer::from_arc(store)`"
)]
pub trait Store: Send + Sync + 'static {
    /// Writes `records` in one transaction (SQLite), one pipeline (Redis). A record with an id
    /// already in the store is merged into it ([`Record::merge_bounded`] with the store's
    /// history limit): attempts add up, the newer failure wins, the history keeps the last K
    /// errors, there is never a duplicate.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails. SQLite then writes nothing;
    /// Redis writes each record atomically, so a failure part-way may leave the earlier records
    /// of the batch written.
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Writes one record, merging it into an existing one with the same id; see
    /// [`put_many`](Store::put_many).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails; nothing is written then.
    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>> {
        self.put_many(vec![record])
    }

    /// The record with `id`, if there is one.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>>;

    /// One page of the records that match `filter`, the most recently failed first (ties by
    /// id).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn search(
        &self,
        filter: &Filter,
        page: Page,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>>;

    /// Up to `limit` records, the most recently failed first.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.search(&Filter::new(), Page::first(limit))
    }

    /// Counts of the records whose last failure is at or after `since`, by class and by code
    /// (the largest first), and the codes first seen since then.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>>;

    /// The number of records per class, the largest first (ties by class name), over all time.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let counts = self.counts(UNIX_EPOCH);
        Box::pin(async move { Ok(counts.await?.by_class) })
    }

    /// Applies `change` to the record with `id` atomically and returns the record as written, or
    /// `None` when there is no such record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails.
    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>>;

    /// Claims up to `limit` records that are due at `now` (status
    /// [`Deferred`](super::Status::Deferred), or an [`InFlight`](super::Status::InFlight) claim
    /// that expired, with `retry_at <= now`), the earliest retry-at first, and returns them as
    /// written: status `InFlight`, `retry_at = now + lease`, one more resend.
    ///
    /// The claim is atomic: two schedulers on the same store never claim the same record while
    /// the lease runs. A scheduler that dies with a claim loses it when the lease ends.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails.
    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>>;

    /// Deletes the records that match `filter` and returns how many were deleted.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails.
    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>>;

    /// Claims the record `seen` for a re-send (a re-drive, an operator), compare-and-set: only if
    /// the record in the store still has the status and the resend count `seen` was read with.
    /// Then it becomes [`InFlight`](super::Status::InFlight) until `until`, with one more resend
    /// and its durable attempt budget started again ([`Change::Redriving`]), and
    /// [`Claim::Claimed`] returns it as written. Otherwise nothing is written:
    /// [`Claim::ClaimedElsewhere`] (someone else claimed or changed it since it was read) or
    /// [`Claim::Missing`] (deleted meanwhile). Two claimers of one record never both win.
    ///
    /// The check and the write are one atomic step: one lock (memory), one `BEGIN IMMEDIATE`
    /// transaction (SQLite), one versioned write script (Redis).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the read or write fails; nothing is claimed.
    fn claim(
        &self,
        seen: &Record,
        until: SystemTime,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.change_if_unchanged(seen, Change::Redriving { until })
    }

    /// Applies `change` to the record `seen` only if the record in the store still has the status
    /// and the resend count `seen` was read with, in one atomic step, like
    /// [`claim`](Store::claim) (which is this with [`Change::Redriving`]). [`Claim::Claimed`]
    /// returns the record as written; [`Claim::ClaimedElsewhere`] and [`Claim::Missing`] say why
    /// nothing was written.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the read or write fails; nothing is changed.
    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>>;

    /// How many attempts of the message `id` count against its durable attempt budget
    /// ([`Record::budget_spent`]), or `None` when there is no record: what
    /// [`AttemptBudgetLayer`](super::AttemptBudgetLayer) reads on each call. Stores read only
    /// that number, not the whole record; the default reads the record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let record = self.get(id);
        Box::pin(async move { Ok(record.await?.map(|r| r.budget_spent)) })
    }
}

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

/// Sorts records the most recently failed first, ties by id: the order of every search.
pub(crate) fn newest_first(records: &mut [Record]) {
    records.sort_by(|a, b| {
        b.last_failed_at
            .cmp(&a.last_failed_at)
            .then_with(|| a.id.cmp(&b.id))
    });
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
        page: Page,
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
            all.into_iter().skip(page.offset).take(page.limit).collect()
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

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.with(move |memory| {
            let before = memory.records.len();
            memory.records.retain(|_, r| !filter.matches(r));
            (before - memory.records.len()) as u64
        })
    }
}
