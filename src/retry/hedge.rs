//! Hedging (gRFC A6's, tower's `Hedge`): copies of a request safe to send twice, sent while a
//! slow attempt is still out, each after the hedging delay. The copies run inline in one
//! allocation made with the first; the first answer wins, and the others are cancelled with the
//! future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::Span;

use super::policy::MAX_COPIES;
use super::reconcile::Attempt;
use super::trace::record_failure;
use crate::failure::{Class, Failure};
use crate::observe::{Event, Hook};
use crate::request::Replay;

/// A call's hedging, kept with the failure path's record.
pub(super) struct Hedges<F, R> {
    /// The copies still out, beside the current attempt: one allocation for the call's
    /// copies, made with the first.
    copies: Option<Pin<Box<Copies<F, R>>>>,
    /// Copies sent in the call.
    sent: u32,
    /// No more copies: a server pushed back, the budget or the service said no.
    off: bool,
    /// The current attempt's number, once a copy was sent beside it (`attempts` counts the
    /// copies too).
    primary: Option<u32>,
}

impl<F, R> Hedges<F, R> {
    pub(super) fn new() -> Self {
        Hedges {
            copies: None,
            sent: 0,
            off: false,
            primary: None,
        }
    }

    /// Whether copies are still out.
    pub(super) fn out(&self) -> bool {
        self.copies.as_ref().is_some_and(|c| c.out())
    }

    /// The current attempt's number, once a copy was sent beside it.
    pub(super) fn primary(&self) -> Option<u32> {
        self.primary
    }

    /// A new attempt is the current one: copies sent from now on go beside it.
    pub(super) fn next_primary(&mut self) {
        self.primary = None;
    }

    /// No more copies in this call.
    pub(super) fn stop(&mut self) {
        self.off = true;
    }

    /// An attempt failed while another was out: a server that pushed back (a delay hint, the
    /// throttled class) stops the copies.
    pub(super) fn pushed_back(&mut self, failure: &Failure<R>) {
        if failure.retry_after().is_some() || failure.class() == Class::THROTTLED {
            self.off = true;
        }
    }

    /// A copy was sent, `delay` after the attempt numbered `primary` (the current one): said
    /// at `INFO` and to the listener, and put in a free slot with its `future`.
    pub(super) fn sent(
        &mut self,
        primary: u32,
        copy: Out,
        future: F,
        delay: Duration,
        hook: &Hook,
    ) {
        let attempt = copy.attempt;
        tracing::info!(
            attempt,
            after = ?delay,
            "hedging: a copy sent while an earlier attempt is still out"
        );
        hook.emit(|| Event::HedgeSent {
            attempt,
            after: delay,
        });
        self.primary.get_or_insert(primary);
        self.sent += 1;
        self.copies
            .get_or_insert_with(|| Box::pin(Copies::new()))
            .as_mut()
            .push(future, copy);
    }

    /// Polls the copies out: the first that ended, taken out, with its number and start (a
    /// failure is recorded on the copy's span).
    #[inline]
    pub(super) fn poll<E>(&mut self, cx: &mut Context<'_>) -> Option<Ended<R>>
    where
        F: Future<Output = Result<R, E>>,
        E: Into<Failure<R>>,
        R: 'static,
    {
        poll_copies(self.copies.as_mut()?.as_mut(), cx)
    }
}

/// Whether another copy may be sent: the request is safe to send twice and copied
/// (`copyable`), attempts are left, and the call's copies (`hedges`, once there is a failure
/// path's record) were not stopped nor used up (`max_copies`).
#[cold]
pub(super) fn allowed<F, R>(
    hedges: Option<&Hedges<F, R>>,
    copyable: bool,
    attempts_left: bool,
    max_copies: u32,
) -> bool {
    copyable && attempts_left && hedges.is_none_or(|h| !h.off && h.sent < max_copies)
}

pin_project! {
    /// The hedged copies under way, inline: slot `i` is out when `meta[i]` is `Some`.
    struct Copies<F, R> {
        #[pin]
        c0: Option<Attempt<F, R>>,
        #[pin]
        c1: Option<Attempt<F, R>>,
        #[pin]
        c2: Option<Attempt<F, R>>,
        #[pin]
        c3: Option<Attempt<F, R>>,
        meta: [Option<Out>; MAX_COPIES],
    }
}

/// A copy's number, start and span, while it is out.
pub(super) struct Out {
    attempt: u32,
    started: Option<Instant>,
    span: Span,
}

impl Out {
    pub(super) fn new(attempt: u32, started: Option<Instant>, span: Span) -> Self {
        Out {
            attempt,
            started,
            span,
        }
    }
}

impl<F, R> Copies<F, R> {
    fn new() -> Self {
        Copies {
            c0: None,
            c1: None,
            c2: None,
            c3: None,
            meta: [None, None, None, None],
        }
    }

    fn out(&self) -> bool {
        self.meta.iter().any(Option::is_some)
    }

    /// Slot `i`'s future and metadata.
    #[allow(clippy::type_complexity)]
    fn slot(self: Pin<&mut Self>, i: usize) -> (Pin<&mut Option<Attempt<F, R>>>, &mut Option<Out>) {
        let this = self.project();
        let slot = match i {
            0 => this.c0,
            1 => this.c1,
            2 => this.c2,
            _ => this.c3,
        };
        (slot, &mut this.meta[i])
    }

    /// Puts `future` in a free slot (there is one: at most `MAX_COPIES` copies are sent).
    fn push(mut self: Pin<&mut Self>, future: F, copy: Out) {
        let free = self
            .meta
            .iter()
            .position(Option::is_none)
            .expect("at most MAX_COPIES copies in a call");
        let (mut slot, meta) = self.as_mut().slot(free);
        slot.set(Some(Attempt::new(future)));
        *meta = Some(copy);
    }
}

/// A hedged copy that ended: its number, its start, and its result.
pub(super) type Ended<R> = (u32, Option<Instant>, Result<R, Failure<R>>);

#[cold]
#[inline(never)]
fn poll_copies<F, R, E>(
    mut copies: Pin<&mut Copies<F, R>>,
    cx: &mut Context<'_>,
) -> Option<Ended<R>>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
    R: 'static,
{
    for i in 0..MAX_COPIES {
        let (mut slot, meta) = copies.as_mut().slot(i);
        let (Some(copy), Some(future)) = (meta.as_ref(), slot.as_mut().as_pin_mut()) else {
            continue;
        };
        let polled = copy
            .span
            .in_scope(|| future.poll_attempt(cx, None, || None::<&NoRequest>));
        if let Poll::Ready(result) = polled {
            slot.set(None);
            let copy = meta.take().expect("checked above");
            if let Err(failure) = &result {
                record_failure(&copy.span, failure);
            }
            return Some((copy.attempt, copy.started, result));
        }
    }
    None
}

/// The request type of a copy's `poll_attempt`, which never checks a status (copies are only
/// of requests safe to send twice, which are never reconciled).
struct NoRequest;

impl Replay for NoRequest {
    fn replay(&self) -> Option<Self> {
        None
    }
}

/// The earlier of the deadline and the hedging delay from now: when the current attempt's
/// timer fires.
#[inline]
pub(super) fn earliest(deadline: Option<Instant>, hedge: Option<Duration>) -> Option<Instant> {
    let hedge = hedge.and_then(|delay| Instant::now().checked_add(delay));
    match (deadline, hedge) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
