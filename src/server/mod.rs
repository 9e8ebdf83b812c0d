//! The server flavour: a timeout and a circuit breaker for an axum or tonic server protecting
//! itself, answering with a response instead of an error, so that the service is `Infallible`
//! (and so fits `Router::layer`) even over fallible inner layers (tower's `LoadShed`,
//! `Timeout`, `ConcurrencyLimit`, `Buffer`), whose errors it answers with the right status.
//!
//! One layer, [`ServerLayer`], with either or both:
//!
//! - [`timeout`](ServerLayer::timeout): a handler that runs past its time answers
//!   `504 Gateway Timeout` (gRPC `DEADLINE_EXCEEDED`) instead of hanging the connection.
//! - [`breaker`](ServerLayer::breaker): while the handlers keep failing (timeouts included),
//!   answers `503 Service Unavailable` with `Retry-After` (gRPC `UNAVAILABLE`) at once, without
//!   calling them.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tower_backstop::breaker::BreakerLayer;
//! use tower_backstop::server::ServerLayer;
//!
//! let app: Router = Router::new()
//!     .route("/report", get(|| async { "done" }))
//!     .layer(
//!         ServerLayer::new()
//!             .timeout(Duration::from_secs(10))
//!             .breaker(BreakerLayer::consecutive_failures(5)),
//!     );
//! # let _ = app;
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header::RETRY_AFTER};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{Admission, BreakerHandle, BreakerLayer, Ticket};
use crate::classify::{GrpcClassifier, HttpClassifier};
use crate::failure::{BoxError, Code};

pub use crate::http_wire::DEFAULT_OVERLOADED_RETRY_AFTER;
use crate::http_wire::retry_after_secs;

/// The server flavour of the timeout and the breaker, for an axum (or any `http`) server
/// protecting itself; see the [module docs](self).
///
/// - With a [`timeout`](Self::timeout), a handler that takes longer is dropped and the client
///   gets `504 Gateway Timeout` (or the status given to [`timeout_status`](Self::timeout_status))
///   with an empty body, instead of a hung connection (like tower-http's `TimeoutLayer`, whose
///   default answer is 408).
/// - With a [`breaker`](Self::breaker), the breaker counts the server's own failed responses,
///   classified by [`HttpClassifier`] (a 500, or the timeout's 504, counts; a 404 does not), and
///   while it is open the server answers `503 Service Unavailable` with `Retry-After` at once
///   instead of piling up work. The `Retry-After` value is the time left until half-open in whole
///   seconds, rounded up (RFC 9110 §10.2.3, delay-seconds); it is left out when the breaker was
///   forced open.
///
/// The breaker sits outside the timeout, so it sees the timeout's answers.
///
/// The gRPC flavour honours the client's `grpc-timeout`: the shorter of it and the
/// [`timeout`](Self::timeout) (or it alone, without one), timed from the call, so the server
/// stops the handler and answers `DEADLINE_EXCEEDED` itself, before tonic's server timeout
/// would cancel the call. A tonic client ends the call at the same instant on its own side, so
/// a plain tonic caller usually sees its channel's `CANCELLED` ("Timeout expired"); through
/// `GrpcLayer`, that is `DEADLINE_EXCEEDED` too. Clients that do not time out themselves get
/// the server's answer. A malformed
/// value (more than 8 digits, an unknown unit) is ignored, as gRPC servers do; `0n` answers at
/// once unless the handler is ready at its first poll.
///
/// # Fallible inner services
///
/// The inner service's error may be anything that converts into a
/// [`BoxError`], so tower's `LoadShed`, `Timeout`, `ConcurrencyLimit` or `Buffer` can sit
/// inside; this service stays `Infallible` and answers the error, classified by
/// [`classify_error`](crate::classify::classify_error):
///
/// | inner error | HTTP | gRPC (trailers-only) | breaker |
/// |---|---|---|---|
/// | overloaded (`LoadShed`) | 503, `Retry-After` ([`overloaded_retry_after`](Self::overloaded_retry_after)) | `UNAVAILABLE`, `grpc-retry-pushback-ms` | not counted |
/// | elapsed (tower's `Timeout`, ours) | the timeout's answer (504) | `DEADLINE_EXCEEDED` | a failure |
/// | anything else (a readiness error too) | 500 | `INTERNAL` | a failure |
///
/// Put `load_shed()` outside `concurrency_limit(n)` (`.layer(server).load_shed().concurrency_limit(n)`):
/// `ConcurrencyLimit` alone queues calls, `LoadShed` turns a full limit into the rejection
/// answered here. A shed call never ran a handler, so it is neither a failure nor a success for
/// the breaker. tonic's `Server::builder().layer(..)` builds the layers once, so every
/// connection shares the limit's slots.
/// With axum, give the router its state (`.with_state(state)`) before `.layer(...)` when the
/// inner layers keep state across requests (`ConcurrencyLimit`'s slots): until then axum makes
/// each handler's route, and so the layers under it, per request.
///
/// It works with axum's `Router::layer`:
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use http::StatusCode;
/// use tower_backstop::breaker::BreakerLayer;
/// use tower_backstop::server::ServerLayer;
///
/// let app: Router = Router::new()
///     .route("/report", get(|| async { "done" }))
///     .layer(
///         ServerLayer::new()
///             .timeout(Duration::from_secs(10))
///             .breaker(BreakerLayer::consecutive_failures(5)),
///     );
/// // A timeout alone, answering 503 instead of 504:
/// let _layer = ServerLayer::new()
///     .timeout(Duration::from_secs(5))
///     .timeout_status(StatusCode::SERVICE_UNAVAILABLE);
/// # let _ = app;
/// ```
#[derive(Clone, Debug)]
pub struct ServerLayer {
    timeout: Option<Duration>,
    status: StatusCode,
    overloaded_retry_after: Duration,
    breaker: Option<BreakerLayer>,
    classifier: HttpClassifier,
    grpc: bool,
}

