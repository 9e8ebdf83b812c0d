//! The breaker's adaptive concurrency limit, on tokio's paused clock with in-process providers
//! counted on their side: off and free until a provider signals overload (429, 503), then a
//! limit measured from what the provider took, lowered on overload answers and on latency
//! rising, grown back on clean answers and lifted after a quiet time; calls over it wait their
//! turn in order, and every permit comes back.

mod support;

use std::future::{Future, ready};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::StatusCode;
use support::get;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_backstop::breaker::{AdaptiveConcurrency, BreakerHandle, BreakerLayer, LimitedError};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::observe::{Event, Listener};
use tower_backstop::retry::{DelaySource, RetryLayer, RetryPolicy};
use tower_backstop::{BackstopLayer, BoxError, Class, Code, Failure, Sent};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a provider answers a request it has no room for.
#[derive(Clone, Copy, Debug)]
enum Over {
    /// `429`.
    TooMany,
    /// `503`.
    Unavailable,
    /// `503` with `Retry-After: 1`.
    UnavailableAfter,
}

impl Over {
    fn response(self) -> http::Response<()> {
        let builder = http::Response::builder();
        let builder = match self {
            Over::TooMany => builder.status(429),
            Over::Unavailable => builder.status(503),
            Over::UnavailableAfter => builder.status(503).header("retry-after", "1"),
        };
        builder.body(()).unwrap()
    }
}

/// What a provider counted on its side.
#[derive(Default, Debug)]
struct Counts {
    in_flight: u32,
    /// (when, served) for each answer: `true` a `200`, `false` a refusal.
    log: Vec<(Instant, bool)>,
}

/// A provider that serves `slots` requests at once, each answered `200` after its latency
/// (`latency`, times the requests in flight ÷ `capacity` when that is above 1: each gets a
/// share); a request that finds every slot taken is answered at once with `over`.
#[derive(Clone)]
struct Slots {
    slots: Arc<AtomicU32>,
    latency: Duration,
    capacity: u32,
    over: Over,
    /// The request of this number (from 1) is refused whatever the room: 0 for none.
    refuse_nth: u64,
    calls: Arc<AtomicU64>,
    counts: Arc<Mutex<Counts>>,
}

impl Slots {
    fn new(slots: u32, latency: Duration, over: Over) -> Self {
        Slots {
            slots: Arc::new(AtomicU32::new(slots)),
            latency,
            capacity: u32::MAX,
            over,
            refuse_nth: 0,
            calls: Arc::default(),
            counts: Arc::default(),
        }
    }

    /// Served and refused, answered within `from..to`.
    fn between(&self, from: Instant, to: Instant) -> (u64, u64) {
        let counts = self.counts.lock().unwrap();
        let window = counts.log.iter().filter(|(at, _)| *at >= from && *at < to);
        window.fold(
            (0, 0),
            |(ok, no), (_, served)| {
                if *served { (ok + 1, no) } else { (ok, no + 1) }
            },
        )
    }
}

/// A served request's slot, given back when its answer goes (or its future is dropped).
struct Served {
    counts: Arc<Mutex<Counts>>,
    answered: bool,
}

impl Served {
    /// Answered: logged as served, and the slot given back.
    fn answer(mut self) {
        self.answered = true;
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap();
        counts.in_flight -= 1;
        if self.answered {
            counts.log.push((Instant::now(), true));
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<()>, BoxError>> + Send>>;

impl Service<http::Request<String>> for Slots {
    type Response = http::Response<()>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<String>) -> Answer {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let mut counts = self.counts.lock().unwrap();
        if counts.in_flight >= self.slots.load(Ordering::Relaxed) || n == self.refuse_nth {
            counts.log.push((Instant::now(), false));
            return Box::pin(ready(Ok(self.over.response())));
        }
        counts.in_flight += 1;
        let share = f64::from(counts.in_flight) / f64::from(self.capacity);
        let latency = self.latency.mul_f64(share.max(1.0));
        let served = Served {
            counts: Arc::clone(&self.counts),
            answered: false,
        };
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            served.answer();
            Ok(http::Response::new(()))
        })
    }
}

