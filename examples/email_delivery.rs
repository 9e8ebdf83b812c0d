//! Email delivery through all five layers, against a real HTTP mail provider.
//!
//! The example starts an axum "mail provider" on `127.0.0.1:0` in the same process, reads a
//! JSON-lines file of messages, and sends each one as `POST /v1/messages` with an
//! `Idempotency-Key` equal to the message id, 16 at a time, through
//!
//! ```text
//! DeadLetterLayer(SqliteStore) → RetryLayer → BreakerLayer → ClassifyLayer::http() → TimeoutLayer
//!     → hyper-util legacy Client
//! ```
//!
//! The provider answers by recipient, so the data file decides the mix:
//!
//! | recipient | provider answers | what the stack does |
//! |---|---|---|
//! | `@example.com`, `.org`, `.net` | 202 Accepted | delivered on the first attempt |
//! | `@flaky.example` | 503, 503, then 202 | transient: retried with backoff, delivered |
//! | `@busy.example` | 429 with `Retry-After: 1`, then 202 | throttled: waits the server's second, delivered |
//! | a malformed address | 400 invalid recipient | permanent: never retried, dead letter |
//! | `@broken.example` | 500, always | unknown: retried, then dead letter |
//! | `@slow.example` | hangs for 5 s | per-attempt timeout (transient): retried, then dead letter |
//!
//! No message is sent more than 4 times: 300 ms per attempt, exponential backoff from 50 ms
//! capped at 1 s, a `Retry-After` of up to 2 s honoured; `unknown` failures (the 500s) are
//! retried once, cautiously (the policy's default). The circuit breaker is the README's: one per
//! host (here one host), opening when half of the last 100 calls failed once 20 were seen, for
//! 1 s doubling up to 30 s. Broken and slow recipients fail every attempt, but they are a small
//! share of the traffic, so the breaker should stay closed; if it opens, the calls it rejects
//! come back at once, are not attempts, and are stored as deferred records with the half-open
//! instant as their retry-at time, for the dead-letter scheduler to send again (a last step of
//! the example does that).
//!
//! Each dead letter is tagged with the recipient's domain. At the end the example prints the
//! attempts, the retries by class, the breaker's transitions,
//! the dead letters by class (read back from the SQLite store, a fresh file under the temporary
//! directory on each run) with a few samples, and the outcome per kind of recipient. It checks
//! that the provider accepted no message twice and that every message ended either delivered or
//! as a stored dead letter, and exits with status 1 if not. Last, it prints the `backstop-dlq stats`
//! view of the store (top classes and codes, the rate, the alert signals), the same
//! [`Stats`] the command-line tool renders.
//!
//! Run it from the crate root:
//!
//! ```text
//! cargo run --example email_delivery -- examples/data/messages.jsonl
//! ```
//!
//! Logging is off by default so the summary stays readable: `RUST_LOG=tower_backstop=warn` prints
//! each dead letter and breaker trip as it happens, `RUST_LOG=tower_backstop=info` each retry too.

#[path = "support/settle.rs"]
mod settle;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::observe::Event;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::{Attempts, Backoff, DelaySource, RetryPolicy};
use tower_backstop::store::{AlertRules, Filter, Record, SqliteStore, Stats, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BoxError, Class, Code};
use tracing_subscriber::EnvFilter;

/// Messages in flight at once.
const CONCURRENCY: usize = 16;
/// Per-attempt timeout ([`TimeoutLayer`]).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(300);
/// How long the slow provider domain hangs before it answers (well past the attempt timeout).
const HANG: Duration = Duration::from_secs(5);
/// Attempts per message in all, whatever their class (a breaker rejection is not one: it never
/// reaches the provider).
const MAX_ATTEMPTS: u32 = 4;
/// Exponential backoff (full jitter) from this base…
const BACKOFF_BASE: Duration = Duration::from_millis(50);
/// …capped at this.
const BACKOFF_CAP: Duration = Duration::from_secs(1);
/// The longest server hint slept in process: `Retry-After: 1` is honoured.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// The breaker opens when at least this share of the last `BREAKER_WINDOW` calls failed…
const BREAKER_FAILURE_RATE: f64 = 0.5;
/// …over this many calls…
const BREAKER_WINDOW: u32 = 100;
/// …once it has seen this many.
const BREAKER_MINIMUM_CALLS: u32 = 20;
/// How long the breaker stays open after its first trip (doubling while probes fail)…
const BREAKER_OPEN_FOR: Duration = Duration::from_secs(1);
/// …up to this.
const BREAKER_OPEN_CAP: Duration = Duration::from_secs(30);

