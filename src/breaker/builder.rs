//! [`Builder`]: every setting of a breaker, checked by [`Builder::build`] (in `layer.rs`, beside the
//! layer it builds).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::keyed::{Authority, PerKey};
use super::limit::AdaptiveConcurrency;
use super::open::OpenDuration;
use super::rate::AdaptiveRate;
use super::state::{MAX_PROBES, Settings};
use super::window::WindowKind;
use crate::build_error::BuildError;
use crate::failure::Class;
use crate::observe::Listener;

/// The classes that count as failures by default: the ones that say the provider is failing. A
/// throttled answer is not one: the provider is up and asks for less, which the adaptive send
/// rate gives it.
pub(crate) const DEFAULT_CLASSES: [Class; 2] = [Class::TRANSIENT, Class::UNKNOWN];

/// Configures a breaker; [`build`](Builder::build) checks it and makes the
/// [`BreakerLayer`](super::BreakerLayer).
///
/// `K` says how many breakers the layer keeps: `()` (one, the default), or one per key
/// ([`per_host`](Self::per_host), [`keyed_by`](Self::keyed_by)), each built from these settings
/// and named after its key.
///
/// Trip rules combine: the breaker opens when any configured rule is met.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`consecutive_failures`](Self::consecutive_failures) | 5, when no rate rule is set | failures in a row |
/// | [`failure_rate`](Self::failure_rate) | off | share of failed calls in the window, `0.0..=1.0` |
/// | [`slow_calls`](Self::slow_calls) | off | share of calls slower than a threshold |
/// | [`count_window`](Self::count_window) / [`time_window`](Self::time_window) | last 100 calls | the window both rates use |
/// | [`minimum_calls`](Self::minimum_calls) | 100 (the window size for a count window) | calls in the window before a rate can trip it |
/// | [`open_for`](Self::open_for) / [`open_doubling`](Self::open_doubling) | fixed 30 s | how long it stays open |
/// | [`open_jitter`](Self::open_jitter) | none | spread of each open duration, `0.0..=1.0` |
/// | [`half_open_probes`](Self::half_open_probes) | 1 | probes admitted at once in half-open |
/// | [`close_after`](Self::close_after) | 1 | successful probes that close it |
/// | [`max_half_open`](Self::max_half_open) | none | longest time in half-open before it re-opens |
/// | [`failure_classes`](Self::failure_classes) | transient, unknown | classes that count as failures (a throttled answer lowers the send rate instead) |
/// | [`adaptive_rate`](Self::adaptive_rate) / [`without_adaptive_rate`](Self::without_adaptive_rate) | on, [`AdaptiveRate::new`] | the send rate lowered on throttled answers |
/// | [`adaptive_concurrency`](Self::adaptive_concurrency) / [`without_adaptive_concurrency`](Self::without_adaptive_concurrency) | off ([`AdaptiveConcurrency::new`] once turned on: a limit that learns from per-request failures as from overload cuts the calls in flight of a provider that fails one request in five to a few) | the calls in flight bounded, and the bound learnt, once the provider signals overload |
/// | [`per_host`](Self::per_host) / [`keyed_by`](Self::keyed_by) | one breaker | one breaker per host, or per key of yours |
/// | [`max_keys`](Builder::max_keys) | 64 | the most keys with a breaker kept for them |
///
/// The windows and thresholds follow resilience4j's `CircuitBreakerConfig`; the defaults of the
/// rate rules are its defaults.
#[derive(Clone)]
pub struct Builder<K = ()> {
    pub(crate) settings: Settings,
    pub(crate) keys: K,
}

