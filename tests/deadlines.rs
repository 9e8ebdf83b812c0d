//! Deadlines cross the wire: each gRPC attempt carries `grpc-timeout` = the time left (the
//! per-attempt timeout or the overall deadline, whichever ends first, and never above the
//! caller's own), each attempt's smaller than the last under a deadline; for HTTP, the header
//! the policy names. Real tonic servers and real `Channel`s on 127.0.0.1; real axum for HTTP.
#![cfg(feature = "tonic")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::{BackstopLayer, GrpcLayer};

/// Parses a `grpc-timeout` value (as a server would).
fn parse(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("unit {unit}"),
    }
}

/// A health server whose every call fails `UNAVAILABLE`, recording each request's
/// `grpc-timeout` header (or `None`).
async fn recording_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<Option<String>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let failing = tonic::service::interceptor::InterceptedService::new(health, |_req| {
        Err::<tonic::Request<()>, _>(tonic::Status::unavailable("down"))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(ServiceBuilder::new().map_request(
                move |req: http::Request<tonic::body::Body>| {
                    let value = req
                        .headers()
                        .get("grpc-timeout")
                        .map(|v| v.to_str().unwrap().to_owned());
                    record.lock().unwrap().push(value);
                    req
                },
            ))
            .add_service(failing)
            .serve_with_incoming(incoming)
            .await
            .unwrap()
    });
    (addr, seen)
}

fn client(
    addr: std::net::SocketAddr,
    preset: BackstopLayer<
        tower_backstop::classify::GrpcClassifier,
        tower_backstop::breaker::BreakerLayer,
    >,
) -> HealthClient<
    tower_backstop::Grpc<
        tower_backstop::Backstop<
            tonic::transport::Channel,
            tower_backstop::classify::GrpcClassifier,
            tower_backstop::breaker::BreakerLayer,
        >,
    >,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    HealthClient::new(
        ServiceBuilder::new()
            .layer(GrpcLayer::new())
            .layer(preset)
            .service(channel),
    )
}

fn values(seen: &Mutex<Vec<Option<String>>>) -> Vec<Duration> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|v| parse(v.as_deref().expect("every attempt carries grpc-timeout")))
        .collect()
}

#[tokio::test]
async fn each_attempt_carries_the_time_left_of_the_deadline_smaller_than_the_last() {
    let (addr, seen) = recording_server().await;
    let deadline = Duration::from_millis(800);
    let preset = BackstopLayer::grpc(Duration::from_secs(5)).retry(
        RetryPolicy::grpc()
            .max_attempts(4)
            .deadline(deadline)
            .backoff(Backoff::constant(Duration::from_millis(40)))
            .build()
            .unwrap(),
    );
    let status = client(addr, preset)
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let values = values(&seen);
    assert_eq!(values.len(), 4, "{values:?}");
    // The first is the whole deadline (the per-attempt timeout is longer), written exactly.
    assert_eq!(seen.lock().unwrap()[0].as_deref(), Some("800m"));
    for pair in values.windows(2) {
        assert!(pair[1] < pair[0], "{values:?}");
        // At least the backoff between them.
        assert!(pair[0] - pair[1] >= Duration::from_millis(40), "{values:?}");
    }
}

#[tokio::test]
async fn the_per_attempt_timeout_bounds_the_value_when_it_ends_first() {
    let (addr, seen) = recording_server().await;
    let preset = BackstopLayer::grpc(Duration::from_millis(250)).retry(
        RetryPolicy::grpc()
            .max_attempts(3)
            .deadline(Duration::from_secs(30))
            .backoff(Backoff::constant(Duration::from_millis(5)))
            .build()
            .unwrap(),
    );
    let _ = client(addr, preset)
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![Some("250m".to_owned()); 3]);
}

#[tokio::test]
async fn the_callers_own_grpc_timeout_is_a_deadline_never_extended() {
    let (addr, seen) = recording_server().await;
    let preset = BackstopLayer::grpc(Duration::from_secs(5)).retry(
        RetryPolicy::grpc()
            .max_attempts(5)
            .backoff(Backoff::constant(Duration::from_millis(100)))
            .build()
            .unwrap(),
    );
    let mut request = tonic::Request::new(HealthCheckRequest::default());
    request.set_timeout(Duration::from_millis(250));
    let status = client(addr, preset).check(request).await.unwrap_err();
    let values = values(&seen);
    // Three attempts fit in 250 ms with 100 ms between them; not five.
    assert!((2..=3).contains(&values.len()), "{values:?}");
    assert!(values[0] <= Duration::from_millis(250), "{values:?}");
    for pair in values.windows(2) {
        assert!(pair[1] < pair[0], "re-sent unchanged: {values:?}");
    }
    // The caller gets the server's last status, and why the retries stopped.
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let failure = GrpcLayer::failure(&status).unwrap();
    assert_eq!(
        failure.notes().get::<Attempts>().unwrap().give_up(),
        GiveUp::DeadlineExceeded
    );
}

#[tokio::test]
async fn an_http_policy_writes_the_time_left_into_the_header_it_names() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let router = axum::Router::new().route(
        "/send",
        axum::routing::get(move |headers: http::HeaderMap| {
            let value = headers
                .get("x-request-timeout-ms")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            record.lock().unwrap().push(value);
            async { http::StatusCode::SERVICE_UNAVAILABLE }
        }),
    );
    let base = support::serve(router).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(2)).retry(
                RetryPolicy::default()
                    .max_attempts(3)
                    .deadline(Duration::from_millis(900))
                    .backoff(Backoff::constant(Duration::from_millis(50)))
                    .time_left_header(http::HeaderName::from_static("x-request-timeout-ms"))
                    .build()
                    .unwrap(),
            ),
        )
        .service(client);
    let request = http::Request::get(format!("{base}/send"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let failure = stack.oneshot(request).await.unwrap_err();
    assert_eq!(
        failure.code(),
        tower_backstop::Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0], Some(900));
    for pair in seen.windows(2) {
        assert!(pair[1].unwrap() + 50 <= pair[0].unwrap(), "{seen:?}");
    }
}

