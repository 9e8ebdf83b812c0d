//! One behaviour, three backends: every case runs against `MemoryStore`, `SqliteStore` and
//! `RedisStore` (a real `redis-server`; see `tests/redis_support`).

mod redis_support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use tower_backstop::dead_letter::{
    Change, Filter, MemoryStore, Page, Record, SqliteStore, Status, Store,
};
use tower_backstop::{Class, Code, Envelope, Failure};

/// A store to test and whatever must live as long as it (a temporary directory).
struct Opened {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy)]
enum Backend {
    Memory,
    Sqlite,
    Redis,
}

impl Backend {
    async fn open(self, test: &str, history_limit: usize) -> Option<Opened> {
        Some(match self {
            Backend::Memory => Opened {
                store: Arc::new(MemoryStore::new().with_history_limit(history_limit)),
                _dir: None,
            },
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let store = SqliteStore::open(dir.path().join("dl.db"))
                    .unwrap()
                    .with_history_limit(history_limit);
                Opened {
                    store: Arc::new(store),
                    _dir: Some(dir),
                }
            }
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let store = redis_support::redis_store(test).await?;
                Opened {
                    store: Arc::new(store.with_history_limit(history_limit)),
                    _dir: None,
                }
            }
            #[cfg(not(feature = "redis"))]
            Backend::Redis => match redis_support::redis_store(test).await? {},
        })
    }
}

const BASE: u64 = 1_780_000_000_000; // ms since the epoch, in 2026

fn at(ms_after_base: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(BASE + ms_after_base)
}

/// A dead record `id` of `class`/`code`, last failed at `t`, one attempt.
fn rec(id: &str, class: &'static str, code: &str, t: SystemTime) -> Record {
    let f: Failure = Failure::new(
        Class::new(class),
        Code::Http(StatusCode::SERVICE_UNAVAILABLE),
    );
    let mut r = Record::from_failure(
        id.to_owned(),
        Envelope::new(format!("payload of {id}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages"),
        &f,
    );
    r.code = code.to_owned();
    r.first_failed_at = t;
    r.last_failed_at = t;
    r.history[0].at = t;
    r.history[0].code = code.to_owned();
    r.message = format!("{id} failed at {}", humantime::format_rfc3339_millis(t));
    r.history[0].message = r.message.clone();
    r
}

fn deferred(mut r: Record, retry_at: SystemTime) -> Record {
    r.status = Status::Deferred;
    r.retry_at = Some(retry_at);
    r
}

fn ids(records: &[Record]) -> Vec<&str> {
    records.iter().map(|r| r.id.as_str()).collect()
}

async fn round_trip(b: Backend) {
    let Some(o) = b.open("round_trip", 10).await else {
        return;
    };
    let mut r = rec("m-1", "throttled", "http 429", at(0));
    r.payload = vec![0, 159, 146, 150, 255];
    r.payload_len = 5;
    r.tags.insert("campaign".into(), "flash_sale".into());
    r.tags.insert("provider".into(), "sendgrid".into());
    r = deferred(r, at(60_000));
    o.store.put(r.clone()).await.unwrap();
    assert_eq!(o.store.get("m-1").await.unwrap(), Some(r));
    assert_eq!(o.store.get("nope").await.unwrap(), None);
}

async fn upsert_merges_by_id(b: Backend) {
    let Some(o) = b.open("upsert", 10).await else {
        return;
    };
    let mut first = rec("m-1", "transient", "http 503", at(0));
    first.attempts = 3;
    first.budget_spent = 3;
    first.tags.insert("tenant".into(), "acme".into());
    o.store.put(first).await.unwrap();
    let mut second = rec("m-1", "unknown", "http 500", at(1_000));
    second.attempts = 2;
    second.budget_spent = 2;
    second.tags.insert("provider".into(), "ses".into());
    o.store.put(second).await.unwrap();

    let all = o.store.list(10).await.unwrap();
    assert_eq!(all.len(), 1, "one record per id");
    let r = &all[0];
    assert_eq!((r.attempts, r.budget_spent), (5, 5));
    assert_eq!(r.first_failed_at, at(0));
    assert_eq!(r.last_failed_at, at(1_000));
    assert_eq!((r.class.as_str(), r.code.as_str()), ("unknown", "http 500"));
    assert_eq!(r.history.len(), 2);
    assert_eq!(r.history[0].code, "http 503");
    assert_eq!(r.history[1].code, "http 500");
    assert_eq!(r.tags.len(), 2);
    // The old class index no longer finds it; the new one does.
    let by_old = o
        .store
        .search(&Filter::new().class("transient"), Page::first(10))
        .await
        .unwrap();
    assert!(by_old.is_empty());
    let by_new = o
        .store
        .search(&Filter::new().class("unknown"), Page::first(10))
        .await
        .unwrap();
    assert_eq!(ids(&by_new), ["m-1"]);
}

async fn history_keeps_last_k(b: Backend) {
    let Some(o) = b.open("history", 3).await else {
        return;
    };
    for i in 0..20u64 {
        o.store
            .put(rec(
                "m-1",
                "transient",
                &format!("http 5{i:02}"),
                at(i * 1_000),
            ))
            .await
            .unwrap();
    }
    let r = o.store.get("m-1").await.unwrap().unwrap();
    assert_eq!(r.attempts, 20);
    let codes: Vec<&str> = r.history.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["http 517", "http 518", "http 519"]);
    assert_eq!(r.first_failed_at, at(0));
}

