//! [`Retention`]: how long, and how many, records a store keeps.

use std::time::{Duration, SystemTime};

use super::query::Filter;
use super::record::Status;
use super::{AuditAction, AuditEntry, Store, StoreError};

/// Records older than this are pruned by default: 30 days, measured from a record's last
/// failure. A month covers a billing cycle and most incident reviews; Sidekiq keeps its dead
/// set six months, AWS SQS a message at most 14 days.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// At most this many records are kept by default: 100,000 (Sidekiq's dead set keeps 10,000
/// jobs by default; our records are smaller than a job with its payload cut at 64 KiB).
pub const DEFAULT_MAX_RECORDS: u64 = 100_000;

/// How many records a batch of [`Retention::prune`] deletes by id at most, so that a prune over
/// a large store never holds its whole excess in memory.
const BATCH: u64 = 500;

/// A bound on what a store keeps: by age (from a record's last failure) and by count. Pruning
/// removes only [`Resolved`](Status::Resolved) and [`Dead`](Status::Dead) records, the
/// resolved ones first, the oldest first; it never removes a [`Deferred`](Status::Deferred) or
/// [`InFlight`](Status::InFlight) record, whose message is still to be delivered, so a store
/// full of deferred records may stay above the bound.
///
/// The default is [`DEFAULT_MAX_AGE`] and [`DEFAULT_MAX_RECORDS`]. The
/// [`Scheduler`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html) runs it on an interval
/// ([`Scheduler::retention`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html#method.retention)), and `backstop-dlq prune`
/// on demand.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_backstop_store::{MemoryStore, Retention};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let retention = Retention::new()
///     .max_age(Duration::from_secs(7 * 24 * 3600))
///     .max_records(10_000);
/// let pruned = retention.prune(&store, SystemTime::now()).await.unwrap();
/// assert_eq!(pruned.total(), 0);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    max_age: Option<Duration>,
    max_records: Option<u64>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Some(DEFAULT_MAX_AGE),
            max_records: Some(DEFAULT_MAX_RECORDS),
        }
    }
}

/// What a prune removed, or what a [`plan`](Retention::plan) would remove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Records older than the maximum age.
    pub by_age: u64,
    /// Records beyond the maximum count, after those.
    pub by_count: u64,
}

impl Pruned {
    /// Both counts together.
    pub fn total(&self) -> u64 {
        self.by_age + self.by_count
    }
}

/// The statuses pruning may remove, in the order it removes them.
const PRUNABLE: [Status; 2] = [Status::Resolved, Status::Dead];

impl Retention {
    /// The defaults: [`DEFAULT_MAX_AGE`] and [`DEFAULT_MAX_RECORDS`].
    pub fn new() -> Self {
        Retention::default()
    }

    /// Prunes records whose last failure is more than `age` before the prune's `now`.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// No bound by age.
    pub fn no_max_age(mut self) -> Self {
        self.max_age = None;
        self
    }

    /// Keeps at most `n` records (0 keeps only the deferred and in-flight ones).
    pub fn max_records(mut self, n: u64) -> Self {
        self.max_records = Some(n);
        self
    }

    /// No bound by count.
    pub fn no_max_records(mut self) -> Self {
        self.max_records = None;
        self
    }

    /// The bound by age, if any.
    pub fn age_bound(&self) -> Option<Duration> {
        self.max_age
    }

    /// The bound by count, if any.
    pub fn count_bound(&self) -> Option<u64> {
        self.max_records
    }

    /// The instant before which records are too old at `now`.
    fn cutoff(&self, now: SystemTime) -> Option<SystemTime> {
        now.checked_sub(self.max_age?)
    }