#[test]
fn a_callers_malformed_grpc_timeout_is_ignored() {
    use tower_backstop::request::BufferedBody;
    use tower_backstop::{GrpcRequest, Replay};
    let request = |value: &str| {
        let body = BufferedBody::<tonic::body::Body>::new(bytes::Bytes::new(), None);
        GrpcRequest(
            http::Request::post("http://127.0.0.1:1/grpc.health.v1.Health/Check")
                .header("grpc-timeout", value)
                .body(body)
                .unwrap(),
        )
    };
    for bad in ["123456789S", "5x", "-1S", "S", "1.5m", " 5S"] {
        assert_eq!(request(bad).time_left(None), None, "{bad:?}");
    }
    assert_eq!(request("0n").time_left(None), Some(Duration::ZERO));
    assert_eq!(
        request("250m").time_left(None),
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        request("99999999H").time_left(None),
        Some(Duration::from_secs(99_999_999 * 3600))
    );
}

#[tokio::test]
async fn a_dead_letter_keeps_the_callers_headers_not_the_time_left_this_call_wrote() {
    use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
    use tower_backstop::store::{MemoryStore, Store};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let router = axum::Router::new().route(
        "/send",
        axum::routing::put(move |headers: http::HeaderMap| {
            record
                .lock()
                .unwrap()
                .push(headers.contains_key("x-request-timeout-ms"));
            async { http::StatusCode::SERVICE_UNAVAILABLE }
        }),
    );
    let base = support::serve(router).await;
    let store = MemoryStore::new();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(2))
                .retry(
                    RetryPolicy::default()
                        .max_attempts(2)
                        .backoff(Backoff::constant(Duration::from_millis(5)))
                        .time_left_header(http::HeaderName::from_static("x-request-timeout-ms"))
                        .build()
                        .unwrap(),
                )
                .dead_letters(DeadLetterLayer::new(store.clone())),
        )
        .service(client);
    let request = http::Request::put(format!("{base}/send"))
        .header("idempotency-key", "order-9")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let failure = stack.oneshot(request).await.unwrap_err();
    // Every attempt carried it...
    assert_eq!(*seen.lock().unwrap(), vec![true, true]);
    // ...but the record, which a re-drive sends again, has only what the caller sent.
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("stored: {failure:?}");
    };
    let record = store.get(id).await.unwrap().unwrap();
    let names: Vec<&str> = record.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"idempotency-key"), "{names:?}");
    assert!(!names.contains(&"x-request-timeout-ms"), "{names:?}");
}

/// The values of `x-request-timeout-ms` a loopback provider answering 503 saw, one per attempt,
/// for a call through `BackstopLayer::http(preset_timeout)` with `policy` (which names the
/// header) and the caller's own value of the header, if any.
async fn header_values(
    preset_timeout: Duration,
    policy: tower_backstop::retry::RetryLayer,
    callers: Option<&str>,
) -> Vec<Option<u64>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let router = axum::Router::new().route(
        "/send",
        axum::routing::get(move |headers: http::HeaderMap| {
            let value = headers
                .get("x-request-timeout-ms")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            record.lock().unwrap().push(value);
            async { http::StatusCode::SERVICE_UNAVAILABLE }
        }),
    );
    let base = support::serve(router).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(BackstopLayer::http(preset_timeout).retry(policy))
        .service(client);
    let mut request = http::Request::get(format!("{base}/send"));
    if let Some(value) = callers {
        request = request.header("x-request-timeout-ms", value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let failure = stack.oneshot(request).await.unwrap_err();
    assert_eq!(
        failure.code(),
        tower_backstop::Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    seen.lock().unwrap().clone()
}

fn header_policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(5)))
        .time_left_header(http::HeaderName::from_static("x-request-timeout-ms"))
}

#[tokio::test]
async fn the_callers_own_header_is_a_deadline_never_extended() {
    let policy = header_policy()
        .deadline(Duration::from_millis(900))
        .build()
        .unwrap();
    let seen = header_values(Duration::from_secs(2), policy, Some("300")).await;
    assert!(!seen.is_empty(), "{seen:?}");
    // The caller gave the call 300 ms: no attempt is told it has the policy's 900.
    for value in &seen {
        assert!(value.unwrap() <= 300, "{seen:?}");
    }
}

#[tokio::test]
async fn the_smaller_of_the_presets_and_the_policys_attempt_timeout_is_written() {
    // The policy's is smaller: it stays.
    let policy = header_policy()
        .attempt_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let seen = header_values(Duration::from_secs(2), policy, None).await;
    assert_eq!(seen, vec![Some(500), Some(500)]);
    // The preset's is smaller: it bounds each attempt.
    let policy = header_policy()
        .attempt_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let seen = header_values(Duration::from_secs(2), policy, None).await;
    assert_eq!(seen, vec![Some(2000), Some(2000)]);
    // The policy sets none: the preset's.
    let seen = header_values(
        Duration::from_secs(2),
        header_policy().build().unwrap(),
        None,
    )
    .await;
    assert_eq!(seen, vec![Some(2000), Some(2000)]);
}
