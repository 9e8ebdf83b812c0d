//! [`Replay`]: a copy of a request for the next attempt, and whether sending it again is safe.

use std::time::Duration;

use bytes::Bytes;

use super::idempotency::http_retry_safe;

/// A request that can be sent again.
///
/// The retry layer takes one copy per attempt and the dead-letter layer keeps one to describe a
/// failure; both happen once per call, so for the success path to allocate nothing, the copy
/// must be cheap (`Bytes`, `Full<Bytes>`, an `Arc`).
///
/// A request type that is not `Replay` does not fit under [`RetryLayer`](crate::retry::RetryLayer)
/// or [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer), and the compiler says so:
///
/// ```compile_fail,E0277
/// use tower::{Service, ServiceBuilder, service_fn};
/// use tower_backstop::{BoxError, retry::RetryLayer};
///
/// struct Job; // neither `Clone` nor `Replay`
/// fn serves_jobs<S: Service<Job>>(_: S) {}
/// serves_jobs(
///     ServiceBuilder::new()
///         .layer(RetryLayer::default())
///         .service(service_fn(|_: Job| async { Ok::<(), BoxError>(()) })),
/// );
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be sent again: it does not implement `tower_backstop::Replay`",
    label = "RetryLayer and DeadLetterLayer need a copy of this request",
    note = "implement `Replay` (and `Describe`) for your request type; `http::Request<B>` is `Replay` when `B: Clone` (use `Full<Bytes>`, or put `ReplayBufferLayer` above `RetryLayer` for a streaming body); `reqwest::Request` is `Replay` with the `reqwest` feature"
)]
pub trait Replay: Sized {
    /// A copy of this request for another attempt, or `None` when it cannot be replayed (a
    /// streaming body that was not buffered). A request with no copy is never retried.
    fn replay(&self) -> Option<Self>;

    /// Whether sending this request more than once is safe. For HTTP: the method is idempotent
    /// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE; RFC 9110 §9.2.2), or the request carries an
    /// `Idempotency-Key` header. The default is `true`.
    fn retry_safe(&self) -> bool {
        true
    }

    /// Records where the request goes on `span`, the span of one attempt
    /// (`backstop.attempt`): OpenTelemetry's HTTP client attributes `http.request.method`,
    /// `server.address` and `server.port`, and `otel.name` (the method, as the HTTP client
    /// semantic conventions name a client span). Called only when the span is enabled. The
    /// default records nothing; HTTP requests, `reqwest::Request` and gRPC requests record
    /// their method and URI's host and port.
    fn record_span(&self, span: &tracing::Span) {
        let _ = span;
    }

    /// The caller's own time left, carried in the request, which the retry layer takes as a
    /// deadline for the whole call (never extended by a retry). `header` is the policy's
    /// [`time_left_header`](crate::retry::RetryPolicy::time_left_header), if any. The default
    /// is `None`; an HTTP request reads `header` (whole milliseconds); a gRPC request under
    /// `GrpcLayer` reads its `grpc-timeout`. A malformed value is ignored.
    fn time_left(&self, header: Option<&http::HeaderName>) -> Option<Duration> {
        let _ = header;
        None
    }

    /// Writes the time left for this attempt into the request, so that the server stops when
    /// the caller will have given up: called by the retry layer before each attempt, with the
    /// least of the overall deadline's time left, the caller's own and the per-attempt timeout.
    /// The default writes nothing; an HTTP request writes [`TimeLeft::millis`] into
    /// [`TimeLeft::header`] when there is one; a gRPC request under `GrpcLayer` writes
    /// [`TimeLeft::grpc_timeout`] into `grpc-timeout`.
    fn set_time_left(&mut self, left: &TimeLeft<'_>) {
        let _ = left;
    }
}

/// The time left for one attempt, as the retry layer hands it to [`Replay::set_time_left`]:
/// its duration, the header the policy names for HTTP
/// ([`RetryPolicy::time_left_header`](crate::retry::RetryPolicy::time_left_header)), and its
/// two wire forms. When the time left is exactly the policy's per-attempt timeout or its
/// deadline (a first attempt, in the common case), both forms were encoded once with the
/// policy and are shared, so writing them allocates nothing.
#[derive(Clone, Copy, Debug)]
pub struct TimeLeft<'a> {
    left: Duration,
    header: Option<&'a http::HeaderName>,
    encoded: Option<&'a Encoded>,
}

impl<'a> TimeLeft<'a> {
    // Inlined, so that for a request that writes no time left (the default `set_time_left`)
    // the compiler drops the whole computation.
    #[inline]
    pub(crate) fn new(
        left: Duration,
        header: Option<&'a http::HeaderName>,
        encoded: Option<&'a Encoded>,
    ) -> Self {
        TimeLeft {
            left,
            header,
            encoded: encoded.filter(|e| e.left == left),
        }
    }

