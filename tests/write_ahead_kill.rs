//! Write-ahead against a real process's death: a child process (this test binary, run again in
//! the child role) sends a keyed message through DeadLetter(write-ahead) → Retry → Classify →
//! hyper-util to an axum provider on loopback that fails the first attempt, so that the child
//! sleeps in backoff; the parent SIGKILLs it there, starts a scheduler on the same store (SQLite
//! file, or Postgres schema), and the provider, counting deliveries per `Idempotency-Key`,
//! receives the message exactly once.

mod postgres_support;
mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use backstop_test_support::Tests;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::{Backoff, Jitter, RetryPolicy};
use tower_backstop::store::{Filter, SqliteStore, Status, Store};

const KEY: &str = "order-42-confirmation";
const BODY: &str = "{\"order\":42,\"to\":\"a@example.com\"}";
/// The child's write-ahead lease: short, so that the takeover comes soon after the kill.
const LEASE: Duration = Duration::from_secs(2);

/// What the provider saw, per idempotency key: requests, and deliveries (202 answers).
#[derive(Clone, Default)]
struct Provider {
    requests: Arc<Mutex<HashMap<String, u32>>>,
    delivered: Arc<Mutex<HashMap<String, u32>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Provider {
    fn requests(&self) -> u32 {
        self.requests.lock().unwrap().get(KEY).copied().unwrap_or(0)
    }

    fn delivered(&self) -> u32 {
        self.delivered
            .lock()
            .unwrap()
            .get(KEY)
            .copied()
            .unwrap_or(0)
    }
}

/// A provider on 127.0.0.1 that answers 503 to the first request of each key, then 202.
async fn provider() -> (String, Provider) {
    async fn handle(State(p): State<Provider>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        p.bodies.lock().unwrap().push(body);
        let n = {
            let mut requests = p.requests.lock().unwrap();
            let n = requests.entry(key.clone()).or_default();
            *n += 1;
            *n
        };
        if n == 1 {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        *p.delivered.lock().unwrap().entry(key).or_default() += 1;
        StatusCode::ACCEPTED
    }
    let p = Provider::default();
    let router = axum::Router::new()
        .route("/v1/messages", post(handle))
        .with_state(p.clone());
    (support::serve(router).await, p)
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>()
}

/// Opens the store the parent names in `BACKSTOP_WA_STORE`: `sqlite:<path>` or
/// `postgres:<schema>` (at the test server's URL).
async fn open_store(spec: &str) -> Arc<dyn Store> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        return Arc::new(SqliteStore::open(path).unwrap());
    }
    #[cfg(feature = "postgres")]
    if let Some(schema) = spec.strip_prefix("postgres:") {
        let url = postgres_support::postgres_url();
        let store = tower_backstop::store::PostgresStore::connect(&url)
            .schema(schema)
            .await
            .unwrap();
        return Arc::new(store);
    }
    panic!("unknown store {spec:?}");
}

/// The child role (`BACKSTOP_WA_STORE` and `BACKSTOP_WA_PROVIDER` set): sends the message with
/// write-ahead and a 50 s backoff (under the policy's 60 s in-process bound) after a failed attempt, and should never get to the end.
/// Not a test of its own: listed only in the child process.
fn write_ahead_child() {
    let (Ok(spec), Ok(provider)) = (
        std::env::var("BACKSTOP_WA_STORE"),
        std::env::var("BACKSTOP_WA_PROVIDER"),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = open_store(&spec).await;
        let mut dead_letters = DeadLetterLayer::from_arc(store);
        if std::env::var_os("BACKSTOP_WA_OFF").is_none() {
            dead_letters = dead_letters.write_ahead_lease(LEASE);
        }
        let svc = ServiceBuilder::new()
            .layer(dead_letters)
            .layer(
                RetryPolicy::new()
                    .max_attempts(3)
                    .backoff(Backoff::constant(Duration::from_secs(50)).jitter(Jitter::None))
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(client());
        let request = http::Request::post(format!("{provider}/v1/messages"))
            .header("content-type", "application/json")
            .header("idempotency-key", KEY)
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .unwrap();
        let outcome = svc.oneshot(request).await;
        println!("child finished: {:?}", outcome.map(|r| r.status()));
    });
}

/// The child, with write-ahead unless `off`.
fn spawn_child(spec: &str, provider: &str, off: bool) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "write_ahead_child", "--nocapture"])
        .args(["--test-threads=1"])
        .env("BACKSTOP_WA_STORE", spec)
        .env("BACKSTOP_WA_PROVIDER", provider)
        .stdout(Stdio::null());
    if off {
        command.env("BACKSTOP_WA_OFF", "1");
    }
    command.spawn().unwrap()
}

