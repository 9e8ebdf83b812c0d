//! The shared store of a run: Postgres in a schema of its own, or Redis under a key prefix of
//! its own, so that runs never see each other's records; removed when the run ends.

use std::sync::Arc;

use tower::BoxError;
use tower_backstop::store::{PostgresStore, RedisStore, Status, Store};

/// Which kind of store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    /// Postgres through PgBouncer in transaction pooling (`?pooler=transaction`).
    PgBouncer,
    Redis,
    /// Redis through a Sentinel (`redis+sentinel://host:port/primary-name`, this soak's own
    /// form), a replica taking over when the primary dies.
    Sentinel,
}

impl Kind {
    /// The kind of `url`: `postgres://`, `postgresql://` (with `pooler=transaction`: through
    /// PgBouncer) or `redis://`.
    pub fn of(url: &str) -> Result<Kind, BoxError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(if url.contains("pooler=transaction") {
                Kind::PgBouncer
            } else {
                Kind::Postgres
            })
        } else if url.starts_with("redis://") {
            Ok(Kind::Redis)
        } else if url.starts_with("redis+sentinel://") {
            Ok(Kind::Sentinel)
        } else {
            Err(format!(
                "--store {}: expected a postgres:// or redis:// URL",
                tower_backstop::store::redact_url(url)
            )
            .into())
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "Postgres",
            Kind::PgBouncer => "Postgres through PgBouncer",
            Kind::Redis => "Redis",
            Kind::Sentinel => "Redis through Sentinel",
        }
    }
}

/// A store server of the run's own, to stop hard and start again: a Postgres cluster
/// (`initdb` in a temporary directory) or a `redis-server` with an append-only file.
pub enum Server {
    Postgres(backstop_test_support::PgCluster),
    /// A cluster and a PgBouncer in transaction pooling in front of it: the cluster goes down,
    /// the pooler stays.
    PgBouncer(
        backstop_test_support::PgCluster,
        backstop_test_support::PgBouncer,
    ),
    Redis(backstop_test_support::RedisServer),
    /// A primary, a replica and a Sentinel: the primary is killed, the replica takes over.
    Sentinel(backstop_test_support::RedisSentinelSet),
}

impl Server {
    pub fn start(kind: Kind) -> Result<Server, BoxError> {
        Ok(match kind {
            Kind::Postgres => Server::Postgres(backstop_test_support::PgCluster::start()?),
            Kind::PgBouncer => {
                let cluster = backstop_test_support::PgCluster::start()?;
                // PgBouncer waits `server_login_retry` (15 s by default) after a failed login
                // before it tries the server again: 1 s, as the operations guide advises, so
                // that the store is back for its clients soon after Postgres is.
                let bouncer = backstop_test_support::PgBouncer::start_with(
                    &cluster,
                    &[("server_login_retry", "1")],
                )?;
                Server::PgBouncer(cluster, bouncer)
            }
            Kind::Redis => Server::Redis(backstop_test_support::RedisServer::start()?),
            Kind::Sentinel => Server::Sentinel(backstop_test_support::RedisSentinelSet::start()?),
        })
    }

    pub fn url(&self) -> String {
        match self {
            Server::Postgres(cluster) => cluster.url(),
            Server::PgBouncer(_, bouncer) => format!("{}?pooler=transaction", bouncer.url()),
            Server::Redis(server) => server.url(),
            Server::Sentinel(set) => {
                format!("redis+sentinel://127.0.0.1:{}/backstop", set.sentinel)
            }
        }
    }

    /// Stops it as a crash would: `pg_ctl stop -m immediate`, SIGKILL.
    pub fn stop(&mut self) {
        match self {
            Server::Postgres(cluster) | Server::PgBouncer(cluster, _) => cluster.crash(),
            Server::Redis(server) => server.kill(),
            Server::Sentinel(set) => set.kill_primary(),
        }
    }

    /// Starts it again on the same port and data.
    pub fn start_again(&mut self) -> Result<(), BoxError> {
        match self {
            Server::Postgres(cluster) | Server::PgBouncer(cluster, _) => cluster.resume()?,
            Server::Redis(server) => server.resume()?,
            // Not started again: the replica the Sentinel promotes takes over.
            Server::Sentinel(set) => set.wait_promoted()?,
        }
        Ok(())
    }
}

/// Opens the store at `url` in `namespace` (a Postgres schema, a Redis key prefix), with a pool
/// of `connections` for Postgres.
pub async fn open(
    url: &str,
    namespace: &str,
    connections: u32,
) -> Result<Arc<dyn Store>, BoxError> {
    Ok(match Kind::of(url)? {
        // Through PgBouncer, the URL's `pooler=transaction` tells the store.
        Kind::Postgres | Kind::PgBouncer => Arc::new(
            PostgresStore::connect(url)
                .schema(namespace)
                .max_connections(connections)
                .await?,
        ),
        Kind::Redis => Arc::new(RedisStore::connect(url).await?.with_prefix(namespace)),
        Kind::Sentinel => {
            let (sentinel, name) = sentinel_of(url)?;
            Arc::new(
                RedisStore::connect_sentinel(&[sentinel.as_str()], name)
                    .await?
                    .with_prefix(namespace),
            )
        }
    })
}

/// The Sentinel's `redis://` URL and the primary's name in `redis+sentinel://host:port/name`.
fn sentinel_of(url: &str) -> Result<(String, &str), BoxError> {
    let rest = url.trim_start_matches("redis+sentinel://");
    let (host, name) = rest
        .split_once('/')
        .ok_or("a redis+sentinel:// URL needs the primary's name as its path")?;
    Ok((format!("redis://{host}"), name))
}

/// Removes everything the run wrote: the schema, or every key under the prefix.
pub async fn remove(url: &str, namespace: &str) -> Result<(), BoxError> {
    match Kind::of(url)? {
        Kind::Postgres | Kind::PgBouncer => {
            let store = PostgresStore::connect(url)
                .schema(namespace)
                .max_connections(1)
                .await?;
            // Unnamed: a named statement does not survive a transaction pooler.
            sqlx::query(&format!("DROP SCHEMA \"{namespace}\" CASCADE"))
                .persistent(false)
                .execute(store.pool())
                .await?;
            store.close().await;
        }
        // The servers of a Sentinel run are the run's own, gone with it.
        Kind::Sentinel => {}
        Kind::Redis => {
            let client = redis::Client::open(url)?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            // SCAN by pages rather than one KEYS: a large run's keys would take longer than
            // the connection waits for an answer.
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{{{namespace}}}*"))
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await?;
                if !keys.is_empty() {
                    // UNLINK frees in the background: a DEL of an index set of a million
                    // entries holds the server past the connection's wait.
                    let () = redis::cmd("UNLINK")
                        .arg(keys)
                        .query_async(&mut conn)
                        .await?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
    Ok(())
}

/// Records deferred or in flight: what the schedulers still have to send.
pub async fn outstanding(store: &dyn Store) -> Result<u64, BoxError> {
    let filter = |s| tower_backstop::store::Filter::new().status(s);
    let deferred = store.count(&filter(Status::Deferred)).await?;
    let in_flight = store.count(&filter(Status::InFlight)).await?;
    Ok(deferred + in_flight)
}
