//! Policies as configuration: reads a TOML file with one section per provider
//! (`examples/data/backstop.toml` by default), builds the preset for each, and sends requests
//! through each stack to a provider of its own on 127.0.0.1: the mail provider answers every
//! third request with a 503, the SMS provider is down. It prints what each stack did and
//! each provider's settings as read, and exits non-zero if a stack did not do what its section
//! says (mail: every request delivered after at most one retry; SMS: two attempts per request
//! until its breaker opens after three failures in a row, then none).
//!
//! ```sh
//! cargo run --example config --features serde,axum -- examples/data/backstop.toml
//! ```
//!
//! A file that cannot work stops it with the field's path, for example
//! `providers.sms: retry.max_attempts: a request needs at least 1 call (1 means never retry)`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tower::{Layer, ServiceExt};
use tower_backstop::config::BackstopConfig;
use tower_backstop::retry::Attempts;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The file: a table of providers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    providers: BTreeMap<String, BackstopConfig>,
}

async fn serve(app: axum::Router) -> Result<std::net::SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/data/backstop.toml".to_owned());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let file: File = toml::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    // Every section is checked before anything starts.
    let mut layers = BTreeMap::new();
    for (name, config) in &file.providers {
        let layer = config
            .http()
            .map_err(|e| format!("{path}: providers.{name}: {e}"))?;
        layers.insert(name.clone(), layer);
    }

    // The providers: mail answers 503 to every third request (a failure rate its breaker
    // tolerates), SMS is down.
    let mail_requests = Arc::new(AtomicU64::new(0));
    let mail = serve(
        axum::Router::new()
            .route(
                "/send",
                post(|State(n): State<Arc<AtomicU64>>| async move {
                    if n.fetch_add(1, Ordering::Relaxed) % 3 == 0 {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::ACCEPTED
                    }
                }),
            )
            .with_state(mail_requests.clone()),
    )
    .await?;
    let sms_requests = Arc::new(AtomicU64::new(0));
    let sms = serve(
        axum::Router::new()
            .route(
                "/send",
                post(|State(n): State<Arc<AtomicU64>>| async move {
                    n.fetch_add(1, Ordering::Relaxed);
                    StatusCode::SERVICE_UNAVAILABLE
                }),
            )
            .with_state(sms_requests.clone()),
    )
    .await?;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut ok = true;
    for (name, config) in &file.providers {
        let (addr, upstream) = match name.as_str() {
            "mail" => (mail, &mail_requests),
            "sms" => (sms, &sms_requests),
            other => return Err(format!("{path}: no provider `{other}` in this example").into()),
        };
        let layer = &layers[name];
        println!("[{name}] as read:\n{}", toml::to_string(config)?);
        let stack = layer.layer(client.clone());
        let (mut delivered, mut failed, mut attempts) = (0, 0, Vec::new());
        for n in 0..6 {
            let request = http::Request::post(format!("http://{addr}/send"))
                .header("idempotency-key", format!("{name}-{n}"))
                .body(Full::new(Bytes::from(format!(r#"{{"message":{n}}}"#))))?;
            match stack.clone().oneshot(request).await {
                Ok(response) if response.status().is_success() => delivered += 1,
                Ok(response) => {
                    return Err(format!("[{name}] answered {}", response.status()).into());
                }
                Err(failure) => {
                    failed += 1;
                    attempts.push(failure.note::<Attempts>().map_or(0, Attempts::count));
                    println!("[{name}] message {n}: {failure}");
                }
            }
        }
        let reached = upstream.load(Ordering::Relaxed);
        println!(
            "[{name}] 6 messages: {delivered} delivered, {failed} failed, {reached} requests reached the provider\n"
        );
        ok &= match name.as_str() {
            // Every third request fails: each message is delivered with at most one retry.
            "mail" => delivered == 6 && (6..=12).contains(&reached),
            // Two attempts each until three failures in a row open the breaker (during the
            // second message), then the breaker fails fast: 3 requests reach the provider.
            "sms" => delivered == 0 && reached == 3 && attempts[0] == 2,
            _ => true,
        };
    }
    if !ok {
        return Err("a stack did not do what its section says".into());
    }
    println!("each stack did what its section says");
    Ok(())
}
