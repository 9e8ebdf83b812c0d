//! The README's stack around a `reqwest::Client` (feature `reqwest`), against a real axum
//! provider on 127.0.0.1 that fails twice before it delivers, and refuses one message outright.
//! Exits non-zero when an outcome is not the expected one.
//!
//! ```sh
//! cargo run --example reqwest_client --features reqwest
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::Class;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Backoff, RetryPolicy};
use tower_backstop::store::{SqliteStore, Store};
use tower_backstop::timeout::TimeoutLayer;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A provider: `/v1/messages` answers 503 twice, then 202; `/v1/blocked` answers 403.
async fn provider() -> Result<(String, Arc<AtomicU32>), Error> {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let app = axum::Router::new()
        .route(
            "/v1/messages",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n <= 2 {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::ACCEPTED
                    }
                }
            }),
        )
        .route("/v1/blocked", post(|| async { StatusCode::FORBIDDEN }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, calls))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (url, calls) = provider().await?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("dead_letters.db"))?);

    let client = reqwest::Client::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store.clone()))
        .layer(
            RetryPolicy::new()
                .max_attempts(5)
                .backoff(Backoff::exponential(
                    Duration::from_millis(10),
                    Duration::from_millis(100),
                ))
                .build()?,
        )
        .layer(BreakerLayer::consecutive_failures(5).open_for(Duration::from_secs(30)))
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(2)))
        .service(client.clone());

    let request = client
        .post(format!("{url}/v1/messages"))
        .header("idempotency-key", "msg-1")
        .body(r#"{"to":"a@example.com"}"#)
        .build()?;
    let response = svc.clone().oneshot(request).await?;
    println!(
        "msg-1: {} after {} calls",
        response.status(),
        calls.load(Ordering::SeqCst)
    );
    if response.status() != 202 || calls.load(Ordering::SeqCst) != 3 {
        return Err("msg-1 should be delivered on the third call".into());
    }

    let request = client
        .post(format!("{url}/v1/blocked"))
        .header("idempotency-key", "msg-2")
        .body(r#"{"to":"b@example.com"}"#)
        .build()?;
    let failure = match svc.oneshot(request).await {
        Ok(response) => return Err(format!("msg-2 should fail, got {}", response.status()).into()),
        Err(failure) => failure,
    };
    println!("msg-2: {failure}");
    if failure.class() != Class::PERMANENT
        || !matches!(failure.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "msg-2")
    {
        return Err("msg-2 should be a permanent failure stored as a dead letter".into());
    }
    let record = store
        .get("msg-2")
        .await?
        .ok_or("msg-2's record is missing")?;
    println!(
        "dead letter {}: {} {} ({}), payload {}",
        record.id,
        record.metadata["method"],
        record.metadata["uri"],
        record.code,
        String::from_utf8_lossy(&record.payload)
    );
    Ok(())
}
