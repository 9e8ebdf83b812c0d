//! The in-process alerts' `tracing` lines: a raise at WARN and a clear at INFO, each with the
//! stable field `alert` (the rule's name) and `firing`. Alone in its own test binary, like
//! tests/breaker_tracing.rs: `tracing` caches each callsite's interest process-wide, so a
//! thread-local subscriber set while other tests run on other threads can miss events.

mod support;

use std::time::Duration;

use support::{Scripted, get, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::observe::Alerts;

#[tokio::test(start_paused = true)]
async fn a_raise_is_a_warn_line_and_a_clear_an_info_line() {
    let logs = support::LogCapture::start(tracing::Level::INFO);
    let breaker = BreakerLayer::builder()
        .name("mail")
        .consecutive_failures(1)
        .open_for(Duration::from_secs(10))
        .listener(Alerts::new())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(Scripted::new([status(503)], status(200)));
    svc.clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    tokio::time::advance(Duration::from_secs(10)).await;
    svc.oneshot(get("http://mail.test/")).await.unwrap();

    let text = logs.text();
    let raised = text
        .lines()
        .find(|l| l.contains("alert: breaker mail is open"))
        .unwrap_or_else(|| panic!("no raise in {text}"));
    assert!(raised.contains("WARN"), "{raised}");
    assert!(raised.contains("alert=\"breaker_open\""), "{raised}");
    assert!(raised.contains("firing=true"), "{raised}");
    let cleared = text
        .lines()
        .find(|l| l.contains("alert cleared: breaker mail is open"))
        .unwrap_or_else(|| panic!("no clear in {text}"));
    assert!(cleared.contains("INFO"), "{cleared}");
    assert!(cleared.contains("firing=false"), "{cleared}");
}
