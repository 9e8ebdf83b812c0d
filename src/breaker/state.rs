//! The breaker's state machine, in atomics.
//!
//! One `AtomicU64` word holds the state (3 bits), the half-open bookkeeping (probes in flight and
//! successful probes, 10 bits each) and a generation number (the other 41 bits). Every transition
//! is one compare-and-swap that bumps the generation and clears the bookkeeping, so:
//! - an outcome from an earlier period (a slow call started before the last trip) cannot change
//!   a later one: it carries the word it was admitted under, and its generation no longer matches;
//! - a probe permit is taken and given back by a compare-and-swap on the same word that decides
//!   the transitions, so "exactly N probes" and "a failure and a success racing" have one order.
//!
//! The closed-state success path with the consecutive rule is one atomic load at admission (the
//! word) and one at completion (the failure count, written only when a row of failures is to
//! end): no lock, no clock read, and no write.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::limit::{AdaptiveConcurrency, Limiter};
use super::open::{Cause, CauseSlot, OpenDuration, OpenError, describe};
use super::rate::{AdaptiveRate, Admit, Change, Pacer, Tick, Ticket};
use super::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use super::tunable::{Rule, Tunable, saturating_nanos};
use super::window::{Counts, FAILED, SLOW, Window, WindowKind};
use crate::failure::{Class, Code};
use crate::observe::{Event, Listener, deliver};
use crate::status::{BreakerSnapshot, State};

/// The most probes or successful probes a half-open breaker can be configured with.
pub const MAX_PROBES: u32 = 1_000;

/// What a breaker is built from: the settings of a [`Builder`](super::Builder), as plain data.
/// The builder checks them; [`Shared::new`] only reads them.
#[derive(Clone)]
pub(crate) struct Settings {
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
    /// The adaptive send rate, when on.
    pub(crate) rate: Option<AdaptiveRate>,
    /// The adaptive concurrency limit, when on.
    pub(crate) concurrency: Option<AdaptiveConcurrency>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
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
            .field("rate", &self.rate)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl Settings {
    /// Whether a rate rule (failure rate or slow calls) is set.
    pub(crate) fn has_rates(&self) -> bool {
        self.failure_rate.is_some() || self.slow.is_some()
    }

    /// The calls the window must hold before a rate can trip the breaker.
    pub(crate) fn minimum(&self) -> u32 {
        self.minimum_calls.unwrap_or(match self.window {
            WindowKind::Count(n) => n,
            WindowKind::Time { .. } => 100,
        })
    }

    /// The first setting of `new` that a breaker built from these settings cannot take while it
    /// runs (see [`Shared::retune`]), by its builder's method: what decides the breaker's
    /// window (a rate rule, the slow-call rule, the window's kind and size), the classes it
    /// counts, whether it paces, whether it limits concurrency, and its name. `None`: every
    /// difference is a threshold.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn shape_change(&self, new: &Settings) -> Option<&'static str> {
        if self.has_rates() != new.has_rates() {
            return Some(
                if self.failure_rate.is_some() != new.failure_rate.is_some() {
                    "failure_rate"
                } else {
                    "slow_calls"
                },
            );
        }
        if self.slow.is_some() != new.slow.is_some() {
            return Some("slow_calls");
        }
        if self.has_rates() && self.window != new.window {
            return Some(match new.window {
                WindowKind::Count(_) => "count_window",
                WindowKind::Time { .. } => "time_window",
            });
        }
        if self.classes != new.classes {
            return Some("failure_classes");
        }
        if self.rate.is_some() != new.rate.is_some() {
            return Some("adaptive_rate");
        }
        if self.concurrency.is_some() != new.concurrency.is_some() {
            return Some("adaptive_concurrency");
        }
        if self.name != new.name {
            return Some("name");
        }
        None
    }

    /// The same settings under another name (a keyed breaker is named after its key).
    pub(crate) fn named(&self, name: &str) -> Settings {
        Settings {
            name: Arc::from(name),
            ..self.clone()
        }
    }
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
/// `half_open_at` of a breaker its watch moved to half-open: no probe yet, so the half-open
/// wait has not begun.
const NO_PROBE_YET: u64 = u64::MAX;
const FORCED_OPEN: u64 = 3;
const DISABLED: u64 = 4;
const STATE_MASK: u64 = 0b111;
const IN_FLIGHT_SHIFT: u32 = 3;
const SUCCESS_SHIFT: u32 = 13;
const COUNT_MASK: u64 = 0x3FF;
const GEN_SHIFT: u32 = 23;
const ONE_IN_FLIGHT: u64 = 1 << IN_FLIGHT_SHIFT;
const ONE_SUCCESS: u64 = 1 << SUCCESS_SHIFT;

/// The public state a word encodes.
fn state_name(word: u64) -> State {
    match word & STATE_MASK {
        CLOSED => State::Closed,
        OPEN => State::Open,
        HALF_OPEN => State::HalfOpen,
        FORCED_OPEN => State::ForcedOpen,
        _ => State::Disabled,
    }
}

/// Counters of a breaker, read through [`BreakerHandle::stats`](super::BreakerHandle::stats).
///
/// The transition counters count since the breaker was built; the window counters describe the
/// current window of the closed state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Transitions to open (trips, failed probes, half-open waits exceeded; not forced opens).
    pub opened: u64,
    /// Transitions from open to half-open.
    pub half_opened: u64,
    /// Transitions from half-open to closed (enough successful probes).
    pub closed: u64,
    /// Calls rejected without reaching the inner service.
    pub rejected: u64,
    /// Probes admitted in half-open.
    pub probes: u64,
    /// Calls that ended in a class that counts as a failure.
    pub failures: u64,
    /// Failures in a row, now (the consecutive rule's count).
    pub consecutive_failures: u32,
    /// Calls in the current window (rate rules only).
    pub window_calls: u64,
    /// Failed calls in the current window (rate rules only).
    pub window_failures: u64,
    /// Slow calls in the current window (slow-call rule only).
    pub window_slow_calls: u64,
}

