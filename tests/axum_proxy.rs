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

/// The status, `Retry-After` and body of `failure`'s answer.
async fn answer_of<R: IntoResponse>(failure: Failure<R>) -> (u16, Option<String>, String) {
    let response = IntoResponse::into_response(failure);
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        retry_after,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn each_kind_of_failure_has_its_answer() {
    use tower_backstop::Code;
    let throttled: Failure<Response> =
        Failure::new(Class::THROTTLED, Code::Http(StatusCode::TOO_MANY_REQUESTS))
            .with_retry_after(Duration::from_millis(2500));
    assert_eq!(
        answer_of(throttled).await,
        (429, Some("3".to_owned()), "throttled (http 429)".to_owned())
    );
    // A gRPC RESOURCE_EXHAUSTED is throttled too; without a hint, no Retry-After.
    let throttled: Failure<Response> = Failure::new(Class::THROTTLED, Code::Grpc(8));
    assert_eq!(answer_of(throttled).await.0, 429);
    assert_eq!(
        answer_of(Failure::<Response>::new(Class::THROTTLED, Code::Grpc(8)))
            .await
            .1,
        None
    );
    let open: Failure<Response> = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
        .with_retry_after(Duration::from_millis(100));
    assert_eq!(answer_of(open).await.0, 503);
    let open: Failure<Response> = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
        .with_retry_after(Duration::from_millis(100));
    assert_eq!(answer_of(open).await.1.as_deref(), Some("1"));
    let shed: Failure<Response> = Failure::new(Class::TRANSIENT, Code::Overloaded);
    assert_eq!(
        answer_of(shed).await,
        (
            503,
            Some("1".to_owned()),
            "transient (overloaded, not sent)".to_owned()
        )
    );
    let timeout: Failure<Response> = Failure::new(Class::TRANSIENT, Code::Timeout);
    assert_eq!(answer_of(timeout).await.0, 504);
    let deadline: Failure<Response> = Failure::new(Class::TRANSIENT, Code::Grpc(4));
    assert_eq!(answer_of(deadline).await.0, 504);
    for code in [
        Code::Io(std::io::ErrorKind::ConnectionRefused),
        Code::Reset(7),
        Code::Tls,
        Code::Error,
        Code::Grpc(14),
    ] {
        let failure: Failure<Response> = Failure::new(Class::TRANSIENT, code);
        assert_eq!(answer_of(failure).await.0, 502, "{code}");
    }
    // An HTTP status whose response is gone: that status, with the hint.
    let gone: Failure<Response> = Failure::new(
        Class::TRANSIENT,
        Code::Http(StatusCode::SERVICE_UNAVAILABLE),
    )
    .with_retry_after(Duration::from_secs(7));
    assert_eq!(
        answer_of(gone).await,
        (503, Some("7".to_owned()), "transient (http 503)".to_owned())
    );
}

/// A user's error type that keeps the upstream's failure as its source.
#[derive(Debug)]
struct CheckoutError(Failure);

impl std::fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("checkout failed")
    }
}

impl std::error::Error for CheckoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test]
async fn the_answer_is_the_same_through_buffer_a_user_error_and_a_box_error() {
    use tower_backstop::{BoxError, Code};
    // The failure itself.
    let failure = || {
        Failure::new(Class::THROTTLED, Code::Http(StatusCode::TOO_MANY_REQUESTS))
            .with_retry_after(Duration::from_secs(4))
    };
    let direct =
        answer_of(failure().map_response(|()| Response::new(axum::body::Body::empty()))).await;
    assert_eq!(
        direct,
        (429, Some("4".to_owned()), "throttled (http 429)".to_owned())
    );

    // Behind a user error, boxed twice.
    let user: BoxError = Box::new(CheckoutError(failure()));
    let boxed: BoxError = Box::new(CheckoutError(Failure::from(user).map_response(|_: ()| ())));
    assert_eq!(answer_of(Failure::<Response>::from(boxed)).await, direct);

    // Behind tower's `Buffer` over a stack that sheds load: the rejection's answer.
    let shed = ServiceBuilder::new()
        .buffer(4)
        .load_shed()
        .concurrency_limit(1)
        .service(tower::service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, BoxError>(Response::new(axum::body::Body::empty()))
        }));
    let mut first = shed.clone();
    let mut second = shed.clone();
    let _held =
        tokio::spawn(async move { tower::Service::call(first.ready().await.unwrap(), ()).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let error = tower::Service::call(second.ready().await.unwrap(), ())
        .await
        .unwrap_err();
    assert_eq!(
        answer_of(Failure::<Response>::from(error)).await,
        (
            503,
            Some("1".to_owned()),
            "transient (overloaded, not sent)".to_owned()
        )
    );
    // A plain error that carries no failure is classified: an upstream error, 502.
    let plain: BoxError = "something broke".into();
    assert_eq!(answer_of(Failure::<Response>::from(plain)).await.0, 502);
}
