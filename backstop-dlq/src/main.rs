//! `backstop-dlq`: look into a dead-letter store, and re-drive or purge from it on purpose.
//!
//! ```text
//! backstop-dlq --store dead_letters.db list --filter class=throttled --filter tag.campaign=spring
//! backstop-dlq --store dead_letters.db show msg-0042
//! backstop-dlq --store redis://127.0.0.1:6379 stats --window 1h
//! backstop-dlq --store dead_letters.db redrive --filter class=throttled --dry-run
//! backstop-dlq --store dead_letters.db redrive --target http://127.0.0.1:8080 \
//!     --filter class=throttled --rate 50 --max 200
//! backstop-dlq --store dead_letters.db purge --filter class=permanent --filter until=2026-04-01T00:00:00Z --yes
//! backstop-dlq --store dead_letters.db serve --bind 127.0.0.1:8080
//! backstop-dlq --store dead_letters.db serve --allow-actions --target http://127.0.0.1:8080
//! backstop-dlq --store dead_letters.db reconcile --status-url 'http://provider/v1/messages/{id}' \
//!     --id-from-json id
//! ```
//!
//! A filter is `key=value`, repeated (every one must hold): `class`, `code`, `status` (dead,
//! deferred, in_flight, resolved), `id` (several: any of them), `tag.NAME`, `since` and `until`
//! (an RFC 3339 time, or a duration back from now such as `15m`, `2h`, `7days`).
//!
//! `serve` runs the dead-letter board (`backstop_dlq::board`) on a loopback address, read-only
//! unless `--allow-actions` (the actor is `$USER`, else `$LOGNAME`); another address needs
//! `--allow-remote`.
//!
//! Exit status: 0 done, 1 an error, 2 a bad command line, a purge without `--yes`, or a refused
//! `serve`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backstop_dlq::Board;
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::{Reconciler, Redrive, http_request};
use tower_backstop::retry::{Delivery, RetryPolicy};
use tower_backstop::store::{
    AlertRules, Filter, Record, Retention, SqliteStore, Stats, Status, Store,
};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BoxError, Envelope};

/// `println!` to standard output, except that a closed pipe (`backstop-dlq list | head`) ends the
/// program quietly with success, as the shell tools do, instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` with the same handling of a closed pipe.
macro_rules! out_raw {
    ($($arg:tt)*) => {
        write_out(format_args!($($arg)*))
    };
}

fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("backstop-dlq: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "backstop-dlq",
    version,
    about = "Search, count, re-drive and purge dead letters in a tower-backstop store"
)]
struct Cli {
    /// The store: a SQLite file, or a redis:// URL (needs the `redis` feature).
    #[arg(long, short)]
    store: String,
    /// The key prefix of a Redis store.
    #[arg(long, default_value = "backstop:dlq")]
    prefix: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List what is outstanding: dead letters first (the most recently failed first), then
    /// deferred and in-flight records (the soonest due first). Resolved records only with
    /// `--resolved` or `--filter status=resolved`.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Also list resolved records (re-sent with success), after the outstanding ones.
        #[arg(long)]
        resolved: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Show one dead letter in full: history, metadata, payload.
    Show {
        /// The record's id.
        id: String,
        /// The record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Top classes and codes of the outstanding dead letters over a window, the deferred records
    /// apart, the dead-letter rate and the alert signals (resolved records never count).
    Stats {
        /// The window of the counts (`24h`, `15m`, `7days`).
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        window: Duration,
    },
    /// Re-send the dead letters that match a filter, each to the URI it was first sent to
    /// (or to `--target`), through retry, classify and timeout layers and a dead-letter layer
    /// over this store.
    Redrive {
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
    },
    /// Serve the dead-letter board: web pages of the overview, the records, their groups, one
    /// record and the audit trail; with `--allow-actions`, re-drives (through the same stack as
    /// `redrive`) and purges, each previewed and confirmed. Prints the address it listens on.
    Serve {
        /// The address to listen on; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: std::net::SocketAddr,
        /// Allow an address that is not loopback (put your own authentication in front).
        #[arg(long)]
        allow_remote: bool,
        /// Allow re-drives and purges, as the OS user (`$USER`, else `$LOGNAME`).
        #[arg(long)]
        allow_actions: bool,
        /// Re-drive to here instead of each record's own URI (as `redrive --target`).
        #[arg(long)]
        target: Option<String>,
        /// Attempts per re-driven message (the first included).
        #[arg(long, default_value_t = 3)]
        attempts: u32,
        /// Timeout per attempt of a re-drive (`10s`, `500ms`).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Ask the provider about each outcome-unknown dead letter: `GET` the status URL with the
    /// message id in it; 200 → delivered (the record is resolved), 404 → never delivered (the
    /// record is deferred, due now, for the scheduler to send again), anything else → still
    /// unknown (left as it is).
    Reconcile {
        #[command(flatten)]
        filter: FilterArgs,
        /// The status URL; `{id}` is replaced by the message id (percent-encoded).
        #[arg(long)]
        status_url: String,
        /// Take the message id from this top-level field of the JSON payload instead of the
        /// record id.
        #[arg(long)]
        id_from_json: Option<String>,
        /// Records in all, at most.
        #[arg(long, default_value_t = 1000)]
        max: usize,
        /// Timeout of each status request (`5s`, `500ms`).
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Remove what the retention no longer keeps: resolved and dead records older than
    /// `--max-age`, then, above `--max-records`, the oldest resolved records, then the oldest
    /// dead ones. Deferred and in-flight records are never removed.
    Prune {
        /// Records whose last failure is older than this go (`30days`, `12h`).
        #[arg(long, default_value = "30days", value_parser = parse_duration)]
        max_age: Duration,
        /// At most this many records are kept.
        #[arg(long, default_value_t = tower_backstop::store::DEFAULT_MAX_RECORDS)]
        max_records: u64,
        /// Only count what would go.
        #[arg(long)]
        dry_run: bool,
    },
    /// The audit trail, the newest first: each re-drive, purge and prune, who ran it (the OS
    /// user for this tool), when, on which records, what the dry run counted, what it sent or
    /// removed, and the outcome.
    Audit {
        #[command(flatten)]
        page: PageArgs,
    },
    /// Delete the dead letters that match a filter.
    Purge {
        #[command(flatten)]
        filter: FilterArgs,
        /// Really delete; without it, only say how many would go.
        #[arg(long)]
        yes: bool,
    },
}

/// One page of a listing.
#[derive(Args, Debug)]
struct PageArgs {
    /// Records (or entries) per page.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Records (or entries) to skip (paging).
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// One JSON line per record (or entry) instead of a table.
    #[arg(long)]
    json: bool,
}

impl PageArgs {
    fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset.saturating_add(self.limit)
    }
}

#[derive(Args, Debug, Default)]
struct FilterArgs {
    /// `key=value`: class, code, status, id, tag.NAME, since, until. Repeat to narrow.
    #[arg(long = "filter", short = 'f', value_name = "KEY=VALUE")]
    filters: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration (15m, 2h): {e}"))
}

impl FilterArgs {
    fn build(&self, now: SystemTime) -> Result<Filter, String> {
        Filter::from_pairs(&self.filters, now).map_err(|e| e.to_string())
    }
}

/// The stack re-drives send through: a dead-letter layer over `store`, retry, classify and a
/// timeout per attempt around a hyper-util client (`redrive` and `serve`).
macro_rules! redrive_stack {
    ($store:expr, $attempts:expr, $timeout:expr) => {{
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        ServiceBuilder::new()
            .layer(DeadLetterLayer::from_arc($store))
            .layer(RetryPolicy::new().max_attempts($attempts).build()?)
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new($timeout))
            .service(client)
    }};
}

/// Who runs this tool, for the audit trail: the OS user (`$USER`, else `$LOGNAME`).
fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown user".to_owned())
}

/// Opens the store named on the command line. SQLite files must exist; reads open them read-only.
async fn open(cli: &Cli, write: bool) -> Result<Arc<dyn Store>, BoxError> {
    if cli.store.starts_with("redis://") || cli.store.starts_with("rediss://") {
        #[cfg(feature = "redis")]
        {
            let store = tower_backstop::store::RedisStore::connect(&cli.store)
                .await?
                .with_prefix(cli.prefix.clone());
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "redis"))]
        return Err("this backstop-dlq was built without the `redis` feature".into());
    }
    let path = std::path::Path::new(&cli.store);
    if !path.exists() {
        return Err(format!("no dead-letter store at {}", path.display()).into());
    }
    Ok(if write {
        Arc::new(SqliteStore::open(path)?)
    } else {
        Arc::new(SqliteStore::open_read_only(path)?)
    })
}

fn time(t: SystemTime) -> String {
    // RFC 3339 ends with the year 9999; a later time (a record written by hand) shows as that.
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(t.min(last)).to_string()
}

