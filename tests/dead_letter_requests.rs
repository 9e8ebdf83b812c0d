//! Whole requests: a dead letter keeps the method, URI, every header (secrets redacted, their
//! values never written) and the body, and a re-drive sends all of it again.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use tower_backstop::resend::{Redrive, http_request, http_request_restoring};
use tower_backstop::store::{Filter, SqliteStore, Store};
use tower_backstop::{BoxError, Class, Code, Failure};

const SECRET: &str = "s3cret-Zq9";

/// The request of the issue: gzip body, a tenant, an idempotency key, and secrets.
fn webhook() -> Request<Full<Bytes>> {
    Request::post("http://provider.test/v1/events?batch=7")
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .header("x-tenant", "acme")
        .header("idempotency-key", "evt-42")
        .header("authorization", format!("Bearer {SECRET}"))
        .header("cookie", format!("session={SECRET}"))
        .header("X-Api-Key", SECRET)
        .header("x-trace", "one")
        .header("x-trace", "two")
        .header("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap())
        .body(Full::new(Bytes::from_static(b"\x1f\x8b\x08\x00gzip-bytes")))
        .unwrap()
}

/// A provider that answers 500 and keeps what it received.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<(http::Method, http::Uri, HeaderMap)>>>,
}

impl Provider {
    fn failing(
        &self,
    ) -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = http::Response<()>,
        Error = Failure<http::Response<()>>,
        Future = impl Send,
    > + Clone {
        let seen = Arc::clone(&self.seen);
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            seen.lock().unwrap().push((
                req.method().clone(),
                req.uri().clone(),
                req.headers().clone(),
            ));
            async move {
                Err::<http::Response<()>, _>(Failure::new(
                    Class::UNKNOWN,
                    Code::Http(http::StatusCode::INTERNAL_SERVER_ERROR),
                ))
            }
        })
    }

    fn ok(
        &self,
    ) -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = http::Response<()>,
        Error = BoxError,
        Future = impl Send,
    > + Clone {
        let seen = Arc::clone(&self.seen);
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            seen.lock().unwrap().push((
                req.method().clone(),
                req.uri().clone(),
                req.headers().clone(),
            ));
            async move { Ok::<_, BoxError>(http::Response::new(())) }
        })
    }

    fn last(&self) -> (http::Method, http::Uri, HeaderMap) {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

fn every_file_in(dir: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        all.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    all
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn a_dead_letter_keeps_every_header_but_the_secrets_and_redrive_sends_them_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("dl.db")).unwrap();
    let provider = Provider::default();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(provider.failing());
    let failure = svc.oneshot(webhook()).await.unwrap_err();
    assert!(matches!(
        failure.note::<DeadLetterStatus>(),
        Some(DeadLetterStatus::Stored { id }) if id == "evt-42"
    ));

    let r = store.get("evt-42").await.unwrap().unwrap();
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "content-type",
            "content-encoding",
            "x-tenant",
            "idempotency-key",
            "x-trace",
            "x-trace",
            "x-raw"
        ]
    );
    assert_eq!(r.headers[6].1, b"caf\xe9");
    assert_eq!(r.redacted_headers, ["authorization", "cookie", "x-api-key"]);
    assert_eq!(r.metadata["method"], "POST");
    assert_eq!(r.metadata["uri"], "http://provider.test/v1/events?batch=7");
    // Redacted values are never written: not in the database file, its WAL, or the JSON form.
    assert!(!contains(&every_file_in(dir.path()), SECRET));
    assert!(!serde_json::to_string(&r).unwrap().contains(SECRET));
    // The JSON form round-trips the non-UTF-8 value exactly.
    let json = serde_json::to_string(&r).unwrap();
    assert_eq!(
        serde_json::from_str::<tower_backstop::store::Record>(&json).unwrap(),
        r
    );

    // Re-drive: every kept header goes again, the authorization comes back from the hook,
    // the cookie and the API key (no hook answer) stay out.
    let report = Redrive::new(Filter::new().id("evt-42"), 100, 1)
        .unwrap()
        .run(&store, provider.ok(), |record| {
            http_request_restoring(record, None, |name, record| {
                (name == "authorization").then(|| {
                    HeaderValue::from_str(&format!("Bearer re-signed-for-{}", record.id)).unwrap()
                })
            })
        })
        .await
        .unwrap();
    assert_eq!(report.resolved(), 1);
    let (method, uri, headers) = provider.last();
    assert_eq!(method, http::Method::POST);
    assert_eq!(uri, "http://provider.test/v1/events?batch=7");
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["x-tenant"], "acme");
    assert_eq!(headers["idempotency-key"], "evt-42");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-raw"].as_bytes(), b"caf\xe9");
    let traces: Vec<&HeaderValue> = headers.get_all("x-trace").iter().collect();
    assert_eq!(traces, ["one", "two"]);
    assert_eq!(headers["authorization"], "Bearer re-signed-for-evt-42");
    assert!(!headers.contains_key("cookie"));
    assert!(!headers.contains_key("x-api-key"));
    assert_eq!(headers.len(), 8);

    // Without a hook, nothing redacted is sent, and nothing else is lost.
    let plain = http_request(&r, None).unwrap();
    assert!(!plain.headers().contains_key("authorization"));
    assert_eq!(plain.headers()["x-tenant"], "acme");
}

