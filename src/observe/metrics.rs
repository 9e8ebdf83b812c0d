//! [`Metrics`]: the events recorded through the `metrics` facade, under fixed names and bounded
//! labels.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Unit};
use tokio::time::Instant;

use super::event::{Event, Listener};
use crate::failure::{Class, Code, Sent};
use crate::status::{DelaySource, GiveUp, State};

/// The label value of events beyond the bound on a label's values.
const OTHER: &str = "other";

/// A [`Listener`] that records every [`Event`] through the
/// [`metrics`](https://docs.rs/metrics) facade, so any of its exporters (Prometheus,
/// OpenTelemetry, StatsD, …) shows the stack.
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::BackstopLayer;
/// use tower_backstop::observe::Metrics;
///
/// // Install your exporter's recorder first (metrics-exporter-prometheus, say): handles are
/// // registered with the recorder of the first event that needs them.
/// let layer = BackstopLayer::http(Duration::from_secs(2)).listener(Metrics::new());
/// # let _ = layer;
/// ```
///
/// Give a clone of the same `Metrics` to the [`Scheduler`](crate::resend::Scheduler) for the
/// re-send and backlog metrics. Cheap to clone: clones share their handles.
///
/// # Names
///
/// Base units (seconds), `_total` for counters, as Prometheus' naming conventions ask
/// (<https://prometheus.io/docs/practices/naming/>). Histograms are recorded in seconds;
/// their buckets are the exporter's.
///
/// | metric | kind | labels | from |
/// |---|---|---|---|
/// | `backstop_calls_total` | counter | `outcome` = `success_without_retry`, `success_with_retry`, `failed_without_retry`, `failed_with_retry`, `deferred` | each call of the retry layer, once, when it ends (a caller's call, a scheduler's re-send and a re-drive through the stack alike) |
/// | `backstop_attempts_total` | counter | `class` (the failure's class, or `success`), `processed` = `no` (certainly not processed: a refused connection, 408, 425, 429, 503), `maybe` (a timeout or a reset after the request left), `yes` (the provider answered, or nothing says it did not) | each attempt that left the process; a breaker's rejection, or a call its send rate held back, is not one |
/// | `backstop_attempt_duration_seconds` | histogram | `class` | each attempt, from its call to its answer; not a rejection |
/// | `backstop_call_retries` | histogram | — | retries of each call that retried (attempts − 1, at least 1), when it ends; a call with no retry records nothing, as gRFC A96's `grpc.client.call.retries` (count those calls from `backstop_calls_total`) |
/// | `backstop_retry_delay_seconds` | histogram | `source` = `backoff`, `server_hint`, `breaker`, `send_rate` (the wait for a slot of the adaptive send rate), `concurrency_limit` (the wait for a turn of the adaptive concurrency limit) | the delay before each retry that went out; a retry given up during its delay or rejected by an open breaker records nothing; a retry that slept a server's hint and then waited its turn of the send rate records each wait under its source |
/// | `backstop_retries_skipped_total` | counter | `reason` = `not_replayable` (no copy: a streaming body, or one over the replay buffer), `not_idempotent` (outcome unknown, no key) | each call whose failure was not retried for want of a safe copy |
/// | `backstop_hedges_total` | counter | — | each copy sent while an earlier attempt was still out (hedging) |
/// | `backstop_breaker_state` | gauge | `breaker`, `state` = `closed`, `open`, `half_open`, `forced_open`, `disabled` | 1 for the breaker's state, 0 for the one it left; set at its first transition |
/// | `backstop_breaker_transitions_total` | counter | `breaker`, `from`, `to` | each transition |
/// | `backstop_breaker_rejections_total` | counter | `breaker` | each call a breaker rejected (nothing sent) |
/// | `backstop_send_rate` | gauge | `breaker` | the breaker's adaptive send rate in requests a second while a throttling provider limits it ([`AdaptiveRate`](crate::breaker::AdaptiveRate)), NaN once the limit is lifted (on time, with or without calls); set at each change told, and once a second while limited |
/// | `backstop_send_rate_peak` | gauge | `breaker` | the rate the provider took when the limit began (measured before its first throttled answer and over the limit's first measure, the larger), in requests a second: the limit's peak |
/// | `backstop_concurrency_limit` | gauge | `breaker` | the breaker's adaptive concurrency limit in calls in flight at once while a provider that signalled overload is limited ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency)), NaN once the limit is lifted (on time, with or without calls); set at each change told, and once a second while limited |
/// | `backstop_timeouts_total` | counter | `layer` = `timeout` (the per-attempt timeout), `retry` (the retry deadline) | each attempt that ran out of time |
/// | `backstop_dead_letters_total` | counter | `class`, `status` = `dead`, `deferred` | each message that entered that status: written by the dead-letter layer with it, once (a record deferred again by a re-send, or re-driven and dead again, is not counted again) |
/// | `backstop_deferred_backlog` | gauge | — | records waiting to be re-sent (deferred, or claimed and in flight), as the scheduler last counted them |
/// | `backstop_counts_drifted` | gauge | — | the store's counters that disagreed with a recount of its records at the scheduler's last [`check_counts`](crate::resend::Scheduler::check_counts) (0: they agree), before any repair |
/// | `backstop_resends_total` | counter | `outcome` = `delivered`, `failed` (it reached the provider and failed), `held` (an open breaker rejected it, or its adaptive send rate held it back, before anything was sent) | each re-send of the scheduler |
/// | `backstop_redrives_total` | counter | `outcome` = `resolved`, `failed`, `skipped` | each record of an operator's re-drive ([`Redrive`](crate::resend::Redrive) given this listener) |
/// | `backstop_new_codes_total` | counter | `code` (as displayed: `http 400`, `io ConnectionRefused`) | each failure code of an attempt first seen once the first [`learn_codes_for`](Metrics::learn_codes_for) (5 minutes) after this listener's first event had passed: once per code, at most [`max_label_values`](Metrics::max_label_values) codes |
/// | `backstop_store_errors_total` | counter | `operation` = `put`, `read`, `write_ahead`, `claim`, `next_due`, `count`, `update`, `slot`, `prune`, `audit`, `check_counts` | each failed store operation |
/// | `backstop_listener_panics_total` | counter | `event` | each panic of a listener, caught |
/// | `backstop_alert_active` | gauge | `rule` = `dead_letter_spike`, `class_share`, `new_code`, `breaker_open`, `send_rate_low`, `backlog_growing` | 1 while an alert of [`Alerts`](super::Alerts) fires, 0 once cleared (only with that listener) |
///
/// A series appears at its first event, not at 0: a rule over a counter must count a series
/// born within its window from 0 (`docs/alerts.yml` in the repository does).
///
/// # Bounded labels
///
/// No label is a path, an id or an error text. Classes are the stack's closed set and breaker
/// names are bounded by a keyed breaker's bound on keys; in case they are not, each label
/// takes at most [`max_label_values`](Metrics::max_label_values) values (default 100) per
/// metric, and the events of any further value are counted under the value `other`.
///
/// # Cost
///
/// A handle is registered once per label set and kept; an event then costs a lookup under a
/// read lock and the handles' own updates, with no allocation of ours. A slow recorder slows
/// each event by its own update, and by nothing else.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("max_label_values", &self.inner.max)
            .field("learn_codes_for", &self.inner.learn_codes)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A listener that records into the installed recorder. Describes the metrics (units and
    /// help text) to the recorder installed now, if any.
    pub fn new() -> Self {
        describe();
        Metrics {
            inner: Arc::new(Inner::new(100, LEARN_CODES)),
        }
    }

    /// At most `n` values (at least 1) per label and metric; the events of a further value are
    /// counted under `other`. Default 100. Resets the handles: call it before the first event.
    pub fn max_label_values(self, n: usize) -> Self {
        Metrics {
            inner: Arc::new(Inner::new(n.max(1), self.inner.learn_codes)),
        }
    }

    /// The failure codes seen in the first `period` after this listener's first event are the
    /// process's known codes; a code first seen later counts once in
    /// `backstop_new_codes_total{code}`, what the new-code alert rule reads. Default 5
    /// minutes, the window of [`AlertRules`](super::AlertRules) (the in-process
    /// [`Alerts`](super::Alerts) learn for that window too). Resets the handles: call it before
    /// the first event.
    pub fn learn_codes_for(self, period: Duration) -> Self {
        Metrics {
            inner: Arc::new(Inner::new(self.inner.max, period)),
        }
    }
}

