//! What each layer and the whole stack cost on the success path, side by side with tower's own
//! `Timeout`, `Retry` and `Retry` + `Timeout`, failsafe's breaker and tower-resilience's retry
//! and breaker, all in one `benchmark_group` (`overhead`), so that the figures of one run can be
//! compared; then the whole stack on two threads sharing one stack (`overhead_2_threads`).
//!
//! Every entry is driven the same way: `poll_ready`, then `call`, the response future awaited in
//! place, `iter_custom` timing a loop of calls inside one `block_on` on a `current_thread`
//! runtime (the model of tokio's `benches/time_timeout.rs`). The inner service is ready at once
//! and answers at once (`benches/support`), so the figures are the layers' own overhead. Our
//! layers get `&'static str` requests, the peers the same. failsafe is not a tower layer: its
//! entry calls `StateMachine::call(inner.call(req))`, how failsafe wraps a future.
//!
//! Before the timed runs, every entry's allocations per call are counted over 10,000 untimed
//! calls with the counting global allocator of `tests/support/counting.rs` and printed:
//! `allocations/call <entry>: <n>`.
//!
//! Configurations: retries allow 3 attempts (ours: `RetryLayer::default()`, or the same policy
//! edited and built; tower's: a policy retrying every error;
//! tower-resilience's: `max_attempts(3)`, fixed 100 ms interval); breakers trip on 5
//! consecutive failures (tower-resilience: a failure rate over a count window of 5 calls);
//! timeouts are 30 s, never reached.
//!
//! `stack/backstop_preset_noop_listener` is the preset with a listener that does nothing. With
//! `--features metrics`, three more: the preset with the `Metrics` listener over a Prometheus
//! recorder (`stack/backstop_preset_metrics`), and the floor under it, outside any layer: two
//! reads of tokio's clock (`floor/tokio_clock_two_reads`) and the recorder's three records of a
//! successful call (`floor/prometheus_records_of_a_call`).
//!
//! ```text
//! cargo bench --bench overhead -- --warm-up-time 1 --measurement-time 3
//! ```

use std::fmt::Debug;
use std::future::{Future, Ready, poll_fn, ready};
use std::hint::black_box;
use std::time::{Duration, Instant};

mod support;

use support::*;

use criterion::{Bencher, Criterion, criterion_group, criterion_main};
use failsafe::futures::CircuitBreaker as _;
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceBuilder};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::{ClassifyLayer, Verdict};
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::retry::{RetryLayer, RetryPolicy};
use tower_backstop::store::MemoryStore;
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, BoxError};

#[path = "../tests/support/counting.rs"]
mod counting;

use counting::allocations;

/// A timeout long enough never to fire.
const TIMEOUT: Duration = Duration::from_secs(30);

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

/// One call of anything measured.
trait Call {
    fn call_once(&mut self) -> impl Future<Output = ()>;
}

/// A tower service: `poll_ready`, `call`, await; the call must succeed.
#[derive(Clone)]
struct Tower<S>(S);

impl<S> Call for Tower<S>
where
    S: Service<Req>,
    S::Error: Debug,
{
    #[inline]
    async fn call_once(&mut self) {
        poll_fn(|cx| self.0.poll_ready(cx))
            .await
            .expect("service ready");
        let response = self
            .0
            .call(black_box(REQUEST))
            .await
            .expect("call succeeds");
        black_box(response);
    }
}

type Failsafe = failsafe::StateMachine<
    failsafe::failure_policy::ConsecutiveFailures<failsafe::backoff::Constant>,
    (),
>;

/// failsafe around the bare service's future.
#[derive(Clone)]
struct FailsafeCall(Failsafe, Bare);

impl Call for FailsafeCall {
    async fn call_once(&mut self) {
        poll_fn(|cx| self.1.poll_ready(cx))
            .await
            .expect("service ready");
        let response = self
            .0
            .call(self.1.call(black_box(REQUEST)))
            .await
            .expect("call succeeds");
        black_box(response);
    }
}

fn failsafe() -> Failsafe {
    failsafe::Config::new()
        .failure_policy(failsafe::failure_policy::consecutive_failures(
            5,
            failsafe::backoff::constant(Duration::from_secs(3600)),
        ))
        .build()
}

fn resilience_breaker() -> tower_resilience_circuitbreaker::CircuitBreakerLayer {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(1.0)
        .sliding_window_size(5)
        .minimum_number_of_calls(5)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .expect("a valid configuration")
}

fn resilience_retry() -> tower_resilience_retry::RetryLayer<Req, Req, BoxError> {
    tower_resilience_retry::RetryLayer::<Req, Req, BoxError>::builder()
        .max_attempts(3)
        .fixed_backoff(Duration::from_millis(100))
        .build()
}

