//! DeadLetterLayer with the in-memory and SQLite stores.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use support::{Scripted, Step, post_with_key, status, status_with};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::Class;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::retry::{Attempts, GiveUp, RetryPolicy};
use tower_backstop::store::{MemoryStore, SqliteStore, Store};

fn stored_id<R>(f: &tower_backstop::Failure<R>) -> String {
    match f.note::<DeadLetterStatus>() {
        Some(DeadLetterStatus::Stored { id }) => id.clone(),
        other => panic!("expected a stored dead letter, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn exhausted_message_becomes_exactly_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.db");
    let store = SqliteStore::open(&path).unwrap();
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let body = "{\"to\":\"ops@example.com\",\"subject\":\"report\"}";
    let mut failure = svc
        .oneshot(post_with_key(
            "http://mail.test/v1/messages",
            body,
            "msg-0042",
        ))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(stored_id(&failure), "msg-0042");
    assert_eq!(
        failure.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::AttemptsExhausted)
    );
    // The caller still has the provider's response.
    assert_eq!(failure.response_mut().unwrap().status(), 503);

    let records = store.list(100).await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.id, "msg-0042");
    assert_eq!(r.class, "transient");
    assert_eq!(r.code, "http 503");
    assert_eq!(r.attempts, 3);
    assert_eq!(r.payload, body.as_bytes());
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.metadata["method"], "POST");
    assert_eq!(r.metadata["uri"], "http://mail.test/v1/messages");
    assert!(r.first_failed_at <= r.last_failed_at);

    // Durable: close, reopen, read the same record.
    let before = r.clone();
    store.close();
    drop(store);
    let reopened = SqliteStore::open(&path).unwrap();
    assert_eq!(reopened.get("msg-0042").await.unwrap(), Some(before));
    assert_eq!(
        reopened.count_by_class().await.unwrap(),
        vec![("transient".to_owned(), 1)]
    );
}

