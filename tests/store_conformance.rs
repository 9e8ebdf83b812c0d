//! The cases of the conformance suite that need the middleware (re-drives and schedulers racing
//! over one store, the audit of a re-drive), against every store: memory, SQLite, Redis (one
//! server), Redis Cluster and Postgres, one test per case and store (`redis::…`). The cases
//! that need only the `Store` trait are `tower_backstop_store::testing`'s, run against the same
//! stores by `tower-backstop-store/tests/conformance.rs`.
//!
//! Redis, the Redis Cluster and Postgres are real servers at `BACKSTOP_REDIS_URL`,
//! `BACKSTOP_REDIS_CLUSTER_URLS` and `BACKSTOP_POSTGRES_URL`: when one is missing its tests are
//! reported as ignored, with the reason, or fail when it is required (`BACKSTOP_REQUIRE_REDIS=1`,
//! `BACKSTOP_REQUIRE_REDIS_CLUSTER=1`, `BACKSTOP_REQUIRE_POSTGRES=1`).

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backstop_test_support::{Service, Tests};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower_backstop::dead_letter::record_of;
use tower_backstop::resend::{Outcome, Redrive, Scheduler, http_request};
use tower_backstop::store::{
    AuditAction, AuditEntry, BoxFuture, Change, Claim, Counts, Filter, FleetNote, Lease, Record,
    Retention, Status, Store, StoreError, purge,
};
use tower_backstop::{BoxError, Class, Code, Envelope, Failure, MessageId};
use tower_backstop_store::testing::{Backend, MemoryBackend, Opened, SqliteBackend};

