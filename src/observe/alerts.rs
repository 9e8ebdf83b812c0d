//! [`Alerts`]: the alert rules of a mail pipeline's runbook, evaluated in process on the
//! events as they happen.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::event::{Event, Listener, deliver};
use crate::failure::{Class, Code};
use crate::status::State;

type Hook = Arc<dyn Fn(&Alert, bool) + Send + Sync>;

/// When the alert signals fire. The defaults follow the usual runbook of a mail pipeline:
/// a class above 20 % of the dead letters of the last 5 minutes, a dead-letter rate over the last
/// 5 minutes at least 3 times that of the hour before, a code never seen before, a deferred
/// backlog that kept growing for minutes.
///
/// Only outstanding dead letters (dead records) count: deferred records are shown apart and
/// resolved ones never. The rules compare with a past the reader may not have:
///
/// - over a store (`Stats`, `backstop-dlq stats`), the rate spike and the new code wait until
///   the store has that past: a record that last failed before the baseline period began. A
///   new store, or one purged of everything older, raises neither;
/// - in process ([`Alerts`]), a listener that has not yet seen a whole baseline and window
///   raises a spike on an absolute bar instead, `spike_factor × min_count` dead letters in the
///   window (15 by default), so that a process's first burst pages; a new code waits for the
///   first window only (every code is new to a listener that just started). The Prometheus
///   rules shipped in the repository's `docs/alerts.yml` do the same.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AlertRules {
    /// The recent window the signals look at. Default 5 minutes.
    pub window: Duration,
    /// A class whose share of the window's dead letters is above this fraction raises
    /// [`Alert::ClassShare`]. Default 0.2 (20 %).
    pub class_share: f64,
    /// The window must hold at least this many dead letters for the rate and share signals
    /// (one failure alone is 100 % of one). Default 5.
    pub min_count: u64,
    /// The baseline the rate is compared with: the dead letters of this period before the
    /// window. Default 1 hour.
    pub baseline: Duration,
    /// The window's rate at least this many times the baseline's raises [`Alert::RateSpike`];
    /// without a baseline (in process), `spike_factor × min_count` dead letters in the window
    /// do. Default 3.0.
    pub spike_factor: f64,
    /// In-process alerts only ([`Alerts`]): [`Alert::BacklogGrowing`] fires while the lowest
    /// backlog count of the last [`backlog_sustained`](Self::backlog_sustained) is at least
    /// [`backlog_growth`](Self::backlog_growth) above the lowest of the last `backlog_window`.
    /// Default 5 minutes.
    pub backlog_window: Duration,
    /// In-process alerts only: how long the backlog must have stayed up (see
    /// [`backlog_window`](Self::backlog_window)): a backlog that grows and drains within this
    /// time (a burst of short deferrals) raises nothing. Default 2 minutes.
    pub backlog_sustained: Duration,
    /// In-process alerts only: the growth, in records, that raises
    /// [`Alert::BacklogGrowing`]. Default 10.
    pub backlog_growth: u64,
}

impl Default for AlertRules {
    fn default() -> Self {
        AlertRules {
            window: Duration::from_secs(5 * 60),
            class_share: 0.2,
            min_count: 5,
            baseline: Duration::from_secs(60 * 60),
            spike_factor: 3.0,
            backlog_window: Duration::from_secs(5 * 60),
            backlog_sustained: Duration::from_secs(2 * 60),
            backlog_growth: 10,
        }
    }
}

