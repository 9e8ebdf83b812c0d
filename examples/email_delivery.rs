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
//! No call sends a message more than 4 times: 300 ms per attempt, exponential backoff from 50 ms
//! capped at 1 s, a `Retry-After` of up to 2 s honoured; `unknown` failures (the 500s) are
//! retried once, cautiously (the policy's default). The circuit breaker is the README's: one per
//! host (here one host), opening when half of the last 100 calls failed once 20 were seen, for
//! 1 s doubling up to 30 s. Broken and slow recipients fail every attempt, but they are a small
//! share of the traffic, so the breaker should stay closed; if it opens, the calls it rejects
//! come back at once, are not attempts, and are stored as deferred records with the half-open
//! instant as their retry-at time. The breaker also paces the host: the first 429 of the busy
//! recipients begins a send-rate limit (a second's measure of what the host admits, then that
//! rate), later ones lower it, and a call above that rate waits for its turn (a wait, not an
//! attempt), within the same 2 s bound as a server's hint, or is stored deferred to its
//! turn. The dead-letter scheduler then sends the deferred records again, when due, through the
//! same stack (a last step of the example): each re-send is a call of its own, with its own
//! attempts, so a record deferred after failed attempts counts the attempts of both.
//!
//! Each dead letter is tagged with the recipient's domain. At the end the example prints a
//! summary of what happened, counted from the facts the crate gives (the retry layer's and the
//! scheduler's events, through their listener hooks, and the records of the SQLite store, a
//! fresh file under the temporary directory on each run):
//!
//! - the messages delivered at once (the first attempt accepted), after retries (accepted after
//!   failed attempts in the same call), or deferred and then delivered by the scheduler; the
//!   dead letters, by class; those still deferred;
//! - the attempts (requests that reached the provider) and the retries among them (attempts
//!   sent again after a failed one, in the same call), by the class of the failure that asked
//!   for them;
//! - the paced calls: waits for a turn of the send rate or of the concurrency limit, counted
//!   apart (neither attempts nor retries);
//! - the messages deferred to the scheduler, by cause: the breaker open, a send-rate wait longer
//!   than the bound, or their attempts used up (the second tier of retries, which this example
//!   leaves off); and the scheduler's re-sends;
//! - the breaker's transitions, the outcome per kind of recipient, and one sample dead letter
//!   per class, read back from the store.
//!
//! It checks that the provider accepted no message twice and that every message ended
//! delivered, dead or deferred, and exits with status 1 if not. Last, it prints the
//! `backstop-dlq stats` view of the store (top classes and codes, the rate, the alert signals),
//! the same [`Stats`] the command-line tool renders.
//!
//! Each request names its send in a header ([`SEND_HEADER`]: `first`, or the scheduler's
//! `resend-N`), so that the provider counts each call's requests on its side. The example's
//! test (`cargo test --example email_delivery`) runs the same pipeline on a slice of the file
//! and checks every count of the summary against what the provider counted.
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
use tower_backstop::breaker::{BreakerHandle, BreakerLayer, PerKey};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::observe::Event;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::{Attempts, Backoff, DelaySource, GiveUp, RetryPolicy};
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
/// Attempts per call (the first pass, and each scheduler re-send), whatever their class (a
/// breaker rejection is not one: it never reaches the provider); a record adds up its calls.
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
/// The header that names the send a request belongs to: [`FIRST_PASS`] for the first pass,
/// `resend-N` for the scheduler's N-th re-send. Every attempt of one call carries the same
/// value, so that the provider counts each call's requests (and its retries) on its side.
const SEND_HEADER: &str = "x-send";
/// The [`SEND_HEADER`] of the first pass.
const FIRST_PASS: &str = "first";

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

/// What the provider saw, per `Idempotency-Key`, and per send of a message (the key and the
/// sender's [`SEND_HEADER`]): the ground truth the summary is checked against.
#[derive(Debug, Default)]
struct ProviderLog {
    /// Requests received per key.
    requests: HashMap<String, u32>,
    /// Deliveries (202 Accepted answers) per key.
    deliveries: HashMap<String, u32>,
    /// Per send (key, [`SEND_HEADER`]): the requests of that call, its retries included.
    sends: HashMap<(String, String), SendLog>,
}

/// One send of a message as the provider saw it: one call of the sender, retries included.
#[derive(Clone, Copy, Debug, Default)]
struct SendLog {
    /// Requests received.
    requests: u32,
    /// Whether one of them was accepted (202).
    accepted: bool,
}

