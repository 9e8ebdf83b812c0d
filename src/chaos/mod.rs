//! Fault injection for your own tests: [`ChaosLayer`] makes a working HTTP or gRPC client
//! answer as a failing provider would (a 429 with `Retry-After`, a 503, a 500, a reset, a
//! refused connection, an error of any class, added latency, a stall past the timeout), so a
//! test proves that the stack around it retries, opens its breaker and dead-letters as it
//! should, without writing a faulty server.
//!
//! It is a testing tool, in the spirit of Polly's chaos strategies and seatbelt's chaos
//! injection: put it directly over the client, below [`TimeoutLayer`](crate::timeout::TimeoutLayer)
//! (or below the whole [`BackstopLayer`](crate::BackstopLayer)), where a real provider's answer
//! would come in, so that every layer above sees the fault as it would see the real one.
//!
//! - **Rates.** Each [`Fault`] has a rate, the share of requests it hits, within `[0, 1]`; the
//!   rates add up to at most 1, and one draw per selected request picks at most one fault.
//! - **Deterministic.** With [`seed`](ChaosBuilder::seed), the `n`-th selected request draws
//!   the same number on every run (a SplitMix64 sequence, Steele, Lea and Flood, OOPSLA 2014),
//!   so a test that sends requests in order sees the same faults every time.
//! - **Selected requests.** [`when`](ChaosBuilder::when) limits the faults to requests a
//!   predicate picks (a path, a header, a host); the others pass untouched and draw nothing.
//! - **Off unless enabled.** A layer is built disabled: until [`ChaosHandle::enable`] (or
//!   [`enabled(true)`](ChaosBuilder::enabled) on the builder), every request passes through
//!   with one relaxed atomic load and nothing else, so the layer can stay in a stack that is
//!   switched on only in a test or a game day.
//!
//! Faults that answer or fail do not call the inner service (the provider never sees the
//! request); [`Fault::Latency`] holds the real call back for the delay. The response's body is a
//! [`ChaosBody`]: the inner service's body, or an empty one for an injected response.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_backstop::chaos::{ChaosLayer, Fault};
//! use tower_backstop::retry::{Attempts, RetryPolicy};
//! use tower_backstop::{BackstopLayer, Class};
//!
//! // The provider always answers 200; every attempt is made to fail with a 503.
//! let provider = tower::service_fn(|_: http::Request<String>| async {
//!     Ok::<_, tower_backstop::BoxError>(http::Response::new(String::from("sent")))
//! });
//! let chaos = ChaosLayer::builder()
//!     .fault(1.0, Fault::status(503))
//!     .seed(7)
//!     .enabled(true)
//!     .build()?;
//! let handle = chaos.handle();
//! let svc = ServiceBuilder::new()
//!     .layer(BackstopLayer::http(Duration::from_secs(1)).retry(RetryPolicy::new().build()?))
//!     .layer(chaos)
//!     .service(provider);
//!
//! let failure = svc.clone().oneshot(http::Request::new(String::new())).await.unwrap_err();
//! assert_eq!(failure.class(), Class::TRANSIENT);
//! assert_eq!(failure.note::<Attempts>().map(Attempts::count), Some(3));
//! assert_eq!(handle.injected(), 3);
//!
//! handle.disable();
//! let response = svc.oneshot(http::Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use tower_layer::Layer;

use crate::build_error::BuildError;
use crate::failure::{Class, Sent};

mod future;

pub use self::future::{Chaos, ChaosBody, ResponseFuture};

/// One fault [`ChaosLayer`] can inject.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Fault {
    /// An answer with this status and headers and an empty body, the request never sent on
    /// (as a provider that refuses it).
    Response {
        /// The status, within 100–999 ([`ChaosBuilder::build`] checks it).
        status: u16,
        /// The headers (for example `Retry-After`, or a gRPC trailers-only answer's
        /// `grpc-status`).
        headers: HeaderMap,
    },
    /// An error of this class, as a layer or a client reporting it would give it: a
    /// [`Failure`](crate::Failure) with [`Code::Error`](crate::Code::Error), the class kept by
    /// every layer above.
    Error {
        /// The class.
        class: Class,
        /// Whether the request is reported as having reached the provider.
        sent: Sent,
    },
    /// The connection reset after the request left (an io error of kind `ConnectionReset`:
    /// transient, and the request may have been processed).
    Reset,
    /// The connection refused (an io error of kind `ConnectionRefused`: transient, and the
    /// request certainly not processed).
    Refused,
    /// The real answer, this much later: the inner service is called at once and its future
    /// polled only after the delay, so a client whose future does its work when polled
    /// (hyper-util's, reqwest's) sends the request after the delay. The timer is part of the
    /// response future: no allocation.
    Latency(Duration),
    /// No answer at all: the future stays pending until it is dropped (by the timeout above
    /// it, or the caller). The provider never sees the request.
    Stall,
}

