use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;
use tracing::field::Empty;

use super::RetryPolicy;
use super::note::Attempts;
use super::policy::{Attempted, Decision, MAX_COPIES, Spare, retry_at};
use super::reconcile::{Attempt, Reconcile, outcome_unknown};
use crate::failure::{Class, Code, Failure, Sent};
use crate::observe::{Event, Hook};
use crate::request::Replay;
use crate::status::GiveUp;

pin_project! {
    /// Response future of [`Retry`](super::Retry): a state machine of attempt, delay (a timer
    /// stored inline) and readiness, with its own attempt counts per logical request.
    ///
    /// When the request cannot be retried at all (`max_attempts(1)`, a request that could not
    /// be copied, a request not safe to resend with
    /// [`retry_unprocessed`](super::RetryPolicy::retry_unprocessed) off) it holds no service
    /// clone and no policy: it only forwards the single attempt. The overall deadline, when there is one, reads the clock only when an attempt
    /// first waits or fails (see [`RetryPolicy::deadline`]).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future, S::Response>,
        retry: Option<Retrying<S, Req, S::Future, S::Response>>,
        deadline: Deadline,
        // Whether the request is safe to send twice (for the outcome-unknown rule).
        safe: bool,
        // Why the request was not retryable, when `retry` is `None`.
        single: GiveUp,
        // Set under a dead-letter layer that reuses this layer's copy of the request
        // (the preset's, `dead_letter::with_retry`): every failure carries the unsent copy up.
        hand_back: Option<HandBack<S::Response, Req>>,
        // The copy handed back when `retry` is `None`.
        kept: Option<Req>,
        // The policy's status check, for a request not safe to resend (`RetryPolicy::reconcile`).
        reconcile: Option<Reconcile>,
        // The policy, kept for its listener when `retry` is `None` and there is one (a retrying
        // future reads the listener from its own clone of the policy, so a call clones one
        // reference, not two); and when the current attempt was called (only with a listener).
        single_policy: Option<RetryPolicy>,
        started: Option<Instant>,
        // The call's span (`backstop.call`) and the current attempt's (`backstop.attempt`),
        // boxed and made only for a subscriber that wants them (at `DEBUG`): otherwise one word, `None`.
        spans: Traced,
    }
}

/// Puts an unsent copy of the request on a failure, for the dead-letter layer above.
pub(crate) type HandBack<R, Req> = fn(&mut Failure<R>, Req);

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Called {
            // The call, then the status check when the policy reconciles its failure.
            #[pin]
            future: Attempt<F, R>,
            // The overall deadline, raced against the attempt: created at the attempt's first
            // `Pending`, and only when there is a deadline.
            #[pin]
            deadline: Option<Sleep>,
        },
        Sleeping {
            #[pin]
            sleep: Sleep,
        },
        Readying,
    }
}

/// The overall deadline of one logical request.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// No deadline (none configured, or one too far to represent, such as `Duration::MAX`).
    None,
    /// A deadline this long after the clock is first read.
    After(Duration),
    /// The instant it ends.
    At(Instant),
}

impl Deadline {
    // Inlined, like everything the constructors call: an out-of-line call between the inner
    // future's making and its move into ours makes the compiler build the inner future in a
    // temporary and copy it.
    #[inline]
    fn new(after: Option<Duration>) -> Self {
        after.map_or(Deadline::None, Deadline::After)
    }

    /// The instant the deadline ends, fixed at the first call of this method: the first time
    /// an attempt waits (its first `Pending`) or fails.
    #[inline]
    fn at(&mut self) -> Option<Instant> {
        match *self {
            Deadline::None => None,
            Deadline::At(at) => Some(at),
            Deadline::After(after) => {
                *self = Instant::now()
                    .checked_add(after)
                    .map_or(Deadline::None, Deadline::At);
                self.at()
            }
        }
    }
}

/// What a request that may be retried keeps between attempts: built on the call, used on the
/// failure path only. Kept small: what only failures need is boxed on the first failure.
struct Retrying<S, Req, F, R> {
    service: S,
    /// The layer's policy.
    policy: RetryPolicy,
    spare: Option<Req>,
    spare_state: Spare,
    /// Attempts sent, hedged copies included.
    attempts: u32,
    history: Option<Box<History<F, R>>>,
}