/// The bucket boundaries of this crate's histograms, by metric name, for a recorder that needs
/// them: `metrics-exporter-prometheus` renders a histogram as a summary (quantiles that cannot
/// be aggregated across processes) unless its buckets are set, and
/// [`prometheus_builder`](super::prometheus_builder) (feature `prometheus`) sets these.
///
/// - `backstop_attempt_duration_seconds` and `backstop_retry_delay_seconds`, in seconds: the
///   Prometheus client libraries' default buckets (5 ms to 10 s), extended to 30 s and 60 s,
///   the longest delay the retry layer sleeps by default
///   ([`RetryPolicy::max_delay`](crate::retry::RetryPolicy::max_delay)).
/// - `backstop_call_retries`, in retries: 1 to 5 one by one (gRFC A6 caps a call's attempts at
///   5), then 10 and 20 for policies that allow more.
pub const HISTOGRAM_BUCKETS: [(&str, &[f64]); 3] = [
    ("backstop_attempt_duration_seconds", SECONDS),
    ("backstop_retry_delay_seconds", SECONDS),
    (
        "backstop_call_retries",
        &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0],
    ),
];

/// Seconds: the Prometheus client libraries' default buckets, then 30 s and 60 s.
const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How long the codes seen first are learnt, by default: the alert rules' window.
const LEARN_CODES: Duration = Duration::from_secs(5 * 60);

