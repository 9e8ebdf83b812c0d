//! Write-ahead and the outbox: a request stored before its first attempt (resolved on success,
//! its failure written under its claim, taken over by a scheduler when the call dies), and a
//! request put in the store to be sent later, with Postgres inside the caller's transaction.
//! The SIGKILL test of a real process is tests/write_ahead_kill.rs.

mod postgres_support;
mod redis_support;
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backstop_test_support::Tests;
use support::outage::as_string_request;
use support::{Scripted, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::Clock;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, QUEUED};
use tower_backstop::observe::Event;
use tower_backstop::resend::Scheduler;
use tower_backstop::retry::{Backoff, Jitter, RetryPolicy};
use tower_backstop::store::{Filter, MemoryStore, Status, Store};

const URI: &str = "http://mail.test/v1/messages";

/// DeadLetter(write-ahead, `lease`) → Retry(`attempts`, constant `backoff`) → Classify over
/// `upstream`, on the tokio clock.
fn stack(
    store: &Arc<dyn Store>,
    lease: Duration,
    attempts: u32,
    backoff: Duration,
    upstream: Scripted,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<()>,
    Error = tower_backstop::Failure<http::Response<()>>,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    ServiceBuilder::new()
        .layer(
            DeadLetterLayer::from_arc(Arc::clone(store))
                .clock(Clock::tokio())
                .write_ahead_lease(lease),
        )
        .layer(
            RetryPolicy::new()
                .max_attempts(attempts)
                .backoff(Backoff::constant(backoff).jitter(Jitter::None))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(upstream)
}

/// While the call is out the request is in the store, claimed and queued (no attempt, no
/// failure); once it succeeds, the record is resolved, and still no failure.
async fn a_call_that_succeeds_is_stored_first_then_resolved() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::always(support::Step::After(
        Duration::from_secs(2),
        Box::new(status(202)),
    ));
    let svc = stack(
        &store,
        Duration::from_secs(10),
        3,
        Duration::from_secs(1),
        upstream.clone(),
    );
    let start = Clock::tokio().now();
    let call = tokio::spawn(svc.oneshot(post_with_key(URI, "{\"n\":1}", "wa-ok")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(upstream.calls(), 1, "the call went out after the write");
    let during = store
        .get("wa-ok")
        .await
        .unwrap()
        .expect("stored before the attempt");
    assert_eq!(during.status, Status::InFlight);
    assert_eq!(
        (during.class.as_str(), during.code.as_str()),
        (QUEUED, "write-ahead")
    );
    assert_eq!((during.attempts, during.history.len()), (0, 0));
    assert_eq!(during.payload, b"{\"n\":1}");
    assert_eq!(during.metadata.get("uri").map(String::as_str), Some(URI));
    // The layer's clock is anchored a few microseconds of real time before this one.
    let until = during.retry_at.unwrap().duration_since(start).unwrap();
    assert!(
        until >= Duration::from_millis(9_990) && until <= Duration::from_secs(10),
        "the lease's end: {until:?}"
    );
    // Counted as waiting to be sent, never as a dead letter.
    let counts = store.counts(UNIX_EPOCH).await.unwrap();
    assert_eq!((counts.total, counts.deferred), (0, 1));

    let response = call.await.unwrap().expect("delivered");
    assert_eq!(response.status(), 202);
    let after = store.get("wa-ok").await.unwrap().unwrap();
    assert_eq!(after.status, Status::Resolved);
    assert_eq!(
        (after.attempts, after.history.len(), after.resends),
        (0, 0, 0)
    );
    assert_eq!(after.retry_at, None);
    assert_eq!(store.counts(UNIX_EPOCH).await.unwrap().deferred, 0);
}

/// A call that fails every attempt leaves one record, written under its write-ahead claim: the
/// failure's class and attempts, with the same generated id when the request has no key.
async fn a_call_that_fails_is_written_under_its_claim() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::always(status(503));
    let svc = stack(
        &store,
        Duration::from_secs(10),
        3,
        Duration::from_millis(100),
        upstream.clone(),
    );
    let failure = svc
        .clone()
        .oneshot(post_with_key(URI, "{\"n\":2}", "wa-fail"))
        .await
        .unwrap_err();
    assert!(
        matches!(failure.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "wa-fail"),
        "{:?}",
        failure.note::<DeadLetterStatus>()
    );
    let r = store.get("wa-fail").await.unwrap().unwrap();
    assert_eq!(r.status, Status::Dead);
    assert_eq!(
        (r.class.as_str(), r.code.as_str()),
        ("transient", "http 503")
    );
    assert_eq!((r.attempts, r.history.len()), (3, 1));
    assert_eq!(r.payload, b"{\"n\":2}");

    // No key: the write-ahead record's generated id is the failure's record too.
    let unkeyed = http::Request::post(URI)
        .body("{\"n\":3}".to_owned())
        .unwrap();
    let failure = svc.oneshot(unkeyed).await.unwrap_err();
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("{:?}", failure.note::<DeadLetterStatus>());
    };
    let all = store.search(&Filter::new(), 0..10).await.unwrap();
    assert_eq!(all.len(), 2, "one record per message: {all:?}");
    let r = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.attempts, r.payload.as_slice()),
        (Status::Dead, 3, &b"{\"n\":3}"[..])
    );
    assert_eq!(upstream.calls(), 6);
}

