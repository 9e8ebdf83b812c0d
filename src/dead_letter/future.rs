use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_service::Service;

use super::bounded::{bounded, timed_out};
use super::budget::refusal;
use super::layer::Config;
use super::note::DeadLetterStatus;
use super::record::{generated_id, record_at};
use super::resending;
use super::write_ahead::WriteAhead;
use crate::failure::{Code, Failure};
use crate::observe::Event;
use crate::request::{Describe, Envelope, Replay};
use crate::retry::{Attempts, GiveUp, Unsent};
use crate::store::{BoxFuture, Claim, Lease, Status, StoreError};

pin_project! {
    /// Response future of [`DeadLetter`](super::DeadLetter) over a service `S`: the inner call
    /// (made at once, or, under an [attempt budget](super::DeadLetterLayer::attempt_budget),
    /// when first polled, after the budget allowed it), then, on failure, the one store write
    /// that failure needs.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        // What the layer does before the call (an attempt budget's read, write-ahead), boxed:
        // one word on a call without either, so the future stays small.
        before: Option<Box<Before>>,
        kept: Kept<Req>,
        config: Arc<Config>,
    }
}

impl<S: Service<Req>, Req> std::fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What the dead-letter layer keeps of a request while it is sent.
pub(crate) enum Kept<Req> {
    /// Its own copy.
    Copy(Req),
    /// Nothing yet: the retry layer below hands its unsent copy up with the failure.
    HandedBack,
    /// No copy could be made (a streaming body): only the record id the request names
    /// ([`Describe::message_id`]), taken before the call so that the record keeps it.
    Uncopyable(Option<String>),
}

impl<Req: Describe> Kept<Req> {
    /// `copy` of `req` if there is one, else what the record can still keep of it.
    #[inline]
    pub(crate) fn of(req: &Req, copy: Option<Req>) -> Self {
        match copy {
            Some(copy) => Kept::Copy(copy),
            None => Kept::Uncopyable(req.message_id().map(str::to_owned)),
        }
    }
}

/// The one store write of a failure: the record's id, its status, and whether it was written
/// (`false`: the request was a re-send whose claim had passed to another sender, and nothing
/// was written).
type Write = BoxFuture<'static, Written>;

/// How a failure's record write ended: its id and status, the store's answer (whether it wrote),
/// and, when the store failed and there is a spool, the spool's (`Err` with why it refused).
type Written = (
    String,
    Status,
    Result<bool, StoreError>,
    Option<Result<(), String>>,
);

/// What the layer does before (and, for write-ahead, during) a call: built only when an attempt
/// budget or write-ahead applies to the request.
pub(crate) struct Before {
    /// The attempt budget's read, until it is done.
    check: Option<Check>,
    /// Write-ahead: the record's write, then the claim the call holds.
    ahead: Option<WriteAhead>,
    /// When the store calls before the call began.
    started: std::time::Instant,
    /// How long they took, once done: the failure's record write gets what is left of the
    /// store timeout.
    spent: Option<Duration>,
}

impl Before {
    /// What `config` does before calling with `req`: `None` when neither an attempt budget
    /// (a request with a message id) nor write-ahead (a request that can be copied) applies.
    #[cold]
    #[inline(never)]
    pub(crate) fn of<Req>(config: &Arc<Config>, req: &Req) -> Option<Box<Before>>
    where
        Req: Replay + Describe + Send + 'static,
    {
        let check = match (config.budget, req.message_id()) {
            (Some(budget), Some(id)) => Some(Check {
                // Bounded: a store that does not answer is a budget not known.
                read: Box::pin(super::bounded::bounded_call(
                    super::spool::store_bound(config),
                    config.store.budget_spent(id),
                )),
                id: id.to_owned(),
                budget,
            }),
            _ => None,
        };
        // The budget's read and the write-ahead write share one store timeout (less the spool's
        // share, with a spool): a hung store costs the caller that much before the call, and
        // the failure's record write only what is left of it.
        let started = std::time::Instant::now();
        let deadline = Some(started + super::spool::store_bound(config));
        let ahead = match (config.write_ahead, req.replay()) {
            (Some(length), Some(copy)) => Some(WriteAhead::Storing(super::write_ahead::store(
                config, copy, length, deadline,
            ))),
            (Some(_), None) => {
                tracing::warn!("request body cannot be copied: sent without write-ahead");
                None
            }
            (None, _) => None,
        };
        if check.is_none() && ahead.is_none() {
            return None;
        }
        Some(Box::new(Before {
            check,
            ahead,
            started,
            spent: None,
        }))
    }
}

