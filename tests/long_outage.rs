//! A long outage ends delivered, by itself: the scheduler paces its re-sends by the stack's
//! breaker (one probe per half-open period, nothing sent while it is open, a local rejection
//! never a re-send), every record keeps the provider's refusal as its root cause, and the
//! backlog drains exactly once after recovery, with one scheduler or two, and through a store
//! that fails for a while. On tokio's paused clock, with an in-process provider.

mod postgres_support;
mod redis_support;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backstop_test_support::{Fault, FaultyStore, Op, Tests};
use bytes::Bytes;
use http_body_util::Full;
use support::outage::{
    OPEN_FOR, Provider, URI, as_string_request, send_all, stack, stack_opening_for,
};
use tower_backstop::breaker::State;
use tower_backstop::dead_letter::record_of;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::store::{Change, Filter, MemoryStore, Record, SqliteStore, Status, Store};
use tower_backstop::{Class, Clock, Code, Envelope, Failure};

async fn statuses(store: &dyn Store) -> HashMap<Status, usize> {
    let mut out = HashMap::new();
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        *out.entry(r.status).or_default() += 1;
    }
    out
}

/// A record of a request to [`URI`] keyed `id`, deferred to `at`, that `breaker` rejected.
fn deferred(id: &str, breaker: &str, at: SystemTime) -> Record {
    let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
    let mut r = record_of(
        id.to_owned(),
        Envelope::new("{}")
            .with_metadata("method", "POST")
            .with_metadata("uri", URI)
            .with_metadata("idempotency-key", id),
        &f,
    );
    r.status = Status::Deferred;
    r.retry_at = Some(at);
    r.breaker = Some(breaker.to_owned());
    r
}

/// The newcomer's case, longer: the provider refuses connections for a minute (twelve open
/// periods), then recovers.
async fn a_long_outage_ends_with_every_message_delivered_once_and_one_probe_per_half_open() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = Provider::default();
    provider.down(true);
    let (svc, breaker) = stack(&store, &provider, clock);

    // The first message's two refusals open the breaker; its third attempt and the 29 other
    // messages are rejected locally and deferred to the half-open time.
    send_all(&svc, 30).await;
    assert_eq!(provider.requests(), 2);
    assert_eq!(breaker.state(), State::Open);
    let records = store.search(&Filter::new(), 0..usize::MAX).await.unwrap();
    assert_eq!(records.len(), 30);
    for r in &records {
        assert_eq!(
            (r.status, r.class.as_str()),
            (Status::Deferred, "circuit_open")
        );
        assert_eq!(r.breaker.as_deref(), Some("mail.test"), "{}", r.id);
        // The root cause: the refusals that opened the breaker, with their count.
        let cause = r.cause.as_ref().expect("a root cause");
        assert_eq!(
            (cause.class.as_str(), cause.code.as_str(), cause.attempts),
            ("transient", "io ConnectionRefused", 2),
            "{}",
            r.id
        );
        assert!(
            cause.message.contains("refused") && cause.message.contains("2 failures in"),
            "{}",
            cause.message
        );
        // Times are absolute: the message names the half-open instant, not a time left.
        assert!(r.message.contains("half-opens at 20"), "{}", r.message);
        assert!(!r.message.contains("half-opens in"), "{}", r.message);
    }

    // A scheduler that would dead-letter a record after 2 real re-sends.
    let scheduler = Scheduler::new(Arc::clone(&store), svc.clone(), as_string_request)
        .poll_every(Duration::from_millis(100))
        .concurrency(8)
        .rate(100)
        .max_resends(2)
        .clock(clock)
        .spawn();
    let half_opened_before = breaker.stats().half_opened;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let half_opened = breaker.stats().half_opened - half_opened_before;
    let probes = provider.requests() - 2;
    assert!(
        half_opened >= 10,
        "twelve open periods of 5 s in a minute: {half_opened}"
    );
    assert!(probes >= 1, "the scheduler probes the provider");
    assert!(
        probes as u64 <= half_opened,
        "at most one scheduler send per half-open period: {probes} sends, {half_opened} periods"
    );
    // Nothing died of the outage: local rejections are not re-sends.
    let during = statuses(&*store).await;
    assert_eq!(during.get(&Status::Dead), None, "{during:?}");
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        assert!(r.resends <= 2, "{}: {} re-sends", r.id, r.resends);
        assert_eq!(
            r.cause.as_ref().map(|c| c.code.as_str()),
            Some("io ConnectionRefused"),
            "{}",
            r.id
        );
    }

    // Recovery: the next probe closes the breaker and the backlog drains, once each.
    provider.down(false);
    tokio::time::sleep(Duration::from_secs(30)).await;
    scheduler.shutdown().await;
    assert_eq!(breaker.state(), State::Closed);
    let after = statuses(&*store).await;
    assert_eq!(after.get(&Status::Resolved), Some(&30), "{after:?}");
    let effects = provider.effects();
    assert_eq!(effects.len(), 30);
    assert!(effects.values().all(|&n| n == 1));
    // Each record was delivered by one real send after the recovery.
    let delivering = provider.requests() - 2 - probes;
    assert_eq!(delivering, 30, "one send per message after the recovery");
}

