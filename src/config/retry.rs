//! [`RetryConfig`]: the retry policy as data.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, class_named, humane, join};
use crate::failure::Class;
use crate::retry::{Backoff, Budget, Jitter, RetryLayer, RetryPolicy};

/// The settings of a [`RetryPolicy`], each optional (left out, the policy's default).
///
/// | field | sets | form |
/// |---|---|---|
/// | `max_attempts` | [`RetryPolicy::max_attempts`] | attempts, the first call included |
/// | `backoff` | [`RetryPolicy::backoff`] | a [`BackoffConfig`] |
/// | `max_delay` | [`RetryPolicy::max_delay`] | duration |
/// | `max_hint_delay` | [`RetryPolicy::max_hint_delay`] | duration |
/// | `give_up_long_delays` | [`RetryPolicy::give_up_long_delays`] | bool |
/// | `wait_for_breaker` | [`RetryPolicy::wait_for_breaker`] | duration |
/// | `deadline` | [`RetryPolicy::deadline`] | duration, over all attempts and delays |
/// | `retry_unprocessed` | [`RetryPolicy::retry_unprocessed`] | bool |
/// | `assume_idempotent` | [`RetryPolicy::assume_idempotent`] | bool |
/// | `budget` | [`RetryPolicy::budget`] | a [`BudgetConfig`] |
/// | `hedge` | [`RetryPolicy::hedge`] | `{ delay = "100ms", max_copies = 1 }` ([`HedgeConfig`]) |
/// | `classes` | [`RetryPolicy::class`] | a table of class name to [`ClassConfig`] |
///
/// ```toml
/// max_attempts = 4
/// deadline = "20s"
/// backoff = { kind = "exponential", base = "100ms", cap = "5s" }
/// budget = { kind = "token_bucket", max_tokens = 10, token_ratio = 0.1 }
///
/// [classes.throttled]
/// max_attempts = 3
/// backoff = { kind = "constant", delay = "1s" }
///
/// [classes.unknown]
/// retry = false
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryConfig {
    /// The most calls for one request, the first included; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The delay rule of the classes that have none of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffConfig>,
    /// The longest delay slept in process.
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<Duration>,
    /// The longest server hint slept in process; at most `max_delay`.
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub max_hint_delay: Option<Duration>,
    /// Whether a delay above the bound gives the request up (`true`) rather than deferring it
    /// to the dead-letter store (`false`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_up_long_delays: Option<bool>,
    /// The longest wait for our own breaker to half-open, in process; at most `max_delay`.
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub wait_for_breaker: Option<Duration>,
    /// The overall deadline of a request: no attempt starts after it.
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Duration>,
    /// Whether a request proven unprocessed (never sent, or refused before processing) is
    /// retried even when it is not idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_unprocessed: Option<bool>,
    /// Whether every request is treated as safe to send twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assume_idempotent: Option<bool>,
    /// The retry budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
    /// Hedging: a copy of a slow request that is safe to send twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeConfig>,
    /// Per class, by name: how that class is retried, on top of the policy's rule for it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, ClassConfig>,
}

/// [`RetryPolicy::hedge`] as data: after `delay` without an answer, a copy; at most
/// `max_copies` (1 to 4) in a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeConfig {
    /// How long an attempt is out without an answer before a copy is sent; above zero, below
    /// the deadline.
    #[serde(with = "humane::required")]
    pub delay: Duration,
    /// The most copies in a call, 1 to 4.
    pub max_copies: u32,
}

/// How one class is retried: a [`ClassPolicy`](crate::retry::ClassPolicy) as data. The fields
/// given change the policy's rule for the class (for a class the policy has no rule for, a
/// retried class); the others keep it. Giving `max_attempts`, `backoff` or `slow_down` for a
/// class the policy never retries (such as `permanent`) makes it retried, unless `retry = false`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClassConfig {
    /// `false`: never retried ([`ClassPolicy::never`](crate::retry::ClassPolicy::never));
    /// `true`: retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<bool>,
    /// The most attempts that may fail with this class; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The delay rule of this class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffConfig>,
    /// See [`ClassPolicy::slow_down`](crate::retry::ClassPolicy::slow_down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_down: Option<bool>,
}

