//! TimeoutLayer alone and under ClassifyLayer and RetryLayer, on tokio's paused clock.

mod support;

use std::time::Duration;

use support::{Scripted, Step, get, status};
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::{Attempts, Backoff, GiveUp, Jitter, RetryPolicy};
use tower_backstop::timeout::{Elapsed, TimeoutLayer};
use tower_backstop::{Class, Code};

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
        .layer(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(backoff)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(upstream.clone());
    let start = Instant::now();
    let failure = svc.oneshot(get("/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(failure.note::<Attempts>().map_or(0, Attempts::count), 3);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert_eq!(upstream.calls(), 3);
    assert_eq!(upstream.finished(), 0, "no attempt ran to its 500 ms end");
    // 3 attempts of 200 ms, plus 100 ms and 200 ms of backoff.
    assert_eq!(start.elapsed(), Duration::from_millis(900));
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(300));
    assert_eq!(seen[2].at - seen[1].at, Duration::from_millis(400));
}

// The lazy timer (issue #12): a call ready at its first poll never touches tokio's timer; the
// timer starts at the inner future's first `Pending`.

/// An inner service that answers `"ok"` after `delay`, or at its first poll for a zero delay.
fn answers_after(
    delay: Duration,
) -> impl tower::Service<(), Response = &'static str, Error = std::convert::Infallible, Future: Send>
+ Clone {
    tower::service_fn(move |()| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok("ok")
    })
}

#[test]
fn a_call_ready_at_its_first_poll_never_touches_the_timer() {
    // A runtime without a time driver: creating a tokio timer in it panics ("timers are
    // disabled"), so these calls prove that neither layer created one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without time");
    rt.block_on(async {
        let svc =
            TimeoutLayer::new(Duration::from_millis(200)).layer(answers_after(Duration::ZERO));
        assert_eq!(svc.oneshot(()).await.unwrap(), "ok");
        let svc = tower_backstop::server::ServerLayer::new()
            .timeout(Duration::from_millis(200))
            .layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }));
        assert_eq!(
            svc.oneshot(http::Request::new(())).await.unwrap().status(),
            200
        );
    });
}

#[tokio::test(start_paused = true)]
async fn the_timer_starts_at_the_first_pending_not_at_call() {
    use std::pin::pin;
    use tower::Service;
    let mut svc = TimeoutLayer::new(Duration::from_millis(200))
        .layer(answers_after(Duration::from_millis(100)));
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let future = pin!(svc.call(()));
    // 150 ms pass between `call` and the first poll: not counted. The inner call then waits
    // 100 ms, within the 200 ms timeout (a timer started in `call` would have cut it at 200 ms).
    tokio::time::advance(Duration::from_millis(150)).await;
    let start = Instant::now();
    assert_eq!(future.await.unwrap(), "ok");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_passes_ready_calls_and_cuts_the_rest() {
    let svc = TimeoutLayer::new(Duration::ZERO).layer(answers_after(Duration::ZERO));
    assert_eq!(svc.oneshot(()).await.unwrap(), "ok");

    let svc = TimeoutLayer::new(Duration::ZERO).layer(answers_after(Duration::from_millis(10)));
    let start = Instant::now();
    let err = svc.oneshot(()).await.unwrap_err();
    let elapsed = err.downcast_ref::<Elapsed>().expect("an Elapsed error");
    assert_eq!(elapsed.after(), Duration::ZERO);
    // Cut at the first tick of tokio's timer (1 ms resolution), before the call's 10 ms.
    assert!(
        start.elapsed() <= Duration::from_millis(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_of_duration_max_never_fires_and_never_panics() {
    let year = Duration::from_secs(365 * 24 * 3600);
    let svc = TimeoutLayer::new(Duration::MAX).layer(answers_after(year));
    let start = Instant::now();
    assert_eq!(svc.oneshot(()).await.unwrap(), "ok");
    assert_eq!(start.elapsed(), year);
    let svc = tower_backstop::server::ServerLayer::new()
        .timeout(Duration::MAX)
        .layer(tower::service_fn(move |_: http::Request<()>| async move {
            tokio::time::sleep(year).await;
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        }));
    assert_eq!(
        svc.oneshot(http::Request::new(())).await.unwrap().status(),
        200
    );
}

#[tokio::test(start_paused = true)]
async fn the_error_names_the_timeout_and_the_service_reports_it() {
    let svc = TimeoutLayer::new(Duration::from_millis(250)).layer(answers_after(S_LONG));
    assert_eq!(svc.timeout(), Duration::from_millis(250));
    let err = svc.oneshot(()).await.unwrap_err();
    // What a record's message and a log line show.
    assert_eq!(err.to_string(), "attempt timed out after 250ms");
    let direct =
        tower_backstop::timeout::Timeout::new(answers_after(S_LONG), Duration::from_secs(3));
    assert_eq!(direct.timeout(), Duration::from_secs(3));
}

const S_LONG: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services_own() {
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<&'static str, &'static str, _>(
        TimeoutLayer::new(Duration::from_secs(1)),
    );
    // Not ready while the inner service is not.
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    // Ready once it is; the call goes through to it.
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = tokio::spawn(svc.call("a"));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req, "a");
    send.send_response("ok");
    assert_eq!(call.await.unwrap().unwrap(), "ok");
    // An inner service that fails its readiness fails ours, with its own error.
    handle.send_error(std::io::Error::other("inner not ready"));
    let err = match svc.poll_ready() {
        std::task::Poll::Ready(Err(e)) => e,
        other => panic!("expected the inner error, got {other:?}"),
    };
    assert_eq!(err.to_string(), "inner not ready");
}