fn state_of(word: u64) -> u64 {
    word & STATE_MASK
}

fn gen_of(word: u64) -> u64 {
    word >> GEN_SHIFT
}

fn in_flight(word: u64) -> u64 {
    (word >> IN_FLIGHT_SHIFT) & COUNT_MASK
}

fn successes(word: u64) -> u64 {
    (word >> SUCCESS_SHIFT) & COUNT_MASK
}

/// The word of the next period: generation + 1, bookkeeping cleared.
fn next(word: u64, state: u64) -> u64 {
    (gen_of(word).wrapping_add(1) << GEN_SHIFT) | state
}

/// A call admitted by [`Shared::admit`]. It records nothing by itself: hand it back to
/// [`Shared::complete`] (or [`Shared::cancel`] when the call is dropped). Two words, so that the
/// service can keep it and the future can carry it without padding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Permit {
    /// The word it was admitted under; its state says what kind of call this is (closed,
    /// a half-open probe, or disabled: recorded nowhere).
    word: u64,
    /// When the call started (nanoseconds since `base`), when the slow-call rule needs it.
    start: u64,
}

impl Permit {
    /// A permit already handed back: real words never have every generation bit set (see
    /// [`Decision`]).
    const DONE: u64 = u64::MAX;

    /// Takes the permit, leaving a spent one behind; `None` if it was already taken.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<Permit> {
        let word = std::mem::replace(&mut self.word, Self::DONE);
        (word != Self::DONE).then_some(Permit {
            word,
            start: self.start,
        })
    }
}

/// Why a call was rejected: the time left until half-open, in nanoseconds, or `NONE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rejection {
    nanos: u64,
}

impl Rejection {
    const NONE: u64 = u64::MAX;

    fn new(retry_after: Option<Duration>) -> Self {
        Rejection {
            nanos: retry_after.map_or(Self::NONE, |d| saturating_nanos(d).min(Self::NONE - 1)),
        }
    }

    /// The time left until half-open, when known.
    pub(crate) fn retry_after(self) -> Option<Duration> {
        (self.nanos != Self::NONE).then(|| Duration::from_nanos(self.nanos))
    }
}

/// What `poll_ready` decided, kept by the service until `call`: nothing yet, a permit, or a
/// rejection, in two plain words (an `Option<Result<Permit, Rejection>>` costs padding and
/// partial copies on the hot path). Real words never have every generation bit set (that takes
/// 2^41 transitions), so two such words mark "nothing" and "rejected".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decision {
    word: u64,
    aux: u64,
}

impl Decision {
    const EMPTY: u64 = u64::MAX;
    const REJECTED: u64 = u64::MAX - 1;

    pub(crate) const NONE: Decision = Decision {
        word: Self::EMPTY,
        aux: 0,
    };

    #[inline]
    pub(crate) fn new(admitted: Result<Permit, Rejection>) -> Self {
        match admitted {
            Ok(p) => Decision {
                word: p.word,
                aux: p.start,
            },
            Err(r) => Decision {
                word: Self::REJECTED,
                aux: r.nanos,
            },
        }
    }

    #[inline]
    pub(crate) fn is_none(&self) -> bool {
        self.word == Self::EMPTY
    }

    #[inline]
    pub(crate) fn is_rejected(&self) -> bool {
        self.word == Self::REJECTED
    }

    /// Takes the decision, leaving none.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<Result<Permit, Rejection>> {
        let d = std::mem::replace(self, Decision::NONE);
        match d.word {
            Self::EMPTY => None,
            Self::REJECTED => Some(Err(Rejection { nanos: d.aux })),
            word => Some(Ok(Permit { word, start: d.aux })),
        }
    }
}

/// Whether the window's `counts` cross a rate of `rule`: the reason, if so.
fn rate_exceeded(rule: &Rule, counts: Counts) -> Option<&'static str> {
    if counts.calls < rule.minimum_calls {
        return None;
    }
    let calls = counts.calls as f64;
    if let Some(rate) = rule.failure_rate
        && counts.failures as f64 >= rate * calls
    {
        return Some("failure rate");
    }
    if let Some((_, rate)) = rule.slow
        && counts.slow as f64 >= rate * calls
    {
        return Some("slow-call rate");
    }
    None
}

/// How one call ended, as the breaker counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    /// A failure of this class; whether it counts is the breaker's configuration.
    Failure(Class),
}

/// One breaker's state and counters, shared (behind an `Arc`) by the layer, its services, their
/// response futures and the handles.
pub(crate) struct Shared {
    pub(crate) name: Arc<str>,
    /// What its rejections say: open, forced open (shared, so a rejection allocates only its
    /// failure).
    pub(crate) open_errors: [Arc<OpenError>; 2],
    /// The settings it was built from, its thresholds as last changed (see
    /// [`retune`](Self::retune)).
    settings: RwLock<Settings>,
    /// The thresholds, read at each decision.
    rule: Tunable,
    classes: Arc<[Class]>,
    listener: Option<Arc<dyn Listener>>,
    window: Option<Window>,
    /// The adaptive send rate's pacer, when on.
    pacer: Option<Pacer>,
    /// The adaptive concurrency limiter, when on (see `limit.rs`).
    pub(super) limiter: Option<Limiter>,
    /// Whether a call's start time is needed (the slow-call rule).
    needs_start: AtomicBool,
    /// Whether the slow-call rule needs each call's start: `needs_start` goes back to it when a
    /// send-rate limit (which also reads the send times) is lifted.
    slow_needs_start: bool,