/// The attempt budget's store read for message `id`: the attempts it already used, if any.
pub(crate) struct Check {
    read: BoxFuture<'static, Result<Option<u32>, StoreError>>,
    id: String,
    budget: u32,
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting {
            // A ready service (taken after its `poll_ready`) and the request for it.
            call: Option<(S, Req)>,
        },
        Called {
            #[pin]
            future: S::Future,
        },
        Writing {
            write: Write,
            failure: Option<Failure<S::Response>>,
        },
        // The call succeeded: its write-ahead record is being resolved (the write is in
        // `before`, so that this state is no larger than the response).
        Resolving {
            response: Option<S::Response>,
        },
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    /// The call, made.
    #[inline(always)]
    pub(crate) fn new(future: S::Future, kept: Kept<Req>, config: Arc<Config>) -> Self {
        ResponseFuture {
            state: State::Called { future },
            before: None,
            kept,
            config,
        }
    }

    /// The call of `request` on `service` (ready): made at once, or, when `before` says the
    /// layer acts first, when first polled, with the ready service taken (a clone left in
    /// its place).
    #[inline(always)]
    pub(crate) fn start(
        service: &mut S,
        request: Req,
        before: Option<Box<Before>>,
        kept: Kept<Req>,
        config: Arc<Config>,
    ) -> Self
    where
        S: Clone,
    {
        let state = match before {
            None => State::Called {
                future: service.call(request),
            },
            Some(_) => {
                let clone = service.clone();
                let ready = std::mem::replace(service, clone);
                State::Waiting {
                    call: Some((ready, request)),
                }
            }
        };
        ResponseFuture {
            state,
            before,
            kept,
            config,
        }
    }
}

/// A call that failed: the store write of its record, or (`Err`) the failure as it is, for a
/// refusal of which no copy was kept. Out of the poll's way: the success path stays small.
#[cold]
#[inline(never)]
fn on_failure<Req, R>(
    before: &mut Option<Box<Before>>,
    kept: &mut Kept<Req>,
    config: &Arc<Config>,
    mut failure: Failure<R>,
) -> Result<(Write, Failure<R>), Failure<R>>
where
    Req: Replay + Describe + Send + 'static,
{
    let spent = before.as_deref().and_then(|b| b.spent).unwrap_or_default();
    let lease = held(before).map(|renewal| renewal.lease().clone());
    if lease.is_none() && unkept_refusal(kept, &failure) {
        return Err(failure);
    }
    let write = start_write(kept, config, &mut failure, lease, spent);
    Ok((write, failure))
}

/// The one store write for `failure`: its record, built from the request kept (or handed back
/// on the failure), described on the failure path only.
fn start_write<Req, R>(
    kept: &mut Kept<Req>,
    config: &Arc<Config>,
    failure: &mut Failure<R>,
    ahead: Option<Lease>,
    spent: Duration,
) -> Write
where
    Req: Replay + Describe + Send + 'static,
{
    // Our own copy, or the retry layer's unsent one (the preset's `with_retry`).
    let (kept, id) = match std::mem::replace(kept, Kept::HandedBack) {
        Kept::Copy(copy) => (Some(copy), None),
        Kept::HandedBack => (
            failure
                .notes_mut()
                .remove::<Unsent<Req>>()
                .map(Unsent::into_inner),
            None,
        ),
        Kept::Uncopyable(id) => (None, id),
    };
    let config = Arc::clone(config);
    // The write-ahead claim (its record id is the record's), or a re-send's claim, read while
    // the re-send's task polls this future.
    let ahead_id = ahead.as_ref().map(|lease| lease.id.clone());
    let claim = ahead.or_else(super::claim::current);
    if !config.schedule.is_none() {
        let pass = super::schedule::Pass::current();
        let now = config.clock.now();
        super::schedule::defer_exhausted(&config.schedule, kept.as_ref(), failure, pass, now);
    }
    // Everything the record needs from the failure, taken now: the failure
    // itself goes back to the caller.
    let draft = record_at(
        String::new(),
        Envelope::default(),
        failure,
        config.clock.now(),
    );
    let status = draft.status;
    if draft.status == Status::Dead {
        stored_dead(failure);
    } else if let Some(at) = draft.retry_at {
        refusal_deferred(failure, at);
    }
    Box::pin(async move {
        let mut envelope = match kept {
            Some(request) => request.describe().await,
            None => {
                let mut envelope = Envelope::default().with_metadata(
                    "payload_missing",
                    "the request could not be copied before the call",
                );
                envelope.id = id;
                envelope
            }
        };
        if let Some(tags) = &config.tags {
            envelope.tags.extend(tags(&envelope));
        }
        let id = ahead_id
            .or_else(|| envelope.id.clone())
            .unwrap_or_else(generated_id);
        let mut record = draft;
        record.id = id.clone();
        config.fill(&mut record, envelope);
        let lease = claim.filter(|lease| lease.id == id);
        let spare = super::spool::copy(&config, &record, lease.as_ref());
        let started = std::time::Instant::now();
        // What is left of the store timeout after the store calls before the call.
        let total = super::spool::store_bound(&config);
        let bound = total.saturating_sub(spent);
        let write = async {
            match lease {
                // A re-send of a claimed record: its failure ends the claim, if it still holds.
                Some(lease) => config
                    .store
                    .put_claimed(&lease, record)
                    .await
                    .map(|claim| matches!(claim, Claim::Claimed(_))),
                None => config.store.put(record).await.map(|()| true),
            }
        };
        // Bounded: a store that does not answer costs the caller its timeout, no more.
        let written = bounded(bound, write)
            .await
            .unwrap_or_else(|| Err(timed_out(total)));
        let spooled = match (&written, spare) {
            (Err(_), Some(spare)) => {
                let left = config
                    .store_timeout
                    .saturating_sub(spent + started.elapsed());
                Some(super::spool::put(&config, spare, left).await)
            }
            _ => None,
        };
        (id, status, written, spooled)
    })
}