impl ProviderLog {
    /// Requests received in all.
    fn requests_total(&self) -> u64 {
        self.requests.values().map(|n| u64::from(*n)).sum()
    }
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
    let send = (
        key.clone(),
        headers
            .get(SEND_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
    );
    // The n-th request for this key, from 1.
    let seen = {
        let mut log = lock(&log);
        log.sends.entry(send.clone()).or_default().requests += 1;
        let n = log.requests.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let accept = |log: &SharedLog| {
        let mut log = lock(log);
        *log.deliveries.entry(key.clone()).or_default() += 1;
        log.sends.entry(send.clone()).or_default().accepted = true;
        drop(log);
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

/// How one message's first pass ended, as the sender saw it.
#[derive(Debug)]
enum Delivery {
    /// Accepted (202).
    Delivered,
    /// Failed, and the dead-letter layer stored its record: dead, or deferred for the scheduler
    /// (the store says which).
    Stored {
        class: Class,
        code: Code,
        attempts: u32,
        /// Why the retry layer stopped.
        give_up: Option<GiveUp>,
        /// The provider's answer, when the final failure was a response (a 400, a 500).
        provider_said: Option<String>,
    },
    /// Neither delivered nor stored: the dead letter could not be written, or the answer was a
    /// success that is not 202.
    Lost(String),
}

/// Why the first pass left a message deferred to the scheduler, read from its record and the
/// failure: the record's code names a breaker's rejection (`circuit open`) or a send-rate wait
/// (`paced, not sent`); any other deferred record used up its attempts (the second tier of
/// retries) or had a server hint longer than the in-process bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum DeferCause {
    BreakerOpen,
    SendRate,
    AttemptsUsedUp,
    LongHint,
}

impl DeferCause {
    const ALL: [DeferCause; 4] = [
        DeferCause::BreakerOpen,
        DeferCause::SendRate,
        DeferCause::AttemptsUsedUp,
        DeferCause::LongHint,
    ];

    fn of(record: &Record, give_up: Option<GiveUp>) -> DeferCause {
        if record.code == Code::CircuitOpen.to_string() {
            DeferCause::BreakerOpen
        } else if record.code == Code::Paced.to_string() {
            DeferCause::SendRate
        } else if give_up == Some(GiveUp::Deferred) {
            DeferCause::LongHint
        } else {
            DeferCause::AttemptsUsedUp
        }
    }

    fn describe(self) -> &'static str {
        match self {
            DeferCause::BreakerOpen => "breaker open",
            DeferCause::SendRate => "send-rate or concurrency-limit wait",
            DeferCause::AttemptsUsedUp => "attempts used up (second tier)",
            DeferCause::LongHint => "server's delay above the bound",
        }
    }
}

/// Where a message ended, once the scheduler's pass is over: read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
enum End {
    Delivered,
    Dead { class: String },
    Deferred,
    Lost(String),
}

#[derive(Debug)]
struct Outcome {
    id: String,
    behaviour: Behaviour,
    first: Delivery,
    /// Why the first pass left it deferred, if it did.
    deferred: Option<DeferCause>,
    end: End,
}

/// What the listener hooks told: the retry layer's events (attempts, retries, paced waits)
/// and the scheduler's (its re-sends).
#[derive(Clone, Debug, Default)]
struct Tally {
    /// Attempts that went out: every attempt that ended, but a breaker's rejection or a call
    /// the send rate held back (neither left the process).
    attempts: u64,
    /// Those numbered 2 or more: sent again after a failed attempt of the same call.
    retries: u64,
    /// Calls that succeeded on their first attempt.
    succeeded_at_once: u64,
    /// Calls that succeeded on a later attempt.
    succeeded_after_retries: u64,
    /// Retries scheduled after a failure (not a send-rate wait), per class of that failure,
    /// and how many of them waited for the server's hint (`Retry-After`).
    retries_scheduled: BTreeMap<&'static str, (u64, u64)>,
    /// Waits for a turn of the send rate or the concurrency limit, and their time in all.
    paced: u64,
    paced_for: Duration,
    /// Send-rate limits the breaker set on the host after throttled answers (each ends a
    /// second's measure of what the host admitted).
    rate_limits: u64,
    /// Calls an open breaker rejected.
    rejected: u64,
    /// The scheduler's re-sends, per outcome (`delivered`, `failed`, `held`).
    resent: BTreeMap<&'static str, u64>,
}

impl Tally {
    /// Counts `event`.
    fn see(&mut self, event: &Event<'_>) {
        match *event {
            Event::AttemptEnded { code, attempt, .. } => match code {
                Some(Code::CircuitOpen) => self.rejected += 1,
                Some(Code::Paced) => {}
                _ => {
                    self.attempts += 1;
                    self.retries += u64::from(attempt > 1);
                    if code.is_none() && attempt > 1 {
                        self.succeeded_after_retries += 1;
                    } else if code.is_none() {
                        self.succeeded_at_once += 1;
                    }
                }
            },
            Event::RetryScheduled {
                source: DelaySource::SendRate | DelaySource::ConcurrencyLimit,
                delay,
                ..
            } => {
                self.paced += 1;
                self.paced_for += delay;
            }
            Event::RetryScheduled { class, source, .. } => {
                let entry = self.retries_scheduled.entry(class.name()).or_default();
                entry.0 += 1;
                entry.1 += u64::from(source == DelaySource::ServerHint);
            }
            Event::Resent { outcome, .. } => *self.resent.entry(outcome).or_default() += 1,
            Event::SendRate {
                reason: "throttled",
                ..
            } => self.rate_limits += 1,
            _ => {}
        }
    }

    /// `self` and `other` added up.
    fn add(&self, other: &Tally) -> Tally {
        let mut sum = self.clone();
        sum.attempts += other.attempts;
        sum.retries += other.retries;
        sum.succeeded_at_once += other.succeeded_at_once;
        sum.succeeded_after_retries += other.succeeded_after_retries;
        for (class, (n, hinted)) in &other.retries_scheduled {
            let entry = sum.retries_scheduled.entry(class).or_default();
            entry.0 += n;
            entry.1 += hinted;
        }
        sum.paced += other.paced;
        sum.paced_for += other.paced_for;
        sum.rate_limits += other.rate_limits;
        sum.rejected += other.rejected;
        for (outcome, n) in &other.resent {
            *sum.resent.entry(outcome).or_default() += n;
        }
        sum
    }
}

type SharedTally = Arc<Mutex<Tally>>;

fn take(tally: &SharedTally) -> Tally {
    std::mem::take(&mut *tally.lock().unwrap_or_else(PoisonError::into_inner))
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

/// Sends one message through the stack and says how its first pass ended.
async fn deliver<S: Sender>(
    svc: S,
    uri: http::Uri,
    message: Message,
) -> (String, Behaviour, Delivery) {
    let behaviour = Behaviour::of(&message.to);
    let id = message.id.clone();
    let ended = |delivery| (id.clone(), behaviour, delivery);
    let body = match serde_json::to_vec(&message) {
        Ok(body) => body,
        Err(e) => return ended(Delivery::Lost(format!("cannot encode message: {e}"))),
    };
    let request = http::Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", &message.id)
        .header(SEND_HEADER, FIRST_PASS)
        .body(Full::new(Bytes::from(body)));
    let request = match request {
        Ok(request) => request,
        Err(e) => return ended(Delivery::Lost(format!("cannot build request: {e}"))),
    };
    match svc.oneshot(request).await {
        Ok(response) if response.status() == StatusCode::ACCEPTED => {
            // Read the body so the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            ended(Delivery::Delivered)
        }
        Ok(response) => ended(Delivery::Lost(format!(
            "unexpected success status {}",
            response.status()
        ))),
        Err(failure) => {
            match failure.note::<DeadLetterStatus>() {
                Some(DeadLetterStatus::Stored { .. }) => {}
                Some(DeadLetterStatus::NotStored { error, .. }) => {
                    return ended(Delivery::Lost(format!("dead letter not stored: {error}")));
                }
                _ => return ended(Delivery::Lost(format!("no dead letter for: {failure}"))),
            }
            let attempts = failure.note::<Attempts>();
            let (class, code) = (failure.class(), failure.code());
            let (count, give_up) = (
                attempts.map_or(0, Attempts::count),
                attempts.map(Attempts::give_up),
            );
            let provider_said = match failure.into_response() {
                Some(response) => match response.into_body().collect().await {
                    Ok(body) => Some(String::from_utf8_lossy(&body.to_bytes()).into_owned()),
                    Err(e) => Some(format!("(body unreadable: {e})")),
                },
                None => None,
            };
            ended(Delivery::Stored {
                class,
                code,
                attempts: count,
                give_up,
                provider_said,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run: the provider, the stack, the first pass and the scheduler's
// ---------------------------------------------------------------------------------------------

/// What the passes send through: the stack of [`stack`], by what they need of it.
trait Sender:
    tower::Service<
        Request,
        Response = http::Response<hyper::body::Incoming>,
        Error = tower_backstop::Failure<http::Response<hyper::body::Incoming>>,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Sender for S where
    S: tower::Service<
            Request,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower_backstop::Failure<http::Response<hyper::body::Incoming>>,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A listener that counts each event in `tally`.
fn counting(tally: &SharedTally) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    let tally = Arc::clone(tally);
    move |event: &Event<'_>| {
        tally
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .see(event)
    }
}

/// The stack every message goes through, counting the attempts that reached the client in
/// `attempts` and telling the retry layer's events to `tally`; and the breaker, to read its
/// counts at the end.
fn stack(
    store: &SqliteStore,
    tally: &SharedTally,
    attempts: &Arc<AtomicU64>,
) -> Result<(impl Sender, BreakerLayer<PerKey>), BoxError> {
    let policy = RetryPolicy::new()
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Backoff::exponential(BACKOFF_BASE, BACKOFF_CAP))
        .max_delay(MAX_DELAY)
        .listener(counting(tally));
    let breaker = BreakerLayer::builder()
        .failure_rate(BREAKER_FAILURE_RATE)
        .count_window(BREAKER_WINDOW)
        .minimum_calls(BREAKER_MINIMUM_CALLS)
        .open_doubling(BREAKER_OPEN_FOR, BREAKER_OPEN_CAP)
        .open_jitter(0.5)
        .listener(counting(tally))
        .per_host()
        .build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).tags(recipient_domain))
        .layer(policy.build()?)
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(ATTEMPT_TIMEOUT))
        .map_request({
            let attempts = Arc::clone(attempts);
            move |request: Request| {
                attempts.fetch_add(1, Ordering::Relaxed);
                request
            }
        })
        .service(client);
    Ok((svc, breaker))
}

/// Sends every message once through `svc`, [`CONCURRENCY`] at a time: how each first pass
/// ended.
async fn first_pass<S: Sender>(
    svc: S,
    uri: &http::Uri,
    messages: Vec<Message>,
) -> Result<Vec<(String, Behaviour, Delivery)>, BoxError> {
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    for message in messages {
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let (svc, uri) = (svc.clone(), uri.clone());
        tasks.spawn(async move {
            let ended = deliver(svc, uri, message).await;
            drop(slot);
            ended
        });
    }
    let mut ended = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        ended.push(joined?);
    }
    Ok(ended)
}

/// Every record in `store`, whatever its status, by id.
async fn every_record(store: &dyn Store) -> Result<HashMap<String, Record>, BoxError> {
    Ok(store
        .search(&Filter::new(), 0..usize::MAX)
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect())
}

/// Everything a run did: what the summary reads.
struct Report {
    total: usize,
    outcomes: Vec<Outcome>,
    /// The retry layer's events of the first pass, and of the scheduler's re-sends with the
    /// scheduler's own.
    first_pass_events: Tally,
    resend_events: Tally,
    /// Attempts that reached the client (the breaker's rejections and the paced calls never do).
    client_attempts: u64,
    breaker: Option<BreakerHandle>,
    first_pass: Duration,
    log: ProviderLog,
    /// Every record in the store at the end, resolved ones included.
    records: Vec<Record>,
    elapsed: Duration,
    db_path: PathBuf,
}

/// Runs the pipeline on `messages`: a provider on loopback, the stack over a SQLite store at
/// `db_path`, the first pass, then the scheduler's re-sends of what it deferred until none is
/// left (at most a minute). Prints a line per step.
async fn run(messages: Vec<Message>, db_path: PathBuf) -> Result<Report, BoxError> {
    let total = messages.len();
    let log = SharedLog::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = provider(log.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let uri: http::Uri = format!("http://{addr}/v1/messages").parse()?;
    println!("mail provider listening on http://{addr}");

    let dead_letters = SqliteStore::open(&db_path)?;
    let tally = SharedTally::default();
    let client_attempts = Arc::new(AtomicU64::new(0));
    let (svc, breaker) = stack(&dead_letters, &tally, &client_attempts)?;
    let started = Instant::now();
    let firsts = first_pass(svc.clone(), &uri, messages).await?;
    let first_pass = started.elapsed();
    let first_pass_events = take(&tally);

    // Which messages the first pass left deferred, and why: their records say.
    let after_first = every_record(&dead_letters).await?;
    let mut outcomes: Vec<Outcome> = firsts
        .into_iter()
        .map(|(id, behaviour, first)| {
            let deferred = match &first {
                Delivery::Stored { give_up, .. } => after_first
                    .get(&id)
                    .filter(|r| matches!(r.status, Status::Deferred | Status::InFlight))
                    .map(|r| DeferCause::of(r, *give_up)),
                _ => None,
            };
            Outcome {
                id,
                behaviour,
                first,
                deferred,
                end: End::Lost("not settled".to_owned()),
            }
        })
        .collect();
    let deferred = outcomes.iter().filter(|o| o.deferred.is_some()).count();
    if deferred > 0 {
        println!(
            "re-sending {deferred} deferred messages with the dead-letter scheduler, when due"
        );
        scheduler_pass(&dead_letters, svc, &tally).await?;
    }
    let resend_events = take(&tally);
    let records = every_record(&dead_letters).await?;
    for o in &mut outcomes {
        o.end = end_of(o, records.get(&o.id));
    }
    let elapsed = started.elapsed();
    server.abort();
    let log = std::mem::take(&mut *lock(&log));
    let mut records: Vec<Record> = records.into_values().collect();
    records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Report {
        total,
        outcomes,
        first_pass_events,
        resend_events,
        client_attempts: client_attempts.load(Ordering::Relaxed),
        breaker: breaker.handle_for(&addr.to_string()),
        first_pass,
        log,
        records,
        elapsed,
        db_path,
    })
}

/// The scheduler's pass: it re-sends the deferred records when due, through the same stack
/// (so that each re-send updates its own record), naming each re-send in [`SEND_HEADER`], and
/// tells its events to `tally`; until no record is deferred or in flight (at most a minute).
async fn scheduler_pass<S: Sender>(
    dead_letters: &SqliteStore,
    svc: S,
    tally: &SharedTally,
) -> Result<(), BoxError> {
    let store: Arc<dyn Store> = Arc::new(dead_letters.clone());
    let resends = AtomicU64::new(0);
    let rebuild = move |record: &Record| {
        let mut request = http_request(record, None)?;
        let n = resends.fetch_add(1, Ordering::Relaxed) + 1;
        let send = header::HeaderValue::from_str(&format!("resend-{n}"))?;
        request.headers_mut().insert(SEND_HEADER, send);
        Ok::<_, BoxError>(request)
    };
    let scheduler = Scheduler::new(Arc::clone(&store), svc, rebuild)
        .poll_every(Duration::from_millis(100))
        .concurrency(CONCURRENCY)
        .listener(counting(tally))
        .spawn();
    settle::until_settled(&*store, Duration::from_secs(60)).await?;
    scheduler.shutdown().await;
    Ok(())
}

/// Where `outcome`'s message ended, from its first pass and its record at the end.
fn end_of(outcome: &Outcome, record: Option<&Record>) -> End {
    match (&outcome.first, record) {
        (Delivery::Delivered, _) => End::Delivered,
        (Delivery::Lost(why), _) => End::Lost(why.clone()),
        (Delivery::Stored { .. }, None) => End::Lost("reported stored, not in the store".into()),
        (Delivery::Stored { .. }, Some(r)) => match r.status {
            Status::Resolved => End::Delivered,
            Status::Dead => End::Dead {
                class: r.class.clone(),
            },
            _ => End::Deferred,
        },
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
    println!(
        "sending {CONCURRENCY} at a time: {ATTEMPT_TIMEOUT:?} per attempt, at most \
         {MAX_ATTEMPTS} attempts per call, first pass or re-send (2 for unknown failures),\n  backoff \
         {BACKOFF_BASE:?}..{BACKOFF_CAP:?} with full jitter, server hints up to {MAX_DELAY:?}, \
         a breaker per host opening at {}% failed of the last {BREAKER_WINDOW} calls \
         (at least {BREAKER_MINIMUM_CALLS}) for {BREAKER_OPEN_FOR:?} doubling to \
         {BREAKER_OPEN_CAP:?}",
        BREAKER_FAILURE_RATE * 100.0
    );
    let report = run(messages, dead_letter_path()).await?;
    print!("{report}");

    // What an operator sees next: the `backstop-dlq stats` dashboard of the same store.
    println!();
    println!(
        "$ backstop-dlq --store {} stats --window 24h",
        report.db_path.display()
    );
    let stats = Stats::gather(
        &SqliteStore::open(&report.db_path)?,
        SystemTime::now(),
        Duration::from_secs(24 * 60 * 60),
        AlertRules::default(),
    )
    .await?;
    print!("{stats}");
    Ok(if report.problems().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

// ---------------------------------------------------------------------------------------------
// The summary
// ---------------------------------------------------------------------------------------------

/// The numbers of the summary, each counted once from the facts of the run: the messages'
/// ends (their records), the retry layer's and the scheduler's events.
#[derive(Debug, Default)]
struct Summary {
    total: u64,
    /// Delivered in the first pass, on the first attempt (the retry layer's events).
    at_once: u64,
    /// Delivered in the first pass after failed attempts of the same call (the events).
    after_retries: u64,
    /// Delivered in the first pass, by the messages' own ends.
    delivered_first_pass: u64,
    /// Deferred by the first pass, then delivered by the scheduler, by cause.
    resent_delivered: BTreeMap<DeferCause, u64>,
    /// Delivered in all.
    delivered: u64,
    /// Dead letters in all, by class, and those that were deferred first.
    dead: BTreeMap<String, u64>,
    dead_after_resend: u64,
    still_deferred: u64,
    lost: u64,
    /// Deferred by the first pass, by cause.
    deferred: BTreeMap<DeferCause, u64>,
    /// The events of both passes.
    events: Tally,
}

impl Report {
    fn summary(&self) -> Summary {
        let mut s = Summary {
            total: self.total as u64,
            at_once: self.first_pass_events.succeeded_at_once,
            after_retries: self.first_pass_events.succeeded_after_retries,
            events: self.first_pass_events.add(&self.resend_events),
            ..Summary::default()
        };
        for o in &self.outcomes {
            if let Some(cause) = o.deferred {
                *s.deferred.entry(cause).or_default() += 1;
            }
            match (&o.end, o.deferred) {
                (End::Delivered, None) => s.delivered_first_pass += 1,
                (End::Delivered, Some(cause)) => *s.resent_delivered.entry(cause).or_default() += 1,
                (End::Dead { class }, deferred) => {
                    *s.dead.entry(class.clone()).or_default() += 1;
                    s.dead_after_resend += u64::from(deferred.is_some());
                }
                (End::Deferred, _) => s.still_deferred += 1,
                (End::Lost(_), _) => s.lost += 1,
            }
        }
        s.delivered = s.delivered_first_pass + s.resent_delivered.values().sum::<u64>();
        s
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
            if let End::Lost(why) = &o.end {
                problems.push(format!("{} is unaccounted for: {why}", o.id));
            }
        }
        problems.extend(self.records_match_failures());
        let s = self.summary();
        if s.at_once + s.after_retries != s.delivered_first_pass {
            problems.push(format!(
                "the retry layer saw {} calls succeed in the first pass, the messages say {}",
                s.at_once + s.after_retries,
                s.delivered_first_pass
            ));
        }
        if s.events.attempts != self.client_attempts {
            problems.push(format!(
                "the retry layer counted {} attempts, {} reached the client",
                s.events.attempts, self.client_attempts
            ));
        }
        let delivered: BTreeSet<&str> = self
            .outcomes
            .iter()
            .filter(|o| o.end == End::Delivered)
            .map(|o| o.id.as_str())
            .collect();
        let accepted: BTreeSet<&str> = self.log.deliveries.keys().map(String::as_str).collect();
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

    /// The records say what the callers were told: a dead letter of the first pass has the
    /// class, code and attempts of the failure returned, and every record is of a message that
    /// failed.
    fn records_match_failures(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let records: HashMap<&str, &Record> =
            self.records.iter().map(|r| (r.id.as_str(), r)).collect();
        for o in &self.outcomes {
            let Delivery::Stored {
                class,
                code,
                attempts,
                ..
            } = &o.first
            else {
                continue;
            };
            let Some(record) = records.get(o.id.as_str()) else {
                continue; // reported as unaccounted for
            };
            if o.deferred.is_some() {
                continue; // the scheduler's re-sends changed it since
            }
            if record.class != class.name()
                || record.code != code.to_string()
                || record.attempts != *attempts
            {
                problems.push(format!(
                    "{}: stored record ({}, {}, {} attempts) differs from the failure \
                     returned ({class}, {code}, {attempts} attempts)",
                    o.id, record.class, record.code, record.attempts
                ));
            }
        }
        let failed: BTreeSet<&str> = self
            .outcomes
            .iter()
            .filter(|o| matches!(o.first, Delivery::Stored { .. }))
            .map(|o| o.id.as_str())
            .collect();
        for r in &self.records {
            if !failed.contains(r.id.as_str()) {
                problems.push(format!(
                    "{} is in the store but the sender did not see it fail",
                    r.id
                ));
            }
        }
        problems
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

/// `counts` as `name n, name n`, or `none`.
fn listed<K: fmt::Display>(counts: impl IntoIterator<Item = (K, u64)>) -> String {
    let parts: Vec<String> = counts
        .into_iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The deferred messages by cause: with `every`, the breaker, the send rate and the second
/// tier named even at 0 (a cause that cannot occur here, a hint above the bound, only when
/// it did); else the causes that occurred.
fn causes(counts: &BTreeMap<DeferCause, u64>, every: bool) -> String {
    listed(DeferCause::ALL.into_iter().filter_map(|c| {
        let n = counts.get(&c).copied().unwrap_or(0);
        let named = every && c != DeferCause::LongHint;
        (n > 0 || named).then_some((c.describe(), n))
    }))
}

/// The width of the summary's labels.
const LABEL: usize = 20;

/// One line of the summary: its label, its count right-aligned under the others, and what
/// the count is.
fn row(f: &mut fmt::Formatter<'_>, label: &str, n: u64, what: &str) -> fmt::Result {
    if what.is_empty() {
        writeln!(f, "{label:<LABEL$}{n:>5}")
    } else {
        writeln!(f, "{label:<LABEL$}{n:>5}  {what}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary();
        writeln!(f)?;
        writeln!(f, "=== email delivery summary ===")?;
        self.write_messages(f, &s)?;
        writeln!(f)?;
        self.write_attempts(f, &s)?;
        writeln!(f)?;
        self.write_recipients(f)?;
        self.write_samples(f)?;
        writeln!(f)?;
        self.write_checks(f, &s)?;
        writeln!(
            f,
            "{:<LABEL$}  {:.2?} for the first pass, {:.2?} in all, the scheduler's pass \
             included",
            "elapsed", self.first_pass, self.elapsed
        )?;
        writeln!(
            f,
            "{:<LABEL$}  {}",
            "dead-letter store",
            self.db_path.display()
        )?;
        Ok(())
    }
}

impl Report {
    /// What became of the messages.
    fn write_messages(&self, f: &mut fmt::Formatter<'_>, s: &Summary) -> fmt::Result {
        let resent: u64 = s.resent_delivered.values().sum();
        let dead: u64 = s.dead.values().sum();
        row(f, "messages read", s.total, "")?;
        row(f, "delivered (202)", s.delivered, "")?;
        row(f, "  at once", s.at_once, "the first attempt accepted")?;
        row(
            f,
            "  after retries",
            s.after_retries,
            "accepted after failed attempts of the same call",
        )?;
        row(
            f,
            "  deferred, re-sent",
            resent,
            &format!(
                "deferred, then delivered by the scheduler: {}",
                causes(&s.resent_delivered, false)
            ),
        )?;
        let after = match s.dead_after_resend {
            0 => String::new(),
            n => format!("; {n} of them deferred first, dead after a re-send"),
        };
        row(
            f,
            "dead letters",
            dead,
            &format!(
                "{} (from the store{after})",
                listed(s.dead.iter().map(|(c, n)| (c, *n)))
            ),
        )?;
        row(f, "still deferred", s.still_deferred, "")?;
        row(f, "unaccounted for", s.lost, "")
    }

    /// What the attempts, the waits and the scheduler did.
    fn write_attempts(&self, f: &mut fmt::Formatter<'_>, s: &Summary) -> fmt::Result {
        let e = &s.events;
        let provider = self.log.requests_total();
        let reached = if provider == self.client_attempts {
            "requests sent, all received by the provider".to_owned()
        } else {
            format!(
                "requests sent: {} reached the client, {provider} the provider",
                self.client_attempts
            )
        };
        row(f, "attempts", e.attempts, &reached)?;
        row(
            f,
            "  retries",
            e.retries,
            "attempts sent again after a failed one, in the same call",
        )?;
        let scheduled: u64 = e.retries_scheduled.values().map(|(n, _)| n).sum();
        let mut after: Vec<String> = e
            .retries_scheduled
            .iter()
            .map(|(class, (n, hinted))| match hinted {
                0 => format!("{class} {n}"),
                h => format!("{class} {n} ({h} waited for Retry-After)"),
            })
            .collect();
        if after.is_empty() {
            after.push("none".to_owned());
        }
        let mut text = format!("after a failure of class {}", after.join(", "));
        if scheduled > e.retries {
            text.push_str(&format!(
                "; {} never went out (deferred or given up first)",
                scheduled - e.retries
            ));
        }
        row(f, "  scheduled", scheduled, &text)?;
        row(
            f,
            "paced",
            e.paced,
            &format!(
                "waits for a turn of the send rate or the concurrency limit ({:.1?} waited in \
                 all): not attempts, not retries",
                e.paced_for
            ),
        )?;
        row(
            f,
            "deferred",
            s.deferred.values().sum(),
            &format!(
                "by the first pass, to the scheduler: {}",
                causes(&s.deferred, true)
            ),
        )?;
        row(
            f,
            "scheduler re-sends",
            e.resent.values().sum(),
            &listed(e.resent.iter().map(|(o, n)| (o, *n))),
        )?;
        let stats = self.breaker.as_ref().map(|b| b.stats()).unwrap_or_default();
        writeln!(
            f,
            "{:<LABEL$}  opened {}, half-opened {}, closed {}, rejected {}, {} probes; now {}",
            "breaker",
            stats.opened,
            stats.half_opened,
            stats.closed,
            plural(stats.rejected, "call", "calls"),
            stats.probes,
            self.breaker
                .as_ref()
                .map_or("never used".to_owned(), |b| b.state().to_string())
        )
    }

    /// The outcome per recipient behaviour: what the data asked for, and what happened.
    fn write_recipients(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<32} {:>8} {:>10} {:>9}  dead letters",
            "recipient", "messages", "delivered", "deferred"
        )?;
        let mut collateral = 0u64;
        for behaviour in Behaviour::ALL {
            let of_kind: Vec<&Outcome> = self
                .outcomes
                .iter()
                .filter(|o| o.behaviour == behaviour)
                .collect();
            if of_kind.is_empty() {
                continue;
            }
            let delivered = of_kind.iter().filter(|o| o.end == End::Delivered).count();
            let deferred = of_kind.iter().filter(|o| o.deferred.is_some()).count();
            let mut classes: BTreeMap<&str, u64> = BTreeMap::new();
            for o in &of_kind {
                if let End::Dead { class } = &o.end {
                    *classes.entry(class.as_str()).or_default() += 1;
                    collateral += u64::from(behaviour.deliverable());
                }
            }
            let classes = if classes.is_empty() {
                "-".to_owned()
            } else {
                listed(classes)
            };
            writeln!(
                f,
                "{:<32} {:>8} {delivered:>10} {deferred:>9}  {classes}",
                behaviour.describe(),
                of_kind.len(),
            )?;
        }
        if collateral > 0 {
            writeln!(
                f,
                "note: {} to recipients that would have accepted them ended as dead letters.\n      \
                 They are in the store, with the class that stopped them, to be re-driven.",
                plural(collateral, "message", "messages")
            )?;
        }
        Ok(())
    }

    /// One sample dead letter per class, read back from the store: dead letters only.
    fn write_samples(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut seen = BTreeSet::new();
        let mut samples: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| r.status == Status::Dead && seen.insert(r.class.as_str()))
            .collect();
        if samples.is_empty() {
            return Ok(());
        }
        samples.sort_by(|a, b| a.class.cmp(&b.class).then_with(|| a.id.cmp(&b.id)));
        let by_id: HashMap<&str, &Outcome> =
            self.outcomes.iter().map(|o| (o.id.as_str(), o)).collect();
        writeln!(f)?;
        writeln!(f, "sample dead letters (one per class, from the store):")?;
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
                if let Delivery::Stored {
                    provider_said: Some(said),
                    ..
                } = &outcome.first
                {
                    write!(f, "; provider said {}", truncate(said, 80))?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }

    /// The duplicate check and the accounting.
    fn write_checks(&self, f: &mut fmt::Formatter<'_>, s: &Summary) -> fmt::Result {
        let dups = self.duplicates();
        if dups.is_empty() {
            writeln!(
                f,
                "{:<LABEL$}  ok: {} keys delivered, none more than once",
                "duplicate check",
                self.log.deliveries.len()
            )?;
        } else {
            writeln!(
                f,
                "{:<LABEL$}  FAILED: {} delivered more than once",
                "duplicate check",
                plural(dups.len() as u64, "message", "messages")
            )?;
        }
        let problems = self.problems();
        if problems.is_empty() {
            writeln!(
                f,
                "{:<LABEL$}  ok: {} delivered + {} dead letters + {} still deferred = {} \
                 messages",
                "accounting",
                s.delivered,
                s.dead.values().sum::<u64>(),
                s.still_deferred,
                s.total
            )?;
        } else {
            writeln!(f, "{:<LABEL$}  FAILED:", "accounting")?;
            for p in &problems {
                writeln!(f, "  - {p}")?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The summary's test: `cargo test --example email_delivery`
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// What the provider counted, per send of a message (one call, its retries included).
    fn sends(log: &ProviderLog, first: bool) -> impl Iterator<Item = &SendLog> {
        log.sends
            .iter()
            .filter(move |((_, send), _)| (send == FIRST_PASS) == first)
            .map(|(_, s)| s)
    }

    /// The count the summary prints on the line labelled `label`.
    fn printed_count(printed: &str, label: &str) -> Option<u64> {
        printed.lines().find_map(|line| {
            let rest = line.strip_prefix(label)?;
            let rest = rest.strip_prefix(' ')?.trim_start();
            rest.split_whitespace().next()?.parse().ok()
        })
    }

    /// The pipeline on the first 80 messages of the shipped file (every kind of recipient),
    /// against a real provider on loopback: each number of the summary is the provider's own
    /// count of what it received and accepted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_summary_counts_what_the_provider_saw() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_INPUT);
        let messages: Vec<Message> = read_messages(&path).unwrap().into_iter().take(80).collect();
        let kinds: BTreeSet<Behaviour> = messages.iter().map(|m| Behaviour::of(&m.to)).collect();
        assert_eq!(kinds.len(), Behaviour::ALL.len(), "every kind of recipient");
        let db = dead_letter_path();
        let report = run(messages, db.clone()).await.unwrap();
        let _ = std::fs::remove_file(&db);
        let s = report.summary();
        let log = &report.log;
        let printed = report.to_string();
        assert!(report.problems().is_empty(), "{printed}");

        // Every message accounted for, each delivered one accepted once by the provider.
        let dead: u64 = s.dead.values().sum();
        assert_eq!(
            s.delivered + dead + s.still_deferred + s.lost,
            80,
            "{printed}"
        );
        assert_eq!(s.lost, 0, "{printed}");
        assert_eq!(s.delivered, log.deliveries.len() as u64, "{printed}");
        assert!(log.deliveries.values().all(|n| *n == 1), "{printed}");

        // Delivered at once, after retries, or by a re-send: the provider's 202s, per send.
        let first: Vec<&SendLog> = sends(log, true).collect();
        let at_once = first
            .iter()
            .filter(|s| s.accepted && s.requests == 1)
            .count() as u64;
        let after_retries = first
            .iter()
            .filter(|s| s.accepted && s.requests > 1)
            .count() as u64;
        let on_resend = sends(log, false).filter(|s| s.accepted).count() as u64;
        assert_eq!(s.at_once, at_once, "{printed}");
        assert_eq!(s.after_retries, after_retries, "{printed}");
        assert_eq!(
            s.resent_delivered.values().sum::<u64>(),
            on_resend,
            "{printed}"
        );

        // Attempts are what the provider received; retries, its requests beyond each call's
        // first. Waits for the send rate's turn reached nobody, and are counted apart.
        assert_eq!(s.events.attempts, log.requests_total(), "{printed}");
        let retries: u64 = log.sends.values().map(|s| u64::from(s.requests - 1)).sum();
        assert_eq!(s.events.retries, retries, "{printed}");
        assert!(
            s.events.rate_limits > 0,
            "the busy recipients' 429s limit the host's send rate: {printed}"
        );
        let scheduled: u64 = s.events.retries_scheduled.values().map(|(n, _)| n).sum();
        assert!(scheduled >= s.events.retries, "{printed}");

        // The deferred ones, by cause: the records' codes, and each one settled.
        let deferred: u64 = s.deferred.values().sum();
        let deferred_records = report
            .outcomes
            .iter()
            .filter(|o| o.deferred.is_some())
            .count() as u64;
        assert_eq!(deferred, deferred_records, "{printed}");
        assert_eq!(
            deferred,
            on_resend + s.dead_after_resend + s.still_deferred,
            "{printed}"
        );

        // The dead letters, by class, are the store's dead records.
        let mut stored: BTreeMap<String, u64> = BTreeMap::new();
        for r in report.records.iter().filter(|r| r.status == Status::Dead) {
            *stored.entry(r.class.clone()).or_default() += 1;
        }
        assert_eq!(s.dead, stored, "{printed}");

        // The summary prints those numbers under those names.
        for (label, n) in [
            ("delivered (202)", s.delivered),
            ("  at once", at_once),
            ("  after retries", after_retries),
            ("  deferred, re-sent", on_resend),
            ("attempts", log.requests_total()),
            ("  retries", retries),
            ("paced", s.events.paced),
            ("deferred", deferred),
        ] {
            assert_eq!(
                printed_count(&printed, label),
                Some(n),
                "{label:?} in {printed}"
            );
        }
        // The samples are dead letters only.
        let samples = &printed[printed.find("sample dead letters").unwrap_or(0)..];
        for r in report.records.iter().filter(|r| r.status != Status::Dead) {
            assert!(
                !samples.contains(&format!("  {}  class=", r.id)),
                "{samples}"
            );
        }
    }
}
