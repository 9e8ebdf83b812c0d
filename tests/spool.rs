//! The dead-letter layer's local spool: what the store does not take (it fails, hangs, or
//! answers too late) waits in a SQLite file on local disk and is forwarded into the store when
//! it answers again, once, without duplicating what a slow write already put there and without
//! undoing a claim or a resolution that reached the store first. Bad input: a full spool, a
//! spool file corrupt at start, a record in it that does not decode, a read-only spool, two
//! spools on one path, a process restarted with a full spool.
//!
//! In-process stores that fail on command, on tokio's paused clock (the layer's store timeout
//! is real time: a hung store costs each such test its timeout of real time).

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use backstop_test_support::{Fault, FaultyStore, Op};
use support::{Scripted, post_with_key, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::observe::Event;
use tower_backstop::retry::{Attempts, RetryPolicy};
use tower_backstop::store::{
    Change, ErrorEntry, Filter, Lease, MemoryStore, Record, Spool, SpoolError, Status, Store,
};

/// A memory store behind a [`FaultyStore`]: `up`, `down` (every call fails at once), `hung`
/// (its writes never answer), `late` (its writes land at once and answer after this long).
#[derive(Clone)]
struct Switch(FaultyStore);

impl Switch {
    fn new() -> Self {
        Switch(FaultyStore::new(Arc::new(MemoryStore::new())))
    }

    fn up(&self) {
        self.0.set(Fault::Answer);
    }

    fn down(&self) {
        self.0.set(Fault::Fail);
    }

    fn hung(&self) {
        self.0.set_for_each(Op::WRITES, Fault::Hang);
    }

    fn late(&self, by: Duration) {
        self.0.set_for_each(Op::WRITES, Fault::Late(by));
    }

    /// The store behind the faults.
    fn inner(&self) -> &dyn Store {
        &**self.0.inner()
    }
}

/// The spool events a layer told, as `(outcome, count)`.
#[derive(Clone, Default)]
struct Told(Arc<Mutex<Vec<(&'static str, u64)>>>);

impl tower_backstop::observe::Listener for Told {
    fn on_event(&self, event: &Event<'_>) {
        if let Event::Spool { outcome, count, .. } = *event {
            self.0.lock().unwrap().push((outcome, count));
        }
    }
}

impl Told {
    fn outcomes(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().iter().map(|t| t.0).collect()
    }
}

/// One keyed POST through the dead-letter layer over `store` with `spool`, to a provider that
/// answers `upstream`, retried twice; its failure.
async fn call(
    store: &Switch,
    spool: &Spool,
    told: &Told,
    key: &str,
    upstream: Scripted,
) -> tower_backstop::Failure<http::Response<()>> {
    let svc = ServiceBuilder::new()
        .layer(
            DeadLetterLayer::new(store.0.clone())
                .spool(spool.clone())
                .listener(told.clone()),
        )
        .layer(RetryPolicy::new().max_attempts(2).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream);
    svc.oneshot(post_with_key("http://mail.test/", "{\"to\":\"a@b\"}", key))
        .await
        .unwrap_err()
}

/// Waits (paused clock: the forwarder's backoff passes at once) until the spool is empty.
async fn drained(spool: &Spool) {
    for _ in 0..2_000 {
        if spool.state().records == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("spool not drained: {:?}", spool.state());
}

fn open(dir: &Path) -> Spool {
    Spool::open(dir.join("spool.db")).unwrap()
}

fn record(id: &str, at: SystemTime) -> Record {
    let mut r = Record::new(id, ErrorEntry::new(at, "transient", "503", "down", 1));
    r.status = Status::Deferred;
    r.retry_at = Some(at + Duration::from_secs(60));
    r
}

#[tokio::test(start_paused = true)]
async fn a_store_that_is_down_spools_and_the_record_is_forwarded_once_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (store, spool, told) = (Switch::new(), open(dir.path()), Told::default());
    store.down();
    // A 503 that asks for two minutes: deferred. And a 400: a dead letter.
    let deferred = call(
        &store,
        &spool,
        &told,
        "m-1",
        Scripted::always(status_with(503, "retry-after", "120")),
    )
    .await;
    let dead = call(&store, &spool, &told, "m-2", Scripted::always(status(400))).await;
    for (failure, id) in [(&deferred, "m-1"), (&dead, "m-2")] {
        let Some(DeadLetterStatus::Spooled { id: noted, error }) =
            failure.note::<DeadLetterStatus>()
        else {
            panic!("{failure:?}");
        };
        assert_eq!(
            (noted.as_str(), error.to_string().as_str()),
            (id, "the store is down")
        );
        assert!(failure.to_string().contains("spooled locally"), "{failure}");
    }
    // Still deferred: it will be sent again, at its retry-at time.
    let attempts = deferred.note::<Attempts>().unwrap();
    assert!(attempts.is_deferred());
    let retry_at = attempts.retry_at().unwrap();
    assert_eq!(spool.state().records, 2);
    assert!(store.inner().get("m-1").await.unwrap().is_none());
    // The forwarder keeps trying while the store is down, and says so.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(spool.state().records, 2);
    assert!(!spool.state().store_up);
    assert!(
        told.outcomes().contains(&"store_down"),
        "{:?}",
        told.outcomes()
    );
    store.up();
    drained(&spool).await;
    let m1 = store.inner().get("m-1").await.unwrap().unwrap();
    assert_eq!(m1.status, Status::Deferred);
    assert_eq!(m1.retry_at, Some(tower_backstop::store::truncate(retry_at)));
    // One attempt: the retry layer does not wait two minutes; the second tier does.
    assert_eq!(m1.attempts, 1);
    assert_eq!(m1.payload, b"{\"to\":\"a@b\"}");
    assert_eq!(
        store.inner().get("m-2").await.unwrap().unwrap().status,
        Status::Dead
    );
    assert!(spool.state().store_up);
    let outcomes = told.outcomes();
    assert_eq!(outcomes.iter().filter(|o| **o == "spooled").count(), 2);
    let forwarded: u64 = told
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.0 == "forwarded")
        .map(|t| t.1)
        .sum();
    assert_eq!(forwarded, 2);
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_spools_within_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (store, spool, told) = (Switch::new(), open(dir.path()), Told::default());
    store.hung();
    let failure = call(&store, &spool, &told, "m-1", Scripted::always(status(400))).await;
    let Some(DeadLetterStatus::Spooled { error, .. }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    // The store's share of the 1 s timeout: the spool keeps 100 ms of it.
    assert_eq!(
        error.to_string(),
        "dead-letter store did not answer within 900ms"
    );
    assert_eq!(spool.state().records, 1);
}

// On the real clock: a write that answers from a blocking thread holds tokio's paused clock
// still, so that only real time can run out its bound.
#[tokio::test]
async fn a_slow_write_that_lands_late_is_not_forwarded_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (store, spool, told) = (Switch::new(), open(dir.path()), Told::default());
    // Lands after 1.5 s of real time: past the 1 s bound, so the caller is told it spooled.
    store.late(Duration::from_millis(1_500));
    let failure = call(&store, &spool, &told, "m-1", Scripted::always(status(400))).await;
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Spooled { .. })
    ));
    store.up();
    drained(&spool).await;
    let record = store.inner().get("m-1").await.unwrap().unwrap();
    // One failure (one attempt: a 400 is not retried), not the same one merged twice.
    assert_eq!((record.attempts, record.history.len()), (1, 1));
    assert!(
        told.outcomes().contains(&"already_there"),
        "{:?}",
        told.outcomes()
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_spool_refuses_with_both_errors_and_the_caller_is_told_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Switch::new();
    let spool = open(dir.path()).with_max_bytes(100);
    let told = Told::default();
    store.down();
    let failure = call(
        &store,
        &spool,
        &told,
        "m-1",
        Scripted::always(status_with(503, "retry-after", "120")),
    )
    .await;
    let Some(DeadLetterStatus::NotStored { error, .. }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let text = error.to_string();
    assert!(text.starts_with("the store is down; the local spool did not take it either: spool full: it holds 0 bytes of records, its cap is 100"), "{text}");
    // Not deferred: nothing will send it again.
    assert!(!failure.note::<Attempts>().unwrap().is_deferred());
    assert_eq!(told.outcomes(), ["refused"]);
    assert_eq!(spool.state().records, 0);
}

#[test]
fn two_spools_on_one_path_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path());
    let second = Spool::open(dir.path().join("spool.db"));
    let Err(e @ SpoolError::InUse { .. }) = second else {
        panic!("{second:?}");
    };
    assert!(
        e.to_string().contains("is in use by another process"),
        "{e}"
    );
    drop(first);
    // Free again once the first is gone.
    open(dir.path());
}

