//! The hot path allocates nothing (DESIGN §9): a counting global allocator proves it per layer
//! (the server flavours too), for the whole stack of five, and for the `BackstopLayer` preset.
//!
//! Allocations are counted per thread (a `const` thread-local, so counting never allocates
//! itself), and each test drives its service on its own `current_thread` runtime, whose
//! `block_on` runs on the test thread: tests running in parallel do not see each other's
//! allocations. Each case is warmed up first (thread-locals, tokio's context, `tracing`
//! callsites), then counted over [`CALLS`] calls made with `poll_ready` + `call`, and compared
//! with the bare inner service driven the same way.

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::{Ready, poll_fn, ready};
use std::hint::black_box;
use std::pin::pin;
use std::time::Duration;

use tower::{Layer, Service, ServiceBuilder, service_fn};
use tower_backstop::breaker::{AdaptiveConcurrency, BreakerLayer, State};
use tower_backstop::classify::{ClassifyLayer, HttpClassifier, Verdict};
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::failover::FailoverLayer;
use tower_backstop::retry::{Budget, Delivery, RetryLayer, RetryPolicy};
use tower_backstop::server::ServerLayer;
use tower_backstop::store::MemoryStore;
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, BoxError, Class, Code, Failure};

#[path = "support/counting.rs"]
mod counting;

use counting::allocations;

/// Calls made before counting.
const WARM_UP: u64 = 100;
/// Calls counted.
const CALLS: u64 = 1_000;

/// The request: `&'static str` is `Replay` and `Describe`, and free to copy.
const REQUEST: &str = "hello";

type Req = &'static str;

/// A `service_fn` that is ready at once and answers `T` at once.
type Bare<T> = tower::util::ServiceFn<fn(Req) -> Answer<T>>;
type Answer<T> = Ready<Result<T, BoxError>>;

/// The bare inner service: ready at once, answers at once, allocates nothing.
fn bare() -> Bare<Req> {
    service_fn(|req: Req| ready(Ok(req)))
}

/// A bare inner service answering an `http::Response<()>`.
fn bare_http() -> Bare<http::Response<()>> {
    service_fn(|_: Req| ready(Ok(http::Response::new(()))))
}

/// A closure classifier that calls every response a success.
fn all_ok<R>(_: &R) -> Option<Verdict> {
    None
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current_thread runtime")
}

/// One call: `poll_ready`, then `call`, the response future pinned in place and awaited.
async fn call_once<S>(svc: &mut S) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    poll_fn(|cx| svc.poll_ready(cx)).await?;
    let future = pin!(svc.call(REQUEST));
    future.await
}

/// Warms `svc` up, then returns the allocations of [`CALLS`] successful calls.
fn count<S>(mut svc: S) -> u64
where
    S: Service<Req>,
    S::Error: Debug,
{
    runtime().block_on(async move {
        for _ in 0..WARM_UP {
            black_box(call_once(&mut svc).await.expect("warm-up call succeeds"));
        }
        let before = allocations();
        for _ in 0..CALLS {
            black_box(call_once(&mut svc).await.expect("counted call succeeds"));
        }
        allocations() - before
    })
}

/// Asserts that `svc` allocates exactly as much as the bare service `base` over [`CALLS`] calls.
#[track_caller]
fn assert_adds_nothing<S, B>(case: &str, base: B, svc: S)
where
    S: Service<Req>,
    S::Error: Debug,
    B: Service<Req>,
    B::Error: Debug,
{
    let bare = count(base);
    let layered = count(svc);
    println!(
        "{case}: bare {bare} allocations, layered {layered} allocations over {CALLS} calls \
         ({} per call added)",
        (layered as f64 - bare as f64) / CALLS as f64
    );
    assert_eq!(
        layered, bare,
        "{case}: the success path allocates {layered} times over {CALLS} calls, the bare \
         service {bare} times"
    );
}

// The harness itself: the counter sees allocations, and sees them inside a driven call.

#[test]
fn counter_counts_this_threads_allocations() {
    let before = allocations();
    let boxed = black_box(Box::new(7u64));
    let after = allocations();
    drop(boxed);
    assert_eq!(after - before, 1);
}

#[test]
fn counter_sees_an_allocating_service() {
    let allocating = service_fn(|req: Req| ready(Ok::<_, BoxError>(String::from(req))));
    assert_eq!(count(allocating), CALLS);
}

#[test]
fn counter_sees_an_allocating_layer() {
    // tower's `BoxService` boxes each response future: one allocation per call.
    let boxed = tower::util::BoxService::new(bare());
    assert_eq!(count(boxed), CALLS);
}

// The bare services the layers are compared with.

#[test]
fn bare_services_allocate_nothing() {
    assert_eq!(count(bare()), 0, "bare service_fn");
    // `http::Response::new(())` builds an empty `HeaderMap` and no extensions: no allocation,
    // so the HTTP cases are a strict zero too.
    assert_eq!(
        count(bare_http()),
        0,
        "bare service_fn answering http::Response<()>"
    );
}

