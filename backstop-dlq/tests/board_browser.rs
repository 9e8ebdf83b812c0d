//! The dead-letter board in a real browser: Debian's Chromium, driven through chromedriver
//! (WebDriver) by fantoccini, against a board served on 127.0.0.1 over a seeded SQLite store,
//! re-driving to a real axum provider on 127.0.0.1.
//!
//! Each page is saved as a PNG under `target/tmp/board-screenshots/`. Without chromedriver (or
//! Chromium at `/usr/bin/chromium`) the tests are reported as ignored, with the reason, unless
//! `BACKSTOP_REQUIRE_BROWSER=1` (as `.ci/run` sets), when they fail (backstop-test-support).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::routing::post;
use backstop_dlq::Board;
use backstop_test_support::Tests;
use bytes::Bytes;
use fantoccini::{Client, ClientBuilder, Locator};
use http_body_util::Full;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, record_of};
use tower_backstop::store::{Record, SqliteStore, Status, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

/// chromedriver on a free port, ended on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver (found on `PATH` at start-up, by the harness).
async fn driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("chromedriver cannot start: {e}"));
    let driver = Driver { child, port };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return driver;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen on port {port}");
}

/// A headless Chromium session, with the flags this machine's closed network needs.
async fn browser(driver: &Driver, profile: &std::path::Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session with Chromium")
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("board-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn snap(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// The provider: answers 202 and notes each message id it received, once per request.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<String>>>,
}

async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn provider() -> (Provider, SocketAddr) {
    let p = Provider::default();
    let seen = p.seen.clone();
    let app = axum::Router::new().route(
        "/v1/messages",
        post(move |headers: http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let id = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                seen.lock().unwrap().push(id);
                http::StatusCode::ACCEPTED
            }
        }),
    );
    (p, serve(app).await)
}

fn record(id: &str, class: &'static str, code: Code, message: String, to: SocketAddr) -> Record {
    let f: Failure = Failure::new(Class::new(class), code);
    let mut r = record_of(
        id.to_owned(),
        Envelope::new(format!("{{\"id\":\"{id}\",\"to\":\"user@example.test\"}}"))
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", format!("http://{to}/v1/messages"))
            .with_metadata("idempotency-key", id)
            .with_header("x-tenant", "acme")
            .with_tag("campaign", "<script>alert('x')</script>"),
        &f,
    );
    r.message = message;
    r
}

/// Dead letters of three kinds: 5 throttled (429), 4 transient (503, one group), 2 permanent.
async fn seeded(dir: &std::path::Path, to: SocketAddr) -> Arc<dyn Store> {
    let store = SqliteStore::open(dir.join("dl.db")).unwrap();
    let now = SystemTime::now();
    let mut records = Vec::new();
    for i in 0..5 {
        records.push(record(
            &format!("thr-{i}"),
            "throttled",
            Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            format!("429 from 10.0.0.{i}: slow down, retry in {i}0 s"),
            to,
        ));
    }
    for i in 0..4 {
        records.push(record(
            &format!("tr-{i}"),
            "transient",
            Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
            format!("503 Service Unavailable for message {}", 1000 + i),
            to,
        ));
    }
    for i in 0..2 {
        records.push(record(
            &format!("perm-{i}"),
            "permanent",
            Code::Http(http::StatusCode::BAD_REQUEST),
            "400 invalid recipient".to_owned(),
            to,
        ));
    }
    for (i, r) in records.iter_mut().enumerate() {
        r.last_failed_at = now - Duration::from_secs(60 * (i as u64 + 1));
        r.first_failed_at = r.last_failed_at;
    }
    store.put_many(records).await.unwrap();
    Arc::new(store)
}

/// The stack a re-drive sends through: a dead-letter layer over the same store, classified HTTP,
/// a real hyper-util client.
fn stack(
    store: &Arc<dyn Store>,
) -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = Failure<http::Response<hyper::body::Incoming>>,
    Future: Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(store)))
        .layer(ClassifyLayer::http())
        .service(client)
}

