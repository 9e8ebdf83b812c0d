//! Reconciliation of outcome-unknown requests: ask the provider what happened.
//!
//! A request that is not safe to send twice (a keyless POST) and that timed out or lost its
//! connection after it was sent may or may not have been acted on: its outcome is unknown.
//! Retrying it blindly risks a double send; reporting it as failed risks telling the caller a
//! delivered message was lost. A [`StatusCheck`] (for example `GET /v1/messages/{id}`)
//! decides: [`Delivery::Delivered`], [`Delivery::NotDelivered`] or [`Delivery::Unknown`].
//!
//! - [`ReconcileLayer`] runs the check on the call, before an outcome-unknown failure is handed
//!   back: delivered → the call succeeds (the response says so: [`Reconciled`]); not delivered →
//!   the failure carries proof that the request was not processed
//!   ([`Failure::with_sent`] with [`Sent::No`](crate::Sent::No)) and the retry layer above resends it by its normal rules;
//!   unknown → the failure goes on, is reclassified outcome-unknown by the retry layer, and is
//!   dead-lettered as such.
//! - [`Reconciler`](crate::resend::Reconciler) runs the check over stored outcome-unknown records, on demand (the
//!   `backstop-dlq reconcile` command does it with an HTTP status URL).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::failure::Failure;
use crate::request::{Describe, Envelope, Replay};
use crate::store::BoxFuture;

/// What a provider's status check found out about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Delivery {
    /// The provider has it: the request was processed.
    Delivered,
    /// The provider never got it (or rejected it unprocessed): sending it again is safe.
    NotDelivered,
    /// The check could not tell (the status endpoint failed, timed out, or does not know yet).
    Unknown,
}

/// A user-supplied status check: an async function of a request's [`Envelope`] (its payload,
/// headers, metadata and id) that asks the provider whether it was delivered.
///
/// Implemented for closures `Fn(Envelope) -> impl Future<Output = Delivery>`. The check owns its
/// own timeout: a check that hangs holds up the call (on the request path) or the
/// [`Reconciler`](crate::resend::Reconciler). Return [`Delivery::Unknown`] for anything it cannot decide.
///
/// ```
/// use tower_backstop::Envelope;
/// use tower_backstop::dead_letter::{Delivery, ReconcileLayer};
///
/// let layer = ReconcileLayer::new(|envelope: Envelope| async move {
///     // GET https://provider/v1/messages/{id}: 200 → delivered, 404 → not delivered.
///     let _id = envelope.id;
///     Delivery::Unknown
/// });
/// ```
pub trait StatusCheck: Send + Sync + 'static {
    /// Asks the provider about the request `envelope` describes.
    fn check(&self, envelope: Envelope) -> BoxFuture<'static, Delivery>;
}

impl<F, Fut> StatusCheck for F
where
    F: Fn(Envelope) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Delivery> + Send + 'static,
{
    fn check(&self, envelope: Envelope) -> BoxFuture<'static, Delivery> {
        Box::pin(self(envelope))
    }
}

/// Marks a response that [`ReconcileLayer`] made for a request its status check found
/// delivered: the provider's own response was lost, so this one carries no body. In an HTTP
/// response's extensions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled;

/// A response [`ReconcileLayer`] can stand in with when the status check found the request
/// delivered but the provider's answer was lost.
#[diagnostic::on_unimplemented(
    message = "`ReconcileLayer` cannot make a `{Self}` for a request found delivered",
    note = "implement `ReconciledResponse` for your response type; it is implemented for \
            `http::Response<B>` with `B: Default`, and for `()`"
)]
pub trait ReconciledResponse {
    /// The response for the request `envelope` describes.
    fn reconciled(envelope: &Envelope) -> Self;
}

impl<B: Default> ReconciledResponse for http::Response<B> {
    /// `200 OK`, an empty body, and [`Reconciled`] in the extensions.
    fn reconciled(_: &Envelope) -> Self {
        let mut response = http::Response::new(B::default());
        response.extensions_mut().insert(Reconciled);
        response
    }
}

impl ReconciledResponse for () {
    fn reconciled(_: &Envelope) -> Self {}
}

/// Runs a [`StatusCheck`] on each outcome-unknown failure of a request that is not safe to send
/// twice, before the failure is handed back.
///
/// A request that is not safe to send twice (a keyless POST) and that timed out or lost its
/// connection after it was sent may or may not have been acted on: its outcome is unknown.
/// The check decides: delivered → the call succeeds with a stand-in response marked
/// [`Reconciled`] ([`ReconciledResponse`]); not delivered → the failure carries proof that the
/// request was not processed ([`Failure::with_sent`] with [`Sent::No`](crate::Sent::No)) and the retry layer above resends
/// it by its normal rules, as if it had never been sent; unknown → the failure goes on, the retry
/// layer calls it outcome-unknown and the dead-letter layer records it, for a
/// [`Reconciler`](crate::resend::Reconciler) to settle later.
///
/// Place it below [`RetryLayer`](crate::retry::RetryLayer) and above the
/// [`ClassifyLayer`](crate::classify::ClassifyLayer) (so it sees classified failures and its
/// verdict reaches the retry layer):
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backstop::Envelope;
/// use tower_backstop::classify::ClassifyLayer;
/// use tower_backstop::dead_letter::{Delivery, ReconcileLayer};
/// use tower_backstop::retry::RetryLayer;
/// use tower_backstop::timeout::TimeoutLayer;
///
/// let stack = ServiceBuilder::new()
///     .layer(RetryLayer::default())
///     .layer(ReconcileLayer::new(|_: Envelope| async { Delivery::Unknown }))
///     .layer(ClassifyLayer::http())
///     .layer(TimeoutLayer::new(Duration::from_secs(2)));
/// # let _ = stack;
/// ```
///
/// Only requests that are not safe to send twice ([`Replay::retry_safe`] false) are watched; a
/// copy of each is kept for the check ([`Replay`]: free for `Full<Bytes>` bodies, a header map
/// clone for HTTP). Safe requests pass through untouched and are retried as usual.
#[derive(Clone)]
pub struct ReconcileLayer {
    check: Arc<dyn StatusCheck>,
}