impl Listener for Metrics {
    fn on_event(&self, event: &Event<'_>) {
        self.inner.record(event)
    }
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "backstop_calls_total",
        Unit::Count,
        "Calls of the retry layer, by outcome."
    );
    describe_counter!(
        "backstop_attempts_total",
        Unit::Count,
        "Attempts that left the process, by class (or success) and whether the provider processed the request (no, maybe, yes)."
    );
    describe_histogram!(
        "backstop_attempt_duration_seconds",
        Unit::Seconds,
        "Duration of each attempt that left the process, by class."
    );
    describe_histogram!(
        "backstop_call_retries",
        Unit::Count,
        "Retries of each call that retried (attempts minus one); calls without a retry are not recorded."
    );
    describe_histogram!(
        "backstop_retry_delay_seconds",
        Unit::Seconds,
        "Delay before each retry that went out, by its source."
    );
    describe_counter!(
        "backstop_hedges_total",
        Unit::Count,
        "Copies sent while an earlier attempt was still out (hedging)."
    );
    describe_breakers();
    describe_counter!(
        "backstop_retries_skipped_total",
        Unit::Count,
        "Failed calls not retried for want of a safe copy: not replayable, or not idempotent."
    );
    describe_counter!(
        "backstop_timeouts_total",
        Unit::Count,
        "Attempts that ran out of time: per-attempt timeout or retry deadline."
    );
    describe_counter!(
        "backstop_dead_letters_total",
        Unit::Count,
        "Messages that entered the dead or deferred status, by class and status."
    );
    describe_gauge!(
        "backstop_deferred_backlog",
        Unit::Count,
        "Records waiting to be re-sent by the scheduler."
    );
    describe_gauge!(
        "backstop_counts_drifted",
        Unit::Count,
        "Store counters that disagreed with a recount of the records at the scheduler's last check."
    );
    describe_counter!(
        "backstop_resends_total",
        Unit::Count,
        "Re-sends of the scheduler, by outcome: delivered, failed (reached the provider), held (nothing sent)."
    );
    describe_counter!(
        "backstop_redrives_total",
        Unit::Count,
        "Records of an operator's re-drive, by outcome."
    );
    describe_counter!(
        "backstop_new_codes_total",
        Unit::Count,
        "Failure codes first seen after the process's first minutes, by code."
    );
    describe_counter!(
        "backstop_spool_records_total",
        Unit::Count,
        "Records of the dead-letter layer's local spool, by outcome: spooled, refused, forwarded, already_there, superseded, quarantined."
    );
    describe_gauge!(
        "backstop_spool_records",
        Unit::Count,
        "Records waiting in the local spool to be forwarded to the dead-letter store."
    );
    describe_gauge!(
        "backstop_spool_bytes",
        Unit::Bytes,
        "Bytes of the records waiting in the local spool."
    );
    describe_gauge!(
        "backstop_store_up",
        "1 while the dead-letter store takes the spool's records, 0 while it fails (told by the spool)."
    );
    describe_counter!(
        "backstop_store_errors_total",
        Unit::Count,
        "Failed dead-letter store operations."
    );
    describe_counter!(
        "backstop_listener_panics_total",
        Unit::Count,
        "Panics of an event listener, caught."
    );
}

