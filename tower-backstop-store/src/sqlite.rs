use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::types::Value;
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};

use super::query::{Change, Claim, Counts, Filter, change_if_unchanged, claim, top_first};
use super::record::{DEFAULT_HISTORY_LIMIT, ErrorEntry, Record, Status, from_millis, to_millis};
use super::schedule::{from_micros, gap_micros, reserve, to_micros};
use super::{
    AuditAction, AuditEntry, BoxFuture, CountsCheck, FleetNote, Lease, SortKey, Store, StoreError,
};

mod counts;

/// A durable dead-letter store in one SQLite file (embedded, bundled SQLite; feature `sqlite`).
///
/// The database runs in WAL mode with `synchronous = FULL`, and each write is one transaction
/// (`BEGIN IMMEDIATE`): a record that [`put`](Store::put) reported written survives a crash and a
/// restart, and the record, its attempt counts, its tags and the first sighting of its code change
/// together. [`put_many`](Store::put_many) writes a whole batch in one transaction, which is what
/// makes bulk writes fast (one fsync per batch). Calls run on tokio's blocking pool, so the async
/// worker that hit the failure is not blocked on the disk. Clones share one connection; several
/// processes may open the same file (writes wait up to the busy timeout, 5 s by default, for
/// each other).
///
/// Faults of the file, and recovery without a restart:
///
/// - A write that fails because the file is read-only, cannot be opened, or an I/O error drops
///   the connection; the next call opens the file again, so writes resume once the file is
///   writable again. (SQLite opens a file it may not write read-only, silently; only reopening
///   notices the fix.)
/// - Before each write the store checks that the file it has open is still the one at its path:
///   when the file or its directory was removed (or replaced), it opens the path again (a new,
///   empty store when the directory is back) or, while that fails, reports the write as failed,
///   never writing into a file nobody can reach any more.
/// - A write lock held by another process past the busy timeout fails the write with SQLite's
///   "database is locked"; the connection stays, and the next write goes through once the lock is
///   released.
///
/// Every failed write is a [`StoreError`]; through a [`DeadLetterLayer`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html)
/// the caller's failure says the record was not written and a `tracing` error reports it.
///
/// Claims and the next due time read one partial index, `dead_letters_due`: the waiting records
/// (deferred, or in flight until their lease ends) by retry-at time and id, so that a claim reads
/// its batch in order and the time it takes does not grow with the backlog; an older file gets
/// the index when it is opened for writing. Keyset pages ([`search_after`](Store::search_after),
/// [`search_waiting_after`](Store::search_waiting_after), behind
/// [`list_after`](crate::list_after)) read the same index for the waiting records, and
/// `dead_letters_listed` (status, last failure time descending, id) for the others, from their
/// key on: a page deep in the list costs what the first one does. A search by position
/// ([`search`](Store::search)) reads and skips every record before its page. Each connection keeps a page cache of
/// [`DEFAULT_CACHE_SIZE`](SqliteStore::DEFAULT_CACHE_SIZE) (64 MiB;
/// [`with_cache_size`](SqliteStore::with_cache_size)), and keeps the query planner's statistics
/// up to date as SQLite recommends for long-lived connections: `PRAGMA optimize` when it opens
/// the file, then after every 10,000 writes or hour (it re-analyzes a table only when its size
/// changed tenfold; otherwise it costs microseconds).
///
/// Each acknowledgement of a claim ([`change_claimed`](Store::change_claimed)) is a
/// transaction of its own, flushed to the disk before it returns: a scheduler's drain is bound
/// by how fast the disk flushes, one record per flush, whatever the number of schedulers on the
/// file (their writes take turns).
///
/// Layout: a `dead_letters` table (one row per id, indexed by class, code, last failure time,
/// status, and the due index), `dead_letter_tags` (id, key, value; indexed by key and value),
/// `dead_letter_codes` (each code's first sighting), `dead_letter_audit` (the audit trail) and
/// `dead_letter_slots` (the shared send schedules of [`reserve_slot`](Store::reserve_slot):
/// a name and the next free time in microseconds; created on first use in a file written by an
/// earlier version) and `dead_letter_notes` (the fleet's notes of [`put_note`](Store::put_note):
/// one row per topic and author, times in milliseconds, indexed by expiry time; added to a file
/// of an earlier version when it is opened for writing). [`put_note`](Store::put_note) is one
/// transaction that deletes the expired notes and writes the note in place of the older one;
/// [`notes`](Store::notes) one `SELECT` of the notes not expired.
///
/// # Counts
///
/// A table `dead_letter_counts` keeps how many records there are of each status, class and
/// code (one row per key), and triggers on `dead_letters` change it in the transaction of every
/// write: a put, a change of status, a claim, a deletion. So the all-time counts read a few
/// rows, whatever the number of records: [`count_by_class`](Store::count_by_class),
/// [`count`](Store::count) with a filter of a status, a class and a code at most, and
/// [`counts`](Store::counts) from a time at or before the oldest record's last failure
/// (`UNIX_EPOCH`). The counts of a shorter window stay exact: they read the covering index by
/// status and last failure time, as many entries as records in the window.
///
/// A file made by an earlier version gets the table and its triggers the first time it is
/// opened for writing, filled from its records in the same `BEGIN IMMEDIATE` transaction:
/// about 3 s per million records, during which other processes' writes wait, up to their busy
/// timeout (5 s by default: above about 1.5 million records, a write of another process may
/// fail with "database is locked" meanwhile, and its caller retries or defers). A file opened
/// read-only before that counts by reading its records.
/// [`check_counts`](Store::check_counts) recounts the records and repairs the table.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    conn: Arc<Mutex<Link>>,
    path: PathBuf,
    history_limit: usize,
}

/// The connection and how to open it again.
#[derive(Debug)]
struct Link {
    conn: Option<Connection>,
    closed: bool,
    read_only: bool,
    tuning: Tuning,
    /// The identity (device, inode) of the file the connection has open, on Unix.
    file: Option<(u64, u64)>,
    /// When to run `PRAGMA optimize` again on this connection.
    optimize: Optimize,
}

/// The settings of each connection, kept to open the file again with them.
#[derive(Clone, Copy, Debug)]
struct Tuning {
    busy_timeout: Duration,
    /// The page cache, in bytes.
    cache_size: usize,
}

impl Tuning {
    /// Applies the settings to `conn`.
    fn apply(self, conn: &mut Connection) -> Result<(), StoreError> {
        BUSY_TIMEOUT.set(self.busy_timeout);
        conn.busy_handler(Some(wait_for_lock))
            .map_err(sql_error("set busy handler"))?;
        // A negative size is in KiB; at least one page.
        let kib = i64::try_from(self.cache_size / 1024)
            .unwrap_or(i64::MAX)
            .max(1);
        conn.pragma_update(None, "cache_size", -kib)
            .map_err(sql_error("set the page cache size"))
    }
}

