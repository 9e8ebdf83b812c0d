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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::BackstopLayer;
use tower_backstop::retry::Attempts;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Each attempt's bound, in every stack.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
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

/// What every stack is given: one message, the key the provider counts its deliveries by. Every
/// stack answers `Ok(())` when the provider took the message (a 2xx), or why it did not.
#[derive(Clone, Debug)]
struct Message {
    key: String,
}

/// Why a call failed, in a stack's own words.
#[derive(Debug)]
struct Failed(String);

/// The load's shape.
struct Load {
    callers: usize,
    duration: Duration,
}

/// What the callers saw.
#[derive(Debug, Default)]
struct ClientCounts {
    succeeded: u64,
    /// Successful calls answered after the warm-up and before the load's end (the steady part
    /// of the run).
    succeeded_steady: u64,
    failed: u64,
    reasons: HashMap<String, u64>,
    /// Each successful call's time, from the stack's `ready` to its answer; sorted.
    latencies: Vec<Duration>,
    /// From the first call to the last answer (the load's duration plus the calls in hand).
    elapsed: Duration,
}

/// `load.callers` tasks, each sending one message after another through a clone of `svc` until
/// `load.duration` has passed, then finishing its message in hand.
async fn run<S>(svc: S, load: &Load) -> ClientCounts
where
    S: Service<Message, Response = (), Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    let started = Instant::now();
    let duration = load.duration;
    let end = started + duration;
    let mut tasks = Vec::with_capacity(load.callers);
    for caller in 0..load.callers {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut counts = ClientCounts::default();
            let mut seq = 0u64;
            while Instant::now() < end {
                seq += 1;
                let message = Message {
                    key: format!("c{caller}-m{seq}"),
                };
                let sent = Instant::now();
                let result = match svc.ready().await {
                    Ok(ready) => ready.call(message).await,
                    Err(reason) => Err(reason),
                };
                match result {
                    Ok(()) => {
                        counts.succeeded += 1;
                        let answered = started.elapsed();
                        counts.succeeded_steady +=
                            u64::from(answered >= WARM_UP && answered < duration);
                        counts.latencies.push(sent.elapsed());
                    }
                    Err(Failed(reason)) => {
                        counts.failed += 1;
                        *counts.reasons.entry(reason).or_default() += 1;
                        // A stack that fails at once would otherwise keep this worker thread
                        // to itself.
                        tokio::task::yield_now().await;
                    }
                }
            }
            counts
        }));
    }
    let mut all = ClientCounts::default();
    for task in tasks {
        let counts = task.await.expect("a caller panicked");
        all.succeeded += counts.succeeded;
        all.succeeded_steady += counts.succeeded_steady;
        all.failed += counts.failed;
        for (reason, n) in counts.reasons {
            *all.reasons.entry(reason).or_default() += n;
        }
        all.latencies.extend(counts.latencies);
    }
    all.elapsed = started.elapsed();
    all.latencies.sort_unstable();
    all
}

/// The four stacks, each turned into a `Service<Message, Response = (), Error = Failed>` so that
/// one load function drives them all.
mod stacks {
    use super::*;
    use tower_backstop::Failure;

    /// A reqwest request for `message`: a POST with the message's `Idempotency-Key`.
    fn request(client: &reqwest::Client, url: &reqwest::Url, message: Message) -> reqwest::Request {
        client
            .post(url.clone())
            .header("idempotency-key", message.key)
            .body(r#"{"to":"a@example.com"}"#)
            .build()
            .expect("a POST to a parsed URL builds")
    }

    /// The client as a `Service<Message>`: one attempt, reqwest's own answer.
    fn send(
        client: reqwest::Client,
        url: reqwest::Url,
    ) -> impl Service<Message, Response = reqwest::Response, Error = reqwest::Error, Future: Send>
    + Clone
    + Send
    + 'static {
        tower::service_fn(move |message: Message| client.execute(request(&client, &url, message)))
    }

    /// A 2xx is a delivery; any other status is a failed call named by its status.
    fn delivered(response: &reqwest::Response) -> Result<(), Failed> {
        if response.status().is_success() {
            Ok(())
        } else {
            Err(Failed(format!("status {}", response.status().as_u16())))
        }
    }

    // Each stack's error as a `Failed` (`MapResult` needs `From` for readiness errors too).
    impl From<tower::BoxError> for Failed {
        fn from(error: tower::BoxError) -> Self {
            Failed(error.to_string())
        }
    }

    impl From<tower_resilience_adaptive::AdaptiveError<AttemptError>> for Failed {
        fn from(error: tower_resilience_adaptive::AdaptiveError<AttemptError>) -> Self {
            match error {
                tower_resilience_adaptive::AdaptiveError::Service(error) => {
                    Failed(error.to_string())
                }
                error => Failed(error.to_string()),
            }
        }
    }