#[tokio::test]
async fn a_spool_file_corrupt_at_start_is_moved_aside_and_a_fresh_one_works() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    std::fs::write(
        &path,
        b"this is not a SQLite database, but it is long enough to look at",
    )
    .unwrap();
    let spool = Spool::open(&path).unwrap();
    let aside = spool.quarantined();
    assert_eq!(aside.len(), 1);
    assert!(aside[0].to_string_lossy().contains("spool.db.corrupt-"));
    assert!(
        std::fs::read(&aside[0])
            .unwrap()
            .starts_with(b"this is not")
    );
    spool
        .put(record("m-1", SystemTime::now()), None)
        .await
        .unwrap();
    assert_eq!(spool.state().records, 1);
}

#[tokio::test]
async fn a_spooled_record_that_does_not_decode_is_quarantined_and_the_rest_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let spool = Spool::open(&path).unwrap();
    let now = SystemTime::now();
    for id in ["a", "b", "c"] {
        spool.put(record(id, now), None).await.unwrap();
    }
    drop(spool);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE spool SET record = '{\"id\": \"b\", broken' WHERE id = 'b'",
        [],
    )
    .unwrap();
    drop(conn);
    let spool = Spool::open(&path).unwrap();
    let store = MemoryStore::new();
    let done = spool
        .forward_once(&store, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!((done.written, done.quarantined), (2, 1));
    assert!(store.get("a").await.unwrap().is_some());
    assert!(store.get("b").await.unwrap().is_none());
    let quarantine = std::fs::read_to_string(spool.quarantine_path()).unwrap();
    assert_eq!(quarantine, "{\"id\": \"b\", broken\n");
    assert_eq!(spool.state().records, 0);
}

