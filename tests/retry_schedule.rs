//! The second tier of retries: a request that used up its in-process attempts is deferred to the
//! scheduler (5 s, 1 min, 15 min by default) before it is a dead letter; only requests that can
//! be sent again, only classes that may succeed; the preset turns it on.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use support::outage::as_string_request;
use support::{Scripted, Step, post, post_with_key, status, status_with};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule};
use tower_backstop::resend::{Redrive, Scheduler};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::store::{Filter, MemoryStore, Status, Store};
use tower_backstop::{BackstopLayer, Class, Clock, Failure};

const URI: &str = "http://mail.test/v1/messages";

fn refused() -> Step {
    Step::Io(std::io::ErrorKind::ConnectionRefused)
}

/// The test's clock: tokio's paused clock anchored once per test (each test runs on its own
/// thread), so that the layers' times and the test's `now` share one anchor on the wall clock.
fn test_clock() -> Clock {
    thread_local! {
        static CLOCK: Clock = Clock::tokio();
    }
    CLOCK.with(Clock::clone)
}

/// Dead letters with `schedule` over 3 attempts without backoff over the HTTP classifier.
fn stack(
    store: &Arc<dyn Store>,
    schedule: RetrySchedule,
    attempts: u32,
    upstream: &Scripted,
) -> tower::util::BoxCloneService<
    http::Request<String>,
    http::Response<()>,
    Failure<http::Response<()>>,
> {
    tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                DeadLetterLayer::from_arc(Arc::clone(store))
                    .clock(test_clock())
                    .retry_schedule(schedule),
            )
            .layer(
                RetryPolicy::new()
                    .max_attempts(attempts)
                    .backoff(Backoff::constant(Duration::ZERO))
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(upstream.clone()),
    )
}

fn since(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap()
}

/// The record and the caller's failure agree: deferred, due `within` from `now`.
async fn deferred_within(
    store: &Arc<dyn Store>,
    failure: &Failure<http::Response<()>>,
    now: SystemTime,
    within: std::ops::RangeInclusive<Duration>,
) {
    let attempts = failure.note::<Attempts>().unwrap();
    assert_eq!(attempts.give_up(), GiveUp::Deferred, "{failure}");
    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else {
        panic!("not stored: {failure}")
    };
    let record = store.get(id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Deferred);
    assert_eq!(record.retry_at, attempts.retry_at());
    let due = since(record.retry_at.unwrap(), now);
    assert!(within.contains(&due), "due in {due:?}, not in {within:?}");
}

fn is_dead(failure: &Failure<http::Response<()>>, give_up: GiveUp) {
    assert_eq!(failure.note::<Attempts>().unwrap().give_up(), give_up);
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_deferred_5s_then_1min_then_15min_then_dead() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::always(refused());
    let svc = stack(&store, RetrySchedule::new(), 3, &upstream);
    let now = test_clock().now();
    let failure = svc
        .clone()
        .oneshot(post_with_key(URI, "{}", "k1"))
        .await
        .unwrap_err();
    let s = Duration::from_secs;
    deferred_within(&store, &failure, now, s(5)..=Duration::from_millis(6_251)).await;
    assert_eq!(failure.note::<Attempts>().unwrap().count(), 3);

    let start = Instant::now();
    let handle = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(test_clock())
        .spawn();
    tokio::time::sleep(s(25 * 60)).await;
    handle.shutdown().await;

    // Three attempts a pass: the first, then re-sends after 5 s, 1 min and 15 min (each up to
    // 25 % later), then dead.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 12, "{seen:?}");
    let passes: Vec<Duration> = seen.chunks(3).map(|c| c[0].at - start).collect();
    let gaps: Vec<Duration> = passes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(passes[1] >= s(4) && passes[1] <= s(7), "{passes:?}");
    assert!(gaps[1] >= s(60) && gaps[1] <= s(76), "{gaps:?}");
    assert!(gaps[2] >= s(15 * 60) && gaps[2] <= s(1126), "{gaps:?}");
    let record = store.get("k1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.retry_at, record.resends),
        (Status::Dead, None, 3)
    );
    assert_eq!(record.class, "transient");
    assert_eq!(record.history.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_provider_back_by_the_first_resend_gets_the_message_once_and_no_dead_letter() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::new([refused(), refused(), refused()], status(202));
    let svc = stack(&store, RetrySchedule::new(), 3, &upstream);
    let failure = svc
        .clone()
        .oneshot(post_with_key(URI, "{}", "k2"))
        .await
        .unwrap_err();
    assert!(failure.note::<Attempts>().unwrap().is_deferred());
    let handle = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(test_clock())
        .spawn();
    tokio::time::sleep(Duration::from_secs(10)).await;
    handle.shutdown().await;
    assert_eq!(upstream.calls(), 4);
    assert_eq!(upstream.finished(), 4);
    let record = store.get("k2").await.unwrap().unwrap();
    assert_eq!(record.status, Status::Resolved);
    let dead = store
        .search(&Filter::new().status(Status::Dead), 0..10)
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
}

#[tokio::test(start_paused = true)]
async fn only_requests_that_can_be_sent_again_are_deferred() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = test_clock().now();
    let window = Duration::from_secs(5)..=Duration::from_millis(6_251);
    // A POST without a key answered 502 may have been acted on: dead.
    let upstream = Scripted::always(status(502));
    let svc = stack(&store, RetrySchedule::new(), 1, &upstream);
    let failure = svc.oneshot(post(URI, "{}")).await.unwrap_err();
    is_dead(&failure, GiveUp::AttemptsExhausted);
    // The same POST refused at the door certainly was not: deferred.
    let upstream = Scripted::always(refused());
    let svc = stack(&store, RetrySchedule::new(), 1, &upstream);
    let failure = svc.oneshot(post(URI, "{}")).await.unwrap_err();
    deferred_within(&store, &failure, now, window.clone()).await;
    // With a key, a 502 is deferred too.
    let upstream = Scripted::always(status(502));
    let svc = stack(&store, RetrySchedule::new(), 2, &upstream);
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "k3"))
        .await
        .unwrap_err();
    deferred_within(&store, &failure, now, window).await;
    // Without a schedule (the bare layer's default), attempts exhausted is dead, as before.
    let upstream = Scripted::always(refused());
    let svc = stack(&store, RetrySchedule::none(), 2, &upstream);
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "k4"))
        .await
        .unwrap_err();
    is_dead(&failure, GiveUp::AttemptsExhausted);
    let record = store.get("k4").await.unwrap().unwrap();
    assert_eq!((record.status, record.retry_at), (Status::Dead, None));
}

