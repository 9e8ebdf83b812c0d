//! The provider, in a child process of its own (this example run again with `--provider`), so
//! that the client's CPU time is the client's alone: axum on 127.0.0.1, a random port told on
//! its stdout, `POST /start` to start its clock and its schedule, `POST /v1/messages` for the
//! load, `GET /counts` for what it counted in each second since the start. It exits when its
//! stdin closes (the parent is done with it, or gone).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;

use crate::grid::{Cell, Mode, RetryAfter, WORK};
use crate::throttle::Error;

/// What the provider counted in one second of the run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Slice {
    /// Requests answered `200` (in `concurrency` mode, in the second their work ended).
    pub admitted: u64,
    /// Requests answered `429`.
    pub throttled: u64,
    /// Requests received (in the second they arrived).
    pub received: u64,
}

/// What the provider counted over the run.
#[derive(Debug, Default)]
pub struct Counts {
    /// One a second from `POST /start`, up to the last request.
    pub slices: Vec<Slice>,
    /// Keys delivered (answered 200) at least once.
    pub delivered: u64,
    /// Keys delivered more than once.
    pub duplicates: u64,
}

/// The child's command line (after `--provider`).
#[derive(Parser, Debug)]
pub struct ProviderArgs {
    #[arg(long, value_parser = |s: &str| Mode::parse(s).ok_or("rate, change or concurrency"))]
    mode: Mode,
    /// The quota a second (in `concurrency` mode: the limit of requests in flight).
    #[arg(long)]
    quota: u32,
    #[arg(long, value_parser = |s: &str| RetryAfter::parse(s).ok_or("seconds or none"))]
    retry_after: RetryAfter,
    /// A third of the run, in seconds (`change` mode).
    #[arg(long)]
    third: u64,
}

/// A provider child, seen from the parent.
pub struct Provider {
    url: String,
    child: Child,
    stdin: Option<ChildStdin>,
    control: reqwest::Client,
}

impl Provider {
    /// Starts this example again as `cell`'s provider and reads the address it serves on.
    pub fn spawn(cell: &Cell, third: u64) -> Result<Provider, Error> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--provider", "--mode", cell.mode.name()])
            .args(["--quota", &cell.quota.to_string()])
            .args(["--retry-after", &cell.retry_after.to_string()])
            .args(["--third", &third.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("the provider's stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        if line.trim().is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the provider exited without telling its address".into());
        }
        Ok(Provider {
            url: format!("http://{}", line.trim()),
            child,
            stdin,
            control: reqwest::Client::new(),
        })
    }

    /// The URL the load posts to.
    pub fn messages_url(&self) -> Result<reqwest::Url, Error> {
        Ok(format!("{}/v1/messages", self.url).parse()?)
    }

    /// Starts the provider's clock: its seconds, its bucket (full) and its schedule count from
    /// now.
    pub async fn start(&self) -> Result<(), Error> {
        let url = format!("{}/start", self.url);
        self.control.post(url).send().await?.error_for_status()?;
        Ok(())
    }

    /// Reads the provider's counts, then stops it.
    pub async fn finish(mut self) -> Result<Counts, Error> {
        let url = format!("{}/counts", self.url);
        let text = self.control.get(url).send().await?.text().await?;
        // Its stdin closed, the provider exits.
        drop(self.stdin.take());
        let status = tokio::task::spawn_blocking(move || self.child.wait()).await??;
        if !status.success() {
            return Err(format!("the provider exited with {status}").into());
        }
        parse_counts(&text)
    }
}

/// The counts' text: `slice ADMITTED THROTTLED RECEIVED` a line a second, then `delivered N`
/// and `duplicates N`.
fn parse_counts(text: &str) -> Result<Counts, Error> {
    let mut counts = Counts::default();
    for line in text.lines() {
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        match (line.split_whitespace().next(), fields.as_slice()) {
            (Some("slice"), &[admitted, throttled, received]) => counts.slices.push(Slice {
                admitted,
                throttled,
                received,
            }),
            (Some("delivered"), &[n]) => counts.delivered = n,
            (Some("duplicates"), &[n]) => counts.duplicates = n,
            _ => return Err(format!("an unexpected line in the provider's counts: {line}").into()),
        }
    }
    Ok(counts)
}

/// The provider's state.
struct Shared {
    /// The shape served (its callers unused).
    cell: Cell,
    third: f64,
    in_flight: AtomicU32,
    book: Mutex<Book>,
}

struct Book {
    /// `POST /start`'s instant (the first request's, if none came first).
    started: Option<Instant>,
    tokens: f64,
    /// Seconds since the start when the bucket was last refilled.
    refilled: f64,
    slices: Vec<Slice>,
    deliveries: HashMap<String, u32>,
}

impl Book {
    /// Seconds since the start (starting the clock if it has not started).
    fn now(&mut self, now: Instant) -> f64 {
        now.duration_since(*self.started.get_or_insert(now))
            .as_secs_f64()
    }

