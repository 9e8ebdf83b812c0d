//! The server flavours against a real axum server on 127.0.0.1 with a real hyper-util client:
//! `ServerLayer`'s timeout (504) and breaker (503 with `Retry-After`), alone or together, usable
//! with `Router::layer`, and a `BreakerHandle` behind an admin route. Real short durations.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::StatusCode;
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_backstop::breaker::{BreakerHandle, BreakerLayer, State};
use tower_backstop::server::ServerLayer;

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn fetch(base: &str, path: &str) -> (StatusCode, Option<String>, String) {
    let uri: http::Uri = format!("{base}{path}").parse().unwrap();
    let response = client().get(uri).await.expect("the server answers");
    let status = response.status();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn post_to(base: &str, path: &str) -> StatusCode {
    let request = http::Request::post(format!("{base}{path}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    client().request(request).await.unwrap().status()
}

#[tokio::test]
async fn a_hanging_handler_gets_504_within_the_timeout() {
    let app = Router::new()
        .route("/hang", get(std::future::pending::<&'static str>))
        .route("/fast", get(|| async { "fast" }))
        .layer(ServerLayer::new().timeout(Duration::from_millis(100)));
    let base = support::serve(app).await;
    let start = Instant::now();
    let (status, _, body) = fetch(&base, "/hang").await;
    let took = start.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "");
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(fetch(&base, "/fast").await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_timeout_status_can_be_configured() {
    let app = Router::new()
        .route("/hang", get(std::future::pending::<&'static str>))
        .layer(
            ServerLayer::new()
                .timeout(Duration::from_millis(50))
                .timeout_status(StatusCode::REQUEST_TIMEOUT),
        );
    let base = support::serve(app).await;
    assert_eq!(fetch(&base, "/hang").await.0, StatusCode::REQUEST_TIMEOUT);
}

#[tokio::test]
async fn an_open_breaker_answers_503_with_a_retry_after_that_counts_down() {
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let breaker = BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(2));
    let handle = breaker.handle();
    let app = Router::new()
        .route(
            "/work",
            get(move || {
                let flag = flag.clone();
                async move {
                    if flag.load(Ordering::SeqCst) {
                        std::future::pending::<()>().await;
                    }
                    "done"
                }
            }),
        )
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .layer(
            ServerLayer::new()
                .timeout(Duration::from_millis(50))
                .breaker(breaker),
        );
    let base = support::serve(app).await;

    // 404s are the caller's fault: they do not trip it.
    for _ in 0..3 {
        assert_eq!(fetch(&base, "/missing").await.0, StatusCode::NOT_FOUND);
    }
    assert_eq!(handle.state(), State::Closed);
    // Two timeouts (504) trip it.
    for _ in 0..2 {
        assert_eq!(fetch(&base, "/work").await.0, StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(handle.state(), State::Open);

    let (status, retry_after, _) = fetch(&base, "/work").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("2"));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, retry_after, _) = fetch(&base, "/work").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("1"), "counts down");
    assert_eq!(handle.stats().rejected, 2);

    // The handler recovers; after the open duration the probe succeeds and closes it.
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (status, retry_after, body) = fetch(&base, "/work").await;
    assert_eq!(
        (status, retry_after, body.as_str()),
        (StatusCode::OK, None, "done")
    );
    assert_eq!(handle.state(), State::Closed);
}

async fn show(AxumState(breaker): AxumState<BreakerHandle>) -> String {
    format!("{} {}", breaker.name(), breaker.state())
}

async fn force_open(AxumState(breaker): AxumState<BreakerHandle>) {
    breaker.force_open()
}

async fn reset(AxumState(breaker): AxumState<BreakerHandle>) {
    breaker.reset()
}

#[tokio::test]
async fn an_admin_route_reads_and_controls_the_breaker() {
    let breaker = BreakerLayer::new().name("self");
    let admin = Router::new()
        .route("/admin/breaker", get(show))
        .route("/admin/breaker/force-open", post(force_open))
        .route("/admin/breaker/reset", post(reset))
        .with_state(breaker.handle());
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(ServerLayer::new().breaker(breaker))
        .merge(admin);
    let base = support::serve(app).await;

    assert_eq!(fetch(&base, "/admin/breaker").await.2, "self closed");
    assert_eq!(
        post_to(&base, "/admin/breaker/force-open").await,
        StatusCode::OK
    );
    assert_eq!(fetch(&base, "/admin/breaker").await.2, "self forced_open");
    let (status, retry_after, _) = fetch(&base, "/work").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after, None, "forced open has no end to announce");
    assert_eq!(post_to(&base, "/admin/breaker/reset").await, StatusCode::OK);
    assert_eq!(fetch(&base, "/work").await.0, StatusCode::OK);
}
