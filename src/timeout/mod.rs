//! A per-attempt timeout: [`TimeoutLayer`] bounds each call of the inner service by a
//! [`Duration`] and fails it with [`Elapsed`] when it runs out.
//!
//! [`ClassifyLayer`](crate::classify::ClassifyLayer), above it, classifies [`Elapsed`] as
//! [`Class::TRANSIENT`](crate::Class::TRANSIENT) with [`Code::Timeout`](crate::Code::Timeout), so
//! the retry layer retries it like any other transient fault. The overall deadline of a request
//! (all attempts and delays) belongs to [`RetryLayer`](crate::retry::RetryLayer).
//!
//! Connect and read timeouts belong to the client; set them beside this one, for example with
//! hyper-util's `HttpConnector::set_connect_timeout` or reqwest's
//! `ClientBuilder::connect_timeout` and `read_timeout`.
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