/// The failure path's record, allocated on the first failure (or the first hedged copy).
struct History<F, R> {
    /// Attempts failed per class.
    failed: Vec<(Class, u32)>,
    first_failed_at: Option<SystemTime>,
    /// The last real failure, kept while the next attempt runs so the deadline can return it.
    last: Option<Failure<R>>,
    previous_delay: Option<Duration>,
    /// Hedged copies still out, beside the current attempt: one allocation for the call's
    /// copies, made with the first.
    copies: Option<Pin<Box<Copies<F, R>>>>,
    /// Copies sent in the call.
    hedged: u32,
    /// No more copies: a server pushed back, the budget or the service said no.
    hedging_off: bool,
    /// The current attempt's number, once a copy was sent beside it (`attempts` counts the
    /// copies too).
    primary: Option<u32>,
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
struct Out {
    attempt: u32,
    started: Option<Instant>,
    span: Span,
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

/// The failure path's record, created at the first failure.
fn history_of<F, R>(history: &mut Option<Box<History<F, R>>>) -> &mut History<F, R> {
    history.get_or_insert_with(|| {
        Box::new(History {
            failed: Vec::new(),
            first_failed_at: None,
            last: None,
            previous_delay: None,
            copies: None,
            hedged: 0,
            hedging_off: false,
            primary: None,
        })
    })
}

impl<S, Req, F, R> Retrying<S, Req, F, R> {
    fn first_failed_at(&self) -> Option<SystemTime> {
        self.history.as_ref().and_then(|h| h.first_failed_at)
    }

    fn take_last(&mut self) -> Option<Failure<R>> {
        self.history.as_mut().and_then(|h| h.last.take())
    }
}

impl<S, Req, F, R> Retrying<S, Req, F, R> {
    /// The current attempt's number (`attempts` counts the hedged copies too).
    #[inline]
    fn current(&self) -> u32 {
        self.history
            .as_ref()
            .and_then(|h| h.primary)
            .unwrap_or(self.attempts)
    }

    /// Whether hedged copies are still out.
    #[inline]
    fn hedges_out(&self) -> bool {
        self.history
            .as_ref()
            .and_then(|h| h.copies.as_ref())
            .is_some_and(|c| c.out())
    }

    /// The hedging delay, when a copy may be sent beside the attempts out: hedging is on, the
    /// request is safe to send twice and copied, and neither the copies nor the attempts are
    /// used up.
    #[inline]
    fn hedge_delay(&self) -> Option<Duration> {
        let (delay, max_copies) = self.policy.hedging()?;
        hedge_allowed(self, max_copies).then_some(delay)
    }

