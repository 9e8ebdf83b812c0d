use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How many past errors a record keeps by default ([`Record::history`]): the last 10.
pub const DEFAULT_HISTORY_LIMIT: usize = 10;

/// Where a dead letter stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// Quarantined: waits for someone to investigate and re-drive it on purpose.
    Dead,
    /// Deferred: the [`Scheduler`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html) re-sends it once
    /// [`retry_at`](Record::retry_at) is due.
    Deferred,
    /// Claimed by a scheduler or a re-drive that is sending it now; its
    /// [`retry_at`](Record::retry_at) is the end of the claim, after which another scheduler may
    /// take it again.
    InFlight,
    /// Re-sent with success; kept for the audit trail.
    Resolved,
}

impl Status {
    /// The status as stored and shown: `dead`, `deferred`, `in_flight`, `resolved`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Dead => "dead",
            Status::Deferred => "deferred",
            Status::InFlight => "in_flight",
            Status::Resolved => "resolved",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Reads `dead`, `deferred`, `in_flight` (or `in-flight`) and `resolved`; any other text is a
/// [`StoreError`](super::StoreError) that quotes it and names the four statuses.
impl FromStr for Status {
    type Err = super::StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "dead" => Status::Dead,
            "deferred" => Status::Deferred,
            "in_flight" | "in-flight" => Status::InFlight,
            "resolved" => Status::Resolved,
            _ => {
                return Err(super::StoreError::new(format!(
                    "unknown dead-letter status {s:?} (expected dead, deferred, in_flight or resolved)"
                )));
            }
        })
    }
}

/// One failure in a record's [`history`](Record::history).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ErrorEntry {
    /// When it failed (millisecond precision).
    #[serde(with = "time_text")]
    pub at: SystemTime,
    /// The failure's class name.
    pub class: String,
    /// The original code, as displayed by [`Code`](https://docs.rs/tower-backstop/latest/tower_backstop/enum.Code.html).
    pub code: String,
    /// The error's message.
    pub message: String,
    /// The attempts this failure took, the first call included.
    pub attempts: u32,
}

