//! Tower middleware that keeps a service standing when the systems it calls fail.
//!
//! Five layers, each usable alone or stacked with `tower::ServiceBuilder`, outermost first:
//!
//! | layer | what it does |
//! |---|---|
//! | [`DeadLetterLayer`](dead_letter::DeadLetterLayer) | a request that finally fails becomes a dead-letter record in a store (SQLite by default) |
//! | [`RetryLayer`](retry::RetryLayer) | retries what is worth retrying: per-class attempts, backoff with jitter and a cap, `Retry-After`, idempotent requests only |
//! | [`BreakerLayer`](breaker::BreakerLayer) | fails fast while the provider is failing, with the time left until half-open |
//! | [`ClassifyLayer`](classify::ClassifyLayer) | turns each attempt's outcome into success or a [`Failure`] with a [`Class`] and the original [`Code`] |
//! | [`TimeoutLayer`](timeout::TimeoutLayer) | bounds each attempt |
//!
//! A failure is classified once, by [`ClassifyLayer`](classify::ClassifyLayer); every layer above
//! reads the class off the [`Failure`] it receives, even through tower's layers that box errors.
//!
//! [`BackstopLayer`] builds the five in this order from one set of settings. Stacked by hand, a
//! wrong order that the compiler cannot reject is reported by a `tracing` warning when the stack
//! is built.
//!
//! # A client
//!
//! [`BackstopLayer`] builds the five layers in order from one set of settings: one breaker per
//! host tripping on a failure rate, the dead-letter and retry layers sharing one request copy.
//!
//! ```no_run
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_backstop::{
//!     BackstopLayer, dead_letter::DeadLetterLayer, retry::RetryPolicy, store::SqliteStore,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let dead_letters = SqliteStore::open("dead_letters.db")?;
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         BackstopLayer::http(Duration::from_secs(2))
//!             .retry(RetryPolicy::new().max_attempts(5).build()?)
//!             .dead_letters(DeadLetterLayer::new(dead_letters)),
//!     )
//!     .service(client);
//! let request = http::Request::post("http://127.0.0.1:8080/v1/messages")
//!     .header("Idempotency-Key", "msg-1")
//!     .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))?;
//! match svc.oneshot(request).await {
//!     Ok(response) => println!("delivered: {}", response.status()),
//!     Err(failure) => println!("gave up: {failure}"),
//! }
//! # Ok(()) }
//! ```
//!
//! By hand, outermost first: [`DeadLetterLayer`](dead_letter::DeadLetterLayer),
//! [`RetryLayer`](retry::RetryLayer), [`BreakerLayer`](breaker::BreakerLayer) (one breaker per
//! host with [`per_host`](breaker::BreakerLayer::per_host), or one for all),
//! [`ClassifyLayer`](classify::ClassifyLayer),
//! [`TimeoutLayer`](timeout::TimeoutLayer); the README shows the same stack written out.
//!
//! # A server
//!
//! An axum server protecting itself: a handler that hangs becomes `504 Gateway Timeout`, and while
//! the handlers keep failing the breaker answers `503 Service Unavailable` with `Retry-After`.
//! It stays `Infallible`, so it works with `Router::layer`.
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
//!
//! How each layer fits an axum `Router`:
//!
//! | layer | on a `Router` |
//! |---|---|
//! | [`ServerLayer`](server::ServerLayer) (a timeout, a breaker, or both) | `Router::layer` as it is: 504, and 503 with `Retry-After`; errors stay `Infallible` |
//! | [`TimeoutLayer`](timeout::TimeoutLayer), [`BreakerLayer`](breaker::BreakerLayer) | client side: their error is a `BoxError` or a [`Failure`], which a `Router` does not accept; on a server use `ServerLayer` above |
//! | [`ClassifyLayer`](classify::ClassifyLayer), [`RetryLayer`](retry::RetryLayer), [`DeadLetterLayer`](dead_letter::DeadLetterLayer) | client side: around the client a handler calls. With the `axum` feature the handler returns `Result<Response, Failure<_>>`: a [`Failure`] answers with the upstream's response, or 503 with `Retry-After` (open breaker), 504 (timeout), 502 (anything else) |
//!
//! With the `reqwest` feature the stack wraps a `reqwest::Client` unchanged: a `reqwest::Request`
//! is [`Replay`] (by `try_clone`; a streaming body is sent once and its failure says
//! [`GiveUp::NotReplayable`](retry::GiveUp::NotReplayable); safe to resend: an idempotent method or an `Idempotency-Key`) and
//! [`Describe`] (method, URL, `Content-Type`, key and body bytes);
//! [`HttpClassifier`](classify::HttpClassifier) classifies a `reqwest::Response` by status and
//! hint headers as it does an `http::Response`; a `reqwest::Error` that is a timeout is
//! [`Code::Timeout`], and a connect error (refused, DNS, connect timeout: nothing was sent) a
//! refused connection, the proof that lets even a keyless POST be resent.
//!
//! # Features
//!
//! | feature | what | default |
//! |---|---|---|
//! | `dead-letter` | [`dead_letter`], [`resend`] and [`store`] (the `tower-backstop-store` crate): dead letters, deferred re-sends, re-drives | yes |
//! | `sqlite` | [`SqliteStore`](store::SqliteStore), the durable dead-letter store for one machine (bundled SQLite) | yes |
//! | `redis` | `RedisStore`, the dead-letter store shared by many instances (redis crate, tokio) | no |
//! | `postgres` | `PostgresStore`, the dead-letter store shared by a fleet in the team's Postgres (sqlx, tokio; migrations shipped inside) | no |
//! | `hyper-util` | classify hyper-util client connect errors as transient even without an io error in their chain; a layer of ours can sit directly over a hyper-util client | yes |
//! | `axum` | [`Failure`] is axum's `IntoResponse` (axum-core) | no |
//! | `tonic` | `GrpcLayer`: a generated tonic client takes the stack around a `Channel` as its channel (bounded replay buffer, the caller's `tonic::Status`) | no |
//! | `reqwest` | the layers wrap a `reqwest::Client`: `Replay` and `Describe` for `reqwest::Request`, `HttpClassifier` for `reqwest::Response`, reqwest's timeout and connect errors classified | no |

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod breaker;
mod build_error;
#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
pub mod chaos;
pub mod classify;
mod clock;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod config;
#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
pub mod dead_letter;
pub mod failover;
mod failure;
mod grpc_wire;
mod http_wire;
mod integration;
pub mod observe;
mod order;
mod preset;
pub mod request;
#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
pub mod resend;
pub mod retry;
pub mod server;
#[cfg(feature = "serde")]
mod settings;
mod status;
#[cfg(feature = "dead-letter")]
#[cfg_attr(docsrs, doc(cfg(feature = "dead-letter")))]
pub mod store;
pub mod timeout;

pub use self::build_error::BuildError;
pub use self::clock::Clock;
pub use self::failure::{BoxError, Class, Code, Failure, Note, Notes, Sent};
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use self::integration::tonic::{DEFAULT_GRPC_BUFFER, Grpc, GrpcFuture, GrpcLayer, GrpcRequest};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use self::preset::Reload;
pub use self::preset::{Backstop, BackstopLayer};
pub use self::request::{Describe, Envelope, MessageId, Replay, TimeLeft};

// `tower_backstop::event::{Event, Listener, Alerts}` before they moved to `observe`: kept so
// that code written against that path still compiles.
#[doc(hidden)]
pub use self::observe as event;
// `tower_backstop::metrics::Metrics` before it moved to `observe`: kept likewise.
#[cfg(feature = "metrics")]
#[doc(hidden)]
pub use self::observe as metrics;

// The README's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// So do the runbook's.
#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDoctests;

// And the architecture's (the stack by hand).
#[cfg(doctest)]
#[doc = include_str!("../docs/architecture.md")]
struct ArchitectureDoctests;
