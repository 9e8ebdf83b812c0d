//! What only the Postgres store has, against a real server (see `tests/postgres_support`):
//! its migrations under the advisory lock (a schema of version 1 upgraded in place), the schema
//! version check, the claim's plan, its
//! batched deletes, and its errors for bad input and exhausted resources.
//!
//! The behaviour every store shares is in `tower_backstop_store::testing`, run against this
//! store by `tower-backstop-store/tests/conformance.rs`.

mod postgres_support;

use std::time::{Duration, SystemTime};

use backstop_test_support::{Service, Tests};
use postgres_support::{fresh_schema, postgres_url};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool, Row};
use tower_backstop::store::{Change, Filter, FleetNote, PostgresStore, Record, Status, Store};

/// A pool of our own on the test server.
async fn admin(test: &str) -> PgPool {
    let url = postgres_url();
    match PgPoolOptions::new().max_connections(4).connect(&url).await {
        Ok(pool) => pool,
        Err(e) => panic!("{test}: cannot connect to postgres at {url}: {e}"),
    }
}

fn record(id: &str, status: Status, retry_at: Option<SystemTime>) -> Record {
    let mut r: Record = serde_json::from_value(serde_json::json!({
        "id": id,
        "class": "transient",
        "code": "http 503",
        "message": "unavailable",
        "attempts": 1,
        "first_failed_at": "2026-04-01T14:00:00.000Z",
        "last_failed_at": "2026-04-01T14:00:00.000Z",
        "payload": "utf8:{}",
        "content_type": null,
        "metadata": {},
    }))
    .unwrap();
    r.status = status;
    r.retry_at = retry_at;
    r
}

async fn ten_instances_opening_a_new_schema_at_once_migrate_it_once() {
    let admin = admin("ten_opens").await;
    let schema = fresh_schema("ten_opens");
    let opens: Vec<_> = (0..10)
        .map(|_| {
            let schema = schema.clone();
            tokio::spawn(async move {
                PostgresStore::connect(&postgres_url())
                    .schema(schema)
                    .max_connections(2)
                    .await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().expect("every instance opens"));
    }
    let rows: Vec<(i32, String)> = sqlx::query_as(&format!(
        "SELECT version, name FROM \"{schema}\".schema_migrations"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (1, "records".to_owned()),
            (2, "notes".to_owned()),
            (3, "counts".to_owned())
        ],
        "one row per migration"
    );
    // Every instance works on the one schema.
    stores[3]
        .put(record("m-1", Status::Dead, None))
        .await
        .unwrap();
    assert_eq!(stores[8].get("m-1").await.unwrap().unwrap().id, "m-1");
    // Opening again finds nothing to do.
    let again = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    assert_eq!(again.list(10).await.unwrap().len(), 1);
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".schema_migrations"
    ))
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(n, 3);
}

/// A schema of version 1 (no fleet notes) gains the notes' table when a store opens it, its
/// records kept.
/// What the counts say and what a scan of the records says, for a check after each step.
async fn counts_and_scan(store: &PostgresStore) -> [(Vec<(String, u64)>, u64); 2] {
    let all = store.counts(SystemTime::UNIX_EPOCH).await.unwrap();
    let mut scanned = Vec::new();
    for class in ["transient", "poison"] {
        let filter = Filter::new()
            .status(Status::Dead)
            .class(class)
            .since(SystemTime::UNIX_EPOCH);
        let n = store.count(&filter).await.unwrap();
        if n > 0 {
            scanned.push((class.to_owned(), n));
        }
    }
    scanned.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut waiting = 0;
    for status in [Status::Deferred, Status::InFlight] {
        let filter = Filter::new().status(status).since(SystemTime::UNIX_EPOCH);
        waiting += store.count(&filter).await.unwrap();
    }
    [(all.by_class, all.deferred), (scanned, waiting)]
}

/// Records of two classes and three statuses: `n` of each.
fn mixed(n: usize) -> Vec<Record> {
    let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let mut records = Vec::new();
    for i in 0..n {
        records.push(record(&format!("dead-{i}"), Status::Dead, None));
        let mut poison = record(&format!("poison-{i}"), Status::Dead, None);
        poison.class = "poison".into();
        records.push(poison);
        records.push(record(&format!("wait-{i}"), Status::Deferred, Some(later)));
        records.push(record(&format!("done-{i}"), Status::Resolved, None));
    }
    records
}