#[tokio::test(start_paused = true)]
async fn classes_follow_their_own_schedule() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = test_clock().now();
    let s = Duration::from_secs;
    // A permanent failure is never deferred.
    let upstream = Scripted::always(status(400));
    let svc = stack(&store, RetrySchedule::new(), 3, &upstream);
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "p"))
        .await
        .unwrap_err();
    is_dead(&failure, GiveUp::NotRetryable);
    // Unknown (500): once, after a minute.
    let upstream = Scripted::always(status(500));
    let svc = stack(&store, RetrySchedule::new(), 2, &upstream);
    let failure = svc
        .clone()
        .oneshot(post_with_key(URI, "{}", "u"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::UNKNOWN);
    deferred_within(&store, &failure, now, s(60)..=s(75)).await;
    let handle = Scheduler::new(Arc::clone(&store), svc, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(test_clock())
        .spawn();
    tokio::time::sleep(s(5 * 60)).await;
    handle.shutdown().await;
    assert_eq!(upstream.calls(), 4, "two attempts, then one re-send of two");
    let record = store.get("u").await.unwrap().unwrap();
    assert_eq!((record.status, record.resends), (Status::Dead, 1));
    // Throttled with a server hint longer than the step: the hint.
    let upstream = Scripted::always(status_with(429, "retry-after", "20"));
    let svc = stack(&store, RetrySchedule::new(), 1, &upstream);
    let now = test_clock().now();
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "t"))
        .await
        .unwrap_err();
    deferred_within(&store, &failure, now, s(20)..=Duration::from_millis(20_001)).await;
    // A class given no delays is dead at once; one given its own delays follows them.
    let custom = RetrySchedule::new()
        .class(Class::TRANSIENT, [s(2)])
        .class(Class::THROTTLED, []);
    assert_eq!(custom.delays(Class::TRANSIENT), [s(2)]);
    let upstream = Scripted::always(status(429));
    let svc = stack(&store, custom.clone(), 1, &upstream);
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "t2"))
        .await
        .unwrap_err();
    is_dead(&failure, GiveUp::AttemptsExhausted);
    let upstream = Scripted::always(refused());
    let svc = stack(&store, custom, 1, &upstream);
    let now = test_clock().now();
    let failure = svc
        .oneshot(post_with_key(URI, "{}", "c"))
        .await
        .unwrap_err();
    deferred_within(&store, &failure, now, s(2)..=Duration::from_millis(2_501)).await;
}

#[tokio::test(start_paused = true)]
async fn a_redrive_that_fails_again_stays_dead() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let upstream = Scripted::always(refused());
    // Dead first (no schedule), then re-driven on purpose through a stack with one.
    let svc = stack(&store, RetrySchedule::none(), 2, &upstream);
    let _ = svc
        .oneshot(post_with_key(URI, "{}", "r"))
        .await
        .unwrap_err();
    let svc = stack(&store, RetrySchedule::new(), 2, &upstream);
    let redrive = Redrive::new(Filter::new().class("transient"), 50, 10).unwrap();
    let report = redrive.run(&*store, svc, as_string_request).await.unwrap();
    assert_eq!(report.failed(), 1, "{report:?}");
    assert_eq!(upstream.calls(), 4);
    let record = store.get("r").await.unwrap().unwrap();
    assert_eq!((record.status, record.retry_at), (Status::Dead, None));
}

#[tokio::test(start_paused = true)]
async fn the_preset_defers_by_default_and_keeps_a_schedule_chosen() {
    for (schedule, deferred) in [
        (None, true),
        (Some(RetrySchedule::none()), false),
        (Some(RetrySchedule::new()), true),
    ] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let upstream = Scripted::always(refused());
        let layer = DeadLetterLayer::from_arc(Arc::clone(&store)).clock(test_clock());
        let layer = match schedule {
            Some(s) => layer.retry_schedule(s),
            None => layer,
        };
        let svc = ServiceBuilder::new()
            .layer(BackstopLayer::http(Duration::from_secs(1)).dead_letters(layer))
            .service(upstream.clone());
        let failure = svc
            .oneshot(post_with_key(URI, "{}", "k"))
            .await
            .unwrap_err();
        let record = store.get("k").await.unwrap().unwrap();
        let status = if deferred {
            Status::Deferred
        } else {
            Status::Dead
        };
        assert_eq!(record.status, status, "{failure}");
        assert_eq!(
            failure.note::<Attempts>().unwrap().is_deferred(),
            deferred,
            "{failure}"
        );
    }
}
