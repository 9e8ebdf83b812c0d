//! RetryLayer, with ClassifyLayer below it, on tokio's paused clock.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use support::{Scripted, Step, get, post, post_with_key, status, status_with};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::{
    Backoff, DelaySource, Jitter, LongDelay, RetryEvent, RetryLayer, RetryPolicy,
};
use tower_backstop::{Class, Code, Failure, GiveUp};

type Svc = tower::util::BoxCloneService<
    http::Request<String>,
    http::Response<()>,
    Failure<http::Response<()>>,
>;

fn stack(policy: RetryPolicy, upstream: &Scripted) -> Svc {
    tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policy))
            .layer(ClassifyLayer::http())
            .service(upstream.clone()),
    )
}

fn no_jitter(base_ms: u64) -> Backoff {
    Backoff::exponential(Duration::from_millis(base_ms), Duration::from_secs(10))
        .jitter(Jitter::None)
}

fn recorder() -> (
    Arc<Mutex<Vec<RetryEvent>>>,
    impl Fn(&RetryEvent) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    (events, move |e: &RetryEvent| sink.lock().unwrap().push(*e))
}

#[tokio::test(start_paused = true)]
async fn long_retry_after_is_not_slept() {
    let upstream = Scripted::always(status_with(503, "retry-after", "3600"));
    let svc = stack(
        RetryPolicy::new()
            .max_attempts(5)
            .max_delay(Duration::from_secs(30)),
        &upstream,
    );
    let start = Instant::now();
    let failure = svc.oneshot(get("/mail")).await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "slept {:?}",
        start.elapsed()
    );
    assert_eq!(upstream.calls(), 1);
    // Deferred by default: the failure says when to send it again.
    assert_eq!(failure.give_up(), Some(GiveUp::Deferred));
    let retry_at = failure
        .retry_at()
        .expect("a deferred failure has a retry-at time");
    assert!(retry_at >= SystemTime::now() + Duration::from_secs(3600) - Duration::from_secs(1));
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(
        failure.code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(failure.into_response().unwrap().status(), 503);

    // Configured to give up instead: no retry-at time.
    let upstream = Scripted::always(status_with(503, "retry-after", "3600"));
    let svc = stack(
        RetryPolicy::new()
            .max_attempts(5)
            .max_delay(Duration::from_secs(30))
            .on_long_delay(LongDelay::GiveUp),
        &upstream,
    );
    let failure = svc.oneshot(get("/mail")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.give_up(), Some(GiveUp::HintTooLong));
    assert_eq!(failure.retry_at(), None);
}

#[tokio::test(start_paused = true)]
async fn absurd_retry_after_values_never_panic() {
    // A huge but well-formed value ends retrying; malformed ones fall back to computed backoff.
    let upstream = Scripted::always(status_with(429, "retry-after", "9999999999"));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(failure.give_up(), Some(GiveUp::Deferred));
    assert!(failure.retry_at().unwrap() > SystemTime::now() + Duration::from_secs(9_999_999_000));
    assert_eq!(upstream.calls(), 1);

    for bad in ["-1", "nan", "1e999", "soon", "99999999999999999999999999x"] {
        let upstream = Scripted::new([status_with(429, "retry-after", bad)], status(200));
        let (events, on_retry) = recorder();
        let policy = RetryPolicy::new()
            .backoff(no_jitter(100))
            .on_retry(on_retry);
        let start = Instant::now();
        let response = stack(policy, &upstream).oneshot(get("/")).await.unwrap();
        assert_eq!(response.status(), 200, "{bad}");
        assert_eq!(upstream.calls(), 2, "{bad}");
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].source, DelaySource::Backoff, "{bad}");
        assert_eq!(events[0].delay, Duration::from_millis(100), "{bad}");
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }
}

#[tokio::test(start_paused = true)]
async fn http_date_retry_after_is_honoured() {
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let upstream = Scripted::new([status_with(429, "retry-after", date)], status(200));
    let policy = RetryPolicy::new().max_delay(Duration::from_secs(300));
    let svc = stack(policy, &upstream);
    let start = Instant::now();
    let response = svc.oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = upstream.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited > Duration::from_secs(118) && waited <= Duration::from_secs(120),
        "waited {waited:?}"
    );
    assert!(start.elapsed() <= Duration::from_secs(121));
}

