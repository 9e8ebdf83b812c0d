//! The adaptive send rate of a breaker: [`AdaptiveRate`] (its settings) and the pacer each
//! breaker keeps, which lowers a provider's send rate when it answers throttled and raises it
//! again over time.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::build_error::BuildError;

/// How a breaker paces a provider that answers throttled ([`Class::THROTTLED`]: HTTP 429, gRPC
/// `RESOURCE_EXHAUSTED`, SMTP 421): an adaptive send rate per breaker, so per host for a
/// [`per_host`](super::BreakerLayer::per_host) breaker.
///
/// Until the provider throttles, nothing is limited: a call costs one atomic load more. At the
/// first throttled answer the rate starts from the successful calls a second measured from the
/// first success since the breaker was made (or last lifted its limit; over a second at least),
/// is cut to
/// [`decrease`](Self::decrease) of that and then grows along a CUBIC curve (RFC 9438 §4.2:
/// `W(t) = C·(t − K)³ + W_max`, with `K = ∛((W_max − W_cut)/C)`, `t` the seconds since the last
/// cut): quickly back towards the rate that was throttled, slowly around it, faster again beyond
/// it. Every later throttled answer cuts the rate again, at most once per
/// [`min_decrease_interval`](Self::min_decrease_interval), with CUBIC's fast convergence (RFC
/// 9438 §4.7: cut again before it grew back, the curve's plateau is set lower). The rate never
/// falls below [`floor`](Self::floor). Once no throttled answer came for
/// [`lift_after`](Self::lift_after), the limit is lifted.
///
/// While limited, the rate is watched by a task of its own on the tokio runtime of the call
/// that was throttled (off every call's path; it holds the breaker weakly and ends with the
/// limit): it tells the rate ([`Event::SendRate`](crate::observe::Event::SendRate), reason
/// `rising`) once a second and lifts the limit on time whether calls come or not, so the
/// gauges, the health report and the alerts never keep a value for a provider that gets no more
/// traffic.
///
/// While the rate is limited, calls go out at most at that rate, in the order they came: a
/// call that finds others waiting takes its place in the queue and is not sent. The breaker
/// answers it at once with a failure of class [`Class::THROTTLED`], code [`Code::Paced`],
/// [`Sent::No`], a [`PacedError`] source and, as its [`retry_after`](crate::Failure::retry_after),
/// the wait until its turn at the rate of the moment (at most a second: a caller further back
/// looks again). A [`RetryLayer`](crate::retry::RetryLayer) above keeps its place: it waits
/// (within its deadline, not counted as an attempt nor against its retry budget), looks again
/// while the turn has not come (the rate fell), and sends the request in its turn; once its
/// waits for a turn would pass its in-process bound (the bound on server hints), the request is
/// deferred to a dead-letter store like a long `Retry-After`, or given up without one. A
/// server's own hint still holds for each request: it is slept before the turn is asked for.
/// A caller of the breaker alone gets the failure, and a call it makes again takes a new place
/// at the end.
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

/// The highest rate the pacer computes, in requests a second: turns at least 1 µs apart.
const MAX_RATE: f64 = 1e6;

/// The shortest window over which the rate before the first throttled answer is measured: a
/// second, so that a burst at start-up is not taken for a rate.
const MIN_MEASURE_NANOS: u64 = 1_000_000_000;

/// One breaker's pacer: not limited (one atomic load per call) until the provider throttles.
pub(crate) struct Pacer {
    limited: AtomicBool,
    /// Successful calls, counted with a plain load and store, not an atomic add: an estimate
    /// that two threads may undercount by a call, at the cost of a load and a store on the
    /// success path.
    successes: AtomicU64,
    /// When the first success since the measure began came (nanoseconds on the breaker's
    /// clock, plus one; 0: none yet): the measure's window starts there, not at the breaker's
    /// making, so that a process that sat idle after its start (or a breaker opened on the
    /// store's evidence) does not measure its idle time as a low rate.
    first_ok: AtomicU64,
    state: Mutex<Paced>,
}