/// Whether `failure` is a call refused before it left (an open breaker's rejection, a send
/// rate's hold) of which no copy was kept (its body could not be copied): a record could not
/// send it again, so none is written, and the failure goes back as it is, its class and code
/// saying why (the caller may send it again itself).
#[cold]
fn unkept_refusal<Req: Send + 'static, R>(kept: &Kept<Req>, failure: &Failure<R>) -> bool {
    failure.code().not_an_attempt()
        && match kept {
            Kept::Copy(_) => false,
            Kept::HandedBack => failure.note::<Unsent<Req>>().is_none(),
            Kept::Uncopyable(_) => true,
        }
}

/// A call refused before it left that the retry layer gave up on (its deadline, its waits for
/// the breaker used up) but that is stored deferred, to `at`, says so to the caller as the
/// record does: its [`Attempts`] note is [`GiveUp::Deferred`] with that retry-at time.
#[cold]
fn refusal_deferred<R>(failure: &mut Failure<R>, at: std::time::SystemTime) {
    let Some(noted) = failure.note::<Attempts>().filter(|a| !a.is_deferred()) else {
        return;
    };
    let mut deferred = Attempts::new(noted.count(), GiveUp::Deferred).with_retry_at(at);
    if let Some(first) = noted.first_failed_at() {
        deferred = deferred.with_first_failed_at(first);
    }
    failure.notes_mut().insert(deferred);
}

/// A failure that was to be stored deferred, but that the store did not take, says so: its
/// [`Attempts`] note gives up with [`GiveUp::NotStored`] and no retry-at time, so that a caller
/// that reads only [`Attempts::retry_at`] does not take it for deferred.
#[cold]
fn not_deferred<R>(failure: &mut Failure<R>) {
    let Some(noted) = failure.note::<Attempts>() else {
        // No retry layer: the one call, unless it was refused before it left.
        let attempts = u32::from(!failure.code().not_an_attempt());
        failure
            .notes_mut()
            .insert(Attempts::new(attempts, GiveUp::NotStored));
        return;
    };
    let mut lost = Attempts::new(noted.count(), GiveUp::NotStored);
    if let Some(at) = noted.first_failed_at() {
        lost = lost.with_first_failed_at(at);
    }
    failure.notes_mut().insert(lost);
}

