//! The actions: re-drive and purge, each a preview and then a confirmed run, each a `POST` with
//! the board's CSRF token, for an actor the authorisation hook named (the fleet's breaker
//! overrides, in `fleet`, check the same).

use axum::Form;
use axum::extract::State;
use maud::{Markup, html};

use super::breakers::{self, Breakers};
use super::filter::Scope;
use super::html::{Ctx, PageError, PageResult, page, records_table};
use super::{BoardState, DEFAULT_MAX, DEFAULT_RATE, MAX_REDRIVE, Shared, constant_time_eq};
use tower_backstop::resend::{Redrive, http_request};
use tower_backstop::store::{Filter, Record, Status};

type Fields = Form<Vec<(String, String)>>;

/// How many planned records a preview lists (it counts them all).
const PREVIEW_ROWS: usize = 200;

/// The hidden fields that carry a scope from one step to the next.
fn scope_fields(ctx: &Ctx, pairs: &[(String, String)]) -> Markup {
    html! {
        (ctx.csrf_field())
        @for (k, v) in pairs { input type="hidden" name=(k) value=(v); }
    }
}

/// The re-drive and purge forms for `pairs`, when this request may act.
fn action_forms(ctx: &Ctx, s: &Shared, pairs: &[(String, String)], what: &str) -> Markup {
    if ctx.actor.is_none() {
        return html! {};
    }
    html! {
        div.actions #actions {
            @if s.board.sender.is_some() {
                form.inline method="post" action=(ctx.link("/redrive/preview")) {
                    (scope_fields(ctx, pairs))
                    "Re-drive " (what) ": at most "
                    input name="max" type="number" min="1" max=(MAX_REDRIVE) value=(DEFAULT_MAX) size="5";
                    " messages, "
                    input name="rate" type="number" min="1" value=(DEFAULT_RATE) size="4";
                    " per second "
                    button #preview type="submit" { "preview re-drive" }
                }
                " · "
            }
            form.inline method="post" action=(ctx.link("/purge/preview")) {
                (scope_fields(ctx, pairs))
                button #purge type="submit" { "purge " (what) "…" }
            }
        }
    }
}

/// The list page's action forms, for its filter (and group). None for an empty filter.
pub(super) fn forms(ctx: &Ctx, s: &Shared, scope: &Scope) -> Markup {
    if ctx.actor.is_none() {
        return html! {};
    }
    if scope.is_everything() {
        return html! {
            p.note #actions { "Give a filter to re-drive or purge: actions never apply to every record." }
        };
    }
    let what = if scope.narrow.group.is_some() {
        "this group"
    } else {
        "these records"
    };
    action_forms(ctx, s, &scope.link_pairs(), what)
}

/// The record page's action forms. A resolved record's re-drive names its status, so that
/// the preview plans it (and asks to confirm sending it again) instead of finding nothing.
pub(super) fn record_forms(ctx: &Ctx, s: &Shared, r: &Record) -> Markup {
    let mut pairs = vec![("id".to_owned(), r.id.clone())];
    if r.status == Status::Resolved {
        pairs.push(("status".to_owned(), Status::Resolved.as_str().to_owned()));
    }
    action_forms(ctx, s, &pairs, "this record")
}

/// What every action checks first: an actor, and the board's CSRF token in the form. The
/// actor's name when both are there.
pub(super) fn authorised(ctx: &Ctx, fields: &[(String, String)]) -> Result<String, PageError> {
    let Some(actor) = ctx.actor.clone() else {
        return Err(PageError::forbidden(
            "this board is read-only: actions need an authorisation hook that names you",
        ));
    };
    let token = fields
        .iter()
        .rev()
        .find(|(k, _)| k == "csrf")
        .map_or("", |(_, v)| v.as_str());
    if !constant_time_eq(token.as_bytes(), ctx.csrf.as_bytes()) {
        return Err(PageError::forbidden(
            "the form's CSRF token is missing or wrong: reload the page and try again",
        ));
    }
    Ok(actor)
}

/// What a re-drive or a purge checks first: an actor, the CSRF token, a filter that says
/// something.
fn guard(ctx: &Ctx, fields: Vec<(String, String)>) -> Result<(String, Scope), PageError> {
    let actor = authorised(ctx, &fields)?;
    let scope = Scope::read(fields, std::time::SystemTime::now())?;
    if scope.is_everything() {
        return Err(PageError::bad_request(
            "refusing to act on every record: give a filter (class, code, status, host, tag, \
             since, until or id)",
        ));
    }
    Ok((actor, scope))
}

