//! The dead-letter layer's note on a failure: where its record went.

use std::fmt;

use crate::failure::{BoxError, Note, Notes};
use crate::retry::Attempts;

/// What became of a failure at the dead-letter layer: a [`Note`] on the failure it hands back,
/// read with `failure.note::<DeadLetterStatus>()`.
///
/// In the failure's `Display` it ends the message: `; dead letter stored as {id}`,
/// `; stored as {id} for a re-send when due` for a request the retry layer deferred,
/// `; not written: the claim on {id} had passed to another sender`,
/// `; the store did not take {id} ({error}): spooled locally, forwarded when it answers`, or
/// `; dead letter {id} could not be written: {error}`.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeadLetterStatus {
    /// The record was written; `id` finds it in the store.
    Stored {
        /// The record's id (the idempotency key, or a generated message id).
        id: String,
    },
    /// The request was a re-send of a claimed record ([`Scheduler`](crate::resend::Scheduler),
    /// [`Redrive`](crate::resend::Redrive)) whose claim had passed to another sender by the time
    /// it failed (it stalled past its lease): nothing was written, so that the failure does not
    /// undo what the newer claim wrote ([`Store::put_claimed`](crate::store::Store::put_claimed)).
    ClaimLost {
        /// The record's id.
        id: String,
    },
    /// The store did not take the record (it failed, or did not answer within the layer's
    /// store timeout), and the layer's local spool did
    /// ([`DeadLetterLayer::spool`](super::DeadLetterLayer::spool)): it is forwarded into the
    /// store, with this id, as soon as the store answers again. A request that was to be
    /// deferred is still deferred ([`Attempts::retry_at`] holds).
    Spooled {
        /// The record's id.
        id: String,
        /// Why the store did not take it (see [`NotStored`](DeadLetterStatus::NotStored)).
        error: BoxError,
    },
    /// The record could not be written: the store failed or did not answer within the
    /// layer's store timeout, and there is no spool, or the spool refused it too (full, its
    /// disk failing; both errors are in `error`). Nothing will send it again: the failure
    /// that caused it is still the one returned, and a request that was to be deferred says
    /// [`GiveUp::NotStored`](crate::retry::GiveUp::NotStored).
    NotStored {
        /// The id the record would have had.
        id: String,
        /// Why the store refused it: the store's error (a
        /// [`StoreError`](crate::store::StoreError) from this crate's stores; reach it
        /// with `error.downcast_ref::<StoreError>()`; a store of your own may fail with any
        /// error).
        error: BoxError,
    },
}

impl DeadLetterStatus {
    /// The record's id, written or not.
    pub fn id(&self) -> &str {
        match self {
            DeadLetterStatus::Stored { id }
            | DeadLetterStatus::ClaimLost { id }
            | DeadLetterStatus::Spooled { id, .. }
            | DeadLetterStatus::NotStored { id, .. } => id,
        }
    }

    /// Whether the record could not be written because the store failed and no spool took it
    /// (not because a re-send's claim had passed on: [`ClaimLost`](DeadLetterStatus::ClaimLost);
    /// a [`Spooled`](DeadLetterStatus::Spooled) record is kept).
    pub fn failed(&self) -> bool {
        matches!(self, DeadLetterStatus::NotStored { .. })
    }
}

impl Note for DeadLetterStatus {
    /// `; dead letter stored as {id}`, `; stored as {id} for a re-send when due` for a request
    /// the retry layer deferred, or `; dead letter {id} could not be written: {error}`.
    fn fmt_trailer(&self, notes: &Notes, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let deferred = notes.get::<Attempts>().is_some_and(Attempts::is_deferred);
        match self {
            // A deferred request is kept for the scheduler's re-send, not given up on.
            DeadLetterStatus::Stored { id } if deferred => {
                write!(f, "; stored as {id} for a re-send when due")
            }
            DeadLetterStatus::Stored { id } => write!(f, "; dead letter stored as {id}"),
            DeadLetterStatus::ClaimLost { id } => write!(
                f,
                "; not written: the claim on {id} had passed to another sender"
            ),
            DeadLetterStatus::Spooled { id, error } => write!(
                f,
                "; the store did not take {id} ({error}): spooled locally, forwarded when it answers"
            ),
            DeadLetterStatus::NotStored { id, error } => {
                write!(f, "; dead letter {id} could not be written: {error}")
            }
        }
    }
}
