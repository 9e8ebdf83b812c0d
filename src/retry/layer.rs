use tower_layer::Layer;

use super::{Retry, RetryPolicy};

/// Applies [`Retry`] to a service with a [`RetryPolicy`].
///
/// `RetryLayer::default()` is already safe: 3 attempts, exponential backoff with full jitter
/// capped at 20 s, `Retry-After` honoured up to 60 s, idempotent requests only.
#[derive(Clone, Debug, Default)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// A layer that retries by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryLayer { policy }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::Retry);
        Retry::new(inner, self.policy.clone())
    }
}
