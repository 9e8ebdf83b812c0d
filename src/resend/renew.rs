//! Keeping a claim while its re-send is in flight: renewed every third of its lease, confirmed
//! before the request goes out, and ended by an outcome that is tried again while the store
//! fails.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::scheduler::Health;
use crate::clock::Clock;
use crate::dead_letter::bounded::{bounded_call, store_retry};
use crate::store::{BoxFuture, Change, Claim, Lease, Record, Store, StoreError, add_clamped};

/// The first wait before a failed store write of a claim is tried again: 100 ms, doubling.
const RETRY_BASE: Duration = Duration::from_millis(100);

/// The longest wait between two tries of a claim's outcome: 5 s, so that a store that comes
/// back is seen within that.
const RETRY_CAP: Duration = Duration::from_secs(5);

/// The claims one scheduler holds, by record id: the newest lease of each record whose re-send
/// is in flight (or whose outcome is being written), and that outcome. A claim that ended while
/// the store was away, and that the same scheduler took again when it came back, is handed to
/// the re-send that holds the record instead of being sent a second time.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    slots: Mutex<HashMap<String, Slot>>,
    /// Written by the scheduler's loop across each claim of due records and its look at the
    /// slots; read by a re-send whose claim was taken before it looks for a newer one.
    claiming: tokio::sync::RwLock<()>,
}

#[derive(Debug)]
struct Slot {
    lease: Lease,
    /// The change that ends the claim, once the re-send knows it (being written).
    outcome: Option<Change>,
}

impl Claims {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().expect("claims poisoned")
    }

    /// A re-send starts under `lease`.
    pub(crate) fn hold(&self, lease: &Lease) {
        self.slots().insert(
            lease.id.clone(),
            Slot {
                lease: lease.clone(),
                outcome: None,
            },
        );
    }

    /// The re-send of `id` ended.
    pub(crate) fn release(&self, id: &str) {
        self.slots().remove(id);
    }

    /// The newest lease of `id` and the outcome being written, if a re-send holds it.
    pub(crate) fn current(&self, id: &str) -> Option<(Lease, Option<Change>)> {
        self.slots()
            .get(id)
            .map(|slot| (slot.lease.clone(), slot.outcome))
    }

    fn note_outcome(&self, id: &str, change: Change) {
        if let Some(slot) = self.slots().get_mut(id) {
            slot.outcome = Some(change);
        }
    }

    /// Keeps the records of `claimed` that no re-send of this scheduler holds; the others'
    /// new claims go to the re-sends that hold them (not sent again). Called under
    /// [`claiming`](Self::claiming).
    pub(crate) fn take_over(&self, claimed: Vec<Record>) -> Vec<Record> {
        let mut slots = self.slots();
        claimed
            .into_iter()
            .filter(|record| {
                let (Some(slot), Some(lease)) = (slots.get_mut(&record.id), record.lease()) else {
                    return true;
                };
                tracing::info!(
                    id = %record.id,
                    "claim ended while the store was away and was taken again by this scheduler, \
                     whose re-send of it is still under way: kept for that re-send, not sent again"
                );
                slot.lease = lease;
                false
            })
            .collect()
    }

    /// Held by the loop across a claim of due records and [`take_over`](Self::take_over).
    pub(crate) async fn claiming(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.claiming.write().await
    }

    /// A newer lease of `lease`'s record this scheduler took meanwhile, once any claim under
    /// way is done.
    async fn newer(&self, lease: &Lease) -> Option<Lease> {
        let _claimed = self.claiming.read().await;
        self.slots()
            .get(&lease.id)
            .map(|slot| slot.lease.clone())
            .filter(|newer| newer.token != lease.token)
    }
}

/// A claim held by a re-send: its [`Lease`], renewed through the store
/// ([`Store::change_claimed`] with [`Change::Renewed`]) every third of `length` while the
/// re-send waits for the stack or the provider, so that the lease can be short and a dead
/// process's claims are taken over soon. Each store call is bounded by a third of the lease.
pub(crate) struct Held<'a> {
    store: &'a dyn Store,
    lease: Lease,
    /// How long each renewal extends the claim (the lease length).
    length: Duration,
    clock: Clock,
    /// When the next renewal is due.
    next: Instant,
    /// Whether a renewal found the claim gone (it expired and another claimer took it).
    lost: bool,
    /// Renewals that failed in a row.
    failed: u32,
    /// The scheduler's claims and store health, for a scheduler's re-send.
    scheduler: Option<(Arc<Claims>, Health)>,
}

impl<'a> Held<'a> {
    /// The claim `lease`, written at `claimed` (now or a little before), `length` long.
    pub(crate) fn new(
        store: &'a dyn Store,
        lease: Lease,
        length: Duration,
        claimed: Instant,
        clock: Clock,
    ) -> Self {
        Held {
            store,
            lease,
            length,
            clock,
            next: claimed + length / 3,
            lost: false,
            failed: 0,
            scheduler: None,
        }
    }

    /// A scheduler's claim: its outcome is tried again until written (a resolution even after
    /// the lease ended, while no one else claimed the record), a claim the scheduler took
    /// again is followed, and the store's failures are told to `health`.
    pub(crate) fn of_scheduler(mut self, claims: Arc<Claims>, health: Health) -> Self {
        self.scheduler = Some((claims, health));
        self
    }

    /// The claim, as last renewed.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The length of the lease.
    pub(crate) fn length(&self) -> Duration {
        self.length
    }

