//! The retry schedule: deferred records re-sent when due, once, in retry-at order, surviving
//! restarts; a record that fails again is re-scheduled or dead-lettered.

mod redis_support;
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use backstop_test_support::Tests;
use support::outage::as_string_request;
use support::{Scripted, status, status_with};
use tokio::time::Instant;
use tower::ServiceBuilder;
use tower_backstop::Clock;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, record_of};
use tower_backstop::resend::Scheduler;
use tower_backstop::retry::Attempts;
use tower_backstop::store::{Filter, MemoryStore, Record, SqliteStore, Status, Store};
use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

fn deferred(id: &str, retry_at: SystemTime) -> Record {
    let f: Failure = Failure::new(
        Class::THROTTLED,
        Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
    );
    let mut r = record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\"}}"))
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages")
            .with_metadata("idempotency-key", id),
        &f,
    );
    r.status = Status::Deferred;
    r.retry_at = Some(retry_at);
    r
}

/// The calls in flight at a provider: (now, the most at once).
type InFlight = Arc<Mutex<(usize, usize)>>;

/// A provider that notes each message id in `sent`, in the order it was sent, and the calls
/// in flight in `in_flight` (now, the most at once), and accepts each (`202`) after `delay(id)`.
fn counting_provider(
    sent: &Arc<Mutex<Vec<String>>>,
    in_flight: &InFlight,
    delay: impl Fn(&str) -> Duration + Clone + Send + 'static,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    let (in_flight, sent) = (Arc::clone(in_flight), Arc::clone(sent));
    tower::service_fn(move |req: http::Request<String>| {
        let id = req.extensions().get::<MessageId>().unwrap().0.clone();
        let delay = delay(&id);
        sent.lock().unwrap().push(id);
        let in_flight = Arc::clone(&in_flight);
        async move {
            {
                let mut g = in_flight.lock().unwrap();
                g.0 += 1;
                g.1 = g.1.max(g.0);
            }
            tokio::time::sleep(delay).await;
            in_flight.lock().unwrap().0 -= 1;
            Ok::<_, BoxError>(http::Response::builder().status(202).body(()).unwrap())
        }
    })
}

type Calls = Arc<Mutex<Vec<(Instant, String)>>>;

/// A provider that accepts everything and notes when and what it was sent.
fn recording_provider(
    calls: Calls,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: http::Request<String>| {
        let id = req.extensions().get::<MessageId>().unwrap().0.clone();
        calls.lock().unwrap().push((Instant::now(), id));
        async { Ok::<_, BoxError>(http::Response::builder().status(202).body(()).unwrap()) }
    })
}

/// Two schedulers over `store`; one record due in 2 s; it is sent once, at 2 s or later.
async fn due_in_two_seconds_sent_once(store: Arc<dyn Store>, tight: bool) {
    let clock = Clock::tokio();
    let start = Instant::now();
    store
        .put(deferred("due-2s", clock.now() + Duration::from_secs(2)))
        .await
        .unwrap();
    let calls: Calls = Arc::default();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(recording_provider(Arc::clone(&calls)));
    let poll = Duration::from_millis(100);
    let spawn = || {
        Scheduler::new(Arc::clone(&store), stack.clone(), as_string_request)
            .poll_every(poll)
            .clock(clock)
            .spawn()
    };
    let (a, b) = (spawn(), spawn());

    if tight {
        tokio::time::sleep(Duration::from_millis(1_950)).await;
        assert!(calls.lock().unwrap().is_empty(), "sent before it was due");
    }
    // Small steps: against a socket the paused clock jumps to the next timer, which must not be
    // far away. While Redis is slow to answer, virtual time runs on, so the give-up deadline is
    // counted in real time.
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while calls.lock().unwrap().is_empty() && std::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give both schedulers many more polls to send it a second time, if they would.
    for _ in 0..30 {
        tokio::time::sleep(poll).await;
    }
    a.shutdown().await;
    b.shutdown().await;

    let calls = calls.lock().unwrap().clone();
    let record = store.get("due-2s").await.unwrap();
    assert_eq!(
        calls.len(),
        1,
        "sent exactly once: {calls:?}; at {:?}; {record:?}",
        start.elapsed()
    );
    let sent_after = calls[0].0 - start;
    assert!(
        sent_after >= Duration::from_secs(2),
        "sent after {sent_after:?}"
    );
    if tight {
        assert!(
            sent_after <= Duration::from_secs(2) + poll,
            "sent after {sent_after:?}"
        );
    }
    let r = store.get("due-2s").await.unwrap().unwrap();
    assert_eq!(r.status, Status::Resolved);
    assert_eq!(r.resends, 1);
}

async fn deferred_item_due_in_2s_is_sent_once_memory() {
    due_in_two_seconds_sent_once(Arc::new(MemoryStore::new()), true).await;
}

async fn deferred_item_due_in_2s_is_sent_once_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("d.db")).unwrap();
    due_in_two_seconds_sent_once(Arc::new(store), true).await;
}

