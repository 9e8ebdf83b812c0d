//! RetryLayer, with ClassifyLayer below it, on tokio's paused clock.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use support::{
    Scripted, Step, get, no_jitter, post, post_with_key, retry_stack as stack, status, status_with,
};
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_backstop::classify::{ClassifyLayer, HttpClassifier};
use tower_backstop::dead_letter::DeadLetterStatus;
use tower_backstop::observe::Event;
use tower_backstop::retry::{
    Attempts, Backoff, Budget, DelaySource, GiveUp, Jitter, RetryLayer, RetryPolicy,
};
use tower_backstop::{Class, Code, Failure, Sent};

/// One `Event::RetryScheduled`, as the listener saw it.
#[derive(Clone, Copy, Debug)]
struct RetryEvent {
    delay: Duration,
    source: DelaySource,
}

fn recorder() -> (
    Arc<Mutex<Vec<RetryEvent>>>,
    impl Fn(&Event<'_>) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    (events, move |e: &Event<'_>| {
        if let Event::RetryScheduled { delay, source, .. } = *e {
            sink.lock().unwrap().push(RetryEvent { delay, source });
        }
    })
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
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    let retry_at = failure
        .note::<Attempts>()
        .and_then(Attempts::retry_at)
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
            .give_up_long_delays(),
        &upstream,
    );
    let failure = svc.oneshot(get("/mail")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::HintTooLong)
    );
    assert_eq!(
        failure.note::<Attempts>().and_then(Attempts::retry_at),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn absurd_retry_after_values_never_panic() {
    // A huge but well-formed value ends retrying; malformed ones fall back to computed backoff.
    let upstream = Scripted::always(status_with(429, "retry-after", "9999999999"));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    assert!(
        failure
            .note::<Attempts>()
            .and_then(Attempts::retry_at)
            .unwrap()
            > SystemTime::now() + Duration::from_secs(9_999_999_000)
    );
    assert_eq!(upstream.calls(), 1);

    for bad in ["-1", "nan", "1e999", "soon", "99999999999999999999999999x"] {
        let upstream = Scripted::new([status_with(429, "retry-after", bad)], status(200));
        let (events, on_retry) = recorder();
        let policy = RetryPolicy::new()
            .backoff(no_jitter(100))
            .listener(on_retry);
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
        .listener(on_retry);
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
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);

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
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
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
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 4);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert!(
        failure
            .note::<Attempts>()
            .and_then(Attempts::first_failed_at)
            .is_some()
    );

    let upstream = Scripted::always(status(503));
    let svc = stack(RetryPolicy::new().max_attempts(4), &upstream);
    let (a, b) = tokio::join!(
        svc.clone().oneshot(get("/a")),
        svc.clone().oneshot(get("/b"))
    );
    assert_eq!(
        a.unwrap_err().note::<Attempts>().map_or(0, Attempts::count),
        4
    );
    assert_eq!(
        b.unwrap_err().note::<Attempts>().map_or(0, Attempts::count),
        4
    );
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
        .layer(
            RetryPolicy::new()
                .retry_at_most(Class::UNKNOWN, 2)
                .build()
                .unwrap(),
        )
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
        RetryPolicy::new().backoff(no_jitter(10)).build().unwrap(),
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

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_after_the_deadline_even_when_readiness_is_late() {
    // A 100 ms delay fits in a 150 ms deadline; readiness then takes until 250 ms.
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<&'static str, (), _>(
        RetryPolicy::new()
            .backoff(no_jitter(100))
            .deadline(Duration::from_millis(150))
            .build()
            .unwrap(),
    );
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let response = tokio::spawn(svc.call("hello"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!response.is_finished());
    handle.allow(1);
    let failure = response.await.unwrap().unwrap_err();
    // The last real failure, given up for the deadline; no second request was sent.
    assert_eq!(
        failure.code(),
        Code::Io(std::io::ErrorKind::ConnectionReset)
    );
    assert_eq!(
        failure.notes().get::<Attempts>().unwrap().give_up(),
        GiveUp::DeadlineExceeded
    );
    assert_eq!(failure.notes().get::<Attempts>().unwrap().count(), 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(10), handle.next_request())
            .await
            .is_err()
    );
}

/// A service that answers with a scripted list of ready-made failures, then `then`, counting calls.
#[derive(Clone)]
struct Failing {
    script: Arc<Mutex<std::collections::VecDeque<Failure<()>>>>,
    then: fn() -> Failure<()>,
    calls: Arc<Mutex<u32>>,
}

impl Failing {
    fn new(script: Vec<Failure<()>>, then: fn() -> Failure<()>) -> Self {
        Failing {
            script: Arc::new(Mutex::new(script.into())),
            then,
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }
}

impl tower::Service<&'static str> for Failing {
    type Response = ();
    type Error = Failure<()>;
    type Future = std::future::Ready<Result<(), Failure<()>>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: &'static str) -> Self::Future {
        *self.calls.lock().unwrap() += 1;
        let next = self.script.lock().unwrap().pop_front();
        std::future::ready(Err(next.unwrap_or_else(self.then)))
    }
}

/// Sends one request through a `RetryLayer` with `policy` over `upstream`; the failure it ends with.
async fn fail_through(policy: RetryPolicy, upstream: &Failing) -> Failure<()> {
    policy
        .build()
        .unwrap()
        .layer(upstream.clone())
        .oneshot("m")
        .await
        .unwrap_err()
}

fn rejected() -> Failure<()> {
    Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen).with_retry_after(Duration::from_secs(1))
}

fn unavailable() -> Failure<()> {
    Failure::new(
        Class::TRANSIENT,
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
    )
}

