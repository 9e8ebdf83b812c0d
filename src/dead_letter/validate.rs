//! Validation before sending: a request the user's validator rejects never reaches the provider.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::failure::{Class, Code, Failure};

/// Checks a request before it is sent (seed 002 §5, "defensive validation"): required fields,
/// a well-formed recipient, a template that renders. `Ok(())` sends it; `Err(reason)` rejects
/// it.
///
/// Implemented for closures `Fn(&Req) -> Result<(), E>` with `E: Display` (the reason).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a validator of `{Req}` requests",
    note = "a validator is a `Fn(&{Req}) -> Result<(), E>` where `E: Display` is the reason"
)]
pub trait Validator<Req>: Send + Sync + 'static {
    /// `Ok(())` when `request` may be sent, else why not.
    ///
    /// # Errors
    ///
    /// The reason the request is invalid; it becomes the failure's message and the dead
    /// letter's.
    fn validate(&self, request: &Req) -> Result<(), String>;
}

impl<Req, F, E> Validator<Req> for F
where
    F: Fn(&Req) -> Result<(), E> + Send + Sync + 'static,
    E: fmt::Display,
{
    fn validate(&self, request: &Req) -> Result<(), String> {
        self(request).map_err(|e| e.to_string())
    }
}

/// The error inside a [`Failure`] for a request the validator rejected: the source of the
/// failure, with the validator's reason.
#[derive(Debug)]
pub struct Invalid {
    reason: String,
}

impl Invalid {
    /// The validator's reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid request, not sent: {}", self.reason)
    }
}

impl std::error::Error for Invalid {}

/// Runs a [`Validator`] on each request before the services below it see it.
///
/// A rejected request is not sent: the call fails at once with class [`Class::POISON`] (never
/// retried: it would fail the same way every time), code [`Code::Error`] and an [`Invalid`]
/// source carrying the reason, and a `tracing` error event. Under a
/// [`DeadLetterLayer`](super::DeadLetterLayer) it becomes one dead letter of class `poison`
/// whose message is the reason.
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_backstop::dead_letter::{DeadLetterLayer, ValidateLayer};
/// use tower_backstop::store::{MemoryStore, Store};
/// use tower_backstop::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let svc = ServiceBuilder::new()
///     .layer(DeadLetterLayer::new(store.clone()))
///     .layer(ValidateLayer::new(|job: &String| {
///         if job.contains('@') { Ok(()) } else { Err("invalid recipient email") }
///     }))
///     .service(service_fn(|_: String| async { Ok::<_, BoxError>(()) }));
/// let failure = svc.oneshot("nobody".to_owned()).await.unwrap_err();
/// assert_eq!(failure.class().name(), "poison");
/// assert_eq!(store.list(10).await.unwrap()[0].message, "invalid request, not sent: invalid recipient email");
/// # }
/// ```
pub struct ValidateLayer<V> {
    validator: Arc<V>,
}

impl<V> ValidateLayer<V> {
    /// A layer that checks each request with `validator`.
    pub fn new(validator: V) -> Self {
        ValidateLayer {
            validator: Arc::new(validator),
        }
    }
}

impl<V> Clone for ValidateLayer<V> {
    fn clone(&self) -> Self {
        ValidateLayer {
            validator: Arc::clone(&self.validator),
        }
    }
}

impl<V> fmt::Debug for ValidateLayer<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidateLayer").finish_non_exhaustive()
    }
}

impl<S, V> Layer<S> for ValidateLayer<V> {
    type Service = Validate<S, V>;

    fn layer(&self, inner: S) -> Self::Service {
        Validate {
            inner,
            validator: Arc::clone(&self.validator),
        }
    }
}

/// The service of [`ValidateLayer`].
pub struct Validate<S, V> {
    inner: S,
    validator: Arc<V>,
}

impl<S: Clone, V> Clone for Validate<S, V> {
    fn clone(&self) -> Self {
        Validate {
            inner: self.inner.clone(),
            validator: Arc::clone(&self.validator),
        }
    }
}

impl<S: fmt::Debug, V> fmt::Debug for Validate<S, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Validate")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, V, Req> Service<Req> for Validate<S, V>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    V: Validator<Req>,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ValidateFuture<S::Future, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.validator.validate(&req) {
            Ok(()) => ValidateFuture {
                state: ValidateState::Called {
                    future: self.inner.call(req),
                },
            },
            Err(reason) => {
                tracing::error!(
                    class = %Class::POISON,
                    reason = %reason,
                    "request failed validation; not sent"
                );
                ValidateFuture {
                    state: ValidateState::Rejected {
                        failure: Some(
                            Failure::new(Class::POISON, Code::Error)
                                .with_source(Invalid { reason }),
                        ),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// Response future of [`Validate`]: the inner call, or the rejection at once.
    pub struct ValidateFuture<F, R> {
        #[pin]
        state: ValidateState<F, R>,
    }
}

pin_project! {
    #[project = ValidateProj]
    enum ValidateState<F, R> {
        Called {
            #[pin]
            future: F,
        },
        Rejected {
            failure: Option<Failure<R>>,
        },
    }
}

impl<F, R> fmt::Debug for ValidateFuture<F, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidateFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ValidateFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            ValidateProj::Called { future } => future.poll(cx).map_err(Into::into),
            ValidateProj::Rejected { failure } => match failure.take() {
                Some(failure) => Poll::Ready(Err(failure)),
                // Polled after completion.
                None => Poll::Pending,
            },
        }
    }
}
