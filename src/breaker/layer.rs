#[cfg(feature = "dead-letter")]
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "dead-letter")]
use std::time::SystemTime;

#[cfg(feature = "dead-letter")]
use tokio::time::Instant;

use tower_layer::Layer;

use super::Breaker;
use super::admission::Admission;
use super::builder::Builder;
use super::handle::BreakerHandle;
use super::keyed::{Authority, PerKey, Registry};
use super::state::{Settings, Shared};
use crate::build_error::BuildError;
use crate::failure::Class;
use crate::observe::{Health, Hook};
use crate::status::State;
#[cfg(feature = "dead-letter")]
use crate::store::{Filter, Status, Store, StoreError};

/// Applies [`Breaker`] to a service, and owns the breakers' state.
///
/// The state is created with the layer and shared by every service it wraps and all their clones.
/// `BreakerLayer` (that is, `BreakerLayer<()>`) is one breaker: one per endpoint, in a
/// typical client. [`per_host`](Self::per_host) makes it one breaker per host
/// (`BreakerLayer<PerKey>`, its key an [`Authority`](super::Authority)), [`keyed_by`](Self::keyed_by) one per key of yours
/// (`BreakerLayer<PerKey<F>>`). Configure it first, then take a [`handle`](Self::handle): each
/// configuration method builds a fresh breaker.
///
/// Defaults: open after 5 consecutive failures, stay open 30 s, admit 1 probe in half-open and
/// close after it succeeds, count [`Class::TRANSIENT`] and [`Class::UNKNOWN`] as failures (a
/// [`Class::THROTTLED`] answer lowers the [send rate](super::AdaptiveRate) instead; a permanent
/// 4xx is the caller's fault and does not trip it).
/// [`BreakerLayer::builder`] sets everything else: rate rules over count or time windows,
/// slow calls, growing open durations, several probes, a listener, keys and their bound; its
/// [`build`](Builder::build) checks the settings.
pub struct BreakerLayer<K = ()> {
    /// The breaker (unkeyed, `K = ()`), or the one of requests without a key (keyed).
    shared: Arc<Shared>,
    /// The breakers per key: `Some` exactly when keyed.
    keys: Option<Arc<Registry<K>>>,
}

#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
impl<K> BreakerLayer<K> {
    /// Learns from `store` which providers were failing when a process last ran, or are now
    /// for the other processes of a fleet that [`share`](Self::share) their breakers: each
    /// [`Deferred`](Status::Deferred) record rejected by an open breaker carries that breaker's
    /// name ([`Record::breaker`](crate::store::Record::breaker): a keyed breaker's key, such as
    /// `api.mail.test:443`) and its half-open time ([`Record::retry_at`](crate::store::Record::retry_at)).
    /// This layer's breaker of that name, if closed, opens until the latest such time, so that
    /// a new process does not spend fresh attempts on a provider known to be down; a time
    /// already past half-opens it at its next call. A keyed layer makes the breaker of each key
    /// it reads; an unkeyed one learns only the records of its own name. When the store holds
    /// the fleet's notes on a breaker, they win over the records: a breaker a running process
    /// has closed is not opened, and one they all have open opens until the earliest of their
    /// half-open times (not a stale time from the records). Call it once at start-up, before
    /// the first request, with the store the dead-letter layer writes to.
    ///
    /// Returns the number of breakers opened.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`] when the deferred records cannot be read.
    pub async fn learn_from<St>(&self, store: &St) -> Result<usize, StoreError>
    where
        St: Store + ?Sized,
    {
        self.learn_from_records(store).await
    }

