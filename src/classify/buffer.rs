//! Reading a response body before classification, for classifiers that need it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::grpc::Trailers;
use crate::failure::BoxError;
use crate::request::{BufferedBody, Collect};

/// Applies [`BufferResponse`]: reads each response body into memory, up to `limit` bytes,
/// before the classifier above sees the response.
///
/// Put it **below** [`ClassifyLayer`](super::ClassifyLayer) when the classifier needs more than
/// the status and headers (built above a `ClassifyLayer`, it says so in a `tracing` warning):
///
/// - a provider's own error code in a JSON body: the classifier reads
///   [`BufferedBody::bytes`] (see [`ClassifyLayer`](super::ClassifyLayer)'s docs for a
///   closure classifier);
/// - a gRPC status sent in trailers at the end of the body: [`BufferedBody::trailers`], which
///   [`GrpcClassifier`](super::GrpcClassifier) reads too (the trailers are also kept in the
///   response's extensions for it, so that it classifies any body type).
///
/// The trade-off: the whole response is read before the caller sees it (no streaming; memory up
/// to `limit` per response in flight), so use it for unary calls and small JSON answers, not for
/// downloads or server streams. A body longer than `limit` is passed on in full, unclassified
/// beyond its headers. The body type must be `Unpin` (hyper's `Incoming`, tonic's `Body` are).
/// A body that fails while being read becomes an error (classified by
/// [`classify_error`](super::classify_error)).
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
    /// Response future of [`BufferResponse`].
    pub struct BufferResponseFuture<F, B> {
        #[pin]
        future: F,
        reading: Option<(http::response::Parts, Collect<B>)>,
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
            if let Some((_, collect)) = this.reading.as_mut() {
                let body = ready!(collect.poll_collect(cx)).map_err(Into::into)?;
                let Some((mut parts, _)) = this.reading.take() else {
                    return Poll::Ready(Err("response buffer lost its parts".into()));
                };
                if let Some(trailers) = body.trailers() {
                    parts.extensions.insert(Trailers(trailers.clone()));
                }
                return Poll::Ready(Ok(http::Response::from_parts(parts, body)));
            }
            let response = ready!(this.future.as_mut().poll(cx)).map_err(Into::into)?;
            let (parts, body) = response.into_parts();
            *this.reading = Some((parts, Collect::new(body, *this.limit)));
        }
    }
}
