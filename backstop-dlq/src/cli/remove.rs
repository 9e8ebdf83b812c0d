//! The commands that remove records: `purge` and `prune`.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use tower_backstop::BoxError;
use tower_backstop::store::Retention;

use super::actor;
use super::args::{FilterArgs, Global, parse_duration};
use super::store::open;
use crate::narrow;

/// `purge`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Purge {
    #[command(flatten)]
    filter: FilterArgs,
    /// Really delete; without it, only say how many would go.
    #[arg(long)]
    yes: bool,
}

/// `prune`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Prune {
    /// Records whose last failure is older than this go (`30days`, `12h`).
    #[arg(long, default_value = "30days", value_parser = parse_duration)]
    max_age: Duration,
    /// At most this many records are kept.
    #[arg(long, default_value_t = tower_backstop::store::DEFAULT_MAX_RECORDS)]
    max_records: u64,
    /// Only count what would go.
    #[arg(long)]
    dry_run: bool,
}

/// `purge`: counts without `--yes`; deletes with it, as the actor.
pub(crate) async fn purge(g: &Global, a: &Purge, now: SystemTime) -> Result<ExitCode, BoxError> {
    let (filter, narrow) = a.filter.build(now)?;
    if filter.is_empty() && narrow.is_empty() {
        eprintln!("refusing to purge every dead letter: give a --filter");
        return Ok(ExitCode::from(2));
    }
    let actor = if a.yes {
        match actor::required(g.actor.as_deref(), "purge") {
            Some(actor) => actor,
            None => return Ok(ExitCode::from(2)),
        }
    } else {
        String::new()
    };
    let store = open(g, a.yes).await?;
    let Some(filter) = narrow::action_filter(&*store, &filter, &narrow).await? else {
        eprintln!("0 dead letters match: nothing to purge");
        return Ok(ExitCode::from(if a.yes { 0 } else { 2 }));
    };
    if !a.yes {
        let n = store.count(&filter).await?;
        eprintln!("{n} dead letters match; add --yes to delete them");
        return Ok(ExitCode::from(2));
    }
    let n = tower_backstop::store::purge(&*store, &filter, &actor).await?;
    out!("deleted {n} dead letters");
    Ok(ExitCode::SUCCESS)
}

/// `prune`: counts with `--dry-run`; removes without it, as the actor.
pub(crate) async fn prune(g: &Global, a: &Prune, now: SystemTime) -> Result<ExitCode, BoxError> {
    let retention = Retention::new()
        .max_age(a.max_age)
        .max_records(a.max_records);
    let pruned = if a.dry_run {
        let store = open(g, false).await?;
        retention.plan(&*store, now).await?
    } else {
        let Some(actor) = actor::required(g.actor.as_deref(), "prune") else {
            return Ok(ExitCode::from(2));
        };
        let store = open(g, true).await?;
        retention.prune_as(&*store, now, &actor).await?
    };
    let verb = if a.dry_run { "would remove" } else { "removed" };
    out!(
        "{verb} {} records: {} older than {}, {} beyond {} records",
        pruned.total(),
        pruned.by_age,
        humantime::format_duration(a.max_age),
        pruned.by_count,
        a.max_records
    );
    Ok(ExitCode::SUCCESS)
}
