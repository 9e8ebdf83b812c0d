//! A fleet soak: four OS processes, each the README's preset and a `Scheduler` over one shared
//! store (Postgres or Redis), send 2,000 keyed messages to a loopback provider that is down for
//! 60 s; one process is killed with SIGKILL mid-drain and started again.
//!
//! ```text
//! cargo run --example fleet_soak --features postgres,redis                   # both stores, full
//! cargo run --example fleet_soak --features postgres,redis -- --store redis  # one store
//! cargo run --example fleet_soak --features postgres,redis -- --small        # what `.ci/run` runs
//! cargo run --example fleet_soak --features postgres,redis -- --fleet-rate 50  # one shared drain rate
//! cargo run --example fleet_soak --features postgres,redis -- --store-outage   # the store down too
//! cargo run --example fleet_soak --features postgres,redis -- --share-breakers # one view of the provider
//! ```
//!
//! `--store` takes `postgres`, `pgbouncer` or `redis` (the URL from `BACKSTOP_POSTGRES_URL`,
//! `BACKSTOP_PGBOUNCER_URL` with `pooler=transaction`, or `BACKSTOP_REDIS_URL`), `sentinel`
//! (with `--store-outage` only), or a `postgres://` or `redis://` URL; without it, both stores run, one
//! after the other. Each run keeps its records in a Postgres schema or under a Redis key prefix of
//! its own (`fleet_soak_<pid>_<time>`) and removes them at its end.
//!
//! # The provider
//!
//! An axum server on a fixed `127.0.0.1` port below the kernel's ephemeral range, so that it can
//! bind the same port again after the outage. `POST /v1/messages` needs an `Idempotency-Key`; it
//! commits each key once and answers `202 Accepted` to every request, counting per key the
//! requests (deliveries) and whether and when the key was committed. Re-sends of the schedulers
//! carry a header naming the child that sent them, so the provider also logs each re-send.
//!
//! **Down means connections refused**: at the outage the provider drops its listener and closes
//! every open connection, so each attempt meets a refused connection (a request that was
//! provably not sent), as when a provider's process or host is gone; at recovery it listens on
//! the same port again. (A provider that answers 503 is the other soak's outage,
//! `examples/soak.rs`.)
//!
//! # The fleet
//!
//! The parent starts the provider, opens the store once (which creates the schema), and starts
//! four children: this binary again (`std::env::current_exe`) with the role `child`. Each child
//! builds the README's preset, `BackstopLayer::http(2 s)` with a 5-attempt retry policy and a
//! `DeadLetterLayer` over the shared store, calls `learn_from_store`, runs a `Scheduler` with the
//! defaults (50 re-sends a second per process, 10 s leases, a look at the store at least every
//! second), and sends its share of the messages (message `j` goes to child `j mod 4`) open loop:
//! message `j` at `window × j / 2000` after the common start. It acknowledges each message to
//! the parent when its call ends (delivered, or failed and written to the store).
//!
//! The window: healthy 5 s, down 60 s, healthy 15 s. Once the provider is back and the
//! schedulers are draining (200 re-sends have reached the provider since the recovery), the
//! parent SIGKILLs a child while it holds claims. Each child's store is the shared one behind a
//! tap that tells the parent each claim the child wins or renews, with its fencing token and
//! its end (`tap.rs`); a record the store shows in flight under the last claim a child told of
//! it is that child's. Looking every 10 ms, the parent chooses the child that holds the most,
//! once it holds at least 4 (a batch it is sending; at least 1 after 3 s of waiting), stops it
//! at once (SIGSTOP), gives the store writes it had sent 100 ms to land, and reads which records
//! are in flight, with their fencing tokens and the ends of their claims: when the stopped
//! child holds at least one of them, it kills it (SIGKILL) and starts it again; when it holds
//! none (a batch sent, or given back, in the meantime), it lets it go on (SIGCONT) and chooses
//! again (at most 20 times). A claim was the killed process's when the store shows it claimed
//! again (a higher token) or changed only after its end; one renewed or finished before its end
//! had a live holder.
//!
//! **The new process resumes the share**: the parent plays the queue the messages came from,
//! and hands the new process every message of the share that the killed one had not
//! acknowledged (a message whose call was cut by the kill is redelivered by the queue, under
//! the same key); if the share was finished, the new process only runs its scheduler.
//!
//! The parent waits until every share is acknowledged and the store has no deferred or
//! in-flight record (at most 4 minutes after the window), then closes the children's stdin: each
//! shuts its scheduler down and exits.
//!
//! # The report and the targets
//!
//! Per store, the run prints the messages delivered exactly once, the keys never committed,
//! the deliveries beyond the first (absorbed by the key) and why, the dead letters by class,
//! code and root cause, the backlog and the drain (its time and rate, its peak over a second,
//! re-sends per child), and the claims of the killed process with the time each took to be
//! taken over. It exits with status 1 when one is missed:
//!
//! - every key committed, each once; none lost (neither committed nor in the store);
//! - no dead letter by a local rejection (an open breaker's, class `circuit_open`), nor by any
//!   other cause: a message whose in-process attempts all met the refused port in the moment
//!   before its process's breaker opened is deferred to the scheduler (the preset's second tier
//!   with a store), not dead; any dead letter is listed by class, code and root cause;
//! - no record still deferred or in flight at the end;
//! - a child killed mid-drain while it held claims, every one of them taken over within the
//!   lease, a scheduler's look at the store and 2 s (13 s), plus the time the drain rate needs
//!   for the records due before the claims ended (schedulers claim in retry-at order);
//! - a delivery beyond a key's first only where a process was cut: a claim or call of the
//!   killed child, or a request answered in the moment the provider went down (closed before
//!   its answer was written).
//!
//! `--small` runs 400 messages over healthy 2 s, down 12 s, healthy 4 s, and kills after 40
//! re-sends: about 35 s per store. `--fleet-rate N` gives every scheduler one shared drain
//! rate through the store (`Scheduler::fleet_rate`) instead of 50 a second each.
//!
//! # Shared breakers (`--share-breakers`)
//!
//! Each process shares its breakers through the store (`BackstopLayer::share_breakers`) and its
//! scheduler watches them (`Scheduler::watch_breakers`). Each child tells the parent its breaker's
//! state at each change and the running count of the requests it put on the wire; the report says
//! when each process's breaker opened after the provider went down and closed after it came back,
//! how many requests met the down provider (per process, and the fleet's over the most one process
//! sent), and how long after the recovery the backlog was re-sent, all but the killed process's
//! claims (which wait for their lease). Targets with `--share-breakers`: the processes' breakers
//! open within 1 s of each other and close within 1 s of each other, and the drain starts within
//! 1 s of the last close. Reported, not enforced: the drain against 10 s after the recovery (it
//! starts at the prober's first probe after the recovery, within 5 s, and goes at the
//! schedulers' rate), and the fleet's requests to the down provider against 1.25 times one
//! process's (each process trips on its own failures within about half a second of the outage,
//! before the fleet's notes reach it). Without the flag the same figures are printed, for
//! comparison.
//!
//! # The store down too (`--store-outage`)
//!
//! The store fails in the middle of the provider's outage, when the callers' failures most need
//! it: 15 s into the outage it is stopped hard for 30 s (`--small`: 3 s into a 14 s outage, for
//! 8 s). The run then starts a store server of its own, which it can stop and start again (a
//! Postgres cluster of its own stopped with `pg_ctl stop -m immediate`, as a crash, reached
//! directly or through a PgBouncer of its own in transaction pooling that stays up; a
//! `redis-server` with an append-only file fsync'd on every write, killed with SIGKILL; with
//! `--store sentinel`, a Redis primary, replica and Sentinel, the primary killed with SIGKILL and
//! not started again while the Sentinel promotes the replica), the URL
//! given only choosing which kind; and each process keeps what the store does not take in a local
//! spool of its own (`DeadLetterLayer::spool`; the killed and restarted child opens its
//! predecessor's). The targets are the same, and every spool must be empty at the end, drained
//! within 5 s of the store's return. `--no-spool` runs the same without the spools, to see what
//! the outage costs without them (its targets are then missed).