// Each layer alone.

#[cfg(feature = "chaos")]
#[test]
fn chaos_disabled_or_drawing_nothing() {
    use tower_backstop::chaos::{ChaosLayer, Fault};
    // Built disabled: one atomic load per call.
    let layer = ChaosLayer::builder()
        .fault(1.0, Fault::status(503))
        .build()
        .unwrap();
    assert_adds_nothing(
        "ChaosLayer (disabled)",
        bare_http(),
        layer.layer(bare_http()),
    );
    // Enabled, with a draw per call that hits no fault.
    let layer = ChaosLayer::builder()
        .fault(0.0, Fault::status(503))
        .enabled(true)
        .build()
        .unwrap();
    assert_adds_nothing(
        "ChaosLayer (enabled, no fault drawn)",
        bare_http(),
        layer.layer(bare_http()),
    );
}

/// A hedged call allocates twice, whatever its copies: the failure path's record and one block
/// for the copies under way (their futures inline), beside the request's copy (free for
/// `&'static str`). The same slow call unhedged allocates nothing.
#[test]
fn a_hedged_call_allocates_the_record_and_the_copies_block() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    // Every other call (the first attempt of each request) takes 1 s; its copy answers at once.
    fn slow_then_fast(
        calls: Arc<AtomicU64>,
    ) -> impl Service<Req, Response = Req, Error = BoxError> + Clone {
        service_fn(move |req: Req| {
            let slow = calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
            async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok::<_, BoxError>(req)
            }
        })
    }
    let count_paused = |policy: RetryPolicy, calls: Arc<AtomicU64>| {
        let mut svc = ServiceBuilder::new()
            .layer(policy.build().unwrap())
            .layer(ClassifyLayer::new(all_ok::<Req>))
            .service(slow_then_fast(calls));
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async move {
                for _ in 0..10 {
                    call_once(&mut svc).await.unwrap();
                }
                let before = allocations();
                for _ in 0..100 {
                    call_once(&mut svc).await.unwrap();
                }
                allocations() - before
            })
    };
    let calls = Arc::new(AtomicU64::new(0));
    let hedged = count_paused(
        RetryPolicy::new().hedge(Duration::from_millis(100), 1),
        calls.clone(),
    );
    assert_eq!(calls.load(Ordering::Relaxed), 220, "each call sent a copy");
    // Unhedged, every call is the slow one (the counter moves by one per call).
    let calls = Arc::new(AtomicU64::new(0));
    let unhedged = count_paused(RetryPolicy::new(), calls.clone());
    println!("100 calls: hedged {hedged} allocations, unhedged {unhedged}");
    assert_eq!(unhedged, 0);
    assert_eq!(hedged, 200);
}

#[test]
fn timeout_alone() {
    let svc = TimeoutLayer::new(Duration::from_secs(30)).layer(bare());
    assert_adds_nothing("TimeoutLayer", bare(), svc);
}

#[test]
fn classify_closure_alone() {
    let svc = ClassifyLayer::new(all_ok::<Req>).layer(bare());
    assert_adds_nothing("ClassifyLayer(fn)", bare(), svc);
    let svc = ClassifyLayer::new(|_: &Req| -> Option<Verdict> { None }).layer(bare());
    assert_adds_nothing("ClassifyLayer(closure)", bare(), svc);
}

#[test]
fn classify_http_alone() {
    let svc = ClassifyLayer::http().layer(bare_http());
    assert_adds_nothing("ClassifyLayer::http()", bare_http(), svc);
    // Overrides are built once and shared: classifying still allocates nothing.
    let classifier = HttpClassifier::new()
        .success(http::StatusCode::CONFLICT)
        .map_status(
            http::StatusCode::UNPROCESSABLE_ENTITY,
            Class::new("invalid_recipient"),
        );
    let svc = ClassifyLayer::new(classifier).layer(bare_http());
    assert_adds_nothing(
        "ClassifyLayer(HttpClassifier with overrides)",
        bare_http(),
        svc,
    );
}

/// What a bare handler answers.
type Handled = Ready<Result<http::Response<()>, Infallible>>;

/// A bare infallible inner service answering an `http::Response<()>`, as a server's handlers.
type Handler = tower::util::ServiceFn<fn(http::Request<()>) -> Handled>;

fn handler() -> Handler {
    service_fn(|_: http::Request<()>| ready(Ok(http::Response::new(()))))
}

/// Our request made an `http::Request<()>`, which allocates nothing.
type ToHttp = fn(Req) -> http::Request<()>;

/// Our request, made an `http::Request<()>` for `svc`.
fn from_req<S>(svc: S) -> tower::util::MapRequest<S, ToHttp> {
    tower::util::MapRequest::new(svc, |_: Req| http::Request::new(()))
}

