//! What write-ahead costs per call on each store: a successful call through the dead-letter
//! layer with write-ahead off (`write_ahead/<store>/off`: the store is not touched) and on
//! (`write_ahead/<store>/on`: the record written and read back before the call, resolved after
//! it), side by side in one group per store. The inner service answers 202 at once, so the
//! difference is the store's round trips and the record's encoding. Each request is an HTTP POST
//! of a 200-byte JSON body with an `Idempotency-Key` of its own (a new record per call), built
//! before the timed loop.
//!
//! Redis needs a server at `BACKSTOP_REDIS_URL` (default `redis://127.0.0.1:6379`) and the
//! `redis` feature; Postgres one at `BACKSTOP_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and the `postgres` feature. Without them their
//! entries are skipped with a note. Postgres records go to a schema of their own, dropped
//! afterwards; Redis keys under a prefix of their own, deleted afterwards.
//!
//! ```text
//! cargo bench --features redis,postgres --bench write_ahead -- --warm-up-time 1 --measurement-time 3
//! ```

use std::future::poll_fn;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Full;
use tokio::runtime::Runtime;
use tower::{Layer, Service};
use tower_backstop::BoxError;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::store::{Filter, MemoryStore, SqliteStore, Status, Store};

type Request = http::Request<Full<Bytes>>;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A new keyed POST with a 200-byte JSON body.
fn request() -> Request {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let body = format!(
        "{{\"id\":\"msg-{n:010}\",\"to\":\"someone{n}@example.com\",\"subject\":\"Your order has \
         shipped\",\"body\":\"Hi, good news: your order left our warehouse today. Tracking: \
         1Z{n:012}\"}}"
    );
    http::Request::post("http://mail.test/v1/messages")
        .header("content-type", "application/json")
        .header(
            "idempotency-key",
            format!("wa-bench-{}-{n}", std::process::id()),
        )
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// The provider: accepts every message at once.
fn accepted(_: Request) -> std::future::Ready<Result<http::Response<()>, BoxError>> {
    let response = http::Response::builder().status(202).body(()).unwrap();
    std::future::ready(Ok(response))
}

/// One group per store: the same call with write-ahead off and on.
fn compare(c: &mut Criterion, rt: &Runtime, name: &str, store: Arc<dyn Store>) {
    let mut group = c.benchmark_group(format!("write_ahead/{name}"));
    for (entry, on) in [("off", false), ("on", true)] {
        let mut layer = DeadLetterLayer::from_arc(Arc::clone(&store));
        if on {
            layer = layer.write_ahead();
        }
        let mut svc = layer.layer(tower::service_fn(accepted));
        group.bench_function(entry, |b| {
            b.iter_custom(|iters| {
                let requests: Vec<Request> = (0..iters).map(|_| request()).collect();
                rt.block_on(async {
                    let start = Instant::now();
                    for req in requests {
                        poll_fn(|cx| svc.poll_ready(cx)).await.expect("ready");
                        let response = svc.call(black_box(req)).await.expect("delivered");
                        black_box(response);
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
}

fn write_ahead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    compare(c, &rt, "memory", Arc::new(MemoryStore::new()));
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("write_ahead.db")).unwrap();
    compare(c, &rt, "sqlite", Arc::new(sqlite));
    redis(c, &rt);
    postgres(c, &rt);
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
    let store = store.with_prefix(format!("backstop-bench-write-ahead:{}", std::process::id()));
    compare(c, rt, "redis", Arc::new(store.clone()));
    // Leave no bench keys behind.
    for status in [Status::Resolved, Status::InFlight, Status::Dead] {
        let _ = rt.block_on(store.delete(&Filter::new().status(status)));
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
    let schema = format!("backstop_bench_write_ahead_{}", std::process::id());
    let store = match rt.block_on(
        PostgresStore::connect(&url)
            .schema(schema.clone())
            .into_future(),
    ) {
        Ok(store) => store,
        Err(e) => return eprintln!("postgres entries skipped: {e}"),
    };
    compare(c, rt, "postgres", Arc::new(store.clone()));
    // Leave no bench schema behind.
    let drop = format!("DROP SCHEMA \"{schema}\" CASCADE");
    if let Err(e) = rt.block_on(sqlx::query(&drop).execute(store.pool())) {
        eprintln!("could not drop the bench schema {schema}: {e}");
    }
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion, _: &Runtime) {
    eprintln!("postgres entries skipped: built without the `postgres` feature");
}

criterion_group!(benches, write_ahead);
criterion_main!(benches);
