//! A [`RedisStore`] whose primary is found through Redis Sentinel, and found again after a
//! failover.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};

use super::{Connection, RedactedError, RedisStore};
use crate::{StoreError, redact_url};

/// A [`RedisStore`] being opened through Redis Sentinel: set options, then `.await` it. Made by
/// [`RedisStore::connect_sentinel`].
///
/// Awaiting it asks the Sentinels for the primary named `master`, connects to it, loads the
/// store's scripts and returns the store (key prefix `backstop:dlq`, the last
/// [`DEFAULT_HISTORY_LIMIT`](crate::DEFAULT_HISTORY_LIMIT) errors kept per record).
///
/// # Errors
///
/// Awaiting it fails with a [`StoreError`] when no Sentinel URL is given or one is malformed,
/// when no Sentinel answers or none knows `master`, when the address they give is not a primary
/// (a failover under way), when the primary refuses the login, or when the scripts cannot be
/// loaded.
#[must_use = "a store is opened only when this is awaited"]
pub struct OpenSentinel {
    sentinels: Vec<String>,
    master: String,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    connection_timeout: Option<Duration>,
    response_timeout: Option<Duration>,
}

impl std::fmt::Debug for OpenSentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<String> = self.sentinels.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("OpenSentinel")
            .field("sentinels", &shown)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl OpenSentinel {
    pub(super) fn new(sentinels: &[&str], master: &str) -> Self {
        OpenSentinel {
            sentinels: sentinels.iter().map(|u| (*u).to_owned()).collect(),
            master: master.to_owned(),
            username: None,
            password: None,
            db: 0,
            connection_timeout: Some(Duration::from_secs(2)),
            response_timeout: Some(Duration::from_secs(5)),
        }
    }

    /// Logs in to the primary (and, after a failover, to the replica promoted in its place) with
    /// `password`, and `username` when given (Redis 6 ACLs; `None`: the `default` user). Default:
    /// no login. The Sentinels themselves are reached with what their own URLs hold.
    pub fn primary_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.username = username.map(str::to_owned);
        self.password = Some(password.to_owned());
        self
    }

    /// Uses the database `db` of the primary (default 0).
    pub fn database(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// The timeouts for connecting to the primary and for each of its responses (`None`: wait as
    /// long as it takes); by default 2 s and 5 s, as [`RedisStore::connect`]. A call to a
    /// primary that died without closing its connections fails after the response timeout, and
    /// the next call asks the Sentinels again.
    pub fn timeouts(mut self, connection: Option<Duration>, response: Option<Duration>) -> Self {
        self.connection_timeout = connection;
        self.response_timeout = response;
        self
    }

    async fn open(self) -> Result<RedisStore, StoreError> {
        let shown = self
            .sentinels
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",");
        let redacted = |e: &RedisError| {
            let mut text = e.to_string();
            for url in &self.sentinels {
                text = RedactedError::of_text(&text, url);
            }
            RedactedError(text)
        };
        if self.sentinels.is_empty() {
            return Err(StoreError::new(
                "redis dead-letter store: Sentinel needs at least one Sentinel's url",
            ));
        }
        let mut node = "redis://127.0.0.1"
            .into_connection_info()
            .map_err(|e| StoreError::with_source("redis dead-letter store: node settings", e))?
            .redis_settings()
            .clone()
            .set_db(self.db);
        if let Some(username) = &self.username {
            node = node.set_username(username);
        }
        if let Some(password) = &self.password {
            node = node.set_password(password);
        }
        let client = SentinelClient::build(
            self.sentinels.clone(),
            self.master.clone(),
            Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node)),
            SentinelServerType::Master,
        )
        .map_err(|e| {
            StoreError::with_source(
                format!("redis dead-letter store: bad sentinel urls {shown:?}"),
                redacted(&e),
            )
        })?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.connection_timeout)
            .set_response_timeout(self.response_timeout);
        let conn = SentinelConnection(Arc::new(Shared {
            sentinel: tokio::sync::Mutex::new(client),
            config,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            master: self.master.clone(),
            db: self.db,
        }));
        conn.connection().await.map_err(|e| {
            StoreError::with_source(
                format!(
                    "cannot connect to redis dead-letter store: primary {:?} through sentinels \
                     {shown}",
                    self.master
                ),
                redacted(&e),
            )
        })?;
        RedisStore::opened(Connection::Sentinel(conn), self.sentinels).await
    }
}

impl IntoFuture for OpenSentinel {
    type Output = Result<RedisStore, StoreError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.open())
    }
}

/// The connection to the primary that the Sentinels name: one multiplexed connection, dropped
/// when a call on it fails as a lost or read-only primary would (the next call then asks the
/// Sentinels again). Cheap to clone: the clones share it.
#[derive(Clone)]
pub(super) struct SentinelConnection(Arc<Shared>);

struct Shared {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The connection to the current primary and its generation, until a call on it fails.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    master: String,
    db: i64,
}

impl SentinelConnection {
    /// The name of the primary the Sentinels watch.
    pub(super) fn master(&self) -> &str {
        &self.0.master
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.0
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connection to the primary: the current one, or a new one to the primary the
    /// Sentinels name now (the redis crate checks with `ROLE` that it is a primary).
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut sentinel = self.0.sentinel.lock().await;
        // Another call may have connected while this one waited for the lock.
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let client = sentinel.async_get_client().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.0.config)
            .await?;
        let generation = self.0.generation.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(
            master = %self.0.master,
            primary = %client.get_connection_info().addr(),
            "redis dead-letter store: connected to the primary the sentinels name"
        );
        *self
            .0
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// After `error` on the connection of `generation`: drops that connection when the error
    /// says the primary is lost, or is one no longer (a replica answers `READONLY`).
    fn after(&self, generation: u64, error: &RedisError) {
        let lost = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error()
            || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            // A script's write refused by a replica comes back inside the script's error.
            || error.to_string().contains("READONLY");
        if !lost {
            return;
        }
        let mut current = self
            .0
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
            tracing::warn!(
                master = %self.0.master,
                %error,
                "redis dead-letter store: the primary failed; the next call asks the sentinels \
                 for the primary again"
            );
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let result = conn.req_packed_command(cmd).await;
            if let Err(error) = &result {
                self.after(generation, error);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(error) = &result {
                self.after(generation, error);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}
