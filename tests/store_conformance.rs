//! One behaviour, four backends: every case runs against `MemoryStore`, `SqliteStore`,
//! `RedisStore` (a real `redis-server`; see `tests/redis_support`) and `PostgresStore` (a real
//! Postgres server; see `tests/postgres_support`).

mod postgres_support;
mod redis_support;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower_backstop::dead_letter::record_of;
use tower_backstop::resend::{Outcome, Redrive, Scheduler, http_request};
use tower_backstop::store::{
    AuditAction, AuditEntry, BoxFuture, Change, Claim, Counts, Filter, Lease, MemoryStore, Record,
    Retention, SqliteStore, Status, Store, StoreError, purge,
};
use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};

/// A store to test and whatever must live as long as it (a temporary directory).
struct Opened {
    store: Arc<dyn Store>,
    /// A second handle on the same records, as another process would open it: a clone (memory),
    /// a second connection to the same file (SQLite), a second connection with the same prefix
    /// (Redis), a second pool on the same schema (Postgres).
    other: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy)]
enum Backend {
    Memory,
    Sqlite,
    Redis,
    Postgres,
}

impl Backend {
    async fn open(self, test: &str, history_limit: usize) -> Option<Opened> {
        Some(match self {
            Backend::Memory => {
                let store = MemoryStore::new().with_history_limit(history_limit);
                Opened {
                    other: Arc::new(store.clone()),
                    store: Arc::new(store),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let open = || {
                    SqliteStore::open(dir.path().join("dl.db"))
                        .unwrap()
                        .with_history_limit(history_limit)
                };
                Opened {
                    store: Arc::new(open()),
                    other: Arc::new(open()),
                    _dir: Some(dir),
                }
            }
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let store = redis_support::redis_store(test).await?;
                let other = tower_backstop::store::RedisStore::connect_with_timeouts(
                    &redis_support::redis_url(),
                    None,
                    None,
                )
                .await
                .unwrap()
                .with_prefix(store.prefix())
                .with_history_limit(history_limit);
                Opened {
                    store: Arc::new(store.with_history_limit(history_limit)),
                    other: Arc::new(other),
                    _dir: None,
                }
            }
            #[cfg(not(feature = "redis"))]
            Backend::Redis => match redis_support::redis_store(test).await? {},
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let store = postgres_support::postgres_store(test).await?;
                let other = tower_backstop::store::PostgresStore::connect(
                    &postgres_support::postgres_url(),
                )
                .schema(store.schema())
                .await
                .unwrap()
                .with_history_limit(history_limit);
                Opened {
                    store: Arc::new(store.with_history_limit(history_limit)),
                    other: Arc::new(other),
                    _dir: None,
                }
            }
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => match postgres_support::postgres_store(test).await? {},
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
    let mut r = record_of(
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

/// The root cause and the breaker round-trip, and a later write without them (a rejection whose
/// breaker no longer knows why) keeps the ones already stored.
async fn root_cause_and_breaker_are_kept(b: Backend) {
    let Some(o) = b.open("cause", 10).await else {
        return;
    };
    let mut first = rec("m-1", "circuit_open", "circuit open", at(0));
    let mut cause = first.history[0].clone();
    cause.class = "transient".into();
    cause.code = "io ConnectionRefused".into();
    cause.message = "connection refused (io ConnectionRefused); 12 failures in 10s".into();
    cause.attempts = 12;
    first.cause = Some(cause.clone());
    first.breaker = Some("api.mail.test:443".into());
    o.store.put(first.clone()).await.unwrap();
    assert_eq!(o.store.get("m-1").await.unwrap(), Some(first));
    let mut later = rec("m-1", "circuit_open", "circuit open", at(5_000));
    later.cause = None;
    o.store.put(later).await.unwrap();
    let got = o.store.get("m-1").await.unwrap().unwrap();
    assert_eq!(got.cause, Some(cause));
    assert_eq!(got.breaker.as_deref(), Some("api.mail.test:443"));
    assert_eq!(got.last_failed_at, at(5_000));
    // A newer real failure is the new root cause.
    let real = rec("m-1", "transient", "http 503", at(9_000));
    let real_cause = real.cause.clone();
    assert!(real_cause.is_some());
    o.store.put(real).await.unwrap();
    assert_eq!(o.store.get("m-1").await.unwrap().unwrap().cause, real_cause);
}

/// A page that ends at `usize::MAX` ("the rest") reads every record after its start, through
/// every index: `list(usize::MAX)` is the whole store.
async fn an_open_ended_page_reads_to_the_end(b: Backend) {
    let Some(o) = b.open("open_ended", 10).await else {
        return;
    };
    for i in 0..7 {
        o.store
            .put(rec(&format!("m-{i}"), "transient", "http 503", at(i)))
            .await
            .unwrap();
    }
    assert_eq!(o.store.list(usize::MAX).await.unwrap().len(), 7);
    let rest = o
        .store
        .search(&Filter::new().class("transient"), 5..usize::MAX)
        .await
        .unwrap();
    assert_eq!(ids(&rest), ["m-1", "m-0"]);
    let rest = o.store.search(&Filter::new(), 2..usize::MAX).await.unwrap();
    assert_eq!(rest.len(), 5);
}

/// Only dead records count as dead letters, the deferred and in-flight ones apart, resolved
/// ones nowhere, through every status change.
async fn counts_follow_each_status_change(b: Backend) {
    let Some(o) = b.open("count_status", 10).await else {
        return;
    };
    for i in 0..3 {
        o.store
            .put(rec(&format!("d-{i}"), "transient", "http 503", at(i)))
            .await
            .unwrap();
    }
    for i in 0..2 {
        o.store
            .put(deferred(
                rec(&format!("w-{i}"), "throttled", "http 429", at(10 + i)),
                at(100),
            ))
            .await
            .unwrap();
    }
    let counts = |o: &Opened| {
        let store = Arc::clone(&o.store);
        async move {
            let c = store.counts(at(0)).await.unwrap();
            (c.total, c.deferred, c.by_class, c.by_code)
        }
    };
    let transient = |n| vec![("transient".to_owned(), n)];
    let http_503 = |n| vec![("http 503".to_owned(), n)];
    assert_eq!(counts(&o).await, (3, 2, transient(3), http_503(3)));
    o.store
        .update("d-0", Change::Resolved { at: at(50) })
        .await
        .unwrap();
    assert_eq!(counts(&o).await, (2, 2, transient(2), http_503(2)));
    let claimed = o
        .store
        .claim_due(at(200), 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        counts(&o).await,
        (2, 2, transient(2), http_503(2)),
        "in flight"
    );
    o.store
        .update(&claimed[0].id, Change::Resolved { at: at(60) })
        .await
        .unwrap();
    assert_eq!(counts(&o).await.1, 1);
    let other = if claimed[0].id == "w-0" { "w-1" } else { "w-0" };
    o.store.update(other, Change::Dead).await.unwrap();
    let (total, deferred, by_class, by_code) = counts(&o).await;
    assert_eq!((total, deferred), (3, 0));
    assert_eq!(
        by_class,
        [("transient".to_owned(), 2), ("throttled".to_owned(), 1)]
    );
    assert_eq!(
        by_code,
        [("http 503".to_owned(), 2), ("http 429".to_owned(), 1)]
    );
    o.store.delete(&Filter::new().id("d-1")).await.unwrap();
    assert_eq!(counts(&o).await.0, 2);
}

/// A claimed record the scheduler does not send ([`Change::Held`]) is deferred again with its
/// claim's resend given back, compare-and-set like every claim.
async fn a_held_record_gives_its_claim_back(b: Backend) {
    let Some(o) = b.open("held", 10).await else {
        return;
    };
    o.store
        .put(deferred(
            rec("m-1", "circuit_open", "circuit open", at(0)),
            at(1_000),
        ))
        .await
        .unwrap();
    let claimed = o
        .store
        .claim_due(at(2_000), 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((claimed.len(), claimed[0].resends), (1, 1));
    let held = o
        .store
        .change_if_unchanged(
            &claimed[0],
            Change::Held {
                retry_at: at(30_000),
            },
        )
        .await
        .unwrap();
    let Claim::Claimed(held) = held else {
        panic!("{held:?}")
    };
    assert_eq!(
        (held.status, held.resends, held.retry_at),
        (Status::Deferred, 0, Some(at(30_000)))
    );
    assert_eq!(o.store.get("m-1").await.unwrap().as_ref(), Some(&*held));
    // Not due before its new time; a second give-back from the stale claim is refused.
    assert!(
        o.store
            .claim_due(at(29_999), 10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        o.store
            .change_if_unchanged(&claimed[0], Change::Held { retry_at: at(1) })
            .await
            .unwrap(),
        Claim::ClaimedElsewhere { .. }
    ));
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
        .search(&Filter::new().class("transient"), 0..10)
        .await
        .unwrap();
    assert!(by_old.is_empty());
    let by_new = o
        .store
        .search(&Filter::new().class("unknown"), 0..10)
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

    let s = |f: Filter, p: Range<usize>| {
        let store = Arc::clone(&o.store);
        async move { store.search(&f, p).await.unwrap() }
    };
    // Newest first.
    assert_eq!(ids(&s(Filter::new(), 0..3).await), ["m-29", "m-28", "m-27"]);
    // Paging.
    assert_eq!(ids(&s(Filter::new(), 3..6).await), ["m-26", "m-25", "m-24"]);
    assert_eq!(s(Filter::new(), 28..38).await.len(), 2);
    // Class.
    let throttled = s(Filter::new().class("throttled"), 0..100).await;
    assert_eq!(throttled.len(), 10);
    assert!(throttled.iter().all(|r| r.class == "throttled"));
    // Code.
    assert_eq!(s(Filter::new().code("http 400"), 0..100).await.len(), 10);
    // Tag, and tag with class.
    assert_eq!(
        s(Filter::new().tag("campaign", "summer"), 0..100)
            .await
            .len(),
        15
    );
    let summer_permanent = s(
        Filter::new().tag("campaign", "summer").class("permanent"),
        0..100,
    )
    .await;
    assert_eq!(
        ids(&summer_permanent),
        ["m-29", "m-26", "m-23", "m-20", "m-17"]
    );
    // Time range: since inclusive, until exclusive.
    let range = s(Filter::new().since(at(10_000)).until(at(13_000)), 0..100).await;
    assert_eq!(ids(&range), ["m-12", "m-11", "m-10"]);
    // Status, ids.
    assert_eq!(
        ids(&s(Filter::new().status(Status::Resolved), 0..9).await),
        ["m-07"]
    );
    assert_eq!(
        ids(&s(Filter::new().id("m-03").id("m-05").id("zz"), 0..9).await),
        ["m-05", "m-03"]
    );
    // Nothing matches.
    assert!(s(Filter::new().class("poison"), 0..9).await.is_empty());
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
            .search(&Filter::new().tag("tenant", "acme"), 0..100)
            .await
            .unwrap()
            .len(),
        5
    );
    // Four dead letters and one deferred record are left: counted apart.
    let c = o.store.counts(at(0)).await.unwrap();
    assert_eq!((c.total, c.deferred), (4, 1));
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

async fn claims_are_compare_and_set(b: Backend) {
    let Some(o) = b.open("cas_claim", 10).await else {
        return;
    };
    o.store
        .put(rec("m-1", "transient", "http 503", at(0)))
        .await
        .unwrap();
    let seen = o.store.get("m-1").await.unwrap().unwrap();
    let Claim::Claimed(won) = o.store.claim(&seen, at(60_000)).await.unwrap() else {
        panic!("the first claim wins");
    };
    assert_eq!(
        (won.status, won.retry_at, won.resends, won.budget_spent),
        (Status::InFlight, Some(at(60_000)), 1, 0)
    );
    // The second claimer read the same record: it loses, from either handle.
    for store in [&o.store, &o.other] {
        assert_eq!(
            store.claim(&seen, at(90_000)).await.unwrap(),
            Claim::ClaimedElsewhere {
                status: Status::InFlight,
                resends: 1
            }
        );
    }
    // Dead again (the claimer gave up): the status is the one read, but a claim happened in
    // between, so an old read still loses.
    o.store.update("m-1", Change::Dead).await.unwrap();
    assert!(matches!(
        o.store.claim(&seen, at(90_000)).await.unwrap(),
        Claim::ClaimedElsewhere {
            status: Status::Dead,
            resends: 1
        }
    ));
    let fresh = o.store.get("m-1").await.unwrap().unwrap();
    assert!(matches!(
        o.other.claim(&fresh, at(90_000)).await.unwrap(),
        Claim::Claimed(_)
    ));
    // Deleted meanwhile: nothing is written back.
    o.store.delete(&Filter::new().id("m-1")).await.unwrap();
    assert_eq!(
        o.store.claim(&fresh, at(99_000)).await.unwrap(),
        Claim::Missing
    );
    assert_eq!(o.store.get("m-1").await.unwrap(), None);
    assert!(o.store.list(10).await.unwrap().is_empty());
}

/// A claim is a lease with a fencing token: the holder renews it; once it ended and another
/// claimer took the record, every write through the old lease changes nothing, from either
/// handle; the new holder's writes go through.
async fn a_claim_is_fenced_by_its_token(b: Backend) {
    let Some(o) = b.open("fenced", 10).await else {
        return;
    };
    o.store
        .put(deferred(
            rec("m-1", "throttled", "http 429", at(0)),
            at(1_000),
        ))
        .await
        .unwrap();
    let lease = Duration::from_secs(5);
    let first = o.store.claim_due(at(1_000), 10, lease).await.unwrap();
    let a = first[0].lease().expect("a claimed record is in flight");
    assert_eq!((a.id.as_str(), a.token, a.until), ("m-1", 1, at(6_000)));
    // Renewed while it holds: the end moves, the token stays.
    let renewed = o
        .other
        .change_claimed(&a, Change::Renewed { until: at(9_000) })
        .await
        .unwrap();
    let Claim::Claimed(renewed) = renewed else {
        panic!("{renewed:?}")
    };
    assert_eq!(
        (renewed.status, renewed.resends, renewed.retry_at),
        (Status::InFlight, 1, Some(at(9_000)))
    );
    assert_eq!(renewed.lease().map(|l| l.until), Some(at(9_000)));
    // Not due before the new end; after it, another claimer takes it, with a new token.
    assert!(
        o.store
            .claim_due(at(8_999), 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    let second = o.other.claim_due(at(9_000), 10, lease).await.unwrap();
    let b2 = second[0].lease().unwrap();
    assert_eq!((b2.token, b2.until), (2, at(14_000)));
    // The first claimer wakes up: nothing it writes through its old lease lands.
    let before = o.store.get("m-1").await.unwrap();
    let taken = Claim::ClaimedElsewhere {
        status: Status::InFlight,
        resends: 2,
    };
    for change in [
        Change::Renewed { until: at(60_000) },
        Change::Resolved { at: at(10_000) },
        Change::Dead,
        Change::Held { retry_at: at(1) },
        Change::Released { retry_at: at(1) },
    ] {
        for store in [&o.store, &o.other] {
            assert_eq!(
                store.change_claimed(&a, change).await.unwrap(),
                taken,
                "{change:?}"
            );
        }
    }
    let failure = deferred(rec("m-1", "transient", "http 503", at(10_000)), at(1));
    assert_eq!(
        o.store.put_claimed(&a, failure.clone()).await.unwrap(),
        taken
    );
    assert_eq!(o.store.get("m-1").await.unwrap(), before, "nothing changed");
    // The holder finishes it; its claim is then over too.
    let done = o
        .other
        .change_claimed(&b2, Change::Resolved { at: at(10_000) })
        .await
        .unwrap();
    let Claim::Claimed(done) = done else {
        panic!("{done:?}")
    };
    assert_eq!(
        (done.status, done.resolved_at, done.retry_at, done.resends),
        (Status::Resolved, Some(at(10_000)), None, 2)
    );
    assert_eq!(
        o.store.change_claimed(&b2, Change::Dead).await.unwrap(),
        Claim::ClaimedElsewhere {
            status: Status::Resolved,
            resends: 2
        }
    );
    // Deleted meanwhile: nothing is written, and no record comes back.
    o.store.delete(&Filter::new().id("m-1")).await.unwrap();
    assert_eq!(
        o.store.change_claimed(&b2, Change::Dead).await.unwrap(),
        Claim::Missing
    );
    assert_eq!(
        o.store.put_claimed(&b2, failure).await.unwrap(),
        Claim::Missing
    );
    assert_eq!(o.store.get("m-1").await.unwrap(), None);
}

/// A re-send that fails again under its claim merges its failure as `put` would, and that write
/// ends the claim; a claim given back after a send keeps its resend, one given back unsent
/// returns it; a failure of another record is refused.
async fn a_failure_under_its_claim_ends_it(b: Backend) {
    let Some(o) = b.open("put_claimed", 10).await else {
        return;
    };
    o.store
        .put(deferred(
            rec("m-1", "throttled", "http 429", at(0)),
            at(1_000),
        ))
        .await
        .unwrap();
    let lease = Duration::from_secs(5);
    let a = o.store.claim_due(at(1_000), 10, lease).await.unwrap()[0]
        .lease()
        .unwrap();
    let again = deferred(rec("m-1", "transient", "http 503", at(2_000)), at(20_000));
    let written = o.other.put_claimed(&a, again).await.unwrap();
    let Claim::Claimed(written) = written else {
        panic!("{written:?}")
    };
    assert_eq!(
        (
            written.status,
            written.retry_at,
            written.resends,
            written.attempts,
            written.history.len(),
            written.code.as_str(),
            written.first_failed_at,
        ),
        (
            Status::Deferred,
            Some(at(20_000)),
            1,
            2,
            2,
            "http 503",
            at(0)
        )
    );
    assert_eq!(o.store.get("m-1").await.unwrap().as_ref(), Some(&*written));
    // That write ended the claim.
    let late = rec("m-1", "transient", "http 500", at(3_000));
    assert_eq!(
        o.store.put_claimed(&a, late).await.unwrap(),
        Claim::ClaimedElsewhere {
            status: Status::Deferred,
            resends: 1
        }
    );
    // Given back after a send: due again, the resend still counted.
    let c = o.store.claim_due(at(20_000), 10, lease).await.unwrap()[0]
        .lease()
        .unwrap();
    let released = o
        .store
        .change_claimed(
            &c,
            Change::Released {
                retry_at: at(21_000),
            },
        )
        .await
        .unwrap();
    let Claim::Claimed(released) = released else {
        panic!("{released:?}")
    };
    assert_eq!(
        (released.status, released.resends, released.retry_at),
        (Status::Deferred, 2, Some(at(21_000)))
    );
    // Given back unsent: the resend given back too.
    let d = o.other.claim_due(at(21_000), 10, lease).await.unwrap()[0]
        .lease()
        .unwrap();
    assert_eq!(d.token, 3);
    let held = o
        .other
        .change_claimed(
            &d,
            Change::Held {
                retry_at: at(22_000),
            },
        )
        .await
        .unwrap();
    let Claim::Claimed(held) = held else {
        panic!("{held:?}")
    };
    assert_eq!(
        (held.status, held.resends, held.retry_at),
        (Status::Deferred, 2, Some(at(22_000)))
    );
    // Another record's failure under this claim is refused, and nothing is written.
    let e = o.store.claim_due(at(22_000), 10, lease).await.unwrap()[0]
        .lease()
        .unwrap();
    let other = rec("m-2", "transient", "http 503", at(3_000));
    assert!(o.store.put_claimed(&e, other).await.is_err());
    assert_eq!(o.store.get("m-2").await.unwrap(), None);
}

/// The earliest retry-at time of the deferred and in-flight records, what a scheduler sleeps
/// until: dead and resolved records have none.
async fn next_due_is_the_earliest_waiting_time(b: Backend) {
    let Some(o) = b.open("next_due", 10).await else {
        return;
    };
    assert_eq!(o.store.next_due().await.unwrap(), None);
    o.store
        .put(rec("dead", "permanent", "http 400", at(0)))
        .await
        .unwrap();
    assert_eq!(
        o.store.next_due().await.unwrap(),
        None,
        "a dead record waits for no time"
    );
    o.store
        .put_many(vec![
            deferred(rec("late", "throttled", "http 429", at(0)), at(30_000)),
            deferred(rec("soon", "throttled", "http 429", at(0)), at(10_000)),
        ])
        .await
        .unwrap();
    assert_eq!(o.other.next_due().await.unwrap(), Some(at(10_000)));
    // Claimed: due again at the end of its lease.
    let soon = o
        .store
        .claim_due(at(10_000), 1, Duration::from_secs(5))
        .await
        .unwrap()[0]
        .lease()
        .unwrap();
    assert_eq!(o.other.next_due().await.unwrap(), Some(at(15_000)));
    o.store
        .change_claimed(&soon, Change::Resolved { at: at(11_000) })
        .await
        .unwrap();
    assert_eq!(o.other.next_due().await.unwrap(), Some(at(30_000)));
    let late = o
        .store
        .claim_due(at(30_000), 1, Duration::from_secs(5))
        .await
        .unwrap()[0]
        .lease()
        .unwrap();
    o.store.change_claimed(&late, Change::Dead).await.unwrap();
    assert_eq!(o.store.next_due().await.unwrap(), None);
}

/// A send schedule is one per store, whatever the handle: slots a gap apart, kept to the
/// microsecond; an idle schedule starts at the caller's now; two schedules are apart; many
/// callers at once each get a slot of their own.
async fn send_slots_are_shared(b: Backend) {
    let Some(o) = b.open("slots", 10).await else {
        return;
    };
    let gap = Duration::from_millis(50);
    let t = at(0);
    assert_eq!(o.store.reserve_slot("drain", gap, t).await.unwrap(), t);
    assert_eq!(
        o.other.reserve_slot("drain", gap, t).await.unwrap(),
        t + gap
    );
    let a_bit_later = t + Duration::from_millis(10);
    assert_eq!(
        o.store
            .reserve_slot("drain", gap, a_bit_later)
            .await
            .unwrap(),
        t + gap * 2
    );
    assert_eq!(o.other.reserve_slot("other", gap, t).await.unwrap(), t);
    // Idle past its next slot: it starts again at now, without a burst saved up.
    let later = t + Duration::from_secs(1);
    assert_eq!(
        o.store.reserve_slot("drain", gap, later).await.unwrap(),
        later
    );
    assert_eq!(
        o.other.reserve_slot("drain", gap, later).await.unwrap(),
        later + gap
    );
    let fine = Duration::from_micros(1_500);
    assert_eq!(o.store.reserve_slot("fine", fine, t).await.unwrap(), t);
    assert_eq!(
        o.other.reserve_slot("fine", fine, t).await.unwrap(),
        t + fine
    );
    // Forty callers at once, from both handles: forty slots, one gap apart.
    let now = at(5_000);
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let store = Arc::clone(if i % 2 == 0 { &o.store } else { &o.other });
            tokio::spawn(async move { store.reserve_slot("race", gap, now).await.unwrap() })
        })
        .collect();
    let mut slots = Vec::new();
    for call in calls {
        slots.push(call.await.unwrap());
    }
    slots.sort();
    let want: Vec<SystemTime> = (0..40).map(|i| now + gap * i).collect();
    assert_eq!(slots, want);
}

/// A store that lets the test hold a re-drive between reading its plan and claiming.
struct Gated {
    inner: Arc<dyn Store>,
    /// Every search waits here after reading (a barrier of the racing re-drives, or `None`).
    barrier: Option<Arc<tokio::sync::Barrier>>,
    /// Signalled after each search; a search then waits for `go` when it is set.
    searched: Arc<tokio::sync::Notify>,
    go: Option<Arc<tokio::sync::Notify>>,
}

impl Store for Gated {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.put_many(records)
    }
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.inner.get(id)
    }
    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let read = self.inner.search(filter, page);
        let (barrier, searched, go) =
            (self.barrier.clone(), self.searched.clone(), self.go.clone());
        Box::pin(async move {
            let records = read.await;
            searched.notify_one();
            if let Some(barrier) = barrier {
                barrier.wait().await;
            }
            if let Some(go) = go {
                go.notified().await;
            }
            records
        })
    }
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.inner.counts(since)
    }
    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.inner.update(id, change)
    }
    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.claim_due(now, limit, lease)
    }
    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.delete(filter)
    }
    fn append_audit(
        &self,
        entry: tower_backstop::store::AuditEntry,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.append_audit(entry)
    }
    fn audit(
        &self,
        page: std::ops::Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<tower_backstop::store::AuditEntry>, StoreError>> {
        self.inner.audit(page)
    }
    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.change_if_unchanged(seen, change)
    }
    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.put_claimed(lease, record)
    }
    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        self.inner.reserve_slot(schedule, gap, now)
    }
}

