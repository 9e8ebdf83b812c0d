//! Connecting the tests to a real Redis server.
//!
//! The URL comes from `BACKSTOP_REDIS_URL` (default `redis://127.0.0.1:6379`). When the server
//! cannot be reached, a test prints a skip line and passes, unless `BACKSTOP_REQUIRE_REDIS=1`
//! (what `.ci/run` sets), when it fails: a missing Redis never hides behind a green run.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

#[cfg(feature = "redis")]
use tower_backstop::store::RedisStore;

pub fn redis_url() -> String {
    std::env::var("BACKSTOP_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub fn redis_required() -> bool {
    std::env::var("BACKSTOP_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// A store under a fresh key prefix, or `None` (after a skip line) when Redis is unreachable
/// and not required. Without timeouts, so that it works on a paused clock.
#[cfg(feature = "redis")]
pub async fn redis_store(test: &str) -> Option<RedisStore> {
    let url = redis_url();
    match RedisStore::connect_with_timeouts(&url, None, None).await {
        Ok(store) => Some(store.with_prefix(format!(
            "backstop-test:{test}:{:016x}",
            rand::random::<u64>()
        ))),
        Err(e) => skip(test, &url, &e),
    }
}

/// Without the `redis` feature there is no Redis store to test: a skip line (even when Redis is
/// required: the build left the store out on purpose).
#[cfg(not(feature = "redis"))]
pub async fn redis_store(test: &str) -> Option<std::convert::Infallible> {
    eprintln!("SKIPPED {test}: built without the `redis` feature (use --all-features)");
    None
}

pub fn skip<T>(test: &str, url: &str, error: &dyn std::fmt::Display) -> Option<T> {
    if redis_required() {
        panic!(
            "{test}: redis is required (BACKSTOP_REQUIRE_REDIS=1) but unreachable at {url}: {error}"
        );
    }
    eprintln!(
        "SKIPPED {test}: no redis at {url} ({error}); start redis-server or set BACKSTOP_REDIS_URL \
         (BACKSTOP_REQUIRE_REDIS=1 makes this a failure)"
    );
    None
}

/// Time enough for the paused-clock tests; unused otherwise.
pub const NO_TIMEOUT: Option<Duration> = None;