async fn search_filters_and_pages(b: Backend) {
    let Some(o) = b.open("search", 10).await else {
        return;
    };
    let mut batch = Vec::new();
    for i in 0..30u64 {
        let class = ["transient", "throttled", "permanent"][(i % 3) as usize];
        let code = ["http 503", "http 429", "http 400"][(i % 3) as usize];
        let mut r = rec(&format!("m-{i:02}"), class, code, at(i * 1_000));
        r.tags.insert(
            "campaign".into(),
            if i < 15 { "spring" } else { "summer" }.into(),
        );
        if i == 7 {
            r.status = Status::Resolved;
        }
        batch.push(r);
    }
    o.store.put_many(batch).await.unwrap();

    let s = |f: Filter, p: Page| {
        let store = Arc::clone(&o.store);
        async move { store.search(&f, p).await.unwrap() }
    };
    // Newest first.
    assert_eq!(
        ids(&s(Filter::new(), Page::first(3)).await),
        ["m-29", "m-28", "m-27"]
    );
    // Paging.
    assert_eq!(
        ids(&s(Filter::new(), Page::first(3).next()).await),
        ["m-26", "m-25", "m-24"]
    );
    assert_eq!(
        s(
            Filter::new(),
            Page {
                offset: 28,
                limit: 10
            }
        )
        .await
        .len(),
        2
    );
    // Class.
    let throttled = s(Filter::new().class("throttled"), Page::first(100)).await;
    assert_eq!(throttled.len(), 10);
    assert!(throttled.iter().all(|r| r.class == "throttled"));
    // Code.
    assert_eq!(
        s(Filter::new().code("http 400"), Page::first(100))
            .await
            .len(),
        10
    );
    // Tag, and tag with class.
    assert_eq!(
        s(Filter::new().tag("campaign", "summer"), Page::first(100))
            .await
            .len(),
        15
    );
    let summer_permanent = s(
        Filter::new().tag("campaign", "summer").class("permanent"),
        Page::first(100),
    )
    .await;
    assert_eq!(
        ids(&summer_permanent),
        ["m-29", "m-26", "m-23", "m-20", "m-17"]
    );
    // Time range: since inclusive, until exclusive.
    let range = s(
        Filter::new().since(at(10_000)).until(at(13_000)),
        Page::first(100),
    )
    .await;
    assert_eq!(ids(&range), ["m-12", "m-11", "m-10"]);
    // Status, ids.
    assert_eq!(
        ids(&s(Filter::new().status(Status::Resolved), Page::first(9)).await),
        ["m-07"]
    );
    assert_eq!(
        ids(&s(Filter::new().id("m-03").id("m-05").id("zz"), Page::first(9)).await),
        ["m-05", "m-03"]
    );
    // Nothing matches.
    assert!(
        s(Filter::new().class("poison"), Page::first(9))
            .await
            .is_empty()
    );
}

