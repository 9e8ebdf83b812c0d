//! Request bodies end to end: a real axum server on 127.0.0.1 and a real hyper-util client.
//! Cloneable bodies are replayed as they are; other bodies through the bounded replay buffer;
//! a body above the buffer's limit is never retried. Real short durations.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::request::BufferedBody;
use tower_backstop::retry::{Attempts, Backoff, GiveUp, ReplayBufferLayer, RetryPolicy};
use tower_backstop::{Class, Failure};

/// What the server saw of one request: body, `Content-Length`, `Idempotency-Key`.
type Seen = (Bytes, Option<String>, Option<String>);

/// A server that answers `first` to the first request, then 200, recording every request.
async fn server(first: StatusCode) -> (String, Arc<Mutex<Vec<Seen>>>) {
    #[derive(Clone)]
    struct S {
        seen: Arc<Mutex<Vec<Seen>>>,
        first: StatusCode,
    }
    async fn handle(State(s): State<S>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        let n = {
            let mut seen = s.seen.lock().unwrap();
            seen.push((body, header("content-length"), header("idempotency-key")));
            seen.len()
        };
        if n == 1 { s.first } else { StatusCode::OK }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = axum::Router::new()
        .route("/messages", post(handle).put(handle))
        .with_state(S {
            seen: seen.clone(),
            first,
        });
    (support::serve(router).await, seen)
}

fn policy() -> RetryPolicy {
    RetryPolicy::new().backoff(Backoff::exponential(
        Duration::from_millis(5),
        Duration::from_millis(20),
    ))
}

fn kib() -> Bytes {
    (0..1024u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn post_of_one_kib_answered_500_then_200_is_replayed_byte_for_byte() {
    let (base, seen) = server(StatusCode::INTERNAL_SERVER_ERROR).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // A 500 does not prove the POST was not processed, so it is retried only with a key: the
    // key layer stamps one.
    let svc = ServiceBuilder::new()
        .layer(
            tower_http::set_header::SetRequestHeaderLayer::if_not_present(
                tower_backstop::request::IDEMPOTENCY_KEY.clone(),
                |_: &http::Request<_>| Some(tower_backstop::request::new_idempotency_key()),
            ),
        )
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client);
    let request = http::Request::post(format!("{base}/messages"))
        .body(Full::new(kib()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (body, content_length, _) in seen.iter() {
        assert_eq!(body, &kib(), "byte-identical");
        assert_eq!(content_length.as_deref(), Some("1024"));
    }
    assert_eq!(seen[0].2, seen[1].2, "the same idempotency key");
    assert!(seen[0].2.is_some());
}

type Chunks = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, Infallible>>>,
>;

/// A streaming body of 1 KiB in 8 chunks: not cloneable.
fn streaming() -> Chunks {
    let data = kib();
    let frames: Vec<_> = data
        .chunks(128)
        .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

/// PUTs the streaming body through a replay buffer of `limit` bytes to a server that answers 503
/// first; the outcome and what the server saw.
async fn put_streaming(
    limit: usize,
) -> (
    Result<http::Response<Incoming>, Failure<http::Response<Incoming>>>,
    Arc<Mutex<Vec<Seen>>>,
) {
    let (base, seen) = server(StatusCode::SERVICE_UNAVAILABLE).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<BufferedBody<Chunks>>();
    let svc = ServiceBuilder::new()
        .layer(ReplayBufferLayer::new(limit))
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client);
    let request = http::Request::put(format!("{base}/messages"))
        .header("content-length", "1024")
        .body(streaming())
        .unwrap();
    (svc.oneshot(request).await, seen)
}

#[tokio::test]
async fn a_streaming_body_is_replayed_through_the_bounded_buffer() {
    let (result, seen) = put_streaming(4096).await;
    let response = result.unwrap();
    assert_eq!(response.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (body, content_length, _) in seen.iter() {
        assert_eq!(body, &kib());
        assert_eq!(content_length.as_deref(), Some("1024"));
    }
}

#[tokio::test]
async fn a_body_above_the_buffer_limit_is_sent_whole_once_and_never_retried() {
    let (result, seen) = put_streaming(100).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotReplayable)
    );
    assert!(
        failure.to_string().contains("cannot be replayed"),
        "{failure}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "never retried");
    assert_eq!(seen[0].0, kib(), "but sent in full");
}

/// A service that counts its clones and records each body it gets, answering 503 first.
struct Recording {
    clones: Arc<std::sync::atomic::AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Recording {
    /// The service, its clone count and the bodies it got.
    #[allow(clippy::type_complexity)]
    fn new() -> (
        Self,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<Mutex<Vec<Bytes>>>,
    ) {
        let (clones, bodies) = (Arc::default(), Arc::default());
        let service = Recording {
            clones: Arc::clone(&clones),
            bodies: Arc::clone(&bodies),
        };
        (service, clones, bodies)
    }
}

impl Clone for Recording {
    fn clone(&self) -> Self {
        self.clones
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Recording {
            clones: self.clones.clone(),
            bodies: self.bodies.clone(),
        }
    }
}

impl<B> tower::Service<http::Request<BufferedBody<B>>> for Recording
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Debug,
{
    type Response = http::Response<()>;
    type Error = tower_backstop::BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<BufferedBody<B>>) -> Self::Future {
        use http_body_util::BodyExt;
        let bodies = self.bodies.clone();
        Box::pin(async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let n = {
                let mut bodies = bodies.lock().unwrap();
                bodies.push(body);
                bodies.len()
            };
            let status = if n == 1 { 503 } else { 200 };
            Ok(http::Response::builder().status(status).body(()).unwrap())
        })
    }
}

#[tokio::test]
async fn a_body_there_at_once_is_read_in_call_without_a_clone_of_the_service() {
    let (service, clones, bodies) = Recording::new();
    let svc = ServiceBuilder::new()
        .layer(ReplayBufferLayer::new(4096))
        .service(service);
    let request = http::Request::put("http://mail.test/")
        .body(streaming())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(clones.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(bodies.lock().unwrap()[0], kib());
}

#[tokio::test]
async fn a_body_that_arrives_later_is_read_by_the_future_and_replayed() {
    let (service, _, bodies) = Recording::new();
    let svc = ServiceBuilder::new()
        .layer(ReplayBufferLayer::new(4096))
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::http())
        .service(service);
    // Frames sent after the call: the body is pending when `call` looks at it.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, Infallible>>(8);
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    }));
    let request = http::Request::put("http://mail.test/")
        .body(Box::pin(body))
        .unwrap();
    let call = tokio::spawn(svc.oneshot(request));
    for chunk in kib().chunks(256) {
        tokio::task::yield_now().await;
        tx.send(Ok(http_body::Frame::data(Bytes::copy_from_slice(chunk))))
            .await
            .unwrap();
    }
    drop(tx);
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2);
    assert!(bodies.iter().all(|b| b == &kib()), "replayed byte for byte");
}

