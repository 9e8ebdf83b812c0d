//! What a breaker shows the world: its [`State`], and the [`Event`]s a [`Listener`] sees.

use std::fmt;
use std::time::Duration;

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls are rejected at once until the open duration has passed.
    Open,
    /// A fixed number of probes is admitted; their outcomes close or re-open the breaker.
    HalfOpen,
    /// Opened by an operator ([`BreakerHandle::force_open`](super::BreakerHandle::force_open)):
    /// every call is rejected until [`reset`](super::BreakerHandle::reset).
    ForcedOpen,
    /// Disabled by an operator ([`BreakerHandle::disable`](super::BreakerHandle::disable)):
    /// every call goes through and nothing is counted until
    /// [`reset`](super::BreakerHandle::reset).
    Disabled,
}

impl State {
    /// A lower-case name: `closed`, `open`, `half_open`, `forced_open`, `disabled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
            State::ForcedOpen => "forced_open",
            State::Disabled => "disabled",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something a breaker did: a state transition or a rejection, handed to its [`Listener`].
///
/// Every event is also emitted as a `tracing` event (transitions at `INFO`, openings at `WARN`,
/// rejections at `DEBUG`) with the breaker's name as the `breaker` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// The breaker moved from one state to another.
    Transition {
        /// The breaker's name (or the key of a keyed breaker).
        breaker: &'a str,
        /// The state before.
        from: State,
        /// The state after.
        to: State,
        /// Why, in a few lower-case words ("failure rate", "probe failed", "forced open", …).
        reason: &'static str,
    },
    /// A call was rejected without reaching the inner service.
    Rejected {
        /// The breaker's name (or the key of a keyed breaker).
        breaker: &'a str,
        /// The state that rejected it: open, half-open with every probe permit taken, or
        /// forced open.
        state: State,
        /// The time left until half-open, as given to the caller; `None` when forced open.
        retry_after: Option<Duration>,
    },
}

/// A hook that sees every [`Event`] of a breaker, to count them in the user's own metrics.
///
/// Implemented for `()` (does nothing, the default) and for closures `Fn(&Event<'_>)`, like
/// tower-http's `OnFailure`. It is called on the thread that caused the event, inside the call
/// that caused it: keep it short and do not block.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tower_backstop::breaker::{BreakerLayer, Event};
///
/// let rejected = Arc::new(AtomicU64::new(0));
/// let counter = rejected.clone();
/// let layer = BreakerLayer::builder()
///     .listener(move |event: &Event<'_>| {
///         if let Event::Rejected { .. } = event {
///             counter.fetch_add(1, Ordering::Relaxed);
///         }
///     })
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub trait Listener: Send + Sync + 'static {
    /// Called once per event.
    fn on_event(&self, event: &Event<'_>);
}

impl Listener for () {
    #[inline]
    fn on_event(&self, _: &Event<'_>) {}
}

impl<F> Listener for F
where
    F: Fn(&Event<'_>) + Send + Sync + 'static,
{
    fn on_event(&self, event: &Event<'_>) {
        self(event)
    }
}
