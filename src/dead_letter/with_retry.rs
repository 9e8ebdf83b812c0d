//! The dead-letter layer directly above the retry layer, sharing one copy of each request: what
//! the preset builds.

use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::Kept;
use super::{DeadLetter, DeadLetterLayer};
use crate::failure::Failure;
use crate::request::{Describe, Replay};
use crate::retry::{KeepCopy, Retry, RetryLayer};

/// [`DeadLetterLayer`] directly above [`RetryLayer`], built as one layer so that both share a
/// single copy of each request.
///
/// Stacked as two layers, each keeps its own copy: the dead-letter layer one to describe a
/// request that finally fails, the retry layer a spare for the next attempt. Both are free for
/// cheap requests (`Bytes`, `Full<Bytes>`, `&'static str`), but an `http::Request` with headers
/// allocates its `HeaderMap` for each. Built together, the dead-letter layer keeps no copy: the
/// retry layer keeps its spare for the last attempt too (and keeps one even when it cannot
/// retry, for example with `max_attempts(1)`), and hands the unsent spare up with the failure.
/// A call that succeeds at its first attempt makes one copy instead of two; a call of `n`
/// attempts makes `n`, as when stacked. A request that [`Replay`] cannot copy is recorded as
/// before, with its payload missing.
///
/// The two layers behave exactly as when stacked: same attempts, same records. Stacked with
/// other layers between them, or with [`DeadLetterLayer`] alone, each layer keeps its own copy
/// as before: the dead-letter layer cannot know, before the call, that a layer below will
/// hand a copy back.
#[derive(Clone, Debug)]
pub(crate) struct DeadLetterRetryLayer {
    dead_letters: DeadLetterLayer,
    retry: RetryLayer,
}

impl DeadLetterRetryLayer {
    /// `dead_letters` directly above `retry`, sharing one request copy.
    pub(crate) fn new(dead_letters: DeadLetterLayer, retry: RetryLayer) -> Self {
        DeadLetterRetryLayer {
            dead_letters,
            retry,
        }
    }
}

impl<S> Layer<S> for DeadLetterRetryLayer {
    type Service = DeadLetterRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetterRetry {
            inner: self.dead_letters.layer(self.retry.layer(inner)),
        }
    }
}

// How the order checks find the preset's combined service below another layer.
impl crate::order::Named for crate::order::DeadLetterRetry {
    fn name() -> &'static str {
        crate::order::named::<DeadLetterRetry<()>>()
    }
}

/// The service of [`DeadLetterRetryLayer`]: a [`DeadLetter`] over a [`Retry`] that share one
/// request copy.
#[derive(Clone, Debug)]
pub(crate) struct DeadLetterRetry<S> {
    inner: DeadLetter<Retry<S>>,
}

impl<S, Req> Service<Req> for DeadLetterRetry<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<Failure<S::Response>>,
    S::Response: 'static,
    Req: Replay + Describe + Send + 'static,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = super::ResponseFuture<Retry<S>, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Req>::poll_ready(self.inner.inner_mut(), cx)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call_reusing(|retry| {
            // The retry layer hands its copy up on the failure; a request that cannot be copied
            // keeps at least its record id.
            let mut kept = Kept::HandedBack;
            let future = retry.start(req, Some(KeepCopy::new()), |req| {
                kept = Kept::of(req, None);
            });
            (future, kept)
        })
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests;
