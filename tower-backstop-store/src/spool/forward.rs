//! Forwarding: spooled records into the store, idempotently.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Spool, SpoolError};
use crate::{BoxFuture, Claim, Record, Status, Store, StoreError};

/// Records read from the spool at a time.
const BATCH: usize = 100;
/// The forwarder's first wait after a store error; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The forwarder's longest wait between tries while the store fails: the store's return is
/// seen within this and one store timeout.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a [`Spool`] holds now ([`Spool::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpoolState {
    /// Records waiting to be forwarded.
    pub records: u64,
    /// Their bytes (the records' JSON).
    pub bytes: u64,
    /// The size cap ([`Spool::with_max_bytes`]).
    pub max_bytes: u64,
    /// Whether the store answered the last forwarding (`true` before any).
    pub store_up: bool,
    /// Records moved to the quarantine file by this process (past the age cap, or not
    /// decodable).
    pub quarantined: u64,
}

/// What one forwarding did ([`Spool::forward_once`]): each record taken out of the spool,
/// counted once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Forwarded {
    /// Written into the store (new, or merged into the record of the same id).
    pub written: u64,
    /// Already in the store with this same failure (a write that timed out but landed): not
    /// written twice.
    pub already_there: u64,
    /// Not written because the store's record moved on meanwhile: a claim or a resolution of
    /// it, or a newer failure, reached the store first and wins.
    pub superseded: u64,
    /// Moved to the quarantine file: past the age cap, or not decodable.
    pub quarantined: u64,
}

impl Forwarded {
    /// Records taken out of the spool, whatever became of them.
    pub fn total(&self) -> u64 {
        self.written + self.already_there + self.superseded + self.quarantined
    }
}

/// Runs `call` for at most `bound`.
async fn bounded<T>(
    bound: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
        Err(StoreError::new(format!(
            "store did not answer within {}",
            humantime::format_duration(bound)
        )))
    })
}

/// Whether the store's `current` record already holds `spooled`'s failure, or a newer one.
fn newer_or_same(current: &Record, spooled: &Record) -> Option<bool> {
    if current.last_failed_at > spooled.last_failed_at {
        return Some(false);
    }
    (current.last_failed_at == spooled.last_failed_at
        && current.history.last() == spooled.history.last())
    .then_some(true)
}

/// How one spooled record ended.
enum Fate {
    Written,
    AlreadyThere,
    Superseded,
}

impl Spool {
    /// Forwards every record the spool holds into `store`, the first spooled first, each store
    /// call bounded by `bound`, and removes each from the spool once the store has it (or has
    /// moved on). Idempotent:
    ///
    /// - A record spooled under a claim (a re-send's failure) is written with
    ///   [`Store::put_claimed`]: only while that claim still holds; a claim that passed to
    ///   another sender wins. One the store no longer has at all (a store that came back
    ///   empty) is written as it is.
    /// - Any other: a record the store does not have is written; one it has with this same
    ///   failure (a write that timed out but landed) or a newer one is not written again; one
    ///   that a scheduler claimed or that was resolved meanwhile
    ///   ([`InFlight`](Status::InFlight), [`Resolved`](Status::Resolved)) wins over the
    ///   spooled failure, which would send it once more; otherwise it is merged
    ///   ([`Store::put`]).
    /// - A record spooled longer than the age cap, or that does not decode, goes to the
    ///   quarantine file instead (logged at error).
    ///
    /// A record written to the spool while it is forwarded stays for the next round.
    ///
    /// # Errors
    ///
    /// The first error of the store (or of the spool's file): the records before it are
    /// forwarded, the rest stay spooled. The spool's [`state`](Spool::state) then says the
    /// store is down.
    pub async fn forward_once(
        &self,
        store: &dyn Store,
        bound: Duration,
    ) -> Result<Forwarded, SpoolError> {
        let mut done = Forwarded::default();
        loop {
            let batch = self.peek(BATCH).await?;
            let full = batch.len() == BATCH;
            let moved = match self.forward_batch(store, bound, batch, &mut done).await {
                Ok(moved) => moved,
                Err(e) => {
                    self.set_store_up(false);
                    return Err(e);
                }
            };
            self.set_store_up(true);
            if !full || moved == 0 {
                return Ok(done);
            }
        }
    }

