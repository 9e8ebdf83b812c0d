//! [`PostgresStore`]: dead letters in a Postgres database, shared by many instances.

mod counts;
mod error;
mod notify;
mod open;
mod pooled;
mod row;
mod text;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::ops::Range;
use std::pin::Pin;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqlx::Row;
use sqlx::postgres::PgPool;

use self::counts::{CountsSql, counted_by_table};
use self::error::pg_error;
pub use self::open::{DEFAULT_SCHEMA, OpenPostgres};
use self::open::{LOCK_CLASS, Opened, Source};
use self::pooled::Mode;
use self::row::{
    COLUMNS, Columns, PgQuery, count_of, decode_error, decode_row, encode_map, select_list,
};
use super::lease::rounds;
use super::query::{Change, Claim, Counts, Filter};
use super::record::{DEFAULT_HISTORY_LIMIT, Record, Status, add_clamped, from_millis, to_millis};
use super::schedule::{from_micros, gap_micros, to_micros};
use super::{
    AuditAction, AuditEntry, BoxFuture, CountsCheck, FleetNote, Lease, SortKey, Store, StoreError,
};

/// How many rows one statement of a [`delete`](Store::delete) removes at most: a purge or a
/// prune of a million records is a thousand short transactions, not one long one.
const DELETE_BATCH: i64 = 1_000;

/// How many expired notes one [`put_note`](Store::put_note) deletes at most: the notes of the
/// processes that stopped go a few with each write, and a write stays one short statement.
const NOTES_PRUNED: i64 = 100;

