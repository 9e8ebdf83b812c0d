//! TimeoutLayer alone and under ClassifyLayer and RetryLayer, on tokio's paused clock.

mod support;

use std::time::Duration;

use support::{Scripted, Step, get, status};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::{Backoff, Jitter, RetryLayer, RetryPolicy};
use tower_backstop::timeout::{Elapsed, TimeoutLayer};
use tower_backstop::{Class, Code, GiveUp};

#[tokio::test(start_paused = true)]
async fn alone_it_cuts_a_slow_call() {
    let upstream = Scripted::always(Step::After(
        Duration::from_millis(500),
        Box::new(status(200)),
    ));
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(upstream.clone());
    let start = Instant::now();
    let err = svc.oneshot(get("/")).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    let elapsed = err.downcast_ref::<Elapsed>().expect("an Elapsed error");
    assert_eq!(elapsed.after(), Duration::from_millis(200));
    assert_eq!(upstream.finished(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fast_call_passes_through_untouched() {
    let upstream = Scripted::always(Step::After(
        Duration::from_millis(150),
        Box::new(status(204)),
    ));
    let svc = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(upstream.clone());
    assert_eq!(svc.oneshot(get("/")).await.unwrap().status(), 204);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_cut_and_classified_transient() {
    let upstream = Scripted::always(Step::After(
        Duration::from_millis(500),
        Box::new(status(200)),
    ));
    let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1))
        .jitter(Jitter::None);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new().max_attempts(3).backoff(backoff),
        ))
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(upstream.clone());
    let start = Instant::now();
    let failure = svc.oneshot(get("/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(failure.attempts(), 3);
    assert_eq!(failure.give_up(), Some(GiveUp::AttemptsExhausted));
    assert_eq!(upstream.calls(), 3);
    assert_eq!(upstream.finished(), 0, "no attempt ran to its 500 ms end");
    // 3 attempts of 200 ms, plus 100 ms and 200 ms of backoff.
    assert_eq!(start.elapsed(), Duration::from_millis(900));
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(300));
    assert_eq!(seen[2].at - seen[1].at, Duration::from_millis(400));
}
