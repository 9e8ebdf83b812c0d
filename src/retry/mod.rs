//! Retry what is worth retrying: a per-class policy matrix (attempt caps and delay rules), jitter,
//! server hints, a retry budget, an overall deadline, and idempotency rules.
//!
//! [`RetryLayer`] reads each failure's [`Class`](crate::Class) (put
//! [`ClassifyLayer`](crate::classify::ClassifyLayer) below it) and asks its [`RetryPolicy`]:
//!
//! 1. Is the class retried, and are attempts left? [`RetryPolicy::max_attempts`] caps the calls
//!    (the first included: with `max_attempts(4)` a service that always fails is called exactly
//!    4 times); a class's [`ClassPolicy::max_attempts`] caps the attempts that failed with that
//!    class, so failures of one class do not eat into another's cap. A breaker rejection is
//!    not an attempt at all (the request never left): by default it comes back at once,
//!    deferred to the instant the breaker half-opens ([`RetryPolicy::wait_for_breaker`]).
//! 2. Is the request safe to send again? Idempotent methods (RFC 9110 §9.2.2) and requests with
//!    an `Idempotency-Key` are; others only after a failure that proves they were not processed
//!    (408, 425, 429, 503, a refused connection, an open breaker). A timeout or reset after such a request
//!    becomes [`Class::OUTCOME_UNKNOWN`](crate::Class::OUTCOME_UNKNOWN) and is not retried.
//!    With [`RetryPolicy::reconcile`], a [`StatusCheck`] asks the provider first: delivered,
//!    the call succeeds with a stand-in response marked [`Delivery::Delivered`] in its extensions; not delivered, the
//!    request is resent as if never sent; unknown, it stays outcome-unknown.
//!    [`new_idempotency_key`](crate::request::new_idempotency_key) with tower-http's
//!    `SetRequestHeaderLayer` stamps a key once per logical request. A request whose body
//!    cannot be copied ([`Replay`]) is never retried, and the failure says so.
//! 3. How long to wait? The server's hint (`Retry-After`, RFC 9110 §10.2.3; gRFC A6's
//!    `grpc-retry-pushback-ms`; `RateLimit-Reset` and `X-RateLimit-Reset`) when it gave one,
//!    else the class's [`Backoff`] with its [`Jitter`]. A delay above
//!    [`max_delay`](RetryPolicy::max_delay) is not slept: the request is deferred
//!    ([`GiveUp::Deferred`], with [`Attempts::retry_at`]) or given up, as configured.
//! 4. Is there budget and time left? A [`Budget`] shared by clones, withdrawn when a retry is
//!    scheduled; a [`deadline`](RetryPolicy::deadline) past which no attempt starts and no delay
//!    is slept.
//!
//! With [`RetryPolicy::hedge`], a request that is safe to send twice also gets a copy sent while
//! a slow attempt is still out (gRFC A6's hedging, tower's `Hedge`): the first answer wins, the
//! others are cancelled, and every copy is an attempt and comes out of the budget.
//!
//! Waiting is a timer in the response future, stored inline: no thread blocks and nothing is
//! allocated. Each logical request has its own attempt counts. The request is copied with
//! [`Replay`] once per attempt, the one cost of the success path; it is free for `Bytes`,
//! `Full<Bytes>` or `Arc` payloads. A request that cannot be retried at all costs no copy, no
//! service clone and no policy clone. A [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer)
//! directly above keeps a second copy of its own; [`BackstopLayer`](crate::BackstopLayer) builds
//! the two so that the dead-letter layer reuses this layer's spare instead.
//!
//! When it stops, the failure carries an [`Attempts`] note: the number of attempts and why
//! ([`GiveUp`]), read with `failure.note::<Attempts>()`.
//! Every retry, give-up and deferral is a `tracing` event at `INFO` (fields: attempt or
//! attempts, class, code, delay, why or reason, retry_at).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::retry::{Attempts, Backoff, Budget, ClassPolicy, Jitter, RetryLayer, RetryPolicy};
//! use tower_backstop::{BoxError, Class};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // Defaults: 3 attempts, 100 ms doubling to 20 s with full jitter, delays up to 60 s in
//! // process, longer ones deferred; no budget, no deadline.
//! let _layer = RetryLayer::default();
//!
//! // Customised: a policy matrix, a budget and a deadline.
//! const SOFT_BOUNCE: Class = Class::new("soft_bounce");
//! const RENDERING_FAILURE: Class = Class::new("rendering_failure");
//! let policy = RetryPolicy::new()
//!     .max_attempts(6)
//!     .backoff(Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2)).jitter(Jitter::Equal))
//!     .class(Class::TRANSIENT, ClassPolicy::retry().max_attempts(4))
//!     .class(
//!         SOFT_BOUNCE,
//!         ClassPolicy::retry().max_attempts(4).backoff(
//!             Backoff::schedule([15 * 60, 3600, 6 * 3600].map(Duration::from_secs)).unwrap(),
//!         ),
//!     )
//!     .never_retry(RENDERING_FAILURE)
//!     .budget(Budget::token_bucket(10, 0.1).unwrap())
//!     .deadline(Duration::from_secs(30));
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let counter = calls.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(policy.build().unwrap())
//!     .service(service_fn(move |_: String| {
//!         counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!         async { Err::<(), BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()) }
//!     }));
//! let failure = svc.oneshot("hello".to_owned()).await.unwrap_err();
//! assert_eq!(failure.note::<Attempts>().map(Attempts::count), Some(4));
//! assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
//! # }
//! ```
//!
//! # Spans
//!
//! Each call is a `tracing` span `backstop.call` (field `attempts`, the attempts made), and
//! each attempt a child span `backstop.attempt`, at `DEBUG`, with OpenTelemetry's HTTP client
//! attributes (semantic conventions for HTTP client spans): `otel.kind = "client"`,
//! `otel.name` (the method), `http.request.method`, `server.address`, `server.port`,
//! `http.request.resend_count` from the second attempt on, `http.response.status_code` (set by
//! the HTTP classifier below), and on failure `error.type` (the status code for an HTTP answer,
//! else the failure's class) and `otel.status_code = "ERROR"`; plus `attempt`, its number from
//! one. With `tracing-opentelemetry`, the attempts are the call's child spans with no glue. The
//! request's fields come from [`Replay::record_span`]. The level is `DEBUG`, like the spans
//! of tower-http's `TraceLayer`: a service logging at `INFO` makes no span and allocates
//! nothing for them (enable `tower_backstop=debug` in the filter of the layer that exports
//! traces); without a subscriber that wants them, the check costs one atomic load.

