//! A local spool: a bounded durable file for the records a shared store did not take, and the
//! forwarding of them into the store when it answers again.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::{BoxFuture, DEFAULT_HISTORY_LIMIT, Lease, Record, StoreError};

mod forward;

pub use self::forward::{Forwarded, SpoolState};

/// The default size cap of a [`Spool`], 256 MiB of records (their JSON): the smallest disk
/// buffer Vector accepts (`buffer.max_size`, 268,435,488 bytes), enough for about 100,000
/// records of 2 KiB.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// The default age cap of a [`Spool`], 4 days: Amazon SQS's default message retention period
/// (345,600 s). A record spooled longer than this is moved to the spool's quarantine file
/// instead of being forwarded (see [`Spool::with_max_age`]).
pub const DEFAULT_SPOOL_MAX_AGE: Duration = Duration::from_secs(4 * 24 * 3600);

/// Why a [`Spool`] did not take a record, or could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpoolError {
    /// The spool holds its size cap already: the record was not written (nothing else was
    /// dropped to make room).
    Full {
        /// The bytes of records the spool holds.
        bytes: u64,
        /// Its cap ([`Spool::with_max_bytes`]).
        max_bytes: u64,
    },
    /// Another [`Spool`] (in this process or another) has the file open: two writers of one
    /// spool would forward each other's records twice.
    InUse {
        /// The spool's path.
        path: PathBuf,
    },
    /// The file could not be opened, read or written (a read-only disk, a full disk, a
    /// directory that is gone).
    Io(StoreError),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::Full { bytes, max_bytes } => write!(
                f,
                "spool full: it holds {bytes} bytes of records, its cap is {max_bytes}"
            ),
            SpoolError::InUse { path } => write!(
                f,
                "spool {} is in use by another process (or another Spool of this one); give each process a spool path of its own",
                path.display()
            ),
            SpoolError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SpoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpoolError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StoreError> for SpoolError {
    fn from(e: StoreError) -> Self {
        SpoolError::Io(e)
    }
}

/// A bounded durable spool on local disk for the records a shared store (Postgres, Redis) did
/// not take: a SQLite file in WAL mode, fsync'd on each write (`synchronous = FULL`), that one
/// process owns.
///
/// Given to [`DeadLetterLayer::spool`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html#method.spool):
/// when the store fails a record write or does not answer within the layer's store timeout,
/// the record goes here instead, and a forwarder ([`Spool::forward`]) writes it into the store
/// as soon as the store answers again, then removes it from the spool. A process restarted
/// during the outage forwards what its spool holds.
///
/// Forwarding is idempotent: a record keeps its id; one the store already holds with this same
/// failure (the slow write that landed after all) is not written twice; a claim or a resolution
/// that reached the store meanwhile wins over the spooled failure (see [`Spool::forward`]).
/// Writes of the same id merge in the spool as in a store ([`Record::merge_bounded`]).
///
/// Bounded: [`with_max_bytes`](Spool::with_max_bytes) (default [`DEFAULT_SPOOL_MAX_BYTES`])
/// refuses a record past the cap ([`SpoolError::Full`]: the caller is told it was not stored),
/// and [`with_max_age`](Spool::with_max_age) (default [`DEFAULT_SPOOL_MAX_AGE`]) moves a record
/// older than it to the quarantine file rather than forward it days late. Nothing leaves the
/// spool silently: what is not forwarded is written, one JSON record per line, to the
/// quarantine file `<path>.quarantine.jsonl`, and logged.
///
/// One process per spool: the file is locked (`<path>.lock`, an advisory lock the operating
/// system drops when the process dies), and a second [`Spool::open`] of the same path fails with
/// [`SpoolError::InUse`]. A file that is not a readable spool at open (corrupt, or something
/// else) is moved aside to `<path>.corrupt-<unix ms>` and a fresh spool started; a record in it
/// that cannot be decoded is moved to the quarantine file when forwarding reaches it; either is
/// reported by [`quarantined`](Spool::quarantined) and logged at error.
///
/// # Example
///
/// ```
/// use tower_backstop_store::{MemoryStore, Record, ErrorEntry, Spool, Store};
/// use std::time::{Duration, SystemTime};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let dir = std::env::temp_dir().join(format!("spool-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let spool = Spool::open(dir.join("spool.db")).unwrap();
/// let record = Record::new("msg-1", ErrorEntry::new(SystemTime::now(), "transient", "503", "down", 1));
/// spool.put(record, None).await.unwrap();
/// assert_eq!(spool.state().records, 1);
///
/// let store = MemoryStore::new();
/// let forwarded = spool.forward_once(&store, Duration::from_secs(1)).await.unwrap();
/// assert_eq!(forwarded.written, 1);
/// assert!(store.get("msg-1").await.unwrap().is_some());
/// assert_eq!(spool.state().records, 0);
/// # drop(spool); std::fs::remove_dir_all(dir).unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    conn: Mutex<Connection>,
    max_bytes: AtomicU64,
    max_age: Mutex<Duration>,
    records: AtomicU64,
    bytes: AtomicU64,
    /// Whether the last forwarding found the store answering.
    store_up: AtomicBool,
    /// Records written to the quarantine file so far, by this process.
    quarantined_records: AtomicU64,
    /// Files moved aside at open.
    quarantined_files: Mutex<Vec<PathBuf>>,
    /// Told on each record spooled: a forwarder waiting on an empty spool wakes.
    spooled: tokio::sync::Notify,
    /// Whether a forwarder runs ([`Spool::forward`]).
    forwarding: AtomicBool,
    /// Held for the spool's life: the advisory lock on `<path>.lock`.
    _lock: File,
}