/// The breakers' metrics, described.
fn describe_breakers() {
    use ::metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "backstop_breaker_state",
        Unit::Count,
        "1 for a breaker's current state, 0 for the states it left."
    );
    describe_counter!(
        "backstop_breaker_transitions_total",
        Unit::Count,
        "Breaker transitions."
    );
    describe_counter!(
        "backstop_breaker_rejections_total",
        Unit::Count,
        "Calls rejected by a breaker."
    );
    describe_gauge!(
        "backstop_send_rate",
        "A breaker's adaptive send rate in requests a second while a throttling provider limits it; NaN once lifted."
    );
    describe_gauge!(
        "backstop_send_rate_peak",
        "The rate a provider took when the send rate limit began (its peak), in requests a second."
    );
    describe_gauge!(
        "backstop_concurrency_limit",
        Unit::Count,
        "A breaker's adaptive concurrency limit in calls in flight while a provider that signalled overload is limited; NaN once lifted."
    );
}

/// Handles of one metric, one per label set, registered on first use; at most `max` values of
/// the bounded label, further ones counted under `other`.
struct Family<K, H> {
    handles: RwLock<HashMap<K, H>>,
    max: usize,
}

impl<K: Eq + Hash, H: Clone> Family<K, H> {
    fn new(max: usize) -> Self {
        Family {
            handles: RwLock::new(HashMap::new()),
            max,
        }
    }

    /// The handle of `key`; registered by `make` the first time, with the key `owned` makes
    /// of it. A key beyond the bound gets `other`'s handle, `overflow` naming it.
    #[inline]
    fn get<Q>(
        &self,
        key: &Q,
        owned: impl FnOnce(&Q) -> K,
        overflow: impl FnOnce() -> K,
        make: impl Fn(&K) -> H,
    ) -> H
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        if let Some(handle) = self
            .handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return handle.clone();
        }
        let mut handles = self.handles.write().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = handles.get(key) {
            return handle.clone();
        }
        let key = if handles.len() >= self.max {
            overflow()
        } else {
            owned(key)
        };
        handles.entry(key).or_insert_with_key(|k| make(k)).clone()
    }
}

/// A handle per fixed label value, registered on first use.
struct Fixed<H, const N: usize>([OnceLock<H>; N]);

impl<H: Clone, const N: usize> Fixed<H, N> {
    fn new() -> Self {
        Fixed(std::array::from_fn(|_| OnceLock::new()))
    }

    #[inline]
    fn get(&self, i: usize, make: impl FnOnce() -> H) -> &H {
        self.0[i].get_or_init(make)
    }
}

/// A label value that is either one of the stack's names or the overflow value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Name(&'static str);