    /// Shares this layer's breakers with the other processes of a fleet through `store` (the
    /// one their dead-letter layers share), as [`Fleet`](super::Fleet) describes: a task on the
    /// current tokio runtime publishes each breaker's state, opens a breaker a quorum of the
    /// fleet found failing, closes one a peer's probe closed, and applies an operator's
    /// [`FleetOverride`](super::FleetOverride). Call it once the layer is complete (after the
    /// settings that build its breakers afresh), and keep the handle: dropping it stops the
    /// sharing. Nothing changes on a call's path.
    ///
    /// # Errors
    ///
    /// A [`BuildError`](crate::BuildError) naming a [`Fleet`](super::Fleet) setting out of
    /// range, or when called outside a tokio runtime.
    pub fn share(
        &self,
        store: Arc<dyn Store>,
        fleet: super::Fleet,
    ) -> Result<super::FleetHandle, crate::BuildError>
    where
        K: Send + Sync + 'static,
    {
        let breakers = Arc::new(super::fleet::LayerBreakers {
            unkeyed: Arc::clone(&self.shared),
            keys: self.keys.clone(),
        });
        super::fleet::start(breakers, store, fleet)
    }

    async fn learn_from_records<St>(&self, store: &St) -> Result<usize, StoreError>
    where
        St: Store + ?Sized,
    {
        let filter = Filter::new().status(Status::Deferred);
        let records = store.search(&filter, 0..usize::MAX).await?;
        let mut until: BTreeMap<String, Evidence> = BTreeMap::new();
        for record in records {
            if let (Some(name), Some(at)) = (record.breaker.clone(), record.retry_at) {
                until
                    .entry(name)
                    .or_insert_with(Evidence::new)
                    .add(&record, at);
            }
        }
        let (now, wall) = (Instant::now(), SystemTime::now());
        // A fleet that shares its breakers knows better than the records: the processes that
        // run now say whether the provider is down, and until when.
        let notes = store.notes(wall).await.unwrap_or_default();
        let mut opened = 0;
        for (name, mut evidence) in until {
            match super::fleet::fleet_says(&notes, &name) {
                Some(super::fleet::Said::Closed) => continue,
                Some(super::fleet::Said::OpenUntil(at)) => evidence.until = at,
                None => {}
            }
            let shared = match &self.keys {
                None if name == *self.shared.name => Arc::clone(&self.shared),
                None => continue,
                Some(keys) => keys.get(&name),
            };
            let left = evidence.until.duration_since(wall).unwrap_or_default();
            let at = now.checked_add(left).unwrap_or(now + MAX_LEARNED);
            if shared.open_until(at, evidence.describe()) {
                opened += 1;
            }
        }
        Ok(opened)
    }
}

/// What the deferred records of one breaker say of its outage: when it began (the earliest
/// root cause, or rejection, among them), the last real failure they name, and the latest
/// half-open time.
#[cfg(feature = "dead-letter")]
struct Evidence {
    since: Option<SystemTime>,
    last: Option<(SystemTime, String)>,
    until: SystemTime,
}

#[cfg(feature = "dead-letter")]
impl Evidence {
    fn new() -> Self {
        Evidence {
            since: None,
            last: None,
            until: std::time::UNIX_EPOCH,
        }
    }

    /// Adds a record rejected by the breaker, to be re-sent at `at`.
    fn add(&mut self, record: &crate::store::Record, at: SystemTime) {
        self.until = self.until.max(at);
        let began = record
            .cause
            .as_ref()
            .map_or(record.last_failed_at, |c| c.at);
        self.since = Some(self.since.map_or(began, |s| s.min(began)));
        if let Some(cause) = &record.cause
            && self.last.as_ref().is_none_or(|(t, _)| cause.at > *t)
        {
            self.last = Some((cause.at, cause.message.clone()));
        }
    }

    /// `learned from the store: open since 2026-04-01T14:00:00.000Z in an earlier process, until
    /// 2026-04-01T14:00:30.000Z; its last failure: connection refused (io ConnectionRefused)`.
    fn describe(&self) -> String {
        let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let mut text = String::from("learned from the store: open");
        if let Some(since) = self.since {
            text.push_str(&format!(" since {}", time(since)));
        }
        text.push_str(&format!(
            " in an earlier process, until {}",
            time(self.until)
        ));
        if let Some((_, last)) = &self.last {
            text.push_str(&format!("; its last failure: {last}"));
        }
        text
    }
}