    fn slice(&mut self, t: f64) -> &mut Slice {
        let i = t as usize;
        if self.slices.len() <= i {
            self.slices.resize(i + 1, Slice::default());
        }
        &mut self.slices[i]
    }

    fn deliver(&mut self, headers: &HeaderMap) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        *self.deliveries.entry(key.to_owned()).or_default() += 1;
    }
}

impl Shared {
    /// The tokens the bucket gains from `from` to `to` seconds: the quota integrated over the
    /// schedule, so a change between two requests is counted where it happened.
    fn refill(&self, from: f64, to: f64) -> f64 {
        let bounds = [0.0, self.third, 2.0 * self.third, f64::INFINITY];
        bounds
            .windows(2)
            .map(|w| {
                let overlap = (to.min(w[1]) - from.max(w[0])).max(0.0);
                overlap * self.cell.quota_at(w[0], self.third)
            })
            .sum()
    }

    fn throttled(&self) -> Response {
        let mut response = StatusCode::TOO_MANY_REQUESTS.into_response();
        if let RetryAfter::Seconds(seconds) = self.cell.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Serves as the provider `args` describes until stdin closes.
pub fn serve(args: ProviderArgs) -> Result<(), Error> {
    let cell = Cell {
        mode: args.mode,
        quota: args.quota,
        callers: usize::MAX,
        retry_after: args.retry_after,
    };
    let shared = Arc::new(Shared {
        third: args.third as f64,
        in_flight: AtomicU32::new(0),
        book: Mutex::new(Book {
            started: None,
            tokens: cell.nominal(),
            refilled: 0.0,
            slices: Vec::new(),
            deliveries: HashMap::new(),
        }),
        cell,
    });
    let app = axum::Router::new()
        .route("/v1/messages", post(message))
        .route("/start", post(start))
        .route("/counts", get(counts))
        .with_state(shared);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(([127, 0, 0, 1], 0).into())?;
        // Thousands of callers connect at once: a backlog for all of them.
        let listener = socket.listen(4096)?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{}", listener.local_addr()?)?;
        stdout.flush()?;
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
        axum::serve(listener, app).await?;
        Ok(())
    })
}

async fn start(State(shared): State<Arc<Shared>>) -> StatusCode {
    let mut book = shared.book.lock().expect("the provider's lock");
    book.started = Some(Instant::now());
    book.tokens = shared.cell.nominal();
    book.refilled = 0.0;
    StatusCode::NO_CONTENT
}

async fn counts(State(shared): State<Arc<Shared>>) -> String {
    use std::fmt::Write as _;
    let book = shared.book.lock().expect("the provider's lock");
    let mut text = String::new();
    for s in &book.slices {
        let _ = writeln!(text, "slice {} {} {}", s.admitted, s.throttled, s.received);
    }
    let duplicates = book.deliveries.values().filter(|&&n| n > 1).count();
    let _ = writeln!(text, "delivered {}", book.deliveries.len());
    let _ = writeln!(text, "duplicates {duplicates}");
    text
}

/// One request: in `rate` and `change` mode a token admits it at once; in `concurrency` mode
/// a place among the requests in flight admits it for 50 ms of work. Otherwise a 429.
async fn message(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if shared.cell.mode == Mode::Concurrency {
        return in_flight(shared, headers).await;
    }
    let mut book = shared.book.lock().expect("the provider's lock");
    let t = book.now(Instant::now());
    let from = book.refilled;
    let tokens = book.tokens + shared.refill(from, t);
    book.tokens = tokens.min(shared.cell.quota_at(t, shared.third));
    book.refilled = t;
    book.slice(t).received += 1;
    if book.tokens < 1.0 {
        book.slice(t).throttled += 1;
        return shared.throttled();
    }
    book.tokens -= 1.0;
    book.slice(t).admitted += 1;
    book.deliver(&headers);
    StatusCode::OK.into_response()
}

/// Takes one of the places in flight back when the request ends (answered or dropped).
struct Place(Arc<Shared>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn in_flight(shared: Arc<Shared>, headers: HeaderMap) -> Response {
    let t = {
        let mut book = shared.book.lock().expect("the provider's lock");
        let t = book.now(Instant::now());
        book.slice(t).received += 1;
        t
    };
    let before = shared.in_flight.fetch_add(1, Ordering::SeqCst);
    let place = Place(shared.clone());
    if before >= shared.cell.quota {
        drop(place);
        let mut book = shared.book.lock().expect("the provider's lock");
        book.slice(t).throttled += 1;
        return shared.throttled();
    }
    tokio::time::sleep(WORK).await;
    let mut book = shared.book.lock().expect("the provider's lock");
    let t = book.now(Instant::now());
    book.slice(t).admitted += 1;
    book.deliver(&headers);
    drop(place);
    StatusCode::OK.into_response()
}
