//! [`BackstopLayer`]: the five layers in the right order, from one set of settings.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

#[cfg(feature = "dead-letter")]
use tower::util::Either;
#[cfg(feature = "dead-letter")]
use tower::util::future::EitherResponseFuture;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{BreakerLayer, Builder, PerKey};
use crate::classify::{Classify, ClassifyLayer, GrpcClassifier, HttpClassifier};
#[cfg(feature = "dead-letter")]
use crate::dead_letter::{self, DeadLetter, DeadLetterLayer, DeadLetterRetryLayer};
use crate::failure::Class;
use crate::failure::Failure;
use crate::observe::{Health, Hook, Listener};
#[cfg(feature = "dead-letter")]
use crate::request::Describe;
use crate::request::Replay;
use crate::retry::{self, Retry, RetryLayer, RetryPolicy};
use crate::timeout::{Timeout, TimeoutLayer};

#[cfg(feature = "serde")]
pub(crate) mod config;
#[cfg(feature = "serde")]
mod reload;

#[cfg(feature = "serde")]
pub use self::reload::Reload;

/// The breaker rule of the presets and the README: open when at least half of the last 100 calls
/// failed, once 20 were seen (resilience4j's defaults: a 50 % failure-rate threshold over a
/// 100-call window, minimum 100 calls; ours acts after 20 so a small service is covered too),
/// for 1 s, doubling at each trip while the provider keeps failing, up to 30 s, jittered by half
/// so that many breakers do not half-open together. Noise (a few failures in a healthy provider's
/// traffic) stays under the rate; an outage crosses it within 20 calls.
pub(crate) fn client_rule() -> Builder {
    BreakerLayer::builder()
        .failure_rate(0.5)
        .count_window(100)
        .minimum_calls(20)
        .open_doubling(Duration::from_secs(1), Duration::from_secs(30))
        .open_jitter(0.5)
}

/// The five layers in the order the crate is designed for, built from one set of settings:
/// [`DeadLetterLayer`] (when a store is given), [`RetryLayer`], [`BreakerLayer`],
/// [`ClassifyLayer`], [`TimeoutLayer`], outermost first.
///
/// Defaults: [`RetryPolicy::default`] (3 attempts, jittered capped backoff, `Retry-After`
/// honoured, idempotent requests only); for HTTP clients one breaker per host
/// ([`BreakerLayer::per_host`], so one host's outage never fails calls to another), each opening when
/// at least half of its last 100 calls failed (once 20 were seen), for 1 s doubling to 30 s with
/// jitter, and each pacing its host with an adaptive send rate once the host answers throttled
/// (a `429` lowers the rate instead of opening the breaker: see
/// [`AdaptiveRate`](crate::breaker::AdaptiveRate); [`without_adaptive_rate`](Self::without_adaptive_rate)
/// turns it off), with an adaptive concurrency limit to turn on for a provider that limits the
/// calls in flight ([`adaptive_concurrency`](Self::adaptive_concurrency); off by default); no
/// dead-letter store (a final failure is returned to the caller, not recorded,
/// and nothing is deferred: a wait above the retry layer's in-process bound gives the request
/// up with [`GiveUp::HintTooLong`](crate::retry::GiveUp::HintTooLong)). The
/// per-attempt timeout has no default: it depends on the provider, so it is the one required
/// setting.
///
/// With a store, the dead-letter and retry layers are built as one, sharing the retry layer's
/// copy of the request, so a request is copied once per call, not twice (unless the store has
/// an [attempt budget](DeadLetterLayer::attempt_budget) or
/// [write-ahead](DeadLetterLayer::write_ahead), which act before the first attempt: then each
/// keeps its own copy, as when stacked by hand), and the retry
/// layer sleeps a server's hint in process only up to one per-attempt timeout (unless
/// [`RetryPolicy::max_hint_delay`] or [`RetryPolicy::max_delay`] was set): a longer hint (a
/// `Retry-After: 1` with a 500 ms timeout) is deferred to the store, whose
/// [`Scheduler`](crate::resend::Scheduler) sends the request again when it is due, and the
/// caller's slot goes on to the next request. Backoff delays are still slept, so
/// `max_attempts` still caps one pass. Run a `Scheduler` beside such a stack (the operations
/// guide, `docs/operations.md`: "The scheduler: sending deferred requests again").
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backstop::BackstopLayer;
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop::store::MemoryStore;
/// use tower_backstop::retry::RetryPolicy;
///
/// # let client = tower::service_fn(|_: http::Request<String>| async {
/// #     Ok::<_, tower_backstop::BoxError>(http::Response::new(()))
/// # });
/// let svc = ServiceBuilder::new()
///     .layer(
///         BackstopLayer::http(Duration::from_secs(2))
///             .retry(RetryPolicy::new().max_attempts(5).build()?)
///             .dead_letters(DeadLetterLayer::new(MemoryStore::new())),
///     )
///     .service(client);
/// # let _ = svc;
/// # Ok::<(), tower_backstop::BuildError>(())
/// ```
///
/// The service is an [`Either`]: with a dead-letter store, `Left` (the five layers); without,
/// `Right` (the four below it). Both have the same request, response and error types.
#[derive(Clone, Debug)]
pub struct BackstopLayer<C = HttpClassifier, B = BreakerLayer<PerKey>> {
    #[cfg(feature = "dead-letter")]
    dead_letters: Option<DeadLetterLayer>,
    retry: RetryLayer,
    breaker: B,
    classify: ClassifyLayer<C>,
    attempt_timeout: Duration,
    listener: Hook,
    /// Whether the retry policy's base is [`RetryPolicy::grpc`] (a reload builds over it).
    grpc: bool,
    /// The retry policies of a reloadable stack (see [`reloadable`](Self::reloadable)).
    #[cfg(feature = "serde")]
    reload: Option<std::sync::Arc<crate::retry::PolicyCell>>,
}

