//! One event vocabulary: what a `Listener` sees from the retry layer (attempts with their
//! durations, retries, timeouts, giving up), the breaker, the dead-letter layer and the
//! scheduler, set once on the preset or on each layer. On tokio's paused clock with in-process
//! services; the store that fails is a real read-only SQLite file.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::outage::as_string_request;
use support::{Scripted, Step, get, no_jitter, post_with_key, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule, record_of};
use tower_backstop::observe::Event;
use tower_backstop::resend::Scheduler;
use tower_backstop::retry::{DelaySource, GiveUp, RetryPolicy};
use tower_backstop::store::{MemoryStore, SqliteStore, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, Class, Clock, Code, Envelope, Failure, Sent};

/// An event as the listener saw it, owned.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Attempt {
        attempt: u32,
        class: Option<Class>,
        code: Option<Code>,
        sent: Sent,
        duration: Duration,
    },
    Retry {
        attempt: u32,
        class: Class,
        delay: Duration,
        source: DelaySource,
    },
    GaveUp {
        attempts: u32,
        class: Class,
        reason: GiveUp,
    },
    TimedOut {
        attempt: u32,
        deadline: bool,
    },
    Transition {
        breaker: String,
        from: State,
        to: State,
    },
    Rejected {
        breaker: String,
    },
    Stored {
        id: String,
        class: Class,
        deferred: bool,
    },
    Resent {
        id: String,
        outcome: &'static str,
    },
    StoreError {
        operation: &'static str,
        id: Option<String>,
        error: String,
    },
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn recorder() -> (Log, impl Fn(&Event<'_>) + Send + Sync + 'static) {
    let log = Log::default();
    let sink = Arc::clone(&log);
    (log, move |event: &Event<'_>| {
        let seen = match *event {
            Event::AttemptEnded {
                attempt,
                class,
                code,
                sent,
                duration,
            } => Seen::Attempt {
                attempt,
                class,
                code,
                sent,
                duration,
            },
            Event::RetryScheduled {
                attempt,
                class,
                delay,
                source,
                ..
            } => Seen::Retry {
                attempt,
                class,
                delay,
                source,
            },
            Event::GaveUp {
                attempts,
                class,
                reason,
                ..
            } => Seen::GaveUp {
                attempts,
                class,
                reason,
            },
            Event::TimedOut { attempt, deadline } => Seen::TimedOut { attempt, deadline },
            Event::BreakerTransition {
                breaker, from, to, ..
            } => Seen::Transition {
                breaker: breaker.to_owned(),
                from,
                to,
            },
            Event::BreakerRejected { breaker, .. } => Seen::Rejected {
                breaker: breaker.to_owned(),
            },
            Event::DeadLetterStored {
                id,
                class,
                deferred,
                ..
            } => Seen::Stored {
                id: id.to_owned(),
                class,
                deferred,
            },
            Event::Resent { id, outcome } => Seen::Resent {
                id: id.to_owned(),
                outcome,
            },
            Event::StoreError {
                operation,
                id,
                error,
            } => Seen::StoreError {
                operation,
                id: id.map(str::to_owned),
                error: error.to_string(),
            },
            _ => return,
        };
        sink.lock().unwrap().push(seen);
    })
}

fn taken(log: &Log) -> Vec<Seen> {
    std::mem::take(&mut *log.lock().unwrap())
}

fn after(ms: u64, step: Step) -> Step {
    Step::After(Duration::from_millis(ms), Box::new(step))
}

const HTTP_503: Code = Code::Http(http::StatusCode::SERVICE_UNAVAILABLE);

#[tokio::test(start_paused = true)]
async fn each_attempt_ends_with_its_class_and_duration_and_each_retry_says_why() {
    let (log, listener) = recorder();
    let upstream = Scripted::new(
        [
            after(50, status(503)),
            after(30, status_with(503, "retry-after", "2")),
        ],
        after(20, status(200)),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .backoff(no_jitter(100))
                .listener(listener)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(upstream);
    let response = svc.oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        taken(&log),
        [
            Seen::Attempt {
                attempt: 1,
                class: Some(Class::TRANSIENT),
                code: Some(HTTP_503),
                sent: Sent::No,
                duration: Duration::from_millis(50),
            },
            Seen::Retry {
                attempt: 1,
                class: Class::TRANSIENT,
                delay: Duration::from_millis(100),
                source: DelaySource::Backoff,
            },
            Seen::Attempt {
                attempt: 2,
                class: Some(Class::TRANSIENT),
                code: Some(HTTP_503),
                sent: Sent::No,
                duration: Duration::from_millis(30),
            },
            Seen::Retry {
                attempt: 2,
                class: Class::TRANSIENT,
                delay: Duration::from_secs(2),
                source: DelaySource::ServerHint,
            },
            Seen::Attempt {
                attempt: 3,
                class: None,
                code: None,
                sent: Sent::Yes,
                duration: Duration::from_millis(20),
            },
        ],
        "the duration of each attempt excludes the backoff before it"
    );
}