    /// How long the attempt has, counted from now.
    pub fn duration(&self) -> Duration {
        self.left
    }

    /// The HTTP header the policy writes it into, if it names one.
    pub fn header(&self) -> Option<&'a http::HeaderName> {
        self.header
    }

    /// The `grpc-timeout` value (gRPC over HTTP/2): at most 8 digits in the coarsest exact
    /// unit, rounded down, so never above [`duration`](Self::duration): `2S`, `1500m`,
    /// `1234567u`.
    pub fn grpc_timeout(&self) -> http::HeaderValue {
        match self.encoded {
            Some(e) => e.grpc.clone(),
            None => crate::grpc_wire::encode_timeout(self.left),
        }
    }

    /// Whole milliseconds, rounded down, as a header value.
    pub fn millis(&self) -> http::HeaderValue {
        match self.encoded {
            Some(e) => e.millis.clone(),
            None => millis_value(self.left),
        }
    }
}

fn millis_value(left: Duration) -> http::HeaderValue {
    http::HeaderValue::from(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
}

/// A duration's two wire forms, encoded once (with a policy) and shared by every attempt that
/// has exactly that time left.
#[derive(Clone, Debug)]
pub(crate) struct Encoded {
    left: Duration,
    grpc: http::HeaderValue,
    millis: http::HeaderValue,
}

impl Encoded {
    pub(crate) fn new(left: Duration) -> Self {
        let encoded = Encoded {
            left,
            grpc: crate::grpc_wire::encode_timeout(left),
            millis: millis_value(left),
        };
        // Cloned once now, so that the bytes are shared from here on and every later clone
        // only counts a reference.
        drop(encoded.clone());
        encoded
    }

    pub(crate) fn left(&self) -> Duration {
        self.left
    }
}

/// The time left in `header` of `headers`: whole milliseconds, ASCII digits only (at most 19);
/// `None` when absent or malformed.
pub(crate) fn read_time_left(
    headers: &http::HeaderMap,
    header: Option<&http::HeaderName>,
) -> Option<Duration> {
    let value = headers.get(header?)?.as_bytes();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// Writes the time left into its header of `headers`, in whole milliseconds, when the policy
/// names one.
pub(crate) fn write_time_left(headers: &mut http::HeaderMap, left: &TimeLeft<'_>) {
    if let Some(header) = left.header() {
        headers.insert(header.clone(), left.millis());
    }
}

// `do_not_recommend`: a body that is not `Clone` is reported with `Replay`'s own message, which
// names the fixes, not as a missing `Clone`.
#[diagnostic::do_not_recommend]
impl<B: Clone> Replay for http::Request<B> {
    #[inline]
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn retry_safe(&self) -> bool {
        http_retry_safe(self)
    }

    fn record_span(&self, span: &tracing::Span) {
        record_http_span(span, self.method(), self.uri());
    }

    fn time_left(&self, header: Option<&http::HeaderName>) -> Option<Duration> {
        read_time_left(self.headers(), header)
    }

    fn set_time_left(&mut self, left: &TimeLeft<'_>) {
        write_time_left(self.headers_mut(), left);
    }
}

/// Records an HTTP request's method, host and port (the URI's, or its scheme's default) on an
/// attempt's span.
pub(crate) fn record_http_span(span: &tracing::Span, method: &http::Method, uri: &http::Uri) {
    let port = uri.port_u16().or(match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    });
    record_destination(span, method.as_str(), uri.host(), port);
}

/// Records a request's method, server address and port on an attempt's span.
pub(crate) fn record_destination(
    span: &tracing::Span,
    method: &str,
    host: Option<&str>,
    port: Option<u16>,
) {
    span.record("otel.name", method);
    span.record("http.request.method", method);
    if let Some(host) = host {
        span.record("server.address", host);
    }
    if let Some(port) = port {
        span.record("server.port", port);
    }
}

macro_rules! plain_payload {
    ($($ty:ty),*) => {$(
        impl Replay for $ty {
            #[inline]
            fn replay(&self) -> Option<Self> {
                Some(self.clone())
            }
        }
    )*};
}

plain_payload!(String, &'static str, Bytes, Vec<u8>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::idempotency::key_header;

    #[test]
    fn idempotency_follows_rfc_9110() {
        let get = http::Request::get("/").body(()).unwrap();
        let post = http::Request::post("/").body(()).unwrap();
        let keyed = http::Request::post("/")
            .header("Idempotency-Key", "k1")
            .body(())
            .unwrap();
        assert!(get.retry_safe());
        assert!(!post.retry_safe());
        assert!(keyed.retry_safe());
        assert_eq!(key_header(keyed.headers()), Some("k1"));
    }
}
