//! The conformance suite (feature `testing`): the cases every [`Store`] must pass, to run against
//! a store of your own.
//!
//! A [`Backend`] opens a fresh, empty store for each case, and a second handle on the same
//! records, "as another process would open it". [`cases`] lists the cases, each with its name;
//! [`run_all`] runs them all in one test and names each one that failed. The stores of this
//! crate pass them through the backends here: [`MemoryBackend`], `SqliteBackend` (feature
//! `sqlite`), `RedisBackend` (feature `redis`: one server, a Redis Cluster or through Sentinel) and
//! `PostgresBackend` (feature `postgres`).
//!
//! The cases use only the [`Store`] trait and this crate's [`Retention`](crate::Retention) and
//! [`purge`](crate::purge): a record's round trip and merge by id, the bounded history, searches
//! and their pages (ties included), counts over a window and by status, counts that agree with
//! a recount of the records after every kind of write (and [`Store::check_counts`] finding no
//! drift), batches, updates, claims (due, concurrent, compare-and-set, held and given back, an
//! in-flight record written by `put` as a write-ahead does), deletes, odd ids and a 10 MiB
//! payload, retention, the audit trail, what `list` lists (outstanding records only, in the
//! order of every list), and keyset pages by cursor (the whole list with no duplicate and no
//! gap, cursors refused with a clear error, a stale cursor resumed after its key). Every case
//! panics on the first assertion
//! that fails, with a message naming what differed.
//!
//! # Example: one test for every case
//!
//! In your crate's tests (`tower-backstop-store` as a dev-dependency with the `testing` feature,
//! and tokio with `macros` and `rt`):
//!
//! ```
//! use std::sync::Arc;
//!
//! use tower_backstop_store::testing::{self, Backend, Opened};
//! use tower_backstop_store::{BoxFuture, MemoryStore, StoreError};
//!
//! /// Opens the store under test. A store of your own opens its fresh store here (a new file,
//! /// a new key prefix, a new schema), and the second handle as another process would.
//! struct MyBackend;
//!
//! impl Backend for MyBackend {
//!     fn open<'a>(
//!         &'a self,
//!         _test: &'a str,
//!         history_limit: usize,
//!     ) -> BoxFuture<'a, Result<Opened, StoreError>> {
//!         Box::pin(async move {
//!             let store = MemoryStore::new().with_history_limit(history_limit);
//!             Ok(Opened::new(Arc::new(store.clone()), Arc::new(store)))
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // In your tests: `#[tokio::test] async fn conformance() { … }`
//! testing::run_all(&MyBackend).await;
//! # }
//! ```
//!
//! # Example: one test per case
//!
//! With [`libtest-mimic`](https://docs.rs/libtest-mimic) in a test target of its own
//! (`harness = false`), each case is a test of its own, run, filtered and reported by name:
//!
//! ```no_run
//! use libtest_mimic::{Arguments, Trial};
//! use tower_backstop_store::testing::{self, MemoryBackend};
//!
//! fn main() {
//!     let trials = testing::cases()
//!         .iter()
//!         .map(|case| {
//!             Trial::test(case.name(), move || {
//!                 let rt = tokio::runtime::Runtime::new().unwrap();
//!                 rt.block_on(case.run(&MemoryBackend)); // your backend here
//!                 Ok(())
//!             })
//!         })
//!         .collect();
//!     libtest_mimic::run(&Arguments::from_args(), trials).exit();
//! }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::{BoxFuture, MemoryStore, Store, StoreError};

mod backends;
mod cases;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::backends::PostgresBackend;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::backends::RedisBackend;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use self::backends::SqliteBackend;

/// Opens the stores a case runs against: a fresh, empty store for each case.
///
/// Implement it for the store you test (see the [module docs](self) for an example). Each call
/// must give a store that holds nothing yet (a new file, a new key prefix, a new schema), so
/// that cases may run at the same time, and a second handle on the same records.
pub trait Backend: Send + Sync {
    /// A fresh, empty store for the case named `test` (use it in a file name, a key prefix or
    /// a schema name to tell the cases' data apart), keeping the last `history_limit` errors per
    /// record, and a second handle on it ([`Opened::other`]).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be opened: the case then fails with it.
    fn open<'a>(
        &'a self,
        test: &'a str,
        history_limit: usize,
    ) -> BoxFuture<'a, Result<Opened, StoreError>>;
}

/// A store opened for one case, with a second handle on the same records and whatever must live
/// as long as they do (a temporary directory).
pub struct Opened {
    /// The store under test, fresh and empty.
    pub store: Arc<dyn Store>,
    /// A second handle on the same records, as another process would open it: a clone (memory),
    /// a second connection to the same file (SQLite), a second connection with the same prefix
    /// (Redis), a second pool on the same schema (Postgres). The cases race claims through it
    /// and read through it what the first handle wrote.
    pub other: Arc<dyn Store>,
    kept: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("keeps_a_value", &self.kept.is_some())
            .finish_non_exhaustive()
    }
}

