//! Bodies read into memory on their way through: [`ReplayBufferLayer`] reads each request body
//! so that the retry and dead-letter layers above can copy it, [`BufferResponseLayer`] reads
//! each response body so that the classifier above can look inside it.
//!
//! Both read a body into a [`BufferedBody`], up to a byte limit, with the same code: the head
//! of the message (the request's or the response's parts) is kept aside while the body is
//! collected, and the two are put together again (`Reading`). Only what happens around that
//! step differs: a request is read before the inner service is called, a response after.
//!
//! They stay two layer types, not one with a direction, because a stack tells them apart by
//! where it puts them, and the names say that place: the replay buffer goes outermost, above
//! [`RetryLayer`](crate::retry::RetryLayer), and reads what goes down; the response buffer goes
//! directly below [`ClassifyLayer`](crate::classify::ClassifyLayer) and reads what comes up.
//! Their bounds, errors and order checks differ too (the request's body error becomes the
//! caller's error type; the response's is a `BoxError` that the classifier above classifies).
//! Each is also found where its users look for it, as
//! `tower_backstop::retry::ReplayBufferLayer` and `tower_backstop::classify::BufferResponseLayer`.
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_backstop::classify::ClassifyLayer;
//! use tower_backstop::request::{BufferResponseLayer, ReplayBufferLayer};
//! use tower_backstop::retry::RetryLayer;
//!
//! let layers = ServiceBuilder::new()
//!     .layer(ReplayBufferLayer::new(64 * 1024)) // request bodies, for the retries below
//!     .layer(RetryLayer::default())
//!     .layer(ClassifyLayer::http())
//!     .layer(BufferResponseLayer::new(16 * 1024)); // response bodies, for the classifier above
//! # let _ = layers;
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::{BufferedBody, Collect};
use crate::failure::BoxError;

/// Reads one message's body into a [`BufferedBody`], its head (the request's or the response's
/// parts) kept aside to put the message together again: the reading step of both layers.
#[derive(Debug)]
struct Reading<H, B> {
    head: Option<H>,
    collect: Collect<B>,
}

/// The head of a message and its body read, or the body's error.
type Read<H, B> = Result<(H, BufferedBody<B>), <B as Body>::Error>;

impl<H, B> Reading<H, B>
where
    B: Body + Unpin,
{
    /// Reading `collect`'s body (perhaps begun already) for the message whose head is `head`.
    fn new(head: H, collect: Collect<B>) -> Self {
        Reading {
            head: Some(head),
            collect,
        }
    }

    /// Polls the body until it ends or passes the limit, then hands back the head and the
    /// body read. `Ready(None)` if polled again after that.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Read<H, B>>> {
        let body = match ready!(self.collect.poll_collect(cx)) {
            Ok(body) => body,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        Poll::Ready(self.head.take().map(|head| Ok((head, body))))
    }
}

/// Applies [`ReplayBuffer`]: reads each request body into memory, up to `limit` bytes, so that
/// [`RetryLayer`](crate::retry::RetryLayer) can replay it.
///
/// Bodies that are cheap to clone (`Full<Bytes>`, `String`, `Bytes`) need no buffer: the retry
/// layer copies them as they are. Use this layer, **outside** the retry layer, for the others (a
/// hyper `Incoming` body being proxied, tonic's request body, a stream): the request below it
/// has a [`BufferedBody`], which is replayed byte for byte, with the same size hint and so the
/// same `Content-Length`.
///
/// A body longer than `limit` is not held: it still streams through in full, but the request is
/// not replayable, is never retried, and its failure says
/// [`GiveUp::NotReplayable`](crate::retry::GiveUp::NotReplayable).
///
/// The trade-off: the body is read before the first attempt starts (latency of one body read,
/// memory up to `limit` per request in flight). The body type must be `Unpin` (box it otherwise).
///
/// Its one place is above the retry layer (or above a dead-letter layer, which keeps a copy to
/// record): built over a stack with neither, it says so in a `tracing` warning.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_backstop::retry::{ReplayBufferLayer, RetryLayer};
///
/// let layers = ServiceBuilder::new()
///     .layer(ReplayBufferLayer::new(64 * 1024))
///     .layer(RetryLayer::default());
/// # let _ = layers;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ReplayBufferLayer {
    limit: usize,
}