impl Fault {
    /// An answer with `status` and no headers: `Fault::status(503)`. A status outside
    /// 100–999 is an error of [`ChaosBuilder::build`].
    pub fn status(status: u16) -> Self {
        Fault::Response {
            status,
            headers: HeaderMap::new(),
        }
    }

    /// A 429 with `Retry-After` of `retry_after` in whole seconds, rounded up (RFC 9110
    /// §10.2.3; RFC 6585 §4 for 429).
    pub fn throttled(retry_after: Duration) -> Self {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        Fault::Response {
            status: 429,
            headers,
        }
    }

    /// An error of `class`, reported as sent ([`Sent::Yes`]): the provider answered with an
    /// error the classifier would put in that class.
    pub fn error(class: Class) -> Self {
        Fault::Error {
            class,
            sent: Sent::Yes,
        }
    }

    /// A short name, for the log line of each injected fault.
    fn name(&self) -> &'static str {
        match self {
            Fault::Response { .. } => "response",
            Fault::Error { .. } => "error",
            Fault::Reset => "reset",
            Fault::Refused => "refused",
            Fault::Latency(_) => "latency",
            Fault::Stall => "stall",
        }
    }
}

/// Builds a [`ChaosLayer`]: its faults with their rates, the seed, the predicate.
#[derive(Clone)]
pub struct ChaosBuilder<P = Always> {
    faults: Vec<(f64, Fault)>,
    seed: Option<u64>,
    enabled: bool,
    when: P,
}

impl<P> fmt::Debug for ChaosBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosBuilder")
            .field("faults", &self.faults)
            .field("seed", &self.seed)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// Every request is selected (the default predicate of [`ChaosBuilder`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Always;

/// Which requests [`ChaosLayer`] may inject a fault into: [`Always`], or a closure
/// `Fn(&Req) -> bool` given to [`ChaosBuilder::when`].
pub trait Select<Req> {
    /// Whether `request` is selected.
    fn select(&self, request: &Req) -> bool;
}

impl<Req> Select<Req> for Always {
    fn select(&self, _: &Req) -> bool {
        true
    }
}

impl<Req, F: Fn(&Req) -> bool> Select<Req> for F {
    fn select(&self, request: &Req) -> bool {
        self(request)
    }
}

impl ChaosBuilder {
    fn new() -> Self {
        ChaosBuilder {
            faults: Vec::new(),
            seed: None,
            enabled: false,
            when: Always,
        }
    }
}

impl<P> ChaosBuilder<P> {
    /// Injects `fault` into a share `rate` of the selected requests, `rate` within `[0, 1]`.
    /// Faults added together share the draw: their rates add up to at most 1.
    pub fn fault(mut self, rate: f64, fault: Fault) -> Self {
        self.faults.push((rate, fault));
        self
    }

    /// The seed of the draws: with one, the same requests in the same order get the same
    /// faults on every run. Without, a random seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether the layer injects from the start (default `false`: off until
    /// [`ChaosHandle::enable`]).
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Injects only into requests `select` picks (for example
    /// `|req: &http::Request<_>| req.uri().path() == "/send"`); the others pass untouched and
    /// draw nothing.
    pub fn when<Q>(self, select: Q) -> ChaosBuilder<Q> {
        ChaosBuilder {
            faults: self.faults,
            seed: self.seed,
            enabled: self.enabled,
            when: select,
        }
    }

    /// Checks the faults and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] when a rate is outside `[0, 1]` or not a number (`"fault"`), the rates
    /// add up to more than 1 (`"fault"`), a status is outside 100–999 (`"Fault::status"`), or
    /// no fault was given (`"fault"`).
    pub fn build(self) -> Result<ChaosLayer<P>, BuildError> {
        if self.faults.is_empty() {
            return Err(BuildError::new(
                "fault",
                "none",
                "a chaos layer needs at least one fault",
            ));
        }
        let mut total = 0.0;
        for (rate, fault) in &self.faults {
            if !(0.0..=1.0).contains(rate) {
                return Err(BuildError::new(
                    "fault",
                    rate,
                    "a fault's rate must be within [0.0, 1.0]",
                ));
            }
            if let Fault::Response { status, .. } = fault
                && StatusCode::from_u16(*status).is_err()
            {
                return Err(BuildError::new(
                    "Fault::status",
                    status,
                    "an HTTP status is within 100..=999",
                ));
            }
            total += rate;
        }
        if total > 1.0 + 1e-9 {
            return Err(BuildError::new(
                "fault",
                total,
                "the faults' rates add up to more than 1.0",
            ));
        }
        let mut bounds = Vec::with_capacity(self.faults.len());
        let mut upper = 0.0;
        for (rate, fault) in self.faults {
            upper += rate;
            bounds.push((upper, fault));
        }
        Ok(ChaosLayer {
            shared: Arc::new(Shared {
                faults: bounds,
                seed: self.seed.unwrap_or_else(rand::random),
                draws: AtomicU64::new(0),
                injected: AtomicU64::new(0),
                enabled: AtomicBool::new(self.enabled),
            }),
            when: self.when,
        })
    }
}

pub(crate) struct Shared {
    /// Each fault with the upper bound of its share of `[0, 1)`.
    faults: Vec<(f64, Fault)>,
    seed: u64,
    draws: AtomicU64,
    injected: AtomicU64,
    enabled: AtomicBool,
}

impl Shared {
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The fault for the next selected request, if the draw hits one.
    pub(crate) fn draw(&self) -> Option<&Fault> {
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let x = unit(splitmix64(self.seed.wrapping_add(n.wrapping_mul(GOLDEN))));
        let fault = self
            .faults
            .iter()
            .find(|(upper, _)| x < *upper)
            .map(|(_, f)| f)?;
        self.injected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(fault = fault.name(), draw = n, "chaos: fault injected");
        Some(fault)
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The top 53 bits as a number in `[0, 1)`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Injects faults into the requests of the service it wraps; see the [module docs](self).
///
/// Cloning it shares the faults, the draw sequence and the switch.
#[derive(Clone)]
pub struct ChaosLayer<P = Always> {
    shared: Arc<Shared>,
    when: P,
}

impl<P> fmt::Debug for ChaosLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosLayer")
            .field("faults", &self.shared.faults)
            .field("enabled", &self.shared.enabled())
            .finish_non_exhaustive()
    }
}

impl ChaosLayer {
    /// A builder with no fault yet, disabled, every request selected.
    pub fn builder() -> ChaosBuilder {
        ChaosBuilder::new()
    }
}

impl<P> ChaosLayer<P> {
    /// The switch and the counters of this layer (and of every service it built).
    pub fn handle(&self) -> ChaosHandle {
        ChaosHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<S, P: Clone> Layer<S> for ChaosLayer<P> {
    type Service = Chaos<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Chaos::new(inner, self.shared.clone(), self.when.clone())
    }
}

/// Turns a [`ChaosLayer`] on and off at run time, and counts what it did.
#[derive(Clone)]
pub struct ChaosHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for ChaosHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosHandle")
            .field("enabled", &self.is_enabled())
            .field("injected", &self.injected())
            .finish()
    }
}