struct Inner {
    max: usize,
    learn_codes: Duration,
    /// The first event's instant, the start of the codes' learning period.
    started: OnceLock<Instant>,
    /// Every failure code seen.
    codes: RwLock<HashSet<Code>>,
    /// Per code first seen after the learning period; `None` is `other`.
    new_codes: Family<Option<Code>, Counter>,
    calls: Fixed<Counter, 5>,
    retries: OnceLock<Histogram>,
    hedges: OnceLock<Counter>,
    /// The attempts that succeeded: the path of every healthy call, with no lookup.
    success: OnceLock<ClassHandles>,
    /// Per failure class.
    attempts: Family<Name, Arc<ClassHandles>>,
    delays: Fixed<Histogram, 5>,
    breakers: Family<String, Arc<BreakerHandles>>,
    timeouts: Fixed<Counter, 2>,
    /// Per reason: not replayable, not idempotent.
    skipped: Fixed<Counter, 2>,
    /// Per class: dead, deferred.
    dead_letters: Family<Name, Arc<Fixed<Counter, 2>>>,
    backlog: OnceLock<Gauge>,
    drifted: OnceLock<Gauge>,
    resends: Family<Name, Counter>,
    redrives: Family<Name, Counter>,
    store_errors: Family<Name, Counter>,
    /// Records spooled, refused, forwarded…, by outcome.
    spool: Family<Name, Counter>,
    /// The spool's records, bytes, and whether the store answers.
    spool_state: OnceLock<[Gauge; 3]>,
}

/// The handles of one class's attempts.
struct ClassHandles {
    name: &'static str,
    /// Per [`Sent`], as the `processed` label: no, maybe, yes.
    attempts: Fixed<Counter, 3>,
    duration: Histogram,
}

impl ClassHandles {
    fn new(class: &'static str) -> Self {
        ClassHandles {
            name: class,
            attempts: Fixed::new(),
            duration: ::metrics::histogram!("backstop_attempt_duration_seconds", "class" => class),
        }
    }
}

/// The handles of one breaker.
struct BreakerHandles {
    name: String,
    /// Per state, in the order of `STATES`: registered together, so that every state of a
    /// breaker that moved has its 0 or 1.
    states: OnceLock<[Gauge; 5]>,
    /// Per (from, to), `from * 5 + to`.
    transitions: Fixed<Counter, 25>,
    rejections: OnceLock<Counter>,
    /// The adaptive send rate and its peak.
    send_rate: OnceLock<[Gauge; 2]>,
    /// The adaptive concurrency limit.
    concurrency_limit: OnceLock<Gauge>,
}

const OUTCOMES: [&str; 5] = [
    "success_without_retry",
    "success_with_retry",
    "failed_without_retry",
    "failed_with_retry",
    "deferred",
];
/// The `processed` label of [`Sent`]'s values: `Sent::No` is "certainly not processed".
const PROCESSED: [&str; 3] = ["no", "maybe", "yes"];
const SOURCES: [&str; 5] = [
    "backoff",
    "server_hint",
    "breaker",
    "send_rate",
    "concurrency_limit",
];
const STATES: [State; 5] = [
    State::Closed,
    State::Open,
    State::HalfOpen,
    State::ForcedOpen,
    State::Disabled,
];

fn sent_index(sent: Sent) -> usize {
    match sent {
        Sent::No => 0,
        Sent::Maybe => 1,
        Sent::Yes => 2,
    }
}

fn state_index(state: State) -> usize {
    STATES.iter().position(|s| *s == state).unwrap_or(0)
}

