//! The retry schedule: a task that re-sends deferred records when their retry-at time is due.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tower_service::Service;

use super::redrive::{Outcome, resend};
use crate::clock::Clock;
use crate::failure::Failure;
use crate::observe::{Event, Hook, Listener};
use crate::store::{Change, Record, Retention, Status, Store, add_clamped};

/// Re-sends deferred dead letters when they are due: the retry schedule, paced by breaker.
///
/// A record is deferred ([`Status::Deferred`](crate::store::Status::Deferred)) when its failure carried a
/// retry-at time; it sits in the store, indexed by that time (a sorted set in Redis). The
/// scheduler polls the store every [`poll_every`](Scheduler::poll_every) (1 s by default), claims
/// the due records in retry-at order ([`Store::claim_due`], atomic, so that two schedulers on the
/// same store never send the same record while the claim lasts), and re-sends each through the
/// service stack, at most [`concurrency`](Scheduler::concurrency) at a time (8 by default) and
/// at most [`rate`](Scheduler::rate) a second (50 by default, each gap jittered by ±50 %), so
/// that a provider that has just recovered is not hit by its whole backlog at once.
///
/// **Pacing by breaker.** A record an open breaker rejected names that breaker
/// ([`Record::breaker`]). While the scheduler knows the breaker is open, its records are not
/// sent: each is put back, deferred to the breaker's half-open time, and costs no re-send. At
/// half-open the scheduler sends one record as the probe and holds the others; when a re-send
/// of that breaker succeeds, the breaker is closed and its records drain at the rate. A re-send
/// whose final word is the breaker's local rejection is put back the same way, never counts as a
/// re-send, and teaches the scheduler the breaker's half-open time; that includes a probe whose
/// first attempt reached the provider and failed, so that its retry met the re-opened breaker:
/// the failure is the provider's outage, not the message's, and no outage is long enough to use
/// up a record's re-sends. The breakers are those of
/// the stack given, so each process paces by its own, and several schedulers on one Redis store
/// still never both send a record (claims are compare-and-set). A breaker the stack no longer
/// has (the process restarted, the key was evicted) is not known to be open: its records are
/// sent, and a new rejection teaches it again.
///
/// A re-sent record that succeeds becomes [`Resolved`](crate::store::Status::Resolved). One that fails
/// again is written by the stack's dead-letter layer with its new failure: deferred again when
/// the new failure carries a retry-at time, dead otherwise. A record really sent more than
/// [`max_resends`](Scheduler::max_resends) times (5 by default) is dead-lettered instead of sent.
/// Nothing is lost on a restart: records wait in the store, and a claim held by a scheduler that
/// died ends after the [`lease`](Scheduler::lease) (60 s by default), when another scheduler
/// takes the record (so a record may be sent twice if a scheduler dies mid-call: keep the
/// idempotency key, which re-sends keep).
///
/// Logs: a breaker the scheduler learns is open, at WARN with its cause, and its closing, at
/// INFO with the number of records held, once each; a record held or rejected locally at DEBUG.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tower::ServiceBuilder;
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop::resend::{Scheduler, http_request};
/// use tower_backstop::store::{SqliteStore, Store};
///
/// let store = Arc::new(SqliteStore::open("dead_letters.db")?);
/// # let client = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
/// #     Ok::<_, tower_backstop::BoxError>(http::Response::new(())) });
/// let stack = ServiceBuilder::new()
///     .layer(DeadLetterLayer::from_arc(store.clone()))
///     .service(client);
/// let scheduler = Scheduler::new(store, stack, |record| http_request(record, None)).spawn();
/// // … on shutdown:
/// scheduler.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Scheduler<S, F> {
    store: Arc<dyn Store>,
    service: S,
    rebuild: F,
    poll: Duration,
    concurrency: usize,
    lease: Duration,
    max_resends: u32,
    rate: u32,
    clock: Clock,
    listener: Hook,
    backlog_every: Duration,
    retention: Option<(Retention, Duration)>,
}

