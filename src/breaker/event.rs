//! What a breaker shows the world: its [`State`].

use std::fmt;

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