/// One spooled record as the forwarder reads it.
pub(crate) struct Spooled {
    pub(crate) id: String,
    pub(crate) version: i64,
    pub(crate) spooled_at: SystemTime,
    pub(crate) lease: Option<Lease>,
    /// The record, or the text that did not decode.
    pub(crate) record: Result<Record, String>,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS spool (
    id TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    spooled_at INTEGER NOT NULL,
    lease_token INTEGER,
    lease_until INTEGER,
    bytes INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS spool_order ON spool (spooled_at, id);";

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn io(path: &Path, what: &str) -> impl FnOnce(rusqlite::Error) -> SpoolError {
    let message = format!("spool {}: {what}", path.display());
    move |e| SpoolError::Io(StoreError::with_source(message, e))
}

/// `path` with `suffix` added to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Opens the SQLite file at `path` as a spool, or `Err` when it is not one (not a database,
/// corrupt, another schema).
fn connect(path: &Path) -> Result<Connection, SpoolError> {
    let conn = Connection::open(path).map_err(io(path, "cannot open"))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(io(path, "set busy timeout"))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(io(path, "set WAL mode"))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(io(path, "set synchronous"))?;
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(io(path, "check"))?;
    if check != "ok" {
        return Err(SpoolError::Io(StoreError::new(format!(
            "spool {}: corrupt: {check}",
            path.display()
        ))));
    }
    conn.execute_batch(SCHEMA)
        .map_err(io(path, "create the schema"))?;
    // A file with a table `spool` of another shape is not ours.
    conn.query_row(
        "SELECT id, version, spooled_at, lease_token, lease_until, bytes, record FROM spool LIMIT 1",
        [],
        |_| Ok(()),
    )
    .optional()
    .map_err(io(path, "read"))?;
    Ok(conn)
}

/// Whether `e` says the file is there but is not a readable spool (rather than the disk or
/// the directory refusing).
fn is_corrupt(e: &SpoolError) -> bool {
    let SpoolError::Io(e) = e else { return false };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = s.downcast_ref::<rusqlite::Error>() {
            return matches!(
                f.code,
                rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt
            ) || f.extended_code == rusqlite::ffi::SQLITE_ERROR;
        }
        source = s.source();
    }
    e.to_string().contains(": corrupt: ")
}

impl Spool {
    /// Opens the spool at `path` (a SQLite file, created with its directory's permissions when
    /// missing), with the default caps, and takes its lock for this process's life.
    ///
    /// A file at `path` that is not a readable spool is moved aside to
    /// `<path>.corrupt-<unix ms>` (logged at error, listed by
    /// [`quarantined`](Spool::quarantined)) and a fresh spool starts in its place.
    ///
    /// # Errors
    ///
    /// [`SpoolError::InUse`] when another [`Spool`] holds the lock of `path`;
    /// [`SpoolError::Io`] when the file or its lock cannot be created or opened (a read-only
    /// disk, a missing directory).
    pub fn open(path: impl AsRef<Path>) -> Result<Spool, SpoolError> {
        let path = path.as_ref().to_path_buf();
        let lock_path = beside(&path, ".lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                SpoolError::Io(StoreError::with_source(
                    format!("spool {}: cannot create its lock file", path.display()),
                    e,
                ))
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(SpoolError::InUse { path }),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(SpoolError::Io(StoreError::with_source(
                    format!(
                        "spool {}: cannot lock {}",
                        path.display(),
                        lock_path.display()
                    ),
                    e,
                )));
            }
        }
        let mut quarantined = Vec::new();
        let conn = match connect(&path) {
            Ok(conn) => conn,
            Err(e) if path.exists() && is_corrupt(&e) => {
                let aside = beside(&path, &format!(".corrupt-{}", millis(SystemTime::now())));
                tracing::error!(spool = %path.display(), moved_to = %aside.display(), error = %e, "spool file unreadable at open; moved aside, a fresh spool starts");
                std::fs::rename(&path, &aside).map_err(|io| {
                    SpoolError::Io(StoreError::with_source(
                        format!(
                            "spool {}: unreadable ({e}) and cannot be moved aside",
                            path.display()
                        ),
                        io,
                    ))
                })?;
                for side in ["-wal", "-shm"] {
                    let _ = std::fs::rename(beside(&path, side), beside(&aside, side));
                }
                quarantined.push(aside);
                connect(&path)?
            }
            Err(e) => return Err(e),
        };
        let (records, bytes): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM spool",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(io(&path, "count"))?;
        Ok(Spool {
            inner: Arc::new(Inner {
                path,
                conn: Mutex::new(conn),
                max_bytes: AtomicU64::new(DEFAULT_SPOOL_MAX_BYTES),
                max_age: Mutex::new(DEFAULT_SPOOL_MAX_AGE),
                records: AtomicU64::new(u64::try_from(records).unwrap_or(0)),
                bytes: AtomicU64::new(u64::try_from(bytes).unwrap_or(0)),
                store_up: AtomicBool::new(true),
                quarantined_records: AtomicU64::new(0),
                quarantined_files: Mutex::new(quarantined),
                spooled: tokio::sync::Notify::new(),
                forwarding: AtomicBool::new(false),
                _lock: lock,
            }),
        })
    }

    /// Caps the bytes of records (their JSON) the spool holds at `bytes` (default
    /// [`DEFAULT_SPOOL_MAX_BYTES`]): a record that would pass it is refused with
    /// [`SpoolError::Full`]. The file itself takes somewhat more (SQLite's pages, the WAL).
    pub fn with_max_bytes(self, bytes: u64) -> Self {
        self.inner.max_bytes.store(bytes, Ordering::Relaxed);
        self
    }

    /// Records spooled longer than `age` ago (default [`DEFAULT_SPOOL_MAX_AGE`]) are not
    /// forwarded: the forwarder moves them to the quarantine file (one JSON record per line)
    /// and logs each at error, so that a store that comes back after days is not flooded with
    /// stale requests.
    pub fn with_max_age(self, age: Duration) -> Self {
        if let Ok(mut max) = self.inner.max_age.lock() {
            *max = age;
        }
        self
    }

    /// The spool's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The quarantine file, `<path>.quarantine.jsonl`: the records taken out of the spool
    /// without being forwarded (past the age cap, or not decodable), one per line.
    pub fn quarantine_path(&self) -> PathBuf {
        beside(&self.inner.path, ".quarantine.jsonl")
    }

    /// The files moved aside at open because they were not a readable spool.
    pub fn quarantined(&self) -> Vec<PathBuf> {
        self.inner
            .quarantined_files
            .lock()
            .map(|files| files.clone())
            .unwrap_or_default()
    }

    /// What the spool holds now, and whether the store answered the last forwarding.
    pub fn state(&self) -> SpoolState {
        SpoolState {
            records: self.inner.records.load(Ordering::Relaxed),
            bytes: self.inner.bytes.load(Ordering::Relaxed),
            max_bytes: self.inner.max_bytes.load(Ordering::Relaxed),
            store_up: self.inner.store_up.load(Ordering::Relaxed),
            quarantined: self.inner.quarantined_records.load(Ordering::Relaxed),
        }
    }

    /// Writes `record` to the spool, merged into a spooled record with the same id
    /// ([`Record::merge_bounded`], the default history limit), and marks the store down in
    /// [`state`](Spool::state) until a forwarding finds it answering. `lease` is the claim the record
    /// was to be written under ([`Store::put_claimed`](crate::Store::put_claimed)): it is
    /// forwarded under that claim, which wins only if it still holds then.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Full`] when the record would pass the size cap; [`SpoolError::Io`] when
    /// the file cannot be written. Nothing is written then.
    pub fn put(
        &self,
        record: Record,
        lease: Option<Lease>,
    ) -> BoxFuture<'static, Result<(), SpoolError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let job = move || {
                // A record spooled is one the store did not take: down until a forwarding
                // finds it answering.
                inner.store_up.store(false, Ordering::Relaxed);
                let result = inner.put(record, lease.as_ref());
                if result.is_ok() {
                    inner.spooled.notify_one();
                }
                result
            };
            blocking(job).await
        })
    }

    /// Up to `limit` spooled records, the first spooled first.
    pub(crate) async fn peek(&self, limit: usize) -> Result<Vec<Spooled>, SpoolError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.peek(limit)).await
    }

    /// Removes each spooled record `(id, version)` that is still the version read, in one
    /// transaction (one fsync): a write of the same id meanwhile (merged into it) keeps it for
    /// the next round. Whether each was removed, in order.
    pub(crate) async fn remove_many(
        &self,
        items: Vec<(String, i64)>,
    ) -> Result<Vec<bool>, SpoolError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.remove_many(&items)).await
    }

    /// Moves the spooled record `id` (if still `version`) to the quarantine file with `text`.
    pub(crate) async fn quarantine(
        &self,
        id: String,
        version: i64,
        text: String,
    ) -> Result<bool, SpoolError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.remove(&id, version, Some(&text))).await
    }

    pub(crate) fn max_age(&self) -> Duration {
        self.inner
            .max_age
            .lock()
            .map_or(DEFAULT_SPOOL_MAX_AGE, |age| *age)
    }

    pub(crate) fn set_store_up(&self, up: bool) {
        self.inner.store_up.store(up, Ordering::Relaxed);
    }

    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.spooled.notified()
    }

    /// Whether a forwarder ([`forward`](Spool::forward)) runs for this spool now.
    pub fn is_forwarding(&self) -> bool {
        self.inner.forwarding.load(Ordering::Acquire)
    }

    /// Marks a forwarder running; `false` when one already is.
    pub(crate) fn start_forwarding(&self) -> bool {
        !self.inner.forwarding.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn stop_forwarding(&self) {
        self.inner.forwarding.store(false, Ordering::Release);
    }
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("path", &self.inner.path)
            .field("state", &self.state())
            .finish()
    }
}