async fn counts_over_a_window(b: Backend) {
    let Some(o) = b.open("counts", 10).await else {
        return;
    };
    let mut batch = vec![rec("old", "poison", "render error", at(0))];
    for i in 0..6 {
        batch.push(rec(
            &format!("t{i}"),
            "transient",
            "http 503",
            at(100_000 + i),
        ));
    }
    for i in 0..3 {
        batch.push(rec(
            &format!("h{i}"),
            "throttled",
            "http 429",
            at(100_000 + i),
        ));
    }
    batch.push(rec("u0", "transient", "io ConnectionReset", at(200_000)));
    o.store.put_many(batch).await.unwrap();

    let c = o.store.counts(at(50_000)).await.unwrap();
    assert_eq!(c.total, 10);
    assert_eq!(
        c.by_class,
        vec![("transient".to_owned(), 7), ("throttled".to_owned(), 3)]
    );
    assert_eq!(
        c.by_code,
        vec![
            ("http 503".to_owned(), 6),
            ("http 429".to_owned(), 3),
            ("io ConnectionReset".to_owned(), 1)
        ]
    );
    let new: Vec<&str> = c.new_codes.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(new, ["http 429", "http 503", "io ConnectionReset"]);
    assert_eq!(c.new_codes[2].1, at(200_000));
    // A code seen long ago is not new, even when it comes back.
    o.store
        .put(rec("old2", "poison", "render error", at(300_000)))
        .await
        .unwrap();
    let c = o.store.counts(at(250_000)).await.unwrap();
    assert_eq!(c.total, 1);
    assert!(c.new_codes.is_empty(), "{:?}", c.new_codes);
    // All time.
    assert_eq!(
        o.store.count_by_class().await.unwrap(),
        vec![
            ("transient".to_owned(), 7),
            ("throttled".to_owned(), 3),
            ("poison".to_owned(), 2)
        ]
    );
}

async fn put_many_is_one_batch(b: Backend) {
    let Some(o) = b.open("put_many", 10).await else {
        return;
    };
    let mut batch: Vec<Record> = (0..500u64)
        .map(|i| rec(&format!("m-{i:03}"), "transient", "http 503", at(i)))
        .collect();
    // The same id twice in one batch merges too.
    batch.push(rec("m-000", "unknown", "http 500", at(1_000)));
    o.store.put_many(batch).await.unwrap();
    assert_eq!(o.store.list(10_000).await.unwrap().len(), 500);
    let r = o.store.get("m-000").await.unwrap().unwrap();
    assert_eq!(
        (r.attempts, r.class.as_str(), r.history.len()),
        (2, "unknown", 2)
    );
}

