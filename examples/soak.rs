//! A soak test of the README's stack against a faulty provider on loopback, beside tower's own
//! `Retry` + `Timeout` in the same process.
//!
//! ```text
//! cargo run --release --example soak                # the full run (about 6 minutes)
//! cargo run --release --example soak -- --long-only # the long outage alone
//! cargo run --example soak -- --small               # the small run `.ci/run` makes (about 1 minute)
//! ```
//!
//! # The provider
//!
//! An axum server on `127.0.0.1:0` that keeps a ledger of side effects:
//!
//! - `POST /v1/messages` with a JSON body `{"id": "...", "to": "..."}` commits one side effect for
//!   message `id` and answers `202 Accepted`, unless a fault is due. It honours `Idempotency-Key`:
//!   a key it has already committed answers `202` again without a second side effect. A request
//!   without a key is committed every time it arrives: that is how duplicates happen.
//! - `GET /v1/messages/{id}` answers whether message `id` was committed:
//!   `200 {"id": "...", "committed": true, "effects": 1}` (`effects` counts the side effects, so
//!   more than 1 is a duplicate), or `{"committed": false, "effects": 0}` for a message it never
//!   committed. This is the reconciliation status check a user writes for an outcome that stayed
//!   unknown (a timeout or reset after a keyless POST).
//!
//! Faults, by scenario:
//!
//! - **mixed**: 30 % of messages get a fault on their first request, one of eight, chosen from the
//!   message id: 503; 503 with `Retry-After: 1`; 429; 500; 400 (on every request: the request is
//!   bad); reset after commit (the side effect is committed, then the connection is reset before
//!   any answer); a 2 s hang (then commit and 202, if the client is still there); slow 200 ms
//!   (then commit and 202). Later requests for the message are healthy (except 400).
//! - **outage**: healthy for 3 s, every request answered 503 for 5 s, healthy for 4 s, with
//!   messages sent open loop at 200 per second; then the dead-letter scheduler re-sends what was
//!   deferred.
//!
//! - **long outage** (ours alone; `support/long_outage.rs`): healthy 3 s, every request answered
//!   503 for 120 s (15 s in the small run), healthy 30 s (10 s), 50 messages a second open loop
//!   throughout, each with an idempotency key, over a SQLite store, with the dead-letter
//!   scheduler (at its default rate of 50 re-sends a second) running beside the callers from the
//!   start.
//!
//! One message in ten of the mixed and outage scenarios is a keyless POST (no `Idempotency-Key`),
//! the rest carry their id as key.
//!
//! # The stacks
//!
//! - **ours**, the README's: `DeadLetterLayer` (in-memory store) → `RetryLayer` (5 attempts,
//!   default backoff, a server's hint slept in process only up to one per-attempt timeout: a
//!   longer one is deferred to the store, and the dead-letter scheduler sends it when due; with
//!   a status check, `RetryPolicy::reconcile`) → `BreakerLayer::per_host` (per host, 50 % of
//!   the last 100 calls with at least 20, open 1 s doubling to 30 s, jitter 0.5) →
//!   `ClassifyLayer::http()` → `TimeoutLayer` (500 ms per attempt) → hyper-util client.
//!
//!   The status check is an option of the retry policy: its verdict decides whether the retry
//!   layer may resend, and it runs above the breaker, so that a timeout or reset still counts
//!   against the provider when the check then finds the message delivered. It asks the provider's
//!   `GET /v1/messages/{id}` (the id read from the JSON payload: a keyless POST has no other)
//!   through a plain hyper-util client, within 250 ms: `committed: true` → delivered (the caller
//!   gets a stand-in response marked `Delivery::Delivered`, counted delivered), `committed: false` → not
//!   delivered (resent by the normal retry rules), anything else → unknown (dead-lettered as
//!   outcome-unknown). It runs only for an outcome-unknown failure of a keyless POST.
//! - **tower**: `tower::retry::Retry` (5 attempts, no backoff, retries every error and 408, 429,
//!   5xx) → `tower::timeout::Timeout` (500 ms) → the same client.
//!
//! # The report and the targets
//!
//! For each stack and scenario: duplicates (messages with more than one side effect), "lost
//! track" (the caller saw a failure, the provider committed), requests per message overall and
//! during the outage, p50/p99/max latency, wall time, and where each message ended (delivered,
//! dead letter, deferred). The run exits with status 1 when one of ours misses a target:
//!
//! - mixed: no duplicates; no lost track; at least 92.5 % delivered (1,850 of 2,000), counting
//!   the scheduler's pass over what was deferred; no caller waits longer than its bound (5
//!   attempts × (500 ms + the 250 ms status check) + 4 delays of at most 2 s: the 1 s
//!   `Retry-After` doubled by the throttled slow-down, above every backoff cap here); every
//!   message settled (the callers' run plus the scheduler's pass) within 2× tower's wall time.
//!   The small run gates on the callers' run alone and prints the settled ratio: its scheduler
//!   pass is a fixed tail of about a second (the last deferral's `Retry-After`), which does not
//!   shrink with the run.
//! - outage: at most 1.1 provider requests per message sent during the outage; no lost track;
//!   every message delivered or in the store; after the scheduler's pass at least 99 %
//!   delivered, each once.
//! - long outage: every deliverable message delivered exactly once (the few that used up their
//!   attempts on real 503s before the breaker opened are dead letters by the retry policy and
//!   counted apart); no record dead only because of local rejections; none lost or still waiting;
//!   at most one scheduler send reaching the provider per breaker half-open period during the
//!   outage; every deferred record read halfway through names the 503 as its root cause; the
//!   backlog drained, from the breaker's closing, within 2× the time the scheduler's rate allows
//!   (+ 1 s of polling). It also prints the time from recovery until the breaker closed.
//!
//! # Where the wall time goes
//!
//! `SOAK_DEBUG=1` prints, per stack and scenario, the callers' latency summed by the fault of
//! the message's first request, and for ours every delay the retry layer slept, by source
//! (server hint or backoff) and class (through `RetryPolicy::listener`, installed only then).
//! The mixed scenario is a closed loop of 32 callers, so its wall time is about the summed
//! latency divided by 32, plus the drain of the last messages.
//!
//! One full run (release build, 2 shared cores): ours 2.66 s for the callers and 0.62 s for the
//! scheduler's pass, tower's 2.02 s (1.62× until every message settled, 1.31× for the callers).
//! Ours' callers waited 18.0 s more than tower's in all, and ours slept 17.6 s of default backoff
//! (352 delays of 0 to 100 ms, full jitter) and no server hint: the 78 messages answered `503`
//! with `Retry-After: 1` were deferred to the store at once (a 1 s hint is above the stack's
//! bound of one 500 ms attempt for hints), and the scheduler sent them 1 s later, after the
//! callers had moved on to other messages.
//!
//! Before that bound (no `max_hint_delay`, so hints up to `max_delay`'s 60 s slept in process), the
//! same run took 5.41 s (2.7×): the 78 hints held 78.0 caller-seconds, 2.4 s of wall time for 32
//! callers, more than tower's whole run. Tower's retry ignores the hint and goes out at once;
//! ours still never sends before the server's second (RFC 9110 §10.2.3): it parks the wait in the
//! store instead of in a caller.
//!
//! `--small` runs the same with 600 messages in the mixed scenario and an outage of 1 s healthy,
//! 2 s down, 1.5 s healthy.