#[tokio::test]
async fn the_redaction_list_is_configurable() {
    let store = tower_backstop::store::MemoryStore::new();
    let provider = Provider::default();
    let svc = ServiceBuilder::new()
        .layer(
            DeadLetterLayer::new(store.clone())
                .redact_header("X-Tenant")
                .keep_header("cookie"),
        )
        .service(provider.failing());
    let _ = svc.oneshot(webhook()).await.unwrap_err();
    let r = store.get("evt-42").await.unwrap().unwrap();
    assert_eq!(
        r.redacted_headers,
        ["x-tenant", "authorization", "x-api-key"]
    );
    let cookie = r.headers.iter().find(|(n, _)| n == "cookie").unwrap();
    assert_eq!(cookie.1, format!("session={SECRET}").into_bytes());
    assert!(!r.headers.iter().any(|(n, _)| n == "x-tenant"));

    // Redacting nothing writes even the credentials.
    let store = tower_backstop::store::MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).keep_all_headers())
        .service(provider.failing());
    let _ = svc.oneshot(webhook()).await.unwrap_err();
    let r = store.get("evt-42").await.unwrap().unwrap();
    assert!(r.redacted_headers.is_empty(), "{:?}", r.redacted_headers);
    assert!(r.headers.iter().any(|(n, _)| n == "authorization"));
}

#[tokio::test]
async fn a_stored_header_that_is_not_valid_http_is_a_clear_rebuild_error() {
    let store = tower_backstop::store::MemoryStore::new();
    let provider = Provider::default();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(provider.failing());
    let _ = svc.oneshot(webhook()).await.unwrap_err();
    let mut r = store.get("evt-42").await.unwrap().unwrap();
    r.headers.push(("bad name".into(), b"x".to_vec()));
    let err = http_request(&r, None).unwrap_err();
    assert!(err.to_string().contains("bad stored header name"), "{err}");
    r.headers.pop();
    r.headers.push(("x-ok".into(), b"line\nbreak".to_vec()));
    let err = http_request(&r, None).unwrap_err();
    assert!(
        err.to_string().contains("bad stored value of header x-ok"),
        "{err}"
    );
}

/// The dead-letter table of schema version 2, and one record in it.
const V2_COLUMNS: &str = "id TEXT PRIMARY KEY, class TEXT NOT NULL, code TEXT NOT NULL,
    message TEXT NOT NULL, attempts INTEGER NOT NULL, budget_spent INTEGER NOT NULL,
    first_failed_at_ms INTEGER NOT NULL, last_failed_at_ms INTEGER NOT NULL,
    retry_at_ms INTEGER, status TEXT NOT NULL, resends INTEGER NOT NULL,
    resolved_at_ms INTEGER, history TEXT NOT NULL, tags TEXT NOT NULL,
    payload BLOB NOT NULL, payload_truncated INTEGER NOT NULL,
    payload_len INTEGER NOT NULL, content_type TEXT, metadata TEXT NOT NULL";
const V2_ROW: &str = "'old', 'transient', 'http 503', 'm', 1, 1, 0, 0, NULL, 'dead', 0, NULL, \
    '[]', '{}', X'6869', 0, 2, NULL, '{\"method\":\"POST\",\"uri\":\"http://a.test/\"}'";

/// A store written by the previous schema (version 2, no headers) opens, reads, and takes
/// headers from then on.
#[tokio::test]
async fn a_version_2_sqlite_store_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE dead_letters ({V2_COLUMNS});
             INSERT INTO dead_letters VALUES ({V2_ROW});
             PRAGMA user_version = 2;"
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let old = store.get("old").await.unwrap().unwrap();
    assert!(old.headers.is_empty() && old.redacted_headers.is_empty());
    assert_eq!(old.payload, b"hi");
    let provider = Provider::default();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(provider.failing());
    let _ = svc.oneshot(webhook()).await.unwrap_err();
    let new = store.get("evt-42").await.unwrap().unwrap();
    assert_eq!(new.headers.len(), 7);
}

/// A store written by schema version 3 (headers, no root cause and no breaker) opens, reads its
/// records with neither, and keeps both from then on.
#[tokio::test]
async fn a_version_3_sqlite_store_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE dead_letters ({V2_COLUMNS},
                headers TEXT NOT NULL DEFAULT '[]', redacted_headers TEXT NOT NULL DEFAULT '[]');
             INSERT INTO dead_letters VALUES ({V2_ROW}, '[[\"x-a\",\"utf8:b\"]]', '[]');
             PRAGMA user_version = 3;"
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let old = store.get("old").await.unwrap().unwrap();
    assert_eq!((old.cause, old.breaker), (None, None));
    assert_eq!(old.headers, [("x-a".to_owned(), b"b".to_vec())]);
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 6, "upgraded to the current schema");
    let provider = Provider::default();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(provider.failing());
    let _ = svc.oneshot(webhook()).await.unwrap_err();
    let new = store.get("evt-42").await.unwrap().unwrap();
    let cause = new.cause.expect("a real failure is its own root cause");
    assert_eq!((cause.class, cause.code), (new.class, new.code));
}

/// A store written by schema version 4 (no audit trail) opens with an empty trail, and keeps
/// one from then on; the file is at the current version (6) after.
#[tokio::test]
async fn a_version_4_sqlite_store_gains_an_audit_trail() {
    use tower_backstop::store::{AuditAction, AuditEntry, Filter, Store};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE dead_letters ({V2_COLUMNS},
                headers TEXT NOT NULL DEFAULT '[]', redacted_headers TEXT NOT NULL DEFAULT '[]',
                cause TEXT, breaker TEXT);
             INSERT INTO dead_letters VALUES ({V2_ROW}, '[]', '[]', NULL, NULL);
             PRAGMA user_version = 4;"
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get("old").await.unwrap().is_some());
    assert!(store.audit(0..10).await.unwrap().is_empty());
    store
        .append_audit(AuditEntry::new(
            AuditAction::Purge,
            "ops",
            &Filter::new().id("old"),
        ))
        .await
        .unwrap();
    let trail = store.audit(0..10).await.unwrap();
    assert_eq!((trail.len(), trail[0].filter.as_str()), (1, "id=old"));
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 6);
}
