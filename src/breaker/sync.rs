//! The atomics of the breaker: std's, or loom's under `--cfg tower_backstop_loom`
//! (tests/loom.rs).

#[cfg(tower_backstop_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering, fence,
};
#[cfg(not(tower_backstop_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering, fence,
};