thread_local! {
    /// How long a statement on this thread waits for another connection's lock: the busy
    /// timeout of the store whose connection this thread is using, set before each use.
    static BUSY_TIMEOUT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    /// When the statement waiting for a lock on this thread gives up.
    static BUSY_UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// SQLite's busy handler: called with how many times it was called for the same lock, it sleeps
/// briefly and says whether to try again, until the thread's [`BUSY_TIMEOUT`] has passed since
/// the first call.
///
/// SQLite's own (`sqlite3_busy_timeout`) sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 then
/// 100 ms: a connection that found the lock taken sleeps longer than most of the transactions it
/// waits for last (a claim or acknowledgement of a batch holds it for a few milliseconds), and
/// several connections over one file spend their time sleeping. This one sleeps 50 µs, doubling
/// up to 800 µs.
fn wait_for_lock(count: i32) -> bool {
    let now = Instant::now();
    if count == 0 {
        BUSY_UNTIL.set(Some(now + BUSY_TIMEOUT.get()));
    }
    let until = BUSY_UNTIL.get().unwrap_or(now);
    if now >= until {
        return false;
    }
    let step = Duration::from_micros(50 << count.clamp(0, 4)).min(until - now);
    std::thread::sleep(step);
    true
}

/// When a long-lived connection runs `PRAGMA optimize` again: after [`Optimize::WRITES`] writes
/// or [`Optimize::EVERY`], whichever comes first, checked after each write. SQLite recommends
/// `PRAGMA optimize=0x10002` when a long-lived connection opens and then `PRAGMA optimize`
/// periodically (<https://sqlite.org/pragma.html#pragma_optimize>); the store runs the first at
/// open (with 0x10, the analysis limit plain `PRAGMA optimize` uses, so that a large file opens
/// quickly). It re-analyzes a table only when its size changed tenfold since its statistics, or
/// an index has none: usually it does nothing, in microseconds.
#[derive(Debug)]
struct Optimize {
    writes: u32,
    since: Instant,
}

impl Optimize {
    const WRITES: u32 = 10_000;
    const EVERY: Duration = Duration::from_secs(3600);

    fn new(now: Instant) -> Self {
        Optimize {
            writes: 0,
            since: now,
        }
    }

    /// Counts a write made at `now`; whether to optimize now (and count again from here).
    fn after_write(&mut self, now: Instant) -> bool {
        self.writes += 1;
        let due =
            self.writes >= Self::WRITES || now.saturating_duration_since(self.since) >= Self::EVERY;
        if due {
            *self = Optimize::new(now);
        }
        due
    }
}

/// The schema version written to `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS dead_letters (
    id                 TEXT PRIMARY KEY,
    class              TEXT NOT NULL,
    code               TEXT NOT NULL,
    message            TEXT NOT NULL,
    attempts           INTEGER NOT NULL,
    budget_spent       INTEGER NOT NULL,
    first_failed_at_ms INTEGER NOT NULL,
    last_failed_at_ms  INTEGER NOT NULL,
    retry_at_ms        INTEGER,
    status             TEXT NOT NULL,
    resends            INTEGER NOT NULL,
    resolved_at_ms     INTEGER,
    history            TEXT NOT NULL,
    tags               TEXT NOT NULL,
    payload            BLOB NOT NULL,
    payload_truncated  INTEGER NOT NULL,
    payload_len        INTEGER NOT NULL,
    content_type       TEXT,
    metadata           TEXT NOT NULL,
    headers            TEXT NOT NULL DEFAULT '[]',
    redacted_headers   TEXT NOT NULL DEFAULT '[]',
    cause              TEXT,
    breaker            TEXT
);
CREATE INDEX IF NOT EXISTS dead_letters_by_class ON dead_letters (class, last_failed_at_ms);
CREATE INDEX IF NOT EXISTS dead_letters_by_code ON dead_letters (code, last_failed_at_ms);
CREATE INDEX IF NOT EXISTS dead_letters_by_time ON dead_letters (last_failed_at_ms);
-- Covering for the counts of a window by status (class and code read from the index).
CREATE INDEX IF NOT EXISTS dead_letters_by_status ON dead_letters (status, last_failed_at_ms, class, code);
-- The due index (DUE_INDEX below) is made by `ensure_due_index`, for old files too.
CREATE TABLE IF NOT EXISTS dead_letter_tags (
    id    TEXT NOT NULL,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dead_letter_tags_by_value ON dead_letter_tags (key, value);
CREATE TABLE IF NOT EXISTS dead_letter_codes (
    code          TEXT PRIMARY KEY,
    first_seen_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter_slots (
    name    TEXT PRIMARY KEY,
    next_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter_audit (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms   INTEGER NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    filter  TEXT NOT NULL,
    planned INTEGER,
    sent    INTEGER NOT NULL,
    outcome TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter_notes (
    topic         TEXT NOT NULL,
    author        TEXT NOT NULL,
    body          TEXT NOT NULL,
    written_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, author)
);
CREATE INDEX IF NOT EXISTS dead_letter_notes_by_expiry ON dead_letter_notes (expires_at_ms);
";

/// The records a scheduler may claim, in claim order: the waiting ones (deferred, or in flight
/// until the end of their lease) by retry-at time, then id. What [`CLAIM_DUE`] and [`NEXT_DUE`]
/// read, and nothing else: the terms of its `WHERE` are theirs, word for word (SQLite uses a
/// partial index only for a query whose `WHERE` contains its terms).
const DUE_INDEX: &str = "CREATE INDEX IF NOT EXISTS dead_letters_due ON dead_letters \
                         (retry_at_ms, id) WHERE status IN ('deferred', 'in_flight') \
                         AND retry_at_ms IS NOT NULL";

/// The records of each status in the order lists show them, the most recently failed first,
/// ties by id: what keyset pages of the dead and the resolved records
/// ([`Store::search_after`]) read from their key on, with no sort.
const LIST_INDEX: &str = "CREATE INDEX IF NOT EXISTS dead_letters_listed ON dead_letters \
                          (status, last_failed_at_ms DESC, id)";

/// The index by retry-at time of earlier versions, of every status: the due index replaced it.
const OLD_RETRY_INDEX: &str = "DROP INDEX IF EXISTS dead_letters_by_retry";

/// The due records at `?1` (milliseconds), at most `?2`, in claim order, after the columns
/// (`COLUMNS`). `INDEXED BY`: without statistics (a new file, or one that grew since its last
/// `ANALYZE`), SQLite's planner prefers the index by status, whose equality on two statuses it
/// estimates at a few rows, and then sorts every waiting row; over 100,000 waiting records that
/// is half a second a claim. Naming the due index makes the plan the same on every file, and a
/// change of the query that the index cannot serve an error at prepare instead of a silent sort.
const CLAIM_DUE: &str = "FROM dead_letters INDEXED BY dead_letters_due
     WHERE status IN ('deferred', 'in_flight') AND retry_at_ms IS NOT NULL AND retry_at_ms <= ?1
     ORDER BY retry_at_ms, id LIMIT ?2";

/// The earliest retry-at time of the records a scheduler may claim, off the due index (see
/// [`CLAIM_DUE`] for `INDEXED BY`).
const NEXT_DUE: &str = "SELECT retry_at_ms FROM dead_letters INDEXED BY dead_letters_due
     WHERE status IN ('deferred', 'in_flight') AND retry_at_ms IS NOT NULL
     ORDER BY retry_at_ms LIMIT 1";

/// Makes the due index in a file of any version (idempotent: nothing is written when it is
/// there), drops the index it replaced, and brings the planner's statistics up to date
/// (`PRAGMA optimize=0x10012`; see [`Optimize`]). Best effort: a file that is read-only at the
/// moment opens without them (its writes fail anyway, and the connection is opened again, and
/// this run again, once they succeed).
fn ensure_due_index(conn: &Connection, path: &Path) {
    let done = conn
        .execute_batch(&format!(
            "{DUE_INDEX}; {OLD_RETRY_INDEX}; PRAGMA optimize=0x10012;"
        ))
        .map_err(sql_error("create the due index"));
    if let Err(e) = done {
        tracing::warn!(
            path = %path.display(),
            error = %e,
            "sqlite dead-letter store: cannot create the due index or update the planner's \
             statistics; claims fail until the file is writable"
        );
    }
}

/// Makes the list index ([`LIST_INDEX`]) in a file of any version (idempotent: nothing is
/// written when it is there); before [`ensure_due_index`], whose statistics then cover it.
/// Best effort, as that one: on a file that is read-only at the moment, keyset pages read
/// another index and sort.
fn ensure_list_index(conn: &Connection, path: &Path) {
    if let Err(e) = conn
        .execute_batch(LIST_INDEX)
        .map_err(sql_error("create the list index"))
    {
        tracing::warn!(
            path = %path.display(),
            error = %e,
            "sqlite dead-letter store: cannot create the list index; pages by cursor sort \
             their records until the file is writable"
        );
    }
}

fn sql_error(what: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::with_source(format!("sqlite dead-letter store: {what}"), e)
}

fn json_error(what: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
    move |e| StoreError::with_source(format!("sqlite dead-letter store: {what}"), e)
}

/// The identity of the file at `path` (device and inode, on Unix), or `None` when there is no
/// file there (or on other systems, where it is not checked).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Whether the file has the table `name`.
fn has_table(conn: &Connection, name: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1")
        .and_then(|mut stmt| stmt.query_row(params![name], |row| row.get::<_, i64>(0)))
        .map(|n| n > 0)
        .map_err(sql_error("read schema"))
}

/// Opens `path` for reading and writing, creating it and its schema when needed.
fn connect(path: &Path, tuning: Tuning) -> Result<Connection, StoreError> {
    let mut conn = Connection::open(path).map_err(|e| {
        StoreError::with_source(
            format!("cannot open sqlite dead-letter store {}", path.display()),
            e,
        )
    })?;
    tuning.apply(&mut conn)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql_error("set WAL mode"))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql_error("set synchronous"))?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sql_error("read schema version"))?;
    let has_table = has_table(&conn, "dead_letters")?;
    if has_table && (version == 2 || version == 3) {
        // Version 2 had no headers, version 3 no root cause and no breaker: add them, empty, in
        // one transaction.
        let headers = if version == 2 {
            "ALTER TABLE dead_letters ADD COLUMN headers TEXT NOT NULL DEFAULT '[]';
             ALTER TABLE dead_letters ADD COLUMN redacted_headers TEXT NOT NULL DEFAULT '[]';"
        } else {
            ""
        };
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE;
             {headers}
             ALTER TABLE dead_letters ADD COLUMN cause TEXT;
             ALTER TABLE dead_letters ADD COLUMN breaker TEXT;
             PRAGMA user_version = {SCHEMA_VERSION};
             COMMIT;"
        ))
        .map_err(|e| {
            StoreError::with_source(
                format!("sqlite dead-letter store: upgrade schema {version} to {SCHEMA_VERSION}"),
                e,
            )
        })?;
    } else if has_table && !matches!(version, 4 | 5 | SCHEMA_VERSION) {
        // Version 4 had no audit trail and version 5 no fleet notes: the schema below adds
        // their tables.
        return Err(StoreError::new(format!(
            "sqlite dead-letter store {} has schema version {version}, this version of \
             tower-backstop reads version {SCHEMA_VERSION}",
            path.display()
        )));
    }
    if !(has_table && version == SCHEMA_VERSION) {
        // Only a new or upgraded file is written here: a current one opens even when it is
        // read-only at the moment (its writes then fail, each with its own error).
        conn.execute_batch(SCHEMA)
            .map_err(sql_error("create schema"))?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(sql_error("write schema version"))?;
    }
    ensure_list_index(&conn, path);
    ensure_due_index(&conn, path);
    counts::ensure_table(&mut conn, path);
    Ok(conn)
}