impl BackstopLayer<HttpClassifier> {
    /// The stack for an HTTP client (hyper-util, reqwest): [`HttpClassifier::new`]'s mapping,
    /// each attempt bounded by `attempt_timeout`, and the other defaults of [`BackstopLayer`]
    /// ([`RetryPolicy::default`]; one breaker per host, opening when half of its last 100
    /// calls failed once 20 were seen, for 1 s doubling to 30 s; no store).
    ///
    /// `attempt_timeout` means what it means for [`TimeoutLayer::new`]: a zero timeout lets
    /// through only an answer ready at its first poll (and with a store defers every server
    /// hint), which no client wants but no call panics on.
    pub fn http(attempt_timeout: Duration) -> Self {
        BackstopLayer::new(HttpClassifier::new(), attempt_timeout)
    }
}

impl<C> BackstopLayer<C> {
    /// The stack classifying with `classifier` (for example
    /// [`GrpcClassifier`](crate::classify::GrpcClassifier)), each attempt bounded by
    /// `attempt_timeout`, and the other defaults of [`BackstopLayer`] ([`RetryPolicy::default`];
    /// one breaker per request authority, opening when half of its last 100 calls failed once
    /// 20 were seen, for 1 s doubling to 30 s; no store).
    pub fn new(classifier: C, attempt_timeout: Duration) -> Self {
        let per_host = client_rule()
            .per_host()
            .build()
            .expect("the preset breaker rule is valid (checked by a unit test)");
        BackstopLayer {
            #[cfg(feature = "dead-letter")]
            dead_letters: None,
            retry: RetryLayer::of(RetryPolicy::default().with_attempt_bound(attempt_timeout)),
            breaker: per_host,
            classify: ClassifyLayer::new(classifier),
            attempt_timeout,
            listener: Hook::default(),
            grpc: false,
            #[cfg(feature = "serde")]
            reload: None,
        }
    }
}

impl<C, B> BackstopLayer<C, B> {
    /// Records requests that finally fail in this dead-letter layer's store (outermost).
    ///
    /// Unless the layer's [`retry_schedule`](DeadLetterLayer::retry_schedule) was set, the
    /// preset turns on the default second tier ([`RetrySchedule::new`]): a transient failure
    /// that used up its in-process attempts is stored deferred and re-sent by a
    /// [`Scheduler`](crate::resend::Scheduler) after 5 s, 1 min and 15 min before it is dead.
    /// Run a scheduler over the same store; for dead letters at once, set
    /// [`RetrySchedule::none`].
    ///
    /// [`RetrySchedule::new`]: crate::dead_letter::RetrySchedule::new
    /// [`RetrySchedule::none`]: crate::dead_letter::RetrySchedule::none
    #[cfg(feature = "dead-letter")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
    pub fn dead_letters(mut self, layer: DeadLetterLayer) -> Self {
        let layer = layer.default_schedule();
        self.dead_letters = Some(if self.listener.is_set() {
            layer.with_hook(&self.listener)
        } else {
            layer
        });
        self
    }