/// The latest half-open time [`BreakerLayer::learn_from`] sets when a stored one is too far
/// ahead to represent: a week.
#[cfg(feature = "dead-letter")]
const MAX_LEARNED: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl<K> Clone for BreakerLayer<K> {
    fn clone(&self) -> Self {
        BreakerLayer {
            shared: Arc::clone(&self.shared),
            keys: self.keys.clone(),
        }
    }
}

impl<K> fmt::Debug for BreakerLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BreakerLayer");
        match &self.keys {
            None => d
                .field("name", &self.shared.name)
                .field("state", &self.shared.state()),
            Some(keys) => d
                .field("max_keys", &keys.max_keys())
                .field("keys", &keys.keys()),
        };
        d.finish()
    }
}

impl Default for BreakerLayer {
    fn default() -> Self {
        BreakerLayer::new()
    }
}

impl BreakerLayer {
    /// A breaker with the defaults above.
    pub fn new() -> Self {
        BreakerLayer::single(&Builder::default())
    }

    /// A [`Builder`] for every setting; [`Builder::build`] checks it.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The breaker of a builder already checked (or whose settings need no check).
    pub(crate) fn single(builder: &Builder) -> Self {
        BreakerLayer {
            shared: Shared::new(&builder.settings),
            keys: None,
        }
    }

    /// A breaker that opens after `n` consecutive failures (a count of failed calls; values below
    /// 1 are raised to 1), with the other defaults.
    pub fn consecutive_failures(n: u32) -> Self {
        BreakerLayer::single(&Builder::default().consecutive_failures(n.max(1)))
    }

    fn with(&self, f: impl FnOnce(Builder) -> Builder) -> Self {
        BreakerLayer::single(&f(self.to_builder()))
    }

    /// How long the breaker stays open before it half-opens (a fixed duration).
    pub fn open_for(self, duration: Duration) -> Self {
        self.with(|b| b.open_for(duration))
    }

    /// The classes that count as failures; any other failure is ignored by the breaker.
    pub fn failure_classes(self, classes: &[Class]) -> Self {
        self.with(|b| b.failure_classes(classes))
    }

    /// A name for the breaker's `tracing` events (the provider or host it guards).
    pub fn name(self, name: &str) -> Self {
        self.with(|b| b.name(name))
    }

    /// The configuration this layer was built from, to derive another breaker from it.
    pub fn to_builder(&self) -> Builder {
        Builder {
            settings: self.shared.settings(),
            keys: (),
        }
    }

