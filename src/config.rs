//! Policies as data: the retry policy, the breaker rule, the timeout and the preset's settings,
//! read from TOML, JSON, YAML or any other [serde](https://serde.rs) format, so that operators
//! tune attempts, delays and breaker rules per provider without a rebuild.
//!
//! Every type here is a plain `Deserialize + Serialize` struct whose fields are optional (but
//! the preset's `attempt_timeout`, and the parts of a tagged section such as a backoff's `base`):
//! a field left out keeps the default of the layer it configures (the preset's, for
//! [`BackstopConfig`]), so a file says only what it changes. Unknown fields are an error (a typo
//! never passes silently). Durations are written in humane form, as the `humantime` crate reads
//! them: `"250ms"`, `"30s"`, `"5m"`, `"1h 30m"`; a negative or unitless duration is an error.
//!
//! Reading a file checks its shape; building checks its meaning, with the same rules as the
//! builders ([`RetryPolicy::build`](crate::retry::RetryPolicy::build),
//! [`breaker::Builder::build`](crate::breaker::Builder::build)), and a [`ConfigError`] names the
//! field by its path in the file:
//!
//! ```
//! use tower_backstop::config::BackstopConfig;
//!
//! let config: BackstopConfig = toml::from_str(
//!     r#"
//!     attempt_timeout = "2s"
//!
//!     [retry]
//!     max_attempts = 5
//!     deadline = "30s"
//!     backoff = { kind = "exponential", base = "200ms", cap = "10s", jitter = "full" }
//!
//!     [retry.classes.throttled]
//!     max_attempts = 0
//!
//!     [breaker]
//!     failure_rate = 0.5
//!     open_for = "30s"
//!     "#,
//! )?;
//! let err = config.http().unwrap_err();
//! assert_eq!(err.path(), "retry.classes.throttled.max_attempts");
//! assert_eq!(
//!     err.to_string(),
//!     "retry.classes.throttled.max_attempts: must be at least 1 (write `retry = false` to never retry the class)"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A configuration serialises back (for display, or to write a file), with the fields it was
//! given: what was left out is left out, and means the default.
//!
//! Class names are those of the built-in classes (`transient`, `throttled`, `unknown`,
//! `permanent`, `poison`, `circuit_open`, `outcome_unknown`) plus the ones a caller passes to
//! [`RetryConfig::apply`] and [`BreakerConfig::apply`]; any other name is an error that lists
//! the known ones.
//!
//! Each configuration is defined beside the layer it configures, one line per setting of the
//! layer's builder, and gathered here.

pub use crate::breaker::config::{
    AdaptiveConcurrencyConfig, AdaptiveConcurrencySetting, AdaptiveRateConfig, AdaptiveRateSetting,
    BreakerConfig, OpenDoubling, SlowCalls, TimeWindow,
};
pub use crate::preset::config::BackstopConfig;
pub use crate::retry::config::{
    BackoffConfig, BudgetConfig, ClassConfig, HedgeConfig, RetryConfig,
};
pub use crate::settings::ConfigError;
pub use crate::timeout::config::TimeoutConfig;
