//! The dead-letter board end to end: a real axum server on 127.0.0.1 serving the board over a
//! seeded SQLite file (or a memory store), driven by reqwest; re-drives go to a real axum
//! provider on loopback that records what it received.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::http::HeaderMap;
use backstop_dlq::{Board, GROUP_LIMIT, PAGE_SIZE, PAYLOAD_PREVIEW};
use common::csrf;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, record_of};
use tower_backstop::store::{
    AlertRules, AuditAction, Filter, MemoryStore, Record, SqliteStore, Stats, Status, Store,
};
use tower_backstop::{Class, Code, Envelope, Failure};

// ---- seeding ----

fn at(secs_ago: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(secs_ago)
}

fn record(id: &str, class: &'static str, code: Code, message: &str, secs_ago: u64) -> Record {
    let f: Failure = Failure::new(Class::new(class), code);
    let mut r = record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\"}}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", "http://mail.invalid/v1/messages")
            .with_metadata("idempotency-key", id)
            .with_header("x-tenant", "acme")
            .with_header("authorization", "Bearer not-to-be-seen")
            .with_tag("campaign", "spring"),
        &f,
    );
    r.message = message.to_owned();
    r.first_failed_at = at(secs_ago + 60);
    r.last_failed_at = at(secs_ago);
    r
}

fn throttled(i: u64) -> Record {
    record(
        &format!("thr-{i:03}"),
        "throttled",
        Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
        &format!("quota {i} exceeded for tenant 77{i} at 10.0.0.{}", i % 250),
        10 + i,
    )
}

fn permanent(i: u64) -> Record {
    record(
        &format!("perm-{i:03}"),
        "permanent",
        Code::Http(http::StatusCode::BAD_REQUEST),
        &format!("rejected recipient user{i}@example.com"),
        5_000 + i,
    )
}

fn with_status(mut r: Record, status: Status) -> Record {
    r.status = status;
    if matches!(status, Status::Deferred | Status::InFlight) {
        r.retry_at = Some(at(0) + Duration::from_secs(600));
    }
    r
}

async fn sqlite(records: Vec<Record>) -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("d.db")).unwrap();
    store.put_many(records).await.unwrap();
    (dir, Arc::new(store))
}

// ---- servers ----

/// Serves `app` on 127.0.0.1; returns its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Serves `board` mounted under `/dead-letters`; returns the board's URL.
async fn serve_board(board: Board) -> String {
    let app = axum::Router::new().nest("/dead-letters", board.router());
    format!("{}/dead-letters", serve(app).await)
}

type Received = Arc<Mutex<Vec<String>>>;

/// A provider that answers 202 and records the idempotency key of every request; `on_request`
/// runs first (for the race test).
async fn provider(
    on_request: impl Fn(&str) -> Option<tokio::task::JoinHandle<()>> + Clone + Send + Sync + 'static,
) -> (String, Received) {
    let seen: Received = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let log = Arc::clone(&log);
        let on_request = on_request.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            if let Some(task) = on_request(&key) {
                task.await.unwrap();
            }
            log.lock().unwrap().push(key);
            http::StatusCode::ACCEPTED
        }
    });
    (serve(app).await, seen)
}

/// A board over `store` that lets requests with `x-operator` act, re-driving to `target`
/// through the dead-letter, classify and hyper-util stack.
fn acting_board(store: &Arc<dyn Store>, target: &str) -> Board {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(store)))
        .layer(ClassifyLayer::http())
        .service(client);
    Board::new(Arc::clone(store))
        .authorize(|parts: &http::request::Parts| {
            Some(parts.headers.get("x-operator")?.to_str().ok()?.to_owned())
        })
        .redrive_through(stack)
        .redrive_target(target.parse().unwrap())
}

// ---- the client side ----

fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