/// A schema of version 2 (before the counts table) with records in it, some written since by
/// hand (no trigger counted them), gains the counts table, its triggers and its rows, filled
/// from the records, when a store opens it.
async fn a_schema_of_version_2_gains_the_counts_filled_from_its_records() {
    let admin = admin("version_2").await;
    let schema = fresh_schema("version_2");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    store.put_many(mixed(40)).await.unwrap();
    store.close().await;
    admin
        .execute(sqlx::raw_sql(&format!(
            "DROP TABLE \"{schema}\".counts;
             DROP FUNCTION \"{schema}\".count_records() CASCADE;
             DELETE FROM \"{schema}\".schema_migrations WHERE version = 3;
             UPDATE \"{schema}\".records SET status = 'dead', retry_at_ms = NULL
             WHERE id IN ('wait-1', 'wait-2', 'wait-3');"
        )))
        .await
        .unwrap();
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    let [counted, scanned] = counts_and_scan(&store).await;
    assert_eq!(counted, scanned);
    assert_eq!(
        counted.0,
        [("transient".to_owned(), 43), ("poison".to_owned(), 40)]
    );
    assert_eq!(counted.1, 37);
    assert!(store.check_counts(false).await.unwrap().is_clean());
    assert_eq!(
        store
            .count(&Filter::new().status(Status::Resolved))
            .await
            .unwrap(),
        40
    );
}

/// A counter changed by hand (too high, too low, negative) is a drift the check reports,
/// with what it expected and what it found (never below 0), and repairs when asked; a
/// deletion never takes a counter below 0.
async fn a_counter_changed_by_hand_is_reported_and_repaired() {
    let admin = admin("counts_drift").await;
    let schema = fresh_schema("counts_drift");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    store.put_many(mixed(40)).await.unwrap();
    let [want, _] = counts_and_scan(&store).await;
    admin
        .execute(sqlx::raw_sql(&format!(
            "UPDATE \"{schema}\".counts SET n = n + 7
             WHERE status = 'dead' AND class = 'poison' AND slot = 0;
             UPDATE \"{schema}\".counts SET n = 0 WHERE status = 'resolved';
             UPDATE \"{schema}\".counts SET n = -5 WHERE status = 'deferred';"
        )))
        .await
        .unwrap();
    // Deleting resolved records whose counters are at 0 leaves them at 0.
    assert_eq!(
        store
            .delete(&Filter::new().status(Status::Resolved).id("done-1"))
            .await
            .unwrap(),
        1
    );
    let lowest: i64 = sqlx::query_scalar(&format!(
        "SELECT min(n) FROM \"{schema}\".counts WHERE status = 'resolved'"
    ))
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(lowest, 0);
    let found = store.check_counts(false).await.unwrap();
    assert!(!found.repaired);
    let drifts: Vec<_> = found
        .drifts
        .iter()
        .map(|d| (d.status, d.class.as_deref().unwrap(), d.expected, d.found))
        .collect();
    assert_eq!(
        drifts,
        [
            (Status::Dead, "poison", 40, 47),
            (Status::Deferred, "transient", 40, 0),
            (Status::Resolved, "transient", 39, 0),
        ]
    );
    assert_eq!(
        store.check_counts(false).await.unwrap().drifts,
        found.drifts
    );
    let repaired = store.check_counts(true).await.unwrap();
    assert!(repaired.repaired);
    assert_eq!(repaired.drifts, found.drifts);
    assert!(store.check_counts(false).await.unwrap().is_clean());
    let [counted, scanned] = counts_and_scan(&store).await;
    assert_eq!(counted, want);
    assert_eq!(counted, scanned);
}

async fn a_schema_of_version_1_gains_the_notes_table_at_open() {
    let admin = admin("version_1").await;
    let schema = fresh_schema("version_1");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    store.put(record("kept", Status::Dead, None)).await.unwrap();
    store.close().await;
    admin
        .execute(sqlx::raw_sql(&format!(
            "DROP TABLE \"{schema}\".notes;
             DROP TABLE \"{schema}\".counts;
             DROP FUNCTION \"{schema}\".count_records() CASCADE;
             DELETE FROM \"{schema}\".schema_migrations WHERE version >= 2;"
        )))
        .await
        .unwrap();
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    let versions: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM \"{schema}\".schema_migrations ORDER BY version"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(versions, [1, 2, 3]);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let note = FleetNote::new("breaker:a", "p-1", "{}", now, Duration::from_secs(5));
    store.put_note(note.clone()).await.unwrap();
    assert_eq!(store.notes(now).await.unwrap(), [note]);
    assert!(store.get("kept").await.unwrap().is_some());
}