    /// Retries with this layer instead: a policy checked by [`RetryPolicy::build`], as
    /// [`breaker`](Self::breaker) takes a built breaker layer.
    pub fn retry(mut self, retry: RetryLayer) -> Self {
        // The time left written into each attempt is never above the per-attempt timeout.
        let policy = retry.policy.with_attempt_bound(self.attempt_timeout);
        self.retry = RetryLayer::of(if self.listener.is_set() {
            policy.with_hook(&self.listener)
        } else {
            policy
        });
        #[cfg(feature = "serde")]
        {
            self.reload = None;
        }
        self
    }

    /// Uses this breaker layer instead: a [`BreakerLayer`] (one breaker, whose state every
    /// service this layer wraps shares), one per host or per key with a rule of yours
    /// ([`BreakerLayer::per_host`], [`BreakerLayer::keyed_by`]),
    /// or any layer between the retry and classify layers.
    pub fn breaker<B2>(self, breaker: B2) -> BackstopLayer<C, B2> {
        BackstopLayer {
            #[cfg(feature = "dead-letter")]
            dead_letters: self.dead_letters,
            retry: self.retry,
            breaker,
            classify: self.classify,
            attempt_timeout: self.attempt_timeout,
            listener: self.listener,
            grpc: self.grpc,
            #[cfg(feature = "serde")]
            reload: None,
        }
    }
}

impl<C, K: Send + Sync + 'static> BackstopLayer<C, BreakerLayer<K>> {
    /// A reader of this stack's breakers (for the HTTP preset one per host, listed by
    /// `host:port` as requests reach them), for a health or admin route: see [`Health`]. Take
    /// it from the layer before building the service; every service the layer builds shares
    /// these breakers.
    pub fn health(&self) -> Health {
        let health = self.breaker.health();
        #[cfg(feature = "sqlite")]
        if let Some(spool) = self
            .dead_letters
            .as_ref()
            .and_then(DeadLetterLayer::spool_ref)
        {
            return health.spool(spool);
        }
        health
    }
}

#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
impl<C, K> BackstopLayer<C, BreakerLayer<K>> {
    /// Learns from the dead-letter store which providers were down when a process last ran, and
    /// starts their breakers open until the stored half-open times: see
    /// [`BreakerLayer::learn_from`]. Call it once at start-up, after
    /// [`dead_letters`](Self::dead_letters), [`breaker`](Self::breaker) and
    /// [`listener`](Self::listener) (each of which builds the breakers afresh) and before the
    /// first request. Without a store it learns nothing. Returns the number of breakers opened.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`](crate::store::StoreError) when its deferred records cannot be
    /// read.
    pub async fn learn_from_store(&self) -> Result<usize, crate::store::StoreError> {
        match &self.dead_letters {
            Some(layer) => self.breaker.learn_from(&**layer.store()).await,
            None => Ok(0),
        }
    }

    /// Shares this stack's breakers with the other processes of the fleet through the
    /// dead-letter store they share: see [`Fleet`](crate::breaker::Fleet) and
    /// [`BreakerLayer::share`]. Call it inside a tokio runtime, after
    /// [`dead_letters`](Self::dead_letters), [`breaker`](Self::breaker) and
    /// [`listener`](Self::listener) (each builds the breakers afresh), and keep the handle as
    /// long as the services serve: dropping it stops the sharing.
    ///
    /// # Errors
    ///
    /// A [`BuildError`](crate::BuildError) when the stack has no dead-letter store, a
    /// [`Fleet`](crate::breaker::Fleet) setting is out of range, or there is no tokio runtime.
    pub fn share_breakers(
        &self,
        fleet: crate::breaker::Fleet,
    ) -> Result<crate::breaker::FleetHandle, crate::BuildError>
    where
        K: Send + Sync + 'static,
    {
        match &self.dead_letters {
            Some(layer) => self
                .breaker
                .share(std::sync::Arc::clone(layer.store()), fleet),
            None => Err(crate::BuildError::new(
                "share_breakers",
                "no dead-letter store",
                "give the stack a store with dead_letters first: the fleet shares it",
            )),
        }
    }
}

