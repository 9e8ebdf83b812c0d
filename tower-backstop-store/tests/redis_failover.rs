//! A Redis primary killed under writes, with a replica and a Sentinel of our own (started here
//! on free ports of 127.0.0.1, files in a temporary directory): the store opened through the
//! Sentinel fails the calls made while no primary is there, then writes to the replica the
//! Sentinel promotes, and what the replica had before the kill is all there.
//!
//! Needs `redis-server` and `redis-sentinel` (Debian's `redis-server` and `redis-sentinel`):
//! without them the test is ignored, or fails with `BACKSTOP_REQUIRE_REDIS_SENTINEL=1`.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use backstop_test_support::{Service, Tests};
use tower_backstop_store::{ErrorEntry, Filter, Record, RedisStore, Store};

/// A process killed (SIGKILL) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn spawn(program: &str, args: &[&str]) -> Killed {
    Killed(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}")),
    )
}

/// A redis-server without persistence on `port`, its files in `dir`, a replica of `primary`
/// when given.
fn redis_server(port: u16, dir: &Path, primary: Option<u16>) -> Killed {
    let port = port.to_string();
    let dir = dir.to_str().unwrap();
    let mut args = vec![
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir,
    ];
    let primary = primary.map(|p| p.to_string());
    if let Some(p) = &primary {
        args.extend(["--replicaof", "127.0.0.1", p]);
    }
    spawn("redis-server", &args)
}

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

/// Waits (for servers to come up or to fail over; at most 30 s) until `ask(port, args)` holds
/// `want`.
async fn wait_for(port: u16, args: &[&str], want: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = ask(port, args).await;
        if got.contains(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} on {port} never held {want:?}; last: {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    let dir = tempfile::tempdir().unwrap();
    let (primary_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let (pdir, rdir) = (dir.path().join("primary"), dir.path().join("replica"));
    std::fs::create_dir_all(&pdir).unwrap();
    std::fs::create_dir_all(&rdir).unwrap();
    let mut primary = Some(redis_server(primary_port, &pdir, None));
    let _replica = redis_server(replica_port, &rdir, Some(primary_port));
    wait_for(
        replica_port,
        &["INFO", "replication"],
        "master_link_status:up",
    )
    .await;
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor backstop 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds backstop 1000\n\
             sentinel failover-timeout backstop 10000\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let _sentinel = spawn("redis-sentinel", &[conf.to_str().unwrap()]);
    // The Sentinel has found the replica (through the primary's INFO).
    let replica_addr = format!("{replica_port}");
    wait_for(
        sentinel_port,
        &["SENTINEL", "REPLICAS", "backstop"],
        &replica_addr,
    )
    .await;

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
    drop(primary.take());
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
