//! BreakerLayer, with ClassifyLayer below it, on tokio's paused clock.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Scripted, Step, get, status};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::BuildError;
use tower_backstop::breaker::{BreakerHandle, BreakerLayer, Builder, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::observe::Event;
use tower_backstop::{Class, Code};

/// An upstream answer with `code` after `secs` seconds.
fn after(secs: u64, code: u16) -> Step {
    Step::After(Duration::from_secs(secs), Box::new(status(code)))
}

/// A breaker that opens for `open_for` after `n` failures in a row.
fn breaker(n: u32, open_for: Duration) -> BreakerLayer {
    BreakerLayer::consecutive_failures(n).open_for(open_for)
}

/// A breaker that opens at `rate` failures over a count window of `window` calls, once it holds
/// `minimum` calls.
fn rate_breaker(rate: f64, window: u32, minimum: u32) -> BreakerLayer {
    BreakerLayer::builder()
        .failure_rate(rate)
        .count_window(window)
        .minimum_calls(minimum)
        .build()
        .unwrap()
}

/// A breaker that opens at half of the calls failed over a time window of `buckets` buckets of
/// `width` each, once it holds 4 calls.
fn time_breaker(width: Duration, buckets: u32) -> BreakerLayer {
    BreakerLayer::builder()
        .failure_rate(0.5)
        .time_window(width, buckets)
        .minimum_calls(4)
        .build()
        .unwrap()
}

/// A breaker that opens on the first failure for 1 s, doubling on each failed probe up to 60 s.
fn doubling_breaker() -> BreakerLayer {
    BreakerLayer::builder()
        .consecutive_failures(1)
        .open_doubling(Duration::from_secs(1), Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The handle of `layer`, and `layer` over a scripted upstream with the HTTP classifier below it.
fn stack(
    layer: BreakerLayer,
    upstream: &Scripted,
) -> (
    BreakerHandle,
    impl Service<
        http::Request<String>,
        Response = http::Response<()>,
        Error = tower_backstop::Failure<http::Response<()>>,
        Future: Send,
    > + Clone
    + Send
    + 'static,
) {
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    (handle, svc)
}

/// Makes `n` calls to `/` through clones of `svc`, one after another, ignoring their outcomes.
async fn send<S>(svc: &S, n: usize)
where
    S: Service<http::Request<String>> + Clone,
{
    for _ in 0..n {
        let _ = svc.clone().oneshot(get("/")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn opens_after_consecutive_failures_and_rejects_without_calling() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(breaker(3, Duration::from_secs(10)), &upstream);
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
    let (handle, svc) = stack(breaker(3, Duration::from_secs(10)), &upstream);
    send(&svc, 15).await;
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
    let (handle, svc) = stack(breaker(2, Duration::from_secs(5)), &upstream);
    send(&svc, 2).await;
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
    let (handle, svc) = stack(breaker(2, Duration::from_secs(1)), &upstream);
    send(&svc, 2).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.stats().closed, 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_or_ignored_probe_returns_its_permit() {
    let upstream = Scripted::new(
        [status(503), status(503), after(60, 200), status(400)],
        status(200),
    );
    let (handle, mut svc) = stack(breaker(2, Duration::from_secs(1)), &upstream);
    send(&svc, 2).await;
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
        [after(30, 503), after(30, 503), status(503), status(503)],
        status(200),
    );
    let (handle, svc) = stack(breaker(2, Duration::from_secs(1)), &upstream);
    let slow = [
        tokio::spawn(svc.clone().oneshot(get("/slow"))),
        tokio::spawn(svc.clone().oneshot(get("/slow"))),
    ];
    tokio::task::yield_now().await;
    assert_eq!(upstream.calls(), 2);
    send(&svc, 2).await;
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
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().opened, 1);
}

// ---- issue 4: windows, rates, safe half-open, growing open duration, operators, events ----

#[tokio::test(start_paused = true)]
async fn a_slow_success_from_the_closed_period_does_not_close_a_half_open_breaker() {
    let upstream = Scripted::new([after(30, 200), status(503), status(503)], after(60, 503));
    let (handle, svc) = stack(breaker(2, Duration::from_secs(5)), &upstream);
    // Started while closed; answers 200 after 30 s.
    let slow = tokio::spawn(svc.clone().oneshot(get("/slow")));
    tokio::task::yield_now().await;
    send(&svc, 2).await;
    assert_eq!(handle.state(), State::Open);
    tokio::time::advance(Duration::from_secs(5)).await;
    // A probe takes the only permit (and hangs for 60 s): the breaker is half-open.
    let probe = tokio::spawn(svc.clone().oneshot(get("/probe")));
    tokio::task::yield_now().await;
    assert_eq!(handle.state(), State::HalfOpen);
    // The slow call from the closed period succeeds now.
    tokio::time::advance(Duration::from_secs(26)).await;
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    assert_eq!(
        handle.state(),
        State::HalfOpen,
        "an outcome from the closed period must not close the half-open breaker"
    );
    assert_eq!(handle.stats().closed, 0);
    // Only the probe decides: it fails and re-opens the breaker.
    assert_eq!(probe.await.unwrap().unwrap_err().class(), Class::TRANSIENT);
    assert_eq!(handle.state(), State::Open);
}

/// Runs `failures` failing and `10 - failures` successful calls, failures first.
async fn ten_calls(failures: usize) -> (State, usize) {
    let steps = (0..10).map(|i| {
        if i < failures {
            status(503)
        } else {
            status(200)
        }
    });
    let upstream = Scripted::new(steps, status(200));
    let (handle, svc) = stack(rate_breaker(0.5, 10, 10), &upstream);
    send(&svc, 10).await;
    (handle.state(), upstream.calls())
}

#[tokio::test(start_paused = true)]
async fn count_window_of_10_at_50_percent_4_failures_do_not_trip_and_5_do() {
    assert_eq!(ten_calls(4).await, (State::Closed, 10));
    assert_eq!(ten_calls(5).await, (State::Open, 10));
}

#[tokio::test(start_paused = true)]
async fn the_rate_waits_for_the_minimum_number_of_calls() {
    // Nine failures in a row: 100 %, but below the minimum of 10 calls.
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(rate_breaker(0.5, 10, 10), &upstream);
    send(&svc, 9).await;
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().window_calls, 9);
    assert_eq!(handle.stats().window_failures, 9);
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn permanent_failures_count_as_neither_failure_nor_success_in_the_window() {
    // Five 503s and five 400s: the 400s are ignored, so the window holds five calls only.
    let steps = (0..10).map(|i| if i % 2 == 0 { status(503) } else { status(400) });
    let upstream = Scripted::new(steps, status(200));
    let (handle, svc) = stack(rate_breaker(0.5, 10, 6), &upstream);
    send(&svc, 10).await;
    assert_eq!(handle.stats().window_calls, 5);
    assert_eq!(handle.state(), State::Closed);
    // The next call is a success; it is the sixth counted one and reaches the minimum: 5 of 6
    // failed.
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
}

/// Runs `slow` two-second successes and `10 - slow` instant ones, slow first, through a breaker
/// with a 1 s, 50 % slow-call rule over a count window of 10; returns its handle.
async fn ten_calls_slow(slow: usize) -> BreakerHandle {
    let steps = (0..10).map(|i| if i < slow { after(2, 200) } else { status(200) });
    let upstream = Scripted::new(steps, status(200));
    let layer = BreakerLayer::builder()
        .slow_calls(Duration::from_secs(1), 0.5)
        .count_window(10)
        .minimum_calls(10)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    for _ in 0..10 {
        assert!(svc.clone().oneshot(get("/")).await.is_ok());
    }
    handle
}

#[tokio::test(start_paused = true)]
async fn six_two_second_successes_of_ten_trip_a_1s_50_percent_slow_call_rule() {
    assert_eq!(ten_calls_slow(6).await.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn four_slow_calls_of_ten_do_not_trip_the_slow_call_rule() {
    let handle = ten_calls_slow(4).await;
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().window_slow_calls, 4);
}

#[tokio::test(start_paused = true)]
async fn time_window_forgets_failures_older_than_its_buckets() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(time_breaker(Duration::from_secs(1), 10), &upstream);
    // Three failures, then 11 s pass: they leave the 10 s window.
    send(&svc, 3).await;
    assert_eq!(handle.stats().window_failures, 3);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(handle.stats().window_calls, 0);
    send(&svc, 3).await;
    assert_eq!(
        handle.state(),
        State::Closed,
        "3 calls in the window, minimum 4"
    );
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn growing_open_duration_doubles_up_to_its_cap() {
    // Fails until told otherwise: the first 12 calls fail, then successes.
    let upstream = Scripted::new((0..12).map(|_| status(503)), status(200));
    let (handle, svc) = stack(doubling_breaker(), &upstream);
    send(&svc, 1).await;
    let mut seen = Vec::new();
    for _ in 0..9 {
        let left = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(left.class(), Class::CIRCUIT_OPEN);
        let left = left.retry_after().unwrap();
        seen.push(left.as_secs());
        // Wait it out; the probe fails and re-opens it for longer.
        tokio::time::advance(left).await;
        let probe = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(probe.class(), Class::TRANSIENT);
    }
    assert_eq!(seen, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    // Two more failed probes use up the script; the next probe succeeds and closes it.
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(60)).await;
        send(&svc, 1).await;
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok());
    assert_eq!(handle.state(), State::Closed);
    // The trip, nine and two failed probes, and the successful one.
    assert_eq!(upstream.calls(), 13);
}

#[tokio::test(start_paused = true)]
async fn after_a_successful_probe_the_next_trip_opens_for_the_base_duration() {
    let upstream = Scripted::new(
        [
            status(503),
            status(503),
            status(503),
            status(200),
            status(503),
        ],
        status(200),
    );
    let (handle, svc) = stack(doubling_breaker(), &upstream);
    send(&svc, 1).await; // trip: 1 s
    tokio::time::advance(Duration::from_secs(1)).await;
    send(&svc, 1).await; // failed probe: 2 s
    tokio::time::advance(Duration::from_secs(2)).await;
    send(&svc, 1).await; // failed probe: 4 s
    assert_eq!(handle.retry_after(), Some(Duration::from_secs(4)));
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok()); // closes
    assert_eq!(handle.state(), State::Closed);
    send(&svc, 1).await; // trips again
    assert_eq!(handle.retry_after(), Some(Duration::from_secs(1)));
}

#[tokio::test(start_paused = true)]
async fn three_permits_admit_three_probes_and_two_successes_close() {
    let upstream = Scripted::new(
        [status(503)],
        Step::After(Duration::from_millis(100), Box::new(status(200))),
    );
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(1))
        .half_open_probes(3)
        .close_after(2)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 1).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let calls: Vec<_> = (0..20)
        .map(|_| tokio::spawn(svc.clone().oneshot(get("/"))))
        .collect();
    let mut ok = 0;
    let mut rejected = 0;
    for c in calls {
        match c.await.unwrap() {
            Ok(_) => ok += 1,
            Err(f) => {
                assert_eq!(f.class(), Class::CIRCUIT_OPEN);
                rejected += 1;
            }
        }
    }
    assert_eq!((ok, rejected), (3, 17));
    assert_eq!(upstream.calls(), 4);
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().probes, 3);
}