    word: AtomicU64,
    failures: AtomicU32,
    /// When the current open period ends, in nanoseconds since `base`.
    open_until: AtomicU64,
    /// When the current half-open period began, in nanoseconds since `base`.
    half_open_at: AtomicU64,
    /// Openings since the breaker last closed, for a growing open duration.
    trips: AtomicU32,
    base: Instant,

    opened: AtomicU64,
    half_opened: AtomicU64,
    closed: AtomicU64,
    rejected: AtomicU64,
    probes_admitted: AtomicU64,
    failed: AtomicU64,
    /// `failed` when the breaker last closed: the failures of this outage are the difference.
    failed_at_close: AtomicU64,
    /// When the first failure since the breaker last closed came, in nanoseconds since `base`
    /// plus one (0: none yet).
    first_failure: AtomicU64,
    /// When the breaker last opened (not forced), in nanoseconds since `base` plus one (0:
    /// never): what a fleet compares a peer's successful probe with.
    opened_at: AtomicU64,
    /// When probes last closed it, in nanoseconds since `base` plus one (0: never): what it
    /// tells a fleet.
    closed_at: AtomicU64,
    /// The provider's last real failure while the breaker is not closed, shared with
    /// `open_errors`.
    cause: Arc<CauseSlot>,
    /// This breaker, weakly: what the tasks that watch its timers hold (see
    /// [`watch_open`](Self::watch_open) and [`watch_rate`](Self::watch_rate)).
    me: Weak<Shared>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(config: &Settings) -> Arc<Self> {
        Arc::new_cyclic(|me| Shared::with(config, me.clone()))
    }

    fn with(config: &Settings, me: Weak<Shared>) -> Self {
        let window = config.has_rates().then(|| match config.window {
            WindowKind::Count(n) => Window::count(n),
            WindowKind::Time { width, buckets } => {
                Window::time(saturating_nanos(width).max(1), buckets)
            }
        });
        let cause = Arc::new(CauseSlot::default());
        Shared {
            name: config.name.clone(),
            open_errors: OpenError::pair(&config.name, &cause),
            settings: RwLock::new(config.clone()),
            rule: Tunable::new(Rule::of(config)),
            classes: config.classes.clone(),
            listener: config.listener.clone(),
            window,
            pacer: config.rate.map(|rate| Pacer::new(rate, 0)),
            limiter: config.concurrency.map(Limiter::new),
            needs_start: AtomicBool::new(config.slow.is_some()),
            slow_needs_start: config.slow.is_some(),
            word: AtomicU64::new(CLOSED),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            half_open_at: AtomicU64::new(NO_PROBE_YET),
            trips: AtomicU32::new(0),
            base: Instant::now(),
            opened: AtomicU64::new(0),
            half_opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            probes_admitted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            failed_at_close: AtomicU64::new(0),
            first_failure: AtomicU64::new(0),
            opened_at: AtomicU64::new(0),
            closed_at: AtomicU64::new(0),
            cause,
            me,
        }
    }

    /// After a call that failed with `class`: when the failure counts and the breaker is open
    /// now (this failure opened it, or a probe failed), it becomes the breaker's cause, with
    /// the failures counted since the breaker last closed. A failure that leaves the breaker
    /// closed costs one atomic load here; `message` is only built when kept.
    pub(crate) fn note_failure(&self, class: Class, code: Code, message: impl FnOnce() -> String) {
        if !self.counts(class) || state_of(self.word.load(Ordering::Acquire)) != OPEN {
            return;
        }
        let now = self.now();
        let failures = self
            .failed
            .load(Ordering::Relaxed)
            .saturating_sub(self.failed_at_close.load(Ordering::Relaxed))
            .max(1);
        let since = match self.first_failure.load(Ordering::Relaxed) {
            0 => now,
            first => (first - 1).min(now),
        };
        // A breaker opened on the store's evidence keeps saying so through its failed probes.
        let learned = self.cause.get().and_then(|c| c.learned.clone());
        self.cause.set(Some(Cause {
            class,
            code,
            message: message(),
            at: self.base + Duration::from_nanos(now),
            failures,
            since: self.base + Duration::from_nanos(since),
            learned,
        }));
    }