/// While the breaker is open the scheduler sends nothing at all: a record whose breaker it
/// knows to be open is put back, deferred to the half-open time, at no re-send.
async fn nothing_is_sent_while_the_breaker_is_open_and_a_held_record_costs_no_resend() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = Provider::default();
    provider.down(true);
    let (svc, breaker) = stack(&store, &provider, clock);
    send_all(&svc, 10).await;
    let rejected_before = breaker.stats().rejected;
    let scheduler = Scheduler::new(Arc::clone(&store), svc.clone(), as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    // Half the first open period: nothing is due, nothing is sent.
    tokio::time::sleep(OPEN_FOR / 2).await;
    assert_eq!(provider.requests(), 2);
    // Past the half-open instant: one probe, which fails and re-opens the breaker.
    tokio::time::sleep(OPEN_FOR).await;
    assert_eq!(provider.requests(), 3, "one probe");
    assert_eq!(breaker.state(), State::Open);
    // The others were not even tried: the breaker rejected only the probe's own retry
    // (without the pacing, every record of the batch).
    assert_eq!(breaker.stats().rejected - rejected_before, 1);
    let records = store.search(&Filter::new(), 0..usize::MAX).await.unwrap();
    let tried = records.iter().filter(|r| r.history.len() > 1).count();
    assert_eq!(
        tried, 1,
        "only the probe has a second failure in its history"
    );
    for r in records {
        assert_eq!(r.status, Status::Deferred, "{}", r.id);
        assert_eq!(
            r.resends, 0,
            "{}: nothing was re-sent for it but a probe",
            r.id
        );
        let next = r.retry_at.unwrap();
        assert!(
            next > clock.now(),
            "{}: held to a half-open time to come",
            r.id
        );
    }
    scheduler.shutdown().await;
}

/// A record names a breaker the stack no longer has (the process restarted, or the key was
/// evicted): it is not known to be open, so it is sent, once.
async fn a_record_whose_breaker_is_gone_is_sent_once() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = Provider::default();
    let (svc, _) = stack(&store, &provider, clock);
    store
        .put(deferred("m-gone", "gone.test:443", clock.now()))
        .await
        .unwrap();
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(2)).await;
    scheduler.shutdown().await;
    assert_eq!(provider.requests(), 1);
    let r = store.get("m-gone").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 1));
}

