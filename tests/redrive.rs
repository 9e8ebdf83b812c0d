//! Re-drive on purpose: a filter, a dry run, a rate, a maximum; outcomes written back.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use support::{Scripted, post_with_key, status};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::Clock;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, record_of};
use tower_backstop::resend::{ALREADY_DELIVERED, Outcome, Redrive, http_request};
use tower_backstop::store::{Change, Filter, MemoryStore, Record, Status, Store};
use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

/// Calls seen: when, the message id, the idempotency key.
type Calls = Arc<Mutex<Vec<(Instant, String, Option<String>)>>>;

/// The rebuilt request as the scripted upstream takes it (`http::Request<String>`).
fn as_string_request(record: &Record) -> Result<http::Request<String>, BoxError> {
    let request = http_request(record, None)?;
    let payload = String::from_utf8(record.payload.clone())?;
    Ok(request.map(|_: Full<Bytes>| payload))
}

fn dead(id: &str, class: &'static str) -> Record {
    let f: Failure = Failure::new(Class::new(class), Code::Error);
    record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\"}}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages")
            .with_metadata("idempotency-key", id),
        &f,
    )
}

#[tokio::test(start_paused = true)]
async fn one_class_at_50_per_second_over_200_records() {
    let store = MemoryStore::new();
    let mut batch = Vec::new();
    for i in 0..200 {
        batch.push(dead(&format!("thr-{i:03}"), "throttled"));
    }
    for i in 0..100 {
        batch.push(dead(&format!("perm-{i:03}"), "permanent"));
    }
    store.put_many(batch).await.unwrap();

    // The provider: accepts even message numbers, answers 503 to odd ones.
    let calls: Calls = Arc::default();
    let seen = Arc::clone(&calls);
    let provider = tower::service_fn(move |req: http::Request<String>| {
        let id = req.extensions().get::<MessageId>().unwrap().0.clone();
        let key = req
            .headers()
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.lock().unwrap().push((Instant::now(), id.clone(), key));
        let n: u32 = id[4..].parse().unwrap();
        async move {
            let code = if n.is_multiple_of(2) { 202 } else { 503 };
            Ok::<_, BoxError>(http::Response::builder().status(code).body(()).unwrap())
        }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(ClassifyLayer::http())
        .service(provider);

    let redrive = Redrive::new(Filter::new().class("throttled"), 50, 1_000)
        .unwrap()
        .clock(Clock::tokio());
    let started = Instant::now();
    let report = redrive.run(&store, stack, as_string_request).await.unwrap();
    let calls = calls.lock().unwrap().clone();

    // Only that class, each once, keeping id and idempotency key.
    assert_eq!(calls.len(), 200);
    assert!(calls.iter().all(|(_, id, _)| id.starts_with("thr-")));
    assert!(
        calls
            .iter()
            .all(|(_, id, key)| key.as_deref() == Some(id.as_str()))
    );
    let mut ids: Vec<&str> = calls.iter().map(|(_, id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200);
    // No faster than 50/s: 20 ms between sends, 199 gaps at least.
    for pair in calls.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= Duration::from_millis(20));
    }
    assert!(calls[199].0 - started >= Duration::from_millis(199 * 20));
    // Each outcome recorded, in the report and in the store.
    assert_eq!(
        (report.resolved(), report.failed(), report.skipped()),
        (100, 100, 0)
    );
    for resent in &report.records {
        let r = store.get(resent.id()).await.unwrap().unwrap();
        let n: u32 = r.id[4..].parse().unwrap();
        assert_eq!(r.resends, 1);
        if n.is_multiple_of(2) {
            assert!(matches!(resent, Outcome::Resolved { id, .. } if *id == r.id));
            assert_eq!(r.status, Status::Resolved);
            assert!(r.resolved_at.is_some());
        } else {
            assert!(matches!(
                resent,
                Outcome::Failed { new_class, new_code, recorded: true, .. } if new_class == "transient" && new_code == "http 503"
            ));
            assert_eq!(r.status, Status::Dead);
            assert_eq!(
                (r.class.as_str(), r.code.as_str()),
                ("transient", "http 503")
            );
            assert_eq!(r.attempts, 2);
            assert_eq!(r.history.len(), 2);
        }
    }
    // The other class was not touched.
    let untouched = store
        .search(&Filter::new().class("permanent"), 0..1_000)
        .await
        .unwrap();
    assert_eq!(untouched.len(), 100);
    assert!(
        untouched
            .iter()
            .all(|r| r.status == Status::Dead && r.resends == 0)
    );
}

#[tokio::test(start_paused = true)]
async fn dry_run_lists_and_sends_nothing_and_max_caps_the_count() {
    let store = MemoryStore::new();
    store
        .put_many(
            (0..10)
                .map(|i| dead(&format!("m-{i}"), "unknown"))
                .collect(),
        )
        .await
        .unwrap();
    let redrive = Redrive::new(Filter::new().class("unknown"), 1_000, 4).unwrap();
    let plan = redrive.plan(&store).await.unwrap();
    assert_eq!(plan.len(), 4);
    assert!(
        store
            .list(100)
            .await
            .unwrap()
            .iter()
            .all(|r| r.status == Status::Dead && r.resends == 0)
    );

    let upstream = Scripted::always(status(202));
    let report = redrive
        .run(&store, upstream.clone(), as_string_request)
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 4);
    assert_eq!(report.resolved(), 4);
    // The dry run named exactly what was then sent.
    let sent: Vec<&str> = report.records.iter().map(Outcome::id).collect();
    let planned: Vec<&str> = plan.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(sent, planned);
}