    /// The breaker closed: the outage it counted is over.
    fn forget_outage(&self) {
        self.cause.set(None);
        self.first_failure.store(0, Ordering::Relaxed);
        self.failed_at_close
            .store(self.failed.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub(crate) fn counts(&self, class: Class) -> bool {
        self.classes.contains(&class)
    }

    fn now(&self) -> u64 {
        saturating_nanos(Instant::now().saturating_duration_since(self.base))
    }

    /// The breaker's clock, in nanoseconds since it was made.
    pub(crate) fn now_nanos(&self) -> u64 {
        self.now()
    }

    /// The adaptive send rate's pacer, when on.
    #[inline]
    pub(crate) fn pacer(&self) -> Option<&Pacer> {
        self.pacer.as_ref()
    }

    /// Asks the pacer for a turn, when the rate is limited: `Ok` to send now, `Err` with the
    /// wait until the call's turn (and its place in the queue, and the rate).
    #[inline]
    pub(crate) fn pace(&self) -> Result<(), (Duration, Ticket, f64)> {
        match &self.pacer {
            Some(pacer) if pacer.is_limited() => self.pace_slow(pacer),
            _ => Ok(()),
        }
    }

    #[cold]
    fn pace_slow(&self, pacer: &Pacer) -> Result<(), (Duration, Ticket, f64)> {
        let (admit, change) = pacer.admit(self.now());
        if let Some(change) = change {
            self.rate_changed(change);
        }
        match admit {
            Admit::Go => Ok(()),
            Admit::Wait { wait, ticket, rate } => Err((wait, ticket, rate)),
        }
    }

    /// A throttled answer: the pacer lowers the rate, and a new limit gets a task that watches
    /// it ([`watch_rate`](Self::watch_rate)).
    #[cold]
    fn throttled(&self, pacer: &Pacer, sent_at: u64) {
        let (change, watch) = pacer.throttled(self.now(), sent_at);
        if pacer.is_limited() {
            // While limited, each call's start is kept: a throttled answer to a call sent
            // before the last cut is no news.
            self.needs_start.store(true, Ordering::Relaxed);
        }
        if let Some(change) = change {
            self.rate_changed(change);
        }
        if let Some(epoch) = watch {
            self.watch_rate(pacer, epoch);
        }
    }

    /// Watches the send rate's limit `epoch` from a task of its own on the current tokio
    /// runtime, off every call's path: it tells the rate each second and lifts the limit once
    /// the provider has been quiet for the lift time, whether calls come or not, so that the
    /// gauges, the health report and the alerts never keep a value for a provider that gets no
    /// more traffic. It holds the breaker weakly and ends with the limit (or the breaker).
    /// Without a runtime it is not started: the limit is then lifted at the next call, and
    /// readers already see it lifted.
    fn watch_rate(&self, pacer: &Pacer, epoch: u64) {
        let started =
            self.watch(
                move |shared| match shared.pacer.as_ref()?.tick(epoch, shared.now()) {
                    Tick::Stop => None,
                    Tick::Lifted(change) => {
                        shared.rate_changed(change);
                        None
                    }
                    Tick::Sleep(wait, change) => {
                        if let Some(change) = change {
                            shared.rate_changed(change);
                        }
                        Some(wait)
                    }
                },
            );
        if !started {
            pacer.unwatch(epoch);
        }
    }

    /// Runs `look` on this breaker from a task of its own on the current tokio runtime, off
    /// every call's path: after each look it sleeps the time `look` returned, and it ends when
    /// `look` returns `None` or the breaker is dropped (the task holds it weakly). `false`
    /// when there is no runtime to run it on.
    pub(super) fn watch(
        &self,
        mut look: impl FnMut(&Shared) -> Option<Duration> + Send + 'static,
    ) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let breaker = self.me.clone();
        runtime.spawn(async move {
            loop {
                let wait = match breaker.upgrade() {
                    Some(shared) => look(&shared),
                    None => None,
                };
                let Some(wait) = wait else {
                    return;
                };
                tokio::time::sleep(wait).await;
            }
        });
        true
    }

    /// The send rate now and its peak, in requests a second: `None` while not limited (or
    /// without an adaptive rate).
    pub(crate) fn send_rate(&self) -> Option<(f64, f64)> {
        self.pacer.as_ref()?.current(self.now())
    }

    /// Tells the listener of a rate change, and logs the ones an operator acts on: the first
    /// limit, a fall below half the peak, a recovery, the limit lifted.
    fn rate_changed(&self, change: Change) {
        if change.rate.is_none() {
            // Lifted: back to reading the time only for the slow-call rule.
            self.needs_start
                .store(self.slow_needs_start, Ordering::Relaxed);
        }
        let name = &*self.name;
        match (change.reason, change.rate) {
            ("below_half", Some(rate)) => tracing::warn!(
                breaker = name,
                rate,
                peak = change.peak,
                "send rate below half of its peak: the provider keeps throttling"
            ),
            ("recovered", Some(rate)) => tracing::info!(
                breaker = name,
                rate,
                peak = change.peak,
                "send rate recovered to its peak"
            ),
            ("lifted", _) => tracing::info!(
                breaker = name,
                peak = change.peak,
                "send rate no longer limited: no throttled answer for a while"
            ),
            ("throttled", Some(rate)) => tracing::debug!(
                breaker = name,
                rate,
                peak = change.peak,
                "send rate lowered after a throttled answer"
            ),
            _ => {}
        }
        self.emit(Event::SendRate {
            breaker: name,
            rate: change.rate,
            peak: change.peak,
            reason: change.reason,
        });
    }

    pub(crate) fn state(&self) -> State {
        state_name(self.word.load(Ordering::Acquire))
    }

    pub(crate) fn stats(&self) -> Stats {
        let window = self
            .window
            .as_ref()
            .map(|w| w.counts(|| self.now()))
            .unwrap_or_default();
        Stats {
            opened: self.opened.load(Ordering::Relaxed),
            half_opened: self.half_opened.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            probes: self.probes_admitted.load(Ordering::Relaxed),
            failures: self.failed.load(Ordering::Relaxed),
            consecutive_failures: self.failures.load(Ordering::Relaxed),
            window_calls: window.calls,
            window_failures: window.failures,
            window_slow_calls: window.slow,
        }
    }

    /// Where this breaker stands now, for a health report: its counters, state, time left
    /// until half-open and, while it is not closed, why it opened.
    pub(crate) fn snapshot(&self) -> BreakerSnapshot<'_> {
        let stats = self.stats();
        let state = self.state();
        let retry_after = self.retry_after();
        let failure_rate = (self.rule.get().failure_rate.is_some() && stats.window_calls > 0)
            .then(|| stats.window_failures as f64 / stats.window_calls as f64);
        let cause = match state {
            State::Closed | State::Disabled => None,
            _ => self.open_errors[0]
                .cause_now()
                .map(|cause| describe(&cause)),
        };
        BreakerSnapshot {
            name: &self.name,
            state,
            retry_after,
            failure_rate,
            window_calls: stats.window_calls,
            window_failures: stats.window_failures,
            consecutive_failures: stats.consecutive_failures,
            cause,
            opened: stats.opened,
            rejected: stats.rejected,
            send_rate: self.send_rate(),
            concurrency_limit: self.concurrency_limit().map(|(limit, _)| limit),
        }
    }