impl Default for ServerLayer {
    fn default() -> Self {
        ServerLayer::new()
    }
}

impl ServerLayer {
    /// A layer for an HTTP server, with no timeout and no breaker yet: add them with
    /// [`timeout`](Self::timeout) and [`breaker`](Self::breaker).
    pub fn new() -> Self {
        ServerLayer {
            timeout: None,
            status: StatusCode::GATEWAY_TIMEOUT,
            overloaded_retry_after: DEFAULT_OVERLOADED_RETRY_AFTER,
            breaker: None,
            classifier: HttpClassifier::new(),
            grpc: false,
        }
    }

    /// The gRPC flavour, for `tonic::transport::Server::builder().layer(...)`:
    ///
    /// - a handler that takes longer than the [`timeout`](Self::timeout) is dropped and the client
    ///   gets a trailers-only `DEADLINE_EXCEEDED` (HTTP 200, `grpc-status: 4` in the headers);
    /// - the [`breaker`](Self::breaker) counts the handlers' trailers-only error statuses by
    ///   [`GrpcClassifier::new`]'s mapping (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `UNKNOWN`,
    ///   `INTERNAL`, the timeout's `DEADLINE_EXCEEDED`…; a status sent in trailers after a
    ///   message is not seen), and while it is open the server answers a trailers-only
    ///   `UNAVAILABLE` at once, with `grpc-retry-pushback-ms` set to the time left until
    ///   half-open (gRFC A6; left out when the breaker was forced open).
    pub fn grpc() -> Self {
        ServerLayer {
            grpc: true,
            ..ServerLayer::new()
        }
    }

    /// Answers `504 Gateway Timeout` (gRPC: `DEADLINE_EXCEEDED`) when a handler takes longer
    /// than `timeout`, counted from the handler's first `Pending`: a handler that answers at its
    /// first poll never touches the timer or the clock. `Duration::MAX` never fires.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The status of the answer when the timeout elapses (504 by default; HTTP only).
    pub fn timeout_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The `Retry-After` (gRPC: `grpc-retry-pushback-ms`) of the answer to a call that an
    /// inner layer refused as overloaded (tower's `LoadShed`); [`DEFAULT_OVERLOADED_RETRY_AFTER`]
    /// by default. Sent in whole seconds, rounded up (at least 1), for HTTP; in milliseconds
    /// for gRPC.
    pub fn overloaded_retry_after(mut self, delay: Duration) -> Self {
        self.overloaded_retry_after = delay;
        self
    }

    /// Answers 503 with `Retry-After` (gRPC: `UNAVAILABLE`) while `breaker` is open.
    pub fn breaker(mut self, breaker: BreakerLayer) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Classifies the breaker's responses with `classifier` instead of the default
    /// [`HttpClassifier`].
    pub fn classifier(mut self, classifier: HttpClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// The breaker's handle; `None` without a [`breaker`](Self::breaker).
    pub fn handle(&self) -> Option<BreakerHandle> {
        self.breaker.as_ref().map(BreakerLayer::handle)
    }
}

impl<S> Layer<S> for ServerLayer {
    type Service = Server<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Server {
            inner,
            timeout: self.timeout,
            status: self.status,
            overloaded_retry_after: self.overloaded_retry_after,
            ready_error: None,
            breaker: self.breaker.as_ref().map(|b| Counting {
                admission: b.admission(),
                classifier: self.classifier.clone(),
            }),
            grpc: self.grpc,
            decision: None,
        }
    }
}

