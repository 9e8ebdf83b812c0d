//! The last word: a request that finally fails becomes a dead letter in a [`Store`], where people
//! can search it and re-drive it on purpose. Nothing is dropped silently.
//!
//! [`DeadLetterLayer`] sits outermost. When the call below it fails (attempts exhausted, a
//! permanent or poison failure, a breaker open with no attempt left), it writes one [`Record`]:
//! the id (the request's `Idempotency-Key`, or a generated message id), the class, the original
//! code, the message, the attempt count, the first and last failure times, the retry-at time when
//! the failure is deferred (see [`record_of`]), tags from your function, and the
//! original payload (up to a size limit) with what is needed to re-send it. Writing the same id
//! again updates the record instead of duplicating it, keeping the last K errors in its history.
//!
//! The caller still receives the failure, with a [`DeadLetterStatus`] note saying where the
//! record went. A store that cannot be written does not hide the original failure: the failure comes
//! back with [`DeadLetterStatus::NotStored`] and the store's
//! error, and a `tracing` error event reports it.
//!
//! To describe the request after the inner service consumed it, the layer keeps a copy made with
//! [`Replay`]: free for `Bytes` and `Full<Bytes>` bodies. The record is built from it with
//! [`Describe`] on the failure path only; the success path allocates nothing and waits on
//! nothing: a failure costs one store write.
//!
//! # Example
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::store::{MemoryStore, Store};
//! use tower_backstop::BoxError;
//! use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! let svc = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(store.clone()))
//!     .service(service_fn(|_: String| async {
//!         Err::<(), BoxError>("template failed to render".into())
//!     }));
//! let failure = svc.oneshot("{\"to\":\"a@example.com\"}".to_owned()).await.unwrap_err();
//! let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>() else { panic!() };
//! let record = store.get(id).await.unwrap().unwrap();
//! assert_eq!(record.payload, b"{\"to\":\"a@example.com\"}");
//! assert_eq!(record.message, "template failed to render");
//! # }
//! ```
//!
//! For a durable store, use [`SqliteStore::open`] (feature `sqlite`, on by default); for many
//! instances, `RedisStore` (feature `redis`). The stores, their records and their queries are in
//! [`store`](crate::store): writes merge by id, search with a [`Filter`] and a range of positions,
//! [`Counts`] over a window, atomic claims of due records.
//!
//! # Customised
//!
//! Tags from the payload, a 16 KiB payload limit, and a durable attempt budget for a queue
//! consumer (a message that used up 5 attempts before a restart is poison):
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::dead_letter::DeadLetterLayer;
//! use tower_backstop::store::{Filter, MemoryStore, Store};
//! use tower_backstop::BoxError;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new().with_history_limit(5);
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         DeadLetterLayer::new(store.clone())
//!             .max_payload(16 * 1024)
//!             .tags(|envelope| {
//!                 let v: serde_json::Value =
//!                     serde_json::from_slice(&envelope.payload).unwrap_or_default();
//!                 let campaign = v["campaign"].as_str();
//!                 campaign.map(|c| vec![("campaign".into(), c.into())]).unwrap_or_default()
//!             })
//!             .attempt_budget(5),
//!     )
//!     .service(service_fn(|_: String| async { Err::<(), BoxError>("smtp 421".into()) }));
//! let _ = svc.oneshot("{\"campaign\":\"spring\"}".to_owned()).await;
//! let spring = store.search(&Filter::new().tag("campaign", "spring"), 0..10).await.unwrap();
//! assert_eq!(spring.len(), 1);
//! # }
//! ```
//!
//! # Options
//!
//! - [`tags`](DeadLetterLayer::tags), [`max_payload`](DeadLetterLayer::max_payload),
//!   [`redact_header`](DeadLetterLayer::redact_header), [`clock`](DeadLetterLayer::clock):
//!   what a record holds.
//! - [`attempt_budget`](DeadLetterLayer::attempt_budget): a durable attempt budget per message
//!   id; a message that spent it in earlier runs is refused at once, poison, with a
//!   [`BudgetSpent`] source.
//! - Validation before sending is tower's `FilterLayer` below the retry layer, rejecting with
//!   [`Invalid`](crate::classify::Invalid): the request never reaches the provider, is poison, and
//!   is dead-lettered once with the reason.
//! - [`RetryPolicy::reconcile`] asks your [`StatusCheck`] before an outcome-unknown failure
//!   reaches this layer.
//! - [`write_ahead`](DeadLetterLayer::write_ahead): each request is stored before its first
//!   attempt and resolved on success, so that a process that dies while a call is out (in a
//!   backoff sleep) loses nothing: a [`Scheduler`] takes the request over. It costs store round
//!   trips on every call; off by default.
//! - [`Outbox`] ([`DeadLetterLayer::outbox`]): puts a request in the store for the
//!   [`Scheduler`] to send, now or at a time, instead of calling; with Postgres, in your own
//!   transaction.
//!
//! # Afterwards
//!
//! - [`Stats`]: top classes and codes over a window, the dead-letter rate, and the alert signals
//!   of [`AlertRules`] (a class above 20 % of the last 5 minutes, a code never seen before).
//! - [`resend`](crate::resend): [`Scheduler`] re-sends deferred records when their retry-at time
//!   comes, [`Redrive`] re-sends on purpose (a filter, a dry run, a rate and a maximum), and
//!   [`Reconciler`] asks your [`StatusCheck`] about stored outcome-unknown records.
//! - The `backstop-dlq` command-line tool (feature `cli`) does all of these over a SQLite file
//!   or a Redis URL.
//!
//! A record keeps the whole request: method, URI, every header (values byte for byte) and the
//! body; the values of secret headers ([`DeadLetterLayer::redact_header`]: `Authorization`, `Cookie`, API keys…)
//! are never written, and [`http_request_restoring`] gets them back from your hook.
//!
//! [`Store`]: crate::store::Store
//! [`Record`]: crate::store::Record
//! [`Filter`]: crate::store::Filter
//! [`Counts`]: crate::store::Counts
//! [`SqliteStore::open`]: crate::store::SqliteStore::open
//! [`Stats`]: crate::store::Stats
//! [`AlertRules`]: crate::store::AlertRules
//! [`Scheduler`]: crate::resend::Scheduler
//! [`Redrive`]: crate::resend::Redrive
//! [`Reconciler`]: crate::resend::Reconciler
//! [`RetryPolicy::reconcile`]: crate::retry::RetryPolicy::reconcile
//! [`StatusCheck`]: crate::retry::StatusCheck
//! [`http_request_restoring`]: crate::resend::http_request_restoring

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::failure::Failure;
use crate::request::{Describe, Replay};
use crate::store::Store;

