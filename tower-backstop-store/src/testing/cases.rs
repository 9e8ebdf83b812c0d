//! The cases of the conformance suite: each opens fresh stores through a [`Backend`] and
//! asserts what every [`Store`] must do.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Backend, Opened, open};
use crate::{
    AuditAction, AuditEntry, Change, Claim, ErrorEntry, Filter, FleetNote, Record, Retention,
    Status, Store, list_page, purge,
};

mod paging;

pub(super) use self::paging::{
    a_stale_cursor_gives_the_next_page, bad_cursors_are_refused, pages_by_cursor_are_the_list,
};

const BASE: u64 = 1_780_000_000_000; // ms since the epoch, in 2026

fn at(ms_after_base: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(BASE + ms_after_base)
}

/// A dead record `id` of `class`/`code`, last failed at `t`, one attempt: a JSON payload of a
/// `POST`, its failure as its root cause.
fn rec(id: &str, class: &str, code: &str, t: SystemTime) -> Record {
    let message = format!("{id} failed at {}", humantime::format_rfc3339_millis(t));
    let mut r = Record::new(id, ErrorEntry::new(t, class, code, message, 1));
    r.payload = format!("payload of {id}").into_bytes();
    r.payload_len = r.payload.len() as u64;
    r.content_type = Some("application/json".to_owned());
    r.metadata.insert("method".into(), "POST".into());
    r.metadata
        .insert("uri".into(), "http://mail.test/v1/messages".into());
    r.cause = Some(r.history[0].clone());
    r
}

fn deferred(mut r: Record, retry_at: SystemTime) -> Record {
    r.status = Status::Deferred;
    r.retry_at = Some(retry_at);
    r
}

/// The record a write under a claim wrote, or a panic naming what it returned instead.
fn claim_held(claim: Claim) -> Record {
    match claim {
        Claim::Claimed(record) => *record,
        other => panic!("the claim did not hold: {other:?}"),
    }
}

/// Every record in `store`, whatever its status (`list` shows the outstanding ones only).
async fn every(store: &dyn Store) -> Vec<Record> {
    store.search(&Filter::new(), 0..usize::MAX).await.unwrap()
}

fn ids(records: &[Record]) -> Vec<&str> {
    records.iter().map(|r| r.id.as_str()).collect()
}