/// One destination's backlog does not delay another's: ten records of a breaker whose probe is
/// still out are held batch after batch, and the record behind them, of another breaker, is
/// sent in the same poll, not ten polls later.
async fn a_held_backlog_does_not_delay_another_breakers_records() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let t0 = clock.now();
    for i in 0..10 {
        let at = t0 + Duration::from_millis(i);
        store
            .put(deferred(&format!("a-{i}"), "a.test:443", at))
            .await
            .unwrap();
    }
    store
        .put(deferred(
            "b-0",
            "b.test:443",
            t0 + Duration::from_millis(10),
        ))
        .await
        .unwrap();
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&sent);
    // Destination a takes a minute to answer its probe; b answers at once.
    let svc = tower::service_fn(move |req: http::Request<String>| {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        log.lock().unwrap().push(key.clone());
        async move {
            if key.starts_with("a-") {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok::<_, Failure<http::Response<()>>>(http::Response::new(()))
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_secs(1))
        .concurrency(2)
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*sent.lock().unwrap(), ["a-0", "b-0"], "a's probe, then b");
    let b = store.get("b-0").await.unwrap().unwrap();
    assert_eq!(b.status, Status::Resolved, "b was not held behind a");
    scheduler.shutdown().await;
    // The probe answered: a's other records were then sent, each once.
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.iter().filter(|k| *k == "a-0").count(), 1, "{sent:?}");
}

/// Two processes, each with its own breaker and scheduler, share one SQLite store through an
/// outage and its recovery: every message is delivered, and no record is sent twice.
async fn two_schedulers_on_one_store_through_recovery_send_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("d.db")).unwrap());
    two_schedulers_through_recovery(store).await;
}

/// The same with two processes sharing a Redis store, on the real clock (on a paused one, tokio
/// moves the clock on while a Redis reply is on its way): breakers open for 300 ms, an outage of
/// 1.5 s.
#[cfg(feature = "redis")]
async fn two_schedulers_on_one_redis_store_through_recovery_send_each_record_once() {
    let store = redis_support::redis_store("long_outage_two").await;
    two_schedulers_on_the_real_clock(Arc::new(store)).await;
}

/// The same with a Postgres store (its pool's timeouts need the real clock too).
#[cfg(feature = "postgres")]
async fn two_schedulers_on_one_postgres_store_through_recovery_send_each_record_once() {
    let store = postgres_support::postgres_store("long_outage_two").await;
    two_schedulers_on_the_real_clock(Arc::new(store)).await;
}

/// Two processes on `store` through a 1.5 s outage, on the real clock, breakers open for 300 ms.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn two_schedulers_on_the_real_clock(store: Arc<dyn Store>) {
    let clock = Clock::system();
    let provider = Provider::default();
    provider.down(true);
    let open_for = Duration::from_millis(300);
    let (a, _) = stack_opening_for(&store, &provider, clock, open_for);
    let (b, _) = stack_opening_for(&store, &provider, clock, open_for);
    send_all(&a, 20).await;
    let spawn = |svc| {
        Scheduler::new(Arc::clone(&store), svc, as_string_request)
            .poll_every(Duration::from_millis(50))
            .rate(200)
            .clock(clock)
            .spawn()
    };
    let (sa, sb) = (spawn(a), spawn(b));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = provider.requests();
    provider.down(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while statuses(&*store).await.get(&Status::Resolved) != Some(&20)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sa.shutdown().await;
    sb.shutdown().await;
    assert_sent_once_after(&store, &provider, during).await;
}

async fn two_schedulers_through_recovery(store: Arc<dyn Store>) {
    let clock = Clock::tokio();
    let provider = Provider::default();
    provider.down(true);
    let (a, _) = stack(&store, &provider, clock);
    let (b, _) = stack(&store, &provider, clock);
    send_all(&a, 20).await;
    let spawn = |svc| {
        Scheduler::new(Arc::clone(&store), svc, as_string_request)
            .poll_every(Duration::from_millis(100))
            .clock(clock)
            .spawn()
    };
    let (sa, sb) = (spawn(a), spawn(b));
    tokio::time::sleep(Duration::from_secs(20)).await;
    let during = provider.requests();
    provider.down(false);
    tokio::time::sleep(Duration::from_secs(30)).await;
    sa.shutdown().await;
    sb.shutdown().await;
    assert_sent_once_after(&store, &provider, during).await;
}

