//! [`BreakerConfig`]: the breaker rule as data (feature `serde`), one line per setting of
//! [`Builder`] (see `crate::settings` for how the lines become the struct and the code that
//! sets the builder).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::builder::Builder;
use super::keyed::PerKey;
use super::layer::BreakerLayer;
use super::limit::AdaptiveConcurrency;
use super::rate::AdaptiveRate;
use crate::failure::Class;
use crate::settings::{ConfigError, class_named, config_of, humane, join};

config_of! {
    /// The settings of a [`breaker::Builder`](Builder) as data, each optional: a field left out
    /// keeps the builder's default (or the preset's rule, under
    /// [`BackstopConfig`](crate::config::BackstopConfig)). Each field is the builder's method of
    /// the same name, with its meaning and limits; durations are written `"250ms"`, `"30s"`.
    ///
    /// ```toml
    /// failure_rate = 0.5
    /// minimum_calls = 10
    /// slow_calls = { threshold = "1s", rate = 0.5 }
    /// time_window = { width = "1s", buckets = 10 }
    /// open_doubling = { base = "1s", cap = "30s" }
    /// failure_classes = ["transient", "throttled"]
    /// ```
    ///
    /// `count_window` and `time_window` exclude each other, and so do `open_for` and
    /// `open_doubling`: a configuration giving both is an error.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[non_exhaustive]
    pub struct BreakerConfig {
        /// [`Builder::consecutive_failures`]: failures in a row, at least 1.
        consecutive_failures: Option<u32> => b.consecutive_failures(consecutive_failures),
        /// [`Builder::failure_rate`]: the share of failed calls in the window, within (0, 1].
        failure_rate: Option<f64> => b.failure_rate(failure_rate),
        /// [`Builder::slow_calls`]: `{ threshold = "1s", rate = 0.5 }`.
        slow_calls: Option<SlowCalls> => b.slow_calls(slow_calls.threshold, slow_calls.rate),
        /// [`Builder::count_window`]: the last n calls, 1 to 100,000.
        count_window: Option<u32> => b.count_window(count_window),
        /// [`Builder::time_window`]: `{ width = "1s", buckets = 10 }`.
        time_window: Option<TimeWindow> => b.time_window(time_window.width, time_window.buckets),
        /// [`Builder::minimum_calls`]: the calls in the window before a rate can trip it.
        minimum_calls: Option<u32> => b.minimum_calls(minimum_calls),
        /// [`Builder::open_for`].
        #[serde(with = "humane")]
        open_for: Option<Duration> => b.open_for(open_for),
        /// [`Builder::open_doubling`]: `{ base = "1s", cap = "30s" }`.
        open_doubling: Option<OpenDoubling> => {
            b.open_doubling(open_doubling.base, open_doubling.cap)
        },
        /// [`Builder::open_jitter`]: the spread of each open duration, within [0, 1].
        open_jitter: Option<f64> => b.open_jitter(open_jitter),
        /// [`Builder::half_open_probes`]: 1 to 1000.
        half_open_probes: Option<u32> => b.half_open_probes(half_open_probes),
        /// [`Builder::close_after`]: 1 to 1000.
        close_after: Option<u32> => b.close_after(close_after),
        /// [`Builder::max_half_open`].
        #[serde(with = "humane")]
        max_half_open: Option<Duration> => b.max_half_open(max_half_open),
        /// [`Builder::failure_classes`], by class name, as `["transient", "throttled"]`.
        failure_classes: Option<Vec<String>> => {
            let path = join(at, "failure_classes");
            let classes = failure_classes
                .iter()
                .map(|n| class_named(n, custom, &path))
                .collect::<Result<Vec<_>, _>>()?;
            b.failure_classes(&classes)
        },
        /// [`Builder::name`]: the breaker's name in logs and metrics (a single breaker).
        name: Option<String> => b.name(&name),
        /// [`Builder::adaptive_rate`]: `false` turns it off
        /// ([`Builder::without_adaptive_rate`]); `true`, or a table of
        /// [`AdaptiveRateConfig`]'s fields (each optional, over the defaults), turns it on.
        adaptive_rate: Option<AdaptiveRateSetting> => match adaptive_rate {
            AdaptiveRateSetting::On(false) => b.without_adaptive_rate(),
            AdaptiveRateSetting::On(true) => b.adaptive_rate(AdaptiveRate::new()),
            AdaptiveRateSetting::Settings(rate) => {
                let at = join(at, "adaptive_rate");
                b.adaptive_rate(rate.set_fields(&at, AdaptiveRate::new())?)
            }
        },
        /// [`Builder::adaptive_concurrency`]: `false` turns it off
        /// ([`Builder::without_adaptive_concurrency`]); `true`, or a table of
        /// [`AdaptiveConcurrencyConfig`]'s fields (each optional, over the defaults), turns it
        /// on.
        adaptive_concurrency: Option<AdaptiveConcurrencySetting> => match adaptive_concurrency {
            AdaptiveConcurrencySetting::On(false) => b.without_adaptive_concurrency(),
            AdaptiveConcurrencySetting::On(true) => {
                b.adaptive_concurrency(AdaptiveConcurrency::new())
            }
            AdaptiveConcurrencySetting::Settings(limit) => {
                let at = join(at, "adaptive_concurrency");
                b.adaptive_concurrency(limit.set_fields(&at, AdaptiveConcurrency::new())?)
            }
        },
        /// [`Builder::max_keys`]: the most hosts with a breaker (a per-host breaker only).
        max_keys: Option<usize> => {
            keys(b, max_keys).map_err(|problem| ConfigError::new(join(at, "max_keys"), problem))?
        },
    }
    fn set_fields<K>(
        &self,
        at,
        b: Builder<K>,
        custom: &[Class],
        keys: fn(Builder<K>, usize) -> Result<Builder<K>, &'static str>,
    );
}

