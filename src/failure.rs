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
use std::time::Duration;

use http::StatusCode;
use sync_wrapper::SyncWrapper;

pub use tower::BoxError;

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
        f.pad(self.name)
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
    /// The breaker's adaptive send rate held the call back: the provider answered throttled,
    /// and the call came before its slot ([`AdaptiveRate`](crate::breaker::AdaptiveRate)); or
    /// its adaptive concurrency limit did: the provider signalled overload, and the calls in
    /// flight to it were at the limit
    /// ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency)). Not sent; the
    /// failure's [`retry_after`](Failure::retry_after) is the wait until the turn kept for it,
    /// and its source says which held it ([`PacedError`](crate::breaker::PacedError) or
    /// [`LimitedError`](crate::breaker::LimitedError)).
    Paced,
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
    /// The server reset the HTTP/2 stream (`RST_STREAM`) with this error code (RFC 9113 §7:
    /// `REFUSED_STREAM` is 7, `CANCEL` 8). `REFUSED_STREAM` proves the request was not processed
    /// (RFC 9113 §8.7); any other reset came after the request left, so its outcome is unknown.
    Reset(u32),
    /// The server sent an HTTP/2 `GOAWAY` (with this error code, RFC 9113 §7) that did not cover
    /// the stream: the server says it did not process it (RFC 9113 §6.8), so it may be sent again
    /// on a new connection.
    GoAway(u32),
    /// The TLS handshake failed: a certificate the client does not trust (self-signed, expired,
    /// another host's), or a peer that does not speak TLS (an `https://` URL on a plain-HTTP
    /// port). A configuration error that no retry fixes; the cause is in the failure's source.
    Tls,
}

/// The name of an HTTP/2 error code (RFC 9113 §7), for a [`Code::Reset`] or [`Code::GoAway`].
fn http2_error_name(code: u32) -> &'static str {
    match code {
        0 => "NO_ERROR",
        1 => "PROTOCOL_ERROR",
        2 => "INTERNAL_ERROR",
        3 => "FLOW_CONTROL_ERROR",
        4 => "SETTINGS_TIMEOUT",
        5 => "STREAM_CLOSED",
        6 => "FRAME_SIZE_ERROR",
        7 => "REFUSED_STREAM",
        8 => "CANCEL",
        9 => "COMPRESSION_ERROR",
        10 => "CONNECT_ERROR",
        11 => "ENHANCE_YOUR_CALM",
        12 => "INADEQUATE_SECURITY",
        13 => "HTTP_1_1_REQUIRED",
        _ => "unknown error code",
    }
}

