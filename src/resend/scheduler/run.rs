//! The scheduler's loop: claim what is due, start what the pace and the concurrency allow,
//! sleep until the next due time, and at shutdown give back what is unfinished.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::{Id, JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tower_service::Service;

use super::Scheduler;
use super::health::Health;
use super::holds::{Holds, Report};
use super::pace::Pace;
use crate::dead_letter::bounded::{bounded_call, store_retry};
use crate::failure::Failure;
use crate::observe::{Event, Hook};
use crate::resend::redrive::{Outcome, resend};
use crate::resend::renew::{Claims, Held};
use crate::status::State;
use crate::store::{Change, Claim, Filter, Lease, Record, Status, Store, StoreError, add_clamped};

/// The shortest sleep after a look at the store that found a due time already past but claimed
/// nothing (another scheduler took it in between): no busy loop on a store that says "now".
const MIN_SLEEP: Duration = Duration::from_millis(10);

/// The longest wait between two claims while the store fails (unless the poll is longer): 5 s,
/// so that a store that comes back is seen within that.
const CLAIM_BACKOFF_CAP: Duration = Duration::from_secs(5);
/// How often the breakers are looked at while records are held for one.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// How many held records are released at once (their reads and writes in flight together).
const RELEASE_AT_ONCE: usize = 32;
/// The most deferred rejections read to find those of a breaker that closed.
const RELEASE_SCAN: usize = 100_000;

