//! Store faults with real processes and real files: a SQLite file that becomes read-only, a
//! directory that disappears, a write lock held by another process past the busy timeout, and a
//! `redis-server` stopped in the middle of a run and started again, and a Postgres cluster of our
//! own stopped and started again the same way.
//!
//! Each time: the caller's failure says the record was not written, a `tracing` error reports
//! it, nothing is lost silently (every call is either in the store or was told it is not), and
//! writes resume once the store is back, in the same process, with the same store value.
//!
//! Alone in its own test binary: `tracing` caches each callsite's interest process-wide.

mod postgres_support;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use backstop_test_support::Tests;
use support::{Scripted, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::dead_letter::DeadLetterStatus;
use tower_backstop::store::{Filter, SqliteStore, Store};

/// What one call through the dead-letter layer reported.
#[derive(Debug)]
enum Told {
    Stored(String),
    NotStored(String, String),
}

/// One failing call (503) with idempotency key `id` through a dead-letter layer over `store`.
async fn call(store: Arc<dyn Store>, id: &str) -> Told {
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store))
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));
    let failure = svc
        .oneshot(post_with_key("/", "payload", id))
        .await
        .unwrap_err();
    match failure.note::<DeadLetterStatus>() {
        Some(DeadLetterStatus::Stored { id }) => Told::Stored(id.clone()),
        Some(DeadLetterStatus::NotStored { id, error }) => {
            // The caller's failure says so, in words.
            let text = failure.to_string();
            assert!(
                text.contains(&format!("dead letter {id} could not be written")),
                "{text}"
            );
            Told::NotStored(id.clone(), error.to_string())
        }
        other => panic!("{other:?}"),
    }
}

fn not_stored(told: Told, expect: &str) {
    match told {
        Told::NotStored(_, error) => {
            assert!(error.to_lowercase().contains(expect), "{error}")
        }
        Told::Stored(id) => panic!("{id} reported written while the store was broken"),
    }
}

fn stored(told: Told) -> String {
    match told {
        Told::Stored(id) => id,
        Told::NotStored(id, error) => panic!("{id} not written: {error}"),
    }
}

/// Makes `path` read-only for everyone, root included (`chattr +i`), or by its mode when not
/// root; undoes it on drop.
struct ReadOnly<'a>(&'a Path);

impl<'a> ReadOnly<'a> {
    fn set(path: &'a Path) -> Self {
        let immutable = Command::new("chattr").arg("+i").arg(path).status();
        if !immutable.is_ok_and(|s| s.success()) {
            let mut perms = std::fs::metadata(path).unwrap().permissions();
            perms.set_readonly(true);
            std::fs::set_permissions(path, perms).unwrap();
        }
        ReadOnly(path)
    }
}

impl Drop for ReadOnly<'_> {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(self.0).status();
        if let Ok(meta) = std::fs::metadata(self.0) {
            let mut perms = meta.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perms.set_readonly(false);
            let _ = std::fs::set_permissions(self.0, perms);
        }
    }
}

async fn sqlite_file_that_is_read_only_then_writable_again() {
    let logs = support::LogCapture::start(tracing::Level::WARN);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl.db");
    SqliteStore::open(&path).unwrap().close();
    let guard = ReadOnly::set(&path);
    // SQLite opens a file it may not write, read-only, without a word.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    not_stored(call(Arc::clone(&store), "ro-1").await, "readonly");
    not_stored(call(Arc::clone(&store), "ro-2").await, "readonly");
    assert!(logs.text().contains("dead letter could not be written"));
    assert!(logs.text().contains("ro-2"));
    drop(guard);
    // Writable again: the same store writes, without a restart.
    assert_eq!(stored(call(Arc::clone(&store), "ro-3").await), "ro-3");
    let ids: Vec<String> = store
        .search(&Filter::new(), 0..10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["ro-3"], "the two refused were told so, not written");
}

