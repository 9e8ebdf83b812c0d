//! `backstop-dlq` and the board over a real Postgres: the command line's list, show, stats,
//! redrive and purge with `--store postgres://…`, and the board's pages over a `PostgresStore`.
//!
//! The server comes from `BACKSTOP_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test works in a schema of its own. When
//! the server cannot be reached the tests that need it are reported as ignored, with the reason,
//! unless `BACKSTOP_REQUIRE_POSTGRES=1` (what `.ci/run` sets), when they fail
//! (backstop-test-support).

mod common;

use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::routing::post;
use backstop_dlq::Board;
use backstop_test_support::{Service, Tests, postgres_url};
use common::{csrf, stderr, stdout};
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{AuditAction, Filter, PostgresStore, Record, Status, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

/// A store in a fresh schema (its name returned too); the harness checked that the server
/// answers.
async fn postgres_store(test: &str) -> (PostgresStore, String) {
    let url = postgres_url();
    let schema = format!("bt_dlq_{test}_{:016x}", rand::random::<u64>());
    let store = PostgresStore::connect(&url)
        .schema(schema.clone())
        .await
        .unwrap_or_else(|e| panic!("{test}: postgres at {url}: {e}"));
    (store, schema)
}

/// Runs `backstop-dlq` with `args`, as the OS user `pg-tester`, on a blocking thread.
async fn dlq(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_backstop-dlq"))
            .args(&args)
            .env("USER", "pg-tester")
            .env_remove("LOGNAME")
            .output()
            .expect("run backstop-dlq")
    })
    .await
    .unwrap()
}

fn record(id: &str, class: &'static str, code: Code, uri: &str) -> Record {
    let f: Failure = Failure::new(Class::new(class), code);
    record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\"}}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", uri)
            .with_metadata("idempotency-key", id)
            .with_tag("campaign", "spring"),
        &f,
    )
}

/// 5 throttled (429) and 3 permanent (400) dead letters, all to `uri`.
fn sample(uri: &str) -> Vec<Record> {
    let mut v: Vec<Record> = (0..5)
        .map(|i| {
            let code = Code::Http(http::StatusCode::TOO_MANY_REQUESTS);
            record(&format!("thr-{i}"), "throttled", code, uri)
        })
        .collect();
    v.extend((0..3).map(|i| {
        let code = Code::Http(http::StatusCode::BAD_REQUEST);
        record(&format!("perm-{i}"), "permanent", code, uri)
    }));
    v
}

