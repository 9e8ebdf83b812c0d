use std::time::Duration;

use tower_layer::Layer;

use super::config::Builder;
use super::state::SharedRef;
use super::{Breaker, BreakerHandle};
use crate::failure::Class;

/// Applies [`Breaker`] to a service, and owns the breaker's state.
///
/// The state is created with the layer and shared by every service it wraps and all their clones:
/// one layer is one breaker (one per endpoint, in a typical client; see
/// [`KeyedBreakerLayer`](super::KeyedBreakerLayer) for one per host). Configure it first, then
/// take a [`handle`](Self::handle): each configuration method builds a fresh breaker.
///
/// Defaults: open after 5 consecutive failures, stay open 30 s, admit 1 probe in half-open and
/// close after it succeeds, count [`Class::TRANSIENT`], [`Class::THROTTLED`] and
/// [`Class::UNKNOWN`] as failures (a permanent 4xx is the caller's fault and does not trip it).
/// [`BreakerLayer::builder`] sets everything else: rate rules over count or time windows,
/// slow calls, growing open durations, several probes, a listener.
#[derive(Clone, Debug)]
pub struct BreakerLayer {
    shared: SharedRef,
}

impl Default for BreakerLayer {
    fn default() -> Self {
        BreakerLayer::new()
    }
}

impl BreakerLayer {
    /// A breaker with the defaults above.
    pub fn new() -> Self {
        BreakerLayer::from_builder(Builder::default())
    }

    /// A [`Builder`] for every setting; [`Builder::build`] checks it.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn from_builder(builder: Builder) -> Self {
        BreakerLayer {
            shared: SharedRef::Counted(builder.shared()),
        }
    }

    /// A breaker that opens after `n` consecutive failures (a count of failed calls; values below
    /// 1 are raised to 1), with the other defaults.
    pub fn consecutive_failures(n: u32) -> Self {
        BreakerLayer::from_builder(Builder::default().consecutive_failures(n.max(1)))
    }

    fn with(self, f: impl FnOnce(Builder) -> Builder) -> Self {
        BreakerLayer::from_builder(f(self.shared.config.clone()))
    }

    /// How long the breaker stays open before it half-opens (a fixed duration).
    pub fn open_for(self, duration: Duration) -> Self {
        self.with(|b| b.open_for(duration))
    }

    /// The classes that count as failures; any other failure is ignored by the breaker.
    pub fn failure_classes(self, classes: &[Class]) -> Self {
        self.with(|b| b.failure_classes(classes))
    }

    /// A name for the breaker's `tracing` events (the provider or host it guards).
    pub fn name(self, name: &str) -> Self {
        self.with(|b| b.name(name))
    }

    /// The configuration this layer was built from, to derive another breaker from it.
    pub fn to_builder(&self) -> Builder {
        self.shared.config.clone()
    }

    /// A handle to read this breaker's state and counters, and to control it.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            shared: self.shared.clone(),
        }
    }

    /// Makes this breaker's state live until the process ends, so that each call skips the
    /// reference count: the services and response futures reach the state through a
    /// `&'static` reference instead of cloning and dropping an `Arc` (two atomic read-modify-write
    /// operations per call, on a cache line all threads share; `benches/breaker.rs`).
    ///
    /// The state (a few hundred bytes, plus a count window's byte per call) is then never freed:
    /// use it for breakers built once, at startup, not for layers built per request. Handles
    /// taken before or after keep pointing at the same breaker.
    pub fn into_static(self) -> Self {
        BreakerLayer {
            shared: self.shared.leak(),
        }
    }

    pub(crate) fn shared(&self) -> &SharedRef {
        &self.shared
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::Breaker);
        Breaker::new(inner, self.shared.clone())
    }
}
