use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::Breaker;
use super::future::ResponseFuture;
use super::handle::BreakerHandle;
use super::layer::BreakerLayer;
use crate::failure::Failure;

/// Puts a [`Breaker`] around a service and sends the calls it rejects to a fallback service
/// instead (a second provider), so an open breaker does not stop the traffic.
///
/// While the primary's breaker is open, every call goes to the fallback; once its open duration
/// has passed, the next calls probe the primary again, and when the probes succeed it is closed
/// and used again. The decision is made in `poll_ready`, so no request is cloned: a call goes to
/// exactly one service. The fallback is not guarded by this breaker; give it its own
/// [`BreakerLayer`] if it needs one. Without a failover, a rejection carries the time left until
/// half-open ([`Failure::retry_after`]).
///
/// ```
/// use std::time::Duration;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_backstop::{BoxError, breaker::{BreakerLayer, FailoverLayer}};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let backup = service_fn(|_: &str| async { Ok::<_, BoxError>("sent by the backup provider") });
/// let primary = service_fn(|_: &str| async {
///     Err::<&str, BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
/// });
/// let layer = FailoverLayer::new(BreakerLayer::consecutive_failures(1), backup);
/// let svc = ServiceBuilder::new().layer(layer).service(primary);
/// assert!(svc.clone().oneshot("a").await.is_err()); // trips the primary's breaker
/// assert_eq!(svc.oneshot("b").await.unwrap(), "sent by the backup provider");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct FailoverLayer<F> {
    breaker: BreakerLayer,
    fallback: F,
}

impl<F> FailoverLayer<F> {
    /// Guards the primary with `breaker`; rejected calls go to `fallback`.
    pub fn new(breaker: BreakerLayer, fallback: F) -> Self {
        FailoverLayer { breaker, fallback }
    }

    /// The handle of the primary's breaker.
    pub fn handle(&self) -> BreakerHandle {
        self.breaker.handle()
    }
}

impl<S, F: Clone> Layer<S> for FailoverLayer<F> {
    type Service = Failover<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Failover {
            primary: self.breaker.layer(inner),
            fallback: self.fallback.clone(),
        }
    }
}

/// The service of a [`FailoverLayer`]: a breaker-guarded primary and a fallback.
#[derive(Clone, Debug)]
pub struct Failover<S, F> {
    primary: Breaker<S>,
    fallback: F,
}

impl<S, F> Failover<S, F> {
    /// The handle of the primary's breaker.
    pub fn handle(&self) -> BreakerHandle {
        self.primary.handle()
    }
}

pin_project! {
    /// Response future of [`Failover`]: the primary's, or the fallback's when the primary's
    /// breaker rejected the call.
    #[derive(Debug)]
    pub struct FailoverFuture<P, F> {
        #[pin]
        kind: Route<P, F>,
    }
}

pin_project! {
    #[project = FailoverProj]
    #[derive(Debug)]
    enum Route<P, F> {
        Primary {
            #[pin]
            future: P,
        },
        Fallback {
            #[pin]
            future: F,
        },
    }
}

impl<P, F, R, E> Future for FailoverFuture<P, F>
where
    P: Future<Output = Result<R, Failure<R>>>,
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            FailoverProj::Primary { future } => future.poll(cx),
            FailoverProj::Fallback { future } => future.poll(cx).map_err(Into::into),
        }
    }
}

impl<S, F, Req> Service<Req> for Failover<S, F>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    F: Service<Req, Response = S::Response>,
    F::Error: Into<Failure<S::Response>>,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = FailoverFuture<ResponseFuture<S::Future, S::Response>, F::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.primary.poll_ready(cx) {
            Poll::Ready(Ok(())) if self.primary.will_reject() => {
                self.fallback.poll_ready(cx).map_err(Into::into)
            }
            other => other,
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if self.primary.will_reject() {
            self.primary.forget_decision();
            tracing::debug!(
                breaker = self.primary.handle().name(),
                "failing over to the fallback"
            );
            FailoverFuture {
                kind: Route::Fallback {
                    future: self.fallback.call(req),
                },
            }
        } else {
            FailoverFuture {
                kind: Route::Primary {
                    future: self.primary.call(req),
                },
            }
        }
    }
}