async fn a_schema_of_a_newer_version_fails_at_open_and_names_the_fix() {
    let admin = admin("newer_schema").await;
    let schema = fresh_schema("newer_schema");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    store.put(record("kept", Status::Dead, None)).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".schema_migrations (version, name) VALUES (4, 'from the future')"
    ))
    .execute(&admin)
    .await
    .unwrap();
    for err in [
        PostgresStore::connect(&postgres_url())
            .schema(&schema)
            .await
            .unwrap_err(),
        PostgresStore::from_pool(admin.clone())
            .schema(&schema)
            .await
            .unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(text.contains("has version 4"), "{text}");
        assert!(text.contains("knows versions up to 3"), "{text}");
        assert!(text.contains("upgrade tower-backstop"), "{text}");
    }
    // Nothing was changed: the record is there, the version row too.
    assert_eq!(store.list(10).await.unwrap().len(), 1);
}

/// The claim's own statement (the SQL file the store ships), explained and run on a table of
/// 20,000 dead records and 10 deferred ones: it reads the partial index of the deferred and
/// in-flight records and no dead row.
async fn a_claim_reads_the_due_index_and_never_the_dead_rows() {
    let admin = admin("claim_plan").await;
    let schema = fresh_schema("claim_plan");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .await
        .unwrap();
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    for chunk in 0..20 {
        let batch = (0..1_000)
            .map(|i| record(&format!("dead-{chunk:02}-{i:04}"), Status::Dead, None))
            .collect();
        store.put_many(batch).await.unwrap();
    }
    let due = (0..10)
        .map(|i| record(&format!("due-{i}"), Status::Deferred, Some(t)))
        .collect();
    store.put_many(due).await.unwrap();
    admin
        .execute(format!("ANALYZE \"{schema}\".records").as_str())
        .await
        .unwrap();
    let claim = include_str!("../tower-backstop-store/src/postgres/claim.sql")
        .replace("{schema}", &format!("\"{schema}\""))
        .replace("{returning}", "r.id")
        .replace("{columns}", "id");
    let mut tx = admin.begin().await.unwrap();
    let row = sqlx::query(&format!("EXPLAIN (ANALYZE, FORMAT JSON)\n{claim}"))
        .bind(1_780_000_000_000_i64 + 1)
        .bind(100_i64)
        .bind(1_780_000_060_000_i64)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // The plan is `json`; its binary form is its text.
    let plan: serde_json::Value =
        serde_json::from_str(&row.try_get_unchecked::<String, _>(0).unwrap()).unwrap();
    tx.rollback().await.unwrap();
    let mut scans = Vec::new();
    collect_scans(&plan[0]["Plan"], &mut scans);
    let on_records: Vec<&(String, String, u64)> = scans
        .iter()
        .filter(|(_, relation, _)| relation == "records")
        .collect();
    assert!(!on_records.is_empty(), "{plan:#}");
    for (node, _, rows) in &on_records {
        assert!(
            node == "records_due" || node == "records_pkey",
            "the claim read {node}: {plan:#}"
        );
        assert!(*rows <= 10, "{node} returned {rows} rows: {plan:#}");
    }
    assert!(
        on_records
            .iter()
            .any(|(node, _, rows)| node == "records_due" && *rows == 10),
        "{plan:#}"
    );
    // And the store's claim takes exactly those ten.
    let claimed = store
        .claim_due(t + Duration::from_secs(1), 100, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 10);
}

/// Each scan (not the update) of `plan` and its children: (index name or "Seq Scan", relation, actual rows).
fn collect_scans(plan: &serde_json::Value, out: &mut Vec<(String, String, u64)>) {
    let scan = plan["Node Type"]
        .as_str()
        .is_some_and(|t| t.contains("Scan"));
    if let Some(relation) = plan["Relation Name"].as_str().filter(|_| scan) {
        let node = plan["Index Name"]
            .as_str()
            .unwrap_or_else(|| plan["Node Type"].as_str().unwrap_or("?"));
        let rows = plan["Actual Rows"].as_u64().unwrap_or(0);
        out.push((node.to_owned(), relation.to_owned(), rows));
    }
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            collect_scans(child, out);
        }
    }
}