impl Code {
    /// Whether a layer of this process refused the call before it was sent, so that it is
    /// not an attempt: an open breaker ([`Code::CircuitOpen`]) or its send rate or concurrency
    /// limit ([`Code::Paced`]).
    #[inline]
    pub(crate) const fn not_an_attempt(self) -> bool {
        matches!(self, Code::CircuitOpen | Code::Paced)
    }
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
            Code::Paced => f.write_str("paced, not sent"),
            Code::Panic => f.write_str("panic"),
            Code::Provider(code) => write!(f, "provider {code}"),
            Code::Error => f.write_str("error"),
            Code::Overloaded => f.write_str("overloaded, not sent"),
            Code::Reset(code) => write!(f, "http2 reset {} ({code})", http2_error_name(*code)),
            Code::GoAway(code) => write!(f, "http2 goaway {} ({code})", http2_error_name(*code)),
            Code::Tls => f.write_str("tls handshake"),
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
    /// [`Code::CircuitOpen`], [`Code::Paced`], [`Code::Overloaded`], [`Code::Tls`], an HTTP/2 `REFUSED_STREAM`
    /// reset or a `GOAWAY` that did not cover the stream, and HTTP 408, 425, 429 and 503;
    /// [`Sent::Maybe`] for [`Code::Timeout`], any other HTTP/2 reset, gRPC `DEADLINE_EXCEEDED`
    /// (4) and an io error of kind connection reset or aborted, broken pipe, unexpected end of
    /// file, or timed out; [`Sent::Yes`] for anything else.
    pub const fn of(code: Code) -> Sent {
        use io::ErrorKind::*;
        match code {
            Code::Io(ConnectionRefused)
            | Code::CircuitOpen
            | Code::Paced
            | Code::Overloaded
            | Code::Tls
            | Code::Reset(7)
            | Code::GoAway(_) => Sent::No,
            Code::Reset(_) | Code::Grpc(4) => Sent::Maybe,
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

/// What a layer says about its own work on a failure: a typed value kept in the failure's
/// [`Notes`], found again by its type.
///
/// The crate's layers attach theirs: the retry layer's
/// [`Attempts`](crate::retry::Attempts) (how many attempts, why it stopped, when to send again),
/// the dead-letter layer's [`DeadLetterStatus`](crate::dead_letter::DeadLetterStatus) (the
/// record's id, or why it could not be written). A layer of your own can attach its own in the
/// same way, like a value in `http::Extensions`:
///
/// ```
/// use tower_backstop::{Class, Code, Failure, Note};
///
/// #[derive(Debug, PartialEq)]
/// struct Region(&'static str);
/// impl Note for Region {}
///
/// let failure: Failure = Failure::new(Class::TRANSIENT, Code::Error).with_note(Region("eu-1"));
/// assert_eq!(failure.note::<Region>(), Some(&Region("eu-1")));
/// ```
///
/// The provided methods say how the note shows in the failure's `Display`, which reads
/// `{class} failure ({code})`, then each note's [`fmt_outcome`](Note::fmt_outcome), the
/// server's hint, `: {source}`, and each note's [`fmt_trailer`](Note::fmt_trailer). By default
/// a note writes nothing, and is not kept when a failure is found again inside a boxed error
/// ([`duplicate`](Note::duplicate)).
pub trait Note: std::any::Any + fmt::Debug + Send + Sync {
    /// Text written right after the failure's code, before the server's hint: the retry
    /// layer's ` after 4 attempts, attempts exhausted`. `notes` are all of the failure's notes.
    fn fmt_outcome(&self, notes: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = (notes, f);
        Ok(())
    }

    /// Text written at the end, after the source: the dead-letter layer's
    /// `; dead letter stored as msg-1`. `notes` are all of the failure's notes.
    fn fmt_trailer(&self, notes: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = (notes, f);
        Ok(())
    }

    /// A copy of this note for a failure found again deep in a [`BoxError`]'s source chain
    /// (behind a foreign layer that wrapped it), which then keeps the class, code, hint and the
    /// notes that copy themselves. `None`, the default, leaves the note behind.
    fn duplicate(&self) -> Option<Box<dyn Note>> {
        None
    }
}

/// The [`Note`]s a [`Failure`] carries, at most one of each type: a small map from type to
/// value, like `http::Extensions`.
#[derive(Default)]
pub struct Notes {
    entries: Vec<Box<dyn Note>>,
}

/// Notes of a failure that has none.
static NO_NOTES: Notes = Notes {
    entries: Vec::new(),
};

impl Notes {
    fn position<T: Note>(&self) -> Option<usize> {
        self.entries
            .iter()
            .position(|note| <dyn std::any::Any>::is::<T>(&**note))
    }

    /// The note of type `T`, if there is one.
    pub fn get<T: Note>(&self) -> Option<&T> {
        self.entries
            .iter()
            .find_map(|note| <dyn std::any::Any>::downcast_ref::<T>(&**note))
    }

    /// The note of type `T`, mutably, if there is one.
    pub fn get_mut<T: Note>(&mut self) -> Option<&mut T> {
        self.entries
            .iter_mut()
            .find_map(|note| <dyn std::any::Any>::downcast_mut::<T>(&mut **note))
    }

    /// Adds `note`, returning the note of the same type it replaces, if any.
    pub fn insert<T: Note>(&mut self, note: T) -> Option<T> {
        let old = self.remove::<T>();
        self.entries.push(Box::new(note));
        old
    }

    /// Takes the note of type `T` out, if there is one.
    pub fn remove<T: Note>(&mut self) -> Option<T> {
        let at = self.position::<T>()?;
        let note: Box<dyn std::any::Any> = self.entries.remove(at);
        note.downcast::<T>().ok().map(|note| *note)
    }

    /// Whether there are no notes.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of notes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn duplicates(&self) -> Notes {
        Notes {
            entries: self.entries.iter().filter_map(|n| n.duplicate()).collect(),
        }
    }
}

impl fmt::Debug for Notes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.entries).finish()
    }
}