#[test]
fn nothing_re_drives_everything_by_default() {
    let err = Redrive::new(Filter::new(), 10, 10).unwrap_err();
    assert!(
        err.to_string()
            .contains("refusing to re-drive every dead letter")
    );
    assert_eq!(err.setting(), "Redrive::new(filter)");
    let err = Redrive::new(Filter::new().class("x"), 0, 10).unwrap_err();
    assert_eq!(err.setting(), "Redrive::new(per_second)");
    let err = Redrive::new(Filter::new().class("x"), 10, 0).unwrap_err();
    assert_eq!(err.setting(), "Redrive::new(max)");
}

#[tokio::test(start_paused = true)]
async fn twenty_failed_re_drives_keep_the_record_bounded() {
    const K: usize = 5;
    let store = MemoryStore::new().with_history_limit(K);
    let codes = [500u16, 502, 503, 504];
    let upstream = Scripted::new((0..21).map(|i| status(codes[i % codes.len()])), status(500));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let _ = stack
        .clone()
        .oneshot(post_with_key(
            "http://mail.test/v1/messages",
            "{\"to\":\"x@y\"}",
            "m-20",
        ))
        .await
        .unwrap_err();

    let redrive = Redrive::new(Filter::new().id("m-20"), 100, 1).unwrap();
    let mut size_after_k = 0;
    for n in 1..=20 {
        let report = redrive
            .run(&store, stack.clone(), as_string_request)
            .await
            .unwrap();
        assert_eq!(report.failed(), 1, "re-drive {n}");
        let r = store.get("m-20").await.unwrap().unwrap();
        let size = serde_json::to_vec(&r).unwrap().len();
        if n == K {
            size_after_k = size;
        }
        if n > K {
            assert!(
                size <= size_after_k + 16,
                "re-drive {n}: {size} > {size_after_k}"
            );
        }
    }
    assert_eq!(upstream.calls(), 21);
    let r = store.get("m-20").await.unwrap().unwrap();
    assert_eq!(r.attempts, 21);
    assert_eq!(r.resends, 20);
    assert_eq!(r.history.len(), K);
    // The last K errors, in order: calls 17..=21 answered codes[16..=20].
    let want: Vec<String> = (16..21)
        .map(|i| format!("http {}", codes[i % codes.len()]))
        .collect();
    let got: Vec<String> = r.history.iter().map(|e| e.code.clone()).collect();
    assert_eq!(got, want);
    assert_eq!(r.payload, b"{\"to\":\"x@y\"}");
}