/// The re-drive of a form: its filter (a group's ids), rate and maximum.
async fn redrive_of(s: &Shared, scope: &Scope) -> Result<Option<(Redrive, Filter)>, PageError> {
    if s.board.sender.is_none() {
        return Err(PageError::forbidden(
            "this board has no service to re-drive through",
        ));
    }
    let rate = scope.number("rate", DEFAULT_RATE as usize)?;
    let rate = u32::try_from(rate)
        .map_err(|_| PageError::bad_request(format!("rate: {rate} is too large")))?;
    let max = scope.number("max", DEFAULT_MAX)?;
    if max > MAX_REDRIVE {
        return Err(PageError::bad_request(format!(
            "max: {max} is above the board's limit of {MAX_REDRIVE} messages"
        )));
    }
    let Some(filter) = scope.action_filter(&*s.board.store).await? else {
        return Ok(None);
    };
    let redrive = Redrive::new(filter.clone(), rate, max)
        .map_err(|e| PageError::bad_request(e.to_string()))?
        .include_resolved(scope.flag(INCLUDE_RESOLVED));
    Ok(Some((redrive, filter)))
}

/// The confirmation a re-drive of records already delivered needs: the preview's checkbox.
const INCLUDE_RESOLVED: &str = "include_resolved";

/// How many of `plan`'s records were already delivered (resolved).
fn already_delivered(plan: &[Record]) -> usize {
    plan.iter().filter(|r| r.status == Status::Resolved).count()
}

/// The preview's warning of records already delivered, and the checkbox that confirms sending
/// them again; nothing when there are none.
fn resolved_confirmation(resolved: usize, planned: usize) -> Markup {
    if resolved == 0 {
        return html! {};
    }
    html! {
        p.warning #resolved-warning {
            strong { (resolved) } " of these " (planned) " records were already delivered (resolved). "
            "They are skipped, never sent, unless you tick the box below: then they are sent again, "
            "and the audit trail says so."
        }
        label #include-resolved-label {
            input #include-resolved type="checkbox" name=(INCLUDE_RESOLVED) value="1";
            " send again the " (resolved) " records already delivered"
        }
    }
}

fn empty_group(ctx: &Ctx, title: &str) -> PageResult {
    Ok(page(
        ctx,
        title,
        html! {
            p { "Planned: " strong #planned { "0" } }
            p #result { "The group has no records any more: nothing to do." }
        },
    ))
}

/// `POST /redrive/preview`: the dry run, and the form that confirms it.
pub(super) async fn redrive_preview(
    State(s): State<BoardState>,
    ctx: Ctx,
    Form(fields): Fields,
) -> PageResult {
    let (_, scope) = guard(&ctx, fields)?;
    let Some((redrive, _)) = redrive_of(&s, &scope).await? else {
        return empty_group(&ctx, "Re-drive preview");
    };
    let plan = redrive.plan(&*s.board.store).await?;
    let rate = scope.number("rate", DEFAULT_RATE as usize)?;
    let max = scope.number("max", DEFAULT_MAX)?;
    let mut pairs = scope.link_pairs();
    pairs.push(("rate".to_owned(), rate.to_string()));
    pairs.push(("max".to_owned(), max.to_string()));
    pairs.push(("planned".to_owned(), plan.len().to_string()));
    let unsendable = plan.iter().filter(|r| !r.resendable()).count();
    let resolved = already_delivered(&plan);
    let now = std::time::SystemTime::now();
    let breakers = Breakers::read(&*s.board.store, s.board.health.as_ref()).await?;
    let warnings = breakers::warnings(&plan, s.board.target.as_ref(), &breakers, now);
    let body = html! {
        (breakers::warning(&warnings, plan.len(), now))
        p {
            "Would send " strong #planned { (plan.len()) } " records, at most " (rate)
            " per second (at most " (max) "). Nothing has been sent."
            @if unsendable > 0 { " " (unsendable) " of them cannot be re-sent (truncated payload) and will be skipped." }
        }
        @if plan.is_empty() {
            p.note #result { "Nothing to re-drive." }
        } @else {
            form method="post" action=(ctx.link("/redrive/run")) {
                (scope_fields(&ctx, &pairs))
                (resolved_confirmation(resolved, plan.len()))
                button #confirm type="submit" {
                    "re-drive these " (plan.len()) " records"
                    @if !warnings.is_empty() { " anyway" }
                }
            }
            (records_table(&ctx, "planned-records", &plan[..plan.len().min(PREVIEW_ROWS)]))
            @if plan.len() > PREVIEW_ROWS { p.note { "… and " (plan.len() - PREVIEW_ROWS) " more." } }
        }
    };
    Ok(page(&ctx, "Re-drive preview", body))
}