const DEFAULT_INPUT: &str = "examples/data/messages.jsonl";

type Request = http::Request<Full<Bytes>>;

/// One line of the input file, and the JSON body of `POST /v1/messages`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Message {
    id: String,
    to: String,
    subject: String,
    body: String,
}

// ---------------------------------------------------------------------------------------------
// The mail provider
// ---------------------------------------------------------------------------------------------

/// How the provider treats a recipient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Behaviour {
    Accepts,
    Flaky,
    Busy,
    Invalid,
    Broken,
    Slow,
}

impl Behaviour {
    const ALL: [Behaviour; 6] = [
        Behaviour::Accepts,
        Behaviour::Flaky,
        Behaviour::Busy,
        Behaviour::Invalid,
        Behaviour::Broken,
        Behaviour::Slow,
    ];

    fn of(to: &str) -> Behaviour {
        if !is_valid_address(to) {
            return Behaviour::Invalid;
        }
        let domain = to.rsplit('@').next().unwrap_or_default();
        match domain.to_ascii_lowercase().as_str() {
            "flaky.example" => Behaviour::Flaky,
            "busy.example" => Behaviour::Busy,
            "broken.example" => Behaviour::Broken,
            "slow.example" => Behaviour::Slow,
            _ => Behaviour::Accepts,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Behaviour::Accepts => "accepts (202)",
            Behaviour::Flaky => "flaky (503, 503, 202)",
            Behaviour::Busy => "busy (429 Retry-After: 1, 202)",
            Behaviour::Invalid => "invalid recipient (400)",
            Behaviour::Broken => "broken (500 always)",
            Behaviour::Slow => "slow (hangs 5 s)",
        }
    }

    /// Whether a message to this recipient can be delivered at all.
    fn deliverable(self) -> bool {
        matches!(
            self,
            Behaviour::Accepts | Behaviour::Flaky | Behaviour::Busy
        )
    }
}

/// A deliberately plain address check: one `@`, a local part without spaces, a domain of at
/// least two non-empty labels.
fn is_valid_address(to: &str) -> bool {
    let Some((local, domain)) = to.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.contains('@')
        && !to.chars().any(char::is_whitespace)
        && domain.split('.').count() >= 2
        && domain.split('.').all(|label| !label.is_empty())
}

/// What the provider saw, per `Idempotency-Key`.
#[derive(Debug, Default)]
struct ProviderLog {
    /// Requests received per key.
    requests: HashMap<String, u32>,
    /// Deliveries (202 Accepted answers) per key.
    deliveries: HashMap<String, u32>,
}

type SharedLog = Arc<Mutex<ProviderLog>>;

fn lock(log: &SharedLog) -> std::sync::MutexGuard<'_, ProviderLog> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

