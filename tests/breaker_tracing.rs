//! The breaker's `tracing` events: one per transition and per rejection, an outage's start at
//! WARN and its end at INFO, its half-open probes quieter. Alone in its own test
//! binary, like tests/retry_tracing.rs: `tracing` caches each callsite's interest process-wide, so
//! a thread-local subscriber set while other tests run on other threads can miss events.

mod support;

use std::time::Duration;

use support::{Scripted, get, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::ClassifyLayer;

#[tokio::test(start_paused = true)]
async fn every_transition_and_rejection_is_traced() {
    let logs = support::LogCapture::start(tracing::Level::DEBUG);

    let upstream = Scripted::new([status(503), status(503), status(503)], status(200));
    let layer = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(5))
        .name("mail");
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..3 {
        let _ = svc.clone().oneshot(get("/")).await; // two failures, one rejection
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    let _ = svc.clone().oneshot(get("/")).await; // a failed probe re-opens it
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(svc.clone().oneshot(get("/")).await.is_ok()); // a successful probe closes it
    handle.force_open();
    handle.disable();
    handle.reset();
    assert_eq!(handle.state(), State::Closed);

    let out = logs.text();
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("circuit") || l.contains("call rejected"))
        .collect();
    let expect = [
        (
            "WARN",
            "circuit opened",
            "from=\"closed\" to=\"open\" reason=\"consecutive failures\"",
        ),
        (
            "DEBUG",
            "call rejected",
            "state=\"open\" retry_after=Some(5s)",
        ),
        // An outage's half-open probes say less than its start (WARN) and its end (INFO).
        (
            "DEBUG",
            "circuit half-open",
            "from=\"open\" to=\"half_open\"",
        ),
        (
            "INFO",
            "circuit still open",
            "from=\"half_open\" to=\"open\" reason=\"probe failed\"",
        ),
        (
            "DEBUG",
            "circuit half-open",
            "from=\"open\" to=\"half_open\"",
        ),
        (
            "INFO",
            "circuit state changed",
            "from=\"half_open\" to=\"closed\"",
        ),
        (
            "WARN",
            "circuit opened",
            "from=\"closed\" to=\"forced_open\"",
        ),
        (
            "INFO",
            "circuit state changed",
            "from=\"forced_open\" to=\"disabled\"",
        ),
        (
            "INFO",
            "circuit state changed",
            "from=\"disabled\" to=\"closed\" reason=\"reset\"",
        ),
    ];
    assert_eq!(lines.len(), expect.len(), "{out}");
    for (line, (level, message, fields)) in lines.iter().zip(expect) {
        assert!(
            line.contains(level) && line.contains(message) && line.contains(fields),
            "{line:?} should have {level}, {message:?} and {fields}\n{out}"
        );
        assert!(line.contains("breaker=\"mail\""), "{line}");
    }
}
