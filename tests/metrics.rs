//! `Metrics`: every event recorded through the `metrics` facade under the documented names and
//! bounded labels. Each test records into its own `metrics-util` debugging recorder, installed
//! for its thread only, on tokio's paused clock with in-process services.
#![cfg(feature = "metrics")]

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::outage::as_string_request;
use support::{Scripted, Step, get, no_jitter, post_with_key, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, RetrySchedule, record_of};
use tower_backstop::observe::Metrics;
use tower_backstop::observe::{Event, Listener};
use tower_backstop::resend::Scheduler;
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{MemoryStore, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, Class, Clock, Code, Envelope, Failure};

/// Runs `test` on a paused current-thread runtime with `recorder` as this thread's recorder.
fn run<F: Future>(recorder: &dyn Recorder, test: impl FnOnce() -> F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test())
    })
}

/// The recorder's values by `name{label=value,…}`, labels in name order. A snapshot takes the
/// counters' and histograms' values: the next one has only what came after.
fn values(snapshotter: &Snapshotter) -> BTreeMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

fn counter(values: &BTreeMap<String, DebugValue>, key: &str) -> u64 {
    match values.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("no counter {key}: {other:?} in {:#?}", values.keys()),
    }
}

fn gauge(values: &BTreeMap<String, DebugValue>, key: &str) -> f64 {
    match values.get(key) {
        Some(DebugValue::Gauge(v)) => v.0,
        other => panic!("no gauge {key}: {other:?} in {:#?}", values.keys()),
    }
}

fn histogram(values: &BTreeMap<String, DebugValue>, key: &str) -> Vec<f64> {
    match values.get(key) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.0).collect(),
        other => panic!("no histogram {key}: {other:?} in {:#?}", values.keys()),
    }
}

fn after(ms: u64, step: Step) -> Step {
    Step::After(Duration::from_millis(ms), Box::new(step))
}

#[test]
fn calls_attempts_and_retry_delays_are_counted_by_outcome_class_and_source() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let metrics = Metrics::new();
        let policy = RetryPolicy::new()
            .max_attempts(3)
            .backoff(no_jitter(10))
            .listener(metrics);
        let stack = |upstream: Scripted| {
            ServiceBuilder::new()
                .layer(policy.clone().build().unwrap())
                .layer(ClassifyLayer::http())
                .service(upstream)
        };
        let call = |upstream| stack(upstream).oneshot(get("http://mail.test/"));
        call(Scripted::always(after(40, status(200))))
            .await
            .unwrap();
        call(Scripted::new([status(503)], status(200)))
            .await
            .unwrap();
        call(Scripted::always(status(400))).await.unwrap_err();
        call(Scripted::always(status(503))).await.unwrap_err();
        // An hour's `Retry-After` is over the in-process maximum: deferred.
        call(Scripted::always(status_with(429, "retry-after", "3600")))
            .await
            .unwrap_err();
    });
    let v = values(&snapshotter);
    for outcome in [
        "success_without_retry",
        "success_with_retry",
        "failed_without_retry",
        "failed_with_retry",
        "deferred",
    ] {
        assert_eq!(
            counter(&v, &format!("backstop_calls_total{{outcome={outcome}}}")),
            1,
            "{outcome}"
        );
    }
    assert_eq!(
        counter(&v, "backstop_attempts_total{class=success,processed=yes}"),
        2
    );
    assert_eq!(
        counter(&v, "backstop_attempts_total{class=transient,processed=no}"),
        4,
        "one 503 before a success, three before giving up"
    );
    assert_eq!(
        counter(&v, "backstop_attempts_total{class=permanent,processed=yes}"),
        1
    );
    assert_eq!(
        counter(&v, "backstop_attempts_total{class=throttled,processed=no}"),
        1
    );
    let mut retries = histogram(&v, "backstop_call_retries{}");
    retries.sort_by(f64::total_cmp);
    // Only the calls that retried (gRFC A96): the three without a retry are in
    // `backstop_calls_total` above.
    assert_eq!(retries, [1.0, 2.0]);
    let mut delays = histogram(&v, "backstop_retry_delay_seconds{source=backoff}");
    delays.sort_by(f64::total_cmp);
    assert_eq!(delays, [0.01, 0.01, 0.02], "10 ms, then 20 ms");
    let mut durations = histogram(&v, "backstop_attempt_duration_seconds{class=success}");
    durations.sort_by(f64::total_cmp);
    assert_eq!(durations, [0.0, 0.04], "seconds, on tokio's clock");
}

