use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::config::{BuildError, Builder};
use super::future::Guard;
use super::state::{Shared, SharedRef};
use super::{BreakerHandle, ResponseFuture};
use crate::failure::Failure;

/// Takes the key of a request: which breaker of a [`KeyedBreakerLayer`] guards it.
///
/// Implemented by [`Authority`] (the default) and by closures `Fn(&Req) -> Option<String>`.
/// `None` sends the request to the layer's shared `other` breaker.
pub trait KeyOf<Req>: Send + Sync + 'static {
    /// The key of `req`, borrowed from it when possible.
    fn key<'r>(&self, req: &'r Req) -> Option<Cow<'r, str>>;
}

/// The default key of an HTTP request: the authority of its URI (`host:port`), else its `Host`
/// header. Borrowed from the request: taking it allocates nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Authority;

impl<B> KeyOf<http::Request<B>> for Authority {
    fn key<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        if let Some(authority) = req.uri().authority() {
            return Some(Cow::Borrowed(authority.as_str()));
        }
        req.headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(Cow::Borrowed)
    }
}

impl<Req, F> KeyOf<Req> for F
where
    F: Fn(&Req) -> Option<String> + Send + Sync + 'static,
{
    fn key<'r>(&self, req: &'r Req) -> Option<Cow<'r, str>> {
        self(req).map(Cow::Owned)
    }
}

struct Registry {
    template: Builder,
    max_keys: usize,
    breakers: RwLock<HashMap<Box<str>, Arc<Shared>>>,
    other: Arc<Shared>,
}

impl Registry {
    fn get(&self, key: Option<&str>) -> Arc<Shared> {
        let Some(key) = key else {
            return Arc::clone(&self.other);
        };
        // A poisoned lock only means another thread panicked while inserting: the map is whole.
        let read = self.breakers.read().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = read.get(key) {
            return Arc::clone(shared);
        }
        drop(read);
        let mut write = self.breakers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = write.get(key) {
            return Arc::clone(shared);
        }
        if write.len() >= self.max_keys {
            tracing::debug!(
                key,
                max_keys = self.max_keys,
                "breaker key over the bound; using the shared breaker"
            );
            return Arc::clone(&self.other);
        }
        let shared = self.template.clone().name(key).shared();
        write.insert(key.into(), Arc::clone(&shared));
        shared
    }
}

/// One breaker per key taken from the request: per host by default ([`Authority`]), or per
/// provider with a closure. See the [module docs](super) for what each breaker does.
///
/// The number of keys is bounded ([`max_keys`](Self::max_keys), 64 by default): requests with a
/// new key beyond the bound, and requests without a key, share one more breaker named `other`.
/// Each breaker is built from the same [`Builder`], named after its key.
///
/// The lookup takes a read lock on the key map (a write lock the first time a key is seen), so
/// unlike [`Breaker`](super::Breaker) this path is not lock-free; the breakers themselves are.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backstop::breaker::{BreakerLayer, KeyedBreakerLayer};
///
/// // One breaker per `host:port`, at most 16 of them.
/// let per_host = KeyedBreakerLayer::new(BreakerLayer::builder().consecutive_failures(3))
///     .unwrap()
///     .max_keys(16);
/// // One per provider, from a header.
/// let per_provider = KeyedBreakerLayer::with_key(BreakerLayer::builder(), |req: &http::Request<()>| {
///     req.headers().get("x-provider")?.to_str().ok().map(str::to_owned)
/// })
/// .unwrap();
/// # let _ = (per_host, per_provider);
/// ```
pub struct KeyedBreakerLayer<K = Authority> {
    key: Arc<K>,
    registry: Arc<Registry>,
}

impl<K> Clone for KeyedBreakerLayer<K> {
    fn clone(&self) -> Self {
        KeyedBreakerLayer {
            key: Arc::clone(&self.key),
            registry: Arc::clone(&self.registry),
        }
    }
}

impl<K> fmt::Debug for KeyedBreakerLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakerLayer")
            .field("max_keys", &self.registry.max_keys)
            .field("keys", &self.keys())
            .finish()
    }
}

impl KeyedBreakerLayer<Authority> {
    /// Breakers built from `template`, one per request authority.
    ///
    /// # Errors
    ///
    /// The [`BuildError`] of `template`, if it is invalid.
    pub fn new(template: Builder) -> Result<Self, BuildError> {
        KeyedBreakerLayer::with_key(template, Authority)
    }
}

impl<K> KeyedBreakerLayer<K> {
    /// Breakers built from `template`, one per key that `key` takes from the request.
    ///
    /// # Errors
    ///
    /// The [`BuildError`] of `template`, if it is invalid.
    pub fn with_key(template: Builder, key: K) -> Result<Self, BuildError> {
        template.validate()?;
        let other = template.clone().name("other").shared();
        Ok(KeyedBreakerLayer {
            key: Arc::new(key),
            registry: Arc::new(Registry {
                template,
                max_keys: 64,
                breakers: RwLock::default(),
                other,
            }),
        })
    }

    /// The most keys with a breaker of their own (a count; 0 sends everything to `other`).
    /// Builds a fresh set of breakers.
    pub fn max_keys(self, n: usize) -> Self {
        let registry = &self.registry;
        KeyedBreakerLayer {
            key: self.key,
            registry: Arc::new(Registry {
                template: registry.template.clone(),
                max_keys: n,
                breakers: RwLock::default(),
                other: registry.template.clone().name("other").shared(),
            }),
        }
    }

    /// The handle of the breaker of `key`, once a request with that key was seen.
    pub fn handle(&self, key: &str) -> Option<BreakerHandle> {
        let map = self
            .registry
            .breakers
            .read()
            .unwrap_or_else(|e| e.into_inner());
        map.get(key).map(|shared| BreakerHandle {
            shared: SharedRef::Counted(Arc::clone(shared)),
        })
    }

    /// The handle of the `other` breaker, shared by requests without a key or over the bound.
    pub fn other(&self) -> BreakerHandle {
        BreakerHandle {
            shared: SharedRef::Counted(Arc::clone(&self.registry.other)),
        }
    }

    /// The keys that have a breaker, sorted.
    pub fn keys(&self) -> Vec<String> {
        let map = self
            .registry
            .breakers
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<String> = map.keys().map(|k| k.to_string()).collect();
        keys.sort();
        keys
    }
}

impl<S, K> Layer<S> for KeyedBreakerLayer<K> {
    type Service = Keyed<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Keyed {
            inner,
            key: Arc::clone(&self.key),
            registry: Arc::clone(&self.registry),
        }
    }
}

/// The service of a [`KeyedBreakerLayer`].
///
/// Its `poll_ready` is the inner service's (the key is only known at `call`); a call whose
/// breaker is open fails at once without calling the inner service.
pub struct Keyed<S, K = Authority> {
    inner: S,
    key: Arc<K>,
    registry: Arc<Registry>,
}

impl<S: Clone, K> Clone for Keyed<S, K> {
    fn clone(&self) -> Self {
        Keyed {
            inner: self.inner.clone(),
            key: Arc::clone(&self.key),
            registry: Arc::clone(&self.registry),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for Keyed<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed").field("inner", &self.inner).finish()
    }
}

impl<S, K, Req> Service<Req> for Keyed<S, K>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    K: KeyOf<Req>,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S::Future, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = self.registry.get(self.key.key(&req).as_deref());
        match shared.admit() {
            Ok(permit) => ResponseFuture::called(
                self.inner.call(req),
                Guard::owned(SharedRef::Counted(shared), permit),
            ),
            Err(r) => ResponseFuture::rejected(r),
        }
    }
}