#[tokio::test(start_paused = true)]
async fn a_hung_probe_cannot_keep_it_half_open_past_the_maximum_wait() {
    let upstream = Scripted::new([status(503)], after(3600, 200));
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(1))
        .max_half_open(Duration::from_secs(10))
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 1).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let hung = tokio::spawn(svc.clone().oneshot(get("/")));
    tokio::task::yield_now().await;
    assert_eq!(handle.state(), State::HalfOpen);
    tokio::time::advance(Duration::from_secs(9)).await;
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(handle.state(), State::HalfOpen);
    tokio::time::advance(Duration::from_secs(1)).await;
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(
        handle.state(),
        State::Open,
        "re-opened after 10 s half-open"
    );
    assert_eq!(f.retry_after(), Some(Duration::from_secs(1)));
    // The hung probe's late success belongs to the earlier period.
    hung.abort();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(handle.stats().opened, 2);
}

#[tokio::test(start_paused = true)]
async fn operators_force_open_disable_and_reset() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(breaker(2, Duration::from_secs(30)), &upstream);

    handle.force_open();
    assert_eq!(handle.state(), State::ForcedOpen);
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(f.retry_after(), None, "forced open has no end");
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(handle.state(), State::ForcedOpen, "stays open until reset");
    assert_eq!(upstream.calls(), 0);

    handle.disable();
    assert_eq!(handle.state(), State::Disabled);
    for _ in 0..10 {
        let f = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(f.class(), Class::TRANSIENT);
    }
    assert_eq!(handle.state(), State::Disabled, "disabled counts nothing");
    assert_eq!(upstream.calls(), 10);

    handle.reset();
    assert_eq!(handle.state(), State::Closed);
    send(&svc, 2).await;
    assert_eq!(handle.state(), State::Open);
    handle.reset();
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().consecutive_failures, 0);
    assert_eq!(handle.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn the_listener_sees_every_transition_and_rejection() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let layer = BreakerLayer::builder()
        .name("mail")
        .consecutive_failures(2)
        .open_for(Duration::from_secs(5))
        .listener(move |e: &Event<'_>| {
            let line = match *e {
                Event::BreakerTransition {
                    breaker,
                    from,
                    to,
                    reason,
                } => format!("{breaker}: {from} -> {to} ({reason})"),
                Event::BreakerRejected {
                    breaker,
                    state,
                    retry_after,
                } => format!("{breaker}: rejected in {state}, {retry_after:?}"),
                _ => "other".to_owned(),
            };
            seen.lock().unwrap().push(line);
        })
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 3).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    send(&svc, 1).await;
    handle.force_open();
    handle.reset();
    assert_eq!(
        *events.lock().unwrap(),
        [
            "mail: closed -> open (consecutive failures)",
            "mail: rejected in open, Some(5s)",
            "mail: open -> half_open (open duration elapsed)",
            "mail: half_open -> closed (probes succeeded)",
            "mail: closed -> forced_open (forced open)",
            "mail: forced_open -> closed (reset)",
        ]
    );
}

