//! The failure types every layer shares: the [`Class`] of a failure, its original [`Code`], and
//! the [`Failure`] value that carries both up the stack.
//!
//! A failure is classified once, by [`ClassifyLayer`](crate::classify::ClassifyLayer) (or, for a
//! plain [`BoxError`], by [`classify_error`](crate::classify::classify_error) when it is converted
//! with `Failure::from`). Every outer layer reads the class off the value; none parses HTTP or io
//! errors again.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use sync_wrapper::SyncWrapper;

/// A type-erased error, the `tower` convention: `Box<dyn Error + Send + Sync>`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The class of a failure: what kind of trouble it is, and so what the retry policy, the breaker
/// and the dead-letter layer do with it.
///
/// A class is a small `Copy` value (a `&'static str` name) so that a policy lookup allocates
/// nothing. Two classes are equal when their names are equal. The built-in classes follow the
/// taxonomy of the crate's design (RFC 9110 status semantics, gRFC A6 retry, the Google SRE book's
/// advice on retrying): [`TRANSIENT`](Class::TRANSIENT), [`THROTTLED`](Class::THROTTLED),
/// [`UNKNOWN`](Class::UNKNOWN), [`PERMANENT`](Class::PERMANENT), [`POISON`](Class::POISON), plus
/// [`CIRCUIT_OPEN`](Class::CIRCUIT_OPEN), which only the breaker creates.
///
/// Users define their own with [`Class::new`]:
///
/// ```
/// use tower_backstop::Class;
///
/// const SOFT_BOUNCE: Class = Class::new("soft_bounce");
/// assert_eq!(SOFT_BOUNCE.name(), "soft_bounce");
/// assert_ne!(SOFT_BOUNCE, Class::TRANSIENT);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class {
    name: &'static str,
}

impl Class {
    /// A fault that is likely to pass on its own: connection refused or reset, a per-attempt
    /// timeout, HTTP 408, 425, 502, 503, 504. Retried with exponential backoff by default.
    pub const TRANSIENT: Class = Class::new("transient");
    /// The provider asks us to slow down: HTTP 429. Retried after the server's delay by default.
    pub const THROTTLED: Class = Class::new("throttled");
    /// Nothing says whether trying again helps: HTTP 500, an unmapped 5xx, an error type the
    /// classifier has never seen. Retried by default, within the attempt cap.
    pub const UNKNOWN: Class = Class::new("unknown");
    /// The request itself is wrong and will fail again: HTTP 400, 401, 403, 404, 422 and the
    /// other 4xx. Never retried by default; does not trip the breaker.
    pub const PERMANENT: Class = Class::new("permanent");
    /// The request cannot be processed at all (a payload that fails validation, an inner service
    /// that panics). Never retried.
    pub const POISON: Class = Class::new("poison");
    /// The circuit breaker rejected the call without reaching the inner service. The failure's
    /// [`retry_after`](Failure::retry_after) is the time left until the breaker half-opens.
    pub const CIRCUIT_OPEN: Class = Class::new("circuit_open");
    /// A timeout or a connection reset after a request that is not idempotent (RFC 9110 §9.2.2)
    /// and carries no `Idempotency-Key`: the provider may or may not have acted on it. Never
    /// retried; the dead-letter record is there for reconciliation. Set by
    /// [`RetryLayer`](crate::retry::RetryLayer), the one layer that sees the request.
    pub const OUTCOME_UNKNOWN: Class = Class::new("outcome_unknown");

    /// A class named `name`. Use a short `snake_case` name: it is what dead-letter records, logs
    /// and summaries show.
    pub const fn new(name: &'static str) -> Self {
        Class { name }
    }

    /// The class's name, as given to [`Class::new`].
    pub const fn name(self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Class({})", self.name)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The original code of a failure, kept beside its class so that nothing the provider said is
/// lost: an HTTP status, a gRPC status code, an [`io::ErrorKind`], or one of our own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// An HTTP response status.
    Http(StatusCode),
    /// A gRPC status code (the numeric value of `grpc-status`).
    Grpc(i32),
    /// An SMTP reply code (for example 421, 550).
    Smtp(u16),
    /// The [`io::ErrorKind`] found in the error's source chain.
    Io(io::ErrorKind),
    /// The per-attempt timeout of [`TimeoutLayer`](crate::timeout::TimeoutLayer) (or tower's own
    /// `Timeout`) elapsed.
    Timeout,
    /// The circuit breaker was open and did not call the inner service.
    CircuitOpen,
    /// The inner service's future panicked.
    Panic,
    /// A provider's own numeric code, read by a user classifier (for example from a JSON error
    /// body).
    Provider(i64),
    /// An error whose type the classifier does not know; its message is in the failure's source.
    Error,
    /// A layer in this process refused the call before it was sent (tower's `LoadShed`:
    /// `Overloaded`). Proof that the request was not processed, so even a request that is not
    /// idempotent may be sent again.
    Overloaded,
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Code::Http(status) => write!(f, "http {}", status.as_u16()),
            Code::Grpc(code) => write!(f, "grpc {code}"),
            Code::Smtp(code) => write!(f, "smtp {code}"),
            Code::Io(kind) => write!(f, "io {kind:?}"),
            Code::Timeout => f.write_str("timeout"),
            Code::CircuitOpen => f.write_str("circuit open"),
            Code::Panic => f.write_str("panic"),
            Code::Provider(code) => write!(f, "provider {code}"),
            Code::Error => f.write_str("error"),
            Code::Overloaded => f.write_str("overloaded, not sent"),
        }
    }
}