/// An alert signal.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Alert {
    /// The dead-letter rate of the window is well above the baseline's.
    RateSpike {
        /// Dead letters per minute in the window.
        per_minute: f64,
        /// Dead letters per minute in the baseline period before it; for an in-process
        /// listener that has not seen a whole baseline yet, the rate it assumes,
        /// `min_count` per window.
        baseline_per_minute: f64,
    },
    /// One class holds more than the configured share of the window's dead letters.
    ClassShare {
        /// The class.
        class: String,
        /// Its share, from 0 to 1.
        share: f64,
        /// Its dead letters in the window.
        count: u64,
        /// All dead letters in the window.
        total: u64,
    },
    /// A code the store had never seen appeared in the window.
    NewCode {
        /// The code.
        code: String,
        /// When it was first seen.
        first_seen: SystemTime,
    },
    /// A breaker opened (in-process alerts only): raised when it opens or is forced open,
    /// cleared when it closes or is disabled, not while it is half-open.
    BreakerOpen {
        /// The breaker's name (a keyed breaker's key).
        breaker: String,
    },
    /// A breaker's adaptive send rate is below half of its peak (in-process alerts only):
    /// the provider keeps answering throttled and takes far less than it took before
    /// ([`AdaptiveRate`](crate::breaker::AdaptiveRate)). Raised when an
    /// [`Event::SendRate`] tells a rate below half of the peak, cleared when one tells a rate
    /// of half the peak or more, or the limit lifted.
    SendRateLow {
        /// The breaker's name (a keyed breaker's key).
        breaker: String,
        /// The send rate when the alert was raised, in requests a second.
        rate: f64,
        /// The rate the provider took when the limit began (the limit's peak), in requests a
        /// second.
        peak: f64,
    },
    /// The deferred backlog grew and stayed up (in-process alerts only): its lowest count of
    /// the last `backlog_sustained` is `backlog_growth` or more above the lowest of the last
    /// `backlog_window`.
    BacklogGrowing {
        /// The records waiting now.
        backlog: u64,
        /// How much the backlog's low point rose: the lowest count of the last
        /// `backlog_sustained` less the lowest of the last `backlog_window`.
        grown_by: u64,
        /// Deliveries (successful attempts, re-sends and re-drives) per minute over the last
        /// backlog window, for the runbook: falling deliveries point at the provider.
        delivered_per_minute: f64,
        /// Deliveries per minute over the backlog window before it.
        before_per_minute: f64,
    },
}

impl Alert {
    /// The rule's name, stable, for a log field or a metric label: `dead_letter_spike`,
    /// `class_share`, `new_code`, `breaker_open`, `send_rate_low`, `backlog_growing`.
    pub const fn rule(&self) -> &'static str {
        match self {
            Alert::RateSpike { .. } => "dead_letter_spike",
            Alert::ClassShare { .. } => "class_share",
            Alert::NewCode { .. } => "new_code",
            Alert::BreakerOpen { .. } => "breaker_open",
            Alert::SendRateLow { .. } => "send_rate_low",
            Alert::BacklogGrowing { .. } => "backlog_growing",
        }
    }
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Alert::RateSpike {
                per_minute,
                baseline_per_minute,
            } => write!(
                f,
                "dead-letter rate {per_minute:.1}/min, baseline {baseline_per_minute:.1}/min"
            ),
            Alert::ClassShare {
                class,
                share,
                count,
                total,
            } => write!(
                f,
                "class {class} is {:.0}% of recent dead letters ({count} of {total})",
                share * 100.0
            ),
            Alert::NewCode { code, first_seen } => write!(
                f,
                "new code {code:?} first seen {}",
                httpdate::fmt_http_date(*first_seen)
            ),
            Alert::BreakerOpen { breaker } => write!(f, "breaker {breaker} is open"),
            Alert::SendRateLow {
                breaker,
                rate,
                peak,
            } => write!(
                f,
                "breaker {breaker} sends at {rate:.1}/s, below half of its peak {peak:.1}/s"
            ),
            Alert::BacklogGrowing {
                backlog,
                grown_by,
                delivered_per_minute,
                before_per_minute,
            } => write!(
                f,
                "deferred backlog {backlog} (+{grown_by}), deliveries \
                 {delivered_per_minute:.1}/min, {before_per_minute:.1}/min before"
            ),
        }
    }
}

/// What a window's dead letters are compared with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Baseline {
    /// The dead letters of the baseline period before the window.
    Known(u64),
    /// No past to compare with: no spike (a store without the history).
    #[cfg_attr(not(feature = "dead-letter"), allow(dead_code))]
    Unknown,
    /// No past yet: a spike needs `spike_factor × min_count` dead letters in the window (an
    /// in-process listener younger than its baseline and window).
    Assumed,
}

