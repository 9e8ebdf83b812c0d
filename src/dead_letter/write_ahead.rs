//! Write-ahead: a request stored before its first attempt, as a claim the call holds, so that a
//! process that dies mid-call leaves it to another scheduler instead of losing it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, Sleep};

use super::layer::Config;
use crate::observe::Event;
use crate::request::Describe;
use crate::store::{
    BoxFuture, Change, Claim, ErrorEntry, Lease, Record, Status, Store, StoreError, add_clamped,
    truncate,
};

/// How long a write-ahead claim lasts unless renewed: 10 s, the same as a scheduler's claims
/// ([`DEFAULT_LEASE`](crate::resend::DEFAULT_LEASE)). The call renews it every third of that
/// while it is out, so a call (its attempts and backoff included) may take longer; what it bounds
/// is how long the request of a process that died waits before a
/// [`Scheduler`](crate::resend::Scheduler) takes it over.
pub const DEFAULT_WRITE_AHEAD_LEASE: Duration = Duration::from_secs(10);

/// The class of a record that was stored before it was sent ([`Record::class`]): not a failure.
/// A dead letter or a failure count never counts it; once sent and failed, the record takes the
/// failure's class.
pub const QUEUED: &str = "queued";

/// The code of a record stored by write-ahead, before the first attempt.
pub(crate) const WRITE_AHEAD: &str = "write-ahead";

/// The code of a record put in the store to be sent later ([`Outbox`](super::Outbox)).
pub(crate) const OUTBOX: &str = "outbox";

/// The record of `request`, stored before it is sent: class [`QUEUED`], code `code`, no attempt
/// and no failure in its history, status `status` with `retry_at` (the end of the write-ahead
/// claim, or when the outbox sends it), described, tagged, redacted and cut as the layer's
/// records are. Its id is the request's ([`Describe::message_id`] or the envelope's), else a
/// generated one.
pub(crate) async fn queued_record<Req: Describe>(
    config: &Config,
    request: Req,
    status: Status,
    retry_at: SystemTime,
    code: &str,
    message: String,
) -> Record {
    let mut envelope = request.describe().await;
    if let Some(tags) = &config.tags {
        envelope.tags.extend(tags(&envelope));
    }
    let id = envelope
        .id
        .clone()
        .unwrap_or_else(super::record::generated_id);
    let now = config.clock.now();
    let mut record = Record::new(id, ErrorEntry::new(now, QUEUED, code, message, 0));
    record.history.clear();
    record.status = status;
    record.retry_at = Some(truncate(retry_at));
    config.fill(&mut record, envelope);
    record
}

/// Stores `copy` (of the request about to be sent) as a claim of `length`, and reads the claim
/// back: the merge with a record of the same id already there decides its fencing token.
///
/// The write waits at most the layer's store timeout, and no later than `deadline` (real time)
/// when one is given (what is left of the caller's wait for the store after the attempt
/// budget's read); not at all when that deadline has passed.
pub(crate) fn store<Req>(
    config: &Arc<Config>,
    copy: Req,
    length: Duration,
    deadline: Option<std::time::Instant>,
) -> Storing
where
    Req: Describe + Send + 'static,
{
    let config = Arc::clone(config);
    Box::pin(async move {
        let bound = deadline.map_or(config.store_timeout, |deadline| {
            deadline.saturating_duration_since(std::time::Instant::now())
        });
        let until = add_clamped(config.clock.now(), length);
        let message = "stored before its first attempt; in flight".to_owned();
        let record =
            queued_record(&config, copy, Status::InFlight, until, WRITE_AHEAD, message).await;
        let id = record.id.clone();
        if bound.is_zero() {
            // The budget's read used up the caller's wait for the store: not asked.
            return Err((id, super::bounded::timed_out(config.store_timeout)));
        }
        let written = async {
            config.store.put(record).await?;
            let lease = config.store.get(&id).await?.and_then(|r| r.lease());
            lease.ok_or_else(|| {
                StoreError::new(format!(
                    "write-ahead record {id:?} was changed by someone else as it was written"
                ))
            })
        };
        // Bounded: a store that does not answer costs the caller its timeout, and the call
        // goes out without write-ahead.
        super::bounded::bounded_call(bound, written)
            .await
            .map_err(|e| (id, e))
    })
}

/// The write-ahead write on its way: the claim, or the record id and the store's error.
pub(crate) type Storing = BoxFuture<'static, Result<Lease, (String, StoreError)>>;