/// A dead-letter store in Postgres, shared by many instances (feature `postgres`, through sqlx).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_backstop_store::PostgresStore;
///
/// # async fn run() -> Result<(), tower_backstop_store::StoreError> {
/// // A pool of its own, tables in the schema `backstop`.
/// let store = PostgresStore::connect("postgres://app:secret@db/app").await?;
///
/// // Tables in a schema of their own, a smaller pool, statements cut at 10 s.
/// let billing = PostgresStore::connect("postgres://app:secret@db/app")
///     .schema("backstop_billing")
///     .max_connections(4)
///     .statement_timeout(Duration::from_secs(10))
///     .await?
///     .with_history_limit(20);
///
/// // Or over the pool the application already has.
/// let pool = sqlx::PgPool::connect("postgres://app:secret@db/app").await.unwrap();
/// let shared = PostgresStore::from_pool(pool).await?;
/// # Ok(()) }
/// ```
///
/// # Schema and migrations
///
/// The store keeps its tables in one schema ([`DEFAULT_SCHEMA`], `backstop`, unless
/// [`OpenPostgres::schema`] names another; two stores in two schemas share a database and never
/// see each other's records):
///
/// | table | what |
/// |---|---|
/// | `records` | one row per record: its fields as columns (times in milliseconds since the Unix epoch, `bigint`), the history, headers and root cause as `json`, tags and metadata as `jsonb`, the payload as `bytea` |
/// | `codes` | each code's first sighting (the "new code" alert) |
/// | `counts` | how many records there are of each status, class and code, over 8 slots per key (see [Counts](#counts)) |
/// | `audit` | the audit trail |
/// | `notes` | the fleet's notes of [`put_note`](Store::put_note): one row per topic and author, times in milliseconds, indexed by expiry time |
/// | `slots` | the shared send schedules of [`reserve_slot`](Store::reserve_slot): a name and the next free time in microseconds (made on first use, under the migration lock) |
/// | `schema_migrations` | one row per migration applied: version, name, time |
///
/// The migrations are SQL files shipped inside the crate. Opening a store applies those the
/// schema lacks, in one transaction that first takes a **transaction-scoped advisory lock**
/// (`pg_advisory_xact_lock`, keyed by the schema name): of ten instances that start at once on
/// a new database, one migrates and the others wait for it, then find nothing to do. The lock
/// ends with the transaction, so a process killed mid-migration leaves neither a lock nor half a
/// schema. A schema written by a newer version of the crate (a version this one does not know)
/// fails to open, with an error that says to upgrade tower-backstop; an older one is upgraded in
/// place.
///
/// Dead records never slow a claim: the claim reads a partial index, `records_due`, that holds
/// only the deferred and in-flight rows, by due time. Dead and resolved rows are not in it,
/// so a table of a million dead letters and ten deferred ones claims by reading ten index
/// entries. (One table with a partial index rather than a table or a partition per status: a
/// status change is one `UPDATE` of one row, the id stays unique under a plain primary key, and
/// no row moves between partitions under a concurrent `FOR UPDATE`, which Postgres answers with a
/// serialization error.) Other indexes serve the searches and counts: by last failure time, by
/// class, by code, by status (with class and code, for the counts of a window), and a GIN index
/// on the tags.
///
/// # What each call does
///
/// - [`put_many`](Store::put_many) is one statement, one round trip: `INSERT … ON CONFLICT (id)
///   DO UPDATE` whose update is [`Record::merge_bounded`] written in SQL (attempts add up, the
///   histories concatenate and keep the last K, tags unite…), so two instances writing one id at
///   once both land, merged, with no read-modify-write loop. Repeated ids within a batch are
///   merged in the process first. The code's first sighting is noted in the same statement.
/// - [`claim_due`](Store::claim_due) is one statement: `UPDATE … FROM (SELECT … ORDER BY
///   retry_at_ms, id LIMIT n FOR UPDATE SKIP LOCKED) … RETURNING`. Rows another claimer holds
///   are skipped, not waited for: two stores (two processes) on one database never both claim a
///   record, and never block each other.
/// - [`claim`](Store::claim), [`change_if_unchanged`](Store::change_if_unchanged),
///   [`change_claimed`](Store::change_claimed) and [`update`](Store::update) are one `UPDATE …
///   WHERE id = $1 AND status = $2 AND resends = $3 RETURNING`: the compare and the set are one
///   statement.
/// - [`put_claimed`](Store::put_claimed) is the `put` statement for one row that exists, whose
///   update runs only `WHERE status = 'in_flight' AND resends = token`.
/// - [`next_due`](Store::next_due) is `min(retry_at_ms)` off the partial index `records_due`;
///   [`reserve_slot`](Store::reserve_slot) one `INSERT … ON CONFLICT DO UPDATE … RETURNING` on
///   the schedule's row.
/// - [`put_note`](Store::put_note) is one `INSERT … ON CONFLICT (topic, author) DO UPDATE`
///   that also deletes up to 100 expired notes (`FOR UPDATE SKIP LOCKED`: never the rows
///   another write is deleting); [`notes`](Store::notes) one `SELECT … WHERE expires_at_ms > $1`.
/// - [`delete`](Store::delete) removes at most 1,000 rows a statement, each its own short
///   transaction, until none match: retention over a large store never holds one long
///   transaction or a lock on the whole excess.
/// - [`counts`](Store::counts) is two round trips: the oldest record's last failure time (off
///   the index by time), then the counts (see [Counts](#counts)).
///
/// # Counts
///
/// The table `counts` holds how many records there are of each status, class and code. Three
/// statement-level triggers on `records` (after `INSERT`, `UPDATE`, `DELETE`, with their
/// transition tables) change it at the end of every statement that writes records, in that
/// statement's transaction: a put, a change of status, a claim, a deletion, and any statement
/// of your own on the table. Each key is spread over 8 rows (slot `hashtext(id) & 7`), so that
/// schedulers that acknowledge their claims at once change different rows rather than wait on
/// one; a statement changes its rows in key order, so two never wait on each other in a cycle.
/// A statement that changes no status, class or code (a renewal of a claim) changes no count. A
/// row never goes below 0.
///
/// So the all-time counts read a few rows, whatever the number of records:
/// [`count_by_class`](Store::count_by_class), [`count`](Store::count) with a filter of a status,
/// a class and a code at most, and [`counts`](Store::counts) from a time at or before the
/// oldest record's last failure (`UNIX_EPOCH`). The counts of a shorter window stay exact: they
/// read the index by status and last failure time (`counts.sql`), as many entries as records in
/// the window.
///
/// Migration 3 adds the table and its triggers to a schema of an earlier version and fills it
/// from the records, in the migration's transaction: creating the triggers locks `records`
/// against writes (`SHARE ROW EXCLUSIVE`; reads go on) until the fill commits, about a second per
/// million records, so that no write is lost or counted twice. A fleet that upgrades keeps
/// writing once it is done; instances of an earlier version refuse to open the schema
/// afterwards (its version is newer than theirs). [`check_counts`](Store::check_counts)
/// recounts the records (one `REPEATABLE READ` snapshot, no lock) and, when repairing, locks
/// `records` in `SHARE` mode (writes wait) while it recounts and sets the drifted keys.
///
/// # Text
///
/// Postgres text cannot hold the character NUL. A record may (an id is any idempotency key), so
/// the store writes NUL as U+0001 U+0001 and U+0001 as U+0001 U+0002 in its text and `jsonb`
/// columns, a code that keeps order and equality, and reads them back. Any other text is stored
/// as it is.
///
/// # Connections, TLS, PgBouncer
///
/// [`connect`](PostgresStore::connect) opens a pool of its own (10 connections, a 5 s acquire
/// timeout, no statement timeout unless set); [`from_pool`](PostgresStore::from_pool) takes the
/// application's `PgPool` and its settings. The URL's password never appears in errors, `Debug`
/// or `Display` ([`redact_url`](super::redact_url), and a `password=` parameter hidden too). The feature builds sqlx
/// without a TLS stack: a URL with `sslmode=require` cannot connect (the default, `prefer`,
/// connects without TLS). To connect over TLS, enable one of sqlx's TLS features in
/// your own `Cargo.toml` (`sqlx = { version = "0.8", features = ["tls-rustls"] }`): Cargo builds
/// one sqlx with both.
///
/// Behind PgBouncer in transaction pooling mode (`pool_mode = transaction`, PgBouncer's other
/// defaults): open the store with [`behind_pooler`](OpenPostgres::behind_pooler) (or the URL
/// parameter `pooler=transaction`). The connections then send no startup parameter PgBouncer
/// refuses, and every statement runs unnamed in a transaction of its own, so that it is parsed
/// and executed on one server connection (two more round trips a call). The migration lock is
/// transaction-scoped (`pg_advisory_xact_lock`), so migrations work there unchanged.
/// [`listen_for_due`](PostgresStore::listen_for_due) cannot listen through a transaction
/// pooler: it says so once and the schedulers poll, reading the next due time from the store
/// ([`next_due`](Store::next_due)). A store opened without the option fails through such a
/// pooler: PgBouncer refuses sqlx's `extra_float_digits` at login, and sqlx's prepared
/// statements collide on the pooler's shared server connections.
///
/// When the server restarts, calls fail with a [`StoreError`] until it is back, then work again
/// with the same store (the pool tests each connection before use and opens new ones); behind
/// PgBouncer too, whose connections to the server are opened again as the calls need them.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Sql>,
    schema: String,
    history_limit: usize,
    /// The URL the store connected to, its password hidden; `None` over a given pool.
    url: Option<String>,
    /// The channel of due wake-ups, with [`listen_for_due`](PostgresStore::listen_for_due).
    due: Option<Arc<str>>,
    /// How statements run: straight on the pool, or behind a transaction pooler.
    mode: Mode,
}

/// `postgres {url} schema {schema}` (or `postgres pool schema {schema}` over a given pool), the
/// URL's credentials hidden ([`redact_url`](super::redact_url), and a `password=` parameter).
impl std::fmt::Display for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.url {
            Some(url) => write!(f, "postgres {url} schema {}", self.schema),
            None => write!(f, "postgres pool schema {}", self.schema),
        }
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.url)
            .field("schema", &self.schema)
            .field("history_limit", &self.history_limit)
            .finish_non_exhaustive()
    }
}

impl IntoFuture for OpenPostgres {
    type Output = Result<PostgresStore, StoreError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Opened {
                pool,
                url,
                schema,
                quoted,
                mode,
            } = self.open().await?;
            Ok(PostgresStore {
                pool,
                sql: Arc::new(Sql::new(&quoted)),
                schema,
                history_limit: DEFAULT_HISTORY_LIMIT,
                url,
                due: None,
                mode,
            })
        })
    }
}

