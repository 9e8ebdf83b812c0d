use std::time::Duration;

use tower_layer::Layer;

use super::Timeout;

/// Applies [`Timeout`] to a service: each call is bounded by a [`Duration`].
#[derive(Clone, Copy, Debug)]
pub struct TimeoutLayer {
    timeout: Duration,
}

impl TimeoutLayer {
    /// A layer whose services fail each call that takes longer than `timeout` with
    /// [`Elapsed`](super::Elapsed), counted from the inner future's first `Pending` (see
    /// [when the timer starts](super#when-the-timer-starts)). A zero timeout fails every call
    /// that is not ready at its first poll; `Duration::MAX` never fires. Neither is an error:
    /// both have a defined meaning, found in tests (zero: only an answer ready at once passes)
    /// and in a stack whose timeout is set elsewhere (`MAX`), and no call panics on them.
    pub const fn new(timeout: Duration) -> Self {
        TimeoutLayer { timeout }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Timeout::new(inner, self.timeout)
    }
}