#[tokio::test(start_paused = true)]
async fn retry_after_in_the_past_uses_backoff() {
    let upstream = Scripted::new(
        [status_with(
            429,
            "retry-after",
            "Fri, 31 Dec 1999 23:59:59 GMT",
        )],
        status(200),
    );
    let (events, on_retry) = recorder();
    let policy = RetryPolicy::new()
        .backoff(no_jitter(250))
        .on_retry(on_retry);
    stack(policy, &upstream).oneshot(get("/")).await.unwrap();
    let events = events.lock().unwrap();
    assert_eq!(events[0].source, DelaySource::Backoff);
    assert_eq!(events[0].delay, Duration::from_millis(250));
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn throttled_get_is_retried_permanent_errors_are_not() {
    let upstream = Scripted::new([status(429)], status(200));
    let response = stack(RetryPolicy::new(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 2);

    let upstream = Scripted::always(status(404));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.class(), Class::PERMANENT);
    assert_eq!(failure.give_up(), Some(GiveUp::NotRetryable));
    assert_eq!(failure.attempts(), 1);

    let upstream = Scripted::always(status(400));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(post_with_key("/", "{}", "k-400"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.class(), Class::PERMANENT);
}

#[tokio::test(start_paused = true)]
async fn post_is_retried_only_with_an_idempotency_key() {
    let upstream = Scripted::new([Step::Io(std::io::ErrorKind::ConnectionReset)], status(202));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(post("/charge", "{\"amount\":100}"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.give_up(), Some(GiveUp::NotIdempotent));
    assert_eq!(
        failure.code(),
        Code::Io(std::io::ErrorKind::ConnectionReset)
    );

    let upstream = Scripted::new([Step::Io(std::io::ErrorKind::ConnectionReset)], status(202));
    let response = stack(RetryPolicy::new(), &upstream)
        .oneshot(post_with_key("/charge", "{\"amount\":100}", "pay-42"))
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.key.as_deref() == Some("pay-42")));
    assert!(seen.iter().all(|s| s.body == "{\"amount\":100}"));
}

#[tokio::test(start_paused = true)]
async fn attempts_are_capped_and_counted_per_request() {
    let upstream = Scripted::always(status(503));
    let svc = stack(RetryPolicy::new().max_attempts(4), &upstream);
    let failure = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 4);
    assert_eq!(failure.attempts(), 4);
    assert_eq!(failure.give_up(), Some(GiveUp::AttemptsExhausted));
    assert!(failure.first_failed_at().is_some());

    let upstream = Scripted::always(status(503));
    let svc = stack(RetryPolicy::new().max_attempts(4), &upstream);
    let (a, b) = tokio::join!(
        svc.clone().oneshot(get("/a")),
        svc.clone().oneshot(get("/b"))
    );
    assert_eq!(a.unwrap_err().attempts(), 4);
    assert_eq!(b.unwrap_err().attempts(), 4);
    assert_eq!(upstream.calls(), 8);
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_exponentially_between_attempts() {
    let upstream = Scripted::always(Step::Io(std::io::ErrorKind::ConnectionRefused));
    let policy = RetryPolicy::new().max_attempts(4).backoff(no_jitter(100));
    stack(policy, &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    let seen = upstream.seen();
    let gaps: Vec<_> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert_eq!(gaps, [100, 200, 400].map(Duration::from_millis).to_vec());
}

#[tokio::test(start_paused = true)]
async fn unknown_error_types_are_classified_and_retried_within_cap() {
    #[derive(Debug)]
    struct NeverSeen;
    impl std::fmt::Display for NeverSeen {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a kind of error nobody mapped")
        }
    }
    impl std::error::Error for NeverSeen {}

    let calls = Arc::new(Mutex::new(0));
    let counter = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new().retry_at_most(Class::UNKNOWN, 2),
        ))
        .layer(ClassifyLayer::new(|_: &()| None))
        .service(tower::service_fn(move |_: String| {
            *counter.lock().unwrap() += 1;
            async { Err::<(), NeverSeen>(NeverSeen) }
        }));
    let failure = svc.oneshot("payload".to_owned()).await.unwrap_err();
    assert_eq!(failure.class(), Class::UNKNOWN);
    assert_eq!(failure.code(), Code::Error);
    assert_eq!(*calls.lock().unwrap(), 2);
    assert!(
        failure
            .to_string()
            .contains("a kind of error nobody mapped"),
        "{failure}"
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_is_driven_before_each_retry() {
    // tower-test's mock checks the readiness contract: a call without poll_ready panics.
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<&'static str, (), _>(
        RetryLayer::new(RetryPolicy::new().backoff(no_jitter(10))),
    );
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call("hello"));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req, "hello");
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    // The retry waits for readiness: nothing is sent until the mock allows it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!response.is_finished());
    handle.allow(1);
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req, "hello");
    send.send_response(());
    assert!(response.await.unwrap().is_ok());
}
