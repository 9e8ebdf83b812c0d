//! The claim a re-send runs under: while a [`Scheduler`](crate::resend::Scheduler) or a
//! [`Redrive`](crate::resend::Redrive) sends a claimed record through a stack, the dead-letter
//! layer in it writes that record's new failure only while the claim holds
//! ([`Store::put_claimed`](crate::store::Store::put_claimed)), so that a re-send whose claim
//! passed to another sender never undoes what that sender wrote.
//!
//! The claim rides on the re-send's task, not on the request, so that it reaches the layer
//! whatever the request type. A stack that hands its calls to another task (a `Buffer` around
//! the dead-letter layer) loses it there: its writes are plain [`put`](crate::store::Store::put)s,
//! as any failure's.

use crate::store::Lease;

tokio::task_local! {
    static CLAIM: Lease;
}

/// Runs `poll` (one poll of a re-send's call) under the claim `lease`.
pub(crate) fn under<R>(lease: Lease, poll: impl FnOnce() -> R) -> R {
    CLAIM.sync_scope(lease, poll)
}

/// The claim the running re-send is under, if any: read on the failure path only.
pub(super) fn current() -> Option<Lease> {
    CLAIM.try_with(Lease::clone).ok()
}
