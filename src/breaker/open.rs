//! How long a breaker stays open after a trip, and what its rejections say.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::failure::{Class, Code};

/// How long a breaker stays open after a trip: fixed, or growing with each consecutive trip,
/// with optional jitter. Set with [`Builder::open_for`](super::Builder::open_for),
/// [`Builder::open_doubling`](super::Builder::open_doubling) and
/// [`Builder::open_jitter`](super::Builder::open_jitter).
///
/// "Consecutive trips" are openings with no close in between: a trip from closed, then each failed
/// probe. One successful half-open period (the breaker closes) starts the count again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OpenDuration {
    base: Duration,
    cap: Duration,
    growing: bool,
    jitter: f64,
}

impl OpenDuration {
    /// The same `duration` after every trip.
    pub(crate) const fn fixed(duration: Duration) -> Self {
        OpenDuration {
            base: duration,
            cap: duration,
            growing: false,
            jitter: 0.0,
        }
    }

    /// `base` after the first trip, doubled after each consecutive trip, never above `cap`.
    pub(crate) const fn doubling(base: Duration, cap: Duration) -> Self {
        OpenDuration {
            base,
            cap,
            growing: true,
            jitter: 0.0,
        }
    }

    /// Spreads each duration by up to `fraction` of it (see [`pick`](Self::pick)).
    pub(crate) const fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The jitter fraction.
    pub(crate) const fn jitter_fraction(&self) -> f64 {
        self.jitter
    }

    /// Its base, cap, whether it grows, and its jitter.
    pub(crate) const fn parts(&self) -> (Duration, Duration, bool, f64) {
        (self.base, self.cap, self.growing, self.jitter)
    }

