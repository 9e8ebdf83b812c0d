//! [`BackstopLayer`]: the five layers in the right order, from one set of settings.

use std::time::Duration;

use tower::util::Either;
use tower_layer::Layer;

use crate::Class;
use crate::breaker::{Breaker, BreakerLayer};
use crate::classify::{Classify, ClassifyLayer, GrpcClassifier, HttpClassifier};
use crate::dead_letter::{DeadLetter, DeadLetterLayer};
use crate::retry::{Retry, RetryLayer, RetryPolicy};
use crate::timeout::{Timeout, TimeoutLayer};

/// The five layers in the order the crate is designed for, built from one set of settings:
/// [`DeadLetterLayer`] (when a store is given), [`RetryLayer`], [`BreakerLayer`],
/// [`ClassifyLayer`], [`TimeoutLayer`], outermost first (DESIGN §2).
///
/// Defaults: [`RetryPolicy::default`] (3 attempts, jittered capped backoff, `Retry-After`
/// honoured, idempotent requests only), [`BreakerLayer::default`] (open after 5 consecutive
/// failures for 30 s), no dead-letter store (a final failure is returned to the caller, not
/// recorded). The per-attempt timeout has no default: it depends on the provider, so it is the
/// one required setting.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backstop::BackstopLayer;
/// use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore};
/// use tower_backstop::retry::RetryPolicy;
///
/// # let client = tower::service_fn(|_: http::Request<String>| async {
/// #     Ok::<_, tower_backstop::BoxError>(http::Response::new(()))
/// # });
/// let svc = ServiceBuilder::new()
///     .layer(
///         BackstopLayer::http(Duration::from_secs(2))
///             .retry(RetryPolicy::new().max_attempts(5))
///             .dead_letters(DeadLetterLayer::new(MemoryStore::new())),
///     )
///     .service(client);
/// # let _ = svc;
/// ```
///
/// The service is an [`Either`]: with a dead-letter store, `Left` (the five layers); without,
/// `Right` (the four below it). Both have the same request, response and error types.
#[derive(Clone, Debug)]
pub struct BackstopLayer<C = HttpClassifier> {
    dead_letters: Option<DeadLetterLayer>,
    retry: RetryLayer,
    breaker: BreakerLayer,
    classify: ClassifyLayer<C>,
    timeout: TimeoutLayer,
}

impl BackstopLayer<HttpClassifier> {
    /// The stack for an HTTP client (hyper-util, reqwest): [`HttpClassifier::new`]'s mapping,
    /// each attempt bounded by `attempt_timeout`, the other defaults above.
    pub fn http(attempt_timeout: Duration) -> Self {
        BackstopLayer::new(HttpClassifier::new(), attempt_timeout)
    }
}

impl<C> BackstopLayer<C> {
    /// The stack classifying with `classifier` (for example
    /// [`GrpcClassifier`](crate::classify::GrpcClassifier)), each attempt bounded by
    /// `attempt_timeout`, the other defaults above.
    pub fn new(classifier: C, attempt_timeout: Duration) -> Self {
        BackstopLayer {
            dead_letters: None,
            retry: RetryLayer::default(),
            breaker: BreakerLayer::default(),
            classify: ClassifyLayer::new(classifier),
            timeout: TimeoutLayer::new(attempt_timeout),
        }
    }

    /// Records requests that finally fail in this dead-letter layer's store (outermost).
    pub fn dead_letters(mut self, layer: DeadLetterLayer) -> Self {
        self.dead_letters = Some(layer);
        self
    }

    /// Retries by `policy`.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = RetryLayer::new(policy);
        self
    }

    /// Uses this breaker (its state is shared by every service this layer wraps).
    pub fn breaker(mut self, breaker: BreakerLayer) -> Self {
        self.breaker = breaker;
        self
    }
}

impl BackstopLayer<GrpcClassifier> {
    /// The stack for a gRPC client: [`GrpcClassifier::new`]'s mapping, [`RetryPolicy::grpc`],
    /// each attempt bounded by `attempt_timeout`, the other defaults above. Around a tonic
    /// `Channel`, put `GrpcLayer` (feature `tonic`) above it.
    pub fn grpc(attempt_timeout: Duration) -> Self {
        BackstopLayer::new(GrpcClassifier::new(), attempt_timeout).retry(RetryPolicy::grpc())
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

/// The four layers below [`DeadLetterLayer`] in a [`BackstopLayer`].
pub type Attempts<S, C> = Retry<Breaker<Classify<Timeout<S>, C>>>;

impl<S, C: Clone> Layer<S> for BackstopLayer<C> {
    type Service = Either<DeadLetter<Attempts<S, C>>, Attempts<S, C>>;

    fn layer(&self, inner: S) -> Self::Service {
        let attempts = self.retry.layer(
            self.breaker
                .layer(self.classify.layer(self.timeout.layer(inner))),
        );
        match &self.dead_letters {
            Some(dead_letters) => Either::Left(dead_letters.layer(attempts)),
            None => Either::Right(attempts),
        }
    }
}