type HttpRequest = http::Request<Full<Bytes>>;

/// A provider that counts the requests it gets, per message id, and signals each one.
#[derive(Clone, Default)]
struct Provider {
    sent: Arc<std::sync::Mutex<Vec<String>>>,
    signal: Arc<tokio::sync::Notify>,
}

impl Provider {
    fn service(
        &self,
    ) -> impl tower::Service<
        HttpRequest,
        Response = http::Response<()>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        tower::service_fn(move |req: HttpRequest| {
            let this = this.clone();
            async move {
                let id = req
                    .extensions()
                    .get::<MessageId>()
                    .map(|m| m.0.clone())
                    .unwrap_or_default();
                this.sent.lock().unwrap().push(id);
                this.signal.notify_one();
                // Stay in flight a moment, so that a racing claimer comes while this one sends.
                tokio::task::yield_now().await;
                Ok::<_, BoxError>(http::Response::new(()))
            }
        })
    }

    fn sent(&self) -> Vec<String> {
        let mut sent = self.sent.lock().unwrap().clone();
        sent.sort();
        sent
    }
}

async fn two_redrives_race_one_sends(b: Backend) {
    let Some(o) = b.open("redrive_race", 10).await else {
        return;
    };
    o.store
        .put(rec("m-1", "transient", "http 503", at(0)))
        .await
        .unwrap();
    // Both re-drives read the record (dead, no re-send) before either claims it.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let gated = |store: &Arc<dyn Store>| Gated {
        inner: Arc::clone(store),
        barrier: Some(Arc::clone(&barrier)),
        searched: Arc::default(),
        go: None,
    };
    let (a, b2) = (gated(&o.store), gated(&o.other));
    let provider = Provider::default();
    let redrive = Redrive::new(Filter::new().id("m-1"), 1_000, 10).unwrap();
    let (ra, rb) = tokio::join!(
        redrive.run(&a, provider.service(), |r| http_request(r, None)),
        redrive.run(&b2, provider.service(), |r| http_request(r, None)),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(provider.sent(), ["m-1"], "exactly one send");
    assert_eq!(ra.resolved() + rb.resolved(), 1);
    assert_eq!(ra.skipped() + rb.skipped(), 1);
    let skipped = ra.records.iter().chain(&rb.records).find_map(|r| match r {
        Outcome::Skipped { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert!(
        skipped.as_deref().unwrap().starts_with("claimed elsewhere"),
        "{skipped:?}"
    );
    let r = o.store.get("m-1").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 1));
}

async fn redrive_races_scheduler(b: Backend) {
    let Some(o) = b.open("redrive_vs_scheduler", 10).await else {
        return;
    };
    let now = SystemTime::now();
    let due = deferred(
        rec("m-1", "throttled", "http 429", now - Duration::from_secs(2)),
        now - Duration::from_secs(1),
    );
    o.store.put(due).await.unwrap();
    let go = Arc::new(tokio::sync::Notify::new());
    let gated = Gated {
        inner: Arc::clone(&o.store),
        barrier: None,
        searched: Arc::default(),
        go: Some(Arc::clone(&go)),
    };
    let searched = Arc::clone(&gated.searched);
    let provider = Provider::default();
    let service = provider.service();
    let redrive = tokio::spawn(async move {
        Redrive::new(Filter::new().id("m-1"), 1_000, 10)
            .unwrap()
            .run(&gated, service, |r| http_request(r, None))
            .await
    });
    // The re-drive has read the record as deferred; now the scheduler claims and sends it.
    searched.notified().await;
    let scheduler = Scheduler::new(Arc::clone(&o.other), provider.service(), |r: &Record| {
        http_request(r, None)
    })
    .poll_every(Duration::from_millis(5))
    .spawn();
    provider.signal.notified().await;
    go.notify_one();
    let report = redrive.await.unwrap().unwrap();
    scheduler.shutdown().await;
    assert_eq!(provider.sent(), ["m-1"], "exactly one send");
    assert_eq!((report.resolved(), report.skipped()), (0, 1));
    let Outcome::Skipped { reason, .. } = &report.records[0] else {
        panic!("{report:?}");
    };
    assert!(reason.starts_with("claimed elsewhere"), "{reason}");
    let r = o.store.get("m-1").await.unwrap().unwrap();
    assert_eq!((r.status, r.resends), (Status::Resolved, 1));
}

async fn two_schedulers_send_each_record_once(b: Backend) {
    let Some(o) = b.open("two_schedulers", 10).await else {
        return;
    };
    let now = SystemTime::now();
    let records: Vec<Record> = (0..24)
        .map(|i| {
            deferred(
                rec(&format!("m-{i:02}"), "throttled", "http 429", now),
                now - Duration::from_millis(100 + i),
            )
        })
        .collect();
    o.store.put_many(records).await.unwrap();
    let provider = Provider::default();
    let spawn = |store: &Arc<dyn Store>| {
        Scheduler::new(Arc::clone(store), provider.service(), |r: &Record| {
            http_request(r, None)
        })
        .poll_every(Duration::from_millis(2))
        .concurrency(3)
        .spawn()
    };
    let (one, two) = (spawn(&o.store), spawn(&o.other));
    while provider.sent.lock().unwrap().len() < 24 {
        provider.signal.notified().await;
    }
    one.shutdown().await;
    two.shutdown().await;
    let want: Vec<String> = (0..24).map(|i| format!("m-{i:02}")).collect();
    assert_eq!(provider.sent(), want, "each record sent exactly once");
    let all = o.store.list(100).await.unwrap();
    assert!(
        all.iter()
            .all(|r| r.status == Status::Resolved && r.resends == 1),
        "{:?}",
        all.iter()
            .map(|r| (&r.id, r.status, r.resends))
            .collect::<Vec<_>>()
    );
}

/// A store whose every operation waits while the test holds it frozen: a process that stalls
/// (a long pause, a store it cannot reach) with its renewals stuck on the way.
struct Frozen {
    inner: Arc<dyn Store>,
    frozen: tokio::sync::watch::Receiver<bool>,
}

impl Frozen {
    /// Runs `op` on the inner store once it is not frozen (the operation is only made then: a
    /// store may do its work when the call is made, before the future is polled).
    fn gate<T: Send + 'static>(
        &self,
        op: impl FnOnce(&dyn Store) -> BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (inner, mut frozen) = (Arc::clone(&self.inner), self.frozen.clone());
        Box::pin(async move {
            let _ = frozen.wait_for(|f| !*f).await;
            op(&*inner).await
        })
    }
}

