use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::event::Listener;
use super::layer::BreakerLayer;
use super::state::Shared;
use crate::failure::Class;

/// The classes that count as failures by default: the ones that blame the provider.
pub(crate) const DEFAULT_CLASSES: [Class; 3] = [Class::TRANSIENT, Class::THROTTLED, Class::UNKNOWN];

/// The most probes or successful probes a half-open breaker can be configured with.
pub const MAX_PROBES: u32 = 1_000;

/// How long a breaker stays open after a trip: fixed, or growing with each consecutive trip.
///
/// "Consecutive trips" are openings with no close in between: a trip from closed, then each failed
/// probe. One successful half-open period (the breaker closes) starts the count again.
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::breaker::OpenDuration;
///
/// // 30 s every time (the default).
/// let fixed = OpenDuration::fixed(Duration::from_secs(30));
/// // 1 s, 2 s, 4 s, … capped at 60 s, each spread by up to +25 %.
/// let growing = OpenDuration::doubling(Duration::from_secs(1), Duration::from_secs(60))
///     .jitter(0.25);
/// assert_eq!(growing.nth(0), Duration::from_secs(1));
/// assert_eq!(fixed.nth(10), Duration::from_secs(30));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenDuration {
    base: Duration,
    cap: Duration,
    growing: bool,
    jitter: f64,
}

impl OpenDuration {
    /// The same `duration` after every trip.
    pub const fn fixed(duration: Duration) -> Self {
        OpenDuration {
            base: duration,
            cap: duration,
            growing: false,
            jitter: 0.0,
        }
    }

    /// `base` after the first trip, doubled after each consecutive trip, never above `cap`
    /// (exponential backoff, as in the AWS Architecture Blog's "Exponential Backoff And Jitter").
    /// The doubling saturates, so the breaker is never open for longer than `cap`.
    /// [`Builder::build`] rejects a zero `base` or a `cap` below `base`.
    pub const fn doubling(base: Duration, cap: Duration) -> Self {
        OpenDuration {
            base,
            cap,
            growing: true,
            jitter: 0.0,
        }
    }

    /// Spreads each duration by a random amount up to `fraction` of it (bounded additive jitter:
    /// `0.25` is up to +25 %), so that many clients' breakers do not half-open in the same
    /// instant. A doubling duration never exceeds its cap: where the +`fraction` band would cross
    /// the cap it is moved below it, so durations at the cap are spread over
    /// `[cap − fraction × cap, cap]` (never below half the cap) rather than all being the cap. [`Builder::build`] rejects a
    /// fraction outside `0.0..=1.0`.
    pub const fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The duration after the trip numbered `n` (0 for the first of a series), before jitter.
    pub fn nth(&self, n: u32) -> Duration {
        if !self.growing {
            return self.base;
        }
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The duration after trip `n`, with jitter: uniform over a band `jitter × d` wide that
    /// starts at `d` (up to +`jitter`), moved down when it would cross the cap so that it ends
    /// at the cap, and never starting below `d / 2`. So durations at the cap are still spread
    /// (over `[cap − jitter × cap, cap]`, or `[cap / 2, cap]` for a jitter above 0.5) instead of
    /// all being the cap, and breakers that trip together do not half-open together
    /// ("Exponential Backoff And Jitter", AWS Architecture Blog: jitter inside the cap).
    pub(crate) fn pick(&self, n: u32) -> Duration {
        let d = self.nth(n);
        if self.jitter <= 0.0 {
            return d;
        }
        let width = d.mul_f64(self.jitter);
        let cap = if self.growing {
            self.cap
        } else {
            d.saturating_add(width)
        };
        // Never below half the nominal duration, even with a band as wide as the cap.
        let low = d.min(cap.saturating_sub(width)).max(d / 2);
        let high = low.saturating_add(width).min(cap);
        low.saturating_add((high - low).mul_f64(rand::random::<f64>()))
    }

    fn validate(&self) -> Result<(), BuildError> {
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(BuildError("open-duration jitter must be within 0.0..=1.0"));
        }
        if self.growing && self.base.is_zero() {
            return Err(BuildError("a doubling open duration needs a non-zero base"));
        }
        if self.growing && self.cap < self.base {
            return Err(BuildError("the open-duration cap is below its base"));
        }
        Ok(())
    }
}

/// A bad breaker configuration, returned by [`Builder::build`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildError(&'static str);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid breaker configuration: {}", self.0)
    }
}