/// Runs `job` on tokio's blocking pool (or here, outside a runtime).
async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, SpoolError> + Send + 'static,
) -> Result<T, SpoolError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(job)
            .await
            .map_err(|e| SpoolError::Io(StoreError::with_source("spool task failed", e)))?,
        Err(_) => job(),
    }
}

impl Inner {
    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>, SpoolError> {
        self.conn
            .lock()
            .map_err(|_| SpoolError::Io(StoreError::new("spool lock poisoned")))
    }

    fn put(&self, record: Record, lease: Option<&Lease>) -> Result<(), SpoolError> {
        let path = &self.path;
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(io(path, "begin"))?;
        let old: Option<(i64, i64, i64, String)> = tx
            .query_row(
                "SELECT version, spooled_at, bytes, record FROM spool WHERE id = ?1",
                [&record.id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()
            .map_err(io(path, "read"))?;
        let new = old.is_none();
        let (version, spooled_at, old_bytes, record) = match old {
            Some((version, at, bytes, text)) => {
                let merged = match serde_json::from_str::<Record>(&text) {
                    Ok(mut old) => {
                        old.merge_bounded(record, DEFAULT_HISTORY_LIMIT);
                        old
                    }
                    // An undecodable record is overwritten by the newer failure.
                    Err(_) => record,
                };
                (version + 1, at, u64::try_from(bytes).unwrap_or(0), merged)
            }
            None => (0, millis(SystemTime::now()), 0, record),
        };
        let text = serde_json::to_string(&record)
            .map_err(|e| SpoolError::Io(StoreError::with_source("spool: encode the record", e)))?;
        let new_bytes = text.len() as u64;
        // This process alone writes the spool (its lock): the totals kept in memory are its.
        let held = self.bytes.load(Ordering::Relaxed);
        let max_bytes = self.max_bytes.load(Ordering::Relaxed);
        let after = (held + new_bytes).saturating_sub(old_bytes);
        if after > max_bytes {
            return Err(SpoolError::Full {
                bytes: held,
                max_bytes,
            });
        }
        tx.execute(
            "INSERT INTO spool (id, version, spooled_at, lease_token, lease_until, bytes, record)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (id) DO UPDATE SET version = excluded.version,
                 lease_token = excluded.lease_token, lease_until = excluded.lease_until,
                 bytes = excluded.bytes, record = excluded.record",
            params![
                record.id,
                version,
                spooled_at,
                lease.map(|l| l.token),
                lease.map(|l| millis(l.until)),
                i64::try_from(new_bytes).unwrap_or(i64::MAX),
                text
            ],
        )
        .map_err(io(path, "write"))?;
        tx.commit().map_err(io(path, "commit"))?;
        if new {
            self.records.fetch_add(1, Ordering::Relaxed);
        }
        self.bytes.store(after, Ordering::Relaxed);
        Ok(())
    }

    fn peek(&self, limit: usize) -> Result<Vec<Spooled>, SpoolError> {
        let path = &self.path;
        let conn = self.conn()?;
        let mut statement = conn
            .prepare_cached(
                "SELECT id, version, spooled_at, lease_token, lease_until, record FROM spool
                 ORDER BY spooled_at, id LIMIT ?1",
            )
            .map_err(io(path, "read"))?;
        let rows = statement
            .query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |row| {
                let id: String = row.get(0)?;
                let token: Option<u32> = row.get(3)?;
                let until: Option<i64> = row.get(4)?;
                let text: String = row.get(5)?;
                Ok(Spooled {
                    lease: token
                        .zip(until)
                        .map(|(token, until)| Lease::new(id.clone(), token, from_millis(until))),
                    id,
                    version: row.get(1)?,
                    spooled_at: from_millis(row.get(2)?),
                    record: serde_json::from_str(&text).map_err(|_| text),
                })
            })
            .map_err(io(path, "read"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(io(path, "read"))
    }

    /// Deletes each `(id, version)` still at that version, in one transaction.
    fn remove_many(&self, items: &[(String, i64)]) -> Result<Vec<bool>, SpoolError> {
        let path = &self.path;
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(io(path, "begin"))?;
        let (mut removed, mut count, mut freed) = (Vec::with_capacity(items.len()), 0, 0);
        for (id, version) in items {
            let deleted: Option<i64> = tx
                .query_row(
                    "DELETE FROM spool WHERE id = ?1 AND version = ?2 RETURNING bytes",
                    params![id, version],
                    |row| row.get(0),
                )
                .optional()
                .map_err(io(path, "delete"))?;
            removed.push(deleted.is_some());
            if let Some(bytes) = deleted {
                count += 1;
                freed += u64::try_from(bytes).unwrap_or(0);
            }
        }
        tx.commit().map_err(io(path, "commit"))?;
        self.freed(count, freed);
        Ok(removed)
    }

    /// Takes `records` and `bytes` off the totals kept in memory.
    fn freed(&self, records: u64, bytes: u64) {
        let _ = self
            .records
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(records))
            });
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(bytes))
            });
    }

    /// Deletes `id` at `version`; with `quarantine`, appends that text to the quarantine file
    /// first (fsync'd), so that nothing leaves the spool unwritten.
    fn remove(&self, id: &str, version: i64, quarantine: Option<&str>) -> Result<bool, SpoolError> {
        let path = &self.path;
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(io(path, "begin"))?;
        let current: Option<(i64, i64)> = tx
            .query_row(
                "SELECT version, bytes FROM spool WHERE id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(io(path, "read"))?;
        let Some((_, bytes)) = current.filter(|(v, _)| *v == version) else {
            return Ok(false);
        };
        if let Some(text) = quarantine {
            let file = beside(path, ".quarantine.jsonl");
            let mut out = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .and_then(|mut out| {
                    out.write_all(text.replace('\n', " ").as_bytes())?;
                    out.write_all(b"\n")?;
                    out.sync_data()?;
                    Ok(out)
                })
                .map_err(|e| {
                    SpoolError::Io(StoreError::with_source(
                        format!("spool: cannot write the quarantine file {}", file.display()),
                        e,
                    ))
                })?;
            let _ = out.flush();
            self.quarantined_records.fetch_add(1, Ordering::Relaxed);
        }
        tx.execute("DELETE FROM spool WHERE id = ?1", [id])
            .map_err(io(path, "delete"))?;
        tx.commit().map_err(io(path, "commit"))?;
        self.freed(1, u64::try_from(bytes).unwrap_or(0));
        Ok(true)
    }
}