impl Store for Frozen {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        self.gate(move |s| s.put_many(records))
    }
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.gate(move |s| s.get(&id))
    }
    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let filter = filter.clone();
        self.gate(move |s| s.search(&filter, page))
    }
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.gate(move |s| s.counts(since))
    }
    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let id = id.to_owned();
        self.gate(move |s| s.update(&id, change))
    }
    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.gate(move |s| s.claim_due(now, limit, lease))
    }
    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.gate(move |s| s.delete(&filter))
    }
    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.gate(move |s| s.append_audit(entry))
    }
    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.gate(move |s| s.audit(page))
    }
    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let seen = seen.clone();
        self.gate(move |s| s.change_if_unchanged(&seen, change))
    }
    fn change_claimed(
        &self,
        lease: &Lease,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let lease = lease.clone();
        self.gate(move |s| s.change_claimed(&lease, change))
    }
    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let lease = lease.clone();
        self.gate(move |s| s.put_claimed(&lease, record))
    }
    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.gate(|s| s.next_due())
    }
    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        let schedule = schedule.to_owned();
        self.gate(move |s| s.reserve_slot(&schedule, gap, now))
    }
}

/// A provider that notes the idempotency key of each request it gets.
fn keyed_provider(
    keys: Arc<std::sync::Mutex<Vec<String>>>,
    signal: Arc<tokio::sync::Notify>,
) -> impl tower::Service<
    HttpRequest,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: HttpRequest| {
        let key = req
            .headers()
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        keys.lock().unwrap().push(key);
        signal.notify_one();
        async { Ok::<_, BoxError>(http::Response::new(())) }
    })
}