/// A provider on 127.0.0.1 that answers 202 and notes each idempotency key; its base URL.
async fn provider() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/v1/messages",
        post(move |headers: HeaderMap| {
            let log = Arc::clone(&log);
            async move {
                log.lock()
                    .unwrap()
                    .push(headers["idempotency-key"].to_str().unwrap().to_owned());
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

async fn list_show_stats_redrive_and_purge_over_postgres() {
    let (store, schema) = postgres_store("cli").await;
    let (target, seen) = provider().await;
    let host = target.trim_start_matches("http://").to_owned();
    store
        .put_many(sample(&format!("{target}/v1/messages")))
        .await
        .unwrap();
    let url = postgres_url();
    let on = |rest: &[&str]| {
        let mut args = vec!["--store", url.as_str(), "--schema", schema.as_str()];
        args.extend(rest);
        dlq(args.into_iter().map(str::to_owned).collect())
    };

    let o = on(&["list", "-f", "class=throttled", "--json"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Vec<Record> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 5);
    assert!(listed.iter().all(|r| r.class == "throttled"));
    let o = on(&["list", "-f", &format!("host={host}")]).await;
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1 + 8, "{out}");
    assert!(out.lines().skip(1).all(|l| l.contains(&host)), "{out}");

    let o = on(&["show", "perm-1"]).await;
    let out = stdout(&o);
    assert!(out.contains("id              perm-1"), "{out}");
    assert!(out.contains(&format!("host            {host}")), "{out}");

    let o = on(&["stats", "--window", "1h"]).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let throttled = out
        .lines()
        .find(|l| l.trim_start().starts_with("throttled"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        throttled.contains(" 5 ") && throttled.contains("62.5%"),
        "{throttled}"
    );

    let o = on(&[
        "redrive",
        "-f",
        "class=throttled",
        "--rate",
        "100",
        "--max",
        "3",
    ])
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("re-drove 3: 3 resolved, 0 failed again, 0 skipped"),
        "{}",
        stdout(&o)
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
    let resolved = store.count(&Filter::new().status(Status::Resolved)).await;
    assert_eq!(resolved.unwrap(), 3);

    let o = on(&["purge", "-f", "class=permanent"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("3 dead letters match"),
        "{}",
        stderr(&o)
    );
    let o = on(&["purge", "-f", "class=permanent", "--yes", "--actor", "olga"]).await;
    assert!(
        stdout(&o).contains("deleted 3 dead letters"),
        "{}",
        stdout(&o)
    );
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 5);
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(
        audit
            .iter()
            .map(|e| (e.action, e.actor.as_str(), e.sent))
            .collect::<Vec<_>>(),
        [
            (AuditAction::Purge, "olga", 3),
            (AuditAction::Redrive, "pg-tester", 3)
        ]
    );
}

async fn a_postgres_password_never_shows_in_the_cli() {
    for store in [
        "postgres://app:hunter2@127.0.0.1:1/db",
        "postgresql://app:hunter2@127.0.0.1:notaport/db",
        "postgres://app@127.0.0.1:1/db?password=hunter2",
    ] {
        let o = dlq(vec!["--store".into(), store.into(), "list".into()]).await;
        assert!(!o.status.success(), "{store}");
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("postgres") && text.contains("***"), "{text}");
    }
}

async fn the_board_over_postgres() {
    let (store, _) = postgres_store("board").await;
    let store: Arc<dyn Store> = Arc::new(store);
    store
        .put_many(sample("http://mail.invalid/v1/messages"))
        .await
        .unwrap();
    let board = Board::new(Arc::clone(&store)).authorize(|_| Some("pat".to_owned()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, board.router()).await.unwrap() });
    let client = reqwest::Client::new();
    let get = |path: &str| {
        let request = client.get(format!("{base}{path}"));
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.text().await.unwrap()
        }
    };

    let overview = get("/").await;
    assert!(overview.contains("<td id=\"dead\">8</td>"), "{overview}");
    let list = get("/records?class=permanent").await;
    for i in 0..3 {
        assert!(
            list.contains(&format!("href=\"/records/perm-{i}\"")),
            "{list}"
        );
    }
    assert!(!list.contains("href=\"/records/thr-0\""), "{list}");
    let groups = get("/groups").await;
    assert_eq!(groups.matches("data-group=").count(), 2, "{groups}");
    let one = get("/records/thr-2").await;
    assert!(
        one.contains("<td id=\"host\">mail.invalid:80</td>"),
        "{one}"
    );

    let token = csrf(&list);
    let r = client
        .post(format!("{base}/purge/run"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={token}&class=permanent"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 5);
    let audit = get("/audit").await;
    assert!(
        audit.contains("data-action=\"purge\"") && audit.contains("pat"),
        "{audit}"
    );
}

/// A schema name with a typo is an error that names it, for reads and writes alike, and the
/// command leaves no empty schema behind (an operator would otherwise read "no dead letters").
async fn a_mistyped_schema_is_an_error_and_is_not_created() {
    let (_store, schema) = postgres_store("typo").await;
    let typo = format!("{schema}x");
    let url = postgres_url();
    for command in [
        &["list"][..],
        &["stats"],
        &["check-counts"],
        &["purge", "-f", "class=permanent", "--yes"],
    ] {
        let mut args = vec!["--store", url.as_str(), "--schema", typo.as_str()];
        args.extend(command);
        let o = dlq(args.into_iter().map(str::to_owned).collect()).await;
        assert!(!o.status.success(), "{command:?}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("no schema \"{typo}\"")),
            "{command:?}: {err}"
        );
    }
    let reopened = PostgresStore::connect(&url)
        .schema(typo.clone())
        .existing_schema()
        .await;
    assert!(reopened.is_err(), "the command created schema {typo}");
    // The schema that exists opens as before.
    PostgresStore::connect(&url)
        .schema(schema)
        .existing_schema()
        .await
        .unwrap();
}

fn main() {
    let mut tests = Tests::new();
    tests.needs(Service::Postgres).multi_thread(
        "a_mistyped_schema_is_an_error_and_is_not_created",
        a_mistyped_schema_is_an_error_and_is_not_created,
    );
    tests.needs(Service::Postgres).multi_thread(
        "list_show_stats_redrive_and_purge_over_postgres",
        list_show_stats_redrive_and_purge_over_postgres,
    );
    tests.current(
        "a_postgres_password_never_shows_in_the_cli",
        a_postgres_password_never_shows_in_the_cli,
    );
    tests
        .needs(Service::Postgres)
        .multi_thread("the_board_over_postgres", the_board_over_postgres);
    tests.run();
}