/// A delete of 2,500 records goes in statements of at most 1,000 and removes them all; one
/// that a record no longer matches once locked (changed meanwhile) leaves it.
async fn deletes_go_in_bounded_batches_and_remove_every_match() {
    let store = postgres_support::postgres_store("delete_batches").await;
    for chunk in 0..5 {
        let batch = (0..500)
            .map(|i| record(&format!("d-{chunk}-{i:03}"), Status::Dead, None))
            .collect();
        store.put_many(batch).await.unwrap();
    }
    store
        .put(record("keep", Status::Deferred, None))
        .await
        .unwrap();
    let dead = Filter::new().status(Status::Dead);
    assert_eq!(store.count(&dead).await.unwrap(), 2_500);
    assert_eq!(store.delete(&dead).await.unwrap(), 2_500);
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 1);
    assert_eq!(store.delete(&dead).await.unwrap(), 0);
}

async fn a_malformed_or_unreachable_url_fails_at_open_without_its_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Nothing listens on `port` now.
    let refused = format!("postgres://app:hunter2@127.0.0.1:{port}/db");
    let err = PostgresStore::connect(&refused).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("connection refused"), "{text}");
    assert!(text.contains("postgres://***@127.0.0.1"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    for bad in [
        "postgres://app:hunter2@127.0.0.1:notaport/db",
        "mysql://app:hunter2@127.0.0.1/db",
        "postgres://127.0.0.1/db?password=hunter2&sslmode=sideways",
    ] {
        let err = PostgresStore::connect(bad).await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter2"), "{bad}: {text}");
        assert!(text.contains("postgres dead-letter store"), "{bad}: {text}");
    }
    // A bad schema name is refused before anything is written.
    let err = PostgresStore::connect(&refused)
        .schema("")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("schema name"), "{err}");
}

async fn a_database_that_does_not_exist_is_named() {
    let url = postgres_url();
    let (base, _) = url.rsplit_once('/').unwrap();
    let err = PostgresStore::connect(&format!("{base}/no_such_database_here"))
        .await
        .unwrap_err();
    let text = format!("{err}");
    assert!(text.contains("cannot connect"), "{text}");
    assert!(text.contains("no_such_database_here"), "{text}");
    // TLS required: this build has no TLS stack, and says so.
    let sep = if url.contains('?') { '&' } else { '?' };
    let err = PostgresStore::connect(&format!("{url}{sep}sslmode=require"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
}

async fn an_exhausted_pool_is_a_clear_error_and_the_store_goes_on() {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect(&postgres_url())
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool.clone())
        .schema(fresh_schema("pool_exhausted"))
        .await
        .unwrap();
    let held = pool.acquire().await.unwrap();
    let err = store
        .put(record("m-1", Status::Dead, None))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no connection within the pool's acquire timeout"),
        "{err}"
    );
    drop(held);
    store.put(record("m-1", Status::Dead, None)).await.unwrap();
    assert_eq!(store.list(10).await.unwrap().len(), 1);
    // A pool setting given beside a pool is refused, naming it.
    let err = PostgresStore::from_pool(pool)
        .acquire_timeout(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("acquire_timeout"), "{err}");
}

async fn a_statement_timeout_is_a_clear_error_and_writes_nothing() {
    let admin = admin("statement_timeout").await;
    let schema = fresh_schema("statement_timeout");
    let store = PostgresStore::connect(&postgres_url())
        .schema(&schema)
        .statement_timeout(Duration::from_millis(200))
        .await
        .unwrap();
    store.put(record("m-1", Status::Dead, None)).await.unwrap();
    // Another session holds the row's lock past the statement timeout.
    let mut other = admin.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT id FROM \"{schema}\".records WHERE id = 'm-1' FOR UPDATE"
    ))
    .fetch_one(&mut *other)
    .await
    .unwrap();
    let err = store.update("m-1", Change::Dead).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("statement timeout"), "{text}");
    other.rollback().await.unwrap();
    // The lock is gone: the same store writes.
    let r = store
        .update(
            "m-1",
            Change::Resolved {
                at: SystemTime::now(),
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, Status::Resolved);
    let row = sqlx::query(&format!(
        "SELECT status FROM \"{schema}\".records WHERE id = 'm-1'"
    ))
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), "resolved");
}