impl<S, F> fmt::Debug for Scheduler<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("poll", &self.poll)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("max_resends", &self.max_resends)
            .field("rate", &self.rate)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<S, F> Scheduler<S, F> {
    /// A scheduler over `store` that rebuilds each due record into a request with `rebuild` (for
    /// HTTP, [`http_request`](super::http_request)) and sends it through `service`.
    ///
    /// A `service` that is a known client (hyper-util, reqwest, tonic) with no
    /// [`ClassifyLayer`](crate::classify::ClassifyLayer) in it is reported by a `tracing` warning
    /// (an error response would count as delivered).
    pub fn new<Req, E>(store: Arc<dyn Store>, service: S, rebuild: F) -> Self
    where
        F: FnMut(&Record) -> Result<Req, E>,
    {
        crate::order::check::<S>(crate::order::Role::Resend);
        Scheduler {
            store,
            service,
            rebuild,
            poll: Duration::from_secs(1),
            concurrency: 8,
            lease: Duration::from_secs(60),
            max_resends: 5,
            rate: 50,
            clock: Clock::system(),
            listener: Hook::default(),
            backlog_every: Duration::from_secs(15),
            retention: None,
        }
    }

    /// How often to look for due records. Default 1 s.
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// Re-sends in flight at once, at least 1. Default 8.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long a claim lasts: longer than a re-send takes, the whole stack included. Default
    /// 60 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Re-sends per record before the scheduler dead-letters it instead. Default 5. Only real
    /// sends count: a record held because its breaker is open, or rejected by it locally, has
    /// its claim given back ([`Change::Held`]).
    pub fn max_resends(mut self, n: u32) -> Self {
        self.max_resends = n;
        self
    }

    /// Re-sends a second at most, on average, at least 1: each gap between two re-sends is
    /// `1 s / per_second`, jittered by ±50 % so that the schedulers of several processes do not
    /// send in step. Default 50, so that the backlog of a long outage (50 messages a second for
    /// two minutes make 6,000) drains in about two minutes instead of hitting the recovered
    /// provider at once. Set it above the rate at which your stack defers requests in steady
    /// state (a stack that defers 300 `Retry-After` answers a second needs more than 300), or
    /// the scheduler falls behind; the rate applies to every re-send, not only to a drain.
    pub fn rate(mut self, per_second: u32) -> Self {
        self.rate = per_second.max(1);
        self
    }

    /// Hands the scheduler's events to `listener`: each re-send's outcome
    /// ([`Event::Resent`]: delivered, failed again, or held by an open breaker), the records
    /// waiting ([`Event::Backlog`], every [`backlog_every`](Self::backlog_every)) and each store
    /// operation that failed ([`Event::StoreError`], operations `"claim"`, `"count"` and
    /// `"update"`). See [`observe`](crate::observe).
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.listener = Hook::new(listener);
        self
    }

    /// How often a scheduler with a [`listener`](Self::listener) counts the records waiting in
    /// its store and reports them ([`Event::Backlog`]), at least once a poll. Default 15 s, the
    /// Prometheus default scrape interval: each count reads the store's counts
    /// ([`Store::counts`]), which is a scan of its records.
    pub fn backlog_every(mut self, every: Duration) -> Self {
        self.backlog_every = every;
        self
    }

    /// Prunes the store by `retention` every `every` (the first time when the scheduler starts),
    /// on the scheduler's clock: see [`Retention::prune`], which never removes a deferred or
    /// in-flight record. Off by default; an hour is a sensible interval. A failed prune is
    /// reported as [`Event::StoreError`] (operation `"prune"`) and at `WARN`, and the scheduler
    /// goes on.
    pub fn retention(mut self, retention: Retention, every: Duration) -> Self {
        self.retention = Some((retention, every));
        self
    }

    /// The clock for record times. Default [`Clock::system`]; tests on a paused clock use
    /// [`Clock::tokio`].
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// The handle of a spawned [`Scheduler`].
#[derive(Debug)]
pub struct SchedulerHandle {
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl SchedulerHandle {
    /// Stops polling, waits for the re-sends in flight to finish, and returns.
    pub async fn shutdown(self) {
        self.stop.notify_one();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "dead-letter scheduler task failed");
        }
    }
}

