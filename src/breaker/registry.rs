//! Where a call that holds no reference to its breaker finds it again, if it fails.
//!
//! A closed-state call under the consecutive rule, admitted while no failure is counted, changes
//! nothing if it succeeds. Its response future therefore keeps only the breaker's id, not an
//! `Arc` clone: that spares every such call two atomic read-modify-writes on the one reference
//! count that all threads share (a cache line that otherwise bounces between cores on every call,
//! `benches/breaker.rs`, `breaker_closed_success_2_threads`). If the call fails, its future looks
//! the breaker up here by id, under a read lock of one of 16 shards, and records the failure as
//! any other call would. A breaker that is gone by then is not found, and the outcome is dropped
//! with it.
//!
//! Each breaker is added when it is built ([`Builder::shared`](super::Builder)) and removed when
//! its last `Arc` is dropped, so nothing outlives the breakers themselves.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};

use super::state::Shared;

const SHARDS: usize = 16;

type Shard = RwLock<BTreeMap<u64, Weak<Shared>>>;

static REGISTRY: [Shard; SHARDS] = [const { RwLock::new(BTreeMap::new()) }; SHARDS];

/// The next breaker's id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn shard(id: u64) -> &'static Shard {
    // Ids are sequential, so the low bits spread breakers evenly.
    &REGISTRY[(id % SHARDS as u64) as usize]
}

/// A fresh id for a breaker about to be built.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Makes `shared` findable by its id.
pub(crate) fn register(id: u64, shared: &Arc<Shared>) {
    // Only map operations run under the lock, none of which panics, so a poisoned lock still
    // holds a consistent map.
    shard(id)
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, Arc::downgrade(shared));
}

/// The breaker with this id, if it still exists.
pub(crate) fn find(id: u64) -> Option<Arc<Shared>> {
    shard(id)
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .and_then(Weak::upgrade)
}

/// Forgets a breaker that is being dropped.
pub(crate) fn unregister(id: u64) {
    shard(id)
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::super::config::Builder;
    use super::*;

    #[test]
    fn a_breaker_is_found_while_it_lives_and_forgotten_when_dropped() {
        let shared = Builder::default().shared();
        let id = shared.id;
        let found = find(id).expect("a live breaker is found");
        assert!(Arc::ptr_eq(&found, &shared));
        drop(found);
        let weak = Arc::downgrade(&shared);
        drop(shared);
        assert!(weak.upgrade().is_none());
        assert!(find(id).is_none());
        assert!(
            !shard(id)
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&id),
            "the entry is removed, not only dead"
        );
    }

    #[test]
    fn every_breaker_has_an_id_of_its_own() {
        let a = Builder::default().shared();
        let b = Builder::default().shared();
        assert_ne!(a.id, b.id);
        assert!(Arc::ptr_eq(&find(a.id).unwrap(), &a));
        assert!(Arc::ptr_eq(&find(b.id).unwrap(), &b));
    }
}
