use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::hedge;
use super::note::Attempts;
use super::policy::{Attempted, Decision, RetryPolicy, Spare, retry_at};
use super::reconcile::{Attempt, Reconcile, outcome_unknown};
use super::retrying::{MIN_TIME_LEFT, Retrying, write_time_left};
use super::trace::{self, Traced};
use super::unsent::KeepCopy;
use crate::failure::{Class, Code, Failure};
use crate::grpc_wire::codes;
use crate::observe::{Event, Hook};
use crate::request::Replay;
use crate::status::{DelaySource, GiveUp};

pin_project! {
    /// Response future of [`Retry`](super::Retry): a state machine of attempt, delay (a timer
    /// stored inline) and readiness, with its own attempt counts per logical request.
    ///
    /// When the request cannot be retried at all (`max_attempts(1)`, a request that could not
    /// be copied, a request not safe to resend with
    /// [`retry_unprocessed`](super::RetryPolicy::retry_unprocessed) off) it holds no service
    /// clone and no policy: it only forwards the single attempt. The overall deadline, when
    /// there is one, reads the clock only when an attempt first waits or fails (see
    /// [`RetryPolicy::deadline`]).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future, S::Response>,
        call: Call<S, Req, S::Future, S::Response>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Called {
            // The call, then the status check when the policy reconciles its failure.
            #[pin]
            future: Attempt<F, R>,
            // The overall deadline and the hedging delay, raced against the attempt: created at
            // the attempt's first `Pending`, and only when there is either.
            #[pin]
            timer: Option<Sleep>,
        },
        Sleeping {
            #[pin]
            sleep: Sleep,
        },
        Readying,
    }
}

/// Everything of a call but its state, built by `Retry::start`: what each state's function
/// works on.
pub(super) struct Call<S, Req, F, R> {
    /// Whether another attempt is possible, and what it needs.
    pub(super) mode: Mode<S, F, R>,
    /// A copy of the request: for the next attempt or a hedged copy, for the status check,
    /// and for the dead-letter layer above when `keep` is set.
    pub(super) spare: Option<Req>,
    /// Set under a dead-letter layer that reuses this layer's copy of the request (the
    /// preset's): the copy is kept to the end and every failure carries it up.
    pub(super) keep: Option<KeepCopy<R, Req>>,
    pub(super) deadline: Deadline,
    /// Whether the request is safe to send twice (for the outcome-unknown rule).
    pub(super) safe: bool,
    /// The policy's status check, for a request not safe to resend (`RetryPolicy::reconcile`).
    pub(super) reconcile: Option<Reconcile>,
    /// When the current attempt was called (only with a listener).
    pub(super) started: Option<Instant>,
    /// The call's span (`backstop.call`) and the current attempt's (`backstop.attempt`),
    /// boxed and made only for a subscriber that wants them (at `DEBUG`): otherwise one word.
    pub(super) spans: Traced,
}

/// Whether a call may send another attempt.
pub(super) enum Mode<S, F, R> {
    /// It may: a clone of the service, the policy, the counts.
    Retrying(Retrying<S, F, R>),
    /// One attempt only, and why. The policy is kept only for its listener, when it has one (a
    /// retrying call reads the listener from its own clone of the policy, so a call clones one
    /// reference, not two).
    Single {
        reason: GiveUp,
        listener: Option<RetryPolicy>,
        /// The policy gives long delays up instead of deferring them (no store above).
        give_up: bool,
    },
}

impl<S, F, R> Mode<S, F, R> {
    #[inline]
    fn as_retrying(&self) -> Option<&Retrying<S, F, R>> {
        match self {
            Mode::Retrying(r) => Some(r),
            Mode::Single { .. } => None,
        }
    }

    /// Attempts sent so far, hedged copies and a rejected attempt included.
    #[inline]
    fn sent(&self) -> u32 {
        self.as_retrying().map_or(1, |r| r.attempts)
    }

    /// The current attempt's number (a hedged copy's are counted apart).
    #[inline]
    fn sent_current(&self) -> u32 {
        self.as_retrying().map_or(1, Retrying::current)
    }

    /// The call's listener ([`Hook::NONE`] without one).
    #[inline]
    fn hook(&self) -> &Hook {
        trace::hook_of(match self {
            Mode::Retrying(r) => Some(&r.policy),
            Mode::Single { listener, .. } => listener.as_ref(),
        })
    }
}

