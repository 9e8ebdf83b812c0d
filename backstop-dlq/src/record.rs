//! `GET /records/{id}`: one record, in full.

use axum::extract::{Path, Query, State};
use http::StatusCode;
use maud::{Markup, html};

use super::html::{Ctx, PageError, PageResult, page, status, time};
use super::{BoardState, PAYLOAD_PREVIEW};
use tower_backstop::store::Record;

/// Above this size a JSON payload is not parsed to be pretty-printed: 1 MiB.
const JSON_PRETTY_LIMIT: usize = 1024 * 1024;

/// How a payload is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    Text,
    Json,
    Hex,
}

impl View {
    fn name(self) -> &'static str {
        match self {
            View::Text => "text",
            View::Json => "json",
            View::Hex => "hex",
        }
    }
}

/// The view asked for, or the best one: JSON when it parses, text when it is UTF-8, else hex.
fn choose(asked: Option<&str>, payload: &[u8]) -> Result<View, PageError> {
    let utf8 = std::str::from_utf8(payload).is_ok();
    Ok(match asked {
        Some("text") if utf8 => View::Text,
        Some("json") if utf8 => View::Json,
        Some("text" | "json") | Some("hex") => View::Hex,
        Some("") | None => {
            if payload.len() <= JSON_PRETTY_LIMIT
                && serde_json::from_slice::<serde_json::Value>(payload).is_ok()
            {
                View::Json
            } else if utf8 {
                View::Text
            } else {
                View::Hex
            }
        }
        Some(other) => {
            return Err(PageError::bad_request(format!(
                "view: {other:?} is not text, json or hex"
            )));
        }
    })
}

/// The longest prefix of `bytes` of at most `max` bytes that ends on a character boundary when
/// `bytes` is UTF-8.
fn prefix(bytes: &[u8], max: usize) -> &[u8] {
    if bytes.len() <= max {
        return bytes;
    }
    let mut end = max;
    while end > 0 && (bytes[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    &bytes[..end]
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, line) in bytes.chunks(32).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{:08x} ", i * 32));
        for b in line {
            out.push_str(&format!(" {b:02x}"));
        }
    }
    out
}

/// The payload block: the chosen view of a bounded prefix, with a note of what is not shown.
fn payload(ctx: &Ctx, r: &Record, asked: Option<&str>) -> Result<Markup, PageError> {
    let view = choose(asked, &r.payload)?;
    let (limit, shown_text) = match view {
        View::Hex => {
            let shown = prefix(&r.payload, PAYLOAD_PREVIEW / 4);
            (shown.len(), hex(shown))
        }
        View::Json if r.payload.len() <= JSON_PRETTY_LIMIT => {
            match serde_json::from_slice::<serde_json::Value>(&r.payload) {
                Ok(v) => {
                    let pretty = serde_json::to_string_pretty(&v).unwrap_or_default();
                    let cut = prefix(pretty.as_bytes(), PAYLOAD_PREVIEW);
                    (
                        r.payload.len().min(PAYLOAD_PREVIEW),
                        String::from_utf8_lossy(cut).into_owned(),
                    )
                }
                Err(e) => {
                    let shown = prefix(&r.payload, PAYLOAD_PREVIEW);
                    (
                        shown.len(),
                        format!("(not JSON: {e})\n{}", String::from_utf8_lossy(shown)),
                    )
                }
            }
        }
        View::Text | View::Json => {
            let shown = prefix(&r.payload, PAYLOAD_PREVIEW);
            (shown.len(), String::from_utf8_lossy(shown).into_owned())
        }
    };
    let utf8 = std::str::from_utf8(&r.payload).is_ok();
    let link = |v: View| format!("{}?view={}", super::html::record_link(ctx, &r.id), v.name());
    Ok(html! {
        h2 { "Payload" }
        p #payload-info {
            (r.payload_len) " bytes"
            @if r.payload_truncated { ", stored truncated to " (r.payload.len()) " (cannot be re-sent)" }
            @if let Some(ct) = &r.content_type { ", " code { (ct) } }
            @if !utf8 { ", not valid UTF-8" }
            " · view: "
            @for v in [View::Text, View::Json, View::Hex] {
                @if v == view { strong { (v.name()) } } @else if v == View::Hex || utf8 { a href=(link(v)) { (v.name()) } }
                " "
            }
        }
        @if limit < r.payload.len() {
            p.note #payload-cut { "Showing the first " (limit) " of " (r.payload.len()) " stored bytes." }
        }
        pre #payload data-view=(view.name()) { (shown_text) }
    })
}