    /// A handle to read this breaker's state and counters, and to control it.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.shared))
    }

    /// The breaker's door, for the server flavour.
    pub(crate) fn admission(&self) -> Admission {
        Admission::new(Arc::clone(&self.shared))
    }

    /// One breaker per host instead, each with this breaker's settings and named after its key:
    /// one per normalised request authority ([`Authority`]: `host:port`, lower case), at most 64
    /// ([`Builder::max_keys`] sets another bound). A client that calls many hosts should use
    /// this rather than one breaker: one host's outage then never fails calls to another.
    ///
    /// When a new key comes and the bound is reached, an idle breaker (no call in flight, no
    /// handle held) is evicted, a closed one before an open one and then the least recently
    /// used, and the new key gets a fresh breaker; if every breaker has calls in flight, the new
    /// key's call goes through a fresh breaker that is not kept. Requests without a key (a
    /// relative URI with no `Host` header) share one breaker named `unkeyed`
    /// ([`unkeyed`](BreakerLayer::unkeyed)).
    ///
    /// A call to a known key takes a read lock on the key map (never a write lock), clones the
    /// key's `Arc`, and allocates nothing; a new key takes the write lock once. The service's
    /// `poll_ready` is the inner service's (the key is only known at `call`); a call whose
    /// breaker is open fails at once without calling the inner service.
    ///
    /// ```
    /// use tower_backstop::breaker::{BreakerLayer, PerKey};
    ///
    /// // One breaker per `host:port`, each opening after 3 failures in a row.
    /// let per_host: BreakerLayer<PerKey> = BreakerLayer::consecutive_failures(3).per_host();
    /// // The same, at most 16 hosts.
    /// let bounded = BreakerLayer::builder()
    ///     .consecutive_failures(3)
    ///     .per_host()
    ///     .max_keys(16)
    ///     .build()
    ///     .expect("a valid configuration");
    /// # let _ = (per_host, bounded);
    /// ```
    pub fn per_host(self) -> BreakerLayer<PerKey<Authority>> {
        self.keyed_by(Authority)
    }

    /// One breaker per key that `key` takes from the request (a [`KeyOf`](super::KeyOf): a
    /// closure `Fn(&Req) -> Option<String>`), otherwise as [`per_host`](Self::per_host).
    ///
    /// ```
    /// use tower_backstop::breaker::BreakerLayer;
    ///
    /// // One per provider, from a header.
    /// let per_provider = BreakerLayer::new().keyed_by(|req: &http::Request<()>| {
    ///     req.headers().get("x-provider")?.to_str().ok().map(str::to_owned)
    /// });
    /// # let _ = per_provider;
    /// ```
    pub fn keyed_by<F>(self, key: F) -> BreakerLayer<PerKey<F>> {
        BreakerLayer::from_keyed(self.to_builder().keyed_by(key))
    }
}

impl<F> BreakerLayer<PerKey<F>> {
    /// The breakers of a builder already checked.
    fn from_keyed(builder: Builder<PerKey<F>>) -> Self {
        let unkeyed = Shared::new(&builder.settings.named("unkeyed"));
        BreakerLayer {
            shared: unkeyed,
            keys: Some(Arc::new(Registry::new(builder.keys, builder.settings))),
        }
    }

    /// The handle of the breaker of `key` (as normalised by the key function: for
    /// [`Authority`], `host:port` in lower case), once a request with that key was seen. While
    /// the handle is held, that breaker is not evicted.
    pub fn handle_for(&self, key: &str) -> Option<BreakerHandle> {
        self.keys
            .as_ref()
            .and_then(|keys| keys.find(key))
            .map(BreakerHandle::new)
    }

    /// The handle of the breaker shared by requests without a key.
    pub fn unkeyed(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.shared))
    }

    /// The keys that have a breaker, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.keys
            .as_ref()
            .map(|keys| keys.keys())
            .unwrap_or_default()
    }
}

impl Builder {
    /// Checks the configuration and builds the breaker.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the setting when a rate is outside `(0.0, 1.0]`, a count is zero
    /// or too large, a window is empty, the minimum number of calls exceeds a count window, or
    /// the open duration is invalid (see [`Builder::open_doubling`](super::Builder::open_doubling) and [`Builder::open_jitter`](super::Builder::open_jitter)).
    pub fn build(self) -> Result<BreakerLayer, BuildError> {
        self.validate()?;
        Ok(BreakerLayer::single(&self))
    }
}

impl<F> Builder<PerKey<F>> {
    /// Checks the configuration and builds the keyed breakers.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the setting, as for one breaker, or when
    /// [`max_keys`](Builder::max_keys) is 0.
    pub fn build(self) -> Result<BreakerLayer<PerKey<F>>, BuildError> {
        self.validate_keyed()?;
        Ok(BreakerLayer::from_keyed(self))
    }
}

