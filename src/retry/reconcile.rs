//! Reconciliation of outcome-unknown requests, an option of the retry policy
//! ([`RetryPolicy::reconcile`](super::RetryPolicy::reconcile)): ask the provider what happened.

use std::any::{Any, type_name};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::failure::{Failure, Sent};
use crate::request::{Describe, Envelope, Replay};
use futures_core::future::BoxFuture;

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
/// own timeout: a check that hangs holds up the call (on the request path, within the retry
/// policy's [`deadline`](super::RetryPolicy::deadline) when there is one) or the
/// [`Reconciler`](crate::resend::Reconciler). Return [`Delivery::Unknown`] for anything it cannot
/// decide; a check that panics on the request path counts as [`Delivery::Unknown`].
///
/// ```
/// use tower_backstop::Envelope;
/// use tower_backstop::retry::{Delivery, RetryPolicy};
///
/// let policy = RetryPolicy::default().reconcile::<http::Request<String>, http::Response<String>>(
///     |envelope: Envelope| async move {
///         // GET https://provider/v1/messages/{id}: 200 → delivered, 404 → not delivered.
///         let _id = envelope.id;
///         Delivery::Unknown
///     },
/// );
/// # let _ = policy;
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

/// A response the retry layer can stand in with when the status check of
/// [`RetryPolicy::reconcile`](super::RetryPolicy::reconcile) found the request delivered but the
/// provider's answer was lost.
#[diagnostic::on_unimplemented(
    message = "`RetryPolicy::reconcile` cannot make a `{Self}` for a request found delivered",
    note = "implement `ReconciledResponse` for your response type; it is implemented for \
            `http::Response<B>` with `B: Default`, and for `()`"
)]
pub trait ReconciledResponse {
    /// The response for the request `envelope` describes.
    fn reconciled(envelope: &Envelope) -> Self;
}

impl<B: Default> ReconciledResponse for http::Response<B> {
    /// `200 OK`, an empty body, and [`Delivery::Delivered`] in the extensions: the provider's
    /// own response was lost, and `response.extensions().get::<Delivery>()` tells this stand-in
    /// from a response the provider sent.
    fn reconciled(_: &Envelope) -> Self {
        let mut response = http::Response::new(B::default());
        response.extensions_mut().insert(Delivery::Delivered);
        response
    }
}

impl ReconciledResponse for () {
    fn reconciled(_: &Envelope) -> Self {}
}

/// The reconcile option as the policy holds it: a status check typed, out of sight, by the
/// request and response types it was set for, so that the retry layer's `Service` impl needs no
/// `Describe` or `ReconciledResponse` bound. One word (a thin `Arc`), as each retry future of a
/// request not safe to resend holds one.
#[derive(Clone)]
pub(crate) struct Reconcile {
    typed: Arc<Box<dyn Erased>>,
}

impl fmt::Debug for Reconcile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (request, response) = self.typed.types();
        f.debug_struct("Reconcile")
            .field("request", &request)
            .field("response", &response)
            .finish_non_exhaustive()
    }
}

impl Reconcile {
    pub(crate) fn new<Req, Res>(check: Arc<dyn StatusCheck>) -> Self
    where
        Req: Describe + Send + 'static,
        Res: ReconciledResponse + 'static,
    {
        Reconcile {
            typed: Arc::new(Box::new(Typed::<Req, Res> {
                check,
                types: PhantomData,
            })),
        }
    }
}

/// What the retry future asks of the typed check.
trait Erased: Send + Sync {
    /// The check of the request in `request` (an `Option<Req>`, taken), or `None` when its type,
    /// or the type of `response` (an `Option<Res>`, for the stand-in), is not the one the option
    /// was set for.
    fn start(
        &self,
        request: &mut dyn Any,
        response: &dyn Any,
    ) -> Option<BoxFuture<'static, Checked>>;

