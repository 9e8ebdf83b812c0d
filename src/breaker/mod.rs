//! A circuit breaker: after repeated failures of the provider, fail fast instead of calling it.
//!
//! [`BreakerLayer`] counts the failures of the classes that blame the provider
//! ([`Class::TRANSIENT`](crate::Class::TRANSIENT) and [`Class::UNKNOWN`](crate::Class::UNKNOWN) by default; a throttled answer lowers the send rate instead, a permanent 4xx is
//! the caller's fault, a call whose future is dropped is cancelled, and a call refused in this
//! process by tower's `LoadShed` below ([`Code::Overloaded`](crate::Code::Overloaded)) never
//! reached the provider: none of them counts). It trips
//! on consecutive failures, or on the failure rate or slow-call rate over a count-based window
//! (the last N calls) or a time-based window (N buckets of a fixed width) once the window holds a
//! minimum number of calls ([`Builder`]). Once tripped it is open: every call is rejected at once
//! with a [`Failure`] of class [`Class::CIRCUIT_OPEN`](crate::Class::CIRCUIT_OPEN) whose [`retry_after`](Failure::retry_after)
//! is the time left until half-open. After the open duration (fixed, or doubling with each
//! consecutive trip up to a cap: [`Builder::open_doubling`]) it half-opens, on time whether a
//! call comes or not (a task on the tokio runtime watches each open period, as resilience4j's
//! `automaticTransitionFromOpenToHalfOpenEnabled` does), and admits a fixed number of
//! probes at a time; every other call is rejected. It closes after a configured number of
//! successful probes; any failed probe re-opens it and restarts the timer; a probe that is dropped
//! or ends in a class that does not count gives its permit back. Every period has a generation
//! number, so an outcome from an earlier period (a slow call started before the last trip) never
//! changes a later one. This is the pattern of Nygard's *Release It!*, with the rules and defaults
//! of resilience4j's `CircuitBreaker`.
//!
//! The state lives in atomics; the closed-state success path takes no lock, reads no clock when
//! no time-based rule needs it, and allocates nothing. Each call's future holds a reference to
//! its breaker (an `Arc` clone, so that the outcome is recorded even if the service is dropped
//! first). There is no process-wide state: each breaker is its own `Arc`. An open breaker
//! answers `Ready(Ok)` from `poll_ready` without waiting for the inner service, and its future
//! fails at once, like tower's `load_shed`. The rejection's source is an [`OpenError`] naming the
//! breaker and the time left until it half-opens.
//!
//! A provider that is up but overloaded is not failing: while the breaker stays closed, a
//! throttled answer lowers its adaptive send rate ([`AdaptiveRate`]), and a throttled answer or
//! a 503 turns on its adaptive concurrency limit ([`AdaptiveConcurrency`]), which bounds the
//! calls in flight to what the provider takes. Both are on by default, cost one atomic load a
//! call until the provider first says so, and hold a call over them back without sending it
//! ([`Code::Paced`](crate::Code::Paced)), keeping its place in line for a retry layer above.
//!
//! Around it: [`BreakerHandle`] for operators (read, force open, disable, reset: an axum admin
//! route is shown on [`BreakerHandle`]), [`Health`] for a health route listing every breaker,
//! [`Listener`](crate::observe::Listener) for metrics,
//! [`per_host`](BreakerLayer::per_host) and [`keyed_by`](BreakerLayer::keyed_by) for one breaker
//! per host or per key of yours, [`FailoverLayer`](crate::failover::FailoverLayer) to send rejected calls to a second provider, and
//! [`ServerLayer::breaker`](crate::server::ServerLayer::breaker) for an axum server that answers `503` with `Retry-After` itself.
//!
//! Put [`ClassifyLayer`](crate::classify::ClassifyLayer) below it: the breaker reads the class off
//! each [`Failure`] and counts a successful `Ok` response as a success. With a plain `BoxError`
//! service, errors are classified by [`classify_error`](crate::classify::classify_error).
//!
//! # Examples
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
//!
//! Rate rules, a growing open duration and a gentler half-open:
//!
//! ```
//! use std::time::Duration;
//! use tower_backstop::breaker::BreakerLayer;
//!
//! let layer = BreakerLayer::builder()
//!     .name("payments")
//!     // 50 % of the last 20 calls failed, once 10 calls were seen...
//!     .failure_rate(0.5)
//!     .count_window(20)
//!     .minimum_calls(10)
//!     // ...or 80 % of them took longer than 2 s.
//!     .slow_calls(Duration::from_secs(2), 0.8)
//!     // Open 1 s, 2 s, 4 s, ... up to 60 s, spread by up to +10 %.
//!     .open_doubling(Duration::from_secs(1), Duration::from_secs(60))
//!     .open_jitter(0.1)
//!     // 3 probes at a time; 5 successes close it; re-open if still half-open after 30 s.
//!     .half_open_probes(3)
//!     .close_after(5)
//!     .max_half_open(Duration::from_secs(30))
//!     .build()
//!     .expect("a valid configuration");
//! # let _ = layer;
//! ```
//!
//! One breaker per host, for a client that calls many (each one named after its `host:port`):
//!
//! ```
//! use tower_backstop::breaker::{BreakerLayer, State};
//!
//! let layer = BreakerLayer::builder()
//!     .consecutive_failures(3)
//!     .per_host()
//!     .max_keys(16)
//!     .build()
//!     .expect("a valid configuration");
//! // Keys appear as requests come; requests without a host share the `unkeyed` breaker.
//! assert!(layer.keys().is_empty());
//! assert!(layer.handle_for("api.mail.test:443").is_none());
//! assert_eq!(layer.unkeyed().state(), State::Closed);
//! ```
//!
//! A bad setting is an error from [`build`](Builder::build), a [`BuildError`](crate::BuildError)
//! that names it and its value:
//!
//! ```
//! use tower_backstop::breaker::BreakerLayer;
//!
//! let err = BreakerLayer::builder().failure_rate(1.5).build().unwrap_err();
//! assert_eq!(err.setting(), "failure_rate");
//! assert_eq!(
//!     err.to_string(),
//!     "invalid configuration: `failure_rate` is 1.5: the failure rate must be within (0.0, 1.0]"
//! );
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::failure::Failure;

