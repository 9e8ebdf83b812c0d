//! The breaker's adaptive send rate, on tokio's paused clock with in-process providers: a
//! throttled answer lowers the rate instead of opening the breaker, calls before their slot are
//! held back (not sent) with the wait as their hint, a retry layer waits and sends them in
//! their slot, the rate grows back and is lifted, and the preset without a store never says
//! "deferred".

mod support;

use std::collections::HashMap;
use std::future::{Ready, ready};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use support::{Scripted, Step, get, status, status_with};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{AdaptiveRate, BreakerLayer, PacedError, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, RetrySchedule};
use tower_backstop::observe::Event;
use tower_backstop::retry::{Attempts, GiveUp, RetryLayer, RetryPolicy};
use tower_backstop::store::{MemoryStore, Status, Store};
use tower_backstop::{BackstopLayer, BoxError, Class, Code, Sent};

/// A provider that admits `per_second` requests in each whole second of the paused clock and
/// answers every other one `429` with `Retry-After: 1`; it counts on its side what it received,
/// the 429s it sent after `from`, and the deliveries of each message (header `x-key`).
#[derive(Clone)]
struct Quota {
    per_second: u32,
    start: Instant,
    /// Everything is throttled before this much of the run has passed.
    closed_for: Duration,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default, Debug)]
struct Counts {
    window: u64,
    in_window: u32,
    received: u64,
    throttled: u64,
    /// (second of the run, 429) for each request received.
    log: Vec<(u64, bool)>,
    delivered: HashMap<String, u32>,
}

impl Quota {
    fn new(per_second: u32) -> Self {
        Quota {
            per_second,
            start: Instant::now(),
            closed_for: Duration::ZERO,
            counts: Arc::default(),
        }
    }

    /// Received, and 429s sent, from second `from` of the run on.
    fn after(&self, from: u64) -> (u64, u64) {
        let c = self.counts.lock().unwrap();
        let late = c.log.iter().filter(|(s, _)| *s >= from);
        let (n, t) = late.fold((0, 0), |(n, t), (_, x)| (n + 1, t + u64::from(*x)));
        (n, t)
    }

    fn delivered(&self) -> HashMap<String, u32> {
        self.counts.lock().unwrap().delivered.clone()
    }
}

impl Service<http::Request<String>> for Quota {
    type Response = http::Response<()>;
    type Error = BoxError;
    type Future = Ready<Result<http::Response<()>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<String>) -> Self::Future {
        let second = Instant::now().duration_since(self.start).as_secs();
        let mut c = self.counts.lock().unwrap();
        if c.window != second {
            c.window = second;
            c.in_window = 0;
        }
        c.received += 1;
        let open = Instant::now().duration_since(self.start) >= self.closed_for;
        let admitted = open && c.in_window < self.per_second;
        c.log.push((second, !admitted));
        if admitted {
            c.in_window += 1;
            let key = req.headers()["x-key"].to_str().unwrap().to_owned();
            *c.delivered.entry(key).or_default() += 1;
            return ready(Ok(http::Response::new(())));
        }
        c.throttled += 1;
        let response = http::Response::builder()
            .status(429)
            .header("retry-after", "1")
            .body(())
            .unwrap();
        ready(Ok(response))
    }
}

fn keyed(key: &str) -> http::Request<String> {
    http::Request::get("http://api.test/send")
        .header("x-key", key)
        .body(String::new())
        .unwrap()
}