#[tokio::test]
async fn a_record_past_the_age_cap_is_quarantined_not_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(dir.path()).with_max_age(Duration::ZERO);
    spool
        .put(record("old", SystemTime::now()), None)
        .await
        .unwrap();
    let store = MemoryStore::new();
    let done = spool
        .forward_once(&store, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!((done.written, done.quarantined), (0, 1));
    assert!(store.get("old").await.unwrap().is_none());
    let line = std::fs::read_to_string(spool.quarantine_path()).unwrap();
    let kept: Record = serde_json::from_str(line.trim_end()).unwrap();
    assert_eq!(kept.id, "old");
}

#[tokio::test]
async fn forwarding_never_undoes_a_claim_or_a_resolution_that_reached_the_store_first() {
    let dir = tempfile::tempdir().unwrap();
    let spool = open(dir.path());
    let store = MemoryStore::new();
    let earlier = SystemTime::now() - Duration::from_secs(120);
    let now = SystemTime::now();
    // "claimed": in the store and claimed by a scheduler since; "resolved": delivered since.
    store
        .put_many(vec![
            record("claimed", earlier),
            record("resolved", earlier),
        ])
        .await
        .unwrap();
    let claimed = store
        .claim_due(now + Duration::from_secs(3600), 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let resolved = claimed
        .iter()
        .find(|r| r.id == "resolved")
        .unwrap()
        .lease()
        .unwrap();
    store
        .change_claimed(&resolved, Change::Resolved { at: now })
        .await
        .unwrap();
    // "newer": the store has a later failure than the spooled one.
    store
        .put(record("newer", now + Duration::from_secs(1)))
        .await
        .unwrap();
    // "claim-lost": a re-send's failure spooled under a claim that has since passed on;
    // "emptied": a re-send's failure under a claim, of a record the store lost (a store
    // that came back empty).
    let stale = Lease::new("claim-lost", 0, now + Duration::from_secs(60));
    store.put(record("claim-lost", earlier)).await.unwrap();
    let gone = Lease::new("emptied", 1, now + Duration::from_secs(60));
    for (id, lease) in [
        ("claimed", None),
        ("resolved", None),
        ("newer", None),
        ("claim-lost", Some(stale)),
        ("emptied", Some(gone)),
    ] {
        spool.put(record(id, now), lease).await.unwrap();
    }
    let done = spool
        .forward_once(&store, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!((done.written, done.superseded), (1, 4), "{done:?}");
    assert_eq!(
        store.get("claimed").await.unwrap().unwrap().status,
        Status::InFlight
    );
    assert_eq!(
        store.get("resolved").await.unwrap().unwrap().status,
        Status::Resolved
    );
    let newer = store.get("newer").await.unwrap().unwrap();
    assert_eq!(
        newer.last_failed_at,
        tower_backstop::store::truncate(now + Duration::from_secs(1))
    );
    assert_eq!(newer.attempts, 1);
    assert_eq!(
        store
            .get("claim-lost")
            .await
            .unwrap()
            .unwrap()
            .last_failed_at,
        tower_backstop::store::truncate(earlier)
    );
    assert_eq!(
        store.get("emptied").await.unwrap().unwrap().status,
        Status::Deferred
    );
    assert_eq!(spool.state().records, 0);
}

#[test]
fn a_process_restarted_during_the_outage_forwards_what_its_spool_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Switch::new();
    store.down();
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    // The first process: its runtime, and with it the forwarder and the spool's lock, end.
    paused().block_on(async {
        let (spool, told) = (open(dir.path()), Told::default());
        for key in ["m-1", "m-2", "m-3"] {
            call(&store, &spool, &told, key, Scripted::always(status(400))).await;
        }
        assert_eq!(spool.state().records, 3);
    });
    store.up();
    // A new process: the spool opened on the same file, a layer made inside its runtime.
    paused().block_on(async {
        let spool = open(dir.path());
        assert_eq!(spool.state().records, 3);
        let _svc = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(store.0.clone()).spool(spool.clone()))
            .service(Scripted::always(status(200)));
        drained(&spool).await;
        for key in ["m-1", "m-2", "m-3"] {
            assert_eq!(
                store.inner().get(key).await.unwrap().unwrap().status,
                Status::Dead
            );
        }
    });
}

