//! The arguments several commands share: the store and the actor, a filter, a page.

use std::time::{Duration, SystemTime};

use clap::Args;
use tower_backstop::store::Filter;

use crate::narrow::Narrow;

/// The options of every command: which store, and who acts.
#[derive(Args, Debug)]
pub(crate) struct Global {
    /// The store: a SQLite file, a redis:// URL (feature `redis`) or a postgres:// URL (feature
    /// `postgres`).
    #[arg(long, short)]
    pub(crate) store: String,
    /// The key prefix of a Redis store.
    #[arg(long, default_value = "backstop:dlq")]
    pub(crate) prefix: String,
    /// The schema of a Postgres store.
    // The default is the Postgres store's own `DEFAULT_SCHEMA`, which exists only with the
    // `postgres` feature.
    #[arg(long, default_value = "backstop")]
    pub(crate) schema: String,
    /// Who acts, for the audit trail of redrive, purge, prune and serve --allow-actions
    /// [default: $USER, else $LOGNAME; with neither, those commands refuse to act].
    #[arg(long, global = true, value_name = "NAME", value_parser = parse_actor)]
    pub(crate) actor: Option<String>,
}

/// One page of a listing.
#[derive(Args, Debug)]
pub(crate) struct PageArgs {
    /// Records (or entries) per page.
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: usize,
    /// Records (or entries) to skip (paging by position). Every record skipped is read: a page
    /// 100,000 records deep takes about half a second in SQLite or Postgres. Page `list` with
    /// `--after` instead, which costs the same at any depth.
    #[arg(long, default_value_t = 0)]
    pub(crate) offset: usize,
    /// One JSON line per record (or entry) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl PageArgs {
    /// The positions of the page.
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset.saturating_add(self.limit)
    }
}

/// The records a command applies to.
#[derive(Args, Debug, Default)]
pub(crate) struct FilterArgs {
    /// `key=value`: class, code, status, host, id, tag.NAME, since, until. Repeat to narrow.
    #[arg(long = "filter", short = 'f', value_name = "KEY=VALUE")]
    filters: Vec<String>,
}

impl FilterArgs {
    /// The store's filter, and the host that narrows it further.
    pub(crate) fn build(&self, now: SystemTime) -> Result<(Filter, Narrow), BadCommandLine> {
        let (pairs, host) = Narrow::split_host(&self.filters).map_err(BadCommandLine)?;
        let filter = Filter::from_pairs(&pairs, now).map_err(|e| {
            // The store's filter lists its own keys; `host` is this tool's too.
            BadCommandLine(e.to_string().replace(
                "(class, code, status, id,",
                "(class, code, status, host, id,",
            ))
        })?;
        Ok((filter, Narrow { host, group: None }))
    }
}

/// A command line that cannot be run as written (a filter with an unknown key, a value that
/// does not parse): the program exits with status 2, as for a refusal.
#[derive(Debug)]
pub(crate) struct BadCommandLine(pub(crate) String);

impl std::fmt::Display for BadCommandLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadCommandLine {}

/// A duration as `15m`, `2h`, `7days`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration (15m, 2h): {e}"))
}

/// An actor's name: not empty.
fn parse_actor(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() {
        return Err("an empty name: give who acts (alice, ops-bot)".to_owned());
    }
    Ok(name.to_owned())
}