#[test]
fn a_server_hint_is_its_own_delay_source() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let svc = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .backoff(no_jitter(10))
                    .listener(Metrics::new())
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(Scripted::new(
                [status_with(503, "retry-after", "2")],
                status(200),
            ));
        svc.oneshot(get("http://mail.test/")).await.unwrap();
    });
    let v = values(&snapshotter);
    assert_eq!(
        histogram(&v, "backstop_retry_delay_seconds{source=server_hint}"),
        [2.0]
    );
    assert!(!v.contains_key("backstop_retry_delay_seconds{source=backoff}"));
}

#[test]
fn timeouts_are_counted_by_the_layer_that_ran_out_of_time() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let metrics = Metrics::new();
        let per_attempt = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .max_attempts(2)
                    .backoff(no_jitter(10))
                    .listener(metrics.clone())
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_secs(1)))
            .service(Scripted::always(after(5_000, status(200))));
        per_attempt
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
        let deadline = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .deadline(Duration::from_millis(300))
                    .listener(metrics)
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(Scripted::always(after(1_000, status(200))));
        deadline
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
    });
    let v = values(&snapshotter);
    assert_eq!(counter(&v, "backstop_timeouts_total{layer=timeout}"), 2);
    assert_eq!(counter(&v, "backstop_timeouts_total{layer=retry}"), 1);
    assert_eq!(
        counter(
            &v,
            "backstop_attempts_total{class=transient,processed=maybe}"
        ),
        2,
        "a timed-out attempt may have been processed"
    );
}

#[test]
fn retries_skipped_for_want_of_a_safe_copy_are_counted_by_reason() {
    use http_body_util::Full;
    use tower_backstop::retry::ReplayBufferLayer;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let metrics = Metrics::new();
        // A body over the replay buffer (8 bytes): one attempt, then a skipped retry.
        let over = ServiceBuilder::new()
            .layer(ReplayBufferLayer::new(8))
            .layer(
                RetryPolicy::new()
                    .backoff(no_jitter(10))
                    .listener(metrics.clone())
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(tower::service_fn(|_: http::Request<_>| async {
                Ok::<_, tower_backstop::BoxError>(
                    http::Response::builder().status(503).body(()).unwrap(),
                )
            }));
        let request = http::Request::put("http://mail.test/")
            .body(Full::new(bytes::Bytes::from_static(
                b"far more than eight bytes",
            )))
            .unwrap();
        over.oneshot(request).await.unwrap_err();
        // A keyless POST that timed out: outcome unknown, not resent.
        let unknown = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .backoff(no_jitter(10))
                    .listener(metrics)
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_secs(1)))
            .service(Scripted::always(after(5_000, status(200))));
        unknown
            .oneshot(support::post("http://mail.test/", "{}"))
            .await
            .unwrap_err();
    });
    let v = values(&snapshotter);
    assert_eq!(
        counter(&v, "backstop_retries_skipped_total{reason=not_replayable}"),
        1
    );
    assert_eq!(
        counter(&v, "backstop_retries_skipped_total{reason=not_idempotent}"),
        1
    );
}

/// The preset's listener reaches its own per-host breaker and the dead-letter layer: state
/// gauge, transitions, rejections, and dead letters by class and status.
#[test]
fn the_presets_breaker_and_dead_letters_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let store = Arc::new(MemoryStore::new());
        let svc = ServiceBuilder::new()
            .layer(
                BackstopLayer::http(Duration::from_secs(1))
                    .retry(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
                    .listener(Metrics::new())
                    // Dead at once, without the second tier (tested in tests/retry_schedule.rs).
                    .dead_letters(
                        DeadLetterLayer::from_arc(store).retry_schedule(RetrySchedule::none()),
                    ),
            )
            .service(Scripted::always(status(503)));
        // The preset's rule opens the host's breaker once 20 calls were seen, half of them
        // failed: 7 calls of 3 attempts.
        for n in 0..7 {
            let _ = svc
                .clone()
                .oneshot(post_with_key("http://mail.test/", "{}", &format!("k-{n}")))
                .await;
        }
    });
    let v = values(&snapshotter);
    let breaker = "breaker=mail.test:80";
    assert_eq!(
        counter(
            &v,
            &format!("backstop_breaker_transitions_total{{{breaker},from=closed,to=open}}")
        ),
        1
    );
    assert_eq!(
        gauge(
            &v,
            &format!("backstop_breaker_state{{{breaker},state=open}}")
        ),
        1.0
    );
    assert_eq!(
        gauge(
            &v,
            &format!("backstop_breaker_state{{{breaker},state=closed}}")
        ),
        0.0
    );
    let rejections = counter(
        &v,
        &format!("backstop_breaker_rejections_total{{{breaker}}}"),
    );
    assert!(rejections >= 1, "{rejections}");
    // A rejection is not an attempt: nothing left the process. It is counted once, as a
    // rejection, and its call as deferred.
    assert!(
        !v.keys().any(|k| k.contains("class=circuit_open")
            && (k.starts_with("backstop_attempts_total")
                || k.starts_with("backstop_attempt_duration_seconds"))),
        "no attempt and no duration of a rejection: {v:#?}"
    );
    let dead = counter(
        &v,
        "backstop_dead_letters_total{class=transient,status=dead}",
    );
    let deferred = counter(
        &v,
        "backstop_dead_letters_total{class=circuit_open,status=deferred}",
    );
    assert_eq!(dead + deferred, 7, "every call is a record: {v:#?}");
    assert!(
        dead >= 1 && deferred >= 1,
        "dead {dead}, deferred {deferred}"
    );
    assert_eq!(
        counter(&v, "backstop_calls_total{outcome=deferred}"),
        deferred
    );
}