fn provider(log: SharedLog) -> Router {
    Router::new()
        .route("/v1/messages", post(accept_message))
        .with_state(log)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn accept_message(
    State(log): State<SharedLog>,
    headers: HeaderMap,
    Json(message): Json<Message>,
) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "missing Idempotency-Key");
    };
    // The n-th request for this key, from 1.
    let seen = {
        let mut log = lock(&log);
        let n = log.requests.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let accept = |log: &SharedLog| {
        *lock(log).deliveries.entry(key.clone()).or_default() += 1;
        (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "id": key, "status": "queued" })),
        )
            .into_response()
    };
    match Behaviour::of(&message.to) {
        Behaviour::Accepts => accept(&log),
        Behaviour::Flaky if seen <= 2 => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "relay temporarily unavailable",
        ),
        Behaviour::Flaky => accept(&log),
        Behaviour::Busy if seen == 1 => {
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, "sending rate exceeded");
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            response
        }
        Behaviour::Busy => accept(&log),
        Behaviour::Invalid => error(
            StatusCode::BAD_REQUEST,
            &format!("invalid recipient {:?}", message.to),
        ),
        Behaviour::Broken => error(StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
        Behaviour::Slow => {
            // Far past the client's per-attempt timeout; and then not delivered either.
            tokio::time::sleep(HANG).await;
            error(StatusCode::GATEWAY_TIMEOUT, "upstream MTA did not answer")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The sender
// ---------------------------------------------------------------------------------------------

/// How one message ended, as the sender saw it.
#[derive(Debug)]
enum Delivery {
    Delivered,
    DeadLetter {
        class: Class,
        code: Code,
        attempts: u32,
        /// The provider's answer, when the final failure was a response (a 400, a 500).
        provider_said: Option<String>,
    },
    /// Rejected by the open breaker (or asked to wait longer than the in-process bound): stored
    /// as a deferred record, for the scheduler to send again.
    Deferred,
    /// Deferred, then delivered by the scheduler's re-send.
    Redelivered,
    /// Deferred, then re-sent by the scheduler and dead-lettered.
    DeadAfterResend {
        class: String,
    },
    /// Neither delivered nor stored: the dead letter could not be written, or the answer was a
    /// success that is not 202.
    Lost(String),
}

#[derive(Debug)]
struct Outcome {
    id: String,
    behaviour: Behaviour,
    delivery: Delivery,
}

/// Retries per class, and how many of them waited for a server hint (`Retry-After`) instead of
/// the computed backoff.
#[derive(Debug, Default)]
struct RetryCounts {
    by_class: BTreeMap<&'static str, (u64, u64)>,
}

fn read_messages(path: &Path) -> Result<Vec<Message>, BoxError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut messages = Vec::new();
    let mut ids = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let message: Message =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
        if !ids.insert(message.id.clone()) {
            return Err(
                format!("{}:{}: duplicate id {}", path.display(), n + 1, message.id).into(),
            );
        }
        messages.push(message);
    }
    Ok(messages)
}

/// The input path: the first argument, else the shipped file (found from the crate root even
/// when run from elsewhere).
fn input_path() -> PathBuf {
    if let Some(arg) = std::env::args_os().nth(1) {
        return PathBuf::from(arg);
    }
    let relative = PathBuf::from(DEFAULT_INPUT);
    if relative.exists() {
        relative
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_INPUT)
    }
}

/// A fresh dead-letter file per run, so reruns never merge old records.
fn dead_letter_path() -> PathBuf {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "tower-backstop-email-{}-{millis}.db",
        std::process::id()
    ))
}

/// The dead-letter tag function: the recipient's domain, so that dead letters can be searched
/// by domain (`backstop-dlq list --filter tag.domain=broken.example`).
fn recipient_domain(envelope: &tower_backstop::Envelope) -> Vec<(String, String)> {
    serde_json::from_slice::<Message>(&envelope.payload)
        .ok()
        .and_then(|m| m.to.rsplit_once('@').map(|(_, d)| d.to_ascii_lowercase()))
        .map(|domain| vec![("domain".to_owned(), domain)])
        .unwrap_or_default()
}