/// Two breaker rejections (each half-opening in 1 s), then 503s, under a transient cap of 4 and
/// `max_attempts` overall, with in-process waiting for the breaker opted in up to 2 s.
async fn rejections_then_503s(max_attempts: u32) -> (Failing, Failure<()>) {
    let upstream = Failing::new(vec![rejected(), rejected()], unavailable);
    let policy = RetryPolicy::new()
        .max_attempts(max_attempts)
        .backoff(no_jitter(10))
        .wait_for_breaker(Duration::from_secs(2))
        .retry_at_most(Class::TRANSIENT, 4);
    let failure = fail_through(policy, &upstream).await;
    (upstream, failure)
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_fast_and_is_deferred_to_the_half_open_instant() {
    // By default a rejection comes back at once: no sleep, no second call, not an attempt.
    let upstream = Failing::new(vec![], rejected);
    let start = Instant::now();
    let before = SystemTime::now();
    let failure = fail_through(RetryPolicy::new().max_attempts(5), &upstream).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.class(), Class::CIRCUIT_OPEN);
    assert_eq!(
        failure.note::<Attempts>().map_or(0, Attempts::count),
        0,
        "a rejection is not an attempt"
    );
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    // Deferred to the half-open instant (1 s from now), rounded up to the second.
    let at = failure
        .note::<Attempts>()
        .and_then(Attempts::retry_at)
        .expect("a retry-at time");
    assert!(at >= before + Duration::from_secs(1));
    assert!(at <= SystemTime::now() + Duration::from_secs(2));
    let text = failure.to_string();
    assert!(!text.contains("server asked"), "{text}");
    assert!(text.contains("half-opens in 1s"), "{text}");

    // After real attempts, the rejection still adds none.
    let upstream = Failing::new(vec![unavailable(), unavailable()], rejected);
    let failure = fail_through(
        RetryPolicy::new().max_attempts(5).backoff(no_jitter(10)),
        &upstream,
    )
    .await;
    assert_eq!(upstream.calls(), 3);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );

    // Without a retry copy at all (one attempt), a rejection is deferred too.
    let upstream = Failing::new(vec![], rejected);
    let failure = fail_through(RetryPolicy::new().max_attempts(1), &upstream).await;
    assert_eq!(
        (
            failure.note::<Attempts>().map_or(0, Attempts::count),
            failure.note::<Attempts>().map(Attempts::give_up)
        ),
        (0, Some(GiveUp::Deferred))
    );
    // Only a rejection: another failure with a hint, after the one attempt allowed, is given up
    // (attempts exhausted), not deferred to its hint.
    let upstream = Failing::new(vec![], || {
        Failure::new(
            Class::TRANSIENT,
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
        )
        .with_retry_after(Duration::from_secs(1))
    });
    let failure = fail_through(RetryPolicy::new().max_attempts(1), &upstream).await;
    let note = failure.note::<Attempts>().expect("the retry layer's note");
    assert_eq!(
        (note.count(), note.give_up(), note.retry_at()),
        (1, GiveUp::AttemptsExhausted, None)
    );

    // Under `give_up_long_delays`, it is given up instead, at once.
    let upstream = Failing::new(vec![], rejected);
    let failure = fail_through(RetryPolicy::new().give_up_long_delays(), &upstream).await;
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::HintTooLong)
    );
    assert_eq!(upstream.calls(), 1);

    // A forced-open breaker names no half-open instant: the request stops, not retried.
    let upstream = Failing::new(vec![], || {
        Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
    });
    let failure = fail_through(RetryPolicy::new(), &upstream).await;
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn waiting_for_the_breaker_is_an_opt_in_with_a_bound() {
    // Opted in up to 2 s: two rejections waited, then 503s up to the transient cap. The
    // rejections are calls to the layer below but not attempts.
    let (events, on_retry) = recorder();
    let upstream = Failing::new(vec![rejected(), rejected()], unavailable);
    let policy = RetryPolicy::new()
        .max_attempts(8)
        .backoff(no_jitter(10))
        .wait_for_breaker(Duration::from_secs(2))
        .retry_at_most(Class::TRANSIENT, 4)
        .listener(on_retry);
    let failure = fail_through(policy, &upstream).await;
    assert_eq!(upstream.calls(), 6, "2 rejections + 4 transient failures");
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 4);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    let waits: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .take(2)
        .map(|e| (e.source, e.delay))
        .collect();
    for (source, delay) in waits {
        assert_eq!(source, DelaySource::Breaker);
        // The time left, spread by up to +25 % and kept within the bound.
        assert!(
            delay >= Duration::from_secs(1) && delay <= Duration::from_millis(1250),
            "{delay:?}"
        );
    }

    // A breaker that half-opens later than the bound is deferred, not waited.
    let upstream = Failing::new(vec![], || {
        Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
            .with_retry_after(Duration::from_secs(3))
    });
    let start = Instant::now();
    let failure = fail_through(
        RetryPolicy::new().wait_for_breaker(Duration::from_secs(2)),
        &upstream,
    )
    .await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn class_caps_count_only_failures_of_that_class() {
    // Two waited breaker rejections, then 503s: the rejections eat into neither cap.
    let (upstream, failure) = rejections_then_503s(8).await;
    assert_eq!(upstream.calls(), 6, "2 rejections + 4 transient failures");
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 4);
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );

    // The overall cap bounds the attempts, whatever the classes; rejections are not attempts.
    let (upstream, failure) = rejections_then_503s(3).await;
    assert_eq!(upstream.calls(), 5);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 3);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );

    // A class cap alone: circuit_open capped at 2 ends the series on the second rejection,
    // whatever the transient cap.
    let upstream = Failing::new(vec![], rejected);
    let policy = RetryPolicy::new()
        .max_attempts(8)
        .wait_for_breaker(Duration::from_secs(2))
        .retry_at_most(Class::CIRCUIT_OPEN, 2);
    let failure = fail_through(policy, &upstream).await;
    assert_eq!(upstream.calls(), 2);
    assert_eq!(failure.class(), Class::CIRCUIT_OPEN);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 0);
}