/// Waits (up to 30 s) until the browser's address contains `part`: a submitted form returns
/// before the next page has loaded.
async fn url_containing(c: &Client, part: &str) {
    for _ in 0..600 {
        if c.current_url().await.unwrap().as_str().contains(part) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the browser never reached an address with {part:?}");
}

/// The text of the element `css` names, waited for: a click that submits a form returns before
/// the next page has loaded (fantoccini's `wait` polls up to 30 s).
async fn text(c: &Client, css: &str) -> String {
    c.wait()
        .for_element(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// An operator's round: the overview, a filter by class, a record, then a group re-driven with a
/// dry run and a confirm; the provider gets each message once and the audit trail says who.
async fn an_operator_filters_opens_a_record_and_redrives_a_group() {
    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    let (provider, to) = provider().await;
    let store = seeded(dir.path(), to).await;
    let board = Board::new(Arc::clone(&store))
        .authorize(|_| Some("alice".to_owned()))
        .redrive_through(stack(&store));
    let addr = serve(axum::Router::new().nest("/dead-letters", board.router())).await;
    let base = format!("http://{addr}/dead-letters");
    let c = browser(&driver, &dir.path().join("profile")).await;

    // The overview: outstanding counts, the classes' bars.
    c.goto(&base).await.unwrap();
    let overview = text(&c, "#overview").await;
    assert!(overview.contains("throttled"), "{overview}");
    assert!(
        overview.contains("11"),
        "11 outstanding dead letters: {overview}"
    );
    snap(&c, "overview").await;

    // The list, filtered by class through the form.
    c.goto(&format!("{base}/records")).await.unwrap();
    let form = c.form(Locator::Css("#filter")).await.unwrap();
    form.set_by_name("class", "throttled").await.unwrap();
    form.submit().await.unwrap();
    // The unfiltered list has `#records` too: wait for the filtered page's address first.
    url_containing(&c, "class=throttled").await;
    let rows = text(&c, "#records").await;
    assert!(rows.contains("thr-0") && rows.contains("thr-4"), "{rows}");
    assert!(!rows.contains("tr-0") && !rows.contains("perm-0"), "{rows}");
    // The tag's HTML is shown as text, never run.
    let source = c.source().await.unwrap();
    assert!(!source.contains("<script>alert"), "escaped");
    snap(&c, "list").await;

    // A record, opened from the list.
    c.find(Locator::LinkText("thr-2"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let shown = text(&c, "#record").await;
    assert!(
        shown.contains("thr-2") && shown.contains("x-tenant"),
        "{shown}"
    );
    assert!(shown.contains("429"), "{shown}");
    snap(&c, "record").await;

    // The groups: the four 503s are one group (their message ids masked).
    c.goto(&format!("{base}/groups")).await.unwrap();
    let groups = text(&c, "#groups").await;
    assert!(groups.contains("transient"), "{groups}");
    snap(&c, "groups").await;
    // Re-drive the transient group: its records, then the dry run, then the confirm.
    let row = c
        .find(Locator::XPath(
            "//*[@id='groups']//tr[contains(., 'transient')]",
        ))
        .await
        .unwrap();
    row.find(Locator::Css("a.see"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rows = text(&c, "#records").await;
    assert!(rows.contains("tr-0") && !rows.contains("thr-0"), "{rows}");
    c.find(Locator::Css("#preview"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&c, "#planned").await.trim(), "4");
    assert!(
        provider.seen.lock().unwrap().is_empty(),
        "a dry run sends nothing"
    );
    snap(&c, "redrive-preview").await;
    c.find(Locator::Css("#confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let result = text(&c, "#result").await;
    assert!(result.contains("resolved 4"), "{result}");
    snap(&c, "redrive-result").await;
    let mut seen = provider.seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, ["tr-0", "tr-1", "tr-2", "tr-3"], "each message once");
    for i in 0..4 {
        let r = store.get(&format!("tr-{i}")).await.unwrap().unwrap();
        assert_eq!(r.status, Status::Resolved);
    }

    // The audit trail shows it, by the hook's actor.
    c.goto(&format!("{base}/audit")).await.unwrap();
    let audit = text(&c, "#audit").await;
    assert!(
        audit.contains("alice") && audit.contains("redrive") && audit.contains("resolved 4"),
        "{audit}"
    );
    snap(&c, "audit").await;
    c.close().await.unwrap();
}

/// A read-only board shows no action, and refuses the action posted anyway.
async fn a_read_only_board_refuses_the_action() {
    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    let (provider, to) = provider().await;
    let store = seeded(dir.path(), to).await;
    // A re-drive service, but no authorisation hook: read-only.
    let board = Board::new(Arc::clone(&store)).redrive_through(stack(&store));
    let addr = serve(board.router()).await;
    let c = browser(&driver, &dir.path().join("profile")).await;

    c.goto(&format!("http://{addr}/records/tr-1"))
        .await
        .unwrap();
    assert!(text(&c, "#record").await.contains("tr-1"));
    assert!(
        c.find_all(Locator::Css("#preview, #confirm, #confirm-purge"))
            .await
            .unwrap()
            .is_empty(),
        "no action on a read-only board"
    );
    snap(&c, "read-only-record").await;
    // The action posted anyway, from a form the page does not offer.
    let mut fields = HashMap::new();
    fields.insert("id", "tr-1");
    c.execute(
        "const f = document.createElement('form'); f.method = 'POST'; f.action = arguments[0];
         for (const [k, v] of Object.entries(arguments[1])) {
             const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i);
         }
         document.body.appendChild(f); f.submit();",
        vec![
            serde_json::json!(format!("http://{addr}/redrive/run")),
            serde_json::json!(fields),
        ],
    )
    .await
    .unwrap();
    c.wait()
        .for_url(&url_of(&format!("http://{addr}/redrive/run")))
        .await
        .unwrap();
    let body = c
        .find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.to_lowercase().contains("read-only") || body.contains("403"),
        "{body}"
    );
    snap(&c, "read-only-refused").await;
    assert!(provider.seen.lock().unwrap().is_empty(), "nothing sent");
    assert_eq!(
        store.get("tr-1").await.unwrap().unwrap().status,
        Status::Dead
    );
    c.close().await.unwrap();
}

fn url_of(s: &str) -> url::Url {
    url::Url::parse(s).unwrap()
}

/// An outage of one customer's host, as an operator sees it: the overview's breaker panel shows
/// its live breaker open, with the time to half-open and the cause, and the re-drive preview of
/// that host's records warns before anything is sent, with how many records it concerns.
async fn an_operator_sees_an_open_breaker_and_is_warned_before_a_redrive() {
    use tower::ServiceExt as _;
    use tower_backstop::breaker::BreakerLayer;

    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    let (provider, to) = provider().await;
    let store = seeded(dir.path(), to).await;
    // The second customer's host answers 503 to everything, and counts what it gets.
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let down = serve(axum::Router::new().fallback(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { http::StatusCode::SERVICE_UNAVAILABLE }
    }))
    .await;
    // The app's stack: a breaker per host, open after two failures for five minutes.
    let breaker = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(300))
        .per_host();
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let app = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(client);
    for id in ["down-0", "down-1", "down-2"] {
        let request = http::Request::post(format!("http://{down}/v1/messages"))
            .header("idempotency-key", id)
            .body(Full::new(Bytes::from(format!("{{\"id\":\"{id}\"}}"))))
            .unwrap();
        assert!(app.clone().oneshot(request).await.is_err());
    }
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the third was rejected"
    );
    // One delivery to the healthy host, through its own breaker.
    let request = http::Request::post(format!("http://{to}/v1/messages"))
        .header("idempotency-key", "up-0")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert!(app.clone().oneshot(request).await.is_ok());
    let board = Board::new(Arc::clone(&store))
        .authorize(|_| Some("alice".to_owned()))
        .breakers(breaker.health())
        .redrive_through(app.clone());
    let addr = serve(axum::Router::new().nest("/dead-letters", board.router())).await;
    let base = format!("http://{addr}/dead-letters");
    let c = browser(&driver, &dir.path().join("profile")).await;

    // The overview: the down host's breaker is open, with its cause and the time to half-open;
    // the healthy host's is closed.
    c.goto(&base).await.unwrap();
    let down_row = text(&c, &format!("#breakers tr[data-breaker='{down}']")).await;
    assert!(down_row.contains("open"), "{down_row}");
    assert!(down_row.contains("half-opens in"), "{down_row}");
    assert!(down_row.contains("503"), "the cause: {down_row}");
    let up_row = text(&c, &format!("#breakers tr[data-breaker='{to}']")).await;
    assert!(up_row.contains("closed"), "{up_row}");
    snap(&c, "breakers").await;

    // The list of that host's records, then the re-drive preview: a warning before any send.
    c.goto(&format!("{base}/records?host={down}"))
        .await
        .unwrap();
    let rows = text(&c, "#records").await;
    assert!(rows.contains("down-0") && !rows.contains("thr-0"), "{rows}");
    c.find(Locator::Css("#preview"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let warning = text(&c, "#breaker-warning").await;
    assert!(
        warning.contains(&format!(
            "3 of these 3 records go to {down}, whose breaker is open"
        )),
        "{warning}"
    );
    assert!(text(&c, "#confirm").await.contains("anyway"));
    snap(&c, "redrive-warning").await;
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a preview sends nothing"
    );
    assert_eq!(*provider.seen.lock().unwrap(), ["up-0"]);
    c.close().await.unwrap();
}

/// A provider that throttles, as an operator sees it: the overview's breaker panel shows its
/// breaker closed and paced, at the rate the live breaker reports (read just before and just
/// after the page: the rate only grows between throttled answers, so the page's lies between).
async fn an_operator_sees_a_throttled_providers_send_rate() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;
    use tower_backstop::breaker::{BreakerLayer, State};

    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    let (_provider, to) = provider().await;
    let store = seeded(dir.path(), to).await;
    // The throttling host takes 20 requests, then answers 429 to everything.
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let busy = serve(axum::Router::new().fallback(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 20 {
                http::StatusCode::ACCEPTED
            } else {
                http::StatusCode::TOO_MANY_REQUESTS
            }
        }
    }))
    .await;
    let breaker = BreakerLayer::new().per_host();
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let app = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(client);
    let mut throttled = 0;
    for i in 0..21 {
        let request = http::Request::post(format!("http://{busy}/v1/messages"))
            .header("idempotency-key", format!("busy-{i}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        if let Err(f) = app.clone().oneshot(request).await {
            assert_eq!(f.class(), Class::THROTTLED);
            throttled += 1;
        }
    }
    assert_eq!((hits.load(Ordering::SeqCst), throttled), (21, 1));
    let handle = breaker
        .handle_for(&busy.to_string())
        .expect("the host's breaker");
    assert_eq!(handle.state(), State::Closed, "a 429 does not open it");
    let board = Board::new(Arc::clone(&store)).breakers(breaker.health());
    let addr = serve(board.router()).await;
    let c = browser(&driver, &dir.path().join("profile")).await;

    // The limit's first measure runs a second after the 429 (three when it cannot read a rate):
    // no rate is reported until it ends. Wait for it, ten seconds at most.
    let limited_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while handle.send_rate().is_none() && std::time::Instant::now() < limited_by {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let before = handle
        .send_rate()
        .expect("limited once its first measure ended");
    c.goto(&format!("http://{addr}/")).await.unwrap();
    let row = text(&c, &format!("#breakers tr[data-breaker='{busy}']")).await;
    let after = handle.send_rate().expect("still limited");
    let peak = handle.send_rate_peak().expect("limited");
    assert!(row.contains("closed"), "{row}");
    let shown = row
        .split("paced at ")
        .nth(1)
        .unwrap_or_else(|| panic!("no send rate: {row}"));
    let (rate, rest) = shown
        .split_once("/s of ")
        .expect("paced at R/s of P/s peak");
    let rate: f64 = rate.parse().unwrap();
    assert!(
        rest.starts_with(&format!("{peak:.1}/s peak")),
        "the peak {peak}: {row}"
    );
    // One decimal, as shown.
    assert!(
        rate >= before - 0.05 - 1e-9 && rate <= after + 0.05 + 1e-9,
        "shown {rate}, read {before} before and {after} after: {row}"
    );
    // The healthy host's breaker is not paced: nothing shown.
    let request = http::Request::post(format!("http://{to}/v1/messages"))
        .header("idempotency-key", "up-0")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert!(app.clone().oneshot(request).await.is_ok());
    c.refresh().await.unwrap();
    let up_row = text(&c, &format!("#breakers tr[data-breaker='{to}']")).await;
    assert!(!up_row.contains("paced"), "{up_row}");
    snap(&c, "send-rate").await;
    c.close().await.unwrap();
}

/// An app whose store stops answering keeps its failures in its local spool; the board mounted
/// in it shows the spool's depth and that the store does not answer, on the error page of a
/// store that cannot be read; once the store is back and the spool forwarded, the overview shows
/// it empty.
async fn an_operator_sees_the_apps_spool_while_the_store_is_down() {
    use tower::ServiceExt as _;
    use tower_backstop::BackstopLayer;
    use tower_backstop::dead_letter::DeadLetterLayer;
    use tower_backstop::store::{Spool, SqliteStore};

    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    // A provider that refuses every message for good (a 400: a dead letter at once).
    let refusing =
        serve(axum::Router::new().fallback(|| async { http::StatusCode::BAD_REQUEST })).await;
    let sqlite = SqliteStore::open(dir.path().join("d.db")).unwrap();
    let store: Arc<dyn Store> = Arc::new(sqlite.clone());
    let spool = Spool::open(dir.path().join("spool.db")).unwrap();
    let backstop = BackstopLayer::http(std::time::Duration::from_secs(2))
        .dead_letters(DeadLetterLayer::from_arc(Arc::clone(&store)).spool(spool.clone()));
    let health = backstop.health();
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let app = ServiceBuilder::new().layer(backstop).service(client);
    // The store is closed: every failure goes to the spool.
    sqlite.close();
    for i in 0..4 {
        let request = http::Request::post(format!("http://{refusing}/v1/messages"))
            .header("idempotency-key", format!("spooled-{i}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        assert!(app.clone().oneshot(request).await.is_err());
    }
    assert_eq!(spool.state().records, 4);
    let board = Board::new(Arc::clone(&store)).breakers(health);
    let addr = serve(board.router()).await;
    let c = browser(&driver, &dir.path().join("profile")).await;
    c.goto(&format!("http://{addr}/")).await.unwrap();
    assert!(text(&c, "#error").await.contains("cannot be read"));
    assert_eq!(text(&c, "#spool-records").await, "4");
    assert_eq!(
        text(&c, "#store-state").await,
        "does not answer: they wait on this machine's disk"
    );
    snap(&c, "spool-store-down").await;
    // The store back (opened again on its file): the forwarder empties the spool into it.
    let reopened = SqliteStore::open(dir.path().join("d.db")).unwrap();
    let forwarded = spool
        .forward_once(&reopened, std::time::Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(forwarded.written, 4);
    let board = Board::new(Arc::new(reopened)).breakers(
        tower_backstop::breaker::BreakerLayer::new()
            .health()
            .spool(&spool),
    );
    let addr = serve(board.router()).await;
    c.goto(&format!("http://{addr}/")).await.unwrap();
    assert_eq!(text(&c, "#spool-records").await, "0");
    assert_eq!(text(&c, "#store-state").await, "takes them");
    assert_eq!(text(&c, "#dead").await, "4");
    c.close().await.unwrap();
}

/// An operator forces a host's breaker open for the fleet from the overview's form (a duration
/// and a reason), and the overview then shows the override with its actor; the store holds the
/// fleet's note and the audit entry.
async fn an_operator_forces_a_breaker_open_for_the_fleet() {
    use tower_backstop::breaker::{FleetOverride, OverrideAction};
    use tower_backstop::store::{AuditAction, FleetNote, MemoryStore};

    let driver = driver().await;
    let dir = tempfile::tempdir().unwrap();
    // A store that keeps the fleet's notes, and one process's word on the host's breaker.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let name = "api.mail.test:443";
    store
        .put_note(FleetNote::new(
            format!("breaker:{name}"),
            "proc-a",
            r#"{"v":1,"state":"closed","own":false}"#,
            SystemTime::now(),
            Duration::from_secs(600),
        ))
        .await
        .unwrap();
    let board = Board::new(Arc::clone(&store)).authorize(|_| Some("alice".to_owned()));
    let addr = serve(axum::Router::new().nest("/dead-letters", board.router())).await;
    let base = format!("http://{addr}/dead-letters");
    let c = browser(&driver, &dir.path().join("profile")).await;

    c.goto(&base).await.unwrap();
    let row = format!("#breakers tr[data-breaker='{name}']");
    assert!(text(&c, &row).await.contains("proc-a: closed"));
    // The row's override form: opened, filled in, sent with "force open".
    c.find(Locator::Css(&format!("{row} details summary")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let form = c
        .form(Locator::Css(&format!("{row} form.override")))
        .await
        .unwrap();
    form.set_by_name("for", "2h").await.unwrap();
    form.set_by_name("reason", "provider maintenance")
        .await
        .unwrap();
    snap(&c, "breaker-override-form").await;
    c.find(Locator::Css(&format!("{row} button[value='force_open']")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let result = text(&c, "#result").await;
    assert!(
        result.contains(&format!("Written for the fleet: {name} force_open until")),
        "{result}"
    );
    assert!(result.contains("by alice"), "{result}");
    snap(&c, "breaker-override-written").await;

    // The overview shows the override in force, with its actor and reason.
    c.goto(&base).await.unwrap();
    let shown = text(&c, &format!("{row} .override")).await;
    assert!(
        shown.contains("force_open until")
            && shown.contains("by alice")
            && shown.contains("provider maintenance"),
        "{shown}"
    );
    snap(&c, "breaker-override").await;
    let over = store
        .notes(SystemTime::now())
        .await
        .unwrap()
        .iter()
        .find_map(FleetOverride::from_note)
        .expect("the override's note");
    assert_eq!(
        (over.breaker.as_str(), over.action, over.actor.as_str()),
        (name, OverrideAction::ForceOpen, "alice")
    );
    let audit = store.audit(0..10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].action, audit[0].actor.as_str()),
        (AuditAction::Breaker, "alice")
    );
    c.close().await.unwrap();
}

fn main() {
    let mut tests = Tests::new();
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "an_operator_sees_the_apps_spool_while_the_store_is_down",
            an_operator_sees_the_apps_spool_while_the_store_is_down,
        );
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "an_operator_filters_opens_a_record_and_redrives_a_group",
            an_operator_filters_opens_a_record_and_redrives_a_group,
        );
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "a_read_only_board_refuses_the_action",
            a_read_only_board_refuses_the_action,
        );
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "an_operator_sees_an_open_breaker_and_is_warned_before_a_redrive",
            an_operator_sees_an_open_breaker_and_is_warned_before_a_redrive,
        );
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "an_operator_sees_a_throttled_providers_send_rate",
            an_operator_sees_a_throttled_providers_send_rate,
        );
    tests
        .needs(backstop_test_support::Service::Browser)
        .multi_thread(
            "an_operator_forces_a_breaker_open_for_the_fleet",
            an_operator_forces_a_breaker_open_for_the_fleet,
        );
    tests.run();
}
