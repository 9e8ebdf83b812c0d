//! The conformance suite ([`tower_backstop_store::testing`]) against every store of this crate:
//! memory, SQLite, Redis (one server), Redis Cluster, Redis through Sentinel, Postgres, and
//! Postgres through PgBouncer in transaction pooling mode, one test per case and store
//! (`redis::round_trip`, `postgres::claims_are_compare_and_set`,
//! `postgres_pgbouncer::claims_are_compare_and_set`…).
//!
//! Redis, the Redis Cluster, the Sentinels, Postgres and PgBouncer are real servers at
//! `BACKSTOP_REDIS_URL`, `BACKSTOP_REDIS_CLUSTER_URLS`, `BACKSTOP_REDIS_SENTINEL_URLS` (the
//! primary named by `BACKSTOP_REDIS_SENTINEL_MASTER`), `BACKSTOP_POSTGRES_URL` and
//! `BACKSTOP_PGBOUNCER_URL`: when one is missing its tests are reported as ignored, with the
//! reason, or fail when it is required (`BACKSTOP_REQUIRE_REDIS=1`,
//! `BACKSTOP_REQUIRE_REDIS_CLUSTER=1`, `BACKSTOP_REQUIRE_REDIS_SENTINEL=1`,
//! `BACKSTOP_REQUIRE_POSTGRES=1`, `BACKSTOP_REQUIRE_PGBOUNCER=1`). A store left out of the
//! build by its feature has its tests ignored too (`cargo test --all-features` builds them all).

use backstop_test_support::{Service, Tests};
use tower_backstop_store::testing::{self, Backend, MemoryBackend};

/// Adds one test per case, named `{store}::{case}`, running against the backend `make` gives.
fn add<B: Backend + 'static>(
    tests: &mut Tests,
    store: &str,
    service: Option<Service>,
    make: impl Fn() -> B + Clone + Send + 'static,
) {
    for case in testing::cases() {
        let name = format!("{store}::{}", case.name());
        let make = make.clone();
        let run = move || async move { case.run(&make()).await };
        match service {
            Some(service) => tests.needs(service).current(&name, run),
            None => {
                tests.current(&name, run);
            }
        }
    }
}

/// One ignored test per case for a store this build left out, saying which feature.
#[allow(dead_code)] // unused with --all-features
fn unbuilt(tests: &mut Tests, store: &str, feature: &str) {
    for case in testing::cases() {
        tests.unbuilt(
            &format!("{store}::{}", case.name()),
            &format!("built without the `{feature}` feature (use --all-features)"),
        );
    }
}

fn main() {
    let mut tests = Tests::new();
    add(&mut tests, "memory", None, || MemoryBackend);
    #[cfg(feature = "sqlite")]
    add(&mut tests, "sqlite", None, || testing::SqliteBackend);
    #[cfg(not(feature = "sqlite"))]
    unbuilt(&mut tests, "sqlite", "sqlite");
    #[cfg(feature = "redis")]
    {
        add(&mut tests, "redis", Some(Service::Redis), || {
            testing::RedisBackend::new(backstop_test_support::redis_url())
        });
        add(
            &mut tests,
            "redis_cluster",
            Some(Service::RedisCluster),
            || testing::RedisBackend::cluster(backstop_test_support::redis_cluster_urls()),
        );
        add(
            &mut tests,
            "redis_sentinel",
            Some(Service::RedisSentinel),
            || {
                testing::RedisBackend::sentinel(
                    backstop_test_support::redis_sentinel_urls(),
                    &backstop_test_support::redis_sentinel_master(),
                )
            },
        );
    }
    #[cfg(not(feature = "redis"))]
    {
        unbuilt(&mut tests, "redis", "redis");
        unbuilt(&mut tests, "redis_cluster", "redis");
        unbuilt(&mut tests, "redis_sentinel", "redis");
    }
    #[cfg(feature = "postgres")]
    {
        add(&mut tests, "postgres", Some(Service::Postgres), || {
            testing::PostgresBackend::new(backstop_test_support::postgres_url())
        });
        add(
            &mut tests,
            "postgres_pgbouncer",
            Some(Service::PgBouncer),
            || testing::PostgresBackend::behind_pooler(backstop_test_support::pgbouncer_url()),
        );
    }
    #[cfg(not(feature = "postgres"))]
    {
        unbuilt(&mut tests, "postgres", "postgres");
        unbuilt(&mut tests, "postgres_pgbouncer", "postgres");
    }
    tests.run();
}