/// The overall deadline of one logical request.
#[derive(Clone, Copy, Debug)]
pub(super) enum Deadline {
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
    pub(super) fn new(after: Option<Duration>) -> Self {
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

    /// The time left until the deadline, read on the clock now (the deadline starts now if it
    /// has not yet): `None` without a deadline.
    #[inline]
    fn left(&mut self) -> Option<Duration> {
        self.at()
            .map(|at| at.saturating_duration_since(Instant::now()))
    }
}

/// Which attempt ended.
#[derive(Clone, Copy)]
enum Ended {
    /// The current one.
    Current,
    /// A hedged copy: its number and start, and whether the current attempt is still out.
    Copy {
        attempt: u32,
        started: Option<Instant>,
        current_out: bool,
    },
}

/// What the current attempt's wait led to (see [`Call::poll_waiting`]).
enum Waited<R> {
    /// A hedged copy ended.
    Copy(Ended, Result<R, Failure<R>>),
    /// A copy was sent or the timer moved: poll again.
    Again,
    /// The deadline ended the attempt, with this failure.
    Deadline(Failure<R>),
}

/// What a failed attempt leads to: the one answer of [`Call::decide`].
enum Next {
    /// Sleep this long, then send the next attempt.
    Retry(Duration, DelaySource),
    /// Another attempt is still out: this failure is kept as the last one, and the call goes
    /// on.
    SetAside,
    /// The call ends.
    End(End),
}

/// How a call ends on a failure: what [`Call::finish`] writes on it.
enum End {
    /// Given up.
    GiveUp(GiveUp),
    /// Deferred to this instant. The delay is the one above the maximum in-process delay, or
    /// `None` for a single attempt's breaker rejection (deferred to the half-open instant).
    Defer(SystemTime, Option<Duration>),
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    /// The future of a call whose first attempt is `future`.
    #[inline(always)]
    pub(super) fn new(future: S::Future, call: Call<S, Req, S::Future, S::Response>) -> Self {
        ResponseFuture {
            state: State::Called {
                future: Attempt::new(future),
                timer: None,
            },
            call,
        }
    }
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
        let call = this.call;
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { mut future, timer } => {
                    let (ended, result) = match call.poll_attempt(future.as_mut(), cx) {
                        Poll::Ready(result) => (Ended::Current, result),
                        Poll::Pending => {
                            match ready!(call.poll_waiting(future.as_mut(), timer, cx)) {
                                Waited::Copy(ended, result) => (ended, result),
                                Waited::Again => continue,
                                Waited::Deadline(failure) => {
                                    let end = End::GiveUp(GiveUp::DeadlineExceeded);
                                    return Poll::Ready(Err(call.finish(failure, end)));
                                }
                            }
                        }
                    };
                    let mut failure = match result {
                        Ok(response) => {
                            call.succeeded(ended);
                            return Poll::Ready(Ok(response));
                        }
                        Err(failure) => failure,
                    };
                    match call.failed(ended, &mut failure) {
                        Next::SetAside => {
                            call.set_aside(failure);
                            if let Ended::Current = ended {
                                future.set(Attempt::Done);
                            }
                        }
                        Next::Retry(delay, source) => {
                            call.retry_after(failure, delay, source);
                            let sleep = tokio::time::sleep(delay);
                            this.state.set(State::Sleeping { sleep });
                        }
                        Next::End(end) => return Poll::Ready(Err(call.finish(failure, end))),
                    }
                }
                StateProj::Sleeping { sleep } => {
                    ready!(sleep.poll(cx));
                    if let Some(more) = call.slot_wait() {
                        // Its turn for a send slot has not come (the rate fell): wait on.
                        this.state.set(State::Sleeping {
                            sleep: tokio::time::sleep(more),
                        });
                        continue;
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    let future = match ready!(call.next_attempt(cx)) {
                        Ok(future) => Attempt::new(future),
                        Err(failure) => return Poll::Ready(Err(failure)),
                    };
                    let timer = None;
                    this.state.set(State::Called { future, timer });
                }
            }
        }
    }
}

