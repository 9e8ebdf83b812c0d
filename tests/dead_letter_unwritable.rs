//! Dead-letter stores that fail (a read-only SQLite file, a stopped Redis): the caller gets the
//! original failure and a clear error, and `tracing` reports it. Alone in its own test binary:
//! `tracing` caches each callsite's interest process-wide, so a thread-local subscriber set while
//! other tests run on other threads can miss events.

mod support;

use std::sync::Arc;

use backstop_test_support::Tests;
use support::{Scripted, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::store::{SqliteStore, Store};
use tower_backstop::{Class, Failure};

/// The caller gets the original failure, told the dead letter could not be written; tracing
/// reports it.
async fn check_unwritable(store: Arc<dyn Store>, expect: &str) {
    let logs = support::LogCapture::start(tracing::Level::WARN);
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store))
        .layer(ClassifyLayer::http())
        .service(upstream);
    let mut f = svc
        .oneshot(post_with_key("/", "payload", "k-unwritable"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(
        f.response_mut().unwrap().status(),
        503,
        "the original failure is kept"
    );
    assert!(
        f.note::<DeadLetterStatus>()
            .is_some_and(DeadLetterStatus::failed)
    );
    assert!(
        matches!(
            f.note::<DeadLetterStatus>(),
            Some(tower_backstop::dead_letter::DeadLetterStatus::NotStored { error, .. })
                if error.is::<tower_backstop::store::StoreError>()
        ),
        "the store's own error is kept"
    );
    let text = f.to_string();
    assert!(
        text.contains("dead letter k-unwritable could not be written"),
        "{text}"
    );
    assert!(text.to_lowercase().contains(expect), "{text}");
    let logs = logs.text();
    assert!(logs.contains("dead letter could not be written"), "{logs}");
    assert!(logs.contains("k-unwritable"), "{logs}");
}

async fn a_read_only_sqlite_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    SqliteStore::open(&path).unwrap().close();
    let store = SqliteStore::open_read_only(&path).unwrap();
    check_unwritable(Arc::new(store), "readonly").await;
}

/// A `redis-server` of our own on `port`, saving nothing to disk.
#[cfg(feature = "redis")]
fn spawn_redis(port: u16) -> std::io::Result<std::process::Child> {
    std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
}

/// A dead-letter record `id` with `payload`, failed with the message "boom".
#[cfg(feature = "redis")]
fn boom(id: &str, payload: &'static str) -> tower_backstop::store::Record {
    tower_backstop::dead_letter::record_of(
        id.into(),
        tower_backstop::Envelope::new(payload),
        &Failure::<()>::from(tower_backstop::BoxError::from("boom")),
    )
}

#[cfg(feature = "redis")]
async fn a_stopped_redis_is_a_clear_error_and_a_restarted_one_works_again() {
    use tower_backstop::store::RedisStore;

    // A Redis server of our own, so that stopping it does not disturb the other tests.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut child = spawn_redis(port).expect("redis-server, found on PATH at start-up");
    let mut store = None;
    for _ in 0..200 {
        if let Ok(s) = RedisStore::connect(&url).await {
            store = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let store = store.expect("our redis-server did not start");
    store.put(boom("before", "x")).await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    check_unwritable(Arc::new(store.clone()), "redis dead-letter store").await;

    // Redis comes back (empty: no data, no scripts): the same store writes again.
    let mut child = spawn_redis(port).unwrap();
    let mut written = Err(None);
    for _ in 0..300 {
        match store.put(boom("after", "y")).await {
            Ok(()) => {
                written = Ok(());
                break;
            }
            Err(e) => written = Err(Some(e)),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let result = store.get("after").await;
    child.kill().unwrap();
    child.wait().unwrap();
    written.expect("the store writes again after Redis restarts");
    assert_eq!(result.unwrap().unwrap().message, "boom");
}

fn main() {
    let mut tests = Tests::new();
    tests.current(
        "a_read_only_sqlite_file_is_a_clear_error",
        a_read_only_sqlite_file_is_a_clear_error,
    );
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::RedisServerBinary)
        .current(
            "a_stopped_redis_is_a_clear_error_and_a_restarted_one_works_again",
            a_stopped_redis_is_a_clear_error_and_a_restarted_one_works_again,
        );
    tests.run();
}