/// A classified failure: the error type of every layer above
/// [`ClassifyLayer`](crate::classify::ClassifyLayer).
///
/// It carries the [`Class`], the original [`Code`], any delay hint from the server, whether the
/// request was [`Sent`], the source error and, when the failure was a response (a 503, a 429),
/// that response, so that the caller can still have it after the last attempt
/// ([`Failure::into_response`]). What a layer says about its own work is a typed [`Note`]: the
/// retry layer's [`Attempts`](crate::retry::Attempts), the dead-letter layer's
/// [`DeadLetterStatus`](crate::dead_letter::DeadLetterStatus), read with
/// [`note`](Failure::note).
///
/// `R` is the response type of the service. A `Failure<R>` converts from a [`BoxError`]
/// (classified by [`classify_error`](crate::classify::classify_error)), so layers work with plain
/// `BoxError` services too; it is itself an `Error + Send + Sync` whenever `R: Send` (the response
/// is held so that it is only reached through `&mut` or by value), so it converts into a
/// `BoxError` and crosses any tower layer that boxes errors (`Buffer`, `LoadShed`, tower's
/// `Timeout`). Converting such a `BoxError` back (`Failure::from`) finds the failure again
/// instead of classifying it anew: class, code, hint and response are kept.
///
/// A `Failure` is one pointer. Its class, code, hint and source live in one small allocation,
/// made when the failure is created (on the failure path only: a success allocates nothing); a
/// response or notes take a second one, created when first needed.
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
    no_retry: bool,
    source: Option<Source>,
    extra: Option<Box<Extra<R>>>,
}

/// The source error: owned, or shared with other failures (an open breaker's rejection names
/// its breaker with one shared error, so that a rejection allocates only the failure's box).
enum Source {
    Owned(BoxError),
    /// Shared, and said with the failure's hint: for [`Code::CircuitOpen`], `; half-opens in`.
    Shared(Arc<dyn std::error::Error + Send + Sync>),
}

impl Source {
    fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        match self {
            Source::Owned(e) => &**e,
            Source::Shared(e) => &**e,
        }
    }
}

struct Extra<R> {
    // `SyncWrapper`: the response is only reached by `&mut` or by value, so a failure is `Sync`
    // even when the response is not (tonic's body, reqwest's), and it fits in a `BoxError`.
    response: Option<SyncWrapper<R>>,
    notes: Notes,
}

impl<R> Default for Extra<R> {
    fn default() -> Self {
        Extra {
            response: None,
            notes: Notes::default(),
        }
    }
}

