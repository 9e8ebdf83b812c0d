//! The adaptive concurrency limit of a breaker: [`AdaptiveConcurrency`] (its settings) and the
//! limiter each breaker keeps, which bounds the calls in flight to a provider that signals
//! overload, learns the bound from its answers, and lifts it once the provider is quiet.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::StatusCode;

use super::slot::{Queue, SendSlot};
use super::state::{Permit, Shared};
use crate::build_error::BuildError;
use crate::failure::{Class, Code, Failure, Sent};
use crate::observe::Event;
use crate::status::DelaySource;

/// How a breaker bounds the calls in flight to a provider that signals overload: an adaptive
/// concurrency limit per breaker, so per host for a
/// [`per_host`](super::BreakerLayer::per_host) breaker. It sits beside the adaptive send rate
/// ([`AdaptiveRate`](super::AdaptiveRate)): the rate paces a provider that throttles by
/// requests a second, the limit one that throttles by requests at once, or answers overload by
/// slowing down.
///
/// Off by default ([`Builder::adaptive_concurrency`](super::Builder::adaptive_concurrency),
/// [`BackstopLayer::adaptive_concurrency`](crate::BackstopLayer::adaptive_concurrency) turn it
/// on): it cannot tell an overload from failures of single requests, so against a provider that
/// answers one request in five `429` or `503` whatever the load it cuts the calls in flight to a
/// few. Turn it on for a provider that limits the calls in flight.
///
/// Once on, until the provider signals overload, nothing is counted: a call costs one atomic load more,
/// and allocates nothing. The first overload answer turns the limit on: an answer of class
/// [`Class::THROTTLED`] (HTTP 429, gRPC `RESOURCE_EXHAUSTED`, SMTP 421) or an HTTP 503, with or
/// without `Retry-After`, while the breaker is closed (the failures of an outage are the
/// breaker's to count, not a sign of load; gRPC `UNAVAILABLE` is not taken as overload either,
/// since a refused connection answers it too). From then on the calls in flight are counted,
/// and the limit starts from what the provider was taking: the most calls in flight at once
/// from the overload answer until the first success of a call sent after it (one round trip of
/// the provider, a second at most), times [`decrease`](Self::decrease).
///
/// The limit then follows AIMD, the loss-based rule of Netflix concurrency-limits'
/// `AIMDLimit` (and of TCP's congestion window, RFC 5681 §3.1):
///
/// - **decrease**: an overload answer to a call sent after the last decrease multiplies the
///   limit by [`decrease`](Self::decrease) (and takes at least 1 off, as `AIMDLimit` does). The
///   answers to calls sent before it are no news: the limit falls at most once per round trip,
///   however many calls were out when the provider said so.
/// - **latency**: a round trip (and ten successes at least, the sample window of Netflix's
///   `WindowedLimit`) whose mean latency passed [`latency_tolerance`](Self::latency_tolerance)
///   times the lowest such mean seen since the limit turned on (the minimum round trip that
///   Netflix's `GradientLimit`, Envoy's adaptive concurrency filter and TCP Vegas compare
///   with) counts as an overload answer for the decrease, not for the lift. After five such
///   round trips in a row at a limit of 1, the latency is taken as the provider's new normal
///   and becomes the lowest (as Envoy measures its minimum round trip again after five windows
///   at its lowest limit).
/// - **increase**: each success adds `1 / limit`, so the limit grows by one per round trip
///   whose calls all succeeded (TCP's congestion avoidance), unless fewer than half of the
///   limit were in flight when the call was sent (`AIMDLimit`'s rule: a limit that is not
///   reached learns nothing), or the success was slower than the latency rule allows (a slow
///   answer is no sign of room). `AIMDLimit` adds 1 per success because it also cuts on every
///   drop; with one decrease a round trip, 1 per success would settle at several times what
///   the provider takes.
///
/// The limit never falls below 1 call and never rises above [`max`](Self::max). Once no
/// overload answer came for [`lift_after`](Self::lift_after), the limit is lifted and counting
/// stops; it is lifted too when the breaker opens (an outage is the breaker's to handle: a
/// provider still overloaded once it is back says so again, and the limit is measured afresh).
/// While limited, a task of its own on the tokio runtime of the call that turned it on
/// (it holds the breaker weakly) tells the limit once a second
/// ([`Event::ConcurrencyLimit`](crate::observe::Event::ConcurrencyLimit), reason `current`)
/// and lifts it on time, with calls or without.
///
/// While limited, a call that finds the limit reached, or others waiting, is not sent: it takes
/// its place in a first-in-first-out queue and the breaker answers it at once, like a call the
/// send rate holds back, with a failure of class [`Class::THROTTLED`], code [`Code::Paced`],
/// [`Sent::No`], a [`LimitedError`] source and, as its
/// [`retry_after`](crate::Failure::retry_after), the wait until its turn: its place in the
/// queue × the round trip ÷ the limit, at most a second (a call further back looks again).
/// A permit freed by a call that ends (answered, failed, dropped, or panicked) goes to the
/// head of the queue and is kept for it. A [`RetryLayer`](crate::retry::RetryLayer) above
/// keeps the call's place: it waits, within its deadline and its bound on waits for a turn
/// (not counted as an attempt, nor against its retry budget), looks again while its turn has
/// not come, and sends the request in its turn; a turn not taken within two seconds goes to the
/// next in line. A caller of the breaker alone gets the failure; a call it makes again takes a
/// new place at the end. When the send rate is limited too, a call goes out when both let it:
/// whichever binds holds it.
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::breaker::{AdaptiveConcurrency, BreakerLayer};
///
/// // Off by default; on, with the defaults below.
/// let _on = BreakerLayer::builder()
///     .adaptive_concurrency(AdaptiveConcurrency::new())
///     .build()
///     .expect("a valid configuration");
///
/// // Customised: at most 200 calls at once, lifted after a minute without overload.
/// let layer = BreakerLayer::builder()
///     .per_host()
///     .adaptive_concurrency(
///         AdaptiveConcurrency::new()
///             .max(200)
///             .lift_after(Duration::from_secs(60)),
///     )
///     .build()
///     .expect("a valid configuration");
/// # let _ = layer;
///
/// // A setting out of range is an error from `build`, naming it.
/// let err = BreakerLayer::builder()
///     .adaptive_concurrency(AdaptiveConcurrency::new().max(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "adaptive_concurrency.max");
/// ```
///
/// | setting | default | source |
/// |---|---|---|
/// | [`decrease`](Self::decrease) | 0.9 | Netflix concurrency-limits' `AIMDLimit` `backoffRatio` |
/// | [`max`](Self::max) | 1000 calls | Envoy's adaptive concurrency filter, `max_concurrency_limit` |
/// | [`latency_tolerance`](Self::latency_tolerance) | 1.5 | Netflix concurrency-limits' `Gradient2Limit` `rttTolerance` |
/// | [`lift_after`](Self::lift_after) | 30 s | as [`AdaptiveRate::lift_after`](super::AdaptiveRate::lift_after) |
/// | the lowest limit | 1 call | `AIMDLimit` |
///
/// [`Class::THROTTLED`]: crate::Class::THROTTLED
/// [`Code::Paced`]: crate::Code::Paced
/// [`Sent::No`]: crate::Sent::No
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveConcurrency {
    pub(crate) decrease: f64,
    pub(crate) max: u32,
    pub(crate) latency_tolerance: f64,
    pub(crate) lift_after: Duration,
}

