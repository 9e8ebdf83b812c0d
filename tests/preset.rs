//! `BackstopLayer`: the five layers in order from one set of settings. In-process upstream,
//! paused clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Scripted, Step, get, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule};
use tower_backstop::retry::{Attempts, GiveUp, RetryPolicy};
use tower_backstop::store::{Filter, MemoryStore, Store};
use tower_backstop::{BackstopLayer, Class, Code};

#[tokio::test(start_paused = true)]
async fn retries_classifies_times_out_and_dead_letters_in_order() {
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(RetryPolicy::new().max_attempts(3).build().unwrap()),
        )
        .service(upstream.clone());
    let response = svc.oneshot(get("http://up.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 3);

    // Each attempt hangs past the per-attempt timeout: two attempts, then a dead letter.
    let upstream = Scripted::always(Step::After(Duration::from_secs(60), Box::new(status(200))));
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_millis(100))
                .retry(RetryPolicy::new().max_attempts(2).build().unwrap())
                // Dead at once, without the second tier (tested in tests/retry_schedule.rs).
                .dead_letters(
                    DeadLetterLayer::from_arc(store.clone()).retry_schedule(RetrySchedule::none()),
                ),
        )
        .service(upstream.clone());
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!((f.class(), f.code()), (Class::TRANSIENT, Code::Timeout));
    assert_eq!(f.note::<Attempts>().map_or(0, Attempts::count), 2);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert!(matches!(
        f.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));
    assert_eq!(store.list(10).await.unwrap().len(), 1);
    assert_eq!(upstream.calls(), 2);
    assert_eq!(upstream.finished(), 0);
}

#[tokio::test(start_paused = true)]
async fn one_hosts_outage_never_fails_calls_to_another() {
    // The preset keeps one breaker per host: `down.test` answers 503 to everything until its
    // breaker opens (half of at least 20 calls failed); `up.test`, on the same stack, is still
    // called and answers.
    let upstream = tower::service_fn(|req: http::Request<String>| async move {
        let host = req.uri().host().unwrap_or_default().to_ascii_lowercase();
        let code = if host.trim_end_matches('.') == "down.test" {
            503
        } else {
            200
        };
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(code).unwrap();
        Ok::<_, tower_backstop::BoxError>(response)
    });
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(RetryPolicy::new().max_attempts(1).build().unwrap()),
        )
        .service(upstream);
    let mut last = None;
    for _ in 0..25 {
        last = Some(
            svc.clone()
                .oneshot(get("http://DOWN.test./"))
                .await
                .unwrap_err(),
        );
    }
    let last = last.unwrap();
    assert_eq!(last.class(), Class::CIRCUIT_OPEN, "{last}");
    assert!(last.to_string().contains("down.test:80"), "{last}");
    let response = svc.clone().oneshot(get("http://up.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn with_a_store_a_server_hint_longer_than_one_attempt_is_deferred_not_slept() {
    // 503 with `Retry-After: 1`, then 200. Per-attempt timeout 500 ms.
    let script = || Scripted::new([support::status_with(503, "retry-after", "1")], status(200));

    // With a store: the 1 s wait is above one attempt's 500 ms, so the request is stored as
    // deferred to about 1 s from now and the caller gets it back at once.
    let upstream = script();
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_millis(500))
                .dead_letters(DeadLetterLayer::from_arc(store.clone())),
        )
        .service(upstream.clone());
    let started = tokio::time::Instant::now();
    let before = std::time::SystemTime::now();
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "the caller did not wait");
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    assert_eq!(f.retry_after(), Some(Duration::from_secs(1)));
    let at = f
        .note::<Attempts>()
        .and_then(Attempts::retry_at)
        .expect("a retry-at time");
    assert!(
        at >= before + Duration::from_secs(1),
        "never before the server's second"
    );
    assert!(at <= before + Duration::from_secs(3));
    let records = store.list(10).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, tower_backstop::store::Status::Deferred);
    assert_eq!(upstream.calls(), 1);
    // The caller is told it is kept for a re-send, not given up on.
    let message = f.to_string();
    assert!(message.contains("for a re-send when due"), "{message}");
    assert!(!message.contains("dead letter stored"), "{message}");

    // Without a store, the same wait is slept in process (a deferral would be a failure to the
    // caller): the default `max_delay` of 60 s holds.
    let upstream = script();
    let svc = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_millis(500)))
        .service(upstream.clone());
    let started = tokio::time::Instant::now();
    let response = svc.oneshot(get("http://up.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(upstream.calls(), 2);

    // A `max_delay` the user chose is kept, store or not.
    let upstream = script();
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_millis(500))
                .retry(
                    RetryPolicy::new()
                        .max_delay(Duration::from_secs(5))
                        .build()
                        .unwrap(),
                )
                .dead_letters(DeadLetterLayer::from_arc(store.clone())),
        )
        .service(upstream.clone());
    let response = svc.oneshot(get("http://up.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 2);
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The preset's service over the scripted upstream.
type Stack = tower_backstop::Backstop<Scripted>;

/// Two 503s without a hint, then 200, behind the preset with a store, a 500 ms attempt timeout,
/// `max_attempts` attempts and a backoff of 2 s then 4 s (above the timeout).
fn twice_503_with_a_store(max_attempts: u32) -> (Stack, Scripted, Arc<MemoryStore>) {
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_millis(500))
                .retry(
                    RetryPolicy::new()
                        .max_attempts(max_attempts)
                        .backoff(support::no_jitter(2_000))
                        .build()
                        .unwrap(),
                )
                // Dead at once, without the second tier (tested in tests/retry_schedule.rs).
                .dead_letters(
                    DeadLetterLayer::from_arc(store.clone()).retry_schedule(RetrySchedule::none()),
                ),
        )
        .service(upstream.clone());
    (svc, upstream, store)
}