/// A dead letter: one request that finally failed, with everything needed to understand it and
/// to send it again.
///
/// Timestamps have millisecond precision (they are stored as milliseconds since the Unix epoch),
/// so that a record reads back from every store exactly as it was written. In JSON they are
/// RFC 3339 text in UTC (`2026-04-01T14:00:00.000Z`).
///
/// A record never grows without bound: its [`history`](Record::history) keeps the last K errors
/// (the store's history limit, [`DEFAULT_HISTORY_LIMIT`] by default) and its payload is cut at the
/// dead-letter layer's payload limit
/// ([`DEFAULT_PAYLOAD_LIMIT`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/constant.DEFAULT_PAYLOAD_LIMIT.html) by default) with
/// [`payload_truncated`](Record::payload_truncated) set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Record {
    /// The idempotency key of the request, or a generated message id (`msg-` and 32 hex digits).
    pub id: String,
    /// Labels extracted from the request by the layer's tag function (campaign, provider,
    /// tenant…), searchable with [`Filter::tag`](super::Filter::tag).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The last failure's class name ([`Class::name`](https://docs.rs/tower-backstop/latest/tower_backstop/struct.Class.html#method.name)).
    pub class: String,
    /// The last failure's original code, as displayed by [`Code`](https://docs.rs/tower-backstop/latest/tower_backstop/enum.Code.html) (`http 503`,
    /// `io ConnectionReset`).
    pub code: String,
    /// The last error's message.
    pub message: String,
    /// The number of attempts made in all, the first call included. Writing the same id again
    /// adds the new attempts to this count.
    pub attempts: u32,
    /// The attempts counted against a durable attempt budget
    /// ([`DeadLetterLayer::attempt_budget`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html#method.attempt_budget)):
    /// like `attempts`, but set back to zero when someone re-drives the record on purpose.
    #[serde(default)]
    pub budget_spent: u32,
    /// When the first attempt failed.
    #[serde(with = "time_text")]
    pub first_failed_at: SystemTime,
    /// When the last attempt failed.
    #[serde(with = "time_text")]
    pub last_failed_at: SystemTime,
    /// When the request may be sent again: set while the record is
    /// [`Deferred`](Status::Deferred) (the server's delay hint) or
    /// [`InFlight`](Status::InFlight) (the end of the claim).
    #[serde(with = "opt_time_text", default)]
    pub retry_at: Option<SystemTime>,
    /// Where the record stands.
    #[serde(default = "default_status")]
    pub status: Status,
    /// How many times it was re-sent, by a re-drive or the scheduler.
    #[serde(default)]
    pub resends: u32,
    /// When a re-send succeeded, if one did since the last failure.
    #[serde(with = "opt_time_text", default)]
    pub resolved_at: Option<SystemTime>,
    /// The last errors, oldest first, at most the store's history limit.
    #[serde(default)]
    pub history: Vec<ErrorEntry>,
    /// The original payload, byte for byte, or its first bytes when
    /// [`payload_truncated`](Record::payload_truncated).
    #[serde(with = "payload_text")]
    pub payload: Vec<u8>,
    /// Whether `payload` was cut at the payload limit. A truncated record cannot be re-sent.
    #[serde(default)]
    pub payload_truncated: bool,
    /// The size of the original payload, in bytes.
    #[serde(default)]
    pub payload_len: u64,
    /// The payload's media type, when known.
    pub content_type: Option<String>,
    /// Request metadata needed to re-send it (method, uri, idempotency key…).
    pub metadata: BTreeMap<String, String>,
    /// The request's headers as sent, in order: each name and its value byte for byte, except
    /// the redacted ones ([`DeadLetterLayer::redact_header`](https://docs.rs/tower-backstop/latest/tower_backstop/dead_letter/struct.DeadLetterLayer.html#method.redact_header)), whose values are never
    /// written. A re-drive sends every kept header again
    /// ([`http_request`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/fn.http_request.html)). Empty in records written before headers were kept.
    #[serde(default, with = "header_list")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The root cause: the provider's last real failure, beside the final word
    /// ([`class`](Record::class), [`code`](Record::code), [`message`](Record::message)).
    ///
    /// For a record whose final word is a real failure (a response, a timeout, a refused
    /// connection) it is that failure. For one an open breaker rejected, it is the failure that
    /// opened the breaker (or its last failed probe), with the failures the breaker counted in
    /// its message and [`attempts`](ErrorEntry::attempts)
    /// (`connection refused (io ConnectionRefused); 12 failures in 10.2s`). A later write with
    /// no real failure (another rejection whose breaker no longer knows why, a refusal of the
    /// attempt budget) keeps the cause already there. `None` when no real failure is known.
    #[serde(default)]
    pub cause: Option<ErrorEntry>,
    /// The breaker that guards the record's provider (a keyed breaker's key, such as
    /// `api.mail.test:443`), when an open breaker rejected it: the
    /// [`Scheduler`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html) paces its re-sends by that breaker.
    #[serde(default)]
    pub breaker: Option<String>,
    /// The names (lower case) of the headers the request had but the record does not keep the
    /// value of; a re-drive gets them back from a user hook
    /// ([`http_request_restoring`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/fn.http_request_restoring.html)), for example to sign the
    /// request again.
    #[serde(default)]
    pub redacted_headers: Vec<String>,
}

fn default_status() -> Status {
    Status::Dead
}

/// Truncates `t` to whole milliseconds since the Unix epoch.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The latest time a record keeps: the last millisecond of the year 9999, the end of RFC 3339
/// (and of `humantime`'s formatter). Stored times past it read back as it.
pub(crate) const MAX_MILLIS: i64 = 253_402_300_799_999;

