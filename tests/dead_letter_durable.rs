//! Dead letters that must survive: one record per message in every store, durable attempt
//! budgets across restarts, tags, and stores that fail (read-only SQLite, a stopped Redis).

mod redis_support;
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use support::{Scripted, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{
    AttemptBudgetLayer, DeadLetterLayer, Filter, MemoryStore, Page, Redrive, SqliteStore, Status,
    Store, http_request,
};
use tower_backstop::retry::{RetryLayer, RetryPolicy};
use tower_backstop::{Class, Code, DeadLetterStatus, Failure};

/// Sends one message that fails every attempt through DeadLetter → Retry(3) → Classify and
/// checks the one record it leaves.
async fn three_attempts_one_record(store: Arc<dyn Store>) {
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let body = "{\"to\":\"ops@example.com\"}";
    let failure = svc
        .oneshot(post_with_key(
            "http://mail.test/v1/messages",
            body,
            "msg-3x",
        ))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert!(
        matches!(failure.dead_letter(), Some(DeadLetterStatus::Stored { id }) if id == "msg-3x")
    );
    let all = store.list(100).await.unwrap();
    assert_eq!(all.len(), 1, "exactly one record");
    let r = &all[0];
    assert_eq!(r.attempts, 3);
    assert_eq!(r.payload, body.as_bytes());
    assert_eq!(
        (r.class.as_str(), r.code.as_str()),
        ("transient", "http 503")
    );
    assert_eq!(r.status, Status::Dead);
    assert_eq!(r.history.len(), 1);
    assert_eq!(r.history[0].attempts, 3);
    assert_eq!(r.history[0].code, "http 503");
}

#[tokio::test(start_paused = true)]
async fn always_failing_with_3_attempts_is_one_record_memory() {
    three_attempts_one_record(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(start_paused = true)]
async fn always_failing_with_3_attempts_is_one_record_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    three_attempts_one_record(Arc::new(
        SqliteStore::open(dir.path().join("d.db")).unwrap(),
    ))
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(start_paused = true)]
async fn always_failing_with_3_attempts_is_one_record_redis() {
    let Some(store) = redis_support::redis_store("three_attempts").await else {
        return;
    };
    three_attempts_one_record(Arc::new(store)).await;
}

/// DeadLetter → AttemptBudget(3) → Retry(3) → Classify → `upstream`, over `store`.
async fn send_through_budget(
    store: SqliteStore,
    upstream: &Scripted,
) -> Failure<http::Response<()>> {
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(AttemptBudgetLayer::new(store, 3))
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    svc.oneshot(post_with_key(
        "http://mail.test/v1/messages",
        "{}",
        "queue-msg-9",
    ))
    .await
    .unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn a_budget_spent_across_restarts_is_poison_without_calling_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");

    // First process: three attempts, all fail; the budget of 3 is spent.
    {
        let upstream = Scripted::always(status(503));
        let store = SqliteStore::open(&path).unwrap();
        let f = send_through_budget(store.clone(), &upstream).await;
        assert_eq!(upstream.calls(), 3);
        assert_eq!(f.class(), Class::TRANSIENT);
        store.close();
    } // the whole stack and the store are dropped

    // Second process: the same message comes back from the queue.
    let upstream = Scripted::always(status(202));
    let store = SqliteStore::open(&path).unwrap();
    let f = send_through_budget(store.clone(), &upstream).await;
    assert_eq!(upstream.calls(), 0, "the provider is not called again");
    assert_eq!(f.class(), Class::POISON);
    assert_eq!(f.code(), Code::AttemptBudgetSpent);
    assert!(
        f.to_string().contains("already used 3 of its 3 attempts"),
        "{f}"
    );
    let r = store.get("queue-msg-9").await.unwrap().unwrap();
    assert_eq!(
        (r.class.as_str(), r.code.as_str()),
        ("poison", "attempt budget spent")
    );
    assert_eq!(r.attempts, 3, "no attempt was made");
    assert_eq!(r.history.len(), 2);

    // A re-drive on purpose starts the budget again, through the same stack.
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(AttemptBudgetLayer::new(store.clone(), 3))
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let report = Redrive::new(Filter::new().id("queue-msg-9"), 10, 1)
        .unwrap()
        .run(&store, svc, |r| {
            http_request(r, None)
                .map(|req| req.map(|_| String::from_utf8_lossy(&r.payload).into_owned()))
        })
        .await
        .unwrap();
    assert_eq!(report.resolved(), 1);
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        store.get("queue-msg-9").await.unwrap().unwrap().status,
        Status::Resolved
    );
}