impl ChaosHandle {
    /// Starts injecting faults (into requests called from now on).
    pub fn enable(&self) {
        self.shared.enabled.store(true, Ordering::Relaxed);
    }

    /// Stops injecting: every request passes through.
    pub fn disable(&self) {
        self.shared.enabled.store(false, Ordering::Relaxed);
    }

    /// Whether faults are injected.
    pub fn is_enabled(&self) -> bool {
        self.shared.enabled()
    }

    /// Requests that drew a fault so far, latency included.
    pub fn injected(&self) -> u64 {
        self.shared.injected.load(Ordering::Relaxed)
    }

    /// Selected requests that drew, with or without a fault, while enabled.
    pub fn drawn(&self) -> u64 {
        self.shared.draws.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_and_repeatable() {
        let layer = ChaosLayer::builder()
            .fault(0.25, Fault::Reset)
            .fault(0.5, Fault::Refused)
            .seed(42)
            .build()
            .unwrap();
        let again = ChaosLayer::builder()
            .fault(0.25, Fault::Reset)
            .fault(0.5, Fault::Refused)
            .seed(42)
            .build()
            .unwrap();
        let mut counts = [0u32; 3];
        for _ in 0..10_000 {
            let a = layer.shared.draw().map(Fault::name);
            let b = again.shared.draw().map(Fault::name);
            assert_eq!(a, b, "the same seed draws the same faults");
            counts[match a {
                Some("reset") => 0,
                Some("refused") => 1,
                _ => 2,
            }] += 1;
        }
        // 2,500 / 5,000 / 2,500 expected; a 4 % band is over 9 standard deviations wide.
        for (n, expected) in counts.iter().zip([2_500, 5_000, 2_500]) {
            assert!(n.abs_diff(expected) < 400, "{counts:?}");
        }
        assert_eq!(layer.handle().drawn(), 10_000);
        assert_eq!(u64::from(counts[0] + counts[1]), layer.handle().injected());
        assert!((0..1000).all(|i| unit(splitmix64(i)) < 1.0));
    }

    #[test]
    fn another_seed_draws_other_faults() {
        let draws = |seed| {
            let layer = ChaosLayer::builder()
                .fault(0.5, Fault::Reset)
                .seed(seed)
                .build()
                .unwrap();
            (0..64)
                .map(|_| layer.shared.draw().is_some())
                .collect::<Vec<_>>()
        };
        assert_ne!(draws(1), draws(2));
        assert_eq!(draws(3), draws(3));
    }

    #[test]
    fn throttled_rounds_retry_after_up() {
        let header = |d| match Fault::throttled(d) {
            Fault::Response { status, headers } => {
                assert_eq!(status, 429);
                headers[http::header::RETRY_AFTER]
                    .to_str()
                    .unwrap()
                    .to_owned()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(header(Duration::from_secs(2)), "2");
        assert_eq!(header(Duration::from_millis(1500)), "2");
        assert_eq!(header(Duration::ZERO), "0");
    }
}
