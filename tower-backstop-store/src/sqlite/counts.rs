//! The counts table of a [`SqliteStore`](super::SqliteStore): how many records there are of
//! each status, class and code, kept by triggers in the transaction of every write, so that the
//! all-time counts read a few rows instead of every record.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::Value;
use rusqlite::{Connection, TransactionBehavior, params};

use super::{has_table, sql_error};
use crate::StoreError;
use crate::check::{CountKey, CountsCheck};
use crate::query::{Counts, Filter, top_first};
use crate::record::Status;

/// The table and its triggers. The triggers fire inside the statement that writes a record, so
/// the counts change in its transaction whatever the write path:
/// - a new row (`INSERT`) counts one more of its key; `INSERT OR REPLACE` of an existing id
///   (how the store writes a record) first counts one fewer of the row it replaces (the
///   `BEFORE INSERT` trigger: SQLite fires no delete trigger for a replaced row unless
///   `recursive_triggers` is on, which this store never turns on);
/// - a change of status, class or code moves one from the old key to the new;
/// - a deleted row counts one fewer.
///
/// A counter never goes below 0 (`max(n - 1, 0)`, and `CHECK (n >= 0)`): one that would have is
/// a drift that [`check`] reports.
const CREATE: &str = "
CREATE TABLE dead_letter_counts (
    status TEXT NOT NULL,
    class  TEXT NOT NULL,
    code   TEXT NOT NULL,
    n      INTEGER NOT NULL CHECK (n >= 0),
    PRIMARY KEY (status, class, code)
) WITHOUT ROWID;
CREATE TRIGGER dead_letter_counts_insert AFTER INSERT ON dead_letters BEGIN
    INSERT INTO dead_letter_counts (status, class, code, n)
    VALUES (NEW.status, NEW.class, NEW.code, 1)
    ON CONFLICT (status, class, code) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER dead_letter_counts_replace BEFORE INSERT ON dead_letters
WHEN EXISTS (SELECT 1 FROM dead_letters WHERE id = NEW.id) BEGIN
    UPDATE dead_letter_counts SET n = max(n - 1, 0)
    WHERE (status, class, code) = (SELECT status, class, code FROM dead_letters WHERE id = NEW.id);
END;
CREATE TRIGGER dead_letter_counts_update AFTER UPDATE OF status, class, code ON dead_letters
WHEN OLD.status IS NOT NEW.status OR OLD.class IS NOT NEW.class OR OLD.code IS NOT NEW.code
BEGIN
    UPDATE dead_letter_counts SET n = max(n - 1, 0)
    WHERE status = OLD.status AND class = OLD.class AND code = OLD.code;
    INSERT INTO dead_letter_counts (status, class, code, n)
    VALUES (NEW.status, NEW.class, NEW.code, 1)
    ON CONFLICT (status, class, code) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER dead_letter_counts_delete AFTER DELETE ON dead_letters BEGIN
    UPDATE dead_letter_counts SET n = max(n - 1, 0)
    WHERE status = OLD.status AND class = OLD.class AND code = OLD.code;
END;
INSERT INTO dead_letter_counts (status, class, code, n)
SELECT status, class, code, COUNT(*) FROM dead_letters WHERE true GROUP BY status, class, code;
";

/// The name of the counts table.
const TABLE: &str = "dead_letter_counts";

/// Makes the counts table and its triggers in a file that lacks them, and fills it from the
/// records, in one `BEGIN IMMEDIATE` transaction (writers of other processes wait for it: about
/// 3 s per million records). Nothing is written when the table is there. Best effort: a
/// file that is read-only at the moment opens without it, and its counts read the records.
pub(super) fn ensure_table(conn: &mut Connection, path: &Path) {
    if has_counts(conn).unwrap_or(false) {
        // The usual case: no write lock taken at open.
        return;
    }
    let done = (|| {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error("begin"))?;
        if !has_table(&tx, TABLE)? {
            tx.execute_batch(CREATE)
                .map_err(sql_error("create the counts table"))?;
        }
        tx.commit().map_err(sql_error("commit"))
    })();
    if let Err(e) = done {
        tracing::warn!(
            path = %path.display(),
            error = %e,
            "sqlite dead-letter store: cannot create the counts table; counts read every record \
             until the file is writable"
        );
    }
}

/// Whether the file has the counts table (a file opened read-only before its first writable
/// open has none).
fn has_counts(conn: &Connection) -> Result<bool, StoreError> {
    has_table(conn, TABLE)
}

/// Whether `filter` names only a status, a class and a code (any of them): what the counts
/// table answers.
pub(super) fn counted_by_table(filter: &Filter) -> bool {
    filter.tags.is_empty()
        && filter.ids.is_empty()
        && filter.since.is_none()
        && filter.until.is_none()
}