impl<K> Builder<K> {
    /// The same settings, without keys.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn without_keys(self) -> Builder {
        Builder {
            settings: self.settings,
            keys: (),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for Builder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("settings", &self.settings)
            .field("keys", &self.keys)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            settings: Settings {
                name: Arc::from("breaker"),
                consecutive: None,
                failure_rate: None,
                slow: None,
                window: WindowKind::Count(100),
                minimum_calls: None,
                open: OpenDuration::fixed(Duration::from_secs(30)),
                probes: 1,
                close_after: 1,
                max_half_open: None,
                classes: Arc::from(DEFAULT_CLASSES),
                listener: None,
                rate: Some(AdaptiveRate::new()),
                concurrency: None,
            },
            keys: (),
        }
    }
}

impl Builder {
    /// The defaults of the table above: one breaker.
    pub fn new() -> Self {
        Builder::default()
    }

    /// One breaker per host: per normalised request authority ([`Authority`]), at most
    /// [`max_keys`](Builder::max_keys) of them. The choice for a client that calls many hosts,
    /// so that one host's outage never fails calls to another.
    pub fn per_host(self) -> Builder<PerKey<Authority>> {
        self.keyed_by(Authority)
    }

    /// One breaker per key that `key` takes from the request (a [`KeyOf`](super::KeyOf): a
    /// closure `Fn(&Req) -> Option<String>`, for example a provider named in a header), at most
    /// [`max_keys`](Builder::max_keys) of them.
    pub fn keyed_by<F>(self, key: F) -> Builder<PerKey<F>> {
        Builder {
            settings: self.settings,
            keys: PerKey::new(key),
        }
    }
}

impl<F> Builder<PerKey<F>> {
    /// The most keys with a breaker kept for them (at least 1; 64 by default). When a new key
    /// comes and the bound is reached, an idle breaker is evicted (see
    /// [`BreakerLayer::per_host`](super::BreakerLayer::per_host)).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.keys.max_keys = n;
        self
    }
}

