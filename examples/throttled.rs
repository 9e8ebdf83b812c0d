//! A provider that limits its rate, and four client stacks measured against it one after the
//! other: how much gets through, how often the provider had to say 429, how long a delivered
//! message took, and whether anything was delivered twice.
//!
//! **The provider** (axum on 127.0.0.1, a random port, a fresh one per stack) admits `--rate N`
//! requests a second with a token bucket: N tokens a second, a burst of at most N, one token per
//! request. A request that finds no token is answered `429 Too Many Requests` with
//! `Retry-After: 1`; an admitted one is answered `200 OK`. It counts, on its side, the requests it
//! received, the 429s it sent (in all, and after the first 5 s of the run), and each delivery per
//! `Idempotency-Key` (every message carries its own key), so a message delivered twice is counted
//! where it happened.
//!
//! **The load**: `--callers C` tasks, each sending one message after another through the stack for
//! `--seconds D`, then finishing the message in hand. A call succeeds when the stack returns a 2xx
//! response; anything else is a failed call, counted by its reason.
//!
//! **The stacks** (each around its own `reqwest::Client`, each attempt bounded by 2 s):
//!
//! - `tower Retry`: tower's `Retry` with a policy that retries a 429 after its `Retry-After`, at
//!   most 3 attempts, over tower's `Timeout`;
//! - `tower-resilience adaptive`: tower-resilience's adaptive concurrency limiter (AIMD, with the
//!   settings its README shows and a ceiling of C) in front of its retry (3 attempts, 1 s apart:
//!   its delay cannot read `Retry-After`, so it is set to the provider's 1 s), with a 429 turned
//!   into an error below them, so that both see it;
//! - `backstop preset, rate off` and `backstop preset`: `BackstopLayer::http(2 s)` as the README
//!   shows it, without a store. The first is the preset with its adaptive send rate turned off
//!   (`without_adaptive_rate`: each request honours its own `Retry-After`, nothing more), the
//!   second the preset as it comes (a 429 lowers the host's send rate, and calls wait their turn).
//!
//! Run all four (about two minutes with the defaults) and print one row each:
//!
//! ```sh
//! cargo run --release --example throttled --features reqwest
//! cargo run --release --example throttled --features reqwest -- --rate 50 --callers 100 --seconds 30
//! cargo run --release --example throttled --features reqwest -- --only "tower Retry"
//! ```
//!
//! `--only` takes a stack's name or its short name: `tower-retry`, `tower-resilience`,
//! `backstop-rate-off`, `backstop`.
//!
//! `--check` measures one stack (`--only`, by default `backstop preset`) and exits non-zero,
//! saying why, unless its goodput from 5 s to the end of the load is within 10 % of N, the 429s
//! are at most 10 % of what the provider received after the first 5 s, and no message was
//! delivered twice (the first 5 s are left out so that the bucket's first burst does not count;
//! `--seconds` must then be above 5):
//!
//! ```sh
//! cargo run --release --example throttled --features reqwest -- --seconds 10 --check
//! ```

use std::time::Duration;

use clap::{Parser, ValueEnum};
use tower_backstop::BackstopLayer;

#[path = "support/throttle.rs"]
mod throttle;

use throttle::{ATTEMPT_TIMEOUT, ClientCounts, Error, Load, run, stacks};

/// The start of a run that the 429 share leaves out: the bucket's first burst, and the time a
/// stack needs to find the provider's rate.
const WARM_UP: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(
    about = "Goodput, 429s, latency and duplicates of four stacks against a rate-limited provider"
)]
struct Args {
    /// Requests a second the provider admits (a token bucket, burst of the same size).
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Tasks sending one message after another.
    #[arg(long, default_value_t = 100)]
    callers: usize,
    /// How long each stack is loaded, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Measure this stack only.
    #[arg(long, value_enum)]
    only: Option<Stack>,
    /// Measure one stack (`--only`, default `backstop preset`) and exit non-zero unless its
    /// goodput from 5 s to the end of the load is within 10 % of the rate, 429s are at most
    /// 10 % of what the provider received after 5 s, and nothing was delivered twice.
    #[arg(long)]
    check: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Stack {
    #[value(name = "tower Retry", alias = "tower-retry")]
    TowerRetry,
    #[value(name = "tower-resilience adaptive", alias = "tower-resilience")]
    Adaptive,
    #[value(name = "backstop preset, rate off", alias = "backstop-rate-off")]
    BackstopRateOff,
    #[value(name = "backstop preset", alias = "backstop")]
    Backstop,
}

impl Stack {
    const ALL: [Stack; 4] = [
        Stack::TowerRetry,
        Stack::Adaptive,
        Stack::BackstopRateOff,
        Stack::Backstop,
    ];

