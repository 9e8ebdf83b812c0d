use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::record::DEFAULT_PAYLOAD_LIMIT;
use super::{Clock, DeadLetter, RedactHeaders, Store};
use crate::anchor::Anchor;
use crate::request::Envelope;

/// A function that extracts searchable tags (campaign, provider, tenant…) from a described
/// request. See [`DeadLetterLayer::tags`].
pub type TagFn = dyn Fn(&Envelope) -> Vec<(String, String)> + Send + Sync;

/// Where a [`DeadLetter`] service writes its records, and what it does with a record before it
/// writes it. One `Arc` of it per call, not one per field.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tags: Option<Arc<TagFn>>,
    pub(crate) payload_limit: usize,
    pub(crate) clock: Clock,
    pub(crate) redact: RedactHeaders,
}

impl Config {
    /// Writes to `store`, with the default payload limit, no tags, and the system clock.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Config {
            store,
            tags: None,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            clock: Clock::system(),
            redact: RedactHeaders::default(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("tags", &self.tags.is_some())
            .field("payload_limit", &self.payload_limit)
            .field("clock", &self.clock)
            .field("redact", &self.redact)
            .finish()
    }
}

/// Applies [`DeadLetter`] to a service: a request that finally fails is written to `store`.
#[derive(Clone)]
pub struct DeadLetterLayer {
    config: Anchor<Config>,
}

impl DeadLetterLayer {
    /// A layer that writes dead letters to `store`, keeping payloads up to
    /// [`DEFAULT_PAYLOAD_LIMIT`](super::DEFAULT_PAYLOAD_LIMIT) bytes and no tags. Keep a clone of
    /// the store to search it.
    pub fn new(store: impl Store) -> Self {
        DeadLetterLayer::from_arc(Arc::new(store))
    }

    /// A layer over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        DeadLetterLayer {
            config: Anchor::Counted(Arc::new(Config::new(store))),
        }
    }

    /// Tags each record with what `f` extracts from the described request (its payload,
    /// content type and metadata), added to the tags the request's
    /// [`Describe`](crate::Describe) set. Runs on the failure path only.
    ///
    /// ```
    /// use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore};
    ///
    /// let layer = DeadLetterLayer::new(MemoryStore::new()).tags(|envelope| {
    ///     let message: serde_json::Value =
    ///         serde_json::from_slice(&envelope.payload).unwrap_or_default();
    ///     let mut tags = Vec::new();
    ///     if let Some(campaign) = message["campaign"].as_str() {
    ///         tags.push(("campaign".to_owned(), campaign.to_owned()));
    ///     }
    ///     tags
    /// });
    /// ```
    pub fn tags<F>(mut self, f: F) -> Self
    where
        F: Fn(&Envelope) -> Vec<(String, String)> + Send + Sync + 'static,
    {
        self.config.edit(|c| c.tags = Some(Arc::new(f)));
        self
    }

    /// Keeps at most `bytes` of each payload; a longer payload is stored cut, with
    /// [`Record::payload_truncated`](super::Record::payload_truncated) set, and cannot be
    /// re-sent. The default is [`DEFAULT_PAYLOAD_LIMIT`](super::DEFAULT_PAYLOAD_LIMIT) (64 KiB).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.config.edit(|c| c.payload_limit = bytes);
        self
    }

    /// Which headers' values are never written ([`RedactHeaders::default`] unless set: credentials,
    /// cookies and API keys). Every other header is kept whole and sent again on re-drive.
    ///
    /// ```
    /// use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore, RedactHeaders};
    ///
    /// let layer = DeadLetterLayer::new(MemoryStore::new())
    ///     .redact_headers(RedactHeaders::default().and("x-signature"));
    /// ```
    pub fn redact_headers(mut self, redact: RedactHeaders) -> Self {
        self.config.edit(|c| c.redact = redact);
        self
    }

    /// The clock for record times (failure times, retry-at). Default [`Clock::system`]; tests on
    /// tokio's paused clock use [`Clock::tokio`], the same clock as their
    /// [`Scheduler`](super::Scheduler).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.config.edit(|c| c.clock = clock);
        self
    }
}

impl DeadLetterLayer {
    /// Makes this layer's configuration live until the process ends, so that each call skips
    /// its reference count: the response futures reach the store and the settings through a
    /// `&'static` reference instead of cloning and dropping an `Arc` (two atomic
    /// read-modify-write operations per call, on a cache line every thread's calls share;
    /// `benches/overhead.rs` measures the five layers with it, on one thread and on two).
    ///
    /// The configuration (a few words) is then never freed, and the store it holds is never
    /// dropped: a `SqliteStore`'s connection stays open until the process
    /// exits (SQLite's own recovery makes that safe). Use it for layers built once, at startup,
    /// not for layers built per request. The clones of the store you keep to search it still see
    /// every record. A setter called after it leaks one more copy of the configuration.
    ///
    /// ```
    /// use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let layer = DeadLetterLayer::new(store.clone()).max_payload(4096).into_static();
    /// # let _ = layer;
    /// ```
    pub fn into_static(mut self) -> Self {
        self.config = self.config.leak();
        self
    }
}

impl fmt::Debug for DeadLetterLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for DeadLetterLayer {
    type Service = DeadLetter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::DeadLetter);
        DeadLetter {
            inner,
            config: self.config.clone(),
        }
    }
}