impl<R> Failure<R> {
    /// A failure of `class` with the original `code`, no hint, no response, no source and no
    /// notes; [`sent`](Self::sent) is [`Sent::of`] the code.
    pub fn new(class: Class, code: Code) -> Self {
        Failure {
            core: Box::new(Core {
                class,
                code,
                retry_after: None,
                sent: Sent::of(code),
                no_retry: false,
                source: None,
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
    /// `grpc-retry-pushback-ms`, gRFC A6). The retry layer stops with
    /// [`GiveUp::ServerSaidNo`](crate::retry::GiveUp::ServerSaidNo).
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

    /// Keeps the error that was classified as this failure; it becomes [`Error::source`],
    /// replacing any earlier one.
    ///
    /// [`Error::source`]: std::error::Error::source
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.core.source = Some(Source::Owned(source.into()));
        self
    }

    /// Like [`with_source`](Self::with_source), for an error shared by many failures (a
    /// counted reference, no allocation).
    pub(crate) fn with_shared_source(
        mut self,
        source: Arc<dyn std::error::Error + Send + Sync>,
    ) -> Self {
        self.core.source = Some(Source::Shared(source));
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

    /// The failure's notes: what the layers it passed said about their own work.
    pub fn notes(&self) -> &Notes {
        self.core.extra.as_ref().map_or(&NO_NOTES, |e| &e.notes)
    }

    /// The failure's notes, mutably, for a layer to add its own.
    pub fn notes_mut(&mut self) -> &mut Notes {
        &mut self.extra_mut().notes
    }

    /// The note of type `T`, if a layer attached one: `failure.note::<Attempts>()`.
    pub fn note<T: Note>(&self) -> Option<&T> {
        self.notes().get::<T>()
    }

    /// The same failure with `note` attached (replacing a note of the same type).
    pub fn with_note<T: Note>(mut self, note: T) -> Self {
        self.notes_mut().insert(note);
        self
    }

    /// The same failure with its response (if any) mapped by `f`; for example `|_| ()` to drop a
    /// response that is not `Sync` before boxing the failure. Everything else is kept.
    pub fn map_response<T>(self, f: impl FnOnce(R) -> T) -> Failure<T> {
        let core = *self.core;
        Failure {
            core: Box::new(Core {
                class: core.class,
                code: core.code,
                retry_after: core.retry_after,
                sent: core.sent,
                no_retry: core.no_retry,
                source: core.source,
                extra: core.extra.map(|e| {
                    Box::new(Extra {
                        response: e.response.map(|r| SyncWrapper::new(f(r.into_inner()))),
                        notes: e.notes,
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

    /// A failure of another response type with the same class, code, hint and the notes that
    /// copy themselves, and no response and no source: what an outer layer keeps of a failure it
    /// only sees by reference (deep in a `BoxError`'s source chain).
    fn summary<T>(&self) -> Failure<T> {
        let mut copy = Failure::new(self.core.class, self.code());
        copy.core.retry_after = self.core.retry_after;
        copy.core.sent = self.core.sent;
        copy.core.no_retry = self.core.no_retry;
        let notes = self.notes().duplicates();
        if !notes.is_empty() {
            copy.extra_mut().notes = notes;
        }
        copy
    }

    fn source_ref(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.core.source.as_ref().map(Source::get)
    }

    /// Writes the source, and after a shared one the time left of an open breaker.
    fn write_source(&self, f: &mut impl fmt::Write) -> fmt::Result {
        let Some(source) = &self.core.source else {
            return Ok(());
        };
        write!(f, "{}", source.get())?;
        match (source, self.core.code, self.core.retry_after) {
            (Source::Shared(_), Code::CircuitOpen, Some(left)) => {
                write!(f, "; half-opens in {:?}", millis_up(left))
            }
            _ => Ok(()),
        }
    }

    /// The message a dead-letter record keeps: the `Display` of the source error if there is one
    /// (for an open breaker, with the time left until half-open), else the class and code.
    pub fn message(&self) -> String {
        let mut message = String::new();
        match self.core.source {
            Some(_) => {
                let _ = self.write_source(&mut message);
            }
            None => message = format!("{} ({})", self.core.class, self.code()),
        }
        message
    }
}

impl<R: 'static> Failure<R> {
    /// The failure a [`BoxError`] already carries, if any: a `Failure<R>` boxed by a foreign layer
    /// (tower's `Buffer`, `LoadShed`, `Timeout`) comes back whole, response included; a `Failure`
    /// found deeper in the source chain, or a `Failure<()>` (a response dropped with
    /// [`map_response`](Self::map_response)), keeps its class, code, hint and the notes that copy
    /// themselves, with the error as its source. `Err` gives back an error that was never
    /// classified.
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
            .field("no_retry", &self.core.no_retry);
        if let Some(source) = self.source_ref() {
            d.field("source", &source);
        }
        if let Some(extra) = &self.core.extra {
            d.field("has_response", &extra.response.is_some())
                .field("notes", &extra.notes);
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
        let notes = self.notes();
        for note in &notes.entries {
            note.fmt_outcome(notes, f)?;
        }
        match (self.retry_after(), self.core.code) {
            // Our own breaker's time left: written with its source (naming the breaker), if any.
            (Some(_), Code::CircuitOpen) if self.core.source.is_some() => {}
            (Some(delay), Code::CircuitOpen) => {
                write!(f, ", half-opens in {:?}", millis_up(delay))?
            }
            (Some(delay), _) => write!(f, ", server asked to retry after {:?}", millis_up(delay))?,
            (None, _) => {}
        }
        if self.core.source.is_some() {
            f.write_str(": ")?;
            self.write_source(f)?;
        }
        for note in &notes.entries {
            note.fmt_trailer(notes, f)?;
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

    /// A class written in a column of a width fills it, as a `str` does.
    #[test]
    fn a_class_honours_width_and_alignment() {
        assert_eq!(format!("{:<12}|", Class::TRANSIENT), "transient   |");
        assert_eq!(format!("{:>12}|", Class::THROTTLED), "   throttled|");
    }

    #[test]
    fn debug_and_display_show_what_a_failure_holds() {
        #[derive(Debug)]
        struct Region(&'static str);
        impl Note for Region {}

        assert_eq!(format!("{:?}", Class::TRANSIENT), "Class(transient)");
        let mut f: Failure<u16> = Failure::new(Class::TRANSIENT, Code::Error)
            .with_response(503)
            .with_note(Region("eu-1"));
        assert_eq!(format!("{:?}", f.notes()), r#"[Region("eu-1")]"#);
        assert_eq!(f.note::<Region>().map(|r| r.0), Some("eu-1"));
        assert!(f.has_response());
        *f.response_mut().expect("the response is held") = 502;
        assert_eq!(f.into_response(), Some(502));
        let mut bare: Failure<u16> = Failure::new(Class::TRANSIENT, Code::Error);
        assert!(!bare.has_response());
        assert!(bare.response_mut().is_none());

        // An open breaker's time left is written once: by its source when it has one, which
        // names the breaker, or by the failure itself.
        let left = Duration::from_millis(1500);
        let named: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen)
            .with_retry_after(left)
            .with_source("breaker mail is open, half-opens soon");
        assert_eq!(
            named.to_string(),
            "circuit_open failure (circuit open): breaker mail is open, half-opens soon"
        );
        let bare: Failure =
            Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen).with_retry_after(left);
        assert_eq!(
            bare.to_string(),
            "circuit_open failure (circuit open), half-opens in 1.5s"
        );
    }

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
            Code::Reset(0),
            Code::Reset(7),
            Code::Reset(u32::MAX),
            Code::GoAway(0),
            Code::GoAway(u32::MAX),
            Code::Tls,
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
    fn notes_are_found_by_type_replaced_and_removed() {
        #[derive(Debug, PartialEq)]
        struct A(u8);
        impl Note for A {}
        #[derive(Debug, PartialEq)]
        struct B(&'static str);
        impl Note for B {
            fn fmt_outcome(&self, _: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, " [{}]", self.0)
            }
            fn fmt_trailer(&self, notes: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "; with {} notes", notes.len())
            }
            fn duplicate(&self) -> Option<Box<dyn Note>> {
                Some(Box::new(B(self.0)))
            }
        }
        let mut f: Failure<u8> = Failure::new(Class::TRANSIENT, Code::Timeout);
        assert!(f.notes().is_empty());
        assert_eq!(f.note::<A>(), None);
        assert_eq!(f.notes_mut().insert(A(1)), None);
        assert_eq!(f.notes_mut().insert(A(2)), Some(A(1)), "one per type");
        let mut f = f.with_note(B("edge")).map_response(|n| n);
        assert_eq!(f.note::<A>(), Some(&A(2)));
        f.notes_mut().get_mut::<A>().unwrap().0 = 3;
        assert_eq!(f.notes().len(), 2);
        assert_eq!(
            f.to_string(),
            "transient failure (timeout) [edge]; with 2 notes"
        );
        // Through a foreign layer's box, only the notes that copy themselves are kept.
        #[derive(Debug)]
        struct Wrapped(Failure<u8>);
        impl fmt::Display for Wrapped {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let found = Failure::<u8>::recover(Box::new(Wrapped(f))).unwrap();
        assert_eq!(found.note::<B>(), Some(&B("edge")));
        assert_eq!(found.note::<A>(), None);
        let mut found = found;
        assert_eq!(found.notes_mut().remove::<B>(), Some(B("edge")));
        assert!(found.notes().is_empty());
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
            (Code::Grpc(4), Sent::Maybe),
            (Code::Reset(7), Sent::No),
            (Code::Reset(8), Sent::Maybe),
            (Code::Reset(0), Sent::Maybe),
            (Code::GoAway(0), Sent::No),
            (Code::GoAway(2), Sent::No),
            (Code::Tls, Sent::No),
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