#[tokio::test(start_paused = true)]
async fn giving_up_says_why_for_a_retried_call_and_a_single_one() {
    let (log, listener) = recorder();
    let policy = RetryPolicy::new()
        .max_attempts(2)
        .backoff(no_jitter(10))
        .listener(listener);
    let stack = |upstream: Scripted| {
        ServiceBuilder::new()
            .layer(policy.clone().build().unwrap())
            .layer(ClassifyLayer::http())
            .service(upstream)
    };
    stack(Scripted::always(status(503)))
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    let seen = taken(&log);
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(
        seen[3],
        Seen::GaveUp {
            attempts: 2,
            class: Class::TRANSIENT,
            reason: GiveUp::AttemptsExhausted,
        }
    );

    stack(Scripted::always(status(400)))
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(
        taken(&log),
        [
            Seen::Attempt {
                attempt: 1,
                class: Some(Class::PERMANENT),
                code: Some(Code::Http(http::StatusCode::BAD_REQUEST)),
                sent: Sent::Yes,
                duration: Duration::ZERO,
            },
            Seen::GaveUp {
                attempts: 1,
                class: Class::PERMANENT,
                reason: GiveUp::NotRetryable,
            },
        ]
    );

    // A request that cannot be retried at all (max_attempts 1) still reports its attempt.
    let (log, listener) = recorder();
    let single = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(1)
                .listener(listener)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(Scripted::always(after(5, status(503))));
    single.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(
        taken(&log),
        [
            Seen::Attempt {
                attempt: 1,
                class: Some(Class::TRANSIENT),
                code: Some(HTTP_503),
                sent: Sent::No,
                duration: Duration::from_millis(5),
            },
            Seen::GaveUp {
                attempts: 1,
                class: Class::TRANSIENT,
                reason: GiveUp::AttemptsExhausted,
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_per_attempt_timeout_and_the_overall_deadline_are_told_apart() {
    let (log, listener) = recorder();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(2)
                .backoff(no_jitter(10))
                .listener(listener)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(Scripted::always(after(5_000, status(200))));
    svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    let timed_out = Seen::Attempt {
        attempt: 1,
        class: Some(Class::TRANSIENT),
        code: Some(Code::Timeout),
        sent: Sent::Maybe,
        duration: Duration::from_secs(1),
    };
    let seen = taken(&log);
    assert_eq!(seen[0], timed_out);
    assert_eq!(
        seen[1],
        Seen::TimedOut {
            attempt: 1,
            deadline: false
        }
    );
    assert_eq!(
        seen[4],
        Seen::TimedOut {
            attempt: 2,
            deadline: false
        }
    );
    assert_eq!(
        seen.last(),
        Some(&Seen::GaveUp {
            attempts: 2,
            class: Class::TRANSIENT,
            reason: GiveUp::AttemptsExhausted,
        })
    );

    let (log, listener) = recorder();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .deadline(Duration::from_millis(300))
                .listener(listener)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(Scripted::always(after(1_000, status(200))));
    svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(
        taken(&log),
        [
            Seen::TimedOut {
                attempt: 1,
                deadline: true
            },
            Seen::GaveUp {
                attempts: 1,
                class: Class::TRANSIENT,
                reason: GiveUp::DeadlineExceeded,
            },
        ],
        "an attempt the deadline cut short has no end of its own"
    );
}

/// Set once on the preset, before its store is given: the retry layer's, the preset's own
/// per-host breaker's and the dead-letter layer's events all reach it.
#[tokio::test(start_paused = true)]
async fn the_presets_listener_reaches_every_layer_its_breaker_included() {
    let (log, listener) = recorder();
    let store = Arc::new(MemoryStore::new());
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
                .listener(listener)
                // Dead at once, without the second tier: this test follows the events of one
                // pass (the second tier has its own tests in tests/retry_schedule.rs).
                .dead_letters(
                    DeadLetterLayer::from_arc(store.clone()).retry_schedule(RetrySchedule::none()),
                ),
        )
        .service(Scripted::always(status(503)));

    let failure = svc
        .clone()
        .oneshot(post_with_key("http://mail.test/", "{}", "k-0"))
        .await
        .unwrap_err();
    let id = match failure.note::<DeadLetterStatus>() {
        Some(DeadLetterStatus::Stored { id }) => id.clone(),
        other => panic!("not stored: {other:?}"),
    };
    let seen = taken(&log);
    let attempts = seen
        .iter()
        .filter(|s| matches!(s, Seen::Attempt { .. }))
        .count();
    let retries = seen
        .iter()
        .filter(|s| matches!(s, Seen::Retry { .. }))
        .count();
    assert_eq!((attempts, retries), (3, 2), "{seen:?}");
    assert_eq!(
        seen[seen.len() - 2..],
        [
            Seen::GaveUp {
                attempts: 3,
                class: Class::TRANSIENT,
                reason: GiveUp::AttemptsExhausted,
            },
            Seen::Stored {
                id,
                class: Class::TRANSIENT,
                deferred: false,
            },
        ]
    );

    // The preset's rule opens the host's breaker once 20 calls were seen, half of them failed.
    for n in 1..7 {
        let _ = svc
            .clone()
            .oneshot(post_with_key("http://mail.test/", "{}", &format!("k-{n}")))
            .await;
    }
    let seen = taken(&log);
    assert!(
        seen.contains(&Seen::Transition {
            breaker: "mail.test:80".into(),
            from: State::Closed,
            to: State::Open,
        }),
        "{seen:?}"
    );
    assert!(
        seen.contains(&Seen::Rejected {
            breaker: "mail.test:80".into()
        }),
        "{seen:?}"
    );
    let rejected_attempt = seen
        .iter()
        .find(|s| {
            matches!(
                s,
                Seen::Attempt {
                    class: Some(Class::CIRCUIT_OPEN),
                    ..
                }
            )
        })
        .expect("a rejected attempt");
    assert!(
        matches!(rejected_attempt, Seen::Attempt { sent: Sent::No, .. }),
        "a rejection never left: {rejected_attempt:?}"
    );
    assert!(
        seen.iter().any(|s| matches!(
            s,
            Seen::GaveUp {
                reason: GiveUp::Deferred,
                ..
            }
        )),
        "a rejected call is deferred to the half-open time: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|s| matches!(s, Seen::Stored { deferred: true, .. })),
        "and stored deferred: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_that_cannot_write_is_a_store_error_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    SqliteStore::open(&path).unwrap().close();
    let store = SqliteStore::open_read_only(&path).unwrap();
    let (log, listener) = recorder();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store).listener(listener))
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));
    let failure = svc
        .oneshot(post_with_key("http://mail.test/", "{}", "k-ro"))
        .await
        .unwrap_err();
    assert_eq!(
        failure.class(),
        Class::TRANSIENT,
        "the caller's failure is kept"
    );
    let seen = taken(&log);
    let [
        Seen::StoreError {
            operation: "put",
            id: Some(id),
            error,
        },
    ] = &seen[..]
    else {
        panic!("{seen:?}");
    };
    assert_eq!(id, "k-ro");
    assert!(error.to_lowercase().contains("readonly"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn the_scheduler_tells_each_resend_delivered_or_failed() {
    let clock = Clock::tokio();
    let store = Arc::new(MemoryStore::new());
    for (id, _) in [("ok-1", ()), ("bad-1", ())] {
        let mut record = record_of(
            id.to_owned(),
            Envelope::new("{}")
                .with_metadata("method", "POST")
                .with_metadata("uri", format!("http://mail.test/{id}"))
                .with_metadata("idempotency-key", id),
            &Failure::<()>::new(Class::TRANSIENT, HTTP_503),
        );
        record.status = Status::Deferred;
        record.retry_at = Some(clock.now());
        store.put(record).await.unwrap();
    }
    let upstream = tower::service_fn(|req: http::Request<String>| async move {
        let status = if req.uri().path().starts_with("/ok") {
            200
        } else {
            400
        };
        Ok::<_, tower_backstop::BoxError>(
            http::Response::builder().status(status).body(()).unwrap(),
        )
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store.clone()).clock(clock))
        .layer(ClassifyLayer::http())
        .service(upstream);
    let (log, listener) = recorder();
    let handle = Scheduler::new(store.clone(), stack, as_string_request)
        .poll_every(Duration::from_millis(100))
        .clock(clock)
        .listener(listener)
        .spawn();
    tokio::time::sleep(Duration::from_secs(2)).await;
    handle.shutdown().await;
    let mut resent: Vec<Seen> = taken(&log)
        .into_iter()
        .filter(|s| matches!(s, Seen::Resent { .. }))
        .collect();
    resent.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        resent,
        [
            Seen::Resent {
                id: "bad-1".into(),
                outcome: "failed"
            },
            Seen::Resent {
                id: "ok-1".into(),
                outcome: "delivered"
            },
        ]
    );
    assert_eq!(
        store.get("ok-1").await.unwrap().unwrap().status,
        Status::Resolved
    );
}

#[tokio::test(start_paused = true)]
async fn a_listener_that_panics_never_breaks_the_call() {
    let calls = Arc::new(Mutex::new(0_u32));
    let seen = Arc::clone(&calls);
    let panicking = move |_: &Event<'_>| {
        *seen.lock().unwrap() += 1;
        panic!("a listener's bug");
    };
    let breaker = BreakerLayer::builder()
        .consecutive_failures(1)
        .listener(panicking.clone())
        .build()
        .unwrap();
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .backoff(no_jitter(10))
                .listener(panicking)
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(Scripted::new([status(200), status(503)], status(200)));
    let response = svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    let failure = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(
        failure.class(),
        Class::CIRCUIT_OPEN,
        "the breaker opened on the 503 although its listener panicked, and rejected the retry"
    );
    assert_eq!(handle.state(), State::Open);
    assert!(
        *calls.lock().unwrap() >= 5,
        "every event still reached the listener"
    );
}

#[tokio::test(start_paused = true)]
async fn the_unit_listener_does_nothing() {
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().listener(()).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(Scripted::new([status(503)], status(200)));
    assert_eq!(
        svc.oneshot(get("http://mail.test/"))
            .await
            .unwrap()
            .status(),
        200
    );
}
