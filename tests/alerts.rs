//! In-process alerts (`observe::Alerts`): each rule raised as it happens and cleared when its
//! condition ends, through the hook and the list of active alerts (their log lines are in
//! tests/alerts_tracing.rs). On
//! tokio's paused clock with in-process services; the dead letters are real records of a
//! dead-letter layer over a memory store.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Scripted, get, no_jitter, post_with_key, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::observe::{Alerts, Event, Listener};
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{Alert, AlertRules, MemoryStore};

type Told = Arc<Mutex<Vec<(String, bool)>>>;

/// Alerts whose hook writes down each raise and clear as `(rule/detail, firing)`.
fn alerts() -> (Alerts, Told) {
    let told = Told::default();
    let sink = Arc::clone(&told);
    let alerts = Alerts::new().on_alert(move |alert, firing| {
        let detail = match alert {
            Alert::ClassShare { class, .. } => format!("class_share/{class}"),
            Alert::BreakerOpen { breaker } => format!("breaker_open/{breaker}"),
            Alert::SendRateLow { breaker, .. } => format!("send_rate_low/{breaker}"),
            Alert::NewCode { code, .. } => format!("new_code/{code}"),
            other => other.rule().to_owned(),
        };
        sink.lock().unwrap().push((detail, firing));
    });
    (alerts, told)
}

fn taken(told: &Told) -> Vec<(String, bool)> {
    std::mem::take(&mut *told.lock().unwrap())
}

fn told(detail: &str, firing: bool) -> (String, bool) {
    (detail.to_owned(), firing)
}

#[tokio::test(start_paused = true)]
async fn a_breaker_that_opens_raises_an_alert_cleared_when_it_closes() {
    let (alerts, log) = alerts();
    let breaker = BreakerLayer::builder()
        .name("mail")
        .consecutive_failures(2)
        .open_for(Duration::from_secs(10))
        .listener(alerts.clone())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(Scripted::new([status(503), status(503)], status(200)));
    for _ in 0..2 {
        svc.clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(taken(&log), [told("breaker_open/mail", true)]);
    assert_eq!(
        alerts.active(),
        [Alert::BreakerOpen {
            breaker: "mail".into()
        }]
    );

    // Half-open is still an outage: no clear, and no second raise when the probe closes it.
    tokio::time::advance(Duration::from_secs(10)).await;
    svc.clone().oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(taken(&log), [told("breaker_open/mail", false)]);
    assert!(alerts.active().is_empty());
}

/// A breaker named `mail` telling `alerts`, over a provider that takes the first 50 requests
/// (sent in the first second) and answers 429 to everything after; the service over it.
async fn throttling_after_fifty(
    alerts: &Alerts,
) -> (
    BreakerLayer,
    tower::util::BoxCloneService<
        http::Request<String>,
        http::Response<()>,
        tower_backstop::Failure<http::Response<()>>,
    >,
) {
    let breaker = BreakerLayer::builder()
        .name("mail")
        .listener(alerts.clone())
        .build()
        .unwrap();
    let throttling = tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .layer(breaker.clone())
            .layer(ClassifyLayer::http())
            .service(Scripted::new((0..50).map(|_| status(200)), status(429))),
    );
    for _ in 0..50 {
        throttling
            .clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap();
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    (breaker, throttling)
}

/// A provider that keeps answering 429: the breaker stays closed, its send rate falls below
/// half of the peak it measured, and the alert is raised with the breaker's own figures;
/// once the provider takes everything again the limit is lifted and the alert cleared.
#[tokio::test(start_paused = true)]
async fn a_send_rate_below_half_of_its_peak_raises_an_alert_cleared_when_lifted() {
    let (alerts, log) = alerts();
    // 50 requests taken in the first second, then 429 to everything.
    let (breaker, throttling) = throttling_after_fifty(&alerts).await;
    let handle = breaker.handle();
    // The first 429 begins a limit; its first measure (a second, nothing sent) keeps the 50/s
    // taken before, and the rate starts at 0.9 of it: not below half yet.
    throttling
        .clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    let first = handle.send_rate().unwrap();
    assert!((first - 45.0).abs() < 1e-6, "{first}");
    assert!(taken(&log).is_empty());
    assert!(alerts.active().is_empty());
    // Throttled a second later and on, the rate is cut again until it is below half.
    let mut raised = None;
    for _ in 0..10 {
        tokio::time::advance(Duration::from_millis(1_100)).await;
        let _ = throttling.clone().oneshot(get("http://mail.test/")).await;
        if let [alert] = &alerts.active()[..] {
            raised = Some(alert.clone());
            break;
        }
    }
    let Some(Alert::SendRateLow {
        breaker: name,
        rate,
        peak,
    }) = raised
    else {
        panic!("no send-rate alert: {:?}", alerts.active());
    };
    assert_eq!(name, "mail");
    assert_eq!(Some(peak), handle.send_rate_peak());
    assert_eq!(Some(rate), handle.send_rate(), "the rate at the raise");
    assert!(rate < 0.5 * peak, "{rate} of {peak}");
    assert_eq!(handle.state(), State::Closed, "a 429 does not open it");
    assert_eq!(taken(&log), [told("send_rate_low/mail", true)]);

    // The provider takes everything again; quiet for the lift time, the next call lifts the
    // limit and the alert clears.
    let healthy = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(200)));
    tokio::time::advance(Duration::from_secs(31)).await;
    healthy
        .clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap();
    assert_eq!(handle.send_rate(), None);
    assert_eq!(taken(&log), [told("send_rate_low/mail", false)]);
    assert!(alerts.active().is_empty());
}

