//! gRPC end to end: a real tonic server on 127.0.0.1 (tonic-health's service, and a small
//! hand-written service that sends its status in trailers), called through a real tonic
//! `Channel` with the retry and classify layers around it. Real short durations.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Server};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::{BufferResponseLayer, ClassifyLayer, GrpcClassifier, codes};
use tower_backstop::request::BufferedBody;
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::{Class, Code};

/// Serves `router`'s services on 127.0.0.1:0; returns the address.
async fn serve(router: tonic::transport::server::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    addr
}

/// A health server whose every call is refused with UNAVAILABLE by an interceptor: tonic
/// answers trailers-only (the status in the response headers).
async fn always_unavailable() -> (std::net::SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let svc = InterceptedService::new(health, move |_req: tonic::Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unavailable("provider down"))
    });
    (serve(Server::builder().add_service(svc)).await, calls)
}

/// A `grpc.health.v1.Health/Check` request for `service`, encoded by hand (one
/// length-prefixed protobuf message: field 1, the service name).
fn health_check(addr: std::net::SocketAddr, service: &str) -> http::Request<Full<Bytes>> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        message.push(service.len() as u8);
        message.extend_from_slice(service.as_bytes());
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(frame)))
        .unwrap()
}

fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

fn policy() -> RetryPolicy {
    // Every gRPC call is a POST: the policy is told the method is idempotent (gRFC A6 leaves
    // retryability to the service config).
    RetryPolicy::new()
        .max_attempts(4)
        .assume_idempotent(true)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
}

fn to_tonic(req: http::Request<Full<Bytes>>) -> http::Request<tonic::body::Body> {
    req.map(tonic::body::Body::new)
}

#[tokio::test]
async fn always_unavailable_trailers_only_is_retried_per_policy() {
    let (addr, calls) = always_unavailable().await;
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .map_request(to_tonic)
        .service(channel(addr));
    let failure = svc.oneshot(health_check(addr, "")).await.unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "max_attempts(4): four calls"
    );
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::Grpc(codes::UNAVAILABLE));
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 4);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    // The last response is still there, with its status in the headers.
    let response = failure.into_response().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
}

#[tokio::test]
async fn not_found_is_permanent_and_ok_is_success() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("mail", tonic_health::ServingStatus::Serving)
        .await;
    let addr = serve(Server::builder().add_service(health)).await;
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(BufferResponseLayer::new(64 * 1024))
        .map_request(to_tonic)
        .service(channel(addr));
    let failure = svc
        .clone()
        .oneshot(health_check(addr, "nope"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::PERMANENT);
    assert_eq!(failure.code(), Code::Grpc(codes::NOT_FOUND));
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);

    let response = svc.oneshot(health_check(addr, "mail")).await.unwrap();
    // A real answer: one message (status SERVING = 1), then grpc-status 0 in the trailers.
    let body = response.body().bytes().unwrap();
    assert_eq!(&body[..], &[0, 0, 0, 0, 2, 0x08, 0x01]);
    assert_eq!(response.body().trailers().unwrap()["grpc-status"], "0");
}

/// A gRPC service that answers one message, then `grpc-status: 14` in the trailers (not
/// trailers-only), counting calls.
#[derive(Clone, Default)]
struct StatusInTrailers {
    calls: Arc<AtomicU32>,
}

impl NamedService for StatusInTrailers {
    const NAME: &'static str = "test.StatusInTrailers";
}

impl tower::Service<http::Request<tonic::body::Body>> for StatusInTrailers {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "14".parse().unwrap());
        trailers.insert("grpc-message", "draining".parse().unwrap());
        let body =
            BufferedBody::<Full<Bytes>>::new(Bytes::from_static(&[0, 0, 0, 0, 0]), Some(trailers));
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::new(body))
            .unwrap();
        std::future::ready(Ok(response))
    }
}

fn trailers_request(addr: std::net::SocketAddr) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{addr}/test.StatusInTrailers/Call"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap()
}

#[tokio::test]
async fn status_in_trailers_is_classified_when_the_response_is_buffered() {
    let service = StatusInTrailers::default();
    let calls = service.calls.clone();
    let addr = serve(Server::builder().add_service(service)).await;
    let svc = ServiceBuilder::new()
        .layer(policy().max_attempts(3).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(BufferResponseLayer::new(64 * 1024))
        .map_request(to_tonic)
        .service(channel(addr));
    let failure = svc.oneshot(trailers_request(addr)).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::Grpc(codes::UNAVAILABLE));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn status_in_trailers_without_the_buffer_is_seen_too_late() {
    // The documented limit: without BufferResponseLayer the classifier sees only the headers,
    // so the call is a success at classification time and is not retried; the status comes at
    // the end of the body, to the caller.
    let service = StatusInTrailers::default();
    let calls = service.calls.clone();
    let addr = serve(Server::builder().add_service(service)).await;
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .map_request(to_tonic)
        .service(channel(addr));
    let response = svc.oneshot(trailers_request(addr)).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    use http_body_util::BodyExt;
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "14");
}

#[tokio::test]
async fn tonic_connect_errors_are_transient() {
    // A port with nothing listening: the connection is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let svc = ServiceBuilder::new()
        .layer(policy().max_attempts(2).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .map_request(to_tonic)
        .service(channel(addr));
    let failure = svc.oneshot(health_check(addr, "")).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT, "{failure}");
    assert_eq!(
        failure.code(),
        Code::Io(std::io::ErrorKind::ConnectionRefused),
        "found in tonic's error chain"
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 2);
}

/// A gRPC service whose first call is refused at once with trailers-only `UNAVAILABLE`, and
/// whose later calls are never answered (the server is stuck), counting calls.
#[derive(Clone, Default)]
struct RefusedThenStuck {
    calls: Arc<AtomicU32>,
}

impl NamedService for RefusedThenStuck {
    const NAME: &'static str = "test.RefusedThenStuck";
}

impl tower::Service<http::Request<tonic::body::Body>> for RefusedThenStuck {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return Box::pin(std::future::pending());
        }
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-message", "provider down")
            .body(tonic::body::Body::empty())
            .unwrap();
        Box::pin(std::future::ready(Ok(response)))
    }
}

/// The deadline ends a call whose last attempt the server never answered: the caller gets the
/// server's last real answer (`UNAVAILABLE`, from the first attempt), not a timeout, and the
/// reason for giving up is the deadline.
#[tokio::test]
async fn at_the_deadline_the_caller_gets_the_servers_last_real_answer() {
    let service = RefusedThenStuck::default();
    let calls = service.calls.clone();
    let addr = serve(Server::builder().add_service(service)).await;
    let svc = ServiceBuilder::new()
        .layer(
            policy()
                .deadline(Duration::from_millis(300))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .map_request(to_tonic)
        .service(channel(addr));
    let request = http::Request::post(format!("http://{addr}/test.RefusedThenStuck/Call"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let started = std::time::Instant::now();
    let failure = svc.oneshot(request).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "refused, then stuck");
    assert_eq!(failure.class(), Class::TRANSIENT, "{failure}");
    assert_eq!(failure.code(), Code::Grpc(codes::UNAVAILABLE), "{failure}");
    let note = failure.note::<Attempts>().expect("the retry layer's note");
    assert_eq!(
        (note.count(), note.give_up()),
        (2, GiveUp::DeadlineExceeded)
    );
    // The server's own answer is still there.
    let response = failure.into_response().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
}