/// A call that sleeps in backoff far longer than its lease keeps its claim (renewed), and when
/// it dies there (its task stopped, as a killed process's), a scheduler takes the request over
/// after the lease and delivers it once.
async fn a_call_that_dies_in_backoff_is_taken_over_by_a_scheduler() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Clock::tokio();
    let upstream = Scripted::new([status(503)], status(202));
    let lease = Duration::from_secs(3);
    let svc = stack(&store, lease, 3, Duration::from_secs(60), upstream.clone());
    let call = tokio::spawn(
        svc.clone()
            .oneshot(post_with_key(URI, "{\"n\":4}", "wa-die")),
    );
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    assert_eq!(upstream.calls(), 1, "in backoff after the first attempt");
    let r = store.get("wa-die").await.unwrap().unwrap();
    assert_eq!(r.status, Status::InFlight);
    let lease_end = r.retry_at.unwrap();
    assert!(lease_end > clock.now(), "renewed while in backoff: {r:?}");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    let left = lease_end.duration_since(clock.now()).unwrap();

    // A scheduler over the same stack (write-ahead on: its re-sends write nothing ahead).
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(left - Duration::from_millis(50)).await;
    assert_eq!(upstream.calls(), 1, "not taken over before the lease ends");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        upstream.calls(),
        2,
        "taken over within a poll of the lease's end"
    );
    let seen = upstream.seen();
    assert_eq!(seen[1].key.as_deref(), Some("wa-die"));
    assert_eq!(seen[1].body, "{\"n\":4}");
    let r = store.get("wa-die").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 1));
    assert!(r.resolved_at.unwrap() >= lease_end);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(upstream.calls(), 2, "delivered exactly once");
    scheduler.shutdown().await;
}

/// A store that cannot be written does not stop the call: it goes out, the listener hears of
/// the failed write-ahead.
async fn a_store_that_cannot_be_written_does_not_stop_the_call() {
    let memory = MemoryStore::new();
    memory.close();
    let store: Arc<dyn Store> = Arc::new(memory);
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let heard = Arc::clone(&events);
    let upstream = Scripted::always(status(202));
    let svc = ServiceBuilder::new()
        .layer(
            DeadLetterLayer::from_arc(store)
                .write_ahead()
                .listener(move |e: &Event<'_>| {
                    if let Event::StoreError { operation, id, .. } = e {
                        heard.lock().unwrap().push(format!("{operation} {id:?}"));
                    }
                }),
        )
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let response = svc
        .oneshot(post_with_key(URI, "{}", "wa-down"))
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(upstream.calls(), 1);
    assert_eq!(*events.lock().unwrap(), ["write_ahead Some(\"wa-down\")"]);
}

