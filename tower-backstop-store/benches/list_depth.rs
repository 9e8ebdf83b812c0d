//! What a page of the list costs by how deep it is: by position (`list_page`, `Store::search`:
//! `LIMIT/OFFSET`) and after a cursor (`list_after`, `Store::search_after`: keyset), 50 records
//! at 0, 10,000 and 100,000 records deep (and 1,000,000 when the store holds that many), over
//! 110,000 dead letters and 20,000 deferred ones (each with a request of 1 KiB), in
//! SQLite and in the Postgres at `BACKSTOP_POSTGRES_URL` (left out without it).
//! `BACKSTOP_BENCH_DEAD` sets how many dead letters (the deferred ones are 2 for every 11 of
//! them): `BACKSTOP_BENCH_DEAD=1100000` is the curve's million.
//!
//! A timed loop, not criterion: each figure is the median of 7 reads, in milliseconds. SQLite is
//! measured first without its list index (`dead_letters_listed`, as files of earlier versions
//! were), by position only, then with it.
//!
//! ```text
//! BACKSTOP_POSTGRES_URL=postgres://postgres@127.0.0.1:55432/postgres \
//!     cargo bench -p tower-backstop-store --all-features --bench list_depth
//! ```

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use tower_backstop_store::{
    Cursor, ErrorEntry, Filter, PostgresStore, Record, SqliteStore, Status, Store, list_after,
    list_page,
};

const PAGE: usize = 50;

/// How many dead letters: `BACKSTOP_BENCH_DEAD`, 110,000 unless set.
fn dead_count() -> u64 {
    std::env::var("BACKSTOP_BENCH_DEAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110_000)
}

/// The dead letters, one a second back from now, and the deferred ones, one due a second
/// after the other; each with a request of 1 KiB.
fn records() -> Vec<Record> {
    let now = SystemTime::now();
    let dead = dead_count();
    (0..dead + dead * 2 / 11)
        .map(|i| {
            let failed = now - Duration::from_secs(i);
            let entry = ErrorEntry::new(
                failed,
                ["transient", "throttled"][(i % 2) as usize],
                "http 503",
                "m",
                1,
            );
            let mut r = Record::new(format!("r-{i:07}"), entry);
            // A request of 1 KiB, as a small JSON message is.
            r.payload = vec![b'x'; 1024];
            r.payload_len = 1024;
            if i >= dead {
                r.status = Status::Deferred;
                r.retry_at = Some(now + Duration::from_secs(i));
            }
            r
        })
        .collect()
}

/// The median time of 7 runs of `read`, in milliseconds.
async fn median<F, Fut>(mut read: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = usize>,
{
    let mut times = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let n = read().await;
        times.push(start.elapsed().as_secs_f64() * 1_000.0);
        assert!(n > 0, "a page of records");
    }
    times.sort_by(f64::total_cmp);
    times[3]
}

/// The cursor after the first `depth` records of the list of `filter`, read 10,000 at a time.
async fn cursor_at(store: &dyn Store, filter: &Filter, depth: usize) -> Cursor {
    let mut cursor = None;
    let mut read = 0;
    while read < depth {
        let take = (depth - read).min(10_000);
        let page = list_after(store, filter, false, cursor.as_ref(), take)
            .await
            .unwrap();
        read += page.records.len();
        cursor = Some(page.next.expect("the list goes on"));
    }
    cursor.expect("a depth above 0")
}

/// Prints what a page by position costs at each depth, and with `cursors` what a page after a
/// cursor does.
async fn measure(name: &str, store: &dyn Store, cursors: bool) {
    let dead = Filter::new().status(Status::Dead);
    let waiting = Filter::new().status(Status::Deferred);
    let held = usize::try_from(dead_count()).unwrap_or(usize::MAX);
    let mut dead_depths = vec![0usize, 10_000, 100_000];
    if held > 1_000_000 + PAGE {
        dead_depths.push(1_000_000);
    }
    for (part, filter, depths) in [
        ("dead", &dead, dead_depths),
        ("waiting", &waiting, vec![0usize, 10_000]),
    ] {
        for depth in depths {
            let offset = median(|| async move {
                let range = depth..depth + PAGE;
                let page = if part == "dead" {
                    store.search(filter, range).await
                } else {
                    store.search_waiting(filter, range).await
                };
                page.unwrap().len()
            })
            .await;
            let listed = median(|| async move {
                let range = depth..depth + PAGE;
                let page = list_page(store, filter, false, range).await;
                page.unwrap().records.len()
            })
            .await;
            let mut line = format!(
                "{name:<16} {part:<7} {depth:>7} deep: by position {offset:>8.2} ms \
                 (list_page, with its counts: {listed:>8.2} ms)"
            );
            if cursors {
                let cursor = match depth {
                    0 => None,
                    d => Some(cursor_at(store, filter, d).await),
                };
                let cursor = cursor.as_ref();
                let keyset = median(|| async move {
                    let page = list_after(store, filter, false, cursor, PAGE).await;
                    page.unwrap().records.len()
                })
                .await;
                line.push_str(&format!(", after a cursor {keyset:>6.2} ms"));
            }
            println!("{line}");
        }
    }
}

/// SQLite as the previous version of its schema had it (no list index), then as it is.
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("depth.db");
    let store = SqliteStore::open(&path).unwrap();
    seed(&store).await;
    store.close();
    // Reopened, as an operator's tool opens it: with the planner's statistics.
    let store = SqliteStore::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("DROP INDEX dead_letters_listed; ANALYZE;")
        .unwrap();
    measure("sqlite, no index", &store, false).await;
    raw.execute_batch(
        "CREATE INDEX dead_letters_listed ON dead_letters \
         (status, last_failed_at_ms DESC, id); ANALYZE;",
    )
    .unwrap();
    measure("sqlite", &store, true).await;
}

async fn seed(store: &dyn Store) {
    for chunk in records().chunks(5_000) {
        store.put_many(chunk.to_vec()).await.unwrap();
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        sqlite().await;

        let Ok(url) = std::env::var("BACKSTOP_POSTGRES_URL") else {
            println!("postgres: left out (BACKSTOP_POSTGRES_URL is not set)");
            return;
        };
        let schema = format!("bench_list_depth_{}", std::process::id());
        let pg = PostgresStore::connect(&url).schema(&schema).await.unwrap();
        seed(&pg).await;
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(&format!("ANALYZE {schema}.records"))
            .execute(&pool)
            .await
            .unwrap();
        measure("postgres", &pg, true).await;
        // The plans of the keyset reads: an index from the key on, no sort.
        let t = i64::try_from(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
            - 100_000_000;
        for sql in [
            format!(
                "SELECT * FROM {schema}.records WHERE status = 'dead' AND last_failed_at_ms <= {t} \
                 AND (last_failed_at_ms < {t} OR id > 'r-0100000') \
                 ORDER BY last_failed_at_ms DESC, id LIMIT 51"
            ),
            format!(
                "SELECT * FROM {schema}.records WHERE status IN ('deferred', 'in_flight') \
                 AND retry_at_ms IS NOT NULL AND status = 'deferred' \
                 AND (retry_at_ms, id) > ({t}, 'r-0120000') ORDER BY retry_at_ms, id LIMIT 51"
            ),
        ] {
            let rows = sqlx::query(&format!("EXPLAIN {sql}"))
                .fetch_all(&pool)
                .await
                .unwrap();
            for row in rows {
                let line: String = sqlx::Row::get(&row, 0);
                println!("  {line}");
            }
        }
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    });
}
