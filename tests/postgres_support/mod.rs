//! Connecting the tests to a real Postgres server.
//!
//! The URL comes from `BACKSTOP_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`,
//! the throwaway cluster `.ci/run` starts). Each store gets a schema of its own. When the server
//! cannot be reached, a test prints a skip line and passes, unless `BACKSTOP_REQUIRE_POSTGRES=1`
//! (what `.ci/run` sets), when it fails: a missing Postgres never hides behind a green run.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "postgres")]
use tower_backstop::store::PostgresStore;

pub fn postgres_url() -> String {
    std::env::var("BACKSTOP_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn postgres_required() -> bool {
    std::env::var("BACKSTOP_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

/// A fresh schema name for `test`: `bt_`, the test's name (cut to fit), a random suffix.
pub fn fresh_schema(test: &str) -> String {
    let name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(36)
        .collect();
    format!("bt_{name}_{:016x}", rand::random::<u64>())
}

/// A store in a fresh schema, or `None` (after a skip line) when Postgres is unreachable and
/// not required.
#[cfg(feature = "postgres")]
pub async fn postgres_store(test: &str) -> Option<PostgresStore> {
    let url = postgres_url();
    match PostgresStore::connect(&url)
        .schema(fresh_schema(test))
        .await
    {
        Ok(store) => Some(store),
        Err(e) => skip(test, &url, &e),
    }
}

/// Without the `postgres` feature there is no Postgres store to test: a skip line (even when
/// Postgres is required: the build left the store out on purpose).
#[cfg(not(feature = "postgres"))]
pub async fn postgres_store(test: &str) -> Option<std::convert::Infallible> {
    eprintln!("SKIPPED {test}: built without the `postgres` feature (use --all-features)");
    None
}

pub fn skip<T>(test: &str, url: &str, error: &dyn std::fmt::Display) -> Option<T> {
    if postgres_required() {
        panic!(
            "{test}: postgres is required (BACKSTOP_REQUIRE_POSTGRES=1) but unreachable at {url}: \
             {error}"
        );
    }
    eprintln!(
        "SKIPPED {test}: no postgres at {url} ({error}); start a server or set \
         BACKSTOP_POSTGRES_URL (BACKSTOP_REQUIRE_POSTGRES=1 makes this a failure)"
    );
    None
}
