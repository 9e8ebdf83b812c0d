//! The fleet's breakers as the board sees them: what each process that shares its breakers
//! through the store says of them (its notes, `breaker:<name>`), the operators' overrides in
//! force (`override:<name>`), and the form and action that write an override for the whole
//! fleet ([`FleetOverride`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Form;
use axum::extract::State;
use http::StatusCode;
use maud::{Markup, html};
use serde::Deserialize;
use tower_backstop::breaker::{FleetOverride, OverrideAction};
use tower_backstop::store::{FleetNote, Store};

use super::actions::authorised;
use super::html::{Ctx, PageError, PageResult, cut, page, time};
use super::{BoardState, FLEET_PROCESSES};

/// The longest force-open or disable the form takes, as [`FleetOverride::new`]: 7 days.
const MAX_OVERRIDE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest breaker name and reason the form takes, in characters.
const MAX_NAME: usize = 255;
const MAX_REASON: usize = 500;

/// What one process says of one breaker (its note's body: a versioned JSON word).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    /// The process's id (the note's author).
    pub(crate) id: String,
    /// Its state word (`open`, `closed`, `half_open`, `forced_open`, `disabled`), or `None`
    /// when the note cannot be read (or comes from a newer version).
    pub(crate) state: Option<String>,
    /// When it half-opens, while open.
    pub(crate) half_opens_at: Option<SystemTime>,
    /// Opened on its own failures (not on the fleet's word).
    pub(crate) own: bool,
}

/// The word of a process's note, as far as the board reads it.
#[derive(Deserialize)]
struct Word {
    v: u32,
    state: String,
    #[serde(default)]
    own: bool,
    #[serde(default)]
    half_opens_at: Option<u64>,
}

/// The version of the notes the board reads.
const VERSION: u32 = 1;

impl Process {
    fn of(note: &FleetNote) -> Self {
        let word = serde_json::from_str::<Word>(&note.body)
            .ok()
            .filter(|w| w.v <= VERSION);
        Process {
            id: note.author.clone(),
            half_opens_at: word
                .as_ref()
                .and_then(|w| w.half_opens_at)
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            own: word.as_ref().is_some_and(|w| w.own),
            state: word.map(|w| w.state),
        }
    }

    /// Open in that process, however (on its own failures, on the fleet's word, forced).
    fn open(&self) -> bool {
        matches!(self.state.as_deref(), Some("open" | "forced_open"))
    }
}

/// What the fleet's notes say of one breaker.
#[derive(Clone, Debug, Default)]
pub(crate) struct Said {
    /// Each process's word, by process id.
    pub(crate) processes: Vec<Process>,
    /// The operator's override in force (or a reset of the last minute).
    pub(crate) over: Option<FleetOverride>,
}

/// The fleet's notes, read once for a page: by breaker name, or why they could not be read.
#[derive(Clone, Debug)]
pub(crate) struct Notes {
    pub(crate) by_breaker: Result<BTreeMap<String, Said>, String>,
}

impl Notes {
    /// Reads the notes in force at `now`; a store that keeps none, or fails, is said, not
    /// raised.
    pub(crate) async fn read(store: &dyn Store, now: SystemTime) -> Self {
        let by_breaker = match store.notes(now).await {
            Ok(notes) => Ok(by_breaker(&notes)),
            Err(e) => Err(e.to_string()),
        };
        Notes { by_breaker }
    }
}

/// `notes` by breaker: processes' words (by id) and the override, others ignored.
fn by_breaker(notes: &[FleetNote]) -> BTreeMap<String, Said> {
    let mut said: BTreeMap<String, Said> = BTreeMap::new();
    for note in notes {
        if let Some(over) = FleetOverride::from_note(note) {
            let name = over.breaker.clone();
            said.entry(name).or_default().over = Some(over);
        } else if let Some(name) = note.topic.strip_prefix("breaker:") {
            let process = Process::of(note);
            said.entry(name.to_owned())
                .or_default()
                .processes
                .push(process);
        }
    }
    for s in said.values_mut() {
        s.processes.sort_by(|a, b| a.id.cmp(&b.id));
    }
    said
}

impl Said {
    /// How many processes say each state, in words: `3 processes: 2 open, 1 closed`.
    fn summary(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &self.processes {
            *counts
                .entry(p.state.as_deref().unwrap_or("unreadable"))
                .or_default() += 1;
        }
        let n = self.processes.len();
        let states: Vec<String> = counts.iter().map(|(s, k)| format!("{k} {s}")).collect();
        format!(
            "{n} process{}: {}",
            if n == 1 { "" } else { "es" },
            states.join(", ")
        )
    }
}

