//! The counts of a [`PostgresStore`](super::PostgresStore) read from its `counts` table (kept by
//! the triggers of migration 3), and the check that recounts the records.

use std::collections::BTreeMap;
use std::time::SystemTime;

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::error::pg_error;
use super::row::decode_error;
use super::{PostgresStore, bind_all, text, where_clause};
use crate::StoreError;
use crate::check::{CountKey, CountsCheck};
use crate::query::{Counts, Filter, top_first};
use crate::record::{Status, from_millis, to_millis};

/// Whether `filter` names only a status, a class and a code (any of them): what the counts
/// table answers.
pub(super) fn counted_by_table(filter: &Filter) -> bool {
    filter.tags.is_empty()
        && filter.ids.is_empty()
        && filter.since.is_none()
        && filter.until.is_none()
}

/// The statements of the counts, with the store's schema written in.
#[derive(Debug)]
pub(super) struct CountsSql {
    /// Whether a window from `$1` holds every record (none failed last before it).
    all_time: String,
    /// The all-time counts, as `counts.sql` returns them for a window.
    read: String,
    /// `SELECT sum(n) FROM counts WHERE `, to which the filter's clause is added.
    sum: String,
    recount: String,
    counters: String,
    lock: String,
    clear: String,
    set: String,
}

impl CountsSql {
    pub(super) fn new(schema: &str) -> Self {
        CountsSql {
            all_time: format!(
                "SELECT coalesce($1 <= (SELECT min(last_failed_at_ms) FROM {schema}.records), true)"
            ),
            read: format!(
                "SELECT 'class', class, sum(n)::int8 FROM {schema}.counts WHERE status = 'dead'
                 GROUP BY class HAVING sum(n) > 0
                 UNION ALL
                 SELECT 'code', code, sum(n)::int8 FROM {schema}.counts WHERE status = 'dead'
                 GROUP BY code HAVING sum(n) > 0
                 UNION ALL
                 SELECT 'new', code, first_seen_ms FROM {schema}.codes WHERE first_seen_ms >= $1
                 UNION ALL
                 SELECT 'waiting', '', coalesce(sum(n), 0)::int8 FROM {schema}.counts
                 WHERE status IN ('deferred', 'in_flight')"
            ),
            sum: format!("SELECT coalesce(sum(n), 0)::int8 FROM {schema}.counts WHERE "),
            recount: format!(
                "SELECT status, class, code, (hashtext(id) & 7)::int2, count(*)::int8
                 FROM {schema}.records GROUP BY 1, 2, 3, 4"
            ),
            counters: format!("SELECT status, class, code, slot, n FROM {schema}.counts"),
            lock: format!("LOCK TABLE {schema}.records IN SHARE MODE"),
            clear: format!(
                "DELETE FROM {schema}.counts WHERE status = $1 AND class = $2 AND code = $3"
            ),
            set: format!(
                "INSERT INTO {schema}.counts (status, class, code, slot, n)
                 SELECT $1, $2, $3, s, c FROM unnest($4::int2[], $5::int8[]) AS x (s, c)"
            ),
        }
    }
}

/// One row of the counts or of the recount: the key, the slot, the count.
type Slotted = (CountKey, i16, i64);

fn slotted(row: &PgRow) -> Result<Slotted, StoreError> {
    let get = |i| {
        row.try_get::<String, _>(i)
            .map_err(pg_error("check counts"))
    };
    let status: Status = get(0)?.parse()?;
    let class = text::decode(get(1)?).map_err(|e| decode_error("class", e))?;
    let code = text::decode(get(2)?).map_err(|e| decode_error("code", e))?;
    let slot: i16 = row.try_get(3).map_err(pg_error("check counts"))?;
    let n: i64 = row.try_get(4).map_err(pg_error("check counts"))?;
    Ok(((status, Some(class), Some(code)), slot, n))
}