    /// What [`prune`](Self::prune) would remove at `now`, counted and not removed (a dry run).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or cannot be read.
    pub async fn plan(&self, store: &dyn Store, now: SystemTime) -> Result<Pruned, StoreError> {
        let mut plan = Pruned::default();
        let mut left = [0u64; 2];
        for (i, status) in PRUNABLE.into_iter().enumerate() {
            let all = store.count(&Filter::new().status(status)).await?;
            let old = match self.cutoff(now) {
                Some(cutoff) => {
                    store
                        .count(&Filter::new().status(status).until(cutoff))
                        .await?
                }
                None => 0,
            };
            plan.by_age += old;
            left[i] = all - old.min(all);
        }
        if let Some(max) = self.max_records {
            let total = store
                .count(&Filter::new())
                .await?
                .saturating_sub(plan.by_age);
            plan.by_count = total.saturating_sub(max).min(left[0] + left[1]);
        }
        Ok(plan)
    }

    /// Removes the records beyond the bounds at `now`: first every resolved or dead record older
    /// than the maximum age, then, while the store holds more than the maximum count, the
    /// oldest resolved records, then the oldest dead ones, in batches of at most 500.
    ///
    /// Each deletion names the status it removes, so a record that a re-drive or the scheduler
    /// changed meanwhile (a dead letter claimed again) is not removed.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is closed or a read or write fails; what was removed before
    /// stays removed (pruning again continues).
    pub async fn prune(&self, store: &dyn Store, now: SystemTime) -> Result<Pruned, StoreError> {
        let mut pruned = Pruned::default();
        if let Some(cutoff) = self.cutoff(now) {
            for status in PRUNABLE {
                pruned.by_age += store
                    .delete(&Filter::new().status(status).until(cutoff))
                    .await?;
            }
        }
        let Some(max) = self.max_records else {
            return Ok(pruned);
        };
        let mut excess = store.count(&Filter::new()).await?.saturating_sub(max);
        for status in PRUNABLE {
            while excess > 0 {
                let of_status = Filter::new().status(status);
                let n = store.count(&of_status).await?;
                let take = excess.min(n).min(BATCH);
                if take == 0 {
                    break;
                }
                // The `take` oldest: the last positions of the newest-first order.
                let (start, end) = (usize_of(n - take), usize_of(n));
                let oldest = store.search(&of_status, start..end).await?;
                if oldest.is_empty() {
                    break;
                }
                let mut by_id = of_status;
                for record in oldest {
                    by_id = by_id.id(record.id);
                }
                let deleted = store.delete(&by_id).await?;
                if deleted == 0 {
                    // Changed meanwhile by someone else: count again next time.
                    break;
                }
                pruned.by_count += deleted;
                excess = excess.saturating_sub(deleted);
            }
        }
        Ok(pruned)
    }
}

impl Retention {
    /// [`prune`](Self::prune), and when it removed anything, an entry in the audit trail
    /// ([`AuditAction::Prune`]) by `actor`, with the bounds and the counts.
    ///
    /// # Errors
    ///
    /// As [`prune`](Self::prune); and when the records were removed but the audit entry could
    /// not be written, an error that says so.
    pub async fn prune_as(
        &self,
        store: &dyn Store,
        now: SystemTime,
        actor: &str,
    ) -> Result<Pruned, StoreError> {
        let pruned = self.prune(store, now).await?;
        if pruned.total() == 0 {
            return Ok(pruned);
        }
        let bound = |d: Option<String>| d.unwrap_or_else(|| "none".to_owned());
        let entry = AuditEntry::new(AuditAction::Prune, actor, &Filter::new())
            .at(now)
            .sent(pruned.total())
            .outcome(format!(
                "removed {} older than {} and {} beyond {} records",
                pruned.by_age,
                bound(
                    self.max_age
                        .map(|a| humantime::format_duration(a).to_string())
                ),
                pruned.by_count,
                bound(self.max_records.map(|n| n.to_string())),
            ));
        store.append_audit(entry).await.map_err(|e| {
            StoreError::with_source(
                format!(
                    "{} records pruned, but the audit entry was not written",
                    pruned.total()
                ),
                e,
            )
        })?;
        Ok(pruned)
    }
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