/// What a limited pacer keeps, behind its lock. Times are nanoseconds on the breaker's clock.
#[derive(Debug, Default)]
struct Paced {
    /// The settings (behind the lock: a reload changes them, the state kept).
    settings: AdaptiveRate,
    /// CUBIC's `W_max`: the rate at the last cut, requests a second.
    w_max: f64,
    /// CUBIC's `K`, in seconds.
    k: f64,
    last_decrease: u64,
    last_throttle: u64,
    /// Which limit this is: tickets of an earlier one are not in this queue.
    epoch: u64,
    /// Tickets given: a call that has to wait takes the next, and waits its turn.
    issued: u64,
    /// Turns given so far, at the rate of the moment, up to one ahead of the tickets given (a
    /// call that finds no one waiting goes at once): tickets below it may go.
    served: f64,
    /// When `served` was last brought up to date.
    served_at: u64,
    /// Callers whose turn came and who send now: the next calls go at once.
    credits: u32,
    /// The rate when the provider first throttled (this limit's peak), requests a second.
    peak: f64,
    below_half: bool,
    counting_since: u64,
    last_report: u64,
    /// The successes counted when this measure began (the first throttled answer measures
    /// the rate from there).
    ok_at_start: u64,
    /// Throttled answers before this time do not cut the rate again: they answer calls let
    /// through before the last cut.
    calm_until: u64,
    /// Whether a task watches this limit (reports the rate each second and lifts it once quiet,
    /// with or without calls).
    watched: bool,
}

/// What the task that watches a limit does next ([`Pacer::tick`]).
pub(crate) enum Tick {
    /// The limit it watched is gone (lifted at a call, or another limit since): it stops.
    Stop,
    /// The limit is lifted now, quiet for its lift time: told, and the task stops.
    Lifted(Change),
    /// Look again after this long, having told this change, if any.
    Sleep(Duration, Option<Change>),
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
    /// Send it now.
    Go,
    /// Not before its turn, about this long from now at the rate now (its place in the queue,
    /// `ticket`).
    Wait {
        wait: Duration,
        ticket: Ticket,
        rate: f64,
    },
}