#[test]
fn bad_configurations_are_errors_from_build() {
    let err = |b: tower_backstop::breaker::Builder| b.build().unwrap_err();
    let e: BuildError = err(BreakerLayer::builder().failure_rate(1.5));
    assert!(e.to_string().contains("failure rate"), "{e}");
    // Each error names the setting: the builder method that sets it.
    let cases: [(&str, Builder); 16] = [
        ("failure_rate", BreakerLayer::builder().failure_rate(1.5)),
        ("failure_rate", BreakerLayer::builder().failure_rate(0.0)),
        ("failure_rate", BreakerLayer::builder().failure_rate(-0.5)),
        (
            "failure_rate",
            BreakerLayer::builder().failure_rate(f64::NAN),
        ),
        (
            "slow_calls",
            BreakerLayer::builder().slow_calls(Duration::from_secs(1), -0.1),
        ),
        ("count_window", BreakerLayer::builder().count_window(0)),
        (
            "time_window",
            BreakerLayer::builder().time_window(Duration::ZERO, 10),
        ),
        (
            "time_window",
            BreakerLayer::builder().time_window(Duration::from_secs(1), 0),
        ),
        (
            "minimum_calls",
            BreakerLayer::builder()
                .failure_rate(0.5)
                .count_window(10)
                .minimum_calls(11),
        ),
        ("minimum_calls", BreakerLayer::builder().minimum_calls(0)),
        (
            "half_open_probes",
            BreakerLayer::builder().half_open_probes(0),
        ),
        ("close_after", BreakerLayer::builder().close_after(1001)),
        ("close_after", BreakerLayer::builder().close_after(0)),
        (
            "consecutive_failures",
            BreakerLayer::builder().consecutive_failures(0),
        ),
        (
            "open_doubling",
            BreakerLayer::builder().open_doubling(Duration::from_secs(10), Duration::from_secs(1)),
        ),
        (
            "open_jitter",
            BreakerLayer::builder()
                .open_for(Duration::from_secs(1))
                .open_jitter(2.0),
        ),
    ];
    for (setting, builder) in cases {
        let e = err(builder);
        assert_eq!(e.setting(), setting, "{e}");
        assert!(e.to_string().contains(&format!("`{setting}` is ")), "{e}");
    }
    assert!(BreakerLayer::builder().build().is_ok());
}

#[test]
fn bad_configurations_of_keyed_breakers_are_errors_from_build() {
    let e = BreakerLayer::builder()
        .per_host()
        .max_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(e.setting(), "max_keys");
    assert!(e.to_string().contains("`max_keys` is 0"), "{e}");
    // The template of every key's breaker is checked too, before any key is seen.
    let e = BreakerLayer::builder()
        .failure_rate(2.0)
        .per_host()
        .build()
        .unwrap_err();
    assert_eq!(e.setting(), "failure_rate");
    let e = BreakerLayer::builder()
        .keyed_by(|req: &http::Request<()>| Some(req.uri().path().to_owned()))
        .half_open_probes(0)
        .build()
        .unwrap_err();
    assert_eq!(e.setting(), "half_open_probes");
    let layer = BreakerLayer::builder()
        .per_host()
        .max_keys(1)
        .build()
        .unwrap();
    assert!(layer.keys().is_empty());
}