mod admission;
mod builder;
#[cfg(feature = "serde")]
pub(crate) mod config;
#[cfg(feature = "dead-letter")]
mod fleet;
mod future;
mod handle;
pub(crate) mod keyed;
mod layer;
mod limit;
pub(crate) mod open;
mod rate;
mod slot;
mod state;
mod sync;
mod tunable;
mod window;

pub(crate) use self::admission::{Admission, Ticket};
pub use self::builder::Builder;
#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
pub use self::fleet::{Fleet, FleetHandle, FleetOverride, FleetStatus, OverrideAction};
pub use self::future::ResponseFuture;
pub use self::handle::BreakerHandle;
pub use self::keyed::{Authority, KeyOf, PerKey};
pub use self::layer::BreakerLayer;
pub(crate) use self::limit::held_by;
pub use self::limit::{AdaptiveConcurrency, LimitedError};
pub use self::open::OpenError;
pub use self::rate::{AdaptiveRate, PacedError};
pub(crate) use self::slot::SendSlot;
pub use self::state::{MAX_PROBES, Stats};
pub use crate::status::State;
// `tower_backstop::breaker::{Health, HealthReport, BreakerHealth}` before they moved to
// `observe`: kept so that code written against that path still compiles.
#[doc(hidden)]
pub use crate::observe::{BreakerHealth, Health, HealthReport};

use self::future::Guard;
use self::keyed::{Key, Registry};
use self::state::{Decision, Shared};

