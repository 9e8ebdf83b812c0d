//! Sending stored records again: on their retry-at time, on purpose, or after asking the
//! provider.
//!
//! Every re-send reads and claims records in a [`Store`](crate::store::Store), rebuilds each into
//! a request ([`http_request`], [`http_request_restoring`], or your own function) and sends it
//! through a service stack, normally the same stack as the original call, with its
//! [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) over the same store: a request that
//! fails again updates its record instead of making a new one.
//!
//! - [`Scheduler`]: a task that re-sends deferred records when their retry-at time comes. It
//!   also sends what an [`Outbox`](crate::dead_letter::Outbox) queued, and the requests that a
//!   process with [write-ahead](crate::dead_letter::DeadLetterLayer::write_ahead) left in flight
//!   when it died.
//! - [`Redrive`]: re-send on purpose, with a filter, a dry run, a rate and a maximum.
//! - [`Reconciler`]: asks the provider, with your
//!   [`StatusCheck`](crate::retry::StatusCheck), about stored outcome-unknown records.
//!
//! Claims are compare-and-set ([`Store::claim`](crate::store::Store::claim)): of two re-drives,
//! a re-drive and a scheduler, or two schedulers on one store, exactly one sends; the other
//! reports the record skipped, claimed elsewhere.
//!
//! # Example
//!
//! A scheduler with the defaults (poll every second, 8 re-sends at a time):
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower::ServiceBuilder;
//! use tower_backstop::dead_letter::DeadLetterLayer;
//! use tower_backstop::resend::{Scheduler, http_request};
//! use tower_backstop::store::SqliteStore;
//!
//! let store = Arc::new(SqliteStore::open("dead_letters.db")?);
//! # let client = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
//! #     Ok::<_, tower_backstop::BoxError>(http::Response::new(())) });
//! let stack = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::from_arc(store.clone()))
//!     .service(client);
//! let scheduler = Scheduler::new(store, stack, |record| http_request(record, None)).spawn();
//! // … on shutdown:
//! scheduler.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Customised
//!
//! A re-drive of one class, 50 a second, at most 200, tried dry first:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_backstop::resend::{Redrive, http_request};
//! use tower_backstop::store::{Filter, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let redrive = Redrive::new(Filter::new().class("throttled"), 50, 200)?;
//! assert!(redrive.plan(&store).await?.is_empty()); // the dry run
//! let service = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
//!     Ok::<_, tower_backstop::BoxError>(http::Response::new(()))
//! });
//! let report = redrive.run(&store, service, |record| http_request(record, None)).await?;
//! assert_eq!(report.resolved(), 0);
//! # Ok(()) }
//! ```

mod rebuild;
mod reconciler;
mod redrive;
mod renew;
mod scheduler;

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::rebuild::reqwest_request;
pub use self::rebuild::{http_request, http_request_restoring};
pub use self::reconciler::{ReconcileReport, Reconciler};
pub use self::redrive::{ALREADY_DELIVERED, Outcome, Redrive, RedriveReport};
pub use self::scheduler::{
    DEFAULT_LEASE, DEFAULT_SHUTDOWN_WITHIN, Scheduler, SchedulerHandle, StoreHealth,
};
