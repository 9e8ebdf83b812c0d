//! The spare copy a retry future keeps to the end and hands up on its final failure, for a
//! dead-letter layer directly above that reuses it instead of keeping a copy of its own (the
//! preset's `DeadLetterRetry`).

// Only the dead-letter layer (feature `dead-letter`) asks for the copy.
#![cfg_attr(not(feature = "dead-letter"), allow(dead_code))]

use std::fmt;
use std::sync::Mutex;

use crate::failure::{Failure, Note};

/// An unsent copy of the request, put on the final failure by a retry future told to keep one
/// ([`KeepCopy`]). A `Mutex`, so that the failure stays `Sync` for a request that is only `Send`.
pub(crate) struct Unsent<Q>(Mutex<Q>);

impl<Q> fmt::Debug for Unsent<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Unsent(..)")
    }
}

impl<Q: Send + 'static> Note for Unsent<Q> {}

impl<Q> Unsent<Q> {
    /// The copy.
    pub(crate) fn into_inner(self) -> Q {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tells the retry future to keep a spare copy of the request to the end, even when it cannot
/// retry, and to put it on the final failure as an [`Unsent`] note.
///
/// A note must be `Send`, and the retry layer's requests need not be: the note is made by a
/// function of this request type, picked where `Req: Send` is known ([`KeepCopy::new`]).
pub(crate) struct KeepCopy<R, Req>(fn(&mut Failure<R>, Req));

impl<R, Req: Send + 'static> KeepCopy<R, Req> {
    /// Keep the copy, and hand it up as an [`Unsent`] note.
    pub(crate) fn new() -> Self {
        KeepCopy(|failure, request| {
            failure.notes_mut().insert(Unsent(Mutex::new(request)));
        })
    }
}

impl<R, Req> KeepCopy<R, Req> {
    /// Puts `request` on `failure`.
    pub(super) fn hand_up(self, failure: &mut Failure<R>, request: Req) {
        (self.0)(failure, request);
    }
}

impl<R, Req> Clone for KeepCopy<R, Req> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R, Req> Copy for KeepCopy<R, Req> {}