/// The same provider, but no call comes after the alert: the breaker watches its limit, calls
/// or not, so the rate is told each second (it does not grow with no call waiting for a turn,
/// RFC 9438 §5.8) and the limit is lifted once the provider has been quiet for the lift time,
/// clearing the alert, the handle and the health report agreeing all along.
#[tokio::test(start_paused = true)]
async fn with_no_more_calls_the_limit_is_lifted_on_time_and_the_alert_clears() {
    let (alerts, log) = alerts();
    let (breaker, throttling) = throttling_after_fifty(&alerts).await;
    let handle = breaker.handle();
    let health = breaker.health();
    for _ in 0..10 {
        let _ = throttling.clone().oneshot(get("http://mail.test/")).await;
        if !alerts.active().is_empty() {
            break;
        }
        tokio::time::advance(Duration::from_millis(1_100)).await;
    }
    assert_eq!(taken(&log), [told("send_rate_low/mail", true)]);
    let peak = handle.send_rate_peak().unwrap();
    let low = handle.send_rate().unwrap();
    // No call from here on: the rate told each second stays where the last cut left it, the
    // alert firing, every reader agreeing.
    for _ in 1..=27 {
        tokio::time::sleep(Duration::from_millis(1_001)).await;
        let rate = handle.send_rate().expect("limited until the lift time");
        assert_eq!(health.report().breakers[0].send_rate, Some(rate));
        assert!(
            (rate - low).abs() < 1e-6,
            "no growth with no call waiting: {rate}"
        );
        assert!(rate < 0.5 * peak);
        assert_eq!(alerts.active().len(), 1);
    }
    // Past the lift time (30 s after the last 429): lifted, with no call, every reader agrees
    // and the alert clears.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(handle.send_rate(), None);
    assert_eq!(health.report().breakers[0].send_rate, None);
    assert!(alerts.active().is_empty());
    assert_eq!(taken(&log), [told("send_rate_low/mail", false)]);
}

/// The rule on the rates told, as the Prometheus rule reads the gauges: below half of the
/// peak raises once per breaker, half or more clears while still limited, a rate that is not
/// a number never fires.
#[tokio::test(start_paused = true)]
async fn the_send_rate_rule_follows_the_rates_told() {
    let (alerts, log) = alerts();
    let rate = |breaker: &str, rate: Option<f64>, peak: f64| {
        alerts.on_event(&Event::SendRate {
            breaker,
            rate,
            peak,
            reason: "rising",
        });
    };
    rate("a", Some(35.0), 50.0);
    rate("b", Some(f64::NAN), 50.0);
    rate("c", Some(1.0), f64::NAN);
    assert!(taken(&log).is_empty());
    rate("a", Some(24.0), 50.0);
    rate("a", Some(20.0), 50.0);
    rate("b", Some(4.0), 10.0);
    assert_eq!(
        taken(&log),
        [told("send_rate_low/a", true), told("send_rate_low/b", true)]
    );
    // Half the peak is no longer below half: cleared, though still limited.
    rate("a", Some(25.0), 50.0);
    rate("b", None, 10.0);
    assert_eq!(
        taken(&log),
        [
            told("send_rate_low/a", false),
            told("send_rate_low/b", false)
        ]
    );
    assert!(alerts.active().is_empty());
}

