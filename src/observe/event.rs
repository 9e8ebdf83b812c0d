//! The vocabulary every layer speaks: the [`Event`]s, the [`Listener`] that hears them, and the
//! [`Hook`] a layer keeps its listener in.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::failure::{Class, Code, Sent};
use crate::status::{DelaySource, GiveUp, State};

/// Something a layer or the re-send path did, handed to a [`Listener`].
///
/// Borrowed fields (`&'a str`) live only for the call: copy what you keep.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// An attempt of the retry layer ended: the inner service answered or failed. An attempt
    /// cut short by the overall deadline ends in [`TimedOut`](Event::TimedOut) and
    /// [`GaveUp`](Event::GaveUp) instead.
    ///
    /// A call that an open breaker below the retry layer rejected ends here too, with class
    /// [`Class::CIRCUIT_OPEN`], code [`Code::CircuitOpen`] and [`Sent::No`], but it is not an
    /// attempt: nothing left the process, and the retry layer does not count it against
    /// `max_attempts`. Tell it apart by its code; [`BreakerRejected`](Event::BreakerRejected)
    /// is the breaker's own word for it. `Metrics` counts it as a rejection, not as an attempt.
    AttemptEnded {
        /// The attempt's number in its call, from 1.
        attempt: u32,
        /// The failure's class; `None` for a success.
        class: Option<Class>,
        /// The failure's original code; `None` for a success.
        code: Option<Code>,
        /// Whether the request reached the provider: [`Sent::Yes`] for a success.
        sent: Sent,
        /// From the attempt's call to its answer, on tokio's clock.
        duration: Duration,
    },
    /// The retry layer will send the request again after `delay`. Whether it did is
    /// [`Retried`](Event::Retried): a retry may still be given up during its delay (the
    /// deadline passed, the service failed to get ready) or be rejected by an open breaker.
    RetryScheduled {
        /// The number of the attempt that failed, from 1.
        attempt: u32,
        /// Its class.
        class: Class,
        /// Its original code.
        code: Code,
        /// How long the layer sleeps before the next attempt.
        delay: Duration,
        /// Why that delay: the backoff, or the server's hint.
        source: DelaySource,
    },
    /// A retry went out: the attempt that [`RetryScheduled`](Event::RetryScheduled) announced
    /// was sent after its delay and was not rejected by an open breaker below the retry layer.
    /// Told when that attempt ends (just before its [`AttemptEnded`](Event::AttemptEnded)),
    /// or, when the call ends while it is still out (the deadline, a hedged copy that answered
    /// first), then. Its log line is the `retrying` line written when it was scheduled.
    Retried {
        /// The retry's attempt number in its call, from 2.
        attempt: u32,
        /// How long the layer slept before sending it.
        delay: Duration,
        /// Why that delay.
        source: DelaySource,
    },
    /// The retry layer sent a copy of the request while an earlier attempt is still out
    /// ([`RetryPolicy::hedge`](crate::retry::RetryPolicy::hedge)).
    HedgeSent {
        /// The copy's attempt number in its call, from 2.
        attempt: u32,
        /// How long the attempt before it had been out without an answer.
        after: Duration,
    },
    /// The retry layer handed a failure up: the call is over, or (with
    /// [`GiveUp::Deferred`]) left to a dead-letter store's re-send.
    GaveUp {
        /// The attempts made (0 when the breaker rejected the only one).
        attempts: u32,
        /// The final failure's class.
        class: Class,
        /// Its original code.
        code: Code,
        /// Why it stopped.
        reason: GiveUp,
    },
    /// An attempt ran out of time: the per-attempt timeout of
    /// [`TimeoutLayer`](crate::timeout::TimeoutLayer) (seen by the retry layer as a failure
    /// with [`Code::Timeout`]), or the retry policy's overall
    /// [deadline](crate::retry::RetryPolicy::deadline).
    TimedOut {
        /// The attempt's number in its call, from 1.
        attempt: u32,
        /// `true` for the overall deadline, `false` for the per-attempt timeout.
        deadline: bool,
    },
    /// A breaker moved from one state to another.
    BreakerTransition {
        /// The breaker's name (a keyed breaker's key).
        breaker: &'a str,
        /// The state before.
        from: State,
        /// The state after.
        to: State,
        /// Why, in a few lower-case words ("failure rate", "probe failed", "forced open", …).
        reason: &'static str,
    },
    /// A breaker rejected a call without calling the inner service.
    BreakerRejected {
        /// The breaker's name (a keyed breaker's key).
        breaker: &'a str,
        /// The state that rejected it: open, half-open with every probe permit taken, or
        /// forced open.
        state: State,
        /// The time left until half-open, as given to the caller; `None` when forced open.
        retry_after: Option<Duration>,
    },
    /// A breaker's adaptive send rate changed ([`AdaptiveRate`](crate::breaker::AdaptiveRate)):
    /// the provider answered throttled and the rate was lowered (`reason` `"throttled"`), it
    /// fell below half of its peak (`"below_half"`), it grew back (`"rising"`, told at most once
    /// a second while calls come), reached its peak again (`"recovered"`), or the limit was
    /// lifted after a quiet time (`"lifted"`, `rate` `None`).
    SendRate {
        /// The breaker's name (a keyed breaker's key, such as `api.mail.test:443`).
        breaker: &'a str,
        /// The send rate now, in requests a second; `None` once no longer limited.
        rate: Option<f64>,
        /// The rate the provider took when this limit began (before its first throttled
        /// answer or over the limit's first measure, the larger): its peak, in requests a second.
        peak: f64,
        /// Why, in one snake-case word: `throttled`, `below_half`, `rising`, `recovered`,
        /// `lifted`.
        reason: &'static str,
    },
    /// A breaker's adaptive concurrency limit changed
    /// ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency)): set from the calls in
    /// flight measured over the round trip after the provider's first overload answer
    /// (`reason` `"measured"`), lowered on an overload answer (`"overloaded"`) or on a rise of
    /// latency (`"latency"`), told as it is once a second while limited (`"current"`, grown or
    /// not), or lifted after a quiet time (`"lifted"`, `limit` `None`).
    ConcurrencyLimit {
        /// The breaker's name (a keyed breaker's key, such as `api.mail.test:443`).
        breaker: &'a str,
        /// The limit now, in calls in flight at once; `None` once no longer limited.
        limit: Option<u32>,
        /// The calls counted in flight now (0 once lifted).
        in_flight: u32,
        /// Why, in one snake-case word: `measured`, `overloaded`, `latency`, `current`,
        /// `lifted`.
        reason: &'static str,
    },
    /// A failed request became a dead letter or a deferred record: the dead-letter layer wrote
    /// it to its store with that status.
    ///
    /// Told once per message and status: when a [`Scheduler`](crate::resend::Scheduler)'s
    /// re-send or a [`Redrive`](crate::resend::Redrive) of a record fails and the dead-letter
    /// layer writes it back with the status it had (a deferred record deferred again, a dead
    /// one that fails for good again), the record's new failure is written but not told here:
    /// the message did not enter a new state. One that changes status (deferred, then dead) is
    /// told. This needs the re-send's call to run in the re-send's task, as it does in a stack
    /// of layers; behind a `tower::buffer::Buffer`, whose worker is another task, every write
    /// is told.
    DeadLetterStored {
        /// The record's id (unbounded: not a label).
        id: &'a str,
        /// The failure's class.
        class: Class,
        /// Its original code.
        code: Code,
        /// `true` when stored deferred (the scheduler re-sends it when due), `false` when
        /// stored dead (waiting for a person).
        deferred: bool,
    },
    /// The scheduler re-sent a deferred record, or tried to.
    Resent {
        /// The record's id (unbounded: not a label).
        id: &'a str,
        /// `"delivered"` (the record is resolved); `"failed"` (it reached the provider and
        /// failed: the record is dead or deferred again by its policy, or, when the last word
        /// was an open breaker's rejection of a retry, put back for the breaker's half-open
        /// time); or `"held"` (an open breaker in this process rejected it before anything
        /// reached the provider: nothing was sent, the record is put back). Records the
        /// scheduler does not try at all while it knows their breaker is open are not told.
        outcome: &'static str,
    },
    /// An operator's re-drive ([`Redrive::run`](crate::resend::Redrive::run)) re-sent a
    /// record, or skipped it.
    Redriven {
        /// The record's id (unbounded: not a label).
        id: &'a str,
        /// `"resolved"` (delivered; the record is resolved), `"failed"` (it failed again and
        /// has the new failure), or `"skipped"` (not sent: its request could not be rebuilt,
        /// or it changed meanwhile).
        outcome: &'static str,
    },
    /// The scheduler counted the records waiting in its store to be re-sent (deferred, or
    /// claimed and in flight), at most once per
    /// [`Scheduler::backlog_every`](crate::resend::Scheduler::backlog_every) and only when it
    /// has a listener: a backlog that grows while deliveries fall is an outage that has not
    /// ended.
    Backlog {
        /// The records waiting.
        deferred: u64,
    },
    /// The scheduler recounted its store's records and compared the recount with the counters
    /// the store keeps for its counts ([`Store::check_counts`](crate::store::Store::check_counts)),
    /// every [`Scheduler::check_counts`](crate::resend::Scheduler::check_counts) period. A
    /// drift means something wrote the store behind its back; the counts it answers are off by
    /// as much until a repair.
    CountsChecked {
        /// How many keys (status × class × code) were compared; 0 for a store that keeps no
        /// counters.
        keys: u64,
        /// How many of them had drifted: 0 when the counters agree with the records.
        drifted: u64,
        /// Whether the drifted counters were set to the recount.
        repaired: bool,
    },
    /// The dead-letter layer's local spool
    /// ([`DeadLetterLayer::spool`](crate::dead_letter::DeadLetterLayer::spool)) took or refused
    /// a record the store did not take, or its forwarder moved records into the store or found
    /// the store still down.
    Spool {
        /// What happened, in one snake-case word: `spooled` (one record went to the spool),
        /// `refused` (the spool did not take one either: full, or its disk failing; the
        /// caller's failure says it was not stored), `forwarded` (records written into the
        /// store), `already_there` (records the store had already: a slow write that landed),
        /// `superseded` (records whose claim or resolution had moved on in the store: not
        /// written), `quarantined` (records moved to the quarantine file: past the spool's age
        /// cap, or not decodable), `store_down` (a forwarding found the store still failing).
        outcome: &'static str,
        /// How many records the outcome concerns (0 for `store_down`).
        count: u64,
        /// The records in the spool now.
        records: u64,
        /// Their bytes now.
        bytes: u64,
        /// Whether the store answered the spool's last forwarding (`false` while records are
        /// being spooled: the store just failed a write).
        store_up: bool,
    },
    /// A dead-letter store failed an operation; what it was doing is not lost where the
    /// operation allows (a record that cannot be written is on the caller's failure as
    /// [`DeadLetterStatus::NotStored`](crate::dead_letter::DeadLetterStatus::NotStored)).
    StoreError {
        /// What failed: `"put"` (writing a dead letter), `"read"` (reading a message's
        /// attempt budget; the call goes on as if none was spent), `"write_ahead"` (writing a
        /// request before its first attempt; the call goes out without it), `"claim"` (the
        /// scheduler's claim of due records), `"next_due"` (the scheduler reading when the next
        /// record is due), `"count"` (the scheduler counting its backlog), `"update"` (the
        /// scheduler writing a record's new state, tried again while it fails), `"renew"` (the
        /// scheduler renewing a claim), `"slot"` (the scheduler's turn of a fleet
        /// rate), `"prune"` (retention deleting old records), `"audit"` (writing an operator's
        /// audit entry).
        operation: &'static str,
        /// The record concerned, when there is one (unbounded: not a label).
        id: Option<&'a str>,
        /// The store's error.
        error: &'a (dyn Error + 'static),
    },
    /// A [`Reload`](crate::Reload) applied new settings to a running stack (feature `serde`).
    SettingsReloaded {
        /// Where they came from: the watched file's path, or `handle` for
        /// [`Reload::apply`](crate::Reload::apply).
        source: &'a str,
        /// The reloads applied so far, this one included
        /// ([`Reload::version`](crate::Reload::version)).
        version: u64,
    },
    /// A [`Reload`](crate::Reload) refused new settings; the stack keeps the ones it had
    /// (feature `serde`).
    SettingsRefused {
        /// Where they came from: the watched file's path, or `handle`.
        source: &'a str,
        /// The field at fault, by its path (`breaker.failure_rate`); empty when the text did
        /// not read (the problem then is the parser's, with its line when it gives one).
        field: &'a str,
        /// What is wrong.
        problem: &'a str,
    },
}