/// The breaker's adaptive send rate in a configuration: on or off, or its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AdaptiveRateSetting {
    /// `true`: on with the defaults of [`AdaptiveRate::new`]; `false`: off.
    On(bool),
    /// On, with these settings over the defaults.
    Settings(AdaptiveRateConfig),
}

config_of! {
    /// The settings of an [`AdaptiveRate`] as data, each optional (left out: its default).
    /// Each field is the method of the same name; durations are written `"1s"`.
    ///
    /// ```toml
    /// [breaker.adaptive_rate]
    /// floor = 1.0
    /// lift_after = "1m"
    /// ```
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[non_exhaustive]
    pub struct AdaptiveRateConfig {
        /// [`AdaptiveRate::measure_window`]: from 10 ms to 60 s.
        #[serde(with = "humane")]
        measure_window: Option<Duration> => r.measure_window(measure_window),
        /// [`AdaptiveRate::measured_decrease`]: the share of the measured admitted rate a cut
        /// restarts from, within (0, 1].
        measured_decrease: Option<f64> => r.measured_decrease(measured_decrease),
        /// [`AdaptiveRate::decrease`]: the share of the rate kept at a throttled answer when
        /// nothing was measured, within (0, 1).
        decrease: Option<f64> => r.decrease(decrease),
        /// [`AdaptiveRate::regrowth`]: from 10 ms to 60 s.
        #[serde(with = "humane")]
        regrowth: Option<Duration> => r.regrowth(regrowth),
        /// [`AdaptiveRate::floor`]: the lowest rate in requests a second, above 0.
        floor: Option<f64> => r.floor(floor),
        /// [`AdaptiveRate::min_decrease_interval`].
        #[serde(with = "humane")]
        min_decrease_interval: Option<Duration> => r.min_decrease_interval(min_decrease_interval),
        /// [`AdaptiveRate::lift_after`]: above zero.
        #[serde(with = "humane")]
        lift_after: Option<Duration> => r.lift_after(lift_after),
    }
    fn set_fields(&self, _at, r: AdaptiveRate);
}

/// The breaker's adaptive concurrency limit in a configuration: on or off, or its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AdaptiveConcurrencySetting {
    /// `true`: on with the defaults of [`AdaptiveConcurrency::new`]; `false`: off.
    On(bool),
    /// On, with these settings over the defaults.
    Settings(AdaptiveConcurrencyConfig),
}

config_of! {
    /// The settings of an [`AdaptiveConcurrency`] as data, each optional (left out: its
    /// default). Each field is the method of the same name; durations are written `"30s"`.
    ///
    /// ```toml
    /// [breaker.adaptive_concurrency]
    /// max = 200
    /// lift_after = "1m"
    /// ```
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[non_exhaustive]
    pub struct AdaptiveConcurrencyConfig {
        /// [`AdaptiveConcurrency::decrease`]: the share of the limit kept at each decrease,
        /// within [0.5, 1).
        decrease: Option<f64> => r.decrease(decrease),
        /// [`AdaptiveConcurrency::max`]: the highest limit in calls in flight, at least 1.
        max: Option<u32> => r.max(max),
        /// [`AdaptiveConcurrency::latency_tolerance`]: above 1 (`inf` turns the rule off).
        latency_tolerance: Option<f64> => r.latency_tolerance(latency_tolerance),
        /// [`AdaptiveConcurrency::lift_after`]: above zero.
        #[serde(with = "humane")]
        lift_after: Option<Duration> => r.lift_after(lift_after),
    }
    fn set_fields(&self, _at, r: AdaptiveConcurrency);
}