    /// A failure's class and code, and why the retry layer stopped:
    /// `throttled (http 429): attempts exhausted`.
    impl From<Failure<reqwest::Response>> for Failed {
        fn from(failure: Failure<reqwest::Response>) -> Self {
            Failed(match failure.note::<Attempts>() {
                Some(attempts) => format!(
                    "{} ({}): {}",
                    failure.class(),
                    failure.code(),
                    attempts.give_up()
                ),
                None => format!("{} ({})", failure.class(), failure.code()),
            })
        }
    }

    /// tower's `Retry` (a 429 retried after its `Retry-After`, 3 attempts in all) over tower's
    /// `Timeout`.
    pub(super) fn tower_retry(
        client: reqwest::Client,
        url: reqwest::Url,
    ) -> impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static
    {
        ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, tower::BoxError>| match result {
                    Ok(response) => delivered(&response),
                    Err(error) => Err(Failed::from(error)),
                },
            )
            .layer(tower::retry::RetryLayer::new(RetryAfter { attempts: 3 }))
            .timeout(ATTEMPT_TIMEOUT)
            .service(send(client, url))
    }

    /// tower's retry policy for the `tower Retry` stack: a 429 is retried after the seconds of
    /// its `Retry-After` (1 s when it has none) while attempts are left; nothing else is.
    #[derive(Clone, Debug)]
    struct RetryAfter {
        /// Attempts left, the one in flight included.
        attempts: u32,
    }

    impl tower::retry::Policy<Message, reqwest::Response, tower::BoxError> for RetryAfter {
        type Future = tokio::time::Sleep;

        fn retry(
            &mut self,
            _: &mut Message,
            result: &mut Result<reqwest::Response, tower::BoxError>,
        ) -> Option<Self::Future> {
            let response = result.as_ref().ok()?;
            if response.status() != reqwest::StatusCode::TOO_MANY_REQUESTS || self.attempts <= 1 {
                return None;
            }
            self.attempts -= 1;
            let seconds = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1);
            Some(tokio::time::sleep(Duration::from_secs(seconds)))
        }

        fn clone_request(&mut self, message: &Message) -> Option<Message> {
            Some(message.clone())
        }
    }

    /// What one attempt of the `tower-resilience adaptive` stack can end in: its limiter and its
    /// retry read a failure from the error side only, so a 429 is made an error.
    #[derive(Debug)]
    enum AttemptError {
        Throttled,
        Status(u16),
        Timeout,
        Transport(reqwest::Error),
    }

    impl std::fmt::Display for AttemptError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                AttemptError::Throttled => f.write_str("status 429"),
                AttemptError::Status(status) => write!(f, "status {status}"),
                AttemptError::Timeout => f.write_str("attempt timed out"),
                AttemptError::Transport(error) => write!(f, "{error}"),
            }
        }
    }

    /// tower-resilience's AIMD limiter (its README's settings, at most `callers` in flight) in
    /// front of its retry (3 attempts, 1 s apart, on a 429 only), as its docs stack them.
    pub(super) fn adaptive(
        client: reqwest::Client,
        url: reqwest::Url,
        callers: usize,
    ) -> Result<
        impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static,
        Error,
    > {
        use tower_resilience_adaptive::{AdaptiveError, AdaptiveLimiterLayer, Aimd};
        let aimd = Aimd::builder()
            .initial_limit(10)
            .min_limit(1)
            .max_limit(callers)
            .increase_by(1)
            .decrease_factor(0.5)
            .latency_threshold(Duration::from_millis(100))
            .build()?;
        let retry = tower_resilience_retry::RetryLayer::<Message, reqwest::Response, AttemptError>::builder()
            .max_attempts(3)
            .fixed_backoff(Duration::from_secs(1))
            .retry_on(|error| matches!(error, AttemptError::Throttled))
            .build();
        let send = send(client, url);
        let attempt = tower::service_fn(move |message: Message| {
            let call = send.clone().oneshot(message);
            async move {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, call).await {
                    Err(_) => Err(AttemptError::Timeout),
                    Ok(Err(error)) => Err(AttemptError::Transport(error)),
                    Ok(Ok(response)) if response.status() == 429 => Err(AttemptError::Throttled),
                    Ok(Ok(response)) if !response.status().is_success() => {
                        Err(AttemptError::Status(response.status().as_u16()))
                    }
                    Ok(Ok(response)) => Ok(response),
                }
            }
        });
        Ok(ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, AdaptiveError<AttemptError>>| {
                    result.map(drop).map_err(Failed::from)
                },
            )
            .layer(AdaptiveLimiterLayer::new(aimd))
            .layer(retry)
            .service(attempt))
    }

    /// The README's preset around the reqwest client, `layer` as given (no store).
    pub(super) fn backstop(
        client: reqwest::Client,
        url: reqwest::Url,
        layer: BackstopLayer,
    ) -> impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static
    {
        let requests = client.clone();
        ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, Failure<reqwest::Response>>| match result {
                    Ok(response) => delivered(&response),
                    Err(failure) => Err(Failed::from(failure)),
                },
            )
            .map_request(move |message: Message| request(&requests, &url, message))
            .layer(layer)
            .service(client)
    }
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
        let sorted = &self.clients.latencies;
        if sorted.is_empty() {
            return None;
        }
        let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
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