impl std::error::Error for BuildError {}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum WindowKind {
    Count(u32),
    Time { width: Duration, buckets: u32 },
}

/// Configures a breaker; [`build`](Builder::build) checks it and makes the [`BreakerLayer`].
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
/// | [`open_for`](Self::open_for) / [`open_duration`](Self::open_duration) | fixed 30 s | how long it stays open |
/// | [`half_open_probes`](Self::half_open_probes) | 1 | probes admitted at once in half-open |
/// | [`close_after`](Self::close_after) | 1 | successful probes that close it |
/// | [`max_half_open`](Self::max_half_open) | none | longest time in half-open before it re-opens |
/// | [`failure_classes`](Self::failure_classes) | transient, throttled, unknown | classes that count as failures |
///
/// The windows and thresholds follow resilience4j's `CircuitBreakerConfig`; the defaults of the
/// rate rules are its defaults.
#[derive(Clone)]
pub struct Builder {
    pub(crate) name: Arc<str>,
    pub(crate) consecutive: Option<u32>,
    pub(crate) failure_rate: Option<f64>,
    pub(crate) slow: Option<(Duration, f64)>,
    pub(crate) window: WindowKind,
    pub(crate) minimum_calls: Option<u32>,
    pub(crate) open: OpenDuration,
    pub(crate) probes: u32,
    pub(crate) close_after: u32,
    pub(crate) max_half_open: Option<Duration>,
    pub(crate) classes: Arc<[Class]>,
    pub(crate) listener: Option<Arc<dyn Listener>>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("consecutive", &self.consecutive)
            .field("failure_rate", &self.failure_rate)
            .field("slow", &self.slow)
            .field("window", &self.window)
            .field("minimum_calls", &self.minimum_calls)
            .field("open", &self.open)
            .field("probes", &self.probes)
            .field("close_after", &self.close_after)
            .field("max_half_open", &self.max_half_open)
            .field("classes", &self.classes)
            .field("listener", &self.listener.is_some())
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
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
        }
    }
}

