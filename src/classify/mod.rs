//! Classify each attempt's outcome once: success, or a [`Failure`] with its [`Class`], its
//! original [`Code`] and any server delay hint.
//!
//! [`ClassifyLayer`] sits above [`TimeoutLayer`](crate::timeout::TimeoutLayer), so it sees every
//! way an attempt can fail: an error response (503, 429), an io error, a client connect error,
//! the per-attempt timeout. Outer layers ([`BreakerLayer`](crate::breaker::BreakerLayer),
//! [`RetryLayer`](crate::retry::RetryLayer), [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer))
//! read the class off the failure and never parse HTTP or io errors again.
//!
//! A response that is a failure becomes `Err(Failure)` and keeps the response, so the caller can
//! still take it back with [`Failure::into_response`].
//!
//! # Default HTTP mapping
//!
//! | status | class |
//! |---|---|
//! | 1xx, 2xx, 3xx | success |
//! | 408, 425, 502, 503, 504 | [`Class::TRANSIENT`] |
//! | 429 | [`Class::THROTTLED`] |
//! | 500 and any other 5xx | [`Class::UNKNOWN`] |
//! | any other 4xx | [`Class::PERMANENT`] |
//!
//! The classifier also decides, once, whether the request was **sent** ([`Sent`]): a 408, 425,
//! 429 or 503 proves it was not processed ([`Sent::No`], so the retry layer may send even a
//! keyless POST again; [`HttpClassifier::not_sent_statuses`] changes the list), any other
//! failing status is [`Sent::Yes`]; for errors, a refused connection or a load-shed rejection is
//! [`Sent::No`], a timeout or a reset [`Sent::Maybe`] ([`Sent::of`]). The layers above read it
//! and never look at the code again for this.
//!
//! `Retry-After` is read in both forms of RFC 9110 §10.2.3 (delay-seconds and HTTP-date). A value
//! that is neither (`-1`, `nan`, `1e999`, `soon`) is ignored with a `tracing` warning, and the
//! retry layer falls back to its computed backoff; a date in the past is no hint either.
//!
//! # Other protocols and provider codes
//!
//! - [`GrpcClassifier`]: `grpc-status` (trailers-only responses at once; status in trailers
//!   with [`BufferResponseLayer`] below), `grpc-retry-pushback-ms` per gRFC A6. tonic transport
//!   errors are classified by [`classify_error`]: a refused connection is found in their source
//!   chain and is transient.
//! - [`SmtpClassifier`]: SMTP reply codes (421 throttled; 450, 451, 452 transient; 550, 553
//!   permanent), for a service that answers the reply code, or (through a closure and
//!   [`SmtpClassifier::classify_reply`]) any response type that carries one.
//! - [`HttpClassifier::with_body`]: a user function reads the provider's own code from the
//!   body (a JSON error), with [`BufferResponseLayer`] below to hold the body in memory.
//! - `RateLimit-Reset`, `X-RateLimit-Reset` and `X-Rate-Limit-Reset` are read as hints when
//!   `Retry-After` is absent (seconds, or a Unix time in seconds or milliseconds; see
//!   [`rate_limit_reset_hint`]).
//!
//! Every mapping can be overridden code by code (`map_status`, `map_code`, `map_reply`) to user
//! classes; the original code is always kept on the failure ([`Code`]).
//!
//! # Panics of the inner service
//!
//! A future of the inner service that panics is caught (`catch_unwind`) and becomes a
//! [`Class::POISON`] failure with [`Code::Panic`] whose source's `Display` is
//! `inner service panicked: ` and the panic's message (when it was a string):
//! it is never retried, the dead-letter layer records it, and the service keeps serving other
//! requests. (A panic inside the inner service's `call` itself, before it returns a future, is
//! not caught: it happens in the caller's stack.) This needs `panic = "unwind"`, Rust's default.
//!
//! # Errors
//!
//! An inner error that already carries a [`Failure`] (one boxed by tower's `Buffer`, `LoadShed`
//! or `Timeout` between two classifying layers) is passed on as it is, never classified again.
//!
//! [`classify_error`] walks the error's source chain: our [`Elapsed`](crate::timeout::Elapsed),
//! tokio's and tower's are [`Code::Timeout`], transient; tower's `LoadShed` rejection
//! (`Overloaded`) is [`Code::Overloaded`], transient, and proves the request was not sent; io
//! errors of kind connection refused, reset or
//! aborted, broken pipe, not connected and timed out are transient; with the `hyper-util`
//! feature, a hyper-util client connect error is transient; with the `reqwest` feature, a
//! `reqwest::Error` that is a timeout is [`Code::Timeout`] and a connect error a refused
//! connection; an [`Invalid`] request (your validation's error) is [`Class::POISON`] with
//! [`Code::Error`]; anything else is [`Class::UNKNOWN`] with [`Code::Error`] (or the io kind
//! found).
//!
//! # Example
//!
//! ```
//! use http::{Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::{Class, classify::{ClassifyLayer, HttpClassifier}};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Defaults:
//! let _layer = ClassifyLayer::http();
//!
//! // Customised: a provider that says 409 when a message is a duplicate, which we count as
//! // delivered, and 422 for an invalid recipient, which has its own class.
//! const INVALID_RECIPIENT: Class = Class::new("invalid_recipient");
//! let classifier = HttpClassifier::new()
//!     .success(StatusCode::CONFLICT)
//!     .map_status(StatusCode::UNPROCESSABLE_ENTITY, INVALID_RECIPIENT);
//! let svc = ServiceBuilder::new()
//!     .layer(ClassifyLayer::new(classifier))
//!     .service(service_fn(|_: ()| async {
//!         Ok::<_, std::convert::Infallible>(
//!             Response::builder().status(422).body(()).unwrap(),
//!         )
//!     }));
//! let failure = svc.oneshot(()).await.unwrap_err();
//! assert_eq!(failure.class(), INVALID_RECIPIENT);
//! assert_eq!(failure.into_response().unwrap().status(), 422);
//! # }
//! ```