/// Our five layers, stacked one by one.
fn five_layers() -> impl Service<Req, Error: Debug> + Clone + Send + 'static {
    five_layers_of(
        DeadLetterLayer::new(MemoryStore::new()),
        BreakerLayer::new(),
    )
}

/// The five layers stacked one by one, with this dead-letter layer and this breaker.
fn five_layers_of(
    dead_letters: DeadLetterLayer,
    breaker: BreakerLayer,
) -> impl Service<Req, Error: Debug> + Clone + Send + 'static {
    ServiceBuilder::new()
        .layer(dead_letters)
        .layer(RetryLayer::default())
        .layer(breaker)
        .layer(ClassifyLayer::new(all_ok::<Req>))
        .layer(TimeoutLayer::new(TIMEOUT))
        .service(bare())
}

/// Our five layers as the preset builds them with a store: the dead-letter and retry layers
/// share one request copy.
fn five_layers_shared_copy() -> impl Service<Req, Error: Debug> + Clone + Send + 'static {
    BackstopLayer::new(all_ok::<Req>, TIMEOUT)
        .breaker(BreakerLayer::new())
        .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
        .layer(bare())
}

/// What the `Metrics` listener cannot do without on a successful call, measured alone.
#[cfg(feature = "metrics")]
enum Floor {
    /// The attempt's start and end on tokio's clock.
    Clock,
    /// The records of a successful call without a retry, on handles registered once: the
    /// attempt's counter, its duration, the call's counter.
    Records(metrics::Counter, metrics::Histogram, metrics::Counter),
}

#[cfg(feature = "metrics")]
impl Floor {
    fn records() -> Self {
        Floor::Records(
            metrics::counter!("floor_attempts_total", "class" => "success", "sent" => "true"),
            metrics::histogram!("floor_attempt_duration_seconds", "class" => "success"),
            metrics::counter!("floor_calls_total", "outcome" => "success_without_retry"),
        )
    }
}

#[cfg(feature = "metrics")]
impl Call for Floor {
    #[inline]
    async fn call_once(&mut self) {
        match self {
            Floor::Clock => {
                let start = black_box(tokio::time::Instant::now());
                black_box(start.elapsed());
            }
            Floor::Records(attempts, duration, calls) => {
                attempts.increment(1);
                duration.record(black_box(0.000_1));
                calls.increment(1);
            }
        }
    }
}

/// The preset as `five_layers_shared_copy` builds it, with `listener`.
fn preset_listening(
    listener: impl tower_backstop::observe::Listener,
) -> impl Service<Req, Error: Debug> + Clone + Send + 'static {
    BackstopLayer::new(all_ok::<Req>, TIMEOUT)
        .breaker(BreakerLayer::new())
        .listener(listener)
        .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
        .layer(bare())
}

/// tower's retry around tower's timeout: the part of the stack tower has.
fn tower_retry_timeout() -> impl Service<Req, Error: Debug> + Clone + Send + 'static {
    ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryErrors::attempts(3)))
        .layer(tower::timeout::TimeoutLayer::new(TIMEOUT))
        .service(bare())
}

/// Times `iters` calls inside one `block_on`.
fn run<C: Call>(rt: &Runtime, b: &mut Bencher<'_>, c: &mut C) {
    b.iter_custom(|iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                c.call_once().await;
            }
            start.elapsed()
        })
    });
}

/// Counts allocations per call over 10,000 calls after a warm-up, and prints them.
fn count<C: Call>(rt: &Runtime, name: &str, c: &mut C) {
    let per_call = rt.block_on(async {
        for _ in 0..100 {
            c.call_once().await;
        }
        let before = allocations();
        for _ in 0..10_000 {
            c.call_once().await;
        }
        (allocations() - before) as f64 / 10_000.0
    });
    println!("allocations/call {name}: {per_call}");
}

/// Counts, then times, one entry of `group`.
fn entry<C: Call>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    name: &str,
    mut c: C,
) {
    count(rt, &format!("overhead/{name}"), &mut c);
    group.bench_function(name, |b| run(rt, b, &mut c));
}

