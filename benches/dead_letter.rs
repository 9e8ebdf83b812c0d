//! Records written per second to each dead-letter store: SQLite one record per transaction
//! (`put`) and batched (`put_many`, one transaction per 1,000 records), Redis one script call per
//! record and pipelined batches, and the in-memory store for scale. Throughput is in records
//! (criterion's `elem/s`). Each record is a new id with a 200-byte JSON payload, two tags and a
//! one-entry history, as the dead-letter layer writes it.
//!
//! The target: at least 20,000 records/s to SQLite batched.
//!
//! `dead_letter_redis_100k`: reads from a Redis store of 100,000 records, a page of a class
//! search and the counts by class, each under 50 ms (they read index sets, not records). Redis needs a server at
//! `BACKSTOP_REDIS_URL` (default `redis://127.0.0.1:6379`) and the `redis` feature; without them
//! its entries are skipped with a note.
//!
//! ```text
//! cargo bench --features redis --bench dead_letter -- --warm-up-time 1 --measurement-time 3
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{MemoryStore, Record, SqliteStore, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

const BATCH: usize = 1_000;

static NEXT: AtomicU64 = AtomicU64::new(0);

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
    record_of(
        format!("msg-{n:010}"),
        Envelope::new(payload)
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages")
            .with_tag("campaign", format!("camp-{}", n % 7))
            .with_tag("provider", "ses"),
        &failure,
    )
}

fn batch() -> Vec<Record> {
    (0..BATCH).map(|_| record()).collect()
}

/// Times `iters` calls of `write`, building the records outside the timed part.
fn timed<T>(rt: &Runtime, iters: u64, make: impl Fn() -> T, write: impl AsyncFn(T)) -> Duration {
    let inputs: Vec<T> = (0..iters).map(|_| make()).collect();
    rt.block_on(async {
        let start = Instant::now();
        for input in inputs {
            write(input).await;
        }
        start.elapsed()
    })
}

fn bench_store(c: &mut Criterion, rt: &Runtime, name: &str, store: &dyn Store) {
    let mut group = c.benchmark_group("dead_letter_write");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("{name}/single"), |b| {
        b.iter_custom(|iters| timed(rt, iters, record, async |r| store.put(r).await.unwrap()))
    });
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(format!("{name}/batched_{BATCH}"), |b| {
        b.iter_custom(|iters| {
            timed(rt, iters, batch, async |rs| {
                store.put_many(rs).await.unwrap()
            })
        })
    });
    group.finish();
}

fn dead_letter_write(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let memory = MemoryStore::new();
    bench_store(c, &rt, "memory", &memory);

    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("bench.db")).unwrap();
    bench_store(c, &rt, "sqlite", &sqlite);

    #[cfg(feature = "redis")]
    {
        let url = std::env::var("BACKSTOP_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        match rt.block_on(tower_backstop::store::RedisStore::connect(&url)) {
            Ok(store) => {
                let store = store.with_prefix(format!("backstop-bench:{}", std::process::id()));
                bench_store(c, &rt, "redis", &store);
                // Leave no bench keys behind.
                let all = tower_backstop::store::Filter::new()
                    .status(tower_backstop::store::Status::Dead);
                let _ = rt.block_on(store.delete(&all));
            }
            Err(e) => eprintln!("redis entries skipped: no redis at {url}: {e}"),
        }
    }
    #[cfg(not(feature = "redis"))]
    eprintln!("redis entries skipped: built without the `redis` feature");
}

/// The classes of the 100,000-record Redis store, one record in five each.
#[cfg(feature = "redis")]
const SCALE_CLASSES: [&str; 5] = ["transient", "throttled", "unknown", "permanent", "poison"];

/// Reads from a Redis store of 100,000 records (five classes, 20,000 each): a page of 50 of one
/// class (the first page and one 10,000 records deep), the counts by class and code over all
/// time, and the counts by class alone. The target: each under 50 ms.
fn dead_letter_redis_scale(c: &mut Criterion) {
    #[cfg(feature = "redis")]
    {
        use tower_backstop::store::{Filter, RedisStore};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let url = std::env::var("BACKSTOP_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let store = match rt.block_on(RedisStore::connect(&url)) {
            Ok(store) => store.with_prefix(format!("backstop-bench-scale:{}", std::process::id())),
            Err(e) => {
                eprintln!("redis scale entries skipped: no redis at {url}: {e}");
                return;
            }
        };
        rt.block_on(async {
            for chunk in 0..100 {
                let records: Vec<Record> = (0..BATCH)
                    .map(|i| {
                        let mut r = record();
                        r.class = SCALE_CLASSES[(chunk * BATCH + i) % 5].to_owned();
                        r
                    })
                    .collect();
                store.put_many(records).await.unwrap();
            }
        });
        let mut group = c.benchmark_group("dead_letter_redis_100k");
        group.sample_size(20);
        for (name, page) in [
            ("search_class_page_50", 0..50),
            ("search_class_page_50_at_10000", 10_000..10_000 + 50),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let got = rt
                        .block_on(store.search(&Filter::new().class("throttled"), page.clone()))
                        .unwrap();
                    assert_eq!(got.len(), 50);
                })
            });
        }
        group.bench_function("counts", |b| {
            b.iter(|| {
                let counts = rt.block_on(store.counts(std::time::UNIX_EPOCH)).unwrap();
                assert_eq!(counts.total, 100_000);
            })
        });
        group.bench_function("count_by_class", |b| {
            b.iter(|| {
                let counts = rt.block_on(store.count_by_class()).unwrap();
                assert_eq!(counts.len(), 5);
            })
        });
        group.finish();
        for class in SCALE_CLASSES {
            let _ = rt.block_on(store.delete(&Filter::new().class(class)));
        }
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = c;
        eprintln!("redis scale entries skipped: built without the `redis` feature");
    }
}

criterion_group!(benches, dead_letter_write, dead_letter_redis_scale);
criterion_main!(benches);