use std::error::Error as StdError;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use crate::failure::{BoxError, Class, Code, Failure, Sent};

mod future;
mod grpc;
mod http;
mod invalid;
mod layer;
mod smtp;

pub use self::future::ResponseFuture;
pub use self::grpc::GrpcClassifier;
pub use self::http::{
    BodyClassifier, HttpClassifier, MAX_RESET_HINT, parse_retry_after, rate_limit_reset_hint,
};
pub use self::invalid::Invalid;
pub use self::layer::ClassifyLayer;
pub use self::smtp::SmtpClassifier;
pub use crate::grpc_wire::codes;
pub use crate::http_wire::ResponseHead;
pub use crate::request::{BufferResponse, BufferResponseFuture, BufferResponseLayer};

/// The result of classifying one failed attempt: its class, its original code, and the server's
/// delay hint, if it gave one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The failure's class.
    pub class: Class,
    /// The original code.
    pub code: Code,
    /// How long the server asked us to wait, counted from now.
    pub retry_after: Option<Duration>,
    /// The server asked not to retry at all (a negative or unparseable
    /// `grpc-retry-pushback-ms`, gRFC A6).
    pub no_retry: bool,
    /// Whether the request reached the provider; by default [`Sent::of`] the code.
    pub sent: Sent,
}

impl Verdict {
    /// A verdict of `class` with `code` and no hint.
    pub const fn new(class: Class, code: Code) -> Self {
        Verdict {
            class,
            code,
            retry_after: None,
            no_retry: false,
            sent: Sent::of(code),
        }
    }

    /// Says whether the request reached the provider, instead of the default of its code.
    pub const fn with_sent(mut self, sent: Sent) -> Self {
        self.sent = sent;
        self
    }

    /// Marks the verdict as one the server asked not to retry.
    pub const fn with_no_retry(mut self) -> Self {
        self.no_retry = true;
        self
    }

    /// Sets the server's delay hint.
    pub const fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// The [`Failure`] this verdict describes.
    pub fn into_failure<R>(self) -> Failure<R> {
        let failure = Failure::new(self.class, self.code).with_sent(self.sent);
        let failure = match self.retry_after {
            Some(delay) => failure.with_retry_after(delay),
            None => failure,
        };
        if self.no_retry {
            failure.with_no_retry()
        } else {
            failure
        }
    }
}