impl AlertRules {
    /// The rate spike and class-share signals of a window that holds `total` dead letters
    /// (`by_class`, per class), against `baseline`. Shared by `Stats` (over a store) and the
    /// in-process [`Alerts`].
    pub(crate) fn measure<'a>(
        &self,
        total: u64,
        baseline: Baseline,
        by_class: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Vec<Alert> {
        let mut alerts = Vec::new();
        if total < self.min_count {
            return alerts;
        }
        let rate = per_minute(total, self.window);
        let spike = match baseline {
            Baseline::Known(before) => {
                let baseline_rate = per_minute(before, self.baseline);
                (rate >= self.spike_factor * baseline_rate).then_some(baseline_rate)
            }
            Baseline::Unknown => None,
            Baseline::Assumed => (total as f64 >= self.spike_factor * self.min_count as f64)
                .then(|| per_minute(self.min_count, self.window)),
        };
        if let Some(baseline_per_minute) = spike {
            alerts.push(Alert::RateSpike {
                per_minute: rate,
                baseline_per_minute,
            });
        }
        for (class, count) in by_class {
            let share = count as f64 / total as f64;
            if share > self.class_share {
                alerts.push(Alert::ClassShare {
                    class: class.to_owned(),
                    share,
                    count,
                    total,
                });
            }
        }
        alerts
    }
}

pub(crate) fn per_minute(count: u64, over: Duration) -> f64 {
    let minutes = over.as_secs_f64() / 60.0;
    if minutes > 0.0 {
        count as f64 / minutes
    } else {
        0.0
    }
}

/// A [`Listener`] that raises the alerts of [`AlertRules`] as the events happen, and clears
/// them when their condition ends. They are the Prometheus rules of the repository's
/// `docs/alerts.yml` (over the `metrics` feature's `Metrics`), evaluated in process, and fire
/// on the same incidents, the first of a young process included:
///
/// - [`Alert::RateSpike`] (`dead_letter_spike`): at least `min_count` (5) dead letters in the
///   last `window` (5 minutes), at a rate at least `spike_factor` (3) times that of the
///   `baseline` (the hour) before; until the listener has seen a whole baseline and window,
///   at least `spike_factor × min_count` (15) dead letters in the window instead;
/// - [`Alert::ClassShare`] (`class_share`): one class above `class_share` (20 %) of the dead
///   letters of the last `window`, at least `min_count` in all; one alert per class;
/// - [`Alert::BreakerOpen`] (`breaker_open`): a breaker opened or was forced open; cleared
///   when it closes (the Prometheus rule waits a minute before it pages);
/// - [`Alert::SendRateLow`] (`send_rate_low`): a breaker's adaptive send rate
///   ([`Event::SendRate`]) is below half of its peak; cleared when a rate of half the peak
///   or more is told, or the limit is lifted (the Prometheus rule waits 10 minutes before it
///   opens a ticket); one alert per breaker;
/// - [`Alert::BacklogGrowing`] (`backlog_growing`): the scheduler's backlog
///   ([`Event::Backlog`]) rose and stayed up: its lowest count of the last
///   `backlog_sustained` (2 minutes) is at least `backlog_growth` (10) above its lowest of the
///   last `backlog_window` (5 minutes); cleared once it stops rising;
/// - [`Alert::NewCode`] (`new_code`): a failure's code never seen before, once a first whole
///   `window` has passed since the listener's first event (every code is new to a listener
///   that just started); active for one `window`. A breaker's rejection has no code of its
///   own here.
///
/// Dead letters are records stored dead ([`Event::DeadLetterStored`] with `deferred: false`),
/// as for `backstop-dlq stats`: a deferred record waits for the scheduler. Each raise is
/// written at `WARN` and each clear at `INFO` to `tracing`, with the fields `alert` (the rule),
/// `firing`, and the alert's text; handed to [`on_alert`](Self::on_alert); and, with the
/// `metrics` feature, set on the gauge `backstop_alert_active{rule}` (1 while any alert of the
/// rule fires).
///
/// Rules are evaluated on the events that change them, and at most once a second on any
/// other; while an alert that ends with time fires (a spike, a class's share, a growing
/// backlog, a new code), a task on the tokio runtime looks at the rules each second too, so it
/// clears on time with no traffic after it, as Prometheus's rules do. Time is tokio's clock. Dead letters are counted once per message
/// and status ([`Event::DeadLetterStored`]).
///
/// Give it to a stack like any listener; [`then`](Self::then) passes every event on to
/// another one (the `Metrics` listener, say):
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::BackstopLayer;
/// use tower_backstop::observe::Alerts;
///
/// let alerts = Alerts::new().on_alert(|alert, firing| {
///     if firing {
///         eprintln!("page: {alert}");
///     }
/// });
/// let layer = BackstopLayer::http(Duration::from_secs(2)).listener(alerts.clone());
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct Alerts {
    rules: AlertRules,
    hook: Option<Hook>,
    next: Option<Arc<dyn Listener>>,
    state: Arc<Mutex<Watch>>,
}