async fn sqlite_directory_that_disappears_then_comes_back() {
    let logs = support::LogCapture::start(tracing::Level::WARN);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("spool");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("dl.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    stored(call(Arc::clone(&store), "d-1").await);

    std::fs::remove_dir_all(&dir).unwrap();
    // Never written into the deleted file: told so, each time.
    not_stored(call(Arc::clone(&store), "d-2").await, "directory");
    not_stored(call(Arc::clone(&store), "d-3").await, "directory");
    let text = logs.text();
    assert!(
        text.contains("the directory of the database is gone"),
        "{text}"
    );
    assert!(text.contains("dead letter could not be written"), "{text}");

    // The directory is back (empty): the same store opens a new file there and writes.
    std::fs::create_dir(&dir).unwrap();
    stored(call(Arc::clone(&store), "d-4").await);
    assert!(path.exists());
    let fresh = SqliteStore::open_read_only(&path).unwrap();
    assert_eq!(fresh.get("d-4").await.unwrap().unwrap().id, "d-4");
    assert_eq!(fresh.get("d-2").await.unwrap(), None);
}

/// The lock holder, run as a separate process by the test below (`--exact`): with
/// `BACKSTOP_HOLD_LOCK=<path>`, takes SQLite's write lock on the file, prints `locked`, and
/// keeps it until its stdin closes. Not a test of its own: listed only in that process.
fn hold_sqlite_write_lock() {
    let Ok(path) = std::env::var("BACKSTOP_HOLD_LOCK") else {
        return;
    };
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    println!("locked");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    conn.execute_batch("ROLLBACK").unwrap();
}

/// The lock-holding process and its output (kept open until it exits).
struct Holder {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

fn lock_holder(path: &Path) -> Holder {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hold_sqlite_write_lock", "--nocapture"])
        .args(["--test-threads=1"])
        .env("BACKSTOP_HOLD_LOCK", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        if line.contains("locked") {
            return Holder { child, out };
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the lock holder did not take the lock");
}

async fn sqlite_write_lock_held_by_another_process_past_the_busy_timeout() {
    let logs = support::LogCapture::start(tracing::Level::WARN);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl.db");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_busy_timeout(Duration::from_millis(100)),
    );
    stored(call(Arc::clone(&store), "l-1").await);

    let mut holder = tokio::task::spawn_blocking({
        let path = path.clone();
        move || lock_holder(&path)
    })
    .await
    .unwrap();
    not_stored(call(Arc::clone(&store), "l-2").await, "locked");
    assert!(logs.text().contains("l-2"));

    // The other process lets go: the next write goes through.
    drop(holder.child.stdin.take());
    tokio::task::spawn_blocking(move || {
        std::io::copy(&mut holder.out, &mut std::io::sink()).unwrap();
        assert!(holder.child.wait().unwrap().success());
    })
    .await
    .unwrap();
    stored(call(Arc::clone(&store), "l-3").await);
    let mut ids: Vec<String> = store
        .search(&Filter::new(), 0..10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["l-1", "l-3"]);
}

/// A `redis-server` of our own on `port`, its data in `dir` (an append-only file, fsync'd on
/// every write), so that a restart keeps what it acknowledged.
#[cfg(feature = "redis")]
fn spawn_redis(port: u16, dir: &Path) -> std::io::Result<Child> {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
}

#[cfg(feature = "redis")]
async fn redis_stopped_in_the_middle_of_a_run_and_started_again() {
    use tower_backstop::store::RedisStore;

    let logs = support::LogCapture::start(tracing::Level::WARN);
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut server =
        spawn_redis(port, data.path()).expect("redis-server, found on PATH at start-up");
    let mut connected = None;
    for _ in 0..200 {
        if let Ok(s) = RedisStore::connect_with_timeouts(
            &url,
            Some(Duration::from_millis(200)),
            Some(Duration::from_millis(500)),
        )
        .await
        {
            connected = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store: Arc<dyn Store> = Arc::new(connected.expect("our redis-server did not start"));

    // 60 calls; Redis is stopped after the 20th and started again after the 35th.
    let mut told = Vec::new();
    for i in 0..60 {
        if i == 20 {
            server.kill().unwrap();
            server.wait().unwrap();
        }
        if i == 35 {
            server = spawn_redis(port, data.path()).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        told.push(call(Arc::clone(&store), &format!("r-{i:02}")).await);
    }
    let reported_stored: Vec<&String> = told
        .iter()
        .filter_map(|t| match t {
            Told::Stored(id) => Some(id),
            Told::NotStored(..) => None,
        })
        .collect();
    let reported_lost: Vec<&String> = told
        .iter()
        .filter_map(|t| match t {
            Told::NotStored(id, _) => Some(id),
            Told::Stored(_) => None,
        })
        .collect();
    // While it was down, every call was told.
    for (i, t) in told.iter().enumerate().take(35).skip(20) {
        assert!(
            matches!(t, Told::NotStored(..)),
            "call {i} while redis was down: {t:?}"
        );
    }
    // Writes resumed without a restart: the tail of the run is written.
    assert!(
        told[50..].iter().all(|t| matches!(t, Told::Stored(_))),
        "{:?}",
        &told[35..]
    );
    // Nothing silently lost: every call reported written is in the store (Redis kept it across
    // the restart), and every other call was told it was not written.
    let mut in_store: Vec<String> = Vec::new();
    for _ in 0..50 {
        match store.search(&Filter::new(), 0..100).await {
            Ok(all) => {
                in_store = all.into_iter().map(|r| r.id).collect();
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    in_store.sort();
    let mut want: Vec<String> = reported_stored.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(in_store, want);
    assert_eq!(reported_stored.len() + reported_lost.len(), 60);
    let text = logs.text();
    assert_eq!(
        text.matches("dead letter could not be written").count(),
        reported_lost.len(),
        "one tracing error per record not written"
    );
    server.kill().unwrap();
    server.wait().unwrap();
}

#[cfg(feature = "postgres")]
async fn postgres_stopped_in_the_middle_of_a_run_and_started_again() {
    use tower_backstop::store::PostgresStore;

    let logs = support::LogCapture::start(tracing::Level::WARN);
    let cluster = postgres_support::Cluster::start()
        .unwrap_or_else(|e| panic!("a postgres cluster of our own: {e}"));
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&cluster.url())
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap(),
    );

    // 60 calls; Postgres is stopped after the 20th and started again after the 35th.
    let mut told = Vec::new();
    for i in 0..60 {
        if i == 20 {
            cluster.stop();
        }
        if i == 35 {
            cluster.resume().unwrap();
        }
        told.push(call(Arc::clone(&store), &format!("p-{i:02}")).await);
    }
    let reported_stored: Vec<String> = told
        .iter()
        .filter_map(|t| match t {
            Told::Stored(id) => Some(id.clone()),
            Told::NotStored(..) => None,
        })
        .collect();
    let lost = told
        .iter()
        .filter(|t| matches!(t, Told::NotStored(..)))
        .count();
    assert_eq!(
        &reported_stored[..20],
        (0..20).map(|i| format!("p-{i:02}")).collect::<Vec<_>>()
    );
    for (i, t) in told.iter().enumerate().take(35).skip(20) {
        assert!(
            matches!(t, Told::NotStored(..)),
            "call {i} while postgres was down: {t:?}"
        );
    }
    // Writes resumed with the same store, without a restart of ours.
    assert!(
        told[36..].iter().all(|t| matches!(t, Told::Stored(_))),
        "{:?}",
        &told[35..]
    );
    // Nothing silently lost: what was reported written is in the store, across the restart.
    let mut in_store: Vec<String> = store
        .search(&Filter::new(), 0..100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    in_store.sort();
    assert_eq!(in_store, reported_stored);
    assert_eq!(reported_stored.len() + lost, 60);
    assert_eq!(
        logs.text()
            .matches("dead letter could not be written")
            .count(),
        lost,
        "one tracing error per record not written"
    );
}

/// A scheduler draining 60 deferred records over our own Postgres cluster, stopped after the
/// first 15 re-sends and started again 2 s later: nothing is lost (every record is delivered
/// and ends resolved), the scheduler resumes by itself, and its log says so once: one WARN when
/// the store fails, one INFO when it is back, not one a poll.
#[cfg(feature = "postgres")]
async fn postgres_stopped_mid_drain_the_scheduler_resumes_and_says_so_once() {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use std::time::SystemTime;

    use tower_backstop::dead_letter::record_of;
    use tower_backstop::resend::{Scheduler, http_request};
    use tower_backstop::store::{PostgresStore, Record, Status};
    use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

    let logs = support::LogCapture::start(tracing::Level::INFO);
    let cluster = postgres_support::Cluster::start()
        .unwrap_or_else(|e| panic!("a postgres cluster of our own: {e}"));
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&cluster.url())
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap(),
    );
    let now = SystemTime::now();
    let ids: Vec<String> = (0..60).map(|i| format!("d-{i:02}")).collect();
    let records = ids.iter().map(|id| {
        let f: Failure = Failure::new(
            Class::THROTTLED,
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
        );
        let mut r = record_of(
            id.clone(),
            Envelope::new("{}")
                .with_metadata("method", "POST")
                .with_metadata("uri", "http://mail.test/v1/messages"),
            &f,
        );
        r.status = Status::Deferred;
        r.retry_at = Some(now - Duration::from_secs(1));
        r
    });
    store.put_many(records.collect()).await.unwrap();

    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let provider = {
        let sent = Arc::clone(&sent);
        tower::service_fn(
            move |req: http::Request<http_body_util::Full<bytes::Bytes>>| {
                let id = req.extensions().get::<MessageId>().unwrap().0.clone();
                sent.lock().unwrap().push(id);
                async { Ok::<_, BoxError>(http::Response::new(())) }
            },
        )
    };
    let scheduler = Scheduler::new(Arc::clone(&store), provider, |r: &Record| {
        http_request(r, None)
    })
    .rate(20)
    .concurrency(4)
    .lease(Duration::from_secs(2))
    .poll_every(Duration::from_millis(100))
    .spawn();
    let distinct = || {
        sent.lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    let wait_for = |n: usize| async move {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while distinct().len() < n {
            assert!(std::time::Instant::now() < give_up, "{:?}", distinct());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_for(15).await;
    cluster.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.resume().unwrap();
    wait_for(60).await;
    // The last outcomes are written a moment after the last send.
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let all = store.search(&Filter::new(), 0..100).await.unwrap();
        if all.len() == 60 && all.iter().all(|r| r.status == Status::Resolved) {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "{all:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    scheduler.shutdown().await;
    assert_eq!(distinct(), ids.iter().cloned().collect::<BTreeSet<_>>());

    let text = logs.text();
    let said = |message: &str| text.lines().filter(|l| l.contains(message)).count();
    assert_eq!(said("dead-letter store unavailable"), 1, "{text}");
    assert_eq!(said("dead-letter store available again"), 1, "{text}");
    let warn = text
        .lines()
        .find(|l| l.contains("dead-letter store unavailable"))
        .unwrap();
    assert!(warn.contains(" WARN "), "{warn}");
}

/// A store behind PgBouncer in transaction pooling mode (PgBouncer's defaults otherwise), over
/// our own Postgres: writes before and after Postgres restarts, with the same store value and the
/// same PgBouncer, are all stored and all there; `listen_for_due` there says once that it polls.
#[cfg(feature = "postgres")]
async fn postgres_behind_pgbouncer_restarted_keeps_working() {
    use tower_backstop::store::PostgresStore;

    let logs = support::LogCapture::start(tracing::Level::WARN);
    let cluster = postgres_support::Cluster::start()
        .unwrap_or_else(|e| panic!("a postgres cluster of our own: {e}"));
    let bouncer = postgres_support::PgBouncer::start(&cluster)
        .unwrap_or_else(|e| panic!("a pgbouncer of our own: {e}"));
    let opened = PostgresStore::connect(&bouncer.url())
        .behind_pooler()
        .statement_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("open behind pgbouncer: {e}"));
    let store: Arc<dyn Store> = Arc::new(opened.clone());

    let mut told = Vec::new();
    for i in 0..10 {
        told.push(call(Arc::clone(&store), &format!("b-{i:02}")).await);
    }
    // Postgres restarts behind PgBouncer: every server connection PgBouncer held is cut.
    cluster.stop();
    cluster.resume().unwrap();
    for i in 10..20 {
        told.push(call(Arc::clone(&store), &format!("b-{i:02}")).await);
    }
    let stored: Vec<String> = told.into_iter().map(stored).collect();
    assert_eq!(
        stored,
        (0..20).map(|i| format!("b-{i:02}")).collect::<Vec<_>>()
    );
    let mut in_store: Vec<String> = store
        .search(&Filter::new(), 0..100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    in_store.sort();
    assert_eq!(in_store, stored, "what was reported written is there");

    // LISTEN cannot be held behind a transaction pooler: one warning, and no wake-ups (the
    // schedulers poll).
    let listening = opened.listen_for_due();
    assert!(listening.wake_ups().is_none());
    assert!(listening.wake_ups().is_none());
    let text = logs.text();
    assert_eq!(text.matches("LISTEN cannot be held").count(), 1, "{text}");
    drop(bouncer);
}

/// A scheduler draining 40 deferred records over our own Postgres cluster, stopped after the
/// first 10 re-sends for longer than the claims' lease (3 s, a lease of 2 s) and started again:
/// every record is delivered exactly once (counted at the provider) and ends resolved. The
/// outcomes of the re-sends in flight when it stopped are tried again until written, and a
/// claim that ended meanwhile and that the scheduler took again is not sent a second time.
#[cfg(feature = "postgres")]
async fn postgres_stopped_past_the_lease_mid_drain_delivers_each_record_once() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::SystemTime;

    use tower_backstop::dead_letter::record_of;
    use tower_backstop::resend::{Scheduler, http_request};
    use tower_backstop::store::{PostgresStore, Record, Status};
    use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

    let cluster = postgres_support::Cluster::start()
        .unwrap_or_else(|e| panic!("a postgres cluster of our own: {e}"));
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&cluster.url())
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap(),
    );
    let now = SystemTime::now();
    let ids: Vec<String> = (0..40).map(|i| format!("o-{i:02}")).collect();
    let records = ids.iter().map(|id| {
        let f: Failure = Failure::new(
            Class::TRANSIENT,
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
        );
        let mut r = record_of(
            id.clone(),
            Envelope::new("{}")
                .with_metadata("method", "POST")
                .with_metadata("uri", "http://mail.test/v1/messages"),
            &f,
        );
        r.status = Status::Deferred;
        r.retry_at = Some(now - Duration::from_secs(1));
        r
    });
    store.put_many(records.collect()).await.unwrap();

    // The provider takes 100 ms: re-sends are in flight when the store stops.
    let sent: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let provider = {
        let sent = Arc::clone(&sent);
        tower::service_fn(
            move |req: http::Request<http_body_util::Full<bytes::Bytes>>| {
                let id = req.extensions().get::<MessageId>().unwrap().0.clone();
                *sent.lock().unwrap().entry(id).or_default() += 1;
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, BoxError>(http::Response::new(()))
                }
            },
        )
    };
    let scheduler = Scheduler::new(Arc::clone(&store), provider, |r: &Record| {
        http_request(r, None)
    })
    .rate(20)
    .concurrency(4)
    .lease(Duration::from_secs(2))
    .poll_every(Duration::from_millis(100))
    .spawn();
    let wait_for = |n: usize| {
        let sent = Arc::clone(&sent);
        async move {
            let give_up = std::time::Instant::now() + Duration::from_secs(60);
            while sent.lock().unwrap().len() < n {
                assert!(std::time::Instant::now() < give_up, "{:?}", sent.lock());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(10).await;
    cluster.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(scheduler.store_health().failures > 0);
    cluster.resume().unwrap();
    wait_for(40).await;
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let all = store.search(&Filter::new(), 0..100).await.unwrap();
        if all.len() == 40 && all.iter().all(|r| r.status == Status::Resolved) {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "{all:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!scheduler.store_health().is_failing());
    scheduler.shutdown().await;
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.keys().cloned().collect::<Vec<_>>(), ids);
    assert!(sent.values().all(|&n| n == 1), "sent twice: {sent:?}");
}

fn main() {
    let mut tests = Tests::new();
    tests.current(
        "sqlite_file_that_is_read_only_then_writable_again",
        sqlite_file_that_is_read_only_then_writable_again,
    );
    tests.current(
        "sqlite_directory_that_disappears_then_comes_back",
        sqlite_directory_that_disappears_then_comes_back,
    );
    tests.child_role(
        "hold_sqlite_write_lock",
        "BACKSTOP_HOLD_LOCK",
        hold_sqlite_write_lock,
    );
    tests.current(
        "sqlite_write_lock_held_by_another_process_past_the_busy_timeout",
        sqlite_write_lock_held_by_another_process_past_the_busy_timeout,
    );
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::RedisServerBinary)
        .current(
            "redis_stopped_in_the_middle_of_a_run_and_started_again",
            redis_stopped_in_the_middle_of_a_run_and_started_again,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::PostgresBinaries)
        .current(
            "postgres_stopped_in_the_middle_of_a_run_and_started_again",
            postgres_stopped_in_the_middle_of_a_run_and_started_again,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::PostgresBinaries)
        .current(
            "postgres_stopped_mid_drain_the_scheduler_resumes_and_says_so_once",
            postgres_stopped_mid_drain_the_scheduler_resumes_and_says_so_once,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::PostgresBinaries)
        .multi_thread(
            "postgres_stopped_past_the_lease_mid_drain_delivers_each_record_once",
            postgres_stopped_past_the_lease_mid_drain_delivers_each_record_once,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::PgBouncerBinaries)
        .current(
            "postgres_behind_pgbouncer_restarted_keeps_working",
            postgres_behind_pgbouncer_restarted_keeps_working,
        );
    tests.run();
}