    /// Puts the stand-in response into `response` (an `Option<Res>`); `false` when its type is
    /// not the one the option was set for.
    fn stand_in(&self, envelope: &Envelope, response: &mut dyn Any) -> bool;

    /// The request and response types the option was set for.
    fn types(&self) -> (&'static str, &'static str);
}

struct Typed<Req, Res> {
    check: Arc<dyn StatusCheck>,
    types: PhantomData<fn(Req) -> Res>,
}

/// A finished check: the request's envelope and the verdict.
pub(crate) struct Checked {
    envelope: Envelope,
    delivery: Delivery,
}

impl<Req, Res> Erased for Typed<Req, Res>
where
    Req: Describe + Send + 'static,
    Res: ReconciledResponse + 'static,
{
    fn start(
        &self,
        request: &mut dyn Any,
        response: &dyn Any,
    ) -> Option<BoxFuture<'static, Checked>> {
        if !response.is::<Option<Res>>() {
            return None;
        }
        let request = request.downcast_mut::<Option<Req>>()?.take()?;
        let check = Arc::clone(&self.check);
        Some(Box::pin(async move {
            let envelope = request.describe().await;
            let delivery = check.check(envelope.clone()).await;
            Checked { envelope, delivery }
        }))
    }

    fn stand_in(&self, envelope: &Envelope, response: &mut dyn Any) -> bool {
        match response.downcast_mut::<Option<Res>>() {
            Some(slot) => {
                *slot = Some(Res::reconciled(envelope));
                true
            }
            None => false,
        }
    }

    fn types(&self) -> (&'static str, &'static str) {
        (type_name::<Req>(), type_name::<Res>())
    }
}

pin_project_lite::pin_project! {
    /// One attempt of the retry future: the inner call, then, for an outcome-unknown failure of
    /// a request not safe to send twice, the status check (boxed: the failure path only).
    #[project = AttemptProj]
    pub(crate) enum Attempt<F, R> {
        Calling {
            #[pin]
            future: F,
        },
        Checking {
            // Boxed whole, so that the variant is one word beside the call's future.
            checking: Box<Checking<R>>,
        },
        // Failed while a hedged copy is still out: the copies carry on, this one is over.
        Done,
    }
}

/// A status check under way, and the failure it is about.
pub(crate) struct Checking<R> {
    check: BoxFuture<'static, Checked>,
    failure: Option<Failure<R>>,
}

impl<F, R> Attempt<F, R> {
    #[inline(always)]
    pub(crate) fn new(future: F) -> Self {
        Attempt::Calling { future }
    }

    /// The failure a check that has not finished holds (when the deadline ends the attempt).
    pub(crate) fn take_checked(self: Pin<&mut Self>) -> Option<Failure<R>> {
        match self.project() {
            AttemptProj::Checking { checking } => checking.failure.take(),
            AttemptProj::Calling { .. } | AttemptProj::Done => None,
        }
    }

    /// Whether this attempt failed while hedged copies were still out (see `Done`).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Attempt::Done)
    }

    /// Polls the call, and the check when `reconcile` is given (only for a request not safe to
    /// send twice) and the call failed with its outcome unknown. `request` is the copy the
    /// check describes (asked for on the failure path only, and copied again there).
    #[inline(always)]
    pub(crate) fn poll_attempt<'a, E, Req>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        reconcile: Option<&Reconcile>,
        request: impl FnOnce() -> Option<&'a Req>,
    ) -> Poll<Result<R, Failure<R>>>
    where
        F: Future<Output = Result<R, E>>,
        E: Into<Failure<R>>,
        R: 'static,
        Req: Replay + 'static,
    {
        let checking = match self.as_mut().project() {
            AttemptProj::Calling { future } => {
                let failure: Failure<R> = match ready!(future.poll(cx)) {
                    Ok(response) => return Poll::Ready(Ok(response)),
                    Err(e) => e.into(),
                };
                match reconcile {
                    Some(reconcile) if outcome_unknown(&failure) => {
                        match start(reconcile, request(), failure) {
                            Ok(checking) => checking,
                            Err(failure) => return Poll::Ready(Err(failure)),
                        }
                    }
                    _ => return Poll::Ready(Err(failure)),
                }
            }
            AttemptProj::Checking { checking } => {
                return poll_check(checking, cx, reconcile);
            }
            // Never woken again: the hedged copies still out are polled beside it.
            AttemptProj::Done => return Poll::Pending,
        };
        self.set(Attempt::Checking { checking });
        match self.project() {
            AttemptProj::Checking { checking } => poll_check(checking, cx, reconcile),
            AttemptProj::Calling { .. } | AttemptProj::Done => unreachable!("set above"),
        }
    }
}