/// Whether a failed request reached the provider, decided once by the classifier: what lets the
/// retry layer send again a request that is not idempotent, and what makes a failure's outcome
/// unknown.
///
/// The default for a code is [`Sent::of`]; a classifier may say otherwise
/// ([`Verdict::with_sent`](crate::classify::Verdict::with_sent),
/// [`HttpClassifier::not_sent_statuses`](crate::classify::HttpClassifier::not_sent_statuses)),
/// and so may a status check of the provider ([`Failure::with_sent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Sent {
    /// Certainly not processed: the connection was refused, a layer in this process refused the
    /// call (an open breaker, tower's `LoadShed`), or the server said it did not act on it
    /// (HTTP 408, 425, 429, 503 by default; RFC 9110 §15.5.9, RFC 8470 §5.2, RFC 6585 §4). Safe
    /// to send again whatever the method.
    No,
    /// It may have been acted on: a timeout, or the connection was reset, aborted or closed after
    /// the request left. A request that is not safe to send twice then has an unknown outcome
    /// ([`Class::OUTCOME_UNKNOWN`]).
    Maybe,
    /// It reached the provider (an answer came back), or nothing says it did not: never sent
    /// again unless it is safe to send twice.
    Yes,
}

impl Sent {
    /// The default for a failure of `code`: [`Sent::No`] for a refused connection,
    /// [`Code::CircuitOpen`], [`Code::Overloaded`] and HTTP 408, 425, 429 and 503;
    /// [`Sent::Maybe`] for [`Code::Timeout`] and an io error of kind connection reset or aborted,
    /// broken pipe, unexpected end of file, or timed out; [`Sent::Yes`] for anything else.
    pub const fn of(code: Code) -> Sent {
        use io::ErrorKind::*;
        match code {
            Code::Io(ConnectionRefused) | Code::CircuitOpen | Code::Overloaded => Sent::No,
            Code::Http(status) => match status.as_u16() {
                408 | 425 | 429 | 503 => Sent::No,
                _ => Sent::Yes,
            },
            Code::Timeout
            | Code::Io(
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | TimedOut,
            ) => Sent::Maybe,
            _ => Sent::Yes,
        }
    }
}

/// Why the retry layer stopped trying and handed the failure up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// The failure's class is not retried by the policy (a permanent 4xx, poison).
    NotRetryable,
    /// The attempt cap of the failure's class was reached.
    AttemptsExhausted,
    /// The delay before the next attempt (a server hint such as `Retry-After`, the breaker's time
    /// left until half-open, or the class's own schedule) is longer than the policy's maximum
    /// in-process delay, and the policy is set to give up rather than defer
    /// ([`LongDelay::GiveUp`](crate::retry::LongDelay::GiveUp)).
    HintTooLong,
    /// The delay before the next attempt is longer than the policy's maximum in-process delay, so
    /// the request is deferred rather than slept: [`Failure::retry_at`] says when to send it
    /// again ([`LongDelay::Defer`](crate::retry::LongDelay::Defer), the default). Unlike the
    /// other reasons this is not the end of the request: a dead-letter store keeps it with that
    /// retry-at time.
    Deferred,
    /// The retry budget (token bucket or ratio) had nothing left, so the failure was returned at
    /// once instead of retried.
    BudgetExhausted,
    /// The overall deadline of the request ended the series of attempts: the next delay would
    /// have ended after it, or it expired during an attempt. The failure is the last real one.
    DeadlineExceeded,
    /// The server said not to retry (`grpc-retry-pushback-ms` negative or unparseable, gRFC A6).
    ServerSaidNo,
    /// The request is not idempotent (RFC 9110 §9.2.2) and carries no `Idempotency-Key`, so
    /// sending it again could repeat its effect.
    NotIdempotent,
    /// The request could not be copied for another attempt (for example a streaming body).
    NotReplayable,
    /// The inner service failed while the retry layer waited for it to become ready.
    NotReady,
}