#[test]
fn the_scheduler_counts_resends_by_outcome_and_its_backlog() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let first = run(&recorder, || async {
        let clock = Clock::tokio();
        let store = Arc::new(MemoryStore::new());
        for (id, due_in) in [("ok-1", 0), ("bad-1", 0), ("later-1", 3_600)] {
            let mut record = record_of(
                id.to_owned(),
                Envelope::new("{}")
                    .with_metadata("method", "POST")
                    .with_metadata("uri", format!("http://mail.test/{id}"))
                    .with_metadata("idempotency-key", id),
                &Failure::<()>::new(
                    Class::TRANSIENT,
                    Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
                ),
            );
            record.status = Status::Deferred;
            record.retry_at = Some(clock.now() + Duration::from_secs(due_in));
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
        let metrics = Metrics::new();
        let stack = ServiceBuilder::new()
            .layer(
                DeadLetterLayer::from_arc(store.clone())
                    .clock(clock)
                    .listener(metrics.clone()),
            )
            .layer(ClassifyLayer::http())
            .service(upstream);
        let handle = Scheduler::new(store.clone(), stack, as_string_request)
            .poll_every(Duration::from_millis(100))
            .backlog_every(Duration::from_secs(10))
            .clock(clock)
            .listener(metrics)
            .spawn();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let v = values(&snapshotter);
        assert_eq!(
            gauge(&v, "backstop_deferred_backlog{}"),
            3.0,
            "counted before the first claim"
        );
        tokio::time::sleep(Duration::from_secs(20)).await;
        handle.shutdown().await;
        v
    });
    // A snapshot takes the counters' values: add the first one's.
    let v = values(&snapshotter);
    let resends = |outcome: &str| {
        let key = format!("backstop_resends_total{{outcome={outcome}}}");
        [&first, &v]
            .iter()
            .filter(|v| v.contains_key(&key))
            .map(|v| counter(v, &key))
            .sum::<u64>()
    };
    assert_eq!(resends("delivered"), 1);
    assert_eq!(resends("failed"), 1);
    assert_eq!(
        gauge(&v, "backstop_deferred_backlog{}"),
        1.0,
        "the record due in an hour still waits"
    );
    let key = "backstop_dead_letters_total{class=permanent,status=dead}";
    assert_eq!(
        counter(&first, key) + counter(&v, key),
        1,
        "the re-send that failed again is a dead letter"
    );
}

/// Breaker names beyond the bound are counted under `other`, so a key per user cannot blow up
/// the label set; the events are counted all the same.
#[test]
fn label_values_beyond_the_bound_are_counted_under_other() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let metrics = Metrics::new().max_label_values(2);
        for name in ["b1", "b2", "b3", "b4", "b5", "b1"] {
            metrics.on_event(&Event::BreakerRejected {
                breaker: name,
                state: State::Open,
                retry_after: Some(Duration::from_secs(1)),
            });
        }
        for class in ["c1", "c2", "c3"] {
            metrics.on_event(&Event::AttemptEnded {
                attempt: 1,
                class: Some(Class::new(class)),
                code: Some(Code::Error),
                sent: tower_backstop::Sent::Yes,
                duration: Duration::ZERO,
            });
        }
    });
    let v = values(&snapshotter);
    let rejections: Vec<(&String, u64)> = v
        .iter()
        .filter(|(k, _)| k.starts_with("backstop_breaker_rejections_total"))
        .map(|(k, v)| match v {
            DebugValue::Counter(n) => (k, *n),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        rejections
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect::<Vec<_>>(),
        [
            ("backstop_breaker_rejections_total{breaker=b1}", 2),
            ("backstop_breaker_rejections_total{breaker=b2}", 1),
            ("backstop_breaker_rejections_total{breaker=other}", 3),
        ]
    );
    let classes: Vec<&String> = v
        .keys()
        .filter(|k| k.starts_with("backstop_attempts_total"))
        .collect();
    assert_eq!(classes.len(), 3, "c1, c2 and other: {classes:?}");
    assert_eq!(
        counter(&v, "backstop_attempts_total{class=other,processed=yes}"),
        1
    );
}