/// The statements of one store, with its schema written in.
#[derive(Debug)]
struct Sql {
    /// The records table, schema-qualified.
    records: String,
    get: String,
    put: String,
    /// `put` for one record, only while its claim holds.
    put_claimed: String,
    claim: String,
    next_due: String,
    reserve_slot: String,
    create_slots: String,
    change: String,
    /// `change` for a batch of changes under claims, one statement.
    change_many: String,
    counts: String,
    /// The statements of the counts table.
    counts_sql: CountsSql,
    budget: String,
    append_audit: String,
    audit: String,
    put_note: String,
    notes: String,
}

impl Sql {
    fn new(schema: &str) -> Self {
        let columns = select_list("");
        let fill = |sql: &str| {
            sql.replace("{schema}", schema)
                .replace("{returning}", &select_list("r."))
                .replace("{columns}", &columns)
        };
        let put = include_str!("postgres/put.sql");
        Sql {
            records: format!("{schema}.records"),
            get: format!("SELECT {columns} FROM {schema}.records WHERE id = $1"),
            put: fill(&put.replace("{existing}", "").replace("{claimed}", "")),
            put_claimed: fill(
                &put.replace(
                    "{existing}",
                    "WHERE EXISTS (SELECT 1 FROM {schema}.records AS x WHERE x.id = b.id)",
                )
                .replace(
                    "{claimed}",
                    "WHERE r.status = 'in_flight' AND r.resends = $27\nRETURNING {returning}",
                ),
            ),
            claim: fill(include_str!("postgres/claim.sql")),
            next_due: format!(
                "SELECT min(retry_at_ms) FROM {schema}.records \
                 WHERE status IN ('deferred', 'in_flight')"
            ),
            reserve_slot: format!(
                "INSERT INTO {schema}.slots AS s (name, next_us) VALUES ($1, $2 + $3) \
                 ON CONFLICT (name) DO UPDATE SET next_us = greatest(s.next_us, $2) + $3 \
                 RETURNING next_us - $3"
            ),
            create_slots: format!(
                "CREATE TABLE IF NOT EXISTS {schema}.slots (\
                 name text COLLATE \"C\" PRIMARY KEY, next_us bigint NOT NULL)"
            ),
            change: fill(include_str!("postgres/change.sql")),
            change_many: fill(include_str!("postgres/change_many.sql")),
            counts: fill(include_str!("postgres/counts.sql")),
            counts_sql: CountsSql::new(schema),
            budget: format!("SELECT budget_spent FROM {schema}.records WHERE id = $1"),
            append_audit: format!(
                "INSERT INTO {schema}.audit (at_ms, actor, action, filter, planned, sent, outcome) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)"
            ),
            audit: format!(
                "SELECT at_ms, actor, action, filter, planned, sent, outcome FROM {schema}.audit \
                 ORDER BY seq DESC LIMIT $1 OFFSET $2"
            ),
            // At most `NOTES_PRUNED` expired notes go with each write, those other writes hold
            // skipped (`SKIP LOCKED`: a write never waits for another's deletes, so two never
            // wait for each other), and never the note written (one statement must not change
            // one row twice).
            put_note: format!(
                "WITH expired AS (
                     DELETE FROM {schema}.notes WHERE (topic, author) IN (
                         SELECT topic, author FROM {schema}.notes
                         WHERE expires_at_ms <= $4 AND (topic, author) <> ($1, $2)
                         LIMIT {NOTES_PRUNED} FOR UPDATE SKIP LOCKED))
                 INSERT INTO {schema}.notes (topic, author, body, written_at_ms, expires_at_ms)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (topic, author) DO UPDATE SET body = excluded.body,
                     written_at_ms = excluded.written_at_ms, expires_at_ms = excluded.expires_at_ms"
            ),
            notes: format!(
                "SELECT topic, author, body, written_at_ms, expires_at_ms FROM {schema}.notes \
                 WHERE expires_at_ms > $1"
            ),
        }
    }
}

/// A parameter of a filter's `WHERE` clause.
enum Arg {
    Text(String),
    Int(i64),
    Texts(Vec<String>),
}

