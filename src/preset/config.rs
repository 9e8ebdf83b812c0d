//! [`BackstopConfig`]: the preset's settings as data (feature `serde`): the per-attempt
//! timeout, and the retry and breaker sections, each read by its layer's own configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BackstopLayer, client_rule};
use crate::breaker::BreakerLayer;
use crate::breaker::config::BreakerConfig;
use crate::classify::GrpcClassifier;
use crate::retry::RetryPolicy;
use crate::retry::config::RetryConfig;
use crate::settings::{ConfigError, humane};

/// The settings of a [`BackstopLayer`] for one provider: the per-attempt timeout (required),
/// and the retry policy and breaker rule over the preset's defaults.
///
/// ```toml
/// attempt_timeout = "2s"
///
/// [retry]
/// max_attempts = 5
/// deadline = "30s"
///
/// [breaker]
/// failure_rate = 0.5
/// minimum_calls = 10
/// open_doubling = { base = "1s", cap = "1m" }
/// max_keys = 16
/// ```
///
/// The dead-letter store and the listener are not data (a store is opened, a listener is
/// code): add them to the built layer with [`BackstopLayer::dead_letters`] and
/// [`BackstopLayer::listener`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackstopConfig {
    /// Each attempt's timeout ([`TimeoutLayer::new`](crate::timeout::TimeoutLayer::new)).
    #[serde(with = "humane::required")]
    pub attempt_timeout: Duration,
    /// Over [`RetryPolicy::new`] for HTTP, [`RetryPolicy::grpc`] for gRPC.
    #[serde(default, skip_serializing_if = "is_default")]
    pub retry: RetryConfig,
    /// Over the preset's breaker rule (see [`BackstopLayer`]): per host for HTTP, one breaker
    /// for gRPC.
    #[serde(default, skip_serializing_if = "is_default")]
    pub breaker: BreakerConfig,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl BackstopConfig {
    /// The preset's defaults, each attempt bounded by `attempt_timeout`.
    pub fn new(attempt_timeout: Duration) -> Self {
        BackstopConfig {
            attempt_timeout,
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
        }
    }

    /// The stack for an HTTP client, as [`BackstopLayer::http`] with this configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] at the field that cannot work, its path from this section
    /// (`retry.max_attempts`, `breaker.failure_rate`); see [`RetryConfig::build`] and
    /// [`BreakerConfig::build_per_host`].
    pub fn http(&self) -> Result<BackstopLayer, ConfigError> {
        let retry = self
            .retry
            .apply_at("retry", RetryPolicy::new(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("retry", &e))?;
        let breaker = self
            .breaker
            .per_key_at("breaker", client_rule().per_host(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("breaker", &e))?;
        Ok(BackstopLayer::http(self.attempt_timeout)
            .retry(retry)
            .breaker(breaker))
    }

    /// The stack for a gRPC client, as [`BackstopLayer::grpc`] with this configuration.
    ///
    /// # Errors
    ///
    /// As [`http`](Self::http); `breaker.max_keys` is an error (a `Channel` is one endpoint,
    /// with one breaker).
    pub fn grpc(&self) -> Result<BackstopLayer<GrpcClassifier, BreakerLayer>, ConfigError> {
        let retry = self
            .retry
            .apply_at("retry", RetryPolicy::grpc(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("retry", &e))?;
        let breaker = self
            .breaker
            .single_at("breaker", client_rule(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("breaker", &e))?;
        Ok(BackstopLayer::grpc(self.attempt_timeout)
            .retry(retry)
            .breaker(breaker))
    }
}
