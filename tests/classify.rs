//! ClassifyLayer on its own and under RetryLayer: panics, user classes and mappings, hints.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::{Attempts, GiveUp, RetryPolicy};
use tower_backstop::{BoxError, Class, Code};

#[tokio::test(start_paused = true)]
async fn a_panicking_inner_future_is_poison_never_retried_and_the_service_keeps_serving() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(5).build().unwrap())
        .layer(ClassifyLayer::new(|_: &String| None))
        .service(tower::service_fn(move |req: &'static str| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if req == "bad" {
                    panic!("template exploded on {req}");
                }
                Ok::<_, BoxError>(format!("sent {req}"))
            }
        }));

    let failure = svc.clone().oneshot("bad").await.unwrap_err();
    assert_eq!(failure.class(), Class::POISON);
    assert_eq!(failure.code(), Code::Panic);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never retried");
    let source = std::error::Error::source(&failure).unwrap();
    assert_eq!(
        source.to_string(),
        "inner service panicked: template exploded on bad"
    );

    // The same service (and its clones) keeps serving, also alongside a panicking call.
    assert_eq!(svc.clone().oneshot("good").await.unwrap(), "sent good");
    let (a, b) = tokio::join!(svc.clone().oneshot("bad"), svc.clone().oneshot("ok"));
    assert_eq!(a.unwrap_err().class(), Class::POISON);
    assert_eq!(b.unwrap(), "sent ok");
}

#[tokio::test]
async fn a_panic_with_a_non_string_payload_is_still_poison() {
    let svc = ServiceBuilder::new()
        .layer(ClassifyLayer::new(|_: &()| None))
        .service(tower::service_fn(|_: ()| async {
            std::panic::panic_any(42u32);
            #[allow(unreachable_code)]
            Ok::<(), BoxError>(())
        }));
    let failure = svc.oneshot(()).await.unwrap_err();
    assert_eq!(failure.class(), Class::POISON);
    assert!(failure.to_string().contains("not a string"), "{failure}");
}

mod support;

