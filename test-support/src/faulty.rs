//! A store that fails, hangs or answers slowly on command: [`FaultyStore`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tower_backstop_store::{
    AuditEntry, BoxFuture, Change, Claim, Counts, CountsCheck, Filter, FleetNote, Lease, Record,
    SortKey, Store, StoreError,
};

/// How a [`FaultyStore`] answers an operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// As the store it wraps: the operation is passed on, made when it is called.
    #[default]
    Answer,
    /// At once, with a [`StoreError`] (`the store is down`); nothing is passed on.
    Fail,
    /// Not at all while the operation's fault stays `Hang`: the operation is passed on only
    /// once its fault changes, and then as that fault says (a hung database that comes back,
    /// or a caller that gave up first and dropped the future, with nothing written).
    Hang,
    /// After this long on tokio's clock (a paused test clock advances through it), then as
    /// [`Answer`](Fault::Answer): the operation is passed on only after the wait.
    Slow(Duration),
    /// Passed on at once, on a task of its own, and answered only after this long on tokio's
    /// clock: a slow store whose write lands although the caller gave up waiting for it.
    Late(Duration),
}

/// The operations of [`Store`], each of which a [`FaultyStore`] can fault on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Op {
    PutMany,
    Put,
    Get,
    Search,
    Count,
    SearchWaiting,
    SearchAfter,
    SearchWaitingAfter,
    List,
    Counts,
    CountByClass,
    CheckCounts,
    Update,
    ClaimDue,
    Delete,
    Claim,
    ChangeIfUnchanged,
    ChangeClaimed,
    ChangeClaimedMany,
    PutClaimed,
    NextDue,
    ReserveSlot,
    AppendAudit,
    Audit,
    BudgetSpent,
    PutNote,
    Notes,
    ReleaseHeld,
}

impl Op {
    /// The operations that write a record: puts, updates, claims and changes.
    pub const WRITES: &'static [Op] = &[
        Op::PutMany,
        Op::Put,
        Op::Update,
        Op::Claim,
        Op::ChangeIfUnchanged,
        Op::ChangeClaimed,
        Op::ChangeClaimedMany,
        Op::PutClaimed,
        Op::ReleaseHeld,
    ];
}

/// Which fault each operation has: one for all, and some of their own.
#[derive(Clone, Debug, Default)]
struct Faults {
    all: Fault,
    each: HashMap<Op, Fault>,
}

impl Faults {
    fn of(&self, op: Op) -> Fault {
        self.each.get(&op).copied().unwrap_or(self.all)
    }
}

/// What runs just before the next call of an operation, given the id it names (`""` for an
/// operation that names none).
type Hook = Box<dyn FnOnce(&str) -> BoxFuture<'static, ()> + Send>;

/// A [`Store`] over any other that fails, hangs or answers slowly on command, per operation or
/// for all of them ([`Fault`]), and counts the calls of each operation: a database that
/// restarts, a pool that waits for a connection, a network that drops. Clones share the
/// faults and the counts; every operation, default methods included, is passed on to the inner
/// store's own (its wake-ups too).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use backstop_test_support::{Fault, FaultyStore, Op};
/// use tower_backstop_store::{MemoryStore, Store};
///
/// let store = FaultyStore::new(Arc::new(MemoryStore::new()));
/// store.set(Fault::Fail);
/// assert!(store.get("m-1").await.is_err());
/// store.set(Fault::Answer);
/// store.set_for(Op::Get, Fault::Hang);
/// assert!(tokio::time::timeout(std::time::Duration::from_secs(1), store.get("m-1")).await.is_err());
/// assert_eq!(store.calls(Op::Get), 2);
/// # }
/// ```
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: watch::Sender<Faults>,
    hooks: Arc<Mutex<HashMap<Op, Hook>>>,
    calls: Arc<Mutex<HashMap<Op, Arc<AtomicU64>>>>,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("faults", &*self.faults.borrow())
            .finish_non_exhaustive()
    }
}

impl FaultyStore {
    /// `inner`, answering every operation until told otherwise.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            faults: watch::Sender::new(Faults::default()),
            hooks: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// The store it wraps, without faults.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// Every operation answers as `fault` says, from now on (the operations given a fault of
    /// their own too: it is cleared). Hung calls waiting are released to it.
    pub fn set(&self, fault: Fault) {
        self.faults.send_modify(|f| {
            f.all = fault;
            f.each.clear();
        });
    }