impl Default for AdaptiveConcurrency {
    fn default() -> Self {
        AdaptiveConcurrency {
            decrease: 0.9,
            max: 1_000,
            latency_tolerance: 1.5,
            lift_after: Duration::from_secs(30),
        }
    }
}

impl AdaptiveConcurrency {
    /// The defaults of the table above.
    pub fn new() -> Self {
        AdaptiveConcurrency::default()
    }

    /// The share of the limit kept at each decrease, and of the calls in flight measured when
    /// the limit turns on (within `[0.5, 1.0)`, the range `AIMDLimit` accepts; 0.9).
    pub fn decrease(mut self, share: f64) -> Self {
        self.decrease = share;
        self
    }

    /// The highest limit, in calls in flight at once (at least 1; 1000). The measured start is
    /// capped here too.
    pub fn max(mut self, calls: u32) -> Self {
        self.max = calls;
        self
    }

    /// How far a round trip's mean latency may rise above the lowest seen, as a factor
    /// (above 1.0; 1.5), before it lowers the limit as an overload answer would.
    /// `f64::INFINITY` turns the latency rule off: only overload answers lower the limit.
    pub fn latency_tolerance(mut self, factor: f64) -> Self {
        self.latency_tolerance = factor;
        self
    }

    /// How long without an overload answer before the limit is lifted (30 s, above zero).
    pub fn lift_after(mut self, quiet: Duration) -> Self {
        self.lift_after = quiet;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the first setting out of range: `decrease` outside
    /// `[0.5, 1.0)`, `max` zero, `latency_tolerance` not above 1.0, `lift_after` zero.
    pub(crate) fn check(&self) -> Result<(), BuildError> {
        if !(self.decrease >= 0.5 && self.decrease < 1.0) {
            return Err(BuildError::new(
                "adaptive_concurrency.decrease",
                self.decrease,
                "the share kept must be within [0.5, 1.0)",
            ));
        }
        if self.max == 0 {
            return Err(BuildError::new(
                "adaptive_concurrency.max",
                self.max,
                "the highest limit must be at least 1 call",
            ));
        }
        // NaN is no tolerance either.
        if self.latency_tolerance.is_nan() || self.latency_tolerance <= 1.0 {
            return Err(BuildError::new(
                "adaptive_concurrency.latency_tolerance",
                self.latency_tolerance,
                "the latency tolerance must be above 1.0 (infinity turns the rule off)",
            ));
        }
        if self.lift_after.is_zero() {
            return Err(BuildError::new(
                "adaptive_concurrency.lift_after",
                format_args!("{:?}", self.lift_after),
                "the quiet time before the limit is lifted must be above zero",
            ));
        }
        Ok(())
    }
}

const SECOND: u64 = 1_000_000_000;
/// The longest the first round trip after an overload answer is measured: a provider that
/// answers nothing but overload for a second gets a limit from what was measured by then.
const MAX_MEASURE: u64 = SECOND;
/// The round trip assumed, in nanoseconds, when no success was timed (a measure that ended
/// on time): a tenth of a second.
const UNTIMED_RTT: f64 = 1e8;
/// A turn given to a caller that does not take it within this goes to the next in line.
const TURN_KEPT: u64 = 2 * SECOND;
/// Round trips in a row whose latency rose at a limit of 1, after which that latency is the
/// provider's new normal (Envoy's five windows at the lowest limit).
const NEW_NORMAL: u32 = 5;
/// The fewest successes a round trip's latency is judged on (`WindowedLimit`'s `windowSize`).
const MIN_WINDOW: u32 = 10;
/// The smoothing of the round-trip estimate (RFC 6298 §2: α = 1/8).
const RTT_ALPHA: f64 = 0.125;
/// The longest wait a held call is told: further back, it looks again.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// The shortest wait a held call is told (tokio's timers tick by the millisecond).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// One breaker's concurrency limiter: off (one atomic load per call) until the provider
/// signals overload.
pub(crate) struct Limiter {
    active: AtomicBool,
    state: Mutex<Limits>,
}

/// What an active limiter keeps, behind its lock. Times are nanoseconds on the breaker's
/// clock; latencies are nanoseconds, as `f64`.
#[derive(Debug, Default)]
struct Limits {
    settings: AdaptiveConcurrency,
    /// Which activation this is (from 1; 0 marks a call not counted): the calls and tickets
    /// of an earlier one are not this one's.
    epoch: u32,
    /// The limit, fractional (it grows by `1 / limit` a success); `None` while the first round
    /// trip is measured.
    limit: Option<f64>,
    /// When the limit turned on.
    since: u64,
    /// The most calls in flight at once while measuring.
    peak: u32,
    /// Calls counted in flight.
    in_flight: u32,
    /// Callers whose turn came and who send now: the next calls go at once.
    credits: u32,
    /// The next ticket's number.
    next: u64,
    /// Tickets waiting for their turn, first in first out.
    waiting: VecDeque<u64>,
    /// Tickets whose turn came (a permit kept for each), with when it came.
    granted: Vec<(u64, u64)>,
    /// When the limit last fell: overload answers to calls sent before are no news.
    last_cut: u64,
    /// When the last overload answer came.
    last_overload: u64,
    /// The smoothed round trip of successes (0: none yet).
    rtt: f64,
    /// The lowest mean latency of a round trip since the limit turned on (0: none yet).
    lowest: f64,
    /// Round trips in a row whose latency rose at a limit of 1.
    at_floor: u32,
    /// The successes of calls sent since `window_since`: their latencies' sum and count.
    window_since: u64,
    window_sum: f64,
    window_seen: u32,
    last_report: u64,
    /// Whether a task watches this limit.
    watched: bool,
}

/// A call counted among those in flight (or not: `epoch` 0), carried by the call's guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flight {
    epoch: u32,
    /// The calls in flight once it was sent, itself included.
    in_flight: u32,
    start: u64,
}

