//! The backstop preset beside tower's `Retry` and tower-resilience's adaptive concurrency limiter,
//! over a grid of throttling providers: how much gets through, how often the provider had to
//! say 429, how many calls failed, how long a delivered message took, how soon a stack follows
//! a quota that changes, what the client spent in CPU per call, and whether anything was
//! delivered twice. The provider's own counts are the ground truth wherever they can be.
//!
//! **The provider** runs in a child process (this example started again with `--provider`), so
//! that the client's CPU time, read with `getrusage(RUSAGE_SELF)`, is the client's alone. It is
//! axum on 127.0.0.1 (a random port, a fresh provider for each cell and stack) and counts, for
//! each second from the start of the load, the requests it received, answered `200` and
//! answered `429`, and the deliveries of each `Idempotency-Key` (a key delivered twice is a
//! duplicate). Its modes:
//!
//! - `rate`: a token bucket of Q a second with a burst of Q (full at the start); a request
//!   without a token is answered `429` with the cell's `Retry-After` (`0`, `1`, `2` or none);
//! - `change`: the same bucket, Q for the first third of the run, cut by 60 % (0.4·Q) for the
//!   second, raised 4× from there (1.6·Q) for the last; the changes fall exactly on the thirds;
//! - `concurrency`: `429` when L requests are already in flight (`--limit`, 20 by default);
//!   each admitted request takes 50 ms, so the capacity is L ÷ 50 ms (400 a second).
//!
//! **The load**: C callers, each sending one message after another for the cell's length (30 s,
//! `--seconds`; a `change` cell runs three thirds of that length each), then finishing the
//! message in hand. Every call has the same overall deadline (30 s, `--deadline`): the preset's
//! own (`RetryPolicy::deadline`, the retry layer of `BackstopLayer::http(2 s)`), tower's
//! `Timeout` around each peer (which bounds the call, not the wait for readiness). Each attempt
//! is bounded by 2 s in every stack.
//!
//! **The stacks**, as `examples/throttled.rs` builds them: `backstop` (the preset as it comes,
//! its adaptive send rate on, no store), `tower-retry` (tower's `Retry`, 3 attempts, each 429
//! retried after its `Retry-After`, 1 s without one) and `tower-resilience` (its AIMD limiter in
//! front of its retry, 3 attempts 1 s apart).
//!
//! **The grid** (the full form): quotas 5, 20, 50, 200 and 1000 a second with callers at 2× and
//! 8× the quota, in `rate` and `change` mode (`Retry-After: 1`); `concurrency` mode with callers
//! at 2× and 8× its capacity; `Retry-After` 0, 2 and none at quota 50 with 8× callers. A cell
//! whose callers ÷ lowest quota (the seconds a caller would wait for its turn at the quota) is
//! above a third of the deadline is dropped, and the output says so: at a 30 s deadline, the
//! `change` cells with 8× callers (8 ÷ 0.4 = 20 s). `--small` is five cells of 10 s: quota 20
//! and 200 with 8× callers, a `change` cell at 50 with 2×, `concurrency` with 2×, and
//! `Retry-After` none at 50 with 8×.
//!
//! **The figures**, each row one cell and one stack:
//!
//! - *goodput, run*: the provider's `200`s from the start to the end of the load, as a share of
//!   the quota over that time (in `concurrency` mode of the capacity; were the callers fewer
//!   than the quota, of what they could send), and a second;
//! - *goodput, steady*: the same after the first 2 s (the bucket's first burst and a stack's
//!   first reaction left out), to the end of the load; in `change` mode over the last half of
//!   each third: the lowest of the three, then each in brackets (above 100 %: tokens the bucket
//!   saved while a stack sent less, spent later);
//! - *429s after 1 s*: the provider's `429`s among the requests it received after the first
//!   second, to its last request;
//! - *failed*: calls that ended in anything but a `2xx` (client side; the reasons follow the
//!   table), and their share of all calls;
//! - *p50*, *p99*: latencies of successful calls, from the caller asking the stack to be ready to
//!   its answer;
//! - *tracks cut / raise* (`change` mode): after each change, the end of the first second from
//!   which on, every second to the end of that third, the provider admitted at least 90 % of the
//!   new quota (rounded down to whole requests) and answered fewer than 10 % of what it received
//!   `429`, counted from the change (`1 s`: from the first second on; `never`: not even in the
//!   third's last second);
//! - *client CPU per call*: user and system CPU time of the client process during the run ÷ its
//!   calls;
//! - *duplicates*: keys the provider delivered more than once.
//!
//! `--check` judges the `backstop` rows and exits 1, listing every miss (cell, figure, value,
//! target), unless: steady goodput ≥ 90 % of the quota (≥ 80 % of the capacity in
//! `concurrency` mode) in every window, goodput over the run ≥ 85 %, 429s ≤ 10 % after the
//! first second, failed calls ≤ 1 %, no duplicate, each quota change tracked within 3 s, and a
//! p99 at most 1.2× tower-resilience's in the same cell.
//!
//! ```sh
//! cargo run --release --example throttle_sweep --features reqwest -- --small
//! cargo run --release --example throttle_sweep --features reqwest -- --markdown sweep.md
//! cargo run --release --example throttle_sweep --features reqwest -- --cells rate-q1000 --stacks backstop
//! cargo run --release --example throttle_sweep --features reqwest -- --list
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tower::{Service, ServiceBuilder};
use tower_backstop::BackstopLayer;
use tower_backstop::retry::RetryPolicy;

