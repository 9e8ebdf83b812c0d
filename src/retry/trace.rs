//! What the retry future tells the outside: the call's and the attempts' spans, the listener's
//! events, and the log lines of a retry, a deferral and a give-up.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use super::policy::RetryPolicy;
use crate::failure::{Code, Failure, Sent};
use crate::observe::{Event, Hook};
use crate::request::Replay;
use crate::status::DelaySource;
use crate::status::GiveUp;

/// A call's [`Spans`], if a subscriber wants them: one word, whose drop is a branch inline
/// (the spans' own drop is out of line, on the path that made them).
pub(crate) struct Traced(Option<Box<Spans>>);

impl Traced {
    #[inline]
    pub(super) fn as_ref(&self) -> Option<&Spans> {
        self.0.as_deref()
    }

    /// The current attempt's span, if there are spans.
    #[inline]
    pub(crate) fn attempt(&self) -> Option<&Span> {
        self.as_ref().map(|s| &s.attempt)
    }

    /// Records on the call's span the attempts made so far.
    #[inline]
    pub(super) fn record_attempts(&self, attempts: u32) {
        if let Some(spans) = self.as_ref() {
            spans.call.record("attempts", attempts);
        }
    }

    /// An attempt failed: the current one's failure is recorded on its span, which closes,
    /// whatever comes next (a copy's is on its own span, see `poll_copies`); the call's span
    /// counts the attempts made.
    #[inline]
    pub(super) fn attempt_failed<R>(&mut self, failure: &Failure<R>, current: bool, attempts: u32) {
        if let Some(spans) = self.0.as_deref_mut() {
            if current {
                record_failure(&spans.attempt, failure);
                spans.attempt = Span::none();
            }
            spans.call.record("attempts", attempts);
        }
    }

    /// Opens the span of the call's next attempt, number `attempt`, of `request`.
    #[inline]
    pub(super) fn next_attempt<Req: Replay>(&mut self, request: &Req, attempt: u32) {
        if let Some(spans) = self.0.as_deref_mut() {
            spans.attempt = new_attempt_span(&spans.call, request, attempt);
        }
    }

    /// The span of a hedged copy, number `attempt`, of `request`: a child of the call's span
    /// beside the current attempt's.
    #[inline]
    pub(super) fn copy_span<Req: Replay>(&self, request: &Req, attempt: u32) -> Span {
        self.as_ref()
            .map_or_else(Span::none, |s| new_attempt_span(&s.call, request, attempt))
    }
}

impl Drop for Traced {
    #[inline]
    fn drop(&mut self) {
        if let Some(spans) = self.0.take() {
            close(spans);
        }
    }
}

#[cold]
#[inline(never)]
fn close(spans: Box<Spans>) {
    drop(spans);
}

/// A call's spans: `backstop.call`, and the current attempt's `backstop.attempt`, its child.
pub(crate) struct Spans {
    call: Span,
    pub(super) attempt: Span,
}

impl Spans {
    /// The spans of a call of `request`, its first attempt's included; `None` (after one
    /// atomic load) unless a subscriber wants `DEBUG` spans.
    #[inline]
    pub(crate) fn of<Req: Replay>(request: &Req) -> Traced {
        Traced(if tracing::level_enabled!(tracing::Level::DEBUG) {
            Spans::new(request)
        } else {
            None
        })
    }

    #[cold]
    #[inline(never)]
    fn new<Req: Replay>(request: &Req) -> Option<Box<Spans>> {
        let call = tracing::debug_span!("backstop.call", attempts = Empty);
        if call.is_disabled() {
            return None;
        }
        let attempt = new_attempt_span(&call, request, 1);
        Some(Box::new(Spans { call, attempt }))
    }
}

#[inline(never)]
fn new_attempt_span<Req: Replay>(call: &Span, request: &Req, attempt: u32) -> Span {
    let span = tracing::debug_span!(
        parent: call,
        "backstop.attempt",
        attempt,
        otel.name = "backstop.attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = Empty,
        server.address = Empty,
        server.port = Empty,
        http.request.resend_count = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        request.record_span(&span);
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
    }
    span
}

/// Records a failed attempt on its span: `error.type` is the HTTP status code for an HTTP
/// answer (as the semantic conventions ask), else the failure's class; `otel.status_code` is
/// `ERROR`.
#[inline]
pub(super) fn record_failure<R>(span: &Span, failure: &Failure<R>) {
    match failure.code() {
        Code::Http(status) => {
            span.record("http.response.status_code", status.as_u16());
            span.record("error.type", status.as_str());
        }
        _ => {
            span.record("error.type", failure.class().name());
        }
    }
    span.record("otel.status_code", "ERROR");
}