    /// Counts a failure of an attempt while another is still out. `Some` when it ends the call
    /// (gRFC A6's fatal status: a class never retried, a server that said not to retry).
    fn set_aside(&mut self, failure: &Failure<R>) -> Option<GiveUp> {
        let class = failure.class();
        if failure.code() == Code::CircuitOpen {
            // A rejection is not an attempt.
            self.attempts -= 1;
        } else if let Some(budget) = self.policy.budget_ref() {
            budget.failure();
        }
        let history = history_of(&mut self.history);
        history.count(class);
        history.first_failed_at.get_or_insert_with(SystemTime::now);
        if failure.retry_after().is_some() || class == Class::THROTTLED {
            // The server pushed back: no more copies.
            history.hedging_off = true;
        }
        if failure.no_retry() {
            Some(GiveUp::ServerSaidNo)
        } else if self.policy.attempts_for(class).is_none() {
            Some(GiveUp::NotRetryable)
        } else {
            None
        }
    }
}

#[cold]
fn hedge_allowed<S, Req, F, R>(r: &Retrying<S, Req, F, R>, max_copies: u32) -> bool {
    r.spare_state == Spare::Ready
        && r.spare.is_some()
        && r.attempts < r.policy.attempts()
        && r.history
            .as_ref()
            .is_none_or(|h| !h.hedging_off && h.hedged < max_copies)
}

impl<S, Req> Retrying<S, Req, S::Future, S::Response>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    S::Response: 'static,
    Req: Replay + 'static,
{
    /// Sends a hedged copy: `Ready(true)` when sent, `Ready(false)` when hedging stops here
    /// (the budget, the service's readiness error, a copy that cannot be made), `Pending`
    /// while the service is not ready.
    #[cold]
    #[inline(never)]
    fn send_hedge(
        &mut self,
        cx: &mut Context<'_>,
        spans: Option<&Spans>,
        delay: Duration,
        deadline: Option<Instant>,
    ) -> Poll<bool> {
        if let Err(e) = ready!(self.service.poll_ready(cx)) {
            let failure: Failure<S::Response> = e.into();
            tracing::debug!(class = %failure.class(), "hedging stopped: the service is not ready");
            history_of(&mut self.history).hedging_off = true;
            return Poll::Ready(false);
        }
        if let Some(budget) = self.policy.budget_ref()
            && !budget.withdraw()
        {
            tracing::debug!("hedging stopped: retry budget exhausted");
            history_of(&mut self.history).hedging_off = true;
            return Poll::Ready(false);
        }
        let Some(mut request) = self.spare.as_ref().and_then(Replay::replay) else {
            self.spare_state = Spare::NotReplayable;
            return Poll::Ready(false);
        };
        write_time_left(&mut request, &self.policy, deadline);
        let primary = self.current();
        self.attempts += 1;
        let attempt = self.attempts;
        let span = spans.map_or_else(Span::none, |s| new_attempt_span(&s.call, &request, attempt));
        let started = self.policy.hook().attempt_start();
        let future = span.in_scope(|| self.service.call(request));
        tracing::info!(
            attempt,
            after = ?delay,
            "hedging: a copy sent while an earlier attempt is still out"
        );
        self.policy.hook().emit(|| Event::HedgeSent {
            attempt,
            after: delay,
        });
        let history = history_of(&mut self.history);
        history.primary.get_or_insert(primary);
        history.hedged += 1;
        let copy = Out {
            attempt,
            started,
            span,
        };
        history
            .copies
            .get_or_insert_with(|| Box::pin(Copies::new()))
            .as_mut()
            .push(future, copy);
        Poll::Ready(true)
    }

    /// Polls the hedged copies out: the first that ended, taken out, with its number and
    /// start (a failure is recorded on the copy's span).
    #[inline]
    #[allow(clippy::type_complexity)]
    fn poll_hedges(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<(
        u32,
        Option<Instant>,
        Result<S::Response, Failure<S::Response>>,
    )> {
        poll_copies(self.history.as_deref_mut()?.copies.as_mut()?.as_mut(), cx)
    }
}

#[cold]
#[inline(never)]
#[allow(clippy::type_complexity)]
fn poll_copies<F, R, E>(
    mut copies: Pin<&mut Copies<F, R>>,
    cx: &mut Context<'_>,
) -> Option<(u32, Option<Instant>, Result<R, Failure<R>>)>
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

/// Writes into `request` the time left for its attempt: the least of the deadline's (read now)
/// and the policy's per-attempt bound; nothing with neither.
#[inline]
fn write_time_left<Req: Replay>(
    request: &mut Req,
    policy: &RetryPolicy,
    deadline: Option<Instant>,
) {
    let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
    if let Some(left) = super::earlier(left, policy.attempt_bound()) {
        request.set_time_left(&policy.time_left(left));
    }
}

/// The earlier of the deadline and the hedging delay from now.
#[inline]
fn earliest(deadline: Option<Instant>, hedge: Option<Duration>) -> Option<Instant> {
    let hedge = hedge.and_then(|delay| Instant::now().checked_add(delay));
    match (deadline, hedge) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl<F, R> History<F, R> {
    fn count(&mut self, class: Class) -> u32 {
        match self.failed.iter_mut().find(|(c, _)| *c == class) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.failed.push((class, 1));
                1
            }
        }
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    /// `kept` is the copy handed back by `hand_back`, when there is one. `reconcile` is the
    /// policy's status check, given only for a request not safe to resend.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn single(
        future: S::Future,
        safe: bool,
        reason: GiveUp,
        deadline: Option<Duration>,
        hand_back: Option<HandBack<S::Response, Req>>,
        kept: Option<Req>,
        reconcile: Option<Reconcile>,
        single_policy: Option<RetryPolicy>,
        started: Option<Instant>,
        spans: Traced,
    ) -> Self {
        ResponseFuture {
            started,
            single_policy,
            spans,
            state: State::Called {
                future: Attempt::new(future),
                deadline: None,
            },
            retry: None,
            deadline: Deadline::new(deadline),
            safe,
            single: reason,
            hand_back,
            kept,
            reconcile,
        }
    }

    /// `reconcile` as for `single`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn retrying(
        future: S::Future,
        service: S,
        spare: Req,
        safe: bool,
        policy: RetryPolicy,
        deadline: Option<Duration>,
        hand_back: Option<HandBack<S::Response, Req>>,
        reconcile: Option<Reconcile>,
        started: Option<Instant>,
        spans: Traced,
    ) -> Self {
        ResponseFuture {
            started,
            single_policy: None,
            spans,
            state: State::Called {
                future: Attempt::new(future),
                deadline: None,
            },
            retry: Some(Retrying {
                service,
                policy,
                spare: Some(spare),
                spare_state: if safe { Spare::Ready } else { Spare::NotSafe },
                attempts: 1,
                history: None,
            }),
            deadline: Deadline::new(deadline),
            safe,
            single: GiveUp::AttemptsExhausted,
            hand_back,
            kept: None,
            reconcile,
        }
    }
}

/// The overall deadline of [`RetryPolicy::deadline`](super::RetryPolicy::deadline) ended the
/// first attempt before it answered: there is no earlier failure to return.
#[derive(Debug)]
pub(crate) struct DeadlineElapsed(());

impl fmt::Display for DeadlineElapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("retry deadline elapsed during the first attempt")
    }
}