impl Flight {
    /// A call not counted: the limit was off when it was sent.
    pub(crate) const NONE: Flight = Flight {
        epoch: 0,
        in_flight: 0,
        start: 0,
    };

    #[inline]
    pub(crate) fn is_counted(&self) -> bool {
        self.epoch != 0
    }

    /// Takes it, leaving a call not counted behind.
    #[inline]
    pub(crate) fn take(&mut self) -> Flight {
        std::mem::replace(self, Flight::NONE)
    }
}

/// How a call ended, as the limiter counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Success,
    /// Throttled, or HTTP 503.
    Overload,
    /// Any other failure: neither lowers nor raises the limit.
    Other,
    /// Dropped before it ended, or refused in this process: its permit goes back.
    Dropped,
}

/// A place in a limiter's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    epoch: u32,
    number: u64,
}

/// A call the limit holds back: the wait until its turn, its place, and the limit it met.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Held {
    wait: Duration,
    ticket: Ticket,
    limit: u32,
    in_flight: u32,
}

/// What a limit change says, for the breaker's event and log line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Change {
    /// The limit now, `None` once lifted.
    pub(crate) limit: Option<u32>,
    pub(crate) in_flight: u32,
    pub(crate) reason: &'static str,
}

/// What the task that watches a limit does next ([`Limiter::tick`]).
pub(crate) enum Tick {
    /// The limit it watched is gone: it stops.
    Stop,
    /// The limit is lifted now: told, and the task stops.
    Lifted(Change),
    /// Look again after this long, having told this change, if any.
    Sleep(Duration, Option<Change>),
}

/// What a limiter says of a call's answer: the change to tell, and the limit's number when it
/// turned on and no task watches it yet (the caller starts one).
type Answered = (Option<Change>, Option<u32>);

