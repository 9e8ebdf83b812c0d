use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::record::{Record, from_millis, to_millis};
use super::store::{BoxFuture, Store, StoreError, sort_counts};

/// A durable dead-letter store in one SQLite file (embedded, bundled SQLite; feature `sqlite`).
///
/// The database runs in WAL mode with `synchronous = FULL`, and each write is one transaction:
/// a record that [`put`](Store::put) reported written survives a crash and a restart. Calls run on
/// tokio's blocking pool, so the async worker that hit the failure is not blocked on the disk.
/// Clones share one connection.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    conn: Arc<Mutex<Option<Connection>>>,
    path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS dead_letters (
    id                 TEXT PRIMARY KEY,
    class              TEXT NOT NULL,
    code               TEXT NOT NULL,
    message            TEXT NOT NULL,
    attempts           INTEGER NOT NULL,
    first_failed_at_ms INTEGER NOT NULL,
    last_failed_at_ms  INTEGER NOT NULL,
    retry_at_ms        INTEGER,
    payload            BLOB NOT NULL,
    content_type       TEXT,
    metadata           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letters_by_class ON dead_letters (class, last_failed_at_ms);
CREATE INDEX IF NOT EXISTS dead_letters_by_time ON dead_letters (last_failed_at_ms);
";

fn sql_error(what: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::with_source(format!("sqlite dead-letter store: {what}"), e)
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the file cannot be opened or created (a missing directory, no
    /// permission, not a SQLite database) or the schema cannot be written.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = Connection::open(&path).map_err(|e| {
            StoreError::with_source(
                format!("cannot open sqlite dead-letter store {}", path.display()),
                e,
            )
        })?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql_error("set WAL mode"))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql_error("set synchronous"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql_error("set busy timeout"))?;
        conn.execute_batch(SCHEMA)
            .map_err(sql_error("create schema"))?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(Some(conn))),
            path,
        })
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the connection; every later call fails with [`StoreError::closed`].
    pub fn close(&self) {
        if let Ok(mut conn) = self.conn.lock() {
            conn.take();
        }
    }

    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let conn = Arc::clone(&self.conn);
        Box::pin(async move {
            let job = move || {
                let mut guard = conn
                    .lock()
                    .map_err(|_| StoreError::new("sqlite dead-letter store lock poisoned"))?;
                let conn = guard.as_mut().ok_or_else(StoreError::closed)?;
                f(conn)
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle.spawn_blocking(job).await.map_err(|e| {
                    StoreError::with_source("sqlite dead-letter store task failed", e)
                })?,
                Err(_) => job(),
            }
        })
    }
}

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    let metadata: String = row.get(10)?;
    let metadata: BTreeMap<String, String> = serde_json::from_str(&metadata).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(10, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(Record {
        id: row.get(0)?,
        class: row.get(1)?,
        code: row.get(2)?,
        message: row.get(3)?,
        attempts: row.get(4)?,
        first_failed_at: from_millis(row.get(5)?),
        last_failed_at: from_millis(row.get(6)?),
        retry_at: row.get::<_, Option<i64>>(7)?.map(from_millis),
        payload: row.get(8)?,
        content_type: row.get(9)?,
        metadata,
    })
}

const COLUMNS: &str = "id, class, code, message, attempts, first_failed_at_ms, last_failed_at_ms, \
                       retry_at_ms, payload, content_type, metadata";

impl Store for SqliteStore {
    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(move |conn| {
            let metadata = serde_json::to_string(&record.metadata)
                .map_err(|e| StoreError::with_source("cannot encode metadata", e))?;
            let tx = conn.transaction().map_err(sql_error("begin"))?;
            tx.execute(
                "INSERT INTO dead_letters (id, class, code, message, attempts, first_failed_at_ms, \
                     last_failed_at_ms, retry_at_ms, payload, content_type, metadata)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (id) DO UPDATE SET
                     class = excluded.class,
                     code = excluded.code,
                     message = excluded.message,
                     attempts = attempts + excluded.attempts,
                     first_failed_at_ms = MIN(first_failed_at_ms, excluded.first_failed_at_ms),
                     last_failed_at_ms = excluded.last_failed_at_ms,
                     retry_at_ms = excluded.retry_at_ms,
                     payload = excluded.payload,
                     content_type = excluded.content_type,
                     metadata = excluded.metadata",
                params![
                    record.id,
                    record.class,
                    record.code,
                    record.message,
                    record.attempts,
                    to_millis(record.first_failed_at),
                    to_millis(record.last_failed_at),
                    record.retry_at.map(to_millis),
                    record.payload,
                    record.content_type,
                    metadata,
                ],
            )
            .map_err(sql_error("write record"))?;
            tx.commit().map_err(sql_error("commit"))?;
            Ok(())
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.run(move |conn| {
            conn.query_row(
                &format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?1"),
                params![id],
                row_to_record,
            )
            .optional()
            .map_err(sql_error("read record"))
        })
    }

    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM dead_letters ORDER BY last_failed_at_ms DESC, id LIMIT ?1"
                ))
                .map_err(sql_error("list records"))?;
            let rows = stmt
                .query_map(params![limit], row_to_record)
                .map_err(sql_error("list records"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql_error("decode record"))
        })
    }

    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        self.run(|conn| {
            let mut stmt = conn
                .prepare("SELECT class, COUNT(*) FROM dead_letters GROUP BY class")
                .map_err(sql_error("count records"))?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })
                .map_err(sql_error("count records"))?;
            let counts: HashMap<String, i64> = rows
                .collect::<Result<_, _>>()
                .map_err(sql_error("count records"))?;
            Ok(sort_counts(
                counts
                    .into_iter()
                    .map(|(class, n)| (class, u64::try_from(n).unwrap_or(0)))
                    .collect(),
            ))
        })
    }
}
