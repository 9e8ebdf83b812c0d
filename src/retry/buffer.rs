//! The opt-in bounded replay buffer for request bodies that cannot be cloned.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::failure::BoxError;
use crate::request::{BufferedBody, Collect};

/// Applies [`ReplayBuffer`]: reads each request body into memory, up to `limit` bytes, so that
/// [`RetryLayer`](super::RetryLayer) can replay it.
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
        // here and the service made ready is called now: no clone of it, no second state. The
        // body saw a no-op waker only if it answered at once; otherwise the future polls it
        // again with its own.
        let mut now = Context::from_waker(std::task::Waker::noop());
        let state = match collect.poll_collect(&mut now) {
            Poll::Ready(Ok(body)) => BufferState::Calling {
                future: self
                    .inner
                    .call(http::Request::from_parts(parts, read(body))),
            },
            Poll::Ready(Err(e)) => BufferState::Failed {
                error: Some(unreadable(e)),
            },
            Poll::Pending => {
                // Take the service that was made ready; leave a clone behind.
                let clone = self.inner.clone();
                BufferState::Reading {
                    collect,
                    parts: Some(parts),
                    service: Some(std::mem::replace(&mut self.inner, clone)),
                }
            }
        };
        ReplayBufferFuture { state }
    }
}

/// The body read, said at `DEBUG` when it was over the limit.
fn read<B>(body: BufferedBody<B>) -> BufferedBody<B> {
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

pin_project! {
    /// Response future of [`ReplayBuffer`]: reads the body, then calls the inner service.
    pub struct ReplayBufferFuture<S, B>
    where
        S: Service<http::Request<BufferedBody<B>>>,
    {
        #[pin]
        state: BufferState<S, B>,
    }
}

pin_project! {
    #[project = BufferStateProj]
    enum BufferState<S, B>
    where
        S: Service<http::Request<BufferedBody<B>>>,
    {
        Reading {
            collect: Collect<B>,
            parts: Option<http::request::Parts>,
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
                BufferStateProj::Reading {
                    collect,
                    parts,
                    service,
                } => {
                    let body = match ready!(collect.poll_collect(cx)) {
                        Ok(body) => read(body),
                        Err(e) => return Poll::Ready(Err(unreadable(e))),
                    };
                    let (Some(parts), Some(mut service)) = (parts.take(), service.take()) else {
                        let error: BoxError = "replay buffer polled after completion".into();
                        return Poll::Ready(Err(error.into()));
                    };
                    let future = service.call(http::Request::from_parts(parts, body));
                    this.state.set(BufferState::Calling { future });
                }
                BufferStateProj::Calling { future } => return future.poll(cx),
                BufferStateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(|| {
                        let error: BoxError = "replay buffer polled after completion".into();
                        error.into()
                    })));
                }
            }
        }
    }
}