/// The breaker part of a [`Server`].
#[derive(Clone, Debug)]
struct Counting {
    admission: Admission,
    // Cloned per call: free with the default mapping, one `Arc` with overrides.
    classifier: HttpClassifier,
}

/// The service of a [`ServerLayer`].
#[derive(Debug)]
pub struct Server<S> {
    inner: S,
    timeout: Option<Duration>,
    status: StatusCode,
    overloaded_retry_after: Duration,
    // The inner service's readiness error, answered to the next call.
    ready_error: Option<BoxError>,
    breaker: Option<Counting>,
    grpc: bool,
    // What poll_ready decided: a ticket (dropped with the service, it gives its permit back),
    // or the rejection's time left until half-open.
    decision: Option<Result<Ticket, Option<Duration>>>,
}

impl<S: Clone> Clone for Server<S> {
    fn clone(&self) -> Self {
        Server {
            inner: self.inner.clone(),
            timeout: self.timeout,
            status: self.status,
            overloaded_retry_after: self.overloaded_retry_after,
            ready_error: None,
            breaker: self.breaker.clone(),
            grpc: self.grpc,
            decision: None,
        }
    }
}

impl<S, ReqBody, B> Service<http::Request<ReqBody>> for Server<S>
where
    S: Service<http::Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Default,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ServerFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.ready_error.is_some() {
            return Poll::Ready(Ok(()));
        }
        if let Some(breaker) = &self.breaker {
            let decision = self.decision.get_or_insert_with(|| breaker.admission.ask());
            if decision.is_err() {
                return Poll::Ready(Ok(()));
            }
        }
        if let Err(e) = ready!(self.inner.poll_ready(cx)) {
            // Answered to the call that follows, as the inner service's error would be.
            self.ready_error = Some(e.into());
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let answers = Answers {
            grpc: self.grpc,
            status: self.status,
            overloaded_retry_after: self.overloaded_retry_after,
        };
        let counted = match &self.breaker {
            None => None,
            Some(breaker) => match self
                .decision
                .take()
                .unwrap_or_else(|| breaker.admission.ask())
            {
                Ok(ticket) => Some(Counted {
                    ticket,
                    classifier: breaker.classifier.clone(),
                    grpc: self.grpc.then(GrpcClassifier::new),
                }),
                Err(retry_after) => {
                    return ServerFuture {
                        kind: Kind::Rejected {
                            retry_after,
                            grpc: self.grpc,
                        },
                    };
                }
            },
        };
        if let Some(error) = self.ready_error.take() {
            return ServerFuture {
                kind: Kind::Failed {
                    error: Some(error),
                    answers,
                    counted,
                },
            };
        }
        // The client's own deadline (gRPC's `grpc-timeout`): the shorter of it and ours, timed
        // from now, so that this server answers `DEADLINE_EXCEEDED` itself, no later than the
        // client gives up. A malformed value is ignored, as gRPC servers do.
        let client = if self.grpc {
            req.headers()
                .get("grpc-timeout")
                .and_then(crate::grpc_wire::parse_timeout)
        } else {
            None
        };
        let (timeout, sleep) = match client {
            None => (self.timeout, None),
            Some(client) => {
                let timeout = self.timeout.map_or(client, |own| own.min(client));
                (Some(timeout), Some(tokio::time::sleep(timeout)))
            }
        };
        ServerFuture {
            kind: Kind::Called {
                future: self.inner.call(req),
                sleep,
                timeout,
                answers,
                counted,
            },
        }
    }
}

/// How a [`Server`] answers what its handlers did not: a timeout, an inner layer's error.
#[derive(Clone, Copy, Debug)]
struct Answers {
    grpc: bool,
    status: StatusCode,
    overloaded_retry_after: Duration,
}

