//! Reconciliation of outcome-unknown requests (`RetryPolicy::reconcile`).
//!
//! End to end: a real axum provider on 127.0.0.1 with `POST /v1/messages` and a status endpoint
//! `GET /v1/messages/{id}`, a real hyper-util client, keyless POSTs that time out (short real
//! durations). Then the rules one by one, on tokio's paused clock with a scripted upstream:
//! each verdict with `RetryLayer` alone and inside `BackstopLayer`, which requests are checked,
//! and a check that panics, hangs past the deadline or was set for other types loses nothing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::resend::Reconciler;
use tower_backstop::retry::{Attempts, Backoff, Delivery, GiveUp, RetryPolicy, StatusCheck};
use tower_backstop::store::{Filter, MemoryStore, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{Class, Envelope};

/// The provider: what it committed, how many POSTs it got, and how it behaves.
#[derive(Clone, Default)]
struct Provider {
    delivered: Arc<Mutex<HashSet<String>>>,
    posts: Arc<AtomicUsize>,
    /// Commit the message, then answer too late (the client's timeout fires first).
    commit_then_stall: Arc<AtomicBool>,
    /// On the first POST only: stall without committing.
    stall_first_uncommitted: Arc<AtomicBool>,
    /// The status endpoint answers 500.
    status_broken: Arc<AtomicBool>,
}

async fn send(State(p): State<Provider>, body: Bytes) -> StatusCode {
    let n = p.posts.fetch_add(1, Ordering::SeqCst);
    let message: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id = message["id"].as_str().unwrap().to_owned();
    if n == 0 && p.stall_first_uncommitted.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    p.delivered.lock().unwrap().insert(id);
    if p.commit_then_stall.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    StatusCode::ACCEPTED
}

async fn status(State(p): State<Provider>, Path(id): Path<String>) -> StatusCode {
    if p.status_broken.load(Ordering::SeqCst) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else if p.delivered.lock().unwrap().contains(&id) {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn start(provider: &Provider) -> String {
    let router = axum::Router::new()
        .route("/v1/messages", post(send))
        .route("/v1/messages/{id}", get(status))
        .with_state(provider.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// The status check: `GET {base}/v1/messages/{id}` with the id from the JSON payload; 200 →
/// delivered, 404 → not delivered, anything else (or no answer within 1 s) → unknown.
fn status_check(
    base: String,
) -> impl Fn(Envelope) -> futures_util::future::BoxFuture<'static, Delivery> + Clone {
    move |envelope: Envelope| {
        let base = base.clone();
        Box::pin(async move {
            let Ok(message) = serde_json::from_slice::<serde_json::Value>(&envelope.payload) else {
                return Delivery::Unknown;
            };
            let Some(id) = message["id"].as_str() else {
                return Delivery::Unknown;
            };
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let uri: http::Uri = format!("{base}/v1/messages/{id}").parse().unwrap();
            match tokio::time::timeout(Duration::from_secs(1), client.get(uri)).await {
                Ok(Ok(r)) if r.status() == StatusCode::OK => Delivery::Delivered,
                Ok(Ok(r)) if r.status() == StatusCode::NOT_FOUND => Delivery::NotDelivered,
                _ => Delivery::Unknown,
            }
        })
    }
}

fn message(base: &str, id: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("{base}/v1/messages"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"id\":\"{id}\"}}"))))
        .unwrap()
}

type Response = http::Response<http_body_util::combinators::BoxBody<Bytes, hyper::Error>>;

/// Dead letters → retry (3 attempts, 10 ms apart, reconciling) → classify → 50 ms timeout →
/// hyper-util.
fn stack(
    store: &MemoryStore,
    base: &str,
) -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = Response,
    Error = tower_backstop::Failure<Response>,
> + Clone {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Backoff::constant(Duration::from_millis(10)))
                .reconcile::<http::Request<Full<Bytes>>, Response>(status_check(base.to_owned()))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .map_response(|r: http::Response<hyper::body::Incoming>| r.map(BodyExt::boxed))
        .layer(TimeoutLayer::new(Duration::from_millis(50)))
        .service(client)
}

