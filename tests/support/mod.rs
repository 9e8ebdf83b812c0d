//! Shared test helpers: a scripted in-process upstream, and a real axum server on loopback.
#![allow(dead_code, unreachable_pub)]

pub mod outage;

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::Service;
use tower_backstop::BoxError;

/// What the scripted upstream does for one call.
#[derive(Clone, Debug)]
pub enum Step {
    /// Answer with this status and headers.
    Status(u16, Vec<(&'static str, String)>),
    /// Fail with an io error of this kind.
    Io(io::ErrorKind),
    /// Wait, then do the inner step.
    After(Duration, Box<Step>),
}

pub fn status(code: u16) -> Step {
    Step::Status(code, Vec::new())
}

pub fn status_with(code: u16, name: &'static str, value: impl Into<String>) -> Step {
    Step::Status(code, vec![(name, value.into())])
}

/// One call the upstream saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: http::Method,
    pub key: Option<String>,
    pub body: String,
    pub content_length: Option<String>,
    pub at: Instant,
}

/// An in-process upstream that plays a script, one step per call, then repeats `then`.
#[derive(Clone)]
pub struct Scripted {
    steps: Arc<Mutex<VecDeque<Step>>>,
    then: Step,
    seen: Arc<Mutex<Vec<Seen>>>,
    finished: Arc<Mutex<u32>>,
}

impl Scripted {
    pub fn new(steps: impl IntoIterator<Item = Step>, then: Step) -> Self {
        Scripted {
            steps: Arc::new(Mutex::new(steps.into_iter().collect())),
            then,
            seen: Arc::default(),
            finished: Arc::default(),
        }
    }

    pub fn always(step: Step) -> Self {
        Scripted::new([], step)
    }

    pub fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Calls whose future ran to completion (not cut by a timeout).
    pub fn finished(&self) -> u32 {
        *self.finished.lock().unwrap()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn play(step: Step) -> Pin<Box<dyn Future<Output = Result<http::Response<()>, BoxError>> + Send>> {
    Box::pin(async move {
        match step {
            Step::Status(code, headers) => {
                let mut b = http::Response::builder().status(code);
                for (name, value) in headers {
                    b = b.header(name, value);
                }
                Ok(b.body(()).unwrap())
            }
            Step::Io(kind) => Err(io::Error::from(kind).into()),
            Step::After(delay, step) => {
                tokio::time::sleep(delay).await;
                play(*step).await
            }
        }
    })
}

impl Service<http::Request<String>> for Scripted {
    type Response = http::Response<()>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<()>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<String>) -> Self::Future {
        self.seen.lock().unwrap().push(Seen {
            method: req.method().clone(),
            key: req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned()),
            body: req.body().clone(),
            content_length: req
                .headers()
                .get("content-length")
                .map(|v| v.to_str().unwrap().to_owned()),
            at: Instant::now(),
        });
        let step = self
            .steps
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| self.then.clone());
        let finished = self.finished.clone();
        let fut = play(step);
        Box::pin(async move {
            let out = fut.await;
            *finished.lock().unwrap() += 1;
            out
        })
    }
}

pub fn get(uri: &str) -> http::Request<String> {
    http::Request::get(uri).body(String::new()).unwrap()
}

pub fn post(uri: &str, body: &str) -> http::Request<String> {
    http::Request::post(uri)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .unwrap()
}

pub fn post_with_key(uri: &str, body: &str, key: &str) -> http::Request<String> {
    http::Request::post(uri)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .unwrap()
}

/// Serves `router` on 127.0.0.1:0 and returns its base URL.
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}")
}

/// Captures this thread's `tracing` output at `level` and above, as plain text, while it lives.
///
/// Use it only in a test binary of its own: `tracing` caches each callsite's interest
/// process-wide, so a thread-local subscriber set while other tests run on other threads can
/// miss events.
pub struct LogCapture {
    buf: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    pub fn start(level: tracing::Level) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = SharedBuf(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        LogCapture {
            buf,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.buf.lock().unwrap().clone()).unwrap()
    }
}

/// A `RetryLayer` with `policy` over `ClassifyLayer::http()` over `upstream`, boxed.
pub fn retry_stack(
    policy: tower_backstop::retry::RetryPolicy,
    upstream: &Scripted,
) -> tower::util::BoxCloneService<
    http::Request<String>,
    http::Response<()>,
    tower_backstop::Failure<http::Response<()>>,
> {
    tower::util::BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(policy.build().unwrap())
            .layer(tower_backstop::classify::ClassifyLayer::http())
            .service(upstream.clone()),
    )
}

/// Exponential backoff from `base_ms` milliseconds, capped at 10 s, without jitter: exact delays.
pub fn no_jitter(base_ms: u64) -> tower_backstop::retry::Backoff {
    tower_backstop::retry::Backoff::exponential(
        Duration::from_millis(base_ms),
        Duration::from_secs(10),
    )
    .jitter(tower_backstop::retry::Jitter::None)
}