/// An hour of one permanent failure a minute, then 6 a minute of transient ones: a spike
/// against the baseline, and "transient" above 20 % of the window; both clear once the
/// window has only the old rate again.
#[tokio::test(start_paused = true)]
async fn a_dead_letter_spike_and_a_class_share_are_raised_and_cleared() {
    let (alerts, log) = alerts();
    let store = Arc::new(MemoryStore::new());
    let stack = |upstream: Scripted| {
        ServiceBuilder::new()
            .layer(DeadLetterLayer::from_arc(store.clone()).listener(alerts.clone()))
            .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
            .layer(ClassifyLayer::http())
            .service(upstream)
    };
    let mut n = 0;
    let mut fail = |code: u16| {
        n += 1;
        stack(Scripted::always(status(code))).oneshot(post_with_key(
            "http://mail.test/",
            "{}",
            &format!("m-{n}"),
        ))
    };
    for _ in 0..65 {
        fail(400).await.unwrap_err();
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    let seen = taken(&log);
    assert!(
        !seen.iter().any(|(d, _)| d == "dead_letter_spike"),
        "a steady rate is no spike: {seen:?}"
    );
    assert!(
        seen.contains(&told("class_share/permanent", true)),
        "one class alone is 100 % of the window: {seen:?}"
    );

    for _ in 0..3 {
        for _ in 0..6 {
            fail(503).await.unwrap_err();
        }
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    let seen = taken(&log);
    assert!(seen.contains(&told("dead_letter_spike", true)), "{seen:?}");
    assert!(
        seen.contains(&told("class_share/transient", true)),
        "{seen:?}"
    );
    let spike = alerts
        .active()
        .into_iter()
        .find_map(|a| match a {
            Alert::RateSpike {
                per_minute,
                baseline_per_minute,
            } => Some((per_minute, baseline_per_minute)),
            _ => None,
        })
        .expect("a spike is active");
    assert!(spike.0 >= 3.0 * spike.1, "{spike:?}");

    // Back to one permanent failure a minute: after a window, neither rule holds.
    for _ in 0..8 {
        fail(400).await.unwrap_err();
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    let seen = taken(&log);
    assert!(seen.contains(&told("dead_letter_spike", false)), "{seen:?}");
    assert!(
        seen.contains(&told("class_share/transient", false)),
        "{seen:?}"
    );
    assert!(
        alerts
            .active()
            .iter()
            .all(|a| !matches!(a, Alert::RateSpike { .. })),
        "{:?}",
        alerts.active()
    );
}

/// A burst of dead letters raises the spike and the class-share alerts; then nothing more
/// happens (no event at all): both clear on time, once the burst has left the window, as
/// Prometheus's rules do, not at some later event.
#[tokio::test(start_paused = true)]
async fn with_no_more_events_a_spike_clears_once_it_left_the_window() {
    let (alerts, log) = alerts();
    let store = Arc::new(MemoryStore::new());
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(store.clone()).listener(alerts.clone()))
        .layer(RetryPolicy::new().max_attempts(1).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));
    for n in 0..20 {
        stack
            .clone()
            .oneshot(post_with_key("http://mail.test/", "{}", &format!("m-{n}")))
            .await
            .unwrap_err();
    }
    let seen = taken(&log);
    assert!(seen.contains(&told("dead_letter_spike", true)), "{seen:?}");
    assert!(
        seen.contains(&told("class_share/transient", true)),
        "{seen:?}"
    );
    // Within the window (5 minutes): still firing.
    tokio::time::sleep(Duration::from_secs(4 * 60)).await;
    assert!(taken(&log).is_empty());
    assert_eq!(alerts.active().len(), 2, "{:?}", alerts.active());
    // Past it, with no event: cleared.
    tokio::time::sleep(Duration::from_secs(2 * 60)).await;
    let seen = taken(&log);
    assert!(seen.contains(&told("dead_letter_spike", false)), "{seen:?}");
    assert!(
        seen.contains(&told("class_share/transient", false)),
        "{seen:?}"
    );
    assert!(alerts.active().is_empty(), "{:?}", alerts.active());
}

/// A deferred record waits for the scheduler: it is no dead letter, however many there are.
#[tokio::test(start_paused = true)]
async fn deferred_records_raise_no_dead_letter_alert() {
    let (alerts, log) = alerts();
    for _ in 0..100 {
        alerts.on_event(&Event::DeadLetterStored {
            id: "m",
            class: tower_backstop::Class::THROTTLED,
            code: tower_backstop::Code::Http(http::StatusCode::TOO_MANY_REQUESTS),
            deferred: true,
        });
    }
    assert_eq!(taken(&log), []);
}

#[tokio::test(start_paused = true)]
async fn a_code_never_seen_after_a_first_window_is_new() {
    let (alerts, log) = alerts();
    let svc = |code: u16| {
        ServiceBuilder::new()
            .layer(
                RetryPolicy::new()
                    .max_attempts(1)
                    .listener(alerts.clone())
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::http())
            .service(Scripted::always(status(code)))
    };
    // Within the first window every code is new to the listener: no alert.
    svc(503)
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    svc(429)
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    tokio::time::advance(Duration::from_secs(5 * 60)).await;
    svc(503)
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(taken(&log), []);
    svc(418)
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(taken(&log), [told("new_code/http 418", true)]);
    svc(418)
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(taken(&log), [], "seen once, no longer new");
    // Active for one window, then cleared at the next evaluation.
    tokio::time::advance(Duration::from_secs(5 * 60)).await;
    svc(200).oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(taken(&log), [told("new_code/http 418", false)]);
}

/// Twenty minutes of deliveries with an empty backlog, then deliveries stop and the backlog
/// grows: raised; cleared once it shrinks.
#[tokio::test(start_paused = true)]
async fn a_backlog_growing_while_deliveries_fall_is_raised() {
    let (alerts, log) = alerts();
    let rules = AlertRules::default();
    let alerts = alerts.rules(rules);
    let delivered = Event::Resent {
        id: "m",
        outcome: "delivered",
    };
    for _ in 0..20 {
        for _ in 0..10 {
            alerts.on_event(&delivered);
        }
        alerts.on_event(&Event::Backlog { deferred: 0 });
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert_eq!(taken(&log), [], "a steady flow and no backlog");
    let mut backlog = 0;
    for _ in 0..11 {
        backlog += 30;
        alerts.on_event(&delivered);
        alerts.on_event(&Event::Backlog { deferred: backlog });
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert_eq!(taken(&log), [told("backlog_growing", true)]);
    let Some(Alert::BacklogGrowing {
        grown_by,
        delivered_per_minute,
        before_per_minute,
        ..
    }) = alerts.active().into_iter().next()
    else {
        panic!("{:?}", alerts.active());
    };
    assert!(grown_by > 0);
    assert!(delivered_per_minute < 0.5 * before_per_minute);

    // The scheduler drains it: the backlog falls below what it was a window ago.
    for _ in 0..11 {
        backlog = backlog.saturating_sub(40);
        alerts.on_event(&Event::Backlog { deferred: backlog });
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert_eq!(taken(&log), [told("backlog_growing", false)]);
}

/// A hook that panics is caught: the call goes on, the next alert is still told, and every
/// event still reaches the listener given with `then`.
#[tokio::test(start_paused = true)]
async fn a_panicking_hook_is_caught_and_events_go_on_to_the_next_listener() {
    let forwarded = Arc::new(Mutex::new(0_u32));
    let count = Arc::clone(&forwarded);
    let alerts = Alerts::new()
        .on_alert(|_, _| panic!("a hook's bug"))
        .then(move |_: &Event<'_>| *count.lock().unwrap() += 1);
    let breaker = BreakerLayer::builder()
        .consecutive_failures(1)
        .listener(alerts.clone())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .backoff(no_jitter(10))
                .max_attempts(1)
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(ClassifyLayer::http())
        .service(Scripted::always(status(503)));
    let failure = svc
        .clone()
        .oneshot(get("http://mail.test/"))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), tower_backstop::Class::TRANSIENT);
    assert_eq!(alerts.active().len(), 1, "raised despite the hook's panic");
    let transitions = *forwarded.lock().unwrap();
    assert!(transitions >= 1, "the transition reached the next listener");
    let _ = State::Open;
}