/// A [`Backoff`] as data, tagged by `kind`; `jitter` is one of `none`, `full` (the default),
/// `equal`, `decorrelated`, `additive` ([`Jitter`]), and `cap` bounds every delay.
///
/// ```toml
/// backoff = { kind = "exponential", base = "100ms", cap = "20s", jitter = "full" }
/// backoff = { kind = "linear", base = "1s", step = "1s", cap = "10s" }
/// backoff = { kind = "constant", delay = "500ms", jitter = "none" }
/// backoff = { kind = "schedule", delays = ["1s", "5s", "30s"] }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum BackoffConfig {
    /// [`Backoff::constant`]: `delay` after every failed attempt.
    Constant {
        /// The delay.
        #[serde(with = "humane::required")]
        delay: Duration,
        /// The cap, after jitter.
        #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
        cap: Option<Duration>,
        /// The jitter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jitter: Option<Jitter>,
    },
    /// [`Backoff::linear`]: `base + step × (n-1)` after the `n`-th failed attempt.
    Linear {
        /// The first delay.
        #[serde(with = "humane::required")]
        base: Duration,
        /// Added per failed attempt.
        #[serde(with = "humane::required")]
        step: Duration,
        /// The cap, after jitter.
        #[serde(with = "humane::required")]
        cap: Duration,
        /// The jitter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jitter: Option<Jitter>,
    },
    /// [`Backoff::exponential`]: `base × 2^(n-1)` after the `n`-th failed attempt.
    Exponential {
        /// The first delay.
        #[serde(with = "humane::required")]
        base: Duration,
        /// The cap, after jitter.
        #[serde(with = "humane::required")]
        cap: Duration,
        /// The jitter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jitter: Option<Jitter>,
    },
    /// [`Backoff::schedule`]: the `n`-th delay after the `n`-th failed attempt, the last one
    /// repeated.
    Schedule {
        /// The delays, at least one.
        #[serde(with = "humane::list")]
        delays: Vec<Duration>,
        /// The cap, after jitter.
        #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
        cap: Option<Duration>,
        /// The jitter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jitter: Option<Jitter>,
    },
}

impl BackoffConfig {
    /// The backoff, its errors at `path`.
    fn backoff(&self, path: &str) -> Result<Backoff, ConfigError> {
        let (backoff, cap, jitter) = match self {
            BackoffConfig::Constant { delay, cap, jitter } => {
                (Backoff::constant(*delay), *cap, *jitter)
            }
            BackoffConfig::Linear {
                base,
                step,
                cap,
                jitter,
            } => (Backoff::linear(*base, *step, *cap), None, *jitter),
            BackoffConfig::Exponential { base, cap, jitter } => {
                (Backoff::exponential(*base, *cap), None, *jitter)
            }
            BackoffConfig::Schedule {
                delays,
                cap,
                jitter,
            } => {
                let backoff = Backoff::schedule(delays.iter().copied()).map_err(|_| {
                    ConfigError::new(format!("{path}.delays"), "needs at least one delay")
                })?;
                (backoff, *cap, *jitter)
            }
        };
        let backoff = match jitter {
            Some(j) => backoff.jitter(j),
            None => backoff,
        };
        let backoff = match cap {
            Some(c) => backoff.capped_at(c),
            None => backoff,
        };
        if let Some(problem) = backoff.problem() {
            return Err(ConfigError::new(path, problem));
        }
        Ok(backoff)
    }
}

/// A retry [`Budget`] as data, tagged by `kind`.
///
/// ```toml
/// budget = { kind = "token_bucket", max_tokens = 10, token_ratio = 0.1 }
/// budget = { kind = "ratio", ratio = 0.2, min_per_second = 10, window = "10s" }
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum BudgetConfig {
    /// [`Budget::token_bucket`] (gRFC A6 retry throttling).
    TokenBucket {
        /// Tokens in a full bucket, 1 to 1000.
        max_tokens: u32,
        /// Tokens a success gives back, at least 0.001.
        token_ratio: f64,
    },
    /// [`Budget::ratio`] (Finagle's retry budget).
    Ratio {
        /// Retries allowed per call in the window, 0 to 1000.
        ratio: f64,
        /// Retries allowed per second whatever the traffic.
        min_per_second: u32,
        /// The window, 1 s to 1 h.
        #[serde(with = "humane::required")]
        window: Duration,
    },
}

impl BudgetConfig {
    fn budget(&self, prefix: &str) -> Result<Budget, ConfigError> {
        match *self {
            BudgetConfig::TokenBucket {
                max_tokens,
                token_ratio,
            } => Budget::token_bucket(max_tokens, token_ratio),
            BudgetConfig::Ratio {
                ratio,
                min_per_second,
                window,
            } => Budget::ratio(ratio, min_per_second, window),
        }
        .map_err(|e| ConfigError::from_build(prefix, &e))
    }
}