impl std::error::Error for DeadlineElapsed {}

fn give_up<R>(
    hook: &Hook,
    mut failure: Failure<R>,
    attempts: u32,
    first_failed_at: Option<SystemTime>,
    reason: GiveUp,
) -> Failure<R> {
    hook.emit(|| Event::GaveUp {
        attempts,
        class: failure.class(),
        code: failure.code(),
        reason,
    });
    match reason {
        // A retry skipped for want of a copy: said with its cause, so that a request over the
        // replay buffer is not a silent single attempt.
        GiveUp::NotReplayable => tracing::info!(
            attempts,
            class = %failure.class(),
            code = %failure.code(),
            reason = reason.as_str(),
            cause = "the request has no copy to send again: a streaming body, or one over the replay buffer limit",
            "giving up: retry skipped"
        ),
        _ => tracing::info!(
            attempts,
            class = %failure.class(),
            code = %failure.code(),
            reason = reason.as_str(),
            "giving up"
        ),
    }
    let mut note = Attempts::new(attempts, reason);
    if let Some(at) = first_failed_at {
        note = note.with_first_failed_at(at);
    }
    failure.notes_mut().insert(note);
    failure
}

/// A call's [`Spans`], if a subscriber wants them: one word, whose drop is a branch inline
/// (the spans' own drop is out of line, on the path that made them).
pub(crate) struct Traced(Option<Box<Spans>>);

impl Traced {
    #[inline]
    fn as_ref(&self) -> Option<&Spans> {
        self.0.as_deref()
    }

    #[inline]
    fn as_mut(&mut self) -> Option<&mut Spans> {
        self.0.as_deref_mut()
    }

    /// The current attempt's span, if there are spans.
    #[inline]
    pub(crate) fn attempt(&self) -> Option<&Span> {
        self.as_ref().map(|s| &s.attempt)
    }
}

impl Drop for Traced {
    #[inline]
    fn drop(&mut self) {
        if let Some(spans) = self.0.take() {
            close(spans);
        }
    }
}

#[cold]
#[inline(never)]
fn close(spans: Box<Spans>) {
    drop(spans);
}

/// A call's spans: `backstop.call`, and the current attempt's `backstop.attempt`, its child.
pub(crate) struct Spans {
    call: Span,
    attempt: Span,
}

impl Spans {
    /// The spans of a call of `request`, its first attempt's included; `None` (after one
    /// atomic load) unless a subscriber wants `DEBUG` spans.
    #[inline]
    pub(crate) fn of<Req: Replay>(request: &Req) -> Traced {
        Traced(if tracing::level_enabled!(tracing::Level::DEBUG) {
            Spans::new(request)
        } else {
            None
        })
    }

    #[cold]
    #[inline(never)]
    fn new<Req: Replay>(request: &Req) -> Option<Box<Spans>> {
        let call = tracing::debug_span!("backstop.call", attempts = Empty);
        if call.is_disabled() {
            return None;
        }
        let attempt = new_attempt_span(&call, request, 1);
        Some(Box::new(Spans { call, attempt }))
    }
}

