//! A Redis primary killed under writes, with a replica and a Sentinel of our own (test-support's
//! `RedisSentinelSet`: free ports of 127.0.0.1, files in a temporary directory): the store opened through the
//! Sentinel fails the calls made while no primary is there, then writes to the replica the
//! Sentinel promotes, and what the replica had before the kill is all there.
//!
//! Needs `redis-server` and `redis-sentinel` (Debian's `redis-server` and `redis-sentinel`):
//! without them the test is ignored, or fails with `BACKSTOP_REQUIRE_REDIS_SENTINEL=1`.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use backstop_test_support::{RedisSentinelSet, Service, Tests};
use tower_backstop_store::{ErrorEntry, Filter, Record, RedisStore, Store};

/// `INFO`/`SENTINEL` answers from the server at `port`, as text (empty while it is not up).
async fn ask(port: u16, args: &[&str]) -> String {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return String::new();
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return String::new();
    };
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query_async::<redis::Value>(&mut conn).await {
        Ok(v) => format!("{v:?}"),
        Err(_) => String::new(),
    }
}

/// Waits (for the failover; at most 30 s) until the Sentinel at `sentinel` lists the primary
/// `backstop` at `port`, neither subjectively nor objectively down.
async fn wait_promoted(sentinel: u16, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{sentinel}"))
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            let master: Option<HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg("backstop")
                .query_async(&mut conn)
                .await
                .ok();
            if let Some(m) = &master
                && m.get("port") == Some(&port.to_string())
                && m.get("flags")
                    .is_some_and(|f| !f.contains("s_down") && !f.contains("o_down"))
            {
                return;
            }
            last = master;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sentinel never promoted the replica on {port}; last: {last:?}");
}

fn record(id: &str) -> Record {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    Record::new(id, ErrorEntry::new(t, "transient", "http 503", "boom", 1))
}

async fn primary_killed_under_writes_the_promoted_replica_takes_them() {
    // A primary, its replica in sync, and a Sentinel that has found the replica.
    let mut set = tokio::task::block_in_place(RedisSentinelSet::start)
        .unwrap_or_else(|e| panic!("a primary, a replica and a Sentinel of our own: {e}"));
    let (primary_port, replica_port, sentinel_port) = (set.primary, set.replica, set.sentinel);

    let sentinel_url = format!("redis://127.0.0.1:{sentinel_port}");
    let store = RedisStore::connect_sentinel(&[&sentinel_url], "backstop")
        .timeouts(Some(Duration::from_secs(1)), Some(Duration::from_secs(1)))
        .await
        .unwrap()
        .with_prefix("failover");
    assert!(store.to_string().contains("sentinel"), "{store}");
    for i in 0..20 {
        store.put(record(&format!("before-{i:02}"))).await.unwrap();
    }
    // Acknowledged by the primary and, by WAIT, held by the replica: these must survive.
    // (Without WAIT, a write acknowledged but not yet replicated may be lost with the primary.)
    let replicated = ask(primary_port, &["WAIT", "1", "5000"]).await;
    assert_eq!(replicated, "int(1)", "the replica acknowledged the writes");

    // The primary dies (SIGKILL): the call now fails, and is reported as failed.
    set.kill_primary();
    let during = store.put(record("during")).await;
    assert!(during.is_err(), "a write with no primary: {during:?}");

    // The Sentinel promotes the replica (waiting for the failover to end: the Sentinel lists
    // the replica as the primary, up; what the store asks it).
    wait_promoted(sentinel_port, replica_port).await;

    // Writes resume on the promoted replica, with the same store value.
    for i in 0..10 {
        store
            .put(record(&format!("after-{i:02}")))
            .await
            .unwrap_or_else(|e| panic!("write {i} after the failover: {e}"));
    }
    let mut ids: Vec<String> = store
        .search(&Filter::new(), 0..100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    ids.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("after-{i:02}")).collect();
    want.extend((0..20).map(|i| format!("before-{i:02}")));
    assert_eq!(
        ids, want,
        "what the replica had, and what was written after"
    );
}

fn main() {
    let mut tests = Tests::new();
    tests.needs(Service::RedisSentinelBinaries).multi_thread(
        "primary_killed_under_writes_the_promoted_replica_takes_them",
        primary_killed_under_writes_the_promoted_replica_takes_them,
    );
    tests.run();
}