mod breakers;
mod child;
mod fleet;
mod provider;
mod report;
mod run;
mod stores;
mod tap;

use std::process::ExitCode;
use std::time::Duration;

use tower::BoxError;

/// The per-attempt timeout of the preset, as in the README.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts per call, as in the README.
const MAX_ATTEMPTS: u32 = 5;
/// The number of child processes.
const CHILDREN: usize = 4;

/// The idempotency key of message `j`.
fn key_of(j: usize) -> String {
    format!("fleet-{j:05}")
}

/// The phases and sizes of a run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    messages: usize,
    healthy: Duration,
    down: Duration,
    after: Duration,
    /// Re-sends that reached the provider after the recovery before the kill.
    kill_after_resends: usize,
    /// How long after the window the parent waits for the store to settle.
    settle_bound: Duration,
    fleet_rate: Option<u32>,
    /// The store stopped hard this long after the provider went down, for this long; the run
    /// then has a store server of its own and every process a local spool.
    store_outage: Option<(Duration, Duration)>,
    /// With a store outage: whether the processes have a local spool (`--no-spool`: not, to
    /// see what the outage costs without one).
    spool: bool,
    /// Whether the processes share their breakers through the store (`--share-breakers`).
    share_breakers: bool,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            messages: 2_000,
            healthy: Duration::from_secs(5),
            down: Duration::from_secs(60),
            after: Duration::from_secs(15),
            kill_after_resends: 200,
            settle_bound: Duration::from_secs(240),
            fleet_rate: None,
            store_outage: None,
            spool: true,
            share_breakers: false,
        }
    }

    fn small() -> Plan {
        Plan {
            messages: 400,
            healthy: Duration::from_secs(2),
            down: Duration::from_secs(12),
            after: Duration::from_secs(4),
            kill_after_resends: 40,
            settle_bound: Duration::from_secs(60),
            fleet_rate: None,
            store_outage: None,
            spool: true,
            share_breakers: false,
        }
    }

    fn window(&self) -> Duration {
        self.healthy + self.down + self.after
    }
}