/// `GET /records/{id}`.
pub(super) async fn show(
    State(s): State<BoardState>,
    ctx: Ctx,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> PageResult {
    let Some(r) = s.board.store.get(&id).await? else {
        return Err(PageError::new(
            StatusCode::NOT_FOUND,
            format!("no dead letter with id {id:?}"),
        ));
    };
    let asked = q
        .iter()
        .rev()
        .find(|(k, _)| k == "view")
        .map(|(_, v)| v.as_str());
    let payload = payload(&ctx, &r, asked)?;
    let redacted = |name: &str| {
        r.redacted_headers
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    };
    let body = html! {
        section #record data-id=(r.id) {
            table.kv {
                tr { th { "id" } td #id { (r.id) } }
                tr { th { "status" } td #status { (status(&r)) } }
                tr { th { "class" } td { (r.class) } }
                tr { th { "code" } td { (r.code) } }
                tr { th { "host" } td #host { (super::host::of(&r).unwrap_or_else(|| "-".to_owned())) } }
                tr { th { "message" } td { (r.message) } }
                @if let Some(c) = &r.cause {
                    tr { th { "root cause" } td #cause { (c.class) " (" (c.code) ") at " (time(c.at)) ": " (c.message) } }
                }
                @if let Some(b) = &r.breaker { tr { th { "breaker" } td { (b) } } }
                tr { th { "attempts" } td { (r.attempts) " (budget spent " (r.budget_spent) ", re-sent " (r.resends) " times)" } }
                tr { th { "first failed" } td { (time(r.first_failed_at)) } }
                tr { th { "last failed" } td { (time(r.last_failed_at)) } }
                @if let Some(t) = r.retry_at { tr { th { "retry at" } td { (time(t)) } } }
                @if let Some(t) = r.resolved_at { tr { th { "resolved at" } td { (time(t)) } } }
                tr { th { "tags" } td #tags { @for (k, v) in &r.tags { code { (k) "=" (v) } " " } } }
                @for (k, v) in &r.metadata { tr { th { "metadata " (k) } td { (v) } } }
            }
            h2 { "Headers" }
            table #headers {
                @for (name, value) in &r.headers {
                    tr {
                        th { (name) }
                        @if redacted(name) {
                            td.note { "(redacted, not shown)" }
                        } @else {
                            @match std::str::from_utf8(value) {
                                Ok(text) => td { (super::html::cut(text, 500)) },
                                Err(_) => td { "(not UTF-8) hex: " (value.iter().map(|b| format!("{b:02x}")).collect::<String>()) },
                            }
                        }
                    }
                }
                @for name in &r.redacted_headers {
                    tr { th { (name) } td.note { "(redacted, not stored)" } }
                }
            }
            (payload)
            h2 { "History (oldest first, last " (r.history.len()) ")" }
            table #history {
                thead { tr { th { "at" } th { "class" } th { "code" } th { "attempts" } th { "message" } } }
                tbody {
                    @for e in &r.history {
                        tr { td { (time(e.at)) } td { (e.class) } td { (e.code) } td.n { (e.attempts) } td { (e.message) } }
                    }
                }
            }
            (super::actions::record_forms(&ctx, &s, &r))
        }
    };
    Ok(page(
        &ctx,
        &format!("Dead letter {}", super::html::cut(&r.id, 60)),
        body,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_follows_the_bytes() {
        assert_eq!(choose(None, br#"{"a":1}"#).unwrap(), View::Json);
        assert_eq!(choose(None, b"plain").unwrap(), View::Text);
        assert_eq!(choose(None, b"caf\xe9").unwrap(), View::Hex);
        assert_eq!(choose(Some("text"), b"caf\xe9").unwrap(), View::Hex);
        assert_eq!(choose(Some("hex"), b"plain").unwrap(), View::Hex);
        assert!(choose(Some("pdf"), b"plain").is_err());
    }

    #[test]
    fn a_prefix_ends_on_a_character() {
        assert_eq!(prefix("aé".as_bytes(), 2), b"a");
        assert_eq!(prefix(b"abc", 5), b"abc");
        assert_eq!(hex(&[0, 255]), "00000000  00 ff");
    }
}
