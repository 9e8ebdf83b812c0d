//! One process of the fleet: the README's preset over the shared store, a `Scheduler` beside it,
//! and its share of the messages sent open loop over the window.
//!
//! It talks to the parent by lines. On stdout: `ready` (store open, scheduler running), `ack
//! <key> <outcome>` when a caller's call ended (delivered, or failed and in the store: the
//! message is then the store's to finish), `done` when its share is all acknowledged, `bye` when
//! its scheduler has shut down, `claim <token> <id>` for each claim its scheduler wins
//! (`tap.rs`), and `spool <n>` when its local spool (if it has one) holds another number of
//! records, `breaker <state> <unix ms>` at each change of its breaker's state and `attempts <n>
//! <unix ms>`, the running count of requests it put on the wire (`breakers.rs`). On stdin: `go <unix ms>`, the start of the window; the end of
//! stdin asks it to shut down.

use std::collections::HashSet;
use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::Fleet;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{Record, Spool, Store};
use tower_backstop::{BackstopLayer, Failure};

use super::provider::RESEND_HEADER;
use super::tap::Tap;

type Req = http::Request<Full<Bytes>>;
type Resp = http::Response<hyper::body::Incoming>;
use super::{ATTEMPT_TIMEOUT, MAX_ATTEMPTS, key_of};

/// What a child is told on its command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub store: String,
    pub namespace: String,
    pub provider: SocketAddr,
    pub index: usize,
    pub children: usize,
    pub messages: usize,
    pub window: Duration,
    pub fleet_rate: Option<u32>,
    /// Keys of its share a killed predecessor had acknowledged: not sent again.
    pub skip: HashSet<String>,
    /// Its local spool's file, when the run takes the store down.
    pub spool: Option<std::path::PathBuf>,
    /// Whether it shares its breakers with the fleet (`--share-breakers`).
    pub share_breakers: bool,
}

/// Lines from the parent: `go <unix ms>`, then the end of stdin.
fn read_stdin() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// Runs the child until the parent closes its stdin.
pub async fn run(settings: Settings) -> Result<(), BoxError> {
    let mut stdin = read_stdin();
    let shared = super::stores::open(&settings.store, &settings.namespace, 5).await?;
    let store: Arc<dyn Store> = Arc::new(Tap(shared));
    let mut dead_letters = DeadLetterLayer::from_arc(Arc::clone(&store));
    if let Some(path) = &settings.spool {
        let spool = Spool::open(path)?;
        tokio::spawn(tell_spool(spool.clone()));
        dead_letters = dead_letters.spool(spool);
    }
    let backstop = BackstopLayer::http(ATTEMPT_TIMEOUT)
        .retry(RetryPolicy::new().max_attempts(MAX_ATTEMPTS).build()?)
        .dead_letters(dead_letters);
    // At start-up: the hosts the store knows were down start with their breakers open.
    backstop.learn_from_store().await?;
    let _fleet = if settings.share_breakers {
        let id = format!("child{}-{}", settings.index, std::process::id());
        Some(backstop.share_breakers(Fleet::new().process(id))?)
    } else {
        None
    };
    let health = backstop.health();
    tokio::spawn(super::breakers::tell_states(health.clone()));
    // Every request put on the wire, counted.
    let sent = Arc::new(AtomicU64::new(0));
    tokio::spawn(super::breakers::tell_attempts(Arc::clone(&sent)));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let client = tower::service_fn(move |req: Req| {
        sent.fetch_add(1, Ordering::Relaxed);
        client.request(req)
    });
    let stack = ServiceBuilder::new().layer(backstop).service(client);
    let index = settings.index;
    let mut scheduler = Scheduler::new(Arc::clone(&store), stack.clone(), move |r: &Record| {
        http_request(r, None).map(|mut req| {
            req.headers_mut()
                .insert(RESEND_HEADER, http::HeaderValue::from(index));
            req
        })
    });
    if let Some(rate) = settings.fleet_rate {
        scheduler = scheduler.fleet_rate(rate);
    }
    if settings.share_breakers {
        scheduler = scheduler.watch_breakers(health);
    }
    let scheduler = scheduler.spawn();
    println!("ready");

    let start = loop {
        match stdin.recv().await.flatten() {
            Some(line) => {
                if let Some(ms) = line.strip_prefix("go ").and_then(|ms| ms.parse().ok()) {
                    break UNIX_EPOCH + Duration::from_millis(ms);
                }
            }
            None => {
                scheduler.shutdown().await;
                return Ok(());
            }
        }
    };
    let uri: http::Uri = format!("http://{}/v1/messages", settings.provider).parse()?;
    let sending = tokio::spawn(send_share(settings, uri, start, stack));
    while stdin.recv().await.flatten().is_some() {}
    sending.abort();
    scheduler.shutdown().await;
    println!("bye");
    Ok(())
}

/// Tells the parent `spool <records>` each time the spool's depth changes (looked at every
/// 50 ms).
async fn tell_spool(spool: Spool) {
    let mut told = None;
    loop {
        let records = spool.state().records;
        if told != Some(records) {
            println!("spool {records}");
            told = Some(records);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends the child's share (message `j` for every `j` equal to its index modulo the number of
/// children), message `j` at `start + window × j / messages`, each on its own task, and
/// acknowledges each when its call ends.
async fn send_share<S>(settings: Settings, uri: http::Uri, start: SystemTime, stack: S)
where
    S: tower::Service<Req, Response = Resp, Error = Failure<Resp>> + Clone + Send + 'static,
    S::Future: Send,
{
    let now = (tokio::time::Instant::now(), SystemTime::now());
    let at = |j: usize| {
        let offset = settings.window.mul_f64(j as f64 / settings.messages as f64);
        let due = start + offset;
        now.0 + due.duration_since(now.1).unwrap_or(Duration::ZERO)
    };
    let mut calls = JoinSet::new();
    for j in (settings.index..settings.messages).step_by(settings.children) {
        let key = key_of(j);
        if settings.skip.contains(&key) {
            continue;
        }
        tokio::time::sleep_until(at(j)).await;
        let request = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", &key)
            .body(Full::new(Bytes::from(format!(r#"{{"id":"{key}"}}"#))));
        let Ok(request) = request else {
            println!("ack {key} unsendable");
            continue;
        };
        let svc = stack.clone();
        calls.spawn(async move {
            let outcome = match svc.oneshot(request).await {
                Ok(response) if response.status().is_success() => "delivered".to_owned(),
                Ok(response) => format!("answered-{}", response.status().as_u16()),
                Err(failure) => format!("failed:{}", failure.class()),
            };
            println!("ack {key} {outcome}");
        });
    }
    while calls.join_next().await.is_some() {}
    println!("done");
}
