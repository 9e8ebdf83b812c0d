//! What each layer costs on the success path, next to a bare `service_fn` and, where tower has
//! one, tower's own equivalent, in the same `benchmark_group`. The model is tokio's
//! `benches/time_timeout.rs`: `iter_custom` times a loop of calls inside one `block_on` on a
//! `current_thread` runtime, so the runtime's entry cost is paid once per sample, not per call.
//!
//! Every entry is driven by [`run`]: `poll_ready`, then `call`, the response future awaited in
//! place. The inner service is ready at once and answers at once, so the figures are the layers'
//! own overhead. Allocation counts are not measured here; `tests/alloc.rs` proves them.
//!
//! ```text
//! cargo bench --bench overhead -- --warm-up-time 1 --measurement-time 2
//! ```

use std::fmt::Debug;
use std::future::{Ready, ready};
use std::time::Duration;

mod support;

use support::*;

use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Layer, ServiceBuilder, service_fn};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::{ClassifyLayer, Verdict};
use tower_backstop::dead_letter::{DeadLetterLayer, MemoryStore};
use tower_backstop::retry::RetryLayer;
use tower_backstop::timeout::TimeoutLayer;

/// A timeout long enough never to fire.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A bare inner service answering an `http::Response<()>` (200 OK).
fn bare_http() -> BareOf<http::Response<()>> {
    service_fn(|_: Req| ready(Ok(http::Response::new(()))))
}

/// A closure classifier that calls every response a success.
fn all_ok<R>(_: &R) -> Option<Verdict> {
    None
}

/// tower's retry with the attempt cap of our default policy (3 attempts: 2 retries), retrying
/// every error, the request cloned for each attempt.
#[derive(Clone, Copy, Debug)]
struct RetryErrors {
    retries_left: usize,
}

impl RetryErrors {
    const fn attempts(attempts: usize) -> Self {
        RetryErrors {
            retries_left: attempts - 1,
        }
    }
}

impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for RetryErrors {
    type Future = Ready<()>;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Err(_) if self.retries_left > 0 => {
                self.retries_left -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

fn timeout(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("timeout");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop", |b| {
        run(&rt, b, TimeoutLayer::new(TIMEOUT).layer(bare()))
    });
    group.bench_function("tower", |b| {
        run(
            &rt,
            b,
            tower::timeout::TimeoutLayer::new(TIMEOUT).layer(bare()),
        )
    });
    group.finish();
}

fn retry(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("retry");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop", |b| {
        run(&rt, b, RetryLayer::default().layer(bare()))
    });
    group.bench_function("tower", |b| {
        run(
            &rt,
            b,
            tower::retry::RetryLayer::new(RetryErrors::attempts(3)).layer(bare()),
        )
    });
    group.finish();
}

fn classify(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("classify");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop_closure", |b| {
        run(&rt, b, ClassifyLayer::new(all_ok::<Req>).layer(bare()))
    });
    group.bench_function("bare_http", |b| run(&rt, b, bare_http()));
    group.bench_function("backstop_http", |b| {
        run(&rt, b, ClassifyLayer::http().layer(bare_http()))
    });
    group.finish();
}

fn breaker(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("breaker");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop", |b| {
        run(&rt, b, BreakerLayer::new().layer(bare()))
    });
    group.finish();
}

fn dead_letter(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("dead_letter");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop_memory", |b| {
        run(
            &rt,
            b,
            DeadLetterLayer::new(MemoryStore::new()).layer(bare()),
        )
    });
    group.finish();
}

fn stack(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("stack");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop_five_layers", |b| {
        let svc = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(MemoryStore::new()))
            .layer(RetryLayer::default())
            .layer(BreakerLayer::new())
            .layer(ClassifyLayer::new(all_ok::<Req>))
            .layer(TimeoutLayer::new(TIMEOUT))
            .service(bare());
        run(&rt, b, svc)
    });
    // The part of the stack tower has: its retry around its timeout.
    group.bench_function("tower_retry_timeout", |b| {
        let svc = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryErrors::attempts(3)))
            .layer(tower::timeout::TimeoutLayer::new(TIMEOUT))
            .service(bare());
        run(&rt, b, svc)
    });
    group.finish();
}

criterion_group!(
    overhead,
    timeout,
    retry,
    classify,
    breaker,
    dead_letter,
    stack
);
criterion_main!(overhead);
