//! A circuit breaker: after repeated failures of the provider, fail fast instead of calling it.
//!
//! [`BreakerLayer`] counts consecutive failures of the classes that blame the provider
//! ([`Class::TRANSIENT`], [`Class::THROTTLED`], [`Class::UNKNOWN`] by default; a permanent 4xx is
//! the caller's fault and does not count). After the threshold it opens: every call is rejected at
//! once with a [`Failure`] of class [`Class::CIRCUIT_OPEN`] whose
//! [`retry_after`](Failure::retry_after) is the time left until half-open. After the open duration
//! it half-opens and admits exactly one probe: a successful probe closes it, a failed one re-opens
//! it and restarts the timer, and a probe whose future is dropped (or that ends in a class that
//! does not count) gives its permit back. This is the pattern of Nygard's *Release It!* and the
//! Google SRE book's "handling overload" chapter.
//!
//! The state lives in atomics; the closed-state success path takes no lock, reads no clock and
//! allocates nothing. An open breaker answers `Ready(Ok)` from `poll_ready` without waiting for
//! the inner service, and its future fails at once, like tower's `load_shed`.
//!
//! Put [`ClassifyLayer`](crate::classify::ClassifyLayer) below it: the breaker reads the class off
//! each [`Failure`] and counts a successful `Ok` response as a success. With a plain `BoxError`
//! service, errors are classified by [`classify_error`](crate::classify::classify_error).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::{Class, breaker::{BreakerLayer, State}, BoxError};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // Defaults: 5 consecutive failures, open for 30 s.
//! let _default = BreakerLayer::new();
//!
//! // Customised:
//! let layer = BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(10));
//! let handle = layer.handle();
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_: ()| async {
//!     Err::<(), BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
//! }));
//! for _ in 0..2 {
//!     let _ = svc.clone().oneshot(()).await;
//! }
//! assert_eq!(handle.state(), State::Open);
//! let rejected = svc.oneshot(()).await.unwrap_err();
//! assert_eq!(rejected.class(), Class::CIRCUIT_OPEN);
//! assert_eq!(rejected.retry_after(), Some(Duration::from_secs(10)));
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::failure::{Class, Code, Failure};

mod future;
mod layer;
mod state;

pub use self::future::ResponseFuture;
pub use self::layer::BreakerLayer;
pub use self::state::{State, Stats};

use self::state::{Permit, Shared};

/// Fails fast while the provider is failing; see the [module docs](self).
pub struct Breaker<S> {
    inner: S,
    shared: Arc<Shared>,
    // What poll_ready decided: a permit to call, or the time left open.
    decision: Option<Result<Permit, std::time::Duration>>,
}

impl<S> Breaker<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Breaker {
            inner,
            shared,
            decision: None,
        }
    }

    /// A handle to this breaker's state and counters.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Clone> Clone for Breaker<S> {
    fn clone(&self) -> Self {
        // A clone starts without a decision: a permit belongs to the service that was polled.
        Breaker::new(self.inner.clone(), Arc::clone(&self.shared))
    }
}

impl<S: fmt::Debug> fmt::Debug for Breaker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("inner", &self.inner)
            .field("state", &self.shared.state())
            .finish()
    }
}

impl<S, Req> Service<Req> for Breaker<S>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let decision = self.decision.get_or_insert_with(|| self.shared.admit());
        if decision.is_err() {
            // Open: ready at once, the call fails without touching the inner service.
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let decision = self.decision.take().unwrap_or_else(|| self.shared.admit());
        match decision {
            Ok(permit) => ResponseFuture::called(self.inner.call(req), permit),
            Err(left) => ResponseFuture::rejected(
                Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen).with_retry_after(left),
            ),
        }
    }
}

/// A cloneable handle to a breaker's state and counters, for metrics and admin routes.
#[derive(Clone)]
pub struct BreakerHandle {
    shared: Arc<Shared>,
}

impl BreakerHandle {
    /// The current state.
    pub fn state(&self) -> State {
        self.shared.state()
    }

    /// Counters since the breaker was built.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

impl fmt::Debug for BreakerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerHandle")
            .field("name", &self.shared.name)
            .field("state", &self.shared.state())
            .field("stats", &self.shared.stats())
            .finish()
    }
}
