//! Where dead letters are kept: the [`Store`] trait, its records, queries and counts, and the
//! stores there are, from the [`tower_backstop_store`] crate, with the dead-letter [`Stats`] and
//! their [`AlertRules`].
//!
//! One trait, one behaviour, whatever the backend: [`MemoryStore`] for tests, [`SqliteStore`]
//! (feature `sqlite`, on by default) as the durable default for one machine, `RedisStore`
//! (feature `redis`) and `PostgresStore` (feature `postgres`) for a fleet of instances that
//! share one store: the Redis or the Postgres the team already runs. Writes merge by id, searches take a [`Filter`] and a
//! range of positions, [`Counts`] come over a window, and claims of due records are atomic.
//!
//! A [`Record`] is plain data: the id, tags, class and code names, the message, attempt counts,
//! the failure times, the [`Status`] and retry-at time, the history of the last errors, and the
//! whole request (method, URI, headers, payload). The values of secret headers are never written
//! (see [`DeadLetterLayer::redact_header`](crate::dead_letter::DeadLetterLayer::redact_header)).
//! Reading a store never panics on what it holds; store URLs print without their password
//! ([`redact_url`]).
//!
//! [`Stats`] reads the counts of a window and raises the signals of [`AlertRules`].
//!
//! # Example
//!
//! ```
//! use tower_backstop::store::{MemoryStore, Store};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! assert!(store.list(10).await.unwrap().is_empty());
//! # }
//! ```
//!
//! # Customised
//!
//! Keep the last 5 errors per record, and search one tag among the records of the last hour:
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use tower_backstop::store::{Filter, MemoryStore, Status, Store};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new().with_history_limit(5);
//! let hour_ago = SystemTime::now() - Duration::from_secs(3600);
//! let filter = Filter::new().tag("campaign", "spring").since(hour_ago).status(Status::Dead);
//! let spring = store.search(&filter, 0..10).await.unwrap();
//! assert!(spring.is_empty());
//! # }
//! ```

#[doc(inline)]
pub use tower_backstop_store::*;

mod stats;

pub use self::stats::Stats;
pub use crate::observe::{Alert, AlertRules};