/// `POST /redrive/run`: the re-drive, and what came of each record.
pub(super) async fn redrive_run(
    State(s): State<BoardState>,
    ctx: Ctx,
    Form(fields): Fields,
) -> PageResult {
    let (actor, scope) = guard(&ctx, fields)?;
    let Some((redrive, _)) = redrive_of(&s, &scope).await? else {
        return empty_group(&ctx, "Re-drive");
    };
    // Server-side, whatever the page sent: no record already delivered goes out again without
    // the preview's confirmation.
    let resolved = already_delivered(&redrive.plan(&*s.board.store).await?);
    if resolved > 0 && !redrive.includes_resolved() {
        return Err(PageError::bad_request(format!(
            "refusing to re-drive: {resolved} of these records were already delivered \
             (resolved); tick \"send again the records already delivered\" in the preview to \
             send them again, or leave them out of the filter (status=dead)"
        )));
    }
    let resent_resolved = if redrive.includes_resolved() {
        resolved
    } else {
        0
    };
    let redrive = redrive.actor(actor);
    let Some(sender) = s.board.sender.clone() else {
        return Err(PageError::forbidden(
            "this board has no service to re-drive through",
        ));
    };
    let target = s.board.target.clone();
    let report = redrive
        .run(&*s.board.store, sender, |r| {
            http_request(r, target.as_ref())
        })
        .await?;
    let previewed = scope.get("planned").unwrap_or("?").to_owned();
    let body = html! {
        p #result {
            "Re-drove " (report.records.len()) ": resolved " (report.resolved())
            ", failed " (report.failed()) ", skipped " (report.skipped()) "."
        }
        p.note { "The preview planned " (previewed) ". Recorded in the " a href=(ctx.link("/audit")) { "audit trail" } " as done by " (ctx.actor.as_deref().unwrap_or("")) "." }
        @if resent_resolved > 0 {
            p.note #resent-resolved { (resent_resolved) " of the records planned were already delivered and were sent again, as confirmed." }
        }
        table #outcomes {
            thead { tr { th { "id" } th { "outcome" } th { "detail" } } }
            tbody {
                @for o in &report.records {
                    tr data-outcome=(o.word()) {
                        td { a href=(super::html::record_link(&ctx, o.id())) { (o.id()) } }
                        td { (o.word()) }
                        td { (o.detail()) }
                    }
                }
            }
        }
    };
    Ok(page(&ctx, "Re-drive", body))
}

/// `POST /purge/preview`: how many would go, and the form that confirms it.
pub(super) async fn purge_preview(
    State(s): State<BoardState>,
    ctx: Ctx,
    Form(fields): Fields,
) -> PageResult {
    let (_, scope) = guard(&ctx, fields)?;
    let store = &*s.board.store;
    let Some(filter) = scope.action_filter(store).await? else {
        return empty_group(&ctx, "Purge preview");
    };
    let n = store.count(&filter).await?;
    let first = store.search(&filter, 0..PREVIEW_ROWS).await?;
    let body = html! {
        p { "Would delete " strong #planned { (n) } " records, whatever their status. Nothing has been deleted." }
        @if n == 0 {
            p.note #result { "Nothing to purge." }
        } @else {
            form method="post" action=(ctx.link("/purge/run")) {
                (scope_fields(&ctx, &scope.link_pairs()))
                input type="hidden" name="planned" value=(n);
                button #confirm-purge type="submit" { "delete these " (n) " records" }
            }
            (records_table(&ctx, "planned-records", &first))
            @if n as usize > first.len() { p.note { "… and " (n as usize - first.len()) " more." } }
        }
    };
    Ok(page(&ctx, "Purge preview", body))
}

/// `POST /purge/run`: deletes the records of the filter.
pub(super) async fn purge_run(
    State(s): State<BoardState>,
    ctx: Ctx,
    Form(fields): Fields,
) -> PageResult {
    let (actor, scope) = guard(&ctx, fields)?;
    let store = &*s.board.store;
    let Some(filter) = scope.action_filter(store).await? else {
        return empty_group(&ctx, "Purge");
    };
    let n = tower_backstop::store::purge(store, &filter, &actor).await?;
    let previewed = scope.get("planned").unwrap_or("?").to_owned();
    let body = html! {
        p #result { "Deleted " (n) " records." }
        p.note { "The preview counted " (previewed) ". Recorded in the " a href=(ctx.link("/audit")) { "audit trail" } " as done by " (actor) "." }
    };
    Ok(page(&ctx, "Purge", body))
}