#[tokio::test(start_paused = true)]
async fn a_spool_on_a_read_only_disk_refuses_and_the_caller_is_told_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let (store, spool, told) = (Switch::new(), Spool::open(&path).unwrap(), Told::default());
    // A read-only file and write-ahead log, for root too (`chattr +i`); `chmod` otherwise.
    let files = [path.clone(), dir.path().join("spool.db-wal")];
    let immutable = std::process::Command::new("chattr")
        .arg("+i")
        .args(&files)
        .status();
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    if !immutable.is_ok_and(|s| s.success()) {
        assert!(
            !is_root,
            "chattr is needed to make a file read-only for root (e2fsprogs)"
        );
        for file in &files {
            let mut perms = std::fs::metadata(file).unwrap().permissions();
            perms.set_readonly(true);
            std::fs::set_permissions(file, perms).unwrap();
        }
    }
    store.down();
    let failure = call(&store, &spool, &told, "m-1", Scripted::always(status(400))).await;
    let _ = std::process::Command::new("chattr")
        .arg("-i")
        .args(&files)
        .status();
    let Some(DeadLetterStatus::NotStored { error, .. }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let text = error.to_string();
    assert!(
        text.starts_with("the store is down; the local spool did not take it either: spool "),
        "{text}"
    );
    assert_eq!(told.outcomes(), ["refused"]);
}

