//! Watch the stack: one vocabulary of [`Event`]s for every layer and the re-send path, the
//! [`Listener`] that sees them (count them in your own metrics, or raise your own alerts), the
//! listeners built on them, and [`Health`]: every breaker of a stack at a glance, for a
//! `/health` or admin route.
//!
//! Set a listener once on the preset ([`BackstopLayer::listener`](crate::BackstopLayer::listener)),
//! which gives it to each of its layers, or on a layer of your own stack:
//! [`RetryPolicy::listener`](crate::retry::RetryPolicy::listener) (attempts, retries, giving up,
//! timeouts), [`Builder::listener`](crate::breaker::Builder::listener) (breaker transitions and
//! rejections), [`DeadLetterLayer::listener`](crate::dead_letter::DeadLetterLayer::listener)
//! (dead letters stored or deferred, store errors),
//! [`Scheduler::listener`](crate::resend::Scheduler::listener) (re-sends, backlog, store
//! errors) and [`Redrive::listener`](crate::resend::Redrive::listener) (re-drives). Every event
//! is also written as a `tracing` event by the layer that has it, listener or not. With the
//! `metrics` feature, `Metrics` is a listener that records them all as metrics; [`Alerts`] is
//! one that raises the alerts of an on-call runbook as they happen. [`Health`] reads the
//! breakers themselves rather than their events: take it from
//! [`BreakerLayer::health`](crate::breaker::BreakerLayer::health) or
//! [`BackstopLayer::health`](crate::BackstopLayer::health).
//!
//! Fields are typed and bounded: classes are the stack's closed set, breaker names are bounded
//! by a keyed layer's bound on keys, outcomes and reasons are fixed words. Ids (`id`) are the
//! only unbounded fields: never use them as a metric label.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use tower_backstop::BackstopLayer;
//! use tower_backstop::observe::Event;
//!
//! let retries = Arc::new(AtomicU64::new(0));
//! let counter = Arc::clone(&retries);
//! let layer = BackstopLayer::http(Duration::from_secs(2)).listener(move |event: &Event<'_>| {
//!     if let Event::RetryScheduled { .. } = event {
//!         counter.fetch_add(1, Ordering::Relaxed);
//!     }
//! });
//! # let _ = layer;
//! ```

mod alerts;
mod event;
mod health;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "prometheus")]
mod prometheus;

pub use self::alerts::{Alert, AlertRules, Alerts};
#[cfg(feature = "dead-letter")]
pub(crate) use self::alerts::{Baseline, per_minute};
pub use self::event::{Event, Listener};
pub(crate) use self::event::{Hook, deliver};
pub use self::health::{BreakerHealth, Health, HealthReport, SpoolHealth};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use self::metrics::{HISTOGRAM_BUCKETS, Metrics};
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use self::prometheus::prometheus_builder;