/// How many records match `filter` (a status, a class and a code at most, see
/// [`counted_by_table`]) from the counts table; `None` when the file has none.
pub(super) fn count(conn: &Connection, filter: &Filter) -> Result<Option<u64>, StoreError> {
    if !has_counts(conn)? {
        return Ok(None);
    }
    let mut clauses = vec!["1".to_owned()];
    let mut values = Vec::new();
    let named = [
        ("status", filter.status.map(|s| s.as_str().to_owned())),
        ("class", filter.class.clone()),
        ("code", filter.code.clone()),
    ];
    for (column, value) in named {
        if let Some(value) = value {
            values.push(Value::Text(value));
            clauses.push(format!("{column} = ?{}", values.len()));
        }
    }
    let sql = format!(
        "SELECT COALESCE(SUM(n), 0) FROM {TABLE} WHERE {}",
        clauses.join(" AND ")
    );
    let n: i64 = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row(rusqlite::params_from_iter(values), |r| r.get(0)))
        .map_err(sql_error("count records"))?;
    Ok(Some(u64::try_from(n).unwrap_or(0)))
}

/// Whether a window from `since` (ms) holds every record: no record failed last before it.
/// One read of the first entry of the index by time.
pub(super) fn window_is_all_time(conn: &Connection, since: i64) -> Result<bool, StoreError> {
    let oldest: Option<i64> = conn
        .prepare_cached("SELECT MIN(last_failed_at_ms) FROM dead_letters")
        .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
        .map_err(sql_error("read the oldest record"))?;
    Ok(oldest.is_none_or(|oldest| since <= oldest))
}

/// The all-time counts from the counts table, without the new codes (the caller adds them);
/// `None` when the file has no counts table.
pub(super) fn all_time(conn: &Connection) -> Result<Option<Counts>, StoreError> {
    if !has_counts(conn)? {
        return Ok(None);
    }
    let pairs = |column: &str| -> Result<Vec<(String, u64)>, StoreError> {
        let sql = format!(
            "SELECT {column}, SUM(n) FROM {TABLE} WHERE status = 'dead' GROUP BY {column} \
             HAVING SUM(n) > 0"
        );
        let mut stmt = conn
            .prepare_cached(&sql)
            .map_err(sql_error("count records"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(sql_error("count records"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_error("count records"))?;
        Ok(top_first(
            rows.into_iter()
                .map(|(k, n)| (k, u64::try_from(n).unwrap_or(0))),
        ))
    };
    let by_class = pairs("class")?;
    let by_code = pairs("code")?;
    let deferred: i64 = conn
        .prepare_cached(&format!(
            "SELECT COALESCE(SUM(n), 0) FROM {TABLE} WHERE status IN ('deferred', 'in_flight')"
        ))
        .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
        .map_err(sql_error("count deferred records"))?;
    Ok(Some(Counts {
        total: by_class.iter().map(|(_, n)| n).sum(),
        by_class,
        by_code,
        new_codes: Vec::new(),
        deferred: u64::try_from(deferred).unwrap_or(0),
    }))
}

/// Reads `sql` (status, class, code, n) into a map by key.
fn read_keyed(conn: &Connection, sql: &str) -> Result<BTreeMap<CountKey, i64>, StoreError> {
    let mut stmt = conn.prepare(sql).map_err(sql_error("check counts"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .map_err(sql_error("check counts"))?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (status, class, code, n) = row.map_err(sql_error("check counts"))?;
        let status: Status = status.parse()?;
        *out.entry((status, Some(class), Some(code))).or_insert(0) += n;
    }
    Ok(out)
}

/// Recounts the records and compares the recount with the counts table, in one transaction
/// (`BEGIN IMMEDIATE` when repairing, so that no write comes between the recount and the
/// repair; a read transaction otherwise). With `repair`, sets each drifted counter to the
/// recount. A file without a counts table gets one, filled from the records; a file opened
/// read-only that has none is an error.
pub(super) fn check(
    conn: &mut Connection,
    path: &Path,
    repair: bool,
) -> Result<CountsCheck, StoreError> {
    if !has_counts(conn)? {
        ensure_table(conn, path);
        if !has_counts(conn)? {
            return Err(StoreError::new(format!(
                "sqlite dead-letter store {}: no counts table to check (the file was never \
                 opened for writing by this version)",
                path.display()
            )));
        }
    }
    let behavior = if repair {
        TransactionBehavior::Immediate
    } else {
        TransactionBehavior::Deferred
    };
    let tx = conn
        .transaction_with_behavior(behavior)
        .map_err(sql_error("begin"))?;
    let expected = read_keyed(
        &tx,
        "SELECT status, class, code, COUNT(*) FROM dead_letters GROUP BY status, class, code",
    )?;
    let found = read_keyed(&tx, &format!("SELECT status, class, code, n FROM {TABLE}"))?;
    let expected: BTreeMap<CountKey, u64> = expected
        .into_iter()
        .map(|(k, n)| (k, u64::try_from(n).unwrap_or(0)))
        .collect();
    let mut check = CountsCheck::compare(&expected, &found);
    if repair && !check.is_clean() {
        let mut set = tx
            .prepare_cached(&format!(
                "INSERT INTO {TABLE} (status, class, code, n) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (status, class, code) DO UPDATE SET n = excluded.n"
            ))
            .map_err(sql_error("repair counts"))?;
        for d in &check.drifts {
            let n = i64::try_from(d.expected).unwrap_or(i64::MAX);
            set.execute(params![d.status.as_str(), d.class, d.code, n])
                .map_err(sql_error("repair counts"))?;
        }
        drop(set);
        check.repaired = true;
    }
    tx.commit().map_err(sql_error("commit"))?;
    Ok(check)
}
