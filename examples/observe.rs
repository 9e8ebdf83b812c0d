//! What an operator sees: the preset over two real providers on 127.0.0.1 (a mail provider that
//! fails some messages once and refuses others for good, and an SMS provider that is down), its
//! events recorded by `Metrics` into a Prometheus recorder, served on an axum admin server with
//! `/metrics` and the breakers' `/health` route; the in-process `Alerts` print each alert as
//! it is raised. The example then scrapes itself, and exits
//! non-zero unless the scraped numbers agree with what the providers and the store saw:
//! attempts (each a request a provider received), calls the open breaker rejected, dead letters
//! by class and status.
//!
//! ```sh
//! cargo run --example observe --features prometheus,axum
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_backstop::BackstopLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::observe::Alerts;
use tower_backstop::observe::Metrics;
use tower_backstop::retry::{Backoff, RetryPolicy};
use tower_backstop::store::{Alert, MemoryStore, Status, Store};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What a provider received: requests in all, and per message.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    per_message: Mutex<HashMap<String, u32>>,
}

impl Seen {
    /// Counts a request of `message`; the number of times that message arrived.
    fn arrived(&self, message: &str) -> u32 {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut per_message = self.per_message.lock().unwrap();
        let n = per_message.entry(message.to_owned()).or_default();
        *n += 1;
        *n
    }
}

