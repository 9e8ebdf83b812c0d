//! The retry schedule: a task that re-sends deferred records when their retry-at time is due.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tower_service::Service;

use super::redrive::{Outcome, resend};
use crate::clock::Clock;
use crate::failure::Failure;
use crate::store::{Change, Record, Store};

/// Re-sends deferred dead letters when they are due: the retry schedule.
///
/// A record is deferred ([`Status::Deferred`](crate::store::Status::Deferred)) when its failure carried a
/// retry-at time; it sits in the store, indexed by that time (a sorted set in Redis). The
/// scheduler polls the store every [`poll_every`](Scheduler::poll_every) (1 s by default), claims
/// the due records in retry-at order ([`Store::claim_due`], atomic, so that two schedulers on the
/// same store never send the same record while the claim lasts), and re-sends each through the
/// service stack, at most [`concurrency`](Scheduler::concurrency) at a time (8 by default).
///
/// A re-sent record that succeeds becomes [`Resolved`](crate::store::Status::Resolved). One that fails
/// again is written by the stack's dead-letter layer with its new failure: deferred again when
/// the new failure carries a retry-at time, dead otherwise. A record re-sent more than
/// [`max_resends`](Scheduler::max_resends) times (5 by default) is dead-lettered instead of sent.
/// Nothing is lost on a restart: records wait in the store, and a claim held by a scheduler that
/// died ends after the [`lease`](Scheduler::lease) (60 s by default), when another scheduler
/// takes the record (so a record may be sent twice if a scheduler dies mid-call: keep the
/// idempotency key, which re-sends keep).
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
    clock: Clock,
}

impl<S, F> fmt::Debug for Scheduler<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("poll", &self.poll)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("max_resends", &self.max_resends)
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
            clock: Clock::system(),
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

    /// Re-sends per record before the scheduler dead-letters it instead. Default 5.
    pub fn max_resends(mut self, n: u32) -> Self {
        self.max_resends = n;
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
        loop {
            while in_flight.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free > 0 {
                match self
                    .store
                    .claim_due(self.clock.now(), free, self.lease)
                    .await
                {
                    Ok(due) => {
                        for record in due {
                            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                                break;
                            };
                            self.start(record, slot, &mut in_flight).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "dead-letter scheduler cannot claim due records")
                    }
                }
            }
            if tokio::time::timeout(self.poll, stop.notified())
                .await
                .is_ok()
            {
                break;
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    async fn start(
        &mut self,
        record: Record,
        slot: tokio::sync::OwnedSemaphorePermit,
        in_flight: &mut JoinSet<()>,
    ) {
        let store = Arc::clone(&self.store);
        if record.resends > self.max_resends {
            tracing::warn!(
                id = %record.id,
                resends = record.resends - 1,
                "re-sent as often as allowed; dead-lettered"
            );
            if let Err(e) = store.update(&record.id, Change::Dead).await {
                tracing::error!(id = %record.id, error = %e, "cannot dead-letter the record");
            }
            return;
        }
        let rebuilt = (self.rebuild)(&record).map_err(|e| e.to_string());
        let request = match rebuilt {
            Ok(request) => request,
            Err(e) => {
                tracing::error!(id = %record.id, error = %e, "cannot rebuild the request; dead-lettered");
                if let Err(e) = store.update(&record.id, Change::Dead).await {
                    tracing::error!(id = %record.id, error = %e, "cannot dead-letter the record");
                }
                return;
            }
        };
        let mut service = self.service.clone();
        let clock = self.clock;
        in_flight.spawn(async move {
            let outcome = resend(&*store, &mut service, &record, request, None, &clock).await;
            match &outcome {
                Outcome::Resolved { .. } => {
                    tracing::info!(id = %record.id, "scheduled re-send succeeded")
                }
                other => {
                    tracing::warn!(id = %record.id, outcome = ?other, "scheduled re-send failed")
                }
            }
            drop(slot);
        });
    }
}
