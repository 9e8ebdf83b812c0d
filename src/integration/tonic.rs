//! `tonic` (feature `tonic`): a generated gRPC client takes the stack as its channel.
//!
//! One layer line on top, [`GrpcLayer`], and the stack around a `tonic::transport::Channel` is
//! what a generated client (`HealthClient::new(stack)`) expects:
//!
//! - it reads each request body into a bounded replay buffer (gRFC A6: past the limit the call
//!   is sent once and not retried, [`GiveUp::NotReplayable`](crate::retry::GiveUp::NotReplayable)), so
//!   [`RetryLayer`](crate::retry::RetryLayer) can send it again, and the request travels down
//!   as a [`GrpcRequest`], which the `Channel` accepts;
//! - it hands the caller the `tonic::Status` it expects: the server's own status (code and
//!   message) after the last attempt, `UNAVAILABLE` at once for an open breaker, a load-shed
//!   rejection or an HTTP/2 reset, `DEADLINE_EXCEEDED` for our per-attempt timeout, and for
//!   anything else the status tonic finds in the error (a refused connection is
//!   `UNAVAILABLE`); the [`Failure`] behind it is the status's `source()`
//!   ([`GrpcLayer::failure`]): class, code, attempts and why the retries stopped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tonic::body::Body;
use tonic::transport::Channel;
use tower_layer::Layer;
use tower_service::Service;

use crate::failure::{BoxError, Class, Code, Failure};
use crate::request::{
    BufferedBody, Describe, Envelope, Replay, ReplayBuffer, ReplayBufferFuture, ReplayBufferLayer,
};

/// The per-call replay buffer limit of [`GrpcLayer::new`]: 256 KiB, gRPC's own default
/// per-RPC retry buffer (gRFC A6, `grpc.per_rpc_retry_buffer_size`).
pub const DEFAULT_GRPC_BUFFER: usize = 256 * 1024;

/// A gRPC request on its way down the stack: an `http::Request` whose body was read into a
/// bounded replay buffer by [`GrpcLayer`]. It is [`Replay`] (when the body fitted) and
/// [`Describe`], and `tonic::transport::Channel` accepts it.
#[derive(Debug)]
pub struct GrpcRequest(pub http::Request<BufferedBody<Body>>);

impl Replay for GrpcRequest {
    fn replay(&self) -> Option<Self> {
        self.0.replay().map(GrpcRequest)
    }

    fn retry_safe(&self) -> bool {
        self.0.retry_safe()
    }

    fn record_span(&self, span: &tracing::Span) {
        self.0.record_span(span)
    }

    /// The caller's `grpc-timeout` (a malformed value is ignored, as gRPC servers do).
    fn time_left(&self, _header: Option<&http::HeaderName>) -> Option<std::time::Duration> {
        crate::grpc_wire::parse_timeout(self.0.headers().get(GRPC_TIMEOUT)?)
    }

    /// Writes `grpc-timeout` (gRPC over HTTP/2), at most 8 digits: in the coarsest unit that
    /// holds the time left exactly (`500m`, `2S`), else in the finest unit that holds it in 8
    /// digits, rounded down so never above it (`89907220n` for 89.9 ms left after a retry).
    fn set_time_left(&mut self, left: &crate::request::TimeLeft<'_>) {
        self.0
            .headers_mut()
            .insert(GRPC_TIMEOUT, left.grpc_timeout());
    }
}

const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

impl Describe for GrpcRequest {
    fn message_id(&self) -> Option<&str> {
        self.0.message_id()
    }

    fn describe(self) -> impl Future<Output = Envelope> + Send {
        self.0.describe()
    }
}

/// A `Channel` sends a [`GrpcRequest`] as it sends any request (its buffered body is boxed into
/// a `tonic::body::Body`, one allocation per attempt).
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl Service<GrpcRequest> for Channel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<Body>>::poll_ready(self, cx)
    }

    #[inline]
    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        Service::<http::Request<Body>>::call(self, request.0.map(Body::new))
    }
}