/// Fails fast while the provider is failing; see the [module docs](self).
///
/// `K` is `()` (one breaker, the default) or [`PerKey`] (one per key of the request), as the
/// [`BreakerLayer`] that made it.
pub struct Breaker<S, K = ()> {
    inner: S,
    /// The breaker (unkeyed, `K = ()`), or the one of requests without a key (keyed).
    shared: Arc<Shared>,
    /// The breakers per key: `Some` exactly when keyed.
    keys: Option<Arc<Registry<K>>>,
    // What poll_ready decided: a permit to call, or a rejection (one breaker only: a keyed
    // breaker knows its key at `call`).
    decision: Decision,
}

impl<S, K> Breaker<S, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, keys: Option<Arc<Registry<K>>>) -> Self {
        Breaker {
            inner,
            shared,
            keys,
            decision: Decision::NONE,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Breaker<S> {
    /// A handle to this breaker's state and counters.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.shared))
    }

    /// Whether the last `poll_ready` decided to reject the next call.
    pub(crate) fn will_reject(&self) -> bool {
        self.decision.is_rejected()
    }

    /// Drops a rejection decided by `poll_ready` (the call went elsewhere).
    pub(crate) fn forget_decision(&mut self) {
        if self.decision.is_rejected() {
            self.decision = Decision::NONE;
        }
    }
}

impl<S: Clone, K> Clone for Breaker<S, K> {
    fn clone(&self) -> Self {
        // A clone starts without a decision: a permit belongs to the service that was polled.
        Breaker::new(
            self.inner.clone(),
            Arc::clone(&self.shared),
            self.keys.clone(),
        )
    }
}

impl<S, K> Drop for Breaker<S, K> {
    fn drop(&mut self) {
        // A permit taken by poll_ready and never used goes back.
        if let Some(Ok(permit)) = self.decision.take() {
            self.shared.cancel(permit);
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Breaker<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Breaker");
        d.field("inner", &self.inner);
        match &self.keys {
            None => d.field("state", &self.shared.state()),
            Some(keys) => d.field("keys", &keys.keys()),
        };
        d.finish()
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

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.decision.is_none() {
            // Decided here, even when closed, so that `Failover` knows in `poll_ready` where
            // the call will go.
            self.decision = Decision::new(self.shared.admit());
        }
        if self.decision.is_rejected() {
            // Open: ready at once, the call fails without touching the inner service.
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let decision = self.decision.take().unwrap_or_else(|| self.shared.admit());
        match decision {
            Ok(permit) => {
                if let Err(slot) = self.shared.pace() {
                    return ResponseFuture::paced(future::held_back(&self.shared, permit, slot));
                }
                let flight = match self.shared.fly() {
                    Ok(flight) => flight,
                    Err(held) => {
                        return ResponseFuture::paced(limit::held_back(&self.shared, permit, held));
                    }
                };
                let guard = Guard::new(&self.shared, permit).with_flight(flight);
                ResponseFuture::called(self.inner.call(req), guard)
            }
            Err(r) => ResponseFuture::rejected(r, &self.shared.open_errors),
        }
    }
}

impl<S, F, Req> Service<Req> for Breaker<S, PerKey<F>>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    F: KeyOf<Req>,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S::Future, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = match &self.keys {
            Some(keys) => {
                let mut key = Key::new();
                if keys.key_of().key(&req, &mut key) && !key.is_empty() {
                    keys.get(key.as_str())
                } else {
                    keys.keyless_call();
                    Arc::clone(&self.shared)
                }
            }
            None => Arc::clone(&self.shared),
        };
        match shared.admit() {
            Ok(permit) => {
                if let Err(slot) = shared.pace() {
                    return ResponseFuture::paced(future::held_back(&shared, permit, slot));
                }
                let flight = match shared.fly() {
                    Ok(flight) => flight,
                    Err(held) => {
                        return ResponseFuture::paced(limit::held_back(&shared, permit, held));
                    }
                };
                let guard = Guard::owned(shared, permit).with_flight(flight);
                ResponseFuture::called(self.inner.call(req), guard)
            }
            Err(r) => ResponseFuture::rejected(r, &shared.open_errors),
        }
    }
}