    /// `op` answers as `fault` says, from now on, whatever the others do.
    pub fn set_for(&self, op: Op, fault: Fault) {
        self.faults.send_modify(|f| {
            f.each.insert(op, fault);
        });
    }

    /// Each of `ops` answers as `fault` says ([`set_for`](Self::set_for)).
    pub fn set_for_each(&self, ops: &[Op], fault: Fault) {
        self.faults.send_modify(|f| {
            for op in ops {
                f.each.insert(*op, fault);
            }
        });
    }

    /// The fault `op` has now.
    pub fn fault(&self, op: Op) -> Fault {
        self.faults.borrow().of(op)
    }

    /// Runs `hook` just before the next call of `op` is passed on, with the id that call names
    /// (`""` when it names none): someone else changing a record between two calls of a
    /// claimer, say. Once.
    pub fn before_next(
        &self,
        op: Op,
        hook: impl FnOnce(&str) -> BoxFuture<'static, ()> + Send + 'static,
    ) {
        self.hooks.lock().unwrap().insert(op, Box::new(hook));
    }

    /// How many times `op` was called, whatever it answered.
    pub fn calls(&self, op: Op) -> u64 {
        self.counter(op).load(Ordering::SeqCst)
    }

    fn counter(&self, op: Op) -> Arc<AtomicU64> {
        Arc::clone(self.calls.lock().unwrap().entry(op).or_default())
    }

    /// `op` (naming `id`), made with `call` on the inner store as its fault says.
    fn run<T: Send + 'static>(
        &self,
        op: Op,
        id: &str,
        call: impl FnOnce(&dyn Store) -> BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.counter(op).fetch_add(1, Ordering::SeqCst);
        let hook = self.hooks.lock().unwrap().remove(&op);
        let fault = self.faults.borrow().of(op);
        if hook.is_none() && fault == Fault::Answer {
            return call(&*self.inner);
        }
        let hooked = hook.map(|hook| hook(id));
        let inner = Arc::clone(&self.inner);
        let mut faults = self.faults.subscribe();
        Box::pin(async move {
            if let Some(hooked) = hooked {
                hooked.await;
            }
            loop {
                let fault = faults.borrow_and_update().of(op);
                match fault {
                    Fault::Answer => return call(&*inner).await,
                    Fault::Fail => return Err(StoreError::new("the store is down")),
                    Fault::Slow(wait) => {
                        tokio::time::sleep(wait).await;
                        return call(&*inner).await;
                    }
                    Fault::Late(wait) => {
                        let landing = tokio::spawn(call(&*inner));
                        tokio::time::sleep(wait).await;
                        return landing.await.unwrap_or_else(|e| {
                            Err(StoreError::with_source("the store's write panicked", e))
                        });
                    }
                    Fault::Hang => {
                        if faults.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            }
        })
    }
}

impl Store for FaultyStore {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(Op::PutMany, "", move |s| s.put_many(records))
    }
    fn put(&self, record: Record) -> BoxFuture<'static, Result<(), StoreError>> {
        let id = record.id.clone();
        self.run(Op::Put, &id, move |s| s.put(record))
    }
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let owned = id.to_owned();
        self.run(Op::Get, id, move |s| s.get(&owned))
    }
    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let filter = filter.clone();
        self.run(Op::Search, "", move |s| s.search(&filter, page))
    }
    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.run(Op::Count, "", move |s| s.count(&filter))
    }
    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let filter = filter.clone();
        self.run(Op::SearchWaiting, "", move |s| {
            s.search_waiting(&filter, page)
        })
    }
    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (filter, after) = (filter.clone(), after.cloned());
        self.run(Op::SearchAfter, "", move |s| {
            s.search_after(&filter, after.as_ref(), limit)
        })
    }
    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let (filter, after) = (filter.clone(), after.cloned());
        self.run(Op::SearchWaitingAfter, "", move |s| {
            s.search_waiting_after(&filter, after.as_ref(), limit)
        })
    }
    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.run(Op::List, "", move |s| s.list(limit))
    }
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.run(Op::Counts, "", move |s| s.counts(since))
    }
    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        self.run(Op::CountByClass, "", |s| s.count_by_class())
    }
    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        self.run(Op::CheckCounts, "", move |s| s.check_counts(repair))
    }
    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let owned = id.to_owned();
        self.run(Op::Update, id, move |s| s.update(&owned, change))
    }
    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.run(Op::ClaimDue, "", move |s| s.claim_due(now, limit, lease))
    }
    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let filter = filter.clone();
        self.run(Op::Delete, "", move |s| s.delete(&filter))
    }
    fn claim(
        &self,
        seen: &Record,
        until: SystemTime,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let seen = seen.clone();
        self.run(Op::Claim, &seen.id.clone(), move |s| s.claim(&seen, until))
    }
    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let seen = seen.clone();
        self.run(Op::ChangeIfUnchanged, &seen.id.clone(), move |s| {
            s.change_if_unchanged(&seen, change)
        })
    }
    fn change_claimed(
        &self,
        lease: &Lease,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let lease = lease.clone();
        self.run(Op::ChangeClaimed, &lease.id.clone(), move |s| {
            s.change_claimed(&lease, change)
        })
    }
    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        self.run(Op::ChangeClaimedMany, "", move |s| {
            s.change_claimed_many(changes)
        })
    }
    fn applies_batches(&self) -> bool {
        self.inner.applies_batches()
    }
    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let breaker = breaker.to_owned();
        self.run(Op::ReleaseHeld, "", move |s| s.release_held(&breaker, now))
    }
    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let lease = lease.clone();
        self.run(Op::PutClaimed, &lease.id.clone(), move |s| {
            s.put_claimed(&lease, record)
        })
    }
    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.run(Op::NextDue, "", |s| s.next_due())
    }
    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        let schedule = schedule.to_owned();
        self.run(Op::ReserveSlot, "", move |s| {
            s.reserve_slot(&schedule, gap, now)
        })
    }
    fn wake_ups(&self) -> Option<watch::Receiver<u64>> {
        self.inner.wake_ups()
    }
    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(Op::PutNote, "", move |s| s.put_note(note))
    }
    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        self.run(Op::Notes, "", move |s| s.notes(now))
    }
    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.run(Op::AppendAudit, "", move |s| s.append_audit(entry))
    }
    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.run(Op::Audit, "", move |s| s.audit(page))
    }
    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let owned = id.to_owned();
        self.run(Op::BudgetSpent, id, move |s| s.budget_spent(&owned))
    }
}