fn cut(text: &str, max: usize) -> String {
    let text = text.replace(['\n', '\r', '\t'], " ");
    if text.chars().count() <= max {
        text
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

fn tags(r: &Record) -> String {
    r.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The record's message, and its root cause when the final word is another class (an open
/// breaker's rejection names the failure that opened it).
fn message_with_cause(r: &Record) -> String {
    match &r.cause {
        Some(cause) if cause.class != r.class => {
            format!("{} (cause: {})", r.message, cause.message)
        }
        _ => r.message.clone(),
    }
}

/// A plain table: a header, then left-aligned columns.
fn print_table(records: &[Record]) {
    let header = [
        "ID",
        "CLASS",
        "CODE",
        "ATT",
        "STATUS",
        "DUE",
        "LAST FAILED",
        "TAGS",
        "MESSAGE",
    ];
    let rows: Vec<[String; 9]> = records
        .iter()
        .map(|r| {
            [
                cut(&r.id, 40),
                r.class.clone(),
                r.code.clone(),
                r.attempts.to_string(),
                r.status.to_string(),
                r.retry_at.map(time).unwrap_or_else(|| "-".to_owned()),
                time(r.last_failed_at),
                cut(&tags(r), 40),
                cut(&message_with_cause(r), 100),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn print_record(r: &Record) {
    out!("id              {}", r.id);
    out!("status          {}", r.status);
    out!("class           {}", r.class);
    out!("code            {}", r.code);
    out!("message         {}", r.message);
    if let Some(cause) = &r.cause {
        out!(
            "root cause      {} ({}) at {}: {}",
            cause.class,
            cause.code,
            time(cause.at),
            cause.message
        );
    }
    if let Some(breaker) = &r.breaker {
        out!("breaker         {breaker}");
    }
    out!(
        "attempts        {} (budget spent {}, re-sent {} times)",
        r.attempts,
        r.budget_spent,
        r.resends
    );
    out!("first failed    {}", time(r.first_failed_at));
    out!("last failed     {}", time(r.last_failed_at));
    if let Some(t) = r.retry_at {
        out!("retry at        {}", time(t));
    }
    if let Some(t) = r.resolved_at {
        out!("resolved at     {}", time(t));
    }
    if !r.tags.is_empty() {
        out!("tags            {}", tags(r));
    }
    for (k, v) in &r.metadata {
        out!("metadata        {k}: {v}");
    }
    for (name, value) in &r.headers {
        match std::str::from_utf8(value) {
            Ok(text) => out!("header          {name}: {}", cut(text, 200)),
            Err(_) => out!(
                "header          {name}: (not UTF-8) hex:{}",
                value.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
        }
    }
    for name in &r.redacted_headers {
        out!("header          {name}: (redacted, not stored)");
    }
    out!(
        "payload         {} bytes{}{}",
        r.payload_len,
        if r.payload_truncated {
            format!(", truncated to {}", r.payload.len())
        } else {
            String::new()
        },
        r.content_type
            .as_deref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default()
    );
    match std::str::from_utf8(&r.payload) {
        Ok(text) => out!("{text}"),
        Err(_) => out!(
            "{}",
            r.payload
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
    }
    out!("history (oldest first, last {}):", r.history.len());
    for e in &r.history {
        out!(
            "  {}  {}  {}  {} attempt(s)  {}",
            time(e.at),
            e.class,
            e.code,
            e.attempts,
            cut(&e.message, 80)
        );
    }
}

/// The page `page` of the records matching `filter`, outstanding first: dead (the most recently
/// failed first), then deferred and in flight (the soonest due first), then, with `resolved`,
/// the resolved ones (the most recently failed first). A filter that names a status lists that
/// status alone, in that order.
async fn outstanding_first(
    store: &dyn Store,
    filter: &Filter,
    resolved: bool,
    page: std::ops::Range<usize>,
) -> Result<Vec<Record>, BoxError> {
    let statuses = filter.listed_statuses(resolved);
    let mut dead = Vec::new();
    let mut waiting = Vec::new();
    let mut healed = Vec::new();
    for status in statuses {
        // Waiting records are sorted by due time here, so all of them are read.
        let upto = match status {
            Status::Deferred | Status::InFlight => usize::MAX,
            _ => page.end,
        };
        let group = store
            .search(&filter.clone().status(status), 0..upto)
            .await?;
        match status {
            Status::Deferred | Status::InFlight => waiting.extend(group),
            Status::Resolved => healed.extend(group),
            _ => dead.extend(group),
        }
    }
    // Deferred ones, the soonest due first (a search returns the most recently failed first).
    waiting.sort_by(|a, b| a.retry_at.cmp(&b.retry_at).then_with(|| a.id.cmp(&b.id)));
    Ok(dead
        .into_iter()
        .chain(waiting)
        .chain(healed)
        .skip(page.start)
        .take(page.len())
        .collect())
}

async fn run(cli: Cli) -> Result<ExitCode, BoxError> {
    let now = SystemTime::now();
    match &cli.command {
        Command::List {
            filter,
            resolved,
            page,
        } => {
            let PageArgs {
                limit,
                offset,
                json,
            } = page;
            let filter = filter.build(now)?;
            let store = open(&cli, false).await?;
            let records = outstanding_first(&*store, &filter, *resolved, page.range()).await?;
            if *json {
                for r in &records {
                    out!("{}", serde_json::to_string(r)?);
                }
            } else {
                print_table(&records);
                if records.len() == *limit {
                    eprintln!(
                        "(more may follow: --offset {})",
                        offset.saturating_add(*limit)
                    );
                }
            }
        }
        Command::Show { id, json } => {
            let store = open(&cli, false).await?;
            let Some(record) = store.get(id).await? else {
                eprintln!("no dead letter {id}");
                return Ok(ExitCode::FAILURE);
            };
            if *json {
                out!("{}", serde_json::to_string_pretty(&record)?);
            } else {
                print_record(&record);
            }
        }
        Command::Stats { window } => {
            let store = open(&cli, false).await?;
            let stats = Stats::gather(&*store, now, *window, AlertRules::default()).await?;
            out_raw!("{stats}");
        }
        Command::Redrive {
            filter,
            target,
            dry_run,
            rate,
            max,
            attempts,
            timeout,
        } => {
            let filter = filter.build(now)?;
            let target: Option<http::Uri> = target
                .as_deref()
                .map(|t| t.parse().map_err(|e| format!("bad target {t:?}: {e}")))
                .transpose()?;
            let redrive = Redrive::new(filter, *rate, *max)?.actor(os_user());
            let store = open(&cli, true).await?;
            if *dry_run {
                let plan = redrive.plan(&*store).await?;
                for r in &plan {
                    let to = http_request(r, target.as_ref())
                        .map(|req| format!("{} {}", req.method(), req.uri()))
                        .unwrap_or_else(|e| format!("(skipped: {e})"));
                    out!("would send {}  {}  {}  {to}", r.id, r.class, r.code);
                }
                out!("dry run: {} would be sent, nothing sent", plan.len());
                return Ok(ExitCode::SUCCESS);
            }
            let stack = redrive_stack!(Arc::clone(&store), *attempts, *timeout);
            let report = redrive
                .run(&*store, stack, |r| http_request(r, target.as_ref()))
                .await?;
            for r in &report.records {
                let outcome = match r.word() {
                    "resolved" => "resolved".to_owned(),
                    "skipped" => format!("skipped: {}", r.detail()),
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
        }
        Command::Serve {
            bind,
            allow_remote,
            allow_actions,
            target,
            attempts,
            timeout,
        } => {
            if !bind.ip().is_loopback() && !*allow_remote {
                eprintln!(
                    "refusing to serve the board on {bind}, which is not a loopback address: \
                     add --allow-remote (and put your own authentication in front)"
                );
                return Ok(ExitCode::from(2));
            }
            let actor = allow_actions.then(os_user);
            let target: Option<http::Uri> = target
                .as_deref()
                .map(|t| t.parse().map_err(|e| format!("bad target {t:?}: {e}")))
                .transpose()?;
            let store = open(&cli, actor.is_some()).await?;
            let mut board = Board::new(Arc::clone(&store));
            if let Some(actor) = actor.clone() {
                board = board
                    .authorize(move |_| Some(actor.clone()))
                    .redrive_through(redrive_stack!(Arc::clone(&store), *attempts, *timeout));
                if let Some(target) = target {
                    board = board.redrive_target(target);
                }
            }
            let listener = tokio::net::TcpListener::bind(bind).await?;
            out!(
                "serving the dead-letter board on http://{}/ ({})",
                listener.local_addr()?,
                match &actor {
                    Some(a) => format!("actions allowed, as {a}"),
                    None => "read-only".to_owned(),
                }
            );
            axum::serve(listener, board.router()).await?;
        }
        Command::Reconcile {
            filter,
            status_url,
            id_from_json,
            max,
            timeout,
        } => {
            if !status_url.contains("{id}") {
                eprintln!("the status URL must contain {{id}}, where the message id goes");
                return Ok(ExitCode::from(2));
            }
            let filter = filter.build(now)?;
            let store = open(&cli, true).await?;
            let check = http_status_check(status_url.clone(), id_from_json.clone(), *timeout);
            let report = Reconciler::new(check)
                .filter(filter)
                .max(*max)
                .run(&*store)
                .await?;
            for id in &report.delivered {
                out!("{id}  delivered: resolved");
            }
            for id in &report.not_delivered {
                out!("{id}  not delivered: deferred, to be sent again");
            }
            for id in &report.unknown {
                out!("{id}  still unknown");
            }
            for (id, why) in &report.skipped {
                out!("{id}  skipped: {why}");
            }
            out!(
                "reconciled {}: {} delivered, {} not delivered, {} still unknown, {} skipped",
                report.delivered.len()
                    + report.not_delivered.len()
                    + report.unknown.len()
                    + report.skipped.len(),
                report.delivered.len(),
                report.not_delivered.len(),
                report.unknown.len(),
                report.skipped.len()
            );
        }
        Command::Prune {
            max_age,
            max_records,
            dry_run,
        } => {
            let retention = Retention::new().max_age(*max_age).max_records(*max_records);
            let store = open(&cli, !*dry_run).await?;
            let pruned = if *dry_run {
                retention.plan(&*store, now).await?
            } else {
                retention.prune_as(&*store, now, &os_user()).await?
            };
            let verb = if *dry_run { "would remove" } else { "removed" };
            out!(
                "{verb} {} records: {} older than {}, {} beyond {max_records} records",
                pruned.total(),
                pruned.by_age,
                humantime::format_duration(*max_age),
                pruned.by_count
            );
        }
        Command::Audit { page } => {
            let store = open(&cli, false).await?;
            let entries = store.audit(page.range()).await?;
            if page.json {
                for e in &entries {
                    out!("{}", serde_json::to_string(e)?);
                }
            } else if entries.is_empty() {
                out!("no audit entries");
            } else {
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
            }
        }
        Command::Purge { filter, yes } => {
            let filter = filter.build(now)?;
            if filter.is_empty() {
                eprintln!("refusing to purge every dead letter: give a --filter");
                return Ok(ExitCode::from(2));
            }
            let store = open(&cli, *yes).await?;
            if !*yes {
                let n = store.search(&filter, 0..usize::MAX).await?.len();
                eprintln!("{n} dead letters match; add --yes to delete them");
                return Ok(ExitCode::from(2));
            }
            let n = tower_backstop::store::purge(&*store, &filter, &os_user()).await?;
            out!("deleted {n} dead letters");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The HTTP status check of `reconcile`: `GET` `url` with `{id}` replaced; 200 → delivered,
/// 404 → not delivered, anything else (an error, no answer within `timeout`) → unknown.
fn http_status_check(
    url: String,
    id_from_json: Option<String>,
    timeout: Duration,
) -> impl Fn(Envelope) -> std::pin::Pin<Box<dyn std::future::Future<Output = Delivery> + Send>>
+ Send
+ Sync
+ 'static {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    move |envelope: Envelope| {
        let id = match &id_from_json {
            None => envelope.id.clone(),
            Some(field) => serde_json::from_slice::<serde_json::Value>(&envelope.payload)
                .ok()
                .and_then(|v| v.get(field).and_then(|id| id.as_str()).map(str::to_owned)),
        };
        let uri = id.and_then(|id| {
            url.replace("{id}", &percent_encode(&id))
                .parse::<http::Uri>()
                .ok()
        });
        let client = client.clone();
        Box::pin(async move {
            let Some(uri) = uri else {
                return Delivery::Unknown;
            };
            match tokio::time::timeout(timeout, client.get(uri)).await {
                Ok(Ok(r)) if r.status() == http::StatusCode::OK => Delivery::Delivered,
                Ok(Ok(r)) if r.status() == http::StatusCode::NOT_FOUND => Delivery::NotDelivered,
                _ => Delivery::Unknown,
            }
        })
    }
}

/// `id` with every byte but the unreserved ones (RFC 3986 §2.3) percent-encoded.
fn percent_encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn main() -> ExitCode {
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
            ExitCode::FAILURE
        }
    }
}
