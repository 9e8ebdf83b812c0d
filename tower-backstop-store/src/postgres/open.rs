//! Opening a [`PostgresStore`](crate::PostgresStore): the URL or the pool, the options, and the migrations applied
//! under the advisory lock.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor};

use super::error::pg_error;
use super::pooled::Mode;
use crate::{StoreError, redact_url};

/// The schema a store uses unless told otherwise ([`OpenPostgres::schema`]).
pub const DEFAULT_SCHEMA: &str = "backstop";

/// The migrations shipped with this version, in order: (version, name, SQL).
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "records", include_str!("migrations/0001_records.sql")),
    (2, "notes", include_str!("migrations/0002_notes.sql")),
    (3, "counts", include_str!("migrations/0003_counts.sql")),
];

/// The schema version this version of the crate writes and reads: the last migration's.
const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The first key of the advisory lock that serializes migrations ("bstp" in ASCII); the second
/// is `hashtext` of the schema name, so that stores in two schemas migrate independently.
pub(super) const LOCK_CLASS: i32 = 0x6273_7470;

/// The pool size of [`PostgresStore::connect`](crate::PostgresStore::connect) by default: sqlx's own default.
const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// How long a call waits for a free connection (or for a new one to connect) by default before
/// it fails: 5 s, like the Redis store's response timeout (sqlx's own default is 30 s).
const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`PostgresStore`](crate::PostgresStore) being opened: set options, then `.await` it. Made by
/// [`PostgresStore::connect`](crate::PostgresStore::connect) and [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
///
/// Awaiting it connects (for a URL), applies the migrations the schema lacks, and returns the
/// store.
///
/// # Errors
///
/// Awaiting it fails with a [`StoreError`] when the URL is malformed, the server cannot be
/// reached or refuses the login, the schema name is empty or longer than 63 bytes, the
/// migration fails, the schema was written by a newer version of tower-backstop, the schema
/// does not exist and [`existing_schema`](OpenPostgres::existing_schema) was set, or a pool
/// option ([`max_connections`](OpenPostgres::max_connections),
/// [`acquire_timeout`](OpenPostgres::acquire_timeout),
/// [`statement_timeout`](OpenPostgres::statement_timeout)) was set over a given pool (set it on
/// your `PgPoolOptions` instead).
#[must_use = "a store is opened only when this is awaited"]
pub struct OpenPostgres {
    source: Source,
    schema: String,
    max_connections: Option<u32>,
    acquire_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
    pooler: bool,
    create: bool,
}

pub(super) enum Source {
    Url(String),
    Pool(PgPool),
}

impl std::fmt::Debug for OpenPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Url(url) => redact(url),
            Source::Pool(_) => "a given pool".to_owned(),
        };
        f.debug_struct("OpenPostgres")
            .field("source", &source)
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("pooler", &self.pooler)
            .field("create", &self.create)
            .finish()
    }
}

impl OpenPostgres {
    pub(super) fn new(source: Source) -> Self {
        OpenPostgres {
            source,
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: None,
            acquire_timeout: None,
            statement_timeout: None,
            pooler: false,
            create: true,
        }
    }

