//! A tonic client and server in one process (feature `tonic`): tonic-health's generated
//! `HealthClient` takes the stack around a real `Channel` as its channel, with `GrpcLayer` on top
//! and no closures. The server is unavailable for its first two calls, then serves. A second
//! server is always unavailable: the caller gets that server's own status. Exits non-zero when an
//! outcome is not the expected one.
//!
//! ```sh
//! cargo run --example grpc --features tonic
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::ServiceBuilder;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::GrpcClassifier;
use tower_backstop::retry::{Backoff, RetryPolicy};
use tower_backstop::{Backstop, BackstopLayer, Grpc, GrpcLayer};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A health server that refuses its first `failures` calls with UNAVAILABLE.
async fn server(failures: u32) -> Result<(String, Arc<AtomicU32>), Error> {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let svc = InterceptedService::new(health, move |req: tonic::Request<()>| {
        if counter.fetch_add(1, Ordering::SeqCst) < failures {
            Err(tonic::Status::unavailable("warming up"))
        } else {
            Ok(req)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming),
    );
    Ok((url, calls))
}

/// The stack's type: `GrpcLayer` over `BackstopLayer::grpc` around the channel.
type Stack = Grpc<Backstop<Channel, GrpcClassifier, BreakerLayer>>;

fn client(url: String) -> Result<HealthClient<Stack>, Error> {
    let channel = Channel::from_shared(url)?.connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(
            BackstopLayer::grpc(Duration::from_secs(1)).retry(
                RetryPolicy::grpc()
                    .backoff(Backoff::exponential(
                        Duration::from_millis(10),
                        Duration::from_millis(100),
                    ))
                    .build()?,
            ),
        )
        .service(channel);
    Ok(HealthClient::new(stack))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (url, calls) = server(2).await?;
    let mut health = client(url)?;
    let answer = health
        .check(HealthCheckRequest::default())
        .await?
        .into_inner();
    println!(
        "check: status {} after {} calls",
        answer.status,
        calls.load(Ordering::SeqCst)
    );
    if calls.load(Ordering::SeqCst) != 3 {
        return Err("the check should succeed on the third call".into());
    }

    let (url, calls) = server(u32::MAX).await?;
    let mut health = client(url)?;
    match health.check(HealthCheckRequest::default()).await {
        Ok(_) => return Err("an always-unavailable server cannot answer".into()),
        Err(status) => {
            println!(
                "check: {:?} {:?} after {} calls",
                status.code(),
                status.message(),
                calls.load(Ordering::SeqCst)
            );
            if status.code() != tonic::Code::Unavailable || status.message() != "warming up" {
                return Err("the caller should get the server's own status".into());
            }
            if calls.load(Ordering::SeqCst) != 5 {
                return Err("RetryPolicy::grpc() makes 5 attempts".into());
            }
        }
    }
    Ok(())
}