/// The bare handler, taking our request.
fn bare_handler() -> tower::util::MapRequest<Handler, ToHttp> {
    from_req(handler())
}

#[test]
fn server_layer_alone() {
    let timeout = || ServerLayer::new().timeout(Duration::from_secs(30));
    let svc = timeout().layer(handler());
    assert_adds_nothing("ServerLayer timeout", bare_handler(), from_req(svc));
    let svc = ServerLayer::new()
        .breaker(BreakerLayer::new())
        .layer(handler());
    assert_adds_nothing("ServerLayer breaker", bare_handler(), from_req(svc));
    let layer = timeout().breaker(BreakerLayer::new());
    let handle = layer.handle().expect("a breaker");
    assert_adds_nothing(
        "ServerLayer both",
        bare_handler(),
        from_req(layer.layer(handler())),
    );
    assert_eq!(handle.state(), State::Closed);
    let svc = ServerLayer::grpc()
        .timeout(Duration::from_secs(30))
        .breaker(BreakerLayer::new())
        .layer(handler());
    assert_adds_nothing("ServerLayer::grpc both", bare_handler(), from_req(svc));
}

#[test]
fn breaker_alone() {
    let layer = BreakerLayer::new();
    let handle = layer.handle();
    let svc = layer.layer(bare());
    assert_adds_nothing("BreakerLayer", bare(), svc);
    assert_eq!(handle.state(), State::Closed);
}

#[test]
fn breaker_with_its_concurrency_limit_off_or_on_allocates_nothing() {
    // Off until the provider signals overload: one atomic load a call, nothing counted.
    let layer = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .build()
        .expect("a valid configuration");
    let handle = layer.handle();
    assert_adds_nothing(
        "BreakerLayer (concurrency limit off)",
        bare(),
        layer.layer(bare()),
    );
    assert_eq!(handle.concurrency_limit(), None);
    assert_eq!(handle.in_flight(), None);

    // On, after one throttled answer: each call is counted in flight, and still allocates
    // nothing (the calls here stay within the limit).
    let layer = BreakerLayer::builder()
        .without_adaptive_rate()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .build()
        .expect("a valid configuration");
    let handle = layer.handle();
    runtime().block_on(async {
        let mut throttled = layer.layer(service_fn(|_: Req| {
            ready(Err::<Req, _>(Failure::<Req>::new(
                Class::THROTTLED,
                Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            )))
        }));
        let failure = call_once(&mut throttled).await.expect_err("throttled");
        assert_eq!(failure.class(), Class::THROTTLED);
    });
    assert_adds_nothing(
        "BreakerLayer (concurrency limit on)",
        bare(),
        layer.layer(bare()),
    );
    // Measured at 1 (one call in flight), grown to 3 (calls that use half of it grow it).
    assert_eq!(handle.concurrency_limit(), Some(3));
    assert_eq!(handle.in_flight(), Some(0));
}

#[test]
fn breaker_with_rate_rules_alone() {
    // A count window with failure-rate and slow-call rules: the window is built with the layer;
    // recording a call (and reading the clock for the slow-call rule) allocates nothing.
    let layer = BreakerLayer::builder()
        .failure_rate(0.5)
        .slow_calls(Duration::from_secs(1), 0.5)
        .count_window(100)
        .minimum_calls(10)
        .build()
        .expect("a valid configuration");
    let handle = layer.handle();
    assert_adds_nothing("BreakerLayer (count window)", bare(), layer.layer(bare()));
    assert_eq!(handle.stats().window_calls, 100);

    let layer = BreakerLayer::builder()
        .failure_rate(0.5)
        .time_window(Duration::from_secs(1), 10)
        .build()
        .expect("a valid configuration");
    assert_adds_nothing("BreakerLayer (time window)", bare(), layer.layer(bare()));
}

#[test]
fn failover_closed_path_alone() {
    let layer = FailoverLayer::new(BreakerLayer::new(), bare());
    assert_adds_nothing(
        "FailoverLayer (primary closed)",
        bare(),
        layer.layer(bare()),
    );
}

#[test]
fn retry_alone() {
    let svc = RetryLayer::default().layer(bare());
    assert_adds_nothing("RetryLayer::default()", bare(), svc);
}

#[test]
fn retry_with_a_token_bucket_budget() {
    let policy = RetryPolicy::new().budget(Budget::token_bucket(10, 0.1).unwrap());
    let svc = policy.build().unwrap().layer(bare());
    assert_adds_nothing("RetryLayer with a token-bucket budget", bare(), svc);
}

#[test]
fn retry_with_a_ratio_budget_and_a_deadline() {
    let policy = RetryPolicy::new()
        .budget(Budget::ratio(0.2, 10, Duration::from_secs(10)).unwrap())
        .deadline(Duration::from_secs(30));
    let svc = policy.build().unwrap().layer(bare());
    assert_adds_nothing("RetryLayer with a ratio budget and a deadline", bare(), svc);
}