/// Decides whether an attempt failed, and how.
///
/// Implemented by [`HttpClassifier`] for `http::Response<B>`, and for closures
/// `Fn(&R) -> Option<Verdict>` (errors then use [`classify_error`]).
///
/// A classifier that does not know the service's response type is a compile error that names
/// both:
///
/// ```compile_fail,E0277
/// use tower::{Service, ServiceBuilder, service_fn};
/// use tower_backstop::{BoxError, classify::ClassifyLayer};
///
/// fn serves<S: Service<()>>(_: S) {}
/// // `HttpClassifier` reads an HTTP status; this service answers a `String`.
/// serves(
///     ServiceBuilder::new()
///         .layer(ClassifyLayer::http())
///         .service(service_fn(|()| async { Ok::<_, BoxError>(String::new()) })),
/// );
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify a `{R}`",
    label = "ClassifyLayer's classifier does not read this response type",
    note = "`HttpClassifier` classifies any `ResponseHead` (`http::Response<B>`; `reqwest::Response` with the `reqwest` feature); `GrpcClassifier` classifies `http::Response<B>`; any closure `Fn(&{R}) -> Option<Verdict>` is a classifier"
)]
pub trait Classifier<R> {
    /// `None` when `response` is a success; otherwise its verdict.
    fn classify_response(&self, response: &R) -> Option<Verdict>;

    /// The verdict for an error of the inner service. The default is [`classify_error`].
    fn classify_error(&self, error: &(dyn StdError + 'static)) -> Verdict {
        let (class, code) = classify_error(error);
        Verdict::new(class, code)
    }
}

// `do_not_recommend`: a classifier that does not fit the response type is reported as such (the
// trait's own message), not as "expected a `Fn(&R)` closure".
#[diagnostic::do_not_recommend]
impl<R, F> Classifier<R> for F
where
    F: Fn(&R) -> Option<Verdict>,
{
    fn classify_response(&self, response: &R) -> Option<Verdict> {
        self(response)
    }
}

// The conversion lives here, beside the classifier it uses, so that `failure.rs` (the shared
// types) calls into no layer.
impl<R: 'static> From<BoxError> for Failure<R> {
    /// The failure the error already carries (a [`Failure`] boxed by a layer between ours, on
    /// top of the error or deeper in its source chain), else the error classified with
    /// [`classify_error`] and kept as the source.
    fn from(error: BoxError) -> Self {
        match Failure::recover(error) {
            Ok(failure) => failure,
            Err(error) => {
                let (class, code) = classify_error(&*error);
                Failure::new(class, code).with_source(error)
            }
        }
    }
}

