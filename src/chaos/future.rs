//! [`Chaos`], the service [`ChaosLayer`](super::ChaosLayer) builds, its future and its body.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::{Always, Fault, Select, Shared};
use crate::failure::{BoxError, Code, Failure};

/// Injects faults into the requests of `S`; built by [`ChaosLayer`](super::ChaosLayer).
///
/// Its response is `http::Response<ChaosBody<B>>` for an inner response `http::Response<B>`,
/// and its error a [`BoxError`]: the inner service's error, or the injected one.
#[derive(Clone)]
pub struct Chaos<S, P = Always> {
    inner: S,
    shared: Arc<Shared>,
    when: P,
}

impl<S, P> Chaos<S, P> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, when: P) -> Self {
        Chaos {
            inner,
            shared,
            when,
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for Chaos<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chaos")
            .field("inner", &self.inner)
            .field("enabled", &self.shared.enabled())
            .finish_non_exhaustive()
    }
}

impl<S, P, Req, B> Service<Req> for Chaos<S, P>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    P: Select<Req>,
{
    type Response = http::Response<ChaosBody<B>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let drawn = if self.shared.enabled() && self.when.select(&request) {
            self.shared.draw()
        } else {
            None
        };
        let state = match drawn {
            None => State::Pass {
                inner: self.inner.call(request),
            },
            Some(Fault::Latency(delay)) => State::Delayed {
                sleep: tokio::time::sleep(*delay),
                inner: self.inner.call(request),
            },
            Some(Fault::Stall) => State::Stall,
            Some(fault) => State::Fault {
                fault: Some(fault.clone()),
            },
        };
        ResponseFuture { state }
    }
}

pin_project! {
    /// The future of [`Chaos`]: the inner service's answer, late or replaced by a fault.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Pass { #[pin] inner: F },
        Delayed { #[pin] sleep: Sleep, #[pin] inner: F },
        Fault { fault: Option<Fault> },
        Stall,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Pass { .. } => "pass",
            State::Delayed { .. } => "delayed",
            State::Fault { .. } => "fault",
            State::Stall => "stall",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// The source of an injected [`Fault::Error`]: says where the error came from.
#[derive(Debug)]
struct Injected;

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fault injected by ChaosLayer")
    }
}

impl std::error::Error for Injected {}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<ChaosBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = match self.project().state.project() {
            StateProj::Pass { inner } => inner,
            StateProj::Delayed { sleep, inner } => {
                if sleep.poll(cx).is_pending() {
                    return Poll::Pending;
                }
                inner
            }
            StateProj::Stall => return Poll::Pending,
            StateProj::Fault { fault } => {
                let fault = fault
                    .take()
                    .expect("a chaos future polled after it completed");
                return Poll::Ready(answer(fault));
            }
        };
        match inner.poll(cx) {
            Poll::Ready(Ok(response)) => Poll::Ready(Ok(response.map(ChaosBody::inner))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What an injected fault answers.
fn answer<B>(fault: Fault) -> Result<http::Response<ChaosBody<B>>, BoxError> {
    match fault {
        Fault::Response { status, headers } => {
            let mut response = http::Response::new(ChaosBody::empty());
            *response.status_mut() =
                StatusCode::from_u16(status).expect("checked by ChaosBuilder::build");
            *response.headers_mut() = headers;
            Ok(response)
        }
        Fault::Error { class, sent } => Err(Box::new(
            Failure::<()>::new(class, Code::Error)
                .with_sent(sent)
                .with_source(Box::new(Injected)),
        )),
        Fault::Reset => Err(Box::new(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection reset (fault injected by ChaosLayer)",
        ))),
        Fault::Refused => Err(Box::new(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "connection refused (fault injected by ChaosLayer)",
        ))),
        Fault::Latency(_) | Fault::Stall => unreachable!("handled in call"),
    }
}

pin_project! {
    /// The body of a [`Chaos`] response: the inner service's body, or an empty body for an
    /// injected answer. Its data and error types are the inner body's.
    pub struct ChaosBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Empty,
    }
}

impl<B> ChaosBody<B> {
    fn inner(body: B) -> Self {
        ChaosBody {
            kind: Kind::Inner { body },
        }
    }

    fn empty() -> Self {
        ChaosBody { kind: Kind::Empty }
    }

    /// The inner service's body, or `None` for an injected answer.
    pub fn into_inner(self) -> Option<B> {
        match self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Empty => None,
        }
    }
}

impl<B> fmt::Debug for ChaosBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Empty => "empty",
        };
        f.debug_struct("ChaosBody").field("kind", &kind).finish()
    }
}

impl<B: Body> Body for ChaosBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Empty => SizeHint::with_exact(0),
        }
    }
}