/// The fleet's cell of a breaker's row: each process's state (and when it half-opens, while
/// open), at most [`FLEET_PROCESSES`] of them.
pub(crate) fn processes_cell(said: Option<&Said>, now: SystemTime) -> Markup {
    let Some(said) = said.filter(|s| !s.processes.is_empty()) else {
        return html! { span.note { "no process shares it" } };
    };
    html! {
        (said.summary())
        ul.processes {
            @for p in said.processes.iter().take(FLEET_PROCESSES) {
                li data-process=(p.id) data-state=(p.state.as_deref().unwrap_or("unreadable")) {
                    code { (cut(&p.id, 40)) } ": "
                    @match &p.state {
                        Some(state) => {
                            span class=(if p.open() { "firing" } else if state == "closed" { "ok" } else { "waiting" }) { (state) }
                            @if p.open() && !p.own && state == "open" { " (on the fleet's word)" }
                            @if let Some(t) = p.half_opens_at.filter(|_| p.open()) {
                                ", half-opens "
                                @if t > now { "in " (super::breakers::seconds(t.duration_since(now).unwrap_or_default())) } @else { "now" }
                            }
                        }
                        None => { span.waiting { "note unreadable (another version?)" } }
                    }
                }
            }
        }
        @if said.processes.len() > FLEET_PROCESSES {
            span.note { "… and " (said.processes.len() - FLEET_PROCESSES) " more (counted above)." }
        }
    }
}

/// The override cell: the override in force (action, until, reason, actor), if any.
pub(crate) fn override_cell(said: Option<&Said>) -> Markup {
    let Some(over) = said.and_then(|s| s.over.as_ref()) else {
        return html! {};
    };
    html! {
        div.override data-action=(over.action.as_str()) {
            strong { (over.action.as_str()) }
            @if over.action == OverrideAction::Reset {
                " at " (time(over.at))
            } @else {
                " until " (time(over.until))
            }
            " by " (over.actor) ": " (cut(&over.reason, 200))
        }
    }
}

/// The override form of the breaker `name` (or, with `None`, of a breaker the operator names).
pub(crate) fn form(ctx: &Ctx, name: Option<&str>) -> Markup {
    html! {
        details.override-form {
            summary { @if name.is_some() { "override…" } @else { "override another breaker…" } }
            form.override method="post" action=(ctx.link("/breaker/override")) {
                (ctx.csrf_field())
                @if let Some(name) = name {
                    input type="hidden" name="breaker" value=(name);
                } @else {
                    label { "breaker " input name="breaker" required placeholder="api.mail.test:443" size="24"; } " "
                }
                label { "for " input name="for" required placeholder="30m" size="5"; }
                " "
                label { "reason " input name="reason" required size="24" maxlength=(MAX_REASON); }
                " "
                button type="submit" name="action" value="force_open" { "force open" }
                " "
                button type="submit" name="action" value="disable" { "disable" }
                " "
                button type="submit" name="action" value="reset" formnovalidate { "reset" }
            }
        }
    }
}

