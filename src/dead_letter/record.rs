//! The record of a failure: what the dead-letter layer writes.

use std::time::SystemTime;

use crate::failure::{Class, Code, Failure};
use crate::request::Envelope;
use crate::retry::{Attempts, GiveUp};
use crate::store::{ErrorEntry, Record, RedactHeaders, Status, truncate};

use super::BudgetSpent;

/// The record of `failure`, for the request described by `envelope`, with id `id`: what
/// [`DeadLetterLayer`](super::DeadLetterLayer) writes, and what a [`Store`](crate::store::Store)
/// test or a tool can build the same way.
///
/// `retry_at` is the retry layer's [`Attempts::retry_at`](crate::retry::Attempts::retry_at) (or, when no retry layer saw the
/// failure, its delay hint counted from now), rounded up to the millisecond, and the status is
/// [`Deferred`](Status::Deferred), when the failure is deferred: the retry layer deferred it
/// ([`GiveUp::Deferred`]) or no retry layer saw it and it has a hint, and its class is not
/// permanent or poison. Otherwise the status is [`Dead`](Status::Dead) and `retry_at` is `None`.
/// The history holds this one failure. The payload is kept whole; see
/// [`Record::truncate_payload`]. The envelope's headers are kept but for the secret ones of
/// the default redaction list, whose names only are kept.
///
/// ```
/// use tower_backstop::{Class, Code, Envelope, Failure};
/// use tower_backstop::dead_letter::record_of;
/// use tower_backstop::store::Status;
///
/// let failure: Failure = Failure::new(Class::PERMANENT, Code::Error);
/// let record = record_of("msg-1".into(), Envelope::new("{}"), &failure);
/// assert_eq!((record.class.as_str(), record.status), ("permanent", Status::Dead));
/// ```
pub fn record_of<R>(id: String, envelope: Envelope, failure: &Failure<R>) -> Record {
    record_at(id, envelope, failure, SystemTime::now())
}

/// [`record_of`] with the time now given (from the layer's [`Clock`](crate::Clock)).
pub(crate) fn record_at<R>(
    id: String,
    mut envelope: Envelope,
    failure: &Failure<R>,
    now: SystemTime,
) -> Record {
    let (headers, redacted_headers) =
        RedactHeaders::default().split(std::mem::take(&mut envelope.headers));
    let deferred = is_deferred(failure);
    let noted = failure.note::<Attempts>();
    let counted = noted.map_or(0, Attempts::count);
    let retry_at = if deferred {
        noted
            .and_then(Attempts::retry_at)
            .or_else(|| failure.retry_after().and_then(|d| now.checked_add(d)))
    } else {
        None
    };
    // A failure refused by the durable attempt budget made no attempt; a breaker rejection is
    // not an attempt either (only the real attempts before it count).
    let attempts = if refused_by_budget(failure) {
        0
    } else if failure.code() == Code::CircuitOpen {
        counted
    } else {
        counted.max(1)
    };
    let class = failure.class().name().to_owned();
    let code = failure.code().to_string();
    let message = failure.message();
    let last = truncate(now);
    Record {
        id,
        history: vec![ErrorEntry {
            at: last,
            class: class.clone(),
            code: code.clone(),
            message: message.clone(),
            attempts,
        }],
        tags: envelope.tags,
        class,
        code,
        message,
        attempts,
        budget_spent: attempts,
        first_failed_at: truncate(noted.and_then(Attempts::first_failed_at).unwrap_or(now)),
        last_failed_at: last,
        retry_at: retry_at.map(ceil_millis),
        status: if retry_at.is_some() {
            Status::Deferred
        } else {
            Status::Dead
        },
        resends: 0,
        resolved_at: None,
        payload_len: envelope.payload.len() as u64,
        payload: envelope.payload.to_vec(),
        payload_truncated: false,
        content_type: envelope.content_type,
        metadata: envelope.metadata,
        headers,
        redacted_headers,
    }
}

/// Whether `failure` is the attempt budget's refusal: the inner service was not called.
fn refused_by_budget<R>(failure: &Failure<R>) -> bool {
    std::error::Error::source(failure).is_some_and(|s| s.is::<BudgetSpent>())
}

/// Whether a failure is deferred (to be re-sent by the scheduler at its retry-at time) rather
/// than dead.
///
/// A failure is deferred when the retry layer deferred it ([`GiveUp::Deferred`], with an
/// absolute [`Attempts::retry_at`](crate::retry::Attempts::retry_at)), or when no retry layer saw it and it carries a delay hint;
/// in both cases only if its class is neither permanent nor poison (those fail again whenever
/// they are sent). A failure the retry layer gave up on ([`GiveUp::HintTooLong`] under
/// `give_up_long_delays`, attempts exhausted…) is dead.
fn is_deferred<R>(failure: &Failure<R>) -> bool {
    let deferrable = match failure.note::<Attempts>().map(Attempts::give_up) {
        Some(GiveUp::Deferred) => true,
        None => failure.retry_after().is_some(),
        Some(_) => false,
    };
    deferrable && failure.class() != Class::PERMANENT && failure.class() != Class::POISON
}

/// Rounds `t` up to whole milliseconds, so that a stored retry-at time is never before the
/// instant it came from.
fn ceil_millis(t: SystemTime) -> SystemTime {
    let down = truncate(t);
    if down < t {
        down + std::time::Duration::from_millis(1)
    } else {
        down
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn from_failure<R>(id: String, envelope: Envelope, failure: &Failure<R>) -> Record {
        record_of(id, envelope, failure)
    }

    #[test]
    fn only_deferrable_failures_get_a_retry_at() {
        let hint = Duration::from_secs(30);
        let deferred: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
        let r = from_failure("k".into(), Envelope::new("x"), &deferred);
        assert_eq!(r.status, Status::Deferred);
        assert!(r.retry_at.is_some());
        let mut spent: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
        spent
            .notes_mut()
            .insert(Attempts::new(3, GiveUp::AttemptsExhausted));
        let r = from_failure("k".into(), Envelope::new("x"), &spent);
        assert_eq!((r.status, r.retry_at), (Status::Dead, None));
        let permanent: Failure =
            Failure::new(Class::PERMANENT, Code::Timeout).with_retry_after(hint);
        let r = from_failure("k".into(), Envelope::new("x"), &permanent);
        assert_eq!((r.status, r.retry_at), (Status::Dead, None));
        // Deferred by the retry layer: the record keeps its absolute retry-at time.
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let mut deferred: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
        deferred
            .notes_mut()
            .insert(Attempts::new(1, GiveUp::Deferred).with_retry_at(at));
        let r = from_failure("k".into(), Envelope::new("x"), &deferred);
        assert_eq!((r.status, r.retry_at), (Status::Deferred, Some(at)));
        // Given up on because the hint was too long (`give_up_long_delays`): dead.
        let mut too_long: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
        too_long
            .notes_mut()
            .insert(Attempts::new(1, GiveUp::HintTooLong));
        let r = from_failure("k".into(), Envelope::new("x"), &too_long);
        assert_eq!((r.status, r.retry_at), (Status::Dead, None));
    }
}
