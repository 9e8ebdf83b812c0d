use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::record::Record;
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

/// Where dead letters are kept. One trait, one behaviour, whatever the backend:
/// [`MemoryStore`] for tests, [`SqliteStore`](super::SqliteStore) (feature `sqlite`) as the
/// durable default.
///
/// Methods return boxed `'static` futures so that the trait is object-safe and a layer can hold
/// any store; they run on the failure path only. Implementations are cheap to clone handles over
/// shared state.
pub trait Store: Send + Sync + 'static {
    /// Writes `record`. A record with an id already in the store is merged into it
    /// ([`Record::merge`]): attempts add up, the newer failure wins, there is never a duplicate.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails; nothing is written then.
    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The record with `id`, if there is one.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>>;

    /// Up to `limit` records, the most recently failed first.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>>;

    /// The number of records per class, the largest first (ties by class name).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>>;
}

pub(crate) fn sort_counts(counts: HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// A store in memory, for tests and short-lived tools. Clones share the records.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<BTreeMap<String, Record>>>,
    closed: Arc<AtomicBool>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Closes the store: every later call fails with [`StoreError::closed`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, Record>) -> T,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let result = if self.closed.load(Ordering::SeqCst) {
            Err(StoreError::closed())
        } else {
            match self.records.lock() {
                Ok(mut records) => Ok(f(&mut records)),
                Err(_) => Err(StoreError::new("memory store lock poisoned")),
            }
        };
        Box::pin(std::future::ready(result))
    }
}

impl Store for MemoryStore {
    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>> {
        self.with(move |records| match records.get_mut(&record.id) {
            Some(existing) => existing.merge(record),
            None => {
                records.insert(record.id.clone(), record);
            }
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.with(move |records| records.get(&id).cloned())
    }

    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.with(move |records| {
            let mut all: Vec<Record> = records.values().cloned().collect();
            all.sort_by(|a, b| {
                b.last_failed_at
                    .cmp(&a.last_failed_at)
                    .then_with(|| a.id.cmp(&b.id))
            });
            all.truncate(limit);
            all
        })
    }

    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        self.with(|records| {
            let mut counts = HashMap::new();
            for r in records.values() {
                *counts.entry(r.class.clone()).or_insert(0) += 1;
            }
            sort_counts(counts)
        })
    }
}