pub(crate) mod bounded;
mod budget;
pub(crate) mod claim;
mod future;
mod headers;
mod layer;
mod note;
mod outbox;
mod record;
pub(crate) mod resending;
mod schedule;
mod spool;
mod with_retry;
mod write_ahead;

pub use self::budget::BudgetSpent;
pub use self::future::ResponseFuture;
pub(crate) use self::headers::RedactHeaders;
pub use self::layer::{DEFAULT_PAYLOAD_LIMIT, DEFAULT_STORE_TIMEOUT, DeadLetterLayer};
pub use self::note::DeadLetterStatus;
pub use self::outbox::Outbox;
pub use self::record::{MAX_DEFERRAL, record_of};
pub use self::schedule::RetrySchedule;
pub(crate) use self::with_retry::{DeadLetterRetry as WithRetry, DeadLetterRetryLayer};
pub use self::write_ahead::{DEFAULT_WRITE_AHEAD_LEASE, QUEUED};

/// Writes each final failure to a dead-letter [`Store`]; see the [module docs](self).
#[derive(Clone)]
pub struct DeadLetter<S> {
    inner: S,
    config: Arc<layer::Config>,
    /// Whether the layer acts before the call (an attempt budget, write-ahead), read once.
    acts_before: bool,
}

impl<S> DeadLetter<S> {
    /// Wraps `inner`, writing dead letters to `store` with the default payload limit and no
    /// tags; [`DeadLetterLayer`] sets those.
    pub fn new(inner: S, store: Arc<dyn Store>) -> Self {
        DeadLetter {
            inner,
            config: Arc::new(layer::Config::new(store)),
            acts_before: false,
        }
    }
}

impl<S> DeadLetter<S> {
    /// A call that keeps no copy of its own: `call` gets the inner service and returns its
    /// future and what this layer keeps, `Kept::HandedBack` when the copy comes back on the
    /// failure (the retry layer's unsent spare, see `with_retry`), or the record id of a
    /// request that could not be copied.
    #[inline]
    pub(crate) fn call_reusing<Req>(
        &mut self,
        call: impl FnOnce(&mut S) -> (S::Future, future::Kept<Req>),
    ) -> ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        debug_assert!(
            self.config.budget.is_none(),
            "an attempt budget is read before the call: the preset stacks the two layers"
        );
        let (future, kept) = call(&mut self.inner);
        ResponseFuture::new(future, kept, self.config.clone())
    }

    /// The inner service.
    pub(crate) fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for DeadLetter<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetter")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for DeadLetter<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<Failure<S::Response>>,
    Req: Replay + Describe + Send + 'static,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let kept = future::Kept::of(&req, req.replay());
        let before = if self.acts_before {
            future::Before::of(&self.config, &req)
        } else {
            None
        };
        ResponseFuture::start(&mut self.inner, req, before, kept, self.config.clone())
    }
}