#[inline(never)]
fn new_attempt_span<Req: Replay>(call: &Span, request: &Req, attempt: u32) -> Span {
    let span = tracing::debug_span!(
        parent: call,
        "backstop.attempt",
        attempt,
        otel.name = "backstop.attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = Empty,
        server.address = Empty,
        server.port = Empty,
        http.request.resend_count = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        request.record_span(&span);
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
    }
    span
}

/// Records a failed attempt on its span: `error.type` is the HTTP status code for an HTTP
/// answer (as the semantic conventions ask), else the failure's class; `otel.status_code` is
/// `ERROR`.
#[inline]
fn record_failure<R>(span: &Span, failure: &Failure<R>) {
    match failure.code() {
        Code::Http(status) => {
            span.record("http.response.status_code", status.as_u16());
            span.record("error.type", status.as_str());
        }
        _ => {
            span.record("error.type", failure.class().name());
        }
    }
    span.record("otel.status_code", "ERROR");
}

/// Hands the end of an attempt to the listener: a success (`failure` is `None`) or a failure,
/// and a per-attempt timeout.
#[inline(never)]
fn attempt_ended<R>(
    hook: &Hook,
    started: Option<Instant>,
    attempt: u32,
    failure: Option<&Failure<R>>,
) {
    let duration = started.map_or(Duration::ZERO, |at| at.elapsed());
    let (class, code, sent) = match failure {
        None => (None, None, Sent::Yes),
        Some(f) => (Some(f.class()), Some(f.code()), f.sent()),
    };
    hook.emit(|| Event::AttemptEnded {
        attempt,
        class,
        code,
        sent,
        duration,
    });
    if code == Some(Code::Timeout) {
        hook.emit(|| Event::TimedOut {
            attempt,
            deadline: false,
        });
    }
}

/// The call's listener: the policy's, read from the retry state or, without one, from the
/// policy kept for its listener; [`Hook::NONE`] when neither is there.
#[inline]
fn hook_of<'a, S, Req, F, R>(
    retry: Option<&'a Retrying<S, Req, F, R>>,
    single_policy: Option<&'a RetryPolicy>,
) -> &'a Hook {
    match (retry, single_policy) {
        (Some(r), _) => r.policy.hook(),
        (None, Some(policy)) => policy.hook(),
        (None, None) => &Hook::NONE,
    }
}

/// `failure`, with the unsent copy of the request on it when a dead-letter layer above reuses
/// it (see `HandBack`).
#[inline]
fn handed<R, Req>(
    hand_back: Option<HandBack<R, Req>>,
    spare: Option<Req>,
    mut failure: Failure<R>,
) -> Failure<R> {
    if let (Some(hand_back), Some(spare)) = (hand_back, spare) {
        hand_back(&mut failure, spare);
    }
    failure
}