impl GiveUp {
    /// A short lower-case description, as used in `Display`.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotRetryable => "class not retried",
            GiveUp::AttemptsExhausted => "attempts exhausted",
            GiveUp::HintTooLong => "delay above the maximum in-process delay",
            GiveUp::Deferred => "deferred",
            GiveUp::BudgetExhausted => "retry budget exhausted",
            GiveUp::DeadlineExceeded => "deadline exceeded",
            GiveUp::ServerSaidNo => "server said not to retry",
            GiveUp::NotIdempotent => "request not idempotent and has no idempotency key",
            GiveUp::NotReplayable => "request cannot be replayed",
            GiveUp::NotReady => "service failed while becoming ready",
        }
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What became of a failure at the dead-letter layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeadLetterStatus {
    /// The record was written; `id` finds it in the store.
    Stored {
        /// The record's id (the idempotency key, or a generated message id).
        id: String,
    },
    /// The record could not be written. The failure that caused it is still the one returned.
    NotStored {
        /// The id the record would have had.
        id: String,
        /// Why the store refused it: the store's error (a
        /// [`StoreError`](crate::store::StoreError) from this crate's stores; reach it
        /// with `error.downcast_ref::<StoreError>()`). Boxed so that the shared failure types
        /// know no layer.
        error: BoxError,
    },
}

/// A classified failure: the error type of every layer above
/// [`ClassifyLayer`](crate::classify::ClassifyLayer).
///
/// It carries the [`Class`], the original [`Code`], any delay hint from the server, and, when the
/// failure was a response (a 503, a 429), that response, so that the caller can still have it after
/// the last attempt ([`Failure::into_response`]). The retry layer adds the number of attempts and
/// why it gave up; the dead-letter layer adds whether the record was stored.
///
/// `R` is the response type of the service. A `Failure<R>` converts from a [`BoxError`]
/// (classified by [`classify_error`](crate::classify::classify_error)), so layers work with plain
/// `BoxError` services too; it is itself an `Error + Send + Sync` whenever `R: Send` (the response
/// is held so that it is only reached through `&mut` or by value), so it converts into a
/// `BoxError` and crosses any tower layer that boxes errors (`Buffer`, `LoadShed`, tower's
/// `Timeout`). Converting such a `BoxError` back (`Failure::from`) finds the failure again
/// instead of classifying it anew: class, code, hint and response are kept.
///
/// A `Failure` is one pointer. Its class, code and hint live in one small allocation, made when
/// the failure is created (on the failure path only: a success allocates nothing); a response,
/// a source error or the retry and dead-letter notes take a second one, created when first
/// needed. An open breaker's rejection ([`OpenError`]) takes only the first.
///
/// Being one word keeps `Result<R, Failure<R>>`, which every layer moves on the success path
/// too, at most a word larger than `R` (16 bytes for a `&str` response).
pub struct Failure<R = ()> {
    core: Box<Core<R>>,
}

/// What a [`Failure`] carries, boxed.
struct Core<R> {
    class: Class,
    code: Code,
    retry_after: Option<Duration>,
    sent: Sent,
    attempts: u32,
    give_up: Option<GiveUp>,
    no_retry: bool,
    /// An open breaker's rejection, kept here rather than as a boxed source in `extra`: its
    /// [`Error::source`](std::error::Error::source).
    open: Option<OpenError>,
    extra: Option<Box<Extra<R>>>,
}

/// The source of an open breaker's rejection ([`Class::CIRCUIT_OPEN`],
/// [`Code::CircuitOpen`]): which breaker, and when it half-opens. Re-exported as
/// [`breaker::OpenError`](crate::breaker::OpenError).
///
/// Its `Display` reads `breaker "api.mail.test:443" is open; half-opens in 2.5s`, the time
/// rounded up to the millisecond (or `is forced open` when an operator opened it and no time is
/// known). It is the message a dead-letter record keeps.
#[derive(Clone, Debug)]
pub struct OpenError {
    breaker: Arc<str>,
    half_opens_in: Option<Duration>,
}

impl OpenError {
    pub(crate) fn new(breaker: Arc<str>, half_opens_in: Option<Duration>) -> Self {
        OpenError {
            breaker,
            half_opens_in,
        }
    }

    /// The breaker's name ([`Builder::name`](crate::breaker::Builder::name); a keyed breaker's
    /// key).
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// The time left until the breaker half-opens, as of the rejection; `None` when forced open.
    pub fn half_opens_in(&self) -> Option<Duration> {
        self.half_opens_in
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.half_opens_in {
            Some(left) => write!(
                f,
                "breaker {:?} is open; half-opens in {:?}",
                &*self.breaker,
                millis_up(left)
            ),
            None => write!(f, "breaker {:?} is forced open", &*self.breaker),
        }
    }
}