/// A connection whose calls never end; each one signals when it starts.
fn hanging(
    started: Arc<tokio::sync::Semaphore>,
) -> impl tower::Service<
    HttpRequest,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: HttpRequest| {
        started.add_permits(1);
        std::future::pending::<Result<http::Response<()>, BoxError>>()
    })
}

/// Polls `store` until the record `id` satisfies `done`, for at most 20 s (real time: the
/// scheduler's leases run on the system clock).
async fn until_record(store: &dyn Store, id: &str, done: impl Fn(&Record) -> bool) -> Record {
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = store.get(id).await.unwrap()
            && done(&r)
        {
            return r;
        }
        assert!(std::time::Instant::now() < give_up, "{id} never got there");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A deferred record due a second ago, with an idempotency key header.
fn due_keyed(id: &str, now: SystemTime) -> Record {
    let mut r = deferred(
        rec(id, "throttled", "http 429", now - Duration::from_secs(2)),
        now - Duration::from_secs(1),
    );
    r.headers = vec![("idempotency-key".to_owned(), id.as_bytes().to_vec())];
    r
}

/// A scheduler stalls past its lease (its store frozen) while its re-send is in flight; another
/// claims the record and delivers it; then the stalled one wakes and its re-send fails: its
/// write, fenced by its claim's token, changes nothing, and the provider saw the record once.
/// A short real lease: Postgres and Redis do not run on a paused clock.
async fn a_late_sender_past_its_lease_changes_nothing(b: Backend) {
    let Some(o) = b.open("late_sender", 10).await else {
        return;
    };
    let lease = Duration::from_millis(600);
    o.store
        .put(due_keyed("m-1", SystemTime::now()))
        .await
        .unwrap();
    let (freeze, frozen) = tokio::sync::watch::channel(false);
    let a_store: Arc<dyn Store> = Arc::new(Frozen {
        inner: Arc::clone(&o.store),
        frozen,
    });
    // A's connection stalls with the request, then breaks before the provider saw it.
    let (started, release) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let broken = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        tower::service_fn(move |_: HttpRequest| {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            async move {
                started.add_permits(1);
                release.notified().await;
                Err::<http::Response<()>, BoxError>("connection reset".into())
            }
        })
    };
    let a_stack = tower::ServiceBuilder::new()
        .layer(tower_backstop::dead_letter::DeadLetterLayer::from_arc(
            Arc::clone(&a_store),
        ))
        .service(broken);
    let a = Scheduler::new(Arc::clone(&a_store), a_stack, |r: &Record| {
        http_request(r, None)
    })
    .lease(lease)
    .poll_every(Duration::from_millis(50))
    .spawn();
    started.acquire().await.unwrap().forget();
    freeze.send(true).unwrap();

    let (keys, signal) = (Arc::default(), Arc::new(tokio::sync::Notify::new()));
    let b_scheduler = Scheduler::new(
        Arc::clone(&o.other),
        keyed_provider(Arc::clone(&keys), Arc::clone(&signal)),
        |r: &Record| http_request(r, None),
    )
    .lease(lease)
    .poll_every(Duration::from_millis(50))
    .spawn();
    let delivered = until_record(&*o.store, "m-1", |r| r.status == Status::Resolved).await;
    b_scheduler.shutdown().await;
    assert_eq!(delivered.resends, 2, "the second claim delivered it");

    // A wakes: its re-send fails, and its dead-letter layer writes the failure under A's claim.
    freeze.send(false).unwrap();
    release.notify_one();
    a.shutdown_within(Duration::from_secs(10)).await;
    let after = o.store.get("m-1").await.unwrap().unwrap();
    assert_eq!(
        (after.status, after.resends, after.retry_at, &after.history),
        (Status::Resolved, 2, None, &delivered.history),
        "the late write changed nothing"
    );
    assert_eq!(
        *keys.lock().unwrap(),
        ["m-1"],
        "sent once, with its idempotency key"
    );
}