/// A recorder that counts registrations and updates, and forwards to a debugging recorder.
struct Counting {
    inner: DebuggingRecorder,
    registered: Arc<AtomicUsize>,
}

impl Recorder for Counting {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.registered.fetch_add(1, Ordering::Relaxed);
        self.inner.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.registered.fetch_add(1, Ordering::Relaxed);
        self.inner.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.registered.fetch_add(1, Ordering::Relaxed);
        self.inner.register_histogram(key, metadata)
    }
}

/// Handles are registered once per label set: the hundredth call registers nothing, so the
/// work inside a call is the handles' updates only, however slow the recorder's registration.
#[test]
fn handles_are_registered_once_per_label_set_not_per_call() {
    let registered = Arc::new(AtomicUsize::new(0));
    let recorder = Counting {
        inner: DebuggingRecorder::new(),
        registered: Arc::clone(&registered),
    };
    let snapshotter = recorder.inner.snapshotter();
    let after_first = run(&recorder, || async {
        let policy = RetryPolicy::new()
            .max_attempts(2)
            .backoff(no_jitter(10))
            .listener(Metrics::new());
        let svc = ServiceBuilder::new()
            .layer(policy.build().unwrap())
            .layer(ClassifyLayer::http())
            .service(Scripted::new(
                [status(200), status(503), status(503)],
                status(200),
            ));
        svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
        svc.clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
        let after_first = registered.load(Ordering::Relaxed);
        for _ in 0..100 {
            svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
        }
        (after_first, registered.load(Ordering::Relaxed))
    });
    assert!(after_first.0 > 0, "the first calls register their handles");
    assert_eq!(
        after_first.0, after_first.1,
        "a hundred more calls register nothing"
    );
    let v = values(&snapshotter);
    assert_eq!(
        counter(&v, "backstop_calls_total{outcome=success_without_retry}"),
        101
    );
}

#[test]
fn a_panicking_listener_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let svc = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .listener(|_: &Event<'_>| panic!("a listener's bug"))
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(Scripted::always(status(200)));
        let response = svc.oneshot(get("http://mail.test/")).await.unwrap();
        assert_eq!(response.status(), 200, "the call goes on");
    });
    let v = values(&snapshotter);
    assert_eq!(
        counter(&v, "backstop_listener_panics_total{event=attempt_ended}"),
        1
    );
}

/// With no recorder installed every handle is a no-op: the stack works as without metrics.
#[test]
fn without_a_recorder_nothing_is_recorded_and_calls_go_on() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(async {
            let breaker = BreakerLayer::builder()
                .consecutive_failures(1)
                .listener(Metrics::new())
                .build()
                .unwrap();
            let svc = ServiceBuilder::new()
                .layer(breaker)
                .layer(ClassifyLayer::http())
                .service(Scripted::always(status(503)));
            let first = svc
                .clone()
                .oneshot(get("http://mail.test/"))
                .await
                .unwrap_err();
            assert_eq!(first.class(), Class::TRANSIENT);
            let second = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
            assert_eq!(second.class(), Class::CIRCUIT_OPEN);
        });
}

/// In-process alerts set `backstop_alert_active{rule}`: 1 while an alert of the rule fires.
#[test]
fn an_alert_sets_its_rules_gauge_while_it_fires() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (firing, cleared) = run(&recorder, || async {
        let alerts = tower_backstop::observe::Alerts::new();
        let transition = |from, to| Event::BreakerTransition {
            breaker: "mail",
            from,
            to,
            reason: "test",
        };
        alerts.on_event(&transition(State::Closed, State::Open));
        let firing = values(&snapshotter);
        alerts.on_event(&transition(State::Open, State::HalfOpen));
        alerts.on_event(&transition(State::HalfOpen, State::Closed));
        (firing, values(&snapshotter))
    });
    assert_eq!(
        gauge(&firing, "backstop_alert_active{rule=breaker_open}"),
        1.0
    );
    assert_eq!(
        gauge(&cleared, "backstop_alert_active{rule=breaker_open}"),
        0.0
    );
}