#[test]
fn retry_with_a_single_attempt() {
    let svc = RetryPolicy::new()
        .max_attempts(1)
        .build()
        .unwrap()
        .layer(bare());
    assert_adds_nothing("RetryLayer with max_attempts(1)", bare(), svc);
}

#[test]
fn retry_with_a_status_check() {
    // A request safe to resend is never checked: the option costs it nothing.
    let policy = RetryPolicy::new().reconcile::<Req, http::Response<()>>(
        |_: tower_backstop::Envelope| async { Delivery::Unknown },
    );
    let svc = policy.build().unwrap().layer(bare_http());
    assert_adds_nothing("RetryLayer with a status check", bare_http(), svc);
}

/// A request that is not safe to send twice (a keyless POST, say), free to copy.
#[derive(Clone, Copy, Debug)]
struct NotSafe(&'static str);

impl tower_backstop::Replay for NotSafe {
    fn replay(&self) -> Option<Self> {
        Some(*self)
    }

    fn retry_safe(&self) -> bool {
        false
    }
}

impl tower_backstop::Describe for NotSafe {
    async fn describe(self) -> tower_backstop::Envelope {
        tower_backstop::Envelope::new(self.0)
    }
}

#[test]
fn retry_with_a_status_check_on_requests_not_safe_to_resend() {
    // The request is watched (a counted reference to the check, a copy of the request kept),
    // but the check runs only on an outcome-unknown failure: a success allocates nothing.
    fn count_not_safe<S>(mut svc: S) -> u64
    where
        S: Service<NotSafe>,
        S::Error: Debug,
    {
        runtime().block_on(async move {
            let mut once = async || {
                poll_fn(|cx| svc.poll_ready(cx)).await.expect("ready");
                let future = pin!(svc.call(NotSafe(REQUEST)));
                black_box(future.await.expect("the call succeeds"));
            };
            for _ in 0..WARM_UP {
                once().await;
            }
            let before = allocations();
            for _ in 0..CALLS {
                once().await;
            }
            allocations() - before
        })
    }
    let bare = || service_fn(|_: NotSafe| ready(Ok::<_, BoxError>(())));
    let policy = RetryPolicy::new()
        .reconcile::<NotSafe, ()>(|_: tower_backstop::Envelope| async { Delivery::Unknown });
    let base = count_not_safe(bare());
    let layered = count_not_safe(policy.build().unwrap().layer(bare()));
    assert_eq!(
        layered, base,
        "the success path allocates {layered} times over {CALLS} calls, the bare service {base}"
    );
}

#[test]
fn dead_letter_alone() {
    let store = MemoryStore::new();
    let svc = DeadLetterLayer::new(store).layer(bare());
    assert_adds_nothing("DeadLetterLayer(MemoryStore)", bare(), svc);
}

// The whole stack, outermost first: DeadLetter → Retry → Breaker → Classify → Timeout.

/// The five layers around `bare()`, with this dead-letter layer and this breaker.
fn stack_of(
    dead_letters: DeadLetterLayer,
    breaker: BreakerLayer,
) -> impl Service<Req, Response = Req, Error: Debug> {
    ServiceBuilder::new()
        .layer(dead_letters)
        .layer(RetryLayer::default())
        .layer(breaker)
        .layer(ClassifyLayer::new(all_ok::<Req>))
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .service(bare())
}

#[test]
fn whole_stack() {
    let svc = stack_of(
        DeadLetterLayer::new(MemoryStore::new()),
        BreakerLayer::new(),
    );
    assert_adds_nothing("whole stack (closure classifier)", bare(), svc);
}

#[test]
fn whole_stack_http() {
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(MemoryStore::new()))
        .layer(RetryLayer::default())
        .layer(BreakerLayer::new())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .service(bare_http());
    assert_adds_nothing("whole stack (HttpClassifier)", bare_http(), svc);
}

// The failure side: an open breaker's rejection allocates only the `Failure`'s box, which holds
// the `OpenError` naming the breaker (the name itself is an `Arc<str>` clone). Exactly 1 per
// rejection, whatever the number of rejections.

#[test]
fn open_breaker_rejects_with_one_allocation() {
    let layer = BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(3600));
    let handle = layer.handle();
    runtime().block_on(async {
        // Trip it: one failure of a class that counts.
        let mut failing = layer.layer(service_fn(|_: Req| {
            ready(Err::<Req, _>(Failure::<Req>::new(
                Class::TRANSIENT,
                Code::Error,
            )))
        }));
        let failure = call_once(&mut failing).await.expect_err("the call fails");
        assert_eq!(failure.class(), Class::TRANSIENT);
        assert_eq!(handle.state(), State::Open);

        // A service that would succeed, behind the same (open) breaker.
        let mut svc = layer.layer(bare());
        let reject = async |svc: &mut _| {
            let failure: Failure<Req> = call_once(svc).await.expect_err("an open breaker rejects");
            assert_eq!(failure.class(), Class::CIRCUIT_OPEN);
            assert_eq!(failure.code(), Code::CircuitOpen);
            assert!(
                failure
                    .retry_after()
                    .is_some_and(|left| left > Duration::ZERO)
            );
            black_box(failure);
        };
        for _ in 0..WARM_UP {
            reject(&mut svc).await;
        }
        let rejected_before = handle.stats().rejected;
        let before = allocations();
        for _ in 0..CALLS {
            reject(&mut svc).await;
        }
        let allocated = allocations() - before;
        assert_eq!(handle.stats().rejected - rejected_before, CALLS);
        println!("BreakerLayer open rejection: {allocated} allocations over {CALLS} calls");
        assert_eq!(
            allocated, CALLS,
            "an open breaker's rejection allocates {allocated} times over {CALLS} calls"
        );
    });
}