/// Opens a store for `test` through `backend`, or panics with the backend's error.
async fn open(backend: &dyn Backend, test: &str, history_limit: usize) -> Opened {
    match backend.open(test, history_limit).await {
        Ok(opened) => opened,
        Err(e) => panic!("{test}: the backend could not open a store: {e}"),
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

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.put_note(note)
    }

    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.release_held(breaker, now)
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.inner.notes(now)
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

async fn two_redrives_race_one_sends(b: &dyn Backend) {
    let o = open(b, "redrive_race", 10).await;
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

async fn redrive_races_scheduler(b: &dyn Backend) {
    let o = open(b, "redrive_vs_scheduler", 10).await;
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

async fn two_schedulers_send_each_record_once(b: &dyn Backend) {
    let o = open(b, "two_schedulers", 10).await;
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
    let all = o.store.search(&Filter::new(), 0..100).await.unwrap();
    assert!(
        all.iter()
            .all(|r| r.status == Status::Resolved && r.resends == 1),
        "{:?}",
        all.iter()
            .map(|r| (&r.id, r.status, r.resends))
            .collect::<Vec<_>>()
    );
}

/// The audit trail: entries come back newest first and paged, from another handle too; a
/// re-drive, a purge and a prune each write one with their actor, filter, counts and outcome;
/// an empty purge is refused and writes nothing.
async fn audit_trail_records_redrives_purges_and_prunes(b: &dyn Backend) {
    let o = open(b, "audit", 10).await;
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

/// A re-drive whose filter matches nothing sends nothing and says so.
async fn a_redrive_that_matches_nothing_sends_nothing(b: &dyn Backend) {
    let o = open(b, "redrive_nothing", 10).await;
    o.store
        .put_many(vec![
            rec("m-1", "transient", "http 503", at(0)),
            deferred(rec("m-2", "throttled", "http 429", at(1)), at(10)),
        ])
        .await
        .unwrap();
    let provider = Provider::default();
    let report = Redrive::new(Filter::new().class("no-such-class"), 10, 10)
        .unwrap()
        .run(&*o.store, provider.service(), |r| http_request(r, None))
        .await
        .unwrap();
    assert!(report.records.is_empty());
    assert!(provider.sent().is_empty());
}

/// What a case runs, against stores opened by a backend.
type CaseFn = for<'a> fn(&'a dyn Backend) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

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
async fn a_late_sender_past_its_lease_changes_nothing(b: &dyn Backend) {
    let o = open(b, "late_sender", 10).await;
    let lease = Duration::from_millis(600);
    o.store
        .put(due_keyed("m-1", SystemTime::now()))
        .await
        .unwrap();
    // A's store: every operation waits while the test holds it frozen (a process that
    // stalls, a store it cannot reach), with its renewals stuck on the way.
    let frozen = backstop_test_support::FaultyStore::new(Arc::clone(&o.store));
    let a_store: Arc<dyn Store> = Arc::new(frozen.clone());
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
    frozen.set(backstop_test_support::Fault::Hang);

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
    frozen.set(backstop_test_support::Fault::Answer);
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
async fn a_dead_schedulers_claims_are_taken_over_within_the_lease(b: &dyn Backend) {
    // `o` keeps the backend's files (a temporary directory) for the whole case.
    let o = open(b, "takeover", 10).await;
    let (store, other) = (Arc::clone(&o.store), Arc::clone(&o.other));
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
async fn a_shutdown_gives_its_claims_back(b: &dyn Backend) {
    let o = open(b, "shutdown_gives_back", 10).await;
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
    let all = o.store.search(&Filter::new(), 0..10).await.unwrap();
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
async fn a_fleet_rate_is_shared_by_every_scheduler_on_the_store(b: &dyn Backend) {
    let o = open(b, "fleet_rate", 10).await;
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
    // Slots are 50 ms apart on the store's schedule, one schedule for the three schedulers
    // (each alone would send 20 a second: 60 together, the 30 in half a second). A send goes
    // at its slot or later, never earlier: the span of the 30 is at least 29 slots.
    let span = at[29] - at[0];
    assert!(span >= Duration::from_millis(29 * 50 - 60), "{span:?}");
    // A send that a busy machine runs up to 100 ms late can meet, within a second, the sends of
    // the slots up to 100 ms after it and 100 ms before its own: at most 20 + 4. (Seen: 22 on a
    // loaded machine, with every slot kept.)
    for (i, first) in at.iter().enumerate() {
        let in_a_second = at[i..]
            .iter()
            .take_while(|t| **t - *first < Duration::from_secs(1))
            .count();
        assert!(
            in_a_second <= 24,
            "{in_a_second} sends within a second of send {i}"
        );
    }
}

/// One case: its name and its function.
type Case = (&'static str, CaseFn);

macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        [$((stringify!($case), (|b| Box::pin($case(b))) as CaseFn)),*]
    };
}

const CASES: [Case; 9] = cases!(
    two_redrives_race_one_sends,
    redrive_races_scheduler,
    two_schedulers_send_each_record_once,
    a_late_sender_past_its_lease_changes_nothing,
    a_dead_schedulers_claims_are_taken_over_within_the_lease,
    a_shutdown_gives_its_claims_back,
    a_fleet_rate_is_shared_by_every_scheduler_on_the_store,
    audit_trail_records_redrives_purges_and_prunes,
    a_redrive_that_matches_nothing_sends_nothing,
);

/// Adds one test per case, named `{store}::{case}`, running against the backend `make` gives.
fn add<B: Backend + 'static>(
    tests: &mut Tests,
    store: &str,
    service: Option<Service>,
    make: impl Fn() -> B + Clone + Send + 'static,
) {
    for (case, run) in CASES {
        let name = format!("{store}::{case}");
        let make = make.clone();
        let test = move || async move { run(&make()).await };
        match service {
            Some(service) => tests.needs(service).current(&name, test),
            None => {
                tests.current(&name, test);
            }
        }
    }
}

/// One ignored test per case for a store this build left out, saying which feature.
#[allow(dead_code)] // unused with --all-features
fn unbuilt(tests: &mut Tests, store: &str, feature: &str) {
    for (case, _) in CASES {
        tests.unbuilt(
            &format!("{store}::{case}"),
            &format!("built without the `{feature}` feature (use --all-features)"),
        );
    }
}

fn main() {
    let mut tests = Tests::new();
    add(&mut tests, "memory", None, || MemoryBackend);
    add(&mut tests, "sqlite", None, || SqliteBackend);
    #[cfg(feature = "redis")]
    {
        use tower_backstop_store::testing::RedisBackend;
        add(&mut tests, "redis", Some(Service::Redis), || {
            RedisBackend::new(backstop_test_support::redis_url())
        });
        add(
            &mut tests,
            "redis_cluster",
            Some(Service::RedisCluster),
            || RedisBackend::cluster(backstop_test_support::redis_cluster_urls()),
        );
    }
    #[cfg(not(feature = "redis"))]
    {
        unbuilt(&mut tests, "redis", "redis");
        unbuilt(&mut tests, "redis_cluster", "redis");
    }
    #[cfg(feature = "postgres")]
    add(&mut tests, "postgres", Some(Service::Postgres), || {
        tower_backstop_store::testing::PostgresBackend::new(backstop_test_support::postgres_url())
    });
    #[cfg(not(feature = "postgres"))]
    unbuilt(&mut tests, "postgres", "postgres");
    tests.run();
}
