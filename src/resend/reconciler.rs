//! [`Reconciler`]: asks the provider about stored outcome-unknown records, on demand.

use std::fmt;
use std::sync::Arc;

use super::rebuild::envelope_of;
use crate::clock::Clock;
use crate::failure::Class;
use crate::retry::{Delivery, StatusCheck};
use crate::store::{Change, Claim, Filter, Status, Store, StoreError};

/// What a [`Reconciler`] run found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Records found delivered: now [`Resolved`](Status::Resolved), metadata
    /// `reconciled: delivered`.
    pub delivered: Vec<String>,
    /// Records found never delivered: now [`Deferred`](Status::Deferred), due at once, for the
    /// [`Scheduler`](super::Scheduler) to send again; metadata `reconciled: not_delivered`.
    pub not_delivered: Vec<String>,
    /// Records the check could not decide: unchanged, still outcome-unknown.
    pub unknown: Vec<String>,
    /// Records not changed, and why: changed by someone else while they were checked (a
    /// re-drive, another reconciler), deleted, or a store error.
    pub skipped: Vec<(String, String)>,
}

/// Runs a [`StatusCheck`] over the stored outcome-unknown records, on demand.
///
/// It reads the records of class [`Class::OUTCOME_UNKNOWN`] with status
/// [`Dead`](Status::Dead) (narrowed further by [`filter`](Reconciler::filter)), at most
/// [`max`](Reconciler::max) of them (1,000 by default), asks the check about each (rebuilding its
/// envelope from the record, redacted headers excepted), and writes the verdict
/// compare-and-set ([`Store::change_if_unchanged`]): a record someone else changed meanwhile
/// is left alone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_backstop::Envelope;
/// use tower_backstop::retry::Delivery;
/// use tower_backstop::resend::Reconciler;
/// use tower_backstop::store::MemoryStore;
///
/// let store = MemoryStore::new();
/// let report = Reconciler::new(|_: Envelope| async { Delivery::Delivered })
///     .run(&store)
///     .await?;
/// assert!(report.delivered.is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reconciler {
    check: Arc<dyn StatusCheck>,
    filter: Filter,
    max: usize,
    clock: Clock,
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("filter", &self.filter)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler asking `check`.
    pub fn new(check: impl StatusCheck) -> Self {
        Reconciler::from_arc(Arc::new(check))
    }

    /// A reconciler over a check that is already shared (with a retry policy's
    /// [`reconcile`](crate::retry::RetryPolicy::reconcile) option).
    pub fn from_arc(check: Arc<dyn StatusCheck>) -> Self {
        Reconciler {
            check,
            filter: Filter::new(),
            max: 1_000,
            clock: Clock::system(),
        }
    }

    /// Only the records that also match `filter` (a tag, a time range, ids); its class and
    /// status are replaced by outcome-unknown and dead.
    pub fn filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }

    /// At most `max` records per run (at least 1). Default 1,000.
    pub fn max(mut self, max: usize) -> Self {
        self.max = max.max(1);
        self
    }

    /// The clock for the times written. Default [`Clock::system`].
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Checks each stored outcome-unknown record once and writes what the check found.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the records cannot be read. A record that cannot be written is
    /// reported in [`ReconcileReport::skipped`] and the run goes on.
    pub async fn run(&self, store: &dyn Store) -> Result<ReconcileReport, StoreError> {
        let mut filter = self.filter.clone();
        filter.class = Some(Class::OUTCOME_UNKNOWN.name().to_owned());
        filter.status = Some(Status::Dead);
        let records = store.search(&filter, 0..self.max).await?;
        let mut report = ReconcileReport::default();
        for record in records {
            let delivery = self.check.check(envelope_of(&record)).await;
            let change = match delivery {
                Delivery::Delivered => Change::Reconciled {
                    at: self.clock.now(),
                },
                Delivery::NotDelivered => Change::NotDelivered {
                    retry_at: self.clock.now(),
                },
                Delivery::Unknown => {
                    tracing::warn!(id = %record.id, "outcome still unknown after the status check");
                    report.unknown.push(record.id);
                    continue;
                }
            };
            match store.change_if_unchanged(&record, change).await {
                Ok(Claim::Claimed(_)) => {
                    tracing::info!(id = %record.id, delivery = ?delivery, "outcome unknown reconciled");
                    match delivery {
                        Delivery::Delivered => report.delivered.push(record.id),
                        _ => report.not_delivered.push(record.id),
                    }
                }
                Ok(Claim::ClaimedElsewhere { status, .. }) => report.skipped.push((
                    record.id,
                    format!("changed elsewhere while checked (now {status})"),
                )),
                Ok(Claim::Missing) => report
                    .skipped
                    .push((record.id, "deleted while checked".to_owned())),
                Err(e) => {
                    tracing::error!(id = %record.id, error = %e, "reconciled, but the verdict could not be written");
                    report
                        .skipped
                        .push((record.id, format!("cannot write the verdict: {e}")));
                }
            }
        }
        Ok(report)
    }
}
