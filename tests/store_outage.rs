//! A dead-letter store that fails, hangs or answers slowly, on the request path and under a
//! scheduler that drains: callers wait at most the store timeout, and the scheduler rides
//! through it: no record lost, none sent twice (counted at the provider), none dead. On tokio's
//! paused clock, with in-process providers and a [`FaultyStore`] over a memory store.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use backstop_test_support::{Fault, FaultyStore, Op};
use support::outage::{Provider, URI, as_string_request, send_all, stack};
use support::{Scripted, post_with_key, status};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, record_of};
use tower_backstop::resend::Scheduler;
use tower_backstop::store::{Filter, MemoryStore, Record, Status, Store};
use tower_backstop::{BoxError, Class, Clock, Code, Envelope, Failure};

async fn statuses(store: &dyn Store) -> HashMap<Status, usize> {
    let mut out = HashMap::new();
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        *out.entry(r.status).or_default() += 1;
    }
    out
}

/// A memory store, and a faulty store over it.
fn over_memory() -> (MemoryStore, FaultyStore, Arc<dyn Store>) {
    let inner = MemoryStore::new();
    let faulty = FaultyStore::new(Arc::new(inner.clone()));
    let store: Arc<dyn Store> = Arc::new(faulty.clone());
    (inner, faulty, store)
}

/// A record of a keyed request to [`URI`], deferred, due at `at`.
fn due(id: &str, at: SystemTime) -> Record {
    let f: Failure = Failure::new(Class::TRANSIENT, Code::Http(http::StatusCode::BAD_GATEWAY));
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
    r
}

/// The provider is down, its messages deferred; the scheduler drains; the store goes down for
/// 30 s while the provider is still down, and the provider recovers during the store's outage.
/// The scheduler backs off its claims, says the store fails and since when, and once the store
/// is back delivers every message once: none lost, none sent twice, none dead.
#[tokio::test(start_paused = true)]
async fn a_store_down_for_30_s_during_a_provider_outage_loses_nothing_and_sends_nothing_twice() {
    let clock = Clock::tokio();
    let (inner, faulty, store) = over_memory();
    let provider = Provider::default();
    provider.down(true);
    let (svc, _) = stack(&store, &provider, clock);
    send_all(&svc, 40).await;
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .rate(10)
        .clock(clock)
        .spawn();
    // The breaker half-opens at 5 s: the scheduler's probe finds the provider still down.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!scheduler.store_health().is_failing());

    faulty.set(Fault::Fail);
    let down_at = clock.now();
    let claims_before = faulty.calls(Op::ClaimDue);
    tokio::time::sleep(Duration::from_secs(10)).await;
    provider.down(false);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let health = scheduler.store_health();
    assert!(health.is_failing(), "{health:?}");
    let since = health.failing_since.unwrap();
    assert!(since >= down_at, "{health:?}");
    assert_eq!(health.last_error.as_deref(), Some("the store is down"));
    // Backed off: not a claim every poll (300 in 30 s).
    let claims = faulty.calls(Op::ClaimDue) - claims_before;
    assert!(claims <= 30, "{claims} claims in 30 s");

    faulty.set(Fault::Answer);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!scheduler.store_health().is_failing());
    scheduler.shutdown().await;
    let after = statuses(&inner).await;
    assert_eq!(after.get(&Status::Resolved), Some(&40), "{after:?}");
    assert_eq!(after.get(&Status::Dead), None, "{after:?}");
    let effects = provider.effects();
    assert_eq!(effects.len(), 40, "every message delivered");
    assert!(effects.values().all(|&n| n == 1), "{effects:?}");
}

/// A provider that counts the requests it gets, per idempotency key, and answers 202 after
/// `delay`.
#[derive(Clone, Default)]
struct Slow {
    delay: Duration,
    got: Arc<Mutex<HashMap<String, u32>>>,
}

impl Slow {
    fn service(
        &self,
    ) -> impl tower::Service<
        http::Request<String>,
        Response = http::Response<()>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        tower::service_fn(move |req: http::Request<String>| {
            let key = req.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_owned();
            *this.got.lock().unwrap().entry(key).or_default() += 1;
            let delay = this.delay;
            async move {
                tokio::time::sleep(delay).await;
                Ok::<_, BoxError>(http::Response::builder().status(202).body(()).unwrap())
            }
        })
    }

    fn got(&self, key: &str) -> u32 {
        self.got.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// A scheduler over `store` re-sending through a dead-letter layer to `provider`, with a
/// lease of `lease`.
fn scheduler_to(
    store: &Arc<dyn Store>,
    provider: &Slow,
    lease: Duration,
) -> tower_backstop::resend::SchedulerHandle {
    let clock = Clock::tokio();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(store)).clock(clock))
        .layer(ClassifyLayer::http())
        .service(provider.service());
    Scheduler::new(Arc::clone(store), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .lease(lease)
        .clock(clock)
        .spawn()
}