#[tokio::test]
async fn a_provider_code_in_a_json_body_is_mapped_by_a_user_function() {
    use axum::http::StatusCode;
    use axum::routing::post;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_backstop::classify::{BufferResponseLayer, HttpClassifier, Verdict};

    // A Postmark-like provider: 422 with its own code in the body. 406 is an inactive
    // recipient (never retried), 429 in the body is a soft bounce (retried).
    const INACTIVE_RECIPIENT: Class = Class::new("inactive_recipient");
    const SOFT_BOUNCE: Class = Class::new("soft_bounce");
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let router = axum::Router::new().route(
        "/email",
        post(move |body: String| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let code = if body.contains("inactive") {
                    406
                } else if n == 0 {
                    429
                } else {
                    0
                };
                if code == 0 {
                    return (
                        StatusCode::OK,
                        "{\"ErrorCode\":0,\"Message\":\"OK\"}".to_owned(),
                    );
                }
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("{{\"ErrorCode\":{code},\"Message\":\"refused\"}}"),
                )
            }
        }),
    );
    let base = support::serve(router).await;

    #[derive(serde::Deserialize)]
    struct ProviderError {
        #[serde(rename = "ErrorCode")]
        error_code: i64,
    }
    let classifier = HttpClassifier::new().with_body(|_status, body: &[u8]| {
        let error: ProviderError = serde_json::from_slice(body).ok()?;
        match error.error_code {
            0 => None,
            406 => Some(Verdict::new(INACTIVE_RECIPIENT, Code::Provider(406))),
            429 => Some(Verdict::new(SOFT_BOUNCE, Code::Provider(429))),
            other => Some(Verdict::new(Class::UNKNOWN, Code::Provider(other))),
        }
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .assume_idempotent(true)
                .retry(SOFT_BOUNCE)
                .backoff(tower_backstop::retry::Backoff::constant(
                    std::time::Duration::from_millis(5),
                ))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new(classifier))
        .layer(BufferResponseLayer::new(16 * 1024))
        .service(client);
    let send = |body: &'static str| {
        http::Request::post(format!("{base}/email"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };

    let failure = svc
        .clone()
        .oneshot(send("{\"to\":\"inactive@example.com\"}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), INACTIVE_RECIPIENT);
    assert_eq!(failure.code(), Code::Provider(406));
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);
    // The HTTP status stays on the failure too, with the response.
    let response = failure.into_response().unwrap();
    assert_eq!(response.status(), 422);
    assert!(
        response
            .body()
            .bytes()
            .unwrap()
            .starts_with(b"{\"ErrorCode\":406")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A soft bounce in the body is retried, then succeeds.
    calls.store(0, Ordering::SeqCst);
    let response = svc
        .oneshot(send("{\"to\":\"a@example.com\"}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_closure_classifier_turns_a_response_into_a_failure_that_keeps_it() {
    use tower_backstop::classify::Verdict;
    let svc = ServiceBuilder::new()
        .layer(ClassifyLayer::new(|r: &String| {
            (r == "quota exceeded").then(|| Verdict::new(Class::THROTTLED, Code::Provider(4029)))
        }))
        .service(tower::service_fn(|req: &'static str| async move {
            Ok::<_, BoxError>(req.to_string())
        }));
    assert_eq!(svc.clone().oneshot("sent").await.unwrap(), "sent");
    let failure = svc.oneshot("quota exceeded").await.unwrap_err();
    assert_eq!(failure.class(), Class::THROTTLED);
    assert_eq!(failure.code(), Code::Provider(4029));
    assert_eq!(failure.into_response().as_deref(), Some("quota exceeded"));
}

#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services_and_its_error_is_classified() {
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<&'static str, String, _>(
        ClassifyLayer::new(|_: &String| None),
    );
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    handle.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    let failure = match svc.poll_ready() {
        std::task::Poll::Ready(Err(e)) => e,
        other => panic!("expected the inner error, got {other:?}"),
    };
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(
        failure.code(),
        Code::Io(std::io::ErrorKind::ConnectionReset)
    );
}

#[tokio::test(start_paused = true)]
async fn every_timeout_error_we_know_is_a_transient_timeout() {
    use tower_backstop::classify::classify_error;
    let tokio_elapsed =
        tokio::time::timeout(std::time::Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
    assert_eq!(
        classify_error(&tokio_elapsed),
        (Class::TRANSIENT, Code::Timeout)
    );
    let tower_elapsed = tower::timeout::error::Elapsed::new();
    assert_eq!(
        classify_error(&tower_elapsed),
        (Class::TRANSIENT, Code::Timeout)
    );
    // Found behind a wrapper too.
    let wrapped: BoxError = Box::new(Wrapped(Box::new(tower_elapsed)));
    assert_eq!(classify_error(&*wrapped), (Class::TRANSIENT, Code::Timeout));
}

#[derive(Debug)]
struct Wrapped(BoxError);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request failed")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// A connect error of hyper-util's client is transient whatever its cause: nothing was sent. The
/// connector here is the user's own (a proxy tunnel, a Unix socket); its errors are not io
/// errors of a kind we know.
#[tokio::test]
async fn a_hyper_util_connect_error_is_transient_whatever_its_cause() {
    use http_body_util::Empty;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tower_backstop::classify::classify_error;

    async fn connect_with(error: fn() -> BoxError) -> (Class, Code) {
        let connector = tower::service_fn(move |_: http::Uri| {
            std::future::ready(Err::<TokioIo<tokio::net::TcpStream>, BoxError>(error()))
        });
        let client: Client<_, Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let err = client
            .get("http://127.0.0.1:9/".parse().unwrap())
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err:?}");
        classify_error(&err)
    }

    assert_eq!(
        connect_with(|| "proxy refused the tunnel".into()).await,
        (Class::TRANSIENT, Code::Error)
    );
    assert_eq!(
        connect_with(|| std::io::Error::from(std::io::ErrorKind::PermissionDenied).into()).await,
        (
            Class::TRANSIENT,
            Code::Io(std::io::ErrorKind::PermissionDenied)
        )
    );
    // The same io error outside a connect is not known to be transient.
    let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    assert_eq!(
        classify_error(&denied),
        (
            Class::UNKNOWN,
            Code::Io(std::io::ErrorKind::PermissionDenied)
        )
    );
}