/// Without write-ahead, a call that succeeds writes nothing.
async fn without_write_ahead_a_success_writes_nothing() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(202)));
    svc.oneshot(post_with_key(URI, "{}", "plain"))
        .await
        .unwrap();
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The preset with a write-ahead store stacks the two layers apart and writes ahead: the
/// record is resolved after a success, and a failure is the one record, under its claim.
async fn the_preset_writes_ahead_when_its_store_does() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::new([status(202)], status(400));
    let svc = ServiceBuilder::new()
        .layer(
            tower_backstop::BackstopLayer::http(Duration::from_secs(2)).dead_letters(
                DeadLetterLayer::from_arc(Arc::clone(&store))
                    .clock(Clock::tokio())
                    .write_ahead(),
            ),
        )
        .service(upstream.clone());
    svc.clone()
        .oneshot(post_with_key(URI, "{}", "preset-ok"))
        .await
        .unwrap();
    let r = store
        .get("preset-ok")
        .await
        .unwrap()
        .expect("written ahead");
    assert_eq!((r.status, r.class.as_str()), (Status::Resolved, QUEUED));
    svc.oneshot(post_with_key(URI, "{}", "preset-400"))
        .await
        .unwrap_err();
    let r = store.get("preset-400").await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.class.as_str(), r.attempts),
        (Status::Dead, "permanent", 1)
    );
    assert_eq!(upstream.calls(), 2);
}

/// An outbox request waits, deferred (not a dead letter), until its time; the scheduler sends
/// it then, once, and resolves it.
async fn an_outbox_request_is_sent_at_its_time_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Clock::tokio();
    let upstream = Scripted::always(status(202));
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let at = clock.now() + Duration::from_secs(60);
    let outbox = layer.outbox();
    let request = post_with_key(URI, "{\"n\":5}", "ob-1");
    let id = outbox.send_later(request, Some(at)).await.unwrap();
    assert_eq!(id, "ob-1");
    let r = store.get("ob-1").await.unwrap().unwrap();
    assert_eq!(r.status, Status::Deferred);
    assert_eq!((r.class.as_str(), r.code.as_str()), (QUEUED, "outbox"));
    assert_eq!((r.attempts, r.history.len()), (0, 0));
    assert_eq!(r.retry_at, Some(tower_backstop::store::truncate(at)));
    let counts = store.counts(UNIX_EPOCH).await.unwrap();
    assert_eq!((counts.total, counts.deferred), (0, 1), "waiting, not dead");
    assert!(counts.by_class.is_empty());

    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(upstream.calls(), 0, "not before its time");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(upstream.calls(), 1);
    let seen = &upstream.seen()[0];
    assert_eq!(
        (seen.key.as_deref(), seen.body.as_str()),
        (Some("ob-1"), "{\"n\":5}")
    );
    assert_eq!(seen.method, http::Method::POST);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(upstream.calls(), 1, "once");
    let r = store.get("ob-1").await.unwrap().unwrap();
    assert_eq!(r.status, Status::Resolved);
    scheduler.shutdown().await;
}