    /// The duration after the trip numbered `n` (0 for the first of a series), before jitter.
    pub(crate) fn nth(&self, n: u32) -> Duration {
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

    /// What is wrong with this duration, if anything, and the setting at fault
    /// ([`Builder::build`](super::Builder::build) reports it).
    pub(crate) fn problem(&self) -> Option<(&'static str, &'static str)> {
        if !(0.0..=1.0).contains(&self.jitter) {
            return Some((
                "open_jitter",
                "open-duration jitter must be within 0.0..=1.0",
            ));
        }
        if self.growing && self.base.is_zero() {
            return Some((
                "open_doubling",
                "a doubling open duration needs a non-zero base",
            ));
        }
        if self.growing && self.cap < self.base {
            return Some(("open_doubling", "the open-duration cap is below its base"));
        }
        None
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    #[test]
    fn both_errors_of_a_pair_read_the_one_cause() {
        let slot = Arc::new(CauseSlot::default());
        let [open, forced] = OpenError::pair(&Arc::from("mail"), &slot);
        assert!(!open.forced() && forced.forced());
        assert!(open.cause_now().is_none() && forced.cause().is_none());
        let now = Instant::now();
        slot.set(Some(Cause {
            class: Class::TRANSIENT,
            code: Code::Http(http::StatusCode::SERVICE_UNAVAILABLE),
            message: "upstream said no".into(),
            at: now,
            failures: 1,
            since: now,
            learned: None,
        }));
        for e in [&open, &forced] {
            let cause = e.cause_now().expect("the cause is shared");
            assert_eq!(
                cause.code,
                Code::Http(http::StatusCode::SERVICE_UNAVAILABLE)
            );
            assert_eq!(
                e.cause().as_deref(),
                Some("upstream said no (http 503); 1 failure")
            );
        }
    }

    #[test]
    fn open_duration_never_grows_past_its_cap() {
        let d = OpenDuration::doubling(Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(d.nth(0), Duration::from_secs(1));
        assert_eq!(d.nth(5), Duration::from_secs(32));
        assert_eq!(d.nth(6), Duration::from_secs(60));
        assert_eq!(d.nth(u32::MAX), Duration::from_secs(60));
        let huge = OpenDuration::doubling(Duration::MAX, Duration::MAX);
        assert_eq!(huge.nth(1_000), Duration::MAX);
    }

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

/// The last real failure of a breaker's provider, kept while the breaker is not closed: the
/// failure that opened it, or the failed probe after it; or, for a breaker opened on an earlier
/// process's evidence (its deferred records in the store), what that evidence says
/// ([`learned`](Self::learned), with no failure counted here: `failures` 0).
#[derive(Clone, Debug)]
pub(crate) struct Cause {
    // Read by the dead-letter layer, for a record's root cause.
    #[cfg_attr(not(feature = "dead-letter"), allow(dead_code))]
    pub(crate) class: Class,
    pub(crate) code: Code,
    pub(crate) message: String,
    /// When it failed.
    pub(crate) at: Instant,
    /// The failures the breaker counted since it last closed, this one included.
    pub(crate) failures: u64,
    /// When the first of them failed.
    pub(crate) since: Instant,
    /// Where the breaker learned it was open, when it was opened on the store's evidence rather
    /// than on failures of its own (`learned from the store, opened at …`): kept through the
    /// failed probes that follow, until the breaker closes.
    pub(crate) learned: Option<Arc<str>>,
}

#[cfg(feature = "dead-letter")]
impl Cause {
    /// The cause of a breaker opened on the store's evidence, `learned` saying where: no
    /// failure of this process yet.
    pub(crate) fn learned(learned: String, now: Instant) -> Self {
        Cause {
            class: Class::CIRCUIT_OPEN,
            code: Code::CircuitOpen,
            message: learned.clone(),
            at: now,
            failures: 0,
            since: now,
            learned: Some(Arc::from(learned)),
        }
    }
}

/// Where a breaker keeps its [`Cause`], shared with its [`OpenError`]s: written when it opens
/// (and when a probe fails), cleared when it closes; never touched by a call that succeeds.
#[derive(Debug, Default)]
pub(crate) struct CauseSlot(Mutex<Option<Arc<Cause>>>);

impl CauseSlot {
    pub(crate) fn set(&self, cause: Option<Cause>) {
        let cause = cause.map(Arc::new);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = cause;
    }

    pub(crate) fn get(&self) -> Option<Arc<Cause>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The source of an open breaker's rejection ([`Class::CIRCUIT_OPEN`](crate::Class::CIRCUIT_OPEN),
/// [`Code::CircuitOpen`](crate::Code::CircuitOpen)): which breaker rejected the call, and why it
/// opened.
///
/// Its `Display` reads `breaker "api.mail.test:443" is open` (or `is forced open` when an
/// operator opened it); the failure's own `Display` and
/// [`message`](crate::Failure::message) add the time left until half-open, its
/// [`retry_after`](crate::Failure::retry_after), rounded up to the millisecond:
/// `breaker "api.mail.test:443" is open; half-opens in 2.5s`. A dead-letter record keeps the
/// absolute time instead (`half-opens at 2026-04-01T14:00:02.500Z`) and, as its
/// [`cause`](crate::store::Record::cause), the provider's last real failure that
/// [`cause`](OpenError::cause) describes. One `OpenError` per breaker is shared by all of its
/// rejections, so that a rejection allocates only its failure.
#[derive(Debug)]
pub struct OpenError {
    breaker: Arc<str>,
    forced: bool,
    cause: Arc<CauseSlot>,
}

impl OpenError {
    /// The pair a breaker named `breaker` answers with: open, forced open; both read `cause`.
    pub(crate) fn pair(breaker: &Arc<str>, cause: &Arc<CauseSlot>) -> [Arc<OpenError>; 2] {
        [false, true].map(|forced| {
            Arc::new(OpenError {
                breaker: Arc::clone(breaker),
                forced,
                cause: Arc::clone(cause),
            })
        })
    }

    /// The breaker's name ([`Builder::name`](super::Builder::name); a keyed breaker's key).
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// Whether an operator forced the breaker open (no time is known until it half-opens).
    pub fn forced(&self) -> bool {
        self.forced
    }

    /// Why the breaker is open, as its provider failed: the last real failure it counted (the
    /// one that opened it, or a failed probe since), its code, and how many failures it counted
    /// since it last closed, over how long:
    /// `connection refused (io ConnectionRefused); 12 failures in 10.2s`. `None` when the
    /// breaker is closed again, or was forced open with no failure.
    pub fn cause(&self) -> Option<String> {
        self.cause.get().map(|c| describe(&c))
    }

    pub(crate) fn cause_now(&self) -> Option<Arc<Cause>> {
        self.cause.get()
    }
}

/// `message (code); N failures in D` (or `1 failure`), the text of a cause; the code is not
/// repeated when the message names it already (a failure with no source error reads
/// `transient (http 503)`). A breaker opened on the store's evidence reads what it learned
/// (`learned from the store, opened at …`), after its own failures when a probe has failed
/// since.
pub(crate) fn describe(c: &Cause) -> String {
    match (&c.learned, c.failures) {
        (Some(learned), 0) => learned.to_string(),
        (Some(learned), _) => format!("{}; {learned}", counted(c)),
        (None, _) => counted(c),
    }
}

/// `message (code); N failures in D` (or `1 failure`).
fn counted(c: &Cause) -> String {
    let span = c.at.saturating_duration_since(c.since);
    let span = Duration::from_millis(u64::try_from(span.as_millis()).unwrap_or(u64::MAX));
    let code = c.code.to_string();
    let what = if c.message.contains(&code) {
        c.message.clone()
    } else {
        format!("{} ({code})", c.message)
    };
    match c.failures {
        0 | 1 => format!("{what}; 1 failure"),
        n => format!("{what}; {n} failures in {span:?}"),
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.forced { "forced open" } else { "open" };
        write!(f, "breaker {:?} is {how}", &*self.breaker)
    }
}

impl std::error::Error for OpenError {}

#[cfg(test)]
mod open_error_tests {
    use super::*;

    #[test]
    fn a_cause_reads_its_failure_code_count_and_span_once() {
        let at = Instant::now();
        let cause = |message: &str, failures| Cause {
            class: Class::TRANSIENT,
            code: Code::Io(std::io::ErrorKind::ConnectionRefused),
            message: message.to_owned(),
            at: at + Duration::from_millis(10_250),
            failures,
            since: at,
            learned: None,
        };
        assert_eq!(
            describe(&cause("connection refused", 12)),
            "connection refused (io ConnectionRefused); 12 failures in 10.25s"
        );
        assert_eq!(
            describe(&cause("transient (io ConnectionRefused)", 1)),
            "transient (io ConnectionRefused); 1 failure"
        );
        // Kept in the slot until the breaker closes; shared by both of its errors.
        let slot = Arc::new(CauseSlot::default());
        let [open, forced] = OpenError::pair(&Arc::from("api.mail.test:443"), &slot);
        assert_eq!(open.cause(), None);
        slot.set(Some(cause("connection refused", 3)));
        assert_eq!(open.cause(), forced.cause());
        assert!(open.cause().unwrap().starts_with("connection refused"));
        slot.set(None);
        assert_eq!(forced.cause(), None);
    }

    #[test]
    fn an_open_breakers_failure_has_its_open_error_as_source() {
        use crate::breaker::future::rejection_failure;
        use crate::retry::{Attempts, GiveUp};
        use crate::{Class, Code, Failure};

        let [open, forced] = OpenError::pair(&Arc::from("api.mail.test:443"), &Arc::default());
        let f: Failure<u8> = rejection_failure(open, Some(Duration::from_millis(2500)));
        assert_eq!(
            (f.class(), f.code()),
            (Class::CIRCUIT_OPEN, Code::CircuitOpen)
        );
        let source = std::error::Error::source(&f).expect("a source");
        let open = source.downcast_ref::<OpenError>().expect("the OpenError");
        assert_eq!(open.breaker(), "api.mail.test:443");
        assert_eq!(f.retry_after(), Some(Duration::from_millis(2500)));
        let message = r#"breaker "api.mail.test:443" is open; half-opens in 2.5s"#;
        assert_eq!(f.message(), message);
        assert!(f.to_string().ends_with(message), "{f}");
        assert!(format!("{f:?}").contains("api.mail.test:443"), "{f:?}");
        // With the retry layer's notes too, `Debug` still names one source.
        let noted: Failure<u8> = rejection_failure::<u8>(forced, None).with_note(
            Attempts::new(0, GiveUp::Deferred).with_first_failed_at(std::time::SystemTime::now()),
        );
        let debug = format!("{noted:?}");
        assert_eq!(debug.matches("source:").count(), 1, "{debug}");
        assert!(debug.contains("api.mail.test:443"), "{debug}");
        assert_eq!(
            noted.message(),
            r#"breaker "api.mail.test:443" is forced open"#
        );
        // Kept when the response type changes; replaced by a later source.
        let f = f.map_response(|_| ());
        assert_eq!(f.message(), message);
        let f = f.with_source("another cause");
        assert_eq!(f.message(), "another cause");
        assert!(
            std::error::Error::source(&f)
                .unwrap()
                .downcast_ref::<OpenError>()
                .is_none()
        );
    }
}