/// The time `ms` milliseconds after the Unix epoch, clamped to the epoch and [`MAX_MILLIS`]:
/// stored text or numbers out of that range (written by hand or by another tool) never make a
/// time that cannot be formatted.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms.clamp(0, MAX_MILLIS)).unwrap_or(0))
}

/// `t + d` in a record's precision (whole milliseconds), or the latest time a record keeps
/// (the last millisecond of the year 9999) when that overflows or passes it. Stores and the
/// layers that write records compute due times and leases with it, so that no time overflows.
pub fn add_clamped(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d).map_or(from_millis(MAX_MILLIS), truncate)
}

/// `t` truncated to whole milliseconds, the precision every store keeps: a time written and
/// read back compares equal to the truncated one.
pub fn truncate(t: SystemTime) -> SystemTime {
    from_millis(to_millis(t))
}

impl ErrorEntry {
    /// A failure at `at` (kept to the millisecond), of class `class` and code `code` (their
    /// display names), with its message, after `attempts` attempts (the first call included).
    pub fn new(
        at: SystemTime,
        class: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
        attempts: u32,
    ) -> Self {
        ErrorEntry {
            at: truncate(at),
            class: class.into(),
            code: code.into(),
            message: message.into(),
            attempts,
        }
    }
}

impl Record {
    /// A [`Dead`](Status::Dead) record `id` whose one failure so far is `failure`: its class,
    /// code, message and attempts (also the budget spent), failed first and last at its time,
    /// with that failure as its whole history. Everything else is empty (no tags, payload,
    /// headers, metadata, root cause or breaker, no resend): set the public fields for the rest.
    pub fn new(id: impl Into<String>, failure: ErrorEntry) -> Self {
        Record {
            id: id.into(),
            tags: BTreeMap::new(),
            class: failure.class.clone(),
            code: failure.code.clone(),
            message: failure.message.clone(),
            attempts: failure.attempts,
            budget_spent: failure.attempts,
            first_failed_at: failure.at,
            last_failed_at: failure.at,
            retry_at: None,
            status: Status::Dead,
            resends: 0,
            resolved_at: None,
            history: vec![failure],
            payload: Vec::new(),
            payload_truncated: false,
            payload_len: 0,
            content_type: None,
            metadata: BTreeMap::new(),
            headers: Vec::new(),
            cause: None,
            breaker: None,
            redacted_headers: Vec::new(),
        }
    }

    /// Cuts the payload to at most `limit` bytes, setting
    /// [`payload_truncated`](Record::payload_truncated) when it was longer.
    /// [`payload_len`](Record::payload_len) keeps the original size.
    pub fn truncate_payload(&mut self, limit: usize) {
        if self.payload.len() > limit {
            self.payload.truncate(limit);
            self.payload.shrink_to_fit();
            self.payload_truncated = true;
        }
    }

    /// Folds a newer record of the same id into this one, keeping the last
    /// [`DEFAULT_HISTORY_LIMIT`] errors; see [`merge_bounded`](Record::merge_bounded).
    pub fn merge(&mut self, newer: Record) {
        self.merge_bounded(newer, DEFAULT_HISTORY_LIMIT);
    }