fn overhead(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("overhead");
    entry(&mut group, &rt, "bare", Tower(bare()));

    entry(
        &mut group,
        &rt,
        "timeout/backstop",
        Tower(TimeoutLayer::new(TIMEOUT).layer(bare())),
    );
    entry(
        &mut group,
        &rt,
        "timeout/tower",
        Tower(tower::timeout::TimeoutLayer::new(TIMEOUT).layer(bare())),
    );

    entry(
        &mut group,
        &rt,
        "retry/backstop",
        Tower(RetryLayer::default().layer(bare())),
    );
    // The same policy, edited and built: it costs what the default costs (a retrying call keeps a
    // reference to the shared policy either way).
    entry(
        &mut group,
        &rt,
        "retry/backstop_edited_policy",
        Tower(
            RetryPolicy::new()
                .max_attempts(3)
                .build()
                .unwrap()
                .layer(bare()),
        ),
    );
    entry(
        &mut group,
        &rt,
        "retry/tower",
        Tower(tower::retry::RetryLayer::new(RetryErrors::attempts(3)).layer(bare())),
    );
    entry(
        &mut group,
        &rt,
        "retry/tower_resilience",
        Tower(resilience_retry().layer(bare())),
    );

    entry(
        &mut group,
        &rt,
        "breaker/backstop",
        Tower(BreakerLayer::new().layer(bare())),
    );
    entry(
        &mut group,
        &rt,
        "breaker/failsafe",
        FailsafeCall(failsafe(), bare()),
    );
    entry(
        &mut group,
        &rt,
        "breaker/tower_resilience",
        Tower(resilience_breaker().layer(bare())),
    );

    entry(
        &mut group,
        &rt,
        "classify/backstop",
        Tower(ClassifyLayer::new(all_ok::<Req>).layer(bare())),
    );
    entry(
        &mut group,
        &rt,
        "dead_letter/backstop",
        Tower(DeadLetterLayer::new(MemoryStore::new()).layer(bare())),
    );

    entry(
        &mut group,
        &rt,
        "stack/backstop_five_layers",
        Tower(five_layers()),
    );
    entry(
        &mut group,
        &rt,
        "stack/backstop_five_layers_shared_copy",
        Tower(five_layers_shared_copy()),
    );
    entry(
        &mut group,
        &rt,
        "stack/tower_retry_timeout",
        Tower(tower_retry_timeout()),
    );
    // The preset with a listener that does nothing: what the events cost before any recording
    // (the attempt's two clock reads, making the event, handing it over).
    entry(
        &mut group,
        &rt,
        "stack/backstop_preset_noop_listener",
        Tower(preset_listening(())),
    );
    // The preset with the `Metrics` listener, recording into a Prometheus recorder: beside
    // `stack/backstop_five_layers_shared_copy`, the same stack without it.
    #[cfg(feature = "metrics")]
    {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("the first recorder of this process");
        // The floor under the `Metrics` listener, outside any layer: what a successful call
        // without a retry must pay for with this recorder (its attempt's two reads of tokio's
        // clock, and the three records the metric table asks of it).
        entry(&mut group, &rt, "floor/tokio_clock_two_reads", Floor::Clock);
        entry(
            &mut group,
            &rt,
            "floor/prometheus_records_of_a_call",
            Floor::records(),
        );
        entry(
            &mut group,
            &rt,
            "stack/backstop_preset_metrics",
            Tower(preset_listening(tower_backstop::observe::Metrics::new())),
        );
    }
    group.finish();
}

/// Two threads, each with its own runtime and its own clone of one stack (shared breaker,
/// store and policy); the time is the wall time for `iters` calls split between them.
fn run_2_threads<C>(b: &mut Bencher<'_>, c: &C)
where
    C: Call + Clone + Send,
{
    let runtimes = [runtime(), runtime()];
    b.iter_custom(|iters| {
        let half = iters / 2 + 1;
        let start = Instant::now();
        std::thread::scope(|s| {
            for rt in &runtimes {
                let mut c = c.clone();
                s.spawn(move || {
                    rt.block_on(async {
                        for _ in 0..half {
                            c.call_once().await;
                        }
                    })
                });
            }
        });
        start.elapsed()
    });
}

fn overhead_2_threads(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("overhead_2_threads");
    let stacks = [
        ("bare", None),
        ("stack/backstop_five_layers", Some(false)),
        ("stack/backstop_five_layers_shared_copy", Some(true)),
    ];
    for (name, shared) in stacks {
        // The same stack on one thread, then on two, in the same group.
        match shared {
            None => {
                let mut one = Tower(bare());
                group.bench_function(format!("{name}/1_thread"), |b| run(&rt, b, &mut one));
                group.bench_function(format!("{name}/2_threads"), |b| run_2_threads(b, &one));
            }
            Some(false) => {
                let mut one = Tower(five_layers());
                group.bench_function(format!("{name}/1_thread"), |b| run(&rt, b, &mut one));
                group.bench_function(format!("{name}/2_threads"), |b| run_2_threads(b, &one));
            }
            Some(true) => {
                let mut one = Tower(five_layers_shared_copy());
                group.bench_function(format!("{name}/1_thread"), |b| run(&rt, b, &mut one));
                group.bench_function(format!("{name}/2_threads"), |b| run_2_threads(b, &one));
            }
        }
    }
    let mut one = Tower(tower_retry_timeout());
    group.bench_function("stack/tower_retry_timeout/1_thread", |b| {
        run(&rt, b, &mut one)
    });
    group.bench_function("stack/tower_retry_timeout/2_threads", |b| {
        run_2_threads(b, &one)
    });
    group.finish();
}

criterion_group!(benches, overhead, overhead_2_threads);
criterion_main!(benches);
