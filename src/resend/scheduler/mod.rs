//! The retry schedule: a task that re-sends deferred records when their retry-at time is due.

mod acks;
mod health;
mod holds;
mod pace;
mod run;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_service::Service;

pub(crate) use self::health::Health;
pub use self::health::StoreHealth;
use crate::clock::Clock;
use crate::failure::Failure;
use crate::observe::{Hook, Listener};
use crate::store::{Record, Retention, Store};

/// How long a claim of a record lasts unless renewed: 10 s. A [`Scheduler`] (and a
/// [`Redrive`](super::Redrive)) renews the claim of each re-send every third of it (3.3 s) while
/// the stack and the provider take their time, so a re-send may last as long as it needs; a
/// process that dies holds its claims no longer than this, and another scheduler takes them
/// over within the lease and one poll (11 s with the defaults) while the schedulers keep up with
/// what is due; behind a backlog, an ended claim takes its turn in retry-at order, after the
/// records due before its end, at the drain rate. Long enough that a renewal
/// survives a slow store: two renewals are tried before the claim ends, each within the stores'
/// default 5 s response and acquire timeouts.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// How long [`SchedulerHandle::shutdown`] waits for the re-sends in flight before it gives
/// their claims back: 10 s, well inside the 30 s a container orchestrator (Kubernetes' default
/// grace period) gives a process to stop.
pub const DEFAULT_SHUTDOWN_WITHIN: Duration = Duration::from_secs(10);

/// Re-sends deferred dead letters when they are due: the retry schedule, paced by breaker.
///
/// A record is deferred ([`Status::Deferred`](crate::store::Status::Deferred)) when its failure carried a
/// retry-at time; it sits in the store, indexed by that time (a sorted set in Redis). The
/// scheduler asks the store for the earliest due time ([`Store::next_due`]) and sleeps until
/// then, at most [`poll_every`](Scheduler::poll_every) (1 s by default, the bound on how late it
/// sees a record another process wrote). It claims the due records in retry-at order
/// ([`Store::claim_due`], atomic, so that two schedulers on the same store never send the same
/// record while the claim lasts), and re-sends each through the service stack, at most
/// [`concurrency`](Scheduler::concurrency) at a time (8 by default) and at most
/// [`rate`](Scheduler::rate) a second (50 by default, each gap jittered by ±50 %), so that a
/// provider that has just recovered is not hit by its whole backlog at once. The rate is this
/// process's: several processes on one store send that many each, unless they share one
/// [`fleet_rate`](Scheduler::fleet_rate).
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
/// the new failure carries a retry-at time or the layer's
/// [`RetrySchedule`](crate::dead_letter::RetrySchedule) has a step left for it, dead otherwise. A record really sent more than
/// [`max_resends`](Scheduler::max_resends) times (5 by default) is dead-lettered instead of sent.
///
/// **Claims.** Each claim is a [`Lease`](crate::store::Lease): it lasts
/// [`lease`](Scheduler::lease) ([`DEFAULT_LEASE`], 10 s), and the scheduler renews it every third
/// of that while the re-send is in flight. Every write that ends a claim (delivered, failed
/// again, dead-lettered, held, given back) is made only while the claim's fencing token still
/// matches ([`Store::change_claimed`], [`Store::put_claimed`]), and the claim is confirmed
/// before the request goes out: a scheduler that stalls past its lease (a long pause, a store it
/// cannot reach) and wakes up after another took the record sends nothing and changes nothing.
/// Nothing is lost on a restart: records wait in the store, and a claim held by a scheduler that
/// died ends after its lease, when another scheduler takes the record (so a record may be sent
/// twice if a scheduler dies mid-call: keep the idempotency key, which re-sends keep).
///
/// **Store outages.** The scheduler never stops, and never drops a record, because its store
/// fails or does not answer: the records wait in the store. Each store call waits at most a
/// third of the lease. Claims that fail back off: exponential from
/// [`poll_every`](Scheduler::poll_every), doubling, capped at 5 s (or the poll, if longer),
/// with "equal jitter" (Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog),
/// instead of one claim a poll. The write that ends a claim is tried again while the store
/// fails, backing off from 100 ms to at most 5 s: a delivery's resolution until it is written
/// or the claim is known to have passed to another sender (past the lease's end too, so that a
/// delivered record is not sent again), the others until the lease ends (the record is due again
/// then, and looked at afresh). Renewals are tried again past the lease's end: a claim no one
/// else took is renewed when the store is back. A claim that ended during the outage and that
/// this scheduler takes again goes to the re-send still holding the record, which is not sent
/// twice; one another scheduler took is never written over, and the log says so.
/// [`SchedulerHandle::store_health`] says whether the store fails, since when and why.
///
/// **Shutdown.** [`SchedulerHandle::shutdown`] stops claiming, waits for the re-sends in flight
/// at most [`DEFAULT_SHUTDOWN_WITHIN`] (or the bound given to
/// [`shutdown_within`](SchedulerHandle::shutdown_within)), and gives the claims it still holds
/// back, due at once, so that another instance takes them without waiting for their lease.
///
/// Logs: a breaker the scheduler learns is open, at WARN with its cause, and its closing, at
/// INFO with the number of records held, once each; a record held or rejected locally at DEBUG;
/// a store that fails, at WARN once, and its return, at INFO once (the failures in between at
/// DEBUG; each one is an [`Event::StoreError`](crate::observe::Event::StoreError)).
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
    fleet_rate: Option<u32>,
    clock: Clock,
    listener: Hook,
    backlog_every: Duration,
    retention: Option<(Retention, Duration)>,
    /// How often to check the store's counters, and whether to repair them.
    counts_check: Option<(Duration, bool)>,
    /// The stack's breakers, watched to release the records held for one that closed.
    breakers: Option<crate::observe::Health>,
}

