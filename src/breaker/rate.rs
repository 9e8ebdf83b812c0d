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
/// Until the provider throttles, nothing is limited: a call costs one atomic load more.
///
/// **The start is measured.** At the first throttled answer a limit begins with a measure: for
/// [`measure_window`](Self::measure_window) calls still go out as they come, and the successful
/// answers over that window are the rate the provider admits (the throttled answers to a first
/// burst come back before any admitted one and are not counted). The rate then starts from
/// [`measured_decrease`](Self::measured_decrease) of that measure, its plateau at it. A provider
/// that admitted nothing over the window starts at the [`floor`](Self::floor).
///
/// **Growth follows CUBIC** (RFC 9438 §4.2: `W(t) = C·(t − K)³ + W_max`, with
/// `K = ∛((W_max − W_start)/C)`, `t` the seconds since the last cut): quickly back towards the
/// plateau, slowly around it, faster again beyond it. `C` is scaled to the plateau
/// (`C = W_max·(1 − β)/R³`, `R` the [`regrowth`](Self::regrowth)), so that growing back takes the
/// same time at 5 requests a second and at 5,000, and a raised quota is found in about two
/// regrowth times whatever its size. The rate is never above twice the send rate measured over
/// the last window (the AWS SDKs' adaptive mode caps its rate the same way), so a quiet spell
/// does not leave it far above what was tried.
///
/// **Each later throttled answer cuts it**, at most once per
/// [`min_decrease_interval`](Self::min_decrease_interval), and only when it answers a call sent
/// after the last cut (once per round trip, as TCP cuts once per round trip: the answers to calls
/// already out when it was cut are no news; a call whose send time is not known counts as news
/// a second after the cut): to [`measured_decrease`](Self::measured_decrease) of the rate
/// the provider admitted over the last window (about ten admitted answers, a second at least,
/// three at most), the plateau set at that measure, so a quota that fell is followed in one cut
/// and a quota that did not move keeps its plateau; with too few answers to measure, to
/// [`decrease`](Self::decrease) of the rate, with CUBIC's fast convergence (RFC 9438 §4.7). The
/// rate never falls below the [`floor`](Self::floor). Once no throttled answer came for
/// [`lift_after`](Self::lift_after), the limit is lifted.
///
/// While limited, the rate is watched by a task of its own on the tokio runtime of the call
/// that was throttled (off every call's path; it holds the breaker weakly and ends with the
/// limit): it tells the rate ([`Event::SendRate`](crate::observe::Event::SendRate), reason
/// `rising`) once a second and lifts the limit on time whether calls come or not, so the
/// gauges, the health report and the alerts never keep a value for a provider that gets no
/// more traffic.
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
/// deferred to a dead-letter store like a long `Retry-After`, or given up without one. A call
/// the provider answered throttled keeps its place too: its retry sleeps the server's hint,
/// then waits at the front of the queue, ahead of every call that came after it. A caller of
/// the breaker alone gets the failure, and a call it makes again takes a new place at the end.
///
/// The model is the client-side rate limiting of the AWS SDKs' adaptive retry mode (a token
/// bucket whose rate follows CUBIC on throttling errors, capped at twice the measured send
/// rate), with the start and the cuts taken from the measured admitted rate, as BBR paces at
/// its measured delivery rate:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`measure_window`](Self::measure_window) | 1 s | the shortest window of the AWS SDKs' send-rate measure is 0.5 s; a token bucket's first burst lasts a second |
/// | [`measured_decrease`](Self::measured_decrease) | 0.9 | Netflix concurrency-limits' AIMD backoff ratio: a cut that leaves the provider's bucket room to refill |
/// | [`decrease`](Self::decrease) (β) | 0.7 | RFC 9438 §4.6, AWS SDKs' `BETA` |
/// | [`regrowth`](Self::regrowth) (R) | 2 s | ours, from a sweep of quotas from 5 to 400 requests a second: at 1 s the curve overshoots a per-second quota enough to pass 10 % of throttled answers |
/// | [`floor`](Self::floor) | 0.5 requests/s | AWS SDKs' minimum fill rate |
/// | [`min_decrease_interval`](Self::min_decrease_interval) | 1 s | one cut per burst of throttled answers, as TCP cuts once per round trip |
/// | [`lift_after`](Self::lift_after) | 30 s | ours |
///
/// [`Class::THROTTLED`]: crate::Class::THROTTLED
/// [`Code::Paced`]: crate::Code::Paced
/// [`Sent::No`]: crate::Sent::No
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveRate {
    pub(crate) measure_window: Duration,
    pub(crate) measured_decrease: f64,
    pub(crate) decrease: f64,
    pub(crate) regrowth: Duration,
    pub(crate) floor: f64,
    pub(crate) min_decrease_interval: Duration,
    pub(crate) lift_after: Duration,
}

