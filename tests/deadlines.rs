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
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .deadline(Duration::from_millis(900))
        .backoff(Backoff::constant(Duration::from_millis(50)))
        .time_left_header(http::HeaderName::from_static("x-request-timeout-ms"))
        .build()
        .unwrap();
    // The provider answers 503 to each attempt (checked by `header_values`).
    let seen = header_values(Duration::from_secs(2), policy, None).await;
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

// The deadline's race with an attempt's own end, on the paused clock, over tower-test's mock.

mod race {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tokio::time::Instant;
    use tower::{Layer, Service, ServiceBuilder};
    use tower_backstop::observe::Event;
    use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
    use tower_backstop::timeout::TimeoutLayer;
    use tower_backstop::{BoxError, Class, Code, Failure};

    use super::support::get;

    const HEADER: &str = "x-request-timeout-ms";

    /// The provider's last real answer in these tests: a refused connection.
    fn refused() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
    }

    /// A policy of 5 attempts, a constant backoff of `backoff`, a deadline of `deadline`, and
    /// the time left written into [`HEADER`].
    fn policy(backoff: Duration, deadline: Duration) -> RetryPolicy {
        RetryPolicy::new()
            .max_attempts(5)
            .backoff(Backoff::constant(backoff))
            .deadline(deadline)
            .time_left_header(http::HeaderName::from_static(HEADER))
    }

    /// The time left an attempt carries, in whole milliseconds.
    fn time_left(req: &http::Request<String>) -> u64 {
        req.headers()[HEADER].to_str().unwrap().parse().unwrap()
    }

    type Mock = tower_test::mock::Mock<http::Request<String>, ()>;

    /// Ends each call it is given at the time left the request carries, with `cut` (the
    /// channel's `grpc-timeout`, or a server's `DEADLINE_EXCEEDED`), unless the inner service
    /// answers first: the timer starts in `call`, as a channel's does.
    #[derive(Clone)]
    struct CutAtTimeLeft<S> {
        inner: S,
        cut: fn() -> Failure<()>,
    }

    impl<S> Service<http::Request<String>> for CutAtTimeLeft<S>
    where
        S: Service<http::Request<String>, Response = (), Error = BoxError>,
        S::Future: Send + 'static,
    {
        type Response = ();
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, req: http::Request<String>) -> Self::Future {
            let left = Duration::from_millis(time_left(&req));
            let cut = self.cut;
            let answer = self.inner.call(req);
            let timer = tokio::time::sleep(left);
            Box::pin(async move {
                tokio::select! {
                    biased;
                    answer = answer => answer,
                    () = timer => Err(Box::new(cut()) as BoxError),
                }
            })
        }
    }

    /// The first attempt of a call through `layer` over the mock fails with a refused
    /// connection at once; the second is left unanswered, for the layer's own timers. The
    /// failure the caller gets, when, and the mock's handle.
    async fn refused_then_unanswered<L>(
        layer: L,
    ) -> (
        Failure<()>,
        Duration,
        tower_test::mock::Handle<http::Request<String>, ()>,
    )
    where
        L: Layer<Mock>,
        L::Service:
            Service<http::Request<String>, Response = (), Error = Failure<()>> + Send + 'static,
        <L::Service as Service<http::Request<String>>>::Future: Send,
    {
        let (mut svc, mut handle) = tower_test::mock::spawn_layer(layer);
        handle.allow(2);
        assert!(svc.poll_ready().is_ready());
        let start = Instant::now();
        let response = tokio::spawn(svc.call(get("http://mail.test/v1")));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(refused());
        // The second attempt, after the backoff: never answered.
        let (second, _unanswered) = handle.next_request().await.unwrap();
        assert!(time_left(&second) > 0);
        let failure = response.await.unwrap().unwrap_err();
        (failure, start.elapsed(), handle)
    }

    fn assert_last_real_answer(failure: &Failure<()>, attempts: u32) {
        assert_eq!(
            failure.code(),
            Code::Io(std::io::ErrorKind::ConnectionRefused),
            "{failure}"
        );
        assert_eq!(failure.class(), Class::TRANSIENT, "{failure}");
        let note = failure.note::<Attempts>().expect("the retry layer's note");
        assert_eq!(
            (note.give_up(), note.count()),
            (GiveUp::DeadlineExceeded, attempts),
            "{failure}"
        );
    }

    /// The second attempt starts at 100 ms with 150 ms left; its own timeout (150 ms) fires at
    /// the deadline, on the same tick as the deadline's timer, and is seen first. It was cut
    /// short by the time it was given: the caller gets the refusal, not a timeout.
    #[tokio::test(start_paused = true)]
    async fn an_attempts_own_timeout_at_the_deadline_does_not_replace_the_last_real_answer() {
        let timed_out = Arc::new(Mutex::new(Vec::new()));
        let seen = timed_out.clone();
        let layer = ServiceBuilder::new()
            .layer(
                policy(Duration::from_millis(100), Duration::from_millis(250))
                    .listener(move |e: &Event<'_>| {
                        if let Event::TimedOut { attempt, deadline } = *e {
                            seen.lock().unwrap().push((attempt, deadline));
                        }
                    })
                    .build()
                    .unwrap(),
            )
            .layer(TimeoutLayer::new(Duration::from_millis(150)));
        let (failure, elapsed, _) = refused_then_unanswered(layer).await;
        assert_eq!(elapsed, Duration::from_millis(250));
        assert_last_real_answer(&failure, 2);
        // The timeout is the deadline's, told once.
        assert_eq!(*timed_out.lock().unwrap(), vec![(2, true)]);
    }

    /// The same when what ends the attempt is the time left it carries (a channel's
    /// `grpc-timeout`, a server's `DEADLINE_EXCEEDED`).
    #[tokio::test(start_paused = true)]
    async fn an_attempt_cut_by_the_time_left_it_carries_does_not_replace_the_last_real_answer() {
        let cuts: [fn() -> Failure<()>; 2] = [
            || Failure::new(Class::TRANSIENT, Code::Timeout),
            || Failure::new(Class::TRANSIENT, Code::Grpc(4)),
        ];
        for cut in cuts {
            let layer = ServiceBuilder::new()
                .layer(
                    policy(Duration::from_millis(100), Duration::from_millis(250))
                        .build()
                        .unwrap(),
                )
                .layer_fn(move |inner| CutAtTimeLeft { inner, cut });
            let (failure, elapsed, _) = refused_then_unanswered(layer).await;
            assert_eq!(elapsed, Duration::from_millis(250));
            assert_last_real_answer(&failure, 2);
        }
    }

    /// A timeout well before the deadline is a real answer (the provider was slow): it is
    /// retried, and the last one is what the caller gets.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_before_the_deadline_is_a_real_answer() {
        let layer = ServiceBuilder::new()
            .layer(
                policy(Duration::from_millis(10), Duration::from_millis(250))
                    .max_attempts(2)
                    .build()
                    .unwrap(),
            )
            .layer(TimeoutLayer::new(Duration::from_millis(50)));
        let (failure, elapsed, _) = refused_then_unanswered(layer).await;
        assert_eq!(elapsed, Duration::from_millis(60));
        assert_eq!(failure.code(), Code::Timeout, "{failure}");
        assert_eq!(
            failure.note::<Attempts>().map(Attempts::give_up),
            Some(GiveUp::AttemptsExhausted)
        );
    }

    /// An attempt cut at the deadline of a request not safe to send twice (a keyless POST,
    /// retried after a refusal) may have been acted on: the caller gets the last real answer,
    /// marked outcome-unknown, whichever timer is seen first.
    #[tokio::test(start_paused = true)]
    async fn a_keyless_post_cut_at_the_deadline_is_outcome_unknown() {
        for own_timeout in [true, false] {
            let retry = policy(Duration::from_millis(100), Duration::from_millis(250))
                .build()
                .unwrap();
            // With its own timeout of 150 ms, the attempt's end is seen first; with none,
            // the deadline's timer.
            let timeout = TimeoutLayer::new(if own_timeout {
                Duration::from_millis(150)
            } else {
                Duration::from_secs(60)
            });
            let (mut svc, mut handle) = tower_test::mock::spawn_layer::<_, (), _>(
                ServiceBuilder::new().layer(retry).layer(timeout),
            );
            handle.allow(2);
            assert!(svc.poll_ready().is_ready());
            let response =
                tokio::spawn(svc.call(super::support::post("http://mail.test/v1", "{}")));
            let (_, send) = handle.next_request().await.unwrap();
            send.send_error(refused());
            let (_, _unanswered) = handle.next_request().await.unwrap();
            let failure = response.await.unwrap().unwrap_err();
            assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN, "{failure}");
            assert_eq!(
                failure.code(),
                Code::Io(std::io::ErrorKind::ConnectionRefused),
                "{failure}"
            );
            assert_eq!(
                failure.note::<Attempts>().map(Attempts::give_up),
                Some(GiveUp::DeadlineExceeded)
            );
        }
    }

    /// The first attempt fails at once; readiness for the second comes back at 149.5 ms of a
    /// 150 ms deadline: less than a millisecond left, so it is not sent. At 148 ms it is, and
    /// carries the time left read just before the call: 2 ms.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_with_less_than_a_millisecond_left_is_not_started() {
        for (ready_at, sent) in [
            (Duration::from_micros(149_500), false),
            (Duration::from_millis(148), true),
        ] {
            let (mut svc, mut handle) = tower_test::mock::spawn_layer::<_, (), _>(
                policy(Duration::from_millis(100), Duration::from_millis(150))
                    .build()
                    .unwrap(),
            );
            handle.allow(1);
            assert!(svc.poll_ready().is_ready());
            let response = tokio::spawn(svc.call(get("http://mail.test/v1")));
            // The first attempt is polled, and waits: the deadline starts now.
            tokio::task::yield_now().await;
            let (_, send) = handle.next_request().await.unwrap();
            send.send_error(refused());
            // The failure is seen at 0 ms, and the backoff of 100 ms starts; then readiness
            // waits for the mock until `ready_at`.
            tokio::task::yield_now().await;
            tokio::time::advance(ready_at).await;
            assert!(!response.is_finished());
            handle.allow(1);
            if sent {
                let (second, reply) = handle.next_request().await.unwrap();
                assert_eq!(time_left(&second), 2);
                reply.send_response(());
                response.await.unwrap().unwrap();
            } else {
                let failure = response.await.unwrap().unwrap_err();
                assert_last_real_answer(&failure, 1);
                assert!(
                    tokio::time::timeout(Duration::from_millis(10), handle.next_request())
                        .await
                        .is_err(),
                    "not sent"
                );
            }
        }
    }

    /// A backoff that would wake with less than a millisecond left is not slept: the call ends
    /// at once with the last real answer.
    #[tokio::test(start_paused = true)]
    async fn a_delay_that_leaves_less_than_a_millisecond_is_not_slept() {
        let (mut svc, mut handle) = tower_test::mock::spawn_layer::<_, (), _>(
            policy(Duration::from_micros(149_500), Duration::from_millis(150))
                .build()
                .unwrap(),
        );
        handle.allow(2);
        assert!(svc.poll_ready().is_ready());
        let start = Instant::now();
        let response = tokio::spawn(svc.call(get("http://mail.test/v1")));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(refused());
        let failure = response.await.unwrap().unwrap_err();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_last_real_answer(&failure, 1);
    }

    /// A hedged copy due with less than a millisecond left is not sent either.
    #[tokio::test(start_paused = true)]
    async fn a_hedged_copy_with_less_than_a_millisecond_left_is_not_sent() {
        let (mut svc, mut handle) = tower_test::mock::spawn_layer::<_, (), _>(
            policy(Duration::from_millis(10), Duration::from_millis(100))
                .hedge(Duration::from_micros(99_500), 1)
                .build()
                .unwrap(),
        );
        handle.allow(2);
        assert!(svc.poll_ready().is_ready());
        let start = Instant::now();
        let response = tokio::spawn(svc.call(get("http://mail.test/v1")));
        let (_, _unanswered) = handle.next_request().await.unwrap();
        let failure = response.await.unwrap().unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(
            failure.code(),
            Code::Timeout,
            "the deadline's own: {failure}"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(10), handle.next_request())
                .await
                .is_err(),
            "no copy was sent"
        );
    }
}