impl Event<'_> {
    /// The event's name in snake case (`attempt_ended`, `retry_scheduled`, `retried`,
    /// `hedge_sent`, `gave_up`, `timed_out`, `breaker_transition`, `breaker_rejected`, `send_rate`,
    /// `concurrency_limit`, `dead_letter_stored`, `resent`, `redriven`, `backlog`, `spool`, `store_error`,
    /// `settings_reloaded`, `settings_refused`), for a log field
    /// or a metric label.
    pub const fn name(&self) -> &'static str {
        match self {
            Event::AttemptEnded { .. } => "attempt_ended",
            Event::RetryScheduled { .. } => "retry_scheduled",
            Event::Retried { .. } => "retried",
            Event::HedgeSent { .. } => "hedge_sent",
            Event::GaveUp { .. } => "gave_up",
            Event::TimedOut { .. } => "timed_out",
            Event::BreakerTransition { .. } => "breaker_transition",
            Event::BreakerRejected { .. } => "breaker_rejected",
            Event::SendRate { .. } => "send_rate",
            Event::ConcurrencyLimit { .. } => "concurrency_limit",
            Event::DeadLetterStored { .. } => "dead_letter_stored",
            Event::Resent { .. } => "resent",
            Event::Redriven { .. } => "redriven",
            Event::Backlog { .. } => "backlog",
            Event::CountsChecked { .. } => "counts_checked",
            Event::Spool { .. } => "spool",
            Event::StoreError { .. } => "store_error",
            Event::SettingsReloaded { .. } => "settings_reloaded",
            Event::SettingsRefused { .. } => "settings_refused",
        }
    }
}

