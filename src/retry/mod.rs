//! Retry what is worth retrying: per-class attempt caps, exponential backoff with jitter and a
//! cap, the server's `Retry-After` within a maximum delay, idempotent requests only.
//!
//! [`RetryLayer`] reads each failure's [`Class`](crate::Class) (put
//! [`ClassifyLayer`](crate::classify::ClassifyLayer) below it) and asks its [`RetryPolicy`]:
//!
//! 1. Is the class retried, and are attempts left? Attempts count the first call: with
//!    `max_attempts(4)` a service that always fails is called exactly 4 times.
//! 2. Is the request safe to send again? Only idempotent methods (RFC 9110 §9.2.2) or requests
//!    with an `Idempotency-Key` header are retried, so a POST that timed out is never sent twice
//!    blindly. The same request, and so the same key, is sent on every attempt.
//! 3. How long to wait? The server's hint (`Retry-After`, RFC 9110 §10.2.3; the breaker's time
//!    left open) when it gave one, else [`Backoff`]. A hint above
//!    [`max_delay`](RetryPolicy::max_delay) is not slept: the failure comes back at once with
//!    [`GiveUp::HintTooLong`](crate::GiveUp::HintTooLong) and the hint in it.
//!
//! Waiting is a timer in the response future, stored inline: no thread blocks and nothing is
//! allocated. Each logical request has its own attempt count. The request is copied with
//! [`Replay`] once per attempt, the one cost of the success path; it is free for `Bytes`,
//! `Full<Bytes>` or `Arc` payloads.
//!
//! When it gives up, the failure records the number of attempts and why
//! ([`Failure::attempts`](crate::Failure::attempts), [`Failure::give_up`](crate::Failure::give_up)).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::retry::{Backoff, Jitter, RetryLayer, RetryPolicy};
//! use tower_backstop::{BoxError, Class};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // Defaults: 3 attempts, 100 ms doubling to 20 s with full jitter, hints up to 60 s.
//! let _layer = RetryLayer::default();
//!
//! // Customised:
//! let policy = RetryPolicy::new()
//!     .max_attempts(4)
//!     .backoff(Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2)).jitter(Jitter::Equal))
//!     .max_delay(Duration::from_secs(30))
//!     .retry_at_most(Class::UNKNOWN, 2);
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let counter = calls.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy))
//!     .service(service_fn(move |_: String| {
//!         counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!         async { Err::<(), BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()) }
//!     }));
//! let failure = svc.oneshot("hello".to_owned()).await.unwrap_err();
//! assert_eq!(failure.attempts(), 4);
//! assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
//! # }
//! ```

use std::task::{Context, Poll};

use tower_service::Service;

use crate::failure::Failure;
use crate::request::Replay;

mod backoff;
mod future;
mod layer;
mod policy;

pub use self::backoff::{Backoff, Jitter};
pub use self::future::ResponseFuture;
pub use self::layer::RetryLayer;
pub use self::policy::{DelaySource, RetryEvent, RetryPolicy};

use self::policy::Spare;

/// Retries failed calls by a [`RetryPolicy`]; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S> Retry<S> {
    /// Wraps `inner`, retrying by `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        Retry { inner, policy }
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
    Req: Replay,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (spare, spare_state) = if !req.retry_safe() {
            (None, Spare::NotSafe)
        } else if self.policy.attempts() > 1 {
            match req.replay() {
                Some(copy) => (Some(copy), Spare::Ready),
                None => (None, Spare::NotReplayable),
            }
        } else {
            (None, Spare::Ready)
        };
        // Call the service that was made ready; keep a clone for later attempts, which is
        // driven to readiness before each of them.
        let future = self.inner.call(req);
        let service = self.inner.clone();
        ResponseFuture::new(future, service, spare, spare_state, self.policy.clone())
    }
}