/// Kills `child` with SIGKILL and checks that it died of it.
fn kill(mut child: Child) {
    use std::os::unix::process::ExitStatusExt;
    child.kill().unwrap();
    let exit = child.wait().unwrap();
    assert_eq!(exit.signal(), Some(9), "killed by SIGKILL: {exit:?}");
}

/// Polls `check` every 20 ms until it holds, at most `within`.
async fn until(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole run over the store `spec`: the child killed in backoff, a scheduler in this
/// process takes the message over, delivered once.
async fn killed_in_backoff_then_delivered_once(spec: &str) {
    let (url, provider) = provider().await;
    // Made (migrated) before the child opens it.
    let store = open_store(spec).await;
    let child = spawn_child(spec, &url, false);

    // The child stored the message, sent it once (503), and sleeps in its backoff.
    until(
        Duration::from_secs(30),
        "the child's first attempt",
        async || provider.requests() == 1,
    )
    .await;
    let record = store
        .get(KEY)
        .await
        .unwrap()
        .expect("stored before the attempt");
    assert_eq!(record.status, Status::InFlight, "{record:?}");
    assert_eq!(record.payload, BODY.as_bytes());

    kill(child);
    assert_eq!((provider.requests(), provider.delivered()), (1, 0));

    // The restart: a scheduler on the same store, over a stack of its own.
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)).write_ahead())
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client());
    let scheduler = Scheduler::new(Arc::clone(&store), svc, |r: &_| http_request(r, None))
        .poll_every(Duration::from_millis(100))
        .spawn();
    until(Duration::from_secs(30), "the takeover", async || {
        let record = store.get(KEY).await.unwrap().unwrap();
        record.status == Status::Resolved
    })
    .await;
    scheduler.shutdown().await;
    assert_eq!(provider.delivered(), 1, "delivered exactly once");
    assert_eq!(
        provider.requests(),
        2,
        "the child's failed attempt and the takeover"
    );
    let bodies = provider.bodies.lock().unwrap().clone();
    assert_eq!(bodies, [BODY.as_bytes(), BODY.as_bytes()]);
    let record = store.get(KEY).await.unwrap().unwrap();
    assert_eq!((record.status, record.resends), (Status::Resolved, 1));
}

async fn sqlite_sigkill_mid_backoff_delivered_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sqlite:{}", dir.path().join("dl.db").display());
    killed_in_backoff_then_delivered_once(&spec).await;
}

/// The control: without write-ahead, the same death in backoff leaves nothing in the store, and
/// the message is lost (what write-ahead is for).
async fn sqlite_sigkill_mid_backoff_without_write_ahead_loses_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sqlite:{}", dir.path().join("dl.db").display());
    let (url, provider) = provider().await;
    let store = open_store(&spec).await;
    let child = spawn_child(&spec, &url, true);
    until(
        Duration::from_secs(30),
        "the child's first attempt",
        async || provider.requests() == 1,
    )
    .await;
    kill(child);
    assert_eq!(store.get(KEY).await.unwrap(), None, "nothing stored");
    assert!(
        store
            .search(&Filter::new(), 0..10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(provider.delivered(), 0);
}

#[cfg(feature = "postgres")]
async fn postgres_sigkill_mid_backoff_delivered_exactly_once() {
    let schema = postgres_support::fresh_schema("write_ahead_kill");
    let spec = format!("postgres:{schema}");
    killed_in_backoff_then_delivered_once(&spec).await;
    let pool = sqlx::PgPool::connect(&postgres_support::postgres_url())
        .await
        .unwrap();
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

fn main() {
    let mut tests = Tests::new();
    tests.child_role("write_ahead_child", "BACKSTOP_WA_STORE", write_ahead_child);
    tests.multi_thread(
        "sqlite_sigkill_mid_backoff_delivered_exactly_once",
        sqlite_sigkill_mid_backoff_delivered_exactly_once,
    );
    tests.multi_thread(
        "sqlite_sigkill_mid_backoff_without_write_ahead_loses_the_message",
        sqlite_sigkill_mid_backoff_without_write_ahead_loses_the_message,
    );
    #[cfg(feature = "postgres")]
    tests
        .needs(backstop_test_support::Service::Postgres)
        .multi_thread(
            "postgres_sigkill_mid_backoff_delivered_exactly_once",
            postgres_sigkill_mid_backoff_delivered_exactly_once,
        );
    tests.run();
}