impl RetryConfig {
    /// The policy of this configuration, starting from [`RetryPolicy::new`], built into its
    /// layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] at the field that cannot work: the checks of
    /// [`RetryPolicy::build`], a class name that is not a built-in class, a class with
    /// `max_attempts` and `retry = false`.
    pub fn build(&self) -> Result<RetryLayer, ConfigError> {
        let policy = self.apply(RetryPolicy::new(), &[])?;
        policy.build().map_err(|e| ConfigError::from_build("", &e))
    }

    /// `policy` with the fields of this configuration set on it (for example over
    /// [`RetryPolicy::grpc`], or before adding a [`listener`](RetryPolicy::listener)), checked.
    /// Class names are looked up among the built-in classes and `custom`.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn apply(&self, policy: RetryPolicy, custom: &[Class]) -> Result<RetryPolicy, ConfigError> {
        self.apply_at("", policy, custom)
    }

    pub(crate) fn apply_at(
        &self,
        prefix: &str,
        mut policy: RetryPolicy,
        custom: &[Class],
    ) -> Result<RetryPolicy, ConfigError> {
        if let Some(n) = self.max_attempts {
            policy = policy.max_attempts(n);
        }
        if let Some(b) = &self.backoff {
            policy = policy.backoff(b.backoff(&join(prefix, "backoff"))?);
        }
        if let Some(d) = self.max_delay {
            policy = policy.max_delay(d);
        }
        if let Some(d) = self.max_hint_delay {
            policy = policy.max_hint_delay(d);
        }
        if let Some(give_up) = self.give_up_long_delays {
            policy = policy.set_give_up_long_delays(give_up);
        }
        if let Some(d) = self.wait_for_breaker {
            policy = policy.wait_for_breaker(d);
        }
        if let Some(d) = self.deadline {
            policy = policy.deadline(d);
        }
        if let Some(on) = self.retry_unprocessed {
            policy = policy.retry_unprocessed(on);
        }
        if let Some(on) = self.assume_idempotent {
            policy = policy.assume_idempotent(on);
        }
        if let Some(b) = &self.budget {
            policy = policy.budget(b.budget(prefix)?);
        }
        if let Some(h) = self.hedge {
            policy = policy.hedge(h.delay, h.max_copies);
        }
        for (name, class_config) in &self.classes {
            let path = join(prefix, &format!("classes.{name}"));
            let class = class_named(name, custom, &path)?;
            policy = class_config.apply(&path, class, policy)?;
        }
        policy
            .validate()
            .map_err(|e| ConfigError::from_build(prefix, &e))?;
        Ok(policy)
    }
}

impl ClassConfig {
    fn apply(
        &self,
        path: &str,
        class: Class,
        policy: RetryPolicy,
    ) -> Result<RetryPolicy, ConfigError> {
        if self.retry == Some(false) {
            for (field, given) in [
                ("max_attempts", self.max_attempts.is_some()),
                ("backoff", self.backoff.is_some()),
                ("slow_down", self.slow_down.is_some()),
            ] {
                if given {
                    return Err(ConfigError::new(
                        format!("{path}.{field}"),
                        "has no effect: the class is never retried (`retry = false`)",
                    ));
                }
            }
        }
        if self.max_attempts == Some(0) {
            return Err(ConfigError::new(
                format!("{path}.max_attempts"),
                "must be at least 1 (write `retry = false` to never retry the class)",
            ));
        }
        let backoff = match &self.backoff {
            Some(b) => Some(b.backoff(&format!("{path}.backoff"))?),
            None => None,
        };
        // Retry settings given for a class the policy never retries mean it is retried now.
        let retried = self.retry.or_else(|| {
            (self.max_attempts.is_some() || self.backoff.is_some() || self.slow_down.is_some())
                .then_some(true)
        });
        Ok(policy.edit_class(class, |rule| {
            if let Some(retry) = retried {
                rule.set_retried(retry);
            }
            if let Some(n) = self.max_attempts {
                *rule = rule.clone().max_attempts(n);
            }
            if let Some(b) = backoff {
                *rule = rule.clone().backoff(b);
            }
            if let Some(on) = self.slow_down {
                *rule = rule.clone().slow_down(on);
            }
        }))
    }
}
