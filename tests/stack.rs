//! End to end: the five layers around a real hyper-util client, against real servers on
//! 127.0.0.1 (axum, and a raw TCP server that resets connections). Real short durations.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryLayer, RetryPolicy};
use tower_backstop::store::{Filter, SqliteStore, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{Class, Code};

type Body = Full<Bytes>;

fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn policy() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(3)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .max_delay(Duration::from_secs(2))
}

fn request(url: &str, key: Option<&str>, body: &'static [u8]) -> http::Request<Body> {
    let mut b = http::Request::post(url).header("content-type", "application/json");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(body))).unwrap()
}

/// What the provider saw of one request: its idempotency key, body and `Content-Length`.
type Seen = (Option<String>, Bytes, Option<String>);

#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<Seen>>>,
    delivered: Arc<Mutex<HashMap<String, u32>>>,
}

async fn flaky(State(p): State<Provider>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    let len = headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    let n = {
        let mut seen = p.seen.lock().unwrap();
        seen.push((key.clone(), body, len));
        seen.len()
    };
    if n <= 2 {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    *p.delivered
        .lock()
        .unwrap()
        .entry(key.unwrap_or_default())
        .or_default() += 1;
    StatusCode::ACCEPTED
}

#[tokio::test]
async fn five_layers_deliver_through_a_flaky_provider_once() {
    let provider = Provider::default();
    let base = support::serve(
        axum::Router::new()
            .route("/v1/messages", post(flaky))
            .with_state(provider.clone()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("dl.db")).unwrap();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(policy().build().unwrap())
        .layer(BreakerLayer::consecutive_failures(5))
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(2)))
        .service(client());
    let body: &[u8] = b"{\"to\":\"a@example.com\",\"subject\":\"hi\"}";
    let response = svc
        .clone()
        .oneshot(request(&format!("{base}/v1/messages"), Some("msg-1"), body))
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let seen = provider.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for (key, bytes, len) in &seen {
        assert_eq!(key.as_deref(), Some("msg-1"));
        assert_eq!(&bytes[..], body);
        assert_eq!(len.as_deref(), Some(body.len().to_string().as_str()));
    }
    assert_eq!(provider.delivered.lock().unwrap()["msg-1"], 1);
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn exhausted_request_is_dead_lettered_in_sqlite() {
    async fn always_500() -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
    let base = support::serve(axum::Router::new().route("/v1/messages", post(always_500))).await;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("dl.db")).unwrap();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client());
    let f = svc
        .oneshot(request(
            &format!("{base}/v1/messages"),
            Some("msg-500"),
            b"{\"x\":1}",
        ))
        .await
        .unwrap_err();
    // `unknown` is retried cautiously: 2 attempts, whatever `max_attempts` allows.
    assert_eq!(f.class(), Class::UNKNOWN);
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert!(
        matches!(f.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "msg-500")
    );
    let r = store.get("msg-500").await.unwrap().unwrap();
    assert_eq!((r.attempts, r.code.as_str()), (2, "http 500"));
    assert_eq!(r.payload, b"{\"x\":1}");
}

/// A raw HTTP/1.1 server: resets the first `resets` connections after reading the request head,
/// answers 202 after that. Returns its URL and the idempotency keys it saw, one per connection.
async fn resetting_server(resets: u32) -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let count = AtomicU32::new(0);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf[len..]).await.unwrap();
                if n == 0 {
                    break;
                }
                len += n;
            }
            let head = String::from_utf8_lossy(&buf[..len]).to_lowercase();
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("idempotency-key:"))
                .map(|v| v.trim().to_owned());
            seen.lock().unwrap().push(key);
            if count.fetch_add(1, Ordering::SeqCst) < resets {
                stream.set_zero_linger().unwrap();
                drop(stream);
            } else {
                stream
                    .write_all(
                        b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await
                    .unwrap();
            }
        }
    });
    (url, keys)
}

#[tokio::test]
async fn reset_post_is_retried_only_with_a_key() {
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client());

    let (url, keys) = resetting_server(1).await;
    let f = svc
        .clone()
        .oneshot(request(&url, None, b"{\"amount\":100}"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::OUTCOME_UNKNOWN, "{f}");
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
    assert_eq!(
        keys.lock().unwrap().len(),
        1,
        "a POST without a key is sent once"
    );

    let (url, keys) = resetting_server(1).await;
    let response = svc
        .clone()
        .oneshot(request(&url, Some("pay-7"), b"{\"amount\":100}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(
        *keys.lock().unwrap(),
        vec![Some("pay-7".to_owned()), Some("pay-7".to_owned())]
    );
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client());
    let f = svc
        .oneshot(request(&url, Some("k"), b"{}"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.code(), Code::Io(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 3);
}

#[tokio::test]
async fn slow_handler_is_cut_per_attempt_and_breaker_stops_calls() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let base = support::serve(axum::Router::new().route(
        "/slow",
        post(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(500)).await;
                StatusCode::ACCEPTED
            }
        }),
    ))
    .await;
    let breaker = BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(60));
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(policy().max_attempts(2).build().unwrap())
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_millis(50)))
        .service(client());
    let start = std::time::Instant::now();
    let f = svc
        .clone()
        .oneshot(request(&format!("{base}/slow"), Some("k1"), b"{}"))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(f.code(), Code::Timeout);
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(handle.state(), tower_backstop::breaker::State::Open);

    let f = svc
        .oneshot(request(&format!("{base}/slow"), Some("k2"), b"{}"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "an open breaker sends nothing"
    );
}

#[test]
fn the_stack_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>(_: &T) {}
    let store = tower_backstop::store::MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store))
        .layer(RetryLayer::default())
        .layer(BreakerLayer::new())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .check_clone()
        .service(client());
    check(&svc);
}
