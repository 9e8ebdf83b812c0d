use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::limit::{Answer, Flight};
use super::open::OpenError;
use super::rate::{PacedError, Ticket};
use super::slot::{Queue, SendSlot};
use super::state::{Outcome, Permit, Rejection, Shared};
use crate::failure::{Class, Code, Failure, Sent};

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
            // Moved into the failure when polled.
            open: Option<Refusal<R>>,
            _response: PhantomData<fn() -> R>,
        },
    }
}

/// Why a call was not made: an open breaker (its error and the time left until half-open),
/// or the adaptive send rate (the failure, made at the call).
#[derive(Debug)]
enum Refusal<R> {
    Open(Arc<OpenError>, Option<Duration>),
    Paced(Box<Failure<R>>),
}

/// Holds a permit until the call ends; a call dropped before it ended gives it back.
///
/// It holds a reference to the breaker (an `Arc` clone): a call's outcome reaches its breaker
/// even when the service that made it is gone, and no process-wide state is needed to find it.
#[derive(Debug)]
pub(crate) struct Guard {
    shared: Arc<Shared>,
    // A plain permit, not an `Option`: `Permit::DONE` once the outcome is recorded.
    permit: Permit,
    /// The call among those the concurrency limit counts in flight (`Flight::NONE` while the
    /// limit is off): given back when the call ends.
    flight: Flight,
}

impl Guard {
    #[inline]
    pub(crate) fn new(shared: &Arc<Shared>, permit: Permit) -> Self {
        Guard {
            shared: Arc::clone(shared),
            permit,
            flight: Flight::NONE,
        }
    }

    /// Like [`new`](Self::new), for a caller that owns its reference already (and would
    /// otherwise clone it only to drop its own).
    #[inline]
    pub(crate) fn owned(shared: Arc<Shared>, permit: Permit) -> Self {
        Guard {
            shared,
            permit,
            flight: Flight::NONE,
        }
    }

    /// The same guard, holding the call's `flight` of the concurrency limit too.
    #[inline]
    pub(crate) fn with_flight(mut self, flight: Flight) -> Self {
        self.flight = flight;
        self
    }

    /// Records how a finished call ended (a failure's flight waits for
    /// [`note_failure`](Self::note_failure), which knows its code).
    #[inline]
    pub(crate) fn finish_with(&mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            self.shared.complete(permit, outcome);
        }
        if self.flight.is_counted() && outcome == Outcome::Success {
            self.shared.landed(self.flight.take(), Answer::Success);
        }
    }

    /// After [`finish_with`](Self::finish_with) a failure: keeps it as the breaker's cause when
    /// it opened the breaker (or failed a probe), and tells the concurrency limit.
    #[inline]
    pub(crate) fn note_failure<R>(&mut self, failure: &Failure<R>) {
        self.shared
            .note_failure(failure.class(), failure.code(), || failure.message());
        self.shared
            .limit_failure(self.flight.take(), failure.class(), failure.code());
    }
}

impl Guard {
    /// After a throttled answer from the provider, with the send rate limited: a place at the
    /// front of its queue, as a [`SendSlot`] on the failure, for the retry that waits its turn
    /// after the server's hint.
    #[cold]
    #[inline(never)]
    pub(crate) fn keep_place<R>(&self, failure: &mut Failure<R>) {
        if let Some(ticket) = self.shared.pacer().and_then(|p| p.front_ticket()) {
            failure.notes_mut().insert(SendSlot {
                shared: Arc::clone(&self.shared),
                ticket: Queue::Rate(ticket),
                redeemed: false,
            });
        }
    }

    /// Gives the permit back with nothing counted: the call was dropped, or never left this
    /// process (a load-shed rejection below the breaker).
    #[inline]
    pub(crate) fn release(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.shared.cancel(permit);
        }
        if self.flight.is_counted() {
            self.shared.landed(self.flight.take(), Answer::Dropped);
        }
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        // Dropped or cancelled before it ended: a probe's permit goes back, nothing counts.
        self.release();
    }
}

impl<F, R> ResponseFuture<F, R> {
    #[inline]
    pub(crate) fn called(future: F, guard: Guard) -> Self {
        ResponseFuture {
            kind: Kind::Called { future, guard },
        }
    }

    pub(crate) fn rejected(rejection: Rejection, errors: &[Arc<OpenError>; 2]) -> Self {
        let left = rejection.retry_after();
        let error = &errors[usize::from(left.is_none())];
        ResponseFuture {
            kind: Kind::Rejected {
                open: Some(Refusal::Open(Arc::clone(error), left)),
                _response: PhantomData,
            },
        }
    }

    /// A call the adaptive send rate held back, failing with `failure` ([`held_back`]).
    #[inline]
    pub(crate) fn paced(failure: Box<Failure<R>>) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                open: Some(Refusal::Paced(failure)),
                _response: PhantomData,
            },
        }
    }
}

/// The failure of a call the adaptive send rate holds back for `wait`, the time until its place
/// in the queue, `ticket`, has its turn (at `rate` requests a second): its `permit` goes back
/// unused.
#[cold]
#[inline(never)]
pub(crate) fn held_back<R>(
    shared: &Arc<Shared>,
    permit: Permit,
    (wait, ticket, rate): (Duration, Ticket, f64),
) -> Box<Failure<R>> {
    shared.cancel(permit);
    {
        let mut failure = Failure::new(Class::THROTTLED, Code::Paced)
            .with_retry_after(wait)
            .with_sent(Sent::No)
            .with_source(PacedError::new(Arc::clone(&shared.name), rate, wait));
        failure.notes_mut().insert(SendSlot {
            shared: Arc::clone(shared),
            ticket: Queue::Rate(ticket),
            redeemed: false,
        });
        Box::new(failure)
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
            KindProj::Called { future, guard } => match ready!(future.poll(cx)) {
                // The outcome is recorded before the result is built, so that the response
                // stays in registers across the call instead of being spilled and reloaded.
                Ok(response) => {
                    guard.finish_with(Outcome::Success);
                    Poll::Ready(Ok(response))
                }
                Err(e) => {
                    let mut failure: Failure<R> = e.into();
                    if failure.code() == Code::Overloaded {
                        // Refused in this process (tower's `LoadShed` below): the provider was
                        // never asked, so it is neither its failure nor its success.
                        guard.release();
                        return Poll::Ready(Err(failure));
                    }
                    guard.finish_with(Outcome::Failure(failure.class()));
                    guard.note_failure(&failure);
                    if failure.class() == Class::THROTTLED {
                        guard.keep_place(&mut failure);
                    }
                    Poll::Ready(Err(failure))
                }
            },
            KindProj::Rejected { open, .. } => {
                match open
                    .take()
                    .expect("a breaker's rejection polled after completion")
                {
                    Refusal::Open(open, left) => Poll::Ready(Err(rejection_failure(open, left))),
                    Refusal::Paced(failure) => Poll::Ready(Err(*failure)),
                }
            }
        }
    }
}

/// The failure an open breaker answers with: class [`Class::CIRCUIT_OPEN`], code
/// [`Code::CircuitOpen`](crate::Code::CircuitOpen), the time left until half-open as its
/// [`retry_after`](Failure::retry_after), and an [`OpenError`] naming the breaker as its source.
pub(crate) fn rejection_failure<R>(
    open: Arc<OpenError>,
    half_opens_in: Option<Duration>,
) -> Failure<R> {
    let failure = Failure::new(Class::CIRCUIT_OPEN, Code::CircuitOpen).with_shared_source(open);
    match half_opens_in {
        Some(left) => failure.with_retry_after(left),
        None => failure,
    }
}