/// A hook that sees every [`Event`] of the layers it is given to.
///
/// Implemented for `()` (does nothing) and for closures `Fn(&Event<'_>)`, like tower-http's
/// `OnFailure`. It is called on the thread that caused the event, inside the call that caused
/// it: keep it short and do not block. A listener that panics does not break the call: the
/// panic is caught and the call goes on (the panic is written at `ERROR` to `tracing`).
pub trait Listener: Send + Sync + 'static {
    /// Called once per event.
    fn on_event(&self, event: &Event<'_>);
}

impl Listener for () {
    #[inline]
    fn on_event(&self, _: &Event<'_>) {}
}

impl<F> Listener for F
where
    F: Fn(&Event<'_>) + Send + Sync + 'static,
{
    fn on_event(&self, event: &Event<'_>) {
        self(event)
    }
}

/// A layer's listener, if it has one: a counted reference, cloned into a call's future only
/// when set.
#[derive(Clone, Default)]
pub(crate) struct Hook(Option<Arc<dyn Listener>>);

impl Hook {
    /// No listener.
    pub(crate) const NONE: Hook = Hook(None);

    pub(crate) fn new(listener: impl Listener) -> Self {
        Hook(Some(Arc::new(listener)))
    }

    /// The listener itself, for a breaker's settings.
    pub(crate) fn arc(&self) -> Option<Arc<dyn Listener>> {
        self.0.clone()
    }

    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// An attempt's start on tokio's clock, read just before the inner call, for the duration of
    /// `Event::AttemptEnded`: `None`, and no clock read, without a listener.
    #[inline]
    pub(crate) fn attempt_start(&self) -> Option<tokio::time::Instant> {
        self.is_set().then(tokio::time::Instant::now)
    }

    /// Hands `event` to the listener, if there is one; a panic of the listener is caught.
    #[inline]
    pub(crate) fn emit(&self, event: impl FnOnce() -> Event<'static>) {
        if let Some(listener) = &self.0 {
            deliver(&**listener, &event());
        }
    }

    /// As [`emit`](Self::emit), for an event that borrows.
    #[inline]
    #[cfg(any(feature = "dead-letter", feature = "serde"))]
    pub(crate) fn emit_ref(&self, event: &Event<'_>) {
        if let Some(listener) = &self.0 {
            deliver(&**listener, event);
        }
    }
}

pub(crate) fn deliver(listener: &dyn Listener, event: &Event<'_>) {
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener.on_event(event)));
    if caught.is_err() {
        #[cfg(feature = "metrics")]
        ::metrics::counter!("backstop_listener_panics_total", "event" => event.name()).increment(1);
        tracing::error!(
            event = event.name(),
            "an event listener panicked; the call goes on"
        );
    }
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() {
            "Some(Listener)"
        } else {
            "None"
        })
    }
}