/// Against a real Redis server the paused clock jumps ahead while a socket waits, so the timing
/// is checked from below only (never before 2 s); "once" is checked exactly.
#[cfg(feature = "redis")]
async fn deferred_item_due_in_2s_is_sent_once_by_two_schedulers_on_redis() {
    let store = redis_support::redis_store("scheduler_two").await;
    due_in_two_seconds_sent_once(Arc::new(store), false).await;
}

async fn many_due_items_go_in_retry_at_order_within_the_concurrency_limit() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Clock::tokio();
    // Due at 5 s, 4 s, …, 1 s after now; then 20 more all due at 6 s.
    for i in 0..5u64 {
        store
            .put(deferred(
                &format!("o-{i}"),
                clock.now() + Duration::from_secs(5 - i),
            ))
            .await
            .unwrap();
    }
    for i in 0..20u64 {
        store
            .put(deferred(
                &format!("c-{i:02}"),
                clock.now() + Duration::from_secs(6),
            ))
            .await
            .unwrap();
    }
    let (order, in_flight): (_, InFlight) = (Arc::default(), Arc::default());
    let provider = counting_provider(&order, &in_flight, |_| Duration::from_millis(500));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(provider);
    let handle = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(50))
        .concurrency(3)
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(20)).await;
    handle.shutdown().await;
    let order = order.lock().unwrap().clone();
    assert_eq!(&order[..5], ["o-4", "o-3", "o-2", "o-1", "o-0"]);
    assert_eq!(order.len(), 25);
    assert_eq!(
        in_flight.lock().unwrap().1,
        3,
        "at most 3 at once, and 3 were used"
    );
}

async fn failing_again_is_rescheduled_then_dead_lettered_by_policy() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Clock::tokio();
    store
        .put(deferred("again", clock.now() + Duration::from_secs(1)))
        .await
        .unwrap();
    // The provider keeps answering 429 with Retry-After: 3 → deferred again each time.
    let upstream = Scripted::always(status_with(429, "retry-after", "3"));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let handle = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .max_resends(3)
        .clock(clock)
        .spawn();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    handle.shutdown().await;

    // Re-sent at ~1 s, ~4 s, ~7 s; the fourth claim (~10 s) exceeds max_resends(3): dead.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let at: Vec<u64> = seen.iter().map(|s| (s.at - start).as_secs()).collect();
    assert_eq!(at, [1, 4, 7]);
    let r = store.get("again").await.unwrap().unwrap();
    assert_eq!(r.status, Status::Dead);
    assert_eq!(r.retry_at, None);
    assert_eq!(r.history.len(), 4);
    assert_eq!(r.code, "http 429");
}

async fn schedule_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let clock = Clock::tokio();
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .put(deferred("kept", clock.now() + Duration::from_secs(3)))
            .await
            .unwrap();
        // A scheduler claims another record and dies before sending it.
        store
            .put(deferred("claimed", clock.now() + Duration::from_secs(1)))
            .await
            .unwrap();
        let claimed = store
            .claim_due(
                clock.now() + Duration::from_secs(1),
                10,
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        store.close();
    }
    // A new process: the store reopened, a new scheduler.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let upstream = Scripted::always(status(202));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let start = Instant::now();
    let handle = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(15)).await;
    handle.shutdown().await;
    let seen = upstream.seen();
    let at: Vec<u64> = seen.iter().map(|s| (s.at - start).as_secs()).collect();
    // "kept" at 3 s; "claimed" when the dead scheduler's 10 s lease ends (11 s).
    assert_eq!(at, [3, 11], "{seen:?}");
    for id in ["kept", "claimed"] {
        assert_eq!(
            store.get(id).await.unwrap().unwrap().status,
            Status::Resolved
        );
    }
}