#[tokio::test(start_paused = true)]
async fn tags_come_from_the_user_function_and_are_searchable() {
    let store = MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).tags(|envelope| {
            let v: serde_json::Value =
                serde_json::from_slice(&envelope.payload).unwrap_or_default();
            ["campaign", "provider", "tenant"]
                .iter()
                .filter_map(|k| Some((k.to_string(), v[k].as_str()?.to_owned())))
                .collect()
        }))
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));
    for (key, campaign) in [("a", "spring"), ("b", "summer"), ("c", "spring")] {
        let body =
            format!("{{\"campaign\":\"{campaign}\",\"provider\":\"ses\",\"tenant\":\"acme\"}}");
        let _ = svc.clone().oneshot(post_with_key("/", &body, key)).await;
    }
    let spring = store
        .search(&Filter::new().tag("campaign", "spring"), Page::first(10))
        .await
        .unwrap();
    let mut ids: Vec<&str> = spring.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(spring[0].tags["provider"], "ses");
    assert_eq!(spring[0].tags["tenant"], "acme");
}

/// Collects what `tracing` prints while it lives.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    (out, tracing::subscriber::set_default(subscriber))
}

/// The caller gets the original failure, told the dead letter could not be written; tracing
/// reports it.
async fn check_unwritable(store: Arc<dyn Store>, expect: &str) {
    let (logs, _guard) = capture();
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store))
        .layer(ClassifyLayer::http())
        .service(upstream);
    let f = svc
        .oneshot(post_with_key("/", "payload", "k-unwritable"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(
        f.response().unwrap().status(),
        503,
        "the original failure is kept"
    );
    assert!(f.dead_letter_failed());
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

#[tokio::test]
async fn a_read_only_sqlite_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    SqliteStore::open(&path).unwrap().close();
    let store = SqliteStore::open_read_only(&path).unwrap();
    check_unwritable(Arc::new(store), "readonly").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_stopped_redis_is_a_clear_error_and_a_restarted_one_works_again() {
    use tower_backstop::dead_letter::RedisStore;

    // A Redis server of our own, so that stopping it does not disturb the other tests.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let child = std::process::Command::new("redis-server")
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
        .spawn();
    let Ok(mut child) = child else {
        let _: Option<()> = redis_support::skip(
            "a_stopped_redis_is_a_clear_error",
            &url,
            &"no redis-server binary",
        );
        return;
    };
    let mut store = None;
    for _ in 0..200 {
        if let Ok(s) = RedisStore::connect(&url).await {
            store = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let store = store.expect("our redis-server did not start");
    store
        .put(tower_backstop::dead_letter::Record::from_failure(
            "before".into(),
            tower_backstop::Envelope::new("x"),
            &Failure::<()>::from(tower_backstop::BoxError::from("boom")),
        ))
        .await
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    check_unwritable(Arc::new(store.clone()), "redis dead-letter store").await;

    // Redis comes back (empty: no data, no scripts): the same store writes again.
    let mut child = std::process::Command::new("redis-server")
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
        .unwrap();
    let mut written = Err(None);
    for _ in 0..300 {
        let r = tower_backstop::dead_letter::Record::from_failure(
            "after".into(),
            tower_backstop::Envelope::new("y"),
            &Failure::<()>::from(tower_backstop::BoxError::from("boom")),
        );
        match store.put(r).await {
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