mod grid;
mod provider;
mod report;
#[path = "../support/throttle.rs"]
mod throttle;

use grid::Cell;
use provider::Provider;
use report::Row;
use throttle::{ATTEMPT_TIMEOUT, ClientCounts, Error, Failed, Load, Message, run, stacks};

/// A cell's length with `--small`, in seconds.
const SMALL_SECONDS: u64 = 10;

#[derive(Parser, Debug)]
#[command(
    about = "The backstop preset beside tower's Retry and tower-resilience's adaptive limiter over a grid of throttling providers"
)]
struct Args {
    /// Seconds of load in a cell (a third of a `change` cell): 30, or 10 with `--small`.
    #[arg(long)]
    seconds: Option<u64>,
    /// Every call's overall deadline, in seconds, in every stack.
    #[arg(long, default_value_t = 30)]
    deadline: u64,
    /// The small form: five cells of 10 s.
    #[arg(long)]
    small: bool,
    /// Only these stacks (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    stacks: Vec<Stack>,
    /// Only the cells whose name contains one of these (comma-separated), as `rate-q50,change`.
    #[arg(long, value_delimiter = ',')]
    cells: Vec<String>,
    /// The provider's limit of requests in flight in `concurrency` mode.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// At most this many callers in a cell (the output names the cells capped).
    #[arg(long)]
    max_callers: Option<usize>,
    /// Also write the header, the table and its notes to this file (markdown).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Judge the backstop rows against the targets and exit 1 listing every miss.
    #[arg(long)]
    check: bool,
    /// List the cells (and those dropped) and exit.
    #[arg(long)]
    list: bool,
    /// Print the provider's counts of each second after each run (admitted/429/received).
    #[arg(long)]
    slices: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stack {
    /// The preset as it comes (`BackstopLayer::http(2 s)`, its adaptive send rate on).
    #[value(name = "backstop")]
    Backstop,
    /// tower's `Retry` over tower's `Timeout`.
    #[value(name = "tower-retry")]
    TowerRetry,
    /// tower-resilience's AIMD limiter in front of its retry.
    #[value(name = "tower-resilience")]
    Adaptive,
}

impl Stack {
    const ALL: [Stack; 3] = [Stack::Backstop, Stack::TowerRetry, Stack::Adaptive];