    /// Folds a newer record of the same id into this one: the newer failure's class, code,
    /// message, times, status, retry-at and payload win; attempts and the budget spent add up; the
    /// first failure time stays; tags are united (newer values win); the histories are
    /// concatenated and only the last `history_limit` errors are kept (at least one); the
    /// [`cause`](Record::cause) and the [`breaker`](Record::breaker) are the newer ones when it
    /// has them, else the ones already there.
    pub fn merge_bounded(&mut self, newer: Record, history_limit: usize) {
        let first = self.first_failed_at.min(newer.first_failed_at);
        let attempts = self.attempts.saturating_add(newer.attempts);
        let budget_spent = self.budget_spent.saturating_add(newer.budget_spent);
        let resends = self.resends.max(newer.resends);
        let cause = newer.cause.is_none().then(|| self.cause.take()).flatten();
        let breaker = newer
            .breaker
            .is_none()
            .then(|| self.breaker.take())
            .flatten();
        let mut history = std::mem::take(&mut self.history);
        let mut tags = std::mem::take(&mut self.tags);
        *self = newer;
        history.append(&mut self.history);
        tags.append(&mut self.tags);
        self.tags = tags;
        self.history = history;
        self.bound_history(history_limit);
        self.first_failed_at = first;
        self.attempts = attempts;
        self.budget_spent = budget_spent;
        self.resends = resends;
        if cause.is_some() {
            self.cause = cause;
        }
        if breaker.is_some() {
            self.breaker = breaker;
        }
    }

    /// Drops the oldest errors so that at most `history_limit` (at least one) are kept.
    pub fn bound_history(&mut self, history_limit: usize) {
        let keep = history_limit.max(1);
        if self.history.len() > keep {
            let cut = self.history.len() - keep;
            self.history.drain(..cut);
        }
    }

    /// Whether the record can be re-sent: its payload is whole.
    pub fn resendable(&self) -> bool {
        !self.payload_truncated
    }
}

pub(super) mod time_text {
    //! Timestamps as RFC 3339 text in UTC, with milliseconds.
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(super::truncate(*t)))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&s).map_err(serde::de::Error::custom)
    }
}

mod opt_time_text {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        t: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&humantime::format_rfc3339_millis(super::truncate(*t))),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| humantime::parse_rfc3339_weak(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}
/// Decodes hex digits (either case) into bytes, byte by byte: text that is not all ASCII hex
/// digits, or an odd number of them, is an error, never a panic.
pub(crate) fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err(format!(
            "payload has an odd number of hex digits ({})",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(2)
        .enumerate()
        .map(|(i, pair)| match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err(format!(
                "payload is not hex: byte {} is not a hex digit",
                2 * i + usize::from(digit(pair[0]).is_some())
            )),
        })
        .collect()
}