/// A scheduler dies with its re-sends in flight (its task aborted, its store handle dropped):
/// another scheduler takes its records once their lease ends, within the lease and one poll.
async fn a_dead_schedulers_claims_are_taken_over_within_the_lease(b: Backend) {
    let Some(Opened { store, other, _dir }) = b.open("takeover", 10).await else {
        return;
    };
    let (lease, poll) = (Duration::from_millis(1_500), Duration::from_millis(100));
    let now = SystemTime::now();
    store
        .put_many((0..3).map(|i| due_keyed(&format!("m-{i}"), now)).collect())
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let a = Scheduler::new(other, hanging(Arc::clone(&started)), |r: &Record| {
        http_request(r, None)
    })
    .lease(lease)
    .poll_every(poll)
    .spawn();
    started.acquire_many(3).await.unwrap().forget();
    let killed = std::time::Instant::now();
    a.abort();

    let (keys, signal) = (Arc::default(), Arc::new(tokio::sync::Notify::new()));
    let b_scheduler = Scheduler::new(
        Arc::clone(&store),
        keyed_provider(Arc::clone(&keys), Arc::clone(&signal)),
        |r: &Record| http_request(r, None),
    )
    .lease(lease)
    .poll_every(poll)
    .spawn();
    for i in 0..3 {
        until_record(&*store, &format!("m-{i}"), |r| r.status == Status::Resolved).await;
    }
    let took = killed.elapsed();
    b_scheduler.shutdown().await;
    // A renewed its claims every third of the lease: they ended between two thirds of the lease
    // and the lease after it died. (One second of slack for a busy test machine.)
    assert!(
        took >= lease * 2 / 3,
        "taken over before the lease ended: {took:?}"
    );
    assert!(
        took <= lease + poll + Duration::from_secs(1),
        "taken over after {took:?}"
    );
    let mut keys = keys.lock().unwrap().clone();
    keys.sort();
    assert_eq!(keys, ["m-0", "m-1", "m-2"]);
    for i in 0..3 {
        let r = store.get(&format!("m-{i}")).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 2), "{r:?}");
    }
}