/// The outermost layer of a gRPC client stack (feature `tonic`): with it on top, the stack
/// around a `tonic::transport::Channel` is what a generated client (`HealthClient::new(stack)`)
/// takes as its channel, with no closures.
///
/// - It reads each request body into a bounded replay buffer (gRFC A6: past the limit the call
///   is sent once and not retried, [`GiveUp::NotReplayable`](crate::retry::GiveUp::NotReplayable)), so
///   [`RetryLayer`](crate::retry::RetryLayer) can send it again; the request travels down as a
///   [`GrpcRequest`], which the `Channel` accepts.
/// - It hands the caller the `tonic::Status` it expects: the server's own status (code and
///   message) after the last attempt, `UNAVAILABLE` at once for an open breaker, a load-shed
///   rejection or an HTTP/2 reset, `DEADLINE_EXCEEDED` for our per-attempt timeout, and for
///   anything else the status tonic finds in the error (a refused connection is
///   `UNAVAILABLE`). The [`Failure`] behind it (class, code, attempts, why the retries
///   stopped) is the status's `source()`: [`GrpcLayer::failure`].
///
/// ```no_run
/// use std::time::Duration;
/// use tonic_health::pb::health_client::HealthClient;
/// use tower::ServiceBuilder;
/// use tower_backstop::{GrpcLayer, breaker::BreakerLayer, classify::{ClassifyLayer, GrpcClassifier}};
/// use tower_backstop::{retry::{RetryLayer, RetryPolicy}, timeout::TimeoutLayer};
///
/// # async fn run() {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let stack = ServiceBuilder::new()
///     .layer(GrpcLayer::new())
///     .layer(RetryPolicy::grpc().build().unwrap())
///     .layer(BreakerLayer::consecutive_failures(5))
///     .layer(ClassifyLayer::new(GrpcClassifier::new()))
///     .layer(TimeoutLayer::new(Duration::from_secs(1)))
///     .service(channel);
/// let mut client = HealthClient::new(stack);
/// # let _ = client; }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GrpcLayer {
    buffer: ReplayBufferLayer,
}

impl GrpcLayer {
    /// A layer with a replay buffer of [`DEFAULT_GRPC_BUFFER`] bytes per call.
    pub const fn new() -> Self {
        GrpcLayer::with_buffer(DEFAULT_GRPC_BUFFER)
    }

    /// A layer with a replay buffer of `limit` bytes per call (a request body, framing
    /// included, longer than that is sent once and not retried).
    pub const fn with_buffer(limit: usize) -> Self {
        GrpcLayer {
            buffer: ReplayBufferLayer::new(limit),
        }
    }

    /// The [`Failure`] behind a `tonic::Status` that a client over this layer returned: its
    /// class, code, [`Sent`](crate::Sent), server hint and notes (the retry layer's
    /// [`Attempts`](crate::retry::Attempts): how many attempts, and why the retries stopped;
    /// the dead-letter layer's record id), without the response. `None` for a status that did
    /// not come from this layer (a success's status read by tonic from the response body's
    /// trailers, or a status of the caller's own making).
    ///
    /// It is the status's `source()`, downcast: `status.source()?.downcast_ref::<Failure>()`.
    ///
    /// ```
    /// use tower_backstop::{Failure, GrpcLayer};
    ///
    /// fn report(status: &tonic::Status) {
    ///     match GrpcLayer::failure(status) {
    ///         Some(failure) => eprintln!("{}: {} ({})", status.code(), failure.class(), failure.code()),
    ///         None => eprintln!("{status}"),
    ///     }
    /// }
    /// # report(&tonic::Status::unavailable("down"));
    /// ```
    pub fn failure(status: &tonic::Status) -> Option<&Failure> {
        std::error::Error::source(status)?.downcast_ref::<Failure>()
    }
}

impl Default for GrpcLayer {
    fn default() -> Self {
        GrpcLayer::new()
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = Grpc<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Grpc {
            inner: self.buffer.layer(IntoGrpcRequest { inner }),
        }
    }
}

/// Wraps each buffered request as a [`GrpcRequest`] for the stack below.
#[derive(Clone, Debug)]
pub(crate) struct IntoGrpcRequest<S> {
    inner: S,
}

impl<S> Service<http::Request<BufferedBody<Body>>> for IntoGrpcRequest<S>
where
    S: Service<GrpcRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: http::Request<BufferedBody<Body>>) -> Self::Future {
        self.inner.call(GrpcRequest(request))
    }
}

