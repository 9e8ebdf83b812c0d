//! The dead-letter stores of [tower-backstop](https://docs.rs/tower-backstop): the [`Store`]
//! trait, its records, queries and counts, retention and the audit trail, and the stores there
//! are.
//!
//! One trait, one behaviour, whatever the backend: [`MemoryStore`] for tests,
//! `SqliteStore` (feature `sqlite`) for one machine, `RedisStore` (feature `redis`) and
//! `PostgresStore` (feature `postgres`) for a fleet of instances that share one store: the Redis
//! or the Postgres the team already runs. Writes merge by id, searches take a [`Filter`] and a
//! range of positions or a key to read on from (keyset pages, [`list_after`]), [`Counts`]
//! come over a window, and claims of due records are atomic. This crate knows no tower and no
//! failure type: it keeps plain [`Record`]s. Most users reach it through `tower-backstop`'s
//! default features, as `tower_backstop::store`; depend on it directly to implement a store of
//! your own.
//!
//! A [`Record`] is plain data: the id, tags, class and code names, the message, attempt counts,
//! the failure times, the [`Status`] and retry-at time, the history of the last errors, and the
//! whole request (method, URI, headers, payload). The values of secret headers are never written
//! (see [`DeadLetterLayer::redact_header`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html#method.redact_header)).
//! Reading a store never panics on what it holds; store URLs print without their password
//! ([`redact_url`]).
//!
//! # Features
//!
//! | feature | what | default |
//! |---|---|---|
//! | `sqlite` | `SqliteStore`: one file, bundled SQLite (rusqlite) | no |
//! | `redis` | `RedisStore`: one Redis server, a Redis Cluster, or a primary found through Sentinel, shared by many instances (redis crate, tokio) | no |
//! | `postgres` | `PostgresStore`: the team's Postgres, shared by many instances (sqlx, tokio; SQL migrations inside) | no |
//! | `testing` | [`testing`]: the conformance suite, to prove a store of your own | no |
//!
//! # Example
//!
//! ```
//! use tower_backstop_store::{MemoryStore, Store};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! assert!(store.list(10).await.unwrap().is_empty());
//! # }
//! ```
//!
//! # Customised
//!
//! Keep the last 5 errors per record, and search one tag among the records of the last hour:
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use tower_backstop_store::{Filter, MemoryStore, Status, Store};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new().with_history_limit(5);
//! let hour_ago = SystemTime::now() - Duration::from_secs(3600);
//! let filter = Filter::new().tag("campaign", "spring").since(hour_ago).status(Status::Dead);
//! let spring = store.search(&filter, 0..10).await.unwrap();
//! assert!(spring.is_empty());
//! # }
//! ```

use std::fmt;
use std::ops::Range;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod audit;
mod check;
mod cursor;
mod lease;
mod listing;
mod memory;
mod note;
#[cfg(feature = "postgres")]
mod postgres;
mod query;
mod record;
#[cfg(feature = "redis")]
mod redis;
mod retention;
mod schedule;
#[cfg(feature = "sqlite")]
mod spool;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use self::audit::{AuditAction, AuditEntry, purge};
pub use self::check::{CountDrift, CountsCheck};
pub use self::cursor::{Cursor, CursorError, SortKey};
pub use self::lease::Lease;
pub use self::listing::{Listing, Page, list_after, list_order, list_page};
pub use self::memory::MemoryStore;
pub use self::note::FleetNote;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres::{DEFAULT_SCHEMA, OpenPostgres, PostgresStore};
pub use self::query::{Change, Claim, Counts, Filter, FilterError};
pub use self::record::{DEFAULT_HISTORY_LIMIT, ErrorEntry, Record, Status};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{OpenSentinel, RedisStore};
pub use self::retention::{DEFAULT_MAX_AGE, DEFAULT_MAX_RECORDS, Pruned, Retention};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use self::spool::{
    DEFAULT_SPOOL_MAX_AGE, DEFAULT_SPOOL_MAX_BYTES, Forwarded, Spool, SpoolError, SpoolState,
};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use self::sqlite::SqliteStore;