impl std::error::Error for OpenError {}

struct Extra<R> {
    // `SyncWrapper`: the response is only reached by `&mut` or by value, so a failure is `Sync`
    // even when the response is not (tonic's body, reqwest's), and it fits in a `BoxError`.
    response: Option<SyncWrapper<R>>,
    source: Option<BoxError>,
    first_failed_at: Option<SystemTime>,
    retry_at: Option<SystemTime>,
    dead_letter: Option<DeadLetterStatus>,
    /// An unsent copy of the request, handed up by the retry layer to the dead-letter layer
    /// (one request copy per call). A `Mutex<Q>`, so that `Failure` stays `Sync`.
    request: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl<R> Default for Extra<R> {
    fn default() -> Self {
        Extra {
            response: None,
            source: None,
            first_failed_at: None,
            retry_at: None,
            dead_letter: None,
            request: None,
        }
    }
}

impl<R> Failure<R> {
    /// A failure of `class` with the original `code`, no hint, no response and no source.
    pub fn new(class: Class, code: Code) -> Self {
        Failure {
            core: Box::new(Core {
                class,
                code,
                retry_after: None,
                sent: Sent::of(code),
                attempts: 0,
                give_up: None,
                no_retry: false,
                open: None,
                extra: None,
            }),
        }
    }

    fn extra_mut(&mut self) -> &mut Extra<R> {
        self.core.extra.get_or_insert_with(Box::default)
    }

    /// Sets the server's delay hint: how long to wait before the next attempt
    /// (`Retry-After`, RFC 9110 §10.2.3, already resolved to a [`Duration`] from now).
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.core.retry_after = Some(delay);
        self
    }

    /// Marks the failure as one the server asked not to retry (a negative or unparseable
    /// `grpc-retry-pushback-ms`, gRFC A6). The retry layer stops with [`GiveUp::ServerSaidNo`].
    pub fn with_no_retry(mut self) -> Self {
        self.core.no_retry = true;
        self
    }

    /// Sets whether the request reached the provider, replacing the default of its code
    /// ([`Sent::of`]): for example [`Sent::No`] when a status check of the provider said it was
    /// never delivered. The retry layer then resends even a request that is not safe to send
    /// twice, by its normal rules, and does not call the outcome unknown.
    pub fn with_sent(mut self, sent: Sent) -> Self {
        self.core.sent = sent;
        self
    }

    /// Whether the request reached the provider (see [`Sent`]).
    pub fn sent(&self) -> Sent {
        self.core.sent
    }

    /// Whether the server asked not to retry (see [`with_no_retry`](Self::with_no_retry)).
    pub fn no_retry(&self) -> bool {
        self.core.no_retry
    }

    /// Keeps the response that was classified as this failure.
    pub fn with_response(mut self, response: R) -> Self {
        self.extra_mut().response = Some(SyncWrapper::new(response));
        self
    }

