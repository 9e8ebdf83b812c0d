//! A dead-letter store that does not answer (a database restarting, a pool waiting for a
//! connection) costs a caller at most the layer's store timeout: the failure comes back
//! `NotStored`, with the reason, and a request that was to be deferred says it was not, so that
//! a caller reading only its retry-at time does not take it for kept. With an in-process store
//! that hangs on every write; on tokio's paused clock, which the bound (real time) ignores.

mod support;

use std::sync::Arc;
use std::time::Duration;

use backstop_test_support::{Fault, FaultyStore, Op};
use std::time::Instant;
use support::{Scripted, post_with_key, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DEFAULT_STORE_TIMEOUT, DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Attempts, GiveUp, RetryPolicy};
use tower_backstop::store::{MemoryStore, Store};

/// The call's failure when the store hangs, and how long the caller waited for it: the bound
/// is real time (measured on the system's clock even under tokio's paused clock, so that a real
/// store's write is never cut short by the paused clock's jumps), so each of these tests waits it.
async fn through_a_hung_store(
    layer: impl FnOnce(DeadLetterLayer) -> DeadLetterLayer,
    upstream: Scripted,
) -> (
    tower_backstop::Failure<http::Response<()>>,
    Duration,
    FaultyStore,
) {
    // A memory store whose writes never answer (and are never made) while hung.
    let store = FaultyStore::new(Arc::new(MemoryStore::new()));
    store.set_for_each(Op::WRITES, Fault::Hang);
    let svc = ServiceBuilder::new()
        .layer(layer(DeadLetterLayer::new(store.clone())))
        .layer(RetryPolicy::new().max_attempts(2).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream);
    let started = Instant::now();
    let failure = svc
        .oneshot(post_with_key("http://mail.test/", "{}", "m-1"))
        .await
        .unwrap_err();
    (failure, started.elapsed(), store)
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_costs_the_caller_its_timeout_and_says_not_stored() {
    // A 503 that asks for two minutes, above the retry layer's bound: deferred, if the store
    // took it.
    let upstream = Scripted::always(status_with(503, "retry-after", "120"));
    let (failure, waited, store) = through_a_hung_store(|l| l, upstream).await;
    assert!(waited >= DEFAULT_STORE_TIMEOUT, "{waited:?}");
    let Some(DeadLetterStatus::NotStored { error, .. }) = failure.note::<DeadLetterStatus>() else {
        panic!("{failure:?}");
    };
    assert_eq!(
        error.to_string(),
        "dead-letter store did not answer within 1s"
    );
    // Not deferred: nothing will send it again, and the caller is told so.
    let attempts = failure.note::<Attempts>().unwrap();
    assert_eq!(attempts.give_up(), GiveUp::NotStored);
    assert_eq!(attempts.retry_at(), None);
    assert!(!attempts.is_deferred());
    let text = failure.to_string();
    assert!(!text.contains("deferred until"), "{text}");
    assert!(text.contains("could not be written"), "{text}");
    // Once the store answers again, nothing of it was written halfway.
    store.set(Fault::Answer);
    assert_eq!(store.get("m-1").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn the_store_timeout_is_the_layers_setting() {
    let (failure, waited, _) = through_a_hung_store(
        |l| l.store_timeout(Duration::from_millis(250)),
        Scripted::always(status(400)),
    )
    .await;
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::NotStored { .. })
    ));
    // A dead letter that was not written keeps the retry layer's own reason.
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
}