/// The check of `failure`'s request, or the failure back when it cannot run.
#[cold]
#[inline(never)]
fn start<R, Req>(
    reconcile: &Reconcile,
    request: Option<&Req>,
    failure: Failure<R>,
) -> Result<Box<Checking<R>>, Failure<R>>
where
    R: 'static,
    Req: Replay + 'static,
{
    let mut copy = request.and_then(Replay::replay);
    if copy.is_none() {
        tracing::warn!(
            code = %failure.code(),
            "outcome unknown: no copy of the request for the status check"
        );
        return Err(failure);
    }
    let Some(check) = reconcile.typed.start(&mut copy, &None::<R>) else {
        let (request, response) = reconcile.typed.types();
        tracing::error!(
            expected_request = request,
            expected_response = response,
            request = type_name::<Req>(),
            response = type_name::<R>(),
            "outcome unknown: the reconcile option was set for other request and response \
             types; the status check is not run"
        );
        return Err(failure);
    };
    Ok(Box::new(Checking {
        check,
        failure: Some(failure),
    }))
}

/// Polls a check under way; when it ends, the call's result by its verdict.
#[cold]
#[inline(never)]
fn poll_check<R: 'static>(
    checking: &mut Checking<R>,
    cx: &mut Context<'_>,
    reconcile: Option<&Reconcile>,
) -> Poll<Result<R, Failure<R>>> {
    let checked = std::panic::catch_unwind(AssertUnwindSafe(|| checking.check.as_mut().poll(cx)));
    let (envelope, delivery) = match checked {
        Ok(Poll::Pending) => return Poll::Pending,
        Ok(Poll::Ready(Checked { envelope, delivery })) => (Some(envelope), delivery),
        Err(_) => {
            tracing::error!("the status check panicked; the outcome stays unknown");
            (None, Delivery::Unknown)
        }
    };
    let Some(failure) = checking.failure.take() else {
        // Polled after completion: nothing left to hand back.
        return Poll::Pending;
    };
    let id = envelope
        .as_ref()
        .and_then(|e| e.id.as_deref())
        .unwrap_or("-");
    Poll::Ready(match (delivery, envelope.as_ref()) {
        (Delivery::Delivered, Some(envelope)) => {
            let mut response: Option<R> = None;
            if reconcile.is_some_and(|r| r.typed.stand_in(envelope, &mut response))
                && let Some(response) = response
            {
                tracing::info!(
                    id,
                    code = %failure.code(),
                    "outcome unknown reconciled: the provider has it"
                );
                Ok(response)
            } else {
                Err(failure)
            }
        }
        (Delivery::NotDelivered, _) => {
            tracing::info!(
                id,
                code = %failure.code(),
                "outcome unknown reconciled: never delivered; may be sent again"
            );
            Err(failure.with_sent(Sent::No))
        }
        _ => {
            tracing::warn!(
                id,
                code = %failure.code(),
                "outcome unknown: the status check could not tell"
            );
            Err(failure)
        }
    })
}

/// Failures after which a request may or may not have been acted on: it was sent (or may have
/// been), and no answer came back ([`Sent::Maybe`](crate::Sent::Maybe)).
pub(crate) fn outcome_unknown<R>(failure: &Failure<R>) -> bool {
    failure.sent() == Sent::Maybe
}