impl<C, K: Clone> BackstopLayer<C, BreakerLayer<K>> {
    /// Turns the breakers' adaptive send rate off ([`AdaptiveRate`](crate::breaker::AdaptiveRate),
    /// on by default): calls to a provider that answers throttled are no longer spaced, and
    /// each request only honours its own `Retry-After`. The breakers are built afresh without
    /// it (call it before taking a [`health`](Self::health) reader); a throttled answer still
    /// does not count as a failure (add [`Class::THROTTLED`] to
    /// [`Builder::failure_classes`](crate::breaker::Builder::failure_classes) and pass that
    /// breaker to [`breaker`](Self::breaker) for a breaker that opens on them).
    pub fn without_adaptive_rate(mut self) -> Self {
        self.breaker = self.breaker.without_rate();
        #[cfg(feature = "serde")]
        {
            self.reload = None;
        }
        self
    }

    /// Turns the breakers' adaptive concurrency limit on
    /// ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency), off by default): once a
    /// provider signals overload (a `429` or a `503`), the calls in flight to it are counted and
    /// bounded by a limit learnt from its answers. Off by default because it cannot tell an
    /// overload from failures of single requests: a provider that answers one request in five
    /// `429` or `503` whatever the load would see its calls in flight cut to a few. Turn it on
    /// for a provider that limits the calls in flight. The breakers are built afresh with it
    /// (call it before taking a [`health`](Self::health) reader).
    pub fn adaptive_concurrency(
        mut self,
        concurrency: crate::breaker::AdaptiveConcurrency,
    ) -> Self {
        self.breaker = self.breaker.with_concurrency(concurrency);
        #[cfg(feature = "serde")]
        {
            self.reload = None;
        }
        self
    }

    /// Turns the breakers' adaptive concurrency limit off again
    /// ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency), off by default; see
    /// [`adaptive_concurrency`](Self::adaptive_concurrency)). The breakers are built afresh
    /// without it (call it before taking a [`health`](Self::health) reader).
    pub fn without_adaptive_concurrency(mut self) -> Self {
        self.breaker = self.breaker.without_concurrency();
        #[cfg(feature = "serde")]
        {
            self.reload = None;
        }
        self
    }

    /// Hands every layer's events to `listener`, the retry layer's, the breaker's and the
    /// dead-letter layer's: attempts, retries, timeouts, giving up, breaker transitions and
    /// rejections, dead letters and store errors (see [`observe`](crate::observe)). It replaces a
    /// listener those layers had, and reaches a retry policy or dead-letter layer given later.
    ///
    /// The breakers are built afresh with it: call it before taking a
    /// [`health`](Self::health) reader, and after [`breaker`](Self::breaker) (a breaker layer
    /// given after it has no listener; give it one with
    /// [`Builder::listener`](crate::breaker::Builder::listener)). A
    /// [`Scheduler`](crate::resend::Scheduler) takes its own
    /// ([`Scheduler::listener`](crate::resend::Scheduler::listener)).
    pub fn listener(mut self, listener: impl Listener) -> Self {
        let hook = Hook::new(listener);
        self.breaker = self.breaker.with_hook(&hook);
        self.retry = RetryLayer::of(self.retry.policy.with_hook(&hook));
        #[cfg(feature = "serde")]
        {
            self.reload = None;
        }
        #[cfg(feature = "dead-letter")]
        {
            self.dead_letters = self.dead_letters.map(|layer| layer.with_hook(&hook));
        }
        self.listener = hook;
        self
    }
}

impl BackstopLayer<GrpcClassifier, BreakerLayer> {
    /// The stack for a gRPC client: [`GrpcClassifier::new`]'s mapping, [`RetryPolicy::grpc`],
    /// each attempt bounded by `attempt_timeout`, one breaker (a `Channel` is one endpoint) with
    /// the failure-rate rule of [`BackstopLayer`] (half of the last 100 calls failed once 20 were
    /// seen; open 1 s doubling to 30 s), no store. Around a tonic `Channel`, put `GrpcLayer`
    /// (feature `tonic`) on top of it: each attempt then carries `grpc-timeout`, the least of
    /// `attempt_timeout`, the retry deadline's time left and the caller's own.
    pub fn grpc(attempt_timeout: Duration) -> Self {
        BackstopLayer::new(GrpcClassifier::new(), attempt_timeout)
            .retry(
                RetryPolicy::grpc()
                    .build()
                    .expect("the gRPC retry policy is valid (checked by a unit test)"),
            )
            .breaker(BreakerLayer::single(&client_rule()))
            .grpc_base()
    }