/// The resolution of a delivered re-send fails (and its renewals) past the end of its lease:
/// the scheduler takes the ended claim again when it comes round, sees its own re-send still
/// holds the record and does not send it again; once the store answers, the record is resolved.
/// The provider received the message once.
#[tokio::test(start_paused = true)]
async fn a_resolution_that_fails_then_succeeds_is_delivered_once() {
    let (inner, faulty, store) = over_memory();
    let clock = Clock::tokio();
    store
        .put(due("m-1", clock.now() - Duration::from_secs(1)))
        .await
        .unwrap();
    faulty.set_for(Op::ChangeClaimed, Fault::Fail);
    let provider = Slow::default();
    let scheduler = scheduler_to(&store, &provider, Duration::from_secs(3));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(provider.got("m-1"), 1);
    let waiting = inner.get("m-1").await.unwrap().unwrap();
    assert_eq!(waiting.status, Status::InFlight, "not resolved yet");
    // Its claims answer: the store is not down, but its failures are counted.
    assert!(scheduler.store_health().failures > 0);

    faulty.set(Fault::Answer);
    tokio::time::sleep(Duration::from_secs(10)).await;
    scheduler.shutdown().await;
    let after = inner.get("m-1").await.unwrap().unwrap();
    assert_eq!(after.status, Status::Resolved, "{}", after.message);
    assert_eq!(provider.got("m-1"), 1, "sent once");
}

