//! The dead-letter layer's note on a failure: where its record went.

use std::fmt;

use crate::failure::{BoxError, Note, Notes};
use crate::retry::Attempts;

/// What became of a failure at the dead-letter layer: a [`Note`] on the failure it hands back,
/// read with `failure.note::<DeadLetterStatus>()`.
///
/// In the failure's `Display` it ends the message: `; dead letter stored as {id}`,
/// `; stored as {id} for a re-send when due` for a request the retry layer deferred,
/// `; not written: the claim on {id} had passed to another sender`, or
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
    /// The record could not be written. The failure that caused it is still the one returned.
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
            | DeadLetterStatus::NotStored { id, .. } => id,
        }
    }

    /// Whether the record could not be written because the store failed (not because a re-send's
    /// claim had passed on: [`ClaimLost`](DeadLetterStatus::ClaimLost)).
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
            DeadLetterStatus::NotStored { id, error } => {
                write!(f, "; dead letter {id} could not be written: {error}")
            }
        }
    }
}