    /// Keeps the error that was classified as this failure; it becomes [`Error::source`].
    ///
    /// [`Error::source`]: std::error::Error::source
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.core.open = None;
        self.extra_mut().source = Some(source.into());
        self
    }

    /// The failure an open breaker answers with: its source is `open`.
    pub(crate) fn with_open(mut self, open: OpenError) -> Self {
        self.core.open = Some(open);
        self
    }

    /// The failure's class.
    pub fn class(&self) -> Class {
        self.core.class
    }

    /// Replaces the failure's class, keeping everything else.
    pub fn set_class(&mut self, class: Class) {
        self.core.class = class;
    }

    /// The original code: HTTP status, gRPC code, io kind, or one of ours.
    pub fn code(&self) -> Code {
        self.core.code
    }

    /// The server's delay hint, a [`Duration`] counted from when the failure was classified:
    /// `Retry-After` for an HTTP failure, the time left until half-open for
    /// [`Class::CIRCUIT_OPEN`].
    pub fn retry_after(&self) -> Option<Duration> {
        self.core.retry_after
    }

    /// The number of attempts made for this request, the first call included. Zero when no
    /// [`RetryLayer`](crate::retry::RetryLayer) counted them.
    pub fn attempts(&self) -> u32 {
        self.core.attempts
    }

    /// Why the retry layer stopped, when it did.
    pub fn give_up(&self) -> Option<GiveUp> {
        self.core.give_up
    }

    /// When the first attempt of this request failed, as recorded by the retry layer.
    pub fn first_failed_at(&self) -> Option<SystemTime> {
        self.core.extra.as_ref().and_then(|e| e.first_failed_at)
    }

    /// When the request should be sent again, for a failure the retry layer deferred
    /// ([`GiveUp::Deferred`]): an absolute time, rounded up to the next whole millisecond and never
    /// before the instant the server named (`Retry-After`, RFC 9110 §10.2.3). `None` for any
    /// other failure.
    ///
    /// A dead-letter layer stores the record with this retry-at time, so that a scheduler sends
    /// it again then.
    pub fn retry_at(&self) -> Option<SystemTime> {
        self.core.extra.as_ref().and_then(|e| e.retry_at)
    }

    /// Whether the retry layer deferred this failure rather than giving up on it.
    pub fn is_deferred(&self) -> bool {
        self.core.give_up == Some(GiveUp::Deferred)
    }

    /// The same failure with its response (if any) mapped by `f`; for example `|_| ()` to drop a
    /// response that is not `Sync` before boxing the failure.
    pub fn map_response<T>(self, f: impl FnOnce(R) -> T) -> Failure<T> {
        let core = *self.core;
        Failure {
            core: Box::new(Core {
                class: core.class,
                code: core.code,
                retry_after: core.retry_after,
                sent: core.sent,
                attempts: core.attempts,
                give_up: core.give_up,
                no_retry: core.no_retry,
                open: core.open,
                extra: core.extra.map(|e| {
                    Box::new(Extra {
                        response: e.response.map(|r| SyncWrapper::new(f(r.into_inner()))),
                        source: e.source,
                        first_failed_at: e.first_failed_at,
                        retry_at: e.retry_at,
                        dead_letter: e.dead_letter,
                        request: e.request,
                    })
                }),
            }),
        }
    }

    /// The response that was classified as this failure, if it was a response.
    ///
    /// It takes `&mut self` because the response is held so that a failure is `Sync` even when
    /// the response is not (a streaming body): it is never shared, only lent or given away.
    pub fn response_mut(&mut self) -> Option<&mut R> {
        self.core
            .extra
            .as_mut()
            .and_then(|e| e.response.as_mut())
            .map(SyncWrapper::get_mut)
    }

    /// Whether this failure holds the response that was classified as it.
    pub fn has_response(&self) -> bool {
        self.core
            .extra
            .as_ref()
            .is_some_and(|e| e.response.is_some())
    }

    /// Takes the response that was classified as this failure, if it was a response.
    pub fn into_response(self) -> Option<R> {
        self.core
            .extra
            .and_then(|e| e.response)
            .map(SyncWrapper::into_inner)
    }

    /// A failure of another response type with the same class, code, hint and notes, and no
    /// response and no source: what an outer layer keeps of a failure it only sees by reference
    /// (deep in a `BoxError`'s source chain).
    fn summary<T>(&self) -> Failure<T> {
        let mut copy = Failure::new(self.core.class, self.code());
        copy.core.retry_after = self.core.retry_after;
        copy.core.sent = self.core.sent;
        copy.core.attempts = self.core.attempts;
        copy.core.give_up = self.core.give_up;
        copy.core.no_retry = self.core.no_retry;
        if let Some(extra) = &self.core.extra {
            let notes = copy.extra_mut();
            notes.first_failed_at = extra.first_failed_at;
            notes.retry_at = extra.retry_at;
        }
        copy
    }

    /// What the dead-letter layer did with this failure, when one saw it.
    pub fn dead_letter(&self) -> Option<&DeadLetterStatus> {
        self.core
            .extra
            .as_ref()
            .and_then(|e| e.dead_letter.as_ref())
    }

    /// Whether a dead-letter layer tried to store this failure and could not.
    pub fn dead_letter_failed(&self) -> bool {
        matches!(self.dead_letter(), Some(DeadLetterStatus::NotStored { .. }))
    }

    fn source_ref(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match &self.core.open {
            Some(open) => Some(open),
            None => self.core.extra.as_ref().and_then(|e| e.source.as_deref()),
        }
    }

    pub(crate) fn note_attempts(
        &mut self,
        attempts: u32,
        first_failed_at: Option<SystemTime>,
        give_up: GiveUp,
    ) {
        self.core.attempts = attempts;
        self.core.give_up = Some(give_up);
        if first_failed_at.is_some() {
            self.extra_mut().first_failed_at = first_failed_at;
        }
    }

    pub(crate) fn note_retry_at(&mut self, at: SystemTime) {
        self.extra_mut().retry_at = Some(at);
    }

    /// Keeps an unsent copy of the request on the failure, for the dead-letter layer above.
    pub(crate) fn note_request<Q: Send + 'static>(&mut self, request: Q) {
        self.extra_mut().request = Some(Box::new(std::sync::Mutex::new(request)));
    }

    /// Takes the copy [`note_request`](Self::note_request) kept, if it is a `Q`.
    pub(crate) fn take_request<Q: Send + 'static>(&mut self) -> Option<Q> {
        let extra = self.core.extra.as_mut()?;
        match extra.request.take()?.downcast::<std::sync::Mutex<Q>>() {
            Ok(request) => Some(request.into_inner().unwrap_or_else(|e| e.into_inner())),
            Err(other) => {
                extra.request = Some(other);
                None
            }
        }
    }

    pub(crate) fn note_dead_letter(&mut self, status: DeadLetterStatus) {
        self.extra_mut().dead_letter = Some(status);
    }

    /// The message a dead-letter record keeps: the `Display` of the source error if there is one,
    /// else the class and code.
    pub fn message(&self) -> String {
        match self.source_ref() {
            Some(source) => source.to_string(),
            None => format!("{} ({})", self.core.class, self.code()),
        }
    }
}

