//! [`BreakerConfig`]: the breaker rule as data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, class_named, humane, join};
use crate::breaker::{BreakerLayer, Builder, PerKey};
use crate::failure::Class;

/// The settings of a [`breaker::Builder`](Builder), each optional (left out, the builder's
/// default, or the preset's rule under [`BackstopConfig`](super::BackstopConfig)). The fields
/// are the builder's methods, with the same meaning and limits:
///
/// | field | form |
/// |---|---|
/// | `consecutive_failures` | failures in a row, at least 1 |
/// | `failure_rate` | share of failed calls in the window, within (0, 1] |
/// | `slow_calls` | `{ threshold = "1s", rate = 0.5 }` ([`SlowCalls`]) |
/// | `count_window` | the last n calls, 1 to 100,000 |
/// | `time_window` | `{ width = "1s", buckets = 10 }` ([`TimeWindow`]) |
/// | `minimum_calls` | calls in the window before a rate can trip it |
/// | `open_for` | duration |
/// | `open_doubling` | `{ base = "1s", cap = "30s" }` ([`OpenDoubling`]) |
/// | `open_jitter` | spread of each open duration, within [0, 1] |
/// | `half_open_probes` / `close_after` | 1 to 1000 |
/// | `max_half_open` | duration |
/// | `failure_classes` | class names, as `["transient", "throttled"]` |
/// | `name` | the breaker's name in logs and metrics (a single breaker) |
/// | `max_keys` | the most hosts with a breaker (a per-host breaker) |
///
/// `count_window` and `time_window` exclude each other, and so do `open_for` and
/// `open_doubling`: a configuration giving both is an error.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// [`Builder::consecutive_failures`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// [`Builder::failure_rate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<f64>,
    /// [`Builder::slow_calls`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_calls: Option<SlowCalls>,
    /// [`Builder::count_window`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_window: Option<u32>,
    /// [`Builder::time_window`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_window: Option<TimeWindow>,
    /// [`Builder::minimum_calls`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_calls: Option<u32>,
    /// [`Builder::open_for`].
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub open_for: Option<Duration>,
    /// [`Builder::open_doubling`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_doubling: Option<OpenDoubling>,
    /// [`Builder::open_jitter`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_jitter: Option<f64>,
    /// [`Builder::half_open_probes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open_probes: Option<u32>,
    /// [`Builder::close_after`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_after: Option<u32>,
    /// [`Builder::max_half_open`].
    #[serde(default, with = "humane", skip_serializing_if = "Option::is_none")]
    pub max_half_open: Option<Duration>,
    /// [`Builder::failure_classes`], by class name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_classes: Option<Vec<String>>,
    /// [`Builder::name`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// [`Builder::max_keys`], for a per-host breaker only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<usize>,
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
        if self.max_keys.is_some() {
            return Err(ConfigError::new(
                join(prefix, "max_keys"),
                "only a breaker per host keeps keys; this one is a single breaker",
            ));
        }
        let builder = self.common(prefix, builder, custom)?;
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
        let mut builder = self.common(prefix, builder, custom)?;
        if let Some(n) = self.max_keys {
            builder = builder.max_keys(n);
        }
        builder
            .validate_keyed()
            .map_err(|e| ConfigError::from_build(prefix, &e))?;
        Ok(builder)
    }

    fn common<K>(
        &self,
        prefix: &str,
        mut b: Builder<K>,
        custom: &[Class],
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
        if let Some(n) = self.consecutive_failures {
            b = b.consecutive_failures(n);
        }
        if let Some(r) = self.failure_rate {
            b = b.failure_rate(r);
        }
        if let Some(s) = self.slow_calls {
            b = b.slow_calls(s.threshold, s.rate);
        }
        if let Some(n) = self.count_window {
            b = b.count_window(n);
        }
        if let Some(w) = self.time_window {
            b = b.time_window(w.width, w.buckets);
        }
        if let Some(n) = self.minimum_calls {
            b = b.minimum_calls(n);
        }
        if let Some(d) = self.open_for {
            b = b.open_for(d);
        }
        if let Some(o) = self.open_doubling {
            b = b.open_doubling(o.base, o.cap);
        }
        if let Some(j) = self.open_jitter {
            b = b.open_jitter(j);
        }
        if let Some(n) = self.half_open_probes {
            b = b.half_open_probes(n);
        }
        if let Some(n) = self.close_after {
            b = b.close_after(n);
        }
        if let Some(d) = self.max_half_open {
            b = b.max_half_open(d);
        }
        if let Some(names) = &self.failure_classes {
            let path = join(prefix, "failure_classes");
            let classes = names
                .iter()
                .map(|n| class_named(n, custom, &path))
                .collect::<Result<Vec<_>, _>>()?;
            b = b.failure_classes(&classes);
        }
        if let Some(name) = &self.name {
            b = b.name(name);
        }
        Ok(b)
    }
}
