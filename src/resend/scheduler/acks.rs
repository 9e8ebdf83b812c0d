//! The scheduler's store, when it applies a batch in one step ([`Store::applies_batches`]),
//! with its writes under a claim gathered into batches: each
//! [`change_claimed`](Store::change_claimed) of the re-sends in flight (a resolution, a claim
//! given back, a renewal) joins the batch being gathered, and a task of its own applies each
//! batch with one [`change_claimed_many`](Store::change_claimed_many) (on SQLite one
//! transaction and one flush of the disk for the whole batch, instead of one per record).
//! Every other call goes to the store as it is.
//!
//! The batches form by themselves: while one is written, the changes that come meanwhile wait
//! and go together in the next (at most [`MAX_BATCH`]). A lone change waits for nothing but the
//! batch already being written.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::store::{
    AuditEntry, BoxFuture, Change, Claim, Counts, CountsCheck, Filter, FleetNote, Lease, Record,
    SortKey, Store, StoreError,
};

/// The most changes applied in one batch.
pub(super) const MAX_BATCH: usize = 100;

type Answer = oneshot::Sender<Result<Claim, StoreError>>;

/// The scheduler's store: `inner`, with `change_claimed` batched.
pub(super) struct Batched {
    inner: Arc<dyn Store>,
    queue: mpsc::UnboundedSender<(Lease, Change, Answer)>,
}

impl Batched {
    /// Wraps `inner` and starts the task that writes the batches (on the current runtime; it
    /// ends when the wrapper is dropped).
    pub(super) fn new(inner: Arc<dyn Store>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_batches(Arc::clone(&inner), rx));
        Batched { inner, queue }
    }
}

async fn write_batches(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<(Lease, Change, Answer)>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Changes whose caller gave up (its bound on the store call passed) are still applied:
        // as a slow store's write that lands, which a caller under a claim already allows for.
        let (changes, answers): (Vec<_>, Vec<_>) = batch
            .drain(..)
            .map(|(lease, change, answer)| ((lease, change), answer))
            .unzip();
        match store.change_claimed_many(changes).await {
            Ok(claims) if claims.len() == answers.len() => {
                for (answer, claim) in answers.into_iter().zip(claims) {
                    let _ = answer.send(Ok(claim));
                }
            }
            Ok(claims) => {
                let e = format!(
                    "the store answered {} of a batch of {} changes",
                    claims.len(),
                    answers.len()
                );
                for answer in answers {
                    let _ = answer.send(Err(StoreError::new(e.clone())));
                }
            }
            Err(e) => {
                let e = e.to_string();
                for answer in answers {
                    let _ = answer.send(Err(StoreError::new(e.clone())));
                }
            }
        }
    }
}

impl Store for Batched {
    fn change_claimed(
        &self,
        lease: &Lease,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let (answer, answered) = oneshot::channel();
        let queued = self.queue.send((lease.clone(), change, answer)).is_ok();
        Box::pin(async move {
            if !queued {
                return Err(StoreError::new("the scheduler's batch writer has stopped"));
            }
            answered.await.unwrap_or_else(|_| {
                Err(StoreError::new("the scheduler's batch writer has stopped"))
            })
        })
    }

    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        self.inner.change_claimed_many(changes)
    }

    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.release_held(breaker, now)
    }

    fn applies_batches(&self) -> bool {
        self.inner.applies_batches()
    }

    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.put_many(records)
    }

    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.put(record)
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.inner.get(id)
    }

    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.search(filter, page)
    }

    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.search_after(filter, after, limit)
    }

    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.search_waiting_after(filter, after, limit)
    }

    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        self.inner.check_counts(repair)
    }

    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.count(filter)
    }

    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.search_waiting(filter, page)
    }

    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.list(limit)
    }

    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.inner.counts(since)
    }

    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        self.inner.count_by_class()
    }

    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.inner.update(id, change)
    }

    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.inner.claim_due(now, limit, lease)
    }

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.delete(filter)
    }

    fn claim(
        &self,
        seen: &Record,
        until: SystemTime,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.claim(seen, until)
    }

    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.change_if_unchanged(seen, change)
    }

    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.put_claimed(lease, record)
    }

    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.inner.next_due()
    }

    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        self.inner.reserve_slot(schedule, gap, now)
    }

    fn wake_ups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.wake_ups()
    }

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.put_note(note)
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.inner.notes(now)
    }

    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.append_audit(entry)
    }

    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.inner.audit(page)
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        self.inner.budget_spent(id)
    }
}