#[path = "support/long_outage.rs"]
mod long_outage;
#[path = "support/settle.rs"]
mod settle;

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, PerKey};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::observe::Event;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::{Attempts, Delivery, RetryPolicy};
use tower_backstop::store::{Filter, MemoryStore, Record, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{Envelope, Failure};

type Req = http::Request<Full<Bytes>>;
/// tower's stack's response: hyper-util's, as it comes.
type Resp = http::Response<hyper::body::Incoming>;
/// Our stack's response: the body boxed, so that the retry layer's status check can stand in
/// with an empty one (`ReconciledResponse` needs a body with a `Default`).
type OurResp = http::Response<BoxBody<Bytes, hyper::Error>>;

const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
const MAX_ATTEMPTS: u32 = 5;
/// How long our reconciliation status check waits for the provider's answer.
const STATUS_CHECK_TIMEOUT: Duration = Duration::from_millis(250);
/// The longest delay our policy can choose in the mixed scenario (see the module docs).
const LONGEST_DELAY: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// The provider
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Unavailable,
    UnavailableRetryAfter,
    Throttled,
    Internal,
    BadRequest,
    ResetAfterCommit,
    Hang,
    Slow,
}

const FAULTS: [Fault; 8] = [
    Fault::Unavailable,
    Fault::UnavailableRetryAfter,
    Fault::Throttled,
    Fault::Internal,
    Fault::BadRequest,
    Fault::ResetAfterCommit,
    Fault::Hang,
    Fault::Slow,
];

/// FNV-1a: a fixed, dependency-free hash, so that every run faults the same messages.
fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fault a message's first request meets in the mixed scenario, if any (30 % of messages).
fn fault_of(id: &str) -> Option<Fault> {
    let h = hash(id);
    (h % 100 < 30).then(|| FAULTS[((h / 100) % 8) as usize])
}

/// Whether message number `n` is sent as a keyless POST (one in ten).
fn keyless(n: usize) -> bool {
    n % 10 == 9
}

#[derive(Default)]
struct Ledger {
    /// Side effects committed per message id.
    effects: HashMap<String, u32>,
    /// Idempotency keys already committed.
    keys: HashMap<String, ()>,
    /// Requests received per message id.
    requests: HashMap<String, u32>,
}

struct Provider {
    ledger: Mutex<Ledger>,
    mixed: bool,
    outage: AtomicBool,
    outage_requests: AtomicU64,
    /// Of those, the dead-letter scheduler's re-sends (the long outage marks them).
    resend_outage_requests: AtomicU64,
}