#[tokio::test(start_paused = true)]
async fn truncated_payloads_are_skipped_not_sent() {
    let store = MemoryStore::new();
    let upstream = Scripted::always(status(503));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).max_payload(8))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let _ = stack
        .clone()
        .oneshot(post_with_key(
            "/",
            "a payload longer than eight bytes",
            "big",
        ))
        .await
        .unwrap_err();
    let r = store.get("big").await.unwrap().unwrap();
    assert!(r.payload_truncated);
    assert_eq!(r.payload, b"a payloa");
    assert_eq!(r.payload_len, 33);

    let report = Redrive::new(Filter::new().id("big"), 10, 10)
        .unwrap()
        .run(&store, stack, as_string_request)
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 1, "only the original call");
    assert!(
        matches!(&report.records[0], Outcome::Skipped { reason, .. } if reason.contains("truncated"))
    );
}

/// A message already delivered (a resolved record) is not sent again by accident: a filter
/// without a status does not select it, one that names `resolved` plans it but the run skips
/// it with the reason, and only a re-drive that includes resolved records on purpose sends it,
/// with an audit entry that says so.
#[tokio::test(start_paused = true)]
async fn a_resolved_record_is_sent_again_only_on_purpose() {
    let store = MemoryStore::new();
    store
        .put_many(vec![
            dead("d-0", "throttled"),
            dead("r-0", "throttled"),
            dead("r-1", "throttled"),
        ])
        .await
        .unwrap();
    let delivered_at = std::time::SystemTime::now();
    for id in ["r-0", "r-1"] {
        store
            .update(id, Change::Resolved { at: delivered_at })
            .await
            .unwrap();
    }
    let upstream = Scripted::always(status(202));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    let planned_ids = |plan: Vec<Record>| {
        let mut ids: Vec<String> = plan.into_iter().map(|r| r.id).collect();
        ids.sort();
        ids
    };

    // No status in the filter: only the outstanding record is planned.
    let plain = Redrive::new(Filter::new().class("throttled"), 100, 10).unwrap();
    assert_eq!(planned_ids(plain.plan(&store).await.unwrap()), ["d-0"]);

    // `status=resolved`: planned (the dry run shows them), but the run skips each one.
    let resolved = Filter::new().class("throttled").status(Status::Resolved);
    let refused = Redrive::new(resolved.clone(), 100, 10)
        .unwrap()
        .actor("alice");
    assert!(!refused.includes_resolved());
    assert_eq!(
        planned_ids(refused.plan(&store).await.unwrap()),
        ["r-0", "r-1"]
    );
    let report = refused
        .run(&store, stack.clone(), as_string_request)
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 0, "nothing was sent");
    assert_eq!(
        (report.resolved(), report.failed(), report.skipped()),
        (0, 0, 2)
    );
    for o in &report.records {
        assert!(
            matches!(o, Outcome::Skipped { reason, .. } if reason == ALREADY_DELIVERED),
            "{o:?}"
        );
        assert!(o.detail().contains("--include-resolved"), "{}", o.detail());
        let r = store.get(o.id()).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 0), "untouched");
    }
    let entry = store.audit(0..1).await.unwrap().remove(0);
    assert_eq!(
        (entry.actor.as_str(), entry.planned, entry.sent),
        ("alice", Some(2), 0)
    );
    assert_eq!(
        entry.outcome,
        "resolved 0, failed 0, skipped 2; skipped 2 already delivered (resolved)"
    );

    // On purpose: both are claimed, sent once each, resolved again, and the audit says so.
    let deliberate = Redrive::new(resolved, 100, 10)
        .unwrap()
        .actor("alice")
        .include_resolved(true);
    assert!(deliberate.includes_resolved());
    let report = deliberate
        .run(&store, stack, as_string_request)
        .await
        .unwrap();
    assert_eq!(upstream.calls(), 2);
    let mut keys: Vec<String> = upstream.seen().into_iter().filter_map(|s| s.key).collect();
    keys.sort();
    assert_eq!(keys, ["r-0", "r-1"]);
    assert_eq!(
        (report.resolved(), report.failed(), report.skipped()),
        (2, 0, 0)
    );
    for id in ["r-0", "r-1"] {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 1));
    }
    assert_eq!(
        store.get("d-0").await.unwrap().unwrap().resends,
        0,
        "the dead one is not in this filter"
    );
    let entry = store.audit(0..1).await.unwrap().remove(0);
    assert_eq!((entry.planned, entry.sent), (Some(2), 2));
    assert_eq!(
        entry.outcome,
        "resolved 2, failed 0, skipped 0; deliberately re-sent 2 already delivered \
         (include_resolved)"
    );
}
