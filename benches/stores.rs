//! The four dead-letter stores side by side, in one run: records appended per second (one `put`
//! a record, and `put_many` of 1,000), claim-and-ack per second (`claim_due` of one due record,
//! then `change_if_unchanged` to resolved: what a scheduler does per re-send), and over a store
//! of 100,000 dead records, a page of 50 of one class and the counts of all time. Then, group
//! `stores_backlog_<records>`, SQLite, Redis and Postgres over a backlog of waiting records
//! (`BACKSTOP_BENCH_BACKLOG`, 100,000 unless set): claim-and-ack by 1 and 4 claimers, each
//! record acknowledged on its own or the claimed batch at once, and `next_due`.
//!
//! Redis needs a server at `BACKSTOP_REDIS_URL` (default `redis://127.0.0.1:6379`) and the
//! `redis` feature; Postgres one at `BACKSTOP_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and the `postgres` feature. Without them their
//! entries are skipped with a note. Postgres records go to a schema of their own, dropped
//! afterwards; Redis keys under a prefix of their own, deleted afterwards.
//!
//! ```text
//! cargo bench --features redis,postgres --bench stores -- --warm-up-time 1 --measurement-time 3
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{
    Change, Claim, Filter, MemoryStore, Record, SqliteStore, Status, Store,
};
use tower_backstop::{Class, Code, Envelope, Failure};

const BATCH: usize = 1_000;
const SCALE: usize = 100_000;
const CLASSES: [&str; 5] = ["transient", "throttled", "unknown", "permanent", "poison"];

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A new dead record with a 200-byte JSON payload, two tags and a one-entry history, as the
/// dead-letter layer writes it.
fn record() -> Record {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let failure: Failure = Failure::new(
        Class::TRANSIENT,
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
    );
    let payload = format!(
        "{{\"id\":\"msg-{n:010}\",\"to\":\"someone{n}@example.com\",\"subject\":\"Your order has \
         shipped\",\"body\":\"Hi, good news: your order left our warehouse today. Tracking: \
         1Z{n:012}\"}}"
    );
    let mut r = record_of(
        format!("msg-{n:010}"),
        Envelope::new(payload)
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages")
            .with_tag("campaign", format!("camp-{}", n % 7))
            .with_tag("provider", "ses"),
        &failure,
    );
    r.class = CLASSES[(n % 5) as usize].to_owned();
    r
}

/// A record due for a re-send since a second ago.
fn due() -> Record {
    let mut r = record();
    r.status = Status::Deferred;
    r.retry_at = Some(SystemTime::now() - Duration::from_secs(1));
    r
}