async fn updates(b: Backend) {
    let Some(o) = b.open("updates", 10).await else {
        return;
    };
    let mut r = rec("m-1", "transient", "http 503", at(0));
    r.attempts = 4;
    r.budget_spent = 4;
    o.store.put(r).await.unwrap();
    let r = o
        .store
        .update("m-1", Change::Redriving { until: at(60_000) })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.retry_at, r.resends, r.budget_spent, r.attempts),
        (Status::InFlight, Some(at(60_000)), 1, 0, 4)
    );
    assert_eq!(o.store.get("m-1").await.unwrap().unwrap(), r);
    let r = o
        .store
        .update("m-1", Change::Resolved { at: at(5_000) })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.resolved_at, r.retry_at),
        (Status::Resolved, Some(at(5_000)), None)
    );
    // Resolved is not claimable.
    assert!(
        o.store
            .claim_due(at(1_000_000), 10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    let r = o.store.update("m-1", Change::Dead).await.unwrap().unwrap();
    assert_eq!(r.status, Status::Dead);
    assert_eq!(o.store.update("nope", Change::Dead).await.unwrap(), None);
}

async fn claims_due_in_retry_order(b: Backend) {
    let Some(o) = b.open("claim", 10).await else {
        return;
    };
    o.store
        .put_many(vec![
            deferred(rec("late", "throttled", "http 429", at(0)), at(30_000)),
            deferred(rec("soon", "throttled", "http 429", at(0)), at(10_000)),
            deferred(rec("mid", "throttled", "http 429", at(0)), at(20_000)),
            rec("dead", "permanent", "http 400", at(0)),
        ])
        .await
        .unwrap();
    let lease = Duration::from_secs(5);
    assert!(
        o.store
            .claim_due(at(9_999), 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    let claimed = o.store.claim_due(at(25_000), 10, lease).await.unwrap();
    assert_eq!(ids(&claimed), ["soon", "mid"]);
    assert!(
        claimed.iter().all(|r| r.status == Status::InFlight
            && r.retry_at == Some(at(30_000))
            && r.resends == 1)
    );
    // Claimed: not again while the lease runs; the next due one only.
    let again = o.store.claim_due(at(29_999), 10, lease).await.unwrap();
    assert!(again.is_empty(), "{:?}", ids(&again));
    let third = o.store.claim_due(at(30_000), 1, lease).await.unwrap();
    assert_eq!(third.len(), 1);
    // The lease of the first two ended at 30 s: they are claimable again (a dead scheduler).
    let expired = o.store.claim_due(at(31_000), 10, lease).await.unwrap();
    let mut got: Vec<&str> = ids(&expired);
    got.sort();
    let mut want = vec!["late", "mid", "soon"];
    want.retain(|id| *id != third[0].id);
    assert_eq!(got, want);
    assert!(expired.iter().all(|r| r.resends == 2));
}

async fn concurrent_claims_never_overlap(b: Backend) {
    let Some(o) = b.open("claim_race", 10).await else {
        return;
    };
    let batch: Vec<Record> = (0..60u64)
        .map(|i| {
            deferred(
                rec(&format!("m-{i:02}"), "transient", "http 503", at(0)),
                at(i),
            )
        })
        .collect();
    o.store.put_many(batch).await.unwrap();
    let claimer = |store: Arc<dyn Store>| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let c = store
                    .claim_due(at(1_000), 4, Duration::from_secs(3600))
                    .await
                    .unwrap();
                if c.is_empty() {
                    break got;
                }
                got.extend(c.into_iter().map(|r| r.id));
            }
        })
    };
    let (a, b2) = (claimer(Arc::clone(&o.store)), claimer(Arc::clone(&o.store)));
    let (a, b2) = (a.await.unwrap(), b2.await.unwrap());
    let all: HashSet<&String> = a.iter().chain(&b2).collect();
    assert_eq!(a.len() + b2.len(), 60, "every record claimed exactly once");
    assert_eq!(all.len(), 60);
}

async fn delete_by_filter(b: Backend) {
    let Some(o) = b.open("delete", 10).await else {
        return;
    };
    let mut batch = Vec::new();
    for i in 0..10u64 {
        let mut r = rec(
            &format!("m-{i}"),
            if i < 4 { "poison" } else { "transient" },
            "x",
            at(i),
        );
        r.tags.insert("tenant".into(), "acme".into());
        if i >= 8 {
            r = deferred(r, at(100));
        }
        batch.push(r);
    }
    o.store.put_many(batch).await.unwrap();
    assert_eq!(
        o.store
            .delete(&Filter::new().class("poison"))
            .await
            .unwrap(),
        4
    );
    assert_eq!(
        o.store
            .delete(&Filter::new().class("poison"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(o.store.list(100).await.unwrap().len(), 6);
    assert_eq!(o.store.delete(&Filter::new().id("m-9")).await.unwrap(), 1);
    // Deleted records leave no index entry behind.
    assert_eq!(
        o.store
            .search(&Filter::new().tag("tenant", "acme"), Page::first(100))
            .await
            .unwrap()
            .len(),
        5
    );
    assert_eq!(o.store.counts(at(0)).await.unwrap().total, 5);
    let due = o
        .store
        .claim_due(at(1_000), 10, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(ids(&due), ["m-8"]);
    o.store
        .delete(&Filter::new().tag("tenant", "acme"))
        .await
        .unwrap();
    assert!(o.store.list(100).await.unwrap().is_empty());
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $case() { super::$case(super::Backend::Memory).await })*
        }
        mod sqlite {
            $(#[tokio::test] async fn $case() { super::$case(super::Backend::Sqlite).await })*
        }
        mod redis {
            $(#[tokio::test] async fn $case() { super::$case(super::Backend::Redis).await })*
        }
    };
}

conformance!(
    round_trip,
    upsert_merges_by_id,
    history_keeps_last_k,
    search_filters_and_pages,
    counts_over_a_window,
    put_many_is_one_batch,
    updates,
    claims_due_in_retry_order,
    concurrent_claims_never_overlap,
    delete_by_filter,
);