/// Through PgBouncer in transaction pooling mode (`BACKSTOP_PGBOUNCER_URL`): five instances
/// open a new schema at once and it is migrated once (the transaction-scoped migration lock holds
/// there), and a store opened without `behind_pooler` is refused with a hint.
async fn behind_pgbouncer_instances_opening_a_new_schema_at_once_migrate_it_once() {
    let url = backstop_test_support::pgbouncer_url();
    let schema = fresh_schema("pgbouncer_opens");
    let opens: Vec<_> = (0..5)
        .map(|_| {
            let (url, schema) = (url.clone(), schema.clone());
            tokio::spawn(async move {
                PostgresStore::connect(&url)
                    .schema(schema)
                    .max_connections(2)
                    .behind_pooler()
                    .await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    let n: i64 = stores[0]
        .pool()
        .begin()
        .await
        .unwrap()
        .fetch_one(sqlx::raw_sql(&format!(
            "SELECT count(*) FROM \"{schema}\".schema_migrations"
        )))
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3, "one row per migration: migrated once");
    stores[1]
        .put(record("m-1", Status::Dead, None))
        .await
        .unwrap();
    assert!(stores[4].get("m-1").await.unwrap().is_some());

    let refused = PostgresStore::connect(&url)
        .schema(&schema)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("behind_pooler"), "{refused}");
}

/// Behind PgBouncer the statement timeout, which PgBouncer refuses as a startup parameter, is
/// set in each transaction: a statement waiting on a row lock past it fails and says so.
async fn behind_pgbouncer_a_statement_timeout_is_a_clear_error() {
    let url = backstop_test_support::pgbouncer_url();
    let schema = fresh_schema("pgbouncer_timeout");
    let store = PostgresStore::connect(&format!("{url}?pooler=transaction"))
        .schema(&schema)
        .statement_timeout(Duration::from_millis(200))
        .await
        .unwrap();
    store.put(record("m-1", Status::Dead, None)).await.unwrap();
    // Another transaction holds the row's lock past the statement timeout.
    let mut other = store.pool().begin().await.unwrap();
    (&mut *other)
        .execute(sqlx::raw_sql(&format!(
            "SELECT id FROM \"{schema}\".records WHERE id = 'm-1' FOR UPDATE"
        )))
        .await
        .unwrap();
    let err = store.update("m-1", Change::Dead).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("statement timeout"), "{text}");
    other.rollback().await.unwrap();
    let r = store
        .update(
            "m-1",
            Change::Resolved {
                at: SystemTime::now(),
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, Status::Resolved);
}

/// Text Postgres cannot hold (NUL) and the escape character itself round-trip in every field,
/// and searches by them find exactly their records.
async fn nul_and_the_escape_character_round_trip_and_are_found() {
    let store = postgres_support::postgres_store("nul_text").await;
    let mut r = record("a\0b\u{1}c", Status::Dead, None);
    r.class = "cl\0ss".into();
    r.code = "co\u{1}de".into();
    r.message = "m\0".into();
    r.tags.insert("t\0".into(), "v\u{1}\0".into());
    r.metadata.insert("k\u{1}".into(), "\0".into());
    r.breaker = Some("b\0".into());
    r.content_type = Some("c\0".into());
    store.put(r.clone()).await.unwrap();
    let mut other = record("a\u{1}b", Status::Dead, None);
    other.class = "cl\u{1}ss".into();
    store.put(other).await.unwrap();
    assert_eq!(store.get(&r.id).await.unwrap(), Some(r.clone()));
    let found = store
        .search(
            &Filter::new()
                .class("cl\0ss")
                .tag("t\0", "v\u{1}\0")
                .code("co\u{1}de"),
            0..10,
        )
        .await
        .unwrap();
    assert_eq!(found, [r.clone()]);
    let counts = store.counts(SystemTime::UNIX_EPOCH).await.unwrap();
    assert_eq!(
        counts.by_class,
        [("cl\0ss".to_owned(), 1), ("cl\u{1}ss".to_owned(), 1)]
    );
    assert_eq!(store.delete(&Filter::new().id(&r.id)).await.unwrap(), 1);
    assert_eq!(store.list(10).await.unwrap().len(), 1);
}

/// A scheduler over `store` that counts its re-sends, looking at the store once a minute.
fn counting_scheduler(
    store: PostgresStore,
) -> (
    tower_backstop::resend::SchedulerHandle,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let provider = tower::service_fn(move |_: String| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, tower_backstop::BoxError>(()) }
    });
    let rebuild = |r: &Record| Ok::<_, tower_backstop::BoxError>(r.id.clone());
    let handle = tower_backstop::resend::Scheduler::new(Arc::new(store), provider, rebuild)
        .poll_every(Duration::from_secs(60))
        .spawn();
    (handle, sent)
}

