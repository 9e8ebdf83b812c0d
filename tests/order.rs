//! Layer order: each wrong order the compiler cannot reject is reported once, when the stack is
//! built, by a `tracing` warning that names the misplaced or missing layer and the fix; the right
//! order (by hand or by `BackstopLayer`) says nothing. In a binary of its own: it captures logs.
//! With the `hyper-util` feature, a layer of ours directly over the client compiles in any order.
#![cfg(feature = "hyper-util")]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_backstop::BackstopLayer;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::{BufferResponseLayer, ClassifyLayer};
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::retry::{ReplayBufferLayer, RetryLayer};
use tower_backstop::store::MemoryStore;
use tower_backstop::timeout::TimeoutLayer;

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Compiles only when `svc` is a service of the client's requests.
fn is_a_service<S: tower::Service<http::Request<Full<Bytes>>>>(_: &S) {}

/// The warnings logged while `build` runs.
fn warnings(build: impl FnOnce()) -> String {
    let logs = support::LogCapture::start(tracing::Level::WARN);
    build();
    logs.text()
}

#[tokio::test]
async fn each_wrong_order_is_named_when_the_stack_is_built() {
    let right = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .layer(RetryLayer::default())
            .layer(BreakerLayer::consecutive_failures(5))
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    assert!(!right.contains("layer order"), "{right}");

    let classify_above_retry = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(RetryLayer::default())
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        classify_above_retry.contains("ClassifyLayer is above RetryLayer"),
        "{classify_above_retry}"
    );

    // Directly over the client, too: the stack is a service (it compiles and can be called),
    // and the order is named.
    let classify_above_retry_over_client = warnings(|| {
        let svc = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(RetryLayer::default())
            .service(client());
        is_a_service(&svc);
    });
    assert!(
        classify_above_retry_over_client.contains("ClassifyLayer is above RetryLayer"),
        "{classify_above_retry_over_client}"
    );

    let no_classify = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    let no_classify_over_client = warnings(|| {
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .service(client());
        is_a_service(&svc);
    });
    assert!(
        no_classify_over_client.contains("no ClassifyLayer below this layer"),
        "{no_classify_over_client}"
    );
    assert!(
        no_classify.contains("no ClassifyLayer below this layer"),
        "{no_classify}"
    );

    let dead_letter_below_retry = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .layer(ClassifyLayer::http())
            .service(client());
    });
    assert!(
        dead_letter_below_retry.contains("DeadLetterLayer is below RetryLayer"),
        "{dead_letter_below_retry}"
    );

    #[cfg(feature = "reqwest")]
    {
        fn is_a_reqwest_service<S: tower::Service<reqwest::Request>>(_: &S) {}
        let reqwest_without_classify = warnings(|| {
            let svc = ServiceBuilder::new()
                .layer(RetryLayer::default())
                .layer(BreakerLayer::consecutive_failures(5))
                .service(reqwest::Client::new());
            is_a_reqwest_service(&svc);
        });
        assert!(
            reqwest_without_classify.contains("no ClassifyLayer"),
            "{reqwest_without_classify}"
        );
    }
    let tonic_without_classify = warnings(|| {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let _ = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .service(channel);
    });
    assert!(
        tonic_without_classify.contains("no ClassifyLayer"),
        "{tonic_without_classify}"
    );
}

#[tokio::test]
async fn a_scheduler_over_a_bare_client_is_named() {
    use std::sync::Arc;
    use tower_backstop::resend::{Scheduler, http_request};
    use tower_backstop::store::Store;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());

    // A bare client: a 503 would count as delivered.
    let bare = warnings(|| {
        let _ = Scheduler::new(Arc::clone(&store), client(), |r| http_request(r, None));
    });
    assert!(
        bare.contains("the service records are re-sent through has no ClassifyLayer"),
        "{bare}"
    );

    // The stack the calls go through: nothing to say.
    let stack = warnings(|| {
        let svc = ServiceBuilder::new()
            .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
            .layer(RetryLayer::default())
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
        let _ = Scheduler::new(Arc::clone(&store), svc, |r| http_request(r, None));
    });
    assert!(!stack.contains("layer order"), "{stack}");
}

