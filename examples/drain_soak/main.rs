//! A drain soak: a backlog of due records in one shared store (Postgres or Redis), drained by
//! four OS processes, each a `Scheduler` over the store, into a loopback provider that takes
//! everything. What it measures is the store's part of a drain: how fast a fleet claims,
//! sends and acknowledges a large backlog when the provider is not what holds it back.
//!
//! ```text
//! cargo run --release --example drain_soak --features postgres,redis -- --store postgres      # 1,000,000 records
//! cargo run --release --example drain_soak --features postgres,redis -- --store redis --records 200000
//! cargo run --example drain_soak --features postgres,redis -- --small --store postgres        # what `.ci/run` runs
//! ```
//!
//! `--store` takes `postgres` or `redis` (the URL from `BACKSTOP_POSTGRES_URL` or
//! `BACKSTOP_REDIS_URL`) or a `postgres://` or `redis://` URL. The run keeps its records in a
//! Postgres schema or under a Redis key prefix of its own (`drain_soak_<pid>_<time>`) and
//! removes them at its end.
//!
//! # The run
//!
//! The parent starts the provider (an axum server on `127.0.0.1` that commits each
//! `Idempotency-Key` once and answers `202 Accepted`, counting per key the requests it got),
//! seeds the backlog with `put_many` in batches of 1,000 (records of 5 classes, 20 codes, a
//! 300-byte JSON payload, each with its own key, all due now), then starts four children: this
//! binary again with the role `child`. Each runs a `Scheduler` over the store with a rate of
//! its own high enough not to bind (`--rate`, 100,000 re-sends a second) and `--concurrency`
//! re-sends in flight (64), sending through `ClassifyLayer::http()` and a hyper client. The
//! drain is timed from the moment the children are told to start to the moment the provider
//! has every key.
//!
//! It exits with status 1 when a target is missed: every key delivered, each exactly once (no
//! record claimed twice); nothing left deferred or in flight; and, with `--within SECONDS`,
//! the drain done within that time. `--small` drains 10,000 records and sets no time target
//! (a debug build on a shared machine says nothing of the rate).

use std::io::{BufRead, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, ServiceBuilder};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::record_of;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::store::{Record, Status, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

#[allow(dead_code)]
#[path = "../fleet_soak/provider.rs"]
mod provider;
#[allow(dead_code)]
#[path = "../fleet_soak/stores.rs"]
mod stores;

/// The processes that drain the backlog.
const CHILDREN: usize = 4;
/// Records written with each `put_many` of the seeding.
const SEED_BATCH: usize = 1_000;

/// What a run is asked for.
#[derive(Debug)]
struct Plan {
    url: String,
    records: usize,
    rate: u32,
    concurrency: usize,
    within: Option<Duration>,
}

fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

fn number<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> Result<T, BoxError>
where
    T::Err: std::fmt::Display,
{
    match value(args, flag) {
        None if args.iter().any(|a| a == flag) => Err(format!("{flag} needs a number").into()),
        None => Ok(default),
        Some(v) => v.parse().map_err(|e| format!("{flag} {v}: {e}").into()),
    }
}

fn plan_from(args: &[String]) -> Result<Plan, BoxError> {
    let from_env = |var: &str| {
        std::env::var(var).map_err(|_| -> BoxError {
            format!("{var} is not set: give --store a postgres:// or redis:// URL").into()
        })
    };
    let url = match value(args, "--store") {
        None => return Err("--store postgres|redis|URL is required".into()),
        Some("postgres") => from_env("BACKSTOP_POSTGRES_URL")?,
        Some("redis") => from_env("BACKSTOP_REDIS_URL")?,
        Some(url) => url.to_owned(),
    };
    if !matches!(
        stores::Kind::of(&url)?,
        stores::Kind::Postgres | stores::Kind::Redis
    ) {
        return Err("--store: a postgres:// or redis:// URL (no pooler, no Sentinel)".into());
    }
    let small = args.iter().any(|a| a == "--small");
    let records = number(args, "--records", if small { 10_000 } else { 1_000_000 })?;
    let within: Option<u64> = value(args, "--within").map(str::parse).transpose()?;
    Ok(Plan {
        url,
        records,
        rate: number(args, "--rate", 100_000)?,
        concurrency: number(args, "--concurrency", 64)?,
        within: within.map(Duration::from_secs),
    })
}

/// Record `n` of the backlog, due at `due`, addressed to the provider at `uri`.
fn record(n: usize, uri: &str, due: SystemTime) -> Record {
    let key = format!("drain-{n:08}");
    let failure: Failure = Failure::new(
        Class::TRANSIENT,
        Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
    );
    let mut payload = format!("{{\"id\":\"{key}\",\"body\":\"");
    payload.extend(std::iter::repeat_n('x', 300 - payload.len() - 2));
    payload.push_str("\"}");
    let mut r = record_of(
        key.clone(),
        Envelope::new(payload)
            .with_content_type("application/json")
            .with_metadata("method", "POST")
            .with_metadata("uri", uri)
            .with_header("idempotency-key", key),
        &failure,
    );
    r.class = ["transient", "throttled", "unknown", "timeout", "overloaded"][n % 5].to_owned();
    r.code = format!("http {}", 500 + n % 20);
    r.status = Status::Deferred;
    r.retry_at = Some(due);
    r
}

/// A child: its scheduler drains the store until its stdin closes.
async fn child(args: &[String]) -> Result<(), BoxError> {
    let url = value(args, "--store").ok_or("child: --store")?;
    let namespace = value(args, "--namespace").ok_or("child: --namespace")?;
    let rate: u32 = number(args, "--rate", 100_000)?;
    let concurrency: usize = number(args, "--concurrency", 64)?;
    let store = stores::open(url, namespace, 4).await?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(ClassifyLayer::http())
        .service(client);
    // The parent's lines: "go", then the end of the input.
    let (tx, mut told) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(Some(line));
        }
        let _ = tx.send(None);
    });
    println!("ready");
    if told.recv().await.flatten().is_none() {
        return Ok(());
    }
    let scheduler = Scheduler::new(store, stack, |r: &Record| http_request(r, None))
        .rate(rate)
        .concurrency(concurrency)
        .poll_every(Duration::from_millis(100))
        .spawn();
    while told.recv().await.flatten().is_some() {}
    scheduler.shutdown().await;
    Ok(())
}

