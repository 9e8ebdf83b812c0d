//! [`TimeoutConfig`]: the timeout as data (feature `serde`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::TimeoutLayer;
use crate::settings::humane;

/// A [`TimeoutLayer`] as data: `timeout = "2s"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TimeoutConfig {
    /// Each call's timeout.
    #[serde(with = "humane::required")]
    pub timeout: Duration,
}

impl TimeoutConfig {
    /// A configuration of `timeout`.
    pub const fn new(timeout: Duration) -> Self {
        TimeoutConfig { timeout }
    }

    /// The layer ([`TimeoutLayer::new`]); it cannot fail.
    pub const fn layer(&self) -> TimeoutLayer {
        TimeoutLayer::new(self.timeout)
    }
}