impl ReplayBufferLayer {
    /// Buffers request bodies of up to `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        ReplayBufferLayer { limit }
    }
}

impl<S> Layer<S> for ReplayBufferLayer {
    type Service = ReplayBuffer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::ReplayBuffer);
        ReplayBuffer {
            inner,
            limit: self.limit,
        }
    }
}

/// Reads request bodies into a [`BufferedBody`]; see [`ReplayBufferLayer`].
#[derive(Clone, Debug)]
pub struct ReplayBuffer<S> {
    inner: S,
    limit: usize,
}

/// The request body could not be read by [`ReplayBuffer`]: the source of the failure, whose
/// message reads `request body could not be read: {the body's error}`.
#[derive(Debug)]
pub(crate) struct BodyReadError {
    source: BoxError,
}

impl fmt::Display for BodyReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request body could not be read: {}", self.source)
    }
}

impl std::error::Error for BodyReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl<S, B> Service<http::Request<B>> for ReplayBuffer<S>
where
    S: Service<http::Request<BufferedBody<B>>> + Clone,
    S::Error: From<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ReplayBufferFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let mut collect = Collect::new(body, self.limit);
        // A body that is all there at once (a unary gRPC message, a body in memory) is read
        // here and the service made ready is called now: no clone of it, no second state, and
        // the head stays where it is. The body saw a no-op waker only if it answered at once;
        // otherwise the future reads on with its own.
        let mut now = Context::from_waker(std::task::Waker::noop());
        let state = match collect.poll_collect(&mut now) {
            Poll::Ready(Ok(body)) => ReplayState::Calling {
                future: self
                    .inner
                    .call(http::Request::from_parts(parts, replayable(body))),
            },
            Poll::Ready(Err(e)) => ReplayState::Failed {
                error: Some(unreadable(e)),
            },
            Poll::Pending => {
                // Take the service that was made ready; leave a clone behind.
                let clone = self.inner.clone();
                ReplayState::Reading {
                    reading: Reading::new(parts, collect),
                    service: Some(std::mem::replace(&mut self.inner, clone)),
                }
            }
        };
        ReplayBufferFuture { state }
    }
}

/// The body read, said at `DEBUG` when it was over the limit.
fn replayable<B>(body: BufferedBody<B>) -> BufferedBody<B> {
    if !body.is_complete() {
        tracing::debug!("request body above the replay buffer limit: not replayable");
    }
    body
}

/// The error of a body that could not be read.
fn unreadable<E: From<BoxError>>(error: impl Into<BoxError>) -> E {
    let error: BoxError = Box::new(BodyReadError {
        source: error.into(),
    });
    error.into()
}

fn polled_after_completion<E: From<BoxError>>() -> E {
    let error: BoxError = "replay buffer polled after completion".into();
    error.into()
}

pin_project! {
    /// Response future of [`ReplayBuffer`]: reads the body, then calls the inner service.
    pub struct ReplayBufferFuture<S, B>
    where
        S: Service<http::Request<BufferedBody<B>>>,
    {
        #[pin]
        state: ReplayState<S, B>,
    }
}

pin_project! {
    #[project = ReplayStateProj]
    enum ReplayState<S, B>
    where
        S: Service<http::Request<BufferedBody<B>>>,
    {
        Reading {
            reading: Reading<http::request::Parts, B>,
            service: Option<S>,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
        Failed {
            error: Option<S::Error>,
        },
    }
}

impl<S, B> fmt::Debug for ReplayBufferFuture<S, B>
where
    S: Service<http::Request<BufferedBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBufferFuture").finish_non_exhaustive()
    }
}

impl<S, B> Future for ReplayBufferFuture<S, B>
where
    S: Service<http::Request<BufferedBody<B>>>,
    S::Error: From<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                ReplayStateProj::Reading { reading, service } => {
                    let (parts, body) = match ready!(reading.poll_read(cx)) {
                        Some(Ok(read)) => read,
                        Some(Err(e)) => return Poll::Ready(Err(unreadable(e))),
                        None => return Poll::Ready(Err(polled_after_completion())),
                    };
                    let Some(mut service) = service.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let request = http::Request::from_parts(parts, replayable(body));
                    let future = service.call(request);
                    this.state.set(ReplayState::Calling { future });
                }
                ReplayStateProj::Calling { future } => return future.poll(cx),
                ReplayStateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
            }
        }
    }
}