/// The recorder's gauges and counters by `name{label=value}`, from one snapshot (a snapshot
/// takes the values: the next one has only what changed since).
fn metrics_now(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> std::collections::BTreeMap<String, f64> {
    use metrics_util::debugging::DebugValue;
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, value)| {
            let k = k.key();
            let labels: Vec<String> = k
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let key = format!("{}{{{}}}", k.name(), labels.join(","));
            #[allow(clippy::cast_precision_loss)]
            match value {
                DebugValue::Gauge(v) => Some((key, v.0)),
                DebugValue::Counter(n) => Some((key, n as f64)),
                DebugValue::Histogram(_) => None,
            }
        })
        .collect()
}

/// Rows in the spool's file, read past the spool: the ground truth of its gauges.
fn rows(path: &Path) -> f64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM spool", [], |row| row.get::<_, f64>(0))
        .unwrap()
}

#[test]
fn the_spool_metrics_agree_with_its_file_and_the_store() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let store = Switch::new();
                let spool = Spool::open(&path).unwrap().with_max_bytes(3_000);
                let metrics = tower_backstop::observe::Metrics::new();
                let svc = ServiceBuilder::new()
                    .layer(
                        DeadLetterLayer::new(store.0.clone())
                            .spool(spool.clone())
                            .listener(metrics),
                    )
                    .layer(ClassifyLayer::http())
                    .service(Scripted::always(status(400)));
                store.down();
                // Until the spool is full: the cap holds a few records of this size.
                let mut refused = 0.0;
                for n in 0..20 {
                    let failure = svc
                        .clone()
                        .oneshot(post_with_key(
                            "http://mail.test/",
                            "{\"to\":\"a@b\"}",
                            &format!("m-{n}"),
                        ))
                        .await
                        .unwrap_err();
                    if matches!(
                        failure.note::<DeadLetterStatus>(),
                        Some(DeadLetterStatus::NotStored { .. })
                    ) {
                        refused += 1.0;
                    }
                }
                let held = rows(&path);
                assert!(
                    held >= 2.0 && refused >= 1.0,
                    "{held} held, {refused} refused"
                );
                let m = metrics_now(&snapshotter);
                assert_eq!(m["backstop_spool_records{}"], held);
                assert_eq!(m["backstop_store_up{}"], 0.0);
                let bytes = m["backstop_spool_bytes{}"];
                assert!(bytes > 0.0 && bytes <= 3_000.0, "{bytes}");
                assert_eq!(m["backstop_spool_records_total{outcome=spooled}"], held);
                assert_eq!(m["backstop_spool_records_total{outcome=refused}"], refused);
                store.up();
                drained(&spool).await;
                let in_store = store
                    .inner()
                    .search(&Filter::new(), 0..usize::MAX)
                    .await
                    .unwrap()
                    .len();
                assert_eq!(in_store as f64, held);
                assert_eq!(rows(&path), 0.0);
                let m = metrics_now(&snapshotter);
                assert_eq!(m["backstop_spool_records{}"], 0.0);
                assert_eq!(m["backstop_spool_bytes{}"], 0.0);
                assert_eq!(m["backstop_store_up{}"], 1.0);
                assert_eq!(m["backstop_spool_records_total{outcome=forwarded}"], held);
            });
    });
}

#[tokio::test(start_paused = true)]
async fn the_presets_health_reports_its_spool() {
    let dir = tempfile::tempdir().unwrap();
    let (store, spool) = (Switch::new(), open(dir.path()));
    let backstop = tower_backstop::BackstopLayer::http(Duration::from_secs(2))
        .dead_letters(DeadLetterLayer::new(store.0.clone()).spool(spool.clone()));
    let health = backstop.health();
    let svc = ServiceBuilder::new()
        .layer(backstop)
        .service(Scripted::always(status(400)));
    store.down();
    let _ = svc
        .oneshot(post_with_key("http://mail.test/", "{}", "m-1"))
        .await;
    let report = health.report();
    let spooled = report.spool.unwrap();
    assert_eq!((spooled.records, spooled.store_up), (1, false));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["spool"]["records"], 1);
    assert!(report.healthy);
    store.up();
    drained(&spool).await;
    let spooled = health.report().spool.unwrap();
    assert_eq!(
        (spooled.records, spooled.bytes, spooled.store_up),
        (0, 0, true)
    );
}
