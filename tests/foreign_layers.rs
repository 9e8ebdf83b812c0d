//! A failure keeps its class, code, hint and response through tower's own layers (`Buffer`,
//! `ConcurrencyLimit`, `LoadShed`, `RateLimit`, `Timeout`) and a tower-http layer placed between
//! ours: an outer layer that receives a `BoxError` finds the `Failure` inside it instead of
//! classifying it again. In-process upstream, paused clock.

mod support;

use std::cell::Cell;
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use support::{Scripted, Step, get, post, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::{Attempts, GiveUp, RetryPolicy};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BoxError, Class, Code, Failure};

#[tokio::test(start_paused = true)]
async fn buffer_keeps_a_404_and_it_is_not_retried() {
    let upstream = Scripted::always(status(404));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .buffer(16)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1, "a permanent failure is sent once");
    assert_eq!(f.class(), Class::PERMANENT);
    assert_eq!(f.code(), Code::Http(StatusCode::NOT_FOUND));
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(f.response_mut().unwrap().status(), 404);
}

#[tokio::test(start_paused = true)]
async fn buffer_keeps_a_429_with_its_retry_after() {
    let upstream = Scripted::always(status_with(429, "retry-after", "2"));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
        .buffer(16)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(f.class(), Class::THROTTLED);
    assert_eq!(f.code(), Code::Http(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(f.retry_after(), Some(Duration::from_secs(2)));
    let response = f.into_response().unwrap();
    assert_eq!(response.headers()["retry-after"], "2");
}

#[tokio::test(start_paused = true)]
async fn towers_own_timeout_is_a_transient_timeout() {
    let upstream = Scripted::always(Step::After(Duration::from_secs(5), Box::new(status(200))));
    let svc = ServiceBuilder::new()
        .layer(ClassifyLayer::http())
        .timeout(Duration::from_millis(100))
        .service(upstream.clone());
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.code(), Code::Timeout);
    assert_eq!(upstream.finished(), 0);
}

#[tokio::test(start_paused = true)]
async fn towers_timeout_between_our_layers_keeps_the_failure_and_times_out_as_a_timeout() {
    // tower's `Timeout` boxes every error: the 429 below it comes back whole, and its own
    // `Elapsed` (no classifier below it sees that one) is read as a timeout by the retry layer.
    let upstream = Scripted::new(
        [
            status_with(429, "retry-after", "1"),
            Step::After(Duration::from_secs(5), Box::new(status(200))),
        ],
        status(200),
    );
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(2).build().unwrap())
        .timeout(Duration::from_millis(100))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].at - seen[0].at,
        Duration::from_secs(1),
        "the 429 was retried after its Retry-After, which crossed tower's Timeout"
    );
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.code(), Code::Timeout);
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn concurrency_limit_and_rate_limit_pass_the_failure_through() {
    // tower's `RateLimit` is not `Clone` (it holds its timer), so under a retry layer it sits
    // behind a `Buffer`, as with tower's own `Retry`.
    let upstream = Scripted::always(status_with(503, "retry-after", "1"));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .concurrency_limit(4)
        .buffer(4)
        .rate_limit(100, Duration::from_secs(1))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert_eq!(f.response_mut().unwrap().status(), 503);
}

#[tokio::test(start_paused = true)]
async fn load_shed_keeps_the_failure_below_it() {
    let upstream = Scripted::always(status(400));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .load_shed()
        .layer(BreakerLayer::consecutive_failures(5))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(f.class(), Class::PERMANENT);
    assert_eq!(f.response_mut().unwrap().status(), 400);
}

#[tokio::test(start_paused = true)]
async fn a_shed_request_was_never_sent_so_a_keyless_post_is_sent_again() {
    // One slot, held for 150 ms by a first call: the keyless POST is shed (tower's `LoadShed`
    // answers `Overloaded` without calling the upstream), which proves it never left, so the
    // retry layer sends it again although POST is not idempotent.
    let upstream = Scripted::new(
        [Step::After(
            Duration::from_millis(150),
            Box::new(status(200)),
        )],
        status(201),
    );
    let policy = RetryPolicy::new()
        .max_attempts(3)
        .backoff(support::no_jitter(100));
    let svc = ServiceBuilder::new()
        .layer(policy.build().unwrap())
        .layer(ClassifyLayer::http())
        .load_shed()
        .concurrency_limit(1)
        .service(upstream.clone());
    let first = tokio::spawn(svc.clone().oneshot(get("http://up.test/slow")));
    tokio::task::yield_now().await;
    assert_eq!(upstream.calls(), 1);
    let response = svc
        .clone()
        .oneshot(post("http://up.test/messages", "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    let seen = upstream.seen();
    assert_eq!(
        seen.len(),
        2,
        "the shed attempts never reached the upstream"
    );
    assert_eq!(seen[1].method, http::Method::POST);

    // Shed on every attempt: a transient failure that says why.
    let upstream = Scripted::always(Step::After(Duration::from_secs(60), Box::new(status(200))));
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(2)
                .backoff(support::no_jitter(10))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .load_shed()
        .concurrency_limit(1)
        .service(upstream.clone());
    let _hold = tokio::spawn(svc.clone().oneshot(get("http://up.test/slow")));
    tokio::task::yield_now().await;
    let f = svc
        .oneshot(post("http://up.test/messages", "{}"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.code(), Code::Overloaded);
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn our_timeout_above_classify_keeps_class_code_hint_and_response() {
    // The order the issue found misbehaving: `TimeoutLayer` above `ClassifyLayer`. Its boxed
    // error is recovered whole.
    let upstream = Scripted::always(status_with(429, "retry-after", "3"));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(f.class(), Class::THROTTLED);
    assert_eq!(f.code(), Code::Http(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(f.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(f.response_mut().unwrap().status(), 429);
}

#[tokio::test(start_paused = true)]
async fn a_tower_http_layer_between_ours_keeps_the_failure() {
    let upstream = Scripted::always(status(422));
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .layer(
            tower_http::set_header::SetRequestHeaderLayer::if_not_present(
                http::header::USER_AGENT,
                HeaderValue::from_static("backstop-test"),
            ),
        )
        .buffer(4)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(upstream.calls(), 1);
    assert_eq!(f.class(), Class::PERMANENT);
    assert_eq!(f.response_mut().unwrap().status(), 422);
}

#[tokio::test(start_paused = true)]
async fn an_error_never_seen_before_is_unknown_with_its_message() {
    #[derive(Debug)]
    struct Strange;
    impl std::fmt::Display for Strange {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("strange thing happened")
        }
    }
    impl std::error::Error for Strange {}
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
        .buffer(4)
        .service(tower::service_fn(|_: http::Request<String>| async {
            Err::<http::Response<()>, BoxError>(Box::new(Strange))
        }));
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(f.class(), Class::UNKNOWN);
    assert_eq!(f.code(), Code::Error);
    assert_eq!(f.message(), "strange thing happened");
}

/// A response body that is `Send` but not `Sync` (like tonic's and reqwest's bodies).
struct NotSync(#[allow(dead_code)] Cell<u8>);

#[test]
fn a_failure_is_send_and_sync_when_the_response_is_only_send() {
    fn boxes<T: std::error::Error + Send + Sync + 'static>() {}
    boxes::<Failure<http::Response<NotSync>>>();
    let f: Failure<NotSync> =
        Failure::new(Class::TRANSIENT, Code::Timeout).with_response(NotSync(Cell::new(7)));
    let boxed: BoxError = Box::new(f);
    let back = Failure::<NotSync>::from(boxed);
    assert_eq!(back.into_response().unwrap().0.get(), 7);
}