use std::task::{Context, Poll};

use tower_service::Service;

use self::future::{Call, Deadline, Mode};
use self::retrying::{Retrying, earlier};
use crate::failure::Failure;
use crate::request::Replay;

mod backoff;
mod budget;
#[cfg(feature = "serde")]
pub(crate) mod config;
mod future;
mod hedge;
mod layer;
#[cfg(feature = "serde")]
mod live;
mod note;
mod policy;
mod reconcile;
mod retrying;
mod trace;
mod unsent;

pub use self::backoff::{Backoff, Jitter};
pub use self::budget::Budget;
pub use self::future::ResponseFuture;
pub use self::layer::RetryLayer;
#[cfg(feature = "serde")]
pub(crate) use self::live::{LivePolicy, PolicyCell};
pub use self::note::Attempts;
#[cfg(feature = "dead-letter")]
pub(crate) use self::policy::retry_at;
pub use self::policy::{ClassPolicy, RetryPolicy};
pub use self::reconcile::{Delivery, ReconciledResponse, StatusCheck};
pub(crate) use self::unsent::KeepCopy;
#[cfg(feature = "dead-letter")]
pub(crate) use self::unsent::Unsent;
pub use crate::request::{ReplayBuffer, ReplayBufferFuture, ReplayBufferLayer};
pub use crate::status::{DelaySource, GiveUp};

/// Retries failed calls by a [`RetryPolicy`]; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: RetryPolicy,
    /// Where a reloadable stack's policy comes from: `policy` is then the one last taken.
    #[cfg(feature = "serde")]
    live: Option<LivePolicy>,
}