/// A failure the retry layer deferred but that is stored dead (its retry-at time is more than
/// [`MAX_DEFERRAL`](super::MAX_DEFERRAL) ahead) says so to the caller as the record does: its
/// [`Attempts`] note gives up with [`GiveUp::HintTooLong`] and no retry-at time, so its
/// [`DeadLetterStatus`] reads as a dead letter.
#[cold]
fn stored_dead<R>(failure: &mut Failure<R>) {
    let Some(noted) = failure.note::<Attempts>().filter(|a| a.is_deferred()) else {
        return;
    };
    let mut dead = Attempts::new(noted.count(), GiveUp::HintTooLong);
    if let Some(at) = noted.first_failed_at() {
        dead = dead.with_first_failed_at(at);
    }
    failure.notes_mut().insert(dead);
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    Req: Replay + Describe + Send + 'static,
{
    type Output = Result<S::Response, Failure<S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(before) = this.before.as_deref_mut() {
            ready!(poll_before(
                before,
                &mut this.state,
                this.kept,
                this.config,
                cx
            ));
        }
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { call } => {
                    let (mut service, request) = call
                        .take()
                        .expect("dead-letter future polled after completion");
                    let future = service.call(request);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => {
                    let result = match future.poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            if let Some(Before {
                                ahead: Some(WriteAhead::Held(renewal)),
                                ..
                            }) = this.before.as_deref_mut()
                            {
                                renewal.poll_renew(cx);
                            }
                            return Poll::Pending;
                        }
                    };
                    let failure: Failure<S::Response> = match result {
                        // Without write-ahead: the response, at once.
                        Ok(response) if this.before.is_none() => {
                            return Poll::Ready(Ok(response));
                        }
                        Ok(response) => {
                            if !resolve(this.before) {
                                return Poll::Ready(Ok(response));
                            }
                            this.state.set(State::Resolving {
                                response: Some(response),
                            });
                            continue;
                        }
                        Err(e) => e.into(),
                    };
                    match on_failure(this.before, this.kept, this.config, failure) {
                        Ok((write, failure)) => this.state.set(State::Writing {
                            write,
                            failure: Some(failure),
                        }),
                        Err(failure) => return Poll::Ready(Err(failure)),
                    }
                }
                StateProj::Writing { write, failure } => {
                    let (id, status, result, spooled) = ready!(write.as_mut().poll(cx));
                    let mut failure = failure
                        .take()
                        .expect("dead-letter future polled after completion");
                    note_write(this.config, (id, status, result, spooled), &mut failure);
                    return Poll::Ready(Err(failure));
                }
                StateProj::Resolving { response } => {
                    if let Some(Before {
                        ahead: Some(WriteAhead::Resolving(resolve)),
                        ..
                    }) = this.before.as_deref_mut()
                    {
                        ready!(resolve.as_mut().poll(cx));
                    }
                    let response = response
                        .take()
                        .expect("dead-letter future polled after completion");
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

/// The write-ahead claim the call held, taken out of `before`: `None` without write-ahead.
#[cold]
fn held(before: &mut Option<Box<Before>>) -> Option<super::write_ahead::Renewal> {
    match before.take()?.ahead? {
        WriteAhead::Held(renewal) => Some(renewal),
        WriteAhead::Storing(_) | WriteAhead::Resolving(_) => None,
    }
}

/// After a success: starts resolving the write-ahead record the call held, if it held one
/// (`true`: the write is in `before`, to be polled before the response goes back).
#[cold]
fn resolve(before: &mut Option<Box<Before>>) -> bool {
    let Some(before) = before.as_deref_mut() else {
        return false;
    };
    match before.ahead.take() {
        Some(WriteAhead::Held(renewal)) => {
            before.ahead = Some(WriteAhead::Resolving(renewal.resolve()));
            true
        }
        _ => false,
    }
}

/// Polls what comes before the call: the attempt budget's read (a spent budget puts the
/// refusal's write in `state`, and the call is never made), then the write-ahead write.
/// Ready once the call may go on.
fn poll_before<S, Req>(
    before: &mut Before,
    state: &mut Pin<&mut State<S, Req>>,
    kept: &mut Kept<Req>,
    config: &Arc<Config>,
    cx: &mut Context<'_>,
) -> Poll<()>
where
    S: Service<Req>,
    Req: Replay + Describe + Send + 'static,
{
    if let Some(check) = before.check.as_mut() {
        let spent = match ready!(check.read.as_mut().poll(cx)) {
            Ok(spent) => spent.unwrap_or(0),
            Err(error) => {
                config.listener.emit_ref(&Event::StoreError {
                    operation: "read",
                    id: Some(&check.id),
                    error: &error,
                });
                tracing::warn!(
                    id = %check.id,
                    error = %error,
                    "attempt budget not checked: the dead-letter store cannot be read"
                );
                0
            }
        };
        let Check { id, budget, .. } = before.check.take().expect("checked above");
        if spent >= budget {
            // The inner service was never called: drop it, record the refusal.
            let mut failure = refusal(id, spent, budget);
            let write = start_write(kept, config, &mut failure, None, before.started.elapsed());
            state.set(State::Writing {
                write,
                failure: Some(failure),
            });
            before.ahead = None;
        }
    }
    ready!(poll_ahead(&mut before.ahead, cx, config));
    before.spent.get_or_insert_with(|| before.started.elapsed());
    Poll::Ready(())
}

/// Polls the write-ahead write, if it is on its way: ready once the call may go out (written,
/// or failed and reported). A re-send under a claim writes nothing ahead: its record is in the
/// store already, claimed.
fn poll_ahead(ahead: &mut Option<WriteAhead>, cx: &mut Context<'_>, config: &Config) -> Poll<()> {
    let Some(WriteAhead::Storing(storing)) = ahead.as_mut() else {
        return Poll::Ready(());
    };
    if super::claim::current().is_some() {
        *ahead = None;
        return Poll::Ready(());
    }
    let length = config
        .write_ahead
        .unwrap_or(super::DEFAULT_WRITE_AHEAD_LEASE);
    *ahead = ready!(WriteAhead::poll_stored(storing, cx, config, length)).map(WriteAhead::Held);
    Poll::Ready(())
}

/// Reports how the store write of `failure`'s record `id` (with `status`) ended (an event, a
/// `tracing` line) and notes it on the failure ([`DeadLetterStatus`]). A re-send that leaves its
/// record as it was is no new dead letter; a deferral too far ahead was written dead.
fn note_write<R>(config: &Config, written: Written, failure: &mut Failure<R>) {
    let (id, status, result, spooled) = written;
    let hook = &config.listener;
    let deferred = status == Status::Deferred;
    match &result {
        Ok(false) => {}
        Ok(true) if resending::is_repeat(&id, status) => {}
        Ok(true) => hook.emit_ref(&Event::DeadLetterStored {
            id: &id,
            class: failure.class(),
            code: failure.code(),
            deferred,
        }),
        Err(error) => hook.emit_ref(&Event::StoreError {
            operation: "put",
            id: Some(&id),
            error,
        }),
    }
    match result {
        Ok(false) => {
            tracing::info!(
                id = %id,
                class = %failure.class(),
                code = %failure.code(),
                "re-send failed after its claim passed to another sender; its \
                 failure is not written over theirs"
            );
            failure
                .notes_mut()
                .insert(DeadLetterStatus::ClaimLost { id });
        }
        Ok(true) if deferred && failure.code() == Code::CircuitOpen => {
            // Rejected locally by an open breaker, which said so once at WARN.
            tracing::debug!(
                id = %id,
                retry_at = ?failure.note::<Attempts>().and_then(Attempts::retry_at),
                "request rejected by an open breaker stored for a re-send"
            );
            failure.notes_mut().insert(DeadLetterStatus::Stored { id });
        }
        Ok(true) if deferred => {
            // Kept for the scheduler's re-send: expected, not a dead letter.
            tracing::info!(
                id = %id,
                class = %failure.class(),
                code = %failure.code(),
                attempts = attempts(failure),
                retry_at = ?failure.note::<Attempts>().and_then(Attempts::retry_at),
                "deferred request stored for a re-send"
            );
            failure.notes_mut().insert(DeadLetterStatus::Stored { id });
        }
        Ok(true) => {
            tracing::warn!(
                id = %id,
                class = %failure.class(),
                code = %failure.code(),
                attempts = attempts(failure).max(1),
                "dead letter stored"
            );
            failure.notes_mut().insert(DeadLetterStatus::Stored { id });
        }
        Err(error) if matches!(spooled, Some(Ok(()))) => {
            tracing::warn!(
                id = %id,
                class = %failure.class(),
                code = %failure.code(),
                error = %error,
                deferred,
                "dead-letter store did not take the record; spooled locally, forwarded when it answers"
            );
            failure.notes_mut().insert(DeadLetterStatus::Spooled {
                id,
                error: Box::new(error),
            });
        }
        Err(error) => {
            let error = match spooled {
                Some(Err(why)) => StoreError::with_source(
                    format!("{error}; the local spool did not take it either: {why}"),
                    error,
                ),
                _ => error,
            };
            tracing::error!(
                id = %id,
                class = %failure.class(),
                code = %failure.code(),
                error = %error,
                deferred,
                "dead letter could not be written"
            );
            if deferred {
                not_deferred(failure);
            }
            failure.notes_mut().insert(DeadLetterStatus::NotStored {
                id,
                error: Box::new(error),
            });
        }
    }
}

/// The attempts the retry layer counted for `failure`; zero when no retry layer saw it.
fn attempts<R>(failure: &Failure<R>) -> u32 {
    failure.note::<Attempts>().map_or(0, Attempts::count)
}
