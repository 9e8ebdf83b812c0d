use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;

/// The server flavour of the timeout, for axum (or any `http`) server: a handler that takes
/// longer than the timeout is dropped and the client gets `504 Gateway Timeout` (or the status
/// given to [`status`](Self::status)) with an empty body, instead of a hung connection.
///
/// The inner service must be infallible, and so is this one, so it works with axum's
/// `Router::layer` (like tower-http's `TimeoutLayer`, whose default answer is 408). Put a
/// [`ServerBreakerLayer`](crate::server::ServerBreakerLayer) outside it to answer 503 with
/// `Retry-After` while the handlers keep timing out.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use http::StatusCode;
/// use tower_backstop::server::ServerTimeoutLayer;
///
/// let app: Router = Router::new()
///     .route("/slow", get(|| async { "eventually" }))
///     .layer(ServerTimeoutLayer::new(Duration::from_secs(5)));
/// // A 503 instead of a 504:
/// let _layer = ServerTimeoutLayer::new(Duration::from_secs(5))
///     .status(StatusCode::SERVICE_UNAVAILABLE);
/// # let _ = app;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ServerTimeoutLayer {
    timeout: Duration,
    status: StatusCode,
    grpc: bool,
}

impl ServerTimeoutLayer {
    /// Answers `504 Gateway Timeout` when a handler takes longer than `timeout`.
    pub const fn new(timeout: Duration) -> Self {
        ServerTimeoutLayer {
            timeout,
            status: StatusCode::GATEWAY_TIMEOUT,
            grpc: false,
        }
    }

    /// The gRPC flavour, for `tonic::transport::Server::builder().layer(...)`: a handler that
    /// takes longer than `timeout` is dropped and the client gets a trailers-only
    /// `DEADLINE_EXCEEDED` (HTTP 200, `grpc-status: 4` in the headers).
    pub const fn grpc(timeout: Duration) -> Self {
        ServerTimeoutLayer {
            timeout,
            status: StatusCode::OK,
            grpc: true,
        }
    }

    /// The status of the answer when the timeout elapses (504 by default).
    pub const fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }
}

impl<S> Layer<S> for ServerTimeoutLayer {
    type Service = ServerTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTimeout {
            inner,
            timeout: self.timeout,
            status: self.status,
            grpc: self.grpc,
        }
    }
}

/// The service of a [`ServerTimeoutLayer`].
#[derive(Clone, Debug)]
pub struct ServerTimeout<S> {
    inner: S,
    timeout: Duration,
    status: StatusCode,
    grpc: bool,
}

impl<S, Req, B> Service<Req> for ServerTimeout<S>
where
    S: Service<Req, Response = Response<B>, Error = Infallible>,
    B: Default,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ServerTimeoutFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ServerTimeoutFuture {
            response: self.inner.call(req),
            sleep: None,
            timeout: self.timeout,
            status: self.status,
            grpc: self.grpc,
        }
    }
}

pin_project! {
    /// Response future of [`ServerTimeout`]: the handler raced against a timer stored inline.
    ///
    /// Like [`ResponseFuture`](crate::timeout::ResponseFuture), the timer starts at the handler's first
    /// `Pending`: a handler that answers at its first poll never touches the timer or the clock.
    #[derive(Debug)]
    pub struct ServerTimeoutFuture<F> {
        #[pin]
        response: F,
        #[pin]
        sleep: Option<Sleep>,
        timeout: Duration,
        status: StatusCode,
        grpc: bool,
    }
}

impl<F, B> Future for ServerTimeoutFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: Default,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(result) = this.response.poll(cx) {
            return Poll::Ready(result);
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep(*this.timeout)));
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            tracing::debug!(timeout = ?this.timeout, status = this.status.as_u16(), "handler timed out");
            if *this.grpc {
                return Poll::Ready(Ok(crate::grpc_wire::trailers_only(
                    crate::grpc_wire::codes::DEADLINE_EXCEEDED,
                    "handler timed out",
                    None,
                )));
            }
            let mut response = Response::new(B::default());
            *response.status_mut() = *this.status;
            return Poll::Ready(Ok(response));
        }
        Poll::Pending
    }
}
