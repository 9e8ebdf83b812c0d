//! An axum handler that proxies to an upstream through the stack and returns the `Failure`
//! itself (feature `axum`): the upstream's own answer when it gave one, 504 for a timeout, 503
//! with `Retry-After` for an open breaker. A real upstream and a real proxy on 127.0.0.1, called
//! with reqwest. Exits non-zero when an answer is not the expected one.
//!
//! ```sh
//! cargo run --example axum_proxy --features axum
//! ```

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
use tower_backstop::Failure;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::timeout::TimeoutLayer;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Upstream = BoxCloneSyncService<
    http::Request<Full<Bytes>>,
    http::Response<Incoming>,
    Failure<http::Response<Incoming>>,
>;

#[derive(Clone)]
struct AppState {
    upstream: Upstream,
    base: String,
}

/// The proxy's handler: `?` hands the upstream's failure to axum as it is.
async fn proxy(
    State(state): State<AppState>,
    Path(path): Path<String>,
) -> Result<Response, Failure<http::Response<Incoming>>> {
    let request = http::Request::get(format!("{}/{path}", state.base))
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let response = state.upstream.oneshot(request).await?;
    Ok(response.into_response())
}

async fn serve(app: axum::Router) -> Result<String, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let upstream = serve(
        axum::Router::new()
            .route("/report", get(|| async { "report body" }))
            .route(
                "/gone",
                get(|| async { (StatusCode::GONE, "gone for good") }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    "too late"
                }),
            ),
    )
    .await?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(30)))
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(client);
    let front = serve(
        axum::Router::new()
            .route("/{*path}", get(proxy))
            .with_state(AppState {
                upstream: BoxCloneSyncService::new(stack),
                base: upstream,
            }),
    )
    .await?;

    let caller = reqwest::Client::new();
    // Each path, the answer the caller must get, and a header it must carry.
    let expected: [(&str, u16, Option<&str>); 5] = [
        ("report", 200, None),
        ("gone", 410, None),
        ("slow", 504, None),
        ("slow", 504, None),
        // Two failures in a row opened the breaker.
        ("report", 503, Some("retry-after")),
    ];
    for (path, status, header) in expected {
        let response = caller.get(format!("{front}/{path}")).send().await?;
        let got = response.status().as_u16();
        let has_header = header.is_none_or(|h| response.headers().contains_key(h));
        println!(
            "GET /{path}: {got} {}",
            response
                .headers()
                .get("retry-after")
                .map(|v| format!("(retry-after {})", v.to_str().unwrap_or("?")))
                .unwrap_or_default()
        );
        if got != status || !has_header {
            return Err(format!("GET /{path}: expected {status}, got {got}").into());
        }
    }
    Ok(())
}