// A real HTTP request is not free to copy: cloning an `http::Request` with headers allocates
// (the `HeaderMap`). The stack's only extra cost is then the copies `Replay` makes: one kept by
// the dead-letter layer, one spare held by the retry layer. Nothing else may allocate.

type HttpReq = http::Request<http_body_util::Full<bytes::Bytes>>;

fn http_request() -> HttpReq {
    http::Request::post("http://mail.test/v1/messages")
        .header("idempotency-key", "msg-1")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("a valid request")
}

/// Allocations of [`CALLS`] calls of `svc`, each with a fresh copy of `req` made outside the
/// count.
fn count_http<S>(mut svc: S, req: &HttpReq) -> u64
where
    S: Service<HttpReq>,
    S::Error: Debug,
{
    runtime().block_on(async move {
        let mut counted = 0;
        for i in 0..WARM_UP + CALLS {
            let copy = req.clone();
            poll_fn(|cx| svc.poll_ready(cx)).await.expect("ready");
            let before = allocations();
            let future = pin!(svc.call(copy));
            black_box(future.await.expect("call succeeds"));
            if i >= WARM_UP {
                counted += allocations() - before;
            }
        }
        counted
    })
}

#[test]
fn whole_stack_with_http_request_adds_only_the_replay_copies() {
    let req = http_request();
    // The first copy may convert the URI's `Bytes` to shared storage; count copies after it.
    black_box(tower_backstop::Replay::replay(&req));
    let before = allocations();
    for _ in 0..CALLS {
        black_box(tower_backstop::Replay::replay(&req));
    }
    let copies = allocations() - before;
    assert!(copies > 0, "a request with headers allocates when copied");
    assert_eq!(copies % CALLS, 0, "every copy allocates the same");
    let per_copy = copies / CALLS;

    let bare = || service_fn(|_: HttpReq| ready(Ok::<_, BoxError>(http::Response::new(()))));
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(MemoryStore::new()))
        .layer(RetryLayer::default())
        .layer(BreakerLayer::new())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .service(bare());
    let bare = count_http(bare(), &req);
    let layered = count_http(stack, &req);
    let added = layered - bare;
    println!(
        "whole stack, http::Request with 2 headers: {} allocations per call added \
         ({per_copy} per request copy)",
        added as f64 / CALLS as f64
    );
    // Two copies per call when the layers are stacked one by one: the dead-letter layer's kept
    // copy and the retry layer's spare. `DeadLetterRetryLayer` shares one (tested below).
    assert!(
        added <= 2 * per_copy * CALLS,
        "the stack allocates {added} times over {CALLS} calls, more than its two request \
         copies ({per_copy} allocations each)"
    );
}

/// The five layers as the preset builds them with a store (the dead-letter and retry layers
/// sharing one request copy), with one breaker for all hosts, over `inner`.
fn five_layers_sharing_one_copy<S>(
    inner: S,
) -> tower_backstop::Backstop<S, HttpClassifier, BreakerLayer>
where
    BreakerLayer: Layer<tower_backstop::classify::Classify<TimeoutLayerService<S>, HttpClassifier>>,
{
    BackstopLayer::http(Duration::from_secs(30))
        .breaker(BreakerLayer::new())
        .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
        .layer(inner)
}

type TimeoutLayerService<S> = tower_backstop::timeout::Timeout<S>;

#[test]
fn whole_stack_sharing_one_copy_allocates_nothing_with_a_cheap_request() {
    assert_adds_nothing(
        "whole stack, preset sharing one copy (HttpClassifier)",
        bare_http(),
        five_layers_sharing_one_copy(bare_http()),
    );
}