    /// How long each store call may take: a third of the lease.
    fn timeout(&self) -> Duration {
        (self.length / 3).max(Duration::from_millis(1))
    }

    /// Polls `poll` until it is ready, renewing the claim meanwhile. A renewal still on its way
    /// when `poll` is ready is dropped: the write that ends the claim follows. (A poll function
    /// rather than a future: the output type stays the service's own, even for a service whose
    /// future type is opaque.)
    pub(crate) async fn renewing<T>(
        &mut self,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> T {
        let mut renewals = pin!(self.renew_forever());
        poll_fn(|cx| {
            if let Poll::Ready(out) = poll(cx) {
                return Poll::Ready(out);
            }
            let _: Poll<Infallible> = renewals.as_mut().poll(cx);
            Poll::Pending
        })
        .await
    }

    /// Whether the claim still holds now that the request is about to go out: when a renewal is
    /// due (the re-send waited, or its process stalled) it is renewed first, and a claim that
    /// passed to another sender is not sent. While the store cannot be reached, the lease is
    /// trusted until it ends.
    pub(crate) async fn confirm(&mut self) -> bool {
        if self.lost {
            return false;
        }
        if Instant::now() < self.next {
            return true;
        }
        match self.renew().await {
            Some(held) => held,
            None => self.clock.now() < self.lease.until,
        }
    }

    async fn renew_forever(&mut self) -> Infallible {
        loop {
            if self.lost {
                return std::future::pending().await;
            }
            tokio::time::sleep_until(self.next).await;
            self.renew().await;
        }
    }

    /// Renews the claim: `Some(true)` renewed, `Some(false)` the claim is gone, `None` the store
    /// failed (tried again after a backoff of at most a sixth of the lease, past the lease's
    /// end too: a claim no one else took is renewed when the store is back).
    async fn renew(&mut self) -> Option<bool> {
        let until = add_clamped(self.clock.now(), self.length);
        let renewal = self
            .store
            .change_claimed(&self.lease, Change::Renewed { until });
        match bounded_call(self.timeout(), renewal).await {
            Ok(Claim::Claimed(record)) => {
                self.ok();
                self.lease.until = record.retry_at.unwrap_or(until);
                self.next = Instant::now() + self.length / 3;
                self.failed = 0;
                Some(true)
            }
            Ok(Claim::ClaimedElsewhere { status, resends }) => {
                if self.follow().await {
                    self.next = Instant::now() + self.length / 3;
                    return Some(true);
                }
                tracing::info!(
                    id = %self.lease.id,
                    status = %status,
                    resends,
                    "claim ended while its re-send was in flight: another sender took the record"
                );
                self.lost = true;
                Some(false)
            }
            Ok(Claim::Missing) => {
                tracing::info!(id = %self.lease.id, "claimed record deleted while its re-send was in flight");
                self.lost = true;
                Some(false)
            }
            Err(e) => {
                self.failed("renew", &e);
                tracing::debug!(id = %self.lease.id, error = %e, "cannot renew a claim");
                self.failed += 1;
                let cap = (self.length / 6).max(Duration::from_millis(1));
                self.next = Instant::now() + store_retry(self.failed, RETRY_BASE, cap);
                None
            }
        }
    }

    /// Whether this scheduler took the record again after its claim ended (then the claim
    /// followed is that one).
    async fn follow(&mut self) -> bool {
        let Some((claims, _)) = &self.scheduler else {
            return false;
        };
        match claims.newer(&self.lease).await {
            Some(newer) => {
                self.lease = newer;
                true
            }
            None => false,
        }
    }

    fn ok(&self) {
        if let Some((_, health)) = &self.scheduler {
            health.ok();
        }
    }

    fn failed(&self, operation: &'static str, error: &StoreError) {
        if let Some((_, health)) = &self.scheduler {
            health.failed_on(operation, Some(&self.lease.id), error);
        }
    }

    /// Ends the claim with `write` (a change, or a new failure put under the claim; `change`
    /// names it for a scheduler that must give the claim back before it is written), each
    /// try bounded by a third of the lease, tried again while the store fails, backing off
    /// (100 ms, doubling, at most 5 s, equal jitter): until the lease ends, or, for a
    /// scheduler's resolution (`past_lease`), until written or the claim is known lost.
    /// `Err` with the store's last error when it gave up.
    pub(crate) async fn settle(
        &mut self,
        change: Option<Change>,
        past_lease: bool,
        mut write: impl FnMut(&dyn Store, &Lease) -> BoxFuture<'static, Result<Claim, StoreError>>,
    ) -> Result<Claim, StoreError> {
        if let (Some((claims, _)), Some(change)) = (&self.scheduler, change) {
            claims.note_outcome(&self.lease.id, change);
        }
        let mut failed = 0;
        loop {
            let attempt = write(self.store, &self.lease);
            match bounded_call(self.timeout(), attempt).await {
                Ok(Claim::ClaimedElsewhere { .. }) if self.follow().await => {}
                Ok(claim) => {
                    self.ok();
                    return Ok(claim);
                }
                Err(e) => {
                    self.failed("update", &e);
                    let keep_on = (past_lease && self.scheduler.is_some())
                        || self.clock.now() < self.lease.until;
                    if !keep_on {
                        return Err(e);
                    }
                    failed += 1;
                    tracing::debug!(id = %self.lease.id, error = %e, "cannot end a claim yet; trying again");
                    tokio::time::sleep(store_retry(failed, RETRY_BASE, RETRY_CAP)).await;
                }
            }
        }
    }
}