impl<R: 'static> Failure<R> {
    /// The failure a [`BoxError`] already carries, if any: a `Failure<R>` boxed by a foreign layer
    /// (tower's `Buffer`, `LoadShed`, `Timeout`) comes back whole, response included; a `Failure`
    /// found deeper in the source chain, or a `Failure<()>` (a response dropped with
    /// [`map_response`](Self::map_response)), keeps its class, code, hint and notes, with the
    /// error as its source. `Err` gives back an error that was never classified.
    pub(crate) fn recover(error: BoxError) -> Result<Self, BoxError> {
        let error = match error.downcast::<Failure<R>>() {
            Ok(failure) => return Ok(*failure),
            Err(error) => error,
        };
        let mut found = None;
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
        while let Some(e) = current {
            if let Some(f) = e.downcast_ref::<Failure<R>>() {
                found = Some(f.summary());
            } else if let Some(f) = e.downcast_ref::<Failure<()>>() {
                found = Some(f.summary());
            }
            if found.is_some() {
                break;
            }
            current = e.source();
        }
        match found {
            Some(failure) => Ok(failure.with_source(error)),
            None => Err(error),
        }
    }
}

impl<R> fmt::Debug for Failure<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Failure");
        d.field("class", &self.core.class)
            .field("code", &self.code())
            .field("retry_after", &self.retry_after())
            .field("sent", &self.core.sent)
            .field("attempts", &self.core.attempts)
            .field("give_up", &self.core.give_up)
            .field("no_retry", &self.core.no_retry);
        // One `source`: the open breaker's, else the one given.
        if let Some(source) = self.source_ref() {
            d.field("source", &source);
        }
        if let Some(extra) = &self.core.extra {
            d.field("has_response", &extra.response.is_some())
                .field("retry_at", &extra.retry_at)
                .field("dead_letter", &extra.dead_letter);
        }
        d.finish()
    }
}

/// `delay` rounded up to a whole millisecond, for messages: `1.332s`, not `1.331029271s`. Up,
/// so that a message never names a time earlier than the real one.
///
/// A delay too long for 64 bits of milliseconds (over about 584 million years) is kept as it is.
pub(crate) fn millis_up(delay: Duration) -> Duration {
    match u64::try_from(delay.as_millis()) {
        Ok(ms) if Duration::from_millis(ms) == delay => delay,
        Ok(ms) => Duration::from_millis(ms).saturating_add(Duration::from_millis(1)),
        Err(_) => delay,
    }
}

impl<R> fmt::Display for Failure<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failure ({})", self.core.class, self.code())?;
        if self.core.attempts > 0 {
            write!(f, " after {} attempt", self.core.attempts)?;
            if self.core.attempts > 1 {
                f.write_str("s")?;
            }
        }
        if let Some(reason) = self.core.give_up {
            write!(f, ", {reason}")?;
        }
        if let Some(at) = self.retry_at() {
            write!(f, " until {}", httpdate::fmt_http_date(at))?;
        }
        match (self.retry_after(), self.core.code) {
            // Our own breaker's time left: its source (naming the breaker) says it, if any.
            (Some(_), Code::CircuitOpen) if self.source_ref().is_some() => {}
            (Some(delay), Code::CircuitOpen) => {
                write!(f, ", half-opens in {:?}", millis_up(delay))?
            }
            (Some(delay), _) => write!(f, ", server asked to retry after {:?}", millis_up(delay))?,
            (None, _) => {}
        }
        if let Some(source) = self.source_ref() {
            write!(f, ": {source}")?;
        }
        if let Some(extra) = &self.core.extra {
            match &extra.dead_letter {
                // A deferred request is kept for the scheduler's re-send, not given up on.
                Some(DeadLetterStatus::Stored { id }) if self.is_deferred() => {
                    write!(f, "; stored as {id} for a re-send when due")?
                }
                Some(DeadLetterStatus::Stored { id }) => write!(f, "; dead letter stored as {id}")?,
                Some(DeadLetterStatus::NotStored { id, error }) => {
                    write!(f, "; dead letter {id} could not be written: {error}")?
                }
                None => {}
            }
        }
        Ok(())
    }
}