/// An operator's re-drive: each record's outcome counted, resolved and failed apart.
#[test]
fn an_operators_redrive_is_counted_by_outcome() {
    use tower_backstop::resend::Redrive;
    use tower_backstop::store::Filter;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let report = run(&recorder, || async {
        let clock = Clock::tokio();
        let store = Arc::new(MemoryStore::new());
        for id in ["ok-1", "bad-1"] {
            let record = record_of(
                id.to_owned(),
                Envelope::new("{}")
                    .with_metadata("method", "POST")
                    .with_metadata("uri", format!("http://mail.test/{id}")),
                &Failure::<()>::new(
                    Class::TRANSIENT,
                    Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
                ),
            );
            store.put(record).await.unwrap();
        }
        let upstream = tower::service_fn(|req: http::Request<String>| async move {
            let status = if req.uri().path().starts_with("/ok") {
                200
            } else {
                503
            };
            Ok::<_, tower_backstop::BoxError>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        });
        let stack = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .service(upstream);
        Redrive::new(Filter::new().class("transient"), 100, 10)
            .unwrap()
            .clock(clock)
            .listener(Metrics::new())
            .run(&*store, stack, as_string_request)
            .await
            .unwrap()
    });
    assert_eq!((report.resolved(), report.failed()), (1, 1));
    let v = values(&snapshotter);
    assert_eq!(counter(&v, "backstop_redrives_total{outcome=resolved}"), 1);
    assert_eq!(counter(&v, "backstop_redrives_total{outcome=failed}"), 1);
}

/// A slow recorder: every update of its handles takes a lock and counts itself. A successful
/// call without retry updates exactly three handles (its attempt, the attempt's duration, the
/// call; no retries are recorded for a call without one, as gRFC A96) whatever the recorder
/// does, so the work a recorder adds to a call is bounded by three of its own updates.
#[test]
fn a_slow_recorder_costs_a_call_three_updates() {
    use metrics::{CounterFn, GaugeFn, HistogramFn};

    /// A handle whose every update goes through a mutex.
    struct Slow(Arc<Mutex<u64>>);
    impl CounterFn for Slow {
        fn increment(&self, _: u64) {
            *self.0.lock().unwrap() += 1;
        }
        fn absolute(&self, _: u64) {
            *self.0.lock().unwrap() += 1;
        }
    }
    impl GaugeFn for Slow {
        fn increment(&self, _: f64) {
            *self.0.lock().unwrap() += 1;
        }
        fn decrement(&self, _: f64) {
            *self.0.lock().unwrap() += 1;
        }
        fn set(&self, _: f64) {
            *self.0.lock().unwrap() += 1;
        }
    }
    impl HistogramFn for Slow {
        fn record(&self, _: f64) {
            *self.0.lock().unwrap() += 1;
        }
    }
    struct SlowRecorder(Arc<Mutex<u64>>);
    impl Recorder for SlowRecorder {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Slow(Arc::clone(&self.0))))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Slow(Arc::clone(&self.0))))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Slow(Arc::clone(&self.0))))
        }
    }

    let updates = Arc::new(Mutex::new(0_u64));
    let recorder = SlowRecorder(Arc::clone(&updates));
    let per_call = run(&recorder, || async {
        let svc = ServiceBuilder::new()
            .layer(RetryPolicy::new().listener(Metrics::new()).build().unwrap())
            .layer(ClassifyLayer::http())
            .service(Scripted::always(status(200)));
        svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
        let before = *updates.lock().unwrap();
        for _ in 0..10 {
            svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
        }
        (*updates.lock().unwrap() - before) / 10
    });
    assert_eq!(per_call, 3);
}