impl<S, F> fmt::Debug for Scheduler<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("poll", &self.poll)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("max_resends", &self.max_resends)
            .field("rate", &self.rate)
            .field("fleet_rate", &self.fleet_rate)
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
            lease: DEFAULT_LEASE,
            max_resends: 5,
            rate: 50,
            fleet_rate: None,
            clock: Clock::system(),
            listener: Hook::default(),
            backlog_every: Duration::from_secs(15),
            retention: None,
            counts_check: None,
            breakers: None,
        }
    }

    /// Watches the breakers of the stack the scheduler sends through (the reader of
    /// [`BackstopLayer::health`](crate::preset::BackstopLayer::health) or
    /// [`BreakerLayer::health`](crate::breaker::BreakerLayer::health)), so that the records
    /// held for an open breaker are released as soon as that breaker closes, whoever closed it:
    /// a live request's probe, an operator's reset, or another process of the fleet whose
    /// probe succeeded ([`Fleet`](crate::breaker::Fleet)). Held records are those this
    /// scheduler put back unsent, and those the stack's dead-letter layer deferred to the
    /// breaker's half-open time when it rejected a call (class `circuit_open`, naming the
    /// breaker; at most 100,000 of those are read). Without it, a held record waits for the
    /// half-open time the breaker had when it was held.
    ///
    /// While a breaker is not closed, the scheduler looks at the breakers every 250 ms; it
    /// makes a released record due now (one read and one compare-and-set write per record,
    /// each bounded by a third of the lease; a record changed meanwhile is left as it is).
    pub fn watch_breakers(mut self, breakers: crate::observe::Health) -> Self {
        self.breakers = Some(breakers);
        self
    }

    /// The longest the scheduler sleeps between two looks at the store, at least 1 ms. Default
    /// 1 s. Between looks it sleeps until the earliest due time the store knows
    /// ([`Store::next_due`]): a record this bound matters for is one another process writes,
    /// due sooner than that, while the scheduler sleeps.
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// Re-sends in flight at once, at least 1. Default 8. The scheduler claims from the store
    /// when nothing is in flight or at least half of this is free, as many records as are
    /// free: one claim per half of it under a steady drain, not one per re-send.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long a claim lasts unless renewed, at least 3 ms. Default [`DEFAULT_LEASE`], 10 s.
    /// The scheduler renews each claim every third of it while its re-send is in flight, so a
    /// re-send may take longer than the lease; what the lease bounds is how long the claims of a
    /// process that died wait before another scheduler takes them (the lease and one
    /// [`poll_every`](Self::poll_every)). Shorter takes over sooner; longer rides out a store
    /// that answers slowly, or not at all, for longer before a claim ends under a re-send still
    /// in flight (then sent twice, with its idempotency key).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(3));
        self
    }

    /// Re-sends per record before the scheduler dead-letters it instead. Default 5. Only real
    /// sends count: a record held because its breaker is open, or rejected by it locally, has
    /// its claim given back ([`Change::Held`](crate::store::Change::Held)).
    pub fn max_resends(mut self, n: u32) -> Self {
        self.max_resends = n;
        self
    }

    /// Re-sends a second at most, on average, at least 1, **for this process**: each gap
    /// between two re-sends is `1 s / per_second`, jittered by ±50 % so that the schedulers of
    /// several processes do not send in step. Default 50, so that the backlog of a long outage
    /// (50 messages a second for two minutes make 6,000) drains in about two minutes instead of
    /// hitting the recovered provider at once. Each process has its own: four processes on one
    /// store drain at four times the rate (200 a second with the default), unless they share a
    /// [`fleet_rate`](Self::fleet_rate). Set it above the rate at which your stack defers
    /// requests in steady state (a stack that defers 300 `Retry-After` answers a second needs
    /// more than 300), or the scheduler falls behind; the rate applies to every re-send, not
    /// only to a drain.
    pub fn rate(mut self, per_second: u32) -> Self {
        self.rate = per_second.max(1);
        self
    }

    /// Re-sends a second at most **for every scheduler on this store together**, at least 1:
    /// each re-send first reserves a slot of one schedule the store keeps for them all
    /// ([`Store::reserve_slot`]), the slots `1 s / per_second` apart, and goes at its slot. Off
    /// by default (each process paces itself by [`rate`](Self::rate)). Costs one store write per
    /// re-send. While the store cannot give a slot, the scheduler falls back to its own rate
    /// for that re-send. The slots are counted on each process's clock: keep the fleet's clocks
    /// in step (NTP).
    pub fn fleet_rate(mut self, per_second: u32) -> Self {
        self.fleet_rate = Some(per_second.max(1));
        self
    }

    /// Hands the scheduler's events to `listener`: each re-send's outcome
    /// ([`Event::Resent`](crate::observe::Event::Resent): delivered, failed again, or held by
    /// an open breaker), the records waiting
    /// ([`Event::Backlog`](crate::observe::Event::Backlog), every
    /// [`backlog_every`](Self::backlog_every)) and each store operation that failed
    /// ([`Event::StoreError`](crate::observe::Event::StoreError), operations `"claim"`,
    /// `"next_due"`, `"count"`, `"update"` (a record's outcome, each try), `"renew"` (a claim's
    /// renewal), `"slot"` and `"prune"`). See
    /// [`observe`](crate::observe).
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.listener = Hook::new(listener);
        self
    }

    /// How often a scheduler with a [`listener`](Self::listener) counts the records waiting in
    /// its store and reports them ([`Event::Backlog`](crate::observe::Event::Backlog)), at
    /// least once a poll. Default 15 s, the Prometheus default scrape interval: each count
    /// reads the store's counts ([`Store::counts`]), which is a scan of its records.
    pub fn backlog_every(mut self, every: Duration) -> Self {
        self.backlog_every = every;
        self
    }

    /// Prunes the store by `retention` every `every` (the first time when the scheduler starts),
    /// on the scheduler's clock: see [`Retention::prune`], which never removes a deferred or
    /// in-flight record. Off by default; an hour is a sensible interval. A failed prune is
    /// reported as [`Event::StoreError`](crate::observe::Event::StoreError) (operation
    /// `"prune"`) and at `WARN` (once while the store fails), and the scheduler goes on.
    pub fn retention(mut self, retention: Retention, every: Duration) -> Self {
        self.retention = Some((retention, every));
        self
    }

    /// Recounts the store's records every `every` (the first time `every` after the scheduler
    /// starts) and compares the recount with the counters the store keeps so that its counts
    /// need not read the records ([`Store::check_counts`]); with `repair`, sets each drifted
    /// counter to the recount. Off by default; once a day is a sensible period (a check reads
    /// every record's status, class and code: about 1 s per million records on Postgres, 3.5 s
    /// on SQLite, tens of seconds on Redis).
    ///
    /// The check runs on a task of its own, so the re-sends go on meanwhile, and one at a time:
    /// a period that ends while a check is still running starts none. Each check is told as
    /// [`Event::CountsChecked`](crate::observe::Event::CountsChecked) (the `backstop_counts_drifted`
    /// gauge of [`Metrics`](crate::observe::Metrics)); a drift is logged at `WARN` with the
    /// first key that drifted; a failed check is an
    /// [`Event::StoreError`](crate::observe::Event::StoreError) (operation `"check_counts"`),
    /// and the next period tries again. Stores that keep no counters (the in-memory store)
    /// find nothing to check.
    ///
    /// Several schedulers on one store each check it: give one of them this setting, or
    /// `repair` to one only (a repair is one transaction or script, so two never half-apply,
    /// but each recount costs a read of every record).
    pub fn check_counts(mut self, every: Duration, repair: bool) -> Self {
        self.counts_check = Some((every, repair));
        self
    }

    /// The clock for record times. Default [`Clock::system`]; tests on a paused clock use
    /// [`Clock::tokio`].
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// The handle of a spawned [`Scheduler`]. Dropping it leaves the scheduler running.
#[derive(Debug)]
pub struct SchedulerHandle {
    /// `Some(bound)` once a shutdown was asked for, with how long to wait for the re-sends in
    /// flight.
    stop: watch::Sender<Option<Duration>>,
    task: JoinHandle<()>,
    health: Health,
}

