use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header::RETRY_AFTER};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::BreakerHandle;
use crate::breaker::BreakerLayer;
use crate::breaker::future::Guard;
use crate::breaker::state::{Outcome, Permit, Rejection, Shared};
use crate::classify::{GrpcClassifier, HttpClassifier};

/// The server flavour of the breaker, for an axum (or any `http`) server protecting itself: the
/// breaker counts the server's own failed responses, and while it is open the server answers
/// `503 Service Unavailable` with `Retry-After` at once instead of piling up work.
///
/// Responses are classified by [`HttpClassifier`] (a 500 or a 504 from
/// [`ServerTimeoutLayer`](crate::server::ServerTimeoutLayer) counts, a 404 does not). The
/// `Retry-After` value is the time left until half-open in whole seconds, rounded up (RFC 9110
/// §10.2.3, delay-seconds); it is left out when the breaker was forced open. The inner service
/// must be infallible, and so is this one, so it works with axum's `Router::layer`:
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tower_backstop::breaker::BreakerLayer;
/// use tower_backstop::server::ServerBreakerLayer;
/// use tower_backstop::server::ServerTimeoutLayer;
///
/// let breaker = ServerBreakerLayer::new(BreakerLayer::consecutive_failures(5));
/// let app: Router = Router::new()
///     .route("/report", get(|| async { "done" }))
///     // The last layer is the outermost: the breaker sees the timeout's 504s.
///     .layer(ServerTimeoutLayer::new(Duration::from_secs(10)))
///     .layer(breaker);
/// # let _ = app;
/// ```
#[derive(Clone, Debug)]
pub struct ServerBreakerLayer {
    breaker: BreakerLayer,
    classifier: HttpClassifier,
    grpc: Option<GrpcClassifier>,
}

impl ServerBreakerLayer {
    /// Answers 503 while `breaker` is open.
    pub fn new(breaker: BreakerLayer) -> Self {
        ServerBreakerLayer {
            breaker,
            classifier: HttpClassifier::new(),
            grpc: None,
        }
    }

    /// The gRPC flavour, for `tonic::transport::Server::builder().layer(...)`: the breaker counts
    /// the handlers' trailers-only error statuses by [`GrpcClassifier::new`]'s mapping
    /// (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `UNKNOWN`, `INTERNAL`, `DEADLINE_EXCEEDED` from
    /// [`ServerTimeoutLayer::grpc`](crate::server::ServerTimeoutLayer::grpc)…; a status sent in
    /// trailers after a message is not seen), and while it is open the server answers a
    /// trailers-only `UNAVAILABLE` at once, with `grpc-retry-pushback-ms` set to the time left
    /// until half-open (gRFC A6; left out when the breaker was forced open).
    pub fn grpc(breaker: BreakerLayer) -> Self {
        ServerBreakerLayer {
            breaker,
            classifier: HttpClassifier::new(),
            grpc: Some(GrpcClassifier::new()),
        }
    }

    /// Classifies responses with `classifier` instead of the default [`HttpClassifier`].
    pub fn classifier(mut self, classifier: HttpClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// The breaker's handle.
    pub fn handle(&self) -> BreakerHandle {
        self.breaker.handle()
    }
}

impl<S> Layer<S> for ServerBreakerLayer {
    type Service = ServerBreaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerBreaker {
            inner,
            shared: self.breaker.shared(),
            classifier: self.classifier.clone(),
            grpc: self.grpc.clone(),
            decision: None,
        }
    }
}

/// The service of a [`ServerBreakerLayer`].
#[derive(Debug)]
pub struct ServerBreaker<S> {
    inner: S,
    shared: Arc<Shared>,
    // Cloned per call: free with the default mapping, one `Arc` with overrides.
    classifier: HttpClassifier,
    grpc: Option<GrpcClassifier>,
    decision: Option<Result<Permit, Rejection>>,
}

impl<S: Clone> Clone for ServerBreaker<S> {
    fn clone(&self) -> Self {
        ServerBreaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            classifier: self.classifier.clone(),
            grpc: self.grpc.clone(),
            decision: None,
        }
    }
}

impl<S> Drop for ServerBreaker<S> {
    fn drop(&mut self) {
        if let Some(Ok(permit)) = self.decision.take() {
            self.shared.cancel(permit);
        }
    }
}

/// The `Retry-After` delay-seconds for `left`, rounded up so that a client never comes back
/// before the breaker half-opens.
pub(crate) fn retry_after_secs(left: Duration) -> u64 {
    let secs = left.as_secs();
    if left.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

impl<S, Req, B> Service<Req> for ServerBreaker<S>
where
    S: Service<Req, Response = Response<B>, Error = Infallible>,
    B: Default,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ServerBreakerFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        let decision = self.decision.get_or_insert_with(|| self.shared.admit());
        if decision.is_err() {
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.decision.take().unwrap_or_else(|| self.shared.admit()) {
            Ok(permit) => ServerBreakerFuture {
                kind: ServerKind::Called {
                    future: self.inner.call(req),
                    guard: Guard::new(&self.shared, permit),
                    classifier: self.classifier.clone(),
                    grpc: self.grpc.clone(),
                },
            },
            Err(rejection) => ServerBreakerFuture {
                kind: ServerKind::Rejected {
                    retry_after: rejection.retry_after(),
                    grpc: self.grpc.is_some(),
                },
            },
        }
    }
}

pin_project! {
    /// Response future of [`ServerBreaker`]: the handler's response, or a ready 503.
    #[derive(Debug)]
    pub struct ServerBreakerFuture<F> {
        #[pin]
        kind: ServerKind<F>,
    }
}

pin_project! {
    #[project = ServerProj]
    #[derive(Debug)]
    enum ServerKind<F> {
        Called {
            #[pin]
            future: F,
            guard: Guard,
            classifier: HttpClassifier,
            grpc: Option<GrpcClassifier>,
        },
        Rejected {
            retry_after: Option<Duration>,
            grpc: bool,
        },
    }
}

impl<F, B> Future for ServerBreakerFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: Default,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            ServerProj::Called {
                future,
                guard,
                classifier,
                grpc,
            } => {
                let Ok(response) = ready!(future.poll(cx));
                let class = match grpc {
                    Some(grpc) if response.status() == StatusCode::OK => grpc
                        .classify_status(response.headers())
                        .map(|verdict| verdict.class),
                    _ => classifier.class_of(response.status()),
                };
                let outcome = match class {
                    None => Outcome::Success,
                    Some(class) => Outcome::Failure(class),
                };
                guard.finish_with(outcome);
                Poll::Ready(Ok(response))
            }
            ServerProj::Rejected { retry_after, grpc } => {
                if *grpc {
                    return Poll::Ready(Ok(crate::grpc_wire::trailers_only(
                        crate::grpc_wire::codes::UNAVAILABLE,
                        "circuit open",
                        *retry_after,
                    )));
                }
                let mut response = Response::new(B::default());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                if let Some(left) = retry_after {
                    response
                        .headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(*left)));
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}