/// A store that keeps no fleet notes (the trait's defaults for [`Store::put_note`] and
/// [`Store::notes`], which fail), the rest of it `inner`'s: what a store of another crate
/// that predates the notes looks like.
#[derive(Clone)]
pub struct KeepsNoNotes(pub Arc<dyn Store>);

impl std::fmt::Debug for KeepsNoNotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeepsNoNotes")
    }
}

impl Store for KeepsNoNotes {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        self.0.put_many(records)
    }
    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.0.get(id)
    }
    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.search(filter, page)
    }
    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.0.count(filter)
    }
    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.search_waiting(filter, page)
    }
    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.search_after(filter, after, limit)
    }
    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.search_waiting_after(filter, after, limit)
    }
    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        self.0.check_counts(repair)
    }
    fn list(&self, limit: usize) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.list(limit)
    }
    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        self.0.counts(since)
    }
    fn count_by_class(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        self.0.count_by_class()
    }
    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        self.0.update(id, change)
    }
    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.0.claim_due(now, limit, lease)
    }
    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.0.delete(filter)
    }
    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.0.change_if_unchanged(seen, change)
    }
    fn change_claimed(
        &self,
        lease: &Lease,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.0.change_claimed(lease, change)
    }
    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        self.0.change_claimed_many(changes)
    }
    fn applies_batches(&self) -> bool {
        self.0.applies_batches()
    }
    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.0.put_claimed(lease, record)
    }
    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        self.0.next_due()
    }
    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        self.0.reserve_slot(schedule, gap, now)
    }
    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        self.0.append_audit(entry)
    }
    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        self.0.audit(page)
    }
    fn release_held(
        &self,
        breaker: &str,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.0.release_held(breaker, now)
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        self.0.budget_spent(id)
    }
}
