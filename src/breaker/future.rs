use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::state::{Outcome, Permit, Rejection, SharedRef};
use crate::failure::{Class, Failure};

pin_project! {
    /// Response future of [`Breaker`](super::Breaker): the inner call with its permit, or a
    /// rejection that is ready at once.
    #[derive(Debug)]
    pub struct ResponseFuture<F, R> {
        #[pin]
        kind: Kind<F, R>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F, R> {
        Called {
            #[pin]
            future: F,
            guard: Guard,
        },
        Rejected {
            rejection: Rejection,
            _response: PhantomData<fn() -> R>,
        },
    }
}

/// Holds a permit until the call ends; a call dropped before it ended gives it back.
#[derive(Debug)]
pub(crate) struct Guard {
    link: Link,
    // A plain permit, not an `Option`: `Permit::DONE` once the outcome is recorded.
    permit: Permit,
}

/// How a call reaches its breaker when it ends.
#[derive(Debug)]
enum Link {
    /// A reference, for a call whose every outcome counts (a probe, a rate or slow-call rule, a
    /// success that clears the failures counted before it).
    Held(SharedRef),
    /// Only the breaker's id, for a call whose success changes nothing: see
    /// [`Shared::detaches`](super::state::Shared::detaches). A failure looks the breaker up.
    Detached(u64),
}

impl Guard {
    #[inline]
    pub(crate) fn new(shared: &SharedRef, permit: Permit) -> Self {
        let link = match detached(shared, &permit) {
            Some(id) => Link::Detached(id),
            None => Link::Held(shared.clone()),
        };
        Guard { link, permit }
    }

    /// Like [`new`](Self::new), for a caller that owns its reference already (and would
    /// otherwise clone it only to drop its own).
    #[inline]
    pub(crate) fn owned(shared: SharedRef, permit: Permit) -> Self {
        let link = match detached(&shared, &permit) {
            Some(id) => Link::Detached(id),
            None => Link::Held(shared),
        };
        Guard { link, permit }
    }

    /// Records the outcome of a finished call.
    #[inline]
    pub(crate) fn finish<R>(&mut self, result: &Result<R, Failure<R>>) {
        self.finish_with(match result {
            Ok(_) => Outcome::Success,
            Err(f) => Outcome::Failure(f.class()),
        });
    }

    pub(crate) fn finish_with(&mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            match &self.link {
                Link::Held(shared) => shared.complete(permit, outcome),
                // A detached success: nothing to record.
                Link::Detached(_) if outcome == Outcome::Success => {}
                Link::Detached(id) => {
                    if let Some(shared) = super::registry::find(*id) {
                        shared.complete(permit, outcome);
                    }
                }
            }
        }
    }
}

/// The id a call keeps instead of a reference, when it can (`Shared::detaches`); a static breaker
/// costs nothing to hold, so its calls never detach.
#[inline]
fn detached(shared: &SharedRef, permit: &Permit) -> Option<u64> {
    match shared {
        SharedRef::Counted(s) if s.detaches(permit) => Some(s.id),
        _ => None,
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        // Dropped or cancelled before it ended: a probe's permit goes back, nothing counts. A
        // detached call is a closed-state one: it holds no permit that could go back.
        if let Link::Held(shared) = &self.link
            && let Some(permit) = self.permit.take()
        {
            shared.cancel(permit);
        }
    }
}

impl<F, R> ResponseFuture<F, R> {
    #[inline]
    pub(crate) fn called(future: F, guard: Guard) -> Self {
        ResponseFuture {
            kind: Kind::Called { future, guard },
        }
    }

    pub(crate) fn rejected(rejection: Rejection) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                rejection,
                _response: PhantomData,
            },
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
{
    type Output = Result<R, Failure<R>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, guard } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                guard.finish(&result);
                Poll::Ready(result)
            }
            KindProj::Rejected { rejection, .. } => {
                Poll::Ready(Err(rejection_failure(rejection.retry_after())))
            }
        }
    }
}

/// The failure an open breaker answers with.
pub(crate) fn rejection_failure<R>(retry_after: Option<std::time::Duration>) -> Failure<R> {
    let failure = Failure::new(Class::CIRCUIT_OPEN, crate::failure::Code::CircuitOpen);
    match retry_after {
        Some(left) => failure.with_retry_after(left),
        None => failure,
    }
}