impl Provider {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits `id` under `key`: a key already committed adds no side effect.
    fn commit(&self, id: &str, key: Option<&str>) {
        let mut ledger = self.ledger();
        if let Some(key) = key {
            if ledger.keys.contains_key(key) {
                return;
            }
            ledger.keys.insert(key.to_owned(), ());
        }
        *ledger.effects.entry(id.to_owned()).or_default() += 1;
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Message {
    id: String,
    to: String,
}

/// A per-connection switch: a handler that wants its connection reset notifies it.
#[derive(Clone)]
struct Reset(Arc<Notify>);

async fn send_message(
    State(provider): State<Arc<Provider>>,
    reset: Option<axum::Extension<Reset>>,
    headers: HeaderMap,
    axum::Json(message): axum::Json<Message>,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let nth = {
        let mut ledger = provider.ledger();
        let n = ledger.requests.entry(message.id.clone()).or_default();
        *n += 1;
        *n
    };
    if provider.outage.load(Ordering::SeqCst) {
        provider.outage_requests.fetch_add(1, Ordering::Relaxed);
        if headers.contains_key(long_outage::RESEND_HEADER) {
            provider
                .resend_outage_requests
                .fetch_add(1, Ordering::Relaxed);
        }
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let fault = if provider.mixed {
        fault_of(&message.id).filter(|f| nth == 1 || *f == Fault::BadRequest)
    } else {
        None
    };
    let accepted = |provider: &Provider| {
        provider.commit(&message.id, key.as_deref());
        StatusCode::ACCEPTED.into_response()
    };
    match fault {
        None => accepted(&provider),
        Some(Fault::Unavailable) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Some(Fault::UnavailableRetryAfter) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
        )
            .into_response(),
        Some(Fault::Throttled) => StatusCode::TOO_MANY_REQUESTS.into_response(),
        Some(Fault::Internal) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Some(Fault::BadRequest) => StatusCode::BAD_REQUEST.into_response(),
        Some(Fault::ResetAfterCommit) => {
            provider.commit(&message.id, key.as_deref());
            if let Some(axum::Extension(Reset(reset))) = reset {
                reset.notify_one();
            }
            // The connection is reset before this answer could be written.
            std::future::pending::<()>().await;
            StatusCode::ACCEPTED.into_response()
        }
        Some(Fault::Hang) => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            accepted(&provider)
        }
        Some(Fault::Slow) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            accepted(&provider)
        }
    }
}

#[derive(Serialize, Deserialize)]
struct MessageStatus {
    id: String,
    committed: bool,
    effects: u32,
}

/// `GET /v1/messages/{id}`: whether the provider committed message `id`.
async fn message_status(
    State(provider): State<Arc<Provider>>,
    Path(id): Path<String>,
) -> axum::Json<MessageStatus> {
    let effects = provider.ledger().effects.get(&id).copied().unwrap_or(0);
    axum::Json(MessageStatus {
        id,
        committed: effects > 0,
        effects,
    })
}