async fn get(url: &str) -> (u16, String) {
    let r = client().get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn get_as(url: &str, who: &str) -> (u16, String) {
    let r = client()
        .get(url)
        .header("x-operator", who)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn post(url: &str, who: Option<&str>, fields: &[(&str, &str)]) -> (u16, String) {
    let body = fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut req = client()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(who) = who {
        req = req.header("x-operator", who);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The text of the element with `id` (its inner HTML up to its closing tag).
fn element<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {html}"));
    let open_end = start + html[start..].find('>').unwrap() + 1;
    let tag_start = html[..start].rfind('<').unwrap();
    let tag = html[tag_start + 1..].split([' ', '>']).next().unwrap();
    let close = open_end + html[open_end..].find(&format!("</{tag}>")).unwrap();
    &html[open_end..close]
}

/// The text of an element without its tags.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// The ids of the records a table links to, in order.
/// The target of the page's `rel="next"` link, unescaped, if there is one.
fn next_link(html: &str) -> Option<String> {
    let at = html.find("rel=\"next\" href=\"")? + "rel=\"next\" href=\"".len();
    let href = &html[at..at + html[at..].find('"')?];
    Some(href.replace("&amp;", "&"))
}

fn linked_ids(table: &str) -> Vec<String> {
    table
        .split("href=\"/dead-letters/records/")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_owned())
        .collect()
}

/// Every hidden field of the form that holds the button `button_id`.
fn form_fields(html: &str, button_id: &str) -> (String, Vec<(String, String)>) {
    let button = html
        .find(&format!("id=\"{button_id}\""))
        .unwrap_or_else(|| panic!("no #{button_id} in {html}"));
    let form_start = html[..button].rfind("<form").unwrap();
    let form = &html[form_start..button];
    let action = form.split("action=\"").nth(1).unwrap();
    let action = action[..action.find('"').unwrap()].to_owned();
    let mut fields = Vec::new();
    for input in form.split("<input").skip(1) {
        let attr = |name: &str| {
            input.split(&format!(" {name}=\"")).nth(1).map(|v| {
                v[..v.find('"').unwrap()]
                    .replace("&quot;", "\"")
                    .replace("&amp;", "&")
            })
        };
        if let (Some(name), Some(value)) = (attr("name"), attr("value")) {
            fields.push((name, value));
        }
    }
    (action, fields)
}

/// Submits the form of `button_id` on `html` (served by `board`) as `who`.
async fn submit(board: &str, html: &str, button_id: &str, who: &str) -> (u16, String) {
    let (action, fields) = form_fields(html, button_id);
    let origin = &board[..board.find("/dead-letters").unwrap()];
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    post(&format!("{origin}{action}"), Some(who), &fields).await
}

// ---- read-only pages ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_counts_what_the_store_holds() {
    let mut records: Vec<Record> = (0..7).map(throttled).collect();
    records.extend((0..3).map(permanent));
    records.push(with_status(throttled(100), Status::Deferred));
    records.push(with_status(throttled(101), Status::Resolved));
    let (_dir, store) = sqlite(records.clone()).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;

    let (status, html) = get(&board).await;
    assert_eq!(status, 200, "{html}");
    let dead = records.iter().filter(|r| r.status == Status::Dead).count();
    assert_eq!(text(element(&html, "dead")), dead.to_string());
    assert_eq!(text(element(&html, "deferred")), "1");
    // Within the 24 h window: the seeded dead letters, throttled first (7 against 3).
    assert_eq!(text(element(&html, "window-dead")), dead.to_string());
    let classes = text(element(&html, "top-classes"));
    assert!(classes.find("throttled").unwrap() < classes.find("permanent").unwrap());
    assert!(classes.contains('7') && classes.contains('3'), "{classes}");
    // The rate chart has a bar per bucket whose counts add up to the window's dead letters.
    let chart = element(&html, "rate");
    let sum: u64 = chart
        .split("<title>")
        .skip(1)
        .map(|t| t.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, dead as u64);
    // Each rule's state is what `Stats` computes over the same store: the permanent ones
    // failed before the baseline period, so the spike rule has its history.
    let stats = Stats::gather(
        &*store,
        SystemTime::now(),
        Duration::from_secs(86_400),
        AlertRules::default(),
    )
    .await
    .unwrap();
    assert!(stats.has_baseline);
    let alerts = element(&html, "alerts");
    let row = |rule: &str| {
        let i = alerts.find(&format!("data-rule=\"{rule}\"")).unwrap();
        alerts[i..i + alerts[i..].find("</tr>").unwrap()].to_owned()
    };
    for rule in ["dead_letter_spike", "class_share", "new_code"] {
        let fired = stats.alerts.iter().any(|a| a.rule() == rule);
        assert_eq!(row(rule).contains("firing"), fired, "{rule}: {alerts}");
    }
    // Seven throttled of seven recent dead letters is above the 20 % share.
    assert!(
        row("class_share").contains("class throttled is 100%"),
        "{alerts}"
    );

    // A store with no history before the baseline: the spike and new-code rules wait.
    let fresh: Arc<dyn Store> = Arc::new(MemoryStore::new());
    fresh
        .put_many((0..7).map(throttled).collect())
        .await
        .unwrap();
    let (_, html) = get(&serve_board(Board::new(fresh)).await).await;
    let alerts = element(&html, "alerts");
    for rule in ["dead_letter_spike", "new_code"] {
        let i = alerts.find(&format!("data-rule=\"{rule}\"")).unwrap();
        assert!(
            alerts[i..i + alerts[i..].find("</tr>").unwrap()].contains("waiting for history"),
            "{alerts}"
        );
    }

    // A shorter window leaves out the permanent ones (failed about 83 minutes ago).
    let (_, html) = get(&format!("{board}?window=30m")).await;
    assert_eq!(text(element(&html, "window-dead")), "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_outstanding_first_by_counts() {
    let n_dead = 2 * PAGE_SIZE as u64 + 20;
    let mut records: Vec<Record> = (0..n_dead).map(throttled).collect();
    records.extend((200..205).map(|i| with_status(throttled(i), Status::Deferred)));
    records.extend((300..303).map(|i| with_status(throttled(i), Status::Resolved)));
    let (_dir, store) = sqlite(records).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;

    let (status, html) = get(&format!("{board}/records?class=throttled")).await;
    assert_eq!(status, 200);
    let first = linked_ids(element(&html, "records"));
    assert_eq!(first.len(), PAGE_SIZE);
    // The newest dead letter first (throttled(0) failed most recently).
    assert_eq!(first[0], "thr-000");
    assert!(text(element(&html, "total")).starts_with(&format!("{} records", n_dead + 5)));

    // The last page: the 20 remaining dead ones, then the deferred ones; no resolved one.
    let (_, html) = get(&format!("{board}/records?class=throttled&page=3")).await;
    let last = linked_ids(element(&html, "records"));
    assert_eq!(last.len(), 25);
    assert!(last[..20].iter().all(|id| id.as_str() < "thr-200"));
    let deferred: Vec<&str> = last[20..].iter().map(String::as_str).collect();
    assert_eq!(
        deferred,
        ["thr-200", "thr-201", "thr-202", "thr-203", "thr-204"]
    );
    // With resolved ones, they come last.
    let (_, html) = get(&format!(
        "{board}/records?class=throttled&page=3&resolved=1"
    ))
    .await;
    let with = linked_ids(element(&html, "records"));
    assert_eq!(with.len(), 28);
    assert!(with[25..].iter().all(|id| id.starts_with("thr-30")));
    // Every page together is every outstanding record once.
    let mut all = Vec::new();
    for page in 1..=3 {
        let (_, html) = get(&format!("{board}/records?class=throttled&page={page}")).await;
        all.extend(linked_ids(element(&html, "records")));
    }
    let unique: std::collections::BTreeSet<_> = all.iter().collect();
    assert_eq!(all.len(), unique.len());
    assert_eq!(all.len() as u64, n_dead + 5);
    // And following the "next" links from the first page (cursors) is the same list.
    let mut by_cursor = Vec::new();
    // Links are absolute paths (the board's mount point first): after the origin.
    let origin = &board[..board[8..].find('/').map_or(board.len(), |i| i + 8)];
    let mut url = format!("{board}/records?class=throttled");
    for _ in 0..10 {
        let (status, html) = get(&url).await;
        assert_eq!(status, 200, "{url}");
        by_cursor.extend(linked_ids(element(&html, "records")));
        assert!(text(element(&html, "total")).starts_with(&format!("{} records", n_dead + 5)));
        match next_link(&html) {
            Some(next) => {
                assert!(
                    next.contains("after=") && next.contains("class=throttled"),
                    "{next}"
                );
                url = format!("{origin}{next}");
            }
            None => break,
        }
    }
    assert_eq!(
        by_cursor, all,
        "the pages by cursor are the pages by number"
    );
    let (status, html) = get(&format!("{board}/records?class=throttled&after=garbled")).await;
    assert_eq!(status, 400);
    assert!(html.contains("invalid cursor"), "{html}");

    // Past the end: an empty page that says so.
    let (status, html) = get(&format!("{board}/records?class=throttled&page=9")).await;
    assert_eq!(status, 200);
    assert!(linked_ids(element(&html, "records")).is_empty());
    assert!(text(element(&html, "past-end")).starts_with("Page 9 is past the end"));

    // Filter by status and tag, as the filter form sends them (empty fields included).
    let (_, html) = get(&format!(
        "{board}/records?class=&code=&status=deferred&tag=campaign%3Dspring&since=&until="
    ))
    .await;
    assert_eq!(linked_ids(element(&html, "records")).len(), 5);
    let (_, html) = get(&format!("{board}/records?tag=campaign%3Dautumn")).await;
    assert!(linked_ids(element(&html, "records")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_has_a_defined_page() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store
        .put_many((0..3).map(throttled).collect())
        .await
        .unwrap();
    let board = serve_board(Board::new(Arc::clone(&store))).await;

    for (path, status, says) in [
        ("/records?colour=red", 400, "colour"),
        ("/records?since=yesterday", 400, "since"),
        ("/records?until=2026-13-40T00:00:00Z", 400, "until"),
        ("/records?status=gone", 400, "gone"),
        ("/records?tag=campaign", 400, "NAME=value"),
        ("/records?page=0", 400, "page"),
        ("/records?page=two", 400, "two"),
        ("/records?after=%2F%2F", 400, "not a cursor token"),
        (
            "/records?after=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            400,
            "damaged",
        ),
        ("/groups?colour=red", 400, "colour"),
        ("?window=soon", 400, "window"),
        ("/records/no-such-id", 404, "no-such-id"),
        ("/records/thr-000?view=pdf", 400, "pdf"),
    ] {
        let (got, html) = get(&format!("{board}{path}")).await;
        assert_eq!(got, status, "{path}: {html}");
        assert!(
            text(element(&html, "error")).contains(says),
            "{path}: {html}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_page_shows_it_all_and_escapes_it() {
    let mut plain = throttled(1);
    plain.history.push(plain.history[0].clone());
    let mut binary = throttled(2);
    binary.payload = b"caf\xe9 \x00\x01".to_vec();
    binary.payload_len = binary.payload.len() as u64;
    binary.content_type = None;
    let mut big = throttled(3);
    big.payload = vec![b'a'; 10 * 1024 * 1024];
    big.payload_len = big.payload.len() as u64;
    big.content_type = Some("text/plain".into());
    let mut evil = throttled(4);
    evil.tags
        .insert("campaign".into(), "<script>alert(1)</script>".into());
    evil.message = "<script>alert(2)</script> at 10.0.0.1".into();
    let (_dir, store) = sqlite(vec![plain.clone(), binary, big, evil]).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;

    let (status, html) = get(&format!("{board}/records/thr-001")).await;
    assert_eq!(status, 200);
    let section = element(&html, "record");
    assert!(section.contains("throttled") && section.contains("http 429"));
    assert_eq!(text(element(&html, "status")), "dead");
    // The redacted header by name, never its value.
    assert!(element(&html, "headers").contains("authorization"));
    assert!(!html.contains("not-to-be-seen"));
    assert!(element(&html, "headers").contains("acme"));
    // JSON, pretty.
    assert!(html.contains("data-view=\"json\""));
    assert!(element(&html, "payload").contains("\n  &quot;id&quot;: &quot;thr-001&quot;"));
    // History with both entries, and the root cause.
    let history = element(&html, "history");
    assert_eq!(history.matches("<tr>").count() - 1, plain.history.len());
    // The text view of the same payload.
    let (_, html) = get(&format!("{board}/records/thr-001?view=text")).await;
    assert!(html.contains("data-view=\"text\""));

    // Not UTF-8: hex, whatever is asked.
    for q in ["", "?view=text", "?view=hex"] {
        let (status, html) = get(&format!("{board}/records/thr-002{q}")).await;
        assert_eq!(status, 200);
        assert!(html.contains("data-view=\"hex\""), "{q}");
        assert!(element(&html, "payload").contains("63 61 66 e9 20 00 01"));
        assert!(text(element(&html, "payload-info")).contains("not valid UTF-8"));
    }

    // 10 MiB: a bounded prefix and a note.
    let (status, html) = get(&format!("{board}/records/thr-003")).await;
    assert_eq!(status, 200);
    assert!(html.len() < 2 * PAYLOAD_PREVIEW, "{} bytes", html.len());
    let note = text(element(&html, "payload-cut"));
    assert!(
        note.contains(&format!("first {PAYLOAD_PREVIEW} of {}", 10 * 1024 * 1024)),
        "{note}"
    );

    // HTML in a tag and a message: escaped on every page, never executed.
    for path in [
        "/records/thr-004",
        "/records?class=throttled",
        "/groups",
        "/records?tag=campaign%3D%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    ] {
        let (status, html) = get(&format!("{board}{path}")).await;
        assert_eq!(status, 200, "{path}");
        assert!(!html.contains("<script"), "{path}: {html}");
        assert!(html.contains("&lt;script&gt;alert("), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_mask_what_varies_and_link_to_their_records() {
    let mut records: Vec<Record> = (0..6).map(throttled).collect();
    records.extend((0..2).map(permanent));
    let (_dir, store) = sqlite(records).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;

    let (status, html) = get(&format!("{board}/groups")).await;
    assert_eq!(status, 200);
    let table = element(&html, "groups");
    assert_eq!(table.matches("data-group=").count(), 2, "{table}");
    assert!(table.contains("quota &lt;n&gt; exceeded for tenant &lt;n&gt; at &lt;ip&gt;"));
    assert!(table.contains("rejected recipient &lt;email&gt;"));
    let n = store.count(&Filter::new()).await.unwrap();
    assert!(text(element(&html, "scanned")).contains(&format!("newest {n} of {n}")));

    // The throttled group (the largest, first) links to exactly its six records.
    let link = table.split("class=\"see\" href=\"").nth(1).unwrap();
    let link = link[..link.find('"').unwrap()].replace("&amp;", "&");
    let origin = &board[..board.find("/dead-letters").unwrap()];
    let (status, html) = get(&format!("{origin}{link}")).await;
    assert_eq!(status, 200);
    let mut ids = linked_ids(element(&html, "records"));
    ids.sort();
    let want: Vec<String> = (0..6).map(|i| format!("thr-{i:03}")).collect();
    assert_eq!(ids, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_read_a_bounded_number_of_records_and_say_so() {
    let n = GROUP_LIMIT as u64 + 7;
    let (_dir, store) = sqlite((0..n).map(throttled).collect()).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;
    let (status, html) = get(&format!("{board}/groups")).await;
    assert_eq!(status, 200);
    let scanned = text(element(&html, "scanned"));
    assert!(
        scanned.contains(&format!("newest {GROUP_LIMIT} of {n}")),
        "{scanned}"
    );
    assert!(
        scanned.contains(&format!("at most {GROUP_LIMIT} are read")),
        "{scanned}"
    );
    // The groups' sizes add up to what was read, not to what there is.
    let table = element(&html, "groups");
    let sizes: u64 = table
        .split("<tr data-group=")
        .skip(1)
        .map(|row| {
            let cell = row.split("<td class=\"n\">").nth(1).unwrap();
            cell[..cell.find('<').unwrap()].parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(sizes, GROUP_LIMIT as u64);
}

// ---- actions ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_board_shows_no_actions_and_refuses_posts() {
    let (_dir, store) = sqlite((0..3).map(throttled).collect()).await;
    let board = serve_board(Board::new(Arc::clone(&store))).await;
    let (_, html) = get_as(&format!("{board}/records?class=throttled"), "alice").await;
    assert!(!html.contains("id=\"preview\"") && !html.contains("id=\"purge\""));
    assert!(!html.contains("name=\"csrf\""));
    for action in [
        "redrive/preview",
        "redrive/run",
        "purge/preview",
        "purge/run",
    ] {
        let (status, html) = post(
            &format!("{board}/{action}"),
            Some("alice"),
            &[("class", "throttled")],
        )
        .await;
        assert_eq!(status, 403, "{action}");
        assert!(text(element(&html, "error")).contains("read-only"));
    }
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csrf_and_empty_filters_are_refused() {
    let (_dir, store) = sqlite((0..3).map(throttled).collect()).await;
    let (target, received) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;

    // A request the hook names no actor for is read-only.
    let (_, html) = get(&format!("{board}/records?class=throttled")).await;
    assert!(!html.contains("id=\"preview\""));
    let (_, html) = get_as(&format!("{board}/records?class=throttled"), "alice").await;
    assert!(html.contains("id=\"preview\"") && html.contains("id=\"purge\""));
    let token = csrf(&html);

    let forged = "0".repeat(token.len());
    for action in [
        "redrive/preview",
        "redrive/run",
        "purge/preview",
        "purge/run",
    ] {
        for fields in [
            vec![("class", "throttled")],
            vec![("class", "throttled"), ("csrf", forged.as_str())],
            vec![("class", "throttled"), ("csrf", &token[..10])],
        ] {
            let (status, html) = post(&format!("{board}/{action}"), Some("alice"), &fields).await;
            assert_eq!(status, 403, "{action} {fields:?}");
            assert!(text(element(&html, "error")).contains("CSRF"));
        }
        // The right token without an actor: still read-only.
        let (status, _) = post(
            &format!("{board}/{action}"),
            None,
            &[("class", "throttled"), ("csrf", &token)],
        )
        .await;
        assert_eq!(status, 403);
        // No filter, or only empty fields: refused.
        for fields in [
            vec![("csrf", token.as_str())],
            vec![("csrf", token.as_str()), ("class", ""), ("tag", "")],
        ] {
            let (status, html) = post(&format!("{board}/{action}"), Some("alice"), &fields).await;
            assert_eq!(status, 400, "{action}");
            assert!(text(element(&html, "error")).contains("every record"));
        }
        // A bad filter in a form: 400 naming it.
        let (status, html) = post(
            &format!("{board}/{action}"),
            Some("alice"),
            &[("csrf", &token), ("colour", "red")],
        )
        .await;
        assert_eq!(status, 400);
        assert!(text(element(&html, "error")).contains("colour"));
    }
    // The list of an empty filter offers no action.
    let (_, html) = get_as(&format!("{board}/records"), "alice").await;
    assert!(!html.contains("id=\"preview\""));
    assert!(received.lock().unwrap().is_empty());
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 3);
    assert!(store.audit(0..10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_is_previewed_confirmed_sent_once_and_audited() {
    let mut records: Vec<Record> = (0..4).map(throttled).collect();
    records.extend((0..2).map(permanent));
    let (_dir, store) = sqlite(records).await;
    let (target, received) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;

    let (_, list) = get_as(&format!("{board}/records?class=throttled"), "alice").await;
    // Preview with a high rate, so that the test does not wait on the pacing.
    let (action, mut fields) = form_fields(&list, "preview");
    for (k, v) in &mut fields {
        if k == "rate" {
            *v = "1000".into();
        }
    }
    let origin = &board[..board.find("/dead-letters").unwrap()];
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, preview) = post(&format!("{origin}{action}"), Some("alice"), &fields).await;
    assert_eq!(status, 200, "{preview}");
    let planned = store
        .count(&Filter::new().class("throttled").status(Status::Dead))
        .await
        .unwrap();
    assert_eq!(text(element(&preview, "planned")), planned.to_string());
    assert_eq!(
        linked_ids(element(&preview, "planned-records")).len() as u64,
        planned
    );
    // The preview sent nothing.
    assert!(received.lock().unwrap().is_empty());

    let (status, done) = submit(&board, &preview, "confirm", "alice").await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        text(element(&done, "result")),
        format!("Re-drove {planned}: resolved {planned}, failed 0, skipped 0.")
    );
    // Each throttled record arrived exactly once; no permanent one did.
    let mut got = received.lock().unwrap().clone();
    got.sort();
    let want: Vec<String> = (0..4).map(|i| format!("thr-{i:03}")).collect();
    assert_eq!(got, want);
    assert_eq!(
        store
            .count(&Filter::new().class("throttled").status(Status::Resolved))
            .await
            .unwrap(),
        planned
    );
    // The audit trail says who did it, what was planned and what came of it.
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor, "alice");
    assert_eq!(audit[0].action, AuditAction::Redrive);
    assert_eq!(audit[0].planned, Some(planned));
    assert_eq!(audit[0].sent, planned);
    let (status, page) = get(&format!("{board}/audit")).await;
    assert_eq!(status, 200);
    let table = element(&page, "audit");
    assert!(table.contains("data-action=\"redrive\"") && table.contains("alice"));
    assert!(table.contains("class=throttled"));
    let (_, page) = get(&format!("{board}/audit?page=5")).await;
    assert!(page.contains("id=\"past-end\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_record_and_one_group_are_redriven_alone() {
    let mut records: Vec<Record> = (0..3).map(throttled).collect();
    records.extend((0..3).map(permanent));
    let (_dir, store) = sqlite(records).await;
    let (target, received) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;

    // One record, from its page.
    let (_, page) = get_as(&format!("{board}/records/perm-001"), "bob").await;
    let (_, preview) = submit(&board, &page, "preview", "bob").await;
    assert_eq!(text(element(&preview, "planned")), "1");
    let (_, done) = submit(&board, &preview, "confirm", "bob").await;
    assert!(text(element(&done, "result")).contains("resolved 1"));
    assert_eq!(*received.lock().unwrap(), ["perm-001"]);

    // The permanent group, from the groups page: the other two dead ones (the resolved one is
    // not re-driven again).
    let (_, groups) = get_as(&format!("{board}/groups?status=dead"), "bob").await;
    let table = element(&groups, "groups");
    let row = &table[table.find("rejected recipient").unwrap()..];
    let link = row.split("class=\"see\" href=\"").nth(1).unwrap();
    let link = link[..link.find('"').unwrap()].replace("&amp;", "&");
    let origin = &board[..board.find("/dead-letters").unwrap()];
    let (_, list) = get_as(&format!("{origin}{link}"), "bob").await;
    assert_eq!(linked_ids(element(&list, "records")).len(), 2);
    let (_, preview) = submit(&board, &list, "preview", "bob").await;
    assert_eq!(text(element(&preview, "planned")), "2");
    let (_, done) = submit(&board, &preview, "confirm", "bob").await;
    assert!(
        text(element(&done, "result")).contains("resolved 2"),
        "{done}"
    );
    let mut got = received.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ["perm-000", "perm-001", "perm-002"]);
    assert_eq!(
        store
            .count(&Filter::new().class("throttled").status(Status::Dead))
            .await
            .unwrap(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_racing_the_scheduler_reports_the_record_skipped() {
    let (_dir, store) = sqlite(vec![throttled(1), throttled(2)]).await;
    let as_read: BTreeMap<String, Record> = store
        .search(&Filter::new(), 0..10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    // When the first record arrives, "the scheduler" claims the other one, compare-and-set on
    // the record as it was read: the re-drive's own claim of it then loses.
    let racer = Arc::clone(&store);
    let raced: Arc<Mutex<Option<String>>> = Arc::default();
    let raced_log = Arc::clone(&raced);
    let (target, received) = provider(move |key| {
        let mut raced = raced_log.lock().unwrap();
        if raced.is_some() {
            return None;
        }
        let other = as_read.values().find(|r| r.id != key).unwrap().clone();
        *raced = Some(other.id.clone());
        let store = Arc::clone(&racer);
        Some(tokio::spawn(async move {
            let claim = store
                .claim(&other, SystemTime::now() + Duration::from_secs(60))
                .await
                .unwrap();
            assert!(matches!(claim, tower_backstop::store::Claim::Claimed(_)));
        }))
    })
    .await;
    let board = serve_board(acting_board(&store, &target)).await;

    let (_, list) = get_as(&format!("{board}/records?class=throttled"), "carol").await;
    let (_, preview) = submit(&board, &list, "preview", "carol").await;
    assert_eq!(text(element(&preview, "planned")), "2");
    let (status, done) = submit(&board, &preview, "confirm", "carol").await;
    assert_eq!(status, 200);
    assert_eq!(
        text(element(&done, "result")),
        "Re-drove 2: resolved 1, failed 0, skipped 1."
    );
    let loser = raced.lock().unwrap().clone().unwrap();
    let outcomes = element(&done, "outcomes");
    let row = &outcomes[outcomes.find(&format!(">{loser}<")).unwrap()..];
    assert!(
        row[..row.find("</tr>").unwrap()].contains("claimed elsewhere"),
        "{outcomes}"
    );
    // The provider got the winner once and never the loser.
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_ne!(got[0], loser);
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit[0].sent, 1);
    assert!(
        audit[0].outcome.contains("skipped 1"),
        "{}",
        audit[0].outcome
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_is_counted_confirmed_and_audited() {
    let mut records: Vec<Record> = (0..4).map(throttled).collect();
    records.extend((0..3).map(permanent));
    let (_dir, store) = sqlite(records).await;
    let board =
        serve_board(Board::new(Arc::clone(&store)).authorize(|_| Some("dave".into()))).await;

    let (_, list) = get(&format!("{board}/records?class=permanent")).await;
    // No re-drive service: no re-drive form, but a purge.
    assert!(!list.contains("id=\"preview\""));
    let (status, preview) = submit(&board, &list, "purge", "dave").await;
    assert_eq!(status, 200);
    assert_eq!(text(element(&preview, "planned")), "3");
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 7);
    let (status, done) = submit(&board, &preview, "confirm-purge", "dave").await;
    assert_eq!(status, 200);
    assert_eq!(text(element(&done, "result")), "Deleted 3 records.");
    assert_eq!(
        store
            .count(&Filter::new().class("permanent"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 4);
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit[0].action, AuditAction::Purge);
    assert_eq!(audit[0].actor, "dave");
    assert_eq!(audit[0].sent, 3);
    // A re-drive on a board without a service is refused.
    let token = csrf(&list);
    let (status, _) = post(
        &format!("{board}/redrive/preview"),
        None,
        &[("csrf", &token), ("class", "throttled")],
    )
    .await;
    assert_eq!(status, 403);
}

// ---- backstop-dlq serve ----

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binds_loopback_read_only() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    SqliteStore::open(&path)
        .unwrap()
        .put_many((0..2).map(throttled).collect())
        .await
        .unwrap();
    let db = path.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_backstop-dlq");

    // Not loopback: refused unless --allow-remote.
    let o = Command::new(bin)
        .args(["--store", db, "serve", "--bind", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allow-remote"));

    let mut child = Command::new(bin)
        .args(["--store", db, "serve", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let url = format!("http://{url}");
    assert!(line.contains("read-only"), "{line}");
    let (status, html) = get(&format!("{url}/records")).await;
    assert_eq!(status, 200);
    assert_eq!(linked_ids_at(&html, "/records/").len(), 2);
    assert!(!html.contains("id=\"preview\""));
    let (status, _) = post(&format!("{url}/purge/run"), None, &[("class", "throttled")]).await;
    assert_eq!(status, 403);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[cfg(feature = "cli")]
fn linked_ids_at(html: &str, prefix: &str) -> Vec<String> {
    element(html, "records")
        .split(&format!("href=\"{prefix}"))
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_owned())
        .collect()
}

// ---- hosts ----

/// A dead letter of `class` sent to `uri`.
fn to_host(id: &str, uri: &str, message: &str, secs_ago: u64) -> Record {
    let mut r = record(
        id,
        "transient",
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
        message,
        secs_ago,
    );
    r.metadata.insert("uri".into(), uri.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_customers_failing_the_same_way_are_two_groups_each_with_its_host() {
    let mut records = Vec::new();
    for i in 0..3u64 {
        records.push(to_host(
            &format!("a-{i}"),
            "https://api.alpha.test/v1/send",
            &format!("503 Service Unavailable for message {i}"),
            10 + i,
        ));
    }
    for i in 0..2u64 {
        records.push(to_host(
            &format!("b-{i}"),
            "http://API.Beta.test:8025/v1/send",
            &format!("503 Service Unavailable for message {}", 100 + i),
            20 + i,
        ));
    }
    let (_dir, store) = sqlite(records).await;
    let board =
        serve_board(Board::new(Arc::clone(&store)).authorize(|_| Some("erin".to_owned()))).await;

    // The groups: the same message masked, two hosts, two groups.
    let (status, html) = get(&format!("{board}/groups")).await;
    assert_eq!(status, 200);
    let table = element(&html, "groups");
    assert_eq!(table.matches("data-group=").count(), 2, "{table}");
    for (host, n) in [("api.alpha.test:443", 3), ("api.beta.test:8025", 2)] {
        let i = table.find(&format!("data-host=\"{host}\"")).unwrap();
        let row = &table[i..i + table[i..].find("</tr>").unwrap()];
        assert!(row.contains(&format!("<td class=\"n\">{n}</td>")), "{row}");
    }

    // The list has a host column.
    let (_, html) = get(&format!("{board}/records")).await;
    let list = element(&html, "records");
    assert!(list.contains("<th>host</th>"), "{list}");
    assert_eq!(list.matches("api.alpha.test:443").count(), 3, "{list}");
    assert_eq!(list.matches("api.beta.test:8025").count(), 2, "{list}");
    let (_, html) = get(&format!("{board}/records/b-0")).await;
    assert_eq!(text(element(&html, "host")), "api.beta.test:8025");

    // The host filter key: with or without the port, in any case; with the rest of a filter.
    for q in [
        "host=api.beta.test",
        "host=API.beta.test:8025",
        "host=api.beta.test&class=transient",
    ] {
        let (status, html) = get(&format!("{board}/records?{q}")).await;
        assert_eq!(status, 200, "{q}");
        let mut ids = linked_ids(element(&html, "records"));
        ids.sort();
        assert_eq!(ids, ["b-0", "b-1"], "{q}");
        assert!(
            text(element(&html, "total")).starts_with("2 records"),
            "{q}"
        );
    }
    let (_, html) = get(&format!("{board}/records?host=api.beta.test:443")).await;
    assert!(linked_ids(element(&html, "records")).is_empty());
    let (_, html) = get(&format!("{board}/groups?host=api.alpha.test")).await;
    assert_eq!(element(&html, "groups").matches("data-group=").count(), 1);

    // An action on a host: the purge counts and deletes its records only.
    let (_, list) = get(&format!("{board}/records?host=api.alpha.test")).await;
    let (status, preview) = submit(&board, &list, "purge", "erin").await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(text(element(&preview, "planned")), "3");
    let (_, done) = submit(&board, &preview, "confirm-purge", "erin").await;
    assert_eq!(text(element(&done, "result")), "Deleted 3 records.");
    let mut left: Vec<String> = store
        .search(&Filter::new(), 0..10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    left.sort();
    assert_eq!(left, ["b-0", "b-1"]);
    // A host that matches nothing acts on nothing.
    let token = csrf(&list);
    let (status, html) = post(
        &format!("{board}/purge/run"),
        Some("erin"),
        &[("csrf", &token), ("host", "api.gamma.test")],
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        text(element(&html, "result")).contains("nothing to do"),
        "{html}"
    );
    assert_eq!(store.count(&Filter::new()).await.unwrap(), 2);
}

// ---- breakers ----

/// A provider that answers every request with `status`.
async fn answering(status: http::StatusCode) -> String {
    serve(axum::Router::new().fallback(move || async move { status })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_each_breaker_and_a_redrive_into_an_open_one_is_warned_of() {
    use tower::ServiceExt as _;
    use tower_backstop::breaker::BreakerLayer;

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let down = answering(http::StatusCode::SERVICE_UNAVAILABLE).await;
    let up = answering(http::StatusCode::ACCEPTED).await;
    let host_of = |url: &str| url.trim_start_matches("http://").to_owned();
    let (down_host, up_host) = (host_of(&down), host_of(&up));

    // The app's stack: one breaker per host, open after two failures for five minutes.
    let breaker = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(300))
        .per_host();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let app = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(client);
    let send = |to: &str, id: &str| {
        let request = http::Request::post(format!("{to}/v1/messages"))
            .header("idempotency-key", id)
            .body(Full::new(Bytes::from(format!("{{\"id\":\"{id}\"}}"))))
            .unwrap();
        app.clone().oneshot(request)
    };
    // Two 503s open the down host's breaker (two dead letters); the third call is rejected at
    // once and deferred to its half-open time, with the breaker's key.
    for id in ["d-0", "d-1", "d-2"] {
        assert!(send(&down, id).await.is_err());
    }
    assert!(send(&up, "u-0").await.is_ok());
    let deferred = store.get("d-2").await.unwrap().unwrap();
    assert_eq!(deferred.status, Status::Deferred);
    assert_eq!(deferred.breaker.as_deref(), Some(down_host.as_str()));
    let until = deferred.retry_at.unwrap();
    // A dead letter of the healthy host, to re-drive without a warning.
    let other = to_host("u-1", &format!("{up}/v1/messages"), "503 earlier", 30);
    store.put(other).await.unwrap();

    // Live: the board mounted in the app, with its breakers.
    let live = serve_board(
        Board::new(Arc::clone(&store))
            .breakers(breaker.health())
            .authorize(|_| Some("frank".to_owned()))
            .redrive_through(app.clone()),
    )
    .await;
    let (status, html) = get(&live).await;
    assert_eq!(status, 200, "{html}");
    let panel = element(&html, "breakers");
    let row = |name: &str| {
        let i = panel
            .find(&format!("data-breaker=\"{name}\""))
            .unwrap_or_else(|| panic!("no row of {name}: {panel}"));
        panel[i..i + panel[i..].find("</tr>").unwrap()].to_owned()
    };
    let open = row(&down_host);
    assert!(open.contains("data-state=\"open\""), "{open}");
    // Open for 300 s, a moment ago: 5m to the second, rounded up.
    assert!(text(&open).contains("half-opens in 5m"), "{open}");
    assert!(text(&open).contains(&format!(
        "the store holds its records until {}",
        board_time(until)
    )));
    assert!(text(&open).contains("503"), "the cause: {open}");
    assert!(
        open.contains("<td class=\"n\">1</td>"),
        "one deferred record: {open}"
    );
    assert!(row(&up_host).contains("data-state=\"closed\""), "{panel}");

    // The re-drive preview of the down host's records warns, with their count; the confirm
    // button says so. The healthy host's preview has no warning.
    let (_, list) = get(&format!("{live}/records?host={down_host}")).await;
    let (status, preview) = submit(&live, &list, "preview", "frank").await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(text(element(&preview, "planned")), "3");
    let warning = element(&preview, "breaker-warning");
    assert!(
        warning.contains(&format!("data-breaker=\"{down_host}\" data-records=\"3\"")),
        "{warning}"
    );
    let said = text(warning);
    assert!(
        said.contains(&format!(
            "3 of these 3 records go to {down_host}, whose breaker is open"
        )),
        "{said}"
    );
    assert!(
        said.contains("open in this process") && said.contains("half-opens in"),
        "{said}"
    );
    assert!(text(element(&preview, "confirm")).contains("anyway"));
    let (_, list) = get(&format!("{live}/records?host={up_host}")).await;
    let (_, preview) = submit(&live, &list, "preview", "frank").await;
    assert_eq!(text(element(&preview, "planned")), "1");
    assert!(!preview.contains("id=\"breaker-warning\""), "{preview}");

    // Without the live breakers, the store's records still say the down host's is open.
    let stored = serve_board(
        Board::new(Arc::clone(&store))
            .authorize(|_| Some("frank".to_owned()))
            .redrive_through(app.clone()),
    )
    .await;
    let (_, html) = get(&stored).await;
    let panel = element(&html, "breakers");
    assert_eq!(panel.matches("data-breaker=").count(), 1, "{panel}");
    assert!(
        panel.contains(&format!("data-breaker=\"{down_host}\" data-state=\"open\"")),
        "{panel}"
    );
    let (_, list) = get(&format!("{stored}/records?host={down_host}")).await;
    let (_, preview) = submit(&stored, &list, "preview", "frank").await;
    let said = text(element(&preview, "breaker-warning"));
    assert!(
        said.contains(&format!("3 of these 3 records go to {down_host}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("until {}", board_time(until))),
        "{said}"
    );
    assert!(!said.contains("in this process"), "{said}");
}

/// The overview of a board mounted in the app, read through its router in process (no server:
/// the breaker's clock is tokio's paused one, so the rate read and the rate shown are at the
/// same instant).
async fn overview_in_process(board: &axum::Router) -> String {
    use tower::ServiceExt as _;
    let request = http::Request::get("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = board.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_overview_shows_a_throttled_breakers_send_rate_while_limited() {
    use std::sync::atomic::{AtomicU16, Ordering};
    use tower::ServiceExt as _;
    use tower_backstop::breaker::{BreakerLayer, State};

    // An in-process provider: 200 until told otherwise, then 429.
    let answer = Arc::new(AtomicU16::new(200));
    let said = Arc::clone(&answer);
    let provider = tower::service_fn(move |_: http::Request<()>| {
        let status = said.load(Ordering::SeqCst);
        async move {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        }
    });
    let breaker = BreakerLayer::new();
    let app = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(provider);
    let call = || app.clone().oneshot(http::Request::new(()));
    let board = Board::new(Arc::new(MemoryStore::new()))
        .breakers(breaker.health())
        .router();
    let handle = breaker.handle();
    let rate_cell = |html: &str| {
        let panel = element(html, "breakers").to_owned();
        let i = panel.find("<td class=\"rate\">").expect("a send rate cell");
        text(&panel[i..i + panel[i..].find("</td>").unwrap()])
    };

    // 50 calls taken over a second: not limited, no rate shown.
    for _ in 0..50 {
        assert!(call().await.is_ok());
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(handle.send_rate(), None);
    let html = overview_in_process(&board).await;
    assert_eq!(rate_cell(&html), "", "{html}");
    assert!(!html.contains("paced at"), "{html}");

    // A 429: the breaker stays closed and, once the limit's first measure (a second) ended, the
    // rate is limited (0.9 of the 50/s taken before).
    answer.store(429, Ordering::SeqCst);
    let failure = call().await.unwrap_err();
    assert_eq!(failure.class(), Class::THROTTLED);
    assert_eq!(handle.state(), State::Closed);
    tokio::time::advance(Duration::from_secs(1)).await;
    // A second more on CUBIC's curve, with no call waiting: it stays where it started.
    tokio::time::advance(Duration::from_secs(1)).await;
    let rate = handle.send_rate().expect("limited");
    let peak = handle.send_rate_peak().expect("limited");
    assert!((peak - 50.0).abs() < 1e-9, "the peak measured: {peak}");
    assert!(rate > 35.0 && rate < peak, "{rate}");
    let html = overview_in_process(&board).await;
    assert_eq!(
        rate_cell(&html),
        format!("paced at {rate:.1}/s of {peak:.1}/s peak"),
        "{html}"
    );
    let panel = element(&html, "breakers");
    assert!(panel.contains("data-state=\"closed\""), "{panel}");

    // Quiet past the lift time (30 s), a successful call lifts the limit: no rate shown.
    answer.store(200, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(31)).await;
    assert!(call().await.is_ok());
    assert_eq!(handle.send_rate(), None);
    let html = overview_in_process(&board).await;
    assert_eq!(rate_cell(&html), "", "{html}");
}

#[tokio::test(start_paused = true)]
async fn the_overview_shows_a_breakers_concurrency_limit_while_limited() {
    use std::sync::atomic::{AtomicU16, Ordering};
    use tower::ServiceExt as _;
    use tower_backstop::breaker::{AdaptiveConcurrency, BreakerLayer, State};

    // An in-process provider: 200 after 100 ms until told otherwise, then 503.
    let answer = Arc::new(AtomicU16::new(200));
    let said = Arc::clone(&answer);
    let provider = tower::service_fn(move |_: http::Request<()>| {
        let status = said.load(Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            )
        }
    });
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .build()
        .unwrap();
    let app = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(provider);
    let call = || app.clone().oneshot(http::Request::new(()));
    let board = Board::new(Arc::new(MemoryStore::new()))
        .breakers(breaker.health())
        .router();
    let handle = breaker.handle();
    let limit_cell = |html: &str| {
        let panel = element(html, "breakers").to_owned();
        let i = panel
            .find("<td class=\"limit\">")
            .expect("a concurrency limit cell");
        text(&panel[i..i + panel[i..].find("</td>").unwrap()])
    };

    // Calls answered: not limited, no limit shown.
    for _ in 0..5 {
        assert!(call().await.is_ok());
    }
    let html = overview_in_process(&board).await;
    assert_eq!(limit_cell(&html), "", "{html}");
    assert!(
        element(&html, "breakers").contains("<th>concurrency limit</th>"),
        "{html}"
    );

    // A 503 turns the limit on; 10 calls at once, then the first answer measures it: 0.9 of
    // the 10 in flight.
    answer.store(503, Ordering::SeqCst);
    assert_eq!(
        call().await.unwrap_err().code(),
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    answer.store(200, Ordering::SeqCst);
    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(call())).collect();
    for c in calls {
        assert!(c.await.unwrap().is_ok());
    }
    assert_eq!(handle.state(), State::Closed);
    let limit = handle.concurrency_limit().expect("limited");
    assert_eq!(limit, 9);
    let html = overview_in_process(&board).await;
    assert_eq!(limit_cell(&html), "at most 9 in flight", "{html}");

    // Quiet for the lift time (30 s) with no call: lifted, no limit shown.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(handle.concurrency_limit(), None);
    let html = overview_in_process(&board).await;
    assert_eq!(limit_cell(&html), "", "{html}");
}

/// `method path` through the board's router in process, as `who` (no actor: `None`), with a
/// form body for a `POST`: the status and the page.
async fn in_process(
    board: &axum::Router,
    method: http::Method,
    path: &str,
    who: Option<&str>,
    fields: &[(String, String)],
) -> (u16, String) {
    use tower::ServiceExt as _;
    let body = fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(who) = who {
        request = request.header("x-operator", who);
    }
    let request = request.body(axum::body::Body::from(body)).unwrap();
    let response = board.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Records already delivered are re-driven only with the preview's confirmation: the preview
/// warns and offers the box, a run without it is refused (400) whatever the form says
/// otherwise and sends nothing, a run with it sends each once and the audit says so. A resolved
/// record's own page previews it with the same confirmation.
#[tokio::test(start_paused = true)]
async fn a_redrive_of_records_already_delivered_needs_the_confirmation() {
    use tower_backstop::store::Change;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store
        .put_many((0..3).map(throttled).collect())
        .await
        .unwrap();
    for id in ["thr-000", "thr-001"] {
        store
            .update(
                id,
                Change::Resolved {
                    at: SystemTime::now(),
                },
            )
            .await
            .unwrap();
    }
    // The provider, in process: answers 202 and keeps each idempotency key it receives.
    let received: Received = Arc::default();
    let log = Arc::clone(&received);
    let provider = tower::service_fn(move |req: http::Request<Full<Bytes>>| {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        log.lock().unwrap().push(key);
        async move {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(202).body(()).unwrap(),
            )
        }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(ClassifyLayer::http())
        .service(provider);
    let board = Board::new(Arc::clone(&store))
        .authorize(|parts: &http::request::Parts| {
            Some(parts.headers.get("x-operator")?.to_str().ok()?.to_owned())
        })
        .redrive_through(stack)
        .router();
    let get = |path: &'static str| in_process(&board, http::Method::GET, path, Some("erin"), &[]);
    let pairs = |fields: &[(&str, &str)]| -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };

    let (status, list) = get("/records?class=throttled&status=resolved").await;
    assert_eq!(status, 200, "{list}");
    let token = csrf(&list);
    let (status, preview) = in_process(
        &board,
        http::Method::POST,
        "/redrive/preview",
        Some("erin"),
        &pairs(&[
            ("csrf", &token),
            ("class", "throttled"),
            ("status", "resolved"),
            ("rate", "1000"),
        ]),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(text(element(&preview, "planned")), "2");
    assert!(
        text(element(&preview, "resolved-warning"))
            .starts_with("2 of these 2 records were already delivered (resolved)."),
        "{preview}"
    );
    assert!(
        text(element(&preview, "include-resolved-label"))
            .contains("send again the 2 records already delivered"),
        "{preview}"
    );
    // The confirm form carries the box (unticked: a browser sends it only when ticked).
    let (action, fields) = form_fields(&preview, "confirm");
    assert_eq!(action, "/redrive/run");
    assert!(
        fields
            .iter()
            .any(|(k, v)| k == "include_resolved" && v == "1"),
        "{fields:?}"
    );
    let unticked: Vec<(String, String)> = fields
        .iter()
        .filter(|(k, _)| k != "include_resolved")
        .cloned()
        .collect();

    // Not ticked: refused, nothing sent, nothing audited, the records as they were.
    let (status, refused) =
        in_process(&board, http::Method::POST, &action, Some("erin"), &unticked).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        text(element(&refused, "error")).starts_with(
            "refusing to re-drive: 2 of these records were already delivered (resolved)"
        ),
        "{refused}"
    );
    assert!(received.lock().unwrap().is_empty());
    assert!(store.audit(0..10).await.unwrap().is_empty());
    for id in ["thr-000", "thr-001"] {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 0));
    }
    // Any other value of the box is not a confirmation either.
    let mut other = unticked.clone();
    other.push(("include_resolved".into(), "0".into()));
    let (status, _) = in_process(&board, http::Method::POST, &action, Some("erin"), &other).await;
    assert_eq!(status, 400);
    assert!(received.lock().unwrap().is_empty());

    // Ticked: each sent once, resolved again, and the audit says it was deliberate.
    let (status, done) =
        in_process(&board, http::Method::POST, &action, Some("erin"), &fields).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        text(element(&done, "result")),
        "Re-drove 2: resolved 2, failed 0, skipped 0."
    );
    assert!(text(element(&done, "resent-resolved")).starts_with("2 of the records planned"));
    let mut got = received.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ["thr-000", "thr-001"]);
    for id in ["thr-000", "thr-001"] {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!((r.status, r.resends), (Status::Resolved, 1));
    }
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].actor.as_str(), audit[0].sent), ("erin", 2));
    assert_eq!(
        audit[0].outcome,
        "resolved 2, failed 0, skipped 0; deliberately re-sent 2 already delivered \
         (include_resolved)"
    );

    // A resolved record's own page previews it (instead of finding nothing), with the box.
    let (_, page) = get("/records/thr-000").await;
    let (action, fields) = form_fields(&page, "preview");
    let fields: Vec<(String, String)> = fields
        .into_iter()
        .map(|(k, v)| {
            if k == "rate" {
                (k, "1000".into())
            } else {
                (k, v)
            }
        })
        .collect();
    let (status, preview) =
        in_process(&board, http::Method::POST, &action, Some("erin"), &fields).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(text(element(&preview, "planned")), "1");
    assert!(text(element(&preview, "resolved-warning")).starts_with("1 of these 1 records"));
    // An outstanding record's preview has no such box.
    let (_, page) = get("/records/thr-002").await;
    let (action, fields) = form_fields(&page, "preview");
    let (_, preview) = in_process(&board, http::Method::POST, &action, Some("erin"), &fields).await;
    assert_eq!(text(element(&preview, "planned")), "1");
    assert!(!preview.contains("include_resolved"), "{preview}");
}

/// A time as the board writes it: RFC 3339, to the second.
fn board_time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

// ---- headers ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_forbids_framing_and_sniffing_and_names_its_charset() {
    let (_dir, store) = sqlite((0..3).map(throttled).collect()).await;
    let (target, _) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;
    let (_, list) = get_as(&format!("{board}/records?class=throttled"), "gina").await;
    let token = csrf(&list);
    let form = |extra: &[(&'static str, &str)]| {
        let mut fields = vec![("csrf", token.clone()), ("id", "thr-001".to_owned())];
        fields.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        fields
    };
    let gets = [
        ("", 200),
        ("/records?class=throttled", 200),
        ("/records/thr-000", 200),
        ("/groups", 200),
        ("/audit", 200),
        ("/records?colour=red", 400),
        ("/records/nope", 404),
        ("/no/such/page", 404),
        ("/purge/run", 405),
    ];
    let mut seen = Vec::new();
    for (path, want) in gets {
        let r = client()
            .get(format!("{board}{path}"))
            .header("x-operator", "gina")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "GET {path}");
        seen.push((format!("GET {path}"), r));
    }
    for (path, fields, who, want) in [
        (
            "/redrive/preview",
            form(&[("rate", "1000")]),
            Some("gina"),
            200,
        ),
        ("/purge/preview", form(&[]), Some("gina"), 200),
        ("/redrive/run", form(&[("rate", "1000")]), Some("gina"), 200),
        ("/purge/run", form(&[]), Some("gina"), 200),
        ("/purge/run", form(&[]), None, 403),
        ("/breaker/override", form(&[]), Some("gina"), 400),
    ] {
        let body = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut req = client()
            .post(format!("{board}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(who) = who {
            req = req.header("x-operator", who);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), want, "POST {path}");
        seen.push((format!("POST {path}"), r));
    }
    // A form in another encoding: axum's own rejection, with the headers too.
    let r = client()
        .post(format!("{board}/purge/preview"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    seen.push(("POST json".to_owned(), r));

    for (what, r) in seen {
        let h = r.headers();
        let header = |name: &str| h.get(name).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"), "{what}");
        let csp = header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{what}: {csp}"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{what}"
        );
        assert_eq!(
            header("cache-control").as_deref(),
            Some("no-store"),
            "{what}"
        );
        if r.status() == 405 {
            assert_eq!(header("allow").as_deref(), Some("POST"), "{what}");
        }
        let content_type = header("content-type").unwrap_or_default();
        let json = what == "POST json";
        assert!(
            content_type == "text/html; charset=utf-8"
                || (json && content_type == "text/plain; charset=utf-8"),
            "{what}: {content_type:?}"
        );
        let status = r.status();
        let body = r.text().await.unwrap();
        if !json {
            assert!(body.starts_with("<!DOCTYPE html>"), "{what}: {body}");
        }
        if status == 405 {
            assert!(
                text(element(&body, "error")).contains("GET"),
                "{what}: {body}"
            );
        }
    }
}

/// The text of the element with `id` in `html` (its first text node), or `None`.
fn text_of(html: &str, id: &str) -> Option<String> {
    let at = html.find(&format!("id=\"{id}\""))?;
    let rest = &html[at..];
    let start = rest.find('>')? + 1;
    let end = rest[start..].find('<')?;
    Some(rest[start..start + end].to_owned())
}

#[tokio::test]
async fn the_overview_shows_the_apps_spool_and_still_does_while_the_store_is_down() {
    use tower_backstop::breaker::BreakerLayer;
    use tower_backstop::store::Spool;
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path().join("spool.db")).unwrap();
    for i in 0..3 {
        spool.put(permanent(i), None).await.unwrap();
    }
    let (_store_dir, store) = sqlite(vec![permanent(10)]).await;
    let sqlite_store = SqliteStore::open(_store_dir.path().join("d.db")).unwrap();
    let health = BreakerLayer::new().health().spool(&spool);

    // The store answers: the overview, and the spool below it.
    let url = serve_board(Board::new(Arc::clone(&store)).breakers(health.clone())).await;
    let (status, html) = get(&url).await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&html, "spool-records").as_deref(), Some("3"));
    assert_eq!(text_of(&html, "spool-quarantined").as_deref(), Some("0"));
    // Three records were spooled: the store did not take them, as far as the spool knows.
    assert_eq!(
        text_of(&html, "store-state").as_deref(),
        Some("does not answer: they wait on this machine's disk")
    );
    let bytes = spool.state().bytes;
    assert_eq!(
        text_of(&html, "spool-bytes"),
        Some(format!("{bytes} of 268435456 bytes"))
    );

    // The store closed: the overview says it cannot read it, and still shows the spool.
    let closed: Arc<dyn Store> = Arc::new(sqlite_store.clone());
    sqlite_store.close();
    let url = serve_board(Board::new(closed).breakers(health)).await;
    let (status, html) = get(&url).await;
    assert_eq!(status, 500);
    assert!(
        html.contains("the dead-letter store cannot be read"),
        "{html}"
    );
    assert_eq!(text_of(&html, "spool-records").as_deref(), Some("3"));

    // Forwarded: the spool is empty and the store takes its records.
    spool
        .forward_once(&*store, Duration::from_secs(1))
        .await
        .unwrap();
    let health = BreakerLayer::new().health().spool(&spool);
    let url = serve_board(Board::new(Arc::clone(&store)).breakers(health)).await;
    let (_, html) = get(&url).await;
    assert_eq!(text_of(&html, "spool-records").as_deref(), Some("0"));
    assert_eq!(text_of(&html, "store-state").as_deref(), Some("takes them"));
}

// ---- the fleet's breakers ----

/// A process's note on the breaker `name`, as the breakers of a fleet write it.
fn process_note(
    name: &str,
    process: &str,
    state: &str,
    half_opens_at: Option<SystemTime>,
) -> tower_backstop::store::FleetNote {
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let now = SystemTime::now();
    let body = serde_json::json!({
        "v": 1,
        "state": state,
        "own": state == "open",
        "opened_at": (state == "open").then(|| ms(now)),
        "half_opens_at": half_opens_at.map(ms),
        "cause": (state == "open").then_some("503 Service Unavailable"),
    });
    tower_backstop::store::FleetNote::new(
        format!("breaker:{name}"),
        process,
        body.to_string(),
        now,
        Duration::from_secs(60),
    )
}

/// The row of the breaker `name` in the overview's panel.
fn breaker_row(html: &str, name: &str) -> String {
    let panel = element(html, "breakers");
    let i = panel
        .find(&format!("data-breaker=\"{name}\""))
        .unwrap_or_else(|| panic!("no row of {name}: {panel}"));
    panel[i..i + panel[i..].find("</tr>").unwrap()].to_owned()
}

/// The override in force of `name`, as the store's notes hold it.
async fn override_of(
    store: &Arc<dyn Store>,
    name: &str,
) -> Option<tower_backstop::breaker::FleetOverride> {
    store
        .notes(SystemTime::now())
        .await
        .unwrap()
        .iter()
        .filter_map(tower_backstop::breaker::FleetOverride::from_note)
        .find(|o| o.breaker == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_what_each_process_says_and_the_override_in_force() {
    use tower_backstop::breaker::{FleetOverride, OverrideAction};

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // A record an open breaker deferred: the store knows `b.test:80`.
    let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
    let mut deferred = record_of(
        "def-1".to_owned(),
        Envelope::new("{}").with_metadata("uri", "http://b.test/v1"),
        &f,
    );
    deferred.status = Status::Deferred;
    deferred.breaker = Some("b.test:80".into());
    deferred.retry_at = Some(at(0) + Duration::from_secs(600));
    store.put(deferred).await.unwrap();
    // Two processes of the fleet: one has `b.test:80` open (half-opens in two minutes), the
    // other closed; a third tells of `api.mail.test:443`, which an operator forced open.
    let half_opens = SystemTime::now() + Duration::from_secs(120);
    for note in [
        process_note("b.test:80", "proc-a", "open", Some(half_opens)),
        process_note("b.test:80", "proc-b", "closed", None),
        process_note("api.mail.test:443", "proc-a", "forced_open", None),
    ] {
        store.put_note(note).await.unwrap();
    }
    let over = FleetOverride::new(
        "api.mail.test:443",
        OverrideAction::ForceOpen,
        Duration::from_secs(7200),
        "provider maintenance",
        "carol",
        SystemTime::now(),
    )
    .unwrap();
    over.publish(&*store).await.unwrap();

    let board = serve_board(Board::new(Arc::clone(&store))).await;
    let (status, html) = get(&board).await;
    assert_eq!(status, 200, "{html}");
    // The store's breaker, with what each process says of it.
    let row = breaker_row(&html, "b.test:80");
    assert!(row.contains("data-state=\"open\""), "{row}");
    let said = text(&row);
    assert!(said.contains("2 processes: 1 closed, 1 open"), "{said}");
    assert!(
        row.contains("data-process=\"proc-a\" data-state=\"open\""),
        "{row}"
    );
    assert!(said.contains("proc-a: open, half-opens in 2m"), "{said}");
    assert!(said.contains("proc-b: closed"), "{said}");
    // The breaker only the fleet knows, with the override: action, until, actor, reason.
    let row = breaker_row(&html, "api.mail.test:443");
    let said = text(&row);
    assert!(said.contains("1 process: 1 forced_open"), "{said}");
    assert!(row.contains("data-action=\"force_open\""), "{row}");
    assert!(
        said.contains(&format!(
            "force_open until {} by carol: provider maintenance",
            board_time(over.until)
        )),
        "{said}"
    );
    // Read-only: no override form.
    assert!(!html.contains("breaker/override"), "{html}");

    // A store that keeps no notes: the panel says so in one line, the rest of the page shows.
    let (_dir, sqlite) = sqlite(vec![throttled(1)]).await;
    let sqlite: Arc<dyn Store> = Arc::new(backstop_test_support::KeepsNoNotes(sqlite));
    let board = serve_board(Board::new(sqlite).authorize(|_| Some("carol".to_owned()))).await;
    let (status, html) = get(&board).await;
    assert_eq!(status, 200, "{html}");
    let line = text(element(&html, "fleet-unavailable"));
    assert!(line.contains("keeps no fleet notes"), "{line}");
    assert_eq!(text(element(&html, "dead")), "1");
    assert!(
        !html.contains("breaker/override"),
        "no form to write what cannot be kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_override_is_written_for_the_fleet_with_the_actor_and_audited() {
    use tower_backstop::breaker::OverrideAction;

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store
        .put_note(process_note("api.mail.test:443", "proc-a", "closed", None))
        .await
        .unwrap();
    let (target, _) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;

    // The overview offers a form on the breaker's row, and one to name another breaker.
    let (_, html) = get_as(&board, "alice").await;
    let row = breaker_row(&html, "api.mail.test:443");
    assert!(
        row.contains("name=\"breaker\" value=\"api.mail.test:443\""),
        "{row}"
    );
    assert!(html.contains("override another breaker"), "{html}");
    let token = csrf(&html);

    let before = SystemTime::now();
    let (status, done) = post(
        &format!("{board}/breaker/override"),
        Some("alice"),
        &[
            ("csrf", &token),
            ("breaker", "api.mail.test:443"),
            ("for", "2h"),
            ("reason", "provider maintenance"),
            ("action", "force_open"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let result = text(element(&done, "result"));
    assert!(
        result.starts_with("Written for the fleet: api.mail.test:443 force_open until"),
        "{result}"
    );
    assert!(
        result.ends_with(": provider maintenance, by alice."),
        "{result}"
    );
    assert!(done.contains("applies it within a second"), "{done}");
    // The note, by the hook's actor, for two hours.
    let over = override_of(&store, "api.mail.test:443")
        .await
        .expect("the note");
    assert_eq!(over.action, OverrideAction::ForceOpen);
    assert_eq!(over.actor, "alice");
    assert_eq!(over.reason, "provider maintenance");
    let lasts = over.until.duration_since(before).unwrap();
    assert!(
        lasts >= Duration::from_secs(7199) && lasts <= Duration::from_secs(7201),
        "{lasts:?}"
    );
    // The audit entry.
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].action, AuditAction::Breaker);
    assert_eq!(audit[0].actor, "alice");
    assert_eq!(audit[0].filter, "breaker=api.mail.test:443");
    assert_eq!(audit[0].outcome, over.describe());
    // The overview shows it; so does the audit page.
    let (_, html) = get(&board).await;
    let row = breaker_row(&html, "api.mail.test:443");
    assert!(
        text(&row).contains("force_open until") && text(&row).contains("by alice"),
        "{row}"
    );
    let (_, page) = get(&format!("{board}/audit")).await;
    let table = element(&page, "audit");
    assert!(table.contains("data-action=\"breaker\""), "{table}");
    let said = text(table);
    assert!(
        said.contains("alice")
            && said.contains("breaker=api.mail.test:443")
            && said.contains("provider maintenance"),
        "{said}"
    );

    // A breaker the overview does not list, named in the form; then a reset of the first,
    // which replaces its override (the later wins).
    let (status, done) = post(
        &format!("{board}/breaker/override"),
        Some("bob"),
        &[
            ("csrf", &token),
            ("breaker", " sms.test:443 "),
            ("for", "30m"),
            ("reason", "wrong signal"),
            ("action", "disable"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let disabled = override_of(&store, "sms.test:443").await.expect("the note");
    assert_eq!(
        (disabled.action, disabled.actor.as_str()),
        (OverrideAction::Disable, "bob")
    );
    let (status, done) = post(
        &format!("{board}/breaker/override"),
        Some("alice"),
        &[
            ("csrf", &token),
            ("breaker", "api.mail.test:443"),
            ("for", ""),
            ("reason", "maintenance over"),
            ("action", "reset"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let reset = override_of(&store, "api.mail.test:443").await.unwrap();
    assert_eq!(reset.action, OverrideAction::Reset);
    assert_eq!(store.audit(0..10).await.unwrap().len(), 3);
    let (_, html) = get(&board).await;
    assert!(
        breaker_row(&html, "sms.test:443").contains("data-action=\"disable\""),
        "{html}"
    );
    assert!(
        text(&breaker_row(&html, "api.mail.test:443")).contains("reset at"),
        "{html}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_override_is_refused_without_an_actor_a_token_or_good_input() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store
        .put_note(process_note("api.mail.test:443", "proc-a", "closed", None))
        .await
        .unwrap();
    let good = |token: &str| {
        vec![
            ("csrf".to_owned(), token.to_owned()),
            ("breaker".to_owned(), "api.mail.test:443".to_owned()),
            ("for".to_owned(), "2h".to_owned()),
            ("reason".to_owned(), "maintenance".to_owned()),
            ("action".to_owned(), "force_open".to_owned()),
        ]
    };
    let send = |url: String, who: Option<&'static str>, fields: Vec<(String, String)>| async move {
        let fields: Vec<(&str, &str)> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        post(&url, who, &fields).await
    };

    // A read-only board: no form, and the POST is refused, whoever asks.
    let read_only = serve_board(Board::new(Arc::clone(&store))).await;
    let (_, html) = get_as(&read_only, "alice").await;
    assert!(!html.contains("breaker/override") && !html.contains("name=\"csrf\""));
    let (status, html) = send(
        format!("{read_only}/breaker/override"),
        Some("alice"),
        good("0"),
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        text(element(&html, "error")).contains("read-only"),
        "{html}"
    );

    let (target, _) = provider(|_| None).await;
    let board = serve_board(acting_board(&store, &target)).await;
    let url = format!("{board}/breaker/override");
    let (_, html) = get_as(&board, "alice").await;
    let token = csrf(&html);
    // No actor for this request: read-only, even with the token.
    let (status, _) = send(url.clone(), None, good(&token)).await;
    assert_eq!(status, 403);
    // The CSRF token missing, forged or cut.
    let forged = "0".repeat(token.len());
    for csrf in [None, Some(forged.as_str()), Some(&token[..10])] {
        let mut fields = good(&token);
        fields.remove(0);
        if let Some(csrf) = csrf {
            fields.push(("csrf".to_owned(), csrf.to_owned()));
        }
        let (status, html) = send(url.clone(), Some("alice"), fields).await;
        assert_eq!(status, 403, "{csrf:?}");
        assert!(text(element(&html, "error")).contains("CSRF"), "{html}");
    }
    // Bad input: a clear 400 that names the field.
    for (field, value, says) in [
        ("breaker", "", "breaker: name the breaker"),
        ("breaker", "   ", "breaker: name the breaker"),
        ("reason", "", "reason: say why"),
        ("for", "", "for: \"\" is not a duration"),
        ("for", "soon", "for: \"soon\" is not a duration"),
        ("for", "8days", "out of range"),
        ("for", "0s", "out of range"),
        ("action", "close", "action: \"close\" is none of"),
    ] {
        let mut fields = good(&token);
        fields.retain(|(k, _)| k != field);
        fields.push((field.to_owned(), value.to_owned()));
        let (status, html) = send(url.clone(), Some("alice"), fields).await;
        assert_eq!(status, 400, "{field}={value:?}: {html}");
        let error = text(element(&html, "error")).replace("&quot;", "\"");
        assert!(error.contains(says), "{field}={value:?}: {error}");
    }
    // Nothing was written.
    assert!(override_of(&store, "api.mail.test:443").await.is_none());
    assert_eq!(store.notes(SystemTime::now()).await.unwrap().len(), 1);
    assert!(store.audit(0..10).await.unwrap().is_empty());

    // A store that keeps no notes: the override cannot be written, and says so.
    let (_dir, sqlite) = sqlite(vec![throttled(1)]).await;
    let sqlite: Arc<dyn Store> = Arc::new(backstop_test_support::KeepsNoNotes(sqlite));
    let board = serve_board(acting_board(&sqlite, &target)).await;
    let (status, html) = send(format!("{board}/breaker/override"), Some("alice"), {
        let (_, page) = get_as(&format!("{board}/records?class=throttled"), "alice").await;
        good(&csrf(&page))
    })
    .await;
    assert_eq!(status, 500, "{html}");
    let error = text(element(&html, "error"));
    assert!(
        error.contains("was not written") && error.contains("keeps no fleet notes"),
        "{error}"
    );
    assert!(sqlite.audit(0..10).await.unwrap().is_empty());
}