    /// Forwards one batch: reads what the store has of each record, writes the ones to write in
    /// one `put_many`, then removes every settled record from the spool in one transaction.
    /// How many records left the spool.
    async fn forward_batch(
        &self,
        store: &dyn Store,
        bound: Duration,
        batch: Vec<super::Spooled>,
        done: &mut Forwarded,
    ) -> Result<usize, SpoolError> {
        let mut moved = 0;
        let mut settled: Vec<((String, i64), Fate)> = Vec::with_capacity(batch.len());
        let (mut writes, mut written) = (Vec::new(), Vec::new());
        for spooled in batch {
            let (id, version) = (spooled.id, spooled.version);
            let record = match spooled.record {
                Ok(record) => record,
                Err(text) => {
                    tracing::error!(spool = %self.path().display(), id = %id, "spooled record does not decode; moved to the quarantine file");
                    if self.quarantine(id, version, text).await? {
                        done.quarantined += 1;
                        moved += 1;
                    }
                    continue;
                }
            };
            if spooled.spooled_at + self.max_age() < SystemTime::now() {
                tracing::error!(spool = %self.path().display(), id = %id, spooled_at = %humantime::format_rfc3339_millis(spooled.spooled_at), "spooled record past the spool's age cap; moved to the quarantine file, not forwarded");
                let text = serde_json::to_string(&record).unwrap_or_default();
                if self.quarantine(id, version, text).await? {
                    done.quarantined += 1;
                    moved += 1;
                }
                continue;
            }
            let fate = match spooled.lease {
                Some(lease) => forward_claimed(store, bound, lease, record).await?,
                None => match fate_of(store, bound, &record).await? {
                    Some(fate) => fate,
                    None => {
                        writes.push(record);
                        written.push((id, version));
                        continue;
                    }
                },
            };
            settled.push(((id, version), fate));
        }
        if !writes.is_empty() {
            bounded(bound, store.put_many(writes)).await?;
            settled.extend(written.into_iter().map(|at| (at, Fate::Written)));
        }
        let (keys, fates): (Vec<_>, Vec<_>) = settled.into_iter().unzip();
        let removed = self.remove_many(keys).await?;
        // Written to the spool again meanwhile: forwarded again next round.
        for (fate, _) in fates.into_iter().zip(removed).filter(|(_, gone)| *gone) {
            moved += 1;
            match fate {
                Fate::Written => done.written += 1,
                Fate::AlreadyThere => done.already_there += 1,
                Fate::Superseded => done.superseded += 1,
            }
        }
        Ok(moved)
    }

    /// The forwarder: forwards what the spool holds into `store` ([`forward_once`](Spool::forward_once),
    /// each store call bounded by `bound`), then waits for the next record spooled; while the
    /// store fails, tries again after a backoff that doubles from 100 ms to at most 1 s, so that
    /// the spool drains within about a second and one `bound` of the store's return. Runs until
    /// dropped; `report` is told after each forwarding that moved records or failed.
    ///
    /// One forwarder per spool: when one already runs, this one ends at once. The dead-letter
    /// layer starts it for its store when given a spool; a process that wants it without the
    /// layer spawns it: `tokio::spawn(spool.forward(store, timeout, |_, _| {}))`.
    pub fn forward(
        &self,
        store: Arc<dyn Store>,
        bound: Duration,
        mut report: impl FnMut(&Spool, Result<Forwarded, &SpoolError>) + Send + 'static,
    ) -> BoxFuture<'static, ()> {
        let spool = self.clone();
        Box::pin(async move {
            if !spool.start_forwarding() {
                return;
            }
            let _running = Running(spool.clone());
            let mut backoff = FIRST_BACKOFF;
            loop {
                let waiting = spool.notified();
                if spool.state().records == 0 {
                    waiting.await;
                    continue;
                }
                match spool.forward_once(&*store, bound).await {
                    Ok(done) => {
                        backoff = FIRST_BACKOFF;
                        if done.total() > 0 {
                            report(&spool, Ok(done));
                        } else {
                            // Nothing moved (each record re-written meanwhile): breathe.
                            tokio::time::sleep(FIRST_BACKOFF).await;
                        }
                    }
                    Err(e) => {
                        report(&spool, Err(&e));
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        })
    }
}

/// Marks the spool's forwarder stopped when it ends (dropped with its runtime, or aborted).
struct Running(Spool);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.stop_forwarding();
    }
}

/// Writes one spooled `record` into `store` under `lease`, the claim it was spooled under.
async fn forward_claimed(
    store: &dyn Store,
    bound: Duration,
    lease: crate::Lease,
    record: Record,
) -> Result<Fate, StoreError> {
    let current = bounded(bound, store.get(&lease.id)).await?;
    match current {
        // The store came back without it: what the spool holds is all there is.
        None => {
            bounded(bound, store.put(record)).await?;
            Ok(Fate::Written)
        }
        Some(current) if newer_or_same(&current, &record) == Some(true) => Ok(Fate::AlreadyThere),
        Some(_) => match bounded(bound, store.put_claimed(&lease, record)).await? {
            Claim::Claimed(_) => Ok(Fate::Written),
            Claim::ClaimedElsewhere { .. } | Claim::Missing => Ok(Fate::Superseded),
        },
    }
}

/// What becomes of a spooled `record` spooled without a claim, by what the store has of it:
/// `None` when it is to be written (merged into the store's).
async fn fate_of(
    store: &dyn Store,
    bound: Duration,
    record: &Record,
) -> Result<Option<Fate>, StoreError> {
    let Some(current) = bounded(bound, store.get(&record.id)).await? else {
        return Ok(None);
    };
    Ok(match newer_or_same(&current, record) {
        Some(true) => Some(Fate::AlreadyThere),
        Some(false) => Some(Fate::Superseded),
        None if matches!(current.status, Status::InFlight | Status::Resolved) => {
            Some(Fate::Superseded)
        }
        None => None,
    })
}
