//! Keyset pages ([`Store::search_after`](crate::Store::search_after),
//! [`Store::search_waiting_after`](crate::Store::search_waiting_after)): a sorted set read from
//! a key on, `LIMIT` ids at a time, the ties of a score put in id order.

use std::cmp::Ordering;

use super::{RedisStore, redis_error};
use crate::query::Filter;
use crate::record::{Record, Status, to_millis};
use crate::{SortKey, StoreError, list_order};

/// The order a sorted set is read in: by score descending (failure times, the most recent
/// first) or ascending (retry-at times, the soonest first); equal scores by id either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Newest,
    Soonest,
}

/// Where a read of a sorted set resumes: a score (ms) and the id read last at it.
type Mark = (i64, String);

/// What a keyset read of one sorted set reads: the set, its order, the bounds of the filter's
/// times on its scores (for sets scored by failure time) and how many ids a round reads.
struct Scan<'a> {
    index: &'a str,
    way: Way,
    /// The filter's `since`, inclusive (sets scored by failure time only).
    since: Option<i64>,
    /// The filter's `until`, exclusive (sets scored by failure time only).
    until: Option<i64>,
    chunk: usize,
}

impl RedisStore {
    /// Up to `limit` records that match `filter`, the most recently failed first, after `after`.
    pub(super) async fn newest_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        if !filter.ids.is_empty() {
            return self
                .listed_ids_after(filter, after, limit, Way::Newest)
                .await;
        }
        // The filter's own set when one answers it whole; else the narrowest, read on until
        // the page is full.
        let (index, chunk) = match self.exact_index(filter).await? {
            Some(index) => (index, limit.clamp(1, 1024)),
            None => (self.narrowest_index(filter), limit.clamp(64, 1024)),
        };
        let scan = Scan {
            index: &index,
            way: Way::Newest,
            since: filter.since.map(to_millis),
            until: filter.until.map(to_millis),
            chunk,
        };
        self.scan_after(&scan, after, limit, |r| filter.matches(r))
            .await
    }

    /// Up to `limit` waiting records that match `filter`, the soonest due first, after `after`.
    pub(super) async fn soonest_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 || matches!(filter.status, Some(Status::Dead | Status::Resolved)) {
            return Ok(Vec::new());
        }
        if !filter.ids.is_empty() {
            return self
                .listed_ids_after(filter, after, limit, Way::Soonest)
                .await;
        }
        let index = self.key("retry");
        let scan = Scan {
            index: &index,
            way: Way::Soonest,
            since: None,
            until: None,
            chunk: if filter.is_empty() {
                limit.clamp(1, 1024)
            } else {
                limit.clamp(64, 1024)
            },
        };
        self.scan_after(&scan, after, limit, |r| waiting(r) && filter.matches(r))
            .await
    }

    /// The filter's ids read whole (a short list), put in order, from the key on.
    async fn listed_ids_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
        way: Way,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records: Vec<Record> = self
            .fetch(&filter.ids)
            .await?
            .into_iter()
            .filter(|r| filter.matches(r) && (way == Way::Newest || waiting(r)))
            .collect();
        records.sort_by(|a, b| match way {
            Way::Newest => b
                .last_failed_at
                .cmp(&a.last_failed_at)
                .then_with(|| a.id.cmp(&b.id)),
            Way::Soonest => list_order(a, b),
        });
        records.dedup_by(|a, b| a.id == b.id);
        Ok(records
            .into_iter()
            .filter(|r| match (after, way) {
                (None, _) => true,
                (Some(k), Way::Newest) => k.precedes_newest_first(r.last_failed_at, &r.id),
                (Some(k), Way::Soonest) => r
                    .retry_at
                    .is_some_and(|at| k.precedes_soonest_first(at, &r.id)),
            })
            .take(limit)
            .collect())
    }

    /// Reads `scan`'s set from `after` on, a round of ids at a time, and keeps the records
    /// `keep` accepts until there are `limit`.
    async fn scan_after(
        &self,
        scan: &Scan<'_>,
        after: Option<&SortKey>,
        limit: usize,
        keep: impl Fn(&Record) -> bool,
    ) -> Result<Vec<Record>, StoreError> {
        let mut mark: Option<Mark> = after.map(|k| (to_millis(k.at), k.id.clone()));
        let mut out = Vec::new();
        loop {
            let (ids, more) = self.ids_after(scan, mark.as_ref()).await?;
            let Some(last) = ids.last() else {
                return Ok(out);
            };
            mark = Some((last.1, last.0.clone()));
            let ids: Vec<String> = ids.into_iter().map(|(id, _)| id).collect();
            for record in self.fetch(&ids).await? {
                if keep(&record) {
                    out.push(record);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
            if !more {
                return Ok(out);
            }
        }
    }

    /// The ids of `scan`'s set after `mark`, in order, with their scores: the rest of the ties
    /// at the mark's score, then a round (`LIMIT`) of the scores after it, with every tie of
    /// the round's last score; and whether the set may hold more after them.
    async fn ids_after(
        &self,
        scan: &Scan<'_>,
        mark: Option<&Mark>,
    ) -> Result<(Vec<(String, i64)>, bool), StoreError> {
        let mut conn = self.conn.clone();
        let read = redis_error("search records");
        let mut ids: Vec<(String, i64)> = Vec::new();
        if let Some((score, id)) = mark {
            // ZRANGEBYSCORE orders the members of one score by id (byte order).
            let ties: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(scan.index)
                .arg(score)
                .arg(score)
                .query_async(&mut conn)
                .await
                .map_err(read)?;
            ids.extend(
                ties.into_iter()
                    .filter(|t| t.as_str() > id.as_str())
                    .map(|t| (t, *score)),
            );
        }
        let after = mark.map(|(score, _)| *score);
        let round: Vec<(String, i64)> = match scan.way {
            Way::Newest => {
                let top = match (after, scan.until) {
                    (Some(a), Some(u)) => format!("({}", a.min(u)),
                    (Some(x), None) | (None, Some(x)) => format!("({x}"),
                    (None, None) => "+inf".to_owned(),
                };
                let bottom = scan
                    .since
                    .map_or_else(|| "-inf".to_owned(), |s| s.to_string());
                redis::cmd("ZREVRANGEBYSCORE")
                    .arg(scan.index)
                    .arg(top)
                    .arg(bottom)
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(scan.chunk)
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error("search records"))?
            }
            Way::Soonest => redis::cmd("ZRANGEBYSCORE")
                .arg(scan.index)
                .arg(after.map_or_else(|| "-inf".to_owned(), |a| format!("({a}")))
                .arg("+inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(scan.chunk)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("search records"))?,
        };
        let more = round.len() >= scan.chunk;
        ids.extend(self.in_order(scan, round, more).await?);
        Ok((ids, more))
    }

    /// A round of `scan`'s set in its order. Read by score descending, Redis puts the members
    /// of one score in descending id order, and a `LIMIT` that cut a score's ties kept the
    /// greatest ids: when the round was cut (`cut`), its last score's ties are read whole.
    async fn in_order(
        &self,
        scan: &Scan<'_>,
        mut round: Vec<(String, i64)>,
        cut: bool,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        if scan.way == Way::Soonest {
            return Ok(round);
        }
        if let (true, Some(&(_, low))) = (cut, round.last()) {
            round.retain(|(_, score)| *score != low);
            let ties: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(scan.index)
                .arg(low)
                .arg(low)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(redis_error("search records"))?;
            round.extend(ties.into_iter().map(|id| (id, low)));
        }
        round.sort_by(|a, b| match b.1.cmp(&a.1) {
            Ordering::Equal => a.0.cmp(&b.0),
            other => other,
        });
        Ok(round)
    }
}

/// Whether `record` waits for the scheduler (and so is listed by retry-at).
fn waiting(record: &Record) -> bool {
    matches!(record.status, Status::Deferred | Status::InFlight) && record.retry_at.is_some()
}