/// Every one of the 20 records is resolved, and after the first `during` requests each was sent
/// exactly once.
async fn assert_sent_once_after(store: &Arc<dyn Store>, provider: &Provider, during: usize) {
    let after = statuses(&**store).await;
    assert_eq!(after.get(&Status::Resolved), Some(&20), "{after:?}");
    // After the recovery, each message was sent exactly once (keys are not even needed).
    let requests = provider.requests.lock().unwrap()[during..].to_vec();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for key in &requests {
        *per_key.entry(key).or_default() += 1;
    }
    assert_eq!(per_key.len(), 20, "{per_key:?}");
    assert!(per_key.values().all(|&n| n == 1), "{per_key:?}");
}

/// The store fails for 3 s in the middle of the drain: nothing is lost and every record ends
/// resolved. A re-send whose outcome could not be written is sent again, with its idempotency
/// key, when its claim ends: at most the re-sends in flight when the store failed.
async fn a_store_that_fails_during_the_drain_loses_nothing() {
    let clock = Clock::tokio();
    let inner = MemoryStore::new();
    let flaky = FaultyStore::new(Arc::new(inner.clone()));
    let store: Arc<dyn Store> = Arc::new(flaky.clone());
    let provider = Provider::default();
    provider.down(true);
    let (svc, _) = stack(&store, &provider, clock);
    send_all(&svc, 40).await;
    provider.down(false);
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .rate(10)
        .lease(Duration::from_secs(10))
        .clock(clock)
        .spawn();
    // The breaker half-opens at 5 s; the drain runs at 10 a second from then.
    tokio::time::sleep(OPEN_FOR + Duration::from_millis(1500)).await;
    let resolved_before = statuses(&inner).await.get(&Status::Resolved).copied();
    assert!(
        resolved_before.is_some_and(|n| n > 0 && n < 40),
        "mid-drain: {resolved_before:?}"
    );
    flaky.set(Fault::Fail);
    tokio::time::sleep(Duration::from_secs(3)).await;
    flaky.set(Fault::Answer);
    tokio::time::sleep(Duration::from_secs(60)).await;
    scheduler.shutdown().await;
    let after = statuses(&inner).await;
    assert_eq!(after.get(&Status::Resolved), Some(&40), "{after:?}");
    let effects = provider.effects();
    assert_eq!(effects.len(), 40, "every message delivered");
    let twice = effects.values().filter(|&&n| n == 2).count();
    assert!(effects.values().all(|&n| n <= 2), "{effects:?}");
    assert!(twice <= 8, "at most the 8 in flight: {twice}");
}