/// Fail fast: an open breaker's rejection comes back at once, is stored as deferred to the
/// half-open instant (not an attempt), and the scheduler re-sends it then.
async fn an_open_breakers_rejection_is_deferred_and_re_sent_when_it_half_opens() {
    use tower::ServiceExt;
    use tower_backstop::breaker::BreakerLayer;
    use tower_backstop::retry::RetryPolicy;

    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::new([status(503)], status(202));
    let breaker = BreakerLayer::consecutive_failures(1)
        .open_for(Duration::from_secs(10))
        .name("mail.test");
    let handle = breaker.handle();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(RetryPolicy::new().max_attempts(5).build().unwrap())
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let before = SystemTime::now();

    // The 503 trips the breaker; the retry is rejected and comes back at once, deferred.
    let start = Instant::now();
    let f = stack
        .clone()
        .oneshot(support::post_with_key(
            "http://mail.test/v1/messages",
            "{}",
            "k-1",
        ))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(tower_backstop::retry::GiveUp::Deferred)
    );
    assert_eq!(
        f.note::<Attempts>().map_or(0, Attempts::count),
        1,
        "the 503; the rejection is not an attempt"
    );
    // A second message is rejected before it is sent: no attempt at all.
    let f = stack
        .clone()
        .oneshot(support::post_with_key(
            "http://mail.test/v1/messages",
            "{}",
            "k-2",
        ))
        .await
        .unwrap_err();
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 0);
    assert_eq!(upstream.calls(), 1);

    for (id, attempts) in [("k-1", 1), ("k-2", 0)] {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!(r.status, Status::Deferred, "{id}");
        assert_eq!(r.attempts, attempts, "{id}");
        // The half-open time is absolute (RFC 3339), the record's own retry-at time.
        let at = r
            .message
            .strip_prefix("breaker \"mail.test\" is open; half-opens at ")
            .unwrap_or_else(|| panic!("{id}: {}", r.message));
        assert_eq!(
            humantime::parse_rfc3339(at).ok(),
            r.retry_at,
            "{id}: {}",
            r.message
        );
        // The root cause is the 503 that opened the breaker.
        let cause = r.cause.as_ref().expect("a root cause");
        assert_eq!(
            (cause.code.as_str(), cause.attempts),
            ("http 503", 1),
            "{id}"
        );
        assert_eq!(r.breaker.as_deref(), Some("mail.test"));
        // Deferred to the half-open instant, 10 s after the trip (less the backoff the first
        // message slept on the paused clock, under 100 ms), rounded up to the second.
        let at = r.retry_at.unwrap();
        assert!(
            at >= before + Duration::from_millis(9_900),
            "{id}: {:?}",
            at.duration_since(before)
        );
        assert!(at <= SystemTime::now() + Duration::from_secs(11), "{id}");
    }

    // One at a time: the first re-send is the half-open probe, its success closes the breaker.
    let scheduler = Scheduler::new(Arc::clone(&store), stack.clone(), as_string_request)
        .poll_every(Duration::from_millis(100))
        .concurrency(1)
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        upstream.calls(),
        1,
        "nothing is re-sent before the breaker half-opens"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    scheduler.shutdown().await;
    assert_eq!(upstream.calls(), 3);
    for id in ["k-1", "k-2"] {
        assert_eq!(
            store.get(id).await.unwrap().unwrap().status,
            Status::Resolved,
            "{id}"
        );
    }
    assert_eq!(handle.state(), tower_backstop::breaker::State::Closed);
}

/// `shutdown` waits for the re-send in flight, then the scheduler sends nothing more.
async fn shutdown_waits_for_the_resend_in_flight_and_stops_polling() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store.put(deferred("slow", clock.now())).await.unwrap();
    let calls: Calls = Arc::default();
    // The provider takes 5 s to answer.
    let provider = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |req: http::Request<String>| {
            let id = req.extensions().get::<MessageId>().unwrap().0.clone();
            calls.lock().unwrap().push((Instant::now(), id));
            async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, BoxError>(http::Response::builder().status(202).body(()).unwrap())
            }
        })
    };
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(provider);
    let scheduler = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    // The re-send starts at the first poll and waits for the provider.
    for _ in 0..100 {
        if !calls.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        calls.lock().unwrap().len(),
        1,
        "the due record was not sent"
    );
    assert_eq!(
        store.get("slow").await.unwrap().unwrap().status,
        Status::InFlight
    );
    let start = Instant::now();
    scheduler.shutdown().await;
    // It returned once the provider answered, with the outcome written.
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        store.get("slow").await.unwrap().unwrap().status,
        Status::Resolved
    );
    // A record due now is not sent by a scheduler that was shut down.
    store.put(deferred("later", clock.now())).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        1,
        "{:?}",
        calls.lock().unwrap()
    );
    assert_eq!(
        store.get("later").await.unwrap().unwrap().status,
        Status::Deferred
    );
}

fn debug_shows_the_settings() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let scheduler = Scheduler::new(
        store,
        tower::service_fn(|_: http::Request<String>| async {
            Ok::<_, BoxError>(http::Response::new(()))
        }),
        as_string_request,
    )
    .poll_every(Duration::from_millis(250))
    .concurrency(3)
    .max_resends(7);
    let debug = format!("{scheduler:?}");
    for part in [
        "Scheduler",
        "poll: 250ms",
        "concurrency: 3",
        // The default lease, `DEFAULT_LEASE` (renewed while a re-send is in flight).
        "lease: 10s",
        "max_resends: 7",
    ] {
        assert!(debug.contains(part), "{debug}");
    }
}

/// Sends `n` records due now through a recording provider with `configure`d scheduler for
/// `run`, and returns when each was sent, from the start.
async fn drain(
    n: usize,
    run: Duration,
    configure: impl FnOnce(
        Scheduler<Stack, fn(&Record) -> Result<Req, BoxError>>,
    ) -> Scheduler<Stack, fn(&Record) -> Result<Req, BoxError>>,
    breaker: Option<&str>,
) -> (Arc<dyn Store>, Vec<Duration>) {
    let clock = Clock::tokio();
    let start = Instant::now();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for i in 0..n {
        let mut r = deferred(&format!("d-{i:02}"), clock.now());
        r.breaker = breaker.map(str::to_owned);
        store.put(r).await.unwrap();
    }
    let calls: Calls = Arc::default();
    let stack: Stack = tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
            .layer(ClassifyLayer::http())
            .service(recording_provider(Arc::clone(&calls))),
    );
    let rebuild: fn(&Record) -> Result<Req, BoxError> = as_string_request;
    let scheduler =
        configure(Scheduler::new(Arc::clone(&store), stack, rebuild).clock(clock)).spawn();
    tokio::time::sleep(run).await;
    scheduler.shutdown().await;
    let at = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| *t - start)
        .collect();
    (store, at)
}

