//! `redrive`: re-send on purpose, through the stack `serve`'s board re-drives through too.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use clap::Args;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::{ALREADY_DELIVERED, Outcome, Redrive, http_request};
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{Record, Status, Store};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BoxError, Failure};

use super::actor;
use super::args::{FilterArgs, Global, parse_duration};
use super::store::open;
use crate::breakers::{self, Breakers};
use crate::narrow;

/// `redrive`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct RedriveArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Send them here instead of each record's own URI: `http://host:port` keeps each
    /// record's path; a URL with a path replaces it.
    #[arg(long)]
    target: Option<String>,
    /// List what would be sent, send nothing.
    #[arg(long)]
    dry_run: bool,
    /// Messages per second, at most.
    #[arg(long, default_value_t = 10)]
    rate: u32,
    /// Messages in all, at most.
    #[arg(long, default_value_t = 100)]
    max: usize,
    /// Attempts per message (the first included).
    #[arg(long, default_value_t = 3)]
    attempts: u32,
    /// Timeout per attempt (`10s`, `500ms`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Send again the records already delivered (resolved) that the filter selects (only
    /// `--filter status=resolved` selects them). Without it they are skipped, never sent, and
    /// the command exits with status 2.
    #[arg(long)]
    include_resolved: bool,
}

/// What a re-drive sends through: a dead-letter layer over `store` (a request that fails again
/// updates its record), retry with `attempts` attempts, classify, and a `timeout` per attempt,
/// around a hyper-util client.
pub(crate) type Sender = BoxCloneSyncService<http::Request<Full<Bytes>>, (), Failure<()>>;

/// The stack of [`Sender`].
pub(crate) fn stack(
    store: Arc<dyn Store>,
    attempts: u32,
    timeout: Duration,
) -> Result<Sender, BoxError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store))
        .layer(RetryPolicy::new().max_attempts(attempts).build()?)
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(timeout))
        .service(client)
        .map_response(drop)
        .map_err(|e| e.map_response(drop));
    Ok(BoxCloneSyncService::new(stack))
}

/// `--target` parsed.
pub(crate) fn target(target: Option<&str>) -> Result<Option<http::Uri>, BoxError> {
    Ok(target
        .map(|t| t.parse().map_err(|e| format!("bad target {t:?}: {e}")))
        .transpose()?)
}

/// `redrive`: the dry run, or the re-drive, as the actor.
pub(crate) async fn redrive(
    g: &Global,
    a: &RedriveArgs,
    now: SystemTime,
) -> Result<ExitCode, BoxError> {
    let (filter, narrow) = a.filter.build(now)?;
    let target = target(a.target.as_deref())?;
    if filter.is_empty() && narrow.is_empty() {
        eprintln!(
            "backstop-dlq: refusing to re-drive every dead letter: give a --filter (class, code, \
             status, host, id, tag.NAME, since, until)"
        );
        return Ok(ExitCode::from(2));
    }
    let actor = if a.dry_run {
        String::new()
    } else {
        match actor::required(g.actor.as_deref(), "re-drive") {
            Some(actor) => actor,
            None => return Ok(ExitCode::from(2)),
        }
    };
    let store = open(g, true).await?;
    let Some(filter) = narrow::action_filter(&*store, &filter, &narrow).await? else {
        out!("no record matches: nothing to re-drive");
        return Ok(ExitCode::SUCCESS);
    };
    let redrive = Redrive::new(filter, a.rate, a.max)?
        .actor(actor)
        .include_resolved(a.include_resolved);
    if a.dry_run {
        let plan = redrive.plan(&*store).await?;
        dry_run(&*store, &plan, target.as_ref(), a.include_resolved, now).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let sender = stack(Arc::clone(&store), a.attempts, a.timeout)?;
    let report = redrive
        .run(&*store, sender, |r| http_request(r, target.as_ref()))
        .await?;
    let mut refused = 0usize;
    for r in &report.records {
        let outcome = match r {
            Outcome::Resolved { .. } => "resolved".to_owned(),
            Outcome::Skipped { reason, .. } => {
                if reason == ALREADY_DELIVERED {
                    refused += 1;
                }
                format!("skipped: {}", r.detail())
            }
            _ => r.detail(),
        };
        out!("{}  {}", r.id(), outcome);
    }
    out!(
        "re-drove {}: {} resolved, {} failed again, {} skipped",
        report.records.len(),
        report.resolved(),
        report.failed(),
        report.skipped()
    );
    if refused > 0 {
        eprintln!(
            "refused to send again {refused} already delivered (resolved): pass \
             --include-resolved to send them again on purpose"
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// What a dry run prints: each planned record and where it would go (or that it would be
/// skipped as already delivered), a warning per open breaker (as the store knows it) they would
/// go to, a warning of the records already delivered, and the count.
async fn dry_run(
    store: &dyn Store,
    plan: &[Record],
    target: Option<&http::Uri>,
    include_resolved: bool,
    now: SystemTime,
) -> Result<(), BoxError> {
    let resolved = plan.iter().filter(|r| r.status == Status::Resolved).count();
    for r in plan {
        let to = http_request(r, target)
            .map(|req| format!("{} {}", req.method(), req.uri()))
            .unwrap_or_else(|e| format!("(skipped: {e})"));
        match (r.status == Status::Resolved, include_resolved) {
            (false, _) => out!("would send {}  {}  {}  {to}", r.id, r.class, r.code),
            (true, true) => out!("would send again {}  {}  {}  {to}", r.id, r.class, r.code),
            (true, false) => out!(
                "would skip {}  {}  {}  {ALREADY_DELIVERED}",
                r.id,
                r.class,
                r.code
            ),
        }
    }
    let known = Breakers::read(store, None).await?;
    for w in breakers::warnings(plan, target, &known, now) {
        out!("warning: {}", w.describe(plan.len(), now));
    }
    let sent = if include_resolved {
        plan.len()
    } else {
        plan.len() - resolved
    };
    match (resolved, include_resolved) {
        (0, _) => {}
        (n, true) => out!(
            "warning: {n} of these {} records were already delivered (resolved) and would be \
             sent again, on purpose (--include-resolved)",
            plan.len()
        ),
        (n, false) => out!(
            "warning: {n} of these {} records were already delivered (resolved): they would be \
             skipped, not sent; pass --include-resolved to send them again",
            plan.len()
        ),
    }
    out!("dry run: {sent} would be sent, nothing sent");
    Ok(())
}
