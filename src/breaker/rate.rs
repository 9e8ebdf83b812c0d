//! The adaptive send rate of a breaker: [`AdaptiveRate`] (its settings) and the pacer each
//! breaker keeps, which lowers a provider's send rate when it answers throttled and raises it
//! again over time.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::build_error::BuildError;
use crate::failure::Note;

/// How a breaker paces a provider that answers throttled ([`Class::THROTTLED`]: HTTP 429, gRPC
/// `RESOURCE_EXHAUSTED`, SMTP 421): an adaptive send rate per breaker, so per host for a
/// [`per_host`](super::BreakerLayer::per_host) breaker.
///
/// Until the provider throttles, nothing is limited: a call costs one atomic load more. At the
/// first throttled answer the rate starts from the successful calls a second measured since the
/// breaker was made (or last lifted its limit), is cut to [`decrease`](Self::decrease) of that
/// and then grows along a CUBIC curve (RFC 9438 §4.2: `W(t) = C·(t − K)³ + W_max`, with
/// `K = ∛(W_max·(1 − β)/C)`, `t` the seconds since the last cut): quickly back towards the
/// rate that was throttled, slowly around it, faster again beyond it. Every later throttled
/// answer cuts the rate again, at most once per [`min_decrease_interval`](Self::min_decrease_interval).
/// The rate never falls below [`floor`](Self::floor). Once no throttled answer came for
/// [`lift_after`](Self::lift_after), the limit is lifted.
///
/// While the rate is limited, calls are spaced by `1 / rate` seconds. A call that comes before
/// its slot is not sent: the breaker answers at once with a failure of class
/// [`Class::THROTTLED`], code [`Code::Paced`], [`Sent::No`] and the wait until the slot it
/// reserved as [`retry_after`](crate::Failure::retry_after). A [`RetryLayer`](crate::retry::RetryLayer)
/// above waits that long (within its deadline, and not counted as an attempt nor against its
/// retry budget) and sends the request in its slot; a wait above its in-process bound defers
/// the request to a dead-letter store like a long `Retry-After`. A server's own hint still
/// holds for each request: it is slept before the slot is asked for.
///
/// This is the client-side rate limiting of the AWS SDKs' adaptive retry mode (a token bucket
/// whose rate follows CUBIC on throttling errors); the defaults are theirs and RFC 9438's:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`decrease`](Self::decrease) (β) | 0.7 | RFC 9438 §4.6, AWS SDKs' `BETA` |
/// | [`cubic_c`](Self::cubic_c) (C) | 0.4 | RFC 9438 §5, AWS SDKs' `SCALE_CONSTANT` |
/// | [`floor`](Self::floor) | 0.5 requests/s | AWS SDKs' minimum fill rate |
/// | [`min_decrease_interval`](Self::min_decrease_interval) | 1 s | one cut per burst of throttled answers, as TCP cuts once per round trip |
/// | [`lift_after`](Self::lift_after) | 30 s | ours |
///
/// [`Class::THROTTLED`]: crate::Class::THROTTLED
/// [`Code::Paced`]: crate::Code::Paced
/// [`Sent::No`]: crate::Sent::No
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveRate {
    pub(crate) decrease: f64,
    pub(crate) cubic_c: f64,
    pub(crate) floor: f64,
    pub(crate) min_decrease_interval: Duration,
    pub(crate) lift_after: Duration,
}

impl Default for AdaptiveRate {
    fn default() -> Self {
        AdaptiveRate {
            decrease: 0.7,
            cubic_c: 0.4,
            floor: 0.5,
            min_decrease_interval: Duration::from_secs(1),
            lift_after: Duration::from_secs(30),
        }
    }
}

impl AdaptiveRate {
    /// The defaults of the table above.
    pub fn new() -> Self {
        AdaptiveRate::default()
    }

    /// The share of the rate kept at each throttled answer (β, within `(0.0, 1.0)`; 0.7).
    pub fn decrease(mut self, beta: f64) -> Self {
        self.decrease = beta;
        self
    }

    /// CUBIC's scaling constant C (above 0.0; 0.4): how fast the rate grows back, in requests
    /// per second per second cubed.
    pub fn cubic_c(mut self, c: f64) -> Self {
        self.cubic_c = c;
        self
    }

    /// The lowest rate, in requests per second (above 0.0; 0.5). A provider that throttles
    /// forever is sent at most this much; callers then wait long enough that a dead-letter store
    /// takes their requests, or their deadline ends them.
    pub fn floor(mut self, requests_per_second: f64) -> Self {
        self.floor = requests_per_second;
        self
    }

