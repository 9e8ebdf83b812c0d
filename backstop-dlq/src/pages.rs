//! The read-only pages: the overview, the list, the groups.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::extract::{Query, State};
use maud::{Markup, html};

use super::breakers::{self, Breakers};
use super::filter::{Scope, narrowed_page};
use super::fingerprint::Fingerprint;
use super::fleet::Notes;
use super::html::{Ctx, PageError, PageResult, bar, cut, page, query, records_table, time};
use super::narrow;
use super::{BoardState, GROUP_LIMIT, PAGE_SIZE};
use tower_backstop::store::{
    Alert, AuditAction, Cursor, Filter, Listing, Stats, Status, Store, list_after, list_page,
};

type Pairs = Query<Vec<(String, String)>>;

/// The buckets of the overview's rate chart.
const BUCKETS: u32 = 24;

/// `GET /`: counts, the breakers, top classes and codes, the rate over time, the alert rules'
/// state; and the app's local spool, when the board is given the app's health and it has one,
/// even while the store cannot be read.
pub(super) async fn overview(State(s): State<BoardState>, ctx: Ctx, Query(q): Pairs) -> PageResult {
    let spool = s
        .board
        .health
        .as_ref()
        .and_then(|h| h.report().spool)
        .map(|spool| spool_panel(&spool));
    match overview_body(&s, &ctx, &q).await {
        Ok(body) => Ok(page(
            &ctx,
            "Overview",
            html! { (body) @if let Some(spool) = spool { (spool) } },
        )),
        Err(e) => Err(e.with_detail(spool)),
    }
}