/// Where a call with write-ahead stands.
pub(crate) enum WriteAhead {
    /// Its record is being written.
    Storing(Storing),
    /// Its record is written and claimed by the call, which renews the claim while it is out.
    Held(Renewal),
    /// The call succeeded: its record is being resolved.
    Resolving(BoxFuture<'static, ()>),
}

impl WriteAhead {
    /// Polls the write-ahead write: `Some(claim)` once written, `None` when it failed (logged
    /// and reported: the call goes out anyway).
    pub(crate) fn poll_stored(
        storing: &mut Storing,
        cx: &mut Context<'_>,
        config: &Config,
        length: Duration,
    ) -> Poll<Option<Renewal>> {
        let written = std::task::ready!(storing.as_mut().poll(cx));
        Poll::Ready(match written {
            Ok(lease) => Some(Renewal::new(
                Arc::clone(&config.store),
                lease,
                length,
                config.clock,
                config.store_timeout,
            )),
            Err((id, error)) => {
                config.listener.emit_ref(&Event::StoreError {
                    operation: "write_ahead",
                    id: Some(&id),
                    error: &error,
                });
                tracing::warn!(
                    id = %id,
                    error = %error,
                    "write-ahead record could not be written; the request is sent without it \
                     (lost if this process dies before the call ends)"
                );
                None
            }
        })
    }
}

/// A write-ahead claim held while the call is out: renewed every third of its length.
pub(crate) struct Renewal {
    store: Arc<dyn Store>,
    lease: Lease,
    length: Duration,
    clock: crate::clock::Clock,
    /// The bound on each store call ([`DeadLetterLayer::store_timeout`]).
    ///
    /// [`DeadLetterLayer::store_timeout`]: super::DeadLetterLayer::store_timeout
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    renewing: Option<BoxFuture<'static, Result<Claim, StoreError>>>,
    lost: bool,
}

impl Renewal {
    fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        length: Duration,
        clock: crate::clock::Clock,
        timeout: Duration,
    ) -> Self {
        Renewal {
            store,
            lease,
            length,
            clock,
            timeout,
            sleep: Box::pin(tokio::time::sleep(length / 3)),
            renewing: None,
            lost: false,
        }
    }

    /// The claim, as last renewed.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Renews the claim when due; never ready (polled beside the call while it is pending).
    pub(crate) fn poll_renew(&mut self, cx: &mut Context<'_>) {
        while !self.lost {
            if let Some(renewing) = self.renewing.as_mut() {
                let Poll::Ready(renewed) = renewing.as_mut().poll(cx) else {
                    return;
                };
                self.renewing = None;
                self.renewed(renewed);
                continue;
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                return;
            }
            let until = add_clamped(self.clock.now(), self.length);
            let renewal = self
                .store
                .change_claimed(&self.lease, Change::Renewed { until });
            // Bounded: a renewal that hangs is tried again, as one that fails.
            self.renewing = Some(Box::pin(super::bounded::bounded_call(
                self.timeout,
                renewal,
            )));
        }
    }

    fn renewed(&mut self, renewed: Result<Claim, StoreError>) {
        let next = match renewed {
            Ok(Claim::Claimed(record)) => {
                self.lease.until = record.retry_at.unwrap_or(self.lease.until);
                self.length / 3
            }
            Ok(Claim::ClaimedElsewhere { status, .. }) => {
                tracing::warn!(
                    id = %self.lease.id,
                    status = %status,
                    "write-ahead claim ended while the call was out: another sender took the \
                     request (it may be sent twice; its idempotency key lets the provider tell)"
                );
                self.lost = true;
                return;
            }
            Ok(Claim::Missing) => {
                tracing::info!(id = %self.lease.id, "write-ahead record deleted while the call was out");
                self.lost = true;
                return;
            }
            Err(e) => {
                tracing::debug!(id = %self.lease.id, error = %e, "cannot renew a write-ahead claim");
                (self.length / 6).max(Duration::from_millis(1))
            }
        };
        self.sleep.as_mut().reset(Instant::now() + next);
    }

    /// Resolves the record of a call that succeeded, while the claim holds: one try, bounded
    /// by the store timeout, on the caller's time. A try that fails or does not answer is
    /// tried again on a task of its own, backing off, until the claim ends (the caller has its
    /// response meanwhile); a record still not resolved then is sent again by a scheduler after
    /// its lease, said at WARN.
    pub(crate) fn resolve(self) -> BoxFuture<'static, ()> {
        let Renewal {
            store,
            lease,
            clock,
            timeout,
            ..
        } = self;
        Box::pin(async move {
            let at = clock.now();
            let resolving = store.change_claimed(&lease, Change::Resolved { at });
            let first = super::bounded::bounded_call(timeout, resolving).await;
            if let Err(error) = resolved(&lease, first) {
                tracing::debug!(id = %lease.id, error = %error, "cannot resolve a write-ahead record yet; trying again");
                tokio::spawn(resolve_later(store, lease, at, timeout, clock));
            }
        })
    }
}

/// How a resolution of the write-ahead record `lease` ended: `Err` when the store failed.
fn resolved(lease: &Lease, resolution: Result<Claim, StoreError>) -> Result<(), StoreError> {
    match resolution? {
        Claim::Claimed(_) => {}
        Claim::ClaimedElsewhere { .. } | Claim::Missing => tracing::info!(
            id = %lease.id,
            "delivered after the write-ahead claim had passed to another sender; the record is \
             left as they wrote it"
        ),
    }
    Ok(())
}

/// Tries the resolution of the write-ahead record `lease` (delivered at `at`) again, backing
/// off, each try bounded by `timeout`, until it is written or the claim ends.
async fn resolve_later(
    store: Arc<dyn Store>,
    lease: Lease,
    at: SystemTime,
    timeout: Duration,
    clock: crate::clock::Clock,
) {
    let mut failed = 1;
    loop {
        let wait = super::bounded::store_retry(failed, Duration::from_millis(100), timeout * 2);
        if add_clamped(clock.now(), wait) >= lease.until {
            break;
        }
        tokio::time::sleep(wait).await;
        let resolving = store.change_claimed(&lease, Change::Resolved { at });
        match resolved(
            &lease,
            super::bounded::bounded_call(timeout, resolving).await,
        ) {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(id = %lease.id, error = %e, "cannot resolve a write-ahead record yet")
            }
        }
        failed += 1;
    }
    tracing::warn!(
        id = %lease.id,
        "delivered, but the write-ahead record could not be resolved before its claim ended: a \
         scheduler sends it again after its lease (its idempotency key lets the provider tell)"
    );
}