pub use self::record::{add_clamped, truncate};

/// The error type a [`StoreError`] may wrap.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed, `Send` future, the return type of [`Store`] methods (the failure path only): the
/// `futures` crates' own `BoxFuture`, so that `futures::FutureExt::boxed` makes one.
pub use futures_core::future::BoxFuture;

/// A dead-letter store could not do what was asked, or what it holds cannot be used: it is
/// closed, its file cannot be opened or written, a record cannot be decoded (a status that is
/// not one of [`Status`]'s names) or rebuilt into a request
/// ([`http_request`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/fn.http_request.html): a truncated payload, a malformed stored
/// method, URI or header).
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

/// A cursor that cannot be used, as a store error with the same message.
impl From<CursorError> for StoreError {
    fn from(e: CursorError) -> Self {
        StoreError::new(e.to_string())
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
/// use tower_backstop_store::redact_url;
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
/// [`MemoryStore`] for tests, [`SqliteStore`] (feature `sqlite`) as the
/// durable default, `RedisStore` (feature `redis`) and `PostgresStore` (feature `postgres`) for
/// many instances. The conformance suite runs the same cases against all four.
///
/// Methods return boxed `'static` futures so that the trait is object-safe and a layer can hold
/// any store; the request path calls only [`put`](Store::put), on failure. Implementations are
/// cheap to clone handles over shared state.
///
/// Every write of a record is atomic (one SQLite transaction, one Redis script, one Postgres
/// statement): the record, its attempt count and budget, its history and its indexes change together or not at all.
///
/// Something that is not a store (here a `Result` whose `?` was forgotten) is a compile error
/// that names the stores there are:
///
/// ```compile_fail,E0277
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop_store::MemoryStore;
///
/// let _layer = DeadLetterLayer::new(Ok::<_, std::io::Error>(MemoryStore::new()));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a dead-letter store",
    label = "DeadLetterLayer needs a `tower_backstop_store::Store`",
    note = "use `MemoryStore` (tests), `SqliteStore::open(path)?` (feature `sqlite`, on by default; note the `?`), `RedisStore` (feature `redis`) or `PostgresStore::connect(url).await?` (feature `postgres`), or implement `Store`; a store you share as an `Arc` (for a `Scheduler`) goes in with `DeadLetterLayer::from_arc(store)`"
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

    /// One page of the records that match `filter`: those at positions `page` (counted from 0)
    /// of the results, which come the most recently failed first (ties by id), so that pages
    /// are stable while nothing is written. `0..50` is the first 50, `50..100` the next; an
    /// empty range returns nothing, and a range past the end returns what is left.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>>;

    /// How many records match `filter`, whatever their status. SQLite and Postgres read a
    /// filter of a status, a class and a code at most (any of them, or none) from their counts
    /// table, a few rows whatever the number of records, and count any other with their
    /// indexes (`COUNT(*)`); Redis counts an index set (`ZCOUNT`) when one holds exactly the
    /// records of the filter (a status, a class or a code, the dead ones of a class or a code,
    /// with a time range or not). The default reads every matching record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let all = self.search(filter, 0..usize::MAX);
        Box::pin(async move { Ok(all.await?.len() as u64) })
    }