/// The store URLs `--store` names, or both from the environment.
fn store_urls(args: &[String]) -> Result<Vec<String>, BoxError> {
    let from_env = |var: &str| {
        std::env::var(var).map_err(|_| -> BoxError {
            format!("{var} is not set: give --store a postgres:// or redis:// URL").into()
        })
    };
    let at = args.iter().position(|a| a == "--store");
    match at.map(|at| args.get(at + 1)) {
        None => Ok(vec![
            from_env("BACKSTOP_POSTGRES_URL")?,
            from_env("BACKSTOP_REDIS_URL")?,
        ]),
        Some(None) => Err("--store needs a value: postgres, pgbouncer, redis, or a URL".into()),
        Some(Some(s)) if s == "postgres" => Ok(vec![from_env("BACKSTOP_POSTGRES_URL")?]),
        Some(Some(s)) if s == "redis" => Ok(vec![from_env("BACKSTOP_REDIS_URL")?]),
        // A Sentinel of the run's own: with --store-outage only.
        Some(Some(s)) if s == "sentinel" => Ok(vec!["redis+sentinel://own/backstop".to_owned()]),
        Some(Some(s)) if s == "pgbouncer" => {
            let url = from_env("BACKSTOP_PGBOUNCER_URL")?;
            let sep = if url.contains('?') { '&' } else { '?' };
            Ok(vec![format!("{url}{sep}pooler=transaction")])
        }
        Some(Some(url)) => {
            stores::Kind::of(url)?;
            Ok(vec![url.clone()])
        }
    }
}

fn plan_from(args: &[String]) -> Result<Plan, BoxError> {
    let mut plan = if args.iter().any(|a| a == "--small") {
        Plan::small()
    } else {
        Plan::full()
    };
    if let Some(at) = args.iter().position(|a| a == "--fleet-rate") {
        let rate = args
            .get(at + 1)
            .ok_or("--fleet-rate needs a number of re-sends a second")?;
        let rate: u32 = rate
            .parse()
            .map_err(|e| format!("--fleet-rate {rate}: {e}"))?;
        if rate == 0 {
            return Err("--fleet-rate must be at least 1".into());
        }
        plan.fleet_rate = Some(rate);
    }
    plan.spool = !args.iter().any(|a| a == "--no-spool");
    plan.share_breakers = args.iter().any(|a| a == "--share-breakers");
    if args.iter().any(|a| a == "--store-outage") {
        // Full: the store down 30 s from 15 s into the provider's 60 s outage. Small: 8 s from
        // 3 s into a 14 s outage.
        plan.store_outage = Some(if plan.messages == Plan::small().messages {
            plan.down = Duration::from_secs(14);
            (Duration::from_secs(3), Duration::from_secs(8))
        } else {
            (Duration::from_secs(15), Duration::from_secs(30))
        });
    }
    Ok(plan)
}

async fn parent(args: &[String]) -> Result<bool, BoxError> {
    let plan = plan_from(args)?;
    let mut met = true;
    for url in store_urls(args)? {
        let outcome = run::run(&url, plan).await?;
        let misses = report::print(&outcome);
        met &= misses.is_empty();
    }
    Ok(met)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fleet_soak: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.first().is_some_and(|a| a == "child") {
        // A child's log, on its stderr, when `FLEET_SOAK_LOG` names what to show
        // (`tower_backstop=info`); none otherwise.
        if let Ok(filter) = std::env::var("FLEET_SOAK_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .init();
        }
        let result = fleet::settings_from(&args[1..]);
        return match result.map(|s| runtime.block_on(child::run(s))) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) | Err(e) => {
                eprintln!("fleet_soak child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(parent(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fleet_soak: {e}");
            ExitCode::FAILURE
        }
    }
}
