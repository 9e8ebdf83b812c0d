//! The pieces every page shares: the layout, error pages, bars, times, links.

use std::time::{Duration, SystemTime};

use axum::response::{Html, IntoResponse, Response};
use http::StatusCode;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use tower_backstop::store::{Record, StoreError};

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;align-items:baseline}
header a{color:#cfd8dc;text-decoration:none}header a:hover{color:#fff}
header .who{margin-left:auto;color:#90a4ae;font-size:.9em}
main{padding:1em 1.5em;max-width:80em}
table{border-collapse:collapse;width:100%;margin:.5em 0 1em}
th,td{text-align:left;padding:.25em .5em;border-bottom:1px solid #e0e0e0;vertical-align:top}
th{background:#eceff1;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:#ef6c00;height:.9em;min-width:1px}
.dead{color:#b71c1c}.deferred,.in_flight{color:#e65100}.resolved{color:#2e7d32}
.note{color:#546e7a;font-size:.9em}
.firing{color:#b71c1c;font-weight:600}.ok{color:#2e7d32}.waiting{color:#757575}
form.inline{display:inline}
form#filter{display:flex;flex-wrap:wrap;gap:.5em;align-items:end;background:#eceff1;padding:.5em}
form#filter label{display:flex;flex-direction:column;font-size:.85em}
pre{background:#fff;border:1px solid #e0e0e0;padding:.5em;overflow:auto;max-height:40em;white-space:pre-wrap;word-break:break-all}
.actions{background:#fff3e0;border:1px solid #ffe0b2;padding:.5em;margin:.5em 0}
.warning{background:#ffebee;border:1px solid #ef9a9a;padding:.25em .75em;margin:.5em 0}
.kv th{width:12em}
ul.processes{margin:.25em 0;padding-left:1.2em}
details.override-form summary{cursor:pointer;color:#37474f}
form.override{display:flex;flex-wrap:wrap;gap:.25em .5em;align-items:center;background:#fff3e0;border:1px solid #ffe0b2;padding:.4em;margin:.25em 0}
button{cursor:pointer}
";

/// The context of one request: where the board is mounted, and who may act (`None`:
/// read-only for this request).
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub(crate) base: String,
    pub(crate) actor: Option<String>,
    pub(crate) csrf: String,
}

impl Ctx {
    /// A link to `path` (starting with `/`) inside the board. The overview of a nested board
    /// is the mount point itself (`/dead-letters`: axum's nested routers do not answer
    /// `/dead-letters/`).
    pub(crate) fn link(&self, path: &str) -> String {
        match (path, self.base.is_empty()) {
            ("/", false) => self.base.clone(),
            (p, _) if p.starts_with("/?") && !self.base.is_empty() => {
                format!("{}{}", self.base, &p[1..])
            }
            _ => format!("{}{path}", self.base),
        }
    }

    /// The hidden CSRF field every action form carries.
    pub(crate) fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name="csrf" value=(self.csrf); }
    }
}

/// A whole page with the navigation.
pub(crate) fn page(ctx: &Ctx, title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · dead letters" }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    header {
                        strong { "dead letters" }
                        a href=(ctx.link("/")) { "overview" }
                        a href=(ctx.link("/records")) { "records" }
                        a href=(ctx.link("/groups")) { "groups" }
                        a href=(ctx.link("/audit")) { "audit" }
                        span.who {
                            @match &ctx.actor {
                                Some(actor) => { "acting as " (actor) }
                                None => { "read-only" }
                            }
                        }
                    }
                    main { h1 { (title) } (body) }
                }
            }
        }
        .into_string(),
    )
}

/// A page that answers with an error status: a bad filter (400), a refused action (403), an
/// unknown record (404), a store that cannot be read (500).
#[derive(Debug)]
pub(crate) struct PageError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// What the page can still show below the error (the local spool while the store is down).
    pub(crate) detail: Option<Markup>,
}

impl PageError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        PageError {
            status,
            message: message.into(),
            detail: None,
        }
    }

    /// The error with `detail` shown below it.
    pub(crate) fn with_detail(mut self, detail: Option<Markup>) -> Self {
        self.detail = detail;
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        PageError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        PageError::new(StatusCode::FORBIDDEN, message)
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        PageError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the dead-letter store cannot be read: {e}"),
        )
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let reason = self.status.canonical_reason().unwrap_or("error");
        let body = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (self.status.as_u16()) " " (reason) " · dead letters" }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    main {
                        h1 { (self.status.as_u16()) " " (reason) }
                        p #error { (self.message) }
                        @if let Some(detail) = &self.detail {
                            (detail)
                        } @else {
                            p.note { "Go back and correct the request." }
                        }
                    }
                }
            }
        };
        (self.status, Html(body.into_string())).into_response()
    }
}

/// What a page handler returns.
pub(crate) type PageResult = Result<Html<String>, PageError>;

/// A time as RFC 3339 in UTC, to the second; times past the year 9999 show as its end.
pub(crate) fn time(t: SystemTime) -> String {
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(t.min(last)).to_string()
}

/// `n` out of `max` as a CSS bar.
pub(crate) fn bar(n: u64, max: u64) -> Markup {
    let pct = if max == 0 {
        0.0
    } else {
        n as f64 * 100.0 / max as f64
    };
    html! { div.bar style=(format!("width:{pct:.1}%")) {} }
}

/// A status in its colour.
pub(crate) fn status(r: &Record) -> Markup {
    html! { span class=(r.status.as_str()) { (r.status) } }
}

/// `text` cut to `max` characters, with `…`.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// `s` percent-encoded for a URL's path segment or query (every byte but RFC 3986's
/// unreserved ones).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `pairs` as a query string (without the `?`).
pub(crate) fn query(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The link to one record's page.
pub(crate) fn record_link(ctx: &Ctx, id: &str) -> String {
    ctx.link(&format!("/records/{}", encode(id)))
}

/// The table of records of the list, the groups' drill-down and the previews.
pub(crate) fn records_table(ctx: &Ctx, table_id: &str, records: &[Record]) -> Markup {
    html! {
        table id=(table_id) {
            thead { tr {
                th { "id" } th { "status" } th { "host" } th { "class" } th { "code" } th { "attempts" }
                th { "last failed" } th { "due" } th { "tags" } th { "message" }
            } }
            tbody {
                @for r in records {
                    tr {
                        td { a href=(record_link(ctx, &r.id)) { (cut(&r.id, 40)) } }
                        td { (status(r)) }
                        td.host { @if let Some(h) = super::host::of(r) { code { (h) } } @else { "-" } }
                        td { (r.class) }
                        td { (r.code) }
                        td.n { (r.attempts) }
                        td { (time(r.last_failed_at)) }
                        td { @if let Some(t) = r.retry_at { (time(t)) } @else { "-" } }
                        td { @for (k, v) in &r.tags { code { (k) "=" (v) } " " } }
                        td { (cut(&r.message, 120)) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_keeps_unreserved_only() {
        assert_eq!(encode("a b/c=d&é"), "a%20b%2Fc%3Dd%26%C3%A9");
        assert_eq!(
            query(&[("tag".into(), "campaign=spring".into())]),
            "tag=campaign%3Dspring"
        );
    }

    #[test]
    fn cut_counts_characters() {
        assert_eq!(cut("héllo", 10), "héllo");
        assert_eq!(cut("héllo", 3), "hé…");
    }
}
