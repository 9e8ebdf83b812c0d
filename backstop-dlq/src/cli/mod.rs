//! The `backstop-dlq` command line (feature `cli`): look into a dead-letter store, and re-drive
//! or purge from it on purpose. The binary's `main` is [`main`].
//!
//! ```text
//! backstop-dlq --store dead_letters.db list --filter class=throttled --filter tag.campaign=spring
//! backstop-dlq --store dead_letters.db list --filter host=api.mail.test:443
//! backstop-dlq --store dead_letters.db list --limit 100 --after AQAAAAAY…
//! backstop-dlq --store dead_letters.db show msg-0042
//! backstop-dlq --store redis://127.0.0.1:6379 stats --window 1h
//! backstop-dlq --store postgres://app@db.internal/app --schema backstop stats
//! backstop-dlq --store dead_letters.db redrive --filter class=throttled --dry-run
//! backstop-dlq --store dead_letters.db redrive --target http://127.0.0.1:8080 \
//!     --filter class=throttled --rate 50 --max 200
//! backstop-dlq --store dead_letters.db purge --filter class=permanent \
//!     --filter until=2026-04-01T00:00:00Z --yes --actor alice
//! backstop-dlq --store dead_letters.db serve --bind 127.0.0.1:8080
//! backstop-dlq --store dead_letters.db serve --allow-actions --actor alice \
//!     --target http://127.0.0.1:8080
//! backstop-dlq --store postgres://app@db.internal/app breaker force-open api.mail.test:443 \
//!     --for 2h --reason "provider maintenance" --actor alice
//! backstop-dlq --store postgres://app@db.internal/app breaker list
//! backstop-dlq --store dead_letters.db reconcile --status-url 'http://provider/v1/messages/{id}' \
//!     --id-from-json id
//! backstop-dlq --store postgres://app@db.internal/app check-counts --repair
//! ```
//!
//! The store is a SQLite file (it must exist), a `redis://` or `rediss://` URL (feature `redis`,
//! keys under `--prefix`), or a `postgres://` or `postgresql://` URL (feature `postgres`, tables
//! in `--schema`). A URL's password is never printed.
//!
//! A filter is `key=value`, repeated (every one must hold): `class`, `code`, `status` (dead,
//! deferred, in_flight, resolved), `id` (several: any of them), `tag.NAME`, `since` and `until`
//! (an RFC 3339 time, or a duration back from now such as `15m`, `2h`, `7days`), and `host`
//! (`api.mail.test:443`, or `api.mail.test` for any port: the record's target as its stored URI
//! names it, else its breaker's key). The host is read off the records themselves, so a filter
//! with a host looks at the newest [`GROUP_LIMIT`](crate::GROUP_LIMIT) records that match the
//! rest of it.
//!
//! Who acts, for the audit trail of `redrive`, `purge`, `prune`, `breaker` and the board of `serve
//! --allow-actions`: `--actor NAME`, else `$USER`, else `$LOGNAME`; with none of them those
//! commands refuse to act (exit status 2) rather than record an unknown actor.
//!
//! `serve` runs the dead-letter board ([`Board`](crate::Board)) on a loopback address,
//! read-only unless `--allow-actions`; another address needs `--allow-remote`.
//!
//! A re-drive never sends again a message already delivered unless told so: records of
//! `--filter status=resolved` are skipped (the dry run warns of them, the run reports each one
//! skipped and exits with status 2) unless `redrive --include-resolved` is given; then they are
//! sent again, and the audit entry says how many were.
//!
//! `check-counts` recounts the records and compares the recount with the counters the store
//! keeps for its counts (SQLite's and Postgres's counts table, Redis's index sets by status),
//! prints each counter that drifted (expected, found), and with `--repair` sets them to the
//! recount. The counters change with every write, so they drift only when something wrote the
//! store behind its back: run it after a restore or a hand-made change, and otherwise daily or
//! weekly, from cron or CI (it reads every record once: seconds per million). On a Redis store
//! written by an earlier version, run it once with `--repair` so that counts by status and
//! class stop reading the records.
//!
//! Exit status: 0 done, 1 an error, 2 a bad command line, a purge without `--yes`, an action
//! without an actor, a re-drive that skipped records already delivered (no
//! `--include-resolved`), or a refused `serve`; 3 a `check-counts` that found drifted counters
//! and did not repair them.