impl fmt::Debug for Alerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerts")
            .field("rules", &self.rules)
            .field("active", &self.active())
            .finish_non_exhaustive()
    }
}

impl Default for Alerts {
    fn default() -> Self {
        Alerts::new()
    }
}

impl Alerts {
    /// The default rules ([`AlertRules::default`]), no hook.
    pub fn new() -> Self {
        Alerts {
            rules: AlertRules::default(),
            hook: None,
            next: None,
            state: Arc::new(Mutex::new(Watch::default())),
        }
    }

    /// The thresholds.
    pub fn rules(mut self, rules: AlertRules) -> Self {
        self.rules = rules;
        self
    }

    /// Called on each raise (`firing` is `true`) and clear (`false`), on the thread of the
    /// event that caused it; a panic is caught like a listener's.
    pub fn on_alert(mut self, hook: impl Fn(&Alert, bool) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Hands every event on to `listener` too, after the rules saw it.
    pub fn then(mut self, listener: impl Listener) -> Self {
        self.next = Some(Arc::new(listener));
        self
    }

    /// The alerts firing now, in the order of their rules' names.
    pub fn active(&self) -> Vec<Alert> {
        let watch = self.state.lock().unwrap_or_else(|e| e.into_inner());
        watch.firing.values().cloned().collect()
    }
}

impl Listener for Alerts {
    fn on_event(&self, event: &Event<'_>) {
        let (changes, tick) = {
            let mut watch = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let changes = watch.see(&self.rules, event, Instant::now());
            (changes, watch.needs_ticker())
        };
        for (alert, firing) in &changes {
            self.tell(alert, *firing);
        }
        if tick {
            self.start_ticker();
        }
        if let Some(next) = &self.next {
            deliver(&**next, event);
        }
    }
}

impl Alerts {
    /// Looks at the rules again each second from a task of its own on the current tokio
    /// runtime, while an alert that ends with time is firing (a dead-letter spike, a class's
    /// share, a growing backlog, a new code): such an alert then clears on time when no more
    /// events come, as Prometheus's rules do over their windows, instead of at the next event.
    /// The task holds the rules' state weakly and ends when no such alert fires. Without a
    /// runtime it is not started, and alerts clear at the next event.
    fn start_ticker(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).ticking = false;
            return;
        };
        let state = Arc::downgrade(&self.state);
        let (rules, hook) = (self.rules, self.hook.clone());
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(state) = state.upgrade() else {
                    return;
                };
                let alerts = Alerts {
                    rules,
                    hook: hook.clone(),
                    next: None,
                    state,
                };
                let (changes, go_on) = {
                    let mut watch = alerts.state.lock().unwrap_or_else(|e| e.into_inner());
                    let changes = watch.tick(&alerts.rules, Instant::now());
                    let go_on = watch.timed_firing();
                    watch.ticking = go_on;
                    (changes, go_on)
                };
                for (alert, firing) in &changes {
                    alerts.tell(alert, *firing);
                }
                if !go_on {
                    return;
                }
            }
        });
    }

    fn tell(&self, alert: &Alert, firing: bool) {
        if firing {
            tracing::warn!(alert = alert.rule(), firing, "alert: {alert}");
        } else {
            tracing::info!(alert = alert.rule(), firing, "alert cleared: {alert}");
        }
        #[cfg(feature = "metrics")]
        {
            let watch = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let active = watch.firing.values().any(|a| a.rule() == alert.rule());
            ::metrics::gauge!("backstop_alert_active", "rule" => alert.rule()).set(if active {
                1.0
            } else {
                0.0
            });
        }
        if let Some(hook) = &self.hook {
            let caught =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(alert, firing)));
            if caught.is_err() {
                tracing::error!(
                    alert = alert.rule(),
                    "an alert hook panicked; the call goes on"
                );
            }
        }
    }
}