/// Renewals fail past the end of the lease while a slow re-send is out (30 s, a lease of 3 s):
/// the scheduler's next claim of the record goes to that re-send, and the record is sent once
/// and resolved when the store is back.
#[tokio::test(start_paused = true)]
async fn renewals_failing_past_the_lease_end_do_not_send_twice() {
    let (inner, faulty, store) = over_memory();
    let clock = Clock::tokio();
    store
        .put(due("m-1", clock.now() - Duration::from_secs(1)))
        .await
        .unwrap();
    let provider = Slow {
        delay: Duration::from_secs(30),
        ..Slow::default()
    };
    let scheduler = scheduler_to(&store, &provider, Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(provider.got("m-1"), 1, "out");
    faulty.set_for(Op::ChangeClaimed, Fault::Fail);
    tokio::time::sleep(Duration::from_secs(15)).await;
    faulty.set(Fault::Answer);
    tokio::time::sleep(Duration::from_secs(30)).await;
    scheduler.shutdown().await;
    let after = inner.get("m-1").await.unwrap().unwrap();
    assert_eq!(after.status, Status::Resolved, "{}", after.message);
    assert_eq!(provider.got("m-1"), 1, "sent once");
}

/// A slow store (each operation 2 s, below the scheduler's bound of a third of its 10 s lease)
/// slows the drain and loses nothing: every record is sent once and resolved.
#[tokio::test(start_paused = true)]
async fn a_slow_store_slows_the_drain_and_loses_nothing() {
    let (inner, faulty, store) = over_memory();
    let clock = Clock::tokio();
    let ids: Vec<String> = (0..10).map(|i| format!("m-{i}")).collect();
    for id in &ids {
        store
            .put(due(id, clock.now() - Duration::from_secs(1)))
            .await
            .unwrap();
    }
    faulty.set(Fault::Slow(Duration::from_secs(2)));
    let provider = Slow::default();
    let scheduler = scheduler_to(&store, &provider, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(60)).await;
    scheduler.shutdown().await;
    let after = statuses(&inner).await;
    assert_eq!(after.get(&Status::Resolved), Some(&10), "{after:?}");
    for id in &ids {
        assert_eq!(provider.got(id), 1, "{id}");
    }
}

/// The store timeout of the tests on the request path: each hung call waits it in real time
/// (the bound is real time, see `store_timeout.rs`).
const TIMEOUT: Duration = Duration::from_millis(50);

/// The time (on tokio's paused clock, which a hung store call moves by the store timeout) a
/// call with key `key` through a dead-letter layer over `store` takes, and its result.
async fn timed_call(
    layer: DeadLetterLayer,
    upstream: Scripted,
    key: &str,
) -> (
    Duration,
    Result<http::Response<()>, Failure<http::Response<()>>>,
) {
    let svc = ServiceBuilder::new()
        .layer(layer.store_timeout(TIMEOUT))
        .layer(ClassifyLayer::http())
        .service(upstream);
    let started = Instant::now();
    let result = svc.oneshot(post_with_key(URI, "{}", key)).await;
    (started.elapsed(), result)
}

/// Every store call on the request path is bounded: the attempt budget's read and the
/// write-ahead write before the call (one timeout for both), the write-ahead record's
/// resolution after a success, the failure's record write. A store that hangs on each costs the
/// caller at most the store timeout for it, and the call goes on: sent as if the budget were
/// not spent, sent without write-ahead, answered before the record is resolved.
#[tokio::test(start_paused = true)]
async fn a_hung_store_on_every_request_path_call_costs_at_most_the_store_timeout() {
    // Everything hung, a call that succeeds: the budget's read and the write-ahead write share
    // the timeout, and the call goes out.
    let (_, faulty, store) = over_memory();
    faulty.set(Fault::Hang);
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store))
        .attempt_budget(3)
        .write_ahead();
    let (took, result) = timed_call(layer, Scripted::always(status(202)), "m-1").await;
    assert!(result.is_ok());
    assert!(took <= TIMEOUT, "{took:?}");
    assert_eq!(faulty.calls(Op::Put), 0, "no time was left for write-ahead");

    // Everything hung, a call that fails: the failure's record write shares that timeout too
    // (it gets what the calls before the call left of it: nothing), so the caller waits the
    // timeout once, not twice; the failure says not stored.
    let (_, faulty, store) = over_memory();
    faulty.set(Fault::Hang);
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store))
        .attempt_budget(3)
        .write_ahead();
    let (took, result) = timed_call(layer, Scripted::always(status(400)), "m-0").await;
    assert!(took <= TIMEOUT, "{took:?}");
    let failure = result.unwrap_err();
    let Some(DeadLetterStatus::NotStored { error, .. }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    assert_eq!(
        error.to_string(),
        "dead-letter store did not answer within 50ms"
    );

    // Only the budget's read hangs: it costs the timeout; the write-ahead write is not made.
    let (_, faulty, store) = over_memory();
    faulty.set_for(Op::BudgetSpent, Fault::Hang);
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store)).attempt_budget(3);
    let (took, result) = timed_call(layer, Scripted::always(status(202)), "m-2").await;
    assert!(result.is_ok());
    assert!(took <= TIMEOUT, "{took:?}");

    // The write-ahead record is written, and its resolution hangs: the caller has its response
    // after the timeout; the record is resolved once the store answers.
    let (inner, faulty, store) = over_memory();
    faulty.set_for(Op::ChangeClaimed, Fault::Hang);
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store)).write_ahead();
    let (took, result) = timed_call(layer, Scripted::always(status(202)), "m-3").await;
    assert!(result.is_ok());
    assert!(took <= TIMEOUT, "{took:?}");
    assert_eq!(
        inner.get("m-3").await.unwrap().unwrap().status,
        Status::InFlight
    );
    faulty.set(Fault::Answer);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        inner.get("m-3").await.unwrap().unwrap().status,
        Status::Resolved,
        "resolved on its own task once the store answers"
    );

    // The failure's record write hangs: the timeout, and the failure says not stored.
    let (_, faulty, store) = over_memory();
    faulty.set(Fault::Hang);
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store));
    let (took, result) = timed_call(layer, Scripted::always(status(400)), "m-4").await;
    assert!(took <= TIMEOUT, "{took:?}");
    let failure = result.unwrap_err();
    assert!(
        matches!(
            failure.note::<DeadLetterStatus>(),
            Some(DeadLetterStatus::NotStored { .. })
        ),
        "{failure:?}"
    );
}

/// A slow store on the request path: slower than the store timeout, the failure comes back
/// after the timeout, not stored; faster, it is stored.
#[tokio::test(start_paused = true)]
async fn a_slow_store_on_the_request_path_is_waited_for_up_to_the_store_timeout() {
    let (_, faulty, store) = over_memory();
    faulty.set(Fault::Slow(TIMEOUT / 2));
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store));
    let (took, result) = timed_call(layer, Scripted::always(status(400)), "m-1").await;
    assert!(took <= TIMEOUT, "{took:?}");
    assert!(matches!(
        result.unwrap_err().note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));

    faulty.set(Fault::Slow(TIMEOUT * 4));
    let layer = DeadLetterLayer::from_arc(Arc::clone(&store));
    let (took, result) = timed_call(layer, Scripted::always(status(400)), "m-2").await;
    assert!(took <= TIMEOUT, "{took:?}");
    assert!(matches!(
        result.unwrap_err().note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::NotStored { .. })
    ));
}