type Req = http::Request<String>;
type Stack = tower::util::BoxCloneService<Req, http::Response<()>, Failure<http::Response<()>>>;

/// The scheduler's rate bounds its re-sends: 20 due records at 10 a second take about 2 s
/// (each gap jittered within 50–150 % of 100 ms), never a burst.
async fn re_sends_are_paced_at_the_rate() {
    let (_, at) = drain(
        20,
        Duration::from_secs(5),
        |s| s.poll_every(Duration::from_millis(10)).rate(10),
        None,
    )
    .await;
    assert_eq!(at.len(), 20);
    let span = at[19] - at[0];
    assert!(
        span >= Duration::from_millis(950) && span <= Duration::from_millis(2_900),
        "19 gaps of 50 to 150 ms: {span:?}"
    );
    for pair in at.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(49) && gap <= Duration::from_millis(151),
            "{gap:?}"
        );
    }
}

/// A full batch is followed at once, not a poll later: with a 1 s poll, 8 at a time and a high
/// rate, 40 due records are all sent within the first second.
async fn a_full_batch_is_followed_at_once() {
    let (store, at) = drain(
        40,
        Duration::from_millis(900),
        |s| s.poll_every(Duration::from_secs(1)).rate(10_000),
        None,
    )
    .await;
    assert_eq!(at.len(), 40, "{at:?}");
    let resolved = store.search(&Filter::new(), 0..usize::MAX).await.unwrap();
    assert!(resolved.iter().all(|r| r.status == Status::Resolved));
}

/// The first record of a breaker the scheduler has not seen is sent alone as its probe; when
/// that record is dead-lettered instead of sent (it used up its re-sends), the next one probes,
/// and the rest follow.
async fn a_probe_that_is_not_sent_lets_the_next_record_probe() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut spent = deferred("spent", clock.now() - Duration::from_secs(1));
    spent.breaker = Some("mail.test".to_owned());
    spent.resends = 5;
    store.put(spent).await.unwrap();
    for i in 0..3 {
        let mut r = deferred(&format!("r-{i}"), clock.now());
        r.breaker = Some("mail.test".to_owned());
        store.put(r).await.unwrap();
    }
    let calls: Calls = Arc::default();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(recording_provider(Arc::clone(&calls)));
    let scheduler = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    scheduler.shutdown().await;
    assert_eq!(
        store.get("spent").await.unwrap().unwrap().status,
        Status::Dead
    );
    for i in 0..3 {
        let r = store.get(&format!("r-{i}")).await.unwrap().unwrap();
        assert_eq!(r.status, Status::Resolved, "r-{i}");
    }
    assert_eq!(calls.lock().unwrap().len(), 3);
}

/// With a retention, the scheduler prunes at its start and on its interval, on its own clock:
/// the record that grew too old meanwhile goes, the deferred one (due, and re-sent) stays; a
/// closed store's failed prune is reported and the scheduler goes on.
async fn the_scheduler_prunes_by_its_retention_on_an_interval() {
    use tower_backstop::observe::Event;
    use tower_backstop::store::{Filter, Retention};

    let clock = Clock::tokio();
    let store = Arc::new(MemoryStore::new());
    let day = Duration::from_secs(24 * 3600);
    let dead = |id: &str, age: Duration| {
        let mut r = deferred(id, clock.now());
        r.status = Status::Dead;
        r.retry_at = None;
        r.last_failed_at = clock.now() - age;
        r
    };
    store
        .put_many(vec![
            dead("too-old", day * 40),
            dead("old-soon", day * 30 - Duration::from_secs(60)),
            dead("fresh", Duration::ZERO),
            deferred("waiting", clock.now() + Duration::from_secs(120)),
        ])
        .await
        .unwrap();
    let calls: Calls = Arc::default();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let handle = Scheduler::new(
        store.clone() as Arc<dyn Store>,
        ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .service(recording_provider(Arc::clone(&calls))),
        as_string_request,
    )
    .clock(clock)
    .poll_every(Duration::from_secs(1))
    .retention(Retention::new(), Duration::from_secs(3600))
    .listener(move |e: &Event<'_>| {
        if let Event::StoreError { operation, .. } = e {
            seen.lock().unwrap().push(*operation);
        }
    })
    .spawn();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ids = |store: &MemoryStore| {
        let store = store.clone();
        async move {
            let mut ids: Vec<String> = store
                .search(&Filter::new(), 0..100)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(
        ids(&store).await,
        ["fresh", "old-soon", "waiting"],
        "pruned at the start"
    );
    // An hour on, `old-soon` is past 30 days; `waiting` was re-sent meanwhile (resolved, fresh).
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(ids(&store).await, ["fresh", "waiting"]);
    assert_eq!(
        calls.lock().unwrap().len(),
        1,
        "the deferred record was sent"
    );
    // A closed store: the prune fails, is reported, and the scheduler keeps running.
    store.close();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        errors.lock().unwrap().contains(&"prune"),
        "{:?}",
        errors.lock().unwrap()
    );
    handle.shutdown().await;
}

