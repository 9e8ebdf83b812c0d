//! The [`Backend`]s of this crate's stores, each opening a fresh store per case: a new file, a
//! new key prefix, a new schema. What they write is left behind on the servers (meant for
//! throwaway ones); the SQLite files go with their temporary directory.

#[cfg(any(feature = "redis", feature = "postgres"))]
use std::sync::Arc;
#[cfg(any(feature = "redis", feature = "postgres"))]
use std::time::Duration;

#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
use super::{Backend, Opened};
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
use crate::{BoxFuture, StoreError};

/// A random number, different at each call: what tells one case's data from another's.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
fn fresh() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// `test` as a name part: ASCII letters and digits kept (lower case), anything else `_`, at most
/// 36 characters.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
fn name_part(test: &str) -> String {
    test.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(36)
        .collect()
}

/// A directory removed with what it holds when dropped.
#[cfg(feature = "sqlite")]
#[derive(Debug)]
struct TempDir(std::path::PathBuf);

#[cfg(feature = "sqlite")]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// [`SqliteStore`](crate::SqliteStore)s (feature `sqlite`): a new file per case in a temporary
/// directory (removed after the case), and a second connection to the same file as the second
/// handle.
#[cfg(feature = "sqlite")]
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteBackend;

#[cfg(feature = "sqlite")]
impl Backend for SqliteBackend {
    fn open<'a>(
        &'a self,
        test: &'a str,
        history_limit: usize,
    ) -> BoxFuture<'a, Result<Opened, StoreError>> {
        Box::pin(async move {
            let dir = std::env::temp_dir().join(format!(
                "backstop-conformance-{}-{:016x}",
                name_part(test),
                fresh()
            ));
            std::fs::create_dir_all(&dir).map_err(|e| {
                StoreError::with_source(format!("cannot create {}", dir.display()), e)
            })?;
            let dir = TempDir(dir);
            let path = dir.0.join("dl.db");
            let open =
                || crate::SqliteStore::open(&path).map(|s| s.with_history_limit(history_limit));
            let (store, other) = (open()?, open()?);
            Ok(Opened::new(std::sync::Arc::new(store), std::sync::Arc::new(other)).keeping(dir))
        })
    }
}

/// [`RedisStore`](crate::RedisStore)s (feature `redis`) on one server, a Redis Cluster or the
/// primary Sentinel names: a new key prefix per case (`backstop-test:{case}:{random}`), and a
/// second connection with the same prefix as the second handle. Connected without timeouts (so
/// that it works on a paused clock too), but to a Cluster's nodes within 2 s.
#[cfg(feature = "redis")]
#[derive(Clone, Debug)]
pub struct RedisBackend {
    urls: Vec<String>,
    cluster: bool,
    /// The primary's name, through the Sentinels at `urls`.
    master: Option<String>,
}

#[cfg(feature = "redis")]
impl RedisBackend {
    /// Stores on the Redis server at `url` ([`RedisStore::connect`](crate::RedisStore::connect)).
    pub fn new(url: impl Into<String>) -> Self {
        RedisBackend {
            urls: vec![url.into()],
            cluster: false,
            master: None,
        }
    }

    /// Stores on the primary named `master` that the Redis Sentinels at `urls` watch
    /// ([`RedisStore::connect_sentinel`](crate::RedisStore::connect_sentinel)).
    pub fn sentinel(urls: impl IntoIterator<Item = impl Into<String>>, master: &str) -> Self {
        RedisBackend {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: false,
            master: Some(master.to_owned()),
        }
    }

    /// Stores in the Redis Cluster whose nodes `urls` name
    /// ([`RedisStore::connect_cluster`](crate::RedisStore::connect_cluster)).
    pub fn cluster(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        RedisBackend {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            master: None,
        }
    }

    /// A new connection, with the default prefix.
    async fn connect(&self) -> Result<crate::RedisStore, StoreError> {
        if let Some(master) = &self.master {
            let urls: Vec<&str> = self.urls.iter().map(String::as_str).collect();
            return crate::RedisStore::connect_sentinel(&urls, master)
                .timeouts(None, None)
                .await;
        }
        if self.cluster {
            let urls: Vec<&str> = self.urls.iter().map(String::as_str).collect();
            crate::RedisStore::connect_cluster_with_timeouts(
                &urls,
                Some(Duration::from_secs(2)),
                None,
            )
            .await
        } else {
            crate::RedisStore::connect_with_timeouts(&self.urls[0], None, None).await
        }
    }
}

#[cfg(feature = "redis")]
impl Backend for RedisBackend {
    fn open<'a>(
        &'a self,
        test: &'a str,
        history_limit: usize,
    ) -> BoxFuture<'a, Result<Opened, StoreError>> {
        Box::pin(async move {
            let prefix = format!("backstop-test:{}:{:016x}", name_part(test), fresh());
            let store = self
                .connect()
                .await?
                .with_prefix(prefix.clone())
                .with_history_limit(history_limit);
            let other = self
                .connect()
                .await?
                .with_prefix(prefix)
                .with_history_limit(history_limit);
            Ok(Opened::new(Arc::new(store), Arc::new(other)))
        })
    }
}

/// [`PostgresStore`](crate::PostgresStore)s (feature `postgres`): a new schema per case
/// (`bt_{case}_{random}`), and a second pool on the same schema as the second handle.
#[cfg(feature = "postgres")]
#[derive(Clone, Debug)]
pub struct PostgresBackend {
    url: String,
    pooler: bool,
}

#[cfg(feature = "postgres")]
impl PostgresBackend {
    /// Stores in the Postgres database at `url`
    /// ([`PostgresStore::connect`](crate::PostgresStore::connect)).
    pub fn new(url: impl Into<String>) -> Self {
        PostgresBackend {
            url: url.into(),
            pooler: false,
        }
    }

    /// Stores in the Postgres database behind the transaction pooler (PgBouncer with
    /// `pool_mode = transaction`) at `url`, opened with
    /// [`behind_pooler`](crate::OpenPostgres::behind_pooler).
    pub fn behind_pooler(url: impl Into<String>) -> Self {
        PostgresBackend {
            url: url.into(),
            pooler: true,
        }
    }

    /// A store on `schema`.
    async fn connect(&self, schema: &str) -> Result<crate::PostgresStore, StoreError> {
        let open = crate::PostgresStore::connect(&self.url).schema(schema);
        if self.pooler {
            open.behind_pooler().await
        } else {
            open.await
        }
    }
}

#[cfg(feature = "postgres")]
impl Backend for PostgresBackend {
    fn open<'a>(
        &'a self,
        test: &'a str,
        history_limit: usize,
    ) -> BoxFuture<'a, Result<Opened, StoreError>> {
        Box::pin(async move {
            let schema = format!("bt_{}_{:016x}", name_part(test), fresh());
            let store = self
                .connect(&schema)
                .await?
                .with_history_limit(history_limit);
            let other = self
                .connect(&schema)
                .await?
                .with_history_limit(history_limit);
            Ok(Opened::new(Arc::new(store), Arc::new(other)))
        })
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "redis", feature = "postgres")))]
mod tests {
    #[test]
    fn fresh_names_differ() {
        assert_ne!(super::fresh(), super::fresh());
        assert_eq!(super::name_part("Two Redrives-race"), "two_redrives_race");
    }
}
