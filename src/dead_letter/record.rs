//! The record of a failure: what the dead-letter layer writes.

use std::time::{Duration, SystemTime};

use super::RedactHeaders;
use crate::breaker::OpenError;
use crate::breaker::open::describe;
use crate::failure::{Class, Failure};
use crate::request::Envelope;
use crate::retry::{Attempts, GiveUp};
use crate::store::{ErrorEntry, Record, Status, add_clamped, truncate};

use super::BudgetSpent;

/// The longest a record is deferred: a week, the bound on rate-limit resets
/// ([`MAX_RESET_HINT`](crate::classify::MAX_RESET_HINT)). A failure whose retry-at time is further
/// ahead (a `Retry-After` of billions of seconds, a clock far off) is written
/// [`Dead`](Status::Dead), its message saying when it asked to be re-sent and that this is beyond
/// the bound, so that it is counted and seen instead of waiting for years.
pub const MAX_DEFERRAL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The record of `failure`, for the request described by `envelope`, with id `id`: what
/// [`DeadLetterLayer`](super::DeadLetterLayer) writes, and what a [`Store`](crate::store::Store)
/// test or a tool can build the same way.
///
/// `retry_at` is the retry layer's [`Attempts::retry_at`](crate::retry::Attempts::retry_at) (or, when no retry layer saw the
/// failure, its delay hint counted from now), rounded up to the millisecond, and the status is
/// [`Deferred`](Status::Deferred), when the failure is deferred: the retry layer deferred it
/// ([`GiveUp::Deferred`]) or no retry layer saw it and it has a hint, and its class is not
/// permanent or poison, and the retry-at time is at most [`MAX_DEFERRAL`] ahead. Otherwise the
/// status is [`Dead`](Status::Dead) and `retry_at` is `None`.
///
/// The record's [`cause`](Record::cause) is the failure itself when it is a real one; for an
/// open breaker's rejection it is the failure that opened the breaker, its
/// [`breaker`](Record::breaker) the breaker's name, and its message gives the half-open time as
/// an RFC 3339 time (`breaker "api.mail.test:443" is open; half-opens at
/// 2026-04-01T14:00:02.500Z`), never as a time left that is stale once read.
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
    // A failure refused by the durable attempt budget made no attempt; a breaker rejection, or
    // a call its send rate held back, is not an attempt either (only the real attempts before
    // it count).
    let attempts = if refused_by_budget(failure) {
        0
    } else if failure.code().not_an_attempt() {
        counted
    } else {
        counted.max(1)
    };
    let class = failure.class().name().to_owned();
    let code = failure.code().to_string();
    let open = std::error::Error::source(failure).and_then(|s| s.downcast_ref::<OpenError>());
    let retry_at = retry_at.map(ceil_millis);
    // The half-open time: the record's retry-at time when it is deferred (the same instant, as
    // the retry layer read it), else counted from now.
    let half_opens_at = retry_at.or_else(|| {
        failure
            .retry_after()
            .map(|left| ceil_millis(add_clamped(now, left)))
    });
    let mut message = match (open, half_opens_at) {
        (Some(open), Some(at)) => format!(
            "{open}; half-opens at {}",
            humantime::format_rfc3339_millis(at)
        ),
        _ => failure.message(),
    };
    let bound = now
        .checked_add(MAX_DEFERRAL)
        .map_or_else(|| add_clamped(now, MAX_DEFERRAL), ceil_millis);
    let too_far = retry_at.filter(|&at| at > bound);
    if let Some(at) = too_far {
        message = format!(
            "{message}; dead, not deferred: it asked to be re-sent at {}, more than {} ahead",
            humantime::format_rfc3339_millis(at),
            humantime::format_duration(MAX_DEFERRAL)
        );
    }
    let retry_at = retry_at.filter(|_| too_far.is_none());
    let last = truncate(now);
    let cause = match open {
        Some(open) => open.cause_now().map(|c| {
            let ago = tokio::time::Instant::now().saturating_duration_since(c.at);
            ErrorEntry::new(
                now.checked_sub(ago).unwrap_or(now),
                c.class.name(),
                c.code.to_string(),
                describe(&c),
                u32::try_from(c.failures).unwrap_or(u32::MAX),
            )
        }),
        None if refused_by_budget(failure) => None,
        None => Some(ErrorEntry::new(
            last,
            class.clone(),
            code.clone(),
            message.clone(),
            attempts,
        )),
    };
    let mut record = Record::new(id, ErrorEntry::new(last, class, code, message, attempts));
    record.tags = envelope.tags;
    record.first_failed_at = truncate(noted.and_then(Attempts::first_failed_at).unwrap_or(now));
    record.retry_at = retry_at;
    if retry_at.is_some() {
        record.status = Status::Deferred;
    }
    record.payload_len = envelope.payload.len() as u64;
    record.payload = envelope.payload.to_vec();
    record.content_type = envelope.content_type;
    record.metadata = envelope.metadata;
    record.headers = headers;
    record.redacted_headers = redacted_headers;
    record.cause = cause;
    record.breaker = open.map(|o| o.breaker().to_owned());
    record
}

/// A record id for a request that names none: `msg-` and 128 random bits in hex.
pub(super) fn generated_id() -> String {
    format!("msg-{:032x}", rand::random::<u128>())
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
/// they are sent). A call refused before it left (an open breaker's rejection, a send rate's
/// hold) that says when to try again is deferred to then, whatever the retry layer's reason
/// for stopping (its deadline, its waits for the breaker used up): it was never sent, so it is
/// no dead letter. Any other failure the retry layer gave up on ([`GiveUp::HintTooLong`] under
/// `give_up_long_delays`, attempts exhausted…) is dead.
fn is_deferred<R>(failure: &Failure<R>) -> bool {
    let deferrable = match failure.note::<Attempts>().map(Attempts::give_up) {
        Some(GiveUp::Deferred) => true,
        None => failure.retry_after().is_some(),
        Some(_) => failure.code().not_an_attempt() && failure.retry_after().is_some(),
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
    use crate::failure::Code;

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
        let at = truncate(SystemTime::now() + Duration::from_secs(24 * 3600));
        let mut deferred: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
        deferred
            .notes_mut()
            .insert(Attempts::new(1, GiveUp::Deferred).with_retry_at(at));
        let r = from_failure("k".into(), Envelope::new("x"), &deferred);
        assert_eq!((r.status, r.retry_at), (Status::Deferred, Some(at)));
        // Deferred beyond the bound (a `Retry-After` of billions of seconds): dead, and the
        // message says why and when it asked to be re-sent.
        let far: Failure = Failure::new(Class::THROTTLED, Code::Timeout)
            .with_retry_after(Duration::from_secs(3_000_000_000));
        let r = from_failure("k".into(), Envelope::new("x"), &far);
        assert_eq!((r.status, r.retry_at), (Status::Dead, None));
        assert!(
            r.message
                .contains("dead, not deferred: it asked to be re-sent at 2")
                && r.message.ends_with("more than 7days ahead"),
            "{}",
            r.message
        );
        // A week is still a deferral.
        let week: Failure =
            Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(MAX_DEFERRAL);
        let r = from_failure("k".into(), Envelope::new("x"), &week);
        assert_eq!(r.status, Status::Deferred);
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