/// A provider that answers (202) after `delay`, noting when and what it was sent.
fn slow_provider(
    calls: Calls,
    delay: Duration,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: http::Request<String>| {
        let id = req.extensions().get::<MessageId>().unwrap().0.clone();
        calls.lock().unwrap().push((Instant::now(), id));
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(http::Response::builder().status(202).body(()).unwrap())
        }
    })
}

/// A re-send that takes three leases keeps its claim: it is renewed every third of the lease,
/// and a second scheduler polling the same store all along never sends the record.
async fn a_claim_is_renewed_while_its_resend_is_in_flight() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store.put(deferred("slow", clock.now())).await.unwrap();
    let calls: Calls = Arc::default();
    let lease = Duration::from_secs(3);
    let spawn = |delay| {
        Scheduler::new(
            Arc::clone(&store),
            slow_provider(Arc::clone(&calls), delay),
            as_string_request,
        )
        .lease(lease)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn()
    };
    let first = spawn(lease * 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = spawn(Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let r = store.get("slow").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::InFlight, 1), "{r:?}");
    // The claim ends no later than a lease from now: it was renewed within the last third.
    let until = r.retry_at.unwrap();
    assert!(until > clock.now() + lease * 2 / 3, "{until:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.shutdown().await;
    second.shutdown().await;
    assert_eq!(calls.lock().unwrap().len(), 1, "sent once");
    let r = store.get("slow").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 1));
}

/// A scheduler aborted mid-send (as a killed process) holds its claim no longer than its lease:
/// another scheduler sends the record within the lease and one poll of the abort.
async fn an_aborted_schedulers_claim_is_taken_over_within_the_lease_and_a_poll() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store.put(deferred("stuck", clock.now())).await.unwrap();
    let calls: Calls = Arc::default();
    let (lease, poll) = (Duration::from_secs(3), Duration::from_millis(500));
    let spawn = |delay| {
        Scheduler::new(
            Arc::clone(&store),
            slow_provider(Arc::clone(&calls), delay),
            as_string_request,
        )
        .lease(lease)
        .poll_every(poll)
        .clock(clock)
        .spawn()
    };
    let dying = spawn(Duration::from_secs(3_600));
    while calls.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two renewals, then the process dies.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    dying.abort();
    let killed = Instant::now();
    let survivor = spawn(Duration::ZERO);
    while calls.lock().unwrap().len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = calls.lock().unwrap()[1].0 - killed;
    survivor.shutdown().await;
    // The last renewal (at 2 s) ran the claim to 5 s: taken over 2.5 s after the abort.
    assert!(took >= lease * 2 / 3 && took <= lease + poll, "{took:?}");
    let r = store.get("stuck").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 2));
}

/// The scheduler sleeps until the earliest due time the store knows, not a whole poll: with a
/// poll of a minute, a record due in 5 s is sent at 5 s.
async fn the_scheduler_wakes_at_the_next_due_time() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let start = Instant::now();
    store
        .put(deferred("in-5s", clock.now() + Duration::from_secs(5)))
        .await
        .unwrap();
    let calls: Calls = Arc::default();
    let scheduler = Scheduler::new(
        Arc::clone(&store),
        recording_provider(Arc::clone(&calls)),
        as_string_request,
    )
    .poll_every(Duration::from_secs(60))
    .clock(clock)
    .spawn();
    tokio::time::sleep(Duration::from_secs(6)).await;
    scheduler.shutdown().await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sent_after = calls[0].0 - start;
    assert!(
        sent_after >= Duration::from_secs(5) && sent_after <= Duration::from_millis(5_010),
        "{sent_after:?}"
    );
}

/// A shutdown while claimed records wait for their turn (a rate of one a second) and one
/// re-send hangs: it returns after its bound, the waiting records are given back uncounted
/// (never sent), the hanging one due now with its re-send counted.
async fn shutdown_within_gives_back_what_is_unfinished() {
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for i in 0..4 {
        store
            .put(deferred(&format!("m-{i}"), clock.now()))
            .await
            .unwrap();
    }
    let calls: Calls = Arc::default();
    let scheduler = Scheduler::new(
        Arc::clone(&store),
        slow_provider(Arc::clone(&calls), Duration::from_secs(3_600)),
        as_string_request,
    )
    .rate(1)
    .clock(clock)
    .spawn();
    while calls.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    scheduler.shutdown_within(Duration::from_secs(2)).await;
    assert_eq!(asked.elapsed(), Duration::from_secs(2));
    let sent = calls.lock().unwrap()[0].1.clone();
    assert_eq!(calls.lock().unwrap().len(), 1);
    for r in store.search(&Filter::new(), 0..10).await.unwrap() {
        assert_eq!(r.status, Status::Deferred, "{r:?}");
        assert!(r.retry_at.unwrap() <= clock.now(), "{r:?}");
        let counted = u32::from(r.id == sent);
        assert_eq!(r.resends, counted, "{r:?}");
    }
}

