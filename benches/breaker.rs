//! Our breaker beside tower-resilience's circuit breaker and failsafe's, in the same run: the
//! closed-state success path, the open-state rejection, and the closed success path with two
//! threads calling one breaker at once. The inner service is a bare `service_fn`, ready at once.
//!
//! Each entry is timed like `benches/overhead.rs` (`iter_custom` around a loop of `poll_ready` +
//! `call` + await inside one `block_on`). Before each group, every entry's allocations per call
//! are counted over 10,000 untimed calls with a counting global allocator (per thread, as in
//! `tests/alloc.rs`) and printed: `allocations/call <entry>: <n>`.
//!
//! ```text
//! cargo bench --bench breaker -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! failsafe is not a tower layer: its entries call `StateMachine::call(inner.call(req))`, which
//! is how failsafe wraps a future. Every breaker is configured to trip on 5 consecutive failures
//! (tower-resilience: a failure rate over a count window of 5 calls, its nearest rule), and
//! stays open for an hour in the rejection case.

use std::fmt::Debug;
use std::future::{Future, poll_fn, ready};
use std::hint::black_box;
use std::time::{Duration, Instant};

mod support;

use support::*;

use criterion::{Bencher, Criterion, criterion_group, criterion_main};
use failsafe::futures::CircuitBreaker as _;
use tokio::runtime::Runtime;
use tower::{Layer, Service, service_fn};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::{Class, Code, Failure};

#[path = "../tests/support/counting.rs"]
mod counting;

use counting::allocations;

/// One call of anything we measure; `ok` says whether a success is expected.
trait Call {
    fn call_once(&mut self) -> impl Future<Output = bool>;
}

/// A tower service: `poll_ready`, `call`, await.
struct Tower<S>(S);

impl<S> Call for Tower<S>
where
    S: Service<Req>,
    S::Error: Debug,
{
    async fn call_once(&mut self) -> bool {
        poll_fn(|cx| self.0.poll_ready(cx))
            .await
            .expect("service ready");
        let result = self.0.call(black_box(REQUEST)).await;
        black_box(result.is_ok())
    }
}

type Failsafe = failsafe::StateMachine<
    failsafe::failure_policy::ConsecutiveFailures<failsafe::backoff::Constant>,
    (),
>;

/// failsafe around the bare service's future.
struct FailsafeCall(Failsafe, Bare);

impl Call for FailsafeCall {
    async fn call_once(&mut self) -> bool {
        poll_fn(|cx| self.1.poll_ready(cx))
            .await
            .expect("service ready");
        let result = self.0.call(self.1.call(black_box(REQUEST))).await;
        black_box(result.is_ok())
    }
}

fn failsafe(open_for: Duration) -> Failsafe {
    failsafe::Config::new()
        .failure_policy(failsafe::failure_policy::consecutive_failures(
            5,
            failsafe::backoff::constant(open_for),
        ))
        .build()
}

fn ours() -> BreakerLayer {
    BreakerLayer::consecutive_failures(5).open_for(Duration::from_secs(3600))
}

fn resilience() -> tower_resilience_circuitbreaker::CircuitBreakerLayer {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(1.0)
        .sliding_window_size(5)
        .minimum_number_of_calls(5)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .expect("a valid configuration")
}

/// Times `iters` calls in one `block_on`.
fn run<C: Call>(rt: &Runtime, b: &mut Bencher<'_>, mut c: C, expect_ok: bool) {
    b.iter_custom(|iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                assert_eq!(c.call_once().await, expect_ok);
            }
            start.elapsed()
        })
    });
}

/// Counts allocations per call over 10,000 calls after a warm-up, and prints them.
fn count<C: Call>(rt: &Runtime, name: &str, mut c: C, expect_ok: bool) -> C {
    let per_call = rt.block_on(async {
        for _ in 0..100 {
            assert_eq!(c.call_once().await, expect_ok);
        }
        let before = allocations();
        for _ in 0..10_000 {
            assert_eq!(c.call_once().await, expect_ok);
        }
        (allocations() - before) as f64 / 10_000.0
    });
    println!("allocations/call {name}: {per_call}");
    c
}

