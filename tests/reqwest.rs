//! End to end with reqwest (feature `reqwest`): the five layers around a real `reqwest::Client`,
//! against a real axum server on 127.0.0.1. Real short durations.
#![cfg(feature = "reqwest")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::store::{MemoryStore, SqliteStore, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{Class, Code};

/// A server whose `/flaky` answers 503 twice then 200, `/once-busy` (as its first call) 503 with
/// `Retry-After: 1` then 202, `/missing` 404, `/busy` 429 with
/// `Retry-After: 1`, `/bad-hint` 429 with a `Retry-After` that is not UTF-8, `/slow` after
/// 500 ms. Returns its base URL and the count of calls it saw.
async fn server() -> (String, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let router = axum::Router::new()
        .route("/{*path}", any(handler))
        .with_state(calls.clone());
    (support::serve(router).await, calls)
}

async fn handler(
    State(calls): State<Arc<AtomicU32>>,
    uri: axum::http::Uri,
    body: String,
) -> axum::response::Response {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    match uri.path() {
        "/flaky" if n <= 2 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "/flaky" => (StatusCode::OK, body).into_response(),
        "/missing" => StatusCode::NOT_FOUND.into_response(),
        "/once-busy" if n == 1 => {
            (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response()
        }
        "/once-busy" => StatusCode::ACCEPTED.into_response(),
        "/busy" => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response(),
        "/bad-hint" => {
            let mut headers = HeaderMap::new();
            headers.insert(
                "retry-after",
                HeaderValue::from_bytes(b"\xff\xfe1").unwrap(),
            );
            (StatusCode::TOO_MANY_REQUESTS, headers).into_response()
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            StatusCode::OK.into_response()
        }
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

fn fast_policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
}

/// A POST of `hello` to `url` with an `Idempotency-Key`: the message the examples send.
fn post_hello(client: &reqwest::Client, url: &str, key: &str) -> reqwest::Request {
    client
        .post(url)
        .header("idempotency-key", key)
        .body("hello")
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_readme_stack_wraps_a_reqwest_client_unchanged() {
    let (url, calls) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    // The snippet, with only the delays shortened.
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            SqliteStore::open(dir.path().join("dead_letters.db")).unwrap(),
        ))
        .layer(fast_policy(5).build().unwrap())
        .layer(BreakerLayer::consecutive_failures(5).open_for(Duration::from_secs(30)))
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(2)))
        .service(client.clone());
    let request = post_hello(&client, &format!("{url}/flaky"), "msg-1");
    let response = svc.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        "hello",
        "the body was replayed"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_404_is_permanent_sent_once_kept_and_dead_lettered_with_the_request() {
    let (url, calls) = server().await;
    let client = reqwest::Client::new();
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store.clone()))
        .layer(fast_policy(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client.clone());
    let request = client
        .put(format!("{url}/missing?x=1"))
        .header("content-type", "application/json")
        .header("idempotency-key", "k-404")
        .body("{\"a\":1}")
        .build()
        .unwrap();
    let mut f = svc.oneshot(request).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(f.class(), Class::PERMANENT);
    assert_eq!(f.code(), Code::Http(StatusCode::NOT_FOUND));
    assert_eq!(f.response_mut().unwrap().status(), 404);
    assert!(
        matches!(f.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "k-404")
    );
    let record = store.get("k-404").await.unwrap().unwrap();
    assert_eq!(record.metadata["method"], "PUT");
    assert_eq!(record.metadata["uri"], format!("{url}/missing?x=1"));
    assert_eq!(record.content_type.as_deref(), Some("application/json"));
    assert_eq!(&record.payload[..], b"{\"a\":1}");
}

#[tokio::test]
async fn retry_after_is_read_from_a_reqwest_response_and_a_bad_one_is_ignored() {
    let (url, _) = server().await;
    let client = reqwest::Client::new();
    let svc = ServiceBuilder::new()
        .layer(fast_policy(1).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client.clone());
    let request = client.get(format!("{url}/busy")).build().unwrap();
    let f = svc.clone().oneshot(request).await.unwrap_err();
    assert_eq!(f.class(), Class::THROTTLED);
    assert_eq!(f.retry_after(), Some(Duration::from_secs(1)));
    let request = client.get(format!("{url}/bad-hint")).build().unwrap();
    let f = svc.oneshot(request).await.unwrap_err();
    assert_eq!(f.class(), Class::THROTTLED);
    assert_eq!(
        f.retry_after(),
        None,
        "a header that is not UTF-8 is no hint"
    );
    assert!(f.into_response().is_some());
}