impl<S> Retry<S> {
    /// Wraps `inner`, retrying by `policy` (checked by [`RetryPolicy::build`]).
    pub(crate) fn new(inner: S, policy: RetryPolicy) -> Self {
        Retry {
            inner,
            policy,
            #[cfg(feature = "serde")]
            live: None,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

impl<S, Req> Service<Req> for Retry<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<Failure<S::Response>>,
    S::Response: 'static,
    Req: Replay + 'static,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    // Always inlined, with `start`: the response future is then built in the caller's place
    // instead of being returned and copied there.
    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req, None, |_| ())
    }
}

/// A clone of `policy`, kept by a future that will not retry, for the policy's listener: out of
/// line, so that the path without a listener stays small enough to be inlined into the caller.
#[cold]
#[inline(never)]
fn kept_for_listener(policy: &RetryPolicy) -> RetryPolicy {
    policy.clone()
}

impl<S> Retry<S> {
    /// One call: the first attempt, and what the future needs for the next ones. With `keep`,
    /// a copy of the request is always kept (when [`Replay`] can make one), even when no retry
    /// is possible, and goes up on the failure (see [`KeepCopy`]). `uncopyable` sees the
    /// request before it is sent when a copy was wanted and [`Replay`] could not make one.
    #[inline(always)]
    pub(crate) fn start<Req>(
        &mut self,
        req: Req,
        keep: Option<KeepCopy<S::Response, Req>>,
        uncopyable: impl FnOnce(&Req),
    ) -> ResponseFuture<S, Req>
    where
        S: Service<Req> + Clone,
        S::Error: Into<Failure<S::Response>>,
        Req: Replay,
    {
        #[cfg(feature = "serde")]
        if let Some(live) = &mut self.live {
            live.refresh(&mut self.policy);
        }
        let policy = &self.policy;
        if let Some(budget) = policy.budget_ref() {
            budget.first_attempt();
        }
        // No clock read here: the deadline starts when an attempt first waits or fails. The
        // caller's own time left in the request is a deadline too, never extended by a retry.
        let header = policy.time_left_header_ref();
        let deadline = earlier(policy.deadline_after(), req.time_left(header));
        let safe = policy.assumes_idempotent() || req.retry_safe();
        let retries = policy.wants_copy(safe);
        // A request not safe to resend keeps a copy for the status check, when there is one.
        let reconcile = if safe {
            None
        } else {
            policy.reconcile_ref().cloned()
        };
        let spare = if retries || keep.is_some() || reconcile.is_some() {
            let copy = req.replay();
            if copy.is_none() {
                uncopyable(&req);
            }
            copy
        } else {
            None
        };
        // Into the attempt only, after the copy: a copy (for a later attempt, a dead letter, a
        // status check) keeps the caller's own headers, so a re-sent record does not carry a
        // time left that this call wrote.
        let mut req = req;
        if let Some(left) = earlier(deadline, policy.attempt_bound()) {
            req.set_time_left(&policy.time_left(left));
        }
        let spans = trace::Spans::of(&req);
        // The attempt's start (read only with a listener) is read before the inner call, so that nothing
        // runs between the inner future's making and its move into ours (the compiler then
        // builds it in place instead of copying it).
        let started = policy.hook().attempt_start();
        let future = match spans.attempt() {
            None => self.inner.call(req),
            Some(attempt) => attempt.in_scope(|| self.inner.call(req)),
        };
        // Keep a clone of the service (driven to readiness before each later attempt) and of
        // the policy only when another attempt is possible.
        let mode = if retries && spare.is_some() {
            Mode::Retrying(Retrying::new(self.inner.clone(), policy.clone(), safe))
        } else {
            let reason = if policy.attempts() <= 1 {
                GiveUp::AttemptsExhausted
            } else if !retries {
                GiveUp::NotIdempotent
            } else {
                GiveUp::NotReplayable
            };
            // Only for its listener: without one, no policy clone.
            let listener = policy.hook().is_set().then(|| kept_for_listener(policy));
            Mode::Single {
                reason,
                listener,
                give_up: policy.gives_up_long_delays(),
            }
        };
        let call = Call {
            mode,
            spare,
            keep,
            deadline: Deadline::new(deadline),
            safe,
            reconcile,
            started,
            spans,
        };
        ResponseFuture::new(future, call)
    }
}
