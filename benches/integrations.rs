//! The stack around a real client, next to the bare client, in the same `benchmark_group`:
//! reqwest against an axum server, tonic-health's `HealthClient` against a tonic server, both on
//! 127.0.0.1 and driven on one `current_thread` runtime (the server's tasks included). The
//! difference between the two entries of a group is what the layers add to a real round trip.
//! Allocation counts are in `tests/alloc.rs`.
//!
//! ```text
//! cargo bench --bench integrations --features reqwest,tonic -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::{BackstopLayer, GrpcLayer};

const TIMEOUT: Duration = Duration::from_secs(30);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current_thread runtime")
}

fn reqwest(c: &mut Criterion) {
    let rt = runtime();
    let url = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    });
    let client = reqwest::Client::new();
    let mut group = c.benchmark_group("reqwest");
    group.bench_function("bare client", |b| {
        let mut svc = client.clone();
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let request = client.get(&url).build().unwrap();
                    let response = svc.ready().await.unwrap().call(request).await.unwrap();
                    black_box(response.bytes().await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("BackstopLayer::http", |b| {
        let mut svc = ServiceBuilder::new()
            .layer(BackstopLayer::http(TIMEOUT))
            .service(client.clone());
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let request = client.get(&url).build().unwrap();
                    let response = svc.ready().await.unwrap().call(request).await.unwrap();
                    black_box(response.bytes().await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

fn tonic(c: &mut Criterion) {
    let rt = runtime();
    let channel = rt.block_on(async {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        Channel::from_shared(url).unwrap().connect_lazy()
    });
    let mut group = c.benchmark_group("tonic");
    group.bench_function("bare channel", |b| {
        let mut client = HealthClient::new(channel.clone());
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(client.check(HealthCheckRequest::default()).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    // The bare channel with the deadline the stack propagates (`grpc-timeout: 30S` on each
    // call): what the client's and the server's timers for a deadline cost by themselves.
    group.bench_function("bare channel with a deadline", |b| {
        let mut client = HealthClient::new(channel.clone());
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut request = tonic::Request::new(HealthCheckRequest::default());
                    request.set_timeout(TIMEOUT);
                    black_box(client.check(request).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("GrpcLayer + BackstopLayer::grpc", |b| {
        let stack = ServiceBuilder::new()
            .layer(GrpcLayer::new())
            .layer(BackstopLayer::grpc(TIMEOUT))
            .service(channel.clone());
        let mut client = HealthClient::new(stack);
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(client.check(HealthCheckRequest::default()).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(integrations, reqwest, tonic);
criterion_main!(integrations);