/// The newcomer's case, end to end: a webhook dispatcher (the preset, 4 attempts, SQLite, a
/// hyper-util client) posts 300 keyed events to four customers on 127.0.0.1, one of whose ports
/// refuses connections. Every record of that customer names the refused connections as its root
/// cause, whether it used up its attempts before the customer's breaker opened or was rejected
/// by it; the other customers' events are delivered; the scheduler then paces the down
/// customer's records by its breaker and none dies of local rejections.
async fn every_record_of_a_refusing_customer_names_the_refusals() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_backstop::BackstopLayer;
    use tower_backstop::retry::RetryPolicy;

    let mut targets = Vec::new();
    for _ in 0..3 {
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(|| async { axum::http::StatusCode::ACCEPTED }),
        );
        targets.push(format!("{}/hooks", support::serve(app).await));
    }
    // A port nothing listens on: bound, then closed.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    targets.push(format!("http://{down}/hooks"));

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("hooks.db")).unwrap());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = tower::ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(2))
                .retry(RetryPolicy::new().max_attempts(4).build().unwrap())
                .dead_letters(tower_backstop::dead_letter::DeadLetterLayer::from_arc(
                    store.clone(),
                )),
        )
        .service(client);
    let mut delivered = 0;
    for i in 0..300 {
        let req = http::Request::post(&targets[i % 4])
            .header("content-type", "application/json")
            .header("idempotency-key", format!("evt-{i:03}"))
            .body(Full::new(Bytes::from(format!("{{\"n\":{i}}}"))))
            .unwrap();
        if tower::ServiceExt::oneshot(svc.clone(), req).await.is_ok() {
            delivered += 1;
        }
    }
    assert_eq!(delivered, 225);
    let records = store.search(&Filter::new(), 0..usize::MAX).await.unwrap();
    assert_eq!(
        records.len(),
        75,
        "the down customer's events, and only those"
    );
    let key = format!("127.0.0.1:{}", down.port());
    for r in &records {
        let cause = r.cause.as_ref().expect("a root cause");
        assert_eq!(cause.code, "io ConnectionRefused", "{}: {cause:?}", r.id);
        if r.class == "circuit_open" {
            assert_eq!(r.status, Status::Deferred, "{}", r.id);
            assert_eq!(r.breaker.as_deref(), Some(key.as_str()), "{}", r.id);
            assert!(cause.message.contains("failures in"), "{}", cause.message);
            assert!(r.message.contains("half-opens at 20"), "{}", r.message);
        }
    }
    let rejected = records.iter().filter(|r| r.class == "circuit_open").count();
    assert!(rejected > 0, "the breaker opened");

    // A few seconds of the scheduler: the breaker half-opens (1 s, doubling), one probe goes out
    // per period, and no deferred record dies of it.
    let scheduler = Scheduler::new(Arc::clone(&store) as Arc<dyn Store>, svc, |r: &Record| {
        http_request(r, None)
    })
    .poll_every(Duration::from_millis(100))
    .spawn();
    tokio::time::sleep(Duration::from_secs(4)).await;
    scheduler.shutdown().await;
    let after = store.search(&Filter::new(), 0..usize::MAX).await.unwrap();
    let dead_by_rejection = after
        .iter()
        .filter(|r| r.status == Status::Dead && r.class == "circuit_open")
        .count();
    assert_eq!(dead_by_rejection, 0);
    assert!(after.iter().all(|r| r.resends <= 2), "a few probes at most");
}

/// An operator forces the breaker open: no half-open time is known, so the scheduler's records
/// are put back and looked at again every ten polls, none dies of it, and once the operator
/// resets the breaker they are delivered.
async fn a_breaker_forced_open_holds_the_records_without_killing_them() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = Provider::default();
    let (svc, breaker) = stack(&store, &provider, clock);
    provider.down(true);
    send_all(&svc, 5).await;
    provider.down(false);
    breaker.force_open();
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .max_resends(1)
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(provider.requests(), 2, "nothing reaches the provider");
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        assert_eq!(r.status, Status::Deferred, "{}: {}", r.id, r.message);
        assert_eq!(r.resends, 0, "{}", r.id);
        // Held a second (ten polls) at a time: a forced breaker names no half-open time.
        let next = r.retry_at.unwrap().duration_since(clock.now()).unwrap();
        assert!(next <= Duration::from_secs(1), "{}: {next:?}", r.id);
    }
    breaker.reset();
    tokio::time::sleep(Duration::from_secs(3)).await;
    scheduler.shutdown().await;
    let after = statuses(&*store).await;
    assert_eq!(after.get(&Status::Resolved), Some(&5), "{after:?}");
    assert!(provider.effects().values().all(|&n| n == 1));
}

/// A locally rejected re-send gives its claim back only if no one changed the record since it
/// was claimed: here, between the rejection and the give-back, an operator resolves it (it was
/// delivered by other means), or another scheduler claims it. Either change stands: the
/// resolved record is never sent again, the other claim is not taken away.
async fn a_rejected_re_send_never_undoes_someone_elses_change() {
    let resolved_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let (r, provider) = rejected_while(Change::Resolved { at: resolved_at }).await;
    assert_eq!(r.status, Status::Resolved, "{}", r.message);
    assert_eq!(r.resolved_at, Some(resolved_at));
    assert!(
        !provider.effects().contains_key(&r.id),
        "{}: resolved by an operator, never sent again",
        r.id
    );

    let until = SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000_000);
    let (r, _) = rejected_while(Change::Redriving { until }).await;
    assert_eq!(r.status, Status::InFlight, "{}", r.message);
    assert_eq!(r.retry_at, Some(until), "the other claim stands");
    assert_eq!(r.resends, 2, "ours and the other claim's");
}