impl SchedulerHandle {
    /// What the scheduler knows of its store now: whether it fails, since when, and its last
    /// error ([`StoreHealth`]). For a health or readiness route: a scheduler whose store fails
    /// loses nothing (the records wait in the store, the outcome of each re-send is tried
    /// again until written), but sends nothing new until the store is back.
    pub fn store_health(&self) -> StoreHealth {
        self.health.read()
    }

    /// Shuts the scheduler down within [`DEFAULT_SHUTDOWN_WITHIN`] (10 s): see
    /// [`shutdown_within`](Self::shutdown_within).
    pub async fn shutdown(self) {
        self.shutdown_within(DEFAULT_SHUTDOWN_WITHIN).await;
    }

    /// Stops claiming, gives back at once the records claimed but not yet sent (unsent, at no
    /// cost: [`Change::Held`](crate::store::Change::Held)), waits for the re-sends in flight at
    /// most `bound`, then stops those still running and gives their claims back
    /// ([`Change::Released`](crate::store::Change::Released): due now, their re-send counted,
    /// since the provider may have seen it), and returns. Every give-back is made only while
    /// the claim holds. Another scheduler on the store takes the records given back at its
    /// next look, without waiting for their lease to end.
    pub async fn shutdown_within(self, bound: Duration) {
        // The task may have ended already (it panicked): then there is no one to tell.
        let _ = self.stop.send(Some(bound));
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "dead-letter scheduler task failed");
        }
    }

    /// Stops the scheduler at once, as a crash would: nothing is finished or given back, and
    /// the claims it holds end at their lease, when another scheduler takes their records. For
    /// tests of a fleet, and for a supervisor that cannot wait.
    pub fn abort(self) {
        self.task.abort();
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
    pub fn spawn(mut self) -> SchedulerHandle {
        // Its writes under a claim go in batches (see `acks`), where the store applies a batch
        // in one step.
        if self.store.applies_batches() {
            self.store = Arc::new(acks::Batched::new(self.store));
        }
        let (stop, stopped) = watch::channel(None);
        let health = Health::new(self.listener.clone(), self.clock);
        let task = tokio::spawn(run::Run::new(self, stopped, health.clone()).run());
        SchedulerHandle { stop, task, health }
    }
}
