//! A retry policy that a reload replaces while the service runs ([`LivePolicy`]): each
//! service keeps the policy it last saw and the version it saw, and a call compares that
//! version with the cell's, one atomic load of a word that only a reload writes. Only a service
//! that sees a newer version takes the cell's read lock, once, to clone the new policy (a
//! counted reference). A call clones the policy it started with into its future when it may
//! retry, so a call in flight ends under the policy it started with.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::RetryPolicy;

/// The policies of a reloadable stack, one per way the stack is built (with or without a
/// dead-letter store: the preset bounds the delays differently), and their version.
#[derive(Debug)]
pub(crate) struct PolicyCell {
    version: AtomicU64,
    policies: RwLock<Vec<RetryPolicy>>,
}

impl PolicyCell {
    /// A cell holding `policies` at version 0.
    pub(crate) fn new(policies: Vec<RetryPolicy>) -> Arc<Self> {
        Arc::new(PolicyCell {
            version: AtomicU64::new(0),
            policies: RwLock::new(policies),
        })
    }

    /// Replaces the policies (as many as before, in the same order): the next call of every
    /// service takes its own.
    pub(crate) fn set(&self, policies: Vec<RetryPolicy>) {
        let mut held = self
            .policies
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *held = policies;
        // Bumped under the write lock: a reader that takes the read lock sees the policies of
        // the version it then reads.
        self.version.fetch_add(1, Ordering::Release);
    }

    /// The policy at `variant` now (a clone of its counted reference).
    pub(crate) fn get(&self, variant: usize) -> RetryPolicy {
        self.policies.read().unwrap_or_else(PoisonError::into_inner)[variant].clone()
    }
}

/// A service's view of a [`PolicyCell`]: which of its policies, and the version last taken.
#[derive(Clone, Debug)]
pub(crate) struct LivePolicy {
    cell: Arc<PolicyCell>,
    variant: usize,
    seen: u64,
}

impl LivePolicy {
    /// The policy at `variant` of `cell` now, and the view that keeps it up to date.
    pub(crate) fn new(cell: Arc<PolicyCell>, variant: usize) -> (Self, RetryPolicy) {
        // The version before the policy: a reload between the two costs one more look, never
        // a policy kept past its version.
        let seen = cell.version.load(Ordering::Acquire);
        let policy = cell.get(variant);
        let live = LivePolicy {
            cell,
            variant,
            seen,
        };
        (live, policy)
    }

    /// Replaces `policy` with the cell's if a reload came since this service last looked.
    #[inline]
    pub(crate) fn refresh(&mut self, policy: &mut RetryPolicy) {
        if self.cell.version.load(Ordering::Acquire) != self.seen {
            self.take(policy);
        }
    }

    #[cold]
    #[inline(never)]
    fn take(&mut self, policy: &mut RetryPolicy) {
        let held = self
            .cell
            .policies
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        *policy = held[self.variant].clone();
        self.seen = self.cell.version.load(Ordering::Acquire);
    }
}
