//! Feature `axum`: a proxying axum handler returns `Result<Response, Failure<_>>`. A real axum
//! proxy and a real axum upstream on 127.0.0.1, a real hyper-util client between them and a real
//! reqwest client in front. Real short durations.
#![cfg(feature = "axum")]

mod support;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{Class, Failure};

type Upstream = BoxCloneSyncService<
    http::Request<Full<Bytes>>,
    http::Response<Incoming>,
    Failure<http::Response<Incoming>>,
>;

#[derive(Clone)]
struct Proxy {
    upstream: Upstream,
    base: String,
}

/// The handler under test: it returns the `Failure` as it is.
async fn proxy(
    State(proxy): State<Proxy>,
    Path(path): Path<String>,
) -> Result<Response, Failure<http::Response<Incoming>>> {
    let request = http::Request::get(format!("{}/{path}", proxy.base))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = proxy.upstream.oneshot(request).await?;
    Ok(response.into_response())
}

async fn upstream() -> String {
    let router = axum::Router::new()
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such thing") }),
        )
        .route(
            "/busy",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "7")],
                    "busy",
                )
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "late"
            }),
        );
    support::serve(router).await
}

/// A proxy in front of `base`, with a breaker that opens after `trip` failures.
async fn proxy_to(base: String, trip: u32) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let upstream = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(BreakerLayer::consecutive_failures(trip).open_for(Duration::from_secs(30)))
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_millis(50)))
            .service(client),
    );
    let router = axum::Router::new()
        .route("/{*path}", get(proxy))
        .with_state(Proxy { upstream, base });
    support::serve(router).await
}

#[tokio::test]
async fn a_failure_answers_as_the_upstream_did_or_as_a_gateway_should() {
    let client = reqwest::Client::new();
    let front = proxy_to(upstream().await, 100).await;

    let r = client.get(format!("{front}/missing")).send().await.unwrap();
    assert_eq!(r.status(), 404, "the upstream's own response");
    assert_eq!(r.text().await.unwrap(), "no such thing");

    let r = client.get(format!("{front}/busy")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "7");

    let r = client.get(format!("{front}/slow")).send().await.unwrap();
    assert_eq!(r.status(), 504, "our timeout");

    // An upstream that refuses connections: 502.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let front = proxy_to(closed, 1).await;
    let r = client.get(format!("{front}/x")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    // The breaker is now open: 503 with the time left, in whole seconds.
    let r = client.get(format!("{front}/x")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let secs: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&secs), "{secs}");
    assert!(
        r.text()
            .await
            .unwrap()
            .starts_with(Class::CIRCUIT_OPEN.name()),
        "the body names the class"
    );
}