impl ReconcileLayer {
    /// A layer that asks `check` about every outcome-unknown failure.
    pub fn new(check: impl StatusCheck) -> Self {
        ReconcileLayer {
            check: Arc::new(check),
        }
    }

    /// A layer over a check that is already shared (with a [`Reconciler`](crate::resend::Reconciler)).
    pub fn from_arc(check: Arc<dyn StatusCheck>) -> Self {
        ReconcileLayer { check }
    }
}

impl fmt::Debug for ReconcileLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileLayer").finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ReconcileLayer {
    type Service = Reconcile<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Reconcile {
            inner,
            check: Arc::clone(&self.check),
        }
    }
}

/// The service of [`ReconcileLayer`].
#[derive(Clone)]
pub struct Reconcile<S> {
    inner: S,
    check: Arc<dyn StatusCheck>,
}

impl<S: fmt::Debug> fmt::Debug for Reconcile<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconcile")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for Reconcile<S>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    S::Response: ReconciledResponse + Send + 'static,
    Req: Replay + Describe + Send + 'static,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ReconcileFuture<S::Future, Req, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let kept = if req.retry_safe() { None } else { req.replay() };
        let check = kept.as_ref().map(|_| Arc::clone(&self.check));
        ReconcileFuture {
            state: ReconcileState::Called {
                future: self.inner.call(req),
                kept,
                check,
            },
        }
    }
}

pin_project! {
    /// Response future of [`Reconcile`]: the call, then, for an outcome-unknown failure, the
    /// status check.
    pub struct ReconcileFuture<F, Req, R> {
        #[pin]
        state: ReconcileState<F, Req, R>,
    }
}

pin_project! {
    #[project = ReconcileProj]
    enum ReconcileState<F, Req, R> {
        Called {
            #[pin]
            future: F,
            kept: Option<Req>,
            check: Option<Arc<dyn StatusCheck>>,
        },
        Checking {
            check: BoxFuture<'static, (Envelope, Delivery)>,
            failure: Option<Failure<R>>,
        },
    }
}

impl<F, Req, R> fmt::Debug for ReconcileFuture<F, Req, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileFuture").finish_non_exhaustive()
    }
}

impl<F, Req, R, E> Future for ReconcileFuture<F, Req, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
    R: ReconciledResponse,
    Req: Describe + Send + 'static,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                ReconcileProj::Called {
                    future,
                    kept,
                    check,
                } => {
                    let failure: Failure<R> = match ready!(future.poll(cx)) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err(e) => e.into(),
                    };
                    if failure.sent() != crate::failure::Sent::Maybe {
                        return Poll::Ready(Err(failure));
                    }
                    let (Some(request), Some(status)) = (kept.take(), check.take()) else {
                        return Poll::Ready(Err(failure));
                    };
                    let check: BoxFuture<'static, (Envelope, Delivery)> = Box::pin(async move {
                        let envelope = request.describe().await;
                        let delivery = status.check(envelope.clone()).await;
                        (envelope, delivery)
                    });
                    this.state.set(ReconcileState::Checking {
                        check,
                        failure: Some(failure),
                    });
                }
                ReconcileProj::Checking { check, failure } => {
                    let (envelope, delivery) = ready!(check.as_mut().poll(cx));
                    let Some(failure) = failure.take() else {
                        // Polled after completion: nothing left to hand back.
                        return Poll::Pending;
                    };
                    let id = envelope.id.as_deref().unwrap_or("-");
                    return Poll::Ready(match delivery {
                        Delivery::Delivered => {
                            tracing::info!(
                                id,
                                code = %failure.code(),
                                "outcome unknown reconciled: the provider has it"
                            );
                            Ok(R::reconciled(&envelope))
                        }
                        Delivery::NotDelivered => {
                            tracing::info!(
                                id,
                                code = %failure.code(),
                                "outcome unknown reconciled: never delivered; may be sent again"
                            );
                            Err(failure.with_sent(crate::failure::Sent::No))
                        }
                        Delivery::Unknown => {
                            tracing::warn!(
                                id,
                                code = %failure.code(),
                                "outcome unknown: the status check could not tell"
                            );
                            Err(failure)
                        }
                    });
                }
            }
        }
    }
}