impl Limiter {
    pub(crate) fn new(settings: AdaptiveConcurrency) -> Self {
        Limiter {
            active: AtomicBool::new(false),
            state: Mutex::new(Limits {
                settings,
                ..Limits::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Limits> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `settings` from now on, the limit and the queue as they are (a lower `max`
    /// applies at the next change of the limit).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn retune(&self, settings: AdaptiveConcurrency) {
        self.lock().settings = settings;
    }

    /// Whether calls are counted and limited now.
    #[inline]
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Asks for a permit at `now`: `Ok` with the call counted in flight, or `Err` with its place
    /// in the queue; with a change to report, when the limit changed.
    pub(crate) fn admit(&self, now: u64) -> (Result<Flight, Held>, Option<Change>) {
        let mut l = self.lock();
        if !self.is_active() {
            return (Ok(Flight::NONE), None);
        }
        if l.quiet(now) {
            return (Ok(Flight::NONE), Some(self.lift(&mut l)));
        }
        let change = l.measure_due(now).or_else(|| l.report_due(now));
        if l.credits > 0 {
            l.credits -= 1;
            return (Ok(l.fly(now)), change);
        }
        if l.limit.is_none() {
            // The first round trip is measured: every call goes, counted.
            return (Ok(l.fly(now)), change);
        }
        l.expire(now);
        l.pump(now);
        if l.waiting.is_empty() && l.room() > 0 {
            return (Ok(l.fly(now)), change);
        }
        let number = l.next;
        l.next += 1;
        l.waiting.push_back(number);
        let held = Held {
            wait: l.wait_for(l.waiting.len()),
            ticket: Ticket {
                epoch: l.epoch,
                number,
            },
            limit: l.permits(),
            in_flight: l.in_flight,
        };
        (Err(held), change)
    }

    /// A call answered, failed or dropped at `now` (`flight`, counted or not): an overload
    /// answer turns the limit on, or lowers it; a counted call's permit goes to the next in
    /// line.
    pub(crate) fn answered(&self, flight: Flight, answer: Answer, now: u64) -> Answered {
        let mut l = self.lock();
        let mut change = None;
        if answer == Answer::Overload {
            if !self.is_active() {
                l.activate(now);
                self.active.store(true, Ordering::Relaxed);
            }
            l.last_overload = now;
        }
        if flight.is_counted() && flight.epoch == l.epoch && self.is_active() {
            let was = l.in_flight;
            l.in_flight = was.saturating_sub(1);
            change = l.land(flight, answer, now, was);
            l.pump(now);
        }
        let watch = (self.is_active() && !l.watched).then(|| {
            l.watched = true;
            l.epoch
        });
        (change, watch)
    }

    /// Whether `ticket`'s turn came at `now`: `Ok` and the caller sends now (the breaker lets
    /// its call through), or `Err` with the time until it comes.
    pub(crate) fn redeem(&self, ticket: Ticket, now: u64) -> Result<(), Duration> {
        if !self.is_active() {
            return Ok(());
        }
        let mut l = self.lock();
        if ticket.epoch != l.epoch {
            return Ok(());
        }
        l.expire(now);
        l.pump(now);
        if let Some(i) = l.granted.iter().position(|(t, _)| *t == ticket.number) {
            l.granted.swap_remove(i);
            l.credits = l.credits.saturating_add(1);
            return Ok(());
        }
        match l.waiting.iter().position(|t| *t == ticket.number) {
            Some(i) => Err(l.wait_for(i + 1)),
            // Its turn passed on unused: the breaker decides again.
            None => Ok(()),
        }
    }

    /// `ticket` will not be used: its place is left, and a turn kept for it goes to the next.
    pub(crate) fn give_back(&self, ticket: Ticket, now: u64) {
        let mut l = self.lock();
        if ticket.epoch != l.epoch || !self.is_active() {
            return;
        }
        if let Some(i) = l.granted.iter().position(|(t, _)| *t == ticket.number) {
            l.granted.swap_remove(i);
            l.pump(now);
        } else if let Some(i) = l.waiting.iter().position(|t| *t == ticket.number) {
            l.waiting.remove(i);
        }
    }

    /// The watching task's look at limit `epoch` at `now`: lifted once quiet for the lift
    /// time, else the limit told when a second passed since it was last told, and the time
    /// until the next look (a second at most).
    pub(crate) fn tick(&self, epoch: u32, now: u64) -> Tick {
        let mut l = self.lock();
        if !self.is_active() || l.epoch != epoch {
            return Tick::Stop;
        }
        if l.quiet(now) {
            return Tick::Lifted(self.lift(&mut l));
        }
        let change = l.measure_due(now).or_else(|| l.report_due(now));
        l.expire(now);
        l.pump(now);
        let quiet_at = l.last_overload.saturating_add(nanos(l.settings.lift_after));
        let next_look = match l.limit {
            None => l.since.saturating_add(MAX_MEASURE),
            Some(_) => l.last_report.saturating_add(SECOND),
        };
        let next = quiet_at.min(next_look).saturating_sub(now).max(1_000_000);
        Tick::Sleep(Duration::from_nanos(next), change)
    }

    /// No task could be started to watch limit `epoch` (no tokio runtime): a later answer
    /// tries again.
    pub(crate) fn unwatch(&self, epoch: u32) {
        let mut l = self.lock();
        if l.epoch == epoch {
            l.watched = false;
        }
    }

    /// The limit and the calls counted in flight now: `None` while off, or while the first
    /// round trip is measured.
    pub(crate) fn current(&self, now: u64) -> Option<(u32, u32)> {
        if !self.is_active() {
            return None;
        }
        let l = self.lock();
        // Quiet for the lift time: lifted at the next call, and off for a reader now.
        if l.quiet(now) {
            return None;
        }
        l.limit.map(|_| (l.permits(), l.in_flight))
    }

    /// Lifts the limit at once: the breaker opened. The change to tell, when a limit was told
    /// (not while the first round trip was measured).
    pub(crate) fn suspend(&self) -> Option<Change> {
        if !self.is_active() {
            return None;
        }
        let mut l = self.lock();
        let told = l.limit.is_some();
        let change = self.lift(&mut l);
        told.then_some(change)
    }

    /// Lifts the limit: quiet for its lift time. Counting stops.
    fn lift(&self, l: &mut Limits) -> Change {
        self.active.store(false, Ordering::Relaxed);
        *l = Limits {
            settings: l.settings,
            epoch: l.epoch,
            ..Limits::default()
        };
        Change {
            limit: None,
            in_flight: 0,
            reason: "lifted",
        }
    }
}

impl Limits {
    /// The limit turns on at `now`: calls are counted from here, and the first round trip is
    /// measured.
    fn activate(&mut self, now: u64) {
        *self = Limits {
            settings: self.settings,
            epoch: self.epoch.wrapping_add(1).max(1),
            since: now,
            last_overload: now,
            last_report: now,
            ..Limits::default()
        };
    }

    fn quiet(&self, now: u64) -> bool {
        now.saturating_sub(self.last_overload) >= nanos(self.settings.lift_after)
    }

    /// The limit in whole calls, within `1..=max`.
    fn permits(&self) -> u32 {
        let limit = self.limit.unwrap_or(f64::from(self.settings.max));
        (limit.floor() as u32).clamp(1, self.settings.max)
    }

    /// Permits free: neither in flight nor kept for a caller whose turn came.
    fn room(&self) -> u32 {
        let taken = self
            .in_flight
            .saturating_add(self.credits)
            .saturating_add(u32::try_from(self.granted.len()).unwrap_or(u32::MAX));
        self.permits().saturating_sub(taken)
    }

    /// Counts a call sent at `now`.
    fn fly(&mut self, now: u64) -> Flight {
        self.in_flight = self.in_flight.saturating_add(1);
        self.peak = self.peak.max(self.in_flight);
        Flight {
            epoch: self.epoch,
            in_flight: self.in_flight,
            start: now,
        }
    }

    /// Gives free permits to the waiting callers, first in first out.
    fn pump(&mut self, now: u64) {
        while self.room() > 0 {
            let Some(ticket) = self.waiting.pop_front() else {
                return;
            };
            self.granted.push((ticket, now));
        }
    }

    /// Turns not taken in time go to the next in line.
    fn expire(&mut self, now: u64) {
        self.granted
            .retain(|(_, at)| now.saturating_sub(*at) < TURN_KEPT);
    }

    /// The wait of the caller at `position` in the queue (from 1): that many permits to free,
    /// one every round trip ÷ limit, within `[1 ms, 1 s]`.
    fn wait_for(&self, position: usize) -> Duration {
        let rtt = if self.rtt > 0.0 {
            self.rtt
        } else {
            UNTIMED_RTT
        };
        let nanos = position as f64 * rtt / f64::from(self.permits());
        Duration::from_secs_f64(nanos / 1e9).clamp(MIN_WAIT, MAX_WAIT)
    }

    /// A counted call answered at `now`, with `was` calls in flight until then: the measure
    /// ends at the first success, a success is a sample, and an overload answer to a call sent
    /// since the last decrease lowers the limit.
    fn land(&mut self, flight: Flight, answer: Answer, now: u64, was: u32) -> Option<Change> {
        let latency = now.saturating_sub(flight.start) as f64;
        match (self.limit, answer) {
            (None, Answer::Success) => Some(self.measured(now, latency)),
            (None, _) => self.measure_due(now),
            (Some(_), Answer::Success) => self.sample(flight, latency, now, was),
            (Some(_), Answer::Overload) if flight.start >= self.last_cut => {
                Some(self.cut(now, "overloaded"))
            }
            _ => None,
        }
    }

    /// The measure of the first round trip ends at `now`, the round trip `rtt` (0: none
    /// timed): the limit starts at the most calls in flight seen, times the decrease.
    fn measured(&mut self, now: u64, rtt: f64) -> Change {
        let max = f64::from(self.settings.max);
        let start = (f64::from(self.peak.max(1)) * self.settings.decrease).clamp(1.0, max);
        self.limit = Some(start);
        if rtt > 0.0 {
            self.rtt = rtt;
        }
        self.last_cut = now;
        self.restart_window(now);
        self.last_report = now;
        self.told("measured")
    }

    /// Ends a measure that found no success within [`MAX_MEASURE`].
    fn measure_due(&mut self, now: u64) -> Option<Change> {
        (self.limit.is_none() && now.saturating_sub(self.since) >= MAX_MEASURE)
            .then(|| self.measured(now, 0.0))
    }

    /// The limit as it is, told once a second while limited.
    fn report_due(&mut self, now: u64) -> Option<Change> {
        (self.limit.is_some() && now.saturating_sub(self.last_report) >= SECOND).then(|| {
            self.last_report = now;
            self.told("current")
        })
    }

    fn told(&self, reason: &'static str) -> Change {
        Change {
            limit: Some(self.permits()),
            in_flight: self.in_flight,
            reason,
        }
    }

    /// Lowers the limit at `now`: times the decrease, and by one at least.
    fn cut(&mut self, now: u64, reason: &'static str) -> Change {
        let limit = self.limit.unwrap_or(1.0);
        let lowered = (limit * self.settings.decrease).min(limit - 1.0);
        self.limit = Some(lowered.clamp(1.0, f64::from(self.settings.max)));
        self.last_cut = now;
        self.restart_window(now);
        self.last_report = now;
        self.told(reason)
    }

    fn restart_window(&mut self, now: u64) {
        self.window_since = now;
        self.window_sum = 0.0;
        self.window_seen = 0;
    }

    /// A success of a counted call at `now`, `latency` after it was sent, `was` calls in
    /// flight until then: the round trip's estimate, the increase, and the latency rule at the
    /// end of a round trip.
    fn sample(&mut self, flight: Flight, latency: f64, now: u64, was: u32) -> Option<Change> {
        self.rtt = if self.rtt > 0.0 {
            self.rtt + RTT_ALPHA * (latency - self.rtt)
        } else {
            latency
        };
        let limit = self.limit?;
        // Not app-limited (half the limit in flight at least, when it was sent or now), and
        // not slow.
        let used = 2 * u64::from(flight.in_flight.max(was)) >= u64::from(self.permits());
        if used && !self.slow(latency) {
            let max = f64::from(self.settings.max);
            self.limit = Some((limit + 1.0 / limit).min(max));
        }
        if flight.start >= self.window_since {
            self.window_sum += latency;
            self.window_seen += 1;
        }
        let round_trip = now.saturating_sub(self.window_since) as f64 >= self.rtt;
        if !round_trip || self.window_seen < MIN_WINDOW {
            return None;
        }
        let mean = self.window_sum / f64::from(self.window_seen);
        self.restart_window(now);
        self.latency_rule(mean, now)
    }

    /// Whether `latency` passed the latency rule's bound.
    fn slow(&self, latency: f64) -> bool {
        self.lowest > 0.0 && latency > self.settings.latency_tolerance * self.lowest
    }

    /// A round trip's `mean` latency, judged against the lowest seen at `now`.
    fn latency_rule(&mut self, mean: f64, now: u64) -> Option<Change> {
        if !self.slow(mean) {
            self.at_floor = 0;
            self.lowest = if self.lowest > 0.0 {
                self.lowest.min(mean)
            } else {
                mean
            };
            return None;
        }
        if self.permits() > 1 {
            self.at_floor = 0;
            return Some(self.cut(now, "latency"));
        }
        self.at_floor += 1;
        if self.at_floor >= NEW_NORMAL {
            self.lowest = mean;
            self.at_floor = 0;
        }
        None
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("settings", &self.lock().settings)
            .field("active", &self.is_active())
            .finish_non_exhaustive()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a failure of `class` and `code` is an overload answer: throttled, or HTTP 503. A
/// refusal of this process (an open breaker, a call held back) is no answer of the provider.
fn is_overload(class: Class, code: Code) -> bool {
    !code.not_an_attempt()
        && (class == Class::THROTTLED || code == Code::Http(StatusCode::SERVICE_UNAVAILABLE))
}

/// The source of the failure of a call held back by the concurrency limit: the breaker, the
/// limit it met and the wait.
#[derive(Debug)]
pub struct LimitedError {
    breaker: Arc<str>,
    limit: u32,
    in_flight: u32,
    wait: Duration,
}

impl LimitedError {
    /// The breaker's name (a keyed breaker's key, such as `api.mail.test:443`).
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// The concurrency limit when the call came, in calls in flight at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The calls in flight when the call came.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// How long until the call's turn, as estimated when it came (its place in the queue × the
    /// round trip ÷ the limit; at most a second: a call further back looks again then).
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

impl fmt::Display for LimitedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "concurrency limit of `{}` lowered to {} in flight after overload answers ({} in flight); its turn in {:?}",
            self.breaker, self.limit, self.in_flight, self.wait
        )
    }
}

impl std::error::Error for LimitedError {}

/// The failure of a call the concurrency limit holds back (`held`): its `permit` goes back
/// unused, and its place in the queue rides on the failure as a [`SendSlot`].
#[cold]
#[inline(never)]
pub(crate) fn held_back<R>(shared: &Arc<Shared>, permit: Permit, held: Held) -> Box<Failure<R>> {
    shared.cancel(permit);
    let source = LimitedError {
        breaker: Arc::clone(&shared.name),
        limit: held.limit,
        in_flight: held.in_flight,
        wait: held.wait,
    };
    let mut failure = Failure::new(Class::THROTTLED, Code::Paced)
        .with_retry_after(held.wait)
        .with_sent(Sent::No)
        .with_source(source);
    failure.notes_mut().insert(SendSlot {
        shared: Arc::clone(shared),
        ticket: Queue::Limit(held.ticket),
        redeemed: false,
    });
    Box::new(failure)
}

/// Where the wait of a call held back by its breaker (code [`Code::Paced`]) comes from: its
/// concurrency limit, or its send rate.
pub(crate) fn held_by<R>(failure: &Failure<R>) -> DelaySource {
    match failure.note::<SendSlot>().map(|slot| slot.ticket) {
        Some(Queue::Limit(_)) => DelaySource::ConcurrencyLimit,
        _ => DelaySource::SendRate,
    }
}

// The breaker's side of its limit.
impl Shared {
    /// The concurrency limiter, when on.
    #[inline]
    pub(crate) fn limiter(&self) -> Option<&Limiter> {
        self.limiter.as_ref()
    }

    /// Asks the limit for a permit: while it is off (one atomic load), the call goes
    /// uncounted; while it is on, `Ok` with the call counted, or `Err` with its place in the
    /// queue.
    #[inline]
    pub(crate) fn fly(&self) -> Result<Flight, Held> {
        match &self.limiter {
            Some(limiter) if limiter.is_active() => self.fly_slow(limiter),
            _ => Ok(Flight::NONE),
        }
    }

    #[cold]
    fn fly_slow(&self, limiter: &Limiter) -> Result<Flight, Held> {
        let (admitted, change) = limiter.admit(self.now_nanos());
        if let Some(change) = change {
            self.limit_changed(change);
        }
        admitted
    }

    /// A counted call that ended with `answer` (a success, or dropped): its permit goes back.
    #[cold]
    pub(crate) fn landed(&self, flight: Flight, answer: Answer) {
        if let Some(limiter) = &self.limiter {
            self.answered(limiter, flight, answer);
        }
    }

    /// A call that failed with `class` and `code` (`flight`, counted or not): an overload
    /// answer while the breaker is closed turns the limit on or lowers it; a counted call's
    /// permit goes back. A failure that is no overload costs a comparison while the limit is
    /// off.
    pub(crate) fn limit_failure(&self, flight: Flight, class: Class, code: Code) {
        let Some(limiter) = &self.limiter else {
            return;
        };
        let overload = is_overload(class, code) && self.state() == crate::status::State::Closed;
        if !overload && !flight.is_counted() {
            return;
        }
        let answer = if overload {
            Answer::Overload
        } else {
            Answer::Other
        };
        self.answered(limiter, flight, answer);
    }

    #[cold]
    fn answered(&self, limiter: &Limiter, flight: Flight, answer: Answer) {
        let (change, watch) = limiter.answered(flight, answer, self.now_nanos());
        if let Some(change) = change {
            self.limit_changed(change);
        }
        if let Some(epoch) = watch {
            self.watch_limit(limiter, epoch);
        }
    }

    /// Watches limit `epoch` from a task of its own on the current tokio runtime, off every
    /// call's path: it ends the measure on time, tells the limit each second and lifts it once
    /// the provider has been quiet for the lift time, whether calls come or not. It holds the
    /// breaker weakly and ends with the limit (or the breaker). Without a runtime it is not
    /// started: the limit is then lifted at the next call, and readers already see it lifted.
    fn watch_limit(&self, limiter: &Limiter, epoch: u32) {
        let started =
            self.watch(
                move |shared| match shared.limiter()?.tick(epoch, shared.now_nanos()) {
                    Tick::Stop => None,
                    Tick::Lifted(change) => {
                        shared.limit_changed(change);
                        None
                    }
                    Tick::Sleep(wait, change) => {
                        if let Some(change) = change {
                            shared.limit_changed(change);
                        }
                        Some(wait)
                    }
                },
            );
        if !started {
            limiter.unwatch(epoch);
        }
    }

    /// The breaker opened: the limit is lifted (an outage is not a load to limit; the provider
    /// says so again once it is back, if it is overloaded).
    pub(crate) fn limit_outage(&self) {
        if let Some(change) = self.limiter.as_ref().and_then(Limiter::suspend) {
            self.limit_changed(change);
        }
    }

    /// The concurrency limit and the calls counted in flight: `None` while off (or without an
    /// adaptive concurrency limit).
    pub(crate) fn concurrency_limit(&self) -> Option<(u32, u32)> {
        self.limiter.as_ref()?.current(self.now_nanos())
    }

    /// Tells the listener of a limit change, and logs the ones an operator acts on: the first
    /// limit, the limit lifted.
    fn limit_changed(&self, change: Change) {
        let name = &*self.name;
        let in_flight = change.in_flight;
        match (change.reason, change.limit) {
            ("measured", Some(limit)) => tracing::info!(
                breaker = name,
                limit,
                in_flight,
                "concurrency limited after an overload answer"
            ),
            ("lifted", _) => tracing::info!(
                breaker = name,
                "concurrency no longer limited: no overload answer for a while"
            ),
            ("overloaded", Some(limit)) => tracing::debug!(
                breaker = name,
                limit,
                in_flight,
                "concurrency limit lowered after an overload answer"
            ),
            ("latency", Some(limit)) => tracing::debug!(
                breaker = name,
                limit,
                in_flight,
                "concurrency limit lowered: latency rose"
            ),
            _ => {}
        }
        self.emit(Event::ConcurrencyLimit {
            breaker: name,
            limit: change.limit,
            in_flight,
            reason: change.reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limiter() -> Limiter {
        Limiter::new(AdaptiveConcurrency::new())
    }

    #[test]
    fn off_until_an_overload_answer() {
        let l = limiter();
        assert!(!l.is_active());
        let (change, _) = l.answered(Flight::NONE, Answer::Other, 0);
        assert_eq!(change, None);
        assert!(!l.is_active());
        l.answered(Flight::NONE, Answer::Overload, 0);
        assert!(l.is_active());
        assert_eq!(l.current(0), None, "measuring: no limit yet");
    }

    #[test]
    fn the_limit_starts_from_the_peak_in_flight_of_the_first_round_trip() {
        let l = limiter();
        l.answered(Flight::NONE, Answer::Overload, 0);
        let flights: Vec<Flight> = (0..20).map(|_| l.admit(MS).0.unwrap()).collect();
        let (change, _) = l.answered(flights[0], Answer::Success, 100 * MS);
        let change = change.expect("measured");
        assert_eq!(change.reason, "measured");
        assert_eq!(change.limit, Some(18), "0.9 of the 20 in flight at once");
        assert_eq!(l.current(100 * MS), Some((18, 19)));
    }

    #[test]
    fn a_measure_without_success_ends_after_a_second() {
        let l = limiter();
        l.answered(Flight::NONE, Answer::Overload, 0);
        let _f: Vec<_> = (0..5).map(|_| l.admit(0).0.unwrap()).collect();
        match l.tick(1, SECOND) {
            Tick::Sleep(_, Some(change)) => {
                assert_eq!(change.reason, "measured");
                assert_eq!(change.limit, Some(4));
            }
            _ => panic!("measured on time"),
        }
    }

    /// Turns the limiter on with `in_flight` calls sent at 0, the first of them answered at
    /// 100 ms (the limit measured: 0.9 of `in_flight`): the calls still out.
    fn limited(l: &Limiter, in_flight: u32) -> Vec<Flight> {
        l.answered(Flight::NONE, Answer::Overload, 0);
        let mut out: Vec<Flight> = (0..in_flight).map(|_| l.admit(0).0.unwrap()).collect();
        let first = out.remove(0);
        l.answered(first, Answer::Success, 100 * MS);
        out
    }

    /// As [`limited`], every call answered by 100 ms.
    fn limited_idle(l: &Limiter, in_flight: u32) {
        for f in limited(l, in_flight) {
            l.answered(f, Answer::Other, 100 * MS);
        }
    }

    #[test]
    fn calls_over_the_limit_wait_in_order_and_a_freed_permit_goes_to_the_head() {
        let l = limiter();
        let out = limited(&l, 10);
        assert_eq!(l.current(100 * MS), Some((9, 9)));
        let a = l.admit(100 * MS).0.unwrap_err();
        let b = l.admit(100 * MS).0.unwrap_err();
        assert!(a.wait < b.wait, "further back, a longer wait");
        assert!(l.redeem(a.ticket, 101 * MS).is_err());
        // One call ends: its permit goes to `a`, not to a newcomer nor to `b`.
        l.answered(out[0], Answer::Other, 110 * MS);
        assert!(l.admit(110 * MS).0.is_err(), "a newcomer queues behind");
        assert!(l.redeem(b.ticket, 111 * MS).is_err());
        assert_eq!(l.redeem(a.ticket, 112 * MS), Ok(()));
        let flight = l.admit(112 * MS).0.expect("a's call goes");
        assert!(flight.is_counted());
        assert_eq!(l.current(112 * MS), Some((9, 9)));
    }

    #[test]
    fn a_turn_given_back_goes_to_the_next_and_an_unused_one_expires() {
        let l = limiter();
        let out = limited(&l, 10);
        let a = l.admit(100 * MS).0.unwrap_err();
        let b = l.admit(100 * MS).0.unwrap_err();
        l.answered(out[0], Answer::Dropped, 110 * MS);
        // `a` leaves: its turn goes to `b`.
        l.give_back(a.ticket, 111 * MS);
        assert_eq!(l.redeem(b.ticket, 112 * MS), Ok(()));
        l.admit(112 * MS).0.unwrap();
        // A turn kept and not taken within two seconds goes on.
        let c = l.admit(113 * MS).0.unwrap_err();
        let d = l.admit(113 * MS).0.unwrap_err();
        l.answered(out[1], Answer::Other, 120 * MS);
        assert!(l.redeem(d.ticket, 2_200 * MS).is_ok(), "c's turn expired");
        assert_eq!(
            l.redeem(c.ticket, 2_300 * MS),
            Ok(()),
            "lost: decided again"
        );
    }

    #[test]
    fn an_overload_lowers_the_limit_once_per_round_trip() {
        let l = limiter();
        let mut out = limited(&l, 22);
        assert_eq!(l.current(100 * MS), Some((19, 21)));
        // Answers to calls sent before the measure ended are no news.
        let (change, _) = l.answered(out.pop().unwrap(), Answer::Overload, 150 * MS);
        assert_eq!(change, None);
        for f in out.drain(..5) {
            l.answered(f, Answer::Dropped, 150 * MS);
        }
        let late = l.admit(150 * MS).0.unwrap();
        let later = l.admit(150 * MS).0.unwrap();
        let (change, _) = l.answered(late, Answer::Overload, 200 * MS);
        let change = change.expect("lowered");
        assert_eq!((change.reason, change.limit), ("overloaded", Some(17)));
        let (change, _) = l.answered(later, Answer::Overload, 210 * MS);
        assert_eq!(change, None, "sent before that decrease");
    }

    #[test]
    fn clean_round_trips_add_one_each() {
        let l = limiter();
        limited_idle(&l, 11);
        let mut now = 100 * MS;
        let start = l.current(now).unwrap().0;
        for _ in 0..5 {
            // One round trip: a whole limit of calls, sent and answered.
            let permits = l.current(now).unwrap().0;
            let flights: Vec<Flight> = (0..permits).map(|_| l.admit(now).0.unwrap()).collect();
            now += 100 * MS;
            for f in flights {
                l.answered(f, Answer::Success, now);
            }
        }
        let end = l.current(now).unwrap().0;
        assert!((start + 4..=start + 5).contains(&end), "{start} -> {end}");
    }

    #[test]
    fn one_per_success_with_one_decrease_a_round_trip_would_settle_far_above() {
        // Why the increase is spread over a round trip: with +1 a success and one decrease
        // (×0.9) a round trip, a provider taking 10 at once is sent L = 0.9 (L + 10): 90.
        let mut limit = 10.0_f64;
        for _ in 0..200 {
            limit = (limit + 10.0) * 0.9;
        }
        assert!(limit > 80.0, "{limit}");
    }

    #[test]
    fn latency_rising_lowers_the_limit() {
        let l = limiter();
        limited_idle(&l, 11);
        let mut now = 100 * MS;
        let mut reasons = Vec::new();
        for round in 0..40 {
            let latency = if round < 20 { 100 } else { 400 } * MS;
            let flights: Vec<Flight> = (0..9).filter_map(|_| l.admit(now).0.ok()).collect();
            now += latency;
            for f in flights {
                if let (Some(change), _) = l.answered(f, Answer::Success, now) {
                    reasons.push(change.reason);
                }
            }
        }
        assert!(reasons.contains(&"latency"), "{reasons:?}");
    }

    #[test]
    fn a_latency_that_stays_high_becomes_the_new_normal() {
        let hour = Duration::from_secs(3_600);
        let l = Limiter::new(AdaptiveConcurrency::new().lift_after(hour));
        limited_idle(&l, 30);
        let mut now = 100 * MS;
        let mut lowest = u32::MAX;
        for round in 0..400 {
            let latency = if round < 10 { 100 } else { 400 } * MS;
            // 20 callers, as many as the limit lets through (the others would queue).
            let n = l.current(now).unwrap().0.min(20);
            let flights: Vec<Flight> = (0..n).map(|_| l.admit(now).0.unwrap()).collect();
            now += latency;
            for f in flights {
                l.answered(f, Answer::Success, now);
            }
            lowest = lowest.min(l.current(now).unwrap().0);
        }
        // Down to 1, five round trips there, then 400 ms is the lowest and the limit grows
        // again.
        assert_eq!(lowest, 1);
        assert!(l.current(now).unwrap().0 > 10, "{:?}", l.current(now));
    }

    #[test]
    fn lifted_after_the_quiet_time() {
        let l = limiter();
        let _out = limited(&l, 5);
        match l.tick(1, 30 * SECOND) {
            Tick::Lifted(change) => assert_eq!(change.limit, None),
            _ => panic!("lifted"),
        }
        assert!(!l.is_active());
        assert_eq!(l.admit(31 * SECOND).0, Ok(Flight::NONE));
    }

    #[test]
    fn calls_of_an_earlier_limit_are_not_counted_in_a_later_one() {
        let l = limiter();
        let out = limited(&l, 5);
        l.tick(1, 30 * SECOND);
        l.answered(Flight::NONE, Answer::Overload, 31 * SECOND);
        let f = l.admit(31 * SECOND).0.unwrap();
        for old in out {
            l.answered(old, Answer::Success, 32 * SECOND);
        }
        l.answered(f, Answer::Success, 32 * SECOND);
        assert_eq!(l.current(32 * SECOND), Some((1, 0)));
    }

    #[test]
    fn settings_out_of_range_name_the_field() {
        let bad = |s: AdaptiveConcurrency| s.check().unwrap_err().setting();
        let s = AdaptiveConcurrency::new();
        assert_eq!(bad(s.decrease(0.3)), "adaptive_concurrency.decrease");
        assert_eq!(bad(s.decrease(1.0)), "adaptive_concurrency.decrease");
        assert_eq!(bad(s.max(0)), "adaptive_concurrency.max");
        assert_eq!(
            bad(s.latency_tolerance(1.0)),
            "adaptive_concurrency.latency_tolerance"
        );
        assert_eq!(
            bad(s.latency_tolerance(f64::NAN)),
            "adaptive_concurrency.latency_tolerance"
        );
        assert_eq!(
            bad(s.lift_after(Duration::ZERO)),
            "adaptive_concurrency.lift_after"
        );
        assert!(s.latency_tolerance(f64::INFINITY).check().is_ok());
    }
}