/// Starts a provider; returns its address and state. Each connection is served by hyper
/// directly, so that a handler can have its connection reset (zero linger, then closed).
async fn start_provider(mixed: bool) -> Result<(SocketAddr, Arc<Provider>), BoxError> {
    let provider = Arc::new(Provider {
        ledger: Mutex::default(),
        mixed,
        outage: AtomicBool::new(false),
        outage_requests: AtomicU64::new(0),
        resend_outage_requests: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/v1/messages", post(send_message))
        .route("/v1/messages/{id}", get(message_status))
        .with_state(Arc::clone(&provider));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let router = router.clone();
            tokio::spawn(async move {
                // A second handle on the same socket, to reset it while hyper owns the first.
                let Ok(std_stream) = stream.into_std() else {
                    return;
                };
                let Ok(twin) = std_stream
                    .try_clone()
                    .and_then(tokio::net::TcpStream::from_std)
                else {
                    return;
                };
                let Ok(stream) = tokio::net::TcpStream::from_std(std_stream) else {
                    return;
                };
                let reset = Reset(Arc::new(Notify::new()));
                let notify = Arc::clone(&reset.0);
                let service = hyper::service::service_fn(move |mut req: http::Request<_>| {
                    req.extensions_mut().insert(reset.clone());
                    let mut router = router.clone();
                    async move {
                        let req = req.map(axum::body::Body::new);
                        Ok::<_, Infallible>(router.call(req).await.into_response())
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = conn => {}
                    _ = notify.notified() => {
                        let _ = twin.set_zero_linger();
                    }
                }
            });
        }
    });
    Ok((addr, provider))
}

// ---------------------------------------------------------------------------------------------
// The stacks
// ---------------------------------------------------------------------------------------------

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// tower's own: retry every error and 408, 429, 5xx, up to 5 attempts, no backoff.
#[derive(Clone)]
struct TowerPolicy {
    left: u32,
}

impl tower::retry::Policy<Req, Resp, BoxError> for TowerPolicy {
    type Future = std::future::Ready<()>;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Resp, BoxError>) -> Option<Self::Future> {
        let again = match result {
            Ok(response) => {
                let s = response.status().as_u16();
                s == 408 || s == 429 || s >= 500
            }
            Err(_) => true,
        };
        (again && self.left > 0).then(|| {
            self.left -= 1;
            std::future::ready(())
        })
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = http::Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// The reconciliation status check of ours: `GET /v1/messages/{id}` on the provider at `addr`
/// (the id read from the JSON payload: a keyless POST has no other), through a plain
/// hyper-util client, within 250 ms. `committed: true` → delivered, `false` → not delivered;
/// anything else (an error, another status, a body that is not the status JSON, no answer in
/// time) → unknown, and the message stays outcome-unknown in the dead-letter store.
fn status_check(
    addr: SocketAddr,
) -> impl Fn(Envelope) -> Pin<Box<dyn Future<Output = Delivery> + Send>> + Send + Sync + 'static {
    let client = client();
    move |envelope: Envelope| {
        let client = client.clone();
        Box::pin(async move {
            let Ok(message) = serde_json::from_slice::<Message>(&envelope.payload) else {
                return Delivery::Unknown;
            };
            let Ok(uri) = format!("http://{addr}/v1/messages/{}", message.id).parse::<http::Uri>()
            else {
                return Delivery::Unknown;
            };
            let ask = async {
                let response = client.get(uri).await.ok()?;
                if response.status() != StatusCode::OK {
                    return None;
                }
                let body = response.into_body().collect().await.ok()?.to_bytes();
                serde_json::from_slice::<MessageStatus>(&body).ok()
            };
            match tokio::time::timeout(STATUS_CHECK_TIMEOUT, ask).await {
                Ok(Some(status)) if status.committed => Delivery::Delivered,
                Ok(Some(_)) => Delivery::NotDelivered,
                _ => Delivery::Unknown,
            }
        })
    }
}

/// The README's breaker, keyed per host.
fn readme_breaker() -> Result<BreakerLayer<PerKey>, BoxError> {
    Ok(BreakerLayer::builder()
        .failure_rate(0.5)
        .count_window(100)
        .minimum_calls(20)
        .open_doubling(Duration::from_secs(1), Duration::from_secs(30))
        .open_jitter(0.5)
        .per_host()
        .build()?)
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stack {
    Ours,
    Tower,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Delivered,
    DeadLetter,
    Deferred,
    /// The caller saw a failure and nothing holds the message (tower's stack has no store).
    Failed,
}

struct Sent {
    id: String,
    /// The dead-letter record id, when ours stored one.
    record: Option<String>,
    end: End,
    latency: Duration,
}

/// The delays our retry layer slept, by source and class: count, sum, longest (`SOAK_DEBUG`).
type Delays = std::collections::BTreeMap<(&'static str, String), (usize, Duration, Duration)>;

fn debug() -> bool {
    std::env::var_os("SOAK_DEBUG").is_some()
}

struct Outcome {
    /// Ours under `SOAK_DEBUG`: the delays the retry layer slept.
    delays: Delays,
    stack: Stack,
    scenario: &'static str,
    messages: Vec<Sent>,
    wall: Duration,
    provider: Arc<Provider>,
    outage_messages: u64,
    scheduler_pass: Option<Duration>,
    /// Messages deferred when the first pass ended, before the scheduler's.
    deferred_first_pass: usize,
}

fn request(uri: &http::Uri, n: usize) -> Result<(String, Req), BoxError> {
    let id = format!("m-{n:05}");
    let body = serde_json::to_vec(&Message {
        id: id.clone(),
        to: format!("user{n}@example.com"),
    })?;
    let mut builder =
        http::Request::post(uri.clone()).header(header::CONTENT_TYPE, "application/json");
    if !keyless(n) {
        builder = builder.header("idempotency-key", &id);
    }
    Ok((id, builder.body(Full::new(Bytes::from(body)))?))
}

/// Sends one request through `svc` and says how it ended, with our failure's dead-letter record.
/// A response the status check stood in with (the provider committed the message, its answer
/// was lost) is a delivery.
async fn send<S, B>(svc: S, req: Req) -> (End, Option<String>)
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
{
    match svc.oneshot(req).await {
        Ok(response) => {
            let ok = response.status() == StatusCode::ACCEPTED
                || response.extensions().get::<Delivery>() == Some(&Delivery::Delivered);
            let _ = response.into_body().collect().await;
            (if ok { End::Delivered } else { End::Failed }, None)
        }
        Err(error) => {
            let error: BoxError = error.into();
            match error
                .downcast_ref::<Failure<http::Response<B>>>()
                .and_then(|f| {
                    f.note::<DeadLetterStatus>()
                        .map(|d| (d, f.note::<Attempts>().is_some_and(Attempts::is_deferred)))
                }) {
                Some((DeadLetterStatus::Stored { id }, deferred)) => (
                    if deferred {
                        End::Deferred
                    } else {
                        End::DeadLetter
                    },
                    Some(id.clone()),
                ),
                _ => (End::Failed, None),
            }
        }
    }
}

/// The stack under test, boxed (the two answer with different body types).
#[derive(Clone)]
enum Under {
    Ours(tower::util::BoxCloneSyncService<Req, OurResp, BoxError>),
    Tower(tower::util::BoxCloneSyncService<Req, Resp, BoxError>),
}

impl Under {
    async fn send(self, req: Req) -> (End, Option<String>) {
        match self {
            Under::Ours(svc) => send(svc, req).await,
            Under::Tower(svc) => send(svc, req).await,
        }
    }
}

/// The shape of a run: how many messages and how they are paced.
#[derive(Clone, Copy)]
enum Load {
    /// `n` messages, `in_flight` at a time.
    Closed { n: usize, in_flight: usize },
    /// Healthy, down, healthy phases, at `rate` messages per second.
    Outage {
        healthy: Duration,
        down: Duration,
        after: Duration,
        rate: u32,
    },
}

async fn run(stack: Stack, scenario: &'static str, load: Load) -> Result<Outcome, BoxError> {
    let (addr, provider) = start_provider(matches!(load, Load::Closed { .. })).await?;
    let uri: http::Uri = format!("http://{addr}/v1/messages").parse()?;
    let store = Arc::new(MemoryStore::new());
    let delays = Arc::new(Mutex::new(Delays::new()));
    // The README's rule with a store: sleep a server's hint in process only up to one
    // per-attempt timeout; a longer hint (`Retry-After: 1`) is deferred to the store and the
    // scheduler sends it then. Backoff is still slept.
    let mut policy = RetryPolicy::new()
        .max_attempts(MAX_ATTEMPTS)
        .max_hint_delay(ATTEMPT_TIMEOUT)
        .reconcile::<Req, OurResp>(status_check(addr));
    if debug() {
        // Only under SOAK_DEBUG: the hook costs a lock per retry.
        let delays = Arc::clone(&delays);
        policy = policy.listener(move |e: &Event<'_>| {
            let Event::RetryScheduled {
                class,
                delay,
                source,
                ..
            } = *e
            else {
                return;
            };
            let mut delays = delays.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = delays
                .entry((source.as_str(), class.name().to_owned()))
                .or_default();
            entry.0 += 1;
            entry.1 += delay;
            entry.2 = entry.2.max(delay);
        });
    }
    let ours_typed = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(
            Arc::clone(&store) as Arc<dyn Store>
        ))
        .layer(policy.build()?)
        .layer(readme_breaker()?)
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(ATTEMPT_TIMEOUT))
        .map_response(|r: Resp| r.map(BodyExt::boxed))
        .service(client());
    let ours = ours_typed
        .clone()
        .map_err(|f: Failure<OurResp>| -> BoxError { Box::new(f) });
    let theirs = ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(TowerPolicy {
            left: MAX_ATTEMPTS - 1,
        }))
        .layer(tower::timeout::TimeoutLayer::new(ATTEMPT_TIMEOUT))
        .service(client());
    let svc = match stack {
        Stack::Ours => Under::Ours(tower::util::BoxCloneSyncService::new(ours)),
        Stack::Tower => Under::Tower(tower::util::BoxCloneSyncService::new(theirs)),
    };

    let start = Instant::now();
    let mut tasks = JoinSet::new();
    let mut outage_messages = 0;
    match load {
        Load::Closed { n, in_flight } => {
            let slots = Arc::new(Semaphore::new(in_flight));
            for i in 0..n {
                let slot = Arc::clone(&slots).acquire_owned().await?;
                let (id, req) = request(&uri, i)?;
                let svc = svc.clone();
                tasks.spawn(async move {
                    let started = start.elapsed();
                    let (end, record) = svc.send(req).await;
                    drop(slot);
                    Sent {
                        id,
                        record,
                        end,
                        latency: start.elapsed() - started,
                    }
                });
            }
        }
        Load::Outage {
            healthy,
            down,
            after,
            rate,
        } => {
            let total = healthy + down + after;
            let every = Duration::from_secs(1) / rate;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut i = 0;
            loop {
                tick.tick().await;
                let now = start.elapsed();
                if now >= total {
                    break;
                }
                let down_now = now >= healthy && now < healthy + down;
                provider.outage.store(down_now, Ordering::SeqCst);
                if down_now {
                    outage_messages += 1;
                }
                let (id, req) = request(&uri, i)?;
                i += 1;
                let svc = svc.clone();
                tasks.spawn(async move {
                    let started = start.elapsed();
                    let (end, record) = svc.send(req).await;
                    Sent {
                        id,
                        record,
                        end,
                        latency: start.elapsed() - started,
                    }
                });
            }
            provider.outage.store(false, Ordering::SeqCst);
        }
    }
    let mut messages = Vec::new();
    while let Some(sent) = tasks.join_next().await {
        messages.push(sent?);
    }
    let wall = start.elapsed();
    let deferred_first_pass = messages.iter().filter(|m| m.end == End::Deferred).count();

    // Ours: the scheduler re-sends the deferred records when due, through the same stack.
    let mut scheduler_pass = None;
    if stack == Stack::Ours && messages.iter().any(|m| m.end == End::Deferred) {
        let pass = Instant::now();
        let scheduler = Scheduler::new(
            Arc::clone(&store) as Arc<dyn Store>,
            ours_typed,
            |r: &Record| http_request(r, None),
        )
        .poll_every(Duration::from_millis(50))
        .concurrency(64)
        // This load runs at about 1,000 messages a second: a scheduler must keep up with what
        // it defers (the default of 50 re-sends a second suits the long outage's 50 a second).
        .rate(1_000)
        .spawn();
        settle::until_settled(&*store, Duration::from_secs(90)).await?;
        scheduler.shutdown().await;
        // Every record, the resolved ones too: a message delivered by a re-send is one.
        let records: HashMap<String, Status> = store
            .search(&Filter::new(), 0..usize::MAX)
            .await?
            .into_iter()
            .map(|r| (r.id, r.status))
            .collect();
        for m in &mut messages {
            if m.end != End::Deferred {
                continue;
            }
            match m.record.as_ref().and_then(|r| records.get(r)) {
                Some(Status::Resolved) => m.end = End::Delivered,
                Some(Status::Dead) => m.end = End::DeadLetter,
                _ => {}
            }
        }
        scheduler_pass = Some(pass.elapsed());
    }
    let delays = std::mem::take(&mut *delays.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(Outcome {
        delays,
        stack,
        scenario,
        messages,
        wall,
        provider,
        outage_messages,
        scheduler_pass,
        deferred_first_pass,
    })
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

struct Figures {
    sent: usize,
    delivered: usize,
    dead: usize,
    deferred: usize,
    failed: usize,
    duplicates: usize,
    lost_track: usize,
    requests: u64,
    max_requests: u32,
    outage_ratio: Option<f64>,
    p50: Duration,
    p99: Duration,
    max: Duration,
    /// Messages delivered exactly once / delivered.
    exactly_once: usize,
}

fn figures(o: &Outcome) -> Figures {
    let ledger = o.provider.ledger();
    let count = |end| o.messages.iter().filter(|m| m.end == end).count();
    let mut latencies: Vec<Duration> = o.messages.iter().map(|m| m.latency).collect();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    let effects = |id: &str| ledger.effects.get(id).copied().unwrap_or(0);
    Figures {
        sent: o.messages.len(),
        delivered: count(End::Delivered),
        dead: count(End::DeadLetter),
        deferred: count(End::Deferred),
        failed: count(End::Failed),
        duplicates: ledger.effects.values().filter(|n| **n > 1).count(),
        lost_track: o
            .messages
            .iter()
            .filter(|m| m.end != End::Delivered && effects(&m.id) > 0)
            .count(),
        requests: ledger.requests.values().map(|n| u64::from(*n)).sum(),
        max_requests: ledger.requests.values().copied().max().unwrap_or(0),
        outage_ratio: (o.outage_messages > 0).then(|| {
            o.provider.outage_requests.load(Ordering::Relaxed) as f64 / o.outage_messages as f64
        }),
        p50: pct(0.50),
        p99: pct(0.99),
        max: latencies.last().copied().unwrap_or_default(),
        exactly_once: o
            .messages
            .iter()
            .filter(|m| m.end == End::Delivered && effects(&m.id) == 1)
            .count(),
    }
}

fn row(o: &Outcome, f: &Figures) -> String {
    let outage = f.outage_ratio.map_or("-".to_owned(), |r| format!("{r:.2}"));
    let pass = o.scheduler_pass.map_or(String::new(), |d| {
        format!(
            " (+{:.1} s scheduler for {} deferred)",
            d.as_secs_f64(),
            o.deferred_first_pass
        )
    });
    format!(
        "| {} | {:?} | {} | {} / {} / {} / {} | {} | {} | {:.2} / {} | {} | {:.2} / {:.2} / {:.2} s | {:.1} s{} |",
        o.scenario,
        o.stack,
        f.sent,
        f.delivered,
        f.dead,
        f.deferred,
        f.failed,
        f.duplicates,
        f.lost_track,
        f.requests as f64 / f.sent.max(1) as f64,
        f.max_requests,
        outage,
        f.p50.as_secs_f64(),
        f.p99.as_secs_f64(),
        f.max.as_secs_f64(),
        o.wall.as_secs_f64(),
        pass,
    )
}

/// The long outage's plan: 15 s down in the small run, 120 s in the full one, at 50 messages a
/// second, the scheduler at its default rate of 50 re-sends a second.
fn long_plan(small: bool) -> long_outage::Plan {
    long_outage::Plan {
        healthy: Duration::from_secs(3),
        down: Duration::from_secs(if small { 15 } else { 120 }),
        after: Duration::from_secs(if small { 10 } else { 30 }),
        rate: 50,
        drain_rate: 50,
    }
}

/// Runs the long outage, prints its report, and returns its targets: each met or not, and what
/// it says.
async fn long_outage_targets(small: bool) -> Result<Vec<(bool, String)>, BoxError> {
    let plan = long_plan(small);
    let r = long_outage::run(plan).await?;
    println!(
        "long outage: healthy {:?}, 503 for {:?}, healthy {:?}, {} messages/s open loop, scheduler at {}/s",
        plan.healthy, plan.down, plan.after, plan.rate, plan.drain_rate
    );
    println!(
        "long outage: {} sent, {} delivered ({} exactly once), {} dead after exhausting their attempts, {} dead by local rejections, {} still waiting, {} lost",
        r.sent, r.delivered, r.delivered_once, r.dead_exhausted, r.dead_local, r.waiting, r.lost
    );
    if let Some((message, cause)) = &r.sample {
        println!("long outage: a record read mid-outage: {message:?}, root cause {cause:?}");
    }
    println!(
        "long outage: recovery to breaker closed {:.1} s; backlog then {} records; drained in {:.1} s (the rate allows {:.1} s)",
        r.recovery_to_close.as_secs_f64(),
        r.backlog,
        r.drain.as_secs_f64(),
        r.drain_allowed.as_secs_f64()
    );
    let deliverable = r.sent - r.dead_exhausted;
    Ok(vec![
        (
            r.delivered == deliverable && r.delivered_once == r.delivered && r.duplicates == 0,
            format!(
                "long outage: {} of {deliverable} deliverable messages delivered, {} exactly once, {} duplicates (target all, once)",
                r.delivered, r.delivered_once, r.duplicates
            ),
        ),
        (
            r.dead_local == 0,
            format!(
                "long outage: {} records dead only because of local rejections (target 0)",
                r.dead_local
            ),
        ),
        (
            r.lost == 0 && r.waiting == 0,
            format!(
                "long outage: {} messages lost, {} still waiting (target 0)",
                r.lost, r.waiting
            ),
        ),
        (
            r.resends_in_outage <= r.half_open_periods,
            format!(
                "long outage: {} scheduler sends reached the provider during the outage, over {} half-open periods (target at most 1 per period)",
                r.resends_in_outage, r.half_open_periods
            ),
        ),
        (
            r.read_mid_outage > 0 && r.named_cause == r.read_mid_outage,
            format!(
                "long outage: {} of {} deferred records read mid-outage name the provider's 503 as root cause (target all)",
                r.named_cause, r.read_mid_outage
            ),
        ),
        (
            r.drain <= r.drain_allowed * 2 + Duration::from_secs(1),
            format!(
                "long outage: backlog of {} drained {:.1} s after the breaker closed (target at most 2x the {:.1} s the rate allows, + 1 s of polling)",
                r.backlog,
                r.drain.as_secs_f64(),
                r.drain_allowed.as_secs_f64()
            ),
        ),
    ])
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let small = std::env::args().any(|a| a == "--small");
    if std::env::args().any(|a| a == "--long-only") {
        let targets = long_outage_targets(small).await?;
        let missed = targets.iter().filter(|(ok, _)| !ok).count();
        for (ok, what) in &targets {
            println!("{} {what}", if *ok { "ok    " } else { "MISSED" });
        }
        println!(
            "soak: {}",
            if missed == 0 {
                "every target met".to_owned()
            } else {
                format!("{missed} target(s) missed")
            }
        );
        return Ok(if missed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let (mixed, outage) = if small {
        (
            Load::Closed {
                n: 600,
                in_flight: 32,
            },
            Load::Outage {
                healthy: Duration::from_secs(1),
                down: Duration::from_secs(2),
                after: Duration::from_millis(1500),
                rate: 200,
            },
        )
    } else {
        (
            Load::Closed {
                n: 2000,
                in_flight: 32,
            },
            Load::Outage {
                healthy: Duration::from_secs(3),
                down: Duration::from_secs(5),
                after: Duration::from_secs(4),
                rate: 200,
            },
        )
    };
    println!(
        "soak ({}): 127.0.0.1 provider, {MAX_ATTEMPTS} attempts, {ATTEMPT_TIMEOUT:?} per attempt",
        if small { "small" } else { "full" }
    );
    let mut outcomes = Vec::new();
    for (scenario, load) in [("mixed", mixed), ("outage", outage)] {
        for stack in [Stack::Tower, Stack::Ours] {
            outcomes.push(run(stack, scenario, load).await?);
        }
    }

    let mut table = String::new();
    let _ = writeln!(
        table,
        "| scenario | stack | messages | delivered / dead letter / deferred / failed | duplicates | lost track | requests per message (mean / max) | requests per message sent in the outage | p50 / p99 / max latency | wall time |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|");
    let figs: Vec<Figures> = outcomes.iter().map(figures).collect();
    for (o, f) in outcomes.iter().zip(&figs) {
        let _ = writeln!(table, "{}", row(o, f));
    }
    println!("{table}");
    if debug() {
        // Where the callers' time goes: latency summed per fault of the message's first request
        // (mixed scenario: closed loop, so wall time is about the sum over the callers), and
        // the delays our retry layer slept, by source and class.
        for o in &outcomes {
            let mut by: std::collections::BTreeMap<String, (usize, Duration)> = Default::default();
            for m in &o.messages {
                let k = format!(
                    "{:?}{}",
                    fault_of(&m.id),
                    if m.id.ends_with('9') { " keyless" } else { "" }
                );
                let e = by.entry(k).or_default();
                e.0 += 1;
                e.1 += m.latency;
            }
            let total: Duration = o.messages.iter().map(|m| m.latency).sum();
            println!(
                "{} {:?}: latency summed {:.1} s over {} messages, by first fault:",
                o.scenario,
                o.stack,
                total.as_secs_f64(),
                o.messages.len()
            );
            for (k, (n, sum)) in &by {
                println!(
                    "  {k:<36} {n:>5} messages  {:>8.2} s summed  {:>7.1} ms mean",
                    sum.as_secs_f64(),
                    sum.as_secs_f64() * 1000.0 / *n as f64
                );
            }
            for ((source, class), (n, sum, max)) in &o.delays {
                println!(
                    "  slept ({source}, {class}): {n} delays, {:.2} s summed, longest {:.3} s",
                    sum.as_secs_f64(),
                    max.as_secs_f64()
                );
            }
        }
        let summed = |scenario, stack| -> Duration {
            outcomes
                .iter()
                .filter(|o| o.scenario == scenario && o.stack == stack)
                .flat_map(|o| o.messages.iter().map(|m| m.latency))
                .sum()
        };
        let slept = |source| -> Duration {
            outcomes
                .iter()
                .filter(|o| o.scenario == "mixed" && o.stack == Stack::Ours)
                .flat_map(|o| o.delays.iter())
                .filter(|((s, _), _)| *s == source)
                .map(|(_, (_, sum, _))| *sum)
                .sum()
        };
        let ours = summed("mixed", Stack::Ours);
        let tower = summed("mixed", Stack::Tower);
        println!(
            "mixed: ours' callers waited {:.1} s more than tower's in all; ours slept {:.1} s of server hints and {:.1} s of backoff",
            ours.saturating_sub(tower).as_secs_f64(),
            slept("server hint").as_secs_f64(),
            slept("backoff").as_secs_f64()
        );
    }

    // The targets, for our stack.
    let mut missed = Vec::new();
    let mut check = |ok: bool, what: String| {
        println!("{} {what}", if ok { "ok    " } else { "MISSED" });
        if !ok {
            missed.push(what);
        }
    };
    let find = |scenario, stack| {
        outcomes
            .iter()
            .zip(&figs)
            .find(|(o, _)| o.scenario == scenario && o.stack == stack)
            .expect("every run is there")
    };
    let (mixed_ours, mo) = find("mixed", Stack::Ours);
    let (mixed_tower, _) = find("mixed", Stack::Tower);
    check(
        mo.duplicates == 0,
        format!("mixed: {} duplicates (target 0)", mo.duplicates),
    );
    check(
        mo.lost_track == 0,
        format!(
            "mixed: {} lost track, the provider committed what the caller saw fail (target 0)",
            mo.lost_track
        ),
    );
    check(
        mo.delivered * 1000 >= mo.sent * 925,
        format!(
            "mixed: {} of {} delivered (target at least 92.5 %)",
            mo.delivered, mo.sent
        ),
    );
    // Until every message is settled: the callers' run, then the scheduler's pass over what was
    // deferred (the `Retry-After: 1` messages), against tower's run. The small run gates on the
    // callers' run alone: its scheduler pass is a fixed tail (the last deferral's second) that
    // does not shrink with the run, so it is printed there, not gated.
    let pass = mixed_ours.scheduler_pass.unwrap_or_default();
    let tower_wall = mixed_tower.wall.as_secs_f64().max(1e-9);
    let settled = (mixed_ours.wall + pass).as_secs_f64() / tower_wall;
    let callers = mixed_ours.wall.as_secs_f64() / tower_wall;
    check(
        if small {
            callers <= 2.0
        } else {
            settled <= 2.0
        },
        format!(
            "mixed: wall time {:.2} s + {:.2} s scheduler, tower's {:.2} s: {settled:.2}x until \
             settled, {callers:.2}x for the callers (target at most 2x; gated: {})",
            mixed_ours.wall.as_secs_f64(),
            pass.as_secs_f64(),
            mixed_tower.wall.as_secs_f64(),
            if small {
                "the callers' run"
            } else {
                "until settled"
            }
        ),
    );
    let bound = (ATTEMPT_TIMEOUT + STATUS_CHECK_TIMEOUT) * MAX_ATTEMPTS
        + LONGEST_DELAY * (MAX_ATTEMPTS - 1);
    // A little room for the loopback and the scheduler of this process itself.
    let over = mixed_ours
        .messages
        .iter()
        .filter(|m| m.latency > bound + Duration::from_millis(250))
        .count();
    check(
        over == 0,
        format!(
            "mixed: {over} callers waited longer than their bound of {bound:?} (max {:.2} s)",
            mo.max.as_secs_f64()
        ),
    );
    let (outage_ours, oo) = find("outage", Stack::Ours);
    let ratio = oo.outage_ratio.unwrap_or(0.0);
    check(
        ratio <= 1.1,
        format!(
            "outage: {ratio:.2} provider requests per message sent during the outage ({} messages; target at most 1.1)",
            outage_ours.outage_messages
        ),
    );
    check(
        oo.lost_track == 0,
        format!(
            "outage: {} lost track, the provider committed what the caller saw fail (target 0)",
            oo.lost_track
        ),
    );
    check(
        oo.failed == 0,
        format!(
            "outage: {} messages neither delivered nor in the store (target 0)",
            oo.failed
        ),
    );
    check(
        oo.delivered * 100 >= oo.sent * 99,
        format!(
            "outage: {} of {} delivered after the scheduler's pass (target at least 99 %)",
            oo.delivered, oo.sent
        ),
    );
    check(
        oo.exactly_once == oo.delivered && oo.duplicates == 0,
        format!(
            "outage: {} of {} delivered messages committed exactly once, {} duplicates",
            oo.exactly_once, oo.delivered, oo.duplicates
        ),
    );
    for (ok, what) in long_outage_targets(small).await? {
        check(ok, what);
    }
    Ok(if missed.is_empty() {
        println!("soak: every target met");
        ExitCode::SUCCESS
    } else {
        println!("soak: {} target(s) missed", missed.len());
        ExitCode::FAILURE
    })
}