impl Default for AdaptiveRate {
    fn default() -> Self {
        AdaptiveRate {
            measure_window: Duration::from_secs(1),
            measured_decrease: 0.9,
            decrease: 0.7,
            regrowth: Duration::from_secs(2),
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

    /// How long the first measure of a limit runs, and the shortest window of every later
    /// measure (1 s; from 10 ms to 60 s).
    pub fn measure_window(mut self, window: Duration) -> Self {
        self.measure_window = window;
        self
    }

    /// The share of the measured admitted rate a cut restarts from (within `(0.0, 1.0]`; 0.9).
    pub fn measured_decrease(mut self, share: f64) -> Self {
        self.measured_decrease = share;
        self
    }

    /// The share of the rate kept at a throttled answer when too few answers were admitted to
    /// measure (β, within `(0.0, 1.0)`; 0.7). It also sets how far below its plateau the curve
    /// restarts when [`regrowth`](Self::regrowth) is measured.
    pub fn decrease(mut self, beta: f64) -> Self {
        self.decrease = beta;
        self
    }

    /// How long the rate takes to grow back to its plateau after a cut to
    /// [`decrease`](Self::decrease) of it (CUBIC's `K`; 2 s, from 10 ms to 60 s), at every
    /// rate.
    pub fn regrowth(mut self, time: Duration) -> Self {
        self.regrowth = time;
        self
    }

    /// The lowest rate, in requests per second (above 0.0; 0.5). A provider that throttles
    /// forever is sent at most this much; callers then wait long enough that a dead-letter store
    /// takes their requests, or their deadline ends them.
    pub fn floor(mut self, requests_per_second: f64) -> Self {
        self.floor = requests_per_second;
        self
    }

    /// The shortest time between two cuts of the rate (1 s). Whatever it is, the throttled
    /// answers to calls sent before a cut do not cut it again.
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
    /// `(0.0, 1.0)`, `measured_decrease` outside `(0.0, 1.0]`, `floor` not above 0.0 (or not
    /// finite), `measure_window` or `regrowth` outside 10 ms to 60 s, `lift_after` zero.
    pub(crate) fn check(&self) -> Result<(), BuildError> {
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(BuildError::new(
                "adaptive_rate.decrease",
                self.decrease,
                "the share kept must be within (0.0, 1.0)",
            ));
        }
        if !(self.measured_decrease > 0.0 && self.measured_decrease <= 1.0) {
            return Err(BuildError::new(
                "adaptive_rate.measured_decrease",
                self.measured_decrease,
                "the share of the measured rate must be within (0.0, 1.0]",
            ));
        }
        if !(self.floor.is_finite() && self.floor > 0.0) {
            return Err(BuildError::new(
                "adaptive_rate.floor",
                self.floor,
                "the lowest send rate must be above 0.0 requests a second",
            ));
        }
        let span = Duration::from_millis(10)..=Duration::from_secs(60);
        for (name, value) in [
            ("adaptive_rate.measure_window", self.measure_window),
            ("adaptive_rate.regrowth", self.regrowth),
        ] {
            if !span.contains(&value) {
                return Err(BuildError::new(
                    name,
                    format_args!("{value:?}"),
                    "must be from 10ms to 60s",
                ));
            }
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

/// The shortest spacing of the snapshots the measures are read from, in nanoseconds.
const SNAP_EVERY: u64 = 50_000_000;

/// How many snapshots are kept: at least 3.2 s of them at the shortest spacing.
const SNAPS: usize = 64;

/// How many admitted answers a measure wants: at low rates its window is longer (up to
/// [`MAX_WINDOW`]), so that a measure of a few answers a second is not off by a third.
const MEASURE_ANSWERS: f64 = 10.0;

/// How long after a cut a throttled answer to a call whose send time is not known is taken as
/// an answer to a call sent before it, in nanoseconds.
const UNKNOWN_ROUND_TRIP: u64 = 1_000_000_000;

/// How many measure windows the first measure of a limit may run, waiting for
/// [`MEASURE_ANSWERS`] admitted answers.
const MEASURE_WINDOWS: u64 = 3;

/// The longest window a measure reads, in nanoseconds.
const MAX_WINDOW: u64 = 3_000_000_000;

/// How often the task watching a limit looks at it, in nanoseconds: it takes a snapshot, ends
/// the first measure on time and tells the rate once a second.
const LOOK_EVERY: u64 = 250_000_000;

/// A ticket's number before it is placed in a queue: a call answered throttled takes its place
/// at the front only when it asks for its turn, after the server's hint.
const UNPLACED: u64 = u64::MAX;

/// One breaker's pacer: not limited (one atomic load per call) until the provider throttles.
pub(crate) struct Pacer {
    limited: AtomicBool,
    /// Successful calls, counted with a plain load and store, not an atomic add: an estimate
    /// that two threads may undercount by a call, at the cost of a load and a store on the
    /// success path.
    successes: AtomicU64,
    /// When the first success since the measure began came (nanoseconds on the breaker's
    /// clock, plus one; 0: none yet): the measure before a limit starts there, not at the
    /// breaker's making, so that a process that sat idle after its start (or a breaker opened
    /// on the store's evidence) does not measure its idle time as a low rate.
    first_ok: AtomicU64,
    state: Mutex<Paced>,
}

/// What the pacer saw at one time: the measures are differences of two of these.
#[derive(Clone, Copy, Debug, Default)]
struct Snap {
    at: u64,
    ok: u64,
    sent: u64,
}

/// What a limited pacer keeps, behind its lock. Times are nanoseconds on the breaker's clock.
#[derive(Debug)]
struct Paced {
    /// The settings (behind the lock: a reload changes them, the state kept).
    settings: AdaptiveRate,
    /// CUBIC's `W_max`: the plateau of the curve, requests a second.
    w_max: f64,
    /// CUBIC's `K`, in seconds.
    k: f64,
    /// CUBIC's `C`, scaled to `W_max` (or the limit's peak, if higher) so that the regrowth
    /// takes the same time at every rate.
    c: f64,
    /// The rate the last cut set, requests a second.
    start: f64,
    /// The origin of the curve's clock: the last cut, moved on by the time no call waited
    /// for a turn (RFC 9438 §5.8: the rate does not grow while the callers, not the rate,
    /// limit what is sent).
    curve_at: u64,
    /// Whether a call answered throttled asked for its turn while the first measure ran.
    front_asked: bool,
    last_decrease: u64,
    last_throttle: u64,
    /// While the first measure of a limit runs: when it ends (0: not measuring), and the
    /// successes counted when it began.
    measuring_until: u64,
    measure_from: u64,
    measure_ok: u64,
    /// Which limit this is: tickets of an earlier one are not in this queue.
    epoch: u64,
    /// Tickets given: a call that has to wait takes the next, and waits its turn.
    issued: u64,
    /// Turns given so far, at the rate of the moment, up to one ahead of the tickets given (a
    /// call that finds no one waiting goes at once): tickets below it may go.
    served: f64,
    /// The front of the queue, for calls answered throttled: tickets given and turns given
    /// there. Turns go to the front first.
    front_issued: u64,
    front_served: f64,
    /// When `served` was last brought up to date.
    served_at: u64,
    /// Callers whose turn came and who send now: the next calls go at once.
    credits: u32,
    /// Calls let through since this limit began (the measured send rate).
    sent: u64,
    /// Twice the send rate measured: the rate is never set above it, requests a second.
    cap: f64,
    /// Boxed: the breaker's hot fields stay close together.
    snaps: Box<[Snap; SNAPS]>,
    /// The next snapshot's slot, and how many are kept.
    snap_next: usize,
    snap_len: usize,
    /// The rate when the provider first throttled (this limit's peak), requests a second.
    peak: f64,
    below_half: bool,
    counting_since: u64,
    last_report: u64,
    /// The successes counted when the measure before a limit began.
    ok_at_start: u64,
    /// Throttled answers before this time do not cut the rate again: they answer calls let
    /// through before the last cut.
    calm_until: u64,
    /// A change made where it could not be told: the next look or call tells it.
    untold: Option<Change>,
    /// Whether a task watches this limit (reports the rate each second and lifts it once quiet,
    /// with or without calls).
    watched: bool,
}

impl Paced {
    fn new(settings: AdaptiveRate, now: u64) -> Self {
        Paced {
            settings,
            w_max: 0.0,
            k: 0.0,
            c: 0.0,
            start: 0.0,
            curve_at: 0,
            front_asked: false,
            last_decrease: 0,
            last_throttle: 0,
            measuring_until: 0,
            measure_from: 0,
            measure_ok: 0,
            epoch: 0,
            issued: 0,
            served: 0.0,
            front_issued: 0,
            front_served: 0.0,
            served_at: 0,
            credits: 0,
            sent: 0,
            cap: MAX_RATE,
            snaps: Box::new([Snap::default(); SNAPS]),
            snap_next: 0,
            snap_len: 0,
            peak: 0.0,
            below_half: false,
            counting_since: now,
            last_report: 0,
            ok_at_start: 0,
            calm_until: 0,
            untold: None,
            watched: false,
        }
    }

    /// Keeps a snapshot at `now` (at most one per [`SNAP_EVERY`]) and updates the cap: twice
    /// the send rate measured over the last window.
    fn snap(&mut self, ok: u64, now: u64) {
        if self.snap_len > 0 {
            let last = self.snaps[(self.snap_next + SNAPS - 1) % SNAPS];
            if now.saturating_sub(last.at) < SNAP_EVERY {
                return;
            }
        }
        self.snaps[self.snap_next] = Snap {
            at: now,
            ok,
            sent: self.sent,
        };
        self.snap_next = (self.snap_next + 1) % SNAPS;
        self.snap_len = (self.snap_len + 1).min(SNAPS);
        if self.measuring_until == 0
            && let Some((_, sent)) = self.measure(ok, now)
        {
            self.cap = (2.0 * sent).max(self.settings.floor);
        }
    }

    /// The admitted (successful) calls and the calls let through a second, measured over the
    /// window that holds about [`MEASURE_ANSWERS`] answers at the rate now (the measure window
    /// at least, [`MAX_WINDOW`] at most) and since this limit's last cut: `None` when the
    /// snapshots kept span less than half of it.
    fn measure(&self, ok: u64, now: u64) -> Option<(f64, f64)> {
        let rate = self.w_max.max(self.settings.floor);
        let window = nanos(self.settings.measure_window)
            .max((MEASURE_ANSWERS / rate * 1e9) as u64)
            .min(MAX_WINDOW);
        let from = now.saturating_sub(window);
        // The newest snapshot at or before `from`, else the oldest one after it.
        let mut pick: Option<Snap> = None;
        for i in 0..self.snap_len {
            let snap = self.snaps[(self.snap_next + SNAPS - 1 - i) % SNAPS];
            pick = Some(snap);
            if snap.at <= from {
                break;
            }
        }
        let snap = pick?;
        let span = now.saturating_sub(snap.at);
        if span < window || span == 0 {
            return None;
        }
        let seconds = span as f64 / 1e9;
        let ok = ok.saturating_sub(snap.ok) as f64 / seconds;
        let sent = self.sent.saturating_sub(snap.sent) as f64 / seconds;
        Some((ok, sent))
    }

    fn forget_snaps(&mut self) {
        self.snap_len = 0;
        self.snap_next = 0;
    }
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
            state: Mutex::new(Paced::new(settings, now)),
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

    /// Whether calls go through the pacer now (limited, or measuring for a limit).
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

    /// The rate now, requests a second, for a limited pacer: CUBIC's curve, at most twice the
    /// send rate measured; no limit while the first measure runs.
    fn rate_at(&self, p: &Paced, now: u64) -> f64 {
        if p.measuring_until != 0 {
            return MAX_RATE;
        }
        let t = now.saturating_sub(p.curve_at) as f64 / 1e9;
        let w = p.c * (t - p.k).powi(3) + p.w_max;
        // Growth above the rate the last cut set stops at twice the send rate measured; the
        // cap never cuts below it (callers asleep on a server's hint are no lack of demand).
        let w = if w > p.start {
            w.min(p.cap.max(p.start))
        } else {
            w
        };
        w.clamp(p.settings.floor, MAX_RATE)
    }

    /// Sets the curve at `now`: from `start` back up to the plateau `w_max` in CUBIC's `K`
    /// (RFC 9438 §4.2), with `C` scaled to `w_max` so that growing back from a cut of
    /// [`decrease`](AdaptiveRate::decrease) takes [`regrowth`](AdaptiveRate::regrowth) at every
    /// rate.
    fn set_curve(&self, p: &mut Paced, start: f64, w_max: f64, now: u64) {
        self.advance(p, now);
        let floor = p.settings.floor;
        let start = start.clamp(floor, MAX_RATE);
        p.start = start;
        p.w_max = w_max.clamp(start, MAX_RATE);
        let k0 = p.settings.regrowth.as_secs_f64();
        // Scaled to the limit's peak when the plateau fell far below it: a provider that
        // throttled everything for a while is found again in seconds once it recovers.
        p.c = p.w_max.max(p.peak) * (1.0 - p.settings.decrease) / (k0 * k0 * k0);
        p.k = ((p.w_max - start) / p.c).cbrt();
        p.last_decrease = now;
        p.curve_at = now;
        p.served_at = now;
        // The answers to calls let through before this cut are no news: known by their send
        // time, else for a second.
        p.calm_until = now.saturating_add(UNKNOWN_ROUND_TRIP);
        p.snap(self.ok(), now);
    }

    /// Cuts the rate at `now`, a throttled answer having come while it was `from`. With a
    /// measure of what the provider admitted over the last window (`admitted`), the curve
    /// restarts from [`measured_decrease`](AdaptiveRate::measured_decrease) of it, its plateau
    /// at it: the provider's own rate, whatever it was cut to. Without one, from
    /// [`decrease`](AdaptiveRate::decrease) of `from`, with CUBIC's fast convergence (RFC 9438
    /// §4.7: cut again before it grew back to the last plateau, the plateau is set lower, at
    /// `from · (1 + β) / 2`).
    fn cut(&self, p: &mut Paced, from: f64, admitted: Option<f64>, now: u64) {
        let (start, w_max) = match admitted {
            Some(admitted) => {
                let took = admitted.min(from);
                (took * p.settings.measured_decrease, took)
            }
            None => {
                let beta = p.settings.decrease;
                let w_max = if from < p.w_max {
                    from * (1.0 + beta) / 2.0
                } else {
                    from
                };
                (from * beta, w_max)
            }
        };
        self.set_curve(p, start, w_max, now);
    }

    /// Gives the turns due since `served_at`, at the rate now: to the front of the queue
    /// first, then to the others (a turn ahead at most).
    fn advance(&self, p: &mut Paced, now: u64) {
        let since = now.saturating_sub(p.served_at);
        if p.served >= p.issued as f64 && p.front_served >= p.front_issued as f64 {
            // No one waited since the last look: the callers, not the rate, limited what was
            // sent, and the curve's clock stands still.
            p.curve_at = p.curve_at.saturating_add(since).min(now);
        }
        let elapsed = since as f64 / 1e9;
        let mut turns = elapsed * self.rate_at(p, now);
        let front_due = p.front_issued as f64 - p.front_served;
        if front_due > 0.0 {
            let given = turns.min(front_due);
            p.front_served += given;
            turns -= given;
        }
        p.served = (p.served + turns).min(p.issued as f64 + 1.0);
        p.served_at = now;
    }

    /// A throttled answer from the provider at `now`: a limit begins (its first measure), or
    /// the rate is cut again. With the change to tell, the limit's number when no task watches
    /// it yet (the caller starts one, [`tick`](Self::tick)).
    pub(crate) fn throttled(&self, now: u64, sent_at: u64) -> (Option<Change>, Option<u64>) {
        let mut p = self.lock();
        let change = self.throttled_locked(&mut p, now, sent_at);
        let watch = (!p.watched && self.is_limited()).then(|| {
            p.watched = true;
            p.epoch
        });
        (change, watch)
    }

    /// `sent_at`: when the call answered throttled was let through while limited (0: before
    /// the limit, or not known). An answer to a call sent before the last cut is no news.
    fn throttled_locked(&self, p: &mut Paced, now: u64, sent_at: u64) -> Option<Change> {
        p.last_throttle = now;
        if !self.is_limited() {
            self.begin(p, now);
            return None;
        }
        if let Some(change) = self.settle(p, now) {
            return Some(change);
        }
        let news = if sent_at != 0 {
            sent_at >= p.last_decrease
        } else {
            now >= p.calm_until
        };
        let interval = nanos(p.settings.min_decrease_interval);
        if p.measuring_until != 0 || !news || now < p.last_decrease.saturating_add(interval) {
            return None;
        }
        self.advance(p, now);
        let current = self.rate_at(p, now);
        let admitted = p.measure(self.ok(), now).map(|(ok, _)| ok);
        self.cut(p, current, admitted, now);
        p.last_report = now;
        Some(self.report(p, now, "throttled"))
    }

    /// Begins a limit at the first throttled answer: its first measure runs for the measure
    /// window, calls going out as they come meanwhile (the throttled answers to a first burst
    /// come back before any admitted one, and say nothing of the provider's rate). The rate
    /// taken before, measured from the first success, is kept as a lower bound of the peak.
    fn begin(&self, p: &mut Paced, now: u64) {
        let start = match self.first_ok.load(Ordering::Relaxed) {
            0 => now,
            first => (first - 1).max(p.counting_since),
        };
        let window = now.saturating_sub(start);
        let ok = self.ok();
        // Over a second at least: a burst at start-up is not taken for a rate.
        let seconds = window.max(nanos(p.settings.measure_window)) as f64 / 1e9;
        p.peak = ok.saturating_sub(p.ok_at_start) as f64 / seconds;
        p.below_half = false;
        p.credits = 0;
        p.epoch = p.epoch.wrapping_add(1);
        p.issued = 0;
        p.served = 1.0;
        p.front_issued = 0;
        p.front_served = 0.0;
        p.served_at = now;
        p.sent = 0;
        p.cap = MAX_RATE;
        p.w_max = 0.0;
        p.last_decrease = now;
        p.forget_snaps();
        p.measuring_until = now.saturating_add(nanos(p.settings.measure_window)).max(1);
        p.measure_from = now;
        p.measure_ok = ok;
        p.front_asked = false;
        p.last_report = now;
        self.limited.store(true, Ordering::Relaxed);
    }

    /// Ends the first measure of a limit once its window passed and about ten answers were
    /// admitted (or three windows passed): the rate starts from
    /// [`measured_decrease`](AdaptiveRate::measured_decrease) of what the provider admitted
    /// over it, the curve's plateau at it (at the floor when nothing was admitted). The change
    /// to tell, when it ended now.
    fn settle(&self, p: &mut Paced, now: u64) -> Option<Change> {
        if p.measuring_until == 0 || now < p.measuring_until {
            return None;
        }
        let answers = self.ok().saturating_sub(p.measure_ok);
        let window = nanos(p.settings.measure_window);
        let ran = now.saturating_sub(p.measure_from);
        // Nothing admitted yet, before the first throttled answer nor since; or calls went out
        // and were throttled, too few admitted to read a rate from (a low quota, or a provider
        // that admits by the whole second and was spent): the measure runs on, three windows
        // at most.
        let unknown = answers == 0 && p.peak == 0.0;
        let throttled_on = p.sent > answers && !p.front_asked;
        if (unknown || ((answers as f64) < MEASURE_ANSWERS && throttled_on))
            && ran < window.saturating_mul(MEASURE_WINDOWS)
        {
            p.measuring_until = now.saturating_add((window / 4).max(1_000_000));
            return None;
        }
        // What the provider took before its first throttled answer is a lower bound: callers
        // asleep on a server's hint send less than it takes.
        let admitted = (answers as f64 / (ran.max(1) as f64 / 1e9)).max(p.peak);
        p.measuring_until = 0;
        p.peak = p.peak.max(admitted).max(p.settings.floor);
        let start = admitted * p.settings.measured_decrease;
        p.w_max = 0.0;
        p.served = p.issued as f64 + 1.0;
        self.set_curve(p, start, admitted, now);
        p.last_report = now;
        Some(self.report(p, now, "throttled"))
    }

    /// Lifts the limit at `now`: quiet for its lift time. A new measure begins.
    fn lift(&self, p: &mut Paced, now: u64) -> Change {
        self.limited.store(false, Ordering::Relaxed);
        self.first_ok.store(0, Ordering::Relaxed);
        let peak = p.peak;
        let epoch = p.epoch;
        *p = Paced::new(p.settings, now);
        p.ok_at_start = self.ok();
        p.epoch = epoch;
        Change {
            rate: None,
            peak,
            reason: "lifted",
        }
    }

    /// The watching task's look at limit `epoch` at `now`: lifted once quiet for the lift time,
    /// else a snapshot taken, the first measure ended on time, the rate told when a second
    /// passed since it was last told (so that a gauge and a health reading agree with no
    /// calls), and the time until the next look.
    pub(crate) fn tick(&self, epoch: u64, now: u64) -> Tick {
        let mut p = self.lock();
        if !self.is_limited() || p.epoch != epoch {
            return Tick::Stop;
        }
        let quiet_at = p.last_throttle.saturating_add(nanos(p.settings.lift_after));
        if now >= quiet_at {
            return Tick::Lifted(self.lift(&mut p, now));
        }
        let mut change = self.settle(&mut p, now).or(p.untold.take());
        p.snap(self.ok(), now);
        if p.measuring_until == 0 {
            self.advance(&mut p, now);
        }
        if change.is_none()
            && p.measuring_until == 0
            && now.saturating_sub(p.last_report) >= 1_000_000_000
        {
            p.last_report = now;
            change = Some(self.report(&mut p, now, "rising"));
        }
        let mut next = quiet_at.min(now.saturating_add(LOOK_EVERY));
        if p.measuring_until != 0 {
            next = next.min(p.measuring_until);
        }
        let next = next.saturating_sub(now).max(1_000_000);
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

    /// Asks for a turn at `now`: at once when no one waits and the rate allows (or while the
    /// first measure runs), else a place at the end of the queue; with a change to report,
    /// when the pacer changed.
    pub(crate) fn admit(&self, now: u64) -> (Admit, Option<Change>) {
        let mut p = self.lock();
        if !self.is_limited() {
            return (Admit::Go, None);
        }
        if now.saturating_sub(p.last_throttle) >= nanos(p.settings.lift_after) {
            return (Admit::Go, Some(self.lift(&mut p, now)));
        }
        let mut change = self.settle(&mut p, now).or(p.untold.take());
        p.snap(self.ok(), now);
        if p.measuring_until != 0 {
            p.sent += 1;
            return (Admit::Go, change);
        }
        if change.is_none() && now.saturating_sub(p.last_report) >= 1_000_000_000 {
            p.last_report = now;
            change = Some(self.report(&mut p, now, "rising"));
        }
        if p.credits > 0 {
            p.credits -= 1;
            p.sent += 1;
            return (Admit::Go, change);
        }
        self.advance(&mut p, now);
        let ticket = p.issued;
        p.issued += 1;
        if (ticket as f64) < p.served {
            p.sent += 1;
            return (Admit::Go, change);
        }
        let rate = self.rate_at(&p, now);
        let wait = Admit::Wait {
            wait: turn_in(&p, ticket, rate),
            ticket: Ticket {
                epoch: p.epoch,
                number: ticket,
                front: false,
            },
            rate,
        };
        (wait, change)
    }

    /// A place at the front of the queue of the limit now, for a call the provider answered
    /// throttled: `None` when not limited. The place is taken when the call first asks for its
    /// turn ([`redeem`](Self::redeem)), after the server's hint, so that it waits behind no
    /// one who came after it.
    pub(crate) fn front_ticket(&self) -> Option<Ticket> {
        if !self.is_limited() {
            return None;
        }
        Some(Ticket {
            epoch: self.lock().epoch,
            number: UNPLACED,
            front: true,
        })
    }

    /// Whether `ticket`'s turn came at `now`: `Ok` and the caller sends now (the breaker lets
    /// its call through), or `Err` with the time until it comes at the rate now. A front
    /// ticket not placed yet takes its place at the front of the queue now (at once, when no
    /// one waits and a turn is free).
    pub(crate) fn redeem(&self, ticket: &mut Ticket, now: u64) -> Result<(), Duration> {
        if !self.is_limited() {
            return Ok(());
        }
        let mut p = self.lock();
        if ticket.epoch != p.epoch {
            return Ok(());
        }
        if p.measuring_until != 0 {
            // A call answered throttled waits for the measure's end, at the front: sent now,
            // it would be throttled again (and spend an attempt) and add nothing to the measure.
            // Unless nothing is known yet: then it is what the measure is made of.
            let unknown = p.peak == 0.0 && self.ok() == p.measure_ok;
            if !ticket.front || unknown {
                return Ok(());
            }
            p.front_asked = true;
            let left = p.measuring_until.saturating_sub(now).max(1_000_000);
            return Err(Duration::from_nanos(left).min(Duration::from_secs(1)));
        }
        self.advance(&mut p, now);
        if ticket.front {
            if ticket.number == UNPLACED {
                if p.front_served >= p.front_issued as f64 && p.served - p.issued as f64 >= 1.0 {
                    // No one waits, and a turn is free: it is this call's.
                    p.served -= 1.0;
                    p.credits = p.credits.saturating_add(1);
                    ticket.number = UNPLACED - 1;
                    return Ok(());
                }
                ticket.number = p.front_issued;
                p.front_issued += 1;
            }
            if (ticket.number as f64) < p.front_served {
                p.credits = p.credits.saturating_add(1);
                return Ok(());
            }
            let rate = self.rate_at(&p, now);
            let turns = ticket.number as f64 + 1.0 - p.front_served;
            return Err(Duration::from_secs_f64((turns / rate).clamp(0.0, 1.0)));
        }
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
        if ticket.epoch != p.epoch || !self.is_limited() || ticket.number >= UNPLACED - 1 {
            return;
        }
        self.advance(&mut p, now);
        let p = &mut *p;
        let (issued, served) = if ticket.front {
            (&mut p.front_issued, &mut p.front_served)
        } else {
            (&mut p.issued, &mut p.served)
        };
        let ahead = if ticket.front { 0.0 } else { 1.0 };
        if ticket.number + 1 == *issued {
            *issued -= 1;
            *served = served.min(*issued as f64 + ahead);
        } else if (ticket.number as f64) >= *served {
            *served = (*served + 1.0).min(*issued as f64 + ahead);
        }
    }

    /// The rate now and its peak, requests a second: `None` while not limited (or while the
    /// first measure of a limit runs).
    pub(crate) fn current(&self, now: u64) -> Option<(f64, f64)> {
        if !self.is_limited() {
            return None;
        }
        let mut p = self.lock();
        // Quiet for the lift time: lifted at the next call, and not limited for a reader now.
        if now.saturating_sub(p.last_throttle) >= nanos(p.settings.lift_after) {
            return None;
        }
        if let Some(change) = self.settle(&mut p, now) {
            p.untold = Some(change);
        }
        if p.measuring_until != 0 {
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
    // The front of the queue goes first.
    let front = (p.front_issued as f64 - p.front_served).max(0.0);
    let turns = front + ticket as f64 + 1.0 - p.served;
    Duration::from_secs_f64((turns / rate).clamp(0.0, 1.0))
}

/// A place in a limited pacer's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    epoch: u64,
    number: u64,
    /// At the front of the queue: a call the provider answered throttled.
    front: bool,
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
