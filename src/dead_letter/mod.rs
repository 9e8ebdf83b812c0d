//! The last word: a request that finally fails becomes a dead letter in a [`Store`], where people
//! can search it and re-drive it on purpose. Nothing is dropped silently.
//!
//! [`DeadLetterLayer`] sits outermost. When the call below it fails (attempts exhausted, a
//! permanent or poison failure, a breaker open with no attempt left), it writes one [`Record`]:
//! the id (the request's `Idempotency-Key`, or a generated message id), the class, the original
//! code, the message, the attempt count, the first and last failure times, the retry-at time when
//! the server named one, and the original payload with what is needed to re-send it. Writing the
//! same id again updates the record instead of duplicating it.
//!
//! The caller still receives the failure, with [`Failure::dead_letter`] saying where the record
//! went. A store that cannot be written does not hide the original failure: the failure comes
//! back with [`DeadLetterStatus::NotStored`](crate::DeadLetterStatus::NotStored) and the store's
//! error, and a `tracing` error event reports it.
//!
//! To describe the request after the inner service consumed it, the layer keeps a copy made with
//! [`Replay`]: free for `Bytes` and `Full<Bytes>` bodies. The record is built from it with
//! [`Describe`] on the failure path only; the success path allocates
//! nothing.
//!
//! # Example
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore, Store};
//! use tower_backstop::{BoxError, DeadLetterStatus};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! let svc = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(store.clone()))
//!     .service(service_fn(|_: String| async {
//!         Err::<(), BoxError>("template failed to render".into())
//!     }));
//! let failure = svc.oneshot("{\"to\":\"a@example.com\"}".to_owned()).await.unwrap_err();
//! let Some(DeadLetterStatus::Stored { id }) = failure.dead_letter() else { panic!() };
//! let record = store.get(id).await.unwrap().unwrap();
//! assert_eq!(record.payload, b"{\"to\":\"a@example.com\"}");
//! assert_eq!(record.message, "template failed to render");
//! # }
//! ```
//!
//! For a durable store, use [`SqliteStore::open`] (feature `sqlite`, on by default).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::failure::Failure;
use crate::request::{Describe, Replay};

mod future;
mod layer;
mod record;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

pub use self::future::ResponseFuture;
pub use self::layer::DeadLetterLayer;
pub use self::record::Record;
#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteStore;
pub use self::store::{BoxFuture, MemoryStore, Store, StoreError};

/// Writes each final failure to a dead-letter [`Store`]; see the [module docs](self).
#[derive(Clone)]
pub struct DeadLetter<S> {
    inner: S,
    store: Arc<dyn Store>,
}

impl<S> DeadLetter<S> {
    /// Wraps `inner`, writing dead letters to `store`.
    pub fn new(inner: S, store: Arc<dyn Store>) -> Self {
        DeadLetter { inner, store }
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
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    Req: Replay + Describe + Send + 'static,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S::Future, Req, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let kept = req.replay();
        ResponseFuture::new(self.inner.call(req), kept, Arc::clone(&self.store))
    }
}
