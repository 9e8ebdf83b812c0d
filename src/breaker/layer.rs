use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::state::Shared;
use super::{Breaker, BreakerHandle};
use crate::failure::Class;

/// Applies [`Breaker`] to a service, and owns the breaker's state.
///
/// The state is created with the layer and shared by every service it wraps and all their clones:
/// one layer is one breaker (one per endpoint, in a typical client). Configure it first, then take
/// a [`handle`](Self::handle): each configuration method builds a fresh breaker.
///
/// Defaults: open after 5 consecutive failures, stay open 30 s, count
/// [`Class::TRANSIENT`], [`Class::THROTTLED`] and [`Class::UNKNOWN`] as failures (a permanent 4xx
/// is the caller's fault and does not trip it).
#[derive(Clone, Debug)]
pub struct BreakerLayer {
    shared: Arc<Shared>,
}

const DEFAULT_CLASSES: [Class; 3] = [Class::TRANSIENT, Class::THROTTLED, Class::UNKNOWN];

impl Default for BreakerLayer {
    fn default() -> Self {
        BreakerLayer::new()
    }
}

impl BreakerLayer {
    /// A breaker with the defaults above.
    pub fn new() -> Self {
        BreakerLayer {
            shared: Arc::new(Shared::new(
                "breaker",
                5,
                Duration::from_secs(30),
                DEFAULT_CLASSES.into(),
            )),
        }
    }

    /// A breaker that opens after `n` consecutive failures (a count of failed calls; values below
    /// 1 are raised to 1), with the other defaults.
    pub fn consecutive_failures(n: u32) -> Self {
        BreakerLayer::new().with(|s| Shared::new(s.name, n, s.open_for(), s.classes()))
    }

    fn with(self, f: impl FnOnce(&Shared) -> Shared) -> Self {
        BreakerLayer {
            shared: Arc::new(f(&self.shared)),
        }
    }

    /// How long the breaker stays open before it half-opens and admits one probe.
    pub fn open_for(self, duration: Duration) -> Self {
        self.with(|s| Shared::new(s.name, s.threshold(), duration, s.classes()))
    }

    /// The classes that count as failures; any other failure is ignored by the breaker.
    pub fn failure_classes(self, classes: &[Class]) -> Self {
        self.with(|s| Shared::new(s.name, s.threshold(), s.open_for(), classes.into()))
    }

    /// A name for the breaker's `tracing` events (the provider or host it guards).
    pub fn name(self, name: &'static str) -> Self {
        self.with(|s| Shared::new(name, s.threshold(), s.open_for(), s.classes()))
    }

    /// A handle to read this breaker's state and counters.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Breaker::new(inner, Arc::clone(&self.shared))
    }
}
