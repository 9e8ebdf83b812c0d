//! Validation before sending, with tower's `FilterLayer` and an `Invalid` error: a rejected
//! request never reaches the provider, is poison with the validator's reason, and is
//! dead-lettered once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower::filter::FilterLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::Invalid;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Attempts, RetryPolicy};
use tower_backstop::store::{MemoryStore, Store};
use tower_backstop::{BoxError, Class};

/// The seed's `validate_job`: required fields and an `@` in the recipient.
fn validate_job(request: &http::Request<String>) -> Result<(), String> {
    let job: serde_json::Value =
        serde_json::from_str(request.body()).map_err(|e| format!("payload is not JSON: {e}"))?;
    let missing: Vec<&str> = ["message_id", "recipient", "template_id", "campaign_id"]
        .into_iter()
        .filter(|f| job.get(f).is_none_or(|v| v.is_null() || v == ""))
        .collect();
    if !missing.is_empty() {
        return Err(format!("missing required fields: {missing:?}"));
    }
    if !job["recipient"].as_str().unwrap_or_default().contains('@') {
        return Err("invalid recipient email".to_owned());
    }
    Ok(())
}

fn job(body: &str) -> http::Request<String> {
    http::Request::post("http://mail.test/v1/send")
        .header("idempotency-key", "job-1")
        .body(body.to_owned())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_rejected_request_never_reaches_the_provider_and_is_one_poison_dead_letter() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let provider = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_: http::Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(http::Response::new(())) }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryPolicy::default().max_attempts(5).build().unwrap())
        .layer(FilterLayer::new(|request: http::Request<String>| {
            validate_job(&request)
                .map(|()| request)
                .map_err(Invalid::new)
        }))
        .service(provider);

    let failure = svc
        .clone()
        .oneshot(job(
            r#"{"message_id":"m-1","recipient":"nobody","template_id":"t","campaign_id":"c"}"#,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "never reached the provider"
    );
    assert_eq!(failure.class(), Class::POISON);
    assert_eq!(
        failure.note::<Attempts>().map_or(0, Attempts::count),
        1,
        "not retried"
    );
    let invalid = std::error::Error::source(&failure)
        .and_then(|s| s.downcast_ref::<Invalid>())
        .unwrap();
    assert_eq!(invalid.reason(), "invalid recipient email");
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { id }) if id == "job-1"
    ));
    let records = store.list(10).await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!((r.class.as_str(), r.attempts), ("poison", 1));
    assert_eq!(r.history.len(), 1, "dead-lettered once");
    assert_eq!(
        r.message,
        "invalid request, not sent: invalid recipient email"
    );

    // Missing fields, and a payload that is not JSON: each reason as given.
    let failure = svc
        .clone()
        .oneshot(job(r#"{"message_id":"m-2","recipient":"a@b.test"}"#))
        .await
        .unwrap_err();
    assert!(
        failure
            .message()
            .contains(r#"missing required fields: ["template_id", "campaign_id"]"#),
        "{}",
        failure.message()
    );
    let failure = svc.clone().oneshot(job("{not json")).await.unwrap_err();
    assert!(failure.message().contains("payload is not JSON"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // A valid one is sent, once.
    svc.oneshot(job(
        r#"{"message_id":"m-3","recipient":"a@b.test","template_id":"t","campaign_id":"c"}"#,
    ))
    .await
    .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