impl Inner {
    fn new(max: usize, learn_codes: Duration) -> Self {
        Inner {
            max,
            learn_codes,
            started: OnceLock::new(),
            codes: RwLock::new(HashSet::new()),
            new_codes: Family::new(max),
            calls: Fixed::new(),
            retries: OnceLock::new(),
            hedges: OnceLock::new(),
            success: OnceLock::new(),
            attempts: Family::new(max),
            delays: Fixed::new(),
            breakers: Family::new(max),
            timeouts: Fixed::new(),
            skipped: Fixed::new(),
            dead_letters: Family::new(max),
            backlog: OnceLock::new(),
            drifted: OnceLock::new(),
            resends: Family::new(max),
            redrives: Family::new(max),
            store_errors: Family::new(max),
            spool: Family::new(max),
            spool_state: OnceLock::new(),
        }
    }

    fn breaker(&self, name: &str) -> Arc<BreakerHandles> {
        self.breakers.get(
            name,
            str::to_owned,
            || OTHER.to_owned(),
            |name| {
                Arc::new(BreakerHandles {
                    name: name.clone(),
                    states: OnceLock::new(),
                    transitions: Fixed::new(),
                    rejections: OnceLock::new(),
                    send_rate: OnceLock::new(),
                    concurrency_limit: OnceLock::new(),
                })
            },
        )
    }

    fn call_ended(&self, outcome: usize, attempts: u32) {
        self.calls
            .get(
                outcome,
                || ::metrics::counter!("backstop_calls_total", "outcome" => OUTCOMES[outcome]),
            )
            .increment(1);
        // As gRFC A96's `grpc.client.call.retries`: a call without a retry records nothing. The
        // calls without one are `backstop_calls_total{outcome=~".*_without_retry"}`, and a healthy
        // call is spared a histogram record (a clock read and a push in Prometheus' exporter).
        let retries = attempts.saturating_sub(1);
        if retries > 0 {
            self.retries
                .get_or_init(|| ::metrics::histogram!("backstop_call_retries"))
                .record(f64::from(retries));
        }
    }

    fn record(&self, event: &Event<'_>) {
        self.started.get_or_init(Instant::now);
        match *event {
            // A breaker's rejection is not an attempt: nothing left the process. It is counted
            // by the breaker's own event, and its call by `GaveUp`.
            Event::AttemptEnded {
                code: Some(code), ..
            } if code.not_an_attempt() => {}
            Event::AttemptEnded {
                attempt,
                class,
                code,
                sent,
                duration,
            } => {
                if let Some(code) = code {
                    self.code_seen(code);
                }
                self.attempt_ended(attempt, class, sent, duration);
            }
            Event::GaveUp {
                attempts, reason, ..
            } => self.gave_up(attempts, reason),
            // Counted when it went out (`Retried`): a retry given up during its delay, or
            // rejected by a breaker, was never sent.
            Event::RetryScheduled { .. } => {}
            Event::Retried { delay, source, .. } => {
                let i = match source {
                    DelaySource::Backoff => 0,
                    DelaySource::ServerHint => 1,
                    DelaySource::Breaker => 2,
                    DelaySource::SendRate => 3,
                    DelaySource::ConcurrencyLimit => 4,
                };
                self.delays
                    .get(i, || {
                        ::metrics::histogram!("backstop_retry_delay_seconds", "source" => SOURCES[i])
                    })
                    .record(delay.as_secs_f64());
            }
            Event::HedgeSent { .. } => {
                self.hedges
                    .get_or_init(|| ::metrics::counter!("backstop_hedges_total"))
                    .increment(1);
            }
            Event::TimedOut { deadline, .. } => {
                let i = usize::from(deadline);
                self.timeouts
                    .get(i, || {
                        let layer = if deadline { "retry" } else { "timeout" };
                        ::metrics::counter!("backstop_timeouts_total", "layer" => layer)
                    })
                    .increment(1);
            }
            Event::BreakerTransition {
                breaker, from, to, ..
            } => self.breaker_transition(breaker, from, to),
            Event::BreakerRejected { breaker, .. } => {
                let handles = self.breaker(breaker);
                handles
                    .rejections
                    .get_or_init(|| {
                        ::metrics::counter!("backstop_breaker_rejections_total", "breaker" => handles.name.clone())
                    })
                    .increment(1);
            }
            Event::SendRate { .. } | Event::ConcurrencyLimit { .. } => self.breaker_limit(event),
            Event::DeadLetterStored {
                class, deferred, ..
            } => self.dead_letter_stored(class, deferred),
            Event::Resent { outcome, .. } => count(
                &self.resends,
                outcome,
                |name| ::metrics::counter!("backstop_resends_total", "outcome" => name),
            ),
            Event::Redriven { outcome, .. } => count(
                &self.redrives,
                outcome,
                |name| ::metrics::counter!("backstop_redrives_total", "outcome" => name),
            ),
            Event::Backlog { deferred } => {
                // Exact up to 2^53 records.
                #[allow(clippy::cast_precision_loss)]
                let deferred = deferred as f64;
                self.backlog
                    .get_or_init(|| ::metrics::gauge!("backstop_deferred_backlog"))
                    .set(deferred);
            }
            Event::CountsChecked { drifted, .. } => {
                // Exact up to 2^53 counters.
                #[allow(clippy::cast_precision_loss)]
                let drifted = drifted as f64;
                self.drifted
                    .get_or_init(|| ::metrics::gauge!("backstop_counts_drifted"))
                    .set(drifted);
            }
            Event::Spool {
                outcome,
                count,
                records,
                bytes,
                store_up,
            } => self.spool(outcome, count, records, bytes, store_up),
            // Rare, and read from the log line and `Reload::version`: no metric.
            Event::SettingsReloaded { .. } | Event::SettingsRefused { .. } => {}
            Event::StoreError { operation, .. } => count(
                &self.store_errors,
                operation,
                |name| ::metrics::counter!("backstop_store_errors_total", "operation" => name),
            ),
        }
    }