/// The slow-call rule: a call slower than `threshold` is slow; the breaker opens when the share
/// of slow calls in the window reaches `rate`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowCalls {
    /// A call slower than this is slow.
    #[serde(with = "humane::required")]
    pub threshold: Duration,
    /// The share of slow calls that opens the breaker, within (0, 1].
    pub rate: f64,
}

/// A time window of `buckets` buckets of `width` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeWindow {
    /// The width of one bucket, not zero.
    #[serde(with = "humane::required")]
    pub width: Duration,
    /// Buckets, 1 to 1000.
    pub buckets: u32,
}

/// An open duration that starts at `base` and doubles with each trip in a row, up to `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenDoubling {
    /// The first open duration.
    #[serde(with = "humane::required")]
    pub base: Duration,
    /// The longest open duration.
    #[serde(with = "humane::required")]
    pub cap: Duration,
}

impl BreakerConfig {
    /// One breaker, from [`Builder::new`] with this configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] at the field that cannot work: the checks of
    /// [`Builder::build`], `max_keys` given (a single breaker keeps no keys), a class name
    /// that is not a built-in class, or two fields that exclude each other.
    pub fn build(&self) -> Result<BreakerLayer, ConfigError> {
        self.single_at("", Builder::new(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("", &e))
    }

    /// One breaker per host ([`Builder::per_host`]), from [`Builder::new`] with this
    /// configuration.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), `max_keys` allowed (at least 1).
    pub fn build_per_host(&self) -> Result<BreakerLayer<PerKey>, ConfigError> {
        self.per_key_at("", Builder::new().per_host(), &[])?
            .build()
            .map_err(|e| ConfigError::from_build("", &e))
    }

    /// `builder` with the fields of this configuration set on it (for example before adding a
    /// [`listener`](Builder::listener), or over [`keyed_by`](Builder::keyed_by)), checked.
    /// Class names are looked up among the built-in classes and `custom`.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build); `max_keys` is an error here too: set it on a keyed builder
    /// with [`Builder::max_keys`], or use [`build_per_host`](Self::build_per_host).
    pub fn apply<K>(
        &self,
        builder: Builder<K>,
        custom: &[Class],
    ) -> Result<Builder<K>, ConfigError> {
        self.single_at("", builder, custom)
    }

    /// Applies every field but `max_keys`, which must be absent.
    pub(crate) fn single_at<K>(
        &self,
        prefix: &str,
        builder: Builder<K>,
        custom: &[Class],
    ) -> Result<Builder<K>, ConfigError> {
        const SINGLE: &str = "only a breaker per host keeps keys; this one is a single breaker";
        // Said before any other field's problem.
        if self.max_keys.is_some() {
            return Err(ConfigError::new(join(prefix, "max_keys"), SINGLE));
        }
        let builder = self.common(prefix, builder, custom, |_, _| Err(SINGLE))?;
        builder
            .validate()
            .map_err(|e| ConfigError::from_build(prefix, &e))?;
        Ok(builder)
    }

    /// Applies every field, `max_keys` included.
    pub(crate) fn per_key_at<F>(
        &self,
        prefix: &str,
        builder: Builder<PerKey<F>>,
        custom: &[Class],
    ) -> Result<Builder<PerKey<F>>, ConfigError> {
        let builder = self.common(prefix, builder, custom, |b, n| Ok(b.max_keys(n)))?;
        builder
            .validate_keyed()
            .map_err(|e| ConfigError::from_build(prefix, &e))?;
        Ok(builder)
    }

    /// The fields that exclude each other checked, then every field set; `keys` sets
    /// `max_keys` or says why it cannot be set.
    fn common<K>(
        &self,
        prefix: &str,
        builder: Builder<K>,
        custom: &[Class],
        keys: fn(Builder<K>, usize) -> Result<Builder<K>, &'static str>,
    ) -> Result<Builder<K>, ConfigError> {
        for (given, field, other) in [
            (
                self.count_window.is_some() && self.time_window.is_some(),
                "time_window",
                "count_window",
            ),
            (
                self.open_for.is_some() && self.open_doubling.is_some(),
                "open_doubling",
                "open_for",
            ),
        ] {
            if given {
                return Err(ConfigError::new(
                    join(prefix, field),
                    format!("excludes `{other}`: give one of them"),
                ));
            }
        }
        self.set_fields(prefix, builder, custom, keys)
    }
}