/// A scheduler shut down with re-sends in flight waits at most its bound, then gives their
/// claims back, due at once: another scheduler, with a long lease, sends them at once.
async fn a_shutdown_gives_its_claims_back(b: Backend) {
    let Some(o) = b.open("shutdown_gives_back", 10).await else {
        return;
    };
    let now = SystemTime::now();
    o.store
        .put_many((0..4).map(|i| due_keyed(&format!("m-{i}"), now)).collect())
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let a = Scheduler::new(
        Arc::clone(&o.other),
        hanging(Arc::clone(&started)),
        |r: &Record| http_request(r, None),
    )
    .lease(Duration::from_secs(60))
    .concurrency(2)
    .spawn();
    started.acquire_many(2).await.unwrap().forget();
    let bound = Duration::from_millis(300);
    let asked = std::time::Instant::now();
    a.shutdown_within(bound).await;
    let took = asked.elapsed();
    assert!(
        took >= bound && took < bound + Duration::from_secs(2),
        "{took:?}"
    );
    let all = o.store.list(10).await.unwrap();
    let given_back: Vec<_> = all.iter().filter(|r| r.resends == 1).collect();
    assert_eq!(given_back.len(), 2, "{all:?}");
    for r in &given_back {
        // Due now, and the re-send that may have reached the provider stays counted.
        assert_eq!(r.status, Status::Deferred, "{r:?}");
        assert!(r.retry_at.unwrap() <= SystemTime::now(), "{r:?}");
    }

    let (keys, signal) = (Arc::default(), Arc::new(tokio::sync::Notify::new()));
    let given_back_at = std::time::Instant::now();
    let b_scheduler = Scheduler::new(
        Arc::clone(&o.store),
        keyed_provider(Arc::clone(&keys), Arc::clone(&signal)),
        |r: &Record| http_request(r, None),
    )
    .lease(Duration::from_secs(60))
    .poll_every(Duration::from_millis(50))
    .spawn();
    for i in 0..4 {
        until_record(&*o.store, &format!("m-{i}"), |r| {
            r.status == Status::Resolved
        })
        .await;
    }
    assert!(
        given_back_at.elapsed() < Duration::from_secs(5),
        "taken at once, not after the 60 s lease: {:?}",
        given_back_at.elapsed()
    );
    b_scheduler.shutdown().await;
    assert_eq!(keys.lock().unwrap().len(), 4);
}

/// Three schedulers on one store, each allowed 1,000 re-sends a second of its own, share a
/// fleet-wide rate of 20 a second through the store: the provider gets at most 20 in any
/// second, and the 30 records take their 29 gaps of 50 ms.
async fn a_fleet_rate_is_shared_by_every_scheduler_on_the_store(b: Backend) {
    let Some(o) = b.open("fleet_rate", 10).await else {
        return;
    };
    let now = SystemTime::now();
    o.store
        .put_many(
            (0..30)
                .map(|i| due_keyed(&format!("m-{i:02}"), now))
                .collect(),
        )
        .await
        .unwrap();
    let at: Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Arc::default();
    let provider = {
        let at = Arc::clone(&at);
        tower::service_fn(move |_: HttpRequest| {
            at.lock().unwrap().push(std::time::Instant::now());
            async { Ok::<_, BoxError>(http::Response::new(())) }
        })
    };
    let spawn = |store: &Arc<dyn Store>| {
        Scheduler::new(Arc::clone(store), provider.clone(), |r: &Record| {
            http_request(r, None)
        })
        .rate(1_000)
        .fleet_rate(20)
        .poll_every(Duration::from_millis(20))
        .spawn()
    };
    let fleet = [spawn(&o.store), spawn(&o.other), spawn(&o.other)];
    for i in 0..30 {
        until_record(&*o.store, &format!("m-{i:02}"), |r| {
            r.status == Status::Resolved
        })
        .await;
    }
    for scheduler in fleet {
        scheduler.shutdown().await;
    }
    let mut at = at.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 30, "each record sent once");
    // Slots are 50 ms apart on the store's schedule; each send goes at its slot, give or take
    // the scheduling of a busy test machine.
    let span = at[29] - at[0];
    assert!(span >= Duration::from_millis(29 * 50 - 60), "{span:?}");
    for (i, first) in at.iter().enumerate() {
        let in_a_second = at[i..]
            .iter()
            .take_while(|t| **t - *first < Duration::from_secs(1))
            .count();
        assert!(
            in_a_second <= 21,
            "{in_a_second} sends within a second of send {i}"
        );
    }
}