use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Parser, Subcommand};
use tower_backstop::BoxError;

#[macro_use]
mod out;
mod actor;
mod args;
mod breaker;
mod check;
mod read;
mod reconcile;
mod redrive;
mod remove;
mod serve;
mod store;

use self::args::Global;

#[derive(Parser, Debug)]
#[command(
    name = "backstop-dlq",
    version,
    about = "Search, count, re-drive and purge dead letters in a tower-backstop store"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List what is outstanding: dead letters first (the most recently failed first), then
    /// deferred and in-flight records (the soonest due first). Resolved records only with
    /// `--resolved` or `--filter status=resolved`. When more follow, the command to read them
    /// is printed to stderr: `(more: --after TOKEN)`.
    List(read::List),
    /// Show one dead letter in full: host, history, metadata, payload.
    Show(read::Show),
    /// Top classes and codes of the outstanding dead letters over a window, the deferred records
    /// apart, the dead-letter rate and the alert signals (resolved records never count), and the
    /// breakers the store's deferred records wait on.
    Stats(read::StatsArgs),
    /// Re-send the dead letters that match a filter, each to the URI it was first sent to
    /// (or to `--target`), through retry, classify and timeout layers and a dead-letter layer
    /// over this store. Records already delivered (resolved) are skipped unless
    /// `--include-resolved` is given.
    Redrive(redrive::RedriveArgs),
    /// Serve the dead-letter board: web pages of the overview (with the breakers the store knows
    /// of), the records, their groups, one record and the audit trail; with `--allow-actions`,
    /// re-drives (through the same stack as `redrive`) and purges, each previewed and confirmed,
    /// as `--actor`. Prints the address it listens on.
    Serve(serve::Serve),
    /// Ask the provider about each outcome-unknown dead letter: `GET` the status URL with the
    /// message id in it; 200 → delivered (the record is resolved), 404 → never delivered (the
    /// record is deferred, due now, for the scheduler to send again), anything else → still
    /// unknown (left as it is).
    Reconcile(reconcile::Reconcile),
    /// Remove what the retention no longer keeps: resolved and dead records older than
    /// `--max-age`, then, above `--max-records`, the oldest resolved records, then the oldest
    /// dead ones. Deferred and in-flight records are never removed.
    Prune(remove::Prune),
    /// The audit trail, the newest first: each re-drive, purge and prune, who ran it (`--actor`,
    /// else the OS user, for this tool), when, on which records, what the dry run counted, what
    /// it sent or removed, and the outcome.
    Audit(read::Audit),
    /// Delete the dead letters that match a filter.
    Purge(remove::Purge),
    /// The fleet's breakers (processes that share them through this store), and an
    /// operator's override of one for every process: `force-open`, `disable` (each until
    /// `--for` has passed) or `reset`, with a `--reason`, audited with the actor.
    Breaker(breaker::BreakerArgs),
    /// Recount the records and compare the recount with the counters the store keeps for its
    /// counts; print each that drifted (expected, found), and with `--repair` set them to the
    /// recount. Exit status 3 when a counter drifted and was not repaired.
    CheckCounts(check::CheckCounts),
}

async fn run(cli: Cli) -> Result<ExitCode, BoxError> {
    let now = SystemTime::now();
    let g = &cli.global;
    match &cli.command {
        Command::List(a) => read::list(g, a, now).await,
        Command::Show(a) => read::show(g, a).await,
        Command::Stats(a) => read::stats(g, a, now).await,
        Command::Redrive(a) => redrive::redrive(g, a, now).await,
        Command::Serve(a) => serve::serve(g, a).await,
        Command::Reconcile(a) => reconcile::reconcile(g, a, now).await,
        Command::Prune(a) => remove::prune(g, a, now).await,
        Command::Audit(a) => read::audit(g, a).await,
        Command::Purge(a) => remove::purge(g, a, now).await,
        Command::Breaker(a) => breaker::breaker(g, a, now).await,
        Command::CheckCounts(a) => check::check_counts(g, a).await,
    }
}

/// The `backstop-dlq` program: reads the command line (`std::env::args`), runs the command on
/// a two-thread tokio runtime, prints an error as `backstop-dlq: …` on standard error, and
/// returns the exit status (0 done, 1 an error, 2 a bad command line or a refusal).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("backstop-dlq: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("backstop-dlq: {e}");
            if e.is::<args::BadCommandLine>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