    fn grpc_base(mut self) -> Self {
        self.grpc = true;
        self
    }
}

impl RetryPolicy {
    /// A retry policy for gRPC clients, after gRFC A6: at most 5 attempts (A6's cap on
    /// `maxAttempts`); every call treated as safe to send again (every gRPC call is an HTTP POST,
    /// and A6 leaves retryability to the service config, not the method); `UNAVAILABLE` (and an
    /// open breaker, a per-attempt timeout, a refused connection: [`Class::TRANSIENT`]) and
    /// `RESOURCE_EXHAUSTED` ([`Class::THROTTLED`]) retried, `grpc-retry-pushback-ms` honoured
    /// (a negative value stops); `UNKNOWN`, `INTERNAL` and the other codes of
    /// [`Class::UNKNOWN`] never retried, as A6 retries only the codes it is told to. The backoff
    /// is the default one (exponential with full jitter, as A6's).
    pub fn grpc() -> Self {
        RetryPolicy::new()
            .max_attempts(5)
            .assume_idempotent(true)
            .never_retry(Class::UNKNOWN)
    }
}

/// The breaker, classify and timeout layers of a [`BackstopLayer`] with breaker layer `B`.
pub(crate) type Guarded<S, C, B> = <B as Layer<Classify<Timeout<S>, C>>>::Service;

/// The service a [`BackstopLayer`] builds around `S`: the five layers with a dead-letter store,
/// the four below the dead-letter layer without. For example the type of
/// `BackstopLayer::grpc(..)` around a tonic `Channel` is
/// `Backstop<Channel, GrpcClassifier, BreakerLayer>`.
///
/// Its error is the [`Failure`] of the response type; its future is the dead-letter layer's over
/// the retry layer's, or the retry layer's alone.
pub struct Backstop<S, C = HttpClassifier, B = BreakerLayer<PerKey>>
where
    B: Layer<Classify<Timeout<S>, C>>,
{
    inner: Inner<Guarded<S, C, B>>,
}

impl<S, C, B> Clone for Backstop<S, C, B>
where
    B: Layer<Classify<Timeout<S>, C>>,
    Guarded<S, C, B>: Clone,
{
    fn clone(&self) -> Self {
        Backstop {
            inner: self.inner.clone(),
        }
    }
}

impl<S, C, B> fmt::Debug for Backstop<S, C, B>
where
    B: Layer<Classify<Timeout<S>, C>>,
    Guarded<S, C, B>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backstop")
            .field("inner", &self.inner)
            .finish()
    }
}

/// The preset's service over the guarded layers `G`: with a store, or without.
///
/// With a store: sharing one request copy (`Left`), or, under a dead-letter attempt budget or
/// write-ahead, which act before the retry layer's first call, stacked (`Right(Left)`, a copy
/// each).
#[cfg(feature = "dead-letter")]
type Inner<G> = Either<dead_letter::WithRetry<G>, Either<DeadLetter<Retry<G>>, Retry<G>>>;

/// Without the dead-letter layer (feature `dead-letter` off), the retry layer and the ones below.
#[cfg(not(feature = "dead-letter"))]
type Inner<G> = Retry<G>;

#[cfg(feature = "dead-letter")]
impl<S, C, B, Req> Service<Req> for Backstop<S, C, B>
where
    B: Layer<Classify<Timeout<S>, C>>,
    Guarded<S, C, B>: Service<Req> + Clone,
    <Guarded<S, C, B> as Service<Req>>::Error:
        Into<Failure<<Guarded<S, C, B> as Service<Req>>::Response>>,
    <Guarded<S, C, B> as Service<Req>>::Response: 'static,
    Req: Replay + Describe + Send + 'static,
{
    type Response = <Guarded<S, C, B> as Service<Req>>::Response;
    type Error = Failure<Self::Response>;
    type Future = EitherResponseFuture<
        dead_letter::ResponseFuture<Retry<Guarded<S, C, B>>, Req>,
        EitherResponseFuture<
            dead_letter::ResponseFuture<Retry<Guarded<S, C, B>>, Req>,
            retry::ResponseFuture<Guarded<S, C, B>, Req>,
        >,
    >;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call(req)
    }
}

