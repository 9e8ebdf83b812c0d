//! The server flavours over fallible inner layers (tower's `LoadShed`, `ConcurrencyLimit`,
//! `Timeout`) and the client's `grpc-timeout`: real axum and tonic servers on 127.0.0.1 with
//! real hyper-util and tonic clients, and the malformed `grpc-timeout` values on the paused
//! clock.
#![cfg(feature = "tonic")]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::server::ServerLayer;

async fn get_status(base: &str) -> (u16, Option<String>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(format!("{base}/work").parse().unwrap())
        .await
        .unwrap();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    (status, retry_after)
}

#[tokio::test]
async fn a_shed_call_is_503_with_retry_after_and_not_a_breaker_failure() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let server = ServerLayer::new().breaker(BreakerLayer::consecutive_failures(2));
    let breaker = server.handle().unwrap();
    let app = Router::new()
        .route(
            "/work",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }
            }),
        )
        // Routes made once, so that the one concurrency slot is shared by every request
        // (axum makes a handler's route per request until the router has its state).
        .with_state(())
        .layer(
            ServiceBuilder::new()
                .layer(server)
                .load_shed()
                .concurrency_limit(1),
        );
    let base = support::serve(app).await;
    let slow = tokio::spawn({
        let base = base.clone();
        async move { get_status(&base).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // While the one slot is taken, every other call is shed: 503, come back in a second.
    for _ in 0..5 {
        assert_eq!(get_status(&base).await, (503, Some("1".to_owned())));
    }
    assert_eq!(slow.await.unwrap(), (200, None));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Five sheds did not open a breaker that opens after two failures.
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(get_status(&base).await, (200, None));
}

#[tokio::test]
async fn a_towers_timeout_inside_is_504_and_counts() {
    let server = ServerLayer::new().breaker(BreakerLayer::consecutive_failures(2));
    let breaker = server.handle().unwrap();
    let app = Router::new()
        .route(
            "/work",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "late"
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(server)
                .timeout(Duration::from_millis(30)),
        );
    let base = support::serve(app).await;
    assert_eq!(get_status(&base).await.0, 504);
    assert_eq!(get_status(&base).await.0, 504);
    // Two timeouts are two failures: the breaker opened, and answers 503 itself.
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(get_status(&base).await.0, 503);
}

/// A layer that waits `delay` before calling the inner service.
#[derive(Clone)]
struct Slow<S> {
    inner: S,
    delay: Duration,
}

impl<S, B> Service<http::Request<B>> for Slow<S>
where
    S: Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            inner.call(req).await
        })
    }
}

/// A tonic health server behind `server`, load shedding with one slot, each call `delay` long.
async fn grpc_server(server: ServerLayer, delay: Duration) -> std::net::SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(
                ServiceBuilder::new()
                    .layer(server)
                    .load_shed()
                    .concurrency_limit(1)
                    .layer_fn(move |inner| Slow { inner, delay }),
            )
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    addr
}

fn client(addr: std::net::SocketAddr) -> HealthClient<tonic::transport::Channel> {
    HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy(),
    )
}

#[tokio::test]
async fn under_tonic_a_shed_call_is_unavailable_with_pushback() {
    let addr = grpc_server(ServerLayer::grpc(), Duration::from_millis(300)).await;
    let mut first = client(addr);
    let slow = tokio::spawn(async move { first.check(HealthCheckRequest::default()).await });
    tokio::time::sleep(Duration::from_millis(80)).await;
    let status = client(addr)
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    // Not tonic's RESOURCE_EXHAUSTED: UNAVAILABLE, which clients retry, with gRFC A6's pushback.
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    assert!(slow.await.unwrap().is_ok());
}

#[tokio::test]
async fn the_grpc_flavour_answers_the_clients_deadline_itself() {
    let addr = grpc_server(
        ServerLayer::grpc().timeout(Duration::from_secs(10)),
        Duration::from_millis(500),
    )
    .await;
    // hyper-util's HTTP/2 client, which (unlike tonic's channel) does not time the call out
    // itself: the server's answer is what comes back.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    let request = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "30m")
        // One empty message: HealthCheckRequest { service: "" }.
        .body(http_body_util::Full::new(Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let started = std::time::Instant::now();
    let response = client.request(request).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(400));
    // Trailers-only DEADLINE_EXCEEDED, ours, not tonic's CANCELLED.
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(response.headers()["grpc-message"], "handler timed out");

    // A generated client through our stack with its own deadline: DEADLINE_EXCEEDED too,
    // whichever side's timer ends it first.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(tower_backstop::GrpcLayer::new())
        .layer(tower_backstop::BackstopLayer::grpc(Duration::from_secs(5)))
        .service(channel);
    let mut request = tonic::Request::new(HealthCheckRequest::default());
    request.set_timeout(Duration::from_millis(30));
    let status = HealthClient::new(stack).check(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
}

/// The gRPC flavour over a handler that answers after `delay`, on the paused clock: the answer's
/// `grpc-status` (`None` for the handler's own) for a request with `grpc-timeout: value`.
async fn status_for(value: &str, own: Option<Duration>, delay: Duration) -> Option<String> {
    let mut layer = ServerLayer::grpc();
    if let Some(own) = own {
        layer = layer.timeout(own);
    }
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |_: http::Request<()>| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(http::Response::new(tonic::body::Body::empty()))
        }));
    let request = http::Request::builder()
        .header("grpc-timeout", value)
        .body(())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn malformed_grpc_timeouts_are_ignored_and_zero_is_already_over() {
    let second = Duration::from_secs(1);
    // Honoured: 30 ms against a handler of a second.
    let started = tokio::time::Instant::now();
    assert_eq!(status_for("30m", None, second).await.as_deref(), Some("4"));
    assert_eq!(started.elapsed(), Duration::from_millis(30));
    // The shorter of the client's and ours.
    let started = tokio::time::Instant::now();
    assert_eq!(
        status_for("5S", Some(Duration::from_millis(200)), second)
            .await
            .as_deref(),
        Some("4")
    );
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    // Zero: over at once.
    let started = tokio::time::Instant::now();
    assert_eq!(status_for("0n", None, second).await.as_deref(), Some("4"));
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Malformed, over 8 digits, an unknown unit: ignored, the handler answers.
    for bad in ["123456789S", "5x", "", "-1S", "1.5S", "S"] {
        assert_eq!(status_for(bad, None, second).await, None, "{bad:?}");
    }
    // Ignored, but our own timeout still applies.
    assert_eq!(
        status_for("5x", Some(Duration::from_millis(10)), second)
            .await
            .as_deref(),
        Some("4")
    );
}
