//! [`BreakerHandle`]: read and control one breaker.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::state::{Shared, Stats};
use crate::status::State;

/// A cloneable handle to a breaker: its state and counters, for metrics, and operator control.
///
/// Every method is a few atomic operations; the handle is `Send + Sync` and cheap to clone, so it
/// fits an axum admin route:
///
/// ```
/// use axum::{Router, extract::State, routing::{get, post}};
/// use tower_backstop::breaker::{BreakerHandle, BreakerLayer};
///
/// async fn show(State(breaker): State<BreakerHandle>) -> String {
///     let stats = breaker.stats();
///     format!("{} (opened {} times, {} rejected)", breaker.state(), stats.opened, stats.rejected)
/// }
/// async fn force_open(State(breaker): State<BreakerHandle>) { breaker.force_open() }
/// async fn disable(State(breaker): State<BreakerHandle>) { breaker.disable() }
/// async fn reset(State(breaker): State<BreakerHandle>) { breaker.reset() }
///
/// let layer = BreakerLayer::new().name("mail-provider");
/// let admin: Router = Router::new()
///     .route("/admin/breaker", get(show))
///     .route("/admin/breaker/force-open", post(force_open))
///     .route("/admin/breaker/disable", post(disable))
///     .route("/admin/breaker/reset", post(reset))
///     .with_state(layer.handle());
/// # let _ = admin;
/// ```
#[derive(Clone)]
pub struct BreakerHandle {
    shared: Arc<Shared>,
}

impl BreakerHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        BreakerHandle { shared }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.shared.state()
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Counters: transitions and rejections since the breaker was built, and the current window.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The time left until half-open: `Some` when open (the rest of the open duration) or
    /// half-open (the next open duration, the longest a rejected caller may wait); `None` when
    /// closed, disabled or forced open.
    pub fn retry_after(&self) -> Option<Duration> {
        self.shared.retry_after()
    }

    /// The adaptive send rate now, in requests a second, while the provider's throttled
    /// answers limit it; `None` while not limited, or without an adaptive rate
    /// ([`AdaptiveRate`](super::AdaptiveRate)).
    pub fn send_rate(&self) -> Option<f64> {
        self.shared.send_rate().map(|(rate, _)| rate)
    }

    /// While limited: the rate the provider took when the limit began (before its first
    /// throttled answer or over the limit's first measure, the larger): its peak, in requests a
    /// second.
    pub fn send_rate_peak(&self) -> Option<f64> {
        self.shared.send_rate().map(|(_, peak)| peak)
    }

    /// The adaptive concurrency limit now, in calls in flight at once, while the provider's
    /// overload answers limit it; `None` while not limited (and during the first round trip
    /// after the first overload answer, which measures it), or without an adaptive
    /// concurrency limit ([`AdaptiveConcurrency`](super::AdaptiveConcurrency)).
    pub fn concurrency_limit(&self) -> Option<u32> {
        self.shared.concurrency_limit().map(|(limit, _)| limit)
    }

    /// While the concurrency is limited: the calls counted in flight now (sent since the limit
    /// turned on, and not yet answered).
    pub fn in_flight(&self) -> Option<u32> {
        self.shared
            .concurrency_limit()
            .map(|(_, in_flight)| in_flight)
    }

    /// Opens the breaker until [`reset`](Self::reset): every call is rejected, with no
    /// `retry_after`. Outcomes of calls already in flight are ignored.
    pub fn force_open(&self) {
        self.shared.force_open()
    }

    /// Disables the breaker until [`reset`](Self::reset): every call goes through and nothing is
    /// counted.
    pub fn disable(&self) {
        self.shared.disable()
    }

    /// Closes the breaker with empty counters and a fresh open-duration series, from any state.
    /// Outcomes of calls already in flight are ignored.
    pub fn reset(&self) {
        self.shared.reset()
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
