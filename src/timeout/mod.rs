//! A per-attempt timeout: [`TimeoutLayer`] bounds each call of the inner service by a
//! [`Duration`] and fails it with [`Elapsed`] when it runs out.
//!
//! [`ClassifyLayer`](crate::classify::ClassifyLayer), above it, classifies [`Elapsed`] as
//! [`Class::TRANSIENT`](crate::Class::TRANSIENT) with [`Code::Timeout`](crate::Code::Timeout), so
//! the retry layer retries it like any other transient fault. The overall deadline of a request
//! (all attempts and delays) belongs to [`RetryLayer`](crate::retry::RetryLayer).
//!
//! # When the timer starts
//!
//! The timer is lazy. A call whose inner future is ready at its first poll (a cache hit, an
//! in-process handler, a pooled answer) never touches tokio's timer or clock: it costs a few
//! nanoseconds over the bare call. Otherwise the timer starts at the inner future's first
//! `Pending`, so the measured duration runs from the end of that first poll, not from
//! [`call`](Service::call). The synchronous part of the first poll (for a client, building the
//! request and handing it to the connection) and any time between `call` and the first poll
//! are not counted; a timeout bounds the time spent *waiting*. With tower's own `Timeout` the
//! timer starts in `call`.
//!
//! A zero timeout fails every call that is not ready at its first poll (within tokio's timer
//! resolution of 1 ms). `Duration::MAX` never fires: tokio saturates it to its far future
//! (about 30 years), without panicking.
//!
//! For a server, [`ServerLayer::timeout`](crate::server::ServerLayer::timeout) answers `504 Gateway Timeout` (or a configured status)
//! when a handler takes too long, and stays `Infallible` for axum's `Router::layer`.
//!
//! # Connect and read timeouts
//!
//! They belong to the client; set them beside this one. Ours bounds the whole attempt (connect,
//! send, and the response head); the client's bound each phase. With hyper-util:
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::{Client, connect::HttpConnector};
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_backstop::{classify::ClassifyLayer, timeout::TimeoutLayer};
//!
//! let mut connector = HttpConnector::new();
//! connector.set_connect_timeout(Some(Duration::from_secs(1))); // TCP connect
//! let client = Client::builder(TokioExecutor::new())
//!     .pool_idle_timeout(Duration::from_secs(30))
//!     .build::<_, Full<Bytes>>(connector);
//! let svc = ServiceBuilder::new()
//!     .layer(ClassifyLayer::http())
//!     .layer(TimeoutLayer::new(Duration::from_secs(5))) // the whole attempt
//!     .service(client);
//! # let _ = svc;
//! ```
//!
//! With reqwest (its `Client` is a `tower::Service<reqwest::Request>`):
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_backstop::timeout::TimeoutLayer;
//!
//! let client = reqwest::Client::builder()
//!     .connect_timeout(Duration::from_secs(1)) // TCP (and TLS) connect
//!     .read_timeout(Duration::from_secs(2)) // between two reads of the response
//!     .build()
//!     .unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(TimeoutLayer::new(Duration::from_secs(5))) // the whole attempt
//!     .service(client);
//! # let _ = svc;
//! ```
//!
//! Like tower's own `Timeout`, the error type is [`BoxError`]: the inner error is boxed (a no-op
//! when it is already a `BoxError`), and [`Elapsed`] is found by downcasting.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_backstop::timeout::{Elapsed, TimeoutLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(TimeoutLayer::new(Duration::from_millis(200)))
//!     .service(service_fn(|_: ()| async {
//!         tokio::time::sleep(Duration::from_millis(500)).await;
//!         Ok::<_, std::convert::Infallible>("late")
//!     }));
//! let err = svc.oneshot(()).await.unwrap_err();
//! assert!(err.is::<Elapsed>());
//! # }
//! ```

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use crate::failure::BoxError;

#[cfg(feature = "serde")]
pub(crate) mod config;
mod future;
mod layer;

pub use self::future::ResponseFuture;
pub use self::layer::TimeoutLayer;

/// The per-attempt timeout elapsed before the inner service answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed {
    after: Duration,
}

impl Elapsed {
    pub(crate) fn new(after: Duration) -> Self {
        Elapsed { after }
    }

    /// The timeout that elapsed.
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt timed out after {:?}", self.after)
    }
}

impl std::error::Error for Elapsed {}

/// Bounds each call of the inner service by a timeout; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Timeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Timeout<S> {
    /// Wraps `inner`, failing any call that takes longer than `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Timeout { inner, timeout }
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl<S, Req> Service<Req> for Timeout<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.timeout)
    }
}