/// The form's fields, checked: the override asked.
fn read_form(
    fields: &[(String, String)],
    actor: &str,
    now: SystemTime,
) -> Result<FleetOverride, PageError> {
    let last = |key: &str| {
        fields
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.trim())
    };
    let name = last("breaker");
    if name.is_empty() {
        return Err(PageError::bad_request(
            "breaker: name the breaker (a per-host breaker's host:port, api.mail.test:443)",
        ));
    }
    if name.chars().count() > MAX_NAME {
        return Err(PageError::bad_request(format!(
            "breaker: a name is at most {MAX_NAME} characters"
        )));
    }
    let action = match last("action") {
        "force_open" => OverrideAction::ForceOpen,
        "disable" => OverrideAction::Disable,
        "reset" => OverrideAction::Reset,
        other => {
            return Err(PageError::bad_request(format!(
                "action: {other:?} is none of force_open, disable, reset"
            )));
        }
    };
    let reason = last("reason");
    if reason.is_empty() {
        return Err(PageError::bad_request(
            "reason: say why, for the audit trail and every process's health report",
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(PageError::bad_request(format!(
            "reason: at most {MAX_REASON} characters"
        )));
    }
    let duration = match action {
        OverrideAction::Reset => Duration::ZERO,
        _ => {
            let text = last("for");
            let duration = humantime::parse_duration(text).map_err(|_| {
                PageError::bad_request(format!("for: {text:?} is not a duration (30m, 2h, 3days)"))
            })?;
            if duration.is_zero() || duration > MAX_OVERRIDE {
                return Err(PageError::bad_request(format!(
                    "for: {text} is out of range: above zero and at most 7 days"
                )));
            }
            duration
        }
    };
    FleetOverride::new(name, action, duration, reason, actor, now)
        .map_err(|e| PageError::bad_request(e.to_string()))
}

/// `POST /breaker/override`: writes an operator's override of one breaker for the fleet, and
/// its audit entry, as the hook's actor.
pub(super) async fn override_breaker(
    State(s): State<BoardState>,
    ctx: Ctx,
    Form(fields): Form<Vec<(String, String)>>,
) -> PageResult {
    let actor = authorised(&ctx, &fields)?;
    let over = read_form(&fields, &actor, SystemTime::now())?;
    over.publish(&*s.board.store).await.map_err(|e| {
        PageError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the override of {} was not written: {e}", over.breaker),
        )
    })?;
    let body = html! {
        p #result data-breaker=(over.breaker) data-action=(over.action.as_str()) {
            "Written for the fleet: " code { (over.breaker) } " " (over.describe()) ", by " (actor) "."
        }
        p.note {
            "Each process that shares its breakers through this store applies it within a second"
            @if over.action != OverrideAction::Reset { " and resets the breaker by itself at its expiry" }
            ". Recorded in the " a href=(ctx.link("/audit")) { "audit trail" } ". "
            a href=(ctx.link("/")) { "Back to the overview" } "."
        }
    };
    Ok(page(&ctx, "Breaker override", body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_form_is_read_and_checked() {
        let now = SystemTime::now();
        let ok = read_form(
            &fields(&[
                ("breaker", " a.test:443 "),
                ("action", "force_open"),
                ("for", "2h"),
                ("reason", "maintenance"),
            ]),
            "alice",
            now,
        )
        .unwrap();
        assert_eq!(ok.breaker, "a.test:443");
        assert_eq!(ok.action, OverrideAction::ForceOpen);
        assert_eq!(ok.actor, "alice");
        // A reset needs no duration.
        let reset = read_form(
            &fields(&[
                ("breaker", "a.test:443"),
                ("action", "reset"),
                ("reason", "back"),
            ]),
            "alice",
            now,
        )
        .unwrap();
        assert_eq!(reset.action, OverrideAction::Reset);
        for (bad, says) in [
            (
                vec![("action", "disable"), ("for", "1h"), ("reason", "x")],
                "breaker",
            ),
            (
                vec![
                    ("breaker", "a"),
                    ("action", "close"),
                    ("for", "1h"),
                    ("reason", "x"),
                ],
                "action",
            ),
            (
                vec![
                    ("breaker", "a"),
                    ("action", "disable"),
                    ("for", "1h"),
                    ("reason", " "),
                ],
                "reason",
            ),
            (
                vec![("breaker", "a"), ("action", "disable"), ("reason", "x")],
                "for",
            ),
            (
                vec![
                    ("breaker", "a"),
                    ("action", "disable"),
                    ("for", "soon"),
                    ("reason", "x"),
                ],
                "for",
            ),
            (
                vec![
                    ("breaker", "a"),
                    ("action", "disable"),
                    ("for", "8days"),
                    ("reason", "x"),
                ],
                "out of range",
            ),
            (
                vec![
                    ("breaker", "a"),
                    ("action", "disable"),
                    ("for", "0s"),
                    ("reason", "x"),
                ],
                "out of range",
            ),
        ] {
            let e = read_form(&fields(&bad), "alice", now).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(says), "{bad:?}: {}", e.message);
        }
    }

    #[test]
    fn notes_are_grouped_by_breaker_with_the_override() {
        let now = SystemTime::now();
        let word = |state: &str| {
            format!(
                r#"{{"v":1,"state":"{state}","own":true,"half_opens_at":{}}}"#,
                1_000
            )
        };
        let over = FleetOverride::new(
            "a.test:443",
            OverrideAction::Disable,
            Duration::from_secs(60),
            "wrong signal",
            "bob",
            now,
        )
        .unwrap();
        let notes = vec![
            FleetNote::new(
                "breaker:a.test:443",
                "p2",
                word("closed"),
                now,
                Duration::from_secs(3),
            ),
            FleetNote::new(
                "breaker:a.test:443",
                "p1",
                word("open"),
                now,
                Duration::from_secs(3),
            ),
            FleetNote::new(
                "breaker:a.test:443",
                "p3",
                "{\"v\":9}",
                now,
                Duration::from_secs(3),
            ),
            FleetNote::new("other:x", "p1", "?", now, Duration::from_secs(3)),
            over.to_note(),
        ];
        let said = by_breaker(&notes);
        assert_eq!(said.len(), 1);
        let a = &said["a.test:443"];
        let ids: Vec<&str> = a.processes.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["p1", "p2", "p3"]);
        assert!(a.processes[0].open() && a.processes[0].half_opens_at.is_some());
        assert_eq!(a.processes[2].state, None);
        assert_eq!(a.over.as_ref(), Some(&over));
        assert_eq!(a.summary(), "3 processes: 1 closed, 1 open, 1 unreadable");
    }
}
