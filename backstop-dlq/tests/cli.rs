//! `backstop-dlq` end to end: the real binary over a SQLite file (and a Redis URL when one is
//! reachable), re-driving to a real axum server on 127.0.0.1.

mod common;
mod redis_support;

use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::routing::post;
use backstop_test_support::Tests;
use common::{csrf, stderr, stdout};
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{Change, Filter, Record, SqliteStore, Status, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

/// The OS user the tool runs as in these tests: `$USER` is set to this name of the tests' own
/// and `$LOGNAME` is unset, so that the actor of the audit trail does not depend on the
/// machine's environment (which may set neither).
const OS_USER: &str = "cli-tester";

fn dlq(args: &[&str]) -> Output {
    dlq_env(args, &[("USER", Some(OS_USER)), ("LOGNAME", None)])
}

/// Runs `backstop-dlq` with `env` changed: `Some` sets a variable, `None` removes it.
fn dlq_env(args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_backstop-dlq"));
    command.args(args);
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.output().expect("run backstop-dlq")
}

/// Runs `backstop-dlq --store <store> <rest...>` on a blocking thread.
async fn dlq_on(store: &str, rest: &[&str]) -> Output {
    let mut args = vec!["--store".to_owned(), store.to_owned()];
    args.extend(rest.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dlq(&args)
    })
    .await
    .unwrap()
}

fn record(id: &str, class: &'static str, code: Code, campaign: &str) -> Record {
    let f: Failure = Failure::new(Class::new(class), code);
    record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\"}}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.test/v1/messages")
            .with_metadata("idempotency-key", id)
            .with_header("x-tenant", "acme")
            .with_header("x-raw", b"caf\xe9".to_vec())
            .with_header("authorization", "Bearer not-to-be-seen")
            .with_tag("campaign", campaign),
        &f,
    )
}

fn sample() -> Vec<Record> {
    let mut v = Vec::new();
    for i in 0..5 {
        v.push(record(
            &format!("thr-{i}"),
            "throttled",
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            "spring",
        ));
    }
    for i in 0..3 {
        v.push(record(
            &format!("perm-{i}"),
            "permanent",
            Code::Http(http::StatusCode::BAD_REQUEST),
            "summer",
        ));
    }
    v
}

/// The cursor of `(more: --after TOKEN)` in `stderr`, if there is one.
fn after_token(stderr: &str) -> Option<String> {
    let rest = stderr.split("(more: --after ").nth(1)?;
    Some(rest.split(')').next()?.to_owned())
}

/// `list --after`: the whole list a page at a time through the cursor each page prints, the
/// same as one page of all; a cursor that is not one, or was made for another filter, is a
/// usage error that says so.
async fn list_pages_by_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    let mut records = sample();
    records.extend((0..20).map(|i| {
        record(
            &format!("more-{i:02}"),
            "throttled",
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            "autumn",
        )
    }));
    store.put_many(records).await.unwrap();
    let db = path.to_str().unwrap().to_owned();
    let ids = |o: &Output| -> Vec<String> {
        stdout(o)
            .lines()
            .map(|l| serde_json::from_str::<Record>(l).unwrap().id)
            .collect()
    };

    let all = dlq_on(&db, &["list", "--json", "-f", "class=throttled"]).await;
    let want = ids(&all);
    assert_eq!(want.len(), 25);
    assert!(after_token(&stderr(&all)).is_none(), "{}", stderr(&all));
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["list", "--json", "-f", "class=throttled", "--limit", "7"];
        if let Some(token) = &after {
            args.extend(["--after", token.as_str()]);
        }
        let o = dlq_on(&db, &args).await;
        assert!(o.status.success(), "{}", stderr(&o));
        got.extend(ids(&o));
        after = after_token(&stderr(&o));
        if after.is_none() {
            break;
        }
    }
    assert_eq!(got, want, "the pages by cursor are the list");

    // A cursor of the throttled list, then used wrongly.
    let o = dlq_on(&db, &["list", "-f", "class=throttled", "--limit", "7"]).await;
    let token = after_token(&stderr(&o)).unwrap();
    let damaged = format!("{}x", &token[..token.len() - 1]);
    for (args, says) in [
        (vec!["--after", "not-a-cursor!"], "not a cursor token"),
        (vec!["--after", damaged.as_str()], "invalid cursor"),
        (vec!["--after", &token[..10]], "damaged"),
        (
            vec!["--after", token.as_str(), "-f", "class=permanent"],
            "made for another list",
        ),
        (
            vec![
                "--after",
                token.as_str(),
                "-f",
                "class=throttled",
                "--resolved",
            ],
            "made for another list",
        ),
        (
            vec!["--after", token.as_str(), "--offset", "7"],
            "cannot be used with",
        ),
    ] {
        let o = dlq_on(&db, &[&["list"][..], &args[..]].concat()).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}: no page");
    }
}