#[cfg(not(feature = "dead-letter"))]
impl<S, C, B, Req> Service<Req> for Backstop<S, C, B>
where
    B: Layer<Classify<Timeout<S>, C>>,
    Guarded<S, C, B>: Service<Req> + Clone,
    <Guarded<S, C, B> as Service<Req>>::Error:
        Into<Failure<<Guarded<S, C, B> as Service<Req>>::Response>>,
    <Guarded<S, C, B> as Service<Req>>::Response: 'static,
    Req: Replay + 'static,
{
    type Response = <Guarded<S, C, B> as Service<Req>>::Response;
    type Error = Failure<Self::Response>;
    type Future = retry::ResponseFuture<Guarded<S, C, B>, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call(req)
    }
}

impl<S, C: Clone, B> Layer<S> for BackstopLayer<C, B>
where
    B: Layer<Classify<Timeout<S>, C>>,
{
    type Service = Backstop<S, C, B>;

    fn layer(&self, inner: S) -> Self::Service {
        let guarded = self.breaker.layer(
            self.classify
                .layer(TimeoutLayer::new(self.attempt_timeout).layer(inner)),
        );
        #[cfg(not(feature = "dead-letter"))]
        return Backstop {
            // No store: nothing can be deferred (see below).
            inner: self.retry_layer(NO_STORE).layer(guarded),
        };
        #[cfg(feature = "dead-letter")]
        match &self.dead_letters {
            Some(dead_letters) => {
                // With a store, a server's wait longer than one attempt is the store's job.
                // The bound is a preset's, not the user's: it is not checked against
                // `max_delay`, which bounds it anyway.
                let retry = self.retry_layer(WITH_STORE);
                let inner = if dead_letters.needs_own_copy() {
                    Either::Right(Either::Left(dead_letters.layer(retry.layer(guarded))))
                } else {
                    Either::Left(
                        DeadLetterRetryLayer::new(dead_letters.clone(), retry).layer(guarded),
                    )
                };
                Backstop { inner }
            }
            None => {
                // Without a store, nothing can be deferred: a wait above the in-process bound
                // gives the request up, and the caller's failure never says "deferred".
                let retry = self.retry_layer(NO_STORE);
                Backstop {
                    inner: Either::Right(Either::Right(retry.layer(guarded))),
                }
            }
        }
    }
}

/// The preset's retry policy without a store (index of [`BackstopLayer::policies`]).
const NO_STORE: usize = 0;
/// The preset's retry policy with a store.
#[cfg(feature = "dead-letter")]
const WITH_STORE: usize = 1;

/// The retry policy as the stack uses it: without a store ([`NO_STORE`]), and with one
/// ([`WITH_STORE`]).
#[cfg_attr(not(feature = "dead-letter"), allow(unused_variables))]
fn policies(policy: &RetryPolicy, attempt_timeout: Duration) -> Vec<RetryPolicy> {
    // Without a store, nothing can be deferred: a wait above the in-process bound gives the
    // request up, and the caller's failure never says "deferred".
    #[cfg_attr(not(feature = "dead-letter"), allow(unused_mut))]
    let mut policies = vec![policy.clone().give_up_long_delays()];
    // With a store, a server's wait longer than one attempt is the store's job. The bound is a
    // preset's, not the user's: it is not checked against `max_delay`, which bounds it anyway.
    #[cfg(feature = "dead-letter")]
    policies.push(policy.clone().max_hint_delay_unless_chosen(attempt_timeout));
    policies
}

impl<C, B> BackstopLayer<C, B> {
    /// The retry layer of the stack, without a store or with one (`variant`): a reloadable
    /// stack's takes its policy from the reload's cell.
    fn retry_layer(&self, variant: usize) -> RetryLayer {
        #[cfg(feature = "serde")]
        if let Some(cell) = &self.reload {
            let (live, policy) = crate::retry::LivePolicy::new(cell.clone(), variant);
            return RetryLayer {
                policy,
                live: Some(live),
            };
        }
        RetryLayer::of(policies(&self.retry.policy, self.attempt_timeout).swap_remove(variant))
    }
}

// How the order checks find the preset's service below another layer.
impl crate::order::Named for crate::order::Preset {
    fn name() -> &'static str {
        crate::order::named::<Backstop<()>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preset_breaker_rule_is_valid() {
        client_rule().build().expect("valid");
        client_rule().per_host().build().expect("valid");
    }

    #[test]
    fn the_preset_retry_policies_are_valid() {
        RetryPolicy::default().build().expect("valid");
        RetryPolicy::grpc().build().expect("valid");
    }
}
