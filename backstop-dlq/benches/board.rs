//! The dead-letter board's pages over a store of 100,000 records, SQLite and Redis: the
//! overview and the list (its first page, a page deep in it, a filter), each a real HTTP request
//! from reqwest to the board served by axum on 127.0.0.1.
//!
//! Redis is the server at `BACKSTOP_REDIS_URL` (default `redis://127.0.0.1:6379`); without one
//! the Redis entries are left out. Seeding takes a few seconds per store.
//!
//! ```text
//! cargo bench -p backstop-dlq --bench board -- --warm-up-time 1 --measurement-time 3
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backstop_dlq::Board;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{Filter, SqliteStore, Status, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

const RECORDS: usize = 100_000;

/// 100,000 records, one every 20 s back from now (23 days): five classes, seven codes, 50
/// tenants; one in ten deferred, one in ten resolved, the rest dead.
async fn seed(store: &dyn Store) {
    let now = SystemTime::now();
    let classes = [
        "transient",
        "throttled",
        "poison",
        "permanent",
        "outcome_unknown",
    ];
    let mut batch = Vec::new();
    for i in 0..RECORDS {
        let f: Failure = Failure::new(
            Class::new(classes[i % 5]),
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
        );
        let mut r = record_of(
            format!("m-{i:06}"),
            Envelope::new(format!("{{\"id\":{i}}}"))
                .with_metadata("method", "POST")
                .with_metadata("uri", "http://mail.test/v1/messages")
                .with_tag("tenant", format!("t{}", i % 50)),
            &f,
        );
        r.last_failed_at = now - Duration::from_secs(i as u64 * 20);
        r.first_failed_at = r.last_failed_at;
        r.code = format!("http {}", 500 + i % 7);
        r.message = format!("upstream {} failed for message {i}", r.code);
        match i % 10 {
            0 => {
                r.status = Status::Deferred;
                r.retry_at = Some(now + Duration::from_secs(600));
            }
            1 => r.status = Status::Resolved,
            _ => {}
        }
        batch.push(r);
        if batch.len() == 1_000 {
            store.put_many(std::mem::take(&mut batch)).await.unwrap();
        }
    }
    if !batch.is_empty() {
        store.put_many(batch).await.unwrap();
    }
}

async fn serve(store: Arc<dyn Store>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Board::new(store).router();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn pages(c: &mut Criterion, rt: &Runtime, name: &str, addr: SocketAddr) {
    let client = reqwest::Client::new();
    let mut group = c.benchmark_group(format!("board_100k/{name}"));
    for (entry, path) in [
        ("overview", "/"),
        ("overview_7d", "/?window=7d"),
        ("list", "/records"),
        ("list_page_100", "/records?page=100"),
        ("list_dead_class", "/records?status=dead&class=poison"),
        ("list_tag", "/records?tag=tenant%3Dt7"),
    ] {
        let url = format!("http://{addr}{path}");
        // Each page must answer 200 before it is timed.
        let status = rt.block_on(client.get(&url).send()).unwrap().status();
        assert_eq!(status, 200, "{url}");
        group.bench_function(entry, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let page = client.get(&url).send().await.unwrap();
                    assert!(page.status().is_success());
                    page.bytes().await.unwrap()
                })
            })
        });
    }
    group.finish();
}

fn board(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("dl.db")).unwrap());
    rt.block_on(seed(&*sqlite));
    let addr = rt.block_on(serve(sqlite));
    pages(c, &rt, "sqlite", addr);

    let url =
        std::env::var("BACKSTOP_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = rt.block_on(async {
        let store = tower_backstop::store::RedisStore::connect(&url)
            .await
            .ok()?;
        Some(store.with_prefix(format!("bench-board-{}", std::process::id())))
    });
    match redis {
        Some(store) => {
            rt.block_on(seed(&store));
            let store: Arc<dyn Store> = Arc::new(store);
            let addr = rt.block_on(serve(Arc::clone(&store)));
            pages(c, &rt, "redis", addr);
            rt.block_on(store.delete(&Filter::new().since(SystemTime::UNIX_EPOCH)))
                .unwrap();
        }
        None => eprintln!("no Redis at {url}: the Redis entries are left out"),
    }
}

criterion_group!(benches, board);
criterion_main!(benches);