impl Builder {
    /// Opens after `n` failures in a row (a count of calls).
    ///
    /// Any success whose call started after the breaker last opened or closed ends the row,
    /// failures counted while it ran included; a success from before (a slow call admitted in
    /// an earlier closed period) changes nothing. A failure of a class that does not count
    /// ([`failure_classes`](Self::failure_classes)) neither adds to the row nor ends it.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive = Some(n);
        self
    }

    /// Opens when at least `rate` (`0.0..=1.0`; `0.5` is 50 %) of the calls in the window failed,
    /// once the window holds [`minimum_calls`](Self::minimum_calls).
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = Some(rate);
        self
    }

    /// Opens when at least `rate` (`0.0..=1.0`) of the calls in the window took longer than
    /// `threshold`, whatever their result (resilience4j's slow-call rate). With this rule each
    /// call reads the clock twice.
    pub fn slow_calls(mut self, threshold: Duration, rate: f64) -> Self {
        self.slow = Some((threshold, rate));
        self
    }

    /// The rates are taken over the last `calls` calls (a count-based window, `1..=100_000`).
    pub fn count_window(mut self, calls: u32) -> Self {
        self.window = WindowKind::Count(calls);
        self
    }

    /// The rates are taken over `buckets` buckets of `width` each (a time-based window: the last
    /// `width × buckets`, moving one bucket at a time; `buckets` in `1..=1_000`, a bucket counts
    /// up to 65,535 calls and keeps the sample of its first ones beyond that). Each call then
    /// reads the clock once when it ends. A bucket knows its start modulo 65,536 widths, so after
    /// a silence of exactly a multiple of 65,536 widths an old bucket could be read as current.
    pub fn time_window(mut self, width: Duration, buckets: u32) -> Self {
        self.window = WindowKind::Time { width, buckets };
        self
    }

    /// The calls the window must hold before a rate can trip the breaker.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = Some(calls);
        self
    }

    /// A fixed open duration.
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.open = OpenDuration::fixed(duration);
        self
    }

    /// A fixed or growing open duration.
    pub fn open_duration(mut self, open: OpenDuration) -> Self {
        self.open = open;
        self
    }

    /// Probes admitted at the same time in half-open (`1..=1_000`); every other call is rejected.
    /// A probe that ends gives its permit to the next call.
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.probes = n;
        self
    }

    /// Successful probes that close the breaker (`1..=1_000`).
    pub fn close_after(mut self, n: u32) -> Self {
        self.close_after = n;
        self
    }

    /// The longest the breaker stays half-open without closing; past it, the next call re-opens
    /// it (resilience4j's `maxWaitDurationInHalfOpenState`), so a hung probe cannot keep it
    /// half-open for ever.
    pub fn max_half_open(mut self, duration: Duration) -> Self {
        self.max_half_open = Some(duration);
        self
    }

    /// The classes that count as failures. Any other failure (a permanent 4xx, a call whose
    /// future was dropped) is ignored: it neither counts as a failure nor as a success.
    pub fn failure_classes(mut self, classes: &[Class]) -> Self {
        self.classes = Arc::from(classes);
        self
    }

    /// A name for the breaker's events (the provider or host it guards).
    pub fn name(mut self, name: &str) -> Self {
        self.name = Arc::from(name);
        self
    }

    /// A hook that sees every transition and rejection; see [`Listener`].
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Checks the configuration and builds the breaker.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] when a rate is outside `0.0..=1.0`, a count is zero or too large, a
    /// window is empty, the minimum number of calls exceeds a count window, or the open duration
    /// is invalid (see [`OpenDuration`]).
    pub fn build(self) -> Result<BreakerLayer, BuildError> {
        self.validate()?;
        Ok(BreakerLayer::from_builder(self))
    }

    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let rate_ok = |r: f64| r > 0.0 && r <= 1.0;
        if self.consecutive == Some(0) {
            return Err(BuildError("consecutive failures must be at least 1"));
        }
        if self.failure_rate.is_some_and(|r| !rate_ok(r)) {
            return Err(BuildError("the failure rate must be within (0.0, 1.0]"));
        }
        if let Some((_, r)) = self.slow
            && !rate_ok(r)
        {
            return Err(BuildError("the slow-call rate must be within (0.0, 1.0]"));
        }
        match self.window {
            WindowKind::Count(n) if n == 0 || n > 100_000 => {
                return Err(BuildError("a count window holds 1..=100000 calls"));
            }
            WindowKind::Time { width, buckets } => {
                if width.is_zero() || buckets == 0 || buckets > 1_000 {
                    return Err(BuildError(
                        "a time window needs a non-zero bucket width and 1..=1000 buckets",
                    ));
                }
            }
            WindowKind::Count(_) => {}
        }
        if self.minimum_calls == Some(0) {
            return Err(BuildError("the minimum number of calls must be at least 1"));
        }
        if let (WindowKind::Count(n), Some(min)) = (self.window, self.minimum_calls)
            && min > n
        {
            return Err(BuildError(
                "the minimum number of calls exceeds the count window, so it could never trip",
            ));
        }
        if self.probes == 0 || self.probes > MAX_PROBES {
            return Err(BuildError("half-open probes must be within 1..=1000"));
        }
        if self.close_after == 0 || self.close_after > MAX_PROBES {
            return Err(BuildError("close-after must be within 1..=1000"));
        }
        self.open.validate()
    }

    pub(crate) fn has_rates(&self) -> bool {
        self.failure_rate.is_some() || self.slow.is_some()
    }

    pub(crate) fn minimum(&self) -> u32 {
        self.minimum_calls.unwrap_or(match self.window {
            WindowKind::Count(n) => n,
            WindowKind::Time { .. } => 100,
        })
    }

    /// The breaker this configuration describes.
    pub(crate) fn shared(&self) -> std::sync::Arc<Shared> {
        std::sync::Arc::new(Shared::new(self))
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    #[test]
    fn jittered_durations_stay_within_half_and_the_cap() {
        let cap = Duration::from_secs(4);
        for jitter in [0.1, 0.5, 1.0] {
            let d = OpenDuration::doubling(Duration::from_secs(1), cap).jitter(jitter);
            for n in 0..6 {
                let nominal = d.nth(n);
                let picks: Vec<Duration> = (0..200).map(|_| d.pick(n)).collect();
                assert!(
                    picks.iter().all(|p| *p <= cap && *p >= nominal / 2),
                    "{jitter} {n}"
                );
                let distinct: std::collections::BTreeSet<_> = picks.iter().collect();
                assert!(distinct.len() > 100, "{jitter} {n}: not spread");
            }
        }
        let fixed = OpenDuration::fixed(Duration::from_secs(10)).jitter(0.25);
        for _ in 0..200 {
            let p = fixed.pick(0);
            assert!(p >= Duration::from_secs(10) && p <= Duration::from_millis(12_500));
        }
    }
}
