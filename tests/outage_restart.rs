//! The operator's trial, end to end on loopback: a webhook dispatcher (the preset over a SQLite
//! store, a hyper-util client, a scheduler) posts keyed events to two customers while one refuses
//! connections and the other answers 503; mid-outage the dispatcher is stopped and a new one is
//! started on the same store. When the customers come back, every event has reached its customer
//! exactly once (counted by the customers) and no dead letter is left.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceExt};
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule};
use tower_backstop::resend::{Scheduler, SchedulerHandle, http_request};
use tower_backstop::store::{Filter, Record, SqliteStore, Status, Store};
use tower_backstop::{BackstopLayer, Class};

/// Deliveries (202 answers) per idempotency key, counted by the customers.
type Ledger = Arc<Mutex<HashMap<String, u32>>>;

/// A customer on 127.0.0.1 that accepts each event (202) and counts it by key; `failing` makes
/// it answer 503, `stop` closes its port (connections refused) until `start`.
struct Customer {
    addr: SocketAddr,
    ledger: Ledger,
    failing: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Customer {
    async fn new(ledger: Ledger) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut customer = Customer {
            addr,
            ledger,
            failing: Arc::default(),
            server: None,
        };
        customer.serve(listener);
        customer
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (ledger, failing) = (self.ledger.clone(), self.failing.clone());
        let app = axum::Router::new().route(
            "/hooks",
            axum::routing::post(move |headers: axum::http::HeaderMap| async move {
                if failing.load(Ordering::SeqCst) {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                }
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                *ledger.lock().unwrap().entry(key).or_default() += 1;
                axum::http::StatusCode::ACCEPTED
            }),
        );
        self.server = Some(tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        }));
    }

    async fn stop(&mut self) {
        let server = self.server.take().unwrap();
        server.abort();
        let _ = server.await;
    }

    async fn start(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn uri(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }
}

type Dispatcher = tower_backstop::Backstop<Client<HttpConnector, Full<Bytes>>>;

/// One dispatcher process: the preset over `store` (learning from it which customers are down)
/// and its scheduler. The second tier's steps are the default's, scaled down to seconds so that
/// the trial stays short.
async fn dispatcher(store: &Arc<SqliteStore>) -> (Dispatcher, SchedulerHandle, usize) {
    let s = Duration::from_secs;
    let schedule = RetrySchedule::new()
        .class(Class::TRANSIENT, [s(1), s(2), s(4), s(8)])
        .class(Class::THROTTLED, [s(1), s(2), s(4), s(8)]);
    let layer = BackstopLayer::http(Duration::from_millis(500))
        .dead_letters(DeadLetterLayer::from_arc(store.clone()).retry_schedule(schedule));
    let learned = layer.learn_from_store().await.unwrap();
    // No pooled connections: a closed port refuses the next request at once.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    let svc = layer.layer(client);
    let scheduler = Scheduler::new(
        Arc::clone(store) as Arc<dyn Store>,
        svc.clone(),
        |r: &Record| http_request(r, None),
    )
    .poll_every(Duration::from_millis(100))
    .spawn();
    (svc, scheduler, learned)
}

/// Posts events `range` (alternating customers, 20 a second), each keyed, and waits for every
/// caller: the number answered at once; every other one must have been stored.
async fn post_events(svc: &Dispatcher, uris: &[String; 2], range: std::ops::Range<usize>) -> usize {
    let mut callers = Vec::new();
    for i in range {
        let req = http::Request::post(&uris[i % 2])
            .header("content-type", "application/json")
            .header("idempotency-key", format!("evt-{i:03}"))
            .body(Full::new(Bytes::from(format!("{{\"n\":{i}}}"))))
            .unwrap();
        callers.push(tokio::spawn(svc.clone().oneshot(req)));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut delivered = 0;
    for caller in callers {
        match caller.await.unwrap() {
            Ok(_) => delivered += 1,
            Err(failure) => assert!(
                matches!(
                    failure.note::<DeadLetterStatus>(),
                    Some(DeadLetterStatus::Stored { .. })
                ),
                "{failure}"
            ),
        }
    }
    delivered
}

async fn by_status(store: &SqliteStore) -> HashMap<Status, usize> {
    let mut counts = HashMap::new();
    for r in store.search(&Filter::new(), 0..usize::MAX).await.unwrap() {
        *counts.entry(r.status).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_an_outage_ends_with_every_event_delivered_once_and_no_dead_letter() {
    let ledger = Ledger::default();
    let mut refusing = Customer::new(ledger.clone()).await;
    let answering_503 = Customer::new(ledger.clone()).await;
    let uris = [refusing.uri(), answering_503.uri()];
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("hooks.db")).unwrap());

    // The first process: 40 events, the outage starting after the first 10.
    let (first, scheduler, learned) = dispatcher(&store).await;
    assert_eq!(learned, 0, "a fresh store knows of no customer down");
    let outage = {
        let failing = answering_503.failing.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            failing.store(true, Ordering::SeqCst);
        }
    };
    let (delivered_first, ()) = tokio::join!(post_events(&first, &uris, 0..40), async {
        outage.await;
        refusing.stop().await;
    });
    assert!(
        delivered_first >= 8,
        "those before the outage: {delivered_first}"
    );
    // Stopped mid-outage, its claims given back.
    scheduler.shutdown().await;
    drop(first);
    let stored = by_status(&store).await;
    assert!(
        stored.get(&Status::Deferred).copied().unwrap_or(0) > 0,
        "{stored:?}"
    );
    assert_eq!(stored.get(&Status::Dead), None, "{stored:?}");

    // The second process, on the same store, while both customers are still down: it learns
    // which customers are down and sends 40 more.
    let (second, scheduler, learned) = dispatcher(&store).await;
    assert!(learned >= 1, "the customers down are learned: {learned}");
    let delivered_second = post_events(&second, &uris, 40..80).await;
    assert_eq!(delivered_second, 0, "both customers are down");

    // The customers come back; the scheduler drains the backlog.
    refusing.start().await;
    answering_503.failing.store(false, Ordering::SeqCst);
    let mut waited = Duration::ZERO;
    loop {
        let counts = by_status(&store).await;
        let open = counts.get(&Status::Deferred).copied().unwrap_or(0)
            + counts.get(&Status::InFlight).copied().unwrap_or(0);
        if open == 0 || waited > Duration::from_secs(90) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += Duration::from_millis(200);
    }
    scheduler.shutdown().await;

    let ledger = ledger.lock().unwrap().clone();
    let missing: Vec<usize> = (0..80)
        .filter(|i| !ledger.contains_key(&format!("evt-{i:03}")))
        .collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let twice: Vec<_> = ledger.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert_eq!(ledger.len(), 80);
    let counts = by_status(&store).await;
    assert_eq!(
        counts.get(&Status::Dead),
        None,
        "no dead letter: {counts:?}"
    );
    assert_eq!(
        counts.get(&Status::Resolved).copied().unwrap_or(0),
        80 - delivered_first,
        "every stored event resolved: {counts:?}"
    );
}