/// Hands the end of an attempt to the listener: a success (`failure` is `None`) or a failure,
/// and a timeout: the per-attempt one, or, when `deadline` is set, the overall deadline's (the
/// attempt's time left was up).
#[inline(never)]
pub(super) fn attempt_ended<R>(
    hook: &Hook,
    started: Option<Instant>,
    attempt: u32,
    failure: Option<&Failure<R>>,
    deadline: bool,
) {
    let duration = started.map_or(Duration::ZERO, |at| at.elapsed());
    let (class, code, sent) = match failure {
        None => (None, None, Sent::Yes),
        Some(f) => (Some(f.class()), Some(f.code()), f.sent()),
    };
    hook.emit(|| Event::AttemptEnded {
        attempt,
        class,
        code,
        sent,
        duration,
    });
    if deadline || code == Some(Code::Timeout) {
        hook.emit(|| Event::TimedOut { attempt, deadline });
    }
}

/// The call's listener: the policy's (a retrying call's, or the one a single attempt keeps for
/// its listener); [`Hook::NONE`] without a policy.
#[inline]
pub(super) fn hook_of(policy: Option<&RetryPolicy>) -> &Hook {
    policy.map_or(&Hook::NONE, RetryPolicy::hook)
}

/// A retry scheduled after `failure` of attempt `attempt`: said at `INFO` and to the listener.
pub(super) fn retrying<R>(
    hook: &Hook,
    failure: &Failure<R>,
    attempt: u32,
    delay: Duration,
    source: DelaySource,
) {
    let (class, code) = (failure.class(), failure.code());
    tracing::info!(
        attempt,
        class = %class,
        code = %code,
        delay = ?delay,
        why = source.as_str(),
        "retrying"
    );
    hook.emit(|| Event::RetryScheduled {
        attempt,
        class,
        code,
        delay,
        source,
    });
}

/// The retry scheduled after `delay` (for `source`) went out as attempt `attempt`: said to the
/// listener (its log line is the `retrying` of its scheduling).
#[cold]
#[inline(never)]
pub(super) fn retried(hook: &Hook, attempt: u32, delay: Duration, source: DelaySource) {
    hook.emit(|| Event::Retried {
        attempt,
        delay,
        source,
    });
}

/// The call gave up on `failure` after `attempts` attempts: said to the listener and at `INFO`.
pub(super) fn gave_up<R>(hook: &Hook, failure: &Failure<R>, attempts: u32, reason: GiveUp) {
    hook.emit(|| Event::GaveUp {
        attempts,
        class: failure.class(),
        code: failure.code(),
        reason,
    });
    match reason {
        // A retry skipped for want of a copy: said with its cause, so that a request over the
        // replay buffer is not a silent single attempt.
        GiveUp::NotReplayable => tracing::info!(
            attempts,
            class = %failure.class(),
            code = %failure.code(),
            reason = reason.as_str(),
            cause = "the request has no copy to send again: a streaming body, or one over the replay buffer limit",
            "giving up: retry skipped"
        ),
        _ => tracing::info!(
            attempts,
            class = %failure.class(),
            code = %failure.code(),
            reason = reason.as_str(),
            "giving up"
        ),
    }
}

/// The call deferred `failure` to `at`, after `attempts` attempts, because its next delay,
/// `delay`, is above the maximum in-process delay: said in the log (a breaker rejection at
/// `DEBUG`: the breaker said at `WARN` that it opened) and to the listener. `delay` is `None`
/// for a single attempt's breaker rejection, which is not logged here.
pub(super) fn deferred<R>(
    hook: &Hook,
    failure: &Failure<R>,
    attempts: u32,
    at: SystemTime,
    delay: Option<Duration>,
) {
    match delay {
        None => {}
        Some(_) if failure.code() == Code::CircuitOpen => tracing::debug!(
            attempts,
            retry_at = %httpdate::fmt_http_date(at),
            "deferring: the breaker is open"
        ),
        Some(delay) => tracing::info!(
            attempts,
            class = %failure.class(),
            code = %failure.code(),
            delay = ?delay,
            retry_at = %httpdate::fmt_http_date(at),
            "deferring: delay above the maximum in-process delay"
        ),
    }
    hook.emit(|| Event::GaveUp {
        attempts,
        class: failure.class(),
        code: failure.code(),
        reason: GiveUp::Deferred,
    });
}