async fn list_show_stats_redrive_purge_over_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(sample()).await.unwrap();
    let db = path.to_str().unwrap().to_owned();

    // The provider the re-drive goes to.
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/v1/messages",
        post(move |headers: HeaderMap, body: String| {
            let log = Arc::clone(&log);
            async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                log.lock().unwrap().push((key, body));
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // list --json, with a filter.
    let o = dlq_on(&db, &["list", "--filter", "class=throttled", "--json"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let records: Vec<Record> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 5);
    assert!(records.iter().all(|r| r.class == "throttled"));

    // list as a table, by tag, paged.
    let o = dlq_on(&db, &["list", "-f", "tag.campaign=summer", "--limit", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("CLASS") && lines[0].contains("MESSAGE")
    );
    assert!(
        lines[1].starts_with("perm-") && lines[1].contains("http 400"),
        "{out}"
    );
    // Where the next page starts: a cursor, which reads the third and last.
    let more = stderr(&o);
    let token = after_token(&more).unwrap_or_else(|| panic!("no cursor: {more}"));
    let o = dlq_on(
        &db,
        &[
            "list",
            "-f",
            "tag.campaign=summer",
            "--limit",
            "2",
            "--after",
            &token,
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 2, "{}", stdout(&o));
    assert!(after_token(&stderr(&o)).is_none(), "the last page");

    // A bad filter is a usage error that says why.
    let o = dlq_on(&db, &["list", "-f", "colour=red"]).await;
    assert_eq!(o.status.code(), Some(2), "a bad command line");
    assert!(stderr(&o).contains("unknown filter key"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("host"),
        "the keys listed: {}",
        stderr(&o)
    );

    // show.
    let o = dlq_on(&db, &["show", "thr-3"]).await;
    let out = stdout(&o);
    assert!(
        out.contains("id              thr-3") && out.contains("{\"id\":\"thr-3\"}"),
        "{out}"
    );
    assert!(out.contains("history (oldest first, last 1)"), "{out}");
    // The headers: kept ones with their values, redacted ones by name only.
    assert!(out.contains("header          x-tenant: acme"), "{out}");
    assert!(
        out.contains("header          x-raw: (not UTF-8) hex:636166e9"),
        "{out}"
    );
    assert!(
        out.contains("header          authorization: (redacted, not stored)"),
        "{out}"
    );
    assert!(!out.contains("not-to-be-seen"), "{out}");
    let o = dlq_on(&db, &["show", "nope"]).await;
    assert!(!o.status.success());

    // stats: the dashboard, its window as written (24 hours read `24h`, not `1day`).
    let o = dlq_on(&db, &["stats", "--window", "24h"]).await;
    assert!(
        stdout(&o).starts_with("dead letters, last 24h (at "),
        "{}",
        stdout(&o)
    );
    let o = dlq_on(&db, &["stats", "--window", "1h"]).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.starts_with("dead letters, last 1h (at "), "{out}");
    assert!(
        out.contains("top classes") && out.contains("top codes"),
        "{out}"
    );
    let throttled = out
        .lines()
        .find(|l| l.trim_start().starts_with("throttled"))
        .unwrap();
    assert!(
        throttled.contains(" 5 ") && throttled.contains("62.5%"),
        "{throttled}"
    );
    assert!(
        out.contains("class throttled is 62% of recent dead letters"),
        "{out}"
    );
    // A new store has no history to compare with: no new-code alert, and it says so.
    assert!(!out.contains("new code"), "{out}");
    assert!(out.contains("(no history before the last 1h 5m"), "{out}");
    // With a dead letter from before the baseline, the codes of the window are new.
    let mut old = record(
        "old-0",
        "transient",
        Code::Http(http::StatusCode::BAD_GATEWAY),
        "winter",
    );
    old.first_failed_at -= std::time::Duration::from_secs(2 * 3600);
    old.last_failed_at = old.first_failed_at;
    old.history[0].at = old.first_failed_at;
    store.put(old).await.unwrap();
    let o = dlq_on(&db, &["stats", "--window", "1h"]).await;
    let out = stdout(&o);
    assert!(out.contains("new code \"http 429\""), "{out}");
    assert!(!out.contains("new code \"http 502\""), "{out}");
    assert!(
        out.contains("dead 8 "),
        "the old one is outside the window: {out}"
    );
    store.delete(&Filter::new().id("old-0")).await.unwrap();

    // redrive: refused without a filter.
    let o = dlq_on(
        &db,
        &["redrive", "--target", &target, "--rate", "10", "--max", "5"],
    )
    .await;
    assert_eq!(o.status.code(), Some(2), "a refusal");
    assert!(
        stderr(&o).contains("refusing to re-drive every dead letter"),
        "{}",
        stderr(&o)
    );
    // The rate and the maximum have defaults, which the help states.
    let help = dlq(&["redrive", "--help"]);
    let help = stdout(&help);
    assert!(
        help.contains("[default: 10]") && help.contains("[default: 100]"),
        "{help}"
    );

    // Three throttled ones at 100/s.
    let redrive_three = [
        "redrive",
        "--target",
        &target,
        "-f",
        "class=throttled",
        "--rate",
        "100",
        "--max",
        "3",
    ];
    // Dry run: lists, sends nothing.
    let o = dlq_on(&db, &[&redrive_three[..], &["--dry-run"]].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("would send thr-"))
            .count(),
        3,
        "{out}"
    );
    assert!(out.contains(&format!("POST {target}/v1/messages")), "{out}");
    assert!(seen.lock().unwrap().is_empty());

    // The real thing: 3 of them, to the target, with their keys.
    let o = dlq_on(&db, &redrive_three).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("re-drove 3: 3 resolved, 0 failed again, 0 skipped"),
        "{}",
        stdout(&o)
    );
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 3);
    for (key, body) in &sent {
        assert!(key.starts_with("thr-"));
        assert_eq!(body, &format!("{{\"id\":\"{key}\"}}"));
    }
    let resolved = store
        .search(&Filter::new().status(Status::Resolved), 0..10)
        .await
        .unwrap();
    assert_eq!(resolved.len(), 3);

    // list: outstanding first (dead, then deferred by due time); resolved only on request.
    let now = std::time::SystemTime::now();
    for (id, due) in [("def-late", 7200), ("def-soon", 3600)] {
        let f: Failure = Failure::new(Class::THROTTLED, Code::Timeout)
            .with_retry_after(std::time::Duration::from_secs(due));
        let mut r = record_of(id.to_owned(), Envelope::new("{}"), &f);
        assert_eq!(r.status, Status::Deferred);
        r.retry_at = Some(now + std::time::Duration::from_secs(due));
        store.put(r).await.unwrap();
    }
    let listed = |args: Vec<&'static str>| {
        let db = db.clone();
        async move {
            let o = dlq_on(&db, &[&["list", "--json"][..], &args[..]].concat()).await;
            assert!(o.status.success(), "{}", stderr(&o));
            stdout(&o)
                .lines()
                .map(|l| serde_json::from_str::<Record>(l).unwrap())
                .map(|r| (r.id, r.status))
                .collect::<Vec<_>>()
        }
    };
    let outstanding = listed(vec![]).await;
    assert_eq!(outstanding.len(), 2 + 3 + 2, "{outstanding:?}");
    assert!(outstanding[..5].iter().all(|(_, s)| *s == Status::Dead));
    assert_eq!(
        outstanding[5..],
        [
            ("def-soon".to_owned(), Status::Deferred),
            ("def-late".to_owned(), Status::Deferred)
        ]
    );
    let all = listed(vec!["--resolved"]).await;
    assert_eq!(all.len(), 10);
    assert_eq!(all[..7], outstanding[..]);
    assert!(all[7..].iter().all(|(_, s)| *s == Status::Resolved));
    let paged = listed(vec!["--offset", "4", "--limit", "2"]).await;
    assert_eq!(paged[..], outstanding[4..6]);
    assert_eq!(listed(vec!["-f", "status=resolved"]).await.len(), 3);
    store
        .delete(&Filter::new().id("def-late").id("def-soon"))
        .await
        .unwrap();

    // redrive without --target: each record goes to its own stored URI, at the default rate.
    let f: Failure = Failure::new(Class::THROTTLED, Code::Timeout);
    let own = record_of(
        "own-0".to_owned(),
        Envelope::new("{\"id\":\"own-0\"}")
            .with_metadata("method", "POST")
            .with_metadata("uri", format!("{target}/v1/messages"))
            .with_metadata("idempotency-key", "own-0"),
        &f,
    );
    store.put(own).await.unwrap();
    let o = dlq_on(&db, &["redrive", "-f", "id=own-0"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("re-drove 1: 1 resolved"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        seen.lock().unwrap().last().cloned(),
        Some(("own-0".to_owned(), "{\"id\":\"own-0\"}".to_owned()))
    );
    store.delete(&Filter::new().id("own-0")).await.unwrap();

    // purge: asks for --yes first.
    let o = dlq_on(&db, &["purge", "-f", "class=permanent"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("3 dead letters match; add --yes"),
        "{}",
        stderr(&o)
    );
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 8);
    let o = dlq_on(&db, &["purge", "-f", "class=permanent", "--yes"]).await;
    assert!(
        stdout(&o).contains("deleted 3 dead letters"),
        "{}",
        stdout(&o)
    );
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 5);
    let trail = store.audit(0..10).await.unwrap();
    assert_eq!(
        (
            trail[0].action.as_str(),
            trail[0].filter.as_str(),
            trail[0].sent
        ),
        ("purge", "class=permanent", 3),
        "the purge is in the audit trail"
    );
    let o = dlq_on(&db, &["purge", "--yes"]).await;
    assert_eq!(o.status.code(), Some(2), "no purge of everything");

    // A missing store is an error, not a new empty file.
    let missing = dir.path().join("missing.db");
    let o = dlq_on(missing.to_str().unwrap(), &["stats"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no dead-letter store at"));
    assert!(!missing.exists());
}

#[cfg(feature = "redis")]
async fn list_and_stats_over_redis() {
    let store = redis_support::redis_store("cli").await;
    store.put_many(sample()).await.unwrap();
    let url = redis_support::redis_url();
    let prefix = store.prefix().to_owned();
    let (list, stats) = tokio::task::spawn_blocking(move || {
        (
            dlq(&[
                "--store",
                &url,
                "--prefix",
                &prefix,
                "list",
                "-f",
                "class=permanent",
                "--json",
            ]),
            dlq(&["--store", &url, "--prefix", &prefix, "stats"]),
        )
    })
    .await
    .unwrap();
    assert!(list.status.success(), "{}", stderr(&list));
    assert_eq!(stdout(&list).lines().count(), 3);
    assert!(stdout(&stats).contains("permanent"), "{}", stdout(&stats));
    store
        .delete(&Filter::new().tag("campaign", "spring"))
        .await
        .unwrap();
    store
        .delete(&Filter::new().tag("campaign", "summer"))
        .await
        .unwrap();
}

async fn reconcile_asks_a_status_endpoint_about_outcome_unknown_records() {
    use axum::extract::Path;
    let router = axum::Router::new().route(
        "/v1/messages/{id}",
        axum::routing::get(|Path(id): Path<String>| async move {
            match id.as_str() {
                "evt a/1" => axum::http::StatusCode::OK,
                "evt-b" => axum::http::StatusCode::NOT_FOUND,
                _ => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dl.db").display().to_string();
    let store = SqliteStore::open(&db).unwrap();
    let unknown = |id: &str| {
        let f: Failure = Failure::new(Class::OUTCOME_UNKNOWN, Code::Timeout);
        record_of(
            id.to_owned(),
            Envelope::new(format!("{{\"message\":\"{id}\"}}")),
            &f,
        )
    };
    store
        .put_many(vec![
            unknown("evt a/1"),
            unknown("evt-b"),
            unknown("evt-c"),
            record(
                "thr-0",
                "throttled",
                Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
                "x",
            ),
        ])
        .await
        .unwrap();

    let o = dlq_on(
        &db,
        &["reconcile", "--status-url", &format!("{base}/v1/messages")],
    )
    .await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("{id}"), "{}", stderr(&o));

    let url = format!("{base}/v1/messages/{{id}}");
    let o = dlq_on(
        &db,
        &[
            "reconcile",
            "--status-url",
            &url,
            "--id-from-json",
            "message",
        ],
    )
    .await;
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("evt a/1  delivered: resolved"), "{out}");
    assert!(out.contains("evt-b  not delivered"), "{out}");
    assert!(out.contains("evt-c  still unknown"), "{out}");
    assert!(
        out.contains("reconciled 3: 1 delivered, 1 not delivered, 1 still unknown, 0 skipped"),
        "{out}"
    );
    let get = |id: &'static str| {
        let store = store.clone();
        async move { store.get(id).await.unwrap().unwrap() }
    };
    assert_eq!(get("evt a/1").await.status, Status::Resolved);
    assert_eq!(get("evt-b").await.status, Status::Deferred);
    assert_eq!(get("evt-c").await.status, Status::Dead);
    assert_eq!(
        get("thr-0").await.status,
        Status::Dead,
        "other classes untouched"
    );
}

#[cfg(feature = "redis")]
async fn a_redis_password_never_shows_in_the_cli() {
    for store in [
        "redis://:hunter2@127.0.0.1:1/0",
        "redis://user:hunter2@127.0.0.1:notaport/0",
    ] {
        let o = dlq_on(store, &["list"]).await;
        assert!(!o.status.success());
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("***@127.0.0.1"), "{text}");
    }
}

async fn a_closed_pipe_ends_the_tool_quietly() {
    // `backstop-dlq show … | head -1`: the reader is gone before the tool writes. It must end
    // with success and no panic, as the shell tools do, not "failed printing to stdout".
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    SqliteStore::open(&path)
        .unwrap()
        .put_many(sample())
        .await
        .unwrap();
    let db = path.to_str().unwrap().to_owned();
    for args in [
        vec!["show", "thr-3"],
        vec!["list"],
        vec!["stats", "--window", "24h"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut command = Command::new(env!("CARGO_BIN_EXE_backstop-dlq"));
        command
            .arg("--store")
            .arg(&db)
            .args(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped());
        let o = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
    }
}

/// `prune`: a dry run counts, the real run removes the records beyond the retention (old ones
/// by age, then the oldest beyond the count), never a deferred record; a bad age is refused.
async fn prune_removes_what_the_retention_no_longer_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl.db");
    let db = path.to_str().unwrap().to_owned();
    let store = SqliteStore::open(&path).unwrap();
    let now = std::time::SystemTime::now();
    let day = std::time::Duration::from_secs(24 * 3600);
    let mut records = Vec::new();
    for i in 0..6u32 {
        let mut r = record(
            &format!("m-{i}"),
            "throttled",
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            "spring",
        );
        // m-0 and m-1 are 40 days old, the rest 1 to 4 days.
        r.last_failed_at = now - day * if i < 2 { 40 } else { 6 - i };
        if i == 1 {
            r.status = Status::Deferred;
            r.retry_at = Some(now);
        }
        records.push(r);
    }
    store.put_many(records).await.unwrap();

    let o = dlq_on(&db, &["prune", "--max-records", "2", "--dry-run"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("would remove 4 records: 1 older than 30days, 3 beyond 2 records"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        store.count(&Filter::new()).await.unwrap(),
        6,
        "a dry run removes nothing"
    );

    let o = dlq_on(&db, &["prune", "--max-records", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("removed 4 records: 1 older than 30days, 3 beyond 2 records"),
        "{}",
        stdout(&o)
    );
    let mut left: Vec<String> = store
        .search(&Filter::new(), 0..100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["m-1", "m-5"],
        "the newest kept, and the deferred one"
    );

    // The prune is in the audit trail, by the OS user (`$USER`).
    let o = dlq_on(&db, &["audit"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let user = OS_USER;
    let out = stdout(&o);
    let line = out.lines().nth(1).unwrap_or_default();
    assert!(
        line.contains(user)
            && line.contains("prune")
            && line.contains("removed 1 older than 30days and 3 beyond 2 records"),
        "{out}"
    );
    let o = dlq_on(&db, &["audit", "--json"]).await;
    let entry: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(entry["action"], "prune");
    assert_eq!(entry["sent"], 4);

    let o = dlq_on(&db, &["prune", "--max-age", "a while"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("is not a duration"), "{}", stderr(&o));
}

/// A message already delivered (a resolved record) is not re-driven by accident: the dry run
/// warns and says it would skip it, the run skips it and exits with status 2 sending nothing,
/// and only `--include-resolved` sends it again, once, with an audit entry that says so.
async fn a_delivered_message_is_sent_again_only_with_include_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(sample()).await.unwrap();
    for id in ["thr-0", "thr-1"] {
        store
            .update(
                id,
                Change::Resolved {
                    at: std::time::SystemTime::now(),
                },
            )
            .await
            .unwrap();
    }
    let db = path.to_str().unwrap().to_owned();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/v1/messages",
        post(move |headers: HeaderMap| {
            let log = Arc::clone(&log);
            async move {
                let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                log.lock().unwrap().push(key);
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let redrive = |extra: &[&str]| {
        let mut args = vec![
            "redrive",
            "--target",
            target.as_str(),
            "-f",
            "status=resolved",
            "-f",
            "class=throttled",
            "--rate",
            "100",
        ];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let db = db.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            dlq_on(&db, &args).await
        }
    };
    let help = stdout(&dlq(&["redrive", "--help"]));
    assert!(help.contains("--include-resolved"), "{help}");

    // The dry run: no "would send" for them, a warning with the count.
    let o = redrive(&["--dry-run"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(!out.contains("would send"), "{out}");
    assert_eq!(
        out.lines()
            .filter(
                |l| l.starts_with("would skip thr-") && l.contains("already delivered (resolved)")
            )
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(
            "warning: 2 of these 2 records were already delivered (resolved): they would be \
             skipped, not sent; pass --include-resolved to send them again"
        ),
        "{out}"
    );
    assert!(
        out.contains("dry run: 0 would be sent, nothing sent"),
        "{out}"
    );

    // The run without the flag: refused, status 2, nothing sent, the records as they were.
    let o = redrive(&[]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let out = stdout(&o);
    for id in ["thr-0", "thr-1"] {
        assert!(
            out.contains(&format!("{id}  skipped: already delivered (resolved)")),
            "{out}"
        );
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 0));
    }
    assert!(
        out.contains("re-drove 2: 0 resolved, 0 failed again, 2 skipped"),
        "{out}"
    );
    assert!(
        stderr(&o).contains(
            "refused to send again 2 already delivered (resolved): pass --include-resolved"
        ),
        "{}",
        stderr(&o)
    );
    assert!(seen.lock().unwrap().is_empty());
    let entry = store.audit(0..1).await.unwrap().remove(0);
    assert_eq!((entry.actor.as_str(), entry.sent), (OS_USER, 0));
    assert!(
        entry
            .outcome
            .contains("skipped 2 already delivered (resolved)"),
        "{}",
        entry.outcome
    );

    // The dry run with the flag warns that they would be sent again.
    let o = redrive(&["--dry-run", "--include-resolved"]).await;
    let out = stdout(&o);
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("would send again thr-"))
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(
            "warning: 2 of these 2 records were already delivered (resolved) and would be sent \
             again, on purpose (--include-resolved)"
        ),
        "{out}"
    );
    assert!(out.contains("dry run: 2 would be sent"), "{out}");
    assert!(seen.lock().unwrap().is_empty());

    // On purpose: each sent once, resolved again, and the audit entry says it was deliberate.
    let o = redrive(&["--include-resolved"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("re-drove 2: 2 resolved, 0 failed again, 0 skipped"),
        "{}",
        stdout(&o)
    );
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ["thr-0", "thr-1"]);
    for id in ["thr-0", "thr-1"] {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 1));
    }
    let o = dlq_on(&db, &["audit", "--json"]).await;
    let entry: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(entry["action"], "redrive");
    assert_eq!(entry["actor"], OS_USER);
    assert_eq!(entry["sent"], 2);
    assert_eq!(
        entry["outcome"],
        "resolved 2, failed 0, skipped 0; deliberately re-sent 2 already delivered \
         (include_resolved)"
    );
    assert_eq!(
        entry["filter"], "class=throttled status=resolved",
        "the filter as given"
    );
}

/// `--actor`, else `$USER`, else `$LOGNAME` names who acts; with none of them every action that
/// audits is refused (status 2) and changes nothing, while dry runs and reads need no actor.
async fn the_actor_is_named_or_the_action_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(sample()).await.unwrap();
    let db = path.to_str().unwrap().to_owned();
    let run = |args: Vec<&str>, env: Vec<(&'static str, Option<&'static str>)>| {
        let mut all = vec!["--store".to_owned(), db.clone()];
        all.extend(args.iter().map(|s| s.to_string()));
        tokio::task::spawn_blocking(move || {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            dlq_env(&all, &env)
        })
    };
    let nobody = || vec![("USER", None), ("LOGNAME", None)];

    for args in [
        vec!["purge", "-f", "class=permanent", "--yes"],
        vec!["prune", "--max-records", "1"],
        vec![
            "redrive",
            "-f",
            "class=throttled",
            "--target",
            "http://127.0.0.1:1",
        ],
        vec!["serve", "--allow-actions", "--bind", "127.0.0.1:0"],
    ] {
        let o = run(args.clone(), nobody()).await.unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("refusing to") && err.contains("add --actor NAME"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unknown user"), "{err}");
    }
    assert_eq!(
        store.count(&Filter::new()).await.unwrap(),
        8,
        "nothing removed"
    );
    assert!(
        store
            .search(&Filter::new().status(Status::Dead), 0..10)
            .await
            .unwrap()
            .iter()
            .all(|r| r.resends == 0),
        "nothing re-driven"
    );
    assert!(
        store.audit(0..10).await.unwrap().is_empty(),
        "nothing audited"
    );

    // Dry runs and reads need no actor.
    for args in [
        vec!["prune", "--dry-run"],
        vec!["redrive", "-f", "class=throttled", "--dry-run"],
        vec!["list"],
        vec!["audit"],
    ] {
        let o = run(args.clone(), nobody()).await.unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }

    // $LOGNAME when $USER is not set; --actor over $USER, before or after the command.
    let actor_of_last = || async { store.audit(0..1).await.unwrap()[0].actor.clone() };
    let o = run(
        vec!["purge", "-f", "id=perm-0", "--yes"],
        vec![("USER", None), ("LOGNAME", Some("log-user"))],
    )
    .await
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(actor_of_last().await, "log-user");
    let o = run(
        vec!["purge", "-f", "id=perm-1", "--yes", "--actor", "alice"],
        vec![("USER", Some("os-user"))],
    )
    .await
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(actor_of_last().await, "alice");
    let o = run(
        vec!["--actor", "bob", "prune", "--max-records", "5"],
        nobody(),
    )
    .await
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(actor_of_last().await, "bob");
    let o = run(
        vec!["purge", "-f", "id=perm-2", "--yes", "--actor", " "],
        nobody(),
    )
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "an empty name is a usage error");
    assert!(stderr(&o).contains("--actor"), "{}", stderr(&o));
    assert!(store.get("perm-2").await.unwrap().is_some());
}

/// Records to two hosts, one of whose breakers deferred a record until later.
fn two_hosts(now: std::time::SystemTime) -> Vec<Record> {
    let mut records = Vec::new();
    for (id, uri) in [
        ("a-0", "https://a.test/v1/messages"),
        ("a-1", "https://A.test:443/v1/messages"),
        ("b-0", "http://b.test:8025/v1/messages"),
        ("b-1", "http://b.test:8025/v1/messages"),
    ] {
        let mut r = record(
            id,
            "transient",
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
            "spring",
        );
        r.metadata.insert("uri".into(), uri.into());
        records.push(r);
    }
    let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
    let mut held = record_of(
        "b-2".to_owned(),
        Envelope::new("{}")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://b.test:8025/v1/messages"),
        &f,
    );
    held.status = Status::Deferred;
    held.breaker = Some("b.test:8025".into());
    held.retry_at = Some(now + std::time::Duration::from_secs(600));
    records.push(held);
    records
}

/// `list` and `show` name each record's host; `--filter host=…` narrows any command to one
/// host; a dry run warns of a host whose breaker the store knows is open; `stats` lists it.
async fn list_and_show_name_the_host_and_filter_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    let now = std::time::SystemTime::now();
    let records = two_hosts(now);
    let until = records[4].retry_at.unwrap();
    store.put_many(records).await.unwrap();
    let db = path.to_str().unwrap().to_owned();

    let o = dlq_on(&db, &["list"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out.lines().next().unwrap();
    assert!(header.starts_with("ID") && header.contains("HOST"), "{out}");
    for line in out.lines().skip(1) {
        let host = if line.starts_with("a-") {
            "a.test:443"
        } else {
            "b.test:8025"
        };
        assert!(line.contains(host), "{line}");
    }
    let o = dlq_on(&db, &["show", "b-0"]).await;
    assert!(
        stdout(&o).contains("host            b.test:8025"),
        "{}",
        stdout(&o)
    );

    let listed = |args: Vec<&'static str>| {
        let db = db.clone();
        async move {
            let o = dlq_on(&db, &[&["list", "--json"][..], &args[..]].concat()).await;
            assert!(o.status.success(), "{}", stderr(&o));
            let mut ids: Vec<String> = stdout(&o)
                .lines()
                .map(|l| serde_json::from_str::<Record>(l).unwrap().id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(
        listed(vec!["-f", "host=b.test"]).await,
        ["b-0", "b-1", "b-2"]
    );
    assert_eq!(listed(vec!["-f", "host=A.TEST:443"]).await, ["a-0", "a-1"]);
    assert_eq!(
        listed(vec!["-f", "host=b.test", "-f", "status=deferred"]).await,
        ["b-2"]
    );
    assert!(listed(vec!["-f", "host=b.test:80"]).await.is_empty());
    let o = dlq_on(&db, &["list", "-f", "host="]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("filter host: empty"), "{}", stderr(&o));

    // A dry run into b.test's open breaker warns, with the count and the store's retry-at.
    let o = dlq_on(&db, &["redrive", "-f", "host=b.test", "--dry-run"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("warning: 3 of these 3 records go to b.test:8025, whose breaker is open"),
        "{out}"
    );
    assert!(
        out.contains(&humantime::format_rfc3339_seconds(until).to_string()),
        "{out}"
    );
    assert!(out.contains("dry run: 3 would be sent"), "{out}");
    let o = dlq_on(&db, &["redrive", "-f", "host=a.test", "--dry-run"]).await;
    assert!(!stdout(&o).contains("warning"), "{}", stdout(&o));
    let o = dlq_on(&db, &["stats"]).await;
    let out = stdout(&o);
    assert!(
        out.contains("breakers (from the deferred records they rejected):"),
        "{out}"
    );
    assert!(
        out.contains("  b.test:8025  open  1 deferred  the store holds"),
        "{out}"
    );

    // A purge of one host removes its records only.
    let o = dlq_on(&db, &["purge", "-f", "host=a.test"]).await;
    assert!(
        stderr(&o).contains("2 dead letters match"),
        "{}",
        stderr(&o)
    );
    let o = dlq_on(&db, &["purge", "-f", "host=a.test", "--yes"]).await;
    assert!(
        stdout(&o).contains("deleted 2 dead letters"),
        "{}",
        stdout(&o)
    );
    assert_eq!(listed(vec![]).await, ["b-0", "b-1", "b-2"]);
}

/// `serve --allow-actions --actor NAME`: the board acts as that name, and its purges are audited
/// under it.
async fn serve_acts_as_the_named_actor() {
    use std::io::BufRead as _;
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(sample()).await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_backstop-dlq"))
        .args([
            "--store",
            path.to_str().unwrap(),
            "serve",
            "--allow-actions",
        ])
        .args(["--actor", "carol", "--bind", "127.0.0.1:0"])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("actions allowed, as carol"), "{line}");
    let base = line
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end()
        .trim_end_matches(" (actions allowed, as carol)");
    let base = format!("http://{}", base.trim_end_matches('/'));

    let client = reqwest::Client::new();
    let page = client
        .get(format!("{base}/records?class=permanent"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("acting as carol"), "{page}");
    let token = csrf(&page);
    let r = client
        .post(format!("{base}/purge/run"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={token}&class=permanent"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("Deleted 3 records."));
    child.kill().unwrap();
    child.wait().unwrap();
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!((audit[0].actor.as_str(), audit[0].sent), ("carol", 3));
}

/// An operator's override for the fleet: `breaker force-open` writes the note every process
/// reads and the audit entry with the actor; `breaker list` shows it beside what a process
/// says; an override without an actor, or longer than 7 days, is refused and writes nothing.
async fn breaker_overrides_are_written_for_the_fleet_and_audited() {
    use std::time::Duration;
    use tower_backstop::breaker::{FleetOverride, OverrideAction};
    use tower_backstop::store::{AuditAction, FleetNote};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    let db = path.to_str().unwrap().to_owned();
    let now = std::time::SystemTime::now();
    store
        .put_note(FleetNote::new(
            "breaker:api.mail.test:443",
            "web-1",
            r#"{"v":1,"state":"open","own":true}"#,
            now,
            Duration::from_secs(60),
        ))
        .await
        .unwrap();

    let o = dlq_on(
        &db,
        &[
            "--actor",
            "alice",
            "breaker",
            "force-open",
            "api.mail.test:443",
            "--for",
            "2h",
            "--reason",
            "provider maintenance",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("api.mail.test:443 for the fleet"),
        "{}",
        stdout(&o)
    );
    let notes = store.notes(std::time::SystemTime::now()).await.unwrap();
    let over = notes
        .iter()
        .find_map(FleetOverride::from_note)
        .expect("an override note");
    assert_eq!(over.action, OverrideAction::ForceOpen);
    assert_eq!(
        (over.actor.as_str(), over.reason.as_str()),
        ("alice", "provider maintenance")
    );
    let lasts = over.until.duration_since(over.at).unwrap();
    assert_eq!(lasts, Duration::from_secs(7_200));
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (
            audit[0].action,
            audit[0].actor.as_str(),
            audit[0].filter.as_str()
        ),
        (AuditAction::Breaker, "alice", "breaker=api.mail.test:443")
    );
    assert!(
        audit[0].outcome.contains("force_open until"),
        "{}",
        audit[0].outcome
    );

    let o = dlq_on(&db, &["breaker", "list"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("api.mail.test:443  override by alice: force_open until"),
        "{out}"
    );
    assert!(out.contains("api.mail.test:443  web-1: "), "{out}");

    // Refused, nothing written: no actor; too long; no reason.
    let path_s = db.clone();
    let o = tokio::task::spawn_blocking(move || {
        dlq_env(
            &[
                "--store", &path_s, "breaker", "disable", "x:1", "--reason", "r",
            ],
            &[("USER", None), ("LOGNAME", None)],
        )
    })
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = dlq_on(
        &db,
        &[
            "breaker", "disable", "x:1", "--for", "8days", "--reason", "r",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("at most 7 days"), "{}", stderr(&o));
    let o = dlq_on(&db, &["breaker", "reset", "x:1"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        store.audit(0..10).await.unwrap().len(),
        1,
        "nothing more written"
    );
    let overrides = store
        .notes(std::time::SystemTime::now())
        .await
        .unwrap()
        .iter()
        .filter(|n| n.topic.starts_with("override:"))
        .count();
    assert_eq!(overrides, 1);
}

/// `check-counts` over a SQLite file: clean (status 0); a counter changed by hand is printed
/// with what was expected and found (status 3, nothing changed); `--repair` sets it (status 0),
/// and the next check is clean.
async fn check_counts_reports_and_repairs_a_drifted_counter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(sample()).await.unwrap();
    store.close();
    let db = path.to_str().unwrap().to_owned();
    let o = dlq_on(&db, &["check-counts"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("counts agree with the records"),
        "{}",
        stdout(&o)
    );
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "UPDATE dead_letter_counts SET n = n + 4 WHERE status = 'dead' AND class = 'throttled'",
        )
        .unwrap();
    for _ in 0..2 {
        let o = dlq_on(&db, &["check-counts"]).await;
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let out = stdout(&o);
        let line = out
            .lines()
            .find(|l| l.contains("throttled"))
            .unwrap_or_else(|| panic!("no drift printed: {out}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"dead"), "{line}");
        assert_eq!(
            words[words.len() - 2..],
            ["5", "9"],
            "expected, found: {line}"
        );
        assert!(out.contains("1 drifted counters"), "{out}");
        assert!(out.contains("--repair"), "{out}");
    }
    let o = dlq_on(&db, &["check-counts", "--repair"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("1 drifted counters repaired"),
        "{}",
        stdout(&o)
    );
    let o = dlq_on(&db, &["check-counts"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = dlq_on(&db, &["stats"]).await;
    assert!(stdout(&o).contains("throttled"), "{}", stdout(&o));
    let reopened = SqliteStore::open(&path).unwrap();
    assert_eq!(
        reopened.count_by_class().await.unwrap(),
        [("throttled".to_owned(), 5), ("permanent".to_owned(), 3)]
    );
}

fn main() {
    let mut tests = Tests::new();
    tests.multi_thread(
        "list_show_stats_redrive_purge_over_sqlite",
        list_show_stats_redrive_purge_over_sqlite,
    );
    tests.multi_thread("list_pages_by_cursor", list_pages_by_cursor);
    #[cfg(feature = "redis")]
    tests
        .needs(backstop_test_support::Service::Redis)
        .multi_thread("list_and_stats_over_redis", list_and_stats_over_redis);
    tests.current(
        "reconcile_asks_a_status_endpoint_about_outcome_unknown_records",
        reconcile_asks_a_status_endpoint_about_outcome_unknown_records,
    );
    #[cfg(feature = "redis")]
    tests.current(
        "a_redis_password_never_shows_in_the_cli",
        a_redis_password_never_shows_in_the_cli,
    );
    tests.multi_thread(
        "a_closed_pipe_ends_the_tool_quietly",
        a_closed_pipe_ends_the_tool_quietly,
    );
    tests.multi_thread(
        "prune_removes_what_the_retention_no_longer_keeps",
        prune_removes_what_the_retention_no_longer_keeps,
    );
    tests.multi_thread(
        "a_delivered_message_is_sent_again_only_with_include_resolved",
        a_delivered_message_is_sent_again_only_with_include_resolved,
    );
    tests.multi_thread(
        "the_actor_is_named_or_the_action_refused",
        the_actor_is_named_or_the_action_refused,
    );
    tests.multi_thread(
        "list_and_show_name_the_host_and_filter_by_it",
        list_and_show_name_the_host_and_filter_by_it,
    );
    tests.multi_thread(
        "breaker_overrides_are_written_for_the_fleet_and_audited",
        breaker_overrides_are_written_for_the_fleet_and_audited,
    );
    tests.multi_thread(
        "check_counts_reports_and_repairs_a_drifted_counter",
        check_counts_reports_and_repairs_a_drifted_counter,
    );
    tests.multi_thread(
        "serve_acts_as_the_named_actor",
        serve_acts_as_the_named_actor,
    );
    tests.run();
}