#[test]
fn whole_stack_sharing_one_copy_copies_an_http_request_once() {
    let req = http_request();
    black_box(tower_backstop::Replay::replay(&req));
    let before = allocations();
    black_box(tower_backstop::Replay::replay(&req));
    let per_copy = allocations() - before;
    assert_eq!(
        per_copy, 2,
        "a 2-header request's copy allocates its HeaderMap twice"
    );

    let bare = || service_fn(|_: HttpReq| ready(Ok::<_, BoxError>(http::Response::new(()))));
    let bare_count = count_http(bare(), &req);
    let layered = count_http(five_layers_sharing_one_copy(bare()), &req);
    let added = layered - bare_count;
    println!(
        "whole stack sharing one copy, http::Request with 2 headers: {} allocations per call \
         added",
        added as f64 / CALLS as f64
    );
    // One copy per call: the retry layer's spare, which the dead-letter layer would reuse.
    assert!(
        added <= 2 * CALLS,
        "the stack allocates {added} times over {CALLS} calls: more than one request copy (2)"
    );
    assert!(added > 0, "the retry layer's spare is a real copy");
}

#[test]
fn failover_to_the_fallback_allocates_nothing() {
    let breaker = BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(3600));
    let handle = breaker.handle();
    runtime().block_on(async {
        let mut failing = breaker.layer(service_fn(|_: Req| {
            ready(Err::<Req, _>(Failure::<Req>::new(
                Class::TRANSIENT,
                Code::Error,
            )))
        }));
        let _ = call_once(&mut failing).await;
    });
    assert_eq!(handle.state(), State::Open);
    let svc = FailoverLayer::new(breaker, bare()).layer(bare());
    assert_adds_nothing("FailoverLayer (primary open, fallback called)", bare(), svc);
    assert!(handle.stats().rejected >= CALLS);
}

// reqwest (feature `reqwest`): the adapters add nothing beyond the one copy of the request a
// retry needs, which costs exactly what reqwest's own `try_clone` costs.

#[cfg(feature = "reqwest")]
#[test]
fn reqwest_stack_adds_only_the_replay_copy() {
    use tower_backstop::Replay;

    type Answer = Ready<Result<reqwest::Response, reqwest::Error>>;
    fn answer(_: reqwest::Request) -> Answer {
        ready(Ok(reqwest::Response::from(http::Response::new(""))))
    }
    let template = reqwest::Client::new()
        .put("http://127.0.0.1:1/v1/messages")
        .header("idempotency-key", "k-1")
        .body("hello")
        .build()
        .unwrap();

    // A copy by `Replay` costs what `try_clone` costs (after a first copy, which may initialise
    // something once).
    black_box(template.try_clone());
    let before = allocations();
    black_box(template.try_clone());
    let try_clone = allocations() - before;
    let before = allocations();
    black_box(template.replay());
    assert_eq!(allocations() - before, try_clone);

    // Classifying a reqwest response, success or failure with a hint, allocates nothing.
    let ok = reqwest::Response::from(http::Response::new(""));
    let busy = reqwest::Response::from(
        http::Response::builder()
            .status(429)
            .header("retry-after", "2")
            .body("")
            .unwrap(),
    );
    let classifier = HttpClassifier::new();
    let before = allocations();
    for _ in 0..CALLS {
        black_box(tower_backstop::classify::Classifier::classify_response(
            &classifier,
            &ok,
        ));
        black_box(tower_backstop::classify::Classifier::classify_response(
            &classifier,
            &busy,
        ));
    }
    assert_eq!(allocations() - before, 0);

    // The whole stack against the bare service, each driven over the same requests.
    fn run<S>(mut svc: S, template: &reqwest::Request) -> u64
    where
        S: Service<reqwest::Request, Response = reqwest::Response>,
        S::Error: Debug,
    {
        runtime().block_on(async move {
            let mut total = 0;
            for i in 0..WARM_UP + CALLS {
                let request = template.try_clone().unwrap();
                let before = allocations();
                poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
                black_box(pin!(svc.call(request)).await.unwrap());
                if i >= WARM_UP {
                    total += allocations() - before;
                }
            }
            total
        })
    }
    let bare = run(service_fn(answer), &template);
    let stack = run(
        ServiceBuilder::new()
            .layer(RetryPolicy::new().build().unwrap())
            .layer(BreakerLayer::consecutive_failures(5))
            .layer(ClassifyLayer::http())
            .layer(TimeoutLayer::new(Duration::from_secs(1)))
            .service(service_fn(answer)),
        &template,
    );
    println!(
        "reqwest: bare {bare}, stack {stack} allocations over {CALLS} calls; try_clone {try_clone}"
    );
    assert_eq!(stack, bare + CALLS * try_clone);
}

// tonic (feature `tonic`): `GrpcLayer`'s buffering and the retry copy of the buffered request.