pub(super) async fn round_trip(b: &dyn Backend) {
    let o = open(b, "round_trip", 10).await;
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
pub(super) async fn root_cause_and_breaker_are_kept(b: &dyn Backend) {
    let o = open(b, "cause", 10).await;
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
/// every index: `list(usize::MAX)` is every outstanding record.
pub(super) async fn an_open_ended_page_reads_to_the_end(b: &dyn Backend) {
    let o = open(b, "open_ended", 10).await;
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
pub(super) async fn counts_follow_each_status_change(b: &dyn Backend) {
    let o = open(b, "count_status", 10).await;
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
pub(super) async fn a_held_record_gives_its_claim_back(b: &dyn Backend) {
    let o = open(b, "held", 10).await;
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
    let held = claim_held(
        o.store
            .change_if_unchanged(
                &claimed[0],
                Change::Held {
                    retry_at: at(30_000),
                },
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        (held.status, held.resends, held.retry_at),
        (Status::Deferred, 0, Some(at(30_000)))
    );
    assert_eq!(o.store.get("m-1").await.unwrap().as_ref(), Some(&held));
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

pub(super) async fn upsert_merges_by_id(b: &dyn Backend) {
    let o = open(b, "upsert", 10).await;
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

pub(super) async fn history_keeps_last_k(b: &dyn Backend) {
    let o = open(b, "history", 3).await;
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

pub(super) async fn search_filters_and_pages(b: &dyn Backend) {
    let o = open(b, "search", 10).await;
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

pub(super) async fn counts_over_a_window(b: &dyn Backend) {
    let o = open(b, "counts", 10).await;
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

pub(super) async fn put_many_is_one_batch(b: &dyn Backend) {
    let o = open(b, "put_many", 10).await;
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

pub(super) async fn updates(b: &dyn Backend) {
    let o = open(b, "updates", 10).await;
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

pub(super) async fn claims_due_in_retry_order(b: &dyn Backend) {
    let o = open(b, "claim", 10).await;
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

pub(super) async fn concurrent_claims_never_overlap(b: &dyn Backend) {
    let o = open(b, "claim_race", 10).await;
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

pub(super) async fn delete_by_filter(b: &dyn Backend) {
    let o = open(b, "delete", 10).await;
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
    assert_eq!(every(&*o.store).await.len(), 6);
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
    assert!(every(&*o.store).await.is_empty());
}

pub(super) async fn claims_are_compare_and_set(b: &dyn Backend) {
    let o = open(b, "cas_claim", 10).await;
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
    assert!(every(&*o.store).await.is_empty());
}

pub(super) async fn pages_are_exact_across_ties(b: &dyn Backend) {
    let o = open(b, "ties", 10).await;
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

pub(super) async fn awkward_ids_and_a_big_payload(b: &dyn Backend) {
    let o = open(b, "awkward", 10).await;
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
}

/// Retention: by age (dead and resolved only), then by count (the oldest resolved first, then
/// the oldest dead), never a deferred record, due or not; the dry run counts the same.
pub(super) async fn retention_prunes_by_age_then_count(b: &dyn Backend) {
    let o = open(b, "retention", 10).await;
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
    let mut left: Vec<String> = every(&*o.other).await.into_iter().map(|r| r.id).collect();
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

/// The audit trail: entries come back newest first and paged, from another handle too; a purge
/// and a prune each write one with their actor, filter, counts and outcome; an empty purge is
/// refused and writes nothing, and a prune that removes nothing writes nothing.
pub(super) async fn audit_trail_records_purges_and_prunes(b: &dyn Backend) {
    let o = open(b, "audit_store", 10).await;
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

    o.store
        .put_many(vec![
            rec("m-1", "transient", "x", at(10)),
            rec("m-2", "transient", "x", at(11)),
            rec("p-1", "poison", "y", at(12)),
        ])
        .await
        .unwrap();
    // A purge, and a refused one.
    assert!(purge(&*o.store, &Filter::new(), "bob").await.is_err());
    assert_eq!(
        o.store.audit(0..100).await.unwrap().len(),
        5,
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
    assert_eq!(last.filter, "class=poison");
    assert_eq!(last.outcome, "deleted 1");

    // A prune that removes something is recorded; one that removes nothing is not.
    let retention = Retention::new().no_max_age().max_records(1);
    let pruned = retention
        .prune_as(&*o.store, at(1_000), "scheduler")
        .await
        .unwrap();
    assert_eq!(pruned.by_count, 1);
    let last = o.other.audit(0..1).await.unwrap().remove(0);
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
    assert_eq!(o.store.audit(0..100).await.unwrap().len(), 7);
    assert_eq!(ids(&every(&*o.store).await), ["m-2"]);
}

/// A claim is a lease with a fencing token: the holder renews it; once it ended and another
/// claimer took the record, every write through the old lease changes nothing, from either
/// handle; the new holder's writes go through.
/// A batch of changes under claims: each applies while its claim holds, one whose claim passed
/// to another claimer changes nothing (its record is not resolved, so not lost), and the rest of
/// the batch still applies.
pub(super) async fn a_batch_of_claimed_changes_skips_a_lost_claim(b: &dyn Backend) {
    let o = open(b, "claimed_many", 10).await;
    // m-2 comes due first and is claimed alone, for a second.
    let records: Vec<Record> = (0..5)
        .map(|i| {
            let due = if i == 2 { at(500) } else { at(1_000) };
            deferred(rec(&format!("m-{i}"), "throttled", "http 429", at(0)), due)
        })
        .collect();
    o.store.put_many(records).await.unwrap();
    let lease = Duration::from_secs(5);
    let early = o
        .store
        .claim_due(at(500), 1, Duration::from_secs(1))
        .await
        .unwrap();
    let claimed = o.store.claim_due(at(1_000), 10, lease).await.unwrap();
    let mut leases: Vec<_> = early
        .iter()
        .chain(&claimed)
        .filter_map(Record::lease)
        .collect();
    leases.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(ids(&early), ["m-2"]);
    assert_eq!(leases.len(), 5);
    // m-2's claim ends, and another claimer takes it with a new token.
    let again = o.other.claim_due(at(1_500), 10, lease).await.unwrap();
    assert_eq!(ids(&again), ["m-2"]);
    assert_eq!(again[0].resends, 2);
    // The first claimer's batch: m-0, m-1, m-3 resolved, m-4 renewed, and m-2 through the lost
    // claim.
    let changes = leases
        .iter()
        .map(|l| {
            let change = if l.id == "m-4" {
                Change::Renewed { until: at(9_000) }
            } else {
                Change::Resolved { at: at(1_500) }
            };
            (l.clone(), change)
        })
        .collect();
    let claims = o.store.change_claimed_many(changes).await.unwrap();
    assert_eq!(claims.len(), 5);
    for (i, claim) in claims.into_iter().enumerate() {
        match (i, claim) {
            (2, Claim::ClaimedElsewhere { status, resends }) => {
                assert_eq!((status, resends), (Status::InFlight, 2));
            }
            (4, Claim::Claimed(r)) => {
                assert_eq!((r.status, r.retry_at), (Status::InFlight, Some(at(9_000))));
            }
            (_, Claim::Claimed(r)) => assert_eq!(r.status, Status::Resolved),
            (i, other) => panic!("change {i}: {other:?}"),
        }
    }
    // m-2 stays with the claimer that took it: in flight under its new token, not resolved.
    let m2 = o.store.get("m-2").await.unwrap().unwrap();
    assert_eq!((m2.status, m2.resends), (Status::InFlight, 2));
    let resolved = o
        .store
        .count(&Filter::new().status(Status::Resolved))
        .await
        .unwrap();
    assert_eq!(resolved, 3);
    // An empty batch is nothing to do.
    assert!(
        o.store
            .change_claimed_many(Vec::new())
            .await
            .unwrap()
            .is_empty()
    );
}

/// A batch that names one claim twice applies its changes in the batch's order (a renewal,
/// then the claim given back), and a change to a record deleted meanwhile is
/// [`Claim::Missing`], the rest of the batch applying.
pub(super) async fn a_batch_applies_each_records_changes_in_order(b: &dyn Backend) {
    let o = open(b, "claimed_in_order", 10).await;
    let records: Vec<Record> = (0..3)
        .map(|i| {
            deferred(
                rec(&format!("n-{i}"), "throttled", "http 429", at(0)),
                at(100),
            )
        })
        .collect();
    o.store.put_many(records).await.unwrap();
    let claimed = o
        .store
        .claim_due(at(100), 10, Duration::from_secs(5))
        .await
        .unwrap();
    let lease = |id: &str| {
        claimed
            .iter()
            .find(|r| r.id == id)
            .and_then(Record::lease)
            .unwrap_or_else(|| panic!("{id} claimed"))
    };
    let (n0, n1, n2) = (lease("n-0"), lease("n-1"), lease("n-2"));
    assert_eq!(n0.token, 1);
    o.store.delete(&Filter::new().id("n-2")).await.unwrap();
    let changes = vec![
        (n0.clone(), Change::Renewed { until: at(9_000) }),
        (n1.clone(), Change::Resolved { at: at(200) }),
        (
            n0.clone(),
            Change::Held {
                retry_at: at(5_000),
            },
        ),
        (n2, Change::Resolved { at: at(200) }),
        // The claim was given back just before: it no longer holds.
        (n0, Change::Resolved { at: at(200) }),
    ];
    let claims = o.store.change_claimed_many(changes).await.unwrap();
    assert_eq!(claims.len(), 5);
    let mut claims = claims.into_iter();
    match claims.next().unwrap() {
        Claim::Claimed(r) => {
            assert_eq!((r.status, r.retry_at), (Status::InFlight, Some(at(9_000))));
        }
        other => panic!("the renewal: {other:?}"),
    }
    match claims.next().unwrap() {
        Claim::Claimed(r) => assert_eq!((r.id.as_str(), r.status), ("n-1", Status::Resolved)),
        other => panic!("n-1's resolution: {other:?}"),
    }
    match claims.next().unwrap() {
        Claim::Claimed(r) => {
            assert_eq!(
                (r.status, r.retry_at, r.resends),
                (Status::Deferred, Some(at(5_000)), 0)
            );
        }
        other => panic!("the claim given back after its renewal: {other:?}"),
    }
    assert!(matches!(claims.next().unwrap(), Claim::Missing));
    match claims.next().unwrap() {
        Claim::ClaimedElsewhere { status, resends } => {
            assert_eq!((status, resends), (Status::Deferred, 0));
        }
        other => panic!("a change after the claim was given back: {other:?}"),
    }
    let n0 = o.store.get("n-0").await.unwrap().unwrap();
    assert_eq!(
        (n0.status, n0.retry_at),
        (Status::Deferred, Some(at(5_000)))
    );
}

pub(super) async fn a_claim_is_fenced_by_its_token(b: &dyn Backend) {
    let o = open(b, "fenced", 10).await;
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
    let renewed = claim_held(
        o.other
            .change_claimed(&a, Change::Renewed { until: at(9_000) })
            .await
            .unwrap(),
    );
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
    let done = claim_held(
        o.other
            .change_claimed(&b2, Change::Resolved { at: at(10_000) })
            .await
            .unwrap(),
    );
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

/// A record written in flight by `put` (what a write-ahead writes before a call's first attempt:
/// no attempt, no history, its retry-at the end of the claim) is a claim like one
/// [`claim_due`](Store::claim_due) made: its [`Record::lease`] holds for `change_claimed` and
/// `put_claimed`, it is not due before its end, it counts as waiting, not dead; after its end,
/// another claimer takes it and the old lease changes nothing. Over a record of the same id
/// already there, the token is that record's resend count.
pub(super) async fn an_in_flight_record_put_is_a_claim(b: &dyn Backend) {
    let o = open(b, "in_flight_put", 10).await;
    let ahead = |id: &str, until: SystemTime| {
        let mut r = Record::new(
            id,
            ErrorEntry::new(at(0), "queued", "write-ahead", "ahead", 0),
        );
        r.history.clear();
        r.payload = b"{}".to_vec();
        r.payload_len = 2;
        r.status = Status::InFlight;
        r.retry_at = Some(until);
        r
    };
    o.store.put(ahead("w-1", at(5_000))).await.unwrap();
    let read = o.other.get("w-1").await.unwrap().unwrap();
    assert_eq!((read.attempts, read.history.len()), (0, 0));
    let lease = read.lease().expect("in flight with a retry-at: a claim");
    assert_eq!((lease.token, lease.until), (0, at(5_000)));
    let counts = o.store.counts(at(0)).await.unwrap();
    assert_eq!((counts.total, counts.deferred), (0, 1), "waiting, not dead");
    assert!(
        o.store
            .claim_due(at(4_999), 10, Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty()
    );
    let renewed = claim_held(
        o.other
            .change_claimed(&lease, Change::Renewed { until: at(8_000) })
            .await
            .unwrap(),
    );
    assert_eq!(renewed.retry_at, Some(at(8_000)));
    assert!(
        o.store
            .claim_due(at(7_999), 10, Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty()
    );
    // The call failed: its failure is merged under the claim, which it ends.
    let failed = claim_held(
        o.store
            .put_claimed(&lease, rec("w-1", "transient", "http 503", at(6_000)))
            .await
            .unwrap(),
    );
    assert_eq!(
        (
            failed.status,
            failed.attempts,
            failed.history.len(),
            failed.retry_at
        ),
        (Status::Dead, 1, 1, None)
    );
    assert_eq!(
        (failed.class.as_str(), failed.payload.as_slice()),
        ("transient", &b"payload of w-1"[..])
    );

    // A call that died: taken after its end, with a new token; its old lease is stale.
    o.store.put(ahead("w-2", at(5_000))).await.unwrap();
    let stale = o.store.get("w-2").await.unwrap().unwrap().lease().unwrap();
    let taken = o
        .other
        .claim_due(at(5_000), 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ids(&taken), ["w-2"]);
    assert_eq!(taken[0].resends, 1);
    assert_eq!(
        o.store
            .change_claimed(&stale, Change::Resolved { at: at(5_001) })
            .await
            .unwrap(),
        Claim::ClaimedElsewhere {
            status: Status::InFlight,
            resends: 1
        }
    );

    // Over a record re-sent three times before: the claim's token is its resend count.
    let mut old = rec("w-3", "transient", "http 503", at(0));
    old.resends = 3;
    o.store.put(old).await.unwrap();
    o.store.put(ahead("w-3", at(5_000))).await.unwrap();
    let over = o.other.get("w-3").await.unwrap().unwrap();
    assert_eq!(
        (over.status, over.attempts, over.history.len()),
        (Status::InFlight, 1, 1)
    );
    let lease = over.lease().unwrap();
    assert_eq!(lease.token, 3);
    let done = claim_held(
        o.store
            .change_claimed(&lease, Change::Resolved { at: at(1_000) })
            .await
            .unwrap(),
    );
    assert_eq!((done.status, done.resends), (Status::Resolved, 3));
}

/// A re-send that fails again under its claim merges its failure as `put` would, and that write
/// ends the claim; a claim given back after a send keeps its resend, one given back unsent
/// returns it; a failure of another record is refused.
pub(super) async fn a_failure_under_its_claim_ends_it(b: &dyn Backend) {
    let o = open(b, "put_claimed", 10).await;
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
    let written = claim_held(o.other.put_claimed(&a, again).await.unwrap());
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
    assert_eq!(o.store.get("m-1").await.unwrap().as_ref(), Some(&written));
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
    let released = claim_held(
        o.store
            .change_claimed(
                &c,
                Change::Released {
                    retry_at: at(21_000),
                },
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        (released.status, released.resends, released.retry_at),
        (Status::Deferred, 2, Some(at(21_000)))
    );
    // Given back unsent: the resend given back too.
    let d = o.other.claim_due(at(21_000), 10, lease).await.unwrap()[0]
        .lease()
        .unwrap();
    assert_eq!(d.token, 3);
    let held = claim_held(
        o.other
            .change_claimed(
                &d,
                Change::Held {
                    retry_at: at(22_000),
                },
            )
            .await
            .unwrap(),
    );
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
pub(super) async fn next_due_is_the_earliest_waiting_time(b: &dyn Backend) {
    let o = open(b, "next_due", 10).await;
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
pub(super) async fn send_slots_are_shared(b: &dyn Backend) {
    let o = open(b, "slots", 10).await;
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

/// `list` returns the outstanding records only, never a resolved one, in the order of every
/// list: the dead ones the most recently failed first, then the deferred and in-flight ones
/// together, the soonest due first, ties by id; `search_waiting` reads the waiting part in that
/// order, and `list_page` pages the same list (resolved ones last when asked for).
pub(super) async fn list_is_the_outstanding_records_in_list_order(b: &dyn Backend) {
    let o = open(b, "list_order", 10).await;
    let want = seed_list_order(&o).await;
    for store in [&o.store, &o.other] {
        assert_eq!(ids(&store.list(100).await.unwrap()), want, "list(100)");
        assert_eq!(ids(&store.list(usize::MAX).await.unwrap()), want);
        assert_eq!(ids(&store.list(3).await.unwrap()), want[..3], "list(3)");
        assert_eq!(ids(&store.list(6).await.unwrap()), want[..6], "list(6)");
        assert!(store.list(0).await.unwrap().is_empty());
    }
    assert!(
        o.store
            .list(100)
            .await
            .unwrap()
            .iter()
            .all(|r| r.status != Status::Resolved),
        "list never returns a resolved record"
    );
    waiting_part_in_due_order(&o, &want).await;
    paged_list_is_the_same_list(&o, &want).await;
}

/// Writes the records of the list-order case: four dead, four waiting, two resolved since;
/// returns the outstanding ones' ids in list order.
async fn seed_list_order(o: &Opened) -> [&'static str; 8] {
    let mut batch = vec![
        rec("d-old", "transient", "http 503", at(1_000)),
        rec("d-new", "throttled", "http 429", at(9_000)),
        // Two dead letters that failed at one instant: by id.
        rec("d-tie-b", "transient", "http 503", at(5_000)),
        rec("d-tie-a", "transient", "http 503", at(5_000)),
        // Waiting: due order, whatever their failure times; two due at one instant, by id.
        deferred(
            rec("w-late", "throttled", "http 429", at(9_500)),
            at(600_000),
        ),
        deferred(
            rec("w-tie-b", "throttled", "http 429", at(100)),
            at(300_000),
        ),
        deferred(
            rec("w-tie-a", "transient", "http 503", at(8_000)),
            at(300_000),
        ),
        // The newest failures of all, delivered since: never listed.
        rec("r-0", "throttled", "http 429", at(9_900)),
        rec("r-1", "transient", "http 503", at(9_800)),
    ];
    let mut soon = deferred(
        rec("w-soon", "transient", "http 503", at(9_700)),
        at(60_000),
    );
    soon.status = Status::InFlight;
    batch.push(soon);
    o.store.put_many(batch).await.unwrap();
    for id in ["r-0", "r-1"] {
        o.store
            .update(id, Change::Resolved { at: at(10_000) })
            .await
            .unwrap();
    }
    [
        "d-new", "d-tie-a", "d-tie-b", "d-old", "w-soon", "w-tie-a", "w-tie-b", "w-late",
    ]
}

/// `search_waiting` over the list-order records: the waiting part, a page at a time, by status,
/// by class; none of another status.
async fn waiting_part_in_due_order(o: &Opened, want: &[&str; 8]) {
    let waiting = |filter: Filter, page: Range<usize>| {
        let store = Arc::clone(&o.store);
        async move {
            let records = store.search_waiting(&filter, page).await.unwrap();
            records.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(waiting(Filter::new(), 0..100).await, want[4..]);
    assert_eq!(waiting(Filter::new(), 1..3).await, want[5..7]);
    assert_eq!(waiting(Filter::new(), 3..usize::MAX).await, ["w-late"]);
    assert!(waiting(Filter::new(), 4..10).await.is_empty());
    assert_eq!(
        waiting(Filter::new().status(Status::Deferred), 0..100).await,
        ["w-tie-a", "w-tie-b", "w-late"]
    );
    assert_eq!(
        waiting(Filter::new().status(Status::InFlight), 0..100).await,
        ["w-soon"]
    );
    assert_eq!(
        waiting(Filter::new().class("throttled"), 0..100).await,
        ["w-tie-b", "w-late"]
    );
    assert_eq!(
        waiting(Filter::new().class("throttled"), 1..2).await,
        ["w-late"]
    );
    for other in [Status::Dead, Status::Resolved] {
        assert!(
            waiting(Filter::new().status(other), 0..100)
                .await
                .is_empty()
        );
    }
}

/// `list_page` over the list-order records: the same list, a page at a time; the counts say
/// what it holds.
async fn paged_list_is_the_same_list(o: &Opened, want: &[&str; 8]) {
    let page = |filter: Filter, with_resolved: bool, range: Range<usize>| {
        let store = Arc::clone(&o.store);
        async move {
            list_page(&*store, &filter, with_resolved, range)
                .await
                .unwrap()
        }
    };
    let all = page(Filter::new(), false, 0..100).await;
    assert_eq!(ids(&all.records), want);
    assert_eq!(all.total, 8);
    assert_eq!(
        all.by_status,
        [
            (Status::Dead, 4),
            (Status::Deferred, 3),
            (Status::InFlight, 1)
        ]
    );
    for (from, to) in [(0, 3), (3, 6), (2, 5), (6, 8), (7, 100)] {
        let part = page(Filter::new(), false, from..to).await;
        assert_eq!(ids(&part.records), want[from..to.min(8)], "{from}..{to}");
    }
    assert!(page(Filter::new(), false, 8..20).await.records.is_empty());
    let with = page(Filter::new(), true, 0..100).await;
    assert_eq!(with.total, 10);
    assert_eq!(ids(&with.records[..8]), want);
    assert_eq!(
        ids(&with.records[8..]),
        ["r-0", "r-1"],
        "resolved ones last"
    );
    assert_eq!(
        ids(&page(Filter::new(), true, 7..9).await.records),
        ["w-late", "r-0"]
    );
    let throttled = page(Filter::new().class("throttled"), false, 0..100).await;
    assert_eq!(ids(&throttled.records), ["d-new", "w-tie-b", "w-late"]);
    let resolved = page(Filter::new().status(Status::Resolved), false, 0..100).await;
    assert_eq!(ids(&resolved.records), ["r-0", "r-1"]);
    assert_eq!(resolved.by_status, [(Status::Resolved, 2)]);
}

/// A fleet's notes: one per topic and author (a newer one replaces it), read by every handle
/// on the store, gone from the reads once expired; a big body and awkward names round-trip.
pub(super) async fn fleet_notes_are_one_per_topic_and_author_until_they_expire(b: &dyn Backend) {
    let o = open(b, "notes", 10).await;
    let ttl = Duration::from_secs(5);
    let sorted = |mut notes: Vec<FleetNote>| {
        notes.sort_by(|a, b| (&a.topic, &a.author).cmp(&(&b.topic, &b.author)));
        notes
    };
    let a = FleetNote::new(
        "breaker:mail.test:443",
        "p-1",
        "{\"state\":\"open\"}",
        at(0),
        ttl,
    );
    let b2 = FleetNote::new(
        "breaker:mail.test:443",
        "p-2",
        "{\"state\":\"closed\"}",
        at(0),
        ttl,
    );
    let c = FleetNote::new("breaker:sms.test:443", "p-1", "{}", at(0), ttl);
    for note in [&a, &b2, &c] {
        o.store.put_note(note.clone()).await.unwrap();
    }
    let read = sorted(o.other.notes(at(1_000)).await.unwrap());
    assert_eq!(
        read,
        vec![a.clone(), b2.clone(), c.clone()],
        "every note, from the other handle"
    );
    // A newer note of the same author on the same topic replaces the older one.
    let a2 = FleetNote::new(
        "breaker:mail.test:443",
        "p-1",
        "{\"state\":\"closed\"}",
        at(2_000),
        ttl,
    );
    o.other.put_note(a2.clone()).await.unwrap();
    let read = sorted(o.store.notes(at(2_500)).await.unwrap());
    assert_eq!(read, vec![a2.clone(), b2.clone(), c.clone()]);
    // Expired notes are not read: `b2` and `c` end at 5 s, `a2` at 7 s.
    assert_eq!(o.store.notes(at(5_000)).await.unwrap(), vec![a2.clone()]);
    assert_eq!(
        o.store.notes(at(7_000)).await.unwrap(),
        Vec::<FleetNote>::new()
    );
    // A big body, an author and a topic with characters a key or a query could trip on.
    let body = format!("{{\"cause\":\"{}\"}}", "é\\\"'%_*:{}".repeat(2_000));
    let odd = FleetNote::new("override:a b:c*{x}", "operator'; --", body, at(8_000), ttl);
    o.store.put_note(odd.clone()).await.unwrap();
    assert_eq!(o.other.notes(at(8_001)).await.unwrap(), vec![odd]);
}

/// A breaker closed: its deferred records due later are made due now, in one step where the
/// store has one; records of another breaker, already due, dead, resolved or in flight are
/// left as they are. A store without the step says so (`None`) and changes nothing.
pub(super) async fn release_held_makes_a_breakers_deferred_records_due(b: &dyn Backend) {
    let o = open(b, "release", 10).await;
    let now = at(60_000);
    let with = |id: &str, breaker: &str, status: Status, retry_at: SystemTime| {
        let mut r = deferred(rec(id, "circuit_open", "circuit open", at(0)), retry_at);
        r.status = status;
        r.breaker = Some(breaker.to_owned());
        r
    };
    let records = vec![
        with("held-1", "mail.test:443", Status::Deferred, at(90_000)),
        with("held-2", "mail.test:443", Status::Deferred, at(600_000)),
        with("due", "mail.test:443", Status::Deferred, at(30_000)),
        with("other", "sms.test:443", Status::Deferred, at(90_000)),
        with("dead", "mail.test:443", Status::Dead, at(90_000)),
        with("flying", "mail.test:443", Status::InFlight, at(90_000)),
    ];
    o.store.put_many(records.clone()).await.unwrap();
    let released = o.other.release_held("mail.test:443", now).await.unwrap();
    let Some(released) = released else {
        for r in records {
            assert_eq!(
                o.store.get(&r.id).await.unwrap().unwrap().retry_at,
                r.retry_at
            );
        }
        return;
    };
    assert_eq!(released, 2);
    for (id, retry_at) in [
        ("held-1", now),
        ("held-2", now),
        ("due", at(30_000)),
        ("other", at(90_000)),
        ("dead", at(90_000)),
        ("flying", at(90_000)),
    ] {
        let r = o.store.get(id).await.unwrap().unwrap();
        assert_eq!(r.retry_at, Some(retry_at), "{id}");
    }
    // Claimed in due order with the rest, and released again: nothing left to release.
    assert_eq!(
        o.store.release_held("mail.test:443", now).await.unwrap(),
        Some(0)
    );
    let due: Vec<String> = o
        .store
        .claim_due(now, 10, std::time::Duration::from_secs(10))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(due, ["due", "held-1", "held-2"]);
}

/// Asserts that every count the store gives agrees with a recount of its records: the counts
/// of all time (`counts(UNIX_EPOCH)`, `count_by_class`), those of a window that starts at the
/// oldest record and of one that starts after it, `count` by status, class and code and their
/// pairs, and that [`check_counts`](Store::check_counts) finds no drift. `step` names the write
/// just made.
async fn counts_agree_with_a_recount(store: &dyn Store, step: &str) {
    let records = every(store).await;
    let oldest = records.iter().map(|r| r.last_failed_at).min();
    let mut windows = vec![SystemTime::UNIX_EPOCH];
    windows.extend(oldest);
    windows.extend(oldest.map(|t| t + Duration::from_millis(1)));
    for since in windows {
        let want = crate::Counts::tally(since, &records, std::iter::empty());
        let got = store.counts(since).await.unwrap();
        let got_without_new_codes = crate::Counts {
            new_codes: Vec::new(),
            ..got
        };
        assert_eq!(
            got_without_new_codes, want,
            "{step}: counts since {since:?}"
        );
    }
    let all_time = crate::Counts::tally(SystemTime::UNIX_EPOCH, &records, std::iter::empty());
    assert_eq!(
        store.count_by_class().await.unwrap(),
        all_time.by_class,
        "{step}: count_by_class"
    );
    let mut filters = vec![Filter::new()];
    for r in &records {
        let (class, code) = (r.class.as_str(), r.code.as_str());
        filters.push(Filter::new().class(class));
        filters.push(Filter::new().code(code));
        filters.push(Filter::new().class(class).code(code));
        for status in [
            Status::Dead,
            Status::Deferred,
            Status::InFlight,
            Status::Resolved,
        ] {
            filters.push(Filter::new().status(status));
            filters.push(Filter::new().status(status).class(class));
            filters.push(Filter::new().status(status).code(code));
            filters.push(Filter::new().status(status).class(class).code(code));
        }
    }
    filters.push(Filter::new().class("no such class"));
    filters.dedup();
    for filter in filters {
        let want = records.iter().filter(|r| filter.matches(r)).count() as u64;
        let got = store.count(&filter).await.unwrap();
        assert_eq!(got, want, "{step}: count of {filter:?}");
    }
    let check = store.check_counts(false).await.unwrap();
    assert!(check.is_clean(), "{step}: the counters drifted: {check:?}");
}

/// The counts, of all time and of a window, agree with a recount of the records after each
/// kind of write: puts and batches (merging into records of another class, code or status),
/// updates, claims and their acknowledgements one by one and in a batch, a failure under a
/// claim, a compare-and-set change, deletes, a purge and retention.
pub(super) async fn counts_agree_with_the_records_after_every_write(b: &dyn Backend) {
    let o = open(b, "counts_recount", 10).await;
    let s = &*o.store;
    s.put_many(Vec::new()).await.unwrap();
    counts_agree_with_a_recount(s, "empty").await;
    s.put(rec("a", "transient", "http 503", at(0)))
        .await
        .unwrap();
    s.put(deferred(
        rec("b", "circuit_open", "circuit open", at(1)),
        at(10),
    ))
    .await
    .unwrap();
    counts_agree_with_a_recount(s, "put").await;
    let mut batch = vec![
        // Merged into `a`: another class and code, and deferred now.
        deferred(rec("a", "throttled", "http 429", at(2)), at(10)),
        rec("c", "poison", "http 400", at(3)),
        deferred(rec("d", "circuit_open", "circuit open", at(4)), at(10)),
        deferred(rec("e", "transient", "http 503", at(5)), at(10)),
    ];
    // A repeated id within the batch.
    batch.push(rec("c", "poison", "http 422", at(6)));
    s.put_many(batch).await.unwrap();
    counts_agree_with_a_recount(s, "put_many").await;
    s.update("c", Change::Held { retry_at: at(10) })
        .await
        .unwrap();
    s.update("c", Change::Dead).await.unwrap();
    counts_agree_with_a_recount(s, "update").await;
    let claimed = s
        .claim_due(at(20), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4, "a, b, d and e are due");
    counts_agree_with_a_recount(s, "claim_due").await;
    let lease = |id: &str| {
        claimed
            .iter()
            .find(|r| r.id == id)
            .and_then(Record::lease)
            .unwrap()
    };
    let resolved = Change::Resolved { at: at(21) };
    claim_held(s.change_claimed(&lease("a"), resolved).await.unwrap());
    counts_agree_with_a_recount(s, "change_claimed").await;
    let many = s
        .change_claimed_many(vec![(lease("b"), resolved), (lease("d"), Change::Dead)])
        .await
        .unwrap();
    assert!(many.iter().all(|c| matches!(c, Claim::Claimed(_))));
    counts_agree_with_a_recount(s, "change_claimed_many").await;
    let again = deferred(rec("e", "transient", "http 502", at(22)), at(40));
    claim_held(s.put_claimed(&lease("e"), again).await.unwrap());
    counts_agree_with_a_recount(s, "put_claimed").await;
    let seen = s.get("c").await.unwrap().unwrap();
    let redriven = s.claim(&seen, at(60)).await.unwrap();
    assert!(matches!(redriven, Claim::Claimed(_)));
    counts_agree_with_a_recount(s, "claim").await;
    o.other
        .put(rec("f", "transient", "http 503", at(23)))
        .await
        .unwrap();
    assert_eq!(s.delete(&Filter::new().id("f")).await.unwrap(), 1);
    counts_agree_with_a_recount(s, "delete").await;
    let pruned = Retention::new()
        .no_max_age()
        .max_records(3)
        .prune(s, at(100))
        .await
        .unwrap();
    assert!(pruned.total() > 0, "retention removed something");
    counts_agree_with_a_recount(s, "retention").await;
    s.delete(&Filter::new()).await.unwrap();
    counts_agree_with_a_recount(s, "everything deleted").await;
}