    /// One page of the records waiting for the scheduler, [`Deferred`](Status::Deferred) and
    /// [`InFlight`](Status::InFlight), that match `filter`: those at positions `page` (counted
    /// from 0) of the results, which come the soonest due first (by retry-at; ties by id). A
    /// filter that names another status finds nothing, and so does a waiting record without a
    /// retry-at (never due; no writer of this crate leaves one). What the lists show after the
    /// dead letters ([`list_page`], [`list`](Store::list)).
    ///
    /// SQLite and Postgres read the page off their index by retry-at, whatever the filter;
    /// Redis reads it off its sorted set of due records for the empty filter, and reads every
    /// waiting record for any other. The default reads every matching deferred and in-flight
    /// record with [`search`](Store::search) and sorts them.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let reads: Vec<_> = [Status::Deferred, Status::InFlight]
            .into_iter()
            .filter(|s| filter.status.is_none_or(|wanted| wanted == *s))
            .map(|s| self.search(&filter.clone().status(s), 0..usize::MAX))
            .collect();
        Box::pin(async move {
            let mut waiting = Vec::new();
            for read in reads {
                waiting.extend(read.await?.into_iter().filter(|r| r.retry_at.is_some()));
            }
            waiting.sort_by(list_order);
            Ok(waiting
                .into_iter()
                .skip(page.start)
                .take(page.len())
                .collect())
        })
    }

    /// Up to `limit` records that match `filter`, in the order of [`search`](Store::search)
    /// (the most recently failed first, ties by id), strictly after `after`: those that failed
    /// before `after.at`, or at that time with an id greater than `after.id`. From the start
    /// when `after` is `None`. The keyset read behind [`list_after`]: a page after a key costs
    /// what the first page does, where a [`search`](Store::search) page costs more the further
    /// it is, and a key whose record was deleted or changed since still gives the records
    /// after it.
    ///
    /// SQLite and Postgres read the page off their index by status and failure time (or by
    /// class, code or time, SQLite then putting the records of one failure time in id order)
    /// from the key on. Redis reads it off the filter's sorted set by
    /// failure time from the key on; a filter that one set does not answer alone (a tag with a
    /// status, two of class, code and tags) reads the narrowest set on from the key, a few
    /// pages at a time, until the page is full, and a filter of ids reads those records. The
    /// default reads every matching record with
    /// [`search`](Store::search) and skips to the key: override it in a store that can seek.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let all = self.search(filter, 0..usize::MAX);
        let after = after.cloned();
        Box::pin(async move {
            Ok(all
                .await?
                .into_iter()
                .filter(|r| {
                    after
                        .as_ref()
                        .is_none_or(|k| k.precedes_newest_first(r.last_failed_at, &r.id))
                })
                .take(limit)
                .collect())
        })
    }

    /// Up to `limit` records waiting for the scheduler that match `filter`, in the order of
    /// [`search_waiting`](Store::search_waiting) (the soonest due first, ties by id), strictly
    /// after `after`: those due after `after.at`, or at that time with an id greater than
    /// `after.id`. From the start when `after` is `None`. The keyset read behind
    /// [`list_after`], as [`search_after`](Store::search_after) is for the dead letters.
    ///
    /// SQLite and Postgres read the page off their index of due records from the key on,
    /// whatever the filter. Redis reads its sorted set of due records from the key on: the
    /// page alone for the empty filter; for any other, a few pages at a time until the page is
    /// full, so a filter that few waiting records match reads many to fill one. The default
    /// reads every matching waiting record with [`search_waiting`](Store::search_waiting) and
    /// skips to the key.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let all = self.search_waiting(filter, 0..usize::MAX);
        let after = after.cloned();
        Box::pin(async move {
            Ok(all
                .await?
                .into_iter()
                .filter(|r| match (&after, r.retry_at) {
                    (None, _) => true,
                    (Some(k), Some(at)) => k.precedes_soonest_first(at, &r.id),
                    (Some(_), None) => false,
                })
                .take(limit)
                .collect())
        })
    }

    /// Up to `limit` outstanding records, in the order of every list of records
    /// ([`list_order`]): the [`Dead`](Status::Dead) ones, the most recently failed first, then
    /// the [`Deferred`](Status::Deferred) and [`InFlight`](Status::InFlight) ones, the soonest
    /// due first (ties by id). Never a [`Resolved`](Status::Resolved) record: a message that
    /// was delivered is not outstanding (read those with a [`search`](Store::search) whose
    /// filter names that status). The first page of [`list_page`] with the empty filter, which
    /// is also what `backstop-dlq list` prints and the board's list shows; `list(usize::MAX)`
    /// is every outstanding record.
    ///
    /// The default reads at most `limit` dead records ([`search`](Store::search)) and, when
    /// they are fewer, the first waiting ones ([`search_waiting`](Store::search_waiting)).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let dead = self.search(&Filter::new().status(Status::Dead), 0..limit);
        let waiting = self.search_waiting(&Filter::new(), 0..limit);
        Box::pin(async move {
            let mut records = dead.await?;
            if records.len() < limit {
                let rest = limit - records.len();
                records.extend(waiting.await?.into_iter().take(rest));
            }
            Ok(records)
        })
    }

    /// Counts of the outstanding dead letters ([`Dead`](Status::Dead) records) whose last
    /// failure is at or after `since`, by class and by code (the largest first), the codes first
    /// seen since then, and apart, the deferred and in-flight records of that period
    /// ([`Counts::deferred`]). Resolved records count nowhere.
    ///
    /// SQLite and Postgres read the counts of all time (`since` at or before the oldest
    /// record's last failure, as `UNIX_EPOCH` is) from their counts table, and those of a
    /// shorter window from their index by status and time; Redis counts its index sets by
    /// status and class or code (`ZCOUNT`). None reads a record; [`MemoryStore`] counts its
    /// records.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>>;

    /// The number of outstanding dead letters ([`Dead`](Status::Dead) records) per class, the
    /// largest first (ties by class name), over all time: [`counts`](Store::counts) from
    /// `UNIX_EPOCH`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let counts = self.counts(UNIX_EPOCH);
        Box::pin(async move { Ok(counts.await?.by_class) })
    }

    /// Recounts the records by status, class and original code, compares the recount with the
    /// counters the store keeps so that [`counts`](Store::counts),
    /// [`count_by_class`](Store::count_by_class) and [`count`](Store::count) need not read the
    /// records, and reports every key whose counter drifted ([`CountsCheck::drifts`]: expected
    /// and found). With `repair`, sets each drifted counter to the recount, in the same
    /// transaction (SQLite, Postgres) or script (Redis) as the recount, so that no write slips
    /// between them. A counter is never left negative.
    ///
    /// The counters change in the same transaction or script as each write of a record, so
    /// they drift only when something writes the store's tables or keys behind its back (a
    /// hand-written `UPDATE`, a restore of part of a backup, a Redis that lost some keys). Run
    /// it after such an event, and otherwise about once a day or once a week: it reads every
    /// record's status, class and code once (per million records: about 1 s on Postgres,
    /// 3.5 s on SQLite, tens of seconds on Redis, which reads each record whole).
    ///
    /// The default, for a store that keeps no counters (its counts read the records
    /// themselves, as [`MemoryStore`] does), checks nothing and finds nothing.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed, cannot be read, or the repair cannot be
    /// written (nothing is repaired then).
    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        let _ = repair;
        Box::pin(std::future::ready(Ok(CountsCheck::default())))
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
    /// [`Deferred`](Status::Deferred), or an [`InFlight`](Status::InFlight) claim
    /// that expired, with `retry_at <= now`), the earliest retry-at first, and returns them as
    /// written: status `InFlight`, `retry_at = now + lease`, one more resend. Each one's
    /// [`Record::lease`] is the claim: its fencing token and its end.
    ///
    /// The claim is atomic: two schedulers on the same store never claim the same record while
    /// the lease runs. A scheduler that dies with a claim loses it when the lease ends; one that
    /// lives renews it ([`Change::Renewed`] through [`change_claimed`](Store::change_claimed)).
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
    /// Then it becomes [`InFlight`](Status::InFlight) until `until`, with one more resend
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

    /// Applies `change` to the record `lease` names only while that claim holds: the record is
    /// still [`InFlight`](Status::InFlight) with the lease's fencing token as its resend count
    /// (see [`Lease`]). It is how the holder of a claim renews it ([`Change::Renewed`]),
    /// finishes it ([`Change::Resolved`], [`Change::Dead`]) or gives it back
    /// ([`Change::Held`], [`Change::Released`]). [`Claim::Claimed`] returns the record as
    /// written. Otherwise nothing is written: [`Claim::ClaimedElsewhere`] (the claim ended:
    /// it expired and another claimer took the record, or someone changed it) or
    /// [`Claim::Missing`] (deleted meanwhile). A claimer that stalled past its lease and wakes
    /// up after another took the record changes nothing.
    ///
    /// The default is [`change_if_unchanged`](Store::change_if_unchanged) with the status and
    /// resend count the lease stands for: one atomic step wherever that one is, as in every
    /// store of this crate.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the read or write fails; nothing is changed.
    fn change_claimed(
        &self,
        lease: &Lease,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.change_if_unchanged(&lease.as_seen(), change)
    }

    /// Applies each `(lease, change)` of `changes` as [`change_claimed`](Store::change_claimed)
    /// does, each only while its claim holds, and returns each one's [`Claim`] in the same
    /// order: how a scheduler finishes a batch of re-sends (their resolutions) in one round trip
    /// instead of one per record. A claim that ended (another claimer took its record) is
    /// [`Claim::ClaimedElsewhere`] in its place and changes nothing, and the others still apply.
    ///
    /// A batch may name one claim more than once (a renewal, then its resolution): each
    /// record's changes apply in the batch's order.
    ///
    /// SQLite applies the batch in one `BEGIN IMMEDIATE` transaction (one commit, one fsync,
    /// instead of one per record). Postgres applies it in one statement (an `UPDATE … FROM
    /// unnest(…)`: one round trip and one commit; a record named `k` times takes `k`
    /// statements). Redis sends the batch's versioned writes together over its multiplexed
    /// connection (each write atomic on its own, as in [`change_claimed`](Store::change_claimed);
    /// round trips overlap instead of following each other). The default, and the memory
    /// store, apply the changes one after the other ([`change_claimed`](Store::change_claimed)
    /// each).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the read or write fails. SQLite then writes
    /// nothing of the batch, and a Postgres batch of distinct records nothing either; Redis
    /// and the default may have applied some of the changes (each is atomic on its own, and
    /// applying one again finds its claim ended).
    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        let each: Vec<_> = changes
            .into_iter()
            .map(|(lease, change)| self.change_claimed(&lease, change))
            .collect();
        Box::pin(async move {
            let mut claims = Vec::with_capacity(each.len());
            for change in each {
                claims.push(change.await?);
            }
            Ok(claims)
        })
    }

    /// Makes due at `now` every [`Deferred`](Status::Deferred) record that names `breaker`
    /// ([`Record::breaker`]) and is due after `now`: what a scheduler does when that breaker
    /// closes, so that the records held for it are sent at once rather than at the half-open
    /// time they were deferred to. Returns how many were released, or `None` when the store has
    /// no such single step (the default): the scheduler then releases them one at a time.
    ///
    /// One statement in SQLite and Postgres; one lock in memory.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails; nothing is released.
    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let _ = (breaker, now);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Whether [`change_claimed_many`](Store::change_claimed_many) applies a batch in one step
    /// (one transaction, one round trip) rather than one change after the other: a scheduler
    /// gathers its writes under a claim into batches only for a store that does. `false` by
    /// default; `true` for SQLite, Postgres and Redis.
    fn applies_batches(&self) -> bool {
        false
    }

    /// Merges `record`, a new failure of the claimed message (a re-send that failed again),
    /// into the record `lease` names, as [`put`](Store::put) merges
    /// ([`Record::merge_bounded`]), only while that claim holds (as for
    /// [`change_claimed`](Store::change_claimed)). The new failure's status and retry-at end
    /// the claim. [`Claim::Claimed`] returns the record as written; otherwise nothing is
    /// written ([`Claim::ClaimedElsewhere`], [`Claim::Missing`]): the failure of a re-send whose
    /// claim passed to someone else never undoes what they wrote.
    ///
    /// The check and the merge are one atomic step: one lock (memory), one `BEGIN IMMEDIATE`
    /// transaction (SQLite), one versioned write script (Redis), one statement (Postgres).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the read or write fails; nothing is written.
    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>>;

    /// The earliest retry-at time of the records a scheduler may claim: the
    /// [`Deferred`](Status::Deferred) ones and the claims in flight (whose retry-at is the end
    /// of their lease); `None` when there is none. What a scheduler sleeps until, instead of
    /// polling on a fixed beat. The stores read it off their index of due records (SQLite's and
    /// Postgres's index by retry-at, Redis's sorted set); the default searches the deferred and
    /// in-flight records.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        let deferred = self.search(&Filter::new().status(Status::Deferred), 0..usize::MAX);
        let in_flight = self.search(&Filter::new().status(Status::InFlight), 0..usize::MAX);
        Box::pin(async move {
            let (deferred, in_flight) = (deferred.await?, in_flight.await?);
            Ok(deferred
                .iter()
                .chain(&in_flight)
                .filter_map(|r| r.retry_at)
                .min())
        })
    }

    /// Reserves the next slot of the send schedule `schedule`, one schedule shared by every
    /// handle on this store (every process of a fleet): slots are at least `gap` apart, and a
    /// schedule idle since its last slot starts again at `now`. Returns the time of the slot
    /// reserved, `now` or later: the caller sends then, and the whole fleet together sends at
    /// most one message per `gap`. What the schedulers of a fleet share to drain at one rate
    /// together ([`Scheduler::fleet_rate`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html#method.fleet_rate)).
    ///
    /// One atomic step (a lock, a transaction, a script, a statement) that keeps one time per
    /// schedule, to the microsecond. The times are the callers' clocks: keep the fleet's clocks
    /// in step (NTP), or a caller whose clock runs ahead finds the schedule idle early.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails; nothing is reserved.
    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>>;

    /// Wake-ups the store pushes when a record may have become due sooner than
    /// [`next_due`](Store::next_due) said (another process wrote a deferred record, gave a
    /// claim back): a receiver whose value changes on each such write, so that a scheduler
    /// looks at once instead of at its next poll. `None` (the default) when the store pushes
    /// none: the scheduler's poll bounds the wait. Of the stores of this crate, only a
    /// `PostgresStore` made with `listen_for_due` pushes them (`LISTEN`/`NOTIFY`).
    ///
    /// Called once by each scheduler when it starts, inside a tokio runtime (a store may spawn
    /// the task that listens; it ends when the receiver is dropped). Best effort: a wake-up
    /// may be lost (the listening connection dropped), never the record.
    fn wake_ups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Keeps `note` for the fleet, in place of the note of the same
    /// [`topic`](FleetNote::topic) and [`author`](FleetNote::author) if there is one: what the
    /// processes sharing this store tell each other of their breakers, and an operator's
    /// override for all of them. A store may drop notes past their
    /// [`expires_at`](FleetNote::expires_at) meanwhile.
    ///
    /// The default keeps none: it fails, and a fleet on such a store acts process by process.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed, keeps no notes, or the write fails.
    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        drop(note);
        Box::pin(std::future::ready(Err(note::no_notes())))
    }

    /// Every note whose [`expires_at`](FleetNote::expires_at) is after `now`, in no order: a
    /// fleet has a note per process and breaker, so this is small (tens to a few thousand).
    ///
    /// The default keeps none: it fails.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed, keeps no notes, or the read fails.
    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        let _ = now;
        Box::pin(std::future::ready(Err(note::no_notes())))
    }

    /// Appends `entry` to the audit trail, which the store keeps apart from the records (no
    /// retention prunes it).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or the write fails.
    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>>;

    /// One page of the audit trail, the newest entry first: positions `page`, counted from 0,
    /// as for [`search`](Store::search).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>>;

    /// How many attempts of the message `id` count against its durable attempt budget
    /// ([`Record::budget_spent`]), or `None` when there is no record: what the dead-letter layer's
    /// attempt budget
    /// ([`DeadLetterLayer::attempt_budget`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html#method.attempt_budget))
    /// reads on each call. Stores read only that number, not the whole record; the default reads
    /// the record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let record = self.get(id);
        Box::pin(async move { Ok(record.await?.map(|r| r.budget_spent)) })
    }
}