/// Sends one message through the stack and says how it ended.
async fn deliver<S>(svc: S, uri: http::Uri, message: Message) -> Outcome
where
    S: tower::Service<
            Request,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower_backstop::Failure<http::Response<hyper::body::Incoming>>,
        >,
{
    let behaviour = Behaviour::of(&message.to);
    let id = message.id.clone();
    let outcome = |delivery| Outcome {
        id: id.clone(),
        behaviour,
        delivery,
    };
    let body = match serde_json::to_vec(&message) {
        Ok(body) => body,
        Err(e) => return outcome(Delivery::Lost(format!("cannot encode message: {e}"))),
    };
    let request = http::Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", &message.id)
        .body(Full::new(Bytes::from(body)));
    let request = match request {
        Ok(request) => request,
        Err(e) => return outcome(Delivery::Lost(format!("cannot build request: {e}"))),
    };
    match svc.oneshot(request).await {
        Ok(response) if response.status() == StatusCode::ACCEPTED => {
            // Read the body so the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            outcome(Delivery::Delivered)
        }
        Ok(response) => outcome(Delivery::Lost(format!(
            "unexpected success status {}",
            response.status()
        ))),
        Err(failure) => {
            let (class, code, attempts) = (
                failure.class(),
                failure.code(),
                failure.note::<Attempts>().map_or(0, Attempts::count),
            );
            match failure.note::<DeadLetterStatus>() {
                Some(DeadLetterStatus::Stored { .. })
                    if failure
                        .note::<Attempts>()
                        .is_some_and(Attempts::is_deferred) =>
                {
                    return outcome(Delivery::Deferred);
                }
                Some(DeadLetterStatus::Stored { .. }) => {}
                Some(DeadLetterStatus::NotStored { error, .. }) => {
                    return outcome(Delivery::Lost(format!("dead letter not stored: {error}")));
                }
                _ => return outcome(Delivery::Lost(format!("no dead letter for: {failure}"))),
            }
            let provider_said = match failure.into_response() {
                Some(response) => match response.into_body().collect().await {
                    Ok(body) => Some(String::from_utf8_lossy(&body.to_bytes()).into_owned()),
                    Err(e) => Some(format!("(body unreadable: {e})")),
                },
                None => None,
            };
            outcome(Delivery::DeadLetter {
                class,
                code,
                attempts,
                provider_said,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();

    let input = input_path();
    let messages = read_messages(&input)?;
    println!("read {} messages from {}", messages.len(), input.display());

    // The provider, in this process, on a port of its own.
    let log = SharedLog::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = provider(log.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let uri: http::Uri = format!("http://{addr}/v1/messages").parse()?;
    println!("mail provider listening on http://{addr}");

    // The sender: five layers around a real hyper-util client.
    let db_path = dead_letter_path();
    let dead_letters = SqliteStore::open(&db_path)?;

    let retries = Arc::new(Mutex::new(RetryCounts::default()));
    let policy = RetryPolicy::new()
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Backoff::exponential(BACKOFF_BASE, BACKOFF_CAP))
        .max_delay(MAX_DELAY)
        .listener({
            let retries = Arc::clone(&retries);
            move |event: &Event<'_>| {
                let Event::RetryScheduled { class, source, .. } = *event else {
                    return;
                };
                let mut retries = retries.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = retries.by_class.entry(class.name()).or_default();
                entry.0 += 1;
                if source == DelaySource::ServerHint {
                    entry.1 += 1;
                }
            }
        });
    let breaker = BreakerLayer::builder()
        .failure_rate(BREAKER_FAILURE_RATE)
        .count_window(BREAKER_WINDOW)
        .minimum_calls(BREAKER_MINIMUM_CALLS)
        .open_doubling(BREAKER_OPEN_FOR, BREAKER_OPEN_CAP)
        .open_jitter(0.5)
        .per_host()
        .build()?;
    let breakers = breaker.clone();

    // Attempts that reached the client (the breaker's rejections never do).
    let attempts = Arc::new(AtomicU64::new(0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letters.clone()).tags(recipient_domain))
        .layer(policy.build()?)
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(ATTEMPT_TIMEOUT))
        .map_request({
            let attempts = Arc::clone(&attempts);
            move |request: Request| {
                attempts.fetch_add(1, Ordering::Relaxed);
                request
            }
        })
        .service(client);

    println!(
        "sending {CONCURRENCY} at a time: {ATTEMPT_TIMEOUT:?} per attempt, at most \
         {MAX_ATTEMPTS} attempts per message (2 for unknown failures),\n  backoff \
         {BACKOFF_BASE:?}..{BACKOFF_CAP:?} with full jitter, server hints up to {MAX_DELAY:?}, \
         a breaker per host opening at {}% failed of the last {BREAKER_WINDOW} calls \
         (at least {BREAKER_MINIMUM_CALLS}) for {BREAKER_OPEN_FOR:?} doubling to \
         {BREAKER_OPEN_CAP:?}",
        BREAKER_FAILURE_RATE * 100.0
    );

    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    let total = messages.len();
    for message in messages {
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let svc = svc.clone();
        let uri = uri.clone();
        tasks.spawn(async move {
            let outcome = deliver(svc, uri, message).await;
            drop(slot);
            outcome
        });
    }
    let mut outcomes = Vec::with_capacity(total);
    while let Some(joined) = tasks.join_next().await {
        outcomes.push(joined?);
    }
    let first_pass = started.elapsed();

    // Deferred records (breaker rejections) are re-sent by the dead-letter scheduler when due,
    // through the same stack, so that each re-send updates its own record.
    let deferred = outcomes
        .iter()
        .filter(|o| matches!(o.delivery, Delivery::Deferred))
        .count();
    if deferred > 0 {
        println!(
            "re-sending {deferred} deferred messages with the dead-letter scheduler, when due"
        );
        let store: Arc<dyn Store> = Arc::new(dead_letters.clone());
        let scheduler = Scheduler::new(Arc::clone(&store), svc.clone(), |record: &Record| {
            http_request(record, None)
        })
        .poll_every(Duration::from_millis(100))
        .concurrency(CONCURRENCY)
        .spawn();
        settle::until_settled(&*store, Duration::from_secs(60)).await?;
        scheduler.shutdown().await;
        // Every record, the resolved ones too: a message the scheduler delivered is one.
        let records: HashMap<String, Record> = store
            .search(&Filter::new(), 0..usize::MAX)
            .await?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        for o in &mut outcomes {
            if !matches!(o.delivery, Delivery::Deferred) {
                continue;
            }
            match records.get(&o.id).map(|r| (r.status, r.class.clone())) {
                Some((Status::Resolved, _)) => o.delivery = Delivery::Redelivered,
                Some((Status::Dead, class)) => o.delivery = Delivery::DeadAfterResend { class },
                _ => {}
            }
        }
    }
    let elapsed = started.elapsed();
    server.abort();

    let retries = std::mem::take(&mut *retries.lock().unwrap_or_else(PoisonError::into_inner));
    let log = std::mem::take(&mut *lock(&log));
    let report = Report {
        total,
        outcomes,
        attempts: attempts.load(Ordering::Relaxed),
        retries,
        breaker: breakers.handle_for(&addr.to_string()),
        first_pass,
        log,
        dead_letters_by_class: dead_letters.count_by_class().await?,
        records: dead_letters.list(usize::MAX).await?,
        elapsed,
        db_path,
    };
    print!("{report}");

    // What an operator sees next: the `backstop-dlq stats` dashboard of the same store.
    println!();
    println!(
        "$ backstop-dlq --store {} stats --window 24h",
        report.db_path.display()
    );
    let stats = Stats::gather(
        &dead_letters,
        SystemTime::now(),
        Duration::from_secs(24 * 60 * 60),
        AlertRules::default(),
    )
    .await?;
    print!("{stats}");
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

// ---------------------------------------------------------------------------------------------
// The summary
// ---------------------------------------------------------------------------------------------

struct Report {
    total: usize,
    outcomes: Vec<Outcome>,
    attempts: u64,
    retries: RetryCounts,
    breaker: Option<tower_backstop::breaker::BreakerHandle>,
    first_pass: Duration,
    log: ProviderLog,
    dead_letters_by_class: Vec<(String, u64)>,
    records: Vec<Record>,
    elapsed: Duration,
    db_path: PathBuf,
}

impl Report {
    fn ids(&self, pick: impl Fn(&Delivery) -> bool) -> BTreeSet<&str> {
        self.outcomes
            .iter()
            .filter(|o| pick(&o.delivery))
            .map(|o| o.id.as_str())
            .collect()
    }

    /// Delivered on the first pass or by the scheduler's re-send.
    fn delivered(&self) -> BTreeSet<&str> {
        self.ids(|d| matches!(d, Delivery::Delivered | Delivery::Redelivered))
    }

    fn dead_lettered(&self) -> BTreeSet<&str> {
        self.ids(|d| {
            matches!(
                d,
                Delivery::DeadLetter { .. } | Delivery::DeadAfterResend { .. }
            )
        })
    }

    /// Still deferred after the scheduler's pass.
    fn deferred(&self) -> BTreeSet<&str> {
        self.ids(|d| matches!(d, Delivery::Deferred))
    }

    fn redelivered(&self) -> BTreeSet<&str> {
        self.ids(|d| matches!(d, Delivery::Redelivered))
    }

    /// Keys the provider accepted more than once.
    fn duplicates(&self) -> Vec<(&str, u32)> {
        let mut dups: Vec<_> = self
            .log
            .deliveries
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        dups.sort_unstable();
        dups
    }

    /// Everything that is wrong with the run; empty when it passed.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, n) in self.duplicates() {
            problems.push(format!("{key} was delivered {n} times"));
        }
        if self.outcomes.len() != self.total {
            problems.push(format!(
                "{} of {} messages came back from the sender",
                self.outcomes.len(),
                self.total
            ));
        }
        for o in &self.outcomes {
            if let Delivery::Lost(why) = &o.delivery {
                problems.push(format!("{} is unaccounted for: {why}", o.id));
            }
        }
        let delivered = self.delivered();
        let dead = self.dead_lettered();
        let stored: BTreeSet<&str> = self.records.iter().map(|r| r.id.as_str()).collect();
        let accepted: BTreeSet<&str> = self.log.deliveries.keys().map(String::as_str).collect();
        for id in dead.difference(&stored) {
            problems.push(format!("{id} was reported stored but is not in the store"));
        }
        // The stored record says what the caller was told.
        let records: HashMap<&str, &Record> =
            self.records.iter().map(|r| (r.id.as_str(), r)).collect();
        for o in &self.outcomes {
            let Delivery::DeadLetter {
                class,
                code,
                attempts,
                ..
            } = &o.delivery
            else {
                continue;
            };
            let Some(record) = records.get(o.id.as_str()) else {
                continue; // reported above
            };
            // A breaker rejection is not an attempt; any other failure made at least one.
            let expected = if *code == Code::CircuitOpen {
                *attempts
            } else {
                (*attempts).max(1)
            };
            if record.class != class.name()
                || record.code != code.to_string()
                || record.attempts != expected
            {
                problems.push(format!(
                    "{}: stored record ({}, {}, {} attempts) differs from the failure \
                     returned ({class}, {code}, {attempts} attempts)",
                    o.id, record.class, record.code, record.attempts
                ));
            }
        }
        let accounted: BTreeSet<&str> = dead
            .iter()
            .chain(&self.deferred())
            .chain(&self.redelivered())
            .copied()
            .collect();
        for id in stored.difference(&accounted) {
            problems.push(format!(
                "{id} is in the store but the sender did not see it fail"
            ));
        }
        for id in delivered.difference(&accepted) {
            problems.push(format!(
                "{id} was reported delivered but the provider never accepted it"
            ));
        }
        for id in accepted.difference(&delivered) {
            problems.push(format!(
                "{id} was accepted by the provider but the sender did not see it delivered"
            ));
        }
        problems
    }

    fn ok(&self) -> bool {
        self.problems().is_empty()
    }
}

fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

fn truncate(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let delivered = self.delivered().len();
        let redelivered = self.redelivered().len();
        let dead = self.dead_lettered().len();
        let deferred = self.deferred().len();
        let lost = self.outcomes.len() - delivered - dead - deferred;
        let provider_requests: u64 = self.log.requests.values().map(|n| u64::from(*n)).sum();

        writeln!(f)?;
        writeln!(f, "=== email delivery summary ===")?;
        writeln!(f, "messages read        {}", self.total)?;
        writeln!(
            f,
            "delivered (202)      {delivered} ({redelivered} of them deferred by the breaker and re-sent by the scheduler)"
        )?;
        writeln!(f, "dead letters         {dead}")?;
        writeln!(f, "still deferred       {deferred}")?;
        writeln!(f, "unaccounted for      {lost}")?;
        write!(
            f,
            "attempts             {} reached the client",
            self.attempts
        )?;
        if provider_requests == self.attempts {
            writeln!(f, " (and the provider)")?;
        } else {
            writeln!(f, " ({provider_requests} reached the provider)")?;
        }

        let retries: u64 = self.retries.by_class.values().map(|(n, _)| n).sum();
        write!(f, "retries              {retries}:")?;
        if self.retries.by_class.is_empty() {
            write!(f, " none")?;
        }
        for (i, (class, (n, hinted))) in self.retries.by_class.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{class} {n}")?;
            if *hinted > 0 {
                write!(f, " ({hinted} waited for Retry-After)")?;
            }
        }
        writeln!(f)?;

        let stats = self.breaker.as_ref().map(|b| b.stats()).unwrap_or_default();
        writeln!(
            f,
            "breaker              opened {}, half-opened {}, closed {}, rejected {} calls, \
             {} probes; now {}",
            stats.opened,
            stats.half_opened,
            stats.closed,
            stats.rejected,
            stats.probes,
            self.breaker
                .as_ref()
                .map_or("never used".to_owned(), |b| b.state().to_string())
        )?;
        writeln!(
            f,
            "elapsed              {:.2?} for the first pass",
            self.first_pass
        )?;

        write!(f, "dead letters by class")?;
        if self.dead_letters_by_class.is_empty() {
            write!(f, " none")?;
        }
        for (i, (class, n)) in self.dead_letters_by_class.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{class} {n}")?;
        }
        writeln!(f, "  (from the SQLite store)")?;

        // Outcome per recipient behaviour: what the data asked for, and what happened.
        writeln!(f)?;
        writeln!(
            f,
            "{:<32} {:>8} {:>10}  dead letters",
            "recipient", "messages", "delivered"
        )?;
        let mut collateral = 0;
        for behaviour in Behaviour::ALL {
            let of_kind: Vec<&Outcome> = self
                .outcomes
                .iter()
                .filter(|o| o.behaviour == behaviour)
                .collect();
            if of_kind.is_empty() {
                continue;
            }
            let ok = of_kind
                .iter()
                .filter(|o| matches!(o.delivery, Delivery::Delivered | Delivery::Redelivered))
                .count();
            let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
            for o in &of_kind {
                let class = match &o.delivery {
                    Delivery::DeadLetter { class, .. } => class.name(),
                    Delivery::DeadAfterResend { class } => class.as_str(),
                    _ => continue,
                };
                *classes.entry(class).or_default() += 1;
                if behaviour.deliverable() {
                    collateral += 1;
                }
            }
            let classes = if classes.is_empty() {
                "-".to_owned()
            } else {
                classes
                    .iter()
                    .map(|(c, n)| format!("{c} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            writeln!(
                f,
                "{:<32} {:>8} {:>10}  {classes}",
                behaviour.describe(),
                of_kind.len(),
                ok
            )?;
        }
        if collateral > 0 {
            writeln!(
                f,
                "note: {} to recipients that would have accepted them ended as dead letters.\n      \
                 They are in the store, with the class that stopped them, to be re-driven.",
                plural(collateral as u64, "message", "messages")
            )?;
        } else if stats.rejected > 0 {
            writeln!(
                f,
                "note: the breaker rejected {} while open, at once; each was deferred and \
                 re-sent by the scheduler.",
                plural(stats.rejected, "call", "calls")
            )?;
        }

        // One sample dead letter per class, read back from the store.
        if !self.records.is_empty() {
            writeln!(f)?;
            writeln!(f, "sample dead letters (one per class, from the store):")?;
            let by_id: HashMap<&str, &Outcome> =
                self.outcomes.iter().map(|o| (o.id.as_str(), o)).collect();
            let mut seen = BTreeSet::new();
            let mut samples: Vec<&Record> = self
                .records
                .iter()
                .filter(|r| seen.insert(r.class.as_str()))
                .collect();
            samples.sort_by(|a, b| a.class.cmp(&b.class).then_with(|| a.id.cmp(&b.id)));
            for record in samples {
                writeln!(
                    f,
                    "  {}  class={} code={:?} attempts={} message={:?}",
                    record.id, record.class, record.code, record.attempts, record.message
                )?;
                if let Some(outcome) = by_id.get(record.id.as_str()) {
                    let to = serde_json::from_slice::<Message>(&record.payload)
                        .map(|m| m.to)
                        .unwrap_or_default();
                    write!(f, "      to {to:?}, {}", outcome.behaviour.describe())?;
                    if let Delivery::DeadLetter {
                        provider_said: Some(said),
                        ..
                    } = &outcome.delivery
                    {
                        write!(f, "; provider said {}", truncate(said, 80))?;
                    }
                    writeln!(f)?;
                }
            }
        }

        writeln!(f)?;
        let dups = self.duplicates();
        if dups.is_empty() {
            writeln!(
                f,
                "duplicate check      ok: {} keys delivered, none more than once",
                self.log.deliveries.len()
            )?;
        } else {
            writeln!(
                f,
                "duplicate check      FAILED: {} delivered more than once",
                plural(dups.len() as u64, "message", "messages")
            )?;
        }
        let problems = self.problems();
        if problems.is_empty() {
            writeln!(
                f,
                "accounting           ok: {delivered} delivered + {dead} dead letters + {deferred} deferred = {} messages",
                self.total
            )?;
        } else {
            writeln!(f, "accounting           FAILED:")?;
            for p in &problems {
                writeln!(f, "  - {p}")?;
            }
        }
        writeln!(
            f,
            "elapsed              {:.2?} in all, the scheduler's pass included",
            self.elapsed
        )?;
        writeln!(f, "dead-letter store    {}", self.db_path.display())?;
        Ok(())
    }
}