impl<R> std::error::Error for Failure<R> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source_ref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_one_word() {
        // Whatever the response type: everything is behind the one pointer.
        assert_eq!(std::mem::size_of::<Failure<[u8; 256]>>(), 8);
        // A result is at most the response plus a word, often no more than the response: the
        // response's own niche (here the `&str`'s pointer) tells the failure apart, or the box's.
        assert_eq!(std::mem::size_of::<Result<&str, Failure<&str>>>(), 16);
        assert_eq!(std::mem::size_of::<Result<(), Failure<()>>>(), 8);
    }

    #[test]
    fn an_open_breakers_failure_has_its_open_error_as_source() {
        let open = OpenError::new(
            Arc::from("api.mail.test:443"),
            Some(Duration::from_millis(2500)),
        );
        let f = Failure::<u8>::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
            .with_open(open)
            .with_retry_after(Duration::from_millis(2500));
        let source = std::error::Error::source(&f).expect("a source");
        let open = source.downcast_ref::<OpenError>().expect("the OpenError");
        assert_eq!(open.breaker(), "api.mail.test:443");
        assert_eq!(open.half_opens_in(), Some(Duration::from_millis(2500)));
        let message = r#"breaker "api.mail.test:443" is open; half-opens in 2.5s"#;
        assert_eq!(f.message(), message);
        assert!(f.to_string().ends_with(message), "{f}");
        assert!(format!("{f:?}").contains("api.mail.test:443"), "{f:?}");
        // With the retry layer's notes too, `Debug` still names one source.
        let mut noted = Failure::<u8>::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
            .with_open(OpenError::new(Arc::from("api.mail.test:443"), None));
        noted.note_attempts(0, Some(SystemTime::now()), GiveUp::Deferred);
        let debug = format!("{noted:?}");
        assert_eq!(debug.matches("source:").count(), 1, "{debug}");
        assert!(debug.contains("api.mail.test:443"), "{debug}");
        // Kept when the response type changes; replaced by a later source.
        let f = f.map_response(|_| ());
        assert_eq!(f.message(), message);
        let f = f.with_source("another cause");
        assert_eq!(f.message(), "another cause");
        assert!(
            std::error::Error::source(&f)
                .unwrap()
                .downcast_ref::<OpenError>()
                .is_none()
        );
    }

    #[test]
    fn every_code_and_hint_comes_back_as_it_went_in() {
        let codes = [
            Code::Http(StatusCode::from_u16(100).unwrap()),
            Code::Http(StatusCode::from_u16(999).unwrap()),
            Code::Http(StatusCode::TOO_MANY_REQUESTS),
            Code::Grpc(i32::MIN),
            Code::Grpc(-1),
            Code::Grpc(14),
            Code::Grpc(i32::MAX),
            Code::Smtp(0),
            Code::Smtp(u16::MAX),
            Code::Io(io::ErrorKind::ConnectionReset),
            Code::Io(io::ErrorKind::Other),
            Code::Io(io::ErrorKind::TimedOut),
            Code::Timeout,
            Code::CircuitOpen,
            Code::Panic,
            Code::Provider(i64::MIN),
            Code::Provider(0),
            Code::Provider(i64::MAX),
            Code::Error,
            Code::Overloaded,
        ];
        for code in codes {
            let f: Failure<()> = Failure::new(Class::UNKNOWN, code);
            assert_eq!(f.code(), code);
            assert_eq!(f.map_response(|()| 1u8).code(), code);
        }
        for hint in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1500),
            Duration::from_secs(86_400 * 365 * 500),
        ] {
            let f: Failure = Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
            assert_eq!(f.retry_after(), Some(hint));
        }
        // Beyond what 64 bits of nanoseconds hold (about 584 years): kept exactly too, through
        // `map_response` as well.
        for hint in [
            Duration::from_nanos(u64::MAX - 1),
            Duration::from_nanos(u64::MAX),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            let f: Failure = Failure::new(Class::THROTTLED, Code::Timeout).with_retry_after(hint);
            assert_eq!(f.retry_after(), Some(hint));
            assert_eq!(f.map_response(|()| 0u8).retry_after(), Some(hint));
        }
        let none: Failure = Failure::new(Class::THROTTLED, Code::Timeout);
        assert_eq!(none.retry_after(), None);
    }

    #[test]
    fn display_is_lower_case_and_complete() {
        let mut f: Failure = Failure::new(
            Class::TRANSIENT,
            Code::Http(StatusCode::SERVICE_UNAVAILABLE),
        )
        .with_retry_after(Duration::from_secs(3));
        f.note_attempts(4, None, GiveUp::AttemptsExhausted);
        let s = f.to_string();
        assert_eq!(
            s,
            "transient failure (http 503) after 4 attempts, attempts exhausted, server asked to retry after 3s"
        );
    }

    #[test]
    fn a_failure_deep_in_a_box_error_is_found_not_classified_again() {
        #[derive(Debug)]
        struct Wrapped(Failure<u8>);
        impl fmt::Display for Wrapped {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("buffered service failed")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let inner: Failure<u8> =
            Failure::new(Class::THROTTLED, Code::Http(StatusCode::TOO_MANY_REQUESTS))
                .with_retry_after(Duration::from_secs(2))
                .with_response(7);
        let f = Failure::<u8>::from(Box::new(Wrapped(inner)) as BoxError);
        assert_eq!(f.class(), Class::THROTTLED);
        assert_eq!(f.code(), Code::Http(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(f.retry_after(), Some(Duration::from_secs(2)));
        assert!(!f.has_response(), "only reachable by reference");
        assert_eq!(f.message(), "buffered service failed");

        // A failure whose response was dropped (`map_response(|_| ())`) is found by any `R`.
        let dropped: Failure<()> = Failure::new(Class::PERMANENT, Code::Grpc(5)).with_no_retry();
        let f = Failure::<String>::from(Box::new(dropped) as BoxError);
        assert_eq!((f.class(), f.code()), (Class::PERMANENT, Code::Grpc(5)));
        assert!(f.no_retry());
    }

    #[test]
    fn message_delays_are_whole_milliseconds_rounded_up() {
        assert_eq!(
            millis_up(Duration::from_nanos(1_331_029_271)),
            Duration::from_millis(1332)
        );
        assert_eq!(millis_up(Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(millis_up(Duration::ZERO), Duration::ZERO);
        assert_eq!(millis_up(Duration::from_nanos(1)), Duration::from_millis(1));
        // No overflow at the top.
        assert_eq!(millis_up(Duration::MAX), Duration::MAX);
        let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
            .with_retry_after(Duration::from_nanos(1_331_029_271));
        assert!(f.to_string().ends_with(", half-opens in 1.332s"), "{f}");
    }

    #[test]
    fn sent_defaults_by_code_and_survives_every_copy() {
        use io::ErrorKind::*;
        for (code, sent) in [
            (Code::Io(ConnectionRefused), Sent::No),
            (Code::CircuitOpen, Sent::No),
            (Code::Overloaded, Sent::No),
            (Code::Http(StatusCode::REQUEST_TIMEOUT), Sent::No),
            (Code::Http(StatusCode::TOO_EARLY), Sent::No),
            (Code::Http(StatusCode::TOO_MANY_REQUESTS), Sent::No),
            (Code::Http(StatusCode::SERVICE_UNAVAILABLE), Sent::No),
            (Code::Http(StatusCode::BAD_GATEWAY), Sent::Yes),
            (Code::Http(StatusCode::INTERNAL_SERVER_ERROR), Sent::Yes),
            (Code::Grpc(14), Sent::Yes),
            (Code::Timeout, Sent::Maybe),
            (Code::Io(ConnectionReset), Sent::Maybe),
            (Code::Io(ConnectionAborted), Sent::Maybe),
            (Code::Io(BrokenPipe), Sent::Maybe),
            (Code::Io(UnexpectedEof), Sent::Maybe),
            (Code::Io(TimedOut), Sent::Maybe),
            (Code::Io(PermissionDenied), Sent::Yes),
            (Code::Error, Sent::Yes),
        ] {
            assert_eq!(Sent::of(code), sent, "{code}");
            let f: Failure<()> = Failure::new(Class::TRANSIENT, code);
            assert_eq!(f.sent(), sent, "{code}");
        }
        // Set by hand (a status check), kept through a new response type and a `BoxError`.
        let f: Failure<()> = Failure::new(Class::TRANSIENT, Code::Timeout).with_sent(Sent::No);
        let f = f.map_response(|()| 1u8);
        assert_eq!(f.sent(), Sent::No);
        let f = Failure::<String>::recover(Box::new(f.map_response(|_| ()))).unwrap();
        assert_eq!(f.sent(), Sent::No);
    }

    #[test]
    fn from_box_error_keeps_source() {
        let e: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionReset));
        let f: Failure = Failure::from(e);
        assert_eq!(f.class(), Class::TRANSIENT);
        assert_eq!(f.code(), Code::Io(io::ErrorKind::ConnectionReset));
        assert!(std::error::Error::source(&f).is_some());
    }
}