    /// Keeps the tables in the schema `name` (default [`DEFAULT_SCHEMA`]), created if needed: one
    /// schema per application, per tenant or per test. Any name Postgres takes (at most 63
    /// bytes); it is quoted, so `Billing` and `billing` are two schemas.
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = name.into();
        self
    }

    /// Opens only a schema that exists: awaiting fails with a [`StoreError`] that names the
    /// schema when there is none by that name, instead of creating it. For tools that read or
    /// tend a store an application writes (an operator's command line, a board), so that a
    /// mistyped schema name is an error rather than an empty store, and leaves nothing behind.
    /// The migrations an existing schema lacks are still applied, as by any version of the
    /// store that opens it.
    pub fn existing_schema(mut self) -> Self {
        self.create = false;
        self
    }

    /// At most `n` connections in the store's pool (default 10, sqlx's default). Only for
    /// [`connect`](crate::PostgresStore::connect).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// How long a call waits for a free connection, or for a new one to connect, before it fails
    /// with a [`StoreError`] (default 5 s). While the server is down every call takes this long
    /// to fail. Only for [`connect`](crate::PostgresStore::connect).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = Some(timeout);
        self
    }

    /// Cuts every statement of the store's connections at `timeout` (the server's
    /// `statement_timeout`, set when each connection opens, or behind a pooler
    /// ([`behind_pooler`](OpenPostgres::behind_pooler)) by `SET LOCAL` in each transaction;
    /// default: the server's setting, usually none). A statement cut short fails with a [`StoreError`] that says so, and writes
    /// nothing. Only for [`connect`](crate::PostgresStore::connect).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = Some(timeout);
        self
    }

    /// The store connects through a **transaction pooler**: PgBouncer with `pool_mode =
    /// transaction` (or any pooler that may give each transaction another server connection).
    /// The same as the URL parameter `pooler=transaction`
    /// (`postgres://app@pgbouncer:6432/app?pooler=transaction`), which the store reads and
    /// removes before sqlx sees the URL. Off by default: the store cannot tell a pooler from a
    /// server.
    ///
    /// What changes:
    /// - The connections send no startup parameter PgBouncer refuses by default: not sqlx's
    ///   `extra_float_digits` (the store reads no floating-point column), and not `options`:
    ///   a [`statement_timeout`](OpenPostgres::statement_timeout) is set by `SET LOCAL` in each
    ///   transaction instead (one more round trip per call).
    /// - Every statement is unnamed (never prepared by name and kept: the next transaction may
    ///   run on a server connection that lacks it, or has another one by that name) and runs in
    ///   a transaction of its own, `BEGIN` … `COMMIT`, so that its parse and its execution reach
    ///   the same server connection: two more round trips per call.
    /// - The migration lock is transaction-scoped (`pg_advisory_xact_lock`) with or without this
    ///   option, so migrations work through the pooler unchanged.
    /// - [`PostgresStore::listen_for_due`](crate::PostgresStore::listen_for_due) cannot listen
    ///   there: it logs one warning and the schedulers poll.
    ///
    /// Over a given pool ([`from_pool`](crate::PostgresStore::from_pool)), build the pool's
    /// `PgConnectOptions` with `.extra_float_digits(None)` yourself (PgBouncer refuses the
    /// connection otherwise); the store runs its own statements unnamed, in transactions.
    /// [`PostgresStore::put_in`](crate::PostgresStore::put_in) behind a pooler needs a
    /// transaction of yours (`&mut *tx`), not a bare connection.
    pub fn behind_pooler(mut self) -> Self {
        self.pooler = true;
        self
    }

    /// Connects (for a URL) and migrates the schema.
    pub(super) async fn open(self) -> Result<Opened, StoreError> {
        let schema = quote_schema(&self.schema)?;
        let mut mode = Mode {
            pooled: self.pooler,
            set_timeout: None,
        };
        let (pool, url) = match self.source {
            Source::Pool(pool) => {
                let set = [
                    ("max_connections", self.max_connections.is_some()),
                    ("acquire_timeout", self.acquire_timeout.is_some()),
                    ("statement_timeout", self.statement_timeout.is_some()),
                ];
                if let Some((name, _)) = set.iter().find(|(_, set)| *set) {
                    return Err(StoreError::new(format!(
                        "postgres dead-letter store: {name} is a setting of the pool, and the \
                         store was given a pool: set it on your PgPoolOptions"
                    )));
                }
                let mut conn = pool.acquire().await.map_err(pg_error("connect"))?;
                migrate(&mut conn, &self.schema, &schema, self.create).await?;
                drop(conn);
                (pool, None)
            }
            Source::Url(url) => {
                let (sqlx_url, pooler_in_url) = strip_pooler(&url)?;
                mode.pooled |= pooler_in_url;
                let options = connect_options(&sqlx_url, self.statement_timeout, &mut mode)?;
                let acquire = self.acquire_timeout.unwrap_or(DEFAULT_ACQUIRE_TIMEOUT);
                // One connection of our own first: a refused connection or a failed login is
                // reported as such (the pool would retry it until its timeout, then say only
                // that it timed out).
                let mut conn = tokio::time::timeout(acquire, PgConnection::connect_with(&options))
                    .await
                    .map_err(|_| {
                        StoreError::new(format!(
                            "cannot connect to postgres dead-letter store {}: no answer within \
                             {acquire:?}",
                            redact(&url)
                        ))
                    })?
                    .map_err(|e| connect_error(&url, &e))?;
                migrate(&mut conn, &self.schema, &schema, self.create).await?;
                let _ = conn.close().await;
                let pool = PgPoolOptions::new()
                    .max_connections(self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS))
                    .acquire_timeout(acquire)
                    .connect_lazy_with(options);
                (pool, Some(redact(&url)))
            }
        };
        Ok(Opened {
            pool,
            url,
            schema: self.schema,
            quoted: schema,
            mode,
        })
    }
}

