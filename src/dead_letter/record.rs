use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::failure::Failure;
use crate::request::Envelope;

/// A dead letter: one request that finally failed, with everything needed to understand it and
/// to send it again.
///
/// Timestamps have millisecond precision (they are stored as milliseconds since the Unix epoch),
/// so that a record reads back from every store exactly as it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Record {
    /// The idempotency key of the request, or a generated message id (`msg-` and 32 hex digits).
    pub id: String,
    /// The failure's class name ([`Class::name`](crate::Class::name)).
    pub class: String,
    /// The original code, as displayed by [`Code`](crate::Code) (`http 503`, `io ConnectionReset`).
    pub code: String,
    /// The last error's message.
    pub message: String,
    /// The number of attempts made, the first call included (at least 1). Writing the same id
    /// again adds the new attempts to this count.
    pub attempts: u32,
    /// When the first attempt failed.
    pub first_failed_at: SystemTime,
    /// When the last attempt failed.
    pub last_failed_at: SystemTime,
    /// When the request may be sent again, if the server named a time (`Retry-After`).
    pub retry_at: Option<SystemTime>,
    /// The original payload, byte for byte.
    #[serde(with = "payload_text")]
    pub payload: Vec<u8>,
    /// The payload's media type, when known.
    pub content_type: Option<String>,
    /// Request metadata needed to re-send it (method, uri, idempotency key…).
    pub metadata: BTreeMap<String, String>,
}

/// Truncates `t` to whole milliseconds since the Unix epoch.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn truncate(t: SystemTime) -> SystemTime {
    from_millis(to_millis(t))
}

impl Record {
    /// The record of `failure`, for the request described by `envelope`, with id `id`.
    pub fn from_failure<R>(id: String, envelope: Envelope, failure: &Failure<R>) -> Self {
        let now = SystemTime::now();
        let retry_at = failure.retry_after().and_then(|d| now.checked_add(d));
        Record {
            id,
            class: failure.class().name().to_owned(),
            code: failure.code().to_string(),
            message: failure.message(),
            attempts: failure.attempts().max(1),
            first_failed_at: truncate(failure.first_failed_at().unwrap_or(now)),
            last_failed_at: truncate(now),
            retry_at: retry_at.map(truncate),
            payload: envelope.payload.to_vec(),
            content_type: envelope.content_type,
            metadata: envelope.metadata,
        }
    }

    /// Folds a newer record of the same id into this one: the newer failure's class, code,
    /// message, times and payload win; attempts add up; the first failure time stays.
    pub fn merge(&mut self, newer: Record) {
        let first = self.first_failed_at.min(newer.first_failed_at);
        let attempts = self.attempts.saturating_add(newer.attempts);
        *self = newer;
        self.first_failed_at = first;
        self.attempts = attempts;
    }
}

mod payload_text {
    //! Payloads as hex in JSON: readable in a terminal, and exact.
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(bytes) {
            Ok(text) => s.serialize_str(&format!("utf8:{text}")),
            Err(_) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                s.serialize_str(&format!("hex:{hex}"))
            }
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        if let Some(text) = s.strip_prefix("utf8:") {
            return Ok(text.as_bytes().to_vec());
        }
        let hex = s
            .strip_prefix("hex:")
            .ok_or_else(|| serde::de::Error::custom("payload must start with utf8: or hex:"))?;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd number of hex digits"));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Class, Code};

    #[test]
    fn json_round_trip_keeps_binary_payload() {
        let f: Failure = Failure::new(Class::TRANSIENT, Code::Timeout);
        let mut r = Record::from_failure("k".into(), Envelope::new(vec![0u8, 255, 10]), &f);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
        r.payload = b"{\"a\":1}".to_vec();
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("utf8:{"));
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
    }

    #[test]
    fn merge_adds_attempts_keeps_first_time() {
        let f: Failure = Failure::new(Class::TRANSIENT, Code::Timeout);
        let mut a = Record::from_failure("k".into(), Envelope::new("x"), &f);
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
}
