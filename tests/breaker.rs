//! BreakerLayer, with ClassifyLayer below it, on tokio's paused clock.

mod support;

use std::time::Duration;

use support::{Scripted, Step, get, status};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::{Class, Code};

fn breaker(n: u32, open_for: Duration) -> BreakerLayer {
    BreakerLayer::consecutive_failures(n).open_for(open_for)
}

#[tokio::test(start_paused = true)]
async fn opens_after_consecutive_failures_and_rejects_without_calling() {
    let upstream = Scripted::always(status(503));
    let layer = breaker(3, Duration::from_secs(10));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..3 {
        let f = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(f.class(), Class::TRANSIENT);
    }
    assert_eq!(handle.state(), State::Open);
    let rejected = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(
        upstream.calls(),
        3,
        "the rejected call must not reach the upstream"
    );
    assert_eq!(rejected.class(), Class::CIRCUIT_OPEN);
    assert_eq!(rejected.code(), Code::CircuitOpen);
    assert_eq!(rejected.retry_after(), Some(Duration::from_secs(10)));

    tokio::time::advance(Duration::from_secs(4)).await;
    let rejected = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(rejected.retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(handle.stats().rejected, 2);
    assert_eq!(handle.stats().opened, 1);
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_count_and_4xx_does_not_count() {
    let upstream = Scripted::new(
        [
            status(503),
            status(503),
            status(200),
            status(503),
            status(503),
        ],
        status(400),
    );
    let layer = breaker(3, Duration::from_secs(10));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..15 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(upstream.calls(), 15);
    assert_eq!(handle.stats().opened, 0);
}

#[tokio::test(start_paused = true)]
async fn after_open_duration_exactly_one_probe_goes_through() {
    let upstream = Scripted::new(
        [status(503), status(503)],
        Step::After(Duration::from_millis(100), Box::new(status(503))),
    );
    let layer = breaker(2, Duration::from_secs(5));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    assert_eq!(handle.state(), State::Open);
    tokio::time::advance(Duration::from_secs(5)).await;

    let mut tasks = Vec::new();
    for _ in 0..50 {
        tasks.push(tokio::spawn(svc.clone().oneshot(get("/"))));
    }
    let mut rejected = 0;
    for t in tasks {
        let f = t.await.unwrap().unwrap_err();
        if f.class() == Class::CIRCUIT_OPEN {
            rejected += 1;
        }
    }
    assert_eq!(
        upstream.calls(),
        3,
        "exactly one probe reaches the upstream"
    );
    assert_eq!(rejected, 49);
    // The failed probe re-opened the breaker and restarted the timer.
    assert_eq!(handle.state(), State::Open);
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    let left = f.retry_after().unwrap();
    assert!(
        left > Duration::from_millis(4800) && left <= Duration::from_secs(5),
        "{left:?}"
    );
    let stats = handle.stats();
    assert_eq!((stats.opened, stats.half_opened, stats.probes), (2, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn successful_probe_closes() {
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let layer = breaker(2, Duration::from_secs(1));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.stats().closed, 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_or_ignored_probe_returns_its_permit() {
    let upstream = Scripted::new(
        [
            status(503),
            status(503),
            Step::After(Duration::from_secs(60), Box::new(status(200))),
            status(400),
        ],
        status(200),
    );
    let layer = breaker(2, Duration::from_secs(1));
    let handle = layer.handle();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    tokio::time::advance(Duration::from_secs(1)).await;

    // A probe whose future is dropped before completion.
    svc.ready().await.unwrap();
    let probe = svc.call(get("/"));
    assert_eq!(upstream.calls(), 3);
    drop(probe);
    assert_eq!(handle.state(), State::HalfOpen);

    // The next call becomes the probe; it ends in a 400, which does not count.
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(f.class(), Class::PERMANENT);
    assert_eq!(handle.state(), State::HalfOpen);

    // And the next one is a probe again, which closes it.
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(upstream.calls(), 5);
}

#[tokio::test(start_paused = true)]
async fn open_breaker_is_ready_even_when_inner_is_not() {
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<&'static str, (), _>(
        BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(30)),
    );
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = tokio::spawn(svc.call("a"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(call.await.unwrap().unwrap_err().class(), Class::TRANSIENT);
    // The mock allows nothing now, yet an open breaker answers ready and rejects at once.
    handle.allow(0);
    assert!(svc.poll_ready().is_ready());
    let f = svc.call("b").await.unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_from_before_the_trip_does_not_count_again() {
    // Two slow failures start while closed; the fast ones trip the breaker and it half-opens and
    // closes before the slow ones finish; their late failures belong to the earlier period.
    let upstream = Scripted::new(
        [
            Step::After(Duration::from_secs(30), Box::new(status(503))),
            Step::After(Duration::from_secs(30), Box::new(status(503))),
            status(503),
            status(503),
        ],
        status(200),
    );
    let layer = breaker(2, Duration::from_secs(1));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let slow = [
        tokio::spawn(svc.clone().oneshot(get("/slow"))),
        tokio::spawn(svc.clone().oneshot(get("/slow"))),
    ];
    tokio::task::yield_now().await;
    assert_eq!(upstream.calls(), 2);
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    assert_eq!(handle.state(), State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok());
    assert_eq!(handle.state(), State::Closed);
    for s in slow {
        let late = s.await.unwrap().unwrap_err();
        assert_eq!(late.class(), Class::TRANSIENT);
    }
    // Two late failures would reach the threshold if they counted in the new period.
    assert_eq!(handle.state(), State::Closed);
    let _ = svc.clone().oneshot(get("/")).await;
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().opened, 1);
}