/// What opening gave: the pool, the URL (its password hidden) when there was one, and the
/// schema's name as given and quoted.
pub(super) struct Opened {
    pub(super) pool: PgPool,
    pub(super) url: Option<String>,
    pub(super) schema: String,
    pub(super) quoted: String,
    pub(super) mode: Mode,
}

/// The URL parameter that says the store connects through a transaction pooler
/// ([`OpenPostgres::behind_pooler`]).
const POOLER_PARAMETER: &str = "pooler";

/// `url` without its `pooler=transaction` parameter (sqlx would warn of a parameter it does not
/// know), and whether it had one.
fn strip_pooler(url: &str) -> Result<(String, bool), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), false));
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let mut pooled = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((POOLER_PARAMETER, "transaction")) => pooled = true,
            Some((POOLER_PARAMETER, other)) => {
                return Err(StoreError::new(format!(
                    "postgres dead-letter store: bad url {:?}: {POOLER_PARAMETER}={other:?} is \
                     not a pooler mode this store knows (only `transaction`)",
                    redact(url)
                )));
            }
            _ => kept.push(pair),
        }
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok((out, pooled))
}

/// The connection options of `url`, with `statement_timeout` set on every connection: as the
/// startup parameter `options`, or, behind a transaction pooler (`mode.pooled`), noted in
/// `mode` to be set in each transaction, with no startup parameter PgBouncer refuses.
fn connect_options(
    url: &str,
    statement_timeout: Option<Duration>,
    mode: &mut Mode,
) -> Result<PgConnectOptions, StoreError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        StoreError::with_source(
            format!("postgres dead-letter store: bad url {:?}", redact(url)),
            Redacted::of(&e, url),
        )
    })?;
    let millis = statement_timeout.map(|t| t.as_millis().max(1));
    if mode.pooled {
        mode.set_timeout = millis.map(|ms| format!("SET LOCAL statement_timeout = {ms}"));
        return Ok(options.extra_float_digits(None).statement_cache_capacity(0));
    }
    Ok(match millis {
        Some(ms) => options.options([("statement_timeout", ms.to_string())]),
        None => options,
    })
}

fn connect_error(url: &str, e: &sqlx::Error) -> StoreError {
    let why = match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            ": connection refused (is the server running, on this host and port?)"
        }
        sqlx::Error::Tls(_) => {
            ": TLS failed (this build of sqlx has no TLS stack unless your \
                                 application enables one of sqlx's TLS features)"
        }
        sqlx::Error::Database(db) if db.message().contains("unsupported startup parameter") => {
            ": refused a startup parameter, as PgBouncer does: behind a connection pooler, \
             open the store with behind_pooler() or the URL parameter pooler=transaction"
        }
        _ => "",
    };
    StoreError::with_source(
        format!(
            "cannot connect to postgres dead-letter store {}{why}",
            redact(url)
        ),
        Redacted::of(e, url),
    )
}

/// `url` with its credentials hidden: [`redact_url`], and a `password=` parameter's value too.
fn redact(url: &str) -> String {
    let mut text = redact_url(url);
    for secret in passwords(url) {
        text = text.replace(&secret, "***");
    }
    text
}

/// An error as text, with the URL's credentials (and the password alone, should the error quote
/// it) hidden.
#[derive(Debug)]
struct Redacted(String);