/// The send-rate events told: (reason, rate).
type Told = Vec<(&'static str, Option<f64>)>;

/// A listener that keeps the send-rate events.
#[derive(Clone, Default)]
struct Rates(Arc<Mutex<Told>>);

impl tower_backstop::observe::Listener for Rates {
    fn on_event(&self, event: &Event<'_>) {
        if let Event::SendRate { reason, rate, .. } = event {
            self.0.lock().unwrap().push((reason, *rate));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn throttled_answers_lower_the_rate_and_leave_the_breaker_closed() {
    let upstream = Scripted::always(status_with(429, "retry-after", "1"));
    let layer = BreakerLayer::new();
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    // Ten calls a second for four seconds, all throttled: the limit's first measure runs its
    // longest (three seconds: nothing admitted), then the rate is the floor.
    let mut paced = 0;
    for _ in 0..40 {
        if let Err(f) = svc.clone().oneshot(get("/")).await
            && f.code() == Code::Paced
        {
            paced += 1;
            assert_eq!(f.class(), Class::THROTTLED);
            assert_eq!(f.sent(), Sent::No, "a paced call never left");
            let wait = f.retry_after().expect("the wait until its slot");
            assert!(wait > Duration::ZERO);
            let source = std::error::Error::source(&f).and_then(|e| e.downcast_ref::<PacedError>());
            assert_eq!(source.expect("a PacedError").wait(), wait);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(
        handle.state(),
        State::Closed,
        "a throttled provider is up: the breaker stays closed"
    );
    assert!(paced > 0, "calls before their slot are held back");
    assert_eq!(
        upstream.calls() + paced,
        40,
        "a held-back call does not reach the provider"
    );
    let rate = handle.send_rate().expect("limited");
    assert!(rate >= 0.5, "never below the floor: {rate}");
}

#[tokio::test(start_paused = true)]
async fn without_the_rate_a_throttled_answer_does_nothing_to_later_calls() {
    let upstream = Scripted::always(status_with(429, "retry-after", "1"));
    let layer = BreakerLayer::builder()
        .without_adaptive_rate()
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..10 {
        let f = svc.clone().oneshot(get("/")).await.unwrap_err();
        assert_eq!(f.code(), Code::Http(http::StatusCode::TOO_MANY_REQUESTS));
    }
    assert_eq!(upstream.calls(), 10);
    assert_eq!(handle.state(), State::Closed);
    assert_eq!(handle.send_rate(), None);
}

#[tokio::test(start_paused = true)]
async fn a_retry_layer_waits_for_the_slot_and_sends_the_request_in_it() {
    // Two calls a second are taken, then 429 for the rest of the second.
    let quota = Quota::new(2);
    let breaker = BreakerLayer::new();
    let handle = breaker.handle();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(quota.clone());
    // Twenty callers at once: the provider throttles the third; the rest wait for slots.
    let calls: Vec<_> = (0..20)
        .map(|i| tokio::spawn(svc.clone().oneshot(keyed(&format!("m{i}")))))
        .collect();
    let mut failed = Vec::new();
    for call in calls {
        if let Err(f) = call.await.unwrap() {
            failed.push(f);
        }
    }
    assert!(handle.send_rate().is_some(), "the provider throttled");
    let delivered = quota.delivered();
    assert!(
        delivered.values().all(|n| *n == 1),
        "no message twice: {delivered:?}"
    );
    // Each caller has 3 attempts; waits for a slot are none of them.
    for f in &failed {
        let attempts = f.notes().get::<Attempts>().unwrap();
        assert!(attempts.count() <= 3, "{attempts:?}");
        assert_ne!(
            f.code(),
            Code::Paced,
            "the caller gets the provider's answer"
        );
    }
    assert_eq!(delivered.len() + failed.len(), 20);
    // Without pacing, the 18 callers over the quota would each hit the provider 3 times. The
    // first burst is answered 429 before any admitted answer; then each waits its turn at the
    // rate measured.
    let (_, late_429) = quota.after(1);
    assert!(
        late_429 <= 3,
        "pacing spares the provider: {late_429} throttled after the first burst"
    );
}

/// The trial on the paused clock: 100 callers in a loop for 30 s against a provider that
/// admits 50 a second; the README's preset without a store.
#[tokio::test(start_paused = true)]
async fn a_hundred_callers_get_the_providers_rate_with_few_429s() {
    let quota = Quota::new(50);
    let svc = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_secs(2)))
        .service(quota.clone());
    let end = Instant::now() + Duration::from_secs(30);
    let delivered = Arc::new(Mutex::new(0u64));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for c in 0..100 {
        let svc = svc.clone();
        let (delivered, failed) = (delivered.clone(), failed.clone());
        callers.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < end {
                match svc.clone().oneshot(keyed(&format!("c{c}-{i}"))).await {
                    Ok(_) => *delivered.lock().unwrap() += 1,
                    Err(f) => {
                        failed
                            .lock()
                            .unwrap()
                            .push(f.notes().get::<Attempts>().map(|a| a.give_up()));
                        // A caller that failed at once lets the others run.
                        tokio::task::yield_now().await;
                    }
                }
                i += 1;
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let ok = *delivered.lock().unwrap();
    let (late, late_429) = quota.after(5);
    let failed = failed.lock().unwrap();
    assert!(
        ok as f64 >= 0.9 * 50.0 * 30.0,
        "goodput within 10 % of 50/s: {ok} in 30 s, {} failed",
        failed.len()
    );
    assert!(
        late_429 as f64 <= 0.1 * late as f64,
        "at most 10 % 429s after the first 5 s: {late_429} of {late}"
    );
    assert!(
        quota.delivered().values().all(|n| *n == 1),
        "no duplicate delivery"
    );
    assert!(
        failed.iter().all(|r| *r != Some(GiveUp::Deferred)),
        "without a store nothing says deferred: {failed:?}"
    );
}

/// `n` answers `200`, then `then` for ever.
fn healthy_then(n: usize, then: Step) -> Scripted {
    Scripted::new(std::iter::repeat_n(status(200), n), then)
}

#[tokio::test(start_paused = true)]
async fn the_rate_grows_back_then_is_lifted_after_a_quiet_time() {
    // 20 answers 200, one 429, then 200 for ever.
    let upstream = Scripted::new(
        std::iter::repeat_n(status(200), 20).chain([status_with(429, "retry-after", "1")]),
        status(200),
    );
    let rates = Rates::default();
    let layer = BreakerLayer::builder()
        .adaptive_rate(AdaptiveRate::new().lift_after(Duration::from_secs(20)))
        .listener(rates.clone())
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    // 20 a second for a second, then the throttled answer.
    for _ in 0..21 {
        tokio::time::advance(Duration::from_millis(50)).await;
        let _ = svc.clone().oneshot(get("/ok")).await;
    }
    // The call throttled retried after its `Retry-After`, once the first measure ended: the
    // rate is limited.
    assert!(handle.send_rate().is_some());
    let (reason, cut) = rates.0.lock().unwrap()[0];
    assert_eq!(reason, "throttled");
    let cut = cut.unwrap();
    // About 20 a second taken before the throttled answer (nothing else sent while its call
    // slept), started at 90 % of it.
    assert!((17.0..=19.0).contains(&cut), "{cut}");
    // Calls keep coming, 40 a second: the rate grows back along CUBIC's curve.
    for _ in 0..120 {
        tokio::time::advance(Duration::from_millis(25)).await;
        svc.clone().oneshot(get("/ok")).await.unwrap();
    }
    let grown = handle.send_rate().unwrap();
    assert!(grown > cut, "CUBIC grows it back: {cut} then {grown}");
    // Quiet for the lift time: the next call lifts the limit.
    tokio::time::advance(Duration::from_secs(20)).await;
    svc.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(handle.send_rate(), None);
    let events = rates.0.lock().unwrap();
    assert_eq!(events.last().unwrap(), &("lifted", None));
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_throttles_for_ever_is_cut_to_the_floor_then_its_requests_deferred() {
    // Healthy for 2 s at 20 a second, then 429 for ever.
    let upstream = healthy_then(40, status_with(429, "retry-after", "1"));
    let rates = Rates::default();
    let breaker = BreakerLayer::builder()
        .listener(rates.clone())
        .build()
        .unwrap();
    let handle = breaker.handle();
    let store = MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).retry_schedule(RetrySchedule::none()))
        .layer(
            RetryPolicy::default()
                .max_delay(Duration::from_secs(5))
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    for i in 0..40 {
        tokio::time::advance(Duration::from_millis(50)).await;
        svc.clone().oneshot(keyed(&format!("ok{i}"))).await.unwrap();
    }
    for i in 0..120 {
        let _ = svc.clone().oneshot(keyed(&format!("m{i}"))).await;
        tokio::time::advance(Duration::from_millis(250)).await;
    }
    let peak = handle.send_rate_peak().unwrap();
    let rate = handle.send_rate().unwrap();
    assert!((15.0..=25.0).contains(&peak), "{peak}");
    assert!(rate < peak / 4.0, "cut again and again: {rate} of {peak}");
    assert!(
        rates
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|(r, _)| *r == "below_half"),
        "the fall below half of the peak is told"
    );
    assert_eq!(handle.state(), State::Closed);
    // A burst now waits longer than the in-process bound: deferred to the store.
    let calls: Vec<_> = (0..20)
        .map(|i| tokio::spawn(svc.clone().oneshot(keyed(&format!("burst{i}")))))
        .collect();
    let mut deferred = 0;
    for call in calls {
        if let Err(f) = call.await.unwrap()
            && f.notes().get::<Attempts>().unwrap().give_up() == GiveUp::Deferred
        {
            deferred += 1;
        }
    }
    assert!(deferred > 0);
    let stored = store
        .search(&Default::default(), 0..usize::MAX)
        .await
        .unwrap();
    assert!(
        stored
            .iter()
            .filter(|r| r.status == Status::Deferred)
            .count()
            >= deferred,
        "each deferred request is in the store"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_of_zero_or_none_still_lowers_the_rate() {
    for hint in [Some("0"), None, Some("Wed, 21 Oct 2015 07:28:00 GMT")] {
        let step = match hint {
            Some(v) => status_with(429, "retry-after", v),
            None => status(429),
        };
        let upstream = Scripted::new([step], status(200));
        let breaker = BreakerLayer::new();
        let handle = breaker.handle();
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::default())
            .layer(breaker)
            .layer(ClassifyLayer::http())
            .service(upstream.clone());
        svc.clone()
            .oneshot(get("/"))
            .await
            .expect("retried and delivered");
        // The limit's first measure ends a second later.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(handle.send_rate().is_some(), "{hint:?}");
        assert_eq!(upstream.calls(), 2, "{hint:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_store_the_preset_never_says_deferred() {
    // An open breaker: the preset's rule opens after 20 calls of which half failed.
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_secs(1)))
        .service(upstream.clone());
    let mut reasons = Vec::new();
    for _ in 0..40 {
        let f = svc
            .clone()
            .oneshot(get("http://api.test/"))
            .await
            .unwrap_err();
        reasons.push(f.notes().get::<Attempts>().unwrap().give_up());
    }
    assert!(
        reasons.contains(&GiveUp::HintTooLong),
        "rejections once the breaker opened: {reasons:?}"
    );
    assert!(!reasons.contains(&GiveUp::Deferred), "{reasons:?}");
}

#[test]
fn bad_settings_are_errors_naming_the_setting() {
    let cases = [
        (AdaptiveRate::new().floor(0.0), "adaptive_rate.floor"),
        (AdaptiveRate::new().floor(f64::NAN), "adaptive_rate.floor"),
        (AdaptiveRate::new().decrease(1.5), "adaptive_rate.decrease"),
        (AdaptiveRate::new().decrease(0.0), "adaptive_rate.decrease"),
        (
            AdaptiveRate::new().measured_decrease(0.0),
            "adaptive_rate.measured_decrease",
        ),
        (
            AdaptiveRate::new().measured_decrease(1.2),
            "adaptive_rate.measured_decrease",
        ),
        (
            AdaptiveRate::new().regrowth(Duration::ZERO),
            "adaptive_rate.regrowth",
        ),
        (
            AdaptiveRate::new().measure_window(Duration::from_secs(3600)),
            "adaptive_rate.measure_window",
        ),
        (
            AdaptiveRate::new().lift_after(Duration::ZERO),
            "adaptive_rate.lift_after",
        ),
    ];
    for (rate, setting) in cases {
        let err = BreakerLayer::builder()
            .adaptive_rate(rate)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), setting);
    }
}

#[tokio::test(start_paused = true)]
async fn a_paced_call_dropped_before_its_slot_gives_the_slot_back() {
    let upstream = Scripted::new([status(429)], status(200));
    let breaker = BreakerLayer::new();
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    // The throttled answer begins a limit; over its first measure (a second) one call was
    // admitted: the rate starts at 90 % of 1 a second, and the next call takes the first slot
    // at once.
    let _ = svc.clone().oneshot(get("/")).await;
    svc.clone().oneshot(get("/")).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    svc.clone().oneshot(get("/")).await.unwrap();
    let first = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(first.code(), Code::Paced);
    let wait = first.retry_after().unwrap();
    drop(first);
    // The slot it reserved is free again: the next caller gets the same wait, not a later one.
    let second = svc.clone().oneshot(get("/")).await.unwrap_err();
    assert_eq!(second.code(), Code::Paced);
    assert_eq!(second.retry_after().unwrap(), wait);
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_a_slot_never_runs_past_the_deadline() {
    // One 429 begins a limit; its retry is the only call admitted over the first measure (a
    // second): the rate starts at 0.9 a second, a slot every 1.1 s.
    let upstream = Scripted::new([status(429)], status(200));
    let breaker = BreakerLayer::new();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::default()
                .deadline(Duration::from_millis(500))
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(upstream.clone());
    svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(upstream.calls(), 2);
    tokio::time::advance(Duration::from_secs(1)).await;
    // The next call takes the first slot at once; the one after is 1.1 s away, past a 500 ms
    // deadline.
    svc.clone().oneshot(get("/")).await.unwrap();
    let calls = upstream.calls();
    assert_eq!(calls, 3);
    let started = Instant::now();
    let f = svc.clone().oneshot(get("/")).await.unwrap_err();
    let attempts = f.notes().get::<Attempts>().unwrap();
    assert_eq!(attempts.give_up(), GiveUp::DeadlineExceeded);
    assert_eq!(attempts.count(), 0, "a held-back call is no attempt");
    assert_eq!(upstream.calls(), calls, "nothing sent");
    assert!(
        Instant::now() - started < Duration::from_millis(500),
        "given up at once, not slept"
    );
}

/// A process that sat idle after its start (a restart at night, a breaker opened on the
/// store's evidence) measures the rate the provider took from its first answer, not from the
/// breaker's making: the peak reads what was sent.
#[tokio::test(start_paused = true)]
async fn the_peak_is_the_rate_sent_not_diluted_by_an_idle_start() {
    let upstream = Scripted::new((0..20).map(|_| status(200)), status(429));
    let layer = BreakerLayer::new();
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(upstream);
    tokio::time::advance(Duration::from_secs(60)).await;
    // 5 a second for 4 s, then a 429.
    for _ in 0..20 {
        svc.clone().oneshot(get("/")).await.unwrap();
        tokio::time::advance(Duration::from_millis(200)).await;
    }
    svc.clone().oneshot(get("/")).await.unwrap_err();
    // The limit's first measure (a second, nothing sent) keeps the rate taken before.
    tokio::time::advance(Duration::from_secs(1)).await;
    let peak = handle.send_rate_peak().unwrap();
    assert!((4.5..=5.5).contains(&peak), "peak {peak}/s, 5/s sent");
}

/// The provider throttles before any call succeeded (so the rate starts at its floor): the
/// rate grows back to what the provider takes within seconds.
#[tokio::test(start_paused = true)]
async fn a_provider_that_throttles_before_any_success_is_still_sent_its_rate() {
    let mut quota = Quota::new(50);
    quota.closed_for = Duration::from_millis(100);
    let svc = ServiceBuilder::new()
        .layer(BackstopLayer::http(Duration::from_secs(2)))
        .service(quota.clone());
    let start = Instant::now();
    let end = start + Duration::from_secs(30);
    let delivered = Arc::new(Mutex::new(0u64));
    let mut callers = Vec::new();
    for c in 0..100 {
        let svc = svc.clone();
        let delivered = delivered.clone();
        callers.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < end {
                match svc.clone().oneshot(keyed(&format!("c{c}-{i}"))).await {
                    // Counted from 5 s on: the rate starts at its floor.
                    Ok(_) if Instant::now() >= start + Duration::from_secs(5) => {
                        *delivered.lock().unwrap() += 1;
                    }
                    Ok(_) => {}
                    Err(_) => tokio::task::yield_now().await,
                }
                i += 1;
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let ok = *delivered.lock().unwrap();
    assert!(
        ok as f64 >= 0.9 * 50.0 * 25.0,
        "within 10 % of 50/s from 5 s on: {ok} in 25 s"
    );
    assert!(quota.delivered().values().all(|n| *n == 1));
}

/// Twenty messages at once through `svc` to `quota`: how many failed.
async fn twenty_at_once<S>(svc: S) -> usize
where
    S: Service<http::Request<String>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    S::Response: Send,
{
    let calls: Vec<_> = (0..20)
        .map(|i| tokio::spawn(svc.clone().oneshot(keyed(&format!("m{i}")))))
        .collect();
    let mut failed = 0;
    for call in calls {
        failed += usize::from(call.await.unwrap().is_err());
    }
    failed
}

#[tokio::test(start_paused = true)]
async fn a_tower_buffer_around_the_preset_or_inside_it_keeps_the_turns() {
    // The preset behind a `Buffer`, as a service shared by many tasks is often written.
    let quota = Quota::new(5);
    let svc = ServiceBuilder::new()
        .buffer(64)
        .layer(BackstopLayer::http(Duration::from_secs(2)))
        .service(quota.clone());
    assert_eq!(twenty_at_once(svc).await, 0);
    assert_eq!(quota.delivered().len(), 20);
    assert!(quota.delivered().values().all(|n| *n == 1));
    // A `Buffer` between the retry layer and the breaker: the held-back call's failure, and
    // its place in the queue, cross it.
    let quota = Quota::new(5);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::default())
        .buffer(64)
        .layer(BreakerLayer::new())
        .layer(ClassifyLayer::http())
        .service(quota.clone());
    // The buffer's worker sends the first burst before any answer is read (15 of 20 answered
    // 429 at once); the retries then wait their turns.
    assert_eq!(twenty_at_once(svc).await, 0);
    let delivered = quota.delivered();
    assert_eq!(delivered.len(), 20);
    assert!(delivered.values().all(|n| *n == 1));
    let (_, late_429) = quota.after(1);
    assert!(
        late_429 <= 2,
        "after the first second, {late_429} throttled"
    );
}
