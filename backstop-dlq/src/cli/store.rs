//! Opening the store the command line names.

use std::sync::Arc;

use tower_backstop::BoxError;
use tower_backstop::store::{SqliteStore, Store};

use super::args::Global;

/// Opens the store of `--store`: a Redis URL, a Postgres URL, else a SQLite file, which must
/// exist (reads open it read-only: `write` false). Errors name the store with its URL's password
/// hidden.
pub(crate) async fn open(g: &Global, write: bool) -> Result<Arc<dyn Store>, BoxError> {
    let url = g.store.as_str();
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        return redis(g).await;
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return postgres(g).await;
    }
    let path = std::path::Path::new(url);
    if !path.exists() {
        return Err(format!("no dead-letter store at {}", path.display()).into());
    }
    Ok(if write {
        Arc::new(SqliteStore::open(path)?)
    } else {
        Arc::new(SqliteStore::open_read_only(path)?)
    })
}

#[cfg(feature = "redis")]
async fn redis(g: &Global) -> Result<Arc<dyn Store>, BoxError> {
    let store = tower_backstop::store::RedisStore::connect(&g.store)
        .await?
        .with_prefix(g.prefix.clone());
    Ok(Arc::new(store))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &Global) -> Result<Arc<dyn Store>, BoxError> {
    Err("this backstop-dlq was built without the `redis` feature".into())
}

/// Connects to the schema, which must exist (a mistyped name is an error, not a new empty
/// store), and applies the migrations it lacks.
#[cfg(feature = "postgres")]
async fn postgres(g: &Global) -> Result<Arc<dyn Store>, BoxError> {
    let store = tower_backstop::store::PostgresStore::connect(&g.store)
        .schema(g.schema.clone())
        .existing_schema()
        .await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &Global) -> Result<Arc<dyn Store>, BoxError> {
    Err("this backstop-dlq was built without the `postgres` feature".into())
}