/// Applies [`BufferResponse`]: reads each response body into memory, up to `limit` bytes,
/// before the classifier above sees the response.
///
/// Put it **below** [`ClassifyLayer`](crate::classify::ClassifyLayer) when the classifier needs
/// more than the status and headers (built above a `ClassifyLayer`, it says so in a `tracing`
/// warning):
///
/// - a provider's own error code in a JSON body: the classifier reads
///   [`BufferedBody::bytes`] (see [`ClassifyLayer`](crate::classify::ClassifyLayer)'s docs for
///   a closure classifier);
/// - a gRPC status sent in trailers at the end of the body: [`BufferedBody::trailers`], which
///   [`GrpcClassifier`](crate::classify::GrpcClassifier) reads too (the trailers are also kept
///   in the response's extensions for it, so that it classifies any body type).
///
/// The trade-off: the whole response is read before the caller sees it (no streaming; memory up
/// to `limit` per response in flight), so use it for unary calls and small JSON answers, not for
/// downloads or server streams. A body longer than `limit` is passed on in full, unclassified
/// beyond its headers. The body type must be `Unpin` (hyper's `Incoming`, tonic's `Body` are).
/// A body that fails while being read becomes an error (classified by
/// [`classify_error`](crate::classify::classify_error)).
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_backstop::classify::{BufferResponseLayer, ClassifyLayer};
///
/// let layers = ServiceBuilder::new()
///     .layer(ClassifyLayer::http())
///     .layer(BufferResponseLayer::new(16 * 1024));
/// # let _ = layers;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BufferResponseLayer {
    limit: usize,
}

impl BufferResponseLayer {
    /// Buffers response bodies of up to `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        BufferResponseLayer { limit }
    }
}

impl<S> Layer<S> for BufferResponseLayer {
    type Service = BufferResponse<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::BufferResponse);
        BufferResponse {
            inner,
            limit: self.limit,
        }
    }
}

/// Reads response bodies into a [`BufferedBody`]; see [`BufferResponseLayer`].
#[derive(Clone, Debug)]
pub struct BufferResponse<S> {
    inner: S,
    limit: usize,
}

/// Trailers of a response whose body was read to the end by [`BufferResponseLayer`], kept in
/// the response's extensions so that [`GrpcClassifier`](crate::classify::GrpcClassifier) can
/// read the gRPC status sent at the end of the body, whatever the body type. (A classifier of
/// your own reads them from the body: [`BufferedBody::trailers`].)
#[derive(Clone, Debug, Default)]
pub(crate) struct Trailers(pub(crate) HeaderMap);

impl<S, Req, B> Service<Req> for BufferResponse<S>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<BufferedBody<B>>;
    type Error = BoxError;
    type Future = BufferResponseFuture<S::Future, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        BufferResponseFuture {
            future: self.inner.call(req),
            reading: None,
            limit: self.limit,
        }
    }
}

pin_project! {
    /// Response future of [`BufferResponse`]: the inner service's answer, then its body read.
    pub struct BufferResponseFuture<F, B> {
        #[pin]
        future: F,
        reading: Option<Reading<http::response::Parts, B>>,
        limit: usize,
    }
}

impl<F, B> fmt::Debug for BufferResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferResponseFuture")
            .field("limit", &self.limit)
            .field("reading", &self.reading.is_some())
            .finish()
    }
}

impl<F, B, E> Future for BufferResponseFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<http::Response<BufferedBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some(reading) = this.reading.as_mut() {
                let (mut parts, body) = match ready!(reading.poll_read(cx)) {
                    Some(read) => read.map_err(Into::into)?,
                    None => return Poll::Ready(Err("response buffer lost its parts".into())),
                };
                if let Some(trailers) = body.trailers() {
                    parts.extensions.insert(Trailers(trailers.clone()));
                }
                return Poll::Ready(Ok(http::Response::from_parts(parts, body)));
            }
            let response = ready!(this.future.as_mut().poll(cx)).map_err(Into::into)?;
            let (parts, body) = response.into_parts();
            *this.reading = Some(Reading::new(parts, Collect::new(body, *this.limit)));
        }
    }
}
