//! The dead-letter layer's attempt budget reads only what it needs per call: the durable attempt count, not the
//! whole record. Proved by stores whose record is unreadable as a whole but whose count is
//! intact: the layer still refuses the spent message (poison, its source `BudgetSpent`).

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backstop_test_support::Tests;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::dead_letter::{BudgetSpent, DeadLetterLayer, record_of};
use tower_backstop::store::{Record, SqliteStore, Store};
use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

fn spent(id: &str, attempts: u32) -> Record {
    let f: Failure = Failure::new(Class::TRANSIENT, Code::Timeout);
    let mut r = record_of(id.to_owned(), Envelope::new("x"), &f);
    r.attempts = attempts;
    r.budget_spent = attempts;
    r
}

/// Sends one request for message `id` through a budget of 3 over `store`; returns the provider's
/// call count and, for a failure, its class and whether its source is `BudgetSpent`.
async fn send(store: Arc<dyn Store>, id: &str) -> (usize, Option<(Class, bool)>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let provider = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_: http::Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(()) }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store).attempt_budget(3))
        .service(provider);
    let mut request = http::Request::new(String::new());
    request.extensions_mut().insert(MessageId(id.to_owned()));
    let refused = svc.oneshot(request).await.err().map(|f| {
        let budget = std::error::Error::source(&f).is_some_and(|s| s.is::<BudgetSpent>());
        (f.class(), budget)
    });
    (calls.load(Ordering::SeqCst), refused)
}

async fn sqlite_reads_only_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put(spent("m-1", 3)).await.unwrap();
    store.put(spent("m-2", 1)).await.unwrap();
    // Break the rest of both rows: reading them whole now fails.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute("UPDATE dead_letters SET history = 'not json'", [])
        .unwrap();
    assert!(store.get("m-1").await.is_err());
    let store: Arc<dyn Store> = Arc::new(store);
    assert_eq!(
        send(Arc::clone(&store), "m-1").await,
        (0, Some((Class::POISON, true)))
    );
    assert_eq!(send(store, "m-2").await, (1, None));
}

#[cfg(feature = "redis")]
async fn redis_reads_only_the_count() {
    let store = redis_support::redis_store("budget_reads").await;
    store.put(spent("m-1", 3)).await.unwrap();
    store.put(spent("m-2", 1)).await.unwrap();
    let client = redis::Client::open(redis_support::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for id in ["m-1", "m-2"] {
        let () = redis::cmd("HSET")
            .arg(format!("{{{}}}:rec:{id}", store.prefix()))
            .arg("json")
            .arg("not json")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert!(store.get("m-1").await.is_err());
    let store: Arc<dyn Store> = Arc::new(store);
    assert_eq!(
        send(Arc::clone(&store), "m-1").await,
        (0, Some((Class::POISON, true)))
    );
    assert_eq!(send(store, "m-2").await, (1, None));
}

async fn memory_reads_only_the_count() {
    let store = tower_backstop::store::MemoryStore::new();
    store.put(spent("m-1", 3)).await.unwrap();
    assert_eq!(store.budget_spent("m-1").await.unwrap(), Some(3));
    assert_eq!(store.budget_spent("none").await.unwrap(), None);
    assert_eq!(
        send(Arc::new(store), "m-1").await,
        (0, Some((Class::POISON, true)))
    );
}

fn main() {
    let mut tests = Tests::new();
    tests.current("sqlite_reads_only_the_count", sqlite_reads_only_the_count);
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::Redis)
        .current("redis_reads_only_the_count", redis_reads_only_the_count);
    tests.current("memory_reads_only_the_count", memory_reads_only_the_count);
    tests.run();
}