#[tokio::test(start_paused = true)]
async fn permanent_and_breaker_open_failures_are_dead_lettered_with_their_reason() {
    let store = MemoryStore::new();
    let upstream = Scripted::new([status(400)], status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(
            RetryPolicy::new()
                .max_attempts(2)
                .max_delay(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .layer(BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(60)))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let f = svc
        .clone()
        .oneshot(post_with_key("/", "bad", "k-bad"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::PERMANENT);
    // Two 503s open the breaker.
    let _ = svc.clone().oneshot(post_with_key("/", "x", "k-x")).await;
    // Now the breaker is open for 60 s, longer than the 1 s the retry layer may wait.
    let f = svc
        .clone()
        .oneshot(post_with_key("/", "y", "k-y"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(
        f.note::<Attempts>().map(Attempts::give_up),
        Some(GiveUp::Deferred)
    );
    assert_eq!(upstream.calls(), 3);

    let bad = store.get("k-bad").await.unwrap().unwrap();
    assert_eq!(
        (bad.class.as_str(), bad.code.as_str(), bad.attempts),
        ("permanent", "http 400", 1)
    );
    let open = store.get("k-y").await.unwrap().unwrap();
    assert_eq!(open.class, "circuit_open");
    assert!(
        open.retry_at.is_some(),
        "the record says when the breaker half-opens"
    );
    // The rejection keeps the failure that opened the breaker as its root cause.
    let cause = open.cause.as_ref().expect("a root cause");
    assert_eq!(
        (cause.class.as_str(), cause.code.as_str(), cause.attempts),
        ("transient", "http 503", 2),
        "{cause:?}"
    );
    assert!(cause.message.contains("2 failures in"), "{}", cause.message);
    assert!(open.breaker.is_some());
    // The deferred rejection is outstanding, not a dead letter: counted apart.
    assert_eq!(
        store.count_by_class().await.unwrap(),
        vec![("permanent".to_owned(), 1), ("transient".to_owned(), 1)]
    );
    assert_eq!(store.counts(UNIX_EPOCH).await.unwrap().deferred, 1);
}

#[tokio::test]
async fn a_store_that_cannot_be_opened_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteStore::open(dir.path().join("no/such/dir/dead.db")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("cannot open sqlite dead-letter store"),
        "{text}"
    );
    assert!(std::error::Error::source(&err).is_some());

    std::fs::write(
        dir.path().join("junk.db"),
        b"this is not a database, just text.....",
    )
    .unwrap();
    assert!(SqliteStore::open(dir.path().join("junk.db")).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_closed_store_keeps_the_original_failure_and_says_so() {
    // Memory store.
    let memory = MemoryStore::new();
    memory.close();
    check_closed(DeadLetterLayer::new(memory)).await;
    // SQLite store.
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("d.db")).unwrap();
    sqlite.close();
    check_closed(DeadLetterLayer::new(sqlite)).await;
}

async fn check_closed(layer: DeadLetterLayer) {
    let upstream = Scripted::always(status_with(503, "retry-after", "2"));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let mut f = svc
        .oneshot(post_with_key("/", "payload", "k-closed"))
        .await
        .unwrap_err();
    assert_eq!(f.class(), Class::TRANSIENT);
    assert_eq!(f.response_mut().unwrap().status(), 503);
    assert!(
        f.note::<DeadLetterStatus>()
            .is_some_and(DeadLetterStatus::failed)
    );
    let text = f.to_string();
    assert!(
        text.contains("dead letter k-closed could not be written"),
        "{text}"
    );
    assert!(text.contains("closed"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn same_id_twice_updates_instead_of_duplicating() {
    let store = MemoryStore::new();
    let upstream = Scripted::new([status(500)], Step::Io(std::io::ErrorKind::ConnectionReset));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..2 {
        let _ = svc.clone().oneshot(post_with_key("/", "p", "same")).await;
    }
    let all = store.list(10).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].attempts, 2);
    assert_eq!(all[0].code, "io ConnectionReset");
}

#[tokio::test]
async fn requests_without_a_key_get_a_generated_id() {
    let store = MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(tower::service_fn(|_: String| async {
            Err::<(), tower_backstop::BoxError>("render failed".into())
        }));
    let f = svc.oneshot("hello".to_owned()).await.unwrap_err();
    let id = stored_id(&f);
    assert!(id.starts_with("msg-") && id.len() == 36, "{id}");
    let r = store.get(&id).await.unwrap().unwrap();
    assert_eq!(r.payload, b"hello");
    assert_eq!(r.message, "render failed");
    assert_eq!(r.class, "unknown");
}

/// A `Retry-After` of about a century is beyond the longest deferral a record is kept for: the
/// record is dead, and so is what the caller is told (not deferred to the year 2130).
#[tokio::test(start_paused = true)]
async fn a_deferral_too_far_ahead_is_dead_for_the_caller_as_for_the_record() {
    let store = MemoryStore::new();
    let century = (100 * 365 * 24 * 60 * 60u64).to_string();
    let upstream = Scripted::always(status_with(503, "retry-after", century));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let f = svc
        .oneshot(post_with_key("/", "x", "k-far"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 1);
    let record = store.get("k-far").await.unwrap().unwrap();
    assert_eq!(record.status, tower_backstop::store::Status::Dead);
    assert_eq!(record.retry_at, None);
    let note = f.note::<Attempts>().expect("the retry layer's note");
    assert_eq!(
        (note.give_up(), note.retry_at(), note.count()),
        (GiveUp::HintTooLong, None, 1)
    );
    assert!(note.first_failed_at().is_some());
    assert_eq!(stored_id(&f), "k-far");
    let message = f.to_string();
    assert!(message.contains("dead letter stored as k-far"), "{message}");
    assert!(!message.contains("until"), "{message}");
    assert!(!message.contains("re-send"), "{message}");
}