/// Opens `path` for reading only.
fn connect_read_only(path: &Path, tuning: Tuning) -> Result<Connection, StoreError> {
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| {
        StoreError::with_source(
            format!("cannot open sqlite dead-letter store {}", path.display()),
            e,
        )
    })?;
    tuning.apply(&mut conn)?;
    Ok(conn)
}

/// Whether a failed write means the connection must be opened again: the file became
/// read-only or unreachable, or the disk failed under it. A busy or locked database does not.
fn needs_reopen(error: &StoreError) -> bool {
    use rusqlite::ErrorCode::*;
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = e.downcast_ref::<rusqlite::Error>() {
            return matches!(
                f.code,
                ReadOnly | CannotOpen | SystemIoFailure | DiskFull | NotADatabase
            );
        }
        source = e.source();
    }
    false
}

impl Link {
    /// Runs `PRAGMA optimize` after the write made at `now` when it is due. Best effort: a
    /// failure is logged, and the next one is tried in its turn.
    fn optimize_if_due(&mut self, now: Instant) {
        if !self.optimize.after_write(now) {
            return;
        }
        if let Some(conn) = &self.conn
            && let Err(e) = conn.execute_batch("PRAGMA optimize")
        {
            tracing::warn!(error = %e, "sqlite dead-letter store: PRAGMA optimize failed");
        }
    }

    /// The connection, opened again first when it was dropped or its file is no longer the one
    /// at `path`.
    fn connection(&mut self, path: &Path) -> Result<&mut Connection, StoreError> {
        if self.closed {
            return Err(StoreError::closed());
        }
        BUSY_TIMEOUT.set(self.tuning.busy_timeout);
        let now = file_id(path);
        let moved = cfg!(unix) && self.conn.is_some() && now != self.file;
        if moved {
            tracing::error!(
                path = %path.display(),
                "sqlite dead-letter store: the database file was removed or replaced; opening \
                 the path again"
            );
            self.conn = None;
        }
        if self.conn.is_none() {
            let reopened = if self.read_only {
                connect_read_only(path, self.tuning)
            } else if now.is_none()
                && path
                    .parent()
                    .is_some_and(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            {
                Err(StoreError::new(format!(
                    "sqlite dead-letter store {}: the directory of the database is gone",
                    path.display()
                )))
            } else {
                connect(path, self.tuning)
            };
            self.conn = Some(reopened?);
            self.file = file_id(path);
            self.optimize = Optimize::new(Instant::now());
        }
        self.conn.as_mut().ok_or_else(StoreError::closed)
    }
}

impl SqliteStore {
    /// The page cache of each connection unless [`with_cache_size`](SqliteStore::with_cache_size)
    /// says otherwise: 64 MiB (SQLite's own default is 2 MiB), so that what claims and views
    /// read again and again (the front of the due index, the upper levels of every index) stays
    /// in memory in a store of millions of records. The cache fills only as pages are read.
    pub const DEFAULT_CACHE_SIZE: usize = 64 << 20;

    /// Opens (creating if needed) the store at `path`, keeping the last
    /// [`DEFAULT_HISTORY_LIMIT`] errors per record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the file cannot be opened or created (a missing directory, no
    /// permission, not a SQLite database), the schema cannot be written, or the file holds a
    /// dead-letter table of another schema version.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        SqliteStore::open_with(path.as_ref(), false)
    }

    /// Opens an existing store for reading only (what `backstop-dlq list` and `stats` use).
    /// Every write fails with a [`StoreError`] that says the database is read-only.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the file does not exist or is not a SQLite database.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        SqliteStore::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, read_only: bool) -> Result<Self, StoreError> {
        let tuning = Tuning {
            busy_timeout: Duration::from_secs(5),
            cache_size: SqliteStore::DEFAULT_CACHE_SIZE,
        };
        let conn = if read_only {
            connect_read_only(path, tuning)?
        } else {
            connect(path, tuning)?
        };
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(Link {
                conn: Some(conn),
                closed: false,
                read_only,
                tuning,
                file: file_id(path),
                optimize: Optimize::new(Instant::now()),
            })),
            path: path.to_path_buf(),
            history_limit: DEFAULT_HISTORY_LIMIT,
        })
    }

    /// Keeps the last `limit` errors per record (at least one).
    pub fn with_history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// How long a write waits for another connection's (or process's) write lock before it
    /// fails with "database is locked". Default 5 s.
    pub fn with_busy_timeout(self, timeout: Duration) -> Self {
        self.tune(|tuning| tuning.busy_timeout = timeout)
    }

    /// The size of SQLite's page cache for this store's connection, in bytes (rounded down to
    /// KiB, at least one page): the indexes and records it keeps in memory between calls.
    /// Default [`DEFAULT_CACHE_SIZE`](SqliteStore::DEFAULT_CACHE_SIZE), 64 MiB. It is memory
    /// the process may use, per store opened: the cache fills only as pages are read.
    pub fn with_cache_size(self, bytes: usize) -> Self {
        self.tune(|tuning| tuning.cache_size = bytes)
    }

    /// Changes the connection's settings, now and for every reopening.
    fn tune(self, change: impl FnOnce(&mut Tuning)) -> Self {
        if let Ok(mut link) = self.conn.lock() {
            change(&mut link.tuning);
            let tuning = link.tuning;
            if let Some(conn) = &mut link.conn {
                let _ = tuning.apply(conn);
            }
        }
        self
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the connection; every later call fails with [`StoreError::closed`].
    pub fn close(&self) {
        if let Ok(mut link) = self.conn.lock() {
            link.conn = None;
            link.closed = true;
        }
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.call(false, f)
    }

    /// Runs `f` on the connection, on tokio's blocking pool; after a `write` that succeeded,
    /// runs `PRAGMA optimize` when it is due ([`Optimize`]).
    fn call<T: Send + 'static>(
        &self,
        write: bool,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let link = Arc::clone(&self.conn);
        let path = self.path.clone();
        Box::pin(async move {
            let job = move || {
                let mut guard = link
                    .lock()
                    .map_err(|_| StoreError::new("sqlite dead-letter store lock poisoned"))?;
                let result = f(guard.connection(&path)?);
                if let Err(e) = &result
                    && needs_reopen(e)
                {
                    // Open the file again on the next call: it may be writable by then.
                    guard.conn = None;
                }
                if write && result.is_ok() {
                    guard.optimize_if_due(Instant::now());
                }
                result
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle.spawn_blocking(job).await.map_err(|e| {
                    StoreError::with_source("sqlite dead-letter store task failed", e)
                })?,
                Err(_) => job(),
            }
        })
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction and commits it.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.call(true, move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql_error("begin"))?;
            let out = f(&tx)?;
            tx.commit().map_err(sql_error("commit"))?;
            Ok(out)
        })
    }
}