impl Opened {
    /// `store` and a second handle on its records, `other`.
    pub fn new(store: Arc<dyn Store>, other: Arc<dyn Store>) -> Self {
        Opened {
            store,
            other,
            kept: None,
        }
    }

    /// Keeps `value` until the case ends (a temporary directory that holds the store's file).
    pub fn keeping(mut self, value: impl Any + Send + Sync) -> Self {
        self.kept = Some(Box::new(value));
        self
    }
}

/// Opens a store for `test` through `backend`, or panics with the backend's error.
async fn open(backend: &dyn Backend, test: &str, history_limit: usize) -> Opened {
    match backend.open(test, history_limit).await {
        Ok(opened) => opened,
        Err(e) => panic!("{test}: the backend could not open a store: {e}"),
    }
}

/// One case of the suite: a name and what it runs ([`Case::run`]).
#[derive(Clone, Copy)]
pub struct Case {
    name: &'static str,
    run: for<'a> fn(&'a dyn Backend) -> BoxFuture<'a, ()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

impl Case {
    /// The case's name, a Rust identifier (`round_trip`, `claims_are_compare_and_set`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the case against stores opened by `backend`; it panics when the store does not do
    /// what it must (or the backend cannot open it). It spawns tasks: run it inside a tokio
    /// runtime (any flavour).
    pub fn run<'a>(&self, backend: &'a dyn Backend) -> BoxFuture<'a, ()> {
        (self.run)(backend)
    }
}

macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        /// Every case of the suite, in a fixed order, each named after what it checks.
        pub fn cases() -> &'static [Case] {
            &[$(Case {
                name: stringify!($case),
                run: |backend| Box::pin(cases::$case(backend)),
            }),*]
        }
    };
}

cases!(
    round_trip,
    upsert_merges_by_id,
    history_keeps_last_k,
    search_filters_and_pages,
    counts_over_a_window,
    put_many_is_one_batch,
    updates,
    claims_due_in_retry_order,
    concurrent_claims_never_overlap,
    delete_by_filter,
    claims_are_compare_and_set,
    awkward_ids_and_a_big_payload,
    pages_are_exact_across_ties,
    root_cause_and_breaker_are_kept,
    a_held_record_gives_its_claim_back,
    counts_follow_each_status_change,
    an_open_ended_page_reads_to_the_end,
    retention_prunes_by_age_then_count,
    audit_trail_records_purges_and_prunes,
    a_claim_is_fenced_by_its_token,
    a_batch_of_claimed_changes_skips_a_lost_claim,
    a_batch_applies_each_records_changes_in_order,
    a_failure_under_its_claim_ends_it,
    next_due_is_the_earliest_waiting_time,
    send_slots_are_shared,
    an_in_flight_record_put_is_a_claim,
    list_is_the_outstanding_records_in_list_order,
    fleet_notes_are_one_per_topic_and_author_until_they_expire,
    release_held_makes_a_breakers_deferred_records_due,
    pages_by_cursor_are_the_list,
    bad_cursors_are_refused,
    a_stale_cursor_gives_the_next_page,
    counts_agree_with_the_records_after_every_write,
);

/// The case named `name`, if there is one.
pub fn case(name: &str) -> Option<&'static Case> {
    cases().iter().find(|c| c.name == name)
}

/// Runs every case against `backend`, one after the other, and panics at the end naming each
/// case that failed with its message (a case's failure does not stop the others). Run it
/// inside a tokio runtime, in one `#[tokio::test]`.
pub async fn run_all(backend: &dyn Backend) {
    let mut failed = Vec::new();
    for case in cases() {
        if let Err(panic) = (CatchPanic(case.run(backend))).await {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            failed.push(format!("{}: {message}", case.name));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} conformance cases failed:\n{}",
        failed.len(),
        cases().len(),
        failed.join("\n")
    );
}

/// A future that turns a panic while it is polled into an `Err` with the panic's payload.
struct CatchPanic<'a>(BoxFuture<'a, ()>);

impl Future for CatchPanic<'_> {
    type Output = Result<(), Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// [`MemoryStore`]s: a new one per case, its clone as the second handle.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryBackend;

impl Backend for MemoryBackend {
    fn open<'a>(
        &'a self,
        _test: &'a str,
        history_limit: usize,
    ) -> BoxFuture<'a, Result<Opened, StoreError>> {
        Box::pin(async move {
            let store = MemoryStore::new().with_history_limit(history_limit);
            Ok(Opened::new(Arc::new(store.clone()), Arc::new(store)))
        })
    }
}
