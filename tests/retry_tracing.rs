//! The retry layer's `tracing` events. Alone in its own test binary: `tracing` caches each
//! callsite's interest process-wide, so a thread-local subscriber set while other tests run on
//! other threads can miss events.

mod support;

use support::{Scripted, get, no_jitter, retry_stack as stack, status, status_with};
use tower::ServiceExt;
use tower_backstop::retry::RetryPolicy;

#[tokio::test(start_paused = true)]
async fn every_retry_give_up_and_deferral_is_traced() {
    let logs = support::LogCapture::start(tracing::Level::INFO);

    let upstream = Scripted::new([status(503)], status_with(429, "retry-after", "3600"));
    let _ = stack(RetryPolicy::new().backoff(no_jitter(100)), &upstream)
        .oneshot(get("/"))
        .await;
    let upstream = Scripted::always(status(404));
    let _ = stack(RetryPolicy::new(), &upstream).oneshot(get("/")).await;

    // A body over the replay buffer: the skipped retry is said at INFO, with its cause.
    let over = tower::ServiceBuilder::new()
        .layer(tower_backstop::retry::ReplayBufferLayer::new(8))
        .layer(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(tower::service_fn(|_: http::Request<_>| async {
            Ok::<_, tower_backstop::BoxError>(
                http::Response::builder().status(503).body(()).unwrap(),
            )
        }));
    let request = http::Request::put("http://mail.test/")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"far more than eight bytes",
        )))
        .unwrap();
    let _ = over.oneshot(request).await;

    let log = logs.text();
    let skipped = log
        .lines()
        .find(|l| l.contains("retry skipped"))
        .expect(&log);
    for field in [
        " INFO ",
        "attempts=1",
        "code=http 503",
        "over the replay buffer limit",
    ] {
        assert!(skipped.contains(field), "{field} in {skipped}");
    }
    let retry = log.lines().find(|l| l.contains("retrying")).expect(&log);
    for field in [
        "attempt=1",
        "class=transient",
        "code=http 503",
        "delay=100ms",
        "why=\"backoff\"",
    ] {
        assert!(retry.contains(field), "{field} in {retry}");
    }
    let deferral = log.lines().find(|l| l.contains("deferring")).expect(&log);
    for field in [
        "attempts=2",
        "class=throttled",
        "code=http 429",
        "delay=3600s",
        "retry_at=",
    ] {
        assert!(deferral.contains(field), "{field} in {deferral}");
    }
    let give_up = log.lines().find(|l| l.contains("giving up")).expect(&log);
    for field in [
        "attempts=1",
        "class=permanent",
        "code=http 404",
        "reason=\"class not retried\"",
    ] {
        assert!(give_up.contains(field), "{field} in {give_up}");
    }
    drop(logs);

    // A breaker rejection's deferral is said at DEBUG (the breaker said at WARN that it
    // opened), without the delay of a long hint.
    let logs = support::LogCapture::start(tracing::Level::DEBUG);
    let rejecting = tower::ServiceBuilder::new()
        .layer(RetryPolicy::new().build().unwrap())
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(tower::service_fn(|_: http::Request<String>| async {
            let open = tower_backstop::Failure::<()>::new(
                tower_backstop::Class::CIRCUIT_OPEN,
                tower_backstop::Code::CircuitOpen,
            )
            .with_retry_after(std::time::Duration::from_secs(30));
            Err::<http::Response<()>, tower_backstop::BoxError>(Box::new(open))
        }));
    let _ = rejecting.oneshot(get("/")).await;
    let log = logs.text();
    let deferral = log.lines().find(|l| l.contains("deferring")).expect(&log);
    for field in [" DEBUG ", "attempts=0", "the breaker is open", "retry_at="] {
        assert!(deferral.contains(field), "{field} in {deferral}");
    }
    assert!(!deferral.contains("delay="), "{deferral}");
}