const COLUMNS: &str = "id, class, code, message, attempts, budget_spent, first_failed_at_ms, \
                       last_failed_at_ms, retry_at_ms, status, resends, resolved_at_ms, history, \
                       tags, payload, payload_truncated, payload_len, content_type, metadata, \
                       headers, redacted_headers, cause, breaker";

fn decode<T: serde::de::DeserializeOwned>(idx: usize, text: &str) -> rusqlite::Result<T> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A record's headers in their JSON form (the record's own: `[name, "utf8:…"]` pairs).
#[derive(serde::Deserialize)]
struct Headers(#[serde(with = "super::record::header_list")] Vec<(String, Vec<u8>)>);

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    let status: String = row.get(9)?;
    let status: Status = status.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, Box::new(e))
    })?;
    let history: Vec<ErrorEntry> = decode(12, &row.get::<_, String>(12)?)?;
    let tags: BTreeMap<String, String> = decode(13, &row.get::<_, String>(13)?)?;
    let metadata: BTreeMap<String, String> = decode(18, &row.get::<_, String>(18)?)?;
    let headers: Headers = decode(19, &row.get::<_, String>(19)?)?;
    let redacted_headers: Vec<String> = decode(20, &row.get::<_, String>(20)?)?;
    let cause: Option<ErrorEntry> = match row.get::<_, Option<String>>(21)? {
        Some(text) => Some(decode(21, &text)?),
        None => None,
    };
    Ok(Record {
        id: row.get(0)?,
        class: row.get(1)?,
        code: row.get(2)?,
        message: row.get(3)?,
        attempts: row.get(4)?,
        budget_spent: row.get(5)?,
        first_failed_at: from_millis(row.get(6)?),
        last_failed_at: from_millis(row.get(7)?),
        retry_at: row.get::<_, Option<i64>>(8)?.map(from_millis),
        status,
        resends: row.get(10)?,
        resolved_at: row.get::<_, Option<i64>>(11)?.map(from_millis),
        history,
        tags,
        payload: row.get(14)?,
        payload_truncated: row.get(15)?,
        payload_len: row.get::<_, i64>(16)?.try_into().unwrap_or(0),
        content_type: row.get(17)?,
        metadata,
        headers: headers.0,
        redacted_headers,
        cause,
        breaker: row.get(22)?,
    })
}

fn read_record(tx: &Transaction<'_>, id: &str) -> Result<Option<Record>, StoreError> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?1"))
        .map_err(sql_error("read record"))?
        .query_row(params![id], row_to_record)
        .optional()
        .map_err(sql_error("read record"))
}

/// Writes the whole row of `record` and its tags, replacing what was there.
fn write_row(tx: &Transaction<'_>, record: &Record) -> Result<(), StoreError> {
    let history = serde_json::to_string(&record.history).map_err(json_error("encode history"))?;
    let tags = serde_json::to_string(&record.tags).map_err(json_error("encode tags"))?;
    let metadata =
        serde_json::to_string(&record.metadata).map_err(json_error("encode metadata"))?;
    let mut headers = Vec::new();
    super::record::header_list::serialize(
        &record.headers,
        &mut serde_json::Serializer::new(&mut headers),
    )
    .map_err(json_error("encode headers"))?;
    let headers = String::from_utf8(headers)
        .map_err(|e| StoreError::with_source("sqlite dead-letter store: encode headers", e))?;
    let redacted_headers =
        serde_json::to_string(&record.redacted_headers).map_err(json_error("encode headers"))?;
    let cause = record
        .cause
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(json_error("encode cause"))?;
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO dead_letters ({COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
                 ?20, ?21, ?22, ?23)"
    ))
    .map_err(sql_error("write record"))?
    .execute(params![
        record.id,
        record.class,
        record.code,
        record.message,
        record.attempts,
        record.budget_spent,
        to_millis(record.first_failed_at),
        to_millis(record.last_failed_at),
        record.retry_at.map(to_millis),
        record.status.as_str(),
        record.resends,
        record.resolved_at.map(to_millis),
        history,
        tags,
        record.payload,
        record.payload_truncated,
        i64::try_from(record.payload_len).unwrap_or(i64::MAX),
        record.content_type,
        metadata,
        headers,
        redacted_headers,
        cause,
        record.breaker,
    ])
    .map_err(sql_error("write record"))?;
    tx.prepare_cached("DELETE FROM dead_letter_tags WHERE id = ?1")
        .map_err(sql_error("write tags"))?
        .execute(params![record.id])
        .map_err(sql_error("write tags"))?;
    let mut insert = tx
        .prepare_cached("INSERT INTO dead_letter_tags (id, key, value) VALUES (?1, ?2, ?3)")
        .map_err(sql_error("write tags"))?;
    for (key, value) in &record.tags {
        insert
            .execute(params![record.id, key, value])
            .map_err(sql_error("write tags"))?;
    }
    Ok(())
}

/// Merges `record` into the row with its id (or inserts it) and notes its code's first sighting.
fn put_record(tx: &Transaction<'_>, mut record: Record, limit: usize) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO dead_letter_codes (code, first_seen_ms) VALUES (?1, ?2)",
    )
    .map_err(sql_error("write code"))?
    .execute(params![record.code, to_millis(record.last_failed_at)])
    .map_err(sql_error("write code"))?;
    let record = match read_record(tx, &record.id)? {
        Some(mut existing) => {
            existing.merge_bounded(record, limit);
            existing
        }
        None => {
            record.bound_history(limit);
            record
        }
    };
    write_row(tx, &record)
}

/// A `WHERE` clause and its parameters for `filter`.
fn where_clause(filter: &Filter) -> (String, Vec<Value>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let mut push = |clause: &str, value: Value, values: &mut Vec<Value>| {
        values.push(value);
        clauses.push(clause.replace('?', &format!("?{}", values.len())));
    };
    if let Some(class) = &filter.class {
        push("class = ?", Value::Text(class.clone()), &mut values);
    }
    if let Some(code) = &filter.code {
        push("code = ?", Value::Text(code.clone()), &mut values);
    }
    if let Some(since) = filter.since {
        push(
            "last_failed_at_ms >= ?",
            Value::Integer(to_millis(since)),
            &mut values,
        );
    }
    if let Some(until) = filter.until {
        push(
            "last_failed_at_ms < ?",
            Value::Integer(to_millis(until)),
            &mut values,
        );
    }
    if let Some(status) = filter.status {
        push(
            "status = ?",
            Value::Text(status.as_str().to_owned()),
            &mut values,
        );
    }
    for (key, value) in &filter.tags {
        values.push(Value::Text(key.clone()));
        values.push(Value::Text(value.clone()));
        clauses.push(format!(
            "id IN (SELECT id FROM dead_letter_tags WHERE key = ?{} AND value = ?{})",
            values.len() - 1,
            values.len()
        ));
    }
    if !filter.ids.is_empty() {
        let mut marks = Vec::new();
        for id in &filter.ids {
            values.push(Value::Text(id.clone()));
            marks.push(format!("?{}", values.len()));
        }
        clauses.push(format!("id IN ({})", marks.join(", ")));
    }
    if clauses.is_empty() {
        ("1".to_owned(), values)
    } else {
        (clauses.join(" AND "), values)
    }
}