    pub fn name(self) -> &'static str {
        match self {
            Stack::Backstop => "backstop",
            Stack::TowerRetry => "tower-retry",
            Stack::Adaptive => "tower-resilience",
        }
    }
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--provider") {
        let args = std::env::args().take(1).chain(std::env::args().skip(2));
        return match provider::serve(provider::ProviderArgs::parse_from(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("provider: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(sweep(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("throttle_sweep: {error}");
            ExitCode::from(2)
        }
    }
}

/// The settings every cell shares.
struct Settings {
    /// A cell's length, or a third's.
    seconds: u64,
    deadline: Duration,
}

/// Measures every cell with every stack; prints (and writes) the table; with `--check`, whether
/// the backstop rows met the targets.
async fn sweep(args: Args) -> Result<bool, Error> {
    raise_open_files_limit();
    let settings = Settings {
        seconds: args
            .seconds
            .unwrap_or(if args.small { SMALL_SECONDS } else { 30 }),
        deadline: Duration::from_secs(args.deadline),
    };
    let stacks = match args.stacks.as_slice() {
        [] => Stack::ALL.to_vec(),
        some => some.to_vec(),
    };
    let (cells, mut notes) = plan(&args)?;
    let load: u64 = cells.iter().map(|c| c.load_seconds(settings.seconds)).sum();
    eprintln!(
        "{} cells × {} stacks, {} s of load each stack (and the calls in hand after each cell)",
        cells.len(),
        stacks.len(),
        load
    );
    for cell in &cells {
        eprintln!("  {}", cell.name());
    }
    if args.list {
        notes.iter().for_each(|note| eprintln!("{note}"));
        return Ok(true);
    }
    let header = header(&settings, cells.len(), &stacks);
    let mut rows = Vec::new();
    for cell in &cells {
        for &stack in &stacks {
            let row = measure(cell, stack, &settings).await?;
            eprintln!("{}", summary(&row, args.slices));
            rows.push(row);
        }
    }
    notes.push(format!("Load average at the end: {}.", load_average()));
    let check = args.check.then(|| report::check(&rows, &mut notes));
    let mut out = format!("{header}\n{}", report::table(&rows));
    if !notes.is_empty() {
        out += &format!("\n{}\n", notes.join("\n"));
    }
    let reasons = report::reasons(&rows);
    if !reasons.is_empty() {
        out += &format!("\nFailed calls, by reason:\n\n{reasons}");
    }
    println!("{out}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &out)?;
    }
    let Some(misses) = check else { return Ok(true) };
    for miss in &misses {
        eprintln!(
            "check missed: {}: {} is {} (target {})",
            miss.cell, miss.figure, miss.value, miss.target
        );
    }
    match misses.len() {
        0 => eprintln!("check passed: every backstop row met its targets"),
        n => eprintln!("check failed: {n} misses"),
    }
    Ok(misses.is_empty())
}

/// The cells to measure, and the notes on those dropped or capped.
fn plan(args: &Args) -> Result<(Vec<Cell>, Vec<String>), Error> {
    let grid = match args.small {
        true => grid::small(args.limit),
        false => grid::full(args.limit),
    };
    let wanted = |cell: &Cell| {
        let name = cell.name();
        args.cells.is_empty() || args.cells.iter().any(|part| name.contains(part.as_str()))
    };
    let mut cells = Vec::new();
    let mut notes = Vec::new();
    let limit = args.deadline as f64 / 3.0;
    for mut cell in grid.into_iter().filter(wanted) {
        let wait = cell.callers as f64 / cell.lowest_quota();
        if wait > limit {
            notes.push(format!(
                "Dropped `{}`: its callers ÷ its lowest quota is {wait:.0} s, above a third of the {} s deadline.",
                cell.name(),
                args.deadline
            ));
            continue;
        }
        if let Some(max) = args.max_callers.filter(|&max| cell.callers > max) {
            let name = cell.name();
            cell.callers = max;
            notes.push(format!(
                "`{}`: callers capped at {max} (`--max-callers`; the grid's cell is `{name}`).",
                cell.name()
            ));
        }
        cells.push(cell);
    }
    if cells.is_empty() {
        return Err("no cell to measure (see --cells, --list)".into());
    }
    Ok((cells, notes))
}

/// What the table was measured with, and on what.
fn header(settings: &Settings, cells: usize, stacks: &[Stack]) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split(':').nth(1)?.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Throttling sweep, {}: {cells} cells × {} stacks ({}); {} s of load a cell (a `change` \
         cell: three thirds of {} s each), every call's deadline {} s, each attempt's {} s. \
         {cores} cores ({cpu}), load average at the start {}.\n",
        httpdate::fmt_http_date(std::time::SystemTime::now()),
        stacks.len(),
        stacks
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        settings.seconds,
        settings.seconds,
        settings.deadline.as_secs(),
        ATTEMPT_TIMEOUT.as_secs(),
        load_average(),
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or("unknown".to_owned(), |l| {
        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    })
}