/// Five records rejected by a forced-open breaker; the first one read back after its local
/// rejection is changed by `change` just before; the breaker is reset 30 s later. The changed
/// record as it ends, and the provider.
async fn rejected_while(change: Change) -> (Record, Provider) {
    let clock = Clock::tokio();
    let flaky = FaultyStore::new(Arc::new(MemoryStore::new()));
    let store: Arc<dyn Store> = Arc::new(flaky.clone());
    let provider = Provider::default();
    let (svc, breaker) = stack(&store, &provider, clock);
    provider.down(true);
    send_all(&svc, 5).await;
    provider.down(false);
    breaker.force_open();
    // Someone else changes a record just before the next read of one.
    let meddled = Arc::new(std::sync::Mutex::new(None::<String>));
    let (inner, noted) = (Arc::clone(flaky.inner()), Arc::clone(&meddled));
    flaky.before_next(Op::Get, move |id| {
        *noted.lock().unwrap() = Some(id.to_owned());
        let meddling = inner.update(id, change);
        Box::pin(async move {
            meddling.await.unwrap();
        })
    });
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(30)).await;
    breaker.reset();
    tokio::time::sleep(Duration::from_secs(3)).await;
    scheduler.shutdown().await;
    let id = meddled
        .lock()
        .unwrap()
        .clone()
        .expect("a record was read back");
    let after = statuses(&*store).await;
    assert_eq!(after.values().sum::<usize>(), 5, "{after:?}");
    (store.get(&id).await.unwrap().unwrap(), provider)
}

fn main() {
    let mut tests = Tests::new();
    tests.paused(
        "a_long_outage_ends_with_every_message_delivered_once_and_one_probe_per_half_open",
        a_long_outage_ends_with_every_message_delivered_once_and_one_probe_per_half_open,
    );
    tests.paused(
        "nothing_is_sent_while_the_breaker_is_open_and_a_held_record_costs_no_resend",
        nothing_is_sent_while_the_breaker_is_open_and_a_held_record_costs_no_resend,
    );
    tests.paused(
        "a_record_whose_breaker_is_gone_is_sent_once",
        a_record_whose_breaker_is_gone_is_sent_once,
    );
    tests.paused(
        "a_held_backlog_does_not_delay_another_breakers_records",
        a_held_backlog_does_not_delay_another_breakers_records,
    );
    tests.paused(
        "two_schedulers_on_one_store_through_recovery_send_each_record_once",
        two_schedulers_on_one_store_through_recovery_send_each_record_once,
    );
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::Redis)
        .multi_thread(
            "two_schedulers_on_one_redis_store_through_recovery_send_each_record_once",
            two_schedulers_on_one_redis_store_through_recovery_send_each_record_once,
        );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::Postgres)
        .multi_thread(
            "two_schedulers_on_one_postgres_store_through_recovery_send_each_record_once",
            two_schedulers_on_one_postgres_store_through_recovery_send_each_record_once,
        );
    tests.paused(
        "a_store_that_fails_during_the_drain_loses_nothing",
        a_store_that_fails_during_the_drain_loses_nothing,
    );
    tests.multi_thread(
        "every_record_of_a_refusing_customer_names_the_refusals",
        every_record_of_a_refusing_customer_names_the_refusals,
    );
    tests.paused(
        "a_breaker_forced_open_holds_the_records_without_killing_them",
        a_breaker_forced_open_holds_the_records_without_killing_them,
    );
    tests.paused(
        "a_rejected_re_send_never_undoes_someone_elses_change",
        a_rejected_re_send_never_undoes_someone_elses_change,
    );
    tests.run();
}