/// The key of a firing alert: its rule, and the class it is about.
fn key(alert: &Alert) -> String {
    match alert {
        Alert::ClassShare { class, .. } => format!("class_share/{class}"),
        other => other.rule().to_owned(),
    }
}

/// Dead letters of one minute.
struct Minute {
    minute: u64,
    total: u64,
    by_class: Vec<(Class, u64)>,
}

/// What the rules remember.
#[derive(Default)]
struct Watch {
    started: Option<Instant>,
    evaluated: Option<Instant>,
    /// Dead letters per minute since `started`, over the window and baseline.
    dead: VecDeque<Minute>,
    codes: HashSet<Code>,
    /// New codes and when their alert ends.
    new_codes: Vec<(Code, Instant)>,
    /// Backlog counts of the backlog window, oldest first.
    backlog: VecDeque<(Instant, u64)>,
    /// Deliveries per minute, over two backlog windows.
    delivered: VecDeque<(u64, u64)>,
    /// Firing alerts by key (the rule, and the class, breaker or code it is about).
    firing: BTreeMap<String, Alert>,
    /// Whether a task looks at the rules each second (see [`Alerts::start_ticker`]).
    ticking: bool,
}

fn minutes(d: Duration) -> u64 {
    (d.as_secs() / 60).max(1)
}

impl Watch {
    /// Whether an alert that ends with time fires: a measured rule's, or a new code's.
    fn timed_firing(&self) -> bool {
        self.firing.keys().any(|key| {
            key == "dead_letter_spike"
                || key == "backlog_growing"
                || key.starts_with("class_share/")
                || key.starts_with("new_code/")
        })
    }

    /// Whether a ticker must start: an alert that ends with time fires, and none ticks yet.
    fn needs_ticker(&mut self) -> bool {
        let start = !self.ticking && self.timed_firing();
        self.ticking |= start;
        start
    }

    /// The rules looked at again at `now`, with no new event; the alerts raised and cleared.
    fn tick(&mut self, rules: &AlertRules, now: Instant) -> Vec<(Alert, bool)> {
        let Some(started) = self.started else {
            return Vec::new();
        };
        let minute = now.duration_since(started).as_secs() / 60;
        let mut changes = Vec::new();
        self.evaluated = Some(now);
        self.evaluate(rules, now, started, minute, &mut changes);
        changes
    }