#[tokio::test]
async fn delivered_but_timed_out_succeeds_as_reconciled_and_is_not_sent_twice() {
    let provider = Provider::default();
    provider.commit_then_stall.store(true, Ordering::SeqCst);
    let base = start(&provider).await;
    let store = MemoryStore::new();
    let response = stack(&store, &base)
        .oneshot(message(&base, "m-1"))
        .await
        .unwrap();
    assert!(response.extensions().get::<Delivery>() == Some(&Delivery::Delivered));
    assert_eq!(provider.posts.load(Ordering::SeqCst), 1, "never sent twice");
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty(),
        "no dead letter"
    );
}

#[tokio::test]
async fn not_delivered_is_retried_as_if_never_processed() {
    let provider = Provider::default();
    provider
        .stall_first_uncommitted
        .store(true, Ordering::SeqCst);
    let base = start(&provider).await;
    let store = MemoryStore::new();
    let response = stack(&store, &base)
        .oneshot(message(&base, "m-2"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(response.extensions().get::<Delivery>().is_none());
    assert_eq!(provider.posts.load(Ordering::SeqCst), 2, "resent once");
    assert!(provider.delivered.lock().unwrap().contains("m-2"));
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn still_unknown_is_dead_lettered_and_the_reconciler_settles_it_later() {
    let provider = Provider::default();
    provider.commit_then_stall.store(true, Ordering::SeqCst);
    provider.status_broken.store(true, Ordering::SeqCst);
    let base = start(&provider).await;
    let store = MemoryStore::new();
    let svc = stack(&store, &base);
    let failure = svc
        .clone()
        .oneshot(message(&base, "m-3"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(
        provider.posts.load(Ordering::SeqCst),
        1,
        "not sent blindly again"
    );
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let id = id.clone();

    // A second message the provider never got (it stalls without committing), also unknown.
    provider.commit_then_stall.store(false, Ordering::SeqCst);
    provider.posts.store(0, Ordering::SeqCst);
    provider
        .stall_first_uncommitted
        .store(true, Ordering::SeqCst);
    let lost = svc.oneshot(message(&base, "m-4")).await.unwrap_err();
    assert_eq!(lost.class(), Class::OUTCOME_UNKNOWN);
    let Some(DeadLetterStatus::Stored { id: lost_id }) = lost.note::<DeadLetterStatus>() else {
        panic!("{lost:?}");
    };
    let lost_id = lost_id.clone();

    // Still broken: the reconciler leaves both as they are.
    let reconciler = Reconciler::new(status_check(base.clone()));
    let report = reconciler.run(&store).await.unwrap();
    assert_eq!(report.unknown.len(), 2);
    assert!(report.delivered.is_empty() && report.not_delivered.is_empty());

    // The status endpoint is back: the delivered one is resolved, the lost one is due again.
    provider.status_broken.store(false, Ordering::SeqCst);
    let report = reconciler.run(&store).await.unwrap();
    assert_eq!(report.delivered, std::slice::from_ref(&id));
    assert_eq!(report.not_delivered, std::slice::from_ref(&lost_id));
    let r = store.get(&id).await.unwrap().unwrap();
    assert_eq!(r.status, Status::Resolved);
    assert_eq!(r.metadata["reconciled"], "delivered");
    let r = store.get(&lost_id).await.unwrap().unwrap();
    assert_eq!(r.status, Status::Deferred);
    assert!(r.retry_at.is_some());
    assert_eq!(r.metadata["reconciled"], "not_delivered");
    // Nothing outcome-unknown is left dead.
    let left = store
        .search(
            &Filter::new().class("outcome_unknown").status(Status::Dead),
            0..10,
        )
        .await
        .unwrap();
    assert!(left.is_empty());
    // A second run has nothing to do.
    let again = reconciler.run(&store).await.unwrap();
    assert_eq!(
        again.delivered.len() + again.not_delivered.len() + again.unknown.len(),
        0
    );
}

#[tokio::test]
async fn a_record_changed_while_checked_is_left_alone() {
    let store = MemoryStore::new();
    let f: tower_backstop::Failure =
        tower_backstop::Failure::new(Class::OUTCOME_UNKNOWN, tower_backstop::Code::Timeout);
    store
        .put(tower_backstop::dead_letter::record_of(
            "m-5".into(),
            Envelope::new("{\"id\":\"m-5\"}"),
            &f,
        ))
        .await
        .unwrap();
    // The check runs while an operator re-drives the record.
    let during = store.clone();
    let report = Reconciler::new(move |_: Envelope| {
        let during = during.clone();
        async move {
            let seen = during.get("m-5").await.unwrap().unwrap();
            during
                .claim(
                    &seen,
                    std::time::SystemTime::now() + Duration::from_secs(60),
                )
                .await
                .unwrap();
            Delivery::NotDelivered
        }
    })
    .run(&store)
    .await
    .unwrap();
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(report.skipped[0].1.contains("changed elsewhere"));
    let r = store.get("m-5").await.unwrap().unwrap();
    assert_eq!(r.status, Status::InFlight, "the re-drive's claim stands");
}

// The rules one by one, on the paused clock, with the scripted upstream of `support`.

mod support;

use support::{Scripted, Step, post_with_key, retry_stack};
use tower_backstop::{BackstopLayer, Sent};

type Req = http::Request<String>;
type Res = http::Response<()>;
/// The preset with a 50 ms attempt timeout and `check` as its retry policy's status check, with
/// `store` as its dead-letter store when given.
fn preset_with(check: impl StatusCheck, store: Option<&MemoryStore>) -> BackstopLayer {
    let layer = BackstopLayer::http(Duration::from_millis(50)).retry(
        RetryPolicy::new()
            .reconcile::<Req, Res>(check)
            .build()
            .unwrap(),
    );
    match store {
        Some(store) => layer.dead_letters(DeadLetterLayer::new(store.clone())),
        None => layer,
    }
}

/// A check answering `delivery`, counting its calls and keeping the payloads it saw.
fn answering(
    delivery: Delivery,
) -> (
    Arc<Mutex<Vec<Bytes>>>,
    impl Fn(Envelope) -> std::future::Ready<Delivery> + Send + Sync + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (seen, move |envelope: Envelope| {
        sink.lock().unwrap().push(envelope.payload);
        std::future::ready(delivery)
    })
}

fn reset() -> Step {
    Step::Io(std::io::ErrorKind::ConnectionReset)
}

#[tokio::test(start_paused = true)]
async fn retry_layer_alone_settles_each_verdict() {
    // Delivered: a stand-in response, marked, and the request is not sent again.
    let (seen, check) = answering(Delivery::Delivered);
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new().reconcile::<Req, Res>(check);
    let response = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"a\"}"))
        .await
        .unwrap();
    assert!(response.extensions().get::<Delivery>() == Some(&Delivery::Delivered));
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(upstream.calls(), 1, "never sent twice");
    assert_eq!(*seen.lock().unwrap(), [Bytes::from("{\"id\":\"a\"}")]);

    // Not delivered: treated as never sent, so resent by the normal rules.
    let (seen, check) = answering(Delivery::NotDelivered);
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new().reconcile::<Req, Res>(check);
    let response = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"b\"}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(response.extensions().get::<Delivery>().is_none());
    assert_eq!(upstream.calls(), 2, "resent once");
    assert_eq!(seen.lock().unwrap().len(), 1);

    // Not delivered, but resending unprocessed requests is off: given up, not sent again, and
    // the failure says it was not sent.
    let (_, check) = answering(Delivery::NotDelivered);
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new()
        .retry_unprocessed(false)
        .reconcile::<Req, Res>(check);
    let failure = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"c\"}"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.sent(), Sent::No);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );

    // Unknown: outcome-unknown, as without a check.
    let (seen, check) = answering(Delivery::Unknown);
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new().reconcile::<Req, Res>(check);
    let failure = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"d\"}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
    assert_eq!(failure.sent(), Sent::Maybe);
    assert_eq!(upstream.calls(), 1, "not sent blindly again");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn only_outcome_unknown_failures_of_unsafe_requests_are_checked() {
    let (seen, check) = answering(Delivery::Delivered);
    let policy = RetryPolicy::new().reconcile::<Req, Res>(check);

    // A keyed POST is safe to resend: retried, never checked.
    let upstream = Scripted::new([reset()], support::status(202));
    let response = retry_stack(policy.clone(), &upstream)
        .oneshot(post_with_key("/v1/messages", "{}", "k-1"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(upstream.calls(), 2);

    // A 500 was surely sent (a response came back): not checked, not resent.
    let upstream = Scripted::always(support::status(500));
    let failure = retry_stack(policy.clone(), &upstream)
        .oneshot(support::post("/v1/messages", "{}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::UNKNOWN);
    assert_eq!(upstream.calls(), 1);

    // A 503 surely was not processed: resent by the normal rules, not checked.
    let upstream = Scripted::new([support::status(503)], support::status(202));
    let response = retry_stack(policy.clone(), &upstream)
        .oneshot(support::post("/v1/messages", "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(upstream.calls(), 2);

    assert!(seen.lock().unwrap().is_empty(), "the check never ran");
}

#[tokio::test(start_paused = true)]
async fn the_last_attempt_and_a_single_attempt_are_checked_too() {
    // Two attempts: a refused connection (resent), then a reset on the last attempt.
    let (seen, check) = answering(Delivery::Delivered);
    let upstream = Scripted::new(
        [Step::Io(std::io::ErrorKind::ConnectionRefused), reset()],
        support::status(202),
    );
    let policy = RetryPolicy::new()
        .max_attempts(2)
        .reconcile::<Req, Res>(check);
    let response = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"e\"}"))
        .await
        .unwrap();
    assert!(response.extensions().get::<Delivery>() == Some(&Delivery::Delivered));
    assert_eq!(upstream.calls(), 2);
    assert_eq!(seen.lock().unwrap().len(), 1);

    // One attempt only: the retry layer keeps a copy for the check all the same.
    let (seen, check) = answering(Delivery::Delivered);
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new()
        .max_attempts(1)
        .reconcile::<Req, Res>(check);
    let response = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"f\"}"))
        .await
        .unwrap();
    assert!(response.extensions().get::<Delivery>() == Some(&Delivery::Delivered));
    assert_eq!(upstream.calls(), 1);
    assert_eq!(*seen.lock().unwrap(), [Bytes::from("{\"id\":\"f\"}")]);
}

#[tokio::test(start_paused = true)]
async fn backstop_layer_reconciles_with_and_without_a_store() {
    // Each attempt outlives the 50 ms per-attempt timeout: outcome unknown.
    let slow = || {
        Scripted::always(Step::After(
            Duration::from_secs(1),
            Box::new(support::status(202)),
        ))
    };

    // With a store: delivered is a success, and nothing is dead-lettered.
    let (seen, check) = answering(Delivery::Delivered);
    let store = MemoryStore::new();
    let upstream = slow();
    let response = ServiceBuilder::new()
        .layer(preset_with(check, Some(&store)))
        .service(upstream.clone())
        .oneshot(support::post("/v1/messages", "{\"id\":\"g\"}"))
        .await
        .unwrap();
    assert!(response.extensions().get::<Delivery>() == Some(&Delivery::Delivered));
    assert_eq!(upstream.calls(), 1);
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );

    // With a store: unknown is dead-lettered as outcome-unknown, with its payload.
    let (_, check) = answering(Delivery::Unknown);
    let store = MemoryStore::new();
    let upstream = slow();
    let failure = ServiceBuilder::new()
        .layer(preset_with(check, Some(&store)))
        .service(upstream.clone())
        .oneshot(support::post("/v1/messages", "{\"id\":\"h\"}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(upstream.calls(), 1);
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.class, "outcome_unknown");
    assert_eq!(record.payload, b"{\"id\":\"h\"}");

    // Without a store: not delivered is resent.
    let (_, check) = answering(Delivery::NotDelivered);
    let upstream = Scripted::new(
        [Step::After(
            Duration::from_secs(1),
            Box::new(support::status(202)),
        )],
        support::status(202),
    );
    let response = ServiceBuilder::new()
        .layer(preset_with(check, None))
        .service(upstream.clone())
        .oneshot(support::post("/v1/messages", "{\"id\":\"i\"}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(upstream.calls(), 2);
}

/// Dead letters → retry by `policy` → classify → the scripted upstream.
fn dead_letter_stack(
    store: &MemoryStore,
    policy: RetryPolicy,
    upstream: &Scripted,
) -> impl tower::Service<Req, Response = Res, Error = tower_backstop::Failure<Res>> {
    ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(policy.build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream.clone())
}

#[tokio::test(start_paused = true)]
async fn a_panicking_check_loses_nothing() {
    let store = MemoryStore::new();
    let upstream = Scripted::new([reset()], support::status(202));
    let policy = RetryPolicy::new().reconcile::<Req, Res>(|_: Envelope| async {
        panic!("the status endpoint's client panicked")
    });
    let failure = dead_letter_stack(&store, policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"j\"}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(upstream.calls(), 1, "not sent blindly again");
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.class, "outcome_unknown");
    assert_eq!(record.payload, b"{\"id\":\"j\"}");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_ends_a_hanging_check_and_keeps_its_failure() {
    let store = MemoryStore::new();
    let upstream = Scripted::new([reset()], support::status(202));
    let started = Arc::new(AtomicUsize::new(0));
    let count = started.clone();
    let policy = RetryPolicy::new()
        .deadline(Duration::from_secs(1))
        .reconcile::<Req, Res>(move |_: Envelope| {
            count.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Delivery>()
        });
    let begin = tokio::time::Instant::now();
    let failure = dead_letter_stack(&store, policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"k\"}"))
        .await
        .unwrap_err();
    assert_eq!(begin.elapsed(), Duration::from_secs(1));
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(
        failure.code(),
        tower_backstop::Code::Io(std::io::ErrorKind::ConnectionReset)
    );
    assert_eq!(upstream.calls(), 1);
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.class, "outcome_unknown");
    assert_eq!(record.payload, b"{\"id\":\"k\"}");
}

#[tokio::test(start_paused = true)]
async fn a_check_set_for_other_types_is_not_run_and_loses_nothing() {
    let store = MemoryStore::new();
    let upstream = Scripted::new([reset()], support::status(202));
    let (seen, check) = answering(Delivery::Delivered);
    // Set for `String` requests and `()` responses; the service takes and gives HTTP.
    let policy = RetryPolicy::new().reconcile::<String, ()>(check);
    let failure = dead_letter_stack(&store, policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"l\"}"))
        .await
        .unwrap_err();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(upstream.calls(), 1);
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));

    // The right request type, but another response type: not run either.
    let upstream = Scripted::new([reset()], support::status(202));
    let (seen, check) = answering(Delivery::Delivered);
    let policy = RetryPolicy::new().reconcile::<Req, http::Response<String>>(check);
    let failure = retry_stack(policy, &upstream)
        .oneshot(support::post("/v1/messages", "{\"id\":\"m\"}"))
        .await
        .unwrap_err();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(upstream.calls(), 1);
}
