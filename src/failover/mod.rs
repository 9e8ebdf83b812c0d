//! Failover: a breaker around a primary service, and a fallback service (a second provider)
//! that takes the calls the breaker rejects, so an open breaker does not stop the traffic.
//!
//! [`FailoverLayer`] puts a [`Breaker`] around the service it wraps (the primary). While the
//! primary's breaker is open, every call goes to the fallback; once its open duration has
//! passed, the next calls probe the primary again, and when the probes succeed it is closed and
//! used again. The decision is made in `poll_ready`, so no request is cloned: a call goes to
//! exactly one service. The fallback is not guarded by this breaker; give it its own
//! [`BreakerLayer`] if it needs one. Without a failover, a rejection carries the time left until
//! half-open ([`Failure::retry_after`]).
//!
//! Both services answer the same response type; their errors become a [`Failure`] (the
//! primary's through its breaker, the fallback's by `Into<Failure>`), so a [`RetryLayer`] or
//! [`DeadLetterLayer`] above sees one kind of failure whichever provider answered.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::BoxError;
//! use tower_backstop::breaker::BreakerLayer;
//! use tower_backstop::failover::FailoverLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let backup = service_fn(|_: &str| async { Ok::<_, BoxError>("sent by the backup provider") });
//!
//! // With the breaker's defaults: 5 consecutive failures, open for 30 s.
//! let _layer = FailoverLayer::new(BreakerLayer::new(), backup);
//!
//! // Customised: the primary's breaker opens at its first failure.
//! let primary = service_fn(|_: &str| async {
//!     Err::<&str, BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
//! });
//! let layer = FailoverLayer::new(
//!     BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(10)),
//!     backup,
//! );
//! let handle = layer.handle();
//! let svc = ServiceBuilder::new().layer(layer).service(primary);
//! assert!(svc.clone().oneshot("a").await.is_err()); // trips the primary's breaker
//! assert_eq!(svc.oneshot("b").await.unwrap(), "sent by the backup provider");
//! assert_eq!(handle.retry_after(), Some(Duration::from_secs(10)));
//! # }
//! ```
//!
//! [`BreakerLayer`]: crate::breaker::BreakerLayer
//! [`RetryLayer`]: crate::retry::RetryLayer
//! [`DeadLetterLayer`]: crate::dead_letter::DeadLetterLayer

use std::task::{Context, Poll};

use tower_service::Service;

use crate::breaker::{Breaker, BreakerHandle, ResponseFuture};
use crate::failure::Failure;

mod future;
mod layer;

pub use self::future::FailoverFuture;
pub use self::layer::FailoverLayer;

/// The service of a [`FailoverLayer`]: a breaker-guarded primary and a fallback; see the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct Failover<S, F> {
    primary: Breaker<S>,
    fallback: F,
}

impl<S, F> Failover<S, F> {
    pub(crate) fn new(primary: Breaker<S>, fallback: F) -> Self {
        Failover { primary, fallback }
    }

    /// The handle of the primary's breaker.
    pub fn handle(&self) -> BreakerHandle {
        self.primary.handle()
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
            FailoverFuture::fallback(self.fallback.call(req))
        } else {
            FailoverFuture::primary(self.primary.call(req))
        }
    }
}