impl<K> BreakerLayer<K> {
    /// A reader of this layer's breakers (one, or with [`per_host`](Self::per_host) and
    /// [`keyed_by`](Self::keyed_by) one per key), for a health or admin route: see [`Health`].
    /// A keyed layer's `unkeyed` breaker is listed only once a request without a key went
    /// through it (or a handle moved it out of closed): a layer whose requests always have a
    /// key has no such breaker to watch.
    pub fn health(&self) -> Health
    where
        K: Send + Sync + 'static,
    {
        let unkeyed = Arc::clone(&self.shared);
        let keys = self.keys.clone();
        Health::of(move |read| {
            let listed = keys
                .as_ref()
                .is_none_or(|keys| keys.had_keyless_call() || unkeyed.state() != State::Closed);
            if listed {
                read(unkeyed.snapshot());
            }
            if let Some(keys) = &keys {
                keys.each(&mut |shared| read(shared.snapshot()));
            }
        })
    }
}

// Used by a reload (feature `serde`).
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
impl<K> BreakerLayer<K> {
    /// Whether this layer keeps one breaker per key.
    pub(crate) fn is_keyed(&self) -> bool {
        self.keys.is_some()
    }

    /// The settings its breakers are built from now (a keyed layer's template).
    fn current(&self) -> Settings {
        match &self.keys {
            Some(keys) => keys.template(),
            None => self.shared.settings(),
        }
    }

    /// The first setting of `builder` that these breakers cannot take while they run, by its
    /// method's name (see [`Settings::shape_change`]); `None` when [`retune`](Self::retune)
    /// can take it.
    pub(crate) fn cannot_take<K2>(&self, builder: &Builder<K2>) -> Option<&'static str> {
        self.current().shape_change(&builder.settings)
    }

    /// Takes the thresholds of `builder` (checked, and of the same shape: see
    /// [`cannot_take`](Self::cannot_take)) in every breaker of this layer, each keeping its
    /// state, and `max_keys` as a keyed layer's bound. The listener stays this layer's.
    pub(crate) fn retune<K2>(&self, builder: &Builder<K2>, max_keys: Option<usize>) {
        let mut settings = builder.settings.clone();
        settings.listener = self.shared.settings().listener;
        match &self.keys {
            Some(keys) => {
                keys.retune(&settings, max_keys.unwrap_or_else(|| keys.max_keys()));
                self.shared.retune(&settings.named("unkeyed"));
            }
            None => self.shared.retune(&settings),
        }
    }
}

impl<K: Clone> BreakerLayer<K> {
    /// Fresh breakers with the same settings and `hook` as their listener, for the preset.
    pub(crate) fn with_hook(&self, hook: &Hook) -> Self {
        self.rebuilt(|settings| settings.listener = hook.arc())
    }

    /// Fresh breakers with the same settings and no adaptive send rate, for the preset.
    pub(crate) fn without_rate(&self) -> Self {
        self.rebuilt(|settings| settings.rate = None)
    }

    /// Fresh breakers with the same settings and no adaptive concurrency limit, for the
    /// preset.
    pub(crate) fn without_concurrency(&self) -> Self {
        self.rebuilt(|settings| settings.concurrency = None)
    }

    /// Fresh breakers with the same settings and this adaptive concurrency limit, for the
    /// preset.
    pub(crate) fn with_concurrency(
        &self,
        concurrency: crate::breaker::AdaptiveConcurrency,
    ) -> Self {
        self.rebuilt(|settings| settings.concurrency = Some(concurrency))
    }

    /// Fresh breakers with the same settings, changed by `change`.
    fn rebuilt(&self, change: impl Fn(&mut Settings)) -> Self {
        let mut settings = self.shared.settings();
        change(&mut settings);
        BreakerLayer {
            shared: Shared::new(&settings),
            keys: self.keys.as_ref().map(|keys| {
                let mut template = keys.template();
                change(&mut template);
                Arc::new(keys.with_template(template))
            }),
        }
    }
}

impl<S, K> Layer<S> for BreakerLayer<K> {
    type Service = Breaker<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::Breaker);
        Breaker::new(inner, Arc::clone(&self.shared), self.keys.clone())
    }
}

// How the order checks find this layer's service below another layer (keyed too: its
// name is the one breaker's, with a key type).
impl crate::order::Named for crate::order::Breaker {
    fn name() -> &'static str {
        crate::order::named::<Breaker<()>>()
    }
}