#[tokio::test(start_paused = true)]
async fn per_class_delay_rules_are_followed() {
    const SOFT_BOUNCE: Class = Class::new("soft_bounce");
    fn soft_bounce() -> Failure<()> {
        Failure::new(SOFT_BOUNCE, Code::Smtp(450))
    }
    let upstream = Failing::new(vec![unavailable(), unavailable()], soft_bounce);
    let (events, on_retry) = recorder();
    let policy = RetryPolicy::new()
        .max_attempts(6)
        .max_delay(Duration::from_secs(60))
        .backoff(Backoff::linear(
            Duration::from_millis(100),
            Duration::from_millis(50),
            Duration::from_secs(1),
        ))
        .class(
            SOFT_BOUNCE,
            tower_backstop::retry::ClassPolicy::retry()
                .max_attempts(3)
                .backoff(Backoff::schedule([5, 15, 30].map(Duration::from_secs)).unwrap()),
        )
        .listener(on_retry);
    let failure = fail_through(policy, &upstream).await;
    let delays: Vec<_> = events.lock().unwrap().iter().map(|e| e.delay).collect();
    // Transient: linear 100 ms, 150 ms; then the soft bounce's own schedule from its start.
    assert_eq!(
        delays,
        [100, 150, 5_000, 15_000]
            .map(Duration::from_millis)
            .to_vec()
    );
    assert_eq!(upstream.calls(), 5);
    assert_eq!(failure.class(), SOFT_BOUNCE);
    assert_eq!(failure.code(), Code::Smtp(450));
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn a_schedule_above_max_delay_is_deferred() {
    const SOFT_BOUNCE: Class = Class::new("soft_bounce");
    fn soft_bounce() -> Failure<()> {
        Failure::new(SOFT_BOUNCE, Code::Smtp(451))
    }
    let upstream = Failing::new(vec![], soft_bounce);
    let policy = RetryPolicy::new().class(
        SOFT_BOUNCE,
        tower_backstop::retry::ClassPolicy::retry().backoff(
            Backoff::schedule([15 * 60, 3600, 6 * 3600].map(Duration::from_secs)).unwrap(),
        ),
    );
    let before = SystemTime::now();
    let start = Instant::now();
    let failure = fail_through(policy, &upstream).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing slept");
    assert_eq!(upstream.calls(), 1);
    assert!(
        failure
            .note::<Attempts>()
            .is_some_and(Attempts::is_deferred)
    );
    assert!(
        failure
            .note::<Attempts>()
            .and_then(Attempts::retry_at)
            .unwrap()
            >= before + Duration::from_secs(15 * 60)
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_bounds_attempts_and_returns_the_last_real_failure() {
    // Deadline 5 s, upstream always 503 with no hint, backoff 1 s doubling: attempts at 0 s,
    // 1 s, 3 s; the next would start at 7 s, past the deadline, so none does.
    let upstream = Scripted::always(status(503));
    let policy = RetryPolicy::new()
        .max_attempts(100)
        .backoff(
            Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
                .jitter(Jitter::None),
        )
        .deadline(Duration::from_secs(5));
    let start = Instant::now();
    let failure = stack(policy, &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    let starts: Vec<_> = upstream.seen().iter().map(|s| s.at - start).collect();
    assert_eq!(starts, [0, 1, 3].map(Duration::from_secs).to_vec());
    assert!(starts.iter().all(|t| *t <= Duration::from_secs(5)));
    assert!(start.elapsed() <= Duration::from_secs(5));
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 3);
    // The last real failure, with its response, not a bare "deadline exceeded".
    assert_eq!(
        failure.code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(failure.into_response().unwrap().status(), 503);
}

#[tokio::test(start_paused = true)]
async fn deadline_cuts_a_running_attempt() {
    // 503 at once, then an attempt that would take 60 s: the deadline (2 s) drops it at 2 s and
    // the caller gets the 503.
    let upstream = Scripted::new(
        [status(503)],
        Step::After(Duration::from_secs(60), Box::new(status(200))),
    );
    let policy = RetryPolicy::new()
        .backoff(no_jitter(100))
        .deadline(Duration::from_secs(2));
    let start = Instant::now();
    let failure = stack(policy, &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(upstream.calls(), 2);
    assert_eq!(upstream.finished(), 1, "the slow attempt was dropped");
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(
        failure.code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 2);

    // With no earlier failure, the first attempt is cut and says why.
    let upstream = Scripted::always(Step::After(Duration::from_secs(60), Box::new(status(200))));
    let policy = RetryPolicy::new().deadline(Duration::from_secs(2));
    let failure = stack(policy, &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert!(
        failure
            .to_string()
            .contains("retry deadline elapsed during the first attempt"),
        "{failure}"
    );
}

#[tokio::test(start_paused = true)]
async fn ratio_budget_allows_at_most_six_retries_per_ten_first_attempts() {
    let upstream = Scripted::always(status(503));
    let budget = Budget::ratio(0.6, 0, Duration::from_secs(10)).unwrap();
    let policy = RetryPolicy::new()
        .max_attempts(10)
        .backoff(no_jitter(1))
        .budget(budget);
    let svc = stack(policy, &upstream);
    let mut exhausted = 0;
    for i in 0..10 {
        let failure = svc
            .clone()
            .oneshot(get(&format!("/{i}")))
            .await
            .unwrap_err();
        if failure.note::<Attempts>().map(Attempts::give_up) == Some(GiveUp::BudgetExhausted) {
            exhausted += 1;
        }
    }
    let retries = upstream.calls() - 10;
    assert!(retries <= 6, "{retries} retries");
    assert_eq!(retries, 6, "the budget is spent, not wasted");
    assert!(exhausted >= 4, "{exhausted}");

    // Ten requests at once: the same bound, with retries waiting in backoff counted.
    let upstream = Scripted::always(status(503));
    let budget = Budget::ratio(0.6, 0, Duration::from_secs(10)).unwrap();
    let policy = RetryPolicy::new()
        .max_attempts(10)
        .backoff(no_jitter(1_000))
        .budget(budget);
    let svc = stack(policy, &upstream);
    let all =
        futures_util::future::join_all((0..10).map(|i| svc.clone().oneshot(get(&format!("/{i}")))))
            .await;
    assert!(all.iter().all(Result::is_err));
    assert_eq!(upstream.calls() - 10, 6);
}

#[tokio::test(start_paused = true)]
async fn token_bucket_throttles_retries_per_grfc_a6() {
    // 4 tokens, threshold 2: the first failure leaves 3 (> 2, retry), the second 2 (not above
    // half: no more retries), and the failure says so.
    let upstream = Scripted::always(status(503));
    let policy = RetryPolicy::new()
        .max_attempts(5)
        .backoff(no_jitter(1))
        .budget(Budget::token_bucket(4, 0.5).unwrap());
    let svc = stack(policy.clone(), &upstream);
    let failure = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 2);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::BudgetExhausted)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 2);
    // Shared by clones: the next request through another clone is not retried at all.
    let failure = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::BudgetExhausted)
    );
    // Successes refill it (0.5 each): five bring it from 1 to 3.5; the next failure leaves 2.5,
    // above the threshold, so one retry is allowed, whose failure leaves 1.5.
    let ok = Scripted::always(status(200));
    let ok_svc = stack(policy, &ok);
    for _ in 0..5 {
        ok_svc.clone().oneshot(get("/")).await.unwrap();
    }
    let failure = svc.oneshot(get("/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 5, "one retry allowed again");
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::BudgetExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn refused_post_is_retried_for_any_method_other_failures_are_not() {
    // 503 and 429 prove the request was not processed: a keyless POST is retried.
    for refusal in [503, 429] {
        let upstream = Scripted::new([status(refusal)], status(201));
        let response = stack(RetryPolicy::new().backoff(no_jitter(10)), &upstream)
            .oneshot(post("/messages", "{}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(upstream.calls(), 2);
    }
    // A 500 does not: the POST is not sent twice.
    let upstream = Scripted::new([status(500)], status(201));
    let failure = stack(RetryPolicy::new(), &upstream)
        .oneshot(post("/messages", "{}"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
    // Unless the policy says no.
    let upstream = Scripted::new([status(503)], status(201));
    let failure = stack(RetryPolicy::new().retry_unprocessed(false), &upstream)
        .oneshot(post("/messages", "{}"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
}

#[tokio::test(start_paused = true)]
async fn timeout_after_keyless_post_is_outcome_unknown() {
    let upstream = Scripted::always(Step::After(Duration::from_secs(10), Box::new(status(200))));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().build().unwrap())
        .layer(ClassifyLayer::http())
        .layer(tower_backstop::timeout::TimeoutLayer::new(
            Duration::from_secs(1),
        ))
        .service(upstream.clone());
    let failure = svc
        .oneshot(post("/charge", "{\"amount\":100}"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );

    // With one attempt allowed, the reason is still the request's outcome, not the cap: a
    // record that says "attempts exhausted" would invite a re-send of a charge that may have
    // gone through.
    let upstream = Scripted::always(Step::After(Duration::from_secs(10), Box::new(status(200))));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
        .layer(ClassifyLayer::http())
        .layer(tower_backstop::timeout::TimeoutLayer::new(
            Duration::from_secs(1),
        ))
        .service(upstream.clone());
    let failure = svc
        .oneshot(post("/charge", "{\"amount\":100}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(
        failure.note::<Attempts>().map(|a| (a.count(), a.give_up())),
        Some((1, GiveUp::NotIdempotent))
    );
}

#[tokio::test(start_paused = true)]
async fn payment_post_timing_out_is_retried_with_the_same_stamped_key() {
    // The provider honours Idempotency-Key: it charges once per key and answers a repeat with
    // the stored outcome. The first attempt is charged but answers too late (the 1 s timeout
    // fires); the retry carries the same key and gets the stored outcome.
    #[derive(Default)]
    struct Provider {
        charges: Vec<String>,
        keys_seen: Vec<String>,
    }
    let provider = Arc::new(Mutex::new(Provider::default()));
    let state = provider.clone();
    let upstream = tower::service_fn(move |req: http::Request<String>| {
        let state = state.clone();
        async move {
            let key = req.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_owned();
            let first = {
                let mut p = state.lock().unwrap();
                p.keys_seen.push(key.clone());
                if p.charges.contains(&key) {
                    false
                } else {
                    p.charges.push(key);
                    true
                }
            };
            if first {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Ok::<_, tower_backstop::BoxError>(
                http::Response::builder().status(201).body(()).unwrap(),
            )
        }
    });
    let svc = ServiceBuilder::new()
        .layer(
            tower_http::set_header::SetRequestHeaderLayer::if_not_present(
                tower_backstop::request::IDEMPOTENCY_KEY.clone(),
                |_: &http::Request<_>| Some(tower_backstop::request::new_idempotency_key()),
            ),
        )
        .layer(RetryPolicy::new().backoff(no_jitter(100)).build().unwrap())
        .layer(ClassifyLayer::http())
        .layer(tower_backstop::timeout::TimeoutLayer::new(
            Duration::from_secs(1),
        ))
        .service(upstream);
    let response = svc
        .oneshot(post("/payments", "{\"amount\":100}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let p = provider.lock().unwrap();
    assert_eq!(p.keys_seen.len(), 2, "two attempts");
    assert_eq!(p.keys_seen[0], p.keys_seen[1], "the same key on both");
    assert_eq!(p.charges.len(), 1, "one charge");
}

#[tokio::test(start_paused = true)]
async fn retry_after_a_day_is_deferred_and_the_dead_letter_record_has_the_retry_at_time() {
    use tower_backstop::dead_letter::DeadLetterLayer;
    use tower_backstop::store::{MemoryStore, Store};
    let store = MemoryStore::new();
    let upstream = Scripted::always(status_with(503, "retry-after", "86400"));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(
            RetryPolicy::new()
                .max_delay(Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let before = SystemTime::now();
    let start = Instant::now();
    let failure = svc
        .oneshot(post_with_key("/mail", "{}", "msg-86400"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "not slept");
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    let retry_at = failure
        .note::<Attempts>()
        .and_then(Attempts::retry_at)
        .unwrap();
    let day = Duration::from_secs(86_400);
    assert!(
        retry_at >= before + day,
        "never before the server's instant"
    );
    assert!(retry_at <= SystemTime::now() + day + Duration::from_secs(1));
    let record = store.get("msg-86400").await.unwrap().unwrap();
    let stored = record.retry_at.expect("the record carries a retry-at time");
    // The record's time is kept to the millisecond by the store.
    assert!(
        stored + Duration::from_millis(1) >= before + day && stored <= retry_at,
        "{stored:?} vs {retry_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_replayed_is_never_retried_and_the_failure_says_so() {
    struct Streaming;
    impl tower_backstop::Replay for Streaming {
        fn replay(&self) -> Option<Self> {
            None
        }
    }
    let calls = Arc::new(Mutex::new(0));
    let svc = RetryPolicy::new().build().unwrap().layer(refusing(&calls));
    let before = std::time::SystemTime::now();
    let failure = svc.oneshot(Streaming).await.unwrap_err();
    assert_eq!(*calls.lock().unwrap(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotReplayable)
    );
    // One real attempt was made, and the note counts it.
    assert_eq!(failure.note::<Attempts>().map(Attempts::count), Some(1));
    // The note keeps when the attempt failed (what a dead-letter record's `first_failed_at` is).
    let first = failure
        .note::<Attempts>()
        .and_then(Attempts::first_failed_at)
        .expect("the time of the failure");
    assert!(first >= before && first <= std::time::SystemTime::now());
    assert!(
        failure.to_string().contains("cannot be replayed"),
        "{failure}"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limit_reset_and_grpc_pushback_are_server_hints() {
    // RateLimit-Reset: 7 s, slept as given (no jitter on a server hint).
    let upstream = Scripted::new([status_with(429, "ratelimit-reset", "7")], status(200));
    let (events, on_retry) = recorder();
    stack(RetryPolicy::new().listener(on_retry), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap();
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_secs(7));
    assert_eq!(events.lock().unwrap()[0].source, DelaySource::ServerHint);

    // grpc-retry-pushback-ms (gRFC A6): a value is the delay; a negative one means stop.
    use tower_backstop::classify::GrpcClassifier;
    let grpc = |pushback: &str| {
        Step::Status(
            200,
            vec![
                ("grpc-status", "8".to_owned()),
                ("grpc-retry-pushback-ms", pushback.to_owned()),
            ],
        )
    };
    let grpc_stack = |upstream: &Scripted| {
        ServiceBuilder::new()
            .layer(RetryPolicy::new().assume_idempotent(true).build().unwrap())
            .layer(ClassifyLayer::new(GrpcClassifier::new()))
            .service(upstream.clone())
    };
    let upstream = Scripted::new([grpc("250")], status(200));
    grpc_stack(&upstream)
        .oneshot(post("/svc/Method", ""))
        .await
        .unwrap();
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(250));

    let upstream = Scripted::always(grpc("-1"));
    let failure = grpc_stack(&upstream)
        .oneshot(post("/svc/Method", ""))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(failure.class(), Class::THROTTLED);
    assert_eq!(failure.code(), Code::Grpc(8));
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::ServerSaidNo)
    );
}

#[tokio::test(start_paused = true)]
async fn the_stamped_key_is_the_dead_letter_id_and_outcome_unknown_is_recorded() {
    use tower_backstop::dead_letter::DeadLetterLayer;
    use tower_backstop::store::{MemoryStore, Store};
    use tower_backstop::timeout::TimeoutLayer;

    // With the key layer outermost: every attempt carries the stamped key, and the dead-letter
    // record is filed under it.
    let store = MemoryStore::new();
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(
            tower_http::set_header::SetRequestHeaderLayer::if_not_present(
                tower_backstop::request::IDEMPOTENCY_KEY.clone(),
                |_: &http::Request<_>| Some(tower_backstop::request::new_idempotency_key()),
            ),
        )
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let failure = svc.oneshot(post("/charge", "{}")).await.unwrap_err();
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    let key = seen[0].key.clone().expect("stamped");
    assert!(seen.iter().all(|s| s.key.as_deref() == Some(key.as_str())));
    let Some(tower_backstop::dead_letter::DeadLetterStatus::Stored { id }) =
        failure.note::<DeadLetterStatus>()
    else {
        panic!("not stored: {failure}");
    };
    assert_eq!(id, &key);
    assert_eq!(store.get(&key).await.unwrap().unwrap().attempts, 3);

    // Without it, a keyless POST that times out is recorded as outcome unknown, sent once.
    let store = MemoryStore::new();
    let upstream = Scripted::always(Step::After(Duration::from_secs(10), Box::new(status(200))));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryPolicy::new().build().unwrap())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(upstream.clone());
    let failure = svc.oneshot(post("/charge", "{}")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1);
    let Some(tower_backstop::dead_letter::DeadLetterStatus::Stored { id }) =
        failure.note::<DeadLetterStatus>()
    else {
        panic!("not stored: {failure}");
    };
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.class, "outcome_unknown");
    assert_eq!(record.code, "timeout");
}

#[tokio::test(start_paused = true)]
async fn throttled_waits_the_servers_delay_first_then_slower() {
    // 429 with Retry-After: 2, then 429 with no hint: the second wait is not the 200 ms the
    // backoff would give, but twice the server's last delay.
    let upstream = Scripted::new(
        [status_with(429, "retry-after", "2"), status(429)],
        status(200),
    );
    let (events, on_retry) = recorder();
    let policy = RetryPolicy::new()
        .max_attempts(4)
        .retry_at_most(Class::THROTTLED, 4)
        .listener(on_retry);
    stack(policy, &upstream).oneshot(get("/")).await.unwrap();
    let delays: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.delay, e.source))
        .collect();
    assert_eq!(
        delays,
        [
            (Duration::from_secs(2), DelaySource::ServerHint),
            (Duration::from_secs(4), DelaySource::Backoff)
        ]
    );
    // Transient failures keep the plain backoff.
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let (events, on_retry) = recorder();
    let policy = RetryPolicy::new()
        .backoff(no_jitter(100))
        .listener(on_retry);
    stack(policy, &upstream).oneshot(get("/")).await.unwrap();
    let delays: Vec<_> = events.lock().unwrap().iter().map(|e| e.delay).collect();
    assert_eq!(delays, [100, 200].map(Duration::from_millis).to_vec());
}

#[tokio::test]
async fn the_service_is_cloned_only_when_another_attempt_is_possible() {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// A ready service that counts its clones.
    struct Counted(Arc<AtomicU32>);
    impl Clone for Counted {
        fn clone(&self) -> Self {
            self.0.fetch_add(1, Ordering::SeqCst);
            Counted(self.0.clone())
        }
    }
    impl tower::Service<&'static str> for Counted {
        type Response = ();
        type Error = tower_backstop::BoxError;
        type Future = std::future::Ready<Result<(), tower_backstop::BoxError>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: &'static str) -> Self::Future {
            std::future::ready(Ok(()))
        }
    }
    async fn clones_per_call(policy: RetryPolicy) -> u32 {
        let clones = Arc::new(AtomicU32::new(0));
        let mut svc = policy.build().unwrap().layer(Counted(clones.clone()));
        for _ in 0..10 {
            svc.ready().await.unwrap();
            tower::Service::call(&mut svc, "m").await.unwrap();
        }
        clones.load(Ordering::SeqCst) / 10
    }
    assert_eq!(clones_per_call(RetryPolicy::new()).await, 1);
    assert_eq!(clones_per_call(RetryPolicy::new().max_attempts(1)).await, 0);
}

// ---- real servers' headers and statuses ----

/// Sends `req` through the default policy over a provider that answers `first`, then `then`;
/// the result, the upstream, and the paused-clock time it took.
async fn first_then(
    policy: RetryPolicy,
    first: Step,
    then: u16,
    req: http::Request<String>,
) -> (
    Result<http::Response<()>, Failure<http::Response<()>>>,
    Scripted,
    Duration,
) {
    let upstream = Scripted::new([first], status(then));
    let svc = stack(policy, &upstream);
    let start = Instant::now();
    let result = svc.oneshot(req).await;
    (result, upstream, start.elapsed())
}

/// A GET answered 429 with `header: value`, then 200: asserts it was retried once and
/// succeeded, and returns how long the retry waited (paused clock).
async fn waited_after_429_with(
    policy: RetryPolicy,
    header: &'static str,
    value: String,
) -> Duration {
    let (result, upstream, waited) =
        first_then(policy, status_with(429, header, value), 200, get("/mail")).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(upstream.calls(), 2);
    waited
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_keyless_post_answered_408_is_retried() {
    // 408: the server never read the whole request, so even a keyless POST may be sent again.
    let (result, upstream, _) =
        first_then(RetryPolicy::new(), status(408), 202, post("/mail", "{}")).await;
    assert_eq!(result.unwrap().status(), 202);
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn too_early_425_is_transient_and_proves_the_request_was_not_processed() {
    let (result, upstream, _) =
        first_then(RetryPolicy::new(), status(425), 200, get("/mail")).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(upstream.calls(), 2);
    // Even a keyless POST.
    let (result, upstream, _) =
        first_then(RetryPolicy::new(), status(425), 202, post("/mail", "{}")).await;
    assert_eq!(result.unwrap().status(), 202);
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn x_ratelimit_reset_in_epoch_milliseconds_waits_about_thirty_seconds() {
    let reset = (unix_now() + Duration::from_secs(30))
        .as_millis()
        .to_string();
    assert_eq!(reset.len(), 13);
    let waited = waited_after_429_with(RetryPolicy::new(), "x-ratelimit-reset", reset).await;
    assert!(
        waited >= Duration::from_secs(29) && waited <= Duration::from_secs(31),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_absurd_reset_is_ignored_not_turned_into_a_deferral_of_years() {
    // Epoch milliseconds read as seconds would be the year 58,900: the reset is ignored and the
    // throttled backoff applies.
    let reset = (unix_now() + Duration::from_secs(30))
        .as_millis()
        .to_string();
    let policy = RetryPolicy::new().backoff(no_jitter(100));
    let waited = waited_after_429_with(policy, "ratelimit-reset", reset).await;
    assert_eq!(waited, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn the_x_rate_limit_reset_spelling_is_honoured() {
    let reset = (unix_now() + Duration::from_secs(30)).as_secs().to_string();
    let waited = waited_after_429_with(RetryPolicy::new(), "x-rate-limit-reset", reset).await;
    assert!(
        waited >= Duration::from_secs(29) && waited <= Duration::from_secs(31),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_absolute_reset_second_is_never_reached_early() {
    // The reset is the next whole second: the retry goes out once it has passed.
    let now = unix_now();
    let reset_second = now.as_secs() + 1;
    let upstream = Scripted::new(
        [status_with(
            429,
            "x-ratelimit-reset",
            reset_second.to_string(),
        )],
        status(200),
    );
    let svc = stack(RetryPolicy::new(), &upstream);
    let result = svc.oneshot(get("/mail")).await;
    assert_eq!(result.unwrap().status(), 200);
    let seen = upstream.seen();
    let waited = seen[1].at - seen[0].at;
    // The layer read the wall clock somewhere between `now` and `after` (the clock is paused
    // for timers only), and the retry went out `waited` later: so at the latest at
    // `after + waited`, which must be past the end of the reset second. Reading the clock at
    // `now` alone would blame the layer for the test's own running time.
    let after = unix_now();
    assert!(
        after + waited >= Duration::from_secs(reset_second + 1),
        "retried by {:?} at the latest, the reset second {reset_second} had not passed",
        after + waited
    );
    // And not a whole extra second later (timers round up to the millisecond).
    assert!(
        now + waited <= Duration::from_secs(reset_second + 1) + Duration::from_millis(20),
        "waited {waited:?} from {now:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_503_proves_not_processed_by_default_and_a_user_can_exclude_it() {
    let (result, upstream, _) =
        first_then(RetryPolicy::new(), status(503), 202, post("/mail", "{}")).await;
    assert_eq!(result.unwrap().status(), 202);
    assert_eq!(upstream.calls(), 2);

    // The classifier decides what proves "not processed": without 503 in its list, a keyless
    // POST answered 503 is not sent again.
    let without_503 = HttpClassifier::new().not_sent_statuses(&[
        http::StatusCode::REQUEST_TIMEOUT,
        http::StatusCode::TOO_EARLY,
        http::StatusCode::TOO_MANY_REQUESTS,
    ]);
    let upstream = Scripted::new([status(503)], status(202));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().build().unwrap())
        .layer(ClassifyLayer::new(without_503))
        .service(upstream.clone());
    let result = svc.oneshot(post("/mail", "{}")).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.sent(), Sent::Yes);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotIdempotent)
    );
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn unknown_is_retried_once_and_more_slowly() {
    // Default policy: two 500s end it after 2 attempts, with one backoff delay between them.
    let upstream = Scripted::always(status(500));
    let (events, on_retry) = recorder();
    let svc = stack(
        RetryPolicy::new()
            .max_attempts(5)
            .backoff(no_jitter(100))
            .listener(on_retry),
        &upstream,
    );
    let failure = svc.oneshot(get("/mail")).await.unwrap_err();
    assert_eq!(failure.class(), Class::UNKNOWN);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert_eq!(upstream.calls(), 2);
    assert_eq!(events.lock().unwrap().len(), 1);

    // Given more attempts, it keeps the throttled class's slow-down: after a 503 retried at
    // 100 ms, the 500's delay is at least that again and up to twice it.
    let upstream = Scripted::new([status(503), status(500)], status(500));
    let (events, on_retry) = recorder();
    let svc = stack(
        RetryPolicy::new()
            .max_attempts(5)
            .backoff(no_jitter(100))
            .retry_at_most(Class::UNKNOWN, 3)
            .listener(on_retry),
        &upstream,
    );
    let failure = svc.oneshot(get("/mail")).await.unwrap_err();
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 4);
    let delays: Vec<_> = events.lock().unwrap().iter().map(|e| e.delay).collect();
    assert_eq!(
        delays,
        [100, 200, 400].map(Duration::from_millis).to_vec(),
        "503 at 100 ms, then the unknown backoff (100 ms) slowed to twice the previous delay"
    );
}

// The default policy retries by its table, and the overall deadline reads the clock only when an
// attempt first waits or fails.

#[tokio::test(start_paused = true)]
async fn the_default_policy_retries_by_its_table() {
    // 3 attempts in all, transient retried, permanent not: the default's table.
    let upstream = Scripted::always(status(503));
    let failure = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(ClassifyLayer::http())
        .service(upstream.clone())
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 3);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );

    let upstream = Scripted::new([status(503)], status(200));
    let response = stack(RetryPolicy::default(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 2);

    let upstream = Scripted::always(status(404));
    let failure = stack(RetryPolicy::default(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
}

/// An upstream that answers 200 after `delay`, or at its first poll for a zero delay.
fn ok_after(
    delay: Duration,
) -> impl tower::Service<
    &'static str,
    Response = &'static str,
    Error = tower_backstop::BoxError,
    Future: Send,
> + Clone {
    tower::service_fn(move |req: &'static str| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(req)
    })
}

#[test]
fn a_first_attempt_ready_at_its_first_poll_never_starts_the_deadline_timer() {
    // No time driver: creating a tokio timer here panics, so the calls prove none was made.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without time");
    rt.block_on(async {
        let policy = RetryPolicy::new().deadline(Duration::from_secs(2));
        let svc = policy.build().unwrap().layer(ok_after(Duration::ZERO));
        assert_eq!(svc.oneshot("m").await.unwrap(), "m");
        let svc = RetryLayer::default().layer(ok_after(Duration::ZERO));
        assert_eq!(svc.oneshot("m").await.unwrap(), "m");
    });
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_the_first_pending_not_from_call() {
    use std::pin::pin;
    use tower::Service;
    let policy = RetryPolicy::new().deadline(Duration::from_millis(200));
    let mut svc = policy
        .build()
        .unwrap()
        .layer(ok_after(Duration::from_millis(100)));
    svc.ready().await.unwrap();
    let future = pin!(svc.call("m"));
    // 150 ms between `call` and the first poll are not counted; the 100 ms wait is.
    tokio::time::advance(Duration::from_millis(150)).await;
    assert_eq!(future.await.unwrap(), "m");
}

#[tokio::test(start_paused = true)]
async fn a_zero_deadline_lets_only_an_answer_at_the_first_poll_through() {
    let policy = || RetryPolicy::new().deadline(Duration::ZERO);
    // Ready at once: the deadline never starts.
    let svc = policy().build().unwrap().layer(ok_after(Duration::ZERO));
    assert_eq!(svc.oneshot("m").await.unwrap(), "m");

    // Waits: cut at once (tokio's timer resolution is 1 ms), with nothing earlier to return.
    let start = Instant::now();
    let failure = policy()
        .build()
        .unwrap()
        .layer(ok_after(Duration::from_secs(1)))
        .oneshot("m")
        .await
        .unwrap_err();
    assert!(
        start.elapsed() <= Duration::from_millis(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);

    // Fails at once: already past the deadline, so not retried; the caller gets the 503.
    let upstream = Scripted::new([status(503)], status(200));
    let failure = stack(policy(), &upstream)
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 1);
    assert_eq!(
        failure.code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_of_duration_max_is_no_deadline() {
    let upstream = Scripted::new(
        [status(503), status(503)],
        Step::After(Duration::from_secs(3600), Box::new(status(200))),
    );
    let policy = RetryPolicy::new()
        .backoff(no_jitter(100))
        .deadline(Duration::MAX);
    let start = Instant::now();
    let response = stack(policy, &upstream).oneshot(get("/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 3);
    // 100 ms + 200 ms of backoff, then the one-hour attempt: nothing cut it.
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3600) + Duration::from_millis(300)
    );
}

/// A request that can be copied once only: the second attempt is sent, the third cannot be, and
/// the failure keeps when the first attempt failed.
#[tokio::test(start_paused = true)]
async fn a_request_that_stops_being_replayable_keeps_its_first_failure_time() {
    struct CopiesOnce(Arc<Mutex<u32>>);
    impl tower_backstop::Replay for CopiesOnce {
        fn replay(&self) -> Option<Self> {
            let mut copies = self.0.lock().unwrap();
            *copies += 1;
            (*copies == 1).then(|| CopiesOnce(Arc::clone(&self.0)))
        }
    }
    let calls = Arc::new(Mutex::new(0));
    let svc = RetryPolicy::new()
        .backoff(no_jitter(100))
        .max_attempts(3)
        .build()
        .unwrap()
        .layer(refusing(&calls));
    let before = std::time::SystemTime::now();
    let failure = svc
        .oneshot(CopiesOnce(Arc::new(Mutex::new(0))))
        .await
        .unwrap_err();
    assert_eq!(*calls.lock().unwrap(), 2, "the copy was sent, then nothing");
    let attempts = failure.note::<Attempts>().expect("the retry layer's note");
    assert_eq!(attempts.give_up(), GiveUp::NotReplayable);
    assert_eq!(attempts.count(), 2);
    let first = attempts
        .first_failed_at()
        .expect("the time of the first failure");
    assert!(first >= before && first <= std::time::SystemTime::now());
}

/// The inner service fails its readiness before a retry: the request stops there, and the note
/// still says when the first attempt failed (before the retry was scheduled, not when the call
/// gave up).
#[tokio::test(start_paused = true)]
async fn readiness_failing_before_a_retry_gives_up_with_the_first_failure_time() {
    let scheduled = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&scheduled);
    let policy = RetryPolicy::new().backoff(no_jitter(10)).listener(
        move |e: &tower_backstop::event::Event<'_>| {
            if let tower_backstop::event::Event::RetryScheduled { .. } = e {
                *seen.lock().unwrap() = Some(std::time::SystemTime::now());
            }
        },
    );
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<&'static str, (), _>(policy.build().unwrap());
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let before = std::time::SystemTime::now();
    let response = tokio::spawn(svc.call("hello"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    handle.send_error(std::io::Error::other("connection pool closed"));
    let failure = response.await.unwrap().unwrap_err();
    let attempts = failure.note::<Attempts>().expect("the retry layer's note");
    assert_eq!(attempts.give_up(), GiveUp::NotReady);
    assert_eq!(attempts.count(), 1);
    let first = attempts
        .first_failed_at()
        .expect("the time of the first failure");
    let scheduled = scheduled.lock().unwrap().expect("a retry was scheduled");
    assert!(first >= before && first <= scheduled);
}

/// A service that refuses every connection, counting its calls in `calls`.
fn refusing<Req>(
    calls: &Arc<Mutex<u32>>,
) -> impl tower::Service<Req, Response = (), Error = tower_backstop::BoxError, Future: Send>
+ Clone
+ use<Req> {
    let counter = Arc::clone(calls);
    tower::service_fn(move |_: Req| {
        *counter.lock().unwrap() += 1;
        async {
            Err::<(), tower_backstop::BoxError>(
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
            )
        }
    })
}