/// Makes due at `now` the records held for `breaker`, which closed: those of `held` (put back
/// by this scheduler) and the deferred rejections that name it (class `circuit_open`; at most
/// [`RELEASE_SCAN`] read), each unless it changed meanwhile, [`RELEASE_AT_ONCE`] at a time.
async fn release(
    store: Arc<dyn Store>,
    breaker: String,
    held: Vec<String>,
    now: SystemTime,
    timeout: Duration,
    health: Health,
) {
    // One step, where the store has it.
    match bounded_call(timeout, store.release_held(&breaker, now)).await {
        Ok(Some(released)) => {
            if released > 0 {
                tracing::info!(breaker = %breaker, released, "breaker closed: the records held for it are due now");
            }
            return;
        }
        Ok(None) => {}
        Err(e) => {
            health.failed("release", &e);
            tracing::warn!(breaker = %breaker, error = %e, "cannot release the records held for a breaker that closed: they wait for their half-open time");
            return;
        }
    }
    let rejected = Filter::new()
        .status(Status::Deferred)
        .class(crate::Class::CIRCUIT_OPEN.name());
    // The rejections as read (no second read before each change), then the scheduler's own
    // put-backs the search did not return.
    let mut records: Vec<Record> = Vec::new();
    match bounded_call(timeout, store.search(&rejected, 0..RELEASE_SCAN)).await {
        Ok(found) => records.extend(found.into_iter().filter(|r| is_held(r, &breaker, now))),
        Err(e) => health.failed("release", &e),
    }
    let mut ids: Vec<String> = held
        .into_iter()
        .filter(|id| !records.iter().any(|r| &r.id == id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut released = 0usize;
    let mut each = JoinSet::new();
    let mut work: Vec<(Option<Record>, String)> = records
        .into_iter()
        .map(|r| (Some(r), String::new()))
        .chain(ids.into_iter().map(|id| (None, id)))
        .collect();
    while !work.is_empty() || !each.is_empty() {
        while each.len() < RELEASE_AT_ONCE
            && let Some((record, id)) = work.pop()
        {
            let (store, breaker) = (Arc::clone(&store), breaker.clone());
            each.spawn(async move {
                let record = match record {
                    Some(record) => Some(record),
                    None => bounded_call(timeout, store.get(&id)).await?,
                };
                match record {
                    Some(r) if is_held(&r, &breaker, now) => {
                        let change = Change::Released { retry_at: now };
                        let claim =
                            bounded_call(timeout, store.change_if_unchanged(&r, change)).await?;
                        Ok::<bool, StoreError>(matches!(claim, Claim::Claimed(_)))
                    }
                    _ => Ok(false),
                }
            });
        }
        match each.join_next().await {
            Some(Ok(Ok(true))) => released += 1,
            Some(Ok(Ok(false))) | None => {}
            Some(Ok(Err(e))) => {
                health.failed("release", &e);
                tracing::warn!(breaker = %breaker, error = %e, "cannot release a held record: it waits for its half-open time");
            }
            Some(Err(e)) => {
                tracing::error!(breaker = %breaker, error = %e, "a release task failed")
            }
        }
    }
    if released > 0 {
        tracing::info!(breaker = %breaker, released, "breaker closed: the records held for it are due now");
    }
}

/// Whether `record` is held for `breaker`: deferred for it to a time after `now`.
fn is_held(record: &Record, breaker: &str, now: SystemTime) -> bool {
    record.status == Status::Deferred
        && record.breaker.as_deref() == Some(breaker)
        && record.retry_at.is_some_and(|at| at > now)
}

/// What a look at the store found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// As many records as were asked for: more may be due now.
    Full,
    /// Fewer: nothing more is due now.
    Partial,
    /// No room for another re-send: none was asked for.
    Busy,
    /// The store failed.
    Failed,
}

/// A spawned scheduler: its settings and its state.
pub(super) struct Run<S, F> {
    scheduler: Scheduler<S, F>,
    stop: watch::Receiver<Option<Duration>>,
    in_flight: JoinSet<()>,
    /// The claim of each re-send in flight, by its task.
    leases: HashMap<Id, Lease>,
    /// Claimed records not yet started, each with when it was claimed.
    pending: VecDeque<(Record, Instant)>,
    holds: Holds,
    pace: Pace,
    health: Health,
    reports: mpsc::UnboundedReceiver<Report>,
    report: mpsc::UnboundedSender<Report>,
    backlog_at: Option<Instant>,
    pruned_at: Option<Instant>,
    /// When the counters were last checked (the start, before the first check).
    counts_checked_at: Instant,
    /// The check of the counters under way, if one is.
    counts_check: Option<JoinHandle<()>>,
    /// The store's wake-ups ([`Store::wake_ups`]), if it pushes any.
    wake_ups: Option<watch::Receiver<u64>>,
    /// The claims of the re-sends under way, by record id.
    claims: Arc<Claims>,
    /// Claims that failed in a row, for the backoff.
    claims_failed: u32,
    /// When the breakers were last looked at for held records to release.
    watched_at: Option<Instant>,
    /// Each watched breaker's state when last looked at.
    breaker_states: HashMap<String, State>,
}

impl<S, F, Req, E> Run<S, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<Failure<S::Response>> + Send,
    S::Response: Send + 'static,
    F: FnMut(&Record) -> Result<Req, E> + Send + 'static,
    E: fmt::Display + 'static,
    Req: Send + 'static,
{
    pub(super) fn new(
        scheduler: Scheduler<S, F>,
        stop: watch::Receiver<Option<Duration>>,
        health: Health,
    ) -> Self {
        let (report, reports) = mpsc::unbounded_channel();
        Run {
            pace: Pace::new(scheduler.rate, scheduler.fleet_rate),
            health,
            scheduler,
            stop,
            in_flight: JoinSet::new(),
            leases: HashMap::new(),
            pending: VecDeque::new(),
            holds: Holds::default(),
            reports,
            report,
            backlog_at: None,
            pruned_at: None,
            counts_checked_at: Instant::now(),
            counts_check: None,
            wake_ups: None,
            claims: Arc::default(),
            claims_failed: 0,
            watched_at: None,
            breaker_states: HashMap::new(),
        }
    }

    /// How long each store call of the loop may take: a third of the lease.
    fn timeout(&self) -> Duration {
        (self.scheduler.lease / 3).max(Duration::from_millis(1))
    }

    pub(super) async fn run(mut self) {
        self.wake_ups = self.scheduler.store.wake_ups();
        loop {
            while let Some(done) = self.in_flight.try_join_next_with_id() {
                self.forget(done);
            }
            self.housekeeping().await;
            self.learn();
            self.release_closed().await;
            let round = if self.pending.is_empty() {
                self.claim().await
            } else {
                Round::Busy
            };
            if !self.start_pending().await {
                break;
            }
            let wake = self.wake_at(round).await;
            if !self.idle_until(wake).await {
                break;
            }
        }
        self.shut_down().await;
    }

    /// Prunes by the retention and counts the backlog, when either is due.
    async fn housekeeping(&mut self) {
        let store = &*self.scheduler.store;
        if let Some((retention, every)) = &self.scheduler.retention
            && self.pruned_at.is_none_or(|at| at.elapsed() >= *every)
        {
            self.pruned_at = Some(Instant::now());
            match retention
                .prune_as(store, self.scheduler.clock.now(), "scheduler")
                .await
            {
                Ok(pruned) => {
                    self.health.ok();
                    if pruned.total() > 0 {
                        tracing::info!(
                            by_age = pruned.by_age,
                            by_count = pruned.by_count,
                            "pruned the dead-letter records beyond the retention"
                        );
                    }
                }
                Err(e) => self.health.failed("prune", &e),
            }
        }
        if let Some((every, repair)) = self.scheduler.counts_check
            && self.counts_checked_at.elapsed() >= every
            && self
                .counts_check
                .as_ref()
                .is_none_or(JoinHandle::is_finished)
        {
            self.counts_checked_at = Instant::now();
            self.counts_check = Some(tokio::spawn(check_counts(
                Arc::clone(&self.scheduler.store),
                repair,
                self.health.clone(),
                self.scheduler.listener.clone(),
            )));
        }
        let listener = &self.scheduler.listener;
        if listener.is_set()
            && self
                .backlog_at
                .is_none_or(|at| at.elapsed() >= self.scheduler.backlog_every)
        {
            self.backlog_at = Some(Instant::now());
            let timeout = (self.scheduler.lease / 3).max(Duration::from_millis(1));
            match bounded_call(timeout, store.counts(std::time::UNIX_EPOCH)).await {
                Ok(counts) => {
                    self.health.ok();
                    listener.emit(|| Event::Backlog {
                        deferred: counts.deferred,
                    });
                }
                Err(e) => self.health.failed("count", &e),
            }
        }
    }

    /// When a prune or a count of the backlog is due next, if either is kept.
    fn housekeeping_at(&self) -> Option<Instant> {
        let s = &self.scheduler;
        let prune = s
            .retention
            .as_ref()
            .and_then(|(_, every)| self.pruned_at.map(|at| at + *every));
        let count = s
            .listener
            .is_set()
            .then(|| self.backlog_at.map(|at| at + s.backlog_every))
            .flatten();
        let check = s
            .counts_check
            .map(|(every, _)| self.counts_checked_at + every);
        prune.into_iter().chain(count).chain(check).min()
    }

    /// Releases the records held for a breaker that closed (see
    /// [`Scheduler::watch_breakers`]): those this scheduler put back, and those the stack's
    /// dead-letter layers deferred to its half-open time (class `circuit_open`, naming it); each
    /// is made due now, unless it changed meanwhile.
    async fn release_closed(&mut self) {
        let Some(breakers) = &self.scheduler.breakers else {
            return;
        };
        if self.watched_at.is_some_and(|at| at.elapsed() < WATCH_EVERY) {
            return;
        }
        self.watched_at = Some(Instant::now());
        let report = breakers.report();
        let mut closed: Vec<String> = Vec::new();
        for b in &report.breakers {
            let shut = matches!(b.state, State::Closed | State::Disabled);
            let was = self.breaker_states.insert(b.name.clone(), b.state);
            let reopened = was.is_some_and(|w| !matches!(w, State::Closed | State::Disabled));
            if shut && (reopened || self.holds.holding().contains(&b.name.as_str())) {
                closed.push(b.name.clone());
            }
        }
        for name in closed {
            let held = self.holds.release(&name);
            let (store, now) = (
                Arc::clone(&self.scheduler.store),
                self.scheduler.clock.now(),
            );
            // On a task of its own: the loop goes on claiming (what is released comes due).
            let (timeout, health) = (self.timeout(), self.health.clone());
            tokio::spawn(release(store, name, held, now, timeout, health));
        }
    }

    /// Takes in what the re-sends in flight reported.
    fn learn(&mut self) {
        while let Ok(report) = self.reports.try_recv() {
            self.holds.learn(report, self.scheduler.rate);
        }
    }

    /// Whether there is room to claim: nothing in flight, or at least half the concurrency
    /// free. A busy scheduler claims a batch each time half its re-sends ended, not a record
    /// each time one ends (a store round trip per re-send).
    fn room_to_claim(&self) -> bool {
        let (in_flight, concurrency) = (self.in_flight.len(), self.scheduler.concurrency);
        in_flight == 0 || concurrency.saturating_sub(in_flight) >= concurrency.div_ceil(2)
    }

    /// Claims as many due records as there is room for: at most the free concurrency, and at
    /// most what the rate sends in a third of the lease, so that no claim waits out its lease
    /// for its turn; nothing while less than half the concurrency is free
    /// ([`room_to_claim`](Self::room_to_claim)).
    async fn claim(&mut self) -> Round {
        if !self.room_to_claim() {
            return Round::Busy;
        }
        let s = &self.scheduler;
        let free = s.concurrency.saturating_sub(self.in_flight.len());
        let rate = f64::from(s.fleet_rate.unwrap_or(s.rate));
        // At least one; `as` saturates a float that does not fit.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let in_a_third = (rate * s.lease.as_secs_f64() / 3.0).ceil().max(1.0) as usize;
        let limit = free.min(in_a_third);
        let (store, clock, lease) = (Arc::clone(&s.store), s.clock, s.lease);
        let (claims, timeout) = (Arc::clone(&self.claims), self.timeout());
        // A claim and the look at the claims under way are one step for the re-sends that
        // look for a newer claim of their record (one this scheduler took again).
        let claiming = claims.claiming().await;
        let due = bounded_call(timeout, store.claim_due(clock.now(), limit, lease));
        match due.await {
            Ok(due) => {
                self.health.ok();
                self.claims_failed = 0;
                let full = due.len() >= limit;
                let due = self.claims.take_over(due);
                drop(claiming);
                let claimed = Instant::now();
                self.pending.extend(due.into_iter().map(|r| (r, claimed)));
                // A full batch: more may be due now, even when all of it is held (another
                // breaker's records wait behind an open one's backlog).
                if full { Round::Full } else { Round::Partial }
            }
            Err(e) => {
                self.health.failed("claim", &e);
                self.claims_failed = self.claims_failed.saturating_add(1);
                Round::Failed
            }
        }
    }

    /// Holds or starts each claimed record, at the pace; `false` when asked to stop meanwhile.
    async fn start_pending(&mut self) -> bool {
        while let Some((record, claimed)) = self.pending.pop_front() {
            if self.in_flight.len() >= self.scheduler.concurrency {
                self.pending.push_front((record, claimed));
                return true;
            }
            self.learn();
            let now = self.scheduler.clock.now();
            if let Some(until) = self.holds.hold(&record, now, self.scheduler.poll) {
                let s = &self.scheduler;
                let write = Writes::new(&*s.store, &self.health, &s.clock, self.timeout());
                hold(&write, &record, until).await;
                continue;
            }
            let at = self
                .pace
                .reserve(
                    &*self.scheduler.store,
                    &self.scheduler.clock,
                    &mut self.health,
                )
                .await;
            if !until_or_stop(&mut self.stop, at).await {
                self.holds.not_sent(record.breaker.as_deref());
                self.pending.push_front((record, claimed));
                return false;
            }
            let breaker = record.breaker.clone();
            if !self.start(record, claimed).await {
                self.holds.not_sent(breaker.as_deref());
            }
        }
        true
    }

    /// When to look at the store again: at once after a full batch; else at the earliest due
    /// time the store knows, at most a poll away.
    async fn wake_at(&mut self, round: Round) -> Instant {
        let now = Instant::now();
        let poll = now + self.scheduler.poll;
        if round == Round::Full && self.pending.is_empty() {
            return now;
        }
        if round == Round::Failed {
            // Backing off while the store fails, instead of a claim every poll.
            // No later than the next prune or count, which go on meanwhile.
            let cap = self.scheduler.poll.max(CLAIM_BACKOFF_CAP);
            let backoff = now + store_retry(self.claims_failed, self.scheduler.poll, cap);
            return self
                .housekeeping_at()
                .map_or(backoff, |at| at.max(now).min(backoff));
        }
        // While records are held for a breaker that may close, look again soon.
        let watching = self.breaker_states.values().any(|s| *s != State::Closed);
        let poll = if self.scheduler.breakers.is_some()
            && (watching || !self.holds.holding().is_empty())
        {
            poll.min(now + WATCH_EVERY)
        } else {
            poll
        };
        if round != Round::Partial {
            return poll;
        }
        match bounded_call(self.timeout(), self.scheduler.store.next_due()).await {
            Ok(next) => {
                self.health.ok();
                let Some(next) = next else {
                    return poll;
                };
                let clock = self.scheduler.clock.now();
                let wait = next.duration_since(clock).unwrap_or(Duration::ZERO);
                (now + wait.max(MIN_SLEEP)).min(poll)
            }
            Err(e) => {
                self.health.failed("next_due", &e);
                poll
            }
        }
    }

    /// Sleeps until `wake`, or until a re-send ends while the scheduler waits for room;
    /// `false` when asked to stop meanwhile.
    async fn idle_until(&mut self, wake: Instant) -> bool {
        let waiting_for_room = !self.pending.is_empty() || !self.room_to_claim();
        let in_flight = waiting_for_room.then_some(&mut self.in_flight);
        let woken = self.wake_ups.as_mut();
        let (going, done) = until_or_stop_or_done(&mut self.stop, wake, in_flight, woken).await;
        if let Some(done) = done {
            self.forget(done);
        }
        going
    }

    /// A re-send's task ended: its claim is no longer the scheduler's to give back.
    fn forget(&mut self, done: Result<(Id, ()), JoinError>) {
        match done {
            Ok((id, ())) => {
                // The re-send let its claim go itself.
                self.leases.remove(&id);
            }
            Err(e) => {
                let lease = self.leases.remove(&e.id());
                if let Some(lease) = &lease {
                    self.claims.release(&lease.id);
                }
                if !e.is_cancelled() {
                    let id = lease.map(|l| l.id);
                    tracing::error!(error = %e, id = ?id, "dead-letter re-send task failed; its claim ends at its lease");
                }
            }
        }
    }

    /// Starts the re-send of a claimed record; whether it was started (false: dead-lettered
    /// instead).
    async fn start(&mut self, record: Record, claimed: Instant) -> bool {
        let Some(lease) = record.lease() else {
            tracing::error!(id = %record.id, status = %record.status, "a claimed record is not in flight; not sent");
            return false;
        };
        if record.resends > self.scheduler.max_resends {
            tracing::warn!(
                id = %record.id,
                resends = record.resends - 1,
                "re-sent as often as allowed; dead-lettered"
            );
            let s = &self.scheduler;
            let write = Writes::new(&*s.store, &self.health, &s.clock, self.timeout());
            dead(&write, &lease, "re-sent as often as allowed").await;
            return false;
        }
        let rebuilt = (self.scheduler.rebuild)(&record).map_err(|e| e.to_string());
        let request = match rebuilt {
            Ok(request) => request,
            Err(e) => {
                tracing::error!(id = %record.id, error = %e, "cannot rebuild the request; dead-lettered");
                let s = &self.scheduler;
                let write = Writes::new(&*s.store, &self.health, &s.clock, self.timeout());
                dead(&write, &lease, "cannot rebuild the request").await;
                return false;
            }
        };
        let task = ReSend {
            store: Arc::clone(&self.scheduler.store),
            service: self.scheduler.service.clone(),
            record,
            lease: lease.clone(),
            length: self.scheduler.lease,
            claimed,
            clock: self.scheduler.clock,
            recheck: self.scheduler.poll.saturating_mul(10),
            listener: self.scheduler.listener.clone(),
            report: self.report.clone(),
            claims: Arc::clone(&self.claims),
            health: self.health.clone(),
        };
        self.claims.hold(&lease);
        let handle = self.in_flight.spawn(task.run(request));
        self.leases.insert(handle.id(), lease);
        true
    }

    /// Gives back what is claimed and unfinished: the records not started at once, those in
    /// flight once they end or the shutdown's bound passes.
    async fn shut_down(mut self) {
        // A recount cut short writes nothing (its repair is one transaction or script).
        if let Some(check) = self.counts_check.take() {
            check.abort();
        }
        let bound = (*self.stop.borrow()).unwrap_or(super::DEFAULT_SHUTDOWN_WITHIN);
        let store = Arc::clone(&self.scheduler.store);
        let clock = self.scheduler.clock;
        let health = self.health.clone();
        // One try each: a store that fails ends these claims at their lease.
        let write = Writes::new(&*store, &health, &clock, self.timeout()).once();
        for (record, _) in std::mem::take(&mut self.pending) {
            if let Some(lease) = record.lease() {
                let retry_at = clock.now();
                give_back(&write, &lease, Change::Held { retry_at }).await;
            }
        }
        let deadline = Instant::now() + bound;
        while let Ok(Some(done)) =
            tokio::time::timeout_at(deadline, self.in_flight.join_next_with_id()).await
        {
            self.forget(done);
        }
        if self.in_flight.is_empty() {
            return;
        }
        tracing::warn!(
            unfinished = self.in_flight.len(),
            waited = ?bound,
            "dead-letter scheduler shutting down with re-sends still in flight: stopped, their \
             claims given back"
        );
        self.in_flight.abort_all();
        while let Some(done) = self.in_flight.join_next_with_id().await {
            let id = match &done {
                Ok((id, ())) => *id,
                Err(e) => e.id(),
            };
            if let Some(lease) = self.leases.remove(&id)
                && done.is_err()
            {
                // The newest claim of the record, and the outcome its re-send was writing: a
                // re-send delivered is resolved, not given back to be sent again.
                let (lease, outcome) = self.claims.current(&lease.id).unwrap_or((lease, None));
                self.claims.release(&lease.id);
                let change = match outcome {
                    Some(change @ (Change::Resolved { .. } | Change::Dead)) => change,
                    _ => Change::Released {
                        retry_at: clock.now(),
                    },
                };
                give_back(&write, &lease, change).await;
            }
        }
    }
}

/// One re-send, on its own task.
struct ReSend<S> {
    store: Arc<dyn Store>,
    service: S,
    record: Record,
    lease: Lease,
    /// The length of the lease, for its renewals.
    length: Duration,
    claimed: Instant,
    clock: crate::clock::Clock,
    /// How long to hold a record a breaker forced open rejected (it names no half-open time).
    recheck: Duration,
    listener: Hook,
    report: mpsc::UnboundedSender<Report>,
    /// The scheduler's claims under way.
    claims: Arc<Claims>,
    health: Health,
}

impl<S> ReSend<S> {
    async fn run<Req>(mut self, request: Req)
    where
        S: Service<Req>,
        S::Error: Into<Failure<S::Response>>,
    {
        let store = &*self.store;
        let (id, clock) = (self.record.id.clone(), self.clock);
        let mut held = Held::new(store, self.lease, self.length, self.claimed, clock)
            .of_scheduler(Arc::clone(&self.claims), self.health.clone());
        let (outcome, rejected) =
            resend(&mut self.service, &self.record, request, &mut held, &clock).await;
        let timeout = (self.length / 3).max(Duration::from_millis(1));
        let write = Writes::new(store, &self.health, &clock, timeout).until(held.lease().until);
        let lease = held.lease().clone();
        let breaker = self.record.breaker.clone();
        let resent = |outcome| Event::Resent { id: &id, outcome };
        let report = match (&outcome, rejected) {
            (_, Some(rejected)) if rejected.paced => {
                // The breaker's send rate held it back until its slot: nothing new was sent.
                // Put back until then; the scheduler drains no faster than the provider's rate.
                let left = rejected.half_opens_in.unwrap_or(self.recheck);
                let until = add_clamped(clock.now(), left);
                tracing::debug!(id = %id, breaker = %rejected.breaker, "scheduled re-send held back by the send rate");
                let outcome = if rejected.reached { "failed" } else { "held" };
                self.listener.emit_ref(&resent(outcome));
                if rejected.written {
                    put_back(&write, &self.record, &lease, until).await;
                }
                Report::NotSent { breaker }
            }
            (_, Some(rejected)) => {
                // Nothing reached the provider: give the claim back.
                let left = rejected.half_opens_in.unwrap_or(self.recheck);
                let until = add_clamped(clock.now(), left);
                tracing::debug!(
                    id = %id,
                    breaker = %rejected.breaker,
                    "scheduled re-send rejected by an open breaker; held"
                );
                // Held when nothing was sent; a re-send that reached the provider and
                // failed before a retry met the breaker failed, though it is put back.
                let outcome = if rejected.reached { "failed" } else { "held" };
                self.listener.emit_ref(&resent(outcome));
                if rejected.written {
                    put_back(&write, &self.record, &lease, until).await;
                }
                Report::Open {
                    breaker: rejected.breaker,
                    until,
                    cause: rejected.cause,
                    id: id.clone(),
                }
            }
            (Outcome::Resolved { .. }, None) => {
                self.listener.emit_ref(&resent("delivered"));
                tracing::info!(id = %id, "scheduled re-send succeeded");
                Report::Delivered { breaker }
            }
            (Outcome::Skipped { reason, .. }, None) => {
                tracing::info!(id = %id, reason = %reason, "scheduled re-send not sent");
                Report::NotSent { breaker }
            }
            (other, None) => {
                self.listener.emit_ref(&resent("failed"));
                tracing::warn!(id = %id, outcome = ?other, "scheduled re-send failed");
                Report::Failed { breaker }
            }
        };
        self.claims.release(&id);
        let _ = self.report.send(report);
    }
}

/// How the loop and the re-sends write what ends a claim: each try bounded, and tried again
/// while the store fails, backing off (100 ms, doubling, at most 5 s, equal jitter), until the
/// claim's lease ends (after which the record is due again anyway, and looked at afresh), or
/// once.
struct Writes<'a> {
    store: &'a dyn Store,
    health: &'a Health,
    clock: &'a crate::clock::Clock,
    /// The bound on each try.
    timeout: Duration,
    /// Tried until then instead of the lease's end.
    until: Option<SystemTime>,
    once: bool,
}