/// Without a time, the outbox request is due at once; the secret headers are not stored.
async fn an_outbox_request_without_a_time_is_due_now_and_redacted() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let outbox = tower_backstop::dead_letter::Outbox::from_arc(Arc::clone(&store));
    let request = http::Request::post(URI)
        .header("authorization", "Bearer secret")
        .body("{\"n\":6}".to_owned())
        .unwrap();
    let before = SystemTime::now();
    let id = outbox.send_later(request, None).await.unwrap();
    assert!(id.starts_with("msg-"), "{id}");
    let r = store.get(&id).await.unwrap().unwrap();
    assert_eq!(r.status, Status::Deferred);
    let at = r.retry_at.unwrap();
    assert!(at >= tower_backstop::store::truncate(before) && at <= SystemTime::now());
    assert_eq!(r.redacted_headers, ["authorization"]);
    assert!(!r.headers.iter().any(|(name, _)| name == "authorization"));
    assert_eq!(
        store
            .claim_due(SystemTime::now(), 10, Duration::from_secs(10))
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A payload longer than the limit is refused with the reason, and nothing is written.
async fn an_outbox_request_too_long_to_store_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let outbox = DeadLetterLayer::from_arc(Arc::clone(&store))
        .max_payload(8)
        .outbox();
    let e = outbox
        .send_later(post_with_key(URI, "{\"n\":\"too long\"}", "ob-long"), None)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("\"ob-long\"") && text.contains("payload limit of 8 bytes"),
        "{text}"
    );
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// In every store, a write-ahead record whose call died is held until its lease ends, is due
/// then ([`Store::next_due`]), and a scheduler's claim takes it, with its payload; while the
/// call lives, its renewals keep it held. Real stores on a real clock: no sleep, the claims are
/// asked about a time ahead.
async fn write_ahead_record_is_taken_over_after_its_lease(store: Arc<dyn Store>) {
    let lease = Duration::from_secs(10);
    let upstream = Scripted::always(support::Step::After(
        Duration::from_secs(3600),
        Box::new(status(202)),
    ));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).write_ahead())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let started = SystemTime::now();
    let call = tokio::spawn(svc.oneshot(post_with_key(URI, "{\"n\":7}", "wa-store")));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while upstream.calls() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never went out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    call.abort();
    let _ = call.await;
    let r = store.get("wa-store").await.unwrap().expect("stored ahead");
    assert_eq!(
        (r.status, r.class.as_str(), r.attempts),
        (Status::InFlight, QUEUED, 0)
    );
    let until = r.retry_at.unwrap();
    assert!(
        until >= tower_backstop::store::truncate(started + lease),
        "{r:?}"
    );
    assert_eq!(store.next_due().await.unwrap(), Some(until));
    let now = SystemTime::now();
    assert!(
        store.claim_due(now, 10, lease).await.unwrap().is_empty(),
        "held"
    );
    assert_eq!(
        store.counts(UNIX_EPOCH).await.unwrap().total,
        0,
        "no dead letter"
    );
    let taken = store.claim_due(until, 10, lease).await.unwrap();
    assert_eq!(taken.len(), 1, "due at the lease's end");
    assert_eq!(
        (taken[0].resends, taken[0].payload.as_slice()),
        (1, &b"{\"n\":7}"[..])
    );
}

async fn write_ahead_takeover_memory() {
    write_ahead_record_is_taken_over_after_its_lease(Arc::new(MemoryStore::new())).await;
}

async fn write_ahead_takeover_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = tower_backstop::store::SqliteStore::open(dir.path().join("wa.db")).unwrap();
    write_ahead_record_is_taken_over_after_its_lease(Arc::new(store)).await;
}

#[cfg(feature = "redis")]
async fn write_ahead_takeover_redis() {
    let store = redis_support::redis_store("write_ahead_takeover").await;
    write_ahead_record_is_taken_over_after_its_lease(Arc::new(store.clone())).await;
    store
        .delete(&tower_backstop::store::Filter::new().id("wa-store"))
        .await
        .unwrap();
}

#[cfg(feature = "postgres")]
async fn write_ahead_takeover_postgres() {
    let store = postgres_support::postgres_store("write_ahead_takeover").await;
    write_ahead_record_is_taken_over_after_its_lease(Arc::new(store.clone())).await;
    sqlx::query(&format!("DROP SCHEMA {} CASCADE", store.schema()))
        .execute(store.pool())
        .await
        .unwrap();
}

/// An error type for the Postgres test's own statements.
#[cfg(feature = "postgres")]
type TestResult = Result<(), tower_backstop::BoxError>;