    fn name(self) -> &'static str {
        match self {
            Stack::TowerRetry => "tower Retry",
            Stack::Adaptive => "tower-resilience adaptive",
            Stack::BackstopRateOff => "backstop preset, rate off",
            Stack::Backstop => "backstop preset",
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    if args.check && args.seconds <= WARM_UP.as_secs() {
        return Err(format!("--check needs --seconds above {}", WARM_UP.as_secs()).into());
    }
    let stacks = match (args.only, args.check) {
        (Some(stack), _) => vec![stack],
        (None, true) => vec![Stack::Backstop],
        (None, false) => Stack::ALL.to_vec(),
    };
    println!(
        "provider: {} requests/s (token bucket, burst {}), 429 with Retry-After: 1 above it; \
         {} callers for {} s per stack",
        args.rate, args.rate, args.callers, args.seconds
    );
    let mut rows = Vec::new();
    for stack in stacks {
        let row = measure(stack, &args).await?;
        rows.push(row);
    }
    print_table(&rows, args.rate);
    if args.check {
        let failed = check(&rows[0], args.rate);
        if !failed.is_empty() {
            for why in &failed {
                eprintln!("check failed for {}: {why}", rows[0].stack.name());
            }
            std::process::exit(1);
        }
        println!("check passed for {}", rows[0].stack.name());
    }
    Ok(())
}

/// One stack against a fresh provider: build it, load it, read both sides' counts.
async fn measure(stack: Stack, args: &Args) -> Result<Row, Error> {
    let provider = provider::Provider::start(args.rate)?;
    let client = reqwest::Client::new();
    let url: reqwest::Url = format!("{}/v1/messages", provider.url()).parse()?;
    let load = Load {
        callers: args.callers,
        duration: Duration::from_secs(args.seconds),
        warm_up: WARM_UP,
    };
    println!("measuring {} ...", stack.name());
    let clients = match stack {
        Stack::TowerRetry => run(stacks::tower_retry(client, url), &load).await,
        Stack::Adaptive => run(stacks::adaptive(client, url, args.callers)?, &load).await,
        Stack::BackstopRateOff => {
            // The same preset with its adaptive send rate off.
            let preset = BackstopLayer::http(ATTEMPT_TIMEOUT).without_adaptive_rate();
            run(stacks::backstop(client, url, preset), &load).await
        }
        Stack::Backstop => {
            // The preset as it comes, its adaptive send rate on by default.
            let preset = BackstopLayer::http(ATTEMPT_TIMEOUT);
            run(stacks::backstop(client, url, preset), &load).await
        }
    };
    let provider = provider.stop();
    Ok(Row {
        stack,
        duration: load.duration,
        clients,
        provider,
    })
}

/// The loopback provider: a token bucket of `rate` a second (burst `rate`), `429` with
/// `Retry-After: 1` above it, its own counts of what it received and delivered.
mod provider {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::post;

    use super::WARM_UP;

    /// A provider serving on its own thread (so that a client that spins cannot starve it).
    pub(super) struct Provider {
        url: String,
        shared: Arc<Shared>,
        stop: tokio::sync::oneshot::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    }

    /// What the provider counted.
    #[derive(Debug, Default)]
    pub(super) struct Counts {
        pub(super) received: u64,
        pub(super) throttled: u64,
        pub(super) received_after_warm_up: u64,
        pub(super) throttled_after_warm_up: u64,
        /// Keys delivered (answered 200) at least once.
        pub(super) delivered: u64,
        /// Keys delivered more than once.
        pub(super) duplicates: u64,
    }

    struct Shared {
        rate: f64,
        started: Instant,
        state: Mutex<Bucket>,
    }

    struct Bucket {
        tokens: f64,
        refilled: Instant,
        counts: Counts,
        deliveries: HashMap<String, u32>,
    }