/// A scheduler that watches its stack's breakers releases what an open breaker held as soon as
/// it closes (here an operator's reset, 2 s into a 30 s open period; a peer's probe in a fleet
/// closes it the same way): the deferred rejections are re-sent within a second, not at the
/// half-open time they were deferred to. A scheduler that does not watch waits for that time.
async fn records_held_for_a_breaker_are_released_when_it_closes() {
    use tower::ServiceExt;
    use tower_backstop::breaker::BreakerLayer;
    use tower_backstop::retry::RetryPolicy;

    for watch in [true, false] {
        let clock = Clock::tokio();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let upstream = Scripted::new([status(503)], status(202));
        let breaker = BreakerLayer::consecutive_failures(1)
            .open_for(Duration::from_secs(30))
            .name("mail.test");
        let (handle, health) = (breaker.handle(), breaker.health());
        let stack = ServiceBuilder::new()
            .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
            .layer(RetryPolicy::new().max_attempts(5).build().unwrap())
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(upstream.clone());
        for key in ["k-1", "k-2", "k-3"] {
            let post = support::post_with_key("http://mail.test/v1/messages", "{}", key);
            let f = stack.clone().oneshot(post).await.unwrap_err();
            assert_eq!(f.class(), Class::CIRCUIT_OPEN);
        }
        assert_eq!(upstream.calls(), 1);
        let mut scheduler = Scheduler::new(Arc::clone(&store), stack.clone(), as_string_request)
            .poll_every(Duration::from_millis(100))
            .clock(clock);
        if watch {
            scheduler = scheduler.watch_breakers(health);
        }
        let scheduler = scheduler.spawn();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(upstream.calls(), 1, "nothing is re-sent while it is open");
        handle.reset();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let resolved = store
            .search(&Filter::new().status(Status::Resolved), 0..10)
            .await
            .unwrap()
            .len();
        if watch {
            assert_eq!(resolved, 3, "released and re-sent within a second");
            assert_eq!(upstream.calls(), 4);
        } else {
            assert_eq!(resolved, 0, "held until the half-open time");
            tokio::time::sleep(Duration::from_secs(28)).await;
            assert_eq!(
                store
                    .search(&Filter::new().status(Status::Resolved), 0..10)
                    .await
                    .unwrap()
                    .len(),
                3
            );
        }
        scheduler.shutdown().await;
    }
}

/// Over a store that applies a batch in one step (SQLite), the scheduler's resolutions go in
/// batches (a change that comes while one is written goes with the next): a backlog of 300
/// due records drains with fewer writes than records and none one by one, each record sent
/// once and resolved.
async fn resolutions_go_to_a_batching_store_in_batches() {
    use backstop_test_support::{FaultyStore, Op};
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("d.db")).unwrap());
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&sqlite)));
    let store: Arc<dyn Store> = faulty.clone();
    let clock = Clock::tokio();
    let records: Vec<Record> = (0..300)
        .map(|i| deferred(&format!("m-{i:03}"), clock.now() - Duration::from_secs(1)))
        .collect();
    store.put_many(records).await.unwrap();
    let calls: Calls = Arc::default();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(recording_provider(Arc::clone(&calls)));
    let scheduler = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .concurrency(100)
        .rate(100_000)
        .clock(clock)
        .spawn();
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let resolved = sqlite
            .count(&Filter::new().status(Status::Resolved))
            .await
            .unwrap();
        if resolved == 300 {
            break;
        }
    }
    scheduler.shutdown().await;
    let resolved = sqlite
        .count(&Filter::new().status(Status::Resolved))
        .await
        .unwrap();
    assert_eq!(resolved, 300);
    let mut sent: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    sent.sort();
    sent.dedup();
    assert_eq!(
        (sent.len(), calls.lock().unwrap().len()),
        (300, 300),
        "each sent once"
    );
    assert_eq!(faulty.calls(Op::ChangeClaimed), 0, "no write one by one");
    let batches = faulty.calls(Op::ChangeClaimedMany);
    assert!(
        (3..300).contains(&batches),
        "{batches} batches for 300 resolutions"
    );
}

/// The records resolved in `store`.
async fn resolved(store: &Arc<dyn Store>) -> u64 {
    store
        .count(&Filter::new().status(Status::Resolved))
        .await
        .unwrap()
}