/// A gRPC client stack under [`GrpcLayer`]: what a generated tonic client takes as its channel.
#[derive(Clone, Debug)]
pub struct Grpc<S> {
    inner: ReplayBuffer<IntoGrpcRequest<S>>,
}

impl<S, B> Service<http::Request<Body>> for Grpc<S>
where
    S: Service<GrpcRequest, Response = http::Response<B>, Error = Failure<http::Response<B>>>
        + Clone,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = GrpcFuture<S>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(status_of)
    }

    #[inline]
    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        GrpcFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// Response future of [`Grpc`].
    pub struct GrpcFuture<S>
    where
        S: Service<GrpcRequest>,
    {
        #[pin]
        inner: ReplayBufferFuture<IntoGrpcRequest<S>, Body>,
    }
}

impl<S: Service<GrpcRequest>> fmt::Debug for GrpcFuture<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcFuture").finish_non_exhaustive()
    }
}

impl<S, B> Future for GrpcFuture<S>
where
    S: Service<GrpcRequest, Response = http::Response<B>, Error = Failure<http::Response<B>>>,
    B: Send + 'static,
{
    type Output = Result<http::Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match ready!(self.project().inner.poll(cx)) {
            Ok(response) => Poll::Ready(Ok(response)),
            Err(mut failure) if failure.has_response() => {
                // The server's own trailers-only status: the caller's `Status` is the server's,
                // with the failure as its source.
                if let Some(status) = failure.response_mut().and_then(|r| server_status(r)) {
                    return Poll::Ready(Err(with_failure(status, failure)));
                }
                // A proxy's 503, a status with details: tonic reads the answer itself.
                match Failure::into_response(failure) {
                    Some(response) => Poll::Ready(Ok(response)),
                    None => Poll::Ready(Err("response lost".into())),
                }
            }
            Err(failure) => Poll::Ready(Err(status_of(failure))),
        }
    }
}

/// The status of a trailers-only gRPC answer (`grpc-status` in the headers of an HTTP 200).
/// `None` for any other answer, and when the status has `grpc-status-details-bin` (tonic's
/// own parsing of those details panics on a malformed value; its client path is left to read
/// them).
fn server_status<B>(response: &http::Response<B>) -> Option<tonic::Status> {
    let headers = response.headers();
    if response.status() != http::StatusCode::OK || headers.contains_key("grpc-status-details-bin")
    {
        return None;
    }
    tonic::Status::from_header_map(headers)
}

/// `status` with `failure` (its response dropped) as its `source()`.
fn with_failure<R>(mut status: tonic::Status, failure: Failure<R>) -> BoxError {
    status.set_source(std::sync::Arc::new(failure.map_response(|_| ())));
    Box::new(status)
}

/// The caller's `Status` for a failure without a server's answer, with the failure as its
/// `source()`: `UNAVAILABLE` for an open breaker, a load-shed rejection and an HTTP/2 reset or
/// `GOAWAY` (gRPC's mapping of `REFUSED_STREAM`; the others may be retried by the caller as
/// any `UNAVAILABLE`), `DEADLINE_EXCEEDED` for a timeout, else the status tonic finds in the
/// error's source chain (a refused connection is `UNAVAILABLE`), or `UNKNOWN`.
fn status_of<R: Send + 'static>(failure: Failure<R>) -> BoxError {
    let message = failure.to_string();
    let status = match failure.code() {
        _ if failure.class() == Class::CIRCUIT_OPEN => tonic::Status::unavailable(message),
        Code::Overloaded | Code::Reset(_) | Code::GoAway(_) => tonic::Status::unavailable(message),
        Code::Timeout => tonic::Status::deadline_exceeded(message),
        _ => {
            // tonic's own reading of the source chain; the failure stays the source either way.
            let failure: BoxError = Box::new(failure.map_response(|_| ()));
            return match tonic::Status::try_from_error(failure) {
                Ok(status) => Box::new(status),
                Err(failure) => {
                    let mut status = tonic::Status::unknown(message);
                    status.set_source(failure.into());
                    Box::new(status)
                }
            };
        }
    };
    with_failure(status, failure)
}

/// Whether `error` is tonic's `TimeoutExpired`: the channel ended the call at its own
/// `grpc-timeout` (a timeout, transient, for [`classify_error`](crate::classify::classify_error)).
pub(crate) fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<tonic::TimeoutExpired>()
}