    impl Provider {
        /// Binds 127.0.0.1 on a random port and serves `POST /v1/messages`.
        pub(super) fn start(rate: u32) -> std::io::Result<Provider> {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.set_nonblocking(true)?;
            let url = format!("http://{}", listener.local_addr()?);
            let now = Instant::now();
            let shared = Arc::new(Shared {
                rate: f64::from(rate),
                started: now,
                state: Mutex::new(Bucket {
                    tokens: f64::from(rate),
                    refilled: now,
                    counts: Counts::default(),
                    deliveries: HashMap::new(),
                }),
            });
            let app = axum::Router::new()
                .route("/v1/messages", post(message))
                .with_state(shared.clone());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a provider runtime");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    tokio::select! {
                        served = axum::serve(listener, app) => served.expect("the provider serves"),
                        _ = stopped => {}
                    }
                });
            });
            Ok(Provider {
                url,
                shared,
                stop,
                thread,
            })
        }

        pub(super) fn url(&self) -> &str {
            &self.url
        }

        /// Stops serving (open connections are dropped) and returns the counts.
        pub(super) fn stop(self) -> Counts {
            let _ = self.stop.send(());
            self.thread.join().expect("the provider thread panicked");
            let mut bucket = self.shared.state.lock().expect("the provider's lock");
            let mut counts = std::mem::take(&mut bucket.counts);
            counts.delivered = bucket.deliveries.len() as u64;
            counts.duplicates = bucket.deliveries.values().filter(|&&n| n > 1).count() as u64;
            counts
        }
    }

    /// One request: a token admits it (200, its key's delivery counted), no token is a 429.
    async fn message(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> impl IntoResponse {
        let now = Instant::now();
        let after_warm_up = now.duration_since(shared.started) >= WARM_UP;
        let mut bucket = shared.state.lock().expect("the provider's lock");
        let refill = now.duration_since(bucket.refilled).as_secs_f64() * shared.rate;
        bucket.tokens = (bucket.tokens + refill).min(shared.rate);
        bucket.refilled = now;
        bucket.counts.received += 1;
        bucket.counts.received_after_warm_up += u64::from(after_warm_up);
        if bucket.tokens < 1.0 {
            bucket.counts.throttled += 1;
            bucket.counts.throttled_after_warm_up += u64::from(after_warm_up);
            return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")]).into_response();
        }
        bucket.tokens -= 1.0;
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        *bucket.deliveries.entry(key).or_default() += 1;
        StatusCode::OK.into_response()
    }
}

/// One stack's figures, both sides.
struct Row {
    stack: Stack,
    /// The load's duration (D).
    duration: Duration,
    clients: ClientCounts,
    provider: provider::Counts,
}

impl Row {
    fn goodput(&self) -> f64 {
        self.clients.succeeded as f64 / self.clients.elapsed.as_secs_f64()
    }

    /// Successful calls a second from the end of the warm-up to the end of the load: the rate a
    /// stack keeps once the bucket's first burst (which adds N / D to the whole run's goodput)
    /// is spent, and before the callers stop.
    fn steady_goodput(&self) -> f64 {
        let steady = self.duration.saturating_sub(WARM_UP).as_secs_f64();
        self.clients.succeeded_steady as f64 / steady.max(f64::MIN_POSITIVE)
    }

    fn received_per_second(&self) -> f64 {
        self.provider.received as f64 / self.clients.elapsed.as_secs_f64()
    }

    /// The 429s' share of what the provider received after the warm-up, in per cent.
    fn throttled_share(&self) -> f64 {
        let received = self.provider.received_after_warm_up.max(1) as f64;
        100.0 * self.provider.throttled_after_warm_up as f64 / received
    }

    /// The `q`-quantile of the successful calls' latencies.
    fn latency(&self, q: f64) -> Option<Duration> {
        self.clients.latency(q)
    }
}

fn print_table(rows: &[Row], rate: u32) {
    println!();
    println!(
        "| stack | goodput /s | % of N | provider received /s | 429 share after 5 s | p50 | p99 | failed calls | duplicates |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let ms = |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()));
    for row in rows {
        println!(
            "| {} | {:.1} | {:.0} % | {:.1} | {:.1} % | {} | {} | {} | {} |",
            row.stack.name(),
            row.goodput(),
            100.0 * row.goodput() / f64::from(rate),
            row.received_per_second(),
            row.throttled_share(),
            ms(row.latency(0.50)),
            ms(row.latency(0.99)),
            row.clients.failed,
            row.provider.duplicates,
        );
    }
    println!();
    for row in rows {
        let mut reasons: Vec<_> = row.clients.reasons.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1));
        println!(
            "{}: {} succeeded ({:.1}/s from {} s to the end of the load), {} failed in {:.1} s; \
             provider: {} received, {} answered 429, {} keys delivered",
            row.stack.name(),
            row.clients.succeeded,
            row.steady_goodput(),
            WARM_UP.as_secs(),
            row.clients.failed,
            row.clients.elapsed.as_secs_f64(),
            row.provider.received,
            row.provider.throttled,
            row.provider.delivered,
        );
        for (reason, n) in reasons.iter().take(5) {
            println!("  failed: {n} × {reason}");
        }
    }
}

/// What `--check` asserts, each broken rule as a sentence.
fn check(row: &Row, rate: u32) -> Vec<String> {
    let mut failed = Vec::new();
    let n = f64::from(rate);
    if (row.steady_goodput() - n).abs() > 0.1 * n {
        failed.push(format!(
            "goodput from {} s to the end of the load, {:.1}/s, is not within 10 % of the provider's {rate}/s",
            WARM_UP.as_secs(),
            row.steady_goodput()
        ));
    }
    if row.throttled_share() > 10.0 {
        failed.push(format!(
            "{:.1} % of the requests the provider received after the first {} s were answered 429 (at most 10 %)",
            row.throttled_share(),
            WARM_UP.as_secs()
        ));
    }
    if row.provider.duplicates > 0 {
        failed.push(format!(
            "{} messages were delivered more than once",
            row.provider.duplicates
        ));
    }
    failed
}