    /// Takes `event` in at `now`; the alerts raised (`true`) and cleared (`false`).
    fn see(&mut self, rules: &AlertRules, event: &Event<'_>, now: Instant) -> Vec<(Alert, bool)> {
        let started = *self.started.get_or_insert(now);
        let minute = now.duration_since(started).as_secs() / 60;
        let mut changes = Vec::new();
        let mut evaluate = false;
        match *event {
            Event::DeadLetterStored {
                class,
                deferred: false,
                ..
            } => {
                match self.dead.back_mut() {
                    Some(m) if m.minute == minute => m.count(class),
                    _ => {
                        let mut m = Minute {
                            minute,
                            total: 0,
                            by_class: Vec::new(),
                        };
                        m.count(class);
                        self.dead.push_back(m);
                    }
                }
                evaluate = true;
            }
            Event::AttemptEnded {
                class: None,
                code: None,
                ..
            }
            | Event::Resent {
                outcome: "delivered",
                ..
            }
            | Event::Redriven {
                outcome: "resolved",
                ..
            } => {
                match self.delivered.back_mut() {
                    Some((m, n)) if *m == minute => *n += 1,
                    _ => self.delivered.push_back((minute, 1)),
                }
                let keep = 2 * minutes(rules.backlog_window) + 1;
                while self
                    .delivered
                    .front()
                    .is_some_and(|(m, _)| minute.saturating_sub(*m) > keep)
                {
                    self.delivered.pop_front();
                }
            }
            // A breaker's rejection (or a call its send rate held back) is not an attempt, and
            // its code no provider's.
            Event::AttemptEnded {
                code: Some(code), ..
            } if !code.not_an_attempt()
                && self.codes.insert(code)
                && now.duration_since(started) >= rules.window =>
            {
                // The guard records every code; only one seen after a whole window alerts.
                let alert = Alert::NewCode {
                    code: code.to_string(),
                    first_seen: SystemTime::now(),
                };
                self.new_codes.push((code, now + rules.window));
                self.firing
                    .insert(format!("new_code/{code}"), alert.clone());
                changes.push((alert, true));
            }
            Event::BreakerTransition { breaker, to, .. } => {
                self.breaker_moved(breaker, to, &mut changes);
            }
            Event::SendRate {
                breaker,
                rate,
                peak,
                ..
            } => self.send_rate(breaker, rate, peak, &mut changes),
            Event::Backlog { deferred } => {
                self.backlog.push_back((now, deferred));
                // The counts of the backlog window, its start included.
                while self
                    .backlog
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at) > rules.backlog_window)
                {
                    self.backlog.pop_front();
                }
                evaluate = true;
            }
            _ => {}
        }
        if evaluate
            || self
                .evaluated
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.evaluated = Some(now);
            self.evaluate(rules, now, started, minute, &mut changes);
        }
        changes
    }

    /// The breaker-open rule, on a transition: open (or forced open) raises (once per
    /// breaker), closed or disabled clears.
    fn breaker_moved(&mut self, breaker: &str, to: State, changes: &mut Vec<(Alert, bool)>) {
        let key = format!("breaker_open/{breaker}");
        match to {
            State::Open | State::ForcedOpen => {
                if let std::collections::btree_map::Entry::Vacant(slot) = self.firing.entry(key) {
                    let alert = Alert::BreakerOpen {
                        breaker: breaker.to_owned(),
                    };
                    slot.insert(alert.clone());
                    changes.push((alert, true));
                }
            }
            State::Closed | State::Disabled => {
                if let Some(alert) = self.firing.remove(&key) {
                    changes.push((alert, false));
                }
            }
            _ => {}
        }
    }

    /// The send-rate rule, on a rate told: below half of the peak raises (once per breaker),
    /// anything else (half or more, or lifted) clears. A rate or peak that is not a number
    /// compares false, as in Prometheus.
    fn send_rate(
        &mut self,
        breaker: &str,
        rate: Option<f64>,
        peak: f64,
        changes: &mut Vec<(Alert, bool)>,
    ) {
        let key = format!("send_rate_low/{breaker}");
        match rate {
            Some(rate) if rate < 0.5 * peak => {
                if let std::collections::btree_map::Entry::Vacant(slot) = self.firing.entry(key) {
                    let alert = Alert::SendRateLow {
                        breaker: breaker.to_owned(),
                        rate,
                        peak,
                    };
                    slot.insert(alert.clone());
                    changes.push((alert, true));
                }
            }
            _ => {
                if let Some(alert) = self.firing.remove(&key) {
                    changes.push((alert, false));
                }
            }
        }
    }

    /// Raises and clears the alerts whose conditions are measured over windows.
    fn evaluate(
        &mut self,
        rules: &AlertRules,
        now: Instant,
        started: Instant,
        minute: u64,
        changes: &mut Vec<(Alert, bool)>,
    ) {
        let window = minutes(rules.window);
        let baseline = minutes(rules.baseline);
        while self
            .dead
            .front()
            .is_some_and(|m| minute.saturating_sub(m.minute) >= window + baseline)
        {
            self.dead.pop_front();
        }
        let mut now_firing: BTreeMap<String, Alert> = BTreeMap::new();
        // Dead letters of the window (the current minute and the window - 1 before it) and of
        // the baseline before it.
        let in_window = |m: &Minute| minute - m.minute < window;
        let total: u64 = self
            .dead
            .iter()
            .filter(|m| in_window(m))
            .map(|m| m.total)
            .sum();
        let before: u64 = self
            .dead
            .iter()
            .filter(|m| !in_window(m))
            .map(|m| m.total)
            .sum();
        // A listener that has not seen a whole baseline yet compares with an assumed one.
        let baseline = if now.duration_since(started) >= rules.window + rules.baseline {
            Baseline::Known(before)
        } else {
            Baseline::Assumed
        };
        let mut by_class: BTreeMap<Class, u64> = BTreeMap::new();
        for m in self.dead.iter().filter(|m| in_window(m)) {
            for (class, n) in &m.by_class {
                *by_class.entry(*class).or_default() += n;
            }
        }
        let by_class = by_class.into_iter().map(|(class, n)| (class.name(), n));
        for alert in rules.measure(total, baseline, by_class) {
            now_firing.insert(key(&alert), alert);
        }
        if let Some(alert) = self.backlog_growing(rules, now, minute) {
            now_firing.insert("backlog_growing".to_owned(), alert);
        }
        // The measured rules: raise what became true, clear what stopped; a firing alert
        // keeps its first figures until it clears.
        let measured = |key: &str| {
            key == "dead_letter_spike"
                || key == "backlog_growing"
                || key.starts_with("class_share/")
        };
        let ended: Vec<String> = self
            .firing
            .keys()
            .filter(|k| measured(k) && !now_firing.contains_key(*k))
            .cloned()
            .collect();
        for key in ended {
            if let Some(alert) = self.firing.remove(&key) {
                changes.push((alert, false));
            }
        }
        for (key, alert) in now_firing {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.firing.entry(key) {
                slot.insert(alert.clone());
                changes.push((alert, true));
            }
        }
        // New codes stay active for one window.
        let firing = &mut self.firing;
        self.new_codes.retain(|(code, until)| {
            if now < *until {
                return true;
            }
            if let Some(alert) = firing.remove(&format!("new_code/{code}")) {
                changes.push((alert, false));
            }
            false
        });
    }

    /// The backlog rule: the lowest count of the last `backlog_sustained` is `backlog_growth`
    /// or more above the lowest of the last `backlog_window` (both ends included, as
    /// Prometheus' `min_over_time`).
    fn backlog_growing(&self, rules: &AlertRules, now: Instant, minute: u64) -> Option<Alert> {
        let low = |within: Duration| {
            self.backlog
                .iter()
                .filter(|(at, _)| now.duration_since(*at) <= within)
                .map(|(_, n)| *n)
                .min()
        };
        let window_low = low(rules.backlog_window)?;
        let recent_low = low(rules.backlog_sustained)?;
        let &(_, backlog) = self.backlog.back()?;
        let grown_by = recent_low.checked_sub(window_low)?;
        if grown_by < rules.backlog_growth.max(1) {
            return None;
        }
        let window = minutes(rules.backlog_window);
        let delivered = |range: std::ops::Range<u64>| -> u64 {
            self.delivered
                .iter()
                .filter(|(m, _)| range.contains(m))
                .map(|(_, n)| n)
                .sum()
        };
        let recent = delivered(minute.saturating_sub(window - 1)..minute + 1);
        let earlier =
            delivered(minute.saturating_sub(2 * window - 1)..minute.saturating_sub(window - 1));
        Some(Alert::BacklogGrowing {
            backlog,
            grown_by,
            delivered_per_minute: recent as f64 / window as f64,
            before_per_minute: earlier as f64 / window as f64,
        })
    }
}

impl Minute {
    fn count(&mut self, class: Class) {
        self.total += 1;
        match self.by_class.iter_mut().find(|(c, _)| *c == class) {
            Some((_, n)) => *n += 1,
            None => self.by_class.push((class, 1)),
        }
    }
}