/// The keyset read of [`Store::search_after`]: the records of `filter` the most recently failed
/// first, ties by id, after `after`, at most `limit`; its SQL and parameters. With a status, it
/// reads the list index ([`LIST_INDEX`]) from the key on.
fn newest_after(filter: &Filter, after: Option<&SortKey>, limit: usize) -> (String, Vec<Value>) {
    let (mut clause, mut values) = where_clause(filter);
    if let Some(key) = after {
        // Newest first, then by id: not one direction, so not a row-value comparison. The
        // `<=` bounds the index range; the rest skips the ties up to the key's id.
        values.push(Value::Integer(to_millis(key.at)));
        values.push(Value::Text(key.id.clone()));
        let (t, id) = (values.len() - 1, values.len());
        clause.push_str(&format!(
            " AND last_failed_at_ms <= ?{t} AND (last_failed_at_ms < ?{t} OR id > ?{id})"
        ));
    }
    values.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "SELECT {COLUMNS} FROM dead_letters WHERE {clause}
         ORDER BY last_failed_at_ms DESC, id LIMIT ?{}",
        values.len()
    );
    (sql, values)
}

/// The keyset read of [`Store::search_waiting_after`]: the waiting records of `filter` the
/// soonest due first, ties by id, after `after`, at most `limit`; its SQL and parameters. It
/// reads the due index from the key on, named (`INDEXED BY`, for the reason given at
/// [`CLAIM_DUE`]), with its terms word for word (see [`DUE_INDEX`]).
fn soonest_after(filter: &Filter, after: Option<&SortKey>, limit: usize) -> (String, Vec<Value>) {
    let (mut clause, mut values) = where_clause(filter);
    if let Some(key) = after {
        values.push(Value::Integer(to_millis(key.at)));
        values.push(Value::Text(key.id.clone()));
        let (t, id) = (values.len() - 1, values.len());
        clause.push_str(&format!(" AND (retry_at_ms, id) > (?{t}, ?{id})"));
    }
    values.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "SELECT {COLUMNS} FROM dead_letters INDEXED BY dead_letters_due
         WHERE status IN ('deferred', 'in_flight') AND retry_at_ms IS NOT NULL AND {clause}
         ORDER BY retry_at_ms, id LIMIT ?{}",
        values.len()
    );
    (sql, values)
}

/// The waiting records `sql` selects off the due index, which it names (`INDEXED BY`, for the
/// reason given at [`CLAIM_DUE`]). A file this version could not give that index (read-only
/// since before it) is read with the same query unnamed, which SQLite may sort.
fn read_due(conn: &Connection, sql: &str, values: Vec<Value>) -> Result<Vec<Record>, StoreError> {
    let what = "search waiting records";
    match read_records(conn, sql, values.clone(), what) {
        Err(e) if format!("{e:?}").contains("no such index") => {
            let unnamed = sql.replace(" INDEXED BY dead_letters_due", "");
            read_records(conn, &unnamed, values, what)
        }
        read => read,
    }
}

/// The records `sql` selects (its columns [`COLUMNS`]) with `values`; `what` names the read in
/// its errors.
fn read_records(
    conn: &Connection,
    sql: &str,
    values: Vec<Value>,
    what: &'static str,
) -> Result<Vec<Record>, StoreError> {
    let mut stmt = conn.prepare(sql).map_err(sql_error(what))?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(values), row_to_record)
        .map_err(sql_error(what))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(sql_error("decode record"))
}

/// The codes first seen at or after `since` (ms), with that time, the oldest first.
fn new_codes(conn: &Connection, since: i64) -> Result<Vec<(String, SystemTime)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT code, first_seen_ms FROM dead_letter_codes WHERE first_seen_ms >= ?1 \
             ORDER BY first_seen_ms, code",
        )
        .map_err(sql_error("read codes"))?;
    stmt.query_map(params![since], |row| {
        Ok((row.get::<_, String>(0)?, from_millis(row.get(1)?)))
    })
    .map_err(sql_error("read codes"))?
    .collect::<Result<Vec<_>, _>>()
    .map_err(sql_error("read codes"))
}

fn count_pairs(conn: &Connection, sql: &str, since: i64) -> Result<Vec<(String, u64)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(sql)
        .map_err(sql_error("count records"))?;
    let rows = stmt
        .query_map(params![since], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .map_err(sql_error("count records"))?;
    let pairs: Vec<(String, i64)> = rows
        .collect::<Result<_, _>>()
        .map_err(sql_error("count records"))?;
    Ok(top_first(
        pairs
            .into_iter()
            .map(|(k, n)| (k, u64::try_from(n).unwrap_or(0))),
    ))
}