#[tokio::test]
async fn a_keyless_post_that_timed_out_is_outcome_unknown_with_either_timeout() {
    let (url, calls) = server().await;
    // Our per-attempt timeout, then reqwest's own.
    let ours = reqwest::Client::new();
    let theirs = reqwest::Client::builder()
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    for (client, ours_timeout) in [
        (ours, Duration::from_millis(50)),
        (theirs, Duration::from_secs(5)),
    ] {
        let svc = ServiceBuilder::new()
            .layer(fast_policy(3).build().unwrap())
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(ours_timeout))
            .service(client.clone());
        let before = calls.load(Ordering::SeqCst);
        let request = client
            .post(format!("{url}/slow"))
            .body("pay 10")
            .build()
            .unwrap();
        let f = svc.oneshot(request).await.unwrap_err();
        assert_eq!(f.class(), Class::OUTCOME_UNKNOWN);
        assert_eq!(f.code(), Code::Timeout);
        assert_eq!(
            f.note::<Attempts>().map(Attempts::give_up),
            Some(GiveUp::NotIdempotent)
        );
        assert_eq!(calls.load(Ordering::SeqCst) - before, 1, "never resent");
    }
}

#[tokio::test]
async fn a_refused_connection_proves_a_keyless_post_was_not_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = reqwest::Client::new();
    let svc = ServiceBuilder::new()
        .layer(fast_policy(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client.clone());
    let request = client
        .post(format!("http://{addr}/messages"))
        .body("hello")
        .build()
        .unwrap();
    let f = svc.oneshot(request).await.unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.code(), Code::Io(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(
        f.note::<Attempts>().map_or(0, Attempts::count),
        3,
        "resent although POST, as it never left"
    );
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
}

#[tokio::test]
async fn a_streaming_body_is_sent_once_and_kept_as_far_as_it_can_be() {
    let (url, calls) = server().await;
    let client = reqwest::Client::new();
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store.clone()))
        .layer(fast_policy(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client.clone());
    let body = reqwest::Body::wrap(http_body_util::Full::new(bytes::Bytes::from_static(
        b"streamed",
    )));
    let request = client
        .put(format!("{url}/unavailable"))
        .header("idempotency-key", "k-stream")
        .body(body)
        .build()
        .unwrap();
    let f = svc.oneshot(request).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotReplayable)
    );
    // The record exists and says why it has no payload (a request that cannot be copied cannot
    // be kept for the record either).
    let records = store.list(10).await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].metadata.contains_key("payload_missing"));
    // Its id is still the request's idempotency key, read before it was sent.
    assert_eq!(records[0].id, "k-stream");
    assert!(matches!(
        f.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));
}

#[tokio::test]
async fn the_preset_with_a_store_behind_a_buffer_defers_a_long_hint_and_the_scheduler_sends_it() {
    use tower_backstop::BackstopLayer;
    use tower_backstop::resend::{Scheduler, reqwest_request};
    use tower_backstop::store::Status;

    let (url, calls) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("dead_letters.db")).unwrap());
    let client = reqwest::Client::new();
    // The README's preset as a user writes it, with a 200 ms attempt timeout, shared through
    // tower's `Buffer`.
    let svc = ServiceBuilder::new()
        .layer(tower::buffer::BufferLayer::new(16))
        .layer(
            BackstopLayer::http(Duration::from_millis(200))
                .dead_letters(DeadLetterLayer::from_arc(store.clone())),
        )
        .service(client.clone());
    let request = post_hello(&client, &format!("{url}/once-busy"), "msg-busy");
    let error = svc.clone().oneshot(request).await.unwrap_err();
    // Through the `Buffer` the failure comes back whole.
    let failure = tower_backstop::Failure::<reqwest::Response>::from(error);
    assert!(
        failure
            .note::<Attempts>()
            .is_some_and(Attempts::is_deferred),
        "{failure}"
    );
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the 1 s hint was not slept"
    );
    let record = store.get("msg-busy").await.unwrap().unwrap();
    assert_eq!(record.status, Status::Deferred);

    // The scheduler, over the same stack, sends it when due: once.
    let scheduler = Scheduler::new(store.clone(), svc, |record| reqwest_request(record, None))
        .poll_every(Duration::from_millis(50))
        .spawn();
    let mut status = Status::Deferred;
    for _ in 0..100 {
        status = store.get("msg-busy").await.unwrap().unwrap().status;
        if status == Status::Resolved {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    scheduler.shutdown().await;
    assert_eq!(status, Status::Resolved);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
