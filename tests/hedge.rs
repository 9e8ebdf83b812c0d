//! Hedging (`RetryPolicy::hedge`): a copy of a slow request that is safe to send twice, the
//! first answer wins and the rest are cancelled, bounded by the copies, the attempts, the
//! budget and the server's pushback. Paused clock and a scripted in-process upstream; then a
//! real loopback server with a long latency tail and a hyper-util client.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{
    Scripted, Step, get, no_jitter, post, post_with_key, retry_stack, status, status_with,
};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_backstop::Class;
use tower_backstop::observe::Event;
use tower_backstop::retry::{Attempts, Budget, GiveUp, RetryPolicy};

fn after(ms: u64, step: Step) -> Step {
    Step::After(Duration::from_millis(ms), Box::new(step))
}

fn hedged(copies: u32) -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(5)
        .backoff(no_jitter(50))
        .hedge(Duration::from_millis(100), copies)
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_gets_a_copy_and_the_first_answer_wins() {
    // The first attempt would take 1 s; the copy, sent at 100 ms, answers 10 ms later.
    let upstream = Scripted::new([after(1_000, status(200))], after(10, status(200)));
    let start = Instant::now();
    let response = retry_stack(hedged(1), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(110));
    // Two sent, one finished: the slow one was cancelled (its future dropped).
    assert_eq!((upstream.calls(), upstream.finished()), (2, 1));
    let seen = upstream.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn the_first_attempt_still_wins_when_it_answers_first() {
    // The copy goes at 100 ms and would take 500 ms; the first answers at 150 ms.
    let upstream = Scripted::new([after(150, status(200))], after(500, status(200)));
    let start = Instant::now();
    retry_stack(hedged(1), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(150));
    assert_eq!((upstream.calls(), upstream.finished()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_fast_answer_sends_no_copy() {
    let upstream = Scripted::always(after(99, status(200)));
    retry_stack(hedged(2), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn requests_not_safe_to_send_twice_are_never_hedged() {
    let upstream = Scripted::always(after(1_000, status(200)));
    let start = Instant::now();
    retry_stack(hedged(2), &upstream)
        .oneshot(post("http://api.test/send", "{}"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(upstream.calls(), 1);
    // With an idempotency key, it is.
    let upstream = Scripted::new([after(1_000, status(200))], after(10, status(200)));
    retry_stack(hedged(1), &upstream)
        .oneshot(post_with_key("http://api.test/send", "{}", "k-1"))
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 2);
    let seen = upstream.seen();
    assert_eq!(seen[0].key, seen[1].key, "the copy carries the same key");
    assert_eq!(seen[1].body, "{}");
}

#[tokio::test(start_paused = true)]
async fn copies_are_bounded_by_max_copies_and_by_max_attempts() {
    // Every attempt takes 1 s: copies at 100 and 200 ms, then no more.
    let upstream = Scripted::always(after(1_000, status(200)));
    let start = Instant::now();
    retry_stack(hedged(2), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!((upstream.calls(), upstream.finished()), (3, 1));
    // Four copies allowed, but two attempts in all.
    let upstream = Scripted::always(after(1_000, status(200)));
    retry_stack(
        RetryPolicy::new()
            .max_attempts(2)
            .hedge(Duration::from_millis(100), 4),
        &upstream,
    )
    .oneshot(get("http://api.test/"))
    .await
    .unwrap();
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_sends_no_copy() {
    let upstream = Scripted::always(after(1_000, status(200)));
    let policy = hedged(2).budget(Budget::ratio(0.0, 0, Duration::from_secs(10)).unwrap());
    retry_stack(policy, &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_copy_the_budget_refused_is_not_tried_again_in_the_call() {
    // Each first attempt adds half a retry. The slow call's own half is not enough at 100 ms:
    // hedging stops for that call. A second call at 150 ms makes the budget one retry, which
    // the slow call does not take: it is never hedged, and answers at 1 s.
    let upstream = Scripted::new([after(1_000, status(200))], status(200));
    let policy = hedged(3).budget(Budget::ratio(0.5, 0, Duration::from_secs(10)).unwrap());
    let svc = retry_stack(policy, &upstream);
    let start = Instant::now();
    let slow = tokio::spawn(svc.clone().oneshot(get("http://api.test/slow")));
    tokio::time::sleep(Duration::from_millis(150)).await;
    svc.oneshot(get("http://api.test/fast")).await.unwrap();
    slow.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let sent: Vec<_> = upstream.seen().iter().map(|s| s.at - start).collect();
    assert_eq!(sent, [Duration::ZERO, Duration::from_millis(150)]);
}

#[tokio::test(start_paused = true)]
async fn a_servers_pushback_stops_the_copies() {
    // The first copy is throttled at once with Retry-After: no second copy; the first attempt
    // answers at 1 s.
    let upstream = Scripted::new(
        [
            after(1_000, status(200)),
            status_with(429, "retry-after", "5"),
        ],
        after(10, status(200)),
    );
    let start = Instant::now();
    let response = retry_stack(hedged(3), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn any_hint_or_a_throttled_answer_is_pushback() {
    // A 503 with Retry-After (a hint, not throttled), and a 429 without one (throttled, no
    // hint): either stops the copies; the first attempt's answer at 1 s is the call's.
    for pushback in [status_with(503, "retry-after", "5"), status(429)] {
        let upstream = Scripted::new(
            [after(1_000, status(200)), pushback.clone()],
            after(10, status(200)),
        );
        let start = Instant::now();
        retry_stack(hedged(3), &upstream)
            .oneshot(get("http://api.test/"))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{pushback:?}");
        assert_eq!(upstream.calls(), 2, "{pushback:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn every_slot_of_four_copies_keeps_its_own_copy() {
    // Four copies out at once (sent at 100, 200, 300 and 400 ms); the one that answers first is
    // in turn the first, second, third and fourth copy, 350 ms after it was sent.
    for fast in 1..=4u64 {
        let steps = (0..5).map(|i| {
            if i == fast {
                after(350, status(200))
            } else {
                after(5_000, status(200))
            }
        });
        let upstream = Scripted::new(steps, status(200));
        let start = Instant::now();
        retry_stack(hedged(4), &upstream)
            .oneshot(get("http://api.test/"))
            .await
            .unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(100 * fast + 350),
            "copy {fast}"
        );
        assert_eq!(
            (upstream.calls(), upstream.finished()),
            (5, 1),
            "copy {fast}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_rejected_copy_is_not_an_attempt() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower_backstop::{BoxError, Code, Failure};

    // The first attempt fails with a 503 at 1 s; its copy, at 100 ms, is rejected by a breaker
    // below (a local rejection, never sent); then the one retry left is delivered.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let upstream = tower::service_fn(move |_: http::Request<String>| {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut response = http::Response::new(());
            match n {
                0 => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                }
                1 => {
                    let open = Failure::<()>::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
                    return Err::<http::Response<()>, BoxError>(Box::new(open));
                }
                _ => {}
            }
            Ok(response)
        }
    });
    let svc = tower::ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(2)
                .backoff(no_jitter(50))
                .hedge(Duration::from_millis(100), 1)
                .build()
                .unwrap(),
        )
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(upstream);
    let response = svc.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(Ordering::Relaxed), 3);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_hedged_call_and_no_copy_goes_after_it() {
    // Every attempt would take 5 s; copies at 200 ms and 400 ms (the delay is 200 ms), the
    // deadline at 450 ms: two copies, then the deadline ends the call, before a third.
    let upstream = Scripted::always(after(5_000, status(200)));
    let start = Instant::now();
    let failure = retry_stack(
        RetryPolicy::new()
            .max_attempts(5)
            .deadline(Duration::from_millis(450))
            .hedge(Duration::from_millis(200), 4),
        &upstream,
    )
    .oneshot(get("http://api.test/"))
    .await
    .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(450));
    assert_eq!(
        failure.note::<Attempts>().map(|a| (a.count(), a.give_up())),
        Some((3, GiveUp::DeadlineExceeded))
    );
    let seen = upstream.seen();
    let sent: Vec<_> = seen.iter().map(|s| s.at - start).collect();
    assert_eq!(
        sent,
        [
            Duration::ZERO,
            Duration::from_millis(200),
            Duration::from_millis(400)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_fatal_answer_of_a_copy_ends_the_call() {
    // The copy is answered 400 (permanent, never retried): the call ends with it at once, and
    // the first attempt is cancelled.
    let upstream = Scripted::new([after(1_000, status(200)), status(400)], status(200));
    let start = Instant::now();
    let failure = retry_stack(hedged(2), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::PERMANENT);
    assert_eq!(
        failure.note::<Attempts>().map(|a| (a.count(), a.give_up())),
        Some((2, GiveUp::NotRetryable))
    );
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!((upstream.calls(), upstream.finished()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_is_set_aside_while_a_copy_is_out() {
    // The first attempt fails with a 503 at 150 ms, while the copy (sent at 100 ms) is out:
    // the copy's answer at 300 ms is the call's.
    let upstream = Scripted::new([after(150, status(503))], after(200, status(200)));
    let start = Instant::now();
    let response = retry_stack(hedged(1), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_returns_the_failure_set_aside() {
    // The first attempt fails with a 503 at 150 ms while its copy (sent at 100 ms) is out; the
    // deadline ends the call at 300 ms: its failure is that 503, the last real one.
    let upstream = Scripted::new([after(150, status(503))], after(5_000, status(200)));
    let failure = retry_stack(hedged(1).deadline(Duration::from_millis(300)), &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap_err();
    assert_eq!(
        failure.code(),
        tower_backstop::Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        failure.note::<Attempts>().map(|a| (a.count(), a.give_up())),
        Some((2, GiveUp::DeadlineExceeded))
    );
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_out_fails_the_retry_rules_apply() {
    // Both fail (503 at 200 ms and at 250 ms); the backoff after the second failed attempt is
    // 100 ms (50 ms doubled), then the third attempt answers at once.
    let upstream = Scripted::new(
        [after(200, status(503)), after(150, status(503))],
        status(200),
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let policy = RetryPolicy::new()
        .max_attempts(3)
        .backoff(no_jitter(50))
        .hedge(Duration::from_millis(100), 1)
        .listener(move |e: &Event<'_>| match e {
            Event::HedgeSent { attempt, after } => seen
                .lock()
                .unwrap()
                .push(format!("hedge {attempt} after {after:?}")),
            Event::AttemptEnded { attempt, class, .. } => seen.lock().unwrap().push(format!(
                "ended {attempt} {}",
                class.map_or("success", |c| c.name())
            )),
            Event::RetryScheduled { attempt, delay, .. } => seen
                .lock()
                .unwrap()
                .push(format!("retry after {attempt} in {delay:?}")),
            _ => {}
        });
    let start = Instant::now();
    retry_stack(policy, &upstream)
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(350));
    assert_eq!(upstream.calls(), 3);
    assert_eq!(
        *events.lock().unwrap(),
        [
            "hedge 2 after 100ms",
            "ended 1 transient",
            "ended 2 transient",
            "retry after 2 in 100ms",
            "ended 3 success",
        ]
    );
}

#[test]
fn bad_hedging_settings_are_build_errors() {
    let err = |p: RetryPolicy| p.build().unwrap_err();
    let e = err(RetryPolicy::new().hedge(Duration::ZERO, 1));
    assert_eq!(e.setting(), "hedge(delay)");
    let e = err(RetryPolicy::new()
        .deadline(Duration::from_secs(1))
        .hedge(Duration::from_secs(1), 1));
    assert_eq!(e.setting(), "hedge(delay)");
    assert!(
        e.to_string()
            .ends_with("not below the deadline, so no copy could ever be sent"),
        "{e}"
    );
    for copies in [0, 5, 100] {
        let e = err(RetryPolicy::new().hedge(Duration::from_millis(50), copies));
        assert_eq!(e.setting(), "hedge(max_copies)", "{copies}");
        assert!(e.to_string().contains(&format!("is {copies}:")), "{e}");
    }
    RetryPolicy::new()
        .deadline(Duration::from_secs(1))
        .hedge(Duration::from_millis(999), 4)
        .build()
        .unwrap();
}

/// A real axum server on 127.0.0.1 whose every tenth request takes 300 ms (the others answer
/// at once), called through a hyper-util client: with hedging after 30 ms, the slowest calls
/// are the copies' answers, and no call sends more than two requests.
#[tokio::test]
async fn over_a_real_server_hedging_cuts_the_latency_tail() {
    use std::sync::atomic::{AtomicU64, Ordering};

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::ServiceBuilder;
    use tower_backstop::BackstopLayer;

    let requests = Arc::new(AtomicU64::new(0));
    let counter = requests.clone();
    let app = axum::Router::new().route(
        "/item",
        axum::routing::get(move || {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            async move {
                if n.is_multiple_of(10) {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                "item"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let run = |policy: RetryPolicy| {
        let client = client.clone();
        async move {
            let svc = ServiceBuilder::new()
                .layer(BackstopLayer::http(Duration::from_secs(5)).retry(policy.build().unwrap()))
                .service(client);
            let mut latencies = Vec::new();
            for _ in 0..100 {
                let request = http::Request::get(format!("http://{addr}/item"))
                    .body(Full::default())
                    .unwrap();
                let start = std::time::Instant::now();
                let response = svc.clone().oneshot(request).await.unwrap();
                assert_eq!(response.status(), 200);
                latencies.push(start.elapsed());
            }
            latencies.sort();
            latencies[98]
        }
    };
    let p99_plain = run(RetryPolicy::new()).await;
    let before = requests.load(Ordering::Relaxed);
    assert_eq!(before, 100);
    let p99_hedged = run(RetryPolicy::new().hedge(Duration::from_millis(30), 1)).await;
    let sent = requests.load(Ordering::Relaxed) - before;
    assert!(p99_plain >= Duration::from_millis(300), "{p99_plain:?}");
    // A slow request's copy answers about 30 ms after it left: the tail is a tenth or less.
    assert!(
        p99_hedged * 3 < p99_plain,
        "p99 without hedging {p99_plain:?}, with {p99_hedged:?}"
    );
    assert!((101..=200).contains(&sent), "{sent} requests for 100 calls");
}