impl<K> Builder<K> {
    /// Opens after `n` failures in a row (a count of calls).
    ///
    /// Any success whose call started after the breaker last opened or closed ends the row,
    /// failures counted while it ran included; a success from before (a slow call admitted in
    /// an earlier closed period) changes nothing. A failure of a class that does not count
    /// ([`failure_classes`](Self::failure_classes)) neither adds to the row nor ends it.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.settings.consecutive = Some(n);
        self
    }

    /// Opens when at least `rate` (`0.0..=1.0`; `0.5` is 50 %) of the calls in the window failed,
    /// once the window holds [`minimum_calls`](Self::minimum_calls).
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.settings.failure_rate = Some(rate);
        self
    }

    /// Opens when at least `rate` (`0.0..=1.0`) of the calls in the window took longer than
    /// `threshold`, whatever their result (resilience4j's slow-call rate). With this rule each
    /// call reads the clock twice.
    pub fn slow_calls(mut self, threshold: Duration, rate: f64) -> Self {
        self.settings.slow = Some((threshold, rate));
        self
    }

    /// The rates are taken over the last `calls` calls (a count-based window, `1..=100_000`).
    pub fn count_window(mut self, calls: u32) -> Self {
        self.settings.window = WindowKind::Count(calls);
        self
    }

    /// The rates are taken over `buckets` buckets of `width` each (a time-based window: the last
    /// `width × buckets`, moving one bucket at a time; `buckets` in `1..=1_000`, a bucket counts
    /// up to 65,535 calls and keeps the sample of its first ones beyond that). Each call then
    /// reads the clock once when it ends. A bucket knows its start modulo 65,536 widths, so after
    /// a silence of exactly a multiple of 65,536 widths an old bucket could be read as current.
    pub fn time_window(mut self, width: Duration, buckets: u32) -> Self {
        self.settings.window = WindowKind::Time { width, buckets };
        self
    }

    /// The calls the window must hold before a rate can trip the breaker.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.settings.minimum_calls = Some(calls);
        self
    }

    /// Stays open for the same `duration` after every trip (30 s by default), replacing an
    /// [`open_doubling`](Self::open_doubling); an [`open_jitter`](Self::open_jitter) still applies.
    pub fn open_for(mut self, duration: Duration) -> Self {
        let jitter = self.settings.open.jitter_fraction();
        self.settings.open = OpenDuration::fixed(duration).jitter(jitter);
        self
    }

    /// Stays open for `base` after the first trip, doubled after each consecutive trip (an
    /// opening with no close since the last: a failed probe re-opens it), never above `cap`:
    /// exponential backoff, as in the AWS Architecture Blog's "Exponential Backoff And Jitter".
    /// The doubling saturates, so the breaker is never open for longer than `cap`. One
    /// successful half-open period (the breaker closes) starts the count again. Replaces an
    /// [`open_for`](Self::open_for); an [`open_jitter`](Self::open_jitter) still applies.
    ///
    /// [`build`](Self::build) rejects a zero `base` or a `cap` below `base` (setting
    /// `open_doubling`).
    pub fn open_doubling(mut self, base: Duration, cap: Duration) -> Self {
        let jitter = self.settings.open.jitter_fraction();
        self.settings.open = OpenDuration::doubling(base, cap).jitter(jitter);
        self
    }

    /// Spreads each open duration by a random amount up to `fraction` of it (bounded additive
    /// jitter: `0.25` is up to +25 %; none by default), so that many clients' breakers do not
    /// half-open in the same instant. A doubling duration never exceeds its cap: where the
    /// +`fraction` band would cross the cap it is moved below it, so durations at the cap are
    /// spread over `[cap − fraction × cap, cap]` (never below half the cap) rather than all being
    /// the cap ("Exponential Backoff And Jitter": jitter inside the cap).
    ///
    /// [`build`](Self::build) rejects a fraction outside `0.0..=1.0` (setting `open_jitter`).
    pub fn open_jitter(mut self, fraction: f64) -> Self {
        self.settings.open = self.settings.open.jitter(fraction);
        self
    }

    /// Probes admitted at the same time in half-open (`1..=1_000`); every other call is rejected.
    /// A probe that ends gives its permit to the next call.
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.settings.probes = n;
        self
    }

    /// Successful probes that close the breaker (`1..=1_000`).
    pub fn close_after(mut self, n: u32) -> Self {
        self.settings.close_after = n;
        self
    }

    /// The longest the breaker stays half-open without closing, counted from its first probe;
    /// past it, the next call re-opens it (resilience4j's `maxWaitDurationInHalfOpenState`), so
    /// a hung probe cannot keep it half-open for ever. A breaker that half-opened on time with no
    /// call waiting has no probe yet, and waits for one.
    pub fn max_half_open(mut self, duration: Duration) -> Self {
        self.settings.max_half_open = Some(duration);
        self
    }

    /// The classes that count as failures. Any other failure (a permanent 4xx, a call whose
    /// future was dropped) is ignored: it neither counts as a failure nor as a success.
    pub fn failure_classes(mut self, classes: &[Class]) -> Self {
        self.settings.classes = Arc::from(classes);
        self
    }

    /// How the breaker paces a provider that answers throttled ([`AdaptiveRate`]; on by
    /// default with [`AdaptiveRate::new`]). Its settings are checked by `build`.
    pub fn adaptive_rate(mut self, rate: AdaptiveRate) -> Self {
        self.settings.rate = Some(rate);
        self
    }

    /// No adaptive send rate: calls are never paced by the breaker, whatever the provider
    /// answers (each request still honours its own `Retry-After` in a retry layer). Add
    /// [`Class::THROTTLED`] to [`failure_classes`](Self::failure_classes) for a breaker that
    /// opens on throttled answers instead.
    pub fn without_adaptive_rate(mut self) -> Self {
        self.settings.rate = None;
        self
    }

    /// How the breaker bounds the calls in flight to a provider that signals overload
    /// ([`AdaptiveConcurrency`]; off by default: it cannot tell an overload from failures of
    /// single requests). Its settings are checked by `build`.
    pub fn adaptive_concurrency(mut self, concurrency: AdaptiveConcurrency) -> Self {
        self.settings.concurrency = Some(concurrency);
        self
    }

    /// No adaptive concurrency limit: the calls in flight are never counted nor bounded by the
    /// breaker, whatever the provider answers.
    pub fn without_adaptive_concurrency(mut self) -> Self {
        self.settings.concurrency = None;
        self
    }

    /// A name for the breaker's events (the provider or host it guards).
    pub fn name(mut self, name: &str) -> Self {
        self.settings.name = Arc::from(name);
        self
    }

    /// A hook that sees every transition and rejection
    /// ([`Event::BreakerTransition`](crate::observe::Event::BreakerTransition),
    /// [`Event::BreakerRejected`](crate::observe::Event::BreakerRejected)); see [`Listener`].
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.settings.listener = Some(Arc::new(listener));
        self
    }

    /// Checks the settings shared by every kind of breaker.
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let s = &self.settings;
        if let Some(rate) = &s.rate {
            rate.check()?;
        }
        if let Some(concurrency) = &s.concurrency {
            concurrency.check()?;
        }
        let rate_ok = |r: f64| r > 0.0 && r <= 1.0;
        if let Some(n @ 0) = s.consecutive {
            return Err(BuildError::new(
                "consecutive_failures",
                n,
                "consecutive failures must be at least 1",
            ));
        }
        if let Some(r) = s.failure_rate
            && !rate_ok(r)
        {
            return Err(BuildError::new(
                "failure_rate",
                r,
                "the failure rate must be within (0.0, 1.0]",
            ));
        }
        if let Some((_, r)) = s.slow
            && !rate_ok(r)
        {
            return Err(BuildError::new(
                "slow_calls",
                r,
                "the slow-call rate must be within (0.0, 1.0]",
            ));
        }
        match s.window {
            WindowKind::Count(n) if n == 0 || n > 100_000 => {
                return Err(BuildError::new(
                    "count_window",
                    n,
                    "a count window holds 1..=100000 calls",
                ));
            }
            WindowKind::Time { width, buckets } => {
                if width.is_zero() || buckets == 0 || buckets > 1_000 {
                    return Err(BuildError::new(
                        "time_window",
                        format_args!("{width:?} × {buckets}"),
                        "a time window needs a non-zero bucket width and 1..=1000 buckets",
                    ));
                }
            }
            WindowKind::Count(_) => {}
        }
        if let Some(n @ 0) = s.minimum_calls {
            return Err(BuildError::new(
                "minimum_calls",
                n,
                "the minimum number of calls must be at least 1",
            ));
        }
        if let (WindowKind::Count(n), Some(min)) = (s.window, s.minimum_calls)
            && min > n
        {
            return Err(BuildError::new(
                "minimum_calls",
                min,
                "the minimum number of calls exceeds the count window, so it could never trip",
            ));
        }
        if s.probes == 0 || s.probes > MAX_PROBES {
            return Err(BuildError::new(
                "half_open_probes",
                s.probes,
                "half-open probes must be within 1..=1000",
            ));
        }
        if s.close_after == 0 || s.close_after > MAX_PROBES {
            return Err(BuildError::new(
                "close_after",
                s.close_after,
                "close-after must be within 1..=1000",
            ));
        }
        if let Some((setting, problem)) = s.open.problem() {
            return Err(BuildError::new(
                setting,
                format_args!("{:?}", s.open),
                problem,
            ));
        }
        Ok(())
    }
}

impl<F> Builder<PerKey<F>> {
    /// Checks the settings of a keyed breaker.
    pub(crate) fn validate_keyed(&self) -> Result<(), BuildError> {
        self.validate()?;
        if self.keys.max_keys == 0 {
            return Err(BuildError::new(
                "max_keys",
                self.keys.max_keys,
                "the most keys kept must be at least 1",
            ));
        }
        Ok(())
    }
}