/// The send-rate gauges of a provider that throttled once and then gets no more calls: each
/// second the gauge reads what the breaker's handle (and so the health report) reads, not the
/// value of the last call; once the provider has been quiet for the lift time the gauge reads
/// NaN, with no call, and the peak gauge keeps the peak.
#[test]
fn send_rate_gauges_agree_with_the_breaker_and_expire_without_traffic() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let breaker = BreakerLayer::builder()
            .name("mail")
            .listener(Metrics::new())
            .build()
            .unwrap();
        let handle = breaker.handle();
        let svc = ServiceBuilder::new()
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(Scripted::new((0..20).map(|_| status(200)), status(429)));
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(50)).await;
            svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
        }
        svc.clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
        // The limit's first measure: a second.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let peak = handle.send_rate_peak().unwrap();
        let rate = "backstop_send_rate{breaker=mail}";
        let top = "backstop_send_rate_peak{breaker=mail}";
        // No call from here on: each second the gauge follows the rate the handle reads.
        for second in 1..=24 {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            let values = values(&snapshotter);
            let read = handle.send_rate().unwrap();
            let told = gauge(&values, rate);
            assert!(
                (told - read).abs() <= 0.01 * read,
                "second {second}: gauge {told}, handle {read}"
            );
            assert_eq!(gauge(&values, top), peak);
        }
        // Quiet for the lift time (30 s by default) with no call: NaN.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let values = values(&snapshotter);
        assert!(gauge(&values, rate).is_nan(), "{:?}", values.get(rate));
        assert_eq!(gauge(&values, top), peak);
        assert_eq!(handle.send_rate(), None);
    });
}

/// The crate's Prometheus builder renders every histogram as a histogram (buckets, sum and
/// count), not as the exporter's default summary, with the documented bucket boundaries.
#[cfg(feature = "prometheus")]
#[test]
fn the_prometheus_builder_renders_histograms_with_the_documented_buckets() {
    let recorder = tower_backstop::observe::prometheus_builder().build_recorder();
    let handle = recorder.handle();
    run(&recorder, || async {
        let metrics = Metrics::new();
        let svc = ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .max_attempts(3)
                    .backoff(no_jitter(20))
                    .listener(metrics)
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(Scripted::new([status(503)], status(200)));
        svc.oneshot(get("http://mail.test/")).await.unwrap();
    });
    let text = handle.render();
    assert!(!text.contains("quantile="), "a summary rendered:\n{text}");
    for (name, buckets) in tower_backstop::observe::HISTOGRAM_BUCKETS {
        assert!(
            text.contains(&format!("{name}_count")),
            "{name} missing:\n{text}"
        );
        let rendered = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
            .count();
        assert!(
            rendered > buckets.len(),
            "{name}: {rendered} bucket lines for {} bounds and +Inf:\n{text}",
            buckets.len()
        );
    }
    assert!(
        text.contains("backstop_retry_delay_seconds_bucket{source=\"backoff\",le=\"0.025\"} 1")
    );
    assert!(text.contains("backstop_call_retries_bucket{le=\"1\"} 1"));
}

/// A breaker that opened and then gets no more calls: at the end of its open duration it moves
/// to half-open by itself, so the state gauge (what the breaker-open alert reads) and the
/// handle agree with no traffic; the half-open wait counts from the first probe, so a call that
/// comes long after is sent as the probe, not taken for a hung one.
#[test]
fn a_breaker_with_no_more_calls_half_opens_on_time_and_its_gauge_says_so() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    run(&recorder, || async {
        let breaker = BreakerLayer::builder()
            .name("mail")
            .consecutive_failures(1)
            .open_for(Duration::from_secs(5))
            .max_half_open(Duration::from_secs(2))
            .listener(Metrics::new())
            .build()
            .unwrap();
        let handle = breaker.handle();
        let upstream = Scripted::new([status(503)], status(200));
        let svc = ServiceBuilder::new()
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(upstream.clone());
        svc.clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
        let state = |values: &BTreeMap<String, DebugValue>, s: &str| {
            gauge(
                values,
                &format!("backstop_breaker_state{{breaker=mail,state={s}}}"),
            )
        };
        tokio::time::sleep(Duration::from_millis(4_999)).await;
        let read = values(&snapshotter);
        assert_eq!(state(&read, "open"), 1.0);
        assert_eq!(handle.state(), State::Open);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let read = values(&snapshotter);
        assert_eq!(state(&read, "open"), 0.0);
        assert_eq!(state(&read, "half_open"), 1.0);
        assert_eq!(handle.state(), State::HalfOpen);
        // Long past the half-open wait: the next call is the probe, and it closes the breaker.
        tokio::time::sleep(Duration::from_secs(60)).await;
        svc.oneshot(get("http://mail.test/")).await.unwrap();
        assert_eq!(upstream.calls(), 2);
        assert_eq!(handle.state(), State::Closed);
        assert_eq!(state(&values(&snapshotter), "closed"), 1.0);
    });
}