pub(crate) mod header_list {
    //! Headers as `[name, value]` pairs in JSON, each value as the payload is (`utf8:` text or
    //! `hex:` digits), so that a value that is not UTF-8 is kept exactly.
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        headers: &[(String, Vec<u8>)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(headers.len()))?;
        for (name, value) in headers {
            seq.serialize_element(&(name, super::payload_text::encode(value)))?;
        }
        seq.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        Vec::<(String, String)>::deserialize(d)?
            .into_iter()
            .map(|(name, value)| {
                super::payload_text::decode(&value)
                    .map(|v| (name, v))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

mod payload_text {
    //! Payloads as hex in JSON: readable in a terminal, and exact.
    use serde::{Deserialize, Deserializer, Serializer};

    /// `utf8:` and the text, or `hex:` and two hex digits a byte.
    pub(super) fn encode(bytes: &[u8]) -> String {
        match std::str::from_utf8(bytes) {
            Ok(text) => format!("utf8:{text}"),
            Err(_) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                format!("hex:{hex}")
            }
        }
    }

    /// The bytes of `utf8:` or `hex:` text; an error for anything else.
    pub(super) fn decode(s: &str) -> Result<Vec<u8>, String> {
        if let Some(text) = s.strip_prefix("utf8:") {
            return Ok(text.as_bytes().to_vec());
        }
        let hex = s
            .strip_prefix("hex:")
            .ok_or_else(|| "payload must start with utf8: or hex:".to_owned())?;
        super::decode_hex(hex)
    }

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        decode(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status written in a column of a width (a table of the command line) fills it.
    #[test]
    fn a_status_honours_width_and_alignment() {
        assert_eq!(format!("{:<10}|", Status::Dead), "dead      |");
        assert_eq!(format!("{:>10}|", Status::InFlight), " in_flight|");
        assert_eq!(format!("{:.3}", Status::Resolved), "res");
    }

    /// A record of one timed-out attempt of `payload`, as the dead-letter layer writes it.
    fn record(id: &str, payload: impl Into<Vec<u8>>) -> Record {
        let now = truncate(SystemTime::now());
        let entry = ErrorEntry {
            at: now,
            class: "transient".to_owned(),
            code: "timeout".to_owned(),
            message: "timeout".to_owned(),
            attempts: 1,
        };
        let payload = payload.into();
        Record {
            id: id.to_owned(),
            tags: BTreeMap::new(),
            class: entry.class.clone(),
            code: entry.code.clone(),
            message: entry.message.clone(),
            attempts: 1,
            budget_spent: 1,
            first_failed_at: now,
            last_failed_at: now,
            retry_at: None,
            status: Status::Dead,
            resends: 0,
            resolved_at: None,
            history: vec![entry],
            payload_len: payload.len() as u64,
            payload,
            payload_truncated: false,
            content_type: None,
            metadata: BTreeMap::new(),
            headers: Vec::new(),
            redacted_headers: Vec::new(),
            cause: None,
            breaker: None,
        }
    }

    #[test]
    fn json_round_trip_keeps_binary_payload() {
        let mut r = record("k", vec![0u8, 255, 10]);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
        r.payload = b"{\"a\":1}".to_vec();
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("utf8:{"));
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
    }

    #[test]
    fn hex_payload_that_is_not_hex_is_an_error_not_a_panic() {
        let r = record("k", vec![0u8, 255]);
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"hex:00ff\""), "{json}");
        for bad in ["hex:a€", "hex:€a", "hex:abc", "hex:zz", "hex:0g", "nope"] {
            let text = json.replace("hex:00ff", bad);
            let err = serde_json::from_str::<Record>(&text).unwrap_err();
            assert!(err.to_string().contains("payload"), "{bad}: {err}");
        }
        assert_eq!(decode_hex("00Ff10").unwrap(), [0, 255, 16]);
    }

    #[test]
    fn merge_adds_attempts_keeps_first_time() {
        let mut a = record("k", "x");
        a.attempts = 3;
        let mut b = a.clone();
        b.first_failed_at = a.first_failed_at + Duration::from_secs(10);
        b.code = "http 503".into();
        b.attempts = 2;
        let first = a.first_failed_at;
        a.merge(b);
        assert_eq!(a.attempts, 5);
        assert_eq!(a.first_failed_at, first);
        assert_eq!(a.code, "http 503");
    }

    #[test]
    fn history_is_bounded_and_keeps_the_newest() {
        let mut r = record("k", "x");
        for i in 0..20 {
            let mut newer = record("k", "x");
            newer.history[0].message = format!("error {i}");
            r.merge_bounded(newer, 3);
        }
        let messages: Vec<&str> = r.history.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, ["error 17", "error 18", "error 19"]);
        assert_eq!(r.attempts, 21);
        r.merge_bounded(record("k", "x"), 0);
        assert_eq!(r.history.len(), 1, "at least one error is kept");
    }

    #[test]
    fn payload_over_the_limit_is_cut_and_flagged() {
        let mut r = record("k", vec![7u8; 100]);
        r.truncate_payload(100);
        assert!(!r.payload_truncated && r.resendable());
        r.truncate_payload(10);
        assert_eq!((r.payload.len(), r.payload_len), (10, 100));
        assert!(r.payload_truncated && !r.resendable());
    }

    #[test]
    fn status_round_trips_through_text() {
        for s in [
            Status::Dead,
            Status::Deferred,
            Status::InFlight,
            Status::Resolved,
        ] {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        }
        assert_eq!(
            "lost".parse::<Status>().unwrap_err().to_string(),
            "unknown dead-letter status \"lost\" (expected dead, deferred, in_flight or resolved)"
        );
    }
}