impl Answers {
    /// The answer to an inner service's error (classified by
    /// [`classify_error`](crate::classify::classify_error)): overloaded (tower's `LoadShed`)
    /// → 503 with `Retry-After` / `UNAVAILABLE` with `grpc-retry-pushback-ms`, and not counted
    /// by the breaker (the handler never ran); elapsed (tower's `Timeout`, ours) → the timeout's
    /// answer; anything else → 500 / `INTERNAL`. gRPC answers are trailers-only.
    fn error<B: Default>(&self, error: BoxError, counted: Option<&mut Counted>) -> Response<B> {
        let (_, code) = crate::classify::classify_error(&*error);
        let response = match code {
            Code::Overloaded => {
                if let Some(counted) = counted {
                    counted.ticket.release();
                }
                tracing::debug!(error = %error, "call refused as overloaded");
                return self.overloaded();
            }
            Code::Timeout => timed_out(self.grpc, self.status),
            _ => {
                tracing::warn!(error = %error, "inner service failed");
                if self.grpc {
                    crate::grpc_wire::trailers_only(
                        crate::grpc_wire::codes::INTERNAL,
                        "internal error",
                        None,
                    )
                } else {
                    let mut response = Response::new(B::default());
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    response
                }
            }
        };
        if let Some(counted) = counted {
            counted.finish(&response);
        }
        response
    }

    fn overloaded<B: Default>(&self) -> Response<B> {
        if self.grpc {
            return crate::grpc_wire::trailers_only(
                crate::grpc_wire::codes::UNAVAILABLE,
                "overloaded",
                Some(self.overloaded_retry_after),
            );
        }
        let mut response = Response::new(B::default());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from(retry_after_secs(self.overloaded_retry_after).max(1)),
        );
        response
    }
}

/// A call the breaker admitted: its permit, and how to classify the answer.
#[derive(Debug)]
struct Counted {
    ticket: Ticket,
    classifier: HttpClassifier,
    grpc: Option<GrpcClassifier>,
}

impl Counted {
    /// Records the outcome of `response` with the breaker.
    fn finish<B>(&mut self, response: &Response<B>) {
        let class = match &self.grpc {
            Some(grpc) if response.status() == StatusCode::OK => grpc
                .classify_status(response.headers())
                .map(|verdict| verdict.class),
            _ => self.classifier.class_of(response.status()),
        };
        self.ticket.finish(class);
    }
}

pin_project! {
    /// Response future of [`Server`]: the handler's response (raced against a timer stored
    /// inline, when there is a timeout), or a ready 503 from an open breaker.
    ///
    /// Like [`ResponseFuture`](crate::timeout::ResponseFuture), the timer starts at the handler's
    /// first `Pending`: a handler that answers at its first poll never touches the timer or the
    /// clock.
    #[derive(Debug)]
    pub struct ServerFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F> {
        Called {
            #[pin]
            future: F,
            #[pin]
            sleep: Option<Sleep>,
            timeout: Option<Duration>,
            answers: Answers,
            counted: Option<Counted>,
        },
        Rejected {
            retry_after: Option<Duration>,
            grpc: bool,
        },
        // The inner service's readiness error, answered without calling the handler.
        Failed {
            error: Option<BoxError>,
            answers: Answers,
            counted: Option<Counted>,
        },
    }
}

impl<F, B, E> Future for ServerFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Default,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                mut sleep,
                timeout,
                answers,
                counted,
            } => {
                let response = match future.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    Poll::Ready(Err(error)) => {
                        return Poll::Ready(Ok(answers.error(error.into(), counted.as_mut())));
                    }
                    Poll::Pending => {
                        let Some(timeout) = *timeout else {
                            return Poll::Pending;
                        };
                        if sleep.is_none() {
                            sleep.set(Some(tokio::time::sleep(timeout)));
                        }
                        if let Some(sleep) = sleep.as_pin_mut() {
                            ready!(sleep.poll(cx));
                        }
                        let response = timed_out(answers.grpc, answers.status);
                        tracing::debug!(
                            ?timeout,
                            status = response.status().as_u16(),
                            "handler timed out"
                        );
                        response
                    }
                };
                if let Some(counted) = counted {
                    counted.finish(&response);
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Failed {
                error,
                answers,
                counted,
            } => {
                let error = error
                    .take()
                    .expect("a server's answer polled after completion");
                Poll::Ready(Ok(answers.error(error, counted.as_mut())))
            }
            KindProj::Rejected { retry_after, grpc } => {
                if *grpc {
                    return Poll::Ready(Ok(crate::grpc_wire::trailers_only(
                        crate::grpc_wire::codes::UNAVAILABLE,
                        "circuit open",
                        *retry_after,
                    )));
                }
                let mut response = Response::new(B::default());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                if let Some(left) = retry_after {
                    response
                        .headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(*left)));
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

/// The answer of a handler that ran past its time.
fn timed_out<B: Default>(grpc: bool, status: StatusCode) -> Response<B> {
    if grpc {
        return crate::grpc_wire::trailers_only(
            crate::grpc_wire::codes::DEADLINE_EXCEEDED,
            "handler timed out",
            None,
        );
    }
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}