    /// The shortest time between two cuts of the rate (1 s): the throttled answers to calls
    /// already out when the rate was cut do not cut it again.
    pub fn min_decrease_interval(mut self, interval: Duration) -> Self {
        self.min_decrease_interval = interval;
        self
    }

    /// How long without a throttled answer before the limit is lifted (30 s, above zero).
    pub fn lift_after(mut self, quiet: Duration) -> Self {
        self.lift_after = quiet;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the first setting out of range: `decrease` outside
    /// `(0.0, 1.0)`, `cubic_c` or `floor` not above 0.0 (or not finite), `lift_after` zero.
    pub(crate) fn check(&self) -> Result<(), BuildError> {
        let finite_positive = |v: f64| v.is_finite() && v > 0.0;
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(BuildError::new(
                "adaptive_rate.decrease",
                self.decrease,
                "the share kept must be within (0.0, 1.0)",
            ));
        }
        if !finite_positive(self.cubic_c) {
            return Err(BuildError::new(
                "adaptive_rate.cubic_c",
                self.cubic_c,
                "CUBIC's constant must be above 0.0",
            ));
        }
        if !finite_positive(self.floor) {
            return Err(BuildError::new(
                "adaptive_rate.floor",
                self.floor,
                "the lowest send rate must be above 0.0 requests a second",
            ));
        }
        if self.lift_after.is_zero() {
            return Err(BuildError::new(
                "adaptive_rate.lift_after",
                format_args!("{:?}", self.lift_after),
                "the quiet time before the limit is lifted must be above zero",
            ));
        }
        Ok(())
    }
}

/// The highest rate the pacer computes, in requests a second: slots at least 1 µs apart.
const MAX_RATE: f64 = 1e6;

/// The shortest window over which the rate before the first throttled answer is measured: a
/// second, so that a burst at start-up is not taken for a rate.
const MIN_MEASURE_NANOS: u64 = 1_000_000_000;

/// One breaker's pacer: not limited (one atomic load per call) until the provider throttles.
pub(crate) struct Pacer {
    settings: AdaptiveRate,
    limited: AtomicBool,
    /// Successful calls, counted with a plain load and store, not an atomic add: an estimate
    /// that two threads may undercount by a call, at the cost of a load and a store on the
    /// success path.
    successes: AtomicU64,
    state: Mutex<Paced>,
}

/// What a limited pacer keeps, behind its lock. Times are nanoseconds on the breaker's clock.
#[derive(Debug, Default)]
struct Paced {
    /// CUBIC's `W_max`: the rate at the last cut, requests a second.
    w_max: f64,
    /// CUBIC's `K`, in seconds.
    k: f64,
    last_decrease: u64,
    last_throttle: u64,
    /// The first slot not yet given: a call admitted now takes it or a later one.
    next_slot: u64,
    /// The interval the last slot was given with, to take it back.
    last_interval: u64,
    /// Slots redeemed by callers that waited for them: the next calls go at once.
    credits: u32,
    /// The rate when the provider first throttled (this limit's peak), requests a second.
    peak: f64,
    below_half: bool,
    counting_since: u64,
    last_report: u64,
    /// Calls let through since `bucket_start`, and the rate of the last whole bucket (a
    /// second or more), requests a second: what was really sent, which the computed rate can
    /// run ahead of while callers wait in slots given at an older rate.
    bucket_start: u64,
    bucket_sent: u32,
    sent_rate: Option<f64>,
    /// The successes counted when the bucket began, and the rate of successes of the last
    /// whole bucket: what the provider took.
    bucket_ok: u64,
    ok_rate: Option<f64>,
    /// Throttled answers before this time do not cut the rate again: they answer calls sent
    /// in slots given before the last cut.
    calm_until: u64,
}

impl Paced {
    /// A call let through at `now`, with `ok` successes counted so far.
    fn sent(&mut self, now: u64, ok: u64) {
        let elapsed = now.saturating_sub(self.bucket_start);
        if elapsed >= 1_000_000_000 {
            let secs = elapsed as f64 / 1e9;
            self.sent_rate = Some(f64::from(self.bucket_sent) / secs);
            self.ok_rate = Some(ok.saturating_sub(self.bucket_ok) as f64 / secs);
            self.bucket_start = now;
            self.bucket_sent = 0;
            self.bucket_ok = ok;
        }
        self.bucket_sent = self.bucket_sent.saturating_add(1);
    }
}

