//! Dead letters that must survive: one record per message in every store, durable attempt
//! budgets across restarts, tags. Stores that fail are in tests/dead_letter_unwritable.rs.

mod redis_support;
mod support;

use std::sync::Arc;

use backstop_test_support::Tests;
use support::{Scripted, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{BudgetSpent, DeadLetterLayer, DeadLetterStatus};
use tower_backstop::resend::{Redrive, http_request};
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{Filter, MemoryStore, SqliteStore, Status, Store};
use tower_backstop::{BackstopLayer, Class, Failure};

/// Sends one message that fails every attempt through DeadLetter → Retry(3) → Classify and
/// checks the one record it leaves.
async fn three_attempts_one_record(store: Arc<dyn Store>) {
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
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
        matches!(failure.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "msg-3x")
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

async fn always_failing_with_3_attempts_is_one_record_memory() {
    three_attempts_one_record(Arc::new(MemoryStore::new())).await;
}

async fn always_failing_with_3_attempts_is_one_record_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    three_attempts_one_record(Arc::new(
        SqliteStore::open(dir.path().join("d.db")).unwrap(),
    ))
    .await;
}

#[cfg(feature = "redis")]
async fn always_failing_with_3_attempts_is_one_record_redis() {
    let store = redis_support::redis_store("three_attempts").await;
    three_attempts_one_record(Arc::new(store)).await;
}

/// DeadLetter with an attempt budget of 3 → Retry(3) → Classify → `upstream`, over `store`.
async fn send_through_budget(
    store: SqliteStore,
    upstream: &Scripted,
) -> Failure<http::Response<()>> {
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store).attempt_budget(3))
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
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
    let spent = std::error::Error::source(&f)
        .and_then(|s| s.downcast_ref::<BudgetSpent>())
        .expect("the source is the budget's refusal");
    assert_eq!(
        (spent.id(), spent.spent(), spent.budget()),
        ("queue-msg-9", 3, 3)
    );
    assert!(
        f.to_string().contains("already used 3 of its 3 attempts"),
        "{f}"
    );
    let r = store.get("queue-msg-9").await.unwrap().unwrap();
    assert_eq!((r.class.as_str(), r.code.as_str()), ("poison", "error"));
    assert!(
        r.message.contains("already used 3 of its 3 attempts"),
        "the record says why: {}",
        r.message
    );
    assert_eq!(r.attempts, 3, "no attempt was made");
    assert_eq!(r.history.len(), 2);

    // A re-drive on purpose starts the budget again, through the same stack.
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).attempt_budget(3))
        .layer(RetryPolicy::new().max_attempts(3).build().unwrap())
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

/// The preset honours the dead-letter layer's attempt budget too: it is read before the first
/// attempt, so a message that spent its budget is not sent again.
async fn the_preset_applies_the_attempt_budget() {
    let store = MemoryStore::new();
    let stack = |upstream: &Scripted| {
        ServiceBuilder::new()
            .layer(
                BackstopLayer::http(std::time::Duration::from_secs(2))
                    .retry(
                        RetryPolicy::new()
                            .max_attempts(3)
                            .assume_idempotent(true)
                            .build()
                            .unwrap(),
                    )
                    .dead_letters(DeadLetterLayer::new(store.clone()).attempt_budget(3)),
            )
            .service(upstream.clone())
    };
    let send = |upstream: &Scripted| {
        stack(upstream).oneshot(post_with_key(
            "http://mail.test/v1/messages",
            "{}",
            "queue-msg-7",
        ))
    };
    let upstream = Scripted::always(status(503));
    let f = send(&upstream).await.unwrap_err();
    assert_eq!(upstream.calls(), 3);
    assert_eq!(f.class(), Class::TRANSIENT);
    // The same message again: its budget of 3 is spent, the provider is not called.
    let upstream = Scripted::always(status(202));
    let f = send(&upstream).await.unwrap_err();
    assert_eq!(upstream.calls(), 0, "the provider is not called again");
    assert_eq!(f.class(), Class::POISON);
    let spent = std::error::Error::source(&f)
        .and_then(|s| s.downcast_ref::<BudgetSpent>())
        .expect("the source is the budget's refusal");
    assert_eq!((spent.spent(), spent.budget()), (3, 3));
    // A message with budget left goes through the same stack.
    let ok = stack(&upstream)
        .oneshot(post_with_key(
            "http://mail.test/v1/messages",
            "{}",
            "queue-msg-8",
        ))
        .await;
    assert!(ok.is_ok());
    assert_eq!(upstream.calls(), 1);
}

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
        .search(&Filter::new().tag("campaign", "spring"), 0..10)
        .await
        .unwrap();
    let mut ids: Vec<&str> = spring.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(spring[0].tags["provider"], "ses");
    assert_eq!(spring[0].tags["tenant"], "acme");
}

fn main() {
    let mut tests = Tests::new();
    tests.paused(
        "always_failing_with_3_attempts_is_one_record_memory",
        always_failing_with_3_attempts_is_one_record_memory,
    );
    tests.paused(
        "always_failing_with_3_attempts_is_one_record_sqlite",
        always_failing_with_3_attempts_is_one_record_sqlite,
    );
    #[cfg(feature = "redis")]
    tests.needs(backstop_test_support::Service::Redis).paused(
        "always_failing_with_3_attempts_is_one_record_redis",
        always_failing_with_3_attempts_is_one_record_redis,
    );
    tests.paused(
        "a_budget_spent_across_restarts_is_poison_without_calling_the_provider",
        a_budget_spent_across_restarts_is_poison_without_calling_the_provider,
    );
    tests.paused(
        "the_preset_applies_the_attempt_budget",
        the_preset_applies_the_attempt_budget,
    );
    tests.paused(
        "tags_come_from_the_user_function_and_are_searchable",
        tags_come_from_the_user_function_and_are_searchable,
    );
    tests.run();
}