fn bind_all(mut query: PgQuery<'_>, args: Vec<Arg>) -> PgQuery<'_> {
    for arg in args {
        query = match arg {
            Arg::Text(s) => query.bind(s),
            Arg::Int(n) => query.bind(n),
            Arg::Texts(v) => query.bind(v),
        };
    }
    query
}

/// A `WHERE` condition for `filter` and its parameters, numbered from `$1`.
fn where_clause(filter: &Filter) -> (String, Vec<Arg>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut args: Vec<Arg> = Vec::new();
    let mut push = |clause: &str, arg: Arg| {
        args.push(arg);
        clauses.push(clause.replace('?', &format!("${}", args.len())));
    };
    if let Some(class) = &filter.class {
        push("class = ?", Arg::Text(text::encode(class).into_owned()));
    }
    if let Some(code) = &filter.code {
        push("code = ?", Arg::Text(text::encode(code).into_owned()));
    }
    if let Some(since) = filter.since {
        push("last_failed_at_ms >= ?", Arg::Int(to_millis(since)));
    }
    if let Some(until) = filter.until {
        push("last_failed_at_ms < ?", Arg::Int(to_millis(until)));
    }
    if let Some(status) = filter.status {
        push("status = ?", Arg::Text(status.as_str().to_owned()));
    }
    if !filter.tags.is_empty() {
        push("tags @> ?::jsonb", Arg::Text(encode_map(&filter.tags)));
    }
    if !filter.ids.is_empty() {
        let ids = filter
            .ids
            .iter()
            .map(|id| text::encode(id).into_owned())
            .collect();
        push("id = ANY(?::text[])", Arg::Texts(ids));
    }
    if clauses.is_empty() {
        ("true".to_owned(), args)
    } else {
        (clauses.join(" AND "), args)
    }
}

/// What a [`Change`] writes, as the parameters `$2`..`$7` of the `change` statement: status,
/// retry-at, resends added, whether the budget starts again, resolved-at, metadata entries.
struct ChangeArgs {
    status: Status,
    retry_at: Option<i64>,
    resends: i64,
    reset_budget: bool,
    resolved_at: Option<i64>,
    metadata: &'static str,
}

impl ChangeArgs {
    /// The SQL form of `change`, which [`Change::apply`] is in the process.
    fn of(change: Change) -> Self {
        let at = |t: SystemTime| Some(to_millis(t));
        let base = |status: Status, retry_at: Option<i64>| ChangeArgs {
            status,
            retry_at,
            resends: 0,
            reset_budget: false,
            resolved_at: None,
            metadata: "{}",
        };
        match change {
            Change::Redriving { until } => ChangeArgs {
                resends: 1,
                reset_budget: true,
                ..base(Status::InFlight, at(until))
            },
            Change::Resolved { at: t } => ChangeArgs {
                resolved_at: at(t),
                ..base(Status::Resolved, None)
            },
            Change::Dead => base(Status::Dead, None),
            Change::Reconciled { at: t } => ChangeArgs {
                resolved_at: at(t),
                metadata: r#"{"reconciled": "delivered"}"#,
                ..base(Status::Resolved, None)
            },
            Change::NotDelivered { retry_at } => ChangeArgs {
                metadata: r#"{"reconciled": "not_delivered"}"#,
                ..base(Status::Deferred, at(retry_at))
            },
            Change::Held { retry_at } => ChangeArgs {
                resends: -1,
                ..base(Status::Deferred, at(retry_at))
            },
            Change::Renewed { until } => base(Status::InFlight, at(until)),
            Change::Released { retry_at } => base(Status::Deferred, at(retry_at)),
        }
    }
}

impl PostgresStore {
    /// Opens the store at `url` (`postgres://user:password@host:5432/database`, any URL sqlx's
    /// `PgConnectOptions` reads) with a pool of its own: set options on the returned
    /// [`OpenPostgres`], then `.await` it. Keeps the last
    /// [`DEFAULT_HISTORY_LIMIT`](super::DEFAULT_HISTORY_LIMIT) errors per record.
    ///
    /// # Errors
    ///
    /// As [`OpenPostgres`]: a malformed URL, a server that cannot be reached or refuses the
    /// login, a failed migration, a schema of a newer version.
    pub fn connect(url: &str) -> OpenPostgres {
        OpenPostgres::new(Source::Url(url.to_owned()))
    }

    /// Opens the store over the application's own pool (its size, timeouts and TLS settings
    /// apply): set options on the returned [`OpenPostgres`], then `.await` it.
    ///
    /// # Errors
    ///
    /// As [`OpenPostgres`]: no connection from the pool, a failed migration, a schema of a
    /// newer version, a pool setting given to the store.
    pub fn from_pool(pool: PgPool) -> OpenPostgres {
        OpenPostgres::new(Source::Pool(pool))
    }

    /// Keeps the last `limit` errors per record (at least one).
    pub fn with_history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// Pushes wake-ups to the schedulers over this store through `LISTEN`/`NOTIFY`: each write
    /// that leaves a record deferred (a failure deferred, a claim given back, a record held) is
    /// followed by a `NOTIFY` on the channel
    /// `{schema}_due` (or `backstop_due_` and a hash of the schema name, when that is longer
    /// than Postgres's 63 bytes), and each scheduler ([`Store::wake_ups`]) listens on it with a connection
    /// taken from the pool for as long as it runs, so that a record another instance defers
    /// for now is sent at once instead of at the next poll. Off by default: the schedulers
    /// sleep until the earliest due time they read ([`Store::next_due`]), at most their poll
    /// (1 s by default), which is enough for most fleets.
    ///
    /// The cost: one more statement after each such write, and one connection per scheduler.
    /// A lost wake-up (the listening connection dropped) costs at most one poll: the scheduler
    /// listens again within a second.
    ///
    /// `LISTEN` needs a session of its own, which a transaction pooler does not keep (a later
    /// statement may run on another server connection). On a store opened
    /// [`behind_pooler`](OpenPostgres::behind_pooler) this logs one warning (`tracing`, level
    /// WARN) and the schedulers over it poll as they do without this option; its writes still
    /// send the `NOTIFY`, for schedulers of stores that connect to Postgres directly. To listen
    /// from behind PgBouncer, give the store a pool that connects past PgBouncer or through a
    /// session-pooled port.
    pub fn listen_for_due(mut self) -> Self {
        if self.mode.pooled {
            tracing::warn!(
                schema = %self.schema,
                "postgres dead-letter store behind a transaction pooler: LISTEN cannot be held \
                 there, so the schedulers over this store poll for due records instead of \
                 being woken (NOTIFY is still sent)"
            );
        }
        self.due = Some(notify::channel(&self.schema));
        self
    }

    /// Notifies the channel of due wake-ups, if this store has one.
    async fn wake(&self) {
        if let Some(channel) = &self.due {
            // Best effort: the write it follows is done; a lost wake-up costs at most one poll
            // of the schedulers.
            let query = sqlx::query("SELECT pg_notify($1, '')").bind(&**channel);
            if let Err(error) = self.execute(query).await {
                tracing::debug!(%error, %channel, "due wake-up not sent; the schedulers' poll bounds the wait");
            }
        }
    }

    /// The schema that holds the store's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The store's pool: the one it was given, or the one it opened.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Writes `records` as [`put_many`](Store::put_many) does, in one statement, on `conn`:
    /// the caller's own connection, or a transaction the caller opened (`&mut *tx`), so that the
    /// records commit with the caller's own rows, or roll back with them. The outbox pattern:
    /// a business row and the request that announces it (a record an `Outbox` built, deferred
    /// to be sent by the scheduler) are written in one transaction, so that neither is ever
    /// stored without the other. The records are visible to schedulers once the transaction
    /// commits.
    ///
    /// ```no_run
    /// # async fn run(store: tower_backstop_store::PostgresStore, record: tower_backstop_store::Record) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
    ///     .bind(42_i64)
    ///     .bind(1999_i64)
    ///     .execute(&mut *tx)
    ///     .await?;
    /// store.put_in(&mut tx, vec![record]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the statement fails (the transaction is then aborted, as for any
    /// failed statement in Postgres) or a record cannot be encoded; nothing is written.
    ///
    /// Behind a transaction pooler ([`behind_pooler`](OpenPostgres::behind_pooler)) the
    /// statement is unnamed, and `conn` must be in a transaction (as above): outside one, the
    /// pooler may run its parse and its execution on two server connections.
    pub async fn put_in(
        &self,
        conn: &mut sqlx::PgConnection,
        records: Vec<Record>,
    ) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.put_query(&self.sql.put, records)?
            .persistent(self.mode.persistent())
            .execute(conn)
            .await
            .map_err(pg_error("write records"))?;
        Ok(())
    }

    /// Closes the pool: waits for the connections in use to come back, then closes every
    /// connection. Every later call fails with [`StoreError::closed`]. Over a given pool, this
    /// closes that pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Runs `f` with a clone of the store, as a `'static` boxed future.
    fn run<T, F>(&self, f: impl FnOnce(PostgresStore) -> F) -> BoxFuture<'static, T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        Box::pin(f(self.clone()))
    }

    async fn put_batch(&self, records: Vec<Record>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.execute(self.put_query(&self.sql.put, records)?)
            .await
            .map_err(pg_error("write records"))?;
        Ok(())
    }

    /// Merges `record` into its row only while `lease` holds ([`Store::put_claimed`]).
    async fn put_claimed_row(&self, lease: Lease, record: Record) -> Result<Claim, StoreError> {
        lease.check_id(&record)?;
        let query = self
            .put_query(&self.sql.put_claimed, vec![record])?
            .bind(i64::from(lease.token));
        let row = self
            .fetch_optional(query)
            .await
            .map_err(pg_error("write record"))?;
        if let Some(row) = row {
            return Ok(Claim::Claimed(Box::new(decode_row(&row)?)));
        }
        Ok(match self.get_record(&lease.id).await? {
            Some(now) => Claim::ClaimedElsewhere {
                status: now.status,
                resends: now.resends,
            },
            None => Claim::Missing,
        })
    }

    async fn get_record(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let row = self
            .fetch_optional(sqlx::query(&self.sql.get).bind(text::encode(id).into_owned()))
            .await
            .map_err(pg_error("read record"))?;
        row.as_ref().map(decode_row).transpose()
    }

    /// Reserves a slot of the send schedule `name` ([`Store::reserve_slot`]), making the
    /// schedules' table first when a schema of an earlier version has none.
    async fn reserve(&self, name: &str, now: i64, gap: i64) -> Result<SystemTime, StoreError> {
        let name = text::encode(name).into_owned();
        for first in [true, false] {
            let query = sqlx::query(&self.sql.reserve_slot)
                .bind(&name)
                .bind(now)
                .bind(gap);
            let slot = match self.fetch_one(query).await {
                Ok(row) => row.try_get::<i64, _>(0),
                Err(e) => Err(e),
            };
            match slot {
                Ok(slot) => return Ok(from_micros(slot)),
                Err(sqlx::Error::Database(e)) if first && e.code().as_deref() == Some("42P01") => {
                    self.create_slots().await?;
                }
                Err(e) => return Err(pg_error("reserve a send slot")(e)),
            }
        }
        Err(StoreError::new(
            "postgres dead-letter store: reserve a send slot: the schedules' table is missing",
        ))
    }

    /// Creates the table of the send schedules, under the schema's migration lock: a schema
    /// migrated by an earlier version gets it on first use, without a schema version of its own.
    async fn create_slots(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(pg_error("begin"))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_CLASS)
            .bind(&self.schema)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(pg_error("take the migration lock"))?;
        sqlx::query(&self.sql.create_slots)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(pg_error("create the send schedules"))?;
        tx.commit().await.map_err(pg_error("commit"))
    }

    /// The `put` statement `sql` with `records` bound: folded by id, one array per column, the
    /// codes' first sightings and the history limit.
    fn put_query<'q>(&self, sql: &'q str, records: Vec<Record>) -> Result<PgQuery<'q>, StoreError> {
        let limit = self.history_limit;
        // Each code's first sighting, in batch order, before repeated ids are folded.
        let codes: Vec<String> = records
            .iter()
            .map(|r| text::encode(&r.code).into_owned())
            .collect();
        let seen_at: Vec<i64> = records
            .iter()
            .map(|r| to_millis(r.last_failed_at))
            .collect();
        // Fold repeated ids within the batch, in order: one row per id in the statement.
        let mut batch: Vec<Record> = Vec::with_capacity(records.len());
        let mut at: HashMap<String, usize> = HashMap::new();
        for mut record in records {
            match at.get(&record.id) {
                Some(&i) => batch[i].merge_bounded(record, limit),
                None => {
                    record.bound_history(limit);
                    at.insert(record.id.clone(), batch.len());
                    batch.push(record);
                }
            }
        }
        let mut columns = Columns::default();
        for record in batch {
            columns.push(record)?;
        }
        Ok(columns
            .bind(sqlx::query(sql))
            .bind(codes)
            .bind(seen_at)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX)))
    }

    /// Applies `change` to the record `id`, only if it still has the status and resends of
    /// `seen` when given.
    async fn change(
        &self,
        id: &str,
        change: Change,
        seen: Option<(Status, u32)>,
    ) -> Result<Claim, StoreError> {
        let args = ChangeArgs::of(change);
        let query = sqlx::query(&self.sql.change)
            .bind(text::encode(id).into_owned())
            .bind(args.status.as_str())
            .bind(args.retry_at)
            .bind(args.resends)
            .bind(args.reset_budget)
            .bind(args.resolved_at)
            .bind(args.metadata)
            .bind(seen.map(|s| s.0.as_str()))
            .bind(seen.map(|s| i64::from(s.1)));
        let row = self
            .fetch_one(query)
            .await
            .map_err(pg_error("change record"))?;
        let changed: Option<String> = row.try_get(0).map_err(pg_error("change record"))?;
        if changed.is_some() {
            return Ok(Claim::Claimed(Box::new(decode_row(&row)?)));
        }
        let now: Option<String> = row
            .try_get(COLUMNS.len())
            .map_err(pg_error("change record"))?;
        let resends: Option<i64> = row
            .try_get(COLUMNS.len() + 1)
            .map_err(pg_error("change record"))?;
        match (now, resends) {
            (Some(status), Some(resends)) => Ok(Claim::ClaimedElsewhere {
                status: status.parse()?,
                resends: count_of(resends),
            }),
            _ => Ok(Claim::Missing),
        }
    }

    /// Applies one round of a batch of changes under claims (no record twice) in one
    /// statement ([`Store::change_claimed_many`]): each change's position in the batch and its
    /// [`Claim`].
    async fn change_round(
        &self,
        round: Vec<(usize, Lease, Change)>,
    ) -> Result<Vec<(usize, Claim)>, StoreError> {
        let n = round.len();
        let mut ids = Vec::with_capacity(n);
        let (mut statuses, mut retry_ats) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut resends, mut resets) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut resolved_ats, mut metadata) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut tokens, mut at) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut leases = HashMap::with_capacity(n);
        for (i, lease, change) in round {
            let args = ChangeArgs::of(change);
            ids.push(text::encode(&lease.id).into_owned());
            statuses.push(args.status.as_str());
            retry_ats.push(args.retry_at);
            resends.push(args.resends);
            resets.push(args.reset_budget);
            resolved_ats.push(args.resolved_at);
            metadata.push(args.metadata);
            tokens.push(i64::from(lease.token));
            at.push(i64::try_from(i).unwrap_or(i64::MAX));
            leases.insert(i, lease);
        }
        let query = sqlx::query(&self.sql.change_many)
            .bind(ids)
            .bind(statuses)
            .bind(retry_ats)
            .bind(resends)
            .bind(resets)
            .bind(resolved_ats)
            .bind(metadata)
            .bind(tokens)
            .bind(at)
            .bind(Status::InFlight.as_str());
        let rows = self
            .fetch_all(query)
            .await
            .map_err(pg_error("change records"))?;
        let failed = |e| pg_error("change records")(e);
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            let i: i64 = row.try_get(COLUMNS.len() + 1).map_err(failed)?;
            let i = usize::try_from(i).unwrap_or(usize::MAX);
            let changed: Option<String> = row.try_get(0).map_err(failed)?;
            if changed.is_some() {
                claims.push((i, Claim::Claimed(Box::new(decode_row(row)?))));
                continue;
            }
            let now: Option<String> = row.try_get(COLUMNS.len() + 2).map_err(failed)?;
            let count: Option<i64> = row.try_get(COLUMNS.len() + 3).map_err(failed)?;
            let claim = match (now, count) {
                (Some(status), Some(count)) => {
                    let (status, count) = (status.parse()?, count_of(count));
                    let lease = leases.get(&i).ok_or_else(|| {
                        StoreError::new("postgres dead-letter store: a change not asked for")
                    })?;
                    if (status, count) == (Status::InFlight, lease.token) {
                        // Read as of the statement's start, while a change committed since
                        // made the claim end: read it again.
                        match self.get_record(&lease.id).await? {
                            Some(r) => Claim::ClaimedElsewhere {
                                status: r.status,
                                resends: r.resends,
                            },
                            None => Claim::Missing,
                        }
                    } else {
                        Claim::ClaimedElsewhere {
                            status,
                            resends: count,
                        }
                    }
                }
                _ => Claim::Missing,
            };
            claims.push((i, claim));
        }
        if claims.len() != n {
            return Err(StoreError::new(format!(
                "postgres dead-letter store: change records: {} answers to a batch of {n}",
                claims.len()
            )));
        }
        Ok(claims)
    }

    async fn delete_matching(&self, filter: &Filter) -> Result<u64, StoreError> {
        let (clause, args) = where_clause(filter);
        let n = args.len() + 1;
        let records = &self.sql.records;
        // Locked in id order and checked again once locked: a record changed meanwhile so
        // that it no longer matches is not deleted.
        let sql = format!(
            "DELETE FROM {records} WHERE id IN (SELECT id FROM {records} WHERE {clause} \
             ORDER BY id LIMIT ${n} FOR UPDATE)"
        );
        let mut deleted = 0;
        loop {
            let (_, args) = where_clause(filter);
            let done = self
                .execute(bind_all(sqlx::query(&sql), args).bind(DELETE_BATCH))
                .await
                .map_err(pg_error("delete records"))?
                .rows_affected();
            deleted += done;
            if done < DELETE_BATCH as u64 {
                return Ok(deleted);
            }
        }
    }

    async fn write_note(&self, note: FleetNote) -> Result<(), StoreError> {
        let owned = |s: &str| text::encode(s).into_owned();
        let query = sqlx::query(&self.sql.put_note)
            .bind(owned(&note.topic))
            .bind(owned(&note.author))
            .bind(owned(&note.body))
            .bind(to_millis(note.written_at))
            .bind(to_millis(note.expires_at));
        self.execute(query).await.map_err(pg_error("write note"))?;
        Ok(())
    }

    async fn read_notes(&self, now: SystemTime) -> Result<Vec<FleetNote>, StoreError> {
        let rows = self
            .fetch_all(sqlx::query(&self.sql.notes).bind(to_millis(now)))
            .await
            .map_err(pg_error("read notes"))?;
        let get = pg_error("read notes");
        rows.iter()
            .map(|row| {
                let text_at = |i: usize| -> Result<String, StoreError> {
                    let s: String = row.try_get(i).map_err(&get)?;
                    text::decode(s).map_err(|e| decode_error("note", e))
                };
                Ok(FleetNote {
                    topic: text_at(0)?,
                    author: text_at(1)?,
                    body: text_at(2)?,
                    written_at: from_millis(row.try_get(3).map_err(&get)?),
                    expires_at: from_millis(row.try_get(4).map_err(&get)?),
                })
            })
            .collect()
    }

    async fn read_audit(&self, page: Range<usize>) -> Result<Vec<AuditEntry>, StoreError> {
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let query = sqlx::query(&self.sql.audit)
            .bind(i64::try_from(page.len()).unwrap_or(i64::MAX))
            .bind(i64::try_from(page.start).unwrap_or(i64::MAX));
        let rows = self
            .fetch_all(query)
            .await
            .map_err(pg_error("read audit trail"))?;
        let get = pg_error("read audit trail");
        rows.iter()
            .map(|row| {
                let text_at = |i: usize| -> Result<String, StoreError> {
                    let s: String = row.try_get(i).map_err(&get)?;
                    text::decode(s).map_err(|e| decode_error("audit entry", e))
                };
                let action = text_at(2)?;
                let action = AuditAction::parse(&action).ok_or_else(|| {
                    decode_error("audit entry", format!("unknown audit action {action:?}"))
                })?;
                Ok(AuditEntry {
                    at: from_millis(row.try_get(0).map_err(&get)?),
                    actor: text_at(1)?,
                    action,
                    filter: text_at(3)?,
                    planned: row
                        .try_get::<Option<i64>, _>(4)
                        .map_err(&get)?
                        .map(|n| u64::try_from(n).unwrap_or(0)),
                    sent: u64::try_from(row.try_get::<i64, _>(5).map_err(&get)?).unwrap_or(0),
                    outcome: text_at(6)?,
                })
            })
            .collect()
    }
}