fn appends(c: &mut Criterion, rt: &Runtime, name: &str, store: &dyn Store) {
    let mut group = c.benchmark_group("stores_append");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("{name}/put"), |b| {
        b.iter_custom(|iters| {
            let records: Vec<Record> = (0..iters).map(|_| record()).collect();
            rt.block_on(async {
                let start = Instant::now();
                for r in records {
                    store.put(r).await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(format!("{name}/put_many_{BATCH}"), |b| {
        b.iter_custom(|iters| {
            let batches: Vec<Vec<Record>> = (0..iters)
                .map(|_| (0..BATCH).map(|_| record()).collect())
                .collect();
            rt.block_on(async {
                let start = Instant::now();
                for batch in batches {
                    store.put_many(batch).await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

fn claims(c: &mut Criterion, rt: &Runtime, name: &str, store: &dyn Store) {
    let mut group = c.benchmark_group("stores_claim_and_ack");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                // The due records are written outside the timed part.
                let batch: Vec<Record> = (0..iters).map(|_| due()).collect();
                for chunk in batch.chunks(BATCH) {
                    store.put_many(chunk.to_vec()).await.unwrap();
                }
                let start = Instant::now();
                for _ in 0..iters {
                    let now = SystemTime::now();
                    let claimed = store
                        .claim_due(now, 1, Duration::from_secs(60))
                        .await
                        .unwrap();
                    let seen = claimed.first().expect("a due record");
                    let acked = store
                        .change_if_unchanged(seen, Change::Resolved { at: now })
                        .await
                        .unwrap();
                    assert!(matches!(acked, Claim::Claimed(_)));
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

fn pages(c: &mut Criterion, rt: &Runtime, name: &str, store: &dyn Store) {
    let before = rt.block_on(store.count(&Filter::new())).unwrap() as usize;
    let seeded = Instant::now();
    rt.block_on(async {
        for _ in 0..SCALE.saturating_sub(before).div_ceil(BATCH) {
            store
                .put_many((0..BATCH).map(|_| record()).collect())
                .await
                .unwrap();
        }
    });
    eprintln!(
        "{name}: seeded to 100,000 records in {:.1} s",
        seeded.elapsed().as_secs_f64()
    );
    let mut group = c.benchmark_group("stores_100k");
    group.sample_size(20);
    for (label, page) in [("page_50", 0..50), ("page_50_at_10000", 10_000..10_050)] {
        group.bench_function(format!("{name}/class_{label}"), |b| {
            b.iter(|| {
                let got = rt
                    .block_on(store.search(&Filter::new().class("throttled"), page.clone()))
                    .unwrap();
                assert_eq!(got.len(), 50);
            })
        });
    }
    group.bench_function(format!("{name}/counts"), |b| {
        b.iter(|| {
            let counts = rt.block_on(store.counts(std::time::UNIX_EPOCH)).unwrap();
            assert!(counts.total >= SCALE as u64);
        })
    });
    group.finish();
}

/// Each measure on a fresh store of its own (`open` makes one for a part name), so that the
/// appends do not grow the store the claims and pages read.
fn all<S: Store>(c: &mut Criterion, rt: &Runtime, name: &str, open: impl Fn(&str) -> S) {
    appends(c, rt, name, &open("append"));
    claims(c, rt, name, &open("claim"));
    pages(c, rt, name, &open("pages"));
}

fn stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    all(c, &rt, "memory", |_| MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    all(c, &rt, "sqlite", |part| {
        SqliteStore::open(dir.path().join(format!("{part}.db"))).unwrap()
    });
    redis(c, &rt);
    postgres(c, &rt);
    let path = dir.path().join("backlog.db");
    // The file, its write-ahead log (checkpointed into it at times) and shared memory.
    let on_disk = || {
        ["", "-wal", "-shm"]
            .iter()
            .filter_map(|end| {
                let mut file = path.clone().into_os_string();
                file.push(end);
                std::fs::metadata(file).ok().map(|m| m.len())
            })
            .sum()
    };
    backlog(
        c,
        &rt,
        "sqlite",
        || Arc::new(SqliteStore::open(&path).unwrap()),
        on_disk,
    );
}

/// Records claimed at a time by each claimer of the backlog.
const CLAIM_BATCH: usize = 100;
/// The lease of the backlog's claims: the scheduler's default.
const LEASE: Duration = Duration::from_secs(10);

/// Record `n` of a backlog, as the dead-letter layer writes a deferred failure: one of 5
/// classes, 20 codes and 50 hosts (its breaker), a 500-byte payload, due at `retry_at`.
fn waiting(n: u64, retry_at: SystemTime) -> Record {
    let host = format!("host-{:02}.test", n % 50);
    let failure: Failure = Failure::new(
        Class::TRANSIENT,
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
    );
    let mut payload = format!("{{\"id\":\"bl-{n:010}\",\"body\":\"");
    payload.extend(std::iter::repeat_n('x', 500 - payload.len() - 2));
    payload.push_str("\"}");
    let mut r = record_of(
        format!("bl-{n:010}"),
        Envelope::new(payload)
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", format!("http://{host}/v1/messages"))
            .with_tag("campaign", format!("camp-{}", n % 7)),
        &failure,
    );
    r.class = CLASSES[(n % 5) as usize].to_owned();
    r.code = format!("http {}", 500 + n % 20);
    r.breaker = Some(host);
    r.status = Status::Deferred;
    r.retry_at = Some(retry_at);
    r
}

/// Writes `count` records of the backlog, numbered from `from`: every tenth due `due_by`
/// (spread over the minute before it), the others over the next day.
async fn seed(store: &dyn Store, from: u64, count: u64, due_by: SystemTime) {
    let mut n = from;
    while n < from + count {
        let batch = (n..(n + BATCH as u64).min(from + count))
            .map(|n| {
                let at = if n % 10 == 0 {
                    due_by - Duration::from_millis(n % 60_000)
                } else {
                    due_by + Duration::from_secs(60 + n % 86_400)
                };
                waiting(n, at)
            })
            .collect();
        store.put_many(batch).await.unwrap();
        n += BATCH as u64;
    }
}

/// Claims batches and acknowledges them, as the scheduler does, until `left` is spent: each
/// record with its own `change_claimed`, or, `batched`, the claimed batch with one
/// `change_claimed_many` (what the scheduler does on a store that applies batches).
async fn claim_and_ack(store: Arc<dyn Store>, left: Arc<AtomicUsize>, batched: bool) {
    loop {
        let take = left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                (l > 0).then(|| l - l.min(CLAIM_BATCH))
            })
            .map_or(0, |l| l.min(CLAIM_BATCH));
        if take == 0 {
            return;
        }
        let now = SystemTime::now();
        let claimed = store.claim_due(now, take, LEASE).await.unwrap();
        assert_eq!(claimed.len(), take, "the backlog ran dry");
        let leases = claimed
            .iter()
            .map(|r| r.lease().expect("a claimed record is in flight"));
        let acks = if batched {
            let changes = leases.map(|l| (l, Change::Resolved { at: now })).collect();
            store.change_claimed_many(changes).await.unwrap()
        } else {
            let mut acks = Vec::with_capacity(take);
            for lease in leases {
                let change = Change::Resolved { at: now };
                acks.push(store.change_claimed(&lease, change).await.unwrap());
            }
            acks
        };
        for acked in acks {
            assert!(matches!(acked, Claim::Claimed(_)), "{acked:?}");
        }
    }
}

/// A store over a backlog (`BACKSTOP_BENCH_BACKLOG` records, 100,000 unless set): claim-and-ack
/// by 1 and 4 claimers (each a store of its own from `open`, as 4 processes), acknowledged per
/// record and in batches, and `next_due`.
///
/// `footprint` reads what the store holds, in bytes (on disk, or in RAM for Redis): read before
/// and after seeding, its growth per record is printed.
fn backlog(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    open: impl Fn() -> Arc<dyn Store>,
    footprint: impl Fn() -> u64,
) {
    let records: u64 = std::env::var("BACKSTOP_BENCH_BACKLOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SCALE as u64);
    let store = open();
    let before = footprint();
    let seeded = Instant::now();
    rt.block_on(seed(&*store, 0, records, SystemTime::now()));
    let held = footprint().saturating_sub(before);
    eprintln!(
        "{name}: seeded the backlog of {records} records in {:.1} s; it holds {} bytes, {} a \
         record",
        seeded.elapsed().as_secs_f64(),
        held,
        held / records.max(1)
    );
    let next = AtomicU64::new(records);
    let mut group = c.benchmark_group(format!("stores_backlog_{records}"));
    group.sample_size(10);
    for (claimers, batched) in [(1, false), (4, false), (1, true), (4, true)] {
        let stores: Vec<Arc<dyn Store>> = (0..claimers).map(|_| open()).collect();
        group.throughput(Throughput::Elements(CLAIM_BATCH as u64));
        let ack = if batched { "_batched" } else { "" };
        group.bench_function(format!("{name}/claim_and_ack{ack}_{claimers}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    // As many new due records as this sample claims, written outside the
                    // timed part, so that the due part of the backlog stays as it was (the
                    // store grows by the records resolved).
                    let count = iters * CLAIM_BATCH as u64;
                    seed_due(&*store, next.fetch_add(count, Ordering::Relaxed), count).await;
                    let left = Arc::new(AtomicUsize::new(count as usize));
                    let start = Instant::now();
                    let tasks: Vec<_> = stores
                        .iter()
                        .map(|s| {
                            let (s, left) = (Arc::clone(s), Arc::clone(&left));
                            tokio::spawn(claim_and_ack(s, left, batched))
                        })
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("{name}/next_due"), |b| {
        b.iter(|| {
            let next = rt.block_on(store.next_due()).unwrap();
            assert!(next.is_some());
        })
    });
    group.finish();
}

/// Writes `count` records due now, numbered from `from`.
async fn seed_due(store: &dyn Store, from: u64, count: u64) {
    let now = SystemTime::now();
    for start in (from..from + count).step_by(BATCH) {
        let batch = (start..(start + BATCH as u64).min(from + count))
            .map(|n| waiting(n, now - Duration::from_secs(1)))
            .collect();
        store.put_many(batch).await.unwrap();
    }
}

#[cfg(feature = "redis")]
fn redis(c: &mut Criterion, rt: &Runtime) {
    use tower_backstop::store::RedisStore;
    let url =
        std::env::var("BACKSTOP_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let store = match rt.block_on(RedisStore::connect(&url)) {
        Ok(store) => store,
        Err(e) => return eprintln!("redis entries skipped: no redis at {url}: {e}"),
    };
    let prefix = |part: &str| format!("backstop-bench-stores:{}:{part}", std::process::id());
    all(c, rt, "redis", |part| {
        store.clone().with_prefix(prefix(part))
    });
    // The server's memory in use (`INFO memory`, `used_memory`): what the backlog's keys add
    // on an otherwise quiet server.
    let used_memory = || -> u64 {
        let client = redis::Client::open(url.as_str()).unwrap();
        let info: String = rt.block_on(async {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await
                .unwrap()
        });
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    backlog(
        c,
        rt,
        "redis",
        || {
            let store = rt.block_on(RedisStore::connect(&url)).unwrap();
            Arc::new(store.with_prefix(prefix("backlog")))
        },
        used_memory,
    );
    // Leave no bench keys behind.
    for part in ["append", "claim", "pages", "backlog"] {
        let store = store.clone().with_prefix(prefix(part));
        for status in [Status::Dead, Status::Resolved, Status::Deferred] {
            let _ = rt.block_on(store.delete(&Filter::new().status(status)));
        }
    }
}

#[cfg(not(feature = "redis"))]
fn redis(_: &mut Criterion, _: &Runtime) {
    eprintln!("redis entries skipped: built without the `redis` feature");
}

#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion, rt: &Runtime) {
    use std::future::IntoFuture;
    use tower_backstop::store::PostgresStore;
    let url = std::env::var("BACKSTOP_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let schema = |part: &str| format!("backstop_bench_{}_{part}", std::process::id());
    if let Err(e) = rt.block_on(
        PostgresStore::connect(&url)
            .schema(schema("probe"))
            .into_future(),
    ) {
        return eprintln!("postgres entries skipped: {e}");
    }
    let open = |part: &str| {
        rt.block_on(
            PostgresStore::connect(&url)
                .schema(schema(part))
                .into_future(),
        )
        .unwrap()
    };
    all(c, rt, "postgres", open);
    // The records' table with its indexes and TOAST (`pg_total_relation_size`).
    let on_disk = || -> u64 {
        let store = open("backlog");
        let sql = format!(
            "SELECT pg_total_relation_size('\"{}\".records')",
            schema("backlog")
        );
        let size: i64 = rt
            .block_on(sqlx::query_scalar(&sql).fetch_one(store.pool()))
            .unwrap();
        u64::try_from(size).unwrap_or(0)
    };
    backlog(c, rt, "postgres", || Arc::new(open("backlog")), on_disk);
    // Leave no bench schema behind.
    let store = open("probe");
    for part in ["probe", "append", "claim", "pages", "backlog"] {
        let drop = format!("DROP SCHEMA \"{}\" CASCADE", schema(part));
        if let Err(e) = rt.block_on(sqlx::query(&drop).execute(store.pool())) {
            eprintln!("could not drop the bench schema {}: {e}", schema(part));
        }
    }
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion, _: &Runtime) {
    eprintln!("postgres entries skipped: built without the `postgres` feature");
}

criterion_group!(benches, stores);
criterion_main!(benches);