#[tokio::test]
async fn classify_above_any_layer_that_reads_classes_is_named() {
    let above_breaker = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(BreakerLayer::consecutive_failures(5))
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        above_breaker
            .contains("ClassifyLayer is above RetryLayer, BreakerLayer or DeadLetterLayer"),
        "{above_breaker}"
    );
    let above_keyed_breaker = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(BreakerLayer::consecutive_failures(5).per_host())
            .service(client());
    });
    assert!(
        above_keyed_breaker.contains("ClassifyLayer is above"),
        "{above_keyed_breaker}"
    );
    let above_dead_letter = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .service(client());
    });
    assert!(
        above_dead_letter.contains("ClassifyLayer is above"),
        "{above_dead_letter}"
    );
    // The preset classifies already.
    let above_preset = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(BackstopLayer::http(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        above_preset.contains("ClassifyLayer is above"),
        "{above_preset}"
    );
}

#[tokio::test]
async fn dead_letter_below_the_breaker_is_named() {
    let below_breaker = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(BreakerLayer::consecutive_failures(5))
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .layer(ClassifyLayer::http())
            .service(client());
    });
    assert!(
        below_breaker.contains("DeadLetterLayer is below RetryLayer or BreakerLayer"),
        "{below_breaker}"
    );
}

#[tokio::test]
async fn each_layer_over_a_bare_client_is_named() {
    let breaker = warnings(|| {
        let svc = ServiceBuilder::new()
            .layer(BreakerLayer::consecutive_failures(5))
            .service(client());
        is_a_service(&svc);
    });
    assert!(
        breaker.contains("no ClassifyLayer below this layer"),
        "{breaker}"
    );
    let dead_letter = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        dead_letter.contains("no ClassifyLayer below this layer"),
        "{dead_letter}"
    );
    // The preset around the same client says nothing.
    let preset = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(BackstopLayer::http(Duration::from_secs(2)))
            .service(client());
    });
    assert!(!preset.contains("layer order"), "{preset}");
}

#[tokio::test]
async fn the_body_buffers_out_of_place_are_named() {
    // A replay buffer with nothing below that sends a request again or records it.
    let replay_over_classify = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ReplayBufferLayer::new(64 * 1024))
            .layer(ClassifyLayer::http())
            .service(client());
    });
    assert!(
        replay_over_classify.contains("ReplayBufferLayer has no RetryLayer or DeadLetterLayer"),
        "{replay_over_classify}"
    );
    let replay_over_retry = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ReplayBufferLayer::new(64 * 1024))
            .layer(RetryLayer::default())
            .layer(ClassifyLayer::http())
            .service(client());
    });
    assert!(
        !replay_over_retry.contains("layer order"),
        "{replay_over_retry}"
    );
    let replay_over_preset = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ReplayBufferLayer::new(64 * 1024))
            .layer(BackstopLayer::http(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        !replay_over_preset.contains("layer order"),
        "{replay_over_preset}"
    );

    // A response buffer above the classifier, which has classified before the body was read.
    let buffer_over_classify = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(BufferResponseLayer::new(64 * 1024))
            .layer(ClassifyLayer::http())
            .service(client());
    });
    assert!(
        buffer_over_classify.contains("BufferResponseLayer is above ClassifyLayer"),
        "{buffer_over_classify}"
    );
    let buffer_below_classify = warnings(|| {
        let _ = ServiceBuilder::new()
            .layer(ClassifyLayer::http())
            .layer(BufferResponseLayer::new(64 * 1024))
            .layer(TimeoutLayer::new(Duration::from_secs(2)))
            .service(client());
    });
    assert!(
        !buffer_below_classify.contains("layer order"),
        "{buffer_below_classify}"
    );
}

#[tokio::test]
async fn a_redrive_through_a_bare_client_is_named() {
    use tower_backstop::resend::{Redrive, http_request};
    use tower_backstop::store::Filter;
    let store = MemoryStore::new();
    let redrive = Redrive::new(Filter::new().id("m-1"), 100, 1).unwrap();

    let logs = support::LogCapture::start(tracing::Level::WARN);
    let report = redrive
        .run(&store, client(), |r| http_request(r, None))
        .await
        .unwrap();
    let bare = logs.text();
    drop(logs);
    assert!(report.records.is_empty());
    assert!(
        bare.contains("the service records are re-sent through has no ClassifyLayer"),
        "{bare}"
    );

    let logs = support::LogCapture::start(tracing::Level::WARN);
    let stack = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_secs(2)))
        .service(client());
    redrive
        .run(&store, stack, |r| http_request(r, None))
        .await
        .unwrap();
    let quiet = logs.text();
    assert!(!quiet.contains("layer order"), "{quiet}");
}