fn message_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Mail: message `mail-N` with N % 5 == 0 is refused for good (422); N % 5 == 1 fails once
/// (503), then goes through; the rest go through at once.
async fn mail(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> StatusCode {
    let message = message_of(&headers);
    let n: u32 = message
        .trim_start_matches("mail-")
        .parse()
        .unwrap_or_default();
    let arrival = seen.arrived(&message);
    match n % 5 {
        0 => StatusCode::UNPROCESSABLE_ENTITY,
        1 if arrival == 1 => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::ACCEPTED,
    }
}

/// SMS: down.
async fn sms(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> StatusCode {
    seen.arrived(&message_of(&headers));
    StatusCode::SERVICE_UNAVAILABLE
}

async fn serve(app: axum::Router) -> Result<std::net::SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The samples of a Prometheus text exposition, by `name{labels}` as written.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels contain every one of `with`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, with: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(key, _)| {
            key.split_once('{')
                .map_or(key.as_str(), |(n, _)| n)
                .eq(name)
                && with.iter().all(|label| key.contains(label))
        })
        .map(|(_, v)| v)
        .sum()
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let recorder = tower_backstop::observe::prometheus_builder().install_recorder()?;

    let mail_seen = Arc::new(Seen::default());
    let sms_seen = Arc::new(Seen::default());
    let mail_addr = serve(
        axum::Router::new()
            .route("/send", post(mail))
            .with_state(Arc::clone(&mail_seen)),
    )
    .await?;
    let sms_addr = serve(
        axum::Router::new()
            .route("/send", post(sms))
            .with_state(Arc::clone(&sms_seen)),
    )
    .await?;

    let metrics = Metrics::new();
    // The in-process alerts see every event first, then hand it on to the metrics.
    let alerts = Alerts::new()
        .on_alert(|alert, firing| {
            println!(
                "alert {}: {alert}",
                if firing { "raised" } else { "cleared" }
            )
        })
        .then(metrics.clone());
    let store = Arc::new(MemoryStore::new());
    let backstop = BackstopLayer::http(Duration::from_secs(2))
        .retry(
            RetryPolicy::new()
                .backoff(Backoff::exponential(
                    Duration::from_millis(10),
                    Duration::from_millis(100),
                ))
                .build()?,
        )
        .listener(alerts.clone());
    let health = backstop.health().essential(&sms_addr.to_string());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = backstop
        .dead_letters(DeadLetterLayer::from_arc(store.clone()))
        .layer(client);

    let admin = serve(
        axum::Router::new()
            .route("/metrics", get(move || async move { recorder.render() }))
            .route("/health", get(move || async move { health.report() })),
    )
    .await?;

    // 20 messages to each provider, one at a time.
    let mut delivered = 0;
    let mut failed = 0;
    for n in 0..20 {
        for (provider, addr) in [("mail", mail_addr), ("sms", sms_addr)] {
            // The key names the record in the store: one per provider's message.
            let request = http::Request::post(format!("http://{addr}/send"))
                .header("idempotency-key", format!("{provider}-{n}"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(format!(r#"{{"message":{n}}}"#))))?;
            match stack.clone().oneshot(request).await {
                Ok(_) => delivered += 1,
                Err(_) => failed += 1,
            }
        }
    }
    println!("sent 40 messages: {delivered} delivered, {failed} failed");

    let caller = reqwest::Client::new();
    let text = caller
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let scraped = samples(&text);
    let health_response = caller.get(format!("http://{admin}/health")).send().await?;
    let health_status = health_response.status().as_u16();
    let health_body: serde_json::Value = serde_json::from_str(&health_response.text().await?)?;

    // Dead letters by class and status, against the store's own records.
    let mut stored: BTreeMap<(String, &str), u64> = BTreeMap::new();
    for record in store.list(1_000).await? {
        let status = if record.status == Status::Dead {
            "dead"
        } else {
            "deferred"
        };
        *stored.entry((record.class.clone(), status)).or_default() += 1;
    }
    let mut problems = Vec::new();
    if stored.is_empty() {
        problems.push("no dead letter was stored".to_owned());
    }
    let mut check = |what: &str, scraped: f64, truth: f64| {
        println!("{what}: scraped {scraped}, seen {truth}");
        if scraped != truth {
            problems.push(format!("{what}: scraped {scraped}, seen {truth}"));
        }
    };

    // Every attempt reached a provider: a breaker's rejection is not an attempt.
    let attempts = sum(&scraped, "backstop_attempts_total", &[]);
    let reached =
        mail_seen.requests.load(Ordering::Relaxed) + sms_seen.requests.load(Ordering::Relaxed);
    check(
        "attempts, against what the providers received",
        attempts,
        reached as f64,
    );
    let sms_breaker = format!("breaker=\"{sms_addr}\"");
    let sms_rejected = health_body["breakers"]
        .as_array()
        .and_then(|breakers| breakers.iter().find(|b| b["name"] == sms_addr.to_string()))
        .and_then(|b| b["rejected"].as_f64())
        .unwrap_or(-1.0);
    check(
        "calls the SMS breaker rejected, against the breaker's own count",
        sum(
            &scraped,
            "backstop_breaker_rejections_total",
            &[&sms_breaker],
        ),
        sms_rejected,
    );
    check(
        "calls",
        sum(&scraped, "backstop_calls_total", &[]),
        f64::from(delivered + failed),
    );
    check(
        "delivered calls",
        sum(&scraped, "backstop_calls_total", &["outcome=\"success_"]),
        f64::from(delivered),
    );
    for ((class, status), n) in &stored {
        check(
            &format!("dead letters of class {class}, {status}"),
            sum(
                &scraped,
                "backstop_dead_letters_total",
                &[
                    &format!("class=\"{class}\""),
                    &format!("status=\"{status}\""),
                ],
            ),
            *n as f64,
        );
    }
    check(
        "dead letters",
        sum(&scraped, "backstop_dead_letters_total", &[]),
        stored.values().sum::<u64>() as f64,
    );
    check(
        "the SMS breaker's state gauge, open",
        sum(
            &scraped,
            "backstop_breaker_state",
            &[&sms_breaker, "state=\"open\""],
        ),
        1.0,
    );

    check(
        "the alert gauge of breaker_open",
        sum(
            &scraped,
            "backstop_alert_active",
            &["rule=\"breaker_open\""],
        ),
        1.0,
    );
    let open_alert = Alert::BreakerOpen {
        breaker: sms_addr.to_string(),
    };
    if !alerts.active().contains(&open_alert) {
        problems.push(format!(
            "no breaker_open alert for the SMS provider: {:?}",
            alerts.active()
        ));
    }

    println!("GET /health: {health_status} {health_body}");
    let sms_state = health_body["breakers"]
        .as_array()
        .and_then(|breakers| breakers.iter().find(|b| b["name"] == sms_addr.to_string()))
        .map(|b| b["state"].clone());
    if health_status != 503 || sms_state != Some(serde_json::json!("open")) {
        problems.push(format!(
            "health: expected 503 with the SMS breaker open, got {health_status} and {sms_state:?}"
        ));
    }

    if problems.is_empty() {
        println!("the scraped metrics agree with the providers and the store");
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}
