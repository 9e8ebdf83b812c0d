//! [`RetryConfig`]: the retry policy as data (feature `serde`), one line per setting of
//! [`RetryPolicy`] (see `crate::settings` for how the lines become the struct and the code
//! that sets the policy).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Backoff, Budget, ClassPolicy, Jitter, RetryLayer, RetryPolicy};
use crate::failure::Class;
use crate::settings::{ConfigError, class_named, config_of, humane, join};

config_of! {
    /// The settings of a [`RetryPolicy`] as data, each optional: a field left out keeps the
    /// policy's default. Each field is the policy's method of the same name, with its meaning
    /// and limits; durations are written `"250ms"`, `"30s"`.
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
        /// [`RetryPolicy::max_attempts`]: the most calls for one request, the first included;
        /// at least 1.
        max_attempts: Option<u32> => policy.max_attempts(max_attempts),
        /// [`RetryPolicy::backoff`]: the delay rule of the classes that have none of their own.
        backoff: Option<BackoffConfig> => {
            policy.backoff(backoff.backoff(&join(at, "backoff"))?)
        },
        /// [`RetryPolicy::max_delay`]: the longest delay slept in process.
        #[serde(with = "humane")]
        max_delay: Option<Duration> => policy.max_delay(max_delay),
        /// [`RetryPolicy::max_hint_delay`]: the longest server hint slept in process; at most
        /// `max_delay`.
        #[serde(with = "humane")]
        max_hint_delay: Option<Duration> => policy.max_hint_delay(max_hint_delay),
        /// [`RetryPolicy::give_up_long_delays`]: whether a delay above the bound gives the
        /// request up (`true`) rather than deferring it to the dead-letter store (`false`, the
        /// default).
        give_up_long_delays: Option<bool> => policy.set_give_up_long_delays(give_up_long_delays),
        /// [`RetryPolicy::wait_for_breaker`]: the longest wait for our own breaker to
        /// half-open, in process; at most `max_delay`.
        #[serde(with = "humane")]
        wait_for_breaker: Option<Duration> => policy.wait_for_breaker(wait_for_breaker),
        /// [`RetryPolicy::deadline`]: the overall deadline of a request, over all attempts and
        /// delays; no attempt starts after it.
        #[serde(with = "humane")]
        deadline: Option<Duration> => policy.deadline(deadline),
        /// [`RetryPolicy::retry_unprocessed`]: whether a request proven unprocessed (never
        /// sent, or refused before processing) is retried even when it is not idempotent.
        retry_unprocessed: Option<bool> => policy.retry_unprocessed(retry_unprocessed),
        /// [`RetryPolicy::assume_idempotent`]: whether every request is treated as safe to
        /// send twice.
        assume_idempotent: Option<bool> => policy.assume_idempotent(assume_idempotent),
        /// [`RetryPolicy::budget`]: the retry budget.
        budget: Option<BudgetConfig> => policy.budget(budget.budget(at)?),
        /// [`RetryPolicy::hedge`]: a copy of a slow request that is safe to send twice,
        /// `{ delay = "100ms", max_copies = 1 }`.
        hedge: Option<HedgeConfig> => policy.hedge(hedge.delay, hedge.max_copies),
        /// [`RetryPolicy::class`], per class by name: how that class is retried, on top of the
        /// policy's rule for it.
        classes: BTreeMap<String, ClassConfig> => {
            ClassConfig::apply_all(&classes, at, policy, custom)?
        },
    }
    fn set_fields(&self, at, policy: RetryPolicy, custom: &[Class]);
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

config_of! {
    /// How one class is retried: a [`ClassPolicy`] as data. The fields given change the
    /// policy's rule for the class (for a class the policy has no rule for, a retried class);
    /// the others keep it. Giving `max_attempts`, `backoff` or `slow_down` for a class the
    /// policy never retries (such as `permanent`) makes it retried, unless `retry = false`.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[non_exhaustive]
    pub struct ClassConfig {
        /// `false`: never retried ([`ClassPolicy::never`]); `true`: retried
        /// ([`ClassPolicy::retry`]).
        retry: Option<bool> => rule.set_retried(retry),
        /// [`ClassPolicy::max_attempts`]: the most attempts that may fail with this class; at
        /// least 1.
        max_attempts: Option<u32> => rule.max_attempts(max_attempts),
        /// [`ClassPolicy::backoff`]: the delay rule of this class.
        backoff: Option<BackoffConfig> => rule.backoff(backoff.backoff(&join(at, "backoff"))?),
        /// [`ClassPolicy::slow_down`].
        slow_down: Option<bool> => rule.slow_down(slow_down),
    }
    fn set_fields(&self, at, rule: ClassPolicy);
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
        policy: RetryPolicy,
        custom: &[Class],
    ) -> Result<RetryPolicy, ConfigError> {
        let policy = self.set_fields(prefix, policy, custom)?;
        policy
            .validate()
            .map_err(|e| ConfigError::from_build(prefix, &e))?;
        Ok(policy)
    }
}

impl ClassConfig {
    /// `policy` with the rule of each class in `classes` changed, at `prefix.classes.{name}`.
    fn apply_all(
        classes: &BTreeMap<String, ClassConfig>,
        prefix: &str,
        mut policy: RetryPolicy,
        custom: &[Class],
    ) -> Result<RetryPolicy, ConfigError> {
        for (name, class_config) in classes {
            let path = join(prefix, &format!("classes.{name}"));
            let class = class_named(name, custom, &path)?;
            policy = policy.try_edit_class(class, |rule| class_config.apply(&path, rule))?;
        }
        Ok(policy)
    }

    /// `rule` changed by the fields given, their errors at `path`.
    fn apply(&self, path: &str, rule: ClassPolicy) -> Result<ClassPolicy, ConfigError> {
        let sets_retries =
            self.max_attempts.is_some() || self.backoff.is_some() || self.slow_down.is_some();
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
        // Retry settings given for a class the policy never retries mean it is retried now.
        let rule = if self.retry.is_none() && sets_retries {
            rule.set_retried(true)
        } else {
            rule
        };
        self.set_fields(path, rule)
    }
}