impl Redacted {
    fn of(error: &dyn std::fmt::Display, url: &str) -> Self {
        let mut text = error.to_string().replace(url, &redact(url));
        for secret in passwords(url) {
            text = text.replace(&secret, "***");
        }
        Redacted(text)
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Redacted {}

/// The passwords a Postgres URL may hold, in the user info (`user:password@`) or as a
/// `password=` query parameter, as written and percent-decoded (empty ones left out).
fn passwords(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(i) = url.find("://") {
        let rest = &url[i + 3..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@')
            && let Some((_, pw)) = authority[..at].split_once(':')
        {
            found.push(pw.to_owned());
        }
    }
    if let Some(q) = url.find('?') {
        for pair in url[q + 1..].split('&') {
            if let Some(pw) = pair.strip_prefix("password=") {
                found.push(pw.to_owned());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|p| percent_decode(p)).collect();
    for p in decoded {
        if !found.contains(&p) {
            found.push(p);
        }
    }
    found.retain(|p| !p.is_empty());
    found
}

/// `%XX` sequences decoded, byte by byte; text that is not UTF-8 afterwards stays as it was.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

/// `name` quoted as a Postgres identifier, or an error when Postgres would not keep it as it is.
fn quote_schema(name: &str) -> Result<String, StoreError> {
    if name.is_empty() || name.len() > 63 || name.contains('\0') {
        return Err(StoreError::new(format!(
            "postgres dead-letter store: schema name {name:?} must be 1 to 63 bytes, without NUL"
        )));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// Applies the migrations `schema` lacks, under the advisory lock, in one transaction. Its
/// statements are unnamed, so that behind a transaction pooler they leave no prepared statement
/// on the server connection for the next client to collide with.
async fn migrate(
    conn: &mut PgConnection,
    name: &str,
    schema: &str,
    create: bool,
) -> Result<(), StoreError> {
    let create_schema = format!("CREATE SCHEMA {schema}");
    let create_table = format!(
        "CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )"
    );
    let read_version = format!("SELECT max(version) FROM {schema}.schema_migrations");
    let note = format!("INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)");
    let mut tx = conn.begin().await.map_err(pg_error("begin migration"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(LOCK_CLASS)
        .bind(name.to_owned())
        .persistent(false)
        .execute(&mut *tx)
        .await
        .map_err(pg_error("take the migration lock"))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(name.to_owned())
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .map_err(pg_error("read schemas"))?;
    if !exists && !create {
        return Err(StoreError::new(format!(
            "postgres dead-letter store: there is no schema {name:?} on this server (check the \
             schema name; it is not created when only an existing store is opened)"
        )));
    }
    if !exists {
        tx.execute(create_schema.as_str())
            .await
            .map_err(pg_error("create schema"))?;
    }
    tx.execute(create_table.as_str())
        .await
        .map_err(pg_error("create the migrations table"))?;
    let current: Option<i32> = sqlx::query_scalar(&read_version)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(pg_error("read the schema version"))?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::new(format!(
            "postgres dead-letter store: schema {name} has version {current}, written by a newer \
             tower-backstop; this one knows versions up to {SCHEMA_VERSION}: upgrade \
             tower-backstop to open it"
        )));
    }
    for &(version, migration, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let sql = sql.replace("{schema}", schema);
        let script = format!("SET LOCAL search_path TO {schema};\n{sql}");
        tx.execute(script.as_str()).await.map_err(|e| {
            StoreError::with_source(
                format!(
                    "postgres dead-letter store: migration {version} ({migration}) of \
                         schema {name} failed"
                ),
                e,
            )
        })?;
        sqlx::query(&note)
            .bind(version)
            .bind(migration)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(pg_error("note the migration"))?;
    }
    tx.commit().await.map_err(pg_error("commit migration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_where_urls_keep_them() {
        assert_eq!(
            passwords("postgres://app:s%40cret@db/x"),
            ["s%40cret", "s@cret"]
        );
        assert_eq!(passwords("postgres://db/x?user=a&password=pw"), ["pw"]);
        assert!(passwords("postgres://app@db/x").is_empty());
        let e = Redacted::of(
            &"login as app:s%40cret failed, s@cret",
            "postgres://app:s%40cret@db",
        );
        assert_eq!(e.to_string(), "login as app:*** failed, ***");
    }

    #[test]
    fn the_pooler_parameter_is_read_and_removed() {
        let strip = |u: &str| strip_pooler(u).unwrap();
        assert_eq!(
            strip("postgres://db/x"),
            ("postgres://db/x".to_owned(), false)
        );
        assert_eq!(
            strip("postgres://db/x?pooler=transaction"),
            ("postgres://db/x".to_owned(), true)
        );
        assert_eq!(
            strip("postgres://db/x?sslmode=disable&pooler=transaction&application_name=a#f"),
            (
                "postgres://db/x?sslmode=disable&application_name=a#f".to_owned(),
                true
            )
        );
        assert!(strip_pooler("postgres://db/x?pooler=session").is_err());
    }

    #[test]
    fn schema_names_are_quoted_and_bounded() {
        assert_eq!(quote_schema("backstop").unwrap(), "\"backstop\"");
        assert_eq!(quote_schema("a\"b").unwrap(), "\"a\"\"b\"");
        assert!(quote_schema("").is_err());
        assert!(quote_schema(&"x".repeat(64)).is_err());
    }
}