impl PostgresStore {
    /// How many records match `filter` (a status, a class and a code at most, see
    /// [`counted_by_table`]), summed from the counts table.
    pub(super) async fn count_from_table(&self, filter: &Filter) -> Result<u64, StoreError> {
        let (clause, args) = where_clause(filter);
        let sql = format!("{}{clause}", self.sql.counts_sql.sum);
        let n: i64 = self
            .fetch_one(bind_all(sqlx::query(&sql), args))
            .await
            .and_then(|row| row.try_get(0))
            .map_err(pg_error("count records"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The counts from `since`: from the counts table when no record failed last before
    /// `since` (all time), from the records of the window otherwise (`counts.sql`, the index
    /// by status and time).
    pub(super) async fn read_counts(&self, since: SystemTime) -> Result<Counts, StoreError> {
        let from = to_millis(since);
        let all_time: bool = self
            .fetch_one(sqlx::query(&self.sql.counts_sql.all_time).bind(from))
            .await
            .and_then(|row| row.try_get(0))
            .map_err(pg_error("count records"))?;
        let sql = if all_time {
            &self.sql.counts_sql.read
        } else {
            &self.sql.counts
        };
        let rows = self
            .fetch_all(sqlx::query(sql).bind(from))
            .await
            .map_err(pg_error("count records"))?;
        let mut by_class = Vec::new();
        let mut by_code = Vec::new();
        let mut new_codes = Vec::new();
        let mut deferred = 0;
        for row in rows {
            let kind: String = row.try_get(0).map_err(pg_error("count records"))?;
            let name: String = row.try_get(1).map_err(pg_error("count records"))?;
            let n: i64 = row.try_get(2).map_err(pg_error("count records"))?;
            let name = text::decode(name).map_err(|e| decode_error("class or code", e))?;
            let count = u64::try_from(n).unwrap_or(0);
            match kind.as_str() {
                "class" => by_class.push((name, count)),
                "code" => by_code.push((name, count)),
                "new" => new_codes.push((name, from_millis(n))),
                _ => deferred = count,
            }
        }
        new_codes.sort_by(|a: &(String, SystemTime), b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let by_class = top_first(by_class);
        Ok(Counts {
            total: by_class.iter().map(|(_, n)| n).sum(),
            by_class,
            by_code: top_first(by_code),
            new_codes,
            deferred,
        })
    }

    /// Recounts the records and compares the recount with the counts table, key by key (the
    /// sum of its slots). Without `repair`, one `REPEATABLE READ` read-only transaction: the
    /// recount and the counters are of one snapshot, and no write waits. With `repair`, the
    /// records are locked in `SHARE` mode first (writes wait until the check ends; reads go on),
    /// and each drifted key's slots are written again from the recount.
    pub(super) async fn check_counts_table(&self, repair: bool) -> Result<CountsCheck, StoreError> {
        let sql = &self.sql.counts_sql;
        let mut tx = self
            .pooled_begin()
            .await
            .map_err(pg_error("check counts"))?;
        let start = if repair {
            sql.lock.as_str()
        } else {
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"
        };
        sqlx::query(start)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(pg_error("check counts"))?;
        let read = |rows: Vec<PgRow>| -> Result<Vec<Slotted>, StoreError> {
            rows.iter().map(slotted).collect()
        };
        let recount = read(
            sqlx::query(&sql.recount)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await
                .map_err(pg_error("check counts"))?,
        )?;
        let counters = read(
            sqlx::query(&sql.counters)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await
                .map_err(pg_error("check counts"))?,
        )?;
        let mut expected: BTreeMap<CountKey, u64> = BTreeMap::new();
        let mut slots: BTreeMap<CountKey, (Vec<i16>, Vec<i64>)> = BTreeMap::new();
        for (key, slot, n) in recount {
            *expected.entry(key.clone()).or_default() += u64::try_from(n).unwrap_or(0);
            let entry = slots.entry(key).or_default();
            entry.0.push(slot);
            entry.1.push(n);
        }
        let mut found: BTreeMap<CountKey, i64> = BTreeMap::new();
        for (key, _, n) in counters {
            *found.entry(key).or_default() += n;
        }
        let mut check = CountsCheck::compare(&expected, &found);
        if repair && !check.is_clean() {
            for d in &check.drifts {
                let key = (d.status, d.class.clone(), d.code.clone());
                let (s, n) = slots.remove(&key).unwrap_or_default();
                let (class, code) = (
                    text::encode(d.class.as_deref().unwrap_or_default()).into_owned(),
                    text::encode(d.code.as_deref().unwrap_or_default()).into_owned(),
                );
                for (stmt, with_slots) in [(&sql.clear, false), (&sql.set, true)] {
                    let mut q = sqlx::query(stmt)
                        .persistent(false)
                        .bind(d.status.as_str())
                        .bind(class.clone())
                        .bind(code.clone());
                    if with_slots {
                        q = q.bind(s.clone()).bind(n.clone());
                    }
                    q.execute(&mut *tx)
                        .await
                        .map_err(pg_error("repair counts"))?;
                }
            }
            check.repaired = true;
        }
        tx.commit().await.map_err(pg_error("check counts"))?;
        Ok(check)
    }
}
