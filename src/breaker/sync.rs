//! The atomics of the breaker: std's, or loom's under `--cfg loom` (tests/loom.rs).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};
