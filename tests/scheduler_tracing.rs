//! Logs an operator can live with through an outage: the breaker's opening once at WARN, the
//! scheduler's hold once at WARN with its cause, the closing once at INFO with the count held;
//! each local rejection at DEBUG. Alone in its own test binary, like tests/breaker_tracing.rs:
//! `tracing` caches each callsite's interest process-wide.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::outage::{Provider, as_string_request, send_all, stack};
use tower_backstop::Clock;
use tower_backstop::resend::Scheduler;
use tower_backstop::store::{Filter, MemoryStore, Status, Store};

#[tokio::test(start_paused = true)]
async fn an_outage_logs_its_start_and_end_once_and_each_rejection_at_debug() {
    let logs = support::LogCapture::start(tracing::Level::DEBUG);
    let clock = Clock::tokio();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = Provider::default();
    provider.down(true);
    let (svc, _) = stack(&store, &provider, clock);
    send_all(&svc, 20).await;
    let scheduler = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .spawn();
    // Six open periods of 5 s, then recovery.
    tokio::time::sleep(Duration::from_secs(30)).await;
    provider.down(false);
    tokio::time::sleep(Duration::from_secs(20)).await;
    scheduler.shutdown().await;
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        assert_eq!(r.status, Status::Resolved, "{}", r.id);
    }

    let out = logs.text();
    let lines = |level: &str, message: &str| -> Vec<&str> {
        out.lines()
            .filter(|l| l.contains(level) && l.contains(message))
            .collect()
    };
    let warnings: Vec<&str> = out.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert_eq!(lines("WARN", "circuit opened").len(), 1, "{out}");
    let held = lines("WARN", "breaker open: holding its deferred records");
    assert_eq!(held.len(), 1, "{out}");
    assert!(
        held[0].contains("breaker=mail.test") && held[0].contains("refused"),
        "the cause: {}",
        held[0]
    );
    let closed = lines("INFO", "breaker closed: draining its held records");
    assert_eq!(closed.len(), 1, "{out}");
    assert!(closed[0].contains("held="), "{}", closed[0]);
    // The probes of the outage are quieter, and each local rejection is at DEBUG.
    assert!(!lines("INFO", "circuit still open").is_empty(), "{out}");
    assert!(
        !lines("DEBUG", "request rejected by an open breaker stored").is_empty(),
        "{out}"
    );
    assert!(
        !lines("DEBUG", "breaker open; record held").is_empty(),
        "{out}"
    );
    assert!(
        lines("WARN", "scheduled re-send failed").is_empty(),
        "{out}"
    );
}