/// The business row and the outbox record commit together; a rolled-back transaction leaves
/// neither; the committed one is sent by a scheduler.
#[cfg(feature = "postgres")]
async fn postgres_outbox_commits_and_rolls_back_with_the_business_row() -> TestResult {
    let store = postgres_support::postgres_store("outbox_tx").await;
    let table = format!("{}.orders", store.schema());
    sqlx::query(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, total_cents bigint)"
    ))
    .execute(store.pool())
    .await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let outbox = DeadLetterLayer::from_arc(Arc::clone(&shared)).outbox();
    let order = |n: i64| post_with_key(URI, &format!("{{\"order\":{n}}}"), &format!("order-{n}"));

    // Rolled back: neither the order nor its request.
    let mut tx = store.pool().begin().await?;
    sqlx::query(&format!("INSERT INTO {table} VALUES (1, 1999)"))
        .execute(&mut *tx)
        .await?;
    let record = outbox.record(order(1), None).await?;
    store.put_in(&mut tx, vec![record]).await?;
    tx.rollback().await?;
    let orders: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(store.pool())
        .await?;
    assert_eq!(orders, 0);
    assert_eq!(shared.get("order-1").await?, None);

    // Committed: both, and invisible to others until then.
    let mut tx = store.pool().begin().await?;
    sqlx::query(&format!("INSERT INTO {table} VALUES (2, 2999)"))
        .execute(&mut *tx)
        .await?;
    let record = outbox.record(order(2), None).await?;
    store.put_in(&mut tx, vec![record]).await?;
    assert_eq!(
        shared.get("order-2").await?,
        None,
        "not visible before the commit"
    );
    tx.commit().await?;
    let orders: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(store.pool())
        .await?;
    assert_eq!(orders, 1);
    let r = shared.get("order-2").await?.unwrap();
    assert_eq!((r.status, r.class.as_str()), (Status::Deferred, QUEUED));

    // A failed statement in the transaction aborts it: the record is not written either.
    let mut tx = store.pool().begin().await?;
    let record = outbox.record(order(3), None).await?;
    store.put_in(&mut tx, vec![record]).await?;
    let dup = sqlx::query(&format!("INSERT INTO {table} VALUES (2, 1)"))
        .execute(&mut *tx)
        .await;
    assert!(dup.is_err(), "a duplicate order id");
    assert!(tx.commit().await.is_err() || shared.get("order-3").await?.is_none());
    assert_eq!(shared.get("order-3").await?, None);

    // The scheduler sends the committed one, once.
    let upstream = Scripted::always(status(202));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&shared)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let scheduler = Scheduler::new(Arc::clone(&shared), svc, as_string_request)
        .poll_every(Duration::from_millis(50))
        .spawn();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while shared.get("order-2").await?.unwrap().status != Status::Resolved {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not sent within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scheduler.shutdown().await;
    assert_eq!(upstream.calls(), 1);
    assert_eq!(upstream.seen()[0].key.as_deref(), Some("order-2"));
    sqlx::query(&format!("DROP SCHEMA {} CASCADE", store.schema()))
        .execute(store.pool())
        .await?;
    Ok(())
}

fn main() {
    let mut tests = Tests::new();
    tests.paused(
        "a_call_that_succeeds_is_stored_first_then_resolved",
        a_call_that_succeeds_is_stored_first_then_resolved,
    );
    tests.paused(
        "a_call_that_fails_is_written_under_its_claim",
        a_call_that_fails_is_written_under_its_claim,
    );
    tests.paused(
        "a_call_that_dies_in_backoff_is_taken_over_by_a_scheduler",
        a_call_that_dies_in_backoff_is_taken_over_by_a_scheduler,
    );
    tests.paused(
        "a_store_that_cannot_be_written_does_not_stop_the_call",
        a_store_that_cannot_be_written_does_not_stop_the_call,
    );
    tests.paused(
        "without_write_ahead_a_success_writes_nothing",
        without_write_ahead_a_success_writes_nothing,
    );
    tests.paused(
        "the_preset_writes_ahead_when_its_store_does",
        the_preset_writes_ahead_when_its_store_does,
    );
    tests.paused(
        "an_outbox_request_is_sent_at_its_time_once",
        an_outbox_request_is_sent_at_its_time_once,
    );
    tests.current(
        "an_outbox_request_without_a_time_is_due_now_and_redacted",
        an_outbox_request_without_a_time_is_due_now_and_redacted,
    );
    tests.current(
        "an_outbox_request_too_long_to_store_is_refused",
        an_outbox_request_too_long_to_store_is_refused,
    );
    tests.current("write_ahead_takeover_memory", write_ahead_takeover_memory);
    tests.current("write_ahead_takeover_sqlite", write_ahead_takeover_sqlite);
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::Redis)
        .current("write_ahead_takeover_redis", write_ahead_takeover_redis);
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::Postgres)
        .current(
            "write_ahead_takeover_postgres",
            write_ahead_takeover_postgres,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::Postgres)
        .current(
            "postgres_outbox_commits_and_rolls_back_with_the_business_row",
            || async {
                postgres_outbox_commits_and_rolls_back_with_the_business_row()
                    .await
                    .unwrap();
            },
        );
    tests.run();
}
