//! Connecting the tests to a real Redis server, at `BACKSTOP_REDIS_URL` (default
//! `redis://127.0.0.1:6379`).
//!
//! A test that needs it is listed with `tests.needs(Service::Redis)` (backstop-test-support),
//! which probes the server once: when it is missing, the test is reported as ignored with the
//! reason, or fails when `BACKSTOP_REQUIRE_REDIS=1` (what `.ci/run` sets). So here, a server that
//! cannot be reached is a failure.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "redis")]
use tower_backstop::store::RedisStore;

pub use backstop_test_support::redis_url;

/// A store under a fresh key prefix. Without timeouts, so that it works on a paused clock.
#[cfg(feature = "redis")]
pub async fn redis_store(test: &str) -> RedisStore {
    let url = redis_url();
    match RedisStore::connect_with_timeouts(&url, None, None).await {
        Ok(store) => store.with_prefix(format!(
            "backstop-test:{test}:{:016x}",
            rand::random::<u64>()
        )),
        Err(e) => panic!("{test}: cannot connect to redis at {url}: {e}"),
    }
}
