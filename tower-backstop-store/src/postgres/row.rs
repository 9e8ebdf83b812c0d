//! A record as a row of the `records` table, and back.

use std::collections::BTreeMap;

use sqlx::Row;
use sqlx::postgres::PgRow;

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::text;
use crate::StoreError;
use crate::record::{ErrorEntry, Record, Status, from_millis, to_millis};

/// A statement with its parameters bound so far.
pub(super) type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// The columns a record is read from, in the order [`decode_row`] reads them.
pub(super) const COLUMNS: [&str; 23] = [
    "id",
    "class",
    "code",
    "message",
    "attempts",
    "budget_spent",
    "first_failed_at_ms",
    "last_failed_at_ms",
    "retry_at_ms",
    "status",
    "resends",
    "resolved_at_ms",
    "history",
    "tags",
    "payload",
    "payload_truncated",
    "payload_len",
    "content_type",
    "metadata",
    "headers",
    "redacted_headers",
    "cause",
    "breaker",
];

/// The columns that are JSON, read as text.
const JSON_COLUMNS: [&str; 6] = [
    "history",
    "tags",
    "metadata",
    "headers",
    "redacted_headers",
    "cause",
];

/// The select list of a record, each column of table alias `prefix` (`""`: none).
pub(super) fn select_list(prefix: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| {
            if JSON_COLUMNS.contains(c) {
                format!("{prefix}{c}::text AS {c}")
            } else {
                format!("{prefix}{c}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A map of text as a JSON object, each key and value [`text::encode`]d.
pub(super) fn encode_map(map: &BTreeMap<String, String>) -> String {
    let encoded: BTreeMap<_, _> = map
        .iter()
        .map(|(k, v)| (text::encode(k), text::encode(v)))
        .collect();
    serde_json::to_string(&encoded).unwrap_or_else(|_| "{}".to_owned())
}

/// The map [`encode_map`] wrote.
fn decode_map(json: &str) -> Result<BTreeMap<String, String>, String> {
    let stored: BTreeMap<String, String> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    stored
        .into_iter()
        .map(|(k, v)| Ok((text::decode(k)?, text::decode(v)?)))
        .collect()
}

/// A record's headers in their JSON form (the record's own: `[name, "utf8:…"]` pairs).
#[derive(serde::Serialize, serde::Deserialize)]
struct Headers(#[serde(with = "crate::record::header_list")] Vec<(String, Vec<u8>)>);

/// A count read back: within `0..=u32::MAX` as written.
pub(super) fn count_of(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

pub(super) fn decode_error(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::new(format!(
        "postgres dead-letter store: decode record: {what}: {detail}"
    ))
}

/// The record of a row whose first columns are [`COLUMNS`].
pub(super) fn decode_row(row: &PgRow) -> Result<Record, StoreError> {
    let get_err = |e: sqlx::Error| StoreError::with_source("postgres dead-letter store: read", e);
    let text_at = |i: usize| -> Result<String, StoreError> {
        let s: String = row.try_get(i).map_err(get_err)?;
        text::decode(s).map_err(|e| decode_error(COLUMNS[i], e))
    };
    let opt_text_at = |i: usize| -> Result<Option<String>, StoreError> {
        let s: Option<String> = row.try_get(i).map_err(get_err)?;
        s.map(text::decode)
            .transpose()
            .map_err(|e| decode_error(COLUMNS[i], e))
    };
    let int_at = |i: usize| -> Result<i64, StoreError> { row.try_get(i).map_err(get_err) };
    let opt_int_at =
        |i: usize| -> Result<Option<i64>, StoreError> { row.try_get(i).map_err(get_err) };
    let json_at = |i: usize| -> Result<String, StoreError> { row.try_get(i).map_err(get_err) };
    let status: Status = json_at(9)?.parse()?;
    let history: Vec<ErrorEntry> =
        serde_json::from_str(&json_at(12)?).map_err(|e| decode_error("history", e))?;
    let tags = decode_map(&json_at(13)?).map_err(|e| decode_error("tags", e))?;
    let metadata = decode_map(&json_at(18)?).map_err(|e| decode_error("metadata", e))?;
    let headers: Headers =
        serde_json::from_str(&json_at(19)?).map_err(|e| decode_error("headers", e))?;
    let redacted_headers: Vec<String> =
        serde_json::from_str(&json_at(20)?).map_err(|e| decode_error("headers", e))?;
    let cause: Option<ErrorEntry> = opt_text_at(21)?
        .map(|c| serde_json::from_str(&c))
        .transpose()
        .map_err(|e| decode_error("cause", e))?;
    Ok(Record {
        id: text_at(0)?,
        tags,
        class: text_at(1)?,
        code: text_at(2)?,
        message: text_at(3)?,
        attempts: count_of(int_at(4)?),
        budget_spent: count_of(int_at(5)?),
        first_failed_at: from_millis(int_at(6)?),
        last_failed_at: from_millis(int_at(7)?),
        retry_at: opt_int_at(8)?.map(from_millis),
        status,
        resends: count_of(int_at(10)?),
        resolved_at: opt_int_at(11)?.map(from_millis),
        history,
        payload: row.try_get(14).map_err(get_err)?,
        payload_truncated: row.try_get(15).map_err(get_err)?,
        payload_len: u64::try_from(int_at(16)?).unwrap_or(0),
        content_type: opt_text_at(17)?,
        metadata,
        headers: headers.0,
        redacted_headers,
        cause,
        breaker: opt_text_at(22)?,
    })
}

/// A batch of records as one array per column, the parameters of the `put` statement.
#[derive(Default)]
pub(super) struct Columns {
    id: Vec<String>,
    class: Vec<String>,
    code: Vec<String>,
    message: Vec<String>,
    attempts: Vec<i64>,
    budget_spent: Vec<i64>,
    first_failed_at: Vec<i64>,
    last_failed_at: Vec<i64>,
    retry_at: Vec<Option<i64>>,
    status: Vec<String>,
    resends: Vec<i64>,
    resolved_at: Vec<Option<i64>>,
    history: Vec<String>,
    tags: Vec<String>,
    payload: Vec<Vec<u8>>,
    payload_truncated: Vec<bool>,
    payload_len: Vec<i64>,
    content_type: Vec<Option<String>>,
    metadata: Vec<String>,
    headers: Vec<String>,
    redacted_headers: Vec<String>,
    cause: Vec<Option<String>>,
    breaker: Vec<Option<String>>,
}

fn encode_error(what: &'static str) -> impl Fn(serde_json::Error) -> StoreError {
    move |e| StoreError::with_source(format!("postgres dead-letter store: encode {what}"), e)
}

impl Columns {
    pub(super) fn push(&mut self, r: Record) -> Result<(), StoreError> {
        let owned = |s: &str| text::encode(s).into_owned();
        self.id.push(owned(&r.id));
        self.class.push(owned(&r.class));
        self.code.push(owned(&r.code));
        self.message.push(owned(&r.message));
        self.attempts.push(i64::from(r.attempts));
        self.budget_spent.push(i64::from(r.budget_spent));
        self.first_failed_at.push(to_millis(r.first_failed_at));
        self.last_failed_at.push(to_millis(r.last_failed_at));
        self.retry_at.push(r.retry_at.map(to_millis));
        self.status.push(r.status.as_str().to_owned());
        self.resends.push(i64::from(r.resends));
        self.resolved_at.push(r.resolved_at.map(to_millis));
        self.history
            .push(serde_json::to_string(&r.history).map_err(encode_error("history"))?);
        self.tags.push(encode_map(&r.tags));
        self.payload_truncated.push(r.payload_truncated);
        self.payload_len
            .push(i64::try_from(r.payload_len).unwrap_or(i64::MAX));
        self.payload.push(r.payload);
        self.content_type.push(r.content_type.as_deref().map(owned));
        self.metadata.push(encode_map(&r.metadata));
        self.headers
            .push(serde_json::to_string(&Headers(r.headers)).map_err(encode_error("headers"))?);
        self.redacted_headers
            .push(serde_json::to_string(&r.redacted_headers).map_err(encode_error("headers"))?);
        self.cause.push(
            r.cause
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(encode_error("cause"))?,
        );
        self.breaker.push(r.breaker.as_deref().map(owned));
        Ok(())
    }

    pub(super) fn bind(self, query: PgQuery<'_>) -> PgQuery<'_> {
        query
            .bind(self.id)
            .bind(self.class)
            .bind(self.code)
            .bind(self.message)
            .bind(self.attempts)
            .bind(self.budget_spent)
            .bind(self.first_failed_at)
            .bind(self.last_failed_at)
            .bind(self.retry_at)
            .bind(self.status)
            .bind(self.resends)
            .bind(self.resolved_at)
            .bind(self.history)
            .bind(self.tags)
            .bind(self.payload)
            .bind(self.payload_truncated)
            .bind(self.payload_len)
            .bind(self.content_type)
            .bind(self.metadata)
            .bind(self.headers)
            .bind(self.redacted_headers)
            .bind(self.cause)
            .bind(self.breaker)
    }
}