/// A streaming body through a replay buffer of `limit` bytes, a dead-letter layer and a breaker
/// an operator forced open: the call is refused before it left. With a copy (a body within the
/// buffer) the record keeps it for a re-drive; without one (a body above the buffer) there is
/// nothing a record could send again: none is written, and the caller gets the refusal as it is.
async fn refused_by_a_forced_open_breaker(
    limit: usize,
) -> (
    Result<http::Response<Incoming>, Failure<http::Response<Incoming>>>,
    usize,
    usize,
) {
    use tower_backstop::breaker::BreakerLayer;
    use tower_backstop::dead_letter::DeadLetterLayer;
    use tower_backstop::store::{Filter, MemoryStore, Store};
    let (base, seen) = server(StatusCode::OK).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<BufferedBody<Chunks>>();
    let breaker = BreakerLayer::new();
    breaker.handle().force_open();
    let store = MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(ReplayBufferLayer::new(limit))
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(client);
    let request = http::Request::put(format!("{base}/messages"))
        .header("content-length", "1024")
        .body(streaming())
        .unwrap();
    let result = svc.oneshot(request).await;
    let records = store.search(&Filter::new(), 0..10).await.unwrap().len();
    let received = seen.lock().unwrap().len();
    (result, records, received)
}

#[tokio::test]
async fn a_refused_request_with_no_copy_is_handed_back_not_stored() {
    use tower_backstop::dead_letter::DeadLetterStatus;
    use tower_backstop::{Code, Sent};
    let (result, records, received) = refused_by_a_forced_open_breaker(16).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.code(), Code::CircuitOpen);
    assert_eq!(failure.sent(), Sent::No);
    assert!(failure.note::<DeadLetterStatus>().is_none(), "{failure:?}");
    assert_eq!((records, received), (0, 0), "no record, nothing sent");

    // With a copy, the same refusal is kept for a re-drive.
    let (result, records, received) = refused_by_a_forced_open_breaker(4096).await;
    let failure = result.unwrap_err();
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));
    assert_eq!((records, received), (1, 0));
}