/// Starts a child over the run's store.
fn start_child(plan: &Plan, namespace: &str) -> Result<Child, BoxError> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["child", "--store", &plan.url, "--namespace", namespace])
        .args(["--rate", &plan.rate.to_string()])
        .args(["--concurrency", &plan.concurrency.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("child: no stdout")?;
    let mut ready = String::new();
    std::io::BufReader::new(stdout).read_line(&mut ready)?;
    if ready.trim() != "ready" {
        return Err(format!("a child did not start: {ready:?}").into());
    }
    Ok(child)
}

async fn seed(store: &dyn Store, plan: &Plan, uri: &str) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let due = SystemTime::now();
    for from in (0..plan.records).step_by(SEED_BATCH) {
        let batch = (from..(from + SEED_BATCH).min(plan.records))
            .map(|n| record(n, uri, due))
            .collect();
        store.put_many(batch).await?;
    }
    Ok(started.elapsed())
}

/// Runs the drain; whether every target was met.
async fn parent(plan: Plan) -> Result<bool, BoxError> {
    let provider = provider::start().await?;
    let uri = format!("http://{}/v1/messages", provider.addr);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let namespace = format!("drain_soak_{}_{stamp}", std::process::id());
    let store = stores::open(&plan.url, &namespace, 4).await?;
    let kind = stores::Kind::of(&plan.url)?.name();
    let seeded = seed(&*store, &plan, &uri).await?;
    println!(
        "{kind}: seeded {} due records in {:.1} s",
        plan.records,
        seeded.as_secs_f64()
    );
    let mut children = (0..CHILDREN)
        .map(|_| start_child(&plan, &namespace))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    for child in &mut children {
        writeln!(child.stdin.as_mut().ok_or("child: no stdin")?, "go")?;
    }
    // Every key at the provider, or no progress for 30 s.
    let (mut last, mut moved) = (0, Instant::now());
    let mut at_second = Vec::new();
    let drained = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let keys = provider.keys().len();
        if keys >= plan.records {
            break Some(started.elapsed());
        }
        if keys != last {
            (last, moved) = (keys, Instant::now());
        }
        if at_second.len() < started.elapsed().as_secs() as usize {
            at_second.push(keys);
        }
        if moved.elapsed() > Duration::from_secs(30) {
            break None;
        }
    };
    let outstanding = stores::outstanding(&*store).await;
    for mut child in children {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    let keys = provider.keys();
    let twice = keys.values().filter(|s| s.requests > 1).count();
    if let Err(e) = stores::remove(&plan.url, &namespace).await {
        eprintln!("drain_soak: could not remove the run's records ({namespace}): {e}");
    }
    let outstanding = outstanding?;
    let mut met = true;
    let mut miss = |what: String| {
        println!("  MISSED: {what}");
        met = false;
    };
    println!(
        "{kind}: {} of {} keys delivered, {twice} more than once; {outstanding} records left \
         deferred or in flight",
        keys.len(),
        plan.records
    );
    if keys.len() != plan.records {
        miss(format!(
            "{} keys never delivered",
            plan.records - keys.len()
        ));
    }
    if twice > 0 {
        miss(format!("{twice} keys delivered more than once"));
    }
    if outstanding > 0 {
        miss(format!("{outstanding} records still deferred or in flight"));
    }
    match drained {
        Some(took) => {
            let rate = plan.records as f64 / took.as_secs_f64();
            let peak = at_second.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            println!(
                "{kind}: drained by {CHILDREN} processes in {:.1} s: {rate:.0} records a second \
                 (peak {peak} in a second)",
                took.as_secs_f64()
            );
            if let Some(within) = plan.within.filter(|w| took > *w) {
                miss(format!("the drain took more than {} s", within.as_secs()));
            }
        }
        None => miss("the drain stalled for 30 s".to_owned()),
    }
    Ok(met)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("drain_soak: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if args.first().is_some_and(|a| a == "child") {
        runtime.block_on(child(&args[1..])).map(|()| true)
    } else {
        plan_from(&args).and_then(|plan| runtime.block_on(parent(plan)))
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("drain_soak: {e}");
            ExitCode::FAILURE
        }
    }
}
