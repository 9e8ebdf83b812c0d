//! How a layer's services and futures reach the state the layer built once: through a counted
//! reference (an `Arc`, the default), or through a leaked `'static` one that needs no count.
//!
//! Every call's future that must reach shared state when it ends (a breaker's counts) holds one
//! of these. Counted, that is one atomic increment when the
//! call starts and one decrement when it ends, on a cache line that every thread's calls share,
//! so that on two threads the line moves between cores on every call (`benches/overhead.rs`
//! measures both, `overhead_2_threads` the second). A layer's `into_static` leaks its state once
//! instead, for layers built once at startup.
//!
//! This module knows no layer: the breaker uses it, never the reverse.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A counted (`Arc`) or `'static` (leaked) reference to a layer's shared state.
pub(crate) enum Anchor<T: ?Sized + 'static> {
    Counted(Arc<T>),
    Static(&'static T),
}

impl<T: ?Sized> Anchor<T> {
    /// The same state, from now on reached without a count: the `Arc` is leaked (its memory is
    /// never freed, and what it holds is never dropped). Handles already taken keep counting, and
    /// keep pointing at the same state.
    pub(crate) fn leak(self) -> Self {
        match self {
            Anchor::Counted(shared) => {
                let leaked: &'static Arc<T> = Box::leak(Box::new(shared));
                Anchor::Static(&**leaked)
            }
            Anchor::Static(shared) => Anchor::Static(shared),
        }
    }

    /// Whether [`leak`](Self::leak) made this reference (or the one it was cloned from).
    #[cfg(test)]
    pub(crate) fn is_static(&self) -> bool {
        matches!(self, Anchor::Static(_))
    }
}

impl<T: ?Sized> Clone for Anchor<T> {
    #[inline]
    fn clone(&self) -> Self {
        match self {
            Anchor::Counted(shared) => Anchor::Counted(Arc::clone(shared)),
            Anchor::Static(shared) => Anchor::Static(shared),
        }
    }
}

impl<T: ?Sized> Deref for Anchor<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Anchor::Counted(shared) => shared,
            Anchor::Static(shared) => shared,
        }
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Anchor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Anchor::Counted(shared) => f.debug_tuple("Counted").field(&&**shared).finish(),
            Anchor::Static(shared) => f.debug_tuple("Static").field(shared).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaked_anchor_reaches_the_same_state_without_a_count() {
        let shared = Arc::new(7_u32);
        let counted = Anchor::Counted(Arc::clone(&shared));
        let leaked = counted.clone().leak();
        assert!(leaked.is_static() && !counted.is_static());
        assert!(std::ptr::eq(&*leaked, &*shared), "the same state");
        let before = Arc::strong_count(&shared);
        let copies: Vec<_> = (0..10).map(|_| leaked.clone()).collect();
        assert_eq!(
            Arc::strong_count(&shared),
            before,
            "clones of it count nothing"
        );
        assert!(copies.iter().all(|c| **c == 7));
    }
}