#[tokio::test(start_paused = true)]
async fn with_a_store_backoff_is_still_slept_so_max_attempts_caps_the_pass() {
    // The store bound is for server hints only: the backoff is slept, and the three attempts are
    // one pass, capped by `max_attempts`.
    let (svc, upstream, store) = twice_503_with_a_store(3);
    let started = tokio::time::Instant::now();
    let response = svc.oneshot(get("http://up.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_secs(6),
        "2 s and 4 s slept"
    );
    assert_eq!(upstream.calls(), 3);
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );

    // With `max_attempts(2)`: the pass ends after 2 calls, dead-lettered, not deferred.
    let (svc, upstream, store) = twice_503_with_a_store(2);
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    assert_eq!(upstream.calls(), 2);
    let records = store.list(10).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, tower_backstop::store::Status::Dead);
}

/// After a restart, the preset learns from its store which hosts were down: the first call to
/// such a host is deferred by its open breaker without reaching the provider.
#[tokio::test(start_paused = true)]
async fn the_preset_learns_from_its_store_which_hosts_are_down() {
    let store = Arc::new(MemoryStore::new());
    let failure: tower_backstop::Failure =
        tower_backstop::Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
    let mut record = tower_backstop::dead_letter::record_of(
        "m-1".into(),
        tower_backstop::Envelope::new("{}"),
        &failure,
    );
    record.status = tower_backstop::store::Status::Deferred;
    record.breaker = Some("up.test:80".into());
    record.retry_at = Some(std::time::SystemTime::now() + Duration::from_secs(60));
    store.put(record).await.unwrap();

    let layer = BackstopLayer::http(Duration::from_millis(500))
        .dead_letters(DeadLetterLayer::from_arc(store.clone()));
    assert_eq!(layer.learn_from_store().await.unwrap(), 1);
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    let f = svc.oneshot(get("http://up.test/")).await.unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN, "{f}");
    assert_eq!(upstream.calls(), 0);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );

    // Without a store there is nothing to learn.
    let bare = BackstopLayer::http(Duration::from_millis(500));
    assert_eq!(bare.learn_from_store().await.unwrap(), 0);
}