/// A concurrency-limit event: (reason, limit).
type Change = (&'static str, Option<u32>);

/// A listener that keeps the concurrency-limit events.
#[derive(Clone, Default)]
struct Told(Arc<Mutex<Vec<Change>>>);

impl Told {
    fn reasons(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().iter().map(|(r, _)| *r).collect()
    }
}

impl Listener for Told {
    fn on_event(&self, event: &Event<'_>) {
        if let Event::ConcurrencyLimit { reason, limit, .. } = event {
            self.0.lock().unwrap().push((reason, *limit));
        }
    }
}

/// `callers` callers, each calling `svc` in a loop from `from` until `until`.
async fn callers<S>(svc: S, callers: usize, from: Instant, until: Instant)
where
    S: Service<http::Request<String>> + Clone + Send + 'static,
    S::Future: Send,
{
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(from).await;
            while Instant::now() < until {
                if svc.clone().oneshot(get("http://api.test/")).await.is_err() {
                    // A caller that failed lets the others run.
                    tokio::time::sleep(ms(10)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// The limit read each second from `start` for `seconds`.
async fn sample(read: impl Fn() -> Option<u32>, start: Instant, seconds: u64) -> Vec<Option<u32>> {
    let mut seen = Vec::new();
    for s in 1..=seconds {
        tokio::time::sleep_until(start + Duration::from_secs(s)).await;
        seen.push(read());
    }
    seen
}

/// The steady state of a provider that takes 10 requests at once, each in 100 ms, and answers
/// any more `429` at once: 30 callers for a minute get about its 100 a second.
#[tokio::test(start_paused = true)]
async fn a_provider_limited_by_concurrency_is_sent_about_what_it_takes() {
    let provider = Slots::new(10, ms(100), Over::TooMany);
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .build()
        .unwrap();
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(provider.clone());
    let start = Instant::now();
    let minute = start + Duration::from_secs(60);
    let limits = tokio::spawn(sample(move || handle.concurrency_limit(), start, 60));
    callers(svc, 30, start, minute).await;
    let limits = limits.await.unwrap();
    let steady: Vec<u32> = limits[20..].iter().map(|l| l.expect("limited")).collect();
    let mean = f64::from(steady.iter().sum::<u32>()) / steady.len() as f64;
    assert!((8.0..=12.5).contains(&mean), "near 10: {mean} {steady:?}");
    assert!(steady.iter().all(|l| (5..=16).contains(l)), "{steady:?}");
    let (ok, refused) = provider.between(start + Duration::from_secs(10), minute);
    assert!(
        ok as f64 >= 0.8 * 100.0 * 50.0,
        "goodput at least 80 % of 100/s: {ok} in 50 s"
    );
    assert!(
        refused as f64 <= 0.1 * (ok + refused) as f64,
        "at most 10 % refused: {refused} of {}",
        ok + refused
    );
}

/// The same provider behind the preset: its send rate and its concurrency limit both on.
#[tokio::test(start_paused = true)]
async fn the_preset_gets_a_provider_limited_by_concurrency_its_rate_too() {
    let provider = Slots::new(10, ms(100), Over::TooMany);
    let layer = BackstopLayer::http(Duration::from_secs(2))
        .adaptive_concurrency(AdaptiveConcurrency::new());
    let health = layer.health();
    let svc = ServiceBuilder::new().layer(layer).service(provider.clone());
    let start = Instant::now();
    let minute = start + Duration::from_secs(60);
    callers(svc, 30, start, minute).await;
    let (ok, refused) = provider.between(start + Duration::from_secs(10), minute);
    assert!(
        ok as f64 >= 0.8 * 100.0 * 50.0,
        "goodput at least 80 % of 100/s: {ok} in 50 s"
    );
    assert!(
        refused as f64 <= 0.1 * (ok + refused) as f64,
        "at most 10 % refused: {refused} of {}",
        ok + refused
    );
    // Whichever binds holds the calls: the limit never grows far above what the provider
    // takes (at most twice the calls in flight), even while the rate binds.
    let report = health.report();
    let api = report
        .breakers
        .iter()
        .find(|b| b.name.starts_with("api.test"));
    let limit = api
        .expect("the host's breaker")
        .concurrency_limit
        .expect("limited");
    assert!((5..=21).contains(&limit), "{limit}");
}

/// A provider that never signals overload: nothing is counted, nothing is held, nothing told.
#[tokio::test(start_paused = true)]
async fn a_provider_that_never_signals_overload_is_never_counted() {
    let provider = Slots::new(1_000, ms(100), Over::TooMany);
    let told = Told::default();
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .listener(told.clone())
        .build()
        .unwrap();
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(provider.clone());
    let start = Instant::now();
    let end = start + Duration::from_secs(5);
    let limits = tokio::spawn(sample(move || handle.in_flight(), start, 5));
    callers(svc, 50, start, end).await;
    assert!(limits.await.unwrap().iter().all(Option::is_none));
    let (ok, refused) = provider.between(start, end);
    assert_eq!(refused, 0);
    assert!(ok >= 2_400, "{ok}");
    assert!(told.reasons().is_empty());
}

/// A 503, with or without `Retry-After`, is an overload answer too.
#[tokio::test(start_paused = true)]
async fn a_503_lowers_the_limit_with_or_without_retry_after() {
    for over in [Over::Unavailable, Over::UnavailableAfter] {
        let provider = Slots::new(5, ms(100), over);
        let told = Told::default();
        let breaker = BreakerLayer::builder()
            .adaptive_concurrency(AdaptiveConcurrency::new())
            .without_adaptive_rate()
            // 503s count as failures: a breaker that does not open on the few of an overload.
            .consecutive_failures(1_000)
            .listener(told.clone())
            .build()
            .unwrap();
        let handle = breaker.handle();
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(provider.clone());
        let start = Instant::now();
        callers(svc, 20, start, start + Duration::from_secs(20)).await;
        let limit = handle.concurrency_limit().expect("limited");
        assert!((2..=8).contains(&limit), "{over:?}: {limit}");
        let reasons = told.reasons();
        assert_eq!(reasons[0], "measured", "{over:?}: {reasons:?}");
        assert!(reasons.contains(&"overloaded"), "{over:?}: {reasons:?}");
        let (ok, _) = provider.between(
            start + Duration::from_secs(5),
            start + Duration::from_secs(20),
        );
        assert!(
            ok as f64 >= 0.7 * 50.0 * 15.0,
            "{over:?}: {ok} of 50/s in 15 s"
        );
    }
}

/// A provider that answers overload by slowing down (each request's latency grows with the
/// requests in flight above 10), after one 429 turned the limit on at a low load: with the
/// latency rule the limit stays where latency is within 1.5 times its lowest; without it the
/// limit follows the callers.
#[tokio::test(start_paused = true)]
async fn latency_rising_lowers_the_limit() {
    for tolerance in [1.5, f64::INFINITY] {
        let mut provider = Slots::new(1_000, ms(100), Over::TooMany);
        provider.capacity = 10;
        provider.refuse_nth = 20;
        let told = Told::default();
        let breaker = BreakerLayer::builder()
            .adaptive_concurrency(AdaptiveConcurrency::new())
            .without_adaptive_rate()
            .adaptive_concurrency(AdaptiveConcurrency::new().latency_tolerance(tolerance))
            .listener(told.clone())
            .build()
            .unwrap();
        let handle = breaker.handle();
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(provider.clone());
        let start = Instant::now();
        let end = start + Duration::from_secs(25);
        // 5 callers, then 40 from the fifth second.
        let few = callers(svc.clone(), 5, start, end);
        let many = callers(svc, 35, start + Duration::from_secs(5), end);
        tokio::join!(few, many);
        let limit = handle.concurrency_limit().expect("limited");
        let reasons = told.reasons();
        if tolerance.is_finite() {
            assert!(reasons.contains(&"latency"), "{reasons:?}");
            assert!(limit <= 20, "{limit}: {reasons:?}");
        } else {
            assert!(!reasons.contains(&"latency"), "{reasons:?}");
            assert!(limit > 25, "{limit}");
        }
    }
}

/// Callers of a provider that took 5 at once, then takes all it gets: the limit grows back on
/// clean answers, and once no overload answer came for 30 s it is lifted, with no call.
#[tokio::test(start_paused = true)]
async fn the_limit_grows_back_on_clean_answers_and_is_lifted_after_a_quiet_time() {
    let provider = Slots::new(5, ms(100), Over::TooMany);
    let told = Told::default();
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .listener(told.clone())
        .build()
        .unwrap();
    let handle = breaker.handle();
    let health = breaker.health();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(provider.clone());
    let start = Instant::now();
    let slots = Arc::clone(&provider.slots);
    let recovery = tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        let low = handle.concurrency_limit().expect("limited");
        slots.store(1_000, Ordering::Relaxed);
        (low, handle)
    });
    callers(svc, 30, start, start + Duration::from_secs(20)).await;
    let (low, handle) = recovery.await.unwrap();
    assert!(low <= 8, "{low}");
    let high = handle.concurrency_limit().expect("still limited");
    assert!(high >= 25, "grown back: {low} -> {high}");
    let last_refusal = {
        let counts = provider.counts.lock().unwrap();
        counts.log.iter().rev().find(|(_, ok)| !ok).unwrap().0
    };
    assert!(last_refusal < start + Duration::from_secs(11));
    // No call from here on: lifted 30 s after the last overload answer.
    tokio::time::sleep_until(last_refusal + Duration::from_secs(29)).await;
    assert!(handle.concurrency_limit().is_some());
    tokio::time::sleep_until(last_refusal + Duration::from_secs(31)).await;
    assert_eq!(handle.concurrency_limit(), None);
    assert_eq!(handle.in_flight(), None);
    assert_eq!(health.report().breakers[0].concurrency_limit, None);
    let told = told.0.lock().unwrap();
    assert_eq!(*told.last().unwrap(), ("lifted", None));
}

type Probe = &'static str;

type Answered = Pin<Box<dyn Future<Output = Result<Probe, BoxError>> + Send>>;

/// An in-process provider's answer by the request: `429`, a 500, `ok` at once, `slow` after
/// 10 s, `panic` by panicking.
fn answer(req: Probe) -> Answered {
    Box::pin(async move {
        match req {
            "429" => Err(Failure::<()>::new(
                Class::THROTTLED,
                Code::Http(StatusCode::TOO_MANY_REQUESTS),
            )
            .into()),
            "500" => Err(Failure::<()>::new(
                Class::UNKNOWN,
                Code::Http(StatusCode::INTERNAL_SERVER_ERROR),
            )
            .into()),
            "slow" => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(req)
            }
            "panic" => panic!("the provider's future panics"),
            _ => Ok(req),
        }
    })
}

/// The provider of [`answer`].
fn by_request() -> tower::util::ServiceFn<fn(Probe) -> Answered> {
    service_fn(answer as fn(Probe) -> Answered)
}

/// Turns the limit of `svc`'s breaker on with a 429, then measures it over `slow` calls that
/// take 10 s and one answered at once: a limit of 0.9 × (`slow` + 1), `slow` calls in flight.
async fn limited(
    svc: &(
         impl Service<Probe, Response = Probe, Error = Failure<Probe>, Future: Send>
         + Clone
         + Send
         + 'static
     ),
    handle: &BreakerHandle,
    slow: u32,
) -> Vec<tokio::task::JoinHandle<Result<Probe, Failure<Probe>>>> {
    let f = svc.clone().oneshot("429").await.unwrap_err();
    assert_eq!(f.class(), Class::THROTTLED);
    let out: Vec<_> = (0..slow)
        .map(|_| tokio::spawn(svc.clone().oneshot("slow")))
        .collect();
    tokio::task::yield_now().await;
    svc.clone().oneshot("ok").await.unwrap();
    let limit = (0.9 * f64::from(slow + 1)).floor() as u32;
    assert_eq!(handle.concurrency_limit(), Some(limit));
    assert_eq!(handle.in_flight(), Some(slow));
    out
}

/// A call over the limit is answered at once, not sent: throttled, `Paced`, not sent, with its
/// wait; and every permit comes back: on success, on failure, on cancellation, on panic.
#[tokio::test(start_paused = true)]
async fn held_calls_are_not_sent_and_every_permit_comes_back() {
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .name("api")
        .build()
        .unwrap();
    let handle = breaker.handle();
    let svc = breaker.layer(by_request());
    let mut slow = limited(&svc, &handle, 4).await;

    let held = svc.clone().oneshot("ok").await.unwrap_err();
    assert_eq!(held.class(), Class::THROTTLED);
    assert_eq!(held.code(), Code::Paced);
    assert_eq!(held.sent(), Sent::No);
    let source = std::error::Error::source(&held).and_then(|e| e.downcast_ref::<LimitedError>());
    let source = source.expect("a LimitedError");
    assert_eq!((source.breaker(), source.limit()), ("api", 4));
    assert_eq!(held.retry_after(), Some(source.wait()));
    assert!(source.wait() > Duration::ZERO && source.wait() <= Duration::from_secs(1));
    drop(held);

    // Cancelled: a call dropped before its answer gives its permit back.
    slow.pop().unwrap().abort();
    tokio::task::yield_now().await;
    assert_eq!(handle.in_flight(), Some(3));
    // A failure that is no overload, and a success: each gives its permit back.
    let f = svc.clone().oneshot("500").await.unwrap_err();
    assert_eq!(f.class(), Class::UNKNOWN);
    assert_eq!(handle.in_flight(), Some(3));
    svc.clone().oneshot("ok").await.unwrap();
    assert_eq!(handle.in_flight(), Some(3));
    // A panic of the provider's future unwinds through the call: its permit comes back.
    let panicked = tokio::spawn(svc.clone().oneshot("panic"))
        .await
        .unwrap_err();
    assert!(panicked.is_panic());
    assert_eq!(handle.in_flight(), Some(3));
    // The slow ones end.
    for s in slow {
        s.await.unwrap().unwrap();
    }
    assert_eq!(handle.in_flight(), Some(0));
}

/// Five callers with a retry layer, held in turn while the limit (1) is reached, reach the
/// provider in the order they came; each waited for its turn (the retry layer's waits are the
/// concurrency limit's, not attempts).
#[tokio::test(start_paused = true)]
async fn held_callers_are_served_first_in_first_out() {
    // One permit at most: turns are given one at a time, so the order of the queue is the
    // order the provider sees (turns given at once are taken as their callers wake).
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .adaptive_concurrency(AdaptiveConcurrency::new().max(1))
        .build()
        .unwrap();
    let handle = breaker.handle();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let provider = service_fn(move |req: Probe| -> Answered {
        log.lock().unwrap().push(req);
        if !req.starts_with("caller ") {
            return answer(req);
        }
        Box::pin(async move {
            tokio::time::sleep(ms(100)).await;
            Ok(req)
        })
    });
    let svc = breaker.layer(provider);
    // A limit of 1, taken for 10 s by a slow call.
    let _slow = limited(&svc, &handle, 1).await;
    let waits = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&waits);
    let policy = RetryPolicy::new()
        .assume_idempotent(true)
        .listener(move |e: &Event<'_>| {
            if let Event::Retried {
                source: DelaySource::ConcurrencyLimit,
                ..
            } = e
            {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
    let retrying = ServiceBuilder::new()
        .layer(policy.build().unwrap())
        .service(svc);
    let names = ["caller 0", "caller 1", "caller 2", "caller 3", "caller 4"];
    let mut calls = Vec::new();
    for name in names {
        calls.push(tokio::spawn(retrying.clone().oneshot(name)));
        tokio::task::yield_now().await;
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    let callers: Vec<&str> = seen
        .iter()
        .copied()
        .filter(|r| r.starts_with("caller"))
        .collect();
    assert_eq!(callers, names, "in the order they came, each once");
    assert!(waits.load(Ordering::Relaxed) >= 5, "each waited its turn");
}

/// Without the limit, nothing is counted whatever the provider answers.
#[tokio::test(start_paused = true)]
async fn without_the_limit_an_overload_answer_changes_nothing() {
    let breaker = BreakerLayer::builder()
        .adaptive_concurrency(AdaptiveConcurrency::new())
        .without_adaptive_rate()
        .without_adaptive_concurrency()
        .build()
        .unwrap();
    let handle = breaker.handle();
    let svc = breaker.layer(by_request());
    svc.clone().oneshot("429").await.unwrap_err();
    svc.clone().oneshot("ok").await.unwrap();
    assert_eq!(handle.concurrency_limit(), None);

    let layer = BackstopLayer::http(Duration::from_secs(1)).without_adaptive_concurrency();
    let health = layer.health();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(Slots::new(1, ms(100), Over::TooMany));
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(get("http://api.test/"))))
        .collect();
    for call in calls {
        let _ = call.await.unwrap();
    }
    let report = health.report();
    let api = report
        .breakers
        .iter()
        .find(|b| b.name.starts_with("api.test"));
    let api = api.expect("the host's breaker");
    assert_eq!(api.concurrency_limit, None);
    assert!(api.send_rate.is_some(), "the rate is on");
}

#[test]
fn settings_out_of_range_are_build_errors_naming_the_field() {
    let build = |c: AdaptiveConcurrency| {
        BreakerLayer::builder()
            .adaptive_concurrency(c)
            .build()
            .unwrap_err()
    };
    let c = AdaptiveConcurrency::new();
    let err = build(c.max(0));
    assert_eq!(err.setting(), "adaptive_concurrency.max");
    assert_eq!(
        err.to_string(),
        "invalid configuration: `adaptive_concurrency.max` is 0: the highest limit must be at least 1 call"
    );
    assert_eq!(
        build(c.decrease(0.2)).setting(),
        "adaptive_concurrency.decrease"
    );
    assert_eq!(
        build(c.latency_tolerance(0.9)).setting(),
        "adaptive_concurrency.latency_tolerance"
    );
    assert_eq!(
        build(c.lift_after(Duration::ZERO)).setting(),
        "adaptive_concurrency.lift_after"
    );
}

#[cfg(feature = "serde")]
#[test]
fn a_configuration_sets_the_limit_and_names_a_field_out_of_range() {
    use tower_backstop::config::BackstopConfig;

    let read = |text: &str| toml::from_str::<BackstopConfig>(text).unwrap();
    let err = read(
        "attempt_timeout = \"2s\"\n[breaker]\nadaptive_concurrency = { max = 0, lift_after = \"1m\" }\n",
    )
    .http()
    .unwrap_err();
    assert_eq!(err.path(), "breaker.adaptive_concurrency.max");
    let ok = read("attempt_timeout = \"2s\"\n[breaker.adaptive_concurrency]\nmax = 50\n");
    assert!(ok.http().is_ok());
    let off = read("attempt_timeout = \"2s\"\n[breaker]\nadaptive_concurrency = false\n");
    assert!(off.http().is_ok());
}

/// The gauge reads the limit while limited, and NaN once lifted, with no call.
#[cfg(feature = "metrics")]
#[test]
fn the_gauge_follows_the_limit_and_reads_nan_once_lifted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_backstop::observe::Metrics;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauge = || {
        let values = snapshotter.snapshot().into_vec();
        values.into_iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let named = key.name() == "backstop_concurrency_limit"
                && key
                    .labels()
                    .any(|l| l.key() == "breaker" && l.value() == "api");
            match value {
                DebugValue::Gauge(g) if named => Some(g.into_inner()),
                _ => None,
            }
        })
    };
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let breaker = BreakerLayer::builder()
                    .adaptive_concurrency(AdaptiveConcurrency::new())
                    .without_adaptive_rate()
                    .name("api")
                    .listener(Metrics::new())
                    .build()
                    .unwrap();
                let handle = breaker.handle();
                let svc = breaker.layer(by_request());
                let _slow = limited(&svc, &handle, 4).await;
                assert_eq!(gauge(), Some(4.0));
                // Told once a second while limited, with no call (a snapshot takes what was
                // set since the last: read just after each second).
                for _ in 0..25 {
                    tokio::time::sleep(Duration::from_millis(1_000)).await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    assert_eq!(gauge(), handle.concurrency_limit().map(f64::from));
                }
                tokio::time::sleep(Duration::from_secs(6)).await;
                assert_eq!(handle.concurrency_limit(), None);
                assert!(gauge().is_some_and(f64::is_nan), "{:?}", gauge());
            });
    });
}