/// One stack in one cell, against a provider of its own.
async fn measure(cell: &Cell, stack: Stack, settings: &Settings) -> Result<Row, Error> {
    let children = cpu_time(libc::RUSAGE_CHILDREN);
    let spawned = cell.clone();
    let third = settings.seconds;
    let provider = tokio::task::spawn_blocking(move || Provider::spawn(&spawned, third)).await??;
    let url = provider.messages_url()?;
    let client = reqwest::Client::new();
    let load = Load {
        callers: cell.callers,
        duration: Duration::from_secs(cell.load_seconds(settings.seconds)),
        warm_up: Duration::from_secs(report::STEADY_FROM),
    };
    let deadline = settings.deadline;
    eprintln!("measuring {} with {} ...", cell.name(), stack.name());
    let (clients, cpu) = match stack {
        Stack::Backstop => {
            // The preset as it comes, with the sweep's deadline on its retry layer.
            let retry = RetryPolicy::new().deadline(deadline).build()?;
            let preset = BackstopLayer::http(ATTEMPT_TIMEOUT).retry(retry);
            drive(stacks::backstop(client, url, preset), &load, &provider).await?
        }
        Stack::TowerRetry => {
            let svc = within(stacks::tower_retry(client, url), deadline);
            drive(svc, &load, &provider).await?
        }
        Stack::Adaptive => {
            let svc = within(stacks::adaptive(client, url, cell.callers)?, deadline);
            drive(svc, &load, &provider).await?
        }
    };
    let provider = provider.finish().await?;
    Ok(Row {
        cell: cell.clone(),
        stack,
        seconds: settings.seconds,
        clients,
        cpu,
        provider,
        provider_cpu: cpu_time(libc::RUSAGE_CHILDREN).saturating_sub(children),
    })
}

/// Starts the provider's clock, then the load; returns what the callers saw and the client
/// process's CPU time over the load.
async fn drive<S>(
    svc: S,
    load: &Load,
    provider: &Provider,
) -> Result<(ClientCounts, Duration), Error>
where
    S: Service<Message, Response = (), Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    provider.start().await?;
    let before = cpu_time(libc::RUSAGE_SELF);
    let clients = run(svc, load).await;
    Ok((clients, cpu_time(libc::RUSAGE_SELF).saturating_sub(before)))
}

/// A peer within the overall deadline: tower's `Timeout` around it.
fn within<S>(
    svc: S,
    deadline: Duration,
) -> impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static
where
    S: Service<Message, Response = (), Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    ServiceBuilder::new()
        .map_err(|error: tower::BoxError| match error.downcast::<Failed>() {
            Ok(failed) => *failed,
            Err(elapsed) => Failed(format!("overall deadline: {elapsed}")),
        })
        .timeout(deadline)
        .service(svc)
}

/// The user and system CPU time so far of this process (`RUSAGE_SELF`: not the provider's, a
/// child's), or of its children waited for (`RUSAGE_CHILDREN`: the providers that exited).
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: `getrusage` only writes the `rusage` it is given, which lives on this stack.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Thousands of callers hold a connection each, in the client and in the provider (which
/// inherits the limit): the soft limit of open files raised to the hard one.
fn raise_open_files_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            eprintln!("could not raise the open files limit: {error}");
        }
    }
}

/// A line for the progress log: both sides' totals (and with `slices`, the provider's counts
/// of each second).
fn summary(row: &Row, slices: bool) -> String {
    let each = &row.provider.slices;
    let received: u64 = each.iter().map(|s| s.received).sum();
    let throttled: u64 = each.iter().map(|s| s.throttled).sum();
    let mut line = format!(
        "  {} succeeded ({} from {} s to the end of the load), {} failed, in {:.1} s; provider: \
         {received} received, {throttled} answered 429, {} keys delivered, {} twice; CPU: \
         client {:.2} s, provider {:.2} s",
        row.clients.succeeded,
        row.clients.succeeded_steady,
        report::STEADY_FROM,
        row.clients.failed,
        row.clients.elapsed.as_secs_f64(),
        row.provider.delivered,
        row.provider.duplicates,
        row.cpu.as_secs_f64(),
        row.provider_cpu.as_secs_f64(),
    );
    if slices {
        let seconds: Vec<String> = each
            .iter()
            .map(|s| format!("{}/{}/{}", s.admitted, s.throttled, s.received))
            .collect();
        line += &format!(
            "\n  each second, admitted/429/received: {}",
            seconds.join(" ")
        );
    }
    line
}
