//! The commands that only read: `list`, `show`, `stats`, `audit`.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use tower_backstop::BoxError;
use tower_backstop::store::{
    AlertRules, Cursor, Filter, Record, Stats, Store, list_after, list_order, list_page,
};

use super::args::{BadCommandLine, FilterArgs, Global, PageArgs, parse_duration};
use super::out::{print_record, print_table};
use super::store::open;
use crate::breakers::Breakers;
use crate::narrow::{self, Narrow};

/// `list`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct List {
    #[command(flatten)]
    filter: FilterArgs,
    /// Also list resolved records (re-sent with success), after the outstanding ones.
    #[arg(long)]
    resolved: bool,
    #[command(flatten)]
    page: PageArgs,
    /// The page after this cursor: the token a page printed to stderr, `(more: --after
    /// TOKEN)`, with the same filters and `--resolved`. Pages by cursor cost the same at any
    /// depth, and a cursor stays good while the store changes.
    #[arg(long, value_name = "CURSOR", conflicts_with = "offset")]
    after: Option<Cursor>,
}

/// `show`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Show {
    /// The record's id.
    id: String,
    /// The record as JSON.
    #[arg(long)]
    json: bool,
}

/// `stats`' arguments.
#[derive(Args, Debug)]
pub(crate) struct StatsArgs {
    /// The window of the counts (`24h`, `15m`, `7days`).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    window: Duration,
}

/// `audit`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Audit {
    #[command(flatten)]
    page: PageArgs,
}

/// `list`: a page of the outstanding records, as a table or JSON lines; where the next page
/// starts on stderr.
pub(crate) async fn list(g: &Global, a: &List, now: SystemTime) -> Result<ExitCode, BoxError> {
    let (filter, narrow) = a.filter.build(now)?;
    if let Some(after) = &a.after {
        if !narrow.is_empty() {
            return Err(BadCommandLine(
                "--after does not combine with a host filter (host=…): page it with --offset"
                    .to_owned(),
            )
            .into());
        }
        after
            .check(&filter, a.resolved)
            .map_err(|e| BadCommandLine(format!("--after: {e}")))?;
    }
    let store = open(g, false).await?;
    let (records, more) = if narrow.is_empty() && a.page.offset == 0 {
        let page = list_after(&*store, &filter, a.resolved, a.after.as_ref(), a.page.limit).await?;
        let more = page.next.map(|next| format!("(more: --after {next})"));
        (page.records, more)
    } else {
        let records =
            outstanding_first(&*store, &filter, &narrow, a.resolved, a.page.range()).await?;
        let more = (records.len() == a.page.limit).then(|| {
            format!(
                "(more may follow: --offset {})",
                a.page.offset.saturating_add(a.page.limit)
            )
        });
        (records, more)
    };
    if a.page.json {
        for r in &records {
            out!("{}", serde_json::to_string(r)?);
        }
    } else {
        print_table(&records);
        if narrow.host.is_some() {
            eprintln!(
                "(a host is read off the records: the newest {} that match the rest of the \
                 filter were looked at)",
                crate::GROUP_LIMIT
            );
        }
    }
    if let Some(more) = more {
        eprintln!("{more}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The page `page` of the list of the records matching `filter` and `narrow`
/// ([`list_page`]'s list, in [`list_order`]): dead (the most recently failed first), then
/// deferred and in flight (the soonest due first), then, with `resolved`, the resolved ones
/// (the most recently failed first). A filter that names a status lists that status alone.
async fn outstanding_first(
    store: &dyn Store,
    filter: &Filter,
    narrow: &Narrow,
    resolved: bool,
    page: std::ops::Range<usize>,
) -> Result<Vec<Record>, BoxError> {
    if narrow.is_empty() {
        return Ok(list_page(store, filter, resolved, page).await?.records);
    }
    // With a host: its records among the newest that match, in one read, put in list order.
    let statuses = filter.listed_statuses(resolved);
    let mut members = narrow::members(store, filter, narrow).await?;
    members.retain(|r| statuses.contains(&r.status));
    members.sort_by(list_order);
    Ok(members
        .into_iter()
        .skip(page.start)
        .take(page.len())
        .collect())
}

/// `show`: one record in full, or as JSON.
pub(crate) async fn show(g: &Global, a: &Show) -> Result<ExitCode, BoxError> {
    let store = open(g, false).await?;
    let Some(record) = store.get(&a.id).await? else {
        eprintln!("no dead letter {}", a.id);
        return Ok(ExitCode::FAILURE);
    };
    if a.json {
        out!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print_record(&record);
    }
    Ok(ExitCode::SUCCESS)
}

/// `stats`: the counts of the window, the alert signals, and the breakers the store knows.
pub(crate) async fn stats(
    g: &Global,
    a: &StatsArgs,
    now: SystemTime,
) -> Result<ExitCode, BoxError> {
    let store = open(g, false).await?;
    let stats = Stats::gather(&*store, now, a.window, AlertRules::default()).await?;
    out_raw!("{stats}");
    let breakers = Breakers::read(&*store, None).await?;
    if !breakers.list.is_empty() {
        out!("breakers (from the deferred records they rejected):");
        for b in &breakers.list {
            let deferred = b.stored.as_ref().map_or(0, |s| s.deferred);
            out!(
                "  {}  {}  {} deferred  {}",
                b.name,
                b.state(now),
                deferred,
                b.until(now)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit`: a page of the audit trail, as a table or JSON lines.
pub(crate) async fn audit(g: &Global, a: &Audit) -> Result<ExitCode, BoxError> {
    let store = open(g, false).await?;
    let entries = store.audit(a.page.range()).await?;
    if a.page.json {
        for e in &entries {
            out!("{}", serde_json::to_string(e)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        out!("no audit entries");
        return Ok(ExitCode::SUCCESS);
    }
    out!(
        "{:<24}  {:<12}  {:<8}  {:>7}  {:>5}  {:<40}  filter",
        "at",
        "actor",
        "action",
        "planned",
        "sent",
        "outcome"
    );
    for e in &entries {
        out!(
            "{:<24}  {:<12}  {:<8}  {:>7}  {:>5}  {:<40}  {}",
            humantime::format_rfc3339_millis(e.at).to_string(),
            e.actor,
            e.action,
            e.planned.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            e.sent,
            e.outcome,
            e.filter
        );
    }
    Ok(ExitCode::SUCCESS)
}