impl Pacer {
    pub(crate) fn new(settings: AdaptiveRate, now: u64) -> Self {
        Pacer {
            limited: AtomicBool::new(false),
            successes: AtomicU64::new(0),
            first_ok: AtomicU64::new(0),
            state: Mutex::new(Paced {
                settings,
                counting_since: now,
                ..Paced::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Paced> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `settings` from now on, the rate and the queue as they are: a lower floor or a
    /// gentler decrease acts from the next throttled answer, a shorter lift time at the next
    /// look.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn retune(&self, settings: AdaptiveRate) {
        self.lock().settings = settings;
    }

    /// Whether calls are paced now.
    #[inline]
    pub(crate) fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Relaxed)
    }

    /// A successful call: counted, to measure the rate the provider takes; `now` is read only
    /// for the first success of a measure.
    #[inline]
    pub(crate) fn success(&self, now: impl FnOnce() -> u64) {
        let n = self.successes.load(Ordering::Relaxed);
        self.successes.store(n.wrapping_add(1), Ordering::Relaxed);
        if self.first_ok.load(Ordering::Relaxed) == 0 {
            self.first_ok
                .store(now().saturating_add(1), Ordering::Relaxed);
        }
    }

    fn ok(&self) -> u64 {
        self.successes.load(Ordering::Relaxed)
    }

    /// The rate now, requests a second, for a limited pacer: CUBIC's curve.
    fn rate_at(&self, p: &Paced, now: u64) -> f64 {
        let t = now.saturating_sub(p.last_decrease) as f64 / 1e9;
        let w = p.settings.cubic_c * (t - p.k).powi(3) + p.w_max;
        w.clamp(p.settings.floor, MAX_RATE)
    }

    /// Cuts the rate from `from` to β of it at `now`, with CUBIC's fast convergence (RFC 9438
    /// §4.7): cut again before it grew back to the last `W_max`, the provider takes less than
    /// before, so the curve's plateau is set lower, at `from · (1 + β) / 2`.
    fn cut(&self, p: &mut Paced, from: f64, now: u64) {
        // The turns due so far, at the rate before the cut.
        self.advance(p, now);
        let beta = p.settings.decrease;
        let from = from.max(p.settings.floor);
        p.w_max = if from < p.w_max {
            from * (1.0 + beta) / 2.0
        } else {
            from
        };
        let start = (from * beta).max(p.settings.floor);
        p.k = ((p.w_max - start).max(0.0) / p.settings.cubic_c).cbrt();
        p.last_decrease = now;
        // The answers to calls let through before this cut are no news.
        p.calm_until = now.saturating_add(nanos(p.settings.min_decrease_interval));
    }

    /// Gives the turns due since `served_at`, at the rate now (a turn ahead at most).
    fn advance(&self, p: &mut Paced, now: u64) {
        let elapsed = now.saturating_sub(p.served_at) as f64 / 1e9;
        let turns = elapsed * self.rate_at(p, now);
        p.served = (p.served + turns).min(p.issued as f64 + 1.0);
        p.served_at = now;
    }

    /// A throttled answer from the provider at `now`: the rate is limited, or cut again. With
    /// the change to tell, the limit's number when no task watches it yet (the caller starts
    /// one, [`tick`](Self::tick)).
    pub(crate) fn throttled(&self, now: u64) -> (Option<Change>, Option<u64>) {
        let mut p = self.lock();
        let change = self.throttled_locked(&mut p, now);
        let watch = (!p.watched && self.is_limited()).then(|| {
            p.watched = true;
            p.epoch
        });
        (change, watch)
    }

    fn throttled_locked(&self, p: &mut Paced, now: u64) -> Option<Change> {
        p.last_throttle = now;
        if !self.is_limited() {
            // Measured from the first success since the measure began (a second at least).
            let start = match self.first_ok.load(Ordering::Relaxed) {
                0 => now,
                first => (first - 1).max(p.counting_since),
            };
            let window = now.saturating_sub(start).max(MIN_MEASURE_NANOS);
            let ok = self.ok();
            let measured = ok.saturating_sub(p.ok_at_start) as f64 / (window as f64 / 1e9);
            let from = measured.clamp(p.settings.floor, MAX_RATE);
            p.peak = from;
            p.below_half = false;
            p.credits = 0;
            p.epoch = p.epoch.wrapping_add(1);
            p.issued = 0;
            p.served = 1.0;
            p.served_at = now;
            p.last_report = now;
            p.ok_at_start = ok;
            self.cut(p, from, now);
            self.limited.store(true, Ordering::Relaxed);
            return Some(Change {
                rate: Some(self.rate_at(p, now)),
                peak: p.peak,
                reason: "throttled",
            });
        }
        if now < p.calm_until {
            return None;
        }
        let current = self.rate_at(p, now);
        self.cut(p, current, now);
        p.last_report = now;
        Some(self.report(p, now, "throttled"))
    }

    /// Lifts the limit at `now`: quiet for its lift time. A new measure begins.
    fn lift(&self, p: &mut Paced, now: u64) -> Change {
        self.limited.store(false, Ordering::Relaxed);
        self.first_ok.store(0, Ordering::Relaxed);
        let peak = p.peak;
        *p = Paced {
            counting_since: now,
            ok_at_start: self.ok(),
            epoch: p.epoch,
            ..Paced::default()
        };
        Change {
            rate: None,
            peak,
            reason: "lifted",
        }
    }

    /// The watching task's look at limit `epoch` at `now`: lifted once quiet for the lift time,
    /// else the rate told when a second passed since it was last told (so that a gauge and a
    /// health reading agree with no calls), and the time until the next look (a second at
    /// most).
    pub(crate) fn tick(&self, epoch: u64, now: u64) -> Tick {
        let mut p = self.lock();
        if !self.is_limited() || p.epoch != epoch {
            return Tick::Stop;
        }
        let quiet_at = p.last_throttle.saturating_add(nanos(p.settings.lift_after));
        if now >= quiet_at {
            return Tick::Lifted(self.lift(&mut p, now));
        }
        let change = (now.saturating_sub(p.last_report) >= 1_000_000_000).then(|| {
            p.last_report = now;
            self.report(&mut p, now, "rising")
        });
        let next_report = p.last_report.saturating_add(1_000_000_000);
        let next = quiet_at.min(next_report).saturating_sub(now).max(1_000_000);
        Tick::Sleep(Duration::from_nanos(next), change)
    }

    /// No task could be started to watch limit `epoch` (no tokio runtime): a later throttled
    /// answer tries again.
    pub(crate) fn unwatch(&self, epoch: u64) {
        let mut p = self.lock();
        if p.epoch == epoch {
            p.watched = false;
        }
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

    /// Asks for a turn at `now`: at once when no one waits and the rate allows, else a place
    /// in the queue; with a change to report, when the pacer changed.
    pub(crate) fn admit(&self, now: u64) -> (Admit, Option<Change>) {
        let mut p = self.lock();
        if !self.is_limited() {
            return (Admit::Go, None);
        }
        if now.saturating_sub(p.last_throttle) >= nanos(p.settings.lift_after) {
            return (Admit::Go, Some(self.lift(&mut p, now)));
        }
        let change = (now.saturating_sub(p.last_report) >= 1_000_000_000).then(|| {
            p.last_report = now;
            self.report(&mut p, now, "rising")
        });
        if p.credits > 0 {
            p.credits -= 1;
            return (Admit::Go, change);
        }
        self.advance(&mut p, now);
        let ticket = p.issued;
        p.issued += 1;
        if (ticket as f64) < p.served {
            return (Admit::Go, change);
        }
        let rate = self.rate_at(&p, now);
        let wait = Admit::Wait {
            wait: turn_in(&p, ticket, rate),
            ticket: Ticket {
                epoch: p.epoch,
                number: ticket,
            },
            rate,
        };
        (wait, change)
    }

    /// Whether `ticket`'s turn came at `now`: `Ok` and the caller sends now (the breaker lets
    /// its call through), or `Err` with the time until it comes at the rate now.
    pub(crate) fn redeem(&self, ticket: Ticket, now: u64) -> Result<(), Duration> {
        if !self.is_limited() {
            return Ok(());
        }
        let mut p = self.lock();
        if ticket.epoch != p.epoch {
            return Ok(());
        }
        self.advance(&mut p, now);
        if (ticket.number as f64) < p.served {
            p.credits = p.credits.saturating_add(1);
            return Ok(());
        }
        let rate = self.rate_at(&p, now);
        Err(turn_in(&p, ticket.number, rate))
    }

    /// `ticket` will not be used: its turn goes to the next in line.
    pub(crate) fn give_back(&self, ticket: Ticket, now: u64) {
        let mut p = self.lock();
        if ticket.epoch != p.epoch || !self.is_limited() {
            return;
        }
        self.advance(&mut p, now);
        if ticket.number + 1 == p.issued {
            p.issued -= 1;
            p.served = p.served.min(p.issued as f64 + 1.0);
        } else if (ticket.number as f64) >= p.served {
            p.served = (p.served + 1.0).min(p.issued as f64 + 1.0);
        }
    }

    /// The rate now and its peak, requests a second: `None` while not limited.
    pub(crate) fn current(&self, now: u64) -> Option<(f64, f64)> {
        if !self.is_limited() {
            return None;
        }
        let p = self.lock();
        // Quiet for the lift time: lifted at the next call, and not limited for a reader now.
        if now.saturating_sub(p.last_throttle) >= nanos(p.settings.lift_after) {
            return None;
        }
        Some((self.rate_at(&p, now), p.peak))
    }
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("settings", &self.lock().settings)
            .field("limited", &self.is_limited())
            .finish_non_exhaustive()
    }
}

/// The wait until `ticket`'s turn at `rate`, at most a second: the rate may grow meanwhile, so
/// a caller far back in the queue looks again (and waits what it really waited, not what the
/// rate of the moment foretold).
fn turn_in(p: &Paced, ticket: u64, rate: f64) -> Duration {
    let turns = ticket as f64 + 1.0 - p.served;
    Duration::from_secs_f64((turns / rate).clamp(0.0, 1.0))
}

/// A place in a limited pacer's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    epoch: u64,
    number: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

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

    /// How long until the call's turn, at the rate when it came (at most a second: a call
    /// further back in the queue looks again then).
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

impl fmt::Display for PacedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "send rate of `{}` lowered to {:.1}/s after throttled answers; its turn in {:?}",
            self.breaker, self.rate, self.wait
        )
    }
}

impl std::error::Error for PacedError {}