fn closed_success(c: &mut Criterion) {
    let rt = runtime();
    let bare_c = count(&rt, "closed/bare", Tower(bare()), true);
    let ours_c = count(&rt, "closed/backstop", Tower(ours().layer(bare())), true);
    let res_c = count(
        &rt,
        "closed/tower-resilience",
        Tower(resilience().layer(bare())),
        true,
    );
    let fs_c = count(
        &rt,
        "closed/failsafe",
        FailsafeCall(failsafe(Duration::from_secs(3600)), bare()),
        true,
    );
    let mut group = c.benchmark_group("breaker_closed_success");
    group.bench_function("bare", |b| run(&rt, b, Tower(bare_c.0), true));
    group.bench_function("backstop", |b| run(&rt, b, Tower(ours_c.0.clone()), true));
    group.bench_function("tower_resilience", |b| {
        run(&rt, b, Tower(res_c.0.clone()), true)
    });
    group.bench_function("failsafe", |b| {
        run(&rt, b, FailsafeCall(fs_c.0.clone(), bare()), true)
    });
    group.finish();
}

fn open_rejection(c: &mut Criterion) {
    let rt = runtime();

    let layer = ours();
    let handle = layer.handle();
    let mut failing = layer.layer(service_fn(|_: Req| {
        ready(Err::<Req, _>(Failure::<Req>::new(
            Class::TRANSIENT,
            Code::Error,
        )))
    }));
    rt.block_on(async {
        for _ in 0..5 {
            poll_fn(|cx| failing.poll_ready(cx)).await.unwrap();
            let _ = failing.call(REQUEST).await;
        }
    });
    assert_eq!(handle.state(), State::Open);
    let ours_c = count(&rt, "open/backstop", Tower(layer.layer(bare())), false);

    let (res_layer, res_handle) = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(1.0)
        .sliding_window_size(5)
        .minimum_number_of_calls(5)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build_with_handle()
        .expect("a valid configuration");
    rt.block_on(res_handle.force_open());
    assert!(res_handle.is_open());
    let res_c = count(
        &rt,
        "open/tower-resilience",
        Tower(res_layer.layer(bare())),
        false,
    );

    let fs = failsafe(Duration::from_secs(3600));
    for _ in 0..5 {
        fs.on_error();
    }
    assert!(!fs.is_call_permitted());
    let fs_c = count(&rt, "open/failsafe", FailsafeCall(fs, bare()), false);

    let mut group = c.benchmark_group("breaker_open_rejection");
    group.bench_function("backstop", |b| run(&rt, b, Tower(ours_c.0.clone()), false));
    group.bench_function("tower_resilience", |b| {
        run(&rt, b, Tower(res_c.0.clone()), false)
    });
    group.bench_function("failsafe", |b| {
        run(&rt, b, FailsafeCall(fs_c.0.clone(), bare()), false)
    });
    group.finish();
}

/// Two threads, each with its own runtime and its own clone of the service, share one breaker;
/// the time is the wall time for `iters` calls split between them.
fn run_contended<C, F>(b: &mut Bencher<'_>, make: F)
where
    C: Call + Send,
    F: Fn() -> C + Sync,
{
    let runtimes = [runtime(), runtime()];
    b.iter_custom(|iters| {
        let half = iters / 2 + 1;
        let start = Instant::now();
        std::thread::scope(|s| {
            for rt in &runtimes {
                let mut c = make();
                s.spawn(move || {
                    rt.block_on(async {
                        for _ in 0..half {
                            assert!(c.call_once().await);
                        }
                    })
                });
            }
        });
        start.elapsed()
    });
}

fn contention(c: &mut Criterion) {
    let ours = ours();
    let res = resilience();
    let fs = failsafe(Duration::from_secs(3600));
    let mut group = c.benchmark_group("breaker_closed_success_2_threads");
    group.bench_function("bare", |b| run_contended(b, || Tower(bare())));
    group.bench_function("backstop", |b| {
        run_contended(b, || Tower(ours.layer(bare())))
    });
    group.bench_function("tower_resilience", |b| {
        run_contended(b, || Tower(res.layer(bare())))
    });
    group.bench_function("failsafe", |b| {
        run_contended(b, || FailsafeCall(fs.clone(), bare()))
    });
    group.finish();
}

criterion_group!(breaker, closed_success, open_rejection, contention);
criterion_main!(breaker);
