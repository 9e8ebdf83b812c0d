//! Feature `tonic`: a generated client (tonic-health's `HealthClient`) takes the stack around a
//! real `Channel` as its channel, with `GrpcLayer` on top and no closures. A real tonic server on
//! 127.0.0.1. Real short durations.
#![cfg(feature = "tonic")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::ServiceBuilder;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::{ClassifyLayer, GrpcClassifier};
use tower_backstop::retry::{Backoff, RetryPolicy};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, GrpcLayer};

/// A health server; with `fail`, every call is refused by an interceptor with UNAVAILABLE
/// ("provider down"), answered trailers-only. Returns its address and its call count.
async fn health_server(fail: bool) -> (std::net::SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let svc = InterceptedService::new(health, move |req: tonic::Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        if fail {
            Err(tonic::Status::unavailable("provider down"))
        } else {
            Ok(req)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    (addr, calls)
}

fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(attempts)
        .assume_idempotent(true)
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
}

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

#[tokio::test]
async fn a_generated_client_takes_the_stack_and_gets_the_servers_own_status() {
    let (addr, calls) = health_server(true).await;
    // The stack, with `GrpcLayer` on top.
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(policy(3).build().unwrap())
        .layer(BreakerLayer::consecutive_failures(5))
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "provider down");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "retried to the attempt cap"
    );

    // A healthy server: the answer comes through.
    let (addr, calls) = health_server(false).await;
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(BackstopLayer::grpc(Duration::from_secs(1)))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let response = client.check(check("")).await.unwrap().into_inner();
    assert_eq!(
        response.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_open_breaker_is_unavailable_at_once() {
    let (addr, calls) = health_server(true).await;
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(policy(1).build().unwrap())
        .layer(BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(30)))
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let first = client.check(check("")).await.unwrap_err();
    assert_eq!(first.message(), "provider down");
    let second = client.check(check("")).await.unwrap_err();
    assert_eq!(second.code(), tonic::Code::Unavailable);
    assert!(second.message().contains("circuit_open"), "{second:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the open breaker sent nothing"
    );
}

#[tokio::test]
async fn our_timeout_is_deadline_exceeded() {
    // A server that accepts connections and never answers (not even the HTTP/2 handshake).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(policy(2).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(TimeoutLayer::new(Duration::from_millis(50)))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
}

#[tokio::test]
async fn a_refused_connection_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(policy(2).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

#[tokio::test]
async fn a_request_larger_than_the_replay_buffer_is_sent_once() {
    // gRFC A6: past the buffer limit, no more retries for that call; the call itself still goes
    // out whole and the caller gets the server's status.
    let (addr, calls) = health_server(true).await;
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::with_buffer(8))
        .layer(policy(3).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .service(channel(addr));
    let mut client = HealthClient::new(stack);
    let status = client
        .check(check("a-service-name-longer-than-eight-bytes"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "provider down");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// tonic-health's service, answering after `delay`.
#[derive(Clone)]
struct Slow<S> {
    inner: S,
    delay: Duration,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Slow<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Slow<S>
where
    S: tower::Service<http::Request<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let future = self.inner.call(req);
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            future.await
        })
    }
}

#[tokio::test]
async fn the_server_flavours_answer_deadline_exceeded_then_unavailable_with_pushback() {
    use tower_backstop::server::ServerLayer;

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        Server::builder()
            .layer(
                ServerLayer::grpc()
                    .timeout(Duration::from_millis(50))
                    .breaker(
                        BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(30)),
                    ),
            )
            .add_service(Slow {
                inner: health,
                delay: Duration::from_secs(5),
            })
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    let mut client = HealthClient::new(channel(addr));
    for _ in 0..2 {
        let status = client.check(check("")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    }
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "circuit open");
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29_000..=30_000).contains(&pushback), "{pushback}");
}