impl<'a> Writes<'a> {
    fn new(
        store: &'a dyn Store,
        health: &'a Health,
        clock: &'a crate::clock::Clock,
        timeout: Duration,
    ) -> Self {
        Writes {
            store,
            health,
            clock,
            timeout,
            until: None,
            once: false,
        }
    }

    /// Tried until `until`.
    fn until(mut self, until: SystemTime) -> Self {
        self.until = Some(until);
        self
    }

    /// Tried once.
    fn once(mut self) -> Self {
        self.once = true;
        self
    }

    /// `write` on the record of `lease`, tried again while the store fails.
    async fn write<T, W: Future<Output = Result<T, StoreError>>>(
        &self,
        lease: &Lease,
        mut write: impl FnMut(&'a dyn Store) -> W,
    ) -> Result<T, StoreError> {
        let until = self.until.unwrap_or(lease.until);
        let mut failed = 0;
        loop {
            match bounded_call(self.timeout, write(self.store)).await {
                Ok(done) => {
                    self.health.ok();
                    return Ok(done);
                }
                Err(e) => {
                    self.health.failed_on("update", Some(&lease.id), &e);
                    failed += 1;
                    let wait = store_retry(failed, Duration::from_millis(100), CLAIM_BACKOFF_CAP);
                    if self.once || add_clamped(self.clock.now(), wait) >= until {
                        return Err(e);
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// Dead-letters a claimed record the scheduler will not send, if the claim still holds.
async fn dead(write: &Writes<'_>, lease: &Lease, why: &str) {
    match write
        .write(lease, |s| s.change_claimed(lease, Change::Dead))
        .await
    {
        Ok(Claim::Claimed(_)) => {}
        Ok(_) => {
            tracing::info!(id = %lease.id, why, "claim ended before the record was dead-lettered; left as it is")
        }
        Err(e) => {
            tracing::error!(id = %lease.id, error = %e, "cannot dead-letter the record: its claim ends at its lease, and it is looked at again");
        }
    }
}

/// Puts a claimed record back, unsent, deferred to `until` ([`Change::Held`]), if the claim
/// still holds.
async fn hold(write: &Writes<'_>, claimed: &Record, until: SystemTime) {
    tracing::debug!(id = %claimed.id, breaker = ?claimed.breaker, until = %humantime::format_rfc3339_millis(until), "breaker open; record held");
    match claimed.lease() {
        Some(lease) => give_back(write, &lease, Change::Held { retry_at: until }).await,
        None => tracing::error!(id = %claimed.id, "a claimed record is not in flight; not held"),
    }
}

/// Gives the claim `lease` back with `change`, if it still holds.
async fn give_back(write: &Writes<'_>, lease: &Lease, change: Change) {
    let given = write
        .write(lease, |s| s.change_claimed(lease, change))
        .await;
    if let Err(e) = given {
        // The claim ends at its lease, when the record is due again.
        tracing::error!(id = %lease.id, error = %e, "cannot give a claim back: it ends at its lease");
    }
}

/// After a local rejection of a claimed record, written under its claim: gives the claim's
/// re-send back, deferred to `until`, whatever the stack's dead-letter layer wrote (deferred, or
/// dead when the breaker was forced open), as long as no one else changed it since.
async fn put_back(write: &Writes<'_>, claimed: &Record, lease: &Lease, until: SystemTime) {
    let put = write
        .write(lease, |store| async move {
            match store.get(&claimed.id).await? {
                Some(current)
                    if current.resends == claimed.resends && current.status != Status::Resolved =>
                {
                    store
                        .change_if_unchanged(&current, Change::Held { retry_at: until })
                        .await
                        .map(Some)
                }
                _ => Ok(None),
            }
        })
        .await;
    if let Err(e) = put {
        tracing::error!(id = %claimed.id, error = %e, "cannot put a held record back");
    }
}

/// Sleeps until `at`; `false` when a stop is asked for first.
async fn until_or_stop(stop: &mut watch::Receiver<Option<Duration>>, at: Instant) -> bool {
    until_or_stop_or_done(stop, at, None, None).await.0
}

/// Sleeps until `at`, or until a task of `in_flight` ends (when given); `false` when a stop is
/// asked for first. The task that ended, if one did.
async fn until_or_stop_or_done(
    stop: &mut watch::Receiver<Option<Duration>>,
    at: Instant,
    mut in_flight: Option<&mut JoinSet<()>>,
    woken: Option<&mut watch::Receiver<u64>>,
) -> (bool, Option<Result<(Id, ()), JoinError>>) {
    if stop.borrow().is_some() {
        return (false, None);
    }
    let mut stopped = pin!(stop_asked(stop));
    let mut sleep = pin!(tokio::time::sleep_until(at));
    // A wake-up the store pushed: a record may be due sooner than the store said.
    let mut woken = pin!(async move {
        let changed = match woken {
            Some(woken) => woken.changed().await.is_ok(),
            None => false,
        };
        if !changed {
            std::future::pending::<()>().await;
        }
    });
    poll_fn(|cx| {
        if stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready((false, None));
        }
        if let Some(set) = in_flight.as_deref_mut()
            && let Poll::Ready(Some(done)) = set.poll_join_next_with_id(cx)
        {
            return Poll::Ready((true, Some(done)));
        }
        if sleep.as_mut().poll(cx).is_ready() || woken.as_mut().poll(cx).is_ready() {
            return Poll::Ready((true, None));
        }
        Poll::Pending
    })
    .await
}

/// Ends when a stop is asked for; never, when the handle was dropped without one.
async fn stop_asked(stop: &mut watch::Receiver<Option<Duration>>) {
    while stop.borrow_and_update().is_none() {
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Recounts the store's records against its counters ([`Store::check_counts`]) and tells what
/// it found: an [`Event::CountsChecked`], a `WARN` when a counter drifted, a store error when
/// the check failed.
async fn check_counts(store: Arc<dyn Store>, repair: bool, health: Health, listener: Hook) {
    match store.check_counts(repair).await {
        Ok(check) => {
            health.ok();
            let (keys, repaired) = (check.keys, check.repaired);
            let drifted = check.drifts.len() as u64;
            listener.emit(|| Event::CountsChecked {
                keys,
                drifted,
                repaired,
            });
            match check.drifts.first() {
                None => tracing::debug!(keys, "dead-letter store counts agree with the records"),
                Some(first) => tracing::warn!(
                    keys,
                    drifted,
                    repaired,
                    status = %first.status,
                    class = first.class.as_deref().unwrap_or("*"),
                    code = first.code.as_deref().unwrap_or("*"),
                    expected = first.expected,
                    found = first.found,
                    "dead-letter store counts drifted from the records (the first key shown); \
                     something wrote the store behind its back"
                ),
            }
        }
        Err(e) => health.failed("check_counts", &e),
    }
}
