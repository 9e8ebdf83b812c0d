//! An outage for the scheduler's tests: a provider that refuses connections while it is down,
//! and one process's stack over a store, with its breaker.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerHandle, BreakerLayer};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::http_request;
use tower_backstop::retry::{Backoff, RetryPolicy};
use tower_backstop::store::{Record, Store};
use tower_backstop::{BoxError, Clock, Failure};

pub const URI: &str = "http://mail.test/v1/messages";
/// How long the breaker stays open after each trip.
pub const OPEN_FOR: Duration = Duration::from_secs(5);

pub fn as_string_request(record: &Record) -> Result<http::Request<String>, BoxError> {
    let request = http_request(record, None)?;
    let payload = String::from_utf8(record.payload.clone())?;
    Ok(request.map(|_: Full<Bytes>| payload))
}

/// A provider that refuses connections while `down`, and otherwise accepts each message (202),
/// counting the deliveries per idempotency key.
#[derive(Clone, Default)]
pub struct Provider {
    pub down: Arc<AtomicBool>,
    /// Every request that reached it, by idempotency key.
    pub requests: Arc<Mutex<Vec<String>>>,
    /// Deliveries (202 answers) per key.
    pub effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Provider {
    pub fn down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn requests(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    pub fn effects(&self) -> HashMap<String, u32> {
        self.effects.lock().unwrap().clone()
    }

    pub fn service(
        &self,
    ) -> impl tower::Service<
        http::Request<String>,
        Response = http::Response<()>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        tower::service_fn(move |req: http::Request<String>| {
            let this = this.clone();
            async move {
                let key = req.headers()["idempotency-key"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                this.requests.lock().unwrap().push(key.clone());
                if this.down.load(Ordering::SeqCst) {
                    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    return Err::<http::Response<()>, BoxError>(Box::new(refused));
                }
                *this.effects.lock().unwrap().entry(key).or_default() += 1;
                Ok(http::Response::builder().status(202).body(()).unwrap())
            }
        })
    }
}

/// One process's stack over `store`: dead letters, 3 attempts with no backoff (the retry layer
/// reads retry-at times from the system clock: a backoff slept on the paused clock would put
/// them behind the breaker's), a breaker that opens after 2 failures in a row for [`OPEN_FOR`],
/// the HTTP classifier.
pub fn stack(
    store: &Arc<dyn Store>,
    provider: &Provider,
    clock: Clock,
) -> (
    impl tower::Service<
        http::Request<String>,
        Response = http::Response<()>,
        Error = Failure<http::Response<()>>,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    BreakerHandle,
) {
    stack_opening_for(store, provider, clock, OPEN_FOR)
}

/// [`stack`] with a breaker that opens for `open_for`.
pub fn stack_opening_for(
    store: &Arc<dyn Store>,
    provider: &Provider,
    clock: Clock,
    open_for: Duration,
) -> (
    impl tower::Service<
        http::Request<String>,
        Response = http::Response<()>,
        Error = Failure<http::Response<()>>,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    BreakerHandle,
) {
    let breaker = BreakerLayer::consecutive_failures(2)
        .open_for(open_for)
        .name("mail.test");
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(store)).clock(clock))
        .layer(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Backoff::constant(Duration::ZERO))
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(provider.service());
    (svc, handle)
}

/// Sends `n` keyed messages `m-0`… through `svc`, one after another.
pub async fn send_all<S>(svc: &S, n: usize)
where
    S: tower::Service<http::Request<String>, Error = Failure<http::Response<()>>> + Clone,
{
    for i in 0..n {
        let req = super::post_with_key(URI, &format!("{{\"n\":{i}}}"), &format!("m-{i}"));
        let _ = svc.clone().oneshot(req).await;
    }
}