#[cfg(feature = "tonic")]
#[test]
fn grpc_stack_adds_only_the_replay_copy() {
    use tower_backstop::classify::GrpcClassifier;
    use tower_backstop::{GrpcLayer, GrpcRequest, Replay};

    type Response = http::Response<tonic::body::Body>;
    fn ok() -> Response {
        // An empty tonic body allocates nothing.
        http::Response::new(tonic::body::Body::empty())
    }
    fn bare(_: http::Request<tonic::body::Body>) -> Ready<Result<Response, BoxError>> {
        ready(Ok(ok()))
    }
    fn inner(_: GrpcRequest) -> Ready<Result<Response, BoxError>> {
        ready(Ok(ok()))
    }
    /// A unary call's request: one length-prefixed message, gRPC headers.
    fn request() -> http::Request<tonic::body::Body> {
        http::Request::post("http://127.0.0.1:1/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"\0\0\0\0\x02\x0a\0"),
            )))
            .unwrap()
    }
    fn run<S>(mut svc: S) -> u64
    where
        S: Service<http::Request<tonic::body::Body>, Response = Response>,
        S::Error: Debug,
    {
        runtime().block_on(async move {
            let mut total = 0;
            for i in 0..WARM_UP + CALLS {
                let request = request();
                let before = allocations();
                poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
                black_box(pin!(svc.call(request)).await.unwrap());
                if i >= WARM_UP {
                    total += allocations() - before;
                }
            }
            total
        })
    }

    let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
    let keep = slot.clone();
    let mut svc = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .service(service_fn(move |req: GrpcRequest| {
            *keep.lock().unwrap() = Some(req);
            ready(Ok::<_, Failure<Response>>(ok()))
        }));
    runtime().block_on(async {
        poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        svc.call(request()).await.unwrap();
    });
    let buffered: GrpcRequest = slot.lock().unwrap().take().unwrap();
    // The first copy of a freshly buffered request (its header map, and the body's bytes made
    // shareable), as the retry layer makes on each call.
    let before = allocations();
    black_box(buffered.replay());
    let copy = allocations() - before;

    let bare = run(service_fn(bare));
    let stack = run(ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(RetryPolicy::new().assume_idempotent(true).build().unwrap())
        .layer(BreakerLayer::consecutive_failures(5))
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(service_fn(inner)));
    fn inner_failure(_: GrpcRequest) -> Ready<Result<Response, Failure<Response>>> {
        ready(Ok(ok()))
    }
    // Buffering the body of a unary call allocates nothing (one chunk is kept as it is).
    let alone = run(ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .service(service_fn(inner_failure)));
    assert_eq!(alone, bare, "GrpcLayer alone");
    println!("grpc: bare {bare}, stack {stack} allocations over {CALLS} calls; one copy {copy}");
    assert_eq!(stack, bare + CALLS * copy);

    // The preset, which writes `grpc-timeout` into each attempt: the per-attempt timeout's
    // value, encoded once with the policy, is shared, not made per call.
    fn timed(req: GrpcRequest) -> Ready<Result<Response, BoxError>> {
        assert_eq!(req.0.headers()["grpc-timeout"], "1S");
        ready(Ok(ok()))
    }
    let preset = run(ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(
            tower_backstop::BackstopLayer::grpc(Duration::from_secs(1)).retry(
                RetryPolicy::grpc()
                    .deadline(Duration::from_secs(5))
                    .build()
                    .unwrap(),
            ),
        )
        .service(service_fn(timed)));
    println!("grpc preset with grpc-timeout: {preset} allocations over {CALLS} calls");
    assert_eq!(preset, bare + CALLS * copy);
}

#[test]
fn keyed_breaker_for_a_known_host_allocates_nothing() {
    // The key ("mail.test:80", normalised from the URI with the scheme's default port) is built
    // in a stack buffer and looked up under a read lock; only a new key allocates its breaker.
    let req = http_request();
    let bare = || service_fn(|_: HttpReq| ready(Ok::<_, BoxError>(http::Response::new(()))));
    let keyed = BreakerLayer::new().per_host();
    let svc = ServiceBuilder::new()
        .layer(keyed.clone())
        .layer(ClassifyLayer::http())
        .service(bare());
    let base = count_http(bare(), &req);
    let layered = count_http(svc, &req);
    println!(
        "BreakerLayer::per_host, known host: {} allocations over {CALLS} calls (bare {base})",
        layered
    );
    assert_eq!(layered, base, "a known host's call allocates");
    assert_eq!(keyed.keys(), ["mail.test:80"]);
}

// The preset: `BackstopLayer` builds the same layers from one set of settings, so it must add
// nothing either: strictly nothing with a request free to copy, and with a real HTTP request
// only the one copy its retry layer keeps (with or without a dead-letter store, which shares it).

#[test]
fn preset_allocates_nothing_with_a_cheap_request() {
    use tower_backstop::BackstopLayer;

    // One breaker (the HTTP default keys by host, which a `&str` has not).
    let preset = || BackstopLayer::http(Duration::from_secs(30)).breaker(BreakerLayer::new());
    assert_adds_nothing(
        "BackstopLayer::http (one breaker, no store)",
        bare_http(),
        preset().layer(bare_http()),
    );
    assert_adds_nothing(
        "BackstopLayer::http (one breaker, MemoryStore)",
        bare_http(),
        preset()
            .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
            .layer(bare_http()),
    );
    assert_adds_nothing(
        "BackstopLayer::new(closure classifier)",
        bare(),
        BackstopLayer::new(all_ok::<Req>, Duration::from_secs(30))
            .breaker(BreakerLayer::new())
            .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
            .layer(bare()),
    );
}