    /// The time left until half-open, when open and not forced.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        let word = self.word.load(Ordering::Acquire);
        match state_of(word) {
            OPEN => Some(Duration::from_nanos(
                self.open_until
                    .load(Ordering::Acquire)
                    .saturating_sub(self.now()),
            )),
            HALF_OPEN => Some(self.rule.get().open.nth(self.trips.load(Ordering::Relaxed))),
            _ => None,
        }
    }

    pub(super) fn emit(&self, event: Event<'_>) {
        if let Some(listener) = &self.listener {
            deliver(&**listener, &event);
        }
    }

    fn transitioned(&self, from: u64, to: u64, reason: &'static str) {
        let (from, to) = (state_name(from), state_name(to));
        // One WARN when an outage begins and one INFO when it ends; the half-open probes of a
        // long outage in between say less.
        match (from, to) {
            (State::HalfOpen, State::Open) => tracing::info!(
                breaker = &*self.name,
                from = from.as_str(),
                to = to.as_str(),
                reason,
                "circuit still open"
            ),
            (_, State::Open | State::ForcedOpen) => tracing::warn!(
                breaker = &*self.name,
                from = from.as_str(),
                to = to.as_str(),
                reason,
                "circuit opened"
            ),
            (_, State::HalfOpen) => tracing::debug!(
                breaker = &*self.name,
                from = from.as_str(),
                to = to.as_str(),
                reason,
                "circuit half-open"
            ),
            _ => tracing::info!(
                breaker = &*self.name,
                from = from.as_str(),
                to = to.as_str(),
                reason,
                "circuit state changed"
            ),
        }
        self.emit(Event::BreakerTransition {
            breaker: &self.name,
            from,
            to,
            reason,
        });
        if matches!(to, State::Open | State::ForcedOpen) {
            // An outage is the breaker's to handle, not a load to limit.
            self.limit_outage();
        }
    }

    fn reject(&self, word: u64, retry_after: Option<Duration>) -> Rejection {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let state = state_name(word);
        tracing::debug!(breaker = &*self.name, state = state.as_str(), retry_after = ?retry_after, "call rejected");
        self.emit(Event::BreakerRejected {
            breaker: &self.name,
            state,
            retry_after,
        });
        Rejection::new(retry_after)
    }

    /// Admits a call, or rejects it with the time left until half-open.
    #[inline]
    pub(crate) fn admit(&self) -> Result<Permit, Rejection> {
        let word = self.word.load(Ordering::Acquire);
        if state_of(word) == CLOSED {
            let start = if self.needs_start.load(Ordering::Relaxed) {
                self.now()
            } else {
                0
            };
            return Ok(Permit { word, start });
        }
        self.admit_slow(word)
    }

    #[cold]
    fn admit_slow(&self, mut word: u64) -> Result<Permit, Rejection> {
        let rule = self.rule.get();
        loop {
            match state_of(word) {
                CLOSED => {
                    let start = if self.needs_start.load(Ordering::Relaxed) {
                        self.now()
                    } else {
                        0
                    };
                    return Ok(Permit { word, start });
                }
                DISABLED => {
                    return Ok(Permit { word, start: 0 });
                }
                FORCED_OPEN => return Err(self.reject(word, None)),
                OPEN => {
                    let now = self.now();
                    let until = self.open_until.load(Ordering::Acquire);
                    if now < until {
                        return Err(self.reject(word, Some(Duration::from_nanos(until - now))));
                    }
                    word = match self.half_open(word, now) {
                        Ok(half) | Err(half) => half,
                    };
                }
                _ => {
                    // Half-open.
                    if let Some(max) = rule.max_half_open {
                        let now = self.now();
                        let since = self.half_open_at.load(Ordering::Acquire);
                        if now.saturating_sub(since) >= max {
                            self.open_from(word, "half-open wait exceeded");
                            word = self.word.load(Ordering::Acquire);
                            continue;
                        }
                    }
                    if in_flight(word) >= rule.probes {
                        // Every permit is taken. If a probe fails, the breaker opens for the
                        // next open duration: the longest a caller may have to wait.
                        let wait = rule.open.nth(self.trips.load(Ordering::Relaxed));
                        return Err(self.reject(word, Some(wait)));
                    }
                    match self.word.compare_exchange(
                        word,
                        word + ONE_IN_FLIGHT,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            self.probes_admitted.fetch_add(1, Ordering::Relaxed);
                            // The half-open wait counts from the first probe (a breaker moved
                            // to half-open by its watch, with no call, has none yet).
                            let _ = self.half_open_at.compare_exchange(
                                NO_PROBE_YET,
                                self.now(),
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            );
                            tracing::debug!(breaker = &*self.name, "probe admitted");
                            let start = if self.needs_start.load(Ordering::Relaxed) {
                                self.now()
                            } else {
                                0
                            };
                            return Ok(Permit { word, start });
                        }
                        Err(actual) => word = actual,
                    }
                }
            }
        }
    }

    /// Moves the breaker from the open `word` to half-open (its open duration is over), its
    /// half-open wait counted from `since` (now when a call moves it, with its probe;
    /// [`NO_PROBE_YET`] when its watch does): `Ok` with the half-open word, or `Err` with the
    /// word another transition left.
    fn half_open(&self, word: u64, since: u64) -> Result<u64, u64> {
        let half = next(word, HALF_OPEN);
        // Written before the swap: whoever sees the half-open word sees its start.
        self.half_open_at.store(since, Ordering::Release);
        self.word
            .compare_exchange(word, half, Ordering::AcqRel, Ordering::Acquire)?;
        self.half_opened.fetch_add(1, Ordering::Relaxed);
        self.transitioned(word, half, "open duration elapsed");
        Ok(half)
    }

    /// Watches the open period of `word` from a task of its own on the current tokio runtime,
    /// off every call's path: at its end, if the breaker is still in that period, it moves it
    /// to half-open, with or without a call (resilience4j's
    /// `automaticTransitionFromOpenToHalfOpenEnabled`), so that the state gauge, the health
    /// report and the breaker-open alert never keep "open" for a provider that gets no more
    /// traffic. The half-open wait ([`Builder::max_half_open`](super::Builder::max_half_open))
    /// then counts from the first probe, as when a call moves it. It holds the breaker weakly.
    /// Without a runtime it is not started: the next call moves the breaker, as it always
    /// does.
    fn watch_open(&self, word: u64) {
        self.watch(move |shared| {
            if shared.word.load(Ordering::Acquire) != word {
                return None;
            }
            let now = shared.now();
            let until = shared.open_until.load(Ordering::Acquire);
            if now < until {
                return Some(Duration::from_nanos(until - now));
            }
            // Moved to half-open with no probe yet.
            let _ = shared.half_open(word, NO_PROBE_YET);
            None
        });
    }

    /// Opens the breaker from `from` (closed or half-open), unless another transition won.
    fn open_from(&self, from: u64, reason: &'static str) -> bool {
        if self.word.load(Ordering::Acquire) != from {
            // Another transition won; leave the current period's end alone.
            return false;
        }
        let trips = self.trips.load(Ordering::Relaxed);
        let duration = self.rule.get().open.pick(trips);
        // Written before the swap: whoever sees the open word sees its end.
        self.open_until.store(
            self.now().saturating_add(saturating_nanos(duration)),
            Ordering::Release,
        );
        let to = next(from, OPEN);
        if self
            .word
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.opened_at
            .store(self.now().saturating_add(1), Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        if let Some(w) = &self.window {
            w.clear();
        }
        self.transitioned(from, to, reason);
        tracing::debug!(breaker = &*self.name, open_for = ?duration, "open duration");
        self.watch_open(to);
        true
    }

    /// The settings it was built from, with its thresholds as last changed.
    pub(crate) fn settings(&self) -> Settings {
        self.settings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes the thresholds of `settings` (checked by their builder, and of the same shape as
    /// this breaker's: see [`Settings::same_shape`]): its next decision reads them. Its state
    /// is kept: an open breaker stays open until the end of the period it opened for (the
    /// new open duration applies from its next opening), a closed one keeps its window's
    /// counts and its failures in a row, a half-open one its probes. The adaptive send rate's
    /// settings change too, its current rate kept, and so do the adaptive concurrency limit's,
    /// its current limit kept.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn retune(&self, settings: &Settings) {
        self.rule.set(&Rule::of(settings));
        if let (Some(pacer), Some(rate)) = (&self.pacer, settings.rate) {
            pacer.retune(rate);
        }
        if let (Some(limiter), Some(concurrency)) = (&self.limiter, settings.concurrency) {
            limiter.retune(concurrency);
        }
        let mut kept = self
            .settings
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let name = kept.name.clone();
        let listener = kept.listener.clone();
        *kept = Settings {
            name,
            listener,
            ..settings.clone()
        };
    }

    /// Records how an admitted call ended.
    #[inline]
    pub(crate) fn complete(&self, permit: Permit, outcome: Outcome) {
        if let Some(pacer) = &self.pacer {
            match outcome {
                Outcome::Success => pacer.success(|| self.now()),
                Outcome::Failure(Class::THROTTLED) => self.throttled(pacer, permit.start),
                Outcome::Failure(_) => {}
            }
        }
        match state_of(permit.word) {
            CLOSED => self.complete_closed(permit, outcome),
            HALF_OPEN => self.complete_probe(permit, outcome),
            // Disabled: nothing is recorded.
            _ => {}
        }
    }

    #[inline]
    fn complete_closed(&self, permit: Permit, outcome: Outcome) {
        let failed = match outcome {
            Outcome::Success => false,
            Outcome::Failure(class) if self.counts(class) => true,
            // A class that does not count: neither a failure nor a success.
            Outcome::Failure(_) => return,
        };
        if !failed && self.window.is_none() {
            // The hot path: a success under the consecutive rule alone (a rate rule, the
            // slow-call rule included, always has a window). It ends the row of
            // failures if it started in this closed period (after the breaker last closed).
            if self.failures.load(Ordering::Relaxed) != 0
                && self.word.load(Ordering::Acquire) == permit.word
            {
                self.failures.store(0, Ordering::Relaxed);
            }
            return;
        }
        self.record_closed(permit, failed);
    }

    fn record_closed(&self, permit: Permit, failed: bool) {
        let rule = self.rule.get();
        let mut now = None;
        let mut clock = || *now.get_or_insert_with(|| self.now());
        let slow = match (rule.slow, permit.start) {
            (Some((threshold, _)), start) => clock().saturating_sub(start) > threshold,
            _ => false,
        };
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if self.first_failure.load(Ordering::Relaxed) == 0 {
                self.first_failure
                    .store(clock().saturating_add(1), Ordering::Relaxed);
            }
        }
        if self.word.load(Ordering::Acquire) != permit.word {
            // An outcome from an earlier period: it must not change this one.
            return;
        }
        let mut trip = None;
        if let Some(n) = rule.consecutive {
            if failed {
                let count = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if count >= n {
                    trip = Some("consecutive failures");
                }
            } else if self.failures.load(Ordering::Relaxed) != 0 {
                self.failures.store(0, Ordering::Relaxed);
            }
        }
        if let Some(window) = &self.window {
            let bits = if failed { FAILED } else { 0 } | if slow { SLOW } else { 0 };
            window.record(bits, &mut clock);
            if trip.is_none() {
                trip = rate_exceeded(&rule, window.counts(&mut clock));
            }
        }
        if let Some(reason) = trip {
            self.open_from(permit.word, reason);
        }
    }

    fn complete_probe(&self, permit: Permit, outcome: Outcome) {
        let counted = match outcome {
            Outcome::Success => {
                let slow = match (self.rule.get().slow, permit.start) {
                    (Some((threshold, _)), start) => self.now().saturating_sub(start) > threshold,
                    _ => false,
                };
                // A slow probe is a failed probe under the slow-call rule.
                Some(!slow)
            }
            Outcome::Failure(class) if self.counts(class) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                // The span of a cause starts at the first failure counted since the breaker
                // last closed, a failed probe's too (a breaker opened on the store's evidence
                // counts its first failure here).
                if self.first_failure.load(Ordering::Relaxed) == 0 {
                    self.first_failure
                        .store(self.now().saturating_add(1), Ordering::Relaxed);
                }
                Some(false)
            }
            Outcome::Failure(_) => None,
        };
        match counted {
            Some(true) => self.probe_succeeded(permit),
            Some(false) => {
                let mut word = self.word.load(Ordering::Acquire);
                while gen_of(word) == gen_of(permit.word) && state_of(word) == HALF_OPEN {
                    if self.open_from(word, "probe failed") {
                        return;
                    }
                    word = self.word.load(Ordering::Acquire);
                }
            }
            None => self.cancel(permit),
        }
    }

    fn probe_succeeded(&self, permit: Permit) {
        let mut word = self.word.load(Ordering::Acquire);
        while gen_of(word) == gen_of(permit.word) && state_of(word) == HALF_OPEN {
            let done = successes(word) + 1;
            if done >= self.rule.get().close_after {
                let to = next(word, CLOSED);
                // Cleared before the swap: the closed period starts from an empty window.
                self.failures.store(0, Ordering::Relaxed);
                if let Some(w) = &self.window {
                    w.clear();
                }
                match self
                    .word
                    .compare_exchange(word, to, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        self.trips.store(0, Ordering::Relaxed);
                        self.forget_outage();
                        self.closed.fetch_add(1, Ordering::Relaxed);
                        self.closed_at
                            .store(self.now().saturating_add(1), Ordering::Relaxed);
                        self.transitioned(word, to, "probes succeeded");
                        return;
                    }
                    Err(actual) => word = actual,
                }
            } else {
                let to = word - ONE_IN_FLIGHT + ONE_SUCCESS;
                match self
                    .word
                    .compare_exchange(word, to, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return,
                    Err(actual) => word = actual,
                }
            }
        }
    }

    /// A call that was dropped before it ended, or ended in a class that does not count: a probe
    /// gives its permit back; nothing is counted.
    pub(crate) fn cancel(&self, permit: Permit) {
        if state_of(permit.word) != HALF_OPEN {
            return;
        }
        let mut word = self.word.load(Ordering::Acquire);
        while gen_of(word) == gen_of(permit.word)
            && state_of(word) == HALF_OPEN
            && in_flight(word) > 0
        {
            match self.word.compare_exchange(
                word,
                word - ONE_IN_FLIGHT,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    tracing::debug!(breaker = &*self.name, "probe permit returned");
                    return;
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Opens a closed breaker until `until`: a provider another process found down (see
    /// [`BreakerLayer::learn_from`](super::BreakerLayer::learn_from)). A time already past
    /// half-opens it at the next call. Whether it opened: a breaker not closed is left alone.
    /// `learned` says where (see [`Cause::learned`]): it is the breaker's cause until a probe
    /// fails or the breaker closes.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn open_until(&self, until: Instant, learned: String) -> bool {
        self.open_learned(until, learned, "learned from the store")
    }

    /// [`open_until`](Self::open_until), with the transition's `reason`.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn open_learned(
        &self,
        until: Instant,
        learned: String,
        reason: &'static str,
    ) -> bool {
        let from = self.word.load(Ordering::Acquire);
        if state_of(from) != CLOSED {
            return false;
        }
        // Written before the swap: whoever sees the open word sees its end.
        self.open_until.store(
            saturating_nanos(until.saturating_duration_since(self.base)),
            Ordering::Release,
        );
        let to = next(from, OPEN);
        if self
            .word
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.cause.set(Some(Cause::learned(
            learned,
            self.base + Duration::from_nanos(self.now()),
        )));
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.opened_at
            .store(self.now().saturating_add(1), Ordering::Relaxed);
        self.transitioned(from, to, reason);
        self.watch_open(to);
        true
    }

    /// When it last opened and when probes last closed it, on the breaker's clock (see
    /// [`now_nanos`](Self::now_nanos)), for a fleet.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn opened_and_closed_at(&self) -> (Option<u64>, Option<u64>) {
        let at = |a: &AtomicU64| a.load(Ordering::Relaxed).checked_sub(1);
        (at(&self.opened_at), at(&self.closed_at))
    }

    /// Keeps `text` as the cause of a breaker an operator's override forced open, for its
    /// rejections and its health report.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn overridden(&self, text: String) {
        self.cause.set(Some(Cause::learned(
            text,
            self.base + Duration::from_nanos(self.now()),
        )));
    }

    /// The rule that opens it, for a fleet's evidence: failures in a row, and the failure rate
    /// with its minimum of calls.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn rule(&self) -> (Option<u32>, Option<(f64, u64)>) {
        let rule = self.rule.get();
        (
            rule.consecutive,
            rule.failure_rate.map(|rate| (rate, rule.minimum_calls)),
        )
    }

    /// How long it would stay open if it tripped now.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn next_open_duration(&self) -> Duration {
        self.rule
            .get()
            .open
            .pick(self.trips.load(Ordering::Relaxed))
    }

    /// When an open breaker half-opens, on the breaker's clock; `None` when not open.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn half_opens_at(&self) -> Option<u64> {
        (state_of(self.word.load(Ordering::Acquire)) == OPEN)
            .then(|| self.open_until.load(Ordering::Acquire))
    }

    /// Keeps an open breaker open until `until` at least (a fleet's probe is due first);
    /// whether it did. Any other state is left alone.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn stay_open_until(&self, until: Instant) -> bool {
        if state_of(self.word.load(Ordering::Acquire)) != OPEN {
            return false;
        }
        let until = saturating_nanos(until.saturating_duration_since(self.base));
        self.open_until.fetch_max(until, Ordering::AcqRel) < until
    }

    /// Brings an open breaker's half-open time forward to `until` at the latest (the fleet's
    /// prober probes at least that often); whether it did. Any other state is left alone.
    #[cfg(feature = "dead-letter")]
    pub(crate) fn open_at_most_until(&self, until: Instant) -> bool {
        let word = self.word.load(Ordering::Acquire);
        if state_of(word) != OPEN {
            return false;
        }
        let until = saturating_nanos(until.saturating_duration_since(self.base));
        let shortened = self.open_until.fetch_min(until, Ordering::AcqRel) > until;
        if shortened {
            // Its watch sleeps until the old end: one more watches the new one.
            self.watch_open(word);
        }
        shortened
    }

    /// Closes an open or half-open breaker because a probe succeeded in another process of its
    /// fleet; whether it did (a closed, forced or disabled breaker is left alone).
    #[cfg(feature = "dead-letter")]
    pub(crate) fn close_for_fleet(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        while matches!(state_of(word), OPEN | HALF_OPEN) {
            self.failures.store(0, Ordering::Relaxed);
            if let Some(w) = &self.window {
                w.clear();
            }
            let to = next(word, CLOSED);
            match self
                .word
                .compare_exchange(word, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.trips.store(0, Ordering::Relaxed);
                    self.forget_outage();
                    self.closed.fetch_add(1, Ordering::Relaxed);
                    self.transitioned(word, to, "a probe succeeded in another process");
                    return true;
                }
                Err(actual) => word = actual,
            }
        }
        false
    }

    /// Moves to `state` from whatever state the breaker is in, for an operator.
    fn force(&self, state: u64, reason: &'static str) {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if state == CLOSED {
                self.failures.store(0, Ordering::Relaxed);
                if let Some(w) = &self.window {
                    w.clear();
                }
                self.trips.store(0, Ordering::Relaxed);
            }
            let to = next(word, state);
            match self
                .word
                .compare_exchange(word, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if state == CLOSED {
                        self.forget_outage();
                    }
                    self.transitioned(word, to, reason);
                    return;
                }
                Err(actual) => word = actual,
            }
        }
    }

    pub(crate) fn force_open(&self) {
        self.force(FORCED_OPEN, "forced open");
    }

    pub(crate) fn disable(&self) {
        self.force(DISABLED, "disabled");
    }

    pub(crate) fn reset(&self) {
        self.force(CLOSED, "reset");
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    #[test]
    fn word_layout_keeps_fields_apart() {
        let w = next(0, HALF_OPEN) + ONE_IN_FLIGHT * 3 + ONE_SUCCESS * 2;
        assert_eq!(state_of(w), HALF_OPEN);
        assert_eq!(in_flight(w), 3);
        assert_eq!(successes(w), 2);
        assert_eq!(gen_of(w), 1);
        let n = next(w, OPEN);
        assert_eq!(
            (state_of(n), in_flight(n), successes(n), gen_of(n)),
            (OPEN, 0, 0, 2)
        );
        // The maximum counts fit their fields.
        assert!(u64::from(super::MAX_PROBES) <= COUNT_MASK);
    }
}