/// With `listen_for_due`, a record another instance defers for now wakes a scheduler that looks
/// at the store once a minute: it is sent within seconds (`LISTEN`/`NOTIFY`). Without it, the
/// same scheduler has not looked again seconds later.
async fn listen_for_due_wakes_a_sleeping_scheduler_at_once() {
    use std::sync::atomic::Ordering;
    let url = postgres_url();
    for listening in [true, false] {
        let schema = fresh_schema("listen_for_due");
        let open = || PostgresStore::connect(&url).schema(schema.clone());
        let (mut scheduled, mut writer) = (open().await.unwrap(), open().await.unwrap());
        if listening {
            scheduled = scheduled.listen_for_due();
            writer = writer.listen_for_due();
        }
        let (handle, sent) = counting_scheduler(scheduled);
        // The scheduler's first look finds nothing: it sleeps for its poll.
        tokio::time::sleep(Duration::from_millis(500)).await;
        writer
            .put(record("due-now", Status::Deferred, Some(SystemTime::now())))
            .await
            .unwrap();
        let mut waited = Duration::ZERO;
        while sent.load(Ordering::SeqCst) == 0 && waited < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
        let n = sent.load(Ordering::SeqCst);
        handle.shutdown().await;
        if listening {
            assert_eq!(n, 1, "woken by the notification");
            let r = writer.get("due-now").await.unwrap().unwrap();
            assert_eq!(r.status, Status::Resolved);
        } else {
            assert_eq!(n, 0, "no wake-up: the poll, a minute away, governs");
        }
    }
}

fn main() {
    let mut tests = Tests::new();
    tests.needs(Service::Postgres).multi_thread(
        "listen_for_due_wakes_a_sleeping_scheduler_at_once",
        listen_for_due_wakes_a_sleeping_scheduler_at_once,
    );
    tests.needs(Service::Postgres).current(
        "ten_instances_opening_a_new_schema_at_once_migrate_it_once",
        ten_instances_opening_a_new_schema_at_once_migrate_it_once,
    );
    tests.needs(Service::Postgres).current(
        "a_schema_of_version_1_gains_the_notes_table_at_open",
        a_schema_of_version_1_gains_the_notes_table_at_open,
    );
    tests.needs(Service::Postgres).current(
        "a_schema_of_version_2_gains_the_counts_filled_from_its_records",
        a_schema_of_version_2_gains_the_counts_filled_from_its_records,
    );
    tests.needs(Service::Postgres).current(
        "a_counter_changed_by_hand_is_reported_and_repaired",
        a_counter_changed_by_hand_is_reported_and_repaired,
    );
    tests.needs(Service::Postgres).current(
        "a_schema_of_a_newer_version_fails_at_open_and_names_the_fix",
        a_schema_of_a_newer_version_fails_at_open_and_names_the_fix,
    );
    tests.needs(Service::Postgres).current(
        "a_claim_reads_the_due_index_and_never_the_dead_rows",
        a_claim_reads_the_due_index_and_never_the_dead_rows,
    );
    tests.needs(Service::Postgres).current(
        "deletes_go_in_bounded_batches_and_remove_every_match",
        deletes_go_in_bounded_batches_and_remove_every_match,
    );
    tests.current(
        "a_malformed_or_unreachable_url_fails_at_open_without_its_password",
        a_malformed_or_unreachable_url_fails_at_open_without_its_password,
    );
    tests.needs(Service::Postgres).current(
        "a_database_that_does_not_exist_is_named",
        a_database_that_does_not_exist_is_named,
    );
    tests.needs(Service::Postgres).current(
        "an_exhausted_pool_is_a_clear_error_and_the_store_goes_on",
        an_exhausted_pool_is_a_clear_error_and_the_store_goes_on,
    );
    tests.needs(Service::Postgres).current(
        "a_statement_timeout_is_a_clear_error_and_writes_nothing",
        a_statement_timeout_is_a_clear_error_and_writes_nothing,
    );
    tests.needs(Service::Postgres).current(
        "nul_and_the_escape_character_round_trip_and_are_found",
        nul_and_the_escape_character_round_trip_and_are_found,
    );
    tests.needs(Service::PgBouncer).multi_thread(
        "behind_pgbouncer_instances_opening_a_new_schema_at_once_migrate_it_once",
        behind_pgbouncer_instances_opening_a_new_schema_at_once_migrate_it_once,
    );
    tests.needs(Service::PgBouncer).current(
        "behind_pgbouncer_a_statement_timeout_is_a_clear_error",
        behind_pgbouncer_a_statement_timeout_is_a_clear_error,
    );
    tests.run();
}