// A reloadable preset adds nothing either, before a reload and after one (each service takes
// the new policy once, at its first call after the reload: a counted reference, no allocation).

#[cfg(feature = "serde")]
#[test]
fn reloadable_preset_allocates_nothing_with_a_cheap_request() {
    use tower_backstop::config::BackstopConfig;

    // One breaker (the HTTP default keys by host, which a `&str` has not), with the preset's
    // rule, over which a configuration applies.
    let breaker = BreakerLayer::builder()
        .failure_rate(0.5)
        .count_window(100)
        .minimum_calls(20)
        .open_doubling(Duration::from_secs(1), Duration::from_secs(30))
        .open_jitter(0.5)
        .build()
        .expect("a valid rule");
    let (layer, reload) = tower_backstop::BackstopLayer::http(Duration::from_secs(30))
        .breaker(breaker)
        .reloadable();
    let mut config = BackstopConfig::new(Duration::from_secs(30));
    assert_adds_nothing(
        "BackstopLayer::http, reloadable (no store)",
        bare_http(),
        layer.layer(bare_http()),
    );
    config.retry.max_attempts = Some(4);
    config.breaker.consecutive_failures = Some(9);
    reload.apply(&config).expect("a valid configuration");
    assert_adds_nothing(
        "BackstopLayer::http, reloadable, after a reload (MemoryStore)",
        bare_http(),
        layer
            .clone()
            .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
            .layer(bare_http()),
    );
}

#[test]
fn preset_copies_an_http_request_once() {
    use tower_backstop::BackstopLayer;

    let req = http_request();
    black_box(tower_backstop::Replay::replay(&req));
    let before = allocations();
    black_box(tower_backstop::Replay::replay(&req));
    let per_copy = allocations() - before;
    assert!(per_copy > 0, "a request with headers allocates when copied");

    let bare = || service_fn(|_: HttpReq| ready(Ok::<_, BoxError>(http::Response::new(()))));
    let base = count_http(bare(), &req);
    // The defaults: one breaker per host (a known host's call allocates nothing), no store.
    let alone = count_http(
        BackstopLayer::http(Duration::from_secs(30)).layer(bare()),
        &req,
    );
    // With a store: the dead-letter and retry layers share the one copy.
    let with_store = count_http(
        BackstopLayer::http(Duration::from_secs(30))
            .dead_letters(DeadLetterLayer::new(MemoryStore::new()))
            .layer(bare()),
        &req,
    );
    println!(
        "BackstopLayer::http, http::Request with 2 headers: {} allocations per call added \
         without a store, {} with one ({per_copy} per request copy)",
        (alone - base) as f64 / CALLS as f64,
        (with_store - base) as f64 / CALLS as f64,
    );
    for (case, layered) in [("no store", alone), ("MemoryStore", with_store)] {
        assert_eq!(
            layered - base,
            per_copy * CALLS,
            "BackstopLayer::http ({case}): the success path allocates more than the retry \
             layer's one request copy"
        );
    }
}

// With the `metrics` feature and a Prometheus recorder (metrics-exporter-prometheus, as a
// user installs it), the preset's `Metrics` listener adds at most one allocation per call: its
// handles are registered once, and the exporter's histograms grow in blocks.

#[cfg(feature = "metrics")]
#[test]
fn preset_with_metrics_allocates_at_most_once_per_call() {
    use tower_backstop::BackstopLayer;
    use tower_backstop::observe::Metrics;

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let (bare, layered) = metrics::with_local_recorder(&recorder, || {
        let preset = BackstopLayer::http(Duration::from_secs(30))
            .breaker(BreakerLayer::new())
            .listener(Metrics::new());
        (count(bare_http()), count(preset.layer(bare_http())))
    });
    println!(
        "BackstopLayer::http with Metrics: bare {bare}, layered {layered} allocations over \
         {CALLS} calls ({} per call added)",
        (layered as f64 - bare as f64) / CALLS as f64
    );
    assert!(
        layered <= bare + CALLS,
        "the metrics listener allocates {layered} times over {CALLS} calls, the bare service \
         {bare} times"
    );
    let scraped = handle.render();
    assert!(
        scraped.contains(&format!(
            "backstop_calls_total{{outcome=\"success_without_retry\"}} {}",
            WARM_UP + CALLS
        )),
        "every call is counted: {scraped}"
    );
}

// A service that logs at INFO (a `fmt` subscriber, as most services have) gets no span from the
// retry layer (its spans are at DEBUG) and so no allocation for one.

#[test]
fn retry_allocates_nothing_under_an_info_subscriber() {
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    assert_adds_nothing(
        "RetryLayer under an INFO subscriber",
        bare(),
        RetryLayer::default().layer(bare()),
    );
}
