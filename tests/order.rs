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
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::retry::RetryLayer;
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