/// 20 breakers with an open duration doubling from 1 s to 4 s, jitter 0.5, each tripped by a
/// failed call and then by failed probes: from the third trip on the nominal duration is the
/// cap, and the jitter must still spread them inside it.
#[tokio::test(start_paused = true)]
async fn twenty_breakers_at_the_cap_do_not_half_open_together() {
    let mut by_trip: Vec<Vec<Duration>> = vec![Vec::new(); 5];
    for _ in 0..20 {
        let upstream = Scripted::always(status(503));
        let layer = BreakerLayer::builder()
            .consecutive_failures(1)
            .open_doubling(Duration::from_secs(1), Duration::from_secs(4))
            .open_jitter(0.5)
            .build()
            .unwrap();
        let (handle, svc) = stack(layer, &upstream);
        for trip in by_trip.iter_mut() {
            // The first call trips it; later ones are probes, admitted after the open period.
            send(&svc, 1).await;
            assert_eq!(handle.state(), State::Open);
            let open_for = handle.retry_after().unwrap();
            trip.push(open_for);
            tokio::time::advance(open_for).await;
        }
    }
    for (n, durations) in by_trip.iter().enumerate() {
        let nominal = Duration::from_secs(1 << n.min(2));
        let (min, max) = (
            *durations.iter().min().unwrap(),
            *durations.iter().max().unwrap(),
        );
        assert!(
            max <= Duration::from_secs(4),
            "trip {n}: {max:?} over the cap"
        );
        assert!(
            min >= nominal.min(Duration::from_secs(2)),
            "trip {n}: {min:?}"
        );
        let mut distinct = durations.clone();
        distinct.sort();
        distinct.dedup();
        assert!(
            distinct.len() >= 15 && max - min >= Duration::from_millis(200),
            "trip {n}: the 20 breakers half-open together: {durations:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_configured_failure_classes_count() {
    // Throttling (429) is the provider asking us to slow down, not failing: count only transient.
    // Without the adaptive send rate, which would hold the later calls back after the 429s.
    let upstream = Scripted::new((0..5).map(|_| status(429)), status(503));
    let layer = BreakerLayer::builder()
        .without_adaptive_rate()
        .consecutive_failures(2)
        .failure_classes(&[Class::TRANSIENT])
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    for _ in 0..5 {
        let f = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(f.class(), Class::THROTTLED);
    }
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.stats().failures, 0);
    send(&svc, 2).await;
    assert_eq!(handle.state(), State::Open);
    assert_eq!(handle.stats().failures, 2);
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_inner_future_panics_gives_its_permit_back() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let layer = BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(1));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |_: ()| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => Err::<&str, tower_backstop::BoxError>(
                        std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
                    ),
                    1 => panic!("the inner service panics in the probe"),
                    _ => Ok("recovered"),
                }
            }
        }));
    let _ = svc.clone().oneshot(()).await;
    assert_eq!(handle.state(), State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    let panicked = tokio::spawn(svc.clone().oneshot(())).await.unwrap_err();
    assert!(panicked.is_panic());
    // The panic unwound through the response future: its permit went back, nothing counted.
    assert_eq!(handle.state(), State::HalfOpen);
    assert_eq!(svc.clone().oneshot(()).await.unwrap(), "recovered");
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

// ---- which successes end the row of failures, and calls that outlive their breaker ----

/// A breaker of 2 sees one failure and one slow success (5 s), the success admitted before the
/// failure or after it, then one more failure. Returns the consecutive count once the slow
/// success ended, and the state after the last failure.
async fn late_success(admitted_after_the_failure: bool) -> (u32, State) {
    let script = if admitted_after_the_failure {
        [status(503), after(5, 200)]
    } else {
        [after(5, 200), status(503)]
    };
    let upstream = Scripted::new(script, status(503));
    let (handle, svc) = stack(breaker(2, Duration::from_secs(10)), &upstream);
    if admitted_after_the_failure {
        let _ = svc.clone().oneshot(get("/")).await.unwrap_err();
    }
    let slow = tokio::spawn(svc.clone().oneshot(get("/slow")));
    tokio::task::yield_now().await;
    if !admitted_after_the_failure {
        let _ = svc.clone().oneshot(get("/")).await.unwrap_err();
    }
    assert_eq!(handle.stats().consecutive_failures, 1);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(slow.await.unwrap().is_ok());
    let count = handle.stats().consecutive_failures;
    let _ = svc.clone().oneshot(get("/")).await.unwrap_err();
    (count, handle.state())
}

#[tokio::test(start_paused = true)]
async fn a_success_admitted_before_a_failure_in_the_same_closed_period_ends_the_row() {
    // The plain rule: any success that started after the breaker last opened or closed ends
    // the row, failures counted while it ran included.
    assert_eq!(late_success(false).await, (0, State::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_success_from_before_the_breaker_last_closed_does_not_end_the_row() {
    // A slow call admitted in the first closed period; the breaker (2 in a row) trips,
    // half-opens, closes on a probe, and counts one failure; then the slow call succeeds. It
    // started before the breaker last closed, so it changes nothing: the next failure trips it.
    let upstream = Scripted::new(
        [
            after(30, 200),
            status(503),
            status(503),
            status(200),
            status(503),
        ],
        status(503),
    );
    let (handle, svc) = stack(breaker(2, Duration::from_secs(10)), &upstream);
    let slow = tokio::spawn(svc.clone().oneshot(get("/slow")));
    tokio::task::yield_now().await;
    send(&svc, 2).await;
    assert_eq!(handle.state(), State::Open);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok());
    assert_eq!(handle.state(), State::Closed);
    send(&svc, 1).await;
    assert_eq!(handle.stats().consecutive_failures, 1);
    tokio::time::advance(Duration::from_secs(20)).await;
    assert!(slow.await.unwrap().is_ok());
    assert_eq!(handle.stats().consecutive_failures, 1);
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_success_admitted_after_a_failure_clears_it_even_if_it_ends_late() {
    assert_eq!(late_success(true).await, (0, State::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_ends_after_its_breaker_is_dropped_is_returned_and_not_counted() {
    // The slow call holds its own reference to the breaker; by the time it fails, every service,
    // layer and handle of that breaker is gone. Its outcome is recorded in the breaker it holds,
    // which goes with it, and the caller gets the failure, unchanged.
    let upstream = Scripted::new([after(5, 503)], status(200));
    let (handle, svc) = stack(breaker(1, Duration::from_secs(10)), &upstream);
    drop(handle);
    let mut svc2 = svc.clone();
    svc2.ready().await.unwrap();
    let pending = svc2.call(get("/slow"));
    drop((svc, svc2));
    tokio::time::advance(Duration::from_secs(5)).await;
    let failure = pending.await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(
        failure.code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_a_call_admitted_with_nothing_counted_still_trips_a_live_breaker() {
    // The call starts with no failure counted (a breaker of 1); its failure, ending later,
    // reaches the breaker through the future's reference and trips it.
    let upstream = Scripted::new([after(1, 503)], status(200));
    let (handle, svc) = stack(breaker(1, Duration::from_secs(10)), &upstream);
    let slow = tokio::spawn(svc.clone().oneshot(get("/slow")));
    tokio::task::yield_now().await;
    assert_eq!(handle.state(), State::Closed);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(slow.await.unwrap().is_err());
    assert_eq!(handle.state(), State::Open);
    assert_eq!(handle.stats().failures, 1);
}

/// Calls `svc` once, expects an open breaker's rejection, and returns what its
/// [`OpenError`](tower_backstop::breaker::OpenError) says of the cause.
async fn rejection_cause<S>(svc: S) -> Option<String>
where
    S: Service<http::Request<String>, Response = http::Response<()>>,
    S::Error: Into<tower_backstop::Failure<http::Response<()>>>,
{
    let f: tower_backstop::Failure<http::Response<()>> =
        svc.oneshot(get("/")).await.unwrap_err().into();
    assert_eq!(f.code(), Code::CircuitOpen);
    std::error::Error::source(&f)
        .and_then(|s| s.downcast_ref::<tower_backstop::breaker::OpenError>())
        .expect("an OpenError")
        .cause()
}

/// The breaker's rejection names why it opened: the failure that opened it with the failures
/// counted since it last closed, then the failed probe; a close forgets the outage.
#[tokio::test(start_paused = true)]
async fn a_rejection_names_the_failure_that_opened_the_breaker_until_it_closes() {
    let upstream = Scripted::new(
        [
            status(503),
            status(502),
            status(500),
            status(200),
            status(503),
            status(503),
        ],
        status(200),
    );
    let layer = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(5))
        .name("mail");
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let cause = |svc| async move { rejection_cause(svc).await };
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await; // 503, 502: open
    }
    let first = cause(svc.clone()).await.expect("a cause while open");
    assert!(
        first.contains("http 502") && first.contains("2 failures in"),
        "{first}"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    let _ = svc.clone().oneshot(get("/")).await; // the probe: 500, open again
    let probe = cause(svc.clone()).await.expect("a cause while open");
    assert!(
        probe.contains("http 500") && probe.contains("3 failures in 5s"),
        "{probe}"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok()); // the probe: 200, closed
    for _ in 0..2 {
        let _ = svc.clone().oneshot(get("/")).await; // 503, 503: open again
    }
    let again = cause(svc.clone()).await.expect("a cause while open");
    assert!(
        again.contains("http 503") && again.contains("2 failures in"),
        "the close forgot the first outage: {again}"
    );
}

/// Calls `svc` once, expects an open breaker's rejection, and returns what its
/// [`OpenError`](tower_backstop::breaker::OpenError) says: the breaker's name and whether an
/// operator forced it open.
async fn rejection<S>(svc: S) -> (String, bool)
where
    S: Service<http::Request<String>, Response = http::Response<()>>,
    S::Error: Into<tower_backstop::Failure<http::Response<()>>>,
{
    let f: tower_backstop::Failure<http::Response<()>> =
        svc.oneshot(get("/")).await.unwrap_err().into();
    assert_eq!(f.code(), Code::CircuitOpen);
    let open = std::error::Error::source(&f)
        .and_then(|s| s.downcast_ref::<tower_backstop::breaker::OpenError>())
        .expect("an OpenError");
    (open.breaker().to_owned(), open.forced())
}

#[tokio::test(start_paused = true)]
async fn a_rejection_says_which_breaker_and_whether_it_was_forced_open() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(breaker(2, Duration::from_secs(30)).name("mail"), &upstream);
    send(&svc, 2).await;
    assert_eq!(rejection(svc.clone()).await, ("mail".to_owned(), false));
    handle.force_open();
    assert_eq!(rejection(svc.clone()).await, ("mail".to_owned(), true));

    // A keyed breaker is named after its key.
    let keyed = BreakerLayer::builder()
        .consecutive_failures(1)
        .keyed_by(|req: &http::Request<String>| Some(req.uri().path().to_owned()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(keyed)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let _ = svc.clone().oneshot(get("/")).await;
    assert_eq!(rejection(svc).await, ("/".to_owned(), false));
}

/// With no rule chosen a breaker opens after five failures in a row, as the builder's table of
/// defaults says.
#[tokio::test(start_paused = true)]
async fn a_breaker_with_no_rule_opens_after_five_failures_in_a_row() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(Builder::new().build().unwrap(), &upstream);
    send(&svc, 4).await;
    assert_eq!(handle.state(), State::Closed);
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
    assert_eq!(upstream.calls(), 5);
}

/// `open_jitter` applies whatever the order: set before `open_for` it still spreads the open
/// duration over `[d, 2d]` for a fraction of 1.
#[tokio::test(start_paused = true)]
async fn an_open_jitter_set_before_the_duration_still_applies() {
    let mut lefts = Vec::new();
    for _ in 0..5 {
        let upstream = Scripted::always(status(503));
        let layer = Builder::new()
            .consecutive_failures(1)
            .open_jitter(1.0)
            .open_for(Duration::from_secs(10))
            .build()
            .unwrap();
        let (handle, svc) = stack(layer, &upstream);
        send(&svc, 1).await;
        let left = handle.retry_after().expect("open");
        assert!(
            (Duration::from_secs(10)..=Duration::from_secs(20)).contains(&left),
            "{left:?}"
        );
        lefts.push(left);
    }
    assert!(
        lefts.iter().any(|&l| l > Duration::from_secs(10)),
        "no jitter: {lefts:?}"
    );
    let debug = format!(
        "{:?}",
        Builder::new()
            .open_jitter(0.5)
            .open_for(Duration::from_secs(10))
    );
    assert!(debug.contains("jitter: 0.5"), "{debug}");
    assert!(debug.contains("name: \"breaker\""), "{debug}");
}

#[test]
fn a_doubling_open_duration_may_be_capped_at_its_base() {
    let layer = Builder::new()
        .open_doubling(Duration::from_secs(1), Duration::from_secs(1))
        .build();
    assert!(layer.is_ok(), "{layer:?}");
}

/// A half-open breaker's probe taken in `poll_ready` is kept while the inner service is not
/// ready: polling again does not ask the breaker for a second permit (there is none), and the
/// probe reaches the inner service once it is ready. While it is out, the handle's time left is
/// the next open duration, the longest a rejected caller may wait.
#[tokio::test(start_paused = true)]
async fn a_probe_that_waits_for_readiness_keeps_its_permit() {
    let layer = breaker(1, Duration::from_secs(5)).name("mail");
    let breaker = layer.handle();
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<&'static str, &'static str, _>(layer);
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = tokio::spawn(svc.call("a"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert!(call.await.unwrap().is_err());
    assert_eq!(breaker.state(), State::Open);

    tokio::time::advance(Duration::from_secs(5)).await;
    handle.allow(0);
    assert!(
        svc.poll_ready().is_pending(),
        "the probe waits for the inner service"
    );
    assert_eq!(breaker.state(), State::HalfOpen);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(5)));
    assert!(svc.poll_ready().is_pending(), "still the same probe");
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = svc.call("probe");
    let shown = format!("{call:?}");
    assert!(shown.contains(r#"name: "mail""#), "{shown}");
    let call = tokio::spawn(call);
    let (req, send) = handle.next_request().await.expect("the probe is sent");
    assert_eq!(req, "probe");
    send.send_response("ok");
    assert_eq!(call.await.unwrap().unwrap(), "ok");
    assert_eq!(breaker.state(), State::Closed);
}

/// The cause of an opening is a failure that counts: a 404 of a call admitted before the trip
/// that ends while the breaker is open does not replace it. And its span runs from the first
/// failure of the outage, however long after the breaker was built that outage began.
#[tokio::test(start_paused = true)]
async fn the_cause_is_a_counted_failure_and_its_span_starts_with_the_outage() {
    let upstream = Scripted::new([after(3, 404), status(503), status(503)], status(500));
    let layer = breaker(2, Duration::from_secs(5)).name("mail");
    let (_, svc) = stack(layer, &upstream);
    tokio::time::advance(Duration::from_secs(10)).await;
    let slow = tokio::spawn(svc.clone().oneshot(get("/")));
    tokio::task::yield_now().await;
    send(&svc, 2).await; // 503, 503 at 10 s: open
    let first = rejection_cause(svc.clone())
        .await
        .expect("a cause while open");
    assert!(
        first.contains("http 503") && first.contains("2 failures in 0ns"),
        "{first}"
    );
    let _ = slow.await.unwrap(); // the 404, at 13 s
    let still = rejection_cause(svc.clone())
        .await
        .expect("a cause while open");
    assert_eq!(still, first, "a 404 does not count");
    tokio::time::advance(Duration::from_secs(5)).await;
    let _ = svc.clone().oneshot(get("/")).await; // the probe at 18 s: 500, open again
    let probe = rejection_cause(svc.clone())
        .await
        .expect("a cause while open");
    assert!(
        probe.contains("http 500") && probe.contains("3 failures in 8s"),
        "{probe}"
    );
}

/// A call that takes exactly the slow-call threshold is not slow (resilience4j: slower than the
/// threshold).
#[tokio::test(start_paused = true)]
async fn a_call_of_exactly_the_threshold_is_not_slow() {
    let upstream = Scripted::always(after(1, 200));
    let layer = BreakerLayer::builder()
        .slow_calls(Duration::from_secs(1), 0.5)
        .count_window(4)
        .minimum_calls(4)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 4).await;
    assert_eq!(handle.stats().window_slow_calls, 0);
    assert_eq!(handle.state(), State::Closed);
}

/// With a rate rule beside it, the consecutive rule still counts failures in a row: a success
/// ends the row.
#[tokio::test(start_paused = true)]
async fn a_success_ends_the_row_when_a_rate_rule_is_set_too() {
    let upstream = Scripted::new(
        [
            status(503),
            status(503),
            status(200),
            status(503),
            status(503),
        ],
        status(503),
    );
    let layer = BreakerLayer::builder()
        .consecutive_failures(3)
        .failure_rate(1.0)
        .count_window(100)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 5).await;
    assert_eq!(
        handle.state(),
        State::Closed,
        "no three failures in a row yet"
    );
    assert_eq!(handle.stats().consecutive_failures, 2);
    send(&svc, 1).await;
    assert_eq!(handle.state(), State::Open);
}

/// Under the slow-call rule a probe that succeeds slowly is a failed probe; one that takes the
/// threshold exactly, or less, closes the breaker.
#[tokio::test(start_paused = true)]
async fn a_slow_probe_is_a_failed_probe() {
    for (probe_secs, closes) in [(2, false), (1, true), (0, true)] {
        let probe = if probe_secs == 0 {
            status(200)
        } else {
            after(probe_secs, 200)
        };
        let upstream = Scripted::new([after(2, 200), probe], status(200));
        let layer = BreakerLayer::builder()
            .slow_calls(Duration::from_secs(1), 1.0)
            .count_window(1)
            .minimum_calls(1)
            .open_for(Duration::from_secs(5))
            .build()
            .unwrap();
        let (handle, svc) = stack(layer, &upstream);
        send(&svc, 1).await; // one slow call of one: open
        assert_eq!(handle.state(), State::Open);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(svc.clone().oneshot(get("/")).await.is_ok());
        let want = if closes { State::Closed } else { State::Open };
        assert_eq!(handle.state(), want, "a probe of {probe_secs} s");
    }
}

/// The outcome of a probe from an earlier half-open period, ending while a later period's probe
/// is out, changes nothing: neither a late failure (it would re-open the breaker) nor a late
/// success (it would close it), nor a late drop (it would hand out a second permit).
#[tokio::test(start_paused = true)]
async fn a_probe_of_an_earlier_half_open_period_does_not_decide_a_later_one() {
    for late in ["failure", "success", "drop"] {
        let stale = match late {
            "failure" => after(100, 503),
            _ => after(100, 200),
        };
        // Trip; probe A (hangs 100 s); trip again after a reset; probe B (hangs 200 s).
        let upstream = Scripted::new(
            [status(503), stale, status(503), after(200, 200)],
            status(200),
        );
        let (handle, svc) = stack(breaker(1, Duration::from_secs(5)), &upstream);
        send(&svc, 1).await;
        tokio::time::advance(Duration::from_secs(5)).await;
        let a = tokio::spawn(svc.clone().oneshot(get("/")));
        tokio::task::yield_now().await;
        assert_eq!(handle.state(), State::HalfOpen);
        handle.reset();
        send(&svc, 1).await;
        assert_eq!(handle.state(), State::Open);
        tokio::time::advance(Duration::from_secs(5)).await;
        let b = tokio::spawn(svc.clone().oneshot(get("/")));
        tokio::task::yield_now().await;
        assert_eq!(handle.state(), State::HalfOpen);
        if late == "drop" {
            a.abort();
            let _ = a.await;
        } else {
            let _ = a.await.unwrap();
        }
        assert_eq!(handle.state(), State::HalfOpen, "late {late} of probe A");
        // B still holds the one permit: another call is rejected without reaching the upstream.
        let calls = upstream.calls();
        let f = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(f.class(), Class::CIRCUIT_OPEN, "late {late}");
        assert_eq!(upstream.calls(), calls);
        assert!(b.await.unwrap().is_ok());
        assert_eq!(handle.state(), State::Closed);
    }
}

/// With one permit and two successes to close, each successful probe gives its permit back, so
/// the next probe can go.
#[tokio::test(start_paused = true)]
async fn one_permit_and_two_successes_close_after_two_probes_in_turn() {
    let upstream = Scripted::new([status(503)], status(200));
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(5))
        .half_open_probes(1)
        .close_after(2)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok());
    assert_eq!(handle.state(), State::HalfOpen);
    assert!(
        svc.clone().oneshot(get("/")).await.is_ok(),
        "the permit came back"
    );
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(upstream.calls(), 3);
}

/// An operator's reset starts afresh: the row of failures, the window, the doubling of the
/// open duration and the cause are forgotten. Forcing open forgets none of them.
#[tokio::test(start_paused = true)]
async fn a_reset_forgets_the_outage_and_forcing_open_keeps_its_cause() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(doubling_breaker(), &upstream);
    send(&svc, 1).await; // open for 1 s
    tokio::time::advance(Duration::from_secs(1)).await;
    send(&svc, 1).await; // failed probe: open for 2 s
    assert_eq!(handle.retry_after(), Some(Duration::from_secs(2)));
    handle.force_open();
    let cause = rejection_cause(svc.clone()).await;
    assert!(
        cause.as_deref().is_some_and(|c| c.contains("http 503")),
        "{cause:?}"
    );
    handle.reset();
    handle.force_open();
    assert_eq!(
        rejection_cause(svc.clone()).await,
        None,
        "the reset forgot it"
    );
    handle.reset();
    send(&svc, 1).await;
    assert_eq!(
        handle.retry_after(),
        Some(Duration::from_secs(1)),
        "the doubling starts again"
    );

    // The row and the window.
    let layer = BreakerLayer::builder()
        .consecutive_failures(3)
        .failure_rate(0.5)
        .count_window(4)
        .minimum_calls(4)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 2).await;
    assert_eq!(handle.stats().consecutive_failures, 2);
    assert_eq!(handle.stats().window_calls, 2);
    handle.reset();
    assert_eq!(handle.stats().consecutive_failures, 0);
    assert_eq!(handle.stats().window_calls, 0);
    send(&svc, 2).await;
    assert_eq!(
        handle.state(),
        State::Closed,
        "two failures after the reset"
    );
}

/// A time window counts every slow call of a bucket, not only its first.
#[tokio::test(start_paused = true)]
async fn a_time_window_counts_each_slow_call() {
    let upstream = Scripted::always(after(2, 200));
    let layer = BreakerLayer::builder()
        .slow_calls(Duration::from_secs(1), 1.0)
        .time_window(Duration::from_secs(60), 1)
        .minimum_calls(10)
        .build()
        .unwrap();
    let (handle, svc) = stack(layer, &upstream);
    send(&svc, 3).await;
    let stats = handle.stats();
    assert_eq!((stats.window_calls, stats.window_slow_calls), (3, 3));
    assert_eq!(handle.state(), State::Closed, "below the minimum of calls");
}

/// A reset empties a time window as it does a count window.
#[tokio::test(start_paused = true)]
async fn a_reset_empties_a_time_window() {
    let upstream = Scripted::always(status(503));
    let (handle, svc) = stack(time_breaker(Duration::from_secs(60), 4), &upstream);
    send(&svc, 3).await;
    assert_eq!(handle.stats().window_failures, 3);
    handle.reset();
    assert_eq!(handle.stats().window_calls, 0);
    send(&svc, 3).await;
    assert_eq!(handle.state(), State::Closed, "three calls after the reset");
}

#[tokio::test(start_paused = true)]
async fn a_load_shed_rejection_below_never_counts() {
    // One slot, taken by a call that hangs; every other call is shed in this process.
    let breaker = BreakerLayer::consecutive_failures(2);
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .load_shed()
        .concurrency_limit(1)
        .service(tower::service_fn(|_: http::Request<String>| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, tower_backstop::BoxError>(http::Response::new(()))
        }));
    let mut held = svc.clone();
    let _hanging = tokio::spawn(async move {
        let ready = held.ready().await.unwrap();
        ready.call(get("http://mail.test/")).await
    });
    tokio::task::yield_now().await;
    for _ in 0..5 {
        let failure = svc
            .clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
        assert_eq!(failure.code(), Code::Overloaded);
        assert_eq!(failure.sent(), tower_backstop::Sent::No);
    }
    assert_eq!(handle.state(), State::Closed);
}

/// A deferred record of a request an open breaker rejected: breaker `name`, half-opening at
/// `retry_at`.
fn rejected_record(
    id: &str,
    name: &str,
    retry_at: std::time::SystemTime,
) -> tower_backstop::store::Record {
    let failure: tower_backstop::Failure =
        tower_backstop::Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
    let mut record = tower_backstop::dead_letter::record_of(
        id.to_owned(),
        tower_backstop::Envelope::new("{}"),
        &failure,
    );
    record.status = tower_backstop::store::Status::Deferred;
    record.breaker = Some(name.to_owned());
    record.retry_at = Some(retry_at);
    record
}

/// A new process learns from the store which providers were down: the breaker of a host with
/// a deferred rejection starts open until the stored half-open time, so the first call there
/// never reaches the provider; another host, and a host whose time has passed, are called.
#[tokio::test(start_paused = true)]
async fn a_fresh_breaker_learns_from_the_store_which_providers_are_down() {
    use tower_backstop::store::{MemoryStore, Store};
    let store = MemoryStore::new();
    let now = std::time::SystemTime::now();
    let later = now + Duration::from_secs(30);
    store
        .put(rejected_record(
            "m-1",
            "down.test:80",
            now + Duration::from_secs(10),
        ))
        .await
        .unwrap();
    store
        .put(rejected_record("m-2", "down.test:80", later))
        .await
        .unwrap();
    store
        .put(rejected_record(
            "m-3",
            "back.test:80",
            now - Duration::from_secs(1),
        ))
        .await
        .unwrap();
    // A dead record (not deferred) teaches nothing.
    let mut dead = rejected_record("m-4", "dead.test:80", later);
    dead.status = tower_backstop::store::Status::Dead;
    store.put(dead).await.unwrap();

    let breakers = BreakerLayer::consecutive_failures(3).per_host();
    assert_eq!(breakers.learn_from(&store).await.unwrap(), 2);
    let upstream = Scripted::always(status(200));
    let mut svc = ServiceBuilder::new()
        .layer(breakers.clone())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());

    let f = svc
        .ready()
        .await
        .unwrap()
        .call(get("http://down.test/"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN, "{f}");
    assert_eq!(
        upstream.calls(),
        0,
        "rejected without reaching the provider"
    );
    let down = breakers.handle_for("down.test:80").unwrap();
    let left = down.retry_after().unwrap();
    // The latest stored half-open time: 30 s (less the wall-clock time the test took).
    assert!(
        left > Duration::from_secs(29) && left <= Duration::from_secs(30),
        "{left:?}"
    );

    // Another host, and one whose stored time has passed (half-open: its probe goes through).
    svc.ready()
        .await
        .unwrap()
        .call(get("http://other.test/"))
        .await
        .unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(get("http://back.test/"))
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 2);
    assert_eq!(
        breakers.handle_for("back.test:80").unwrap().state(),
        State::Closed
    );
    assert!(breakers.handle_for("dead.test:80").is_none());

    // At the stored time the breaker half-opens, and its probe reaches the provider.
    tokio::time::advance(left).await;
    svc.ready()
        .await
        .unwrap()
        .call(get("http://down.test/"))
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(down.state(), State::Closed);

    // An unkeyed breaker learns only the records of its own name.
    let single = BreakerLayer::builder()
        .name("down.test:80")
        .build()
        .unwrap();
    assert_eq!(single.learn_from(&store).await.unwrap(), 1);
    assert_eq!(single.handle().state(), State::Open);
    let other = BreakerLayer::builder().name("elsewhere").build().unwrap();
    assert_eq!(other.learn_from(&store).await.unwrap(), 0);
    assert_eq!(other.handle().state(), State::Closed);
}

/// A breaker opened on the store's evidence says where it learned it (when the outage began,
/// until when, and the last failure the earlier process saw); once its own probes fail it
/// counts them over a real span, and still says where it learned it.
#[tokio::test(start_paused = true)]
async fn a_learned_breakers_cause_says_where_it_learned_and_counts_a_real_span() {
    use tower_backstop::store::{ErrorEntry, MemoryStore, Store};
    let store = MemoryStore::new();
    let now = std::time::SystemTime::now();
    let mut record = rejected_record("m-1", "down", now + Duration::from_secs(2));
    record.cause = Some(ErrorEntry::new(
        now - Duration::from_secs(60),
        "transient",
        "http 503",
        "transient (http 503)",
        1,
    ));
    store.put(record).await.unwrap();
    let layer = BreakerLayer::builder()
        .name("down")
        .consecutive_failures(3)
        .open_for(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(layer.learn_from(&store).await.unwrap(), 1);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));

    let learned = rejection_cause(svc.clone()).await.unwrap();
    assert!(
        learned.starts_with("learned from the store: open since ")
            && learned.contains(" in an earlier process, until ")
            && learned.ends_with("; its last failure: transient (http 503)"),
        "{learned}"
    );
    let health = layer.health().report();
    assert_eq!(health.breakers[0].cause.as_deref(), Some(&*learned));

    // Half-open: the probe fails, then the next one 5 s later.
    tokio::time::advance(Duration::from_millis(2_100)).await;
    svc.clone().oneshot(get("/")).await.unwrap_err();
    let once = rejection_cause(svc.clone()).await.unwrap();
    assert_eq!(once, format!("transient (http 503); 1 failure; {learned}"));
    tokio::time::advance(Duration::from_millis(5_100)).await;
    svc.clone().oneshot(get("/")).await.unwrap_err();
    let twice = rejection_cause(svc.clone()).await.unwrap();
    assert!(
        twice.starts_with("transient (http 503); 2 failures in 5.1") && twice.ends_with(&learned),
        "{twice}"
    );
}
