//! The server flavours: a timeout and a circuit breaker for an axum or tonic server protecting
//! itself, answering with a response instead of an error so that an `Infallible` service stays
//! `Infallible` (and so fits `Router::layer`).
//!
//! - [`ServerTimeoutLayer`]: a handler that runs past its time answers `504 Gateway Timeout`
//!   (gRPC `DEADLINE_EXCEEDED`) instead of hanging the connection.
//! - [`ServerBreakerLayer`]: while the handlers keep failing, answers `503 Service Unavailable`
//!   with `Retry-After` (gRPC `UNAVAILABLE`) at once, without calling them.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tower_backstop::breaker::BreakerLayer;
//! use tower_backstop::server::{ServerBreakerLayer, ServerTimeoutLayer};
//!
//! let app: Router = Router::new()
//!     .route("/report", get(|| async { "done" }))
//!     .layer(ServerTimeoutLayer::new(Duration::from_secs(10)))
//!     .layer(ServerBreakerLayer::new(BreakerLayer::consecutive_failures(5)));
//! # let _ = app;
//! ```

mod breaker;
mod timeout;

pub use self::breaker::{ServerBreaker, ServerBreakerFuture, ServerBreakerLayer};
pub use self::timeout::{ServerTimeout, ServerTimeoutFuture, ServerTimeoutLayer};