/// What a rate change says, for the breaker's event and log line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Change {
    /// The rate now, `None` once lifted.
    pub(crate) rate: Option<f64>,
    pub(crate) peak: f64,
    pub(crate) reason: &'static str,
}

/// How the pacer answers a call.
pub(crate) enum Admit {
    /// Send it now (with a change to report, when the pacer changed).
    Go(Option<Change>),
    /// Not before its slot, this long from now (a slot reserved for it at `slot`).
    Wait {
        wait: Duration,
        slot: u64,
        rate: f64,
    },
}

impl Pacer {
    pub(crate) fn new(settings: AdaptiveRate, now: u64) -> Self {
        Pacer {
            settings,
            limited: AtomicBool::new(false),
            successes: AtomicU64::new(0),
            state: Mutex::new(Paced {
                counting_since: now,
                ..Paced::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Paced> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether calls are paced now.
    #[inline]
    pub(crate) fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Relaxed)
    }

    /// A successful call: counted, to measure the rate the provider takes.
    #[inline]
    pub(crate) fn success(&self) {
        let n = self.successes.load(Ordering::Relaxed);
        self.successes.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    fn ok(&self) -> u64 {
        self.successes.load(Ordering::Relaxed)
    }

    /// The rate now, requests a second, for a limited pacer: CUBIC's curve, and at most twice
    /// the rate really sent (as the AWS SDKs bound theirs), so that it cannot run far ahead of
    /// what the provider was shown to take.
    fn rate_at(&self, p: &Paced, now: u64) -> f64 {
        let t = now.saturating_sub(p.last_decrease) as f64 / 1e9;
        let mut w = self.settings.cubic_c * (t - p.k).powi(3) + p.w_max;
        if let Some(sent) = p.sent_rate {
            w = w.min(2.0 * sent.max(p.w_max / 2.0));
        }
        w.clamp(self.settings.floor, MAX_RATE)
    }

    /// Cuts the rate from `from` to β of it at `now`, with CUBIC's fast convergence (RFC 9438
    /// §4.7): cut again before it grew back to the last `W_max`, the provider takes less than
    /// before, so the curve's plateau is set lower, at `from · (1 + β) / 2`.
    fn cut(&self, p: &mut Paced, from: f64, now: u64) {
        let beta = self.settings.decrease;
        let from = from.max(self.settings.floor);
        p.w_max = if from < p.w_max {
            from * (1.0 + beta) / 2.0
        } else {
            from
        };
        let start = (from * beta).max(self.settings.floor);
        p.k = ((p.w_max - start).max(0.0) / self.settings.cubic_c).cbrt();
        p.last_decrease = now;
        // The answers to calls in slots given before this cut are no news.
        p.calm_until = now
            .saturating_add(nanos(self.settings.min_decrease_interval))
            .max(p.next_slot);
        // Slots given at the old rate stay given; credits of waiters stay theirs.
    }

    /// A throttled answer from the provider at `now`: the rate is limited, or cut again.
    pub(crate) fn throttled(&self, now: u64) -> Option<Change> {
        let mut p = self.lock();
        p.last_throttle = now;
        if !self.is_limited() {
            let window = now.saturating_sub(p.counting_since).max(MIN_MEASURE_NANOS);
            let ok = self.ok();
            let measured = ok.saturating_sub(p.bucket_ok) as f64 / (window as f64 / 1e9);
            let from = measured.clamp(self.settings.floor, MAX_RATE);
            p.peak = from;
            p.below_half = false;
            p.credits = 0;
            p.next_slot = now;
            p.last_report = now;
            p.bucket_start = now;
            p.bucket_sent = 0;
            p.bucket_ok = ok;
            p.sent_rate = None;
            p.ok_rate = None;
            self.cut(&mut p, from, now);
            self.limited.store(true, Ordering::Relaxed);
            return Some(Change {
                rate: Some(self.rate_at(&p, now)),
                peak: p.peak,
                reason: "throttled",
            });
        }
        if now < p.calm_until {
            return None;
        }
        // Cut from what the provider took (or what was sent), when less than the rate allowed.
        let mut current = self.rate_at(&p, now);
        for measured in [p.sent_rate, p.ok_rate].into_iter().flatten() {
            current = current.min(measured);
        }
        self.cut(&mut p, current, now);
        p.last_report = now;
        Some(self.report(&mut p, now, "throttled"))
    }

    /// The change to report at `now`, with the log line when the rate crossed half its peak.
    fn report(&self, p: &mut Paced, now: u64, reason: &'static str) -> Change {
        let rate = self.rate_at(p, now);
        if rate < p.peak / 2.0 && !p.below_half {
            p.below_half = true;
            return Change {
                rate: Some(rate),
                peak: p.peak,
                reason: "below_half",
            };
        }
        if rate >= p.peak && p.below_half {
            p.below_half = false;
            return Change {
                rate: Some(rate),
                peak: p.peak,
                reason: "recovered",
            };
        }
        Change {
            rate: Some(rate),
            peak: p.peak,
            reason,
        }
    }

    /// Asks for a slot at `now` (a limited pacer only).
    pub(crate) fn admit(&self, now: u64) -> Admit {
        let mut p = self.lock();
        if !self.is_limited() {
            return Admit::Go(None);
        }
        if now.saturating_sub(p.last_throttle) >= nanos(self.settings.lift_after) {
            self.limited.store(false, Ordering::Relaxed);
            let peak = p.peak;
            *p = Paced {
                counting_since: now,
                bucket_ok: self.ok(),
                ..Paced::default()
            };
            return Admit::Go(Some(Change {
                rate: None,
                peak,
                reason: "lifted",
            }));
        }
        let change = (now.saturating_sub(p.last_report) >= 1_000_000_000).then(|| {
            p.last_report = now;
            self.report(&mut p, now, "rising")
        });
        if p.credits > 0 {
            p.credits -= 1;
            p.sent(now, self.ok());
            return Admit::Go(change);
        }
        let rate = self.rate_at(&p, now);
        let interval = ((1e9 / rate) as u64).max(1);
        p.last_interval = interval;
        if p.next_slot <= now {
            p.next_slot = now.saturating_add(interval);
            p.sent(now, self.ok());
            return Admit::Go(change);
        }
        let slot = p.next_slot;
        p.next_slot = slot.saturating_add(interval);
        Admit::Wait {
            wait: Duration::from_nanos(slot - now),
            slot,
            rate,
        }
    }

    /// A caller that waited for its slot sends now: the next call goes at once.
    pub(crate) fn redeem(&self) {
        if self.is_limited() {
            let mut p = self.lock();
            p.credits = p.credits.saturating_add(1);
        }
    }

    /// A slot reserved at `slot` will not be used: given back when it is the last one given.
    pub(crate) fn give_back(&self, slot: u64) {
        let mut p = self.lock();
        if p.next_slot.checked_sub(p.last_interval) == Some(slot) {
            p.next_slot = slot;
        }
    }

    /// The rate now and its peak, requests a second: `None` while not limited.
    pub(crate) fn current(&self, now: u64) -> Option<(f64, f64)> {
        if !self.is_limited() {
            return None;
        }
        let p = self.lock();
        Some((self.rate_at(&p, now), p.peak))
    }
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("settings", &self.settings)
            .field("limited", &self.is_limited())
            .finish_non_exhaustive()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The slot a paced call reserved, on its failure: a retry layer that waits for it redeems it
/// just before it sends again, so that the breaker lets that call through at once; dropped
/// unredeemed, it is given back when it is still the last slot given.
pub(crate) struct SendSlot {
    pub(crate) shared: Arc<super::state::Shared>,
    pub(crate) slot: u64,
    pub(crate) redeemed: bool,
}

impl SendSlot {
    /// The caller sends now, in its slot.
    pub(crate) fn redeem(mut self) {
        self.redeemed = true;
        if let Some(pacer) = self.shared.pacer() {
            pacer.redeem();
        }
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        if !self.redeemed
            && let Some(pacer) = self.shared.pacer()
        {
            pacer.give_back(self.slot);
        }
    }
}

impl fmt::Debug for SendSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendSlot")
            .field("breaker", &self.shared.name)
            .field("slot", &self.slot)
            .finish()
    }
}

impl Note for SendSlot {}

/// The source of a paced call's failure: the breaker, its rate and the wait.
#[derive(Debug)]
pub struct PacedError {
    breaker: Arc<str>,
    rate: f64,
    wait: Duration,
}

impl PacedError {
    pub(crate) fn new(breaker: Arc<str>, rate: f64, wait: Duration) -> Self {
        PacedError {
            breaker,
            rate,
            wait,
        }
    }

    /// The breaker's name (a keyed breaker's key, such as `api.mail.test:443`).
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// The send rate when the call came, in requests a second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// How long until the slot reserved for the call.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

impl fmt::Display for PacedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "send rate of `{}` lowered to {:.1}/s after throttled answers; next slot in {:?}",
            self.breaker, self.rate, self.wait
        )
    }
}

impl std::error::Error for PacedError {}
