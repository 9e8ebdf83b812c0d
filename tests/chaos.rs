//! Fault injection (`chaos`, feature `chaos`): each fault reaches the stack above as the real
//! one would (paused clock, in-process upstream), draws repeat with a seed, the switch and the
//! predicate hold, bad rates are build errors; and over a real loopback server with a
//! hyper-util client, the injected share never reaches the server.
#![cfg(feature = "chaos")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::{Scripted, get, post, status};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::chaos::{ChaosLayer, Fault};
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::retry::{Attempts, Backoff, GiveUp, Jitter, RetryPolicy};
use tower_backstop::store::{MemoryStore, Store};
use tower_backstop::{BackstopLayer, Class, Code, Sent};

fn no_jitter() -> Backoff {
    Backoff::constant(Duration::from_millis(100)).jitter(Jitter::None)
}

fn always(fault: Fault) -> ChaosLayer {
    ChaosLayer::builder()
        .fault(1.0, fault)
        .seed(1)
        .enabled(true)
        .build()
        .unwrap()
}

/// The example of the docs: a user's stack (the preset with a store) proven to retry, open its
/// breaker and dead-letter under a provider that answers 503 to everything, without a faulty
/// server.
#[tokio::test(start_paused = true)]
async fn a_users_stack_retries_opens_its_breaker_and_dead_letters() {
    let store = Arc::new(MemoryStore::new());
    let breaker = BreakerLayer::builder()
        .consecutive_failures(4)
        .open_for(Duration::from_secs(30))
        .per_host()
        .build()
        .unwrap();
    let health = breaker.health();
    let stack = BackstopLayer::http(Duration::from_secs(1))
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(no_jitter())
                .build()
                .unwrap(),
        )
        .breaker(breaker)
        .dead_letters(DeadLetterLayer::from_arc(store.clone()));
    let chaos = always(Fault::status(503));
    let handle = chaos.handle();
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new()
        .layer(stack)
        .layer(chaos)
        .service(upstream.clone());

    // First request: three attempts, each a 503, then a dead letter.
    let failure = svc
        .clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(
        (failure.class(), failure.code()),
        (Class::TRANSIENT, Code::Http(503.try_into().unwrap()))
    );
    assert_eq!(failure.note::<Attempts>().map(Attempts::count), Some(3));
    assert_eq!(handle.injected(), 3);
    // Second request: the fourth 503 in a row opens the breaker; the retry meets it open.
    let failure = svc
        .clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(handle.injected(), 4);
    assert_eq!(failure.class(), Class::CIRCUIT_OPEN);
    let open: Vec<_> = health
        .report()
        .breakers
        .iter()
        .filter(|b| b.state == State::Open)
        .map(|b| b.name.clone())
        .collect();
    assert_eq!(open, ["mail.test:80"]);
    // Both requests are in the store; the provider itself never saw one.
    let records = store.list(10).await.unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records.iter().filter(|r| r.class == "transient").count(), 1);
    assert_eq!(upstream.calls(), 0);

    // Switched off, the same stack delivers (once the breaker lets calls through again).
    handle.disable();
    tokio::time::sleep(Duration::from_secs(31)).await;
    let response = svc.oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.calls(), 1);
    assert_eq!(handle.injected(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_is_waited_as_the_server_asked() {
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(RetryPolicy::new().max_attempts(2).build().unwrap()),
        )
        .layer(always(Fault::throttled(Duration::from_secs(2))))
        .service(Scripted::always(status(200)));
    let start = Instant::now();
    let failure = svc.oneshot(get("http://api.test/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::THROTTLED);
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(2)));
    // One wait of exactly the hint between the two attempts.
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn latency_delays_the_real_call_and_a_stall_meets_the_timeout() {
    let stack = || {
        BackstopLayer::http(Duration::from_secs(1)).retry(
            RetryPolicy::new()
                .max_attempts(2)
                .backoff(no_jitter())
                .build()
                .unwrap(),
        )
    };
    // 300 ms of added latency, under the 1 s timeout: delivered, 300 ms late, one call.
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new()
        .layer(stack())
        .layer(always(Fault::Latency(Duration::from_millis(300))))
        .service(upstream.clone());
    let start = Instant::now();
    svc.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!((upstream.calls(), upstream.finished()), (1, 1));
    // 5 s of latency: each attempt times out before the inner future is ever polled.
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new()
        .layer(stack())
        .layer(always(Fault::Latency(Duration::from_secs(5))))
        .service(upstream.clone());
    let start = Instant::now();
    let failure = svc.oneshot(get("http://api.test/")).await.unwrap_err();
    assert_eq!(
        (failure.class(), failure.code()),
        (Class::TRANSIENT, Code::Timeout)
    );
    assert_eq!(start.elapsed(), Duration::from_millis(2_100));
    assert_eq!((upstream.calls(), upstream.finished()), (2, 0));
    // A stall: two attempt timeouts and the backoff between them; the inner service is never
    // called.
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new()
        .layer(stack())
        .layer(always(Fault::Stall))
        .service(upstream.clone());
    let start = Instant::now();
    let failure = svc.oneshot(get("http://api.test/")).await.unwrap_err();
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(failure.note::<Attempts>().map(Attempts::count), Some(2));
    assert_eq!(start.elapsed(), Duration::from_millis(2_100));
    assert_eq!(upstream.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_reset_and_a_refusal_are_told_apart_for_a_keyless_post() {
    let stack = || {
        BackstopLayer::http(Duration::from_secs(1)).retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(no_jitter())
                .build()
                .unwrap(),
        )
    };
    // A reset after the POST left: it may have been processed, so it is not sent again.
    let chaos = always(Fault::Reset);
    let handle = chaos.handle();
    let svc = ServiceBuilder::new()
        .layer(stack())
        .layer(chaos)
        .service(Scripted::always(status(200)));
    let failure = svc
        .oneshot(post("http://api.test/send", "{}"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(failure.sent(), Sent::Maybe);
    assert_eq!(handle.injected(), 1);
    // A refused connection: certainly not processed, so it is retried to the cap.
    let chaos = always(Fault::Refused);
    let handle = chaos.handle();
    let svc = ServiceBuilder::new()
        .layer(stack())
        .layer(chaos)
        .service(Scripted::always(status(200)));
    let failure = svc
        .oneshot(post("http://api.test/send", "{}"))
        .await
        .unwrap_err();
    assert_eq!(
        (failure.class(), failure.code()),
        (
            Class::TRANSIENT,
            Code::Io(std::io::ErrorKind::ConnectionRefused)
        )
    );
    assert_eq!(failure.sent(), Sent::No);
    assert_eq!(handle.injected(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_error_of_a_class_keeps_its_class() {
    let chaos = always(Fault::error(Class::PERMANENT));
    let handle = chaos.handle();
    let svc = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_secs(1)))
        .layer(chaos)
        .service(Scripted::always(status(200)));
    let failure = svc.oneshot(get("http://api.test/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::PERMANENT);
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(handle.injected(), 1);
    let source = std::error::Error::source(&failure).map(ToString::to_string);
    assert!(
        source.is_some_and(|s| s.contains("injected by ChaosLayer")),
        "the failure says where it came from: {failure:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn off_until_enabled_and_only_for_selected_requests() {
    let chaos = ChaosLayer::builder()
        .fault(1.0, Fault::status(500))
        .seed(3)
        .when(|req: &http::Request<String>| req.uri().path() == "/flaky")
        .build()
        .unwrap();
    let handle = chaos.handle();
    let upstream = Scripted::always(status(200));
    let svc = ServiceBuilder::new().layer(chaos).service(upstream.clone());
    // Built disabled: everything passes and nothing is drawn.
    let response = svc
        .clone()
        .oneshot(get("http://api.test/flaky"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!((handle.drawn(), handle.injected()), (0, 0));
    assert!(!handle.is_enabled());
    handle.enable();
    let response = svc
        .clone()
        .oneshot(get("http://api.test/flaky"))
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    assert!(
        response.into_body().into_inner().is_none(),
        "an injected answer has an empty body"
    );
    // Another path is not selected: it passes and draws nothing.
    let response = svc.oneshot(get("http://api.test/steady")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.into_body().into_inner().is_some());
    assert_eq!((handle.drawn(), handle.injected()), (1, 1));
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_seed_repeats_the_faults_request_for_request() {
    let run = |seed| async move {
        let chaos = ChaosLayer::builder()
            .fault(0.2, Fault::status(503))
            .fault(0.1, Fault::Reset)
            .seed(seed)
            .enabled(true)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(chaos)
            .service(Scripted::always(status(200)));
        let mut outcomes = Vec::new();
        for _ in 0..200 {
            outcomes.push(match svc.clone().oneshot(get("http://api.test/")).await {
                Ok(response) => response.status().as_u16(),
                Err(_) => 0,
            });
        }
        outcomes
    };
    let first = run(11).await;
    assert_eq!(first, run(11).await);
    assert_ne!(first, run(12).await);
    let count = |code| first.iter().filter(|&&c| c == code).count();
    // 40 503s and 20 resets expected of 200; the bands are about 3 standard deviations.
    assert!((22..=58).contains(&count(503)), "{}", count(503));
    assert!((7..=33).contains(&count(0)), "{}", count(0));
    assert_eq!(count(200) + count(503) + count(0), 200);
}

#[test]
fn bad_rates_and_statuses_are_build_errors() {
    let err = |b: tower_backstop::chaos::ChaosBuilder| b.build().unwrap_err();
    for rate in [1.5, -0.1, f64::NAN, f64::INFINITY] {
        let e = err(ChaosLayer::builder().fault(rate, Fault::Reset));
        assert_eq!(e.setting(), "fault", "{rate}");
        assert!(
            e.to_string()
                .ends_with("a fault's rate must be within [0.0, 1.0]"),
            "{e}"
        );
    }
    let e = err(ChaosLayer::builder()
        .fault(0.6, Fault::Reset)
        .fault(0.5, Fault::status(503)));
    assert_eq!(
        e.to_string(),
        "invalid configuration: `fault` is 1.1: the faults' rates add up to more than 1.0"
    );
    let e = err(ChaosLayer::builder().fault(0.5, Fault::status(1000)));
    assert_eq!(e.setting(), "Fault::status");
    let e = err(ChaosLayer::builder().fault(0.5, Fault::status(42)));
    assert_eq!(e.setting(), "Fault::status");
    let e = err(ChaosLayer::builder());
    assert_eq!(e.setting(), "fault");
    // The bounds themselves are valid.
    ChaosLayer::builder()
        .fault(0.0, Fault::Reset)
        .build()
        .unwrap();
    ChaosLayer::builder()
        .fault(0.7, Fault::Reset)
        .fault(0.3, Fault::status(999))
        .build()
        .unwrap();
}

/// Over a real axum server on 127.0.0.1 and a hyper-util client (whose body type the layer
/// wraps): every request is delivered by retries, and the server sees exactly the attempts
/// that drew no fault.
#[tokio::test]
async fn over_a_real_client_the_injected_share_never_reaches_the_server() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    let app = axum::Router::new().route(
        "/send",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                "accepted"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let chaos = ChaosLayer::builder()
        .fault(0.3, Fault::status(503))
        .fault(0.1, Fault::Refused)
        .seed(5)
        .enabled(true)
        .build()
        .unwrap();
    let handle = chaos.handle();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(
            BackstopLayer::http(Duration::from_secs(2)).retry(
                RetryPolicy::new()
                    .max_attempts(10)
                    .backoff(Backoff::constant(Duration::from_millis(1)))
                    .build()
                    .unwrap(),
            ),
        )
        .layer(chaos)
        .service(client);
    for n in 0..30 {
        let request = http::Request::post(format!("http://{addr}/send"))
            .header("idempotency-key", format!("m-{n}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = svc.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"accepted");
    }
    assert!(handle.injected() > 0);
    assert_eq!(seen.load(Ordering::Relaxed), 30);
    assert_eq!(handle.drawn() - handle.injected(), 30);
}