impl<S, F, Req, E> Scheduler<S, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<Failure<S::Response>> + Send,
    S::Response: Send + 'static,
    F: FnMut(&Record) -> Result<Req, E> + Send + 'static,
    E: fmt::Display + 'static,
    Req: Send + 'static,
{
    /// Runs the scheduler on a tokio task until [`SchedulerHandle::shutdown`].
    pub fn spawn(self) -> SchedulerHandle {
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(self.run(Arc::clone(&stop)));
        SchedulerHandle { stop, task }
    }

    async fn run(mut self, stop: Arc<Notify>) {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let mut in_flight = JoinSet::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut holds = Holds::default();
        let mut pace = Pace::new(self.rate);
        let mut backlog_at: Option<tokio::time::Instant> = None;
        let mut pruned_at: Option<tokio::time::Instant> = None;
        loop {
            while in_flight.try_join_next().is_some() {}
            if let Some((retention, every)) = &self.retention
                && pruned_at.is_none_or(|at| at.elapsed() >= *every)
            {
                pruned_at = Some(tokio::time::Instant::now());
                match retention
                    .prune_as(&*self.store, self.clock.now(), "scheduler")
                    .await
                {
                    Ok(pruned) if pruned.total() > 0 => tracing::info!(
                        by_age = pruned.by_age,
                        by_count = pruned.by_count,
                        "pruned the dead-letter records beyond the retention"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        self.listener.emit_ref(&Event::StoreError {
                            operation: "prune",
                            id: None,
                            error: &e,
                        });
                        tracing::warn!(error = %e, "dead-letter scheduler cannot prune the store");
                    }
                }
            }
            if self.listener.is_set()
                && backlog_at.is_none_or(|at| at.elapsed() >= self.backlog_every)
            {
                backlog_at = Some(tokio::time::Instant::now());
                report_backlog(&*self.store, &self.listener).await;
            }
            while let Ok(report) = rx.try_recv() {
                holds.learn(report, self.rate);
            }
            let free = slots.available_permits();
            let mut more = false;
            if free > 0 {
                match self
                    .store
                    .claim_due(self.clock.now(), free, self.lease)
                    .await
                {
                    Ok(due) => {
                        let full = due.len() == free;
                        for record in due {
                            while let Ok(report) = rx.try_recv() {
                                holds.learn(report, self.rate);
                            }
                            let now = self.clock.now();
                            if let Some(until) = holds.hold(&record, now, self.poll) {
                                hold(&*self.store, &record, until).await;
                                continue;
                            }
                            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                                break;
                            };
                            pace.wait().await;
                            let breaker = record.breaker.clone();
                            if !self.start(record, slot, &tx, &mut in_flight).await {
                                holds.not_sent(breaker.as_deref());
                            }
                        }
                        // A full batch: more may be due now, even when all of it was held
                        // (another breaker's records wait behind an open one's backlog).
                        more = full;
                    }
                    Err(e) => {
                        self.listener.emit_ref(&Event::StoreError {
                            operation: "claim",
                            id: None,
                            error: &e,
                        });
                        tracing::warn!(error = %e, "dead-letter scheduler cannot claim due records")
                    }
                }
            }
            let wait = if more { Duration::ZERO } else { self.poll };
            if tokio::time::timeout(wait, stop.notified()).await.is_ok() {
                break;
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    fn update_failed(&self, id: &str, error: &crate::store::StoreError) {
        self.listener.emit_ref(&Event::StoreError {
            operation: "update",
            id: Some(id),
            error,
        });
    }

    /// Starts the re-send of a claimed record; whether it was started (false: dead-lettered
    /// instead).
    async fn start(
        &mut self,
        record: Record,
        slot: tokio::sync::OwnedSemaphorePermit,
        reports: &mpsc::UnboundedSender<Report>,
        in_flight: &mut JoinSet<()>,
    ) -> bool {
        let store = Arc::clone(&self.store);
        if record.resends > self.max_resends {
            tracing::warn!(
                id = %record.id,
                resends = record.resends - 1,
                "re-sent as often as allowed; dead-lettered"
            );
            if let Err(e) = store.update(&record.id, Change::Dead).await {
                self.update_failed(&record.id, &e);
                tracing::error!(id = %record.id, error = %e, "cannot dead-letter the record");
            }
            return false;
        }
        let rebuilt = (self.rebuild)(&record).map_err(|e| e.to_string());
        let request = match rebuilt {
            Ok(request) => request,
            Err(e) => {
                tracing::error!(id = %record.id, error = %e, "cannot rebuild the request; dead-lettered");
                if let Err(e) = store.update(&record.id, Change::Dead).await {
                    self.update_failed(&record.id, &e);
                    tracing::error!(id = %record.id, error = %e, "cannot dead-letter the record");
                }
                return false;
            }
        };
        let mut service = self.service.clone();
        let clock = self.clock;
        let reports = reports.clone();
        let recheck = self.poll.saturating_mul(10);
        let listener = self.listener.clone();
        in_flight.spawn(async move {
            let (outcome, rejected) =
                resend(&*store, &mut service, &record, request, None, &clock).await;
            let report = match (&outcome, rejected) {
                (_, Some(rejected)) => {
                    // Nothing reached the provider: give the claim back.
                    let until = add_clamped(clock.now(), rejected.half_opens_in.unwrap_or(recheck));
                    tracing::debug!(
                        id = %record.id,
                        breaker = %rejected.breaker,
                        "scheduled re-send rejected by an open breaker; held"
                    );
                    // Held when nothing was sent; a re-send that reached the provider and
                    // failed before a retry met the breaker failed, though it is put back.
                    let outcome = if rejected.reached { "failed" } else { "held" };
                    listener.emit_ref(&Event::Resent {
                        id: &record.id,
                        outcome,
                    });
                    give_back(&*store, &record, until).await;
                    Report::Open {
                        breaker: rejected.breaker,
                        until,
                        cause: rejected.cause,
                        id: record.id.clone(),
                    }
                }
                (Outcome::Resolved { .. }, None) => {
                    listener.emit_ref(&Event::Resent {
                        id: &record.id,
                        outcome: "delivered",
                    });
                    tracing::info!(id = %record.id, "scheduled re-send succeeded");
                    Report::Delivered {
                        breaker: record.breaker.clone(),
                    }
                }
                (other, None) => {
                    listener.emit_ref(&Event::Resent {
                        id: &record.id,
                        outcome: "failed",
                    });
                    tracing::warn!(id = %record.id, outcome = ?other, "scheduled re-send failed");
                    Report::Failed {
                        breaker: record.breaker.clone(),
                    }
                }
            };
            let _ = reports.send(report);
            drop(slot);
        });
        true
    }
}

/// Puts a claimed record back, unsent, deferred to `until` ([`Change::Held`]).
async fn hold(store: &dyn Store, claimed: &Record, until: SystemTime) {
    tracing::debug!(id = %claimed.id, breaker = ?claimed.breaker, until = %humantime::format_rfc3339_millis(until), "breaker open; record held");
    match store
        .change_if_unchanged(claimed, Change::Held { retry_at: until })
        .await
    {
        Ok(_) => {}
        Err(e) => {
            // The claim ends at its lease, when the record is due again.
            tracing::error!(id = %claimed.id, error = %e, "cannot put a held record back");
        }
    }
}

/// After a local rejection of a claimed record: gives its claim back, deferred to `until`,
/// whatever the stack's dead-letter layer wrote meanwhile (deferred, or dead when the breaker
/// was forced open), as long as no one else changed it since.
async fn give_back(store: &dyn Store, claimed: &Record, until: SystemTime) {
    match store.get(&claimed.id).await {
        Ok(Some(current))
            if current.resends == claimed.resends && current.status != Status::Resolved =>
        {
            hold(store, &current, until).await
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(id = %claimed.id, error = %e, "cannot read a locally rejected record back");
        }
    }
}

/// What a re-send task tells the scheduler's loop.
#[derive(Debug)]
enum Report {
    /// An open breaker rejected it locally; it half-opens at `until`.
    Open {
        breaker: String,
        until: SystemTime,
        cause: Option<String>,
        id: String,
    },
    /// Sent and delivered: its breaker (if it named one) is closed.
    Delivered { breaker: Option<String> },
    /// Sent and failed.
    Failed { breaker: Option<String> },
}

/// The breakers the scheduler knows to be open, and what it holds for each.
#[derive(Debug, Default)]
struct Holds(HashMap<String, Hold>);

#[derive(Debug)]
struct Hold {
    /// When the breaker half-opens.
    until: SystemTime,
    /// Whether a probe of it is in flight.
    probing: bool,
    /// Whether a rejection showed it open (else it is only named by a record, and its first
    /// record is sent alone to find out).
    open: bool,
    /// The records held for it.
    held: HashSet<String>,
}

impl Holds {
    fn learn(&mut self, report: Report, rate: u32) {
        match report {
            Report::Open {
                breaker,
                until,
                cause,
                id,
            } => {
                let hold = self.0.entry(breaker.clone()).or_insert_with(|| Hold {
                    until,
                    probing: false,
                    open: false,
                    held: HashSet::new(),
                });
                if !hold.open {
                    hold.open = true;
                    tracing::warn!(
                        breaker = %breaker,
                        half_opens_at = %humantime::format_rfc3339_millis(until),
                        cause = cause.as_deref().unwrap_or("unknown"),
                        "breaker open: holding its deferred records until it closes"
                    );
                }
                hold.until = until;
                hold.probing = false;
                hold.held.insert(id);
            }
            Report::Delivered {
                breaker: Some(breaker),
            } => {
                if let Some(hold) = self.0.remove(&breaker)
                    && hold.open
                {
                    tracing::info!(
                        breaker = %breaker,
                        held = hold.held.len(),
                        per_second = rate,
                        "breaker closed: draining its held records"
                    );
                }
            }
            Report::Failed {
                breaker: Some(breaker),
            } => {
                if let Some(hold) = self.0.get_mut(&breaker) {
                    // The probe reached the provider and failed: the next one learns when the
                    // breaker half-opens again.
                    hold.probing = false;
                }
            }
            Report::Delivered { breaker: None } | Report::Failed { breaker: None } => {}
        }
    }

    /// A record chosen as a probe was not sent after all (dead-lettered instead).
    fn not_sent(&mut self, breaker: Option<&str>) {
        if let Some(hold) = breaker.and_then(|b| self.0.get_mut(b)) {
            hold.probing = false;
        }
    }

    /// Whether to hold `record` now, and until when; `None`: send it. The first record of a
    /// breaker the scheduler has not seen yet, and the first due once an open breaker
    /// half-opens, is sent alone, as the probe; the others wait for its outcome.
    fn hold(&mut self, record: &Record, now: SystemTime, poll: Duration) -> Option<SystemTime> {
        let breaker = record.breaker.as_deref()?;
        let hold = self.0.entry(breaker.to_owned()).or_insert_with(|| Hold {
            until: now,
            probing: false,
            open: false,
            held: HashSet::new(),
        });
        if now < hold.until {
            hold.held.insert(record.id.clone());
            return Some(hold.until);
        }
        if hold.probing {
            hold.held.insert(record.id.clone());
            return Some(add_clamped(now, poll));
        }
        hold.probing = true;
        None
    }
}

/// The gaps between re-sends: `1 s / rate`, each jittered by ±50 %, counted from the later of
/// the last send and now (an idle scheduler does not save up a burst).
#[derive(Debug)]
struct Pace {
    gap: Duration,
    next: Option<Instant>,
}

impl Pace {
    fn new(rate: u32) -> Self {
        Pace {
            gap: Duration::from_secs(1) / rate.max(1),
            next: None,
        }
    }

    async fn wait(&mut self) {
        if let Some(next) = self.next {
            tokio::time::sleep_until(next).await;
        }
        let jitter = rand::random::<f64>() + 0.5;
        let now = Instant::now();
        let from = self.next.map_or(now, |next| next.max(now));
        self.next = Some(from + self.gap.mul_f64(jitter));
    }
}

/// Counts the records waiting and hands the number to the listener.
async fn report_backlog(store: &dyn Store, listener: &Hook) {
    match store.counts(std::time::UNIX_EPOCH).await {
        Ok(counts) => listener.emit(|| Event::Backlog {
            deferred: counts.deferred,
        }),
        Err(e) => listener.emit_ref(&Event::StoreError {
            operation: "count",
            id: None,
            error: &e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Class, Code};

    fn record(id: &str, breaker: &str) -> Record {
        let f: Failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen);
        let mut r = crate::dead_letter::record_of(id.to_owned(), crate::Envelope::new("{}"), &f);
        r.breaker = Some(breaker.to_owned());
        r
    }

    fn open(holds: &mut Holds, breaker: &str, until: SystemTime) {
        holds.learn(
            Report::Open {
                breaker: breaker.to_owned(),
                until,
                cause: None,
                id: "rejected".to_owned(),
            },
            50,
        );
    }

    /// A breaker half-opens at its half-open instant: a record due then is the probe, one due a
    /// moment before is held to that instant, and one due while the probe is out waits a poll.
    #[test]
    fn the_probe_goes_at_the_half_open_instant_and_alone() {
        let poll = Duration::from_secs(1);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut holds = Holds::default();
        open(&mut holds, "a", t);
        let early = t - Duration::from_nanos(1);
        assert_eq!(holds.hold(&record("r-0", "a"), early, poll), Some(t));
        assert_eq!(holds.hold(&record("r-1", "a"), t, poll), None, "the probe");
        assert_eq!(holds.hold(&record("r-2", "a"), t, poll), Some(t + poll));
        // Another breaker's record is not held by this one.
        assert_eq!(holds.hold(&record("r-3", "b"), early, poll), None);
        // The probe failed: the next record is the next probe.
        holds.learn(
            Report::Failed {
                breaker: Some("a".to_owned()),
            },
            50,
        );
        assert_eq!(holds.hold(&record("r-4", "a"), t, poll), None);
    }
}