async fn pages_are_exact_across_ties(b: Backend) {
    let Some(o) = b.open("ties", 10).await else {
        return;
    };
    // 7 records at one instant, 3 newer, 3 older, in one class; 4 of another class between.
    let mut batch = Vec::new();
    for (i, t) in [5, 5, 5, 5, 5, 5, 5, 9, 8, 8, 1, 0, 0]
        .into_iter()
        .enumerate()
    {
        batch.push(rec(&format!("t-{i:02}"), "transient", "http 503", at(t)));
    }
    for i in 0..4 {
        batch.push(rec(&format!("o-{i}"), "throttled", "http 429", at(5)));
    }
    o.store.put_many(batch).await.unwrap();
    let mut want: Vec<Record> = o
        .store
        .search(&Filter::new().class("transient"), 0..100)
        .await
        .unwrap();
    assert_eq!(want.len(), 13);
    // Newest first, ties by id: check against a plain sort.
    let mut sorted = want.clone();
    sorted.sort_by(|a, b| {
        b.last_failed_at
            .cmp(&a.last_failed_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    assert_eq!(ids(&want), ids(&sorted));
    for limit in [1, 2, 3, 4, 5] {
        let mut paged = Vec::new();
        let mut page = 0..limit;
        loop {
            let got = o
                .store
                .search(&Filter::new().class("transient"), page.clone())
                .await
                .unwrap();
            if got.is_empty() {
                break;
            }
            paged.extend(got);
            page = page.end..page.end + limit;
        }
        assert_eq!(ids(&paged), ids(&want), "pages of {limit}");
    }
    // A time range cuts the ties as it should (since inclusive, until exclusive).
    let window = o
        .store
        .search(
            &Filter::new().class("transient").since(at(5)).until(at(9)),
            2..6,
        )
        .await
        .unwrap();
    want.retain(|r| r.last_failed_at >= at(5) && r.last_failed_at < at(9));
    assert_eq!(ids(&window), ids(&want[2..6]));
    // Counts agree with the records.
    let counts = o.store.counts(at(5)).await.unwrap();
    assert_eq!(counts.total, 10 + 4);
    assert_eq!(
        counts.by_class,
        [("transient".to_owned(), 10), ("throttled".to_owned(), 4)]
    );
    assert_eq!(
        o.store.count_by_class().await.unwrap(),
        [("transient".to_owned(), 13), ("throttled".to_owned(), 4)]
    );
}

async fn awkward_ids_and_a_big_payload(b: Backend) {
    let Some(o) = b.open("awkward", 10).await else {
        return;
    };
    let long = "x/ y".repeat(2_560); // 10 KiB
    let ids = [
        "with spaces",
        "a/b/../c",
        "rec:{x}:*",
        "é \u{0} ☃",
        long.as_str(),
    ];
    for id in ids {
        o.store
            .put(deferred(rec(id, "transient", "http 503", at(0)), at(10)))
            .await
            .unwrap();
    }
    for id in ids {
        let r = o.store.get(id).await.unwrap().unwrap();
        assert_eq!(r.id, id);
        let Claim::Claimed(_) = o.store.claim(&r, at(60_000)).await.unwrap() else {
            panic!("claim {id:.20}");
        };
        assert_eq!(o.store.budget_spent(id).await.unwrap(), Some(0));
    }
    assert_eq!(o.store.list(10).await.unwrap().len(), ids.len());
    assert_eq!(
        o.store
            .delete(&Filter::new().id(long.clone()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(o.store.get(&long).await.unwrap(), None);
    // A 10 MiB payload, binary, round-trips byte for byte.
    let mut big = rec("big", "transient", "http 503", at(0));
    big.payload = (0..10 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    big.payload_len = big.payload.len() as u64;
    o.store.put(big.clone()).await.unwrap();
    assert_eq!(o.store.get("big").await.unwrap(), Some(big));
    // A re-drive filter that matches nothing sends nothing and says so.
    let provider = Provider::default();
    let report = Redrive::new(Filter::new().class("no-such-class"), 10, 10)
        .unwrap()
        .run(&*o.store, provider.service(), |r| http_request(r, None))
        .await
        .unwrap();
    assert!(report.records.is_empty());
    assert!(provider.sent().is_empty());
}

/// Retention: by age (dead and resolved only), then by count (the oldest resolved first, then
/// the oldest dead), never a deferred record, due or not; the dry run counts the same.
async fn retention_prunes_by_age_then_count(b: Backend) {
    let Some(o) = b.open("retention", 10).await else {
        return;
    };
    let forty_days = Duration::from_secs(40 * 24 * 3600);
    let old = at(0) - forty_days;
    let resolved = |mut r: Record| {
        r.status = Status::Resolved;
        r.resolved_at = Some(r.last_failed_at);
        r
    };
    let mut batch = vec![
        rec("old-dead", "transient", "x", old),
        resolved(rec("old-resolved", "transient", "x", old)),
        // Old and due: still to be delivered, never pruned.
        deferred(rec("old-deferred", "transient", "x", old), at(1)),
    ];
    for i in 0..4u64 {
        batch.push(resolved(rec(&format!("r-{i}"), "transient", "x", at(i))));
        batch.push(rec(&format!("d-{i}"), "poison", "y", at(4 + i)));
    }
    batch.push(deferred(rec("w-due", "transient", "x", at(8)), at(9)));
    batch.push(deferred(rec("w-later", "transient", "x", at(9)), at(5_000)));
    o.store.put_many(batch).await.unwrap();
    assert_eq!(o.store.count(&Filter::new()).await.unwrap(), 13);
    assert_eq!(
        o.store
            .count(&Filter::new().status(Status::Dead))
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        o.store
            .count(&Filter::new().status(Status::Resolved).until(at(0)))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        o.store.count(&Filter::new().class("poison")).await.unwrap(),
        4
    );
    // A status with a class, and the deferred records: counted and paged as the others.
    let dead_poison = Filter::new().status(Status::Dead).class("poison");
    assert_eq!(o.store.count(&dead_poison).await.unwrap(), 4);
    assert_eq!(
        ids(&o.store.search(&dead_poison, 1..3).await.unwrap()),
        ["d-2", "d-1"]
    );
    let waiting = Filter::new().status(Status::Deferred);
    assert_eq!(o.store.count(&waiting).await.unwrap(), 3);
    assert_eq!(
        ids(&o.store.search(&waiting, 0..10).await.unwrap()),
        ["w-later", "w-due", "old-deferred"]
    );
    let resolved = Filter::new().status(Status::Resolved);
    assert_eq!(
        ids(&o.store.search(&resolved, 3..10).await.unwrap()),
        ["r-0", "old-resolved"]
    );

    let now = at(1_000);
    let retention = Retention::new()
        .max_age(Duration::from_secs(30 * 24 * 3600))
        .max_records(6);
    let plan = retention.plan(&*o.store, now).await.unwrap();
    assert_eq!((plan.by_age, plan.by_count), (2, 5), "the dry run");
    assert_eq!(
        o.store.count(&Filter::new()).await.unwrap(),
        13,
        "a dry run removes nothing"
    );

    let pruned = retention.prune(&*o.store, now).await.unwrap();
    assert_eq!((pruned.by_age, pruned.by_count), (2, 5));
    let mut left: Vec<String> = o
        .other
        .list(100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["d-1", "d-2", "d-3", "old-deferred", "w-due", "w-later"],
        "every resolved record went before the oldest dead one; the deferred ones stayed"
    );
    // Nothing left above the bounds: a second prune removes nothing.
    assert_eq!(retention.prune(&*o.store, now).await.unwrap().total(), 0);
    // A bound of 0 keeps only what is still to be delivered.
    let all = Retention::new().no_max_age().max_records(0);
    assert_eq!(all.plan(&*o.store, now).await.unwrap().by_count, 3);
    assert_eq!(all.prune(&*o.store, now).await.unwrap().by_count, 3);
    assert_eq!(o.store.count(&Filter::new()).await.unwrap(), 3);
    let due = o
        .store
        .claim_due(at(1_000), 10, Duration::from_secs(1))
        .await
        .unwrap();
    let mut due = ids(&due);
    due.sort();
    assert_eq!(
        due,
        ["old-deferred", "w-due"],
        "the due records are still claimed"
    );
    // Retention off: nothing is removed.
    let off = Retention::new().no_max_age().no_max_records();
    assert_eq!(off.prune(&*o.store, now).await.unwrap().total(), 0);
}

/// The audit trail: entries come back newest first and paged, from another handle too; a
/// re-drive, a purge and a prune each write one with their actor, filter, counts and outcome;
/// an empty purge is refused and writes nothing.
async fn audit_trail_records_redrives_purges_and_prunes(b: Backend) {
    let Some(o) = b.open("audit", 10).await else {
        return;
    };
    assert!(o.store.audit(0..10).await.unwrap().is_empty());
    for i in 0..5u64 {
        let filter = Filter::new().class(format!("c{i}")).code("http 503");
        let entry = AuditEntry::new(AuditAction::Redrive, format!("op-{i}"), &filter)
            .at(at(i))
            .planned(i)
            .sent(i)
            .outcome(format!("resolved {i}"));
        o.store.append_audit(entry).await.unwrap();
    }
    let page = o.other.audit(1..3).await.unwrap();
    let actors: Vec<&str> = page.iter().map(|e| e.actor.as_str()).collect();
    assert_eq!(actors, ["op-3", "op-2"], "newest first, paged");
    assert_eq!(page[0].filter, "class=c3 code=\"http 503\"");
    assert_eq!(
        (page[0].planned, page[0].sent, page[0].at),
        (Some(3), 3, at(3))
    );
    assert_eq!(page[0].outcome, "resolved 3");
    assert!(
        o.store.audit(5..10).await.unwrap().is_empty(),
        "past the end"
    );

    // A re-drive by a named operator.
    o.store
        .put_many(vec![
            rec("m-1", "transient", "x", at(10)),
            rec("m-2", "transient", "x", at(11)),
            rec("p-1", "poison", "y", at(12)),
        ])
        .await
        .unwrap();
    let provider = Provider::default();
    Redrive::new(Filter::new().class("transient"), 1_000, 10)
        .unwrap()
        .actor("alice")
        .run(&*o.store, provider.service(), |r| http_request(r, None))
        .await
        .unwrap();
    assert_eq!(provider.sent(), ["m-1", "m-2"]);
    let last = o.store.audit(0..1).await.unwrap().remove(0);
    assert_eq!(
        (last.action, last.actor.as_str(), last.filter.as_str()),
        (AuditAction::Redrive, "alice", "class=transient")
    );
    assert_eq!((last.planned, last.sent), (Some(2), 2));
    assert_eq!(last.outcome, "resolved 2, failed 0, skipped 0");

    // A purge, and a refused one.
    assert!(purge(&*o.store, &Filter::new(), "bob").await.is_err());
    assert_eq!(
        o.store.audit(0..100).await.unwrap().len(),
        6,
        "nothing written"
    );
    assert_eq!(
        purge(&*o.store, &Filter::new().class("poison"), "bob")
            .await
            .unwrap(),
        1
    );
    let last = o.store.audit(0..1).await.unwrap().remove(0);
    assert_eq!(
        (last.action, last.actor.as_str(), last.sent),
        (AuditAction::Purge, "bob", 1)
    );
    assert_eq!(last.outcome, "deleted 1");

    // A prune that removes something is recorded; one that removes nothing is not.
    let retention = Retention::new().no_max_age().max_records(1);
    let pruned = retention
        .prune_as(&*o.store, at(1_000), "scheduler")
        .await
        .unwrap();
    assert_eq!(pruned.by_count, 1);
    let last = o.store.audit(0..1).await.unwrap().remove(0);
    assert_eq!(
        (last.action, last.actor.as_str(), last.sent),
        (AuditAction::Prune, "scheduler", 1)
    );
    assert_eq!(
        last.outcome,
        "removed 0 older than none and 1 beyond 1 records"
    );
    retention
        .prune_as(&*o.store, at(1_000), "scheduler")
        .await
        .unwrap();
    assert_eq!(o.store.audit(0..100).await.unwrap().len(), 8);
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
        mod postgres {
            $(#[tokio::test] async fn $case() { super::$case(super::Backend::Postgres).await })*
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
    claims_are_compare_and_set,
    two_redrives_race_one_sends,
    redrive_races_scheduler,
    two_schedulers_send_each_record_once,
    a_late_sender_past_its_lease_changes_nothing,
    a_dead_schedulers_claims_are_taken_over_within_the_lease,
    a_shutdown_gives_its_claims_back,
    a_fleet_rate_is_shared_by_every_scheduler_on_the_store,
    awkward_ids_and_a_big_payload,
    pages_are_exact_across_ties,
    root_cause_and_breaker_are_kept,
    a_held_record_gives_its_claim_back,
    counts_follow_each_status_change,
    an_open_ended_page_reads_to_the_end,
    retention_prunes_by_age_then_count,
    audit_trail_records_redrives_purges_and_prunes,
    a_claim_is_fenced_by_its_token,
    a_failure_under_its_claim_ends_it,
    next_due_is_the_earliest_waiting_time,
    send_slots_are_shared,
);