impl<S, Req> Call<S, Req, S::Future, S::Response>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    S::Response: 'static,
    Req: Replay + 'static,
{
    /// Polls the current attempt, in its span.
    #[inline(always)]
    fn poll_attempt(
        &self,
        future: Pin<&mut Attempt<S::Future, S::Response>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, Failure<S::Response>>> {
        let request = || self.spare.as_ref();
        let reconcile = self.reconcile.as_ref();
        match self.spans.as_ref() {
            None => future.poll_attempt(cx, reconcile, request),
            Some(spans) => spans
                .attempt
                .in_scope(|| future.poll_attempt(cx, reconcile, request)),
        }
    }

    /// The number and start of the attempt that ended, for the listener.
    #[inline]
    fn which(&self, ended: Ended) -> (u32, Option<Instant>) {
        match ended {
            Ended::Copy {
                attempt, started, ..
            } => (attempt, started),
            Ended::Current => {
                let current = self.mode.as_retrying().map_or(1, Retrying::current);
                (current, self.started)
            }
        }
    }

    /// The call succeeded: the span, the listener and the budget are told.
    #[inline]
    fn succeeded(&self, ended: Ended) {
        self.spans.record_attempts(self.mode.sent());
        let hook = self.mode.hook();
        if hook.is_set() {
            // The retry out went through: its own attempt answered, or a copy did first.
            self.retried(hook);
            let (attempt, started) = self.which(ended);
            trace::attempt_ended::<S::Response>(hook, started, attempt, None, false);
        }
        if let Some(budget) = self.mode.as_retrying().and_then(|r| r.policy.budget_ref()) {
            budget.success();
        }
    }

    /// The current attempt is pending: polls the hedged copies out, then the timer of the
    /// deadline and of the next copy.
    #[inline]
    fn poll_waiting(
        &mut self,
        future: Pin<&mut Attempt<S::Future, S::Response>>,
        mut timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Waited<S::Response>> {
        if let Mode::Retrying(r) = &mut self.mode
            && let Some((attempt, started, result)) = r.poll_hedges(cx)
        {
            let current_out = !future.is_done();
            let ended = Ended::Copy {
                attempt,
                started,
                current_out,
            };
            return Poll::Ready(Waited::Copy(ended, result));
        }
        if timer.is_none() {
            // The attempt's first `Pending`: only now race it against the deadline (and, for
            // the first attempt, start the deadline), and against the hedging delay.
            let hedge = self.hedge_delay();
            let Some(at) = hedge::earliest(self.deadline.at(), hedge) else {
                return Poll::Pending;
            };
            timer.set(Some(tokio::time::sleep_until(at)));
        }
        if let Some(sleep) = timer.as_mut().as_pin_mut() {
            ready!(sleep.poll(cx));
            return self.timer_fired(future, timer, cx);
        }
        Poll::Pending
    }

    /// The hedging delay, when a copy may be sent now (see `Retrying::hedge_delay`).
    #[inline]
    fn hedge_delay(&self) -> Option<Duration> {
        let spare = self.spare.is_some();
        self.mode.as_retrying().and_then(|r| r.hedge_delay(spare))
    }

    /// The current attempt's timer fired: at the hedging delay, a copy is sent and the timer
    /// set again; at the deadline, the attempt is over.
    #[cold]
    #[inline(never)]
    fn timer_fired(
        &mut self,
        future: Pin<&mut Attempt<S::Future, S::Response>>,
        mut timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Waited<S::Response>> {
        let deadline = self.deadline.at();
        if deadline.is_none_or(|at| Instant::now() < at)
            && let Mode::Retrying(r) = &mut self.mode
        {
            if let Some(delay) = r.hedge_delay(self.spare.is_some()) {
                let spare = self.spare.as_ref();
                ready!(r.send_hedge(cx, spare, &self.spans, delay, deadline));
            }
            let next = hedge::earliest(deadline, r.hedge_delay(self.spare.is_some()));
            match (next, timer.as_mut().as_pin_mut()) {
                (Some(at), Some(sleep)) => sleep.reset(at),
                _ => timer.set(None),
            }
            return Poll::Ready(Waited::Again);
        }
        // The deadline ended the attempt: the failure is the status check's that was cut short
        // (still outcome-unknown), or the last real one.
        let failure = match future.take_checked() {
            Some(mut checked) => {
                checked.set_class(Class::OUTCOME_UNKNOWN);
                checked
            }
            None => self.cut_by_deadline(),
        };
        let attempt = self.mode.sent();
        let hook = self.mode.hook();
        if hook.is_set() {
            // The attempt cut short went out.
            self.retried(hook);
        }
        hook.emit(|| Event::TimedOut {
            attempt,
            deadline: true,
        });
        Poll::Ready(Waited::Deadline(failure))
    }

    /// An attempt failed: a request not safe to resend whose outcome is unknown is marked so,
    /// the span and the listener are told, and [`decide`](Self::decide) says what comes next.
    #[cold]
    #[inline(never)]
    fn failed(&mut self, ended: Ended, failure: &mut Failure<S::Response>) -> Next {
        // A timeout at the deadline: the attempt was cut short by the time left it was given
        // (its own timeout, or the channel's `grpc-timeout`, raced the deadline's timer).
        let cut = self.cut_short(failure);
        // A timeout or reset after a request that is not safe to resend: it may have been
        // acted on. Never retried; recorded for reconciliation.
        let unknown = !self.safe && outcome_unknown(failure);
        if unknown {
            failure.set_class(Class::OUTCOME_UNKNOWN);
        }
        let current = matches!(ended, Ended::Current);
        self.spans
            .attempt_failed(failure, current, self.mode.sent());
        // The current attempt was a retry: it went out, unless a breaker rejected it.
        let retry = match &mut self.mode {
            Mode::Retrying(r) if current => r.take_retry_out(),
            _ => None,
        };
        let hook = self.mode.hook();
        if hook.is_set() {
            if let Some((delay, source)) = retry
                && !failure.code().not_an_attempt()
            {
                trace::retried(hook, self.mode.sent_current(), delay, source);
            }
            let (attempt, started) = self.which(ended);
            trace::attempt_ended(hook, started, attempt, Some(&*failure), cut);
        }
        if cut {
            // As when the deadline's timer wins: the caller gets the last real answer.
            *failure = self.cut_by_deadline();
            return Next::End(End::GiveUp(GiveUp::DeadlineExceeded));
        }
        self.decide(failure, unknown, ended)
    }

    /// Tells the listener of the retry whose attempt is out, when the call ends with it out
    /// or answered: one load of the failure path's record on a call that never failed.
    #[inline]
    fn retried(&self, hook: &Hook) {
        if let Some((delay, source)) = self.mode.as_retrying().and_then(Retrying::retry_out) {
            trace::retried(hook, self.mode.sent_current(), delay, source);
        }
    }

    /// After a retry's delay: drives the service to readiness and calls it with the spare
    /// copy, keeping another copy when one may be needed. The failure, through
    /// [`finish`](Self::finish), when the service fails, the deadline has passed or there is no
    /// copy.
    #[cold]
    #[inline(never)]
    fn next_attempt(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Future, Failure<S::Response>>> {
        let Mode::Retrying(r) = &mut self.mode else {
            unreachable!("only a retrying call sleeps");
        };
        if let Err(e) = ready!(r.service.poll_ready(cx)) {
            let end = End::GiveUp(GiveUp::NotReady);
            return Poll::Ready(Err(self.finish(e.into(), end)));
        }
        let Some(mut request) = self.spare.take() else {
            let failure = last_or_deadline(r.take_last());
            let end = End::GiveUp(GiveUp::NotReplayable);
            return Poll::Ready(Err(self.finish(failure, end)));
        };
        // A copy for every attempt, the last included: a breaker below may refuse any of them
        // (open, or its send rate holding the call back until its turn), and a refused request
        // never left, so it is sent again, deferred or handed up with its copy, never given up
        // for want of one. Only a call that failed once pays for it.
        let copy = request.replay();
        // The deadline, read once, after readiness and just before the call: a late wake (a
        // loaded runtime, a slow `poll_ready`) may have passed it, and no attempt starts after
        // it, or with less than `MIN_TIME_LEFT`. The same reading is the attempt's time left.
        let left = self.deadline.left();
        if left.is_some_and(|left| left < MIN_TIME_LEFT) {
            // Not sent: the request stays the spare (a dead-letter layer above keeps it).
            self.spare = Some(request);
            let failure = last_or_deadline(r.take_last());
            let end = End::GiveUp(GiveUp::DeadlineExceeded);
            return Poll::Ready(Err(self.finish(failure, end)));
        }
        r.next_attempt();
        match copy {
            Some(copy) => self.spare = Some(copy),
            None => r.spare_state = Spare::NotReplayable,
        }
        // Into this attempt only, after its copy was taken.
        write_time_left(&mut request, &r.policy, left);
        self.spans.next_attempt(&request, r.attempts);
        self.started = r.policy.hook().attempt_start();
        // Its turn for a send slot came (the breaker lets it through at once), or it is given
        // back and the breaker decides again.
        drop(r.take_slot());
        Poll::Ready(Ok(match self.spans.attempt() {
            None => r.service.call(request),
            Some(span) => span.in_scope(|| r.service.call(request)),
        }))
    }
}

impl<S, Req, F, R> Call<S, Req, F, R> {
    /// What the failure of an attempt leads to: set aside while another attempt is out, a
    /// retry after a delay, a deferral, or a give-up. `unknown`: the request is not safe to
    /// resend and the failure's outcome is unknown.
    fn decide(&mut self, failure: &Failure<R>, unknown: bool, ended: Ended) -> Next {
        let give_up = |reason| Next::End(End::GiveUp(reason));
        let r = match &mut self.mode {
            Mode::Retrying(r) => r,
            Mode::Single {
                reason, give_up, ..
            } => return Next::End(single_end(*reason, *give_up, failure, unknown)),
        };
        // Hedged: another attempt is still out. The failure is set aside, unless it ends the
        // call (a class never retried, a server that said no).
        if r.hedges_out()
            || matches!(
                ended,
                Ended::Copy {
                    current_out: true,
                    ..
                }
            )
        {
            return r.set_aside(failure).map_or(Next::SetAside, give_up);
        }
        if failure.code() == Code::Paced {
            return self.decide_paced(failure);
        }
        if failure.code() == Code::CircuitOpen {
            // A breaker rejection is not an attempt: the request never left.
            r.attempts -= 1;
        }
        // A first attempt that failed without waiting starts the deadline here.
        let deadline = self.deadline.at();
        let (class_failures, previous_delay) = r.count(failure.class());
        if unknown {
            return give_up(GiveUp::NotIdempotent);
        }
        let attempted = Attempted {
            attempts: r.attempts,
            class_failures,
            spare: r.spare_state,
            previous_delay,
        };
        let (delay, source) = match r.policy.decide(failure, &attempted) {
            Decision::Stop(reason) => return give_up(reason),
            Decision::Defer(at, delay) => return Next::End(End::Defer(at, Some(delay))),
            Decision::Retry(delay, source) => (delay, source),
        };
        if past_deadline(deadline, delay) {
            return give_up(GiveUp::DeadlineExceeded);
        }
        if let Some(budget) = r.policy.budget_ref()
            && !budget.withdraw()
        {
            return give_up(GiveUp::BudgetExhausted);
        }
        Next::Retry(delay, source)
    }

    /// A call the breaker's adaptive send rate or concurrency limit held back until its slot:
    /// not an attempt, not the provider's failure, and no budget spent; the wait is slept like
    /// a server's hint, or the request deferred or given up like one.
    #[cold]
    fn decide_paced(&mut self, failure: &Failure<R>) -> Next {
        let Mode::Retrying(r) = &mut self.mode else {
            unreachable!("a single attempt ends in `single_end`");
        };
        r.paced();
        let deadline = self.deadline.at();
        let wait = failure.retry_after().unwrap_or_default();
        let source = crate::breaker::held_by(failure);
        match r
            .policy
            .decide_paced(wait, r.paced_for(), r.spare_state, source)
        {
            Decision::Stop(reason) => Next::End(End::GiveUp(reason)),
            Decision::Defer(at, delay) => Next::End(End::Defer(at, Some(delay))),
            Decision::Retry(..) if past_deadline(deadline, wait) => {
                Next::End(End::GiveUp(GiveUp::DeadlineExceeded))
            }
            Decision::Retry(delay, source) => {
                r.add_paced(delay);
                Next::Retry(delay, source)
            }
        }
    }

    /// After a sleep: more to wait for a send slot whose turn has not come, within the policy's
    /// bound and before the deadline.
    #[cold]
    #[inline(never)]
    fn slot_wait(&mut self) -> Option<Duration> {
        let Mode::Retrying(r) = &mut self.mode else {
            return None;
        };
        let more = r.slot_wait()?;
        let deadline = self.deadline.at();
        (!past_deadline(deadline, more)).then_some(more)
    }

    /// Whether `failure` ended an attempt at the deadline because the attempt's time was up: a
    /// timeout (ours, or a server's or channel's `DEADLINE_EXCEEDED`) with less than
    /// `MIN_TIME_LEFT` to the deadline. Such an attempt was cut short by the time left it was
    /// given; it says nothing new of the provider.
    fn cut_short(&mut self, failure: &Failure<R>) -> bool {
        matches!(
            failure.code(),
            Code::Timeout | Code::Grpc(codes::DEADLINE_EXCEEDED)
        ) && self
            .deadline
            .left()
            .is_some_and(|left| left < MIN_TIME_LEFT)
    }

    /// The failure of a call whose deadline ended an attempt: the last real failure (its class,
    /// code and response), or the deadline's own when there is none. For a request not safe
    /// to send twice it is [`Class::OUTCOME_UNKNOWN`]: the attempt cut short was sent, and may
    /// have been acted on.
    fn cut_by_deadline(&mut self) -> Failure<R> {
        let last = match &mut self.mode {
            Mode::Retrying(r) => r.take_last(),
            Mode::Single { .. } => None,
        };
        let mut failure = last_or_deadline(last);
        if !self.safe {
            failure.set_class(Class::OUTCOME_UNKNOWN);
        }
        failure
    }

    /// Keeps `failure` as the last one while another attempt is out.
    fn set_aside(&mut self, failure: Failure<R>) {
        if let Mode::Retrying(r) = &mut self.mode {
            r.keep_last(failure);
        }
    }

    /// A retry after `delay`: said, and `failure` kept as the last one while the call sleeps.
    fn retry_after(&mut self, failure: Failure<R>, delay: Duration, source: DelaySource) {
        if let Mode::Retrying(r) = &mut self.mode {
            trace::retrying(r.policy.hook(), &failure, r.attempts, delay, source);
            r.retry_after(failure, delay, source);
        }
    }

    /// Where every call that fails ends: the [`Attempts`] note (attempts made, why it stopped,
    /// when the first attempt failed, when to send a deferred request again), the listener's
    /// `GaveUp` and the log line, and the spare copy handed up when `keep` is set.
    #[cold]
    #[inline(never)]
    fn finish(&mut self, mut failure: Failure<R>, end: End) -> Failure<R> {
        let (attempts, first) = match &self.mode {
            Mode::Retrying(r) => (r.attempts, r.first_failed_at()),
            // One attempt, unless the breaker rejected it or held it back: the request never
            // left.
            Mode::Single { .. } => (u32::from(!failure.code().not_an_attempt()), None),
        };
        let first = first.unwrap_or_else(SystemTime::now);
        let hook = self.mode.hook();
        let note = match end {
            End::GiveUp(reason) => {
                trace::gave_up(hook, &failure, attempts, reason);
                Attempts::new(attempts, reason)
            }
            End::Defer(at, delay) => {
                trace::deferred(hook, &failure, attempts, at, delay);
                Attempts::new(attempts, GiveUp::Deferred).with_retry_at(at)
            }
        };
        failure.notes_mut().insert(note.with_first_failed_at(first));
        if let (Some(keep), Some(spare)) = (self.keep, self.spare.take()) {
            keep.hand_up(&mut failure, spare);
        }
        failure
    }
}

/// Whether the next attempt, `delay` from now, would start after `deadline` or with less than
/// `MIN_TIME_LEFT` before it.
fn past_deadline(deadline: Option<Instant>, delay: Duration) -> bool {
    deadline.is_some_and(|deadline| {
        Instant::now()
            .checked_add(delay)
            .and_then(|wake| wake.checked_add(MIN_TIME_LEFT))
            .is_none_or(|wake| wake > deadline)
    })
}

/// How the failure of a call's single attempt ends: not retried here. A breaker rejection or a
/// call held back by the send rate never left: it is deferred to the half-open instant or its
/// slot, like any rejection, unless the policy gives long delays up (`give_up`: no store).
fn single_end<R>(reason: GiveUp, give_up: bool, failure: &Failure<R>, unknown: bool) -> End {
    match failure.retry_after() {
        Some(_) if give_up && failure.code().not_an_attempt() => End::GiveUp(GiveUp::HintTooLong),
        Some(left) if failure.code().not_an_attempt() => {
            End::Defer(retry_at(SystemTime::now(), left), None)
        }
        _ if unknown => End::GiveUp(GiveUp::NotIdempotent),
        _ => End::GiveUp(reason),
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

/// The last real failure, or the deadline's own when there is none.
fn last_or_deadline<R>(last: Option<Failure<R>>) -> Failure<R> {
    last.unwrap_or_else(|| {
        Failure::new(Class::TRANSIENT, Code::Timeout).with_source(DeadlineElapsed(()))
    })
}