/// Classifies an error by walking its source chain (see the [module docs](self)).
///
/// Returns the class and the most specific original code found: [`Code::Timeout`] for an elapsed
/// timeout, [`Code::Io`] for an io error, else [`Code::Error`].
pub fn classify_error(error: &(dyn StdError + 'static)) -> (Class, Code) {
    let mut found_io = None;
    #[allow(unused_mut)]
    let mut connect = false;
    // A reqwest connect error, which reqwest says proves nothing was sent.
    #[allow(unused_mut)]
    let mut refused = false;
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if e.is::<crate::timeout::Elapsed>()
            || e.is::<tokio::time::error::Elapsed>()
            || e.is::<tower::timeout::error::Elapsed>()
        {
            return (Class::TRANSIENT, Code::Timeout);
        }
        // tonic's channel ends a call at its own `grpc-timeout` with this error.
        #[cfg(feature = "tonic")]
        if crate::integration::tonic::is_timeout(e) {
            return (Class::TRANSIENT, Code::Timeout);
        }
        if e.is::<tower::load_shed::error::Overloaded>() {
            return (Class::TRANSIENT, Code::Overloaded);
        }
        if e.is::<Invalid>() {
            return (Class::POISON, Code::Error);
        }
        // An HTTP/2 reset or GOAWAY the server sent.
        #[cfg(feature = "http2")]
        if let Some(verdict) = crate::integration::h2::verdict(e) {
            return verdict;
        }
        // reqwest says what its error was: a refused connection, a timeout.
        #[cfg(feature = "reqwest")]
        if crate::integration::reqwest::error::is_connect(e) {
            // Not sent: a refused connection, unless the walk below finds the TLS handshake's
            // error.
            refused = true;
        } else if crate::integration::reqwest::error::is_timeout(e) {
            return (Class::TRANSIENT, Code::Timeout);
        }
        #[cfg(feature = "hyper-util")]
        if crate::integration::hyper_util::is_connect(e) {
            connect = true;
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && found_io.is_none()
        {
            found_io = Some(if invalid_data(io) {
                io::ErrorKind::InvalidData
            } else {
                io.kind()
            });
        }
        current = e.source();
    }
    match found_io {
        // The connection was made but the peer's handshake was not what the client expects:
        // rustls (through tokio-rustls) reports every TLS failure as an io error of this kind.
        Some(io::ErrorKind::InvalidData) if connect || refused => (Class::PERMANENT, Code::Tls),
        _ if refused => (Class::TRANSIENT, Code::Io(io::ErrorKind::ConnectionRefused)),
        Some(kind) if io_kind_is_transient(kind) || connect => (Class::TRANSIENT, Code::Io(kind)),
        Some(kind) => (Class::UNKNOWN, Code::Io(kind)),
        None if connect => (Class::TRANSIENT, Code::Error),
        None => (Class::UNKNOWN, Code::Error),
    }
}

/// Whether `error`, or an io error it wraps (`io::Error::new(kind, inner_io_error)`, which
/// its `source()` skips), is of kind `InvalidData`.
fn invalid_data(error: &io::Error) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.kind() == io::ErrorKind::InvalidData {
            return true;
        }
        current = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<io::Error>());
    }
    false
}

fn io_kind_is_transient(kind: io::ErrorKind) -> bool {
    use io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | BrokenPipe
            | NotConnected
            | TimedOut
            | UnexpectedEof
            | Interrupted
    )
}

/// Classifies each outcome of the inner service with a [`Classifier`]; see the
/// [module docs](self).
///
/// `Error = Failure<S::Response>`; the inner error only needs `Into<BoxError>`.
#[derive(Clone, Debug)]
pub struct Classify<S, C> {
    inner: S,
    classifier: C,
}

impl<S, C> Classify<S, C> {
    /// Wraps `inner`, classifying with `classifier`.
    pub fn new(inner: S, classifier: C) -> Self {
        Classify { inner, classifier }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The failure `error` already carries, else `classifier`'s verdict on it, with `error` as the
/// source.
pub(crate) fn classify_boxed<R: 'static, C: Classifier<R>>(
    classifier: &C,
    error: BoxError,
) -> Failure<R> {
    match Failure::recover(error) {
        Ok(failure) => failure,
        Err(error) => {
            let verdict = classifier.classify_error(&*error);
            tracing::debug!(class = %verdict.class, code = %verdict.code, error = %error, "error classified");
            verdict.into_failure().with_source(error)
        }
    }
}

impl<S, C, Req> Service<Req> for Classify<S, C>
where
    S: Service<Req>,
    S::Response: 'static,
    S::Error: Into<BoxError>,
    C: Classifier<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| classify_boxed(&self.classifier, e.into()))
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.classifier.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_chain_is_found() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let e = Wrapper(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            classify_error(&e),
            (Class::TRANSIENT, Code::Io(io::ErrorKind::ConnectionRefused))
        );
        let e = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(
            classify_error(&e),
            (Class::UNKNOWN, Code::Io(io::ErrorKind::PermissionDenied))
        );
    }

    #[test]
    fn unknown_error_type_is_unknown() {
        #[derive(Debug)]
        struct Weird;
        impl std::fmt::Display for Weird {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("weird")
            }
        }
        impl StdError for Weird {}
        assert_eq!(classify_error(&Weird), (Class::UNKNOWN, Code::Error));
    }

    #[test]
    fn elapsed_is_transient_timeout() {
        let e = crate::timeout::Elapsed::new(Duration::from_millis(5));
        assert_eq!(classify_error(&e), (Class::TRANSIENT, Code::Timeout));
    }
}