/// The app's local spool: what waits in it to be forwarded to the store, and whether the store
/// takes it.
fn spool_panel(spool: &tower_backstop::observe::SpoolHealth) -> Markup {
    html! {
        section #spool {
            h2 { "Local spool of this app" }
            table.kv {
                tr { th { "records waiting to be forwarded to the store" } td #spool-records { (spool.records) } }
                tr { th { "their size, of the cap" } td #spool-bytes { (spool.bytes) " of " (spool.max_bytes) " bytes" } }
                tr {
                    th { "the store" }
                    td #store-state {
                        @if spool.store_up { "takes them" } @else { "does not answer: they wait on this machine's disk" }
                    }
                }
                tr { th { "moved to the quarantine file" } td #spool-quarantined { (spool.quarantined) } }
            }
        }
    }
}

async fn overview_body(
    s: &BoardState,
    ctx: &Ctx,
    q: &[(String, String)],
) -> Result<Markup, PageError> {
    let store = &*s.board.store;
    let window_text = q
        .iter()
        .rev()
        .find(|(k, _)| k == "window")
        .map_or("24h", |(_, v)| v.as_str())
        .to_owned();
    let window = humantime::parse_duration(&window_text)
        .ok()
        .filter(|w| !w.is_zero())
        .ok_or_else(|| {
            PageError::bad_request(format!(
                "window: {window_text:?} is not a duration (15m, 24h, 7days)"
            ))
        })?;
    let now = SystemTime::now();
    let dead = store.count(&Filter::new().status(Status::Dead)).await?;
    let deferred = store.count(&Filter::new().status(Status::Deferred)).await?;
    let in_flight = store.count(&Filter::new().status(Status::InFlight)).await?;
    let stats = Stats::gather(store, now, window, s.board.rules).await?;
    let breakers = Breakers::read(store, s.board.health.as_ref()).await?;
    // The fleet's notes, once: a store that keeps none (or fails) only leaves them out.
    let fleet = Notes::read(store, now).await;
    // The rate: dead letters by their last failure, per bucket of the window.
    let start = now.checked_sub(window).unwrap_or(SystemTime::UNIX_EPOCH);
    let step = window / BUCKETS;
    let mut buckets = Vec::new();
    for i in 0..BUCKETS {
        let from = start + step * i;
        let mut f = Filter::new().status(Status::Dead).since(from);
        if i + 1 < BUCKETS {
            f = f.until(from + step);
        }
        buckets.push((from, store.count(&f).await?));
    }
    let c = &stats.counts;
    let body = html! {
        section #overview {
            table.kv {
                tr { th { "outstanding dead letters" } td #dead { (dead) } }
                tr { th { "deferred (waiting for the scheduler)" } td #deferred { (deferred) } }
                tr { th { "in flight (being re-sent)" } td #in-flight { (in_flight) } }
            }
            (breakers::panel(ctx, &breakers, &fleet, now))
            form method="get" action=(ctx.link("/")) {
                label { "window " input name="window" value=(window_text) size="6"; }
                " " button type="submit" { "show" }
            }
            h2 { "The last " (window_text) }
            p {
                "dead letters " strong #window-dead { (c.total) }
                ", deferred and in flight " (c.deferred)
                ", now " (format!("{:.1}", stats.per_minute)) "/min over the last "
                (humantime::format_duration(stats.rules.window))
                ". Resolved records count nowhere."
            }
            (top_table(ctx, "top-classes", "class", &c.by_class, c.total))
            (top_table(ctx, "top-codes", "code", &c.by_code, c.total))
            h3 { "Dead letters over time" }
            (rate_chart(&buckets, step))
            p.note { "Each dead letter counts once, at its last failure." }
            h2 { "Alert rules" }
            (alert_rules(&stats))
        }
    };
    Ok(body)
}

fn top_table(ctx: &Ctx, id: &str, key: &str, rows: &[(String, u64)], total: u64) -> Markup {
    let max = rows.first().map_or(0, |r| r.1);
    html! {
        h3 { "Top " (if key == "class" { "classes" } else { "codes" }) }
        @if rows.is_empty() {
            p.note { "none" }
        } @else {
            table id=(id) {
                @for (name, n) in rows.iter().take(10) {
                    tr {
                        td { a href=(ctx.link(&format!("/records?{}", query(&[(key.to_owned(), name.clone()), ("status".to_owned(), "dead".to_owned())])))) { (name) } }
                        td.n { (n) }
                        td.n { (format!("{:.1}%", *n as f64 * 100.0 / total.max(1) as f64)) }
                        td style="width:50%" { (bar(*n, max)) }
                    }
                }
            }
            @if rows.len() > 10 { p.note { "… and " (rows.len() - 10) " more" } }
        }
    }
}

/// An inline SVG bar chart of the buckets.
fn rate_chart(buckets: &[(SystemTime, u64)], step: Duration) -> Markup {
    let max = buckets.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    let (w, h) = (20u32, 80u32);
    let width = w * buckets.len() as u32;
    html! {
        svg #rate width=(width) height=(h + 16) role="img" aria-label="dead letters over time" {
            @for (i, (from, n)) in buckets.iter().enumerate() {
                @let bh = (*n as f64 / max as f64 * f64::from(h)).round() as u32;
                rect x=(i as u32 * w + 1) y=(h - bh) width=(w - 2) height=(bh) fill="#ef6c00" {
                    title { (n) " from " (time(*from)) " for " (humantime::format_duration(step)) }
                }
            }
            line x1="0" y1=(h) x2=(width) y2=(h) stroke="#90a4ae" {}
            text x="0" y=(h + 13) font-size="10" fill="#546e7a" { (buckets.first().map(|b| time(b.0)).unwrap_or_default()) }
            text x=(width) y=(h + 13) font-size="10" fill="#546e7a" text-anchor="end" { "now (peak " (max) ")" }
        }
    }
}

fn alert_rules(stats: &Stats) -> Markup {
    let r = &stats.rules;
    let fired =
        |rule: &str| -> Vec<&Alert> { stats.alerts.iter().filter(|a| a.rule() == rule).collect() };
    let rows = [
        (
            "dead_letter_spike",
            format!(
                "the rate over the last {} at least {}× that of the {} before (at least {} dead letters)",
                humantime::format_duration(r.window),
                r.spike_factor,
                humantime::format_duration(r.baseline),
                r.min_count
            ),
            true,
        ),
        (
            "class_share",
            format!(
                "one class above {:.0}% of the dead letters of the last {} (at least {})",
                r.class_share * 100.0,
                humantime::format_duration(r.window),
                r.min_count
            ),
            false,
        ),
        (
            "new_code",
            format!(
                "a code never seen before, in the last {}",
                humantime::format_duration(r.window)
            ),
            true,
        ),
    ];
    html! {
        table #alerts {
            thead { tr { th { "rule" } th { "fires when" } th { "state" } } }
            tbody {
                @for (rule, when, needs_history) in rows {
                    @let alerts = fired(rule);
                    tr data-rule=(rule) {
                        td { code { (rule) } }
                        td { (when) }
                        td {
                            @if !alerts.is_empty() {
                                span.firing { "firing" }
                                @for a in alerts { br; (a.to_string()) }
                            } @else if needs_history && !stats.has_baseline {
                                span.waiting { "waiting for history" }
                            } @else {
                                span.ok { "ok" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The filter form: GET to `action`, the fields named as the filter keys; the pairs it has no
/// field for (ids, more tags, a group) go along hidden.
pub(super) fn filter_form(
    ctx: &Ctx,
    action: &str,
    scope: &Scope,
    resolved: Option<bool>,
) -> Markup {
    let first = |key: &str| {
        scope
            .pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let status = first("status");
    let mut shown = ["class", "code", "status", "host", "since", "until"].map(|k| (k, false));
    let mut tag_shown = false;
    let mut hidden = Vec::new();
    for (k, v) in &scope.pairs {
        if let Some(s) = shown.iter_mut().find(|s| s.0 == k && !s.1) {
            s.1 = true;
        } else if k == "tag" && !tag_shown {
            tag_shown = true;
        } else {
            hidden.push((k, v));
        }
    }
    html! {
        form #filter method="get" action=(ctx.link(action)) {
            label { "class" input name="class" value=(first("class")); }
            label { "code" input name="code" value=(first("code")) placeholder="http 503"; }
            label { "status"
                select name="status" {
                    option value="" selected[status.is_empty()] { "outstanding" }
                    @for s in ["dead", "deferred", "in_flight", "resolved"] {
                        option value=(s) selected[status == s] { (s) }
                    }
                }
            }
            label { "host" input name="host" value=(first("host")) placeholder="api.mail.test:443"; }
            label { "tag" input name="tag" value=(first("tag")) placeholder="campaign=spring"; }
            label { "since" input name="since" value=(first("since")) placeholder="2h or 2026-04-01T00:00:00Z"; }
            label { "until" input name="until" value=(first("until")); }
            @if let Some(resolved) = resolved {
                label { "with resolved" input type="checkbox" name="resolved" value="1" checked[resolved]; }
            }
            @for (k, v) in hidden { input type="hidden" name=(k) value=(v); }
            @if let Some(g) = &scope.narrow.group { input type="hidden" name="group" value=(g); }
            button type="submit" { "filter" }
        }
    }
}

/// `GET /records`: the list, outstanding first, a page at a time: after a cursor (`?after=`,
/// the "next" links; the first page when there is neither), or by number (`?page=N`, and any
/// list narrowed to a host or a group).
pub(super) async fn list(State(s): State<BoardState>, ctx: Ctx, Query(q): Pairs) -> PageResult {
    let store = &*s.board.store;
    let scope = Scope::read(q, SystemTime::now())?;
    let resolved = scope.flag("resolved");
    let after = match scope.get("after") {
        None | Some("") => None,
        Some(token) => Some(cursor_for(token, &scope, resolved)?),
    };
    let by_number = scope.get("page").is_some() || !scope.narrow.is_empty();
    let (listing, nav) = if by_number && after.is_none() {
        numbered_page(store, &ctx, &scope, resolved).await?
    } else {
        cursor_page(store, &ctx, &scope, resolved, after.as_ref()).await?
    };
    let Listing {
        records,
        total,
        by_status,
        ..
    } = listing;
    let body = html! {
        (filter_form(&ctx, "/records", &scope, Some(resolved)))
        @if let Some(g) = &scope.narrow.group {
            p.note { "Group " code { (g) } ": its records among the newest " (GROUP_LIMIT) " that match the filter." }
        }
        @if let Some(h) = &scope.narrow.host {
            p.note #host-note { "Host " code { (h) } ": its records among the newest " (GROUP_LIMIT) " that match the rest of the filter." }
        }
        p #total {
            strong { (total) } " records"
            @for (st, n) in &by_status { ", " (st) " " (n) }
            @if !resolved && scope.filter.status.is_none() { " (resolved records only when asked)" }
        }
        @if let (true, Some(past_end)) = (records.is_empty(), &nav.past_end) {
            p #past-end { (past_end) }
        } @else if records.is_empty() {
            p #empty { "No records match." }
        }
        (records_table(&ctx, "records", &records))
        (nav.links)
        (super::actions::forms(&ctx, &s, &scope))
    };
    Ok(page(&ctx, "Records", body))
}

/// The cursor `token` of a link, if it is one made for this list.
fn cursor_for(token: &str, scope: &Scope, resolved: bool) -> Result<Cursor, PageError> {
    if !scope.narrow.is_empty() {
        return Err(PageError::bad_request(
            "after: a list narrowed to a host or a group pages by number (page=N)",
        ));
    }
    if scope.get("page").is_some() {
        return Err(PageError::bad_request(
            "after: a page after a cursor has no number; leave out page=",
        ));
    }
    let cursor: Cursor = token
        .parse()
        .map_err(|e| PageError::bad_request(format!("after: {e}")))?;
    cursor
        .check(&scope.filter, resolved)
        .map_err(|e| PageError::bad_request(format!("after: {e}")))?;
    Ok(cursor)
}

/// The links under a page of the list, and what to say when it is past the end.
struct Nav {
    links: Markup,
    past_end: Option<String>,
}

/// The link to the list of `scope` with the board keys `extra`.
fn list_link(ctx: &Ctx, scope: &Scope, resolved: bool, extra: &[(&str, String)]) -> String {
    let mut pairs = scope.link_pairs();
    if resolved {
        pairs.push(("resolved".to_owned(), "1".to_owned()));
    }
    pairs.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    ctx.link(&format!("/records?{}", query(&pairs)))
}

/// The page of the list after `after` (from its start for `None`), [`PAGE_SIZE`] records:
/// the keyset read, whatever its depth, and the counts.
async fn cursor_page(
    store: &dyn Store,
    ctx: &Ctx,
    scope: &Scope,
    resolved: bool,
    after: Option<&Cursor>,
) -> Result<(Listing, Nav), PageError> {
    let page = list_after(store, &scope.filter, resolved, after, PAGE_SIZE).await?;
    // The counts alone: an empty range reads no record.
    let mut listing = list_page(store, &scope.filter, resolved, 0..0).await?;
    listing.records = page.records;
    let first = list_link(ctx, scope, resolved, &[]);
    let next = page
        .next
        .map(|c| list_link(ctx, scope, resolved, &[("after", c.to_string())]));
    let links = html! {
        p #pages {
            @if after.is_some() { a rel="first" href=(first) { "← first page" } " " }
            @if let Some(next) = &next { a rel="next" href=(next) { "next →" } }
        }
    };
    let past_end = after.map(|_| "No records after this point: the list has ended.".to_owned());
    Ok((listing, Nav { links, past_end }))
}

/// The page `?page=N` of the list (counted from 1), by position: a page deep in a long list
/// reads every record before it.
async fn numbered_page(
    store: &dyn Store,
    ctx: &Ctx,
    scope: &Scope,
    resolved: bool,
) -> Result<(Listing, Nav), PageError> {
    let page_no = scope.number("page", 1)?;
    if page_no == 0 {
        return Err(PageError::bad_request("page: pages are counted from 1"));
    }
    let range = (page_no - 1).saturating_mul(PAGE_SIZE)..page_no.saturating_mul(PAGE_SIZE);
    let listing = if scope.narrow.is_empty() {
        list_page(store, &scope.filter, resolved, range).await?
    } else {
        narrowed_page(store, &scope.filter, &scope.narrow, resolved, range).await?
    };
    let total = listing.total;
    let pages = (total as usize).div_ceil(PAGE_SIZE).max(1);
    let page_link = |n: usize| list_link(ctx, scope, resolved, &[("page", n.to_string())]);
    let links = html! {
        p #pages {
            @if page_no > 1 { a rel="prev" href=(page_link(page_no - 1)) { "← previous" } " " }
            "page " (page_no) " of " (pages)
            @if page_no < pages { " " a rel="next" href=(page_link(page_no + 1)) { "next →" } }
        }
    };
    let past_end = (page_no > 1).then(|| {
        format!("Page {page_no} is past the end: the list has {total} records on {pages} page(s).")
    });
    Ok((listing, Nav { links, past_end }))
}

/// One group of the groups page.
struct Group {
    fingerprint: Fingerprint,
    count: u64,
    outstanding: u64,
    first: SystemTime,
    last: SystemTime,
}

/// `GET /groups`: the records grouped by fingerprint, the largest group first.
pub(super) async fn groups(State(s): State<BoardState>, ctx: Ctx, Query(q): Pairs) -> PageResult {
    let store = &*s.board.store;
    let scope = Scope::read(q, SystemTime::now())?;
    let matching = store.count(&scope.filter).await?;
    let records = narrow::members(store, &scope.filter, &scope.narrow).await?;
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for r in &records {
        let fp = Fingerprint::of(r);
        let g = groups.entry(fp.key()).or_insert_with(|| Group {
            fingerprint: fp,
            count: 0,
            outstanding: 0,
            first: r.first_failed_at,
            last: r.last_failed_at,
        });
        g.count += 1;
        if r.status != Status::Resolved {
            g.outstanding += 1;
        }
        g.first = g.first.min(r.first_failed_at);
        g.last = g.last.max(r.last_failed_at);
    }
    let mut groups: Vec<(String, Group)> = groups.into_iter().collect();
    groups.sort_by(|a, b| {
        b.1.count
            .cmp(&a.1.count)
            .then_with(|| b.1.last.cmp(&a.1.last))
    });
    let body = html! {
        (filter_form(&ctx, "/groups", &scope, None))
        p #scanned {
            "Grouped the newest " strong { (records.len()) } " of " (matching) " matching records"
            @if matching as usize > GROUP_LIMIT { " (at most " (GROUP_LIMIT) " are read; older ones are not in these groups)" }
            @if let Some(h) = &scope.narrow.host { ", of the host " code { (h) } }
            "."
        }
        table #groups {
            thead { tr {
                th { "host" } th { "class" } th { "code" } th { "message (masked)" } th { "records" }
                th { "outstanding" } th { "first seen" } th { "last seen" } th {}
            } }
            tbody {
                @for (key, g) in &groups {
                    @let see = group_link(&ctx, &scope, key);
                    tr data-group=(key) data-host=(g.fingerprint.host) {
                        td { code { (g.fingerprint.host) } }
                        td { (g.fingerprint.class) }
                        td { (g.fingerprint.code) }
                        td { (cut(&g.fingerprint.message, 160)) }
                        td.n { (g.count) }
                        td.n { (g.outstanding) }
                        td { (time(g.first)) }
                        td { (time(g.last)) }
                        td { a.see href=(see) { "see them" } }
                    }
                }
            }
        }
    };
    Ok(page(&ctx, "Groups", body))
}

/// The list of one group's records (resolved ones too).
fn group_link(ctx: &Ctx, scope: &Scope, key: &str) -> String {
    let mut pairs = scope.pairs.clone();
    pairs.push(("group".to_owned(), key.to_owned()));
    pairs.push(("resolved".to_owned(), "1".to_owned()));
    ctx.link(&format!("/records?{}", query(&pairs)))
}

/// `GET /audit`: the audit trail (re-drives, purges, prunes, breaker overrides), newest
/// first, [`PAGE_SIZE`] a page.
pub(super) async fn audit(State(s): State<BoardState>, ctx: Ctx, Query(q): Pairs) -> PageResult {
    let scope = Scope::read(
        q.into_iter().filter(|(k, _)| k == "page").collect(),
        SystemTime::now(),
    )?;
    let page_no = scope.number("page", 1)?;
    if page_no == 0 {
        return Err(PageError::bad_request("page: pages are counted from 1"));
    }
    let start = (page_no - 1).saturating_mul(PAGE_SIZE);
    // One more than a page, to know whether another follows.
    let mut entries = s
        .board
        .store
        .audit(start..start.saturating_add(PAGE_SIZE + 1))
        .await?;
    let more = entries.len() > PAGE_SIZE;
    entries.truncate(PAGE_SIZE);
    let link = |n: usize| ctx.link(&format!("/audit?page={n}"));
    let body = html! {
        @if entries.is_empty() && page_no > 1 {
            p #past-end { "Page " (page_no) " is past the end of the audit trail." }
        } @else if entries.is_empty() {
            p #empty { "Nothing has been re-driven, purged, pruned or overridden yet." }
        }
        table #audit {
            thead { tr {
                th { "at" } th { "actor" } th { "action" } th { "filter" }
                th { "planned" } th { "sent or removed" } th { "outcome" }
            } }
            tbody {
                @for e in &entries {
                    tr data-action=(e.action.as_str()) {
                        td { (time(e.at)) }
                        td { (e.actor) }
                        td { (e.action.as_str()) }
                        td { code { (cut(&e.filter, 300)) } }
                        td.n { @if let Some(p) = e.planned { (p) } @else { "-" } }
                        // A breaker's override sends and removes nothing: its filter names
                        // the breaker, its outcome what was done and why.
                        td.n { @if e.action == AuditAction::Breaker { "-" } @else { (e.sent) } }
                        td { (e.outcome) }
                    }
                }
            }
        }
        p #pages {
            @if page_no > 1 { a rel="prev" href=(link(page_no - 1)) { "← newer" } " " }
            "page " (page_no)
            @if more { " " a rel="next" href=(link(page_no + 1)) { "older →" } }
        }
    };
    Ok(page(&ctx, "Audit trail", body))
}
