use tower_layer::Layer;

#[cfg(feature = "serde")]
use super::LivePolicy;
use super::{Retry, RetryPolicy};
use crate::build_error::BuildError;

/// Applies [`Retry`] to a service with a [`RetryPolicy`] checked by [`RetryPolicy::build`].
///
/// `RetryLayer::default()` is already safe: 3 attempts, exponential backoff with full jitter
/// capped at 20 s, `Retry-After` honoured up to 60 s, idempotent requests only.
#[derive(Clone, Debug, Default)]
pub struct RetryLayer {
    pub(crate) policy: RetryPolicy,
    /// A reloadable stack's policy (see `BackstopLayer::reloadable`).
    #[cfg(feature = "serde")]
    pub(crate) live: Option<LivePolicy>,
}

impl RetryLayer {
    /// The layer retrying by `policy` (checked).
    pub(crate) fn of(policy: RetryPolicy) -> Self {
        RetryLayer {
            policy,
            #[cfg(feature = "serde")]
            live: None,
        }
    }
}

impl RetryPolicy {
    /// Checks the policy and builds the layer that retries by it.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the setting when:
    ///
    /// - [`max_attempts`](Self::max_attempts) is 0 (`"max_attempts"`), or a class's
    ///   [`ClassPolicy::max_attempts`](super::ClassPolicy::max_attempts) (also set by
    ///   [`retry_at_most`](Self::retry_at_most)) is 0 (`"ClassPolicy::max_attempts"`);
    /// - the [`backoff`](Self::backoff) (`"backoff"`) or a class's
    ///   [`ClassPolicy::backoff`](super::ClassPolicy::backoff) (`"ClassPolicy::backoff"`) is an
    ///   exponential rule from zero, or is capped below its first delay;
    /// - [`max_hint_delay`](Self::max_hint_delay) (`"max_hint_delay"`) or
    ///   [`wait_for_breaker`](Self::wait_for_breaker) (`"wait_for_breaker"`) is above
    ///   [`max_delay`](Self::max_delay), which bounds them, so they would never apply.
    ///
    /// A zero [`max_delay`](Self::max_delay) (every delay deferred or given up) and a zero
    /// [`deadline`](Self::deadline) (only an answer ready at the first poll) are deliberate
    /// choices, not errors.
    ///
    /// ```
    /// use tower_backstop::retry::RetryPolicy;
    ///
    /// let layer = RetryPolicy::new().max_attempts(5).build()?;
    /// # let _ = layer;
    /// let err = RetryPolicy::new().max_attempts(0).build().unwrap_err();
    /// assert_eq!(err.setting(), "max_attempts");
    /// # Ok::<(), tower_backstop::BuildError>(())
    /// ```
    pub fn build(self) -> Result<RetryLayer, BuildError> {
        self.validate()?;
        Ok(RetryLayer::of(self))
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::Retry);
        #[cfg_attr(not(feature = "serde"), allow(unused_mut))]
        let mut retry = Retry::new(inner, self.policy.clone());
        // A reloadable stack's: the policy taken again at the first call after a reload.
        #[cfg(feature = "serde")]
        {
            retry.live = self.live.clone();
        }
        retry
    }
}

// How the order checks find this layer's service below another layer.
impl crate::order::Named for crate::order::Retry {
    fn name() -> &'static str {
        crate::order::named::<Retry<()>>()
    }
}
