//! Keeping a claim while its re-send is in flight: renewed every third of its lease, and
//! confirmed before the request goes out.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::store::{Change, Claim, Lease, Store, add_clamped};

/// A claim held by a re-send: its [`Lease`], renewed through the store
/// ([`Store::change_claimed`] with [`Change::Renewed`]) every third of `length` while the
/// re-send waits for the stack or the provider, so that the lease can be short and a dead
/// process's claims are taken over soon.
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
        }
    }

    /// The claim, as last renewed.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
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
    /// failed (tried again after a sixth of the lease).
    async fn renew(&mut self) -> Option<bool> {
        let until = add_clamped(self.clock.now(), self.length);
        let renewed = self
            .store
            .change_claimed(&self.lease, Change::Renewed { until })
            .await;
        match renewed {
            Ok(Claim::Claimed(record)) => {
                self.lease.until = record.retry_at.unwrap_or(until);
                self.next = Instant::now() + self.length / 3;
                Some(true)
            }
            Ok(Claim::ClaimedElsewhere { status, resends }) => {
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
                tracing::debug!(id = %self.lease.id, error = %e, "cannot renew a claim");
                self.next = Instant::now() + (self.length / 6).max(Duration::from_millis(1));
                None
            }
        }
    }
}