impl Store for SqliteStore {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        let limit = self.history_limit;
        self.write(move |tx| {
            for record in records {
                put_record(tx, record, limit)?;
            }
            Ok(())
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.run(move |conn| {
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?1"))
                .map_err(sql_error("read record"))?
                .query_row(params![id], row_to_record)
                .optional()
                .map_err(sql_error("read record"))
        })
    }

    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (clause, mut values) = where_clause(filter);
        values.push(Value::Integer(
            i64::try_from(page.len()).unwrap_or(i64::MAX),
        ));
        values.push(Value::Integer(
            i64::try_from(page.start).unwrap_or(i64::MAX),
        ));
        let n = values.len();
        self.run(move |conn| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM dead_letters WHERE {clause}
                     ORDER BY last_failed_at_ms DESC, id LIMIT ?{} OFFSET ?{n}",
                    n - 1
                ))
                .map_err(sql_error("search records"))?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(values), row_to_record)
                .map_err(sql_error("search records"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql_error("decode record"))
        })
    }

    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        if matches!(filter.status, Some(Status::Dead | Status::Resolved)) || page.is_empty() {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        let (clause, mut values) = where_clause(filter);
        values.push(Value::Integer(
            i64::try_from(page.len()).unwrap_or(i64::MAX),
        ));
        values.push(Value::Integer(
            i64::try_from(page.start).unwrap_or(i64::MAX),
        ));
        let n = values.len();
        let sql = format!(
            "SELECT {COLUMNS} FROM dead_letters INDEXED BY dead_letters_due
             WHERE status IN ('deferred', 'in_flight') AND retry_at_ms IS NOT NULL AND {clause}
             ORDER BY retry_at_ms, id LIMIT ?{} OFFSET ?{n}",
            n - 1
        );
        self.run(move |conn| read_due(conn, &sql, values))
    }

    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (sql, values) = newest_after(filter, after, limit);
        self.run(move |conn| read_records(conn, &sql, values, "search records"))
    }

    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        if matches!(filter.status, Some(Status::Dead | Status::Resolved)) || limit == 0 {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        let (sql, values) = soonest_after(filter, after, limit);
        self.run(move |conn| read_due(conn, &sql, values))
    }

    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (clause, values) = where_clause(filter);
        let by_table = counts::counted_by_table(filter).then(|| filter.clone());
        self.run(move |conn| {
            if let Some(filter) = by_table
                && let Some(n) = counts::count(conn, &filter)?
            {
                return Ok(n);
            }
            conn.prepare(&format!("SELECT COUNT(*) FROM dead_letters WHERE {clause}"))
                .map_err(sql_error("count records"))?
                .query_row(rusqlite::params_from_iter(values), |row| {
                    row.get::<_, i64>(0)
                })
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(sql_error("count records"))
        })
    }

    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        let since = to_millis(since);
        self.run(move |conn| {
            if counts::window_is_all_time(conn, since)?
                && let Some(mut counts) = counts::all_time(conn)?
            {
                counts.new_codes = new_codes(conn, since)?;
                return Ok(counts);
            }
            let by_class = count_pairs(
                conn,
                "SELECT class, COUNT(*) FROM dead_letters WHERE last_failed_at_ms >= ?1 \
                 AND status = 'dead' GROUP BY class",
                since,
            )?;
            let by_code = count_pairs(
                conn,
                "SELECT code, COUNT(*) FROM dead_letters WHERE last_failed_at_ms >= ?1 \
                 AND status = 'dead' GROUP BY code",
                since,
            )?;
            let new_codes = new_codes(conn, since)?;
            let deferred: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM dead_letters WHERE last_failed_at_ms >= ?1 \
                     AND status IN ('deferred', 'in_flight')",
                )
                .and_then(|mut stmt| stmt.query_row(params![since], |row| row.get(0)))
                .map_err(sql_error("count deferred records"))?;
            Ok(Counts {
                total: by_class.iter().map(|(_, n)| n).sum(),
                by_class,
                by_code,
                new_codes,
                deferred: u64::try_from(deferred).unwrap_or(0),
            })
        })
    }

    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        let path = self.path.clone();
        self.call(repair, move |conn| counts::check(conn, &path, repair))
    }

    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some(mut record) = read_record(tx, &id)? else {
                return Ok(None);
            };
            change.apply(&mut record);
            write_row(tx, &record)?;
            Ok(Some(record))
        })
    }

    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |tx| {
            let mut due = {
                let mut stmt = tx
                    .prepare_cached(&format!("SELECT {COLUMNS} {CLAIM_DUE}"))
                    .map_err(sql_error("claim records"))?;
                stmt.query_map(params![to_millis(now), limit], row_to_record)
                    .map_err(sql_error("claim records"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql_error("decode record"))?
            };
            let mut update = tx
                .prepare_cached(
                    "UPDATE dead_letters SET status = ?2, retry_at_ms = ?3, resends = ?4 \
                     WHERE id = ?1",
                )
                .map_err(sql_error("claim records"))?;
            for record in &mut due {
                claim(record, now, lease);
                update
                    .execute(params![
                        record.id,
                        record.status.as_str(),
                        record.retry_at.map(to_millis),
                        record.resends
                    ])
                    .map_err(sql_error("claim records"))?;
            }
            Ok(due)
        })
    }

    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let seen = seen.clone();
        self.write(move |tx| {
            let mut current = read_record(tx, &seen.id)?;
            let claim = change_if_unchanged(current.as_mut(), &seen, change);
            if let Claim::Claimed(record) = &claim {
                write_row(tx, record)?;
            }
            Ok(claim)
        })
    }

    fn applies_batches(&self) -> bool {
        true
    }

    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let breaker = breaker.to_owned();
        self.write(move |tx| {
            let released = tx
                .prepare_cached(
                    "UPDATE dead_letters SET retry_at_ms = ?1 WHERE status = 'deferred' \
                     AND breaker = ?2 AND retry_at_ms > ?1",
                )
                .map_err(sql_error("release held records"))?
                .execute(params![to_millis(now), breaker])
                .map_err(sql_error("release held records"))?;
            Ok(Some(released as u64))
        })
    }

    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        self.write(move |tx| {
            changes
                .into_iter()
                .map(|(lease, change)| {
                    let mut current = read_record(tx, &lease.id)?;
                    let claim = change_if_unchanged(current.as_mut(), &lease.as_seen(), change);
                    if let Claim::Claimed(record) = &claim {
                        write_row(tx, record)?;
                    }
                    Ok(claim)
                })
                .collect()
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
        self.write(move |tx| {
            let Some(current) = read_record(tx, &lease.id)? else {
                return Ok(Claim::Missing);
            };
            if !lease.holds(&current) {
                return Ok(Claim::ClaimedElsewhere {
                    status: current.status,
                    resends: current.resends,
                });
            }
            put_record(tx, record, limit)?;
            Ok(match read_record(tx, &lease.id)? {
                Some(written) => Claim::Claimed(Box::new(written)),
                None => Claim::Missing,
            })
        })
    }

    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.run(move |conn| {
            conn.prepare_cached(NEXT_DUE)
                .map_err(sql_error("read the next due time"))?
                .query_row([], |row| row.get::<_, i64>(0))
                .optional()
                .map(|ms| ms.map(from_millis))
                .map_err(sql_error("read the next due time"))
        })
    }

    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        let schedule = schedule.to_owned();
        let (now, gap) = (to_micros(now), gap_micros(gap));
        self.write(move |tx| {
            // A file of an earlier version has no schedules yet.
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS dead_letter_slots (
                     name    TEXT PRIMARY KEY,
                     next_us INTEGER NOT NULL
                 )",
            )
            .map_err(sql_error("create the send schedules"))?;
            let next: Option<i64> = tx
                .prepare_cached("SELECT next_us FROM dead_letter_slots WHERE name = ?1")
                .map_err(sql_error("read the send schedule"))?
                .query_row(params![schedule], |row| row.get(0))
                .optional()
                .map_err(sql_error("read the send schedule"))?;
            let (slot, after) = reserve(next, now, gap);
            tx.prepare_cached(
                "INSERT INTO dead_letter_slots (name, next_us) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET next_us = excluded.next_us",
            )
            .map_err(sql_error("write the send schedule"))?
            .execute(params![schedule, after])
            .map_err(sql_error("write the send schedule"))?;
            Ok(from_micros(slot))
        })
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let id = id.to_owned();
        self.run(move |conn| {
            conn.prepare_cached("SELECT budget_spent FROM dead_letters WHERE id = ?1")
                .map_err(sql_error("read attempt budget"))?
                .query_row(params![id], |row| row.get::<_, u32>(0))
                .optional()
                .map_err(sql_error("read attempt budget"))
        })
    }

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.write(move |tx| {
            // The notes expired by the writer's clock go first: off the index by expiry time,
            // usually none.
            tx.prepare_cached("DELETE FROM dead_letter_notes WHERE expires_at_ms <= ?1")
                .map_err(sql_error("delete expired notes"))?
                .execute(params![to_millis(note.written_at)])
                .map_err(sql_error("delete expired notes"))?;
            tx.prepare_cached(
                "INSERT INTO dead_letter_notes (topic, author, body, written_at_ms, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (topic, author) DO UPDATE SET body = excluded.body,
                     written_at_ms = excluded.written_at_ms,
                     expires_at_ms = excluded.expires_at_ms",
            )
            .map_err(sql_error("write note"))?
            .execute(params![
                note.topic,
                note.author,
                note.body,
                to_millis(note.written_at),
                to_millis(note.expires_at),
            ])
            .map_err(sql_error("write note"))?;
            Ok(())
        })
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.run(move |conn| {
            let mut stmt = match conn.prepare_cached(
                "SELECT topic, author, body, written_at_ms, expires_at_ms
                 FROM dead_letter_notes WHERE expires_at_ms > ?1",
            ) {
                Ok(stmt) => stmt,
                // A file of an earlier version opened read-only has no notes yet.
                Err(_) if !has_table(conn, "dead_letter_notes")? => return Ok(Vec::new()),
                Err(e) => return Err(sql_error("read notes")(e)),
            };
            let rows = stmt
                .query_map(params![to_millis(now)], |row| {
                    Ok(FleetNote {
                        topic: row.get(0)?,
                        author: row.get(1)?,
                        body: row.get(2)?,
                        written_at: from_millis(row.get(3)?),
                        expires_at: from_millis(row.get(4)?),
                    })
                })
                .map_err(sql_error("read notes"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql_error("decode note"))
        })
    }

    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.write(move |tx| {
            tx.prepare_cached(
                "INSERT INTO dead_letter_audit (at_ms, actor, action, filter, planned, sent, outcome)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(sql_error("write audit entry"))?
            .execute(params![
                to_millis(entry.at),
                entry.actor,
                entry.action.as_str(),
                entry.filter,
                entry.planned.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                i64::try_from(entry.sent).unwrap_or(i64::MAX),
                entry.outcome,
            ])
            .map_err(sql_error("write audit entry"))?;
            Ok(())
        })
    }

    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.run(move |conn| {
            // A file of an earlier version opened read-only has no trail yet.
            if page.is_empty() || !has_table(conn, "dead_letter_audit")? {
                return Ok(Vec::new());
            }
            let mut stmt = conn
                .prepare_cached(
                    "SELECT at_ms, actor, action, filter, planned, sent, outcome
                     FROM dead_letter_audit ORDER BY seq DESC LIMIT ?1 OFFSET ?2",
                )
                .map_err(sql_error("read audit trail"))?;
            let rows = stmt
                .query_map(
                    params![
                        i64::try_from(page.len()).unwrap_or(i64::MAX),
                        i64::try_from(page.start).unwrap_or(i64::MAX)
                    ],
                    |row| {
                        let action: String = row.get(2)?;
                        let action = AuditAction::parse(&action).ok_or_else(|| {
                            rusqlite::Error::FromSqlConversionFailure(
                                2,
                                rusqlite::types::Type::Text,
                                format!("unknown audit action {action:?}").into(),
                            )
                        })?;
                        Ok(AuditEntry {
                            at: from_millis(row.get(0)?),
                            actor: row.get(1)?,
                            action,
                            filter: row.get(3)?,
                            planned: row
                                .get::<_, Option<i64>>(4)?
                                .map(|n| u64::try_from(n).unwrap_or(0)),
                            sent: u64::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
                            outcome: row.get(6)?,
                        })
                    },
                )
                .map_err(sql_error("read audit trail"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql_error("decode audit entry"))
        })
    }

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (clause, values) = where_clause(filter);
        self.write(move |tx| {
            let ids: Vec<String> = {
                let mut stmt = tx
                    .prepare(&format!("SELECT id FROM dead_letters WHERE {clause}"))
                    .map_err(sql_error("delete records"))?;
                stmt.query_map(rusqlite::params_from_iter(values), |row| row.get(0))
                    .map_err(sql_error("delete records"))?
                    .collect::<Result<_, _>>()
                    .map_err(sql_error("delete records"))?
            };
            for id in &ids {
                for sql in [
                    "DELETE FROM dead_letter_tags WHERE id = ?1",
                    "DELETE FROM dead_letters WHERE id = ?1",
                ] {
                    tx.prepare_cached(sql)
                        .map_err(sql_error("delete records"))?
                        .execute(params![id])
                        .map_err(sql_error("delete records"))?;
                }
            }
            Ok(ids.len() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` waiting records of five classes: every tenth due an hour ago, the others deferred
    /// to the next day; and as many dead and resolved ones beside them, which no claim reads.
    fn backlog(count: u64) -> Vec<Record> {
        let now = SystemTime::now();
        (0..count)
            .flat_map(|n| {
                let entry =
                    ErrorEntry::new(now, "transient", format!("http {}", 500 + n % 20), "m", 1);
                let mut waiting = Record::new(format!("w-{n:06}"), entry.clone());
                waiting.class = ["a", "b", "c", "d", "e"][(n % 5) as usize].to_owned();
                waiting.status = Status::Deferred;
                waiting.retry_at = Some(if n % 10 == 0 {
                    now - Duration::from_secs(3600)
                } else {
                    now + Duration::from_secs(60 + n)
                });
                let mut dead = Record::new(format!("d-{n:06}"), entry.clone());
                dead.status = Status::Dead;
                let mut resolved = Record::new(format!("r-{n:06}"), entry);
                resolved.status = Status::Resolved;
                resolved.resolved_at = Some(now);
                [waiting, dead, resolved]
            })
            .collect()
    }

    /// The lines of `EXPLAIN QUERY PLAN` of `sql`.
    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let n = stmt.parameter_count();
        let values = vec![Value::Integer(to_millis(SystemTime::now())); n];
        stmt.query_map(rusqlite::params_from_iter(values), |row| {
            row.get::<_, String>(3)
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    /// The claim and the next due time read the due index in its order, with no sort, whether
    /// the planner has statistics or not.
    #[tokio::test]
    async fn claims_and_the_next_due_time_read_the_due_index_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.db");
        let store = SqliteStore::open(&path).unwrap();
        for chunk in backlog(10_000).chunks(1_000) {
            store.put_many(chunk.to_vec()).await.unwrap();
        }
        let conn = Connection::open(&path).unwrap();
        for analyzed in [false, true] {
            if analyzed {
                conn.execute_batch("ANALYZE").unwrap();
            }
            for sql in [format!("SELECT {COLUMNS} {CLAIM_DUE}"), NEXT_DUE.to_owned()] {
                let lines = plan(&conn, &sql);
                assert!(
                    lines.len() == 1 && lines[0].contains("USING INDEX dead_letters_due ("),
                    "analyzed: {analyzed}, {sql}: {lines:?}"
                );
                assert!(
                    !lines.iter().any(|l| l.contains("TEMP B-TREE")),
                    "analyzed: {analyzed}, {sql}: {lines:?}"
                );
            }
        }
        // And the claim takes the due records, the earliest first.
        let claimed = store
            .claim_due(SystemTime::now(), 5, Duration::from_secs(10))
            .await
            .unwrap();
        let ids: Vec<&str> = claimed.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["w-000000", "w-000010", "w-000020", "w-000030", "w-000040"]
        );
    }

    /// The lines of `EXPLAIN QUERY PLAN` of `sql` with `values`.
    fn plan_with(conn: &Connection, sql: &str, values: Vec<Value>) -> Vec<String> {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(rusqlite::params_from_iter(values), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Keyset pages read an index from their key on, in the list's order, and sort nothing:
    /// the dead and the resolved records off the list index, the waiting ones off the due index,
    /// with a class or not, whether the planner has statistics or not.
    #[tokio::test]
    async fn keyset_pages_read_an_index_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyset.db");
        let store = SqliteStore::open(&path).unwrap();
        for chunk in backlog(10_000).chunks(1_000) {
            store.put_many(chunk.to_vec()).await.unwrap();
        }
        let conn = Connection::open(&path).unwrap();
        let key = SortKey::new(SystemTime::now(), "d-005000");
        for analyzed in [false, true] {
            if analyzed {
                conn.execute_batch("ANALYZE").unwrap();
            }
            for status in [Status::Dead, Status::Resolved] {
                // A status alone: the list index, in its order.
                let filter = Filter::new().status(status);
                let (sql, values) = newest_after(&filter, Some(&key), 50);
                let lines = plan_with(&conn, &sql, values);
                assert!(
                    lines.len() == 1 && lines[0].contains("USING INDEX dead_letters_listed ("),
                    "analyzed: {analyzed}, {filter}: {lines:?}"
                );
                // With a class: the list index, or the class's index by time whose ties of
                // one time SQLite puts in id order ("LAST TERM"); never a sort of all.
                let filter = filter.class("a");
                let (sql, values) = newest_after(&filter, Some(&key), 50);
                let lines = plan_with(&conn, &sql, values);
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains("USING INDEX dead_letters_listed (")
                            || l.contains("USING INDEX dead_letters_by_class (")),
                    "analyzed: {analyzed}, {filter}: {lines:?}"
                );
                assert!(
                    !lines.iter().any(|l| l.contains("TEMP B-TREE FOR ORDER BY")),
                    "analyzed: {analyzed}, {filter}: {lines:?}"
                );
            }
            for filter in [
                Filter::new(),
                Filter::new().status(Status::Deferred),
                Filter::new().class("a"),
            ] {
                let (sql, values) = soonest_after(&filter, Some(&key), 50);
                let lines = plan_with(&conn, &sql, values);
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains("USING INDEX dead_letters_due (")),
                    "analyzed: {analyzed}, {filter}: {lines:?}"
                );
                assert!(
                    !lines.iter().any(|l| l.contains("TEMP B-TREE")),
                    "analyzed: {analyzed}, {filter}: {lines:?}"
                );
            }
        }
    }

    /// A file without the due index, opened read-only (so it cannot get it): the waiting
    /// records still read, by position and after a key, in due order.
    #[tokio::test]
    async fn waiting_records_read_without_the_due_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-due.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(30)).await.unwrap();
        let want = store
            .search_waiting(&Filter::new(), 0..usize::MAX)
            .await
            .unwrap();
        assert_eq!(want.len(), 30);
        store.close();
        Connection::open(&path)
            .unwrap()
            .execute_batch("DROP INDEX dead_letters_due")
            .unwrap();
        let read_only = SqliteStore::open_read_only(&path).unwrap();
        let page = read_only
            .search_waiting(&Filter::new(), 5..10)
            .await
            .unwrap();
        assert_eq!(page, want[5..10]);
        let key = SortKey::new(want[4].retry_at.unwrap(), want[4].id.clone());
        let after = read_only
            .search_waiting_after(&Filter::new(), Some(&key), 5)
            .await
            .unwrap();
        assert_eq!(after, want[5..10]);
    }

    fn indexes(path: &Path) -> Vec<String> {
        Connection::open(path)
            .unwrap()
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'dead_letters' \
                 AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// A file of an earlier version (its index by retry-at, no due index) gets the due index
    /// when it is opened, once: opening it again changes nothing.
    #[tokio::test]
    async fn an_older_file_gets_the_due_index_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(10)).await.unwrap();
        store.close();
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "DROP INDEX dead_letters_due;
                 CREATE INDEX dead_letters_by_retry ON dead_letters (retry_at_ms)
                     WHERE retry_at_ms IS NOT NULL;",
            )
            .unwrap();
        let expected = [
            "dead_letters_by_class",
            "dead_letters_by_code",
            "dead_letters_by_status",
            "dead_letters_by_time",
            "dead_letters_due",
            "dead_letters_listed",
        ];
        for _ in 0..2 {
            let store = SqliteStore::open(&path).unwrap();
            assert_eq!(indexes(&path), expected);
            let claimed = store
                .claim_due(SystemTime::now(), 100, Duration::from_secs(10))
                .await
                .unwrap();
            assert!(claimed.iter().all(|r| r.status == Status::InFlight));
            store.close();
        }
    }

    /// Opening a file brings the planner's statistics up to date: the due index of a file
    /// written without them has its row in `sqlite_stat1` once the file is opened again.
    #[tokio::test]
    async fn opening_a_file_analyzes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(1_000)).await.unwrap();
        store.close();
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("DROP TABLE IF EXISTS sqlite_stat1")
            .unwrap();
        let _store = SqliteStore::open(&path).unwrap();
        let stat: String = conn
            .query_row(
                "SELECT stat FROM sqlite_stat1 WHERE idx = 'dead_letters_due'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        // The first number is the number of rows in the index: the waiting records.
        assert!(stat.starts_with("1000 "), "{stat}");
    }

    /// `PRAGMA optimize` is due after `Optimize::WRITES` writes or `Optimize::EVERY`, whichever
    /// comes first, and counts again from there.
    #[test]
    fn optimize_is_due_after_so_many_writes_or_so_long() {
        let start = Instant::now();
        let mut optimize = Optimize::new(start);
        for _ in 1..Optimize::WRITES {
            assert!(!optimize.after_write(start));
        }
        assert!(optimize.after_write(start), "the 10,000th write");
        assert!(!optimize.after_write(start), "counted again from there");
        let later = start + Optimize::EVERY;
        assert!(optimize.after_write(later), "an hour later");
        assert!(!optimize.after_write(later + Duration::from_secs(1)));
    }

    fn cache_size(store: &SqliteStore) -> i64 {
        let link = store.conn.lock().unwrap();
        link.conn
            .as_ref()
            .unwrap()
            .pragma_query_value(None, "cache_size", |row| row.get(0))
            .unwrap()
    }

    /// The page cache is 64 MiB unless set, in KiB as SQLite counts it, and the setting is kept.
    #[test]
    fn the_page_cache_is_64_mib_unless_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.db");
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(cache_size(&store), -65_536);
        let store = store.with_cache_size(8 << 20);
        assert_eq!(cache_size(&store), -8_192);
        assert_eq!(store.conn.lock().unwrap().tuning.cache_size, 8 << 20);
        let read_only = SqliteStore::open_read_only(&path).unwrap();
        assert_eq!(cache_size(&read_only), -65_536);
    }

    /// A file of schema version 5 (no fleet notes) reads no notes when opened read-only, and
    /// gains the notes' table, and version 6, when opened for writing; its records stay.
    #[tokio::test]
    async fn a_version_5_file_gets_the_notes_table_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v5.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(3)).await.unwrap();
        store.close();
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "DROP TABLE dead_letter_notes;
                 PRAGMA user_version = 5;",
            )
            .unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let read_only = SqliteStore::open_read_only(&path).unwrap();
        assert_eq!(read_only.notes(now).await.unwrap(), []);
        let store = SqliteStore::open(&path).unwrap();
        let version: i64 = Connection::open(&path)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let note = FleetNote::new("breaker:a", "p-1", "{}", now, Duration::from_secs(5));
        store.put_note(note.clone()).await.unwrap();
        assert_eq!(store.notes(now).await.unwrap(), [note]);
        assert_eq!(store.count(&Filter::new()).await.unwrap(), 9);
    }

    /// The counts a store gives, all time and by status, and whether its check is clean.
    async fn counts_of(store: &SqliteStore) -> (Vec<(String, u64)>, u64, u64, bool) {
        let all = store.counts(SystemTime::UNIX_EPOCH).await.unwrap();
        let resolved = store
            .count(&Filter::new().status(Status::Resolved))
            .await
            .unwrap();
        let clean = match store.check_counts(false).await {
            Ok(check) => check.is_clean(),
            Err(e) => {
                assert!(e.to_string().contains("no counts table"), "{e}");
                true
            }
        };
        (all.by_class, all.deferred, resolved, clean)
    }

    /// A file made before the counts table (its records written without the triggers) counts
    /// by reading its records when opened read-only, and gets the table, filled from its
    /// records, when opened for writing.
    #[tokio::test]
    async fn a_file_without_the_counts_table_gets_it_filled_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("before.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(50)).await.unwrap();
        let want = counts_of(&store).await;
        assert_eq!(want.1, 50, "the waiting records");
        assert!(want.3);
        store.close();
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE dead_letter_counts;
             DROP TRIGGER IF EXISTS dead_letter_counts_insert;
             DROP TRIGGER IF EXISTS dead_letter_counts_replace;
             DROP TRIGGER IF EXISTS dead_letter_counts_update;
             DROP TRIGGER IF EXISTS dead_letter_counts_delete;",
        )
        .unwrap();
        // Written as an earlier version wrote: no trigger counts these.
        conn.execute_batch(
            "UPDATE dead_letters SET status = 'dead' WHERE id IN
                 (SELECT id FROM dead_letters WHERE status = 'deferred' LIMIT 5);",
        )
        .unwrap();
        drop(conn);
        let read_only = SqliteStore::open_read_only(&path).unwrap();
        let before = counts_of(&read_only).await;
        assert_eq!(before.1, 45, "read from the records");
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(counts_of(&store).await, before, "the same, from the table");
        assert!(has_table(&Connection::open(&path).unwrap(), "dead_letter_counts").unwrap());
        store.put_many(backlog(10)).await.unwrap();
        let after = counts_of(&store).await;
        let scanned = store
            .count(
                &Filter::new()
                    .status(Status::Deferred)
                    .since(SystemTime::UNIX_EPOCH),
            )
            .await
            .unwrap();
        assert_eq!(after.1, scanned, "as many as the records say");
        assert!(after.3, "the triggers count the new writes");
    }

    /// A counter changed by hand is a drift the check reports (expected and found) and repairs;
    /// a counter cannot be set below 0, and one at 0 whose record is deleted stays at 0.
    #[tokio::test]
    async fn a_counter_changed_by_hand_is_reported_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drift.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_many(backlog(40)).await.unwrap();
        let want = counts_of(&store).await;
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE dead_letter_counts SET n = n + 7 WHERE status = 'dead' AND code = 'http 500';
             UPDATE dead_letter_counts SET n = 0 WHERE status = 'resolved' AND code = 'http 501';",
        )
        .unwrap();
        let negative =
            conn.execute_batch("UPDATE dead_letter_counts SET n = -1 WHERE code = 'http 502'");
        assert!(negative.is_err(), "a counter cannot be negative");
        // The record of a counter at 0 deleted: the counter stays at 0.
        let id: String = conn
            .query_row(
                "SELECT id FROM dead_letters WHERE status = 'resolved' AND code = 'http 501' \
                 LIMIT 1",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(store.delete(&Filter::new().id(id)).await.unwrap(), 1);
        let n: i64 = conn
            .query_row(
                "SELECT n FROM dead_letter_counts WHERE status = 'resolved' AND code = 'http 501'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(n, 0);
        let by_class = store.count_by_class().await.unwrap();
        assert_ne!(by_class, want.0, "the counts read the table");
        let found = store.check_counts(false).await.unwrap();
        assert_eq!(found.drifts.len(), 2, "{found:?}");
        assert!(!found.repaired);
        let dead = &found.drifts[0];
        assert_eq!(
            (dead.status, dead.code.as_deref()),
            (Status::Dead, Some("http 500"))
        );
        assert_eq!(dead.found, dead.expected + 7);
        let resolved = &found.drifts[1];
        assert_eq!(resolved.status, Status::Resolved);
        assert_eq!((resolved.found, resolved.expected), (0, 1));
        assert!(
            store.check_counts(false).await.unwrap().drifts.len() == 2,
            "not repaired"
        );
        let repaired = store.check_counts(true).await.unwrap();
        assert!(repaired.repaired);
        assert_eq!(repaired.drifts, found.drifts);
        let after = counts_of(&store).await;
        assert!(after.3, "clean after the repair");
        assert_eq!(after.0, want.0);
        assert_eq!(after.2, want.2 - 1);
    }
}
