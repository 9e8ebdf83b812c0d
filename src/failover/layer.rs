use tower_layer::Layer;

use super::Failover;
use crate::breaker::{BreakerHandle, BreakerLayer};

/// Puts a [`Breaker`](crate::breaker::Breaker) around a service and sends the calls it rejects
/// to a fallback service instead (a second provider), so an open breaker does not stop the
/// traffic; see the [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_backstop::{BoxError, breaker::BreakerLayer, failover::FailoverLayer};
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
        Failover::new(self.breaker.layer(inner), self.fallback.clone())
    }
}