/// A busy scheduler claims a batch each time half its concurrency is free, not a record each
/// time a re-send ends: 200 due records, 8 in flight at once, each re-send answered after its own
/// delay (so that they end one at a time), take at most one claim per 4 records, and each is sent
/// once, within the concurrency.
async fn a_busy_scheduler_claims_in_batches() {
    use backstop_test_support::{FaultyStore, Op};
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let store: Arc<dyn Store> = faulty.clone();
    let clock = Clock::tokio();
    let records: Vec<Record> = (0..200)
        .map(|i| deferred(&format!("b-{i:03}"), clock.now() - Duration::from_secs(1)))
        .collect();
    store.put_many(records).await.unwrap();
    // 10 to 130 ms, a different delay for neighbours: the re-sends end one by one.
    let (sent, in_flight): (_, InFlight) = (Arc::default(), Arc::default());
    let provider = counting_provider(&sent, &in_flight, |id| {
        let n: u64 = id[2..].parse().unwrap();
        Duration::from_millis(10 + (n * 37) % 121)
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(provider);
    let scheduler = Scheduler::new(Arc::clone(&store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .concurrency(8)
        .rate(100_000)
        .clock(clock)
        .spawn();
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if resolved(faulty.inner()).await == 200 {
            break;
        }
    }
    scheduler.shutdown().await;
    assert_eq!(resolved(faulty.inner()).await, 200);
    let mut ids = sent.lock().unwrap().clone();
    assert_eq!(ids.len(), 200, "each sent once");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200);
    assert_eq!(
        in_flight.lock().unwrap().1,
        8,
        "at most 8 at once, and 8 used"
    );
    // Claims that found records: each takes at least 4 (half of 8) but the last few.
    let claims = faulty.calls(Op::ClaimDue);
    assert!(claims <= 200 / 4 + 5, "{claims} claims for 200 records");
}

/// What a scheduler's listener heard of its checks of the counters: (keys, drifted, repaired)
/// of each check, and the operations of the store errors.
#[derive(Clone, Default)]
struct Checks(Arc<Mutex<Heard>>);

/// Each check told (keys, drifted, repaired), and each store error's operation.
type Heard = (Vec<(u64, u64, bool)>, Vec<&'static str>);

impl Checks {
    fn listener(&self) -> impl Fn(&tower_backstop::observe::Event<'_>) + Send + Sync + 'static {
        let heard = Arc::clone(&self.0);
        move |e: &tower_backstop::observe::Event<'_>| match *e {
            tower_backstop::observe::Event::CountsChecked {
                keys,
                drifted,
                repaired,
            } => heard.lock().unwrap().0.push((keys, drifted, repaired)),
            tower_backstop::observe::Event::StoreError { operation, .. } => {
                heard.lock().unwrap().1.push(operation)
            }
            _ => {}
        }
    }

    fn checks(&self) -> Vec<(u64, u64, bool)> {
        self.0.lock().unwrap().0.clone()
    }

    fn errors(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().1.clone()
    }

    /// Waits on the paused clock, a second at a time and at most `within`, until `n` checks
    /// were told.
    async fn wait_for(&self, n: usize, within: Duration) {
        let end = Instant::now() + within;
        while self.checks().len() < n && Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// A SQLite store whose counters something changed behind its back (a hand-written `UPDATE`):
/// the scheduler's periodic check finds the drift, first without repairing it, then, told to
/// repair, sets the counters to the recount, which the counts then answer (the ground truth:
/// the three records written). None is checked before its period.
async fn the_scheduler_checks_the_counts_and_repairs_them_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let clock = Clock::tokio();
    for i in 0..3 {
        let mut r = deferred(&format!("k-{i}"), clock.now());
        r.status = Status::Dead;
        r.retry_at = None;
        store.put(r).await.unwrap();
    }
    let truth = store.counts(std::time::UNIX_EPOCH).await.unwrap().total;
    assert_eq!(truth, 3);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("UPDATE dead_letter_counts SET n = n + 5 WHERE status = 'dead'")
        .unwrap();
    assert_ne!(
        store.counts(std::time::UNIX_EPOCH).await.unwrap().total,
        truth,
        "the counts read the counters"
    );

    let calls: Calls = Arc::default();
    let heard = Checks::default();
    let scheduler = Scheduler::new(
        Arc::clone(&store),
        recording_provider(Arc::clone(&calls)),
        as_string_request,
    )
    .clock(clock)
    .check_counts(Duration::from_secs(3600), false)
    .listener(heard.listener())
    .spawn();
    heard.wait_for(1, Duration::from_secs(3590)).await;
    assert!(heard.checks().is_empty(), "checked before its period");
    heard.wait_for(1, Duration::from_secs(60)).await;
    let checks = heard.checks();
    assert_eq!(checks.len(), 1, "{checks:?}");
    let (keys, drifted, repaired) = checks[0];
    assert!(keys > 0 && drifted > 0 && !repaired, "{checks:?}");
    // Not repaired: the drift is still there.
    assert_eq!(
        store.check_counts(false).await.unwrap().drifts.len() as u64,
        drifted
    );
    // The next period checks again.
    heard.wait_for(2, Duration::from_secs(3660)).await;
    assert_eq!(heard.checks().len(), 2);
    scheduler.shutdown().await;

    let heard = Checks::default();
    let scheduler = Scheduler::new(
        Arc::clone(&store),
        recording_provider(Arc::clone(&calls)),
        as_string_request,
    )
    .clock(clock)
    .check_counts(Duration::from_secs(60), true)
    .listener(heard.listener())
    .spawn();
    heard.wait_for(1, Duration::from_secs(120)).await;
    let (_, drifted_then, repaired) = heard.checks()[0];
    assert!(drifted_then > 0 && repaired, "{:?}", heard.checks());
    scheduler.shutdown().await;
    assert_eq!(
        store.counts(std::time::UNIX_EPOCH).await.unwrap().total,
        truth
    );
    assert!(store.check_counts(false).await.unwrap().drifts.is_empty());
    assert!(calls.lock().unwrap().is_empty(), "nothing was due");
}

/// A check that fails is a store error of operation `check_counts`, and the scheduler goes on:
/// the next period checks again, and a record that falls due meanwhile is sent.
async fn a_failed_check_of_the_counts_is_a_store_error_and_the_scheduler_goes_on() {
    use backstop_test_support::{Fault, FaultyStore, Op};
    let faulty = FaultyStore::new(Arc::new(MemoryStore::new()));
    faulty.set_for(Op::CheckCounts, Fault::Fail);
    let store: Arc<dyn Store> = Arc::new(faulty.clone());
    let clock = Clock::tokio();
    store
        .put(deferred("f-1", clock.now() + Duration::from_secs(90)))
        .await
        .unwrap();
    let calls: Calls = Arc::default();
    let heard = Checks::default();
    let scheduler = Scheduler::new(
        Arc::clone(&store),
        recording_provider(Arc::clone(&calls)),
        as_string_request,
    )
    .clock(clock)
    .check_counts(Duration::from_secs(60), false)
    .listener(heard.listener())
    .spawn();
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(faulty.calls(Op::CheckCounts), 1);
    faulty.set_for(Op::CheckCounts, Fault::Answer);
    heard.wait_for(1, Duration::from_secs(120)).await;
    scheduler.shutdown().await;
    assert_eq!(heard.errors(), ["check_counts"]);
    // The in-memory store keeps no counters: nothing to compare, nothing drifted.
    assert_eq!(heard.checks(), [(0, 0, false)]);
    assert_eq!(faulty.calls(Op::CheckCounts), 2);
    let sent: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(sent, ["f-1"]);
}

fn main() {
    let mut tests = Tests::new();
    tests.paused(
        "the_scheduler_checks_the_counts_and_repairs_them_when_asked",
        the_scheduler_checks_the_counts_and_repairs_them_when_asked,
    );
    tests.paused(
        "a_failed_check_of_the_counts_is_a_store_error_and_the_scheduler_goes_on",
        a_failed_check_of_the_counts_is_a_store_error_and_the_scheduler_goes_on,
    );
    tests.paused(
        "deferred_item_due_in_2s_is_sent_once_memory",
        deferred_item_due_in_2s_is_sent_once_memory,
    );
    tests.paused(
        "deferred_item_due_in_2s_is_sent_once_sqlite",
        deferred_item_due_in_2s_is_sent_once_sqlite,
    );
    #[cfg(feature = "redis")]
    tests.needs(backstop_test_support::Service::Redis).paused(
        "deferred_item_due_in_2s_is_sent_once_by_two_schedulers_on_redis",
        deferred_item_due_in_2s_is_sent_once_by_two_schedulers_on_redis,
    );
    tests.paused(
        "many_due_items_go_in_retry_at_order_within_the_concurrency_limit",
        many_due_items_go_in_retry_at_order_within_the_concurrency_limit,
    );
    tests.paused(
        "failing_again_is_rescheduled_then_dead_lettered_by_policy",
        failing_again_is_rescheduled_then_dead_lettered_by_policy,
    );
    tests.paused("schedule_survives_a_restart", schedule_survives_a_restart);
    tests.paused(
        "a_busy_scheduler_claims_in_batches",
        a_busy_scheduler_claims_in_batches,
    );
    tests.paused(
        "an_open_breakers_rejection_is_deferred_and_re_sent_when_it_half_opens",
        an_open_breakers_rejection_is_deferred_and_re_sent_when_it_half_opens,
    );
    tests.paused(
        "shutdown_waits_for_the_resend_in_flight_and_stops_polling",
        shutdown_waits_for_the_resend_in_flight_and_stops_polling,
    );
    tests.sync("debug_shows_the_settings", debug_shows_the_settings);
    tests.paused(
        "re_sends_are_paced_at_the_rate",
        re_sends_are_paced_at_the_rate,
    );
    tests.paused(
        "a_full_batch_is_followed_at_once",
        a_full_batch_is_followed_at_once,
    );
    tests.paused(
        "a_probe_that_is_not_sent_lets_the_next_record_probe",
        a_probe_that_is_not_sent_lets_the_next_record_probe,
    );
    tests.paused(
        "the_scheduler_prunes_by_its_retention_on_an_interval",
        the_scheduler_prunes_by_its_retention_on_an_interval,
    );
    tests.paused(
        "a_claim_is_renewed_while_its_resend_is_in_flight",
        a_claim_is_renewed_while_its_resend_is_in_flight,
    );
    tests.paused(
        "an_aborted_schedulers_claim_is_taken_over_within_the_lease_and_a_poll",
        an_aborted_schedulers_claim_is_taken_over_within_the_lease_and_a_poll,
    );
    tests.paused(
        "the_scheduler_wakes_at_the_next_due_time",
        the_scheduler_wakes_at_the_next_due_time,
    );
    tests.paused(
        "shutdown_within_gives_back_what_is_unfinished",
        shutdown_within_gives_back_what_is_unfinished,
    );
    tests.paused(
        "records_held_for_a_breaker_are_released_when_it_closes",
        records_held_for_a_breaker_are_released_when_it_closes,
    );
    tests.paused(
        "resolutions_go_to_a_batching_store_in_batches",
        resolutions_go_to_a_batching_store_in_batches,
    );
    tests.run();
}