fn deadline_failure<R>(last: Option<Failure<R>>) -> Failure<R> {
    last.unwrap_or_else(|| {
        Failure::new(Class::TRANSIENT, Code::Timeout).with_source(DeadlineElapsed(()))
    })
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    S::Response: 'static,
    Req: Replay + 'static,
{
    type Output = Result<S::Response, Failure<S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called {
                    mut future,
                    mut deadline,
                } => {
                    let (retry, kept) = (&*this.retry, &*this.kept);
                    let request = || match retry {
                        Some(r) => r.spare.as_ref(),
                        None => kept.as_ref(),
                    };
                    let reconcile = this.reconcile.as_ref();
                    let polled = match this.spans.as_ref() {
                        None => future.as_mut().poll_attempt(cx, reconcile, request),
                        Some(spans) => spans
                            .attempt
                            .in_scope(|| future.as_mut().poll_attempt(cx, reconcile, request)),
                    };
                    // Which attempt ended: the current one (`None`), or a hedged copy.
                    let mut copy: Option<(u32, Option<Instant>)> = None;
                    let result = match polled {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            if let Some((attempt, started, result)) =
                                this.retry.as_mut().and_then(|r| r.poll_hedges(cx))
                            {
                                copy = Some((attempt, started));
                                result
                            } else {
                                if deadline.is_none() {
                                    // The attempt's first `Pending`: only now race it against
                                    // the deadline (and, for the first attempt, start the
                                    // deadline), and against the hedging delay.
                                    let hedge = this.retry.as_ref().and_then(Retrying::hedge_delay);
                                    let Some(at) = earliest(this.deadline.at(), hedge) else {
                                        return Poll::Pending;
                                    };
                                    deadline.set(Some(tokio::time::sleep_until(at)));
                                }
                                if let Some(timer) = deadline.as_mut().as_pin_mut() {
                                    ready!(timer.poll(cx));
                                    let deadline_at = this.deadline.at();
                                    if deadline_at.is_none_or(|at| Instant::now() < at)
                                        && let Some(r) = this.retry.as_mut()
                                    {
                                        // The hedging delay, not the deadline: send a copy.
                                        if let Some(delay) = r.hedge_delay() {
                                            ready!(r.send_hedge(
                                                cx,
                                                this.spans.as_ref(),
                                                delay,
                                                deadline_at,
                                            ));
                                        }
                                        let next = earliest(deadline_at, r.hedge_delay());
                                        match (next, deadline.as_mut().as_pin_mut()) {
                                            (Some(at), Some(timer)) => timer.reset(at),
                                            _ => deadline.set(None),
                                        }
                                        continue;
                                    }
                                    // The deadline ended this attempt: return the last real failure.
                                    let (attempts, first, last, spare) = match this.retry.as_mut() {
                                        Some(r) => (
                                            r.attempts,
                                            r.first_failed_at(),
                                            r.take_last(),
                                            r.spare.take(),
                                        ),
                                        None => (1, None, None, this.kept.take()),
                                    };
                                    // A status check cut short: its failure, still outcome-unknown.
                                    let failure = match future.as_mut().take_checked() {
                                        Some(mut checked) => {
                                            checked.set_class(Class::OUTCOME_UNKNOWN);
                                            checked
                                        }
                                        None => deadline_failure(last),
                                    };
                                    let hook =
                                        hook_of(this.retry.as_ref(), this.single_policy.as_ref());
                                    hook.emit(|| Event::TimedOut {
                                        attempt: attempts,
                                        deadline: true,
                                    });
                                    return Poll::Ready(Err(handed(
                                        *this.hand_back,
                                        spare,
                                        give_up(
                                            hook,
                                            failure,
                                            attempts,
                                            first.or_else(|| Some(SystemTime::now())),
                                            GiveUp::DeadlineExceeded,
                                        ),
                                    )));
                                }
                                return Poll::Pending;
                            }
                        }
                    };
                    // The attempt's number and start, for the listener.
                    let ended = |retry: Option<&Retrying<_, _, _, _>>| match (&copy, retry) {
                        (Some((attempt, started)), _) => (*attempt, *started),
                        (None, Some(r)) => (r.current(), *this.started),
                        (None, None) => (1, *this.started),
                    };
                    let mut failure: Failure<S::Response> = match result {
                        Ok(response) => {
                            if let Some(spans) = this.spans.as_ref() {
                                let attempts = this.retry.as_ref().map_or(1, |r| r.attempts);
                                spans.call.record("attempts", attempts);
                            }
                            let hook = hook_of(this.retry.as_ref(), this.single_policy.as_ref());
                            if hook.is_set() {
                                let (attempt, started) = ended(this.retry.as_ref());
                                attempt_ended::<S::Response>(hook, started, attempt, None);
                            }
                            if let Some(budget) =
                                this.retry.as_ref().and_then(|r| r.policy.budget_ref())
                            {
                                budget.success();
                            }
                            return Poll::Ready(Ok(response));
                        }
                        Err(failure) => failure,
                    };
                    // The failure path's own reference to the listener (none without one), so
                    // that the retry state can be changed while events are handed over.
                    let hook = &hook_of(this.retry.as_ref(), this.single_policy.as_ref()).clone();
                    // A timeout or reset after a request that is not safe to resend: it may
                    // have been acted on. Never retried; recorded for reconciliation.
                    let unknown = !*this.safe && outcome_unknown(&failure);
                    if unknown {
                        failure.set_class(Class::OUTCOME_UNKNOWN);
                    }
                    if let Some(spans) = this.spans.as_mut() {
                        // A copy's failure is on its own span (`poll_copies`).
                        if copy.is_none() {
                            record_failure(&spans.attempt, &failure);
                            // The attempt is over: its span closes, whatever comes next.
                            spans.attempt = Span::none();
                        }
                        let attempts = this.retry.as_ref().map_or(1, |r| r.attempts);
                        spans.call.record("attempts", attempts);
                    }
                    if hook.is_set() {
                        let (attempt, started) = ended(this.retry.as_ref());
                        attempt_ended(hook, started, attempt, Some(&failure));
                    }
                    // Hedged: another attempt is still out. The failure is set aside, unless it
                    // ends the call (a class never retried, a server that said no).
                    if let Some(r) = this.retry.as_mut()
                        && (r.hedges_out() || (copy.is_some() && !future.is_done()))
                    {
                        if let Some(reason) = r.set_aside(&failure) {
                            let first = r.first_failed_at();
                            return Poll::Ready(Err(handed(
                                *this.hand_back,
                                r.spare.take(),
                                give_up(hook, failure, r.attempts, first, reason),
                            )));
                        }
                        history_of(&mut r.history).last = Some(failure);
                        if copy.is_none() {
                            future.set(Attempt::Done);
                        }
                        continue;
                    }
                    // A breaker rejection is not an attempt: the request never left.
                    let rejected = failure.code() == Code::CircuitOpen;
                    let Some(r) = this.retry.as_mut() else {
                        if rejected && let Some(left) = failure.retry_after() {
                            // Not retried here, but it never left: deferred to the half-open
                            // instant, like any rejection.
                            let now = SystemTime::now();
                            failure.notes_mut().insert(
                                Attempts::new(0, GiveUp::Deferred)
                                    .with_first_failed_at(now)
                                    .with_retry_at(retry_at(now, left)),
                            );
                            hook.emit(|| Event::GaveUp {
                                attempts: 0,
                                class: failure.class(),
                                code: failure.code(),
                                reason: GiveUp::Deferred,
                            });
                            return Poll::Ready(Err(handed(
                                *this.hand_back,
                                this.kept.take(),
                                failure,
                            )));
                        }
                        let reason = if unknown {
                            GiveUp::NotIdempotent
                        } else {
                            *this.single
                        };
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            this.kept.take(),
                            give_up(
                                hook,
                                failure,
                                u32::from(!rejected),
                                Some(SystemTime::now()),
                                reason,
                            ),
                        )));
                    };
                    if rejected {
                        r.attempts -= 1;
                    }
                    // A first attempt that failed without waiting starts the deadline here.
                    let deadline_at = this.deadline.at();
                    let policy = &r.policy;
                    let history = history_of(&mut r.history);
                    let class_failures = history.count(failure.class());
                    let first = *history.first_failed_at.get_or_insert_with(SystemTime::now);
                    let previous_delay = history.previous_delay;
                    if unknown {
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            r.spare.take(),
                            give_up(
                                hook,
                                failure,
                                r.attempts,
                                Some(first),
                                GiveUp::NotIdempotent,
                            ),
                        )));
                    }
                    let attempted = Attempted {
                        attempts: r.attempts,
                        class_failures,
                        spare: r.spare_state,
                        previous_delay,
                    };
                    let (delay, source) = match policy.decide(&failure, &attempted) {
                        Decision::Stop(reason) => {
                            return Poll::Ready(Err(handed(
                                *this.hand_back,
                                r.spare.take(),
                                give_up(hook, failure, r.attempts, Some(first), reason),
                            )));
                        }
                        Decision::Defer(at, delay) => {
                            if failure.code() == Code::CircuitOpen {
                                // A local rejection: the breaker said it opened, once, at WARN.
                                tracing::debug!(
                                    attempts = r.attempts,
                                    retry_at = %httpdate::fmt_http_date(at),
                                    "deferring: the breaker is open"
                                );
                            } else {
                                tracing::info!(
                                    attempts = r.attempts,
                                    class = %failure.class(),
                                    code = %failure.code(),
                                    delay = ?delay,
                                    retry_at = %httpdate::fmt_http_date(at),
                                    "deferring: delay above the maximum in-process delay"
                                );
                            }
                            hook.emit(|| Event::GaveUp {
                                attempts: r.attempts,
                                class: failure.class(),
                                code: failure.code(),
                                reason: GiveUp::Deferred,
                            });
                            failure.notes_mut().insert(
                                Attempts::new(r.attempts, GiveUp::Deferred)
                                    .with_first_failed_at(first)
                                    .with_retry_at(at),
                            );
                            return Poll::Ready(Err(handed(
                                *this.hand_back,
                                r.spare.take(),
                                failure,
                            )));
                        }
                        Decision::Retry(delay, source) => (delay, source),
                    };
                    if let Some(deadline) = deadline_at
                        && Instant::now()
                            .checked_add(delay)
                            .is_none_or(|wake| wake >= deadline)
                    {
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            r.spare.take(),
                            give_up(
                                hook,
                                failure,
                                r.attempts,
                                Some(first),
                                GiveUp::DeadlineExceeded,
                            ),
                        )));
                    }
                    if let Some(budget) = policy.budget_ref()
                        && !budget.withdraw()
                    {
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            r.spare.take(),
                            give_up(
                                hook,
                                failure,
                                r.attempts,
                                Some(first),
                                GiveUp::BudgetExhausted,
                            ),
                        )));
                    }
                    let (class, code) = (failure.class(), failure.code());
                    tracing::info!(
                        attempt = r.attempts,
                        class = %class,
                        code = %code,
                        delay = ?delay,
                        why = source.as_str(),
                        "retrying"
                    );
                    hook.emit(|| Event::RetryScheduled {
                        attempt: r.attempts,
                        class,
                        code,
                        delay,
                        source,
                    });
                    let history = history_of(&mut r.history);
                    history.last = Some(failure);
                    history.previous_delay = Some(delay);
                    this.state.set(State::Sleeping {
                        sleep: tokio::time::sleep(delay),
                    });
                }
                StateProj::Sleeping { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    let Some(r) = this.retry.as_mut() else {
                        // Only a retrying future sleeps.
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            this.kept.take(),
                            deadline_failure(None),
                        )));
                    };
                    let hook = &r.policy.hook().clone();
                    if let Err(e) = ready!(r.service.poll_ready(cx)) {
                        let failure: Failure<S::Response> = e.into();
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            r.spare.take(),
                            give_up(
                                hook,
                                failure,
                                r.attempts,
                                r.first_failed_at(),
                                GiveUp::NotReady,
                            ),
                        )));
                    }
                    // A late wake (a loaded runtime, a slow `poll_ready`) may pass the
                    // deadline: no attempt starts after it.
                    let deadline_at = this.deadline.at();
                    if deadline_at.is_some_and(|at| Instant::now() >= at) {
                        let failure = deadline_failure(r.take_last());
                        return Poll::Ready(Err(handed(
                            *this.hand_back,
                            r.spare.take(),
                            give_up(
                                hook,
                                failure,
                                r.attempts,
                                r.first_failed_at(),
                                GiveUp::DeadlineExceeded,
                            ),
                        )));
                    }
                    let mut request = match r.spare.take() {
                        Some(request) => request,
                        None => {
                            let failure = deadline_failure(r.take_last());
                            return Poll::Ready(Err(handed(
                                *this.hand_back,
                                r.spare.take(),
                                give_up(
                                    hook,
                                    failure,
                                    r.attempts,
                                    r.first_failed_at(),
                                    GiveUp::NotReplayable,
                                ),
                            )));
                        }
                    };
                    r.attempts += 1;
                    if let Some(history) = r.history.as_deref_mut() {
                        history.primary = None;
                    }
                    let max_attempts = r.policy.attempts();
                    // Under a dead-letter layer that reuses the copy, keep one for the last
                    // attempt too: it goes up with the failure; so with a status check.
                    if r.attempts < max_attempts
                        || this.hand_back.is_some()
                        || this.reconcile.is_some()
                    {
                        match request.replay() {
                            Some(copy) => r.spare = Some(copy),
                            None => r.spare_state = Spare::NotReplayable,
                        }
                    }
                    // Into this attempt only, after its copy was taken.
                    write_time_left(&mut request, &r.policy, deadline_at);
                    if let Some(spans) = this.spans.as_mut() {
                        spans.attempt = new_attempt_span(&spans.call, &request, r.attempts);
                    }
                    *this.started = hook.attempt_start();
                    let future = match this.spans.as_ref() {
                        None => r.service.call(request),
                        Some(spans) => spans.attempt.in_scope(|| r.service.call(request)),
                    };
                    this.state.set(State::Called {
                        future: Attempt::new(future),
                        deadline: None,
                    });
                }
            }
        }
    }
}