    /// A breaker's adaptive send rate or concurrency limit changed: its gauges.
    fn breaker_limit(&self, event: &Event<'_>) {
        match *event {
            Event::SendRate {
                breaker,
                rate,
                peak,
                ..
            } => {
                let handles = self.breaker(breaker);
                let [now, top] = handles.send_rate.get_or_init(|| {
                    let name = handles.name.clone();
                    [
                        ::metrics::gauge!("backstop_send_rate", "breaker" => name.clone()),
                        ::metrics::gauge!("backstop_send_rate_peak", "breaker" => name),
                    ]
                });
                now.set(rate.unwrap_or(f64::NAN));
                top.set(peak);
            }
            Event::ConcurrencyLimit { breaker, limit, .. } => {
                let handles = self.breaker(breaker);
                let gauge = handles.concurrency_limit.get_or_init(|| {
                    ::metrics::gauge!("backstop_concurrency_limit", "breaker" => handles.name.clone())
                });
                gauge.set(limit.map_or(f64::NAN, f64::from));
            }
            _ => {}
        }
    }

    /// An attempt: its counter and duration by class; a success also ends its call.
    #[inline]
    fn attempt_ended(&self, attempt: u32, class: Option<Class>, sent: Sent, duration: Duration) {
        let failed;
        let handles: &ClassHandles = match class {
            None => self.success.get_or_init(|| ClassHandles::new("success")),
            Some(class) => {
                failed = self.attempts.get(
                    &Name(class.name()),
                    |k| *k,
                    || Name(OTHER),
                    |name| Arc::new(ClassHandles::new(name.0)),
                );
                &failed
            }
        };
        let processed = sent_index(sent);
        let counter = handles.attempts.get(processed, || {
            ::metrics::counter!("backstop_attempts_total", "class" => handles.name, "processed" => PROCESSED[processed])
        });
        let histogram = &handles.duration;
        counter.increment(1);
        histogram.record(duration.as_secs_f64());
        if class.is_none() {
            self.call_ended(usize::from(attempt > 1), attempt);
        }
    }

