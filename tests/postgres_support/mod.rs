//! Connecting the tests to a real Postgres server, at `BACKSTOP_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`, the throwaway cluster `.ci/run` starts). Each
//! store gets a schema of its own.
//!
//! A test that needs it is listed with `tests.needs(Service::Postgres)` (backstop-test-support),
//! which probes the server once: when it is missing, the test is reported as ignored with the
//! reason, or fails when `BACKSTOP_REQUIRE_POSTGRES=1` (what `.ci/run` sets). So here, a server
//! that cannot be reached is a failure. A test that starts a [`Cluster`] of its own needs
//! `Service::PostgresBinaries` instead.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "postgres")]
use tower_backstop::store::PostgresStore;

pub use backstop_test_support::postgres_url;

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

/// A store in a fresh schema.
#[cfg(feature = "postgres")]
pub async fn postgres_store(test: &str) -> PostgresStore {
    let url = postgres_url();
    match PostgresStore::connect(&url)
        .schema(fresh_schema(test))
        .await
    {
        Ok(store) => store,
        Err(e) => panic!("{test}: cannot connect to postgres at {url}: {e}"),
    }
}

/// A PgBouncer of our own in front of a [`Cluster`]: see [`backstop_test_support::PgBouncer`].
#[allow(unused_imports)]
pub use backstop_test_support::PgBouncer;
/// A throwaway Postgres cluster of our own: see [`backstop_test_support::PgCluster`].
#[allow(unused_imports)]
pub use backstop_test_support::PgCluster as Cluster;