/// Adds a keyset page's key to `args`: its time in milliseconds and its id. Returns their
/// placeholders' numbers (`$t`, `$id`).
fn bind_key(args: &mut Vec<Arg>, key: &SortKey) -> (usize, usize) {
    args.push(Arg::Int(to_millis(key.at)));
    args.push(Arg::Text(text::encode(&key.id).into_owned()));
    (args.len() - 1, args.len())
}

impl Store for PostgresStore {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        let deferred = records.iter().any(|r| r.status == Status::Deferred);
        self.run(|this| async move {
            this.put_batch(records).await?;
            if deferred {
                this.wake().await;
            }
            Ok(())
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.run(|this| async move { this.get_record(&id).await })
    }

    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (clause, args) = where_clause(filter);
        self.run(|this| async move {
            if page.is_empty() {
                return Ok(Vec::new());
            }
            let n = args.len();
            let sql = format!(
                "SELECT {} FROM {} WHERE {clause} ORDER BY last_failed_at_ms DESC, id \
                 LIMIT ${} OFFSET ${}",
                select_list(""),
                this.sql.records,
                n + 1,
                n + 2
            );
            let query = bind_all(sqlx::query(&sql), args)
                .bind(i64::try_from(page.len()).unwrap_or(i64::MAX))
                .bind(i64::try_from(page.start).unwrap_or(i64::MAX));
            let rows = this
                .fetch_all(query)
                .await
                .map_err(pg_error("search records"))?;
            rows.iter().map(decode_row).collect()
        })
    }

    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (clause, args) = where_clause(filter);
        let other_status = matches!(filter.status, Some(Status::Dead | Status::Resolved));
        self.run(|this| async move {
            if page.is_empty() || other_status {
                return Ok(Vec::new());
            }
            let n = args.len();
            // On the index of due records (`records_due`: retry-at, id; waiting rows only).
            let sql = format!(
                "SELECT {} FROM {} WHERE status IN ('deferred', 'in_flight') \
                 AND retry_at_ms IS NOT NULL AND {clause} ORDER BY retry_at_ms, id \
                 LIMIT ${} OFFSET ${}",
                select_list(""),
                this.sql.records,
                n + 1,
                n + 2
            );
            let query = bind_all(sqlx::query(&sql), args)
                .bind(i64::try_from(page.len()).unwrap_or(i64::MAX))
                .bind(i64::try_from(page.start).unwrap_or(i64::MAX));
            let rows = this
                .fetch_all(query)
                .await
                .map_err(pg_error("search waiting records"))?;
            rows.iter().map(decode_row).collect()
        })
    }

    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (mut clause, mut args) = where_clause(filter);
        if let Some(key) = after {
            // Newest first, then by id: not one direction, so not a row comparison. The `<=`
            // bounds the index range (`records_by_status` and the others: time descending,
            // id); the rest skips the ties up to the key's id.
            let (t, id) = bind_key(&mut args, key);
            clause.push_str(&format!(
                " AND last_failed_at_ms <= ${t} AND (last_failed_at_ms < ${t} OR id > ${id})"
            ));
        }
        self.run(|this| async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let sql = format!(
                "SELECT {} FROM {} WHERE {clause} ORDER BY last_failed_at_ms DESC, id LIMIT ${}",
                select_list(""),
                this.sql.records,
                args.len() + 1
            );
            let query =
                bind_all(sqlx::query(&sql), args).bind(i64::try_from(limit).unwrap_or(i64::MAX));
            let rows = this
                .fetch_all(query)
                .await
                .map_err(pg_error("search records"))?;
            rows.iter().map(decode_row).collect()
        })
    }

    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (mut clause, mut args) = where_clause(filter);
        if let Some(key) = after {
            let (t, id) = bind_key(&mut args, key);
            clause.push_str(&format!(" AND (retry_at_ms, id) > (${t}, ${id})"));
        }
        let other_status = matches!(filter.status, Some(Status::Dead | Status::Resolved));
        self.run(|this| async move {
            if limit == 0 || other_status {
                return Ok(Vec::new());
            }
            // On the index of due records (`records_due`: retry-at, id; waiting rows only),
            // from the key on.
            let sql = format!(
                "SELECT {} FROM {} WHERE status IN ('deferred', 'in_flight') \
                 AND retry_at_ms IS NOT NULL AND {clause} ORDER BY retry_at_ms, id LIMIT ${}",
                select_list(""),
                this.sql.records,
                args.len() + 1
            );
            let query =
                bind_all(sqlx::query(&sql), args).bind(i64::try_from(limit).unwrap_or(i64::MAX));
            let rows = this
                .fetch_all(query)
                .await
                .map_err(pg_error("search waiting records"))?;
            rows.iter().map(decode_row).collect()
        })
    }

    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        if counted_by_table(filter) {
            let filter = filter.clone();
            return self.run(|this| async move { this.count_from_table(&filter).await });
        }
        let (clause, args) = where_clause(filter);
        self.run(|this| async move {
            let sql = format!("SELECT count(*) FROM {} WHERE {clause}", this.sql.records);
            let n: i64 = this
                .fetch_one(bind_all(sqlx::query(&sql), args))
                .await
                .and_then(|row| row.try_get(0))
                .map_err(pg_error("count records"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.run(|this| async move { this.read_counts(since).await })
    }

    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        self.run(move |this| async move { this.check_counts_table(repair).await })
    }

    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.run(|this| async move {
            Ok(match this.change(&id, change, None).await? {
                Claim::Claimed(record) => {
                    if record.status == Status::Deferred {
                        this.wake().await;
                    }
                    Some(*record)
                }
                _ => None,
            })
        })
    }

    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.run(|this| async move {
            let query = sqlx::query(&this.sql.claim)
                .bind(to_millis(now))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(to_millis(add_clamped(now, lease)));
            let rows = this
                .fetch_all(query)
                .await
                .map_err(pg_error("claim records"))?;
            rows.iter().map(decode_row).collect()
        })
    }

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.run(|this| async move { this.delete_matching(&filter).await })
    }

    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let breaker = breaker.to_owned();
        let now = to_millis(now);
        self.run(|this| async move {
            let sql = format!(
                "UPDATE {} SET retry_at_ms = $1 WHERE status = 'deferred' AND breaker = $2 \
                 AND retry_at_ms > $1",
                this.sql.records
            );
            let released = this
                .execute(sqlx::query(&sql).bind(now).bind(breaker))
                .await
                .map_err(pg_error("release held records"))?
                .rows_affected();
            Ok(Some(released))
        })
    }

    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let (id, was) = (seen.id.clone(), (seen.status, seen.resends));
        self.run(|this| async move {
            let claim = this.change(&id, change, Some(was)).await?;
            match claim {
                // The statement reads "now" as of its start: a change committed while it
                // waited for the row's lock may show the values it was compared with. Read
                // them again, then.
                Claim::ClaimedElsewhere { status, resends } if (status, resends) == was => {
                    Ok(match this.get(&id).await? {
                        Some(r) => Claim::ClaimedElsewhere {
                            status: r.status,
                            resends: r.resends,
                        },
                        None => Claim::Missing,
                    })
                }
                Claim::Claimed(record) => {
                    if record.status == Status::Deferred {
                        this.wake().await;
                    }
                    Ok(Claim::Claimed(record))
                }
                other => Ok(other),
            }
        })
    }

    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        self.run(|this| async move {
            let mut claims: Vec<Option<Claim>> = (0..changes.len()).map(|_| None).collect();
            for round in rounds(changes) {
                for (i, claim) in this.change_round(round).await? {
                    if let Some(slot) = claims.get_mut(i) {
                        *slot = Some(claim);
                    }
                }
            }
            let claims: Vec<Claim> = claims.into_iter().flatten().collect();
            if claims
                .iter()
                .any(|c| matches!(c, Claim::Claimed(r) if r.status == Status::Deferred))
            {
                this.wake().await;
            }
            Ok(claims)
        })
    }

    fn applies_batches(&self) -> bool {
        true
    }

    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let lease = lease.clone();
        self.run(|this| async move {
            let claim = this.put_claimed_row(lease, record).await?;
            if matches!(&claim, Claim::Claimed(r) if r.status == Status::Deferred) {
                this.wake().await;
            }
            Ok(claim)
        })
    }

    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.run(|this| async move {
            let ms: Option<i64> = this
                .fetch_one(sqlx::query(&this.sql.next_due))
                .await
                .and_then(|row| row.try_get(0))
                .map_err(pg_error("read the next due time"))?;
            Ok(ms.map(from_millis))
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
        self.run(|this| async move { this.reserve(&schedule, now, gap).await })
    }

    fn wake_ups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        if self.mode.pooled {
            // LISTEN needs a session of its own, which a transaction pooler does not keep
            // (said once, by `listen_for_due`): the schedulers poll.
            return None;
        }
        let channel = self.due.clone()?;
        Some(notify::listen(self.pool.clone(), channel))
    }

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(|this| async move { this.write_note(note).await })
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.run(|this| async move { this.read_notes(now).await })
    }

    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(|this| async move {
            let owned = |s: &str| text::encode(s).into_owned();
            let query = sqlx::query(&this.sql.append_audit)
                .bind(to_millis(entry.at))
                .bind(owned(&entry.actor))
                .bind(entry.action.as_str())
                .bind(owned(&entry.filter))
                .bind(entry.planned.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
                .bind(i64::try_from(entry.sent).unwrap_or(i64::MAX))
                .bind(owned(&entry.outcome));
            this.execute(query)
                .await
                .map_err(pg_error("write audit entry"))?;
            Ok(())
        })
    }

    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.run(|this| async move { this.read_audit(page).await })
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let id = text::encode(id).into_owned();
        self.run(|this| async move {
            let n: Option<i64> = this
                .fetch_optional(sqlx::query(&this.sql.budget).bind(id))
                .await
                .and_then(|row| row.map(|row| row.try_get(0)).transpose())
                .map_err(pg_error("read attempt budget"))?;
            Ok(n.map(count_of))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_in_sql_is_the_change_in_the_process() {
        // Each variant's statement parameters say what `Change::apply` does.
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(5);
        let a = ChangeArgs::of(Change::Redriving { until: t });
        assert_eq!(
            (a.status, a.retry_at, a.resends, a.reset_budget),
            (Status::InFlight, Some(5), 1, true)
        );
        let a = ChangeArgs::of(Change::Held { retry_at: t });
        assert_eq!((a.status, a.resends), (Status::Deferred, -1));
        let a = ChangeArgs::of(Change::Reconciled { at: t });
        assert_eq!(
            (a.status, a.resolved_at, a.retry_at),
            (Status::Resolved, Some(5), None)
        );
        assert!(a.metadata.contains("delivered"));
    }
}