    /// A failure code of an attempt: counted in `backstop_new_codes_total` the first time it is
    /// seen, once the learning period after the first event is over.
    fn code_seen(&self, code: Code) {
        if self
            .codes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&code)
        {
            return;
        }
        let inserted = self
            .codes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(code);
        let learning = self
            .started
            .get()
            .is_none_or(|at| at.elapsed() < self.learn_codes);
        if inserted && !learning {
            self.new_codes
                .get(
                    &Some(code),
                    |k| *k,
                    || None,
                    |k| {
                        let code = k.map_or_else(|| OTHER.to_owned(), |c| c.to_string());
                        ::metrics::counter!("backstop_new_codes_total", "code" => code)
                    },
                )
                .increment(1);
        }
    }

    /// A call that ended in a failure, and the retries it skipped for want of a safe copy.
    fn gave_up(&self, attempts: u32, reason: GiveUp) {
        let outcome = match reason {
            GiveUp::Deferred => 4,
            _ if attempts > 1 => 3,
            _ => 2,
        };
        self.call_ended(outcome, attempts);
        let skipped = match reason {
            GiveUp::NotReplayable => Some(0),
            GiveUp::NotIdempotent => Some(1),
            _ => None,
        };
        if let Some(i) = skipped {
            self.skipped
                .get(i, || {
                    let reason = ["not_replayable", "not_idempotent"][i];
                    ::metrics::counter!("backstop_retries_skipped_total", "reason" => reason)
                })
                .increment(1);
        }
    }

    /// A breaker's state gauges and its transition counter.
    fn breaker_transition(&self, breaker: &str, from: State, to: State) {
        let handles = self.breaker(breaker);
        let gauges = handles.states.get_or_init(|| {
            STATES.map(|state| {
                ::metrics::gauge!("backstop_breaker_state", "breaker" => handles.name.clone(), "state" => state.as_str())
            })
        });
        gauges[state_index(from)].set(0.0);
        gauges[state_index(to)].set(1.0);
        let (from, to) = (state_index(from), state_index(to));
        handles
            .transitions
            .get(from * STATES.len() + to, || {
                ::metrics::counter!(
                    "backstop_breaker_transitions_total",
                    "breaker" => handles.name.clone(),
                    "from" => STATES[from].as_str(),
                    "to" => STATES[to].as_str()
                )
            })
            .increment(1);
    }

    /// A dead letter stored, by class and status.
    fn dead_letter_stored(&self, class: Class, deferred: bool) {
        let name = Name(class.name());
        let handles =
            self.dead_letters
                .get(&name, |k| *k, || Name(OTHER), |_| Arc::new(Fixed::new()));
        let class = name.0;
        let i = usize::from(deferred);
        handles
            .get(i, || {
                let status = if deferred { "deferred" } else { "dead" };
                ::metrics::counter!("backstop_dead_letters_total", "class" => class, "status" => status)
            })
            .increment(1);
    }
}

impl Inner {
    /// The spool's counters and gauges.
    #[cold]
    fn spool(&self, outcome: &'static str, n: u64, records: u64, bytes: u64, store_up: bool) {
        if n > 0 {
            self.spool
                .get(
                    &Name(outcome),
                    |k| *k,
                    || Name(OTHER),
                    |name| ::metrics::counter!("backstop_spool_records_total", "outcome" => name.0),
                )
                .increment(n);
        }
        let [held, size, up] = self.spool_state.get_or_init(|| {
            [
                ::metrics::gauge!("backstop_spool_records"),
                ::metrics::gauge!("backstop_spool_bytes"),
                ::metrics::gauge!("backstop_store_up"),
            ]
        });
        // Exact up to 2^53.
        #[allow(clippy::cast_precision_loss)]
        {
            held.set(records as f64);
            size.set(bytes as f64);
        }
        up.set(if store_up { 1.0 } else { 0.0 });
    }
}

/// Counts one event under `label`, a fixed word (`other` beyond the bound on values).
fn count(
    family: &Family<Name, Counter>,
    label: &'static str,
    make: impl Fn(&'static str) -> Counter,
) {
    family
        .get(&Name(label), |k| *k, || Name(OTHER), |name| make(name.0))
        .increment(1);
}
