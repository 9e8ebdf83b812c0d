//! `Health`: every breaker of a stack (keyed ones included) with its state, failure rate, window
//! and time to half-open; unhealthy while an essential breaker is open. Logic on tokio's paused
//! clock with in-process services; the axum route on a real server on 127.0.0.1 with a real
//! reqwest client.

mod support;

use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_backstop::breaker::{BreakerLayer, State};
use tower_backstop::classify::{ClassifyLayer, HttpClassifier};
use tower_backstop::observe::{BreakerHealth, HealthReport};
use tower_backstop::{BackstopLayer, BoxError};

use support::get;

/// An upstream where every host whose name starts with `down` answers 503, every other 200.
async fn upstream(req: http::Request<String>) -> Result<http::Response<()>, BoxError> {
    let down = req.uri().host().is_some_and(|h| h.starts_with("down"));
    let status = if down { 503 } else { 200 };
    Ok(http::Response::builder().status(status).body(()).unwrap())
}

async fn call<S>(svc: &S, uri: &str, n: usize)
where
    S: Service<http::Request<String>> + Clone,
{
    for _ in 0..n {
        let _ = svc.clone().oneshot(get(uri)).await;
    }
}

fn find<'a>(report: &'a HealthReport, name: &str) -> &'a BreakerHealth {
    report
        .breakers
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no breaker {name} in {report:?}"))
}

fn names(report: &HealthReport) -> Vec<&str> {
    report.breakers.iter().map(|b| b.name.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn lists_every_key_with_its_state_and_time_to_half_open() {
    let layer = BreakerLayer::consecutive_failures(3)
        .open_for(Duration::from_secs(10))
        .per_host();
    let health = layer.health();
    assert_eq!(
        names(&health.report()),
        Vec::<&str>::new(),
        "before any call no breaker is listed: the one of requests without a key is not \
         listed until such a request uses it"
    );
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&svc, "http://up.test/", 2).await;
    call(&svc, "http://down.test/", 2).await;
    assert_eq!(
        find(&health.report(), "down.test:80").consecutive_failures,
        2
    );
    call(&svc, "http://down.test/", 1).await;
    call(&svc, "http://down.test/", 2).await; // rejected

    let report = health.report();
    assert_eq!(
        names(&report),
        ["down.test:80", "up.test:80"],
        "the keys in order; no unkeyed breaker, since every request had a key"
    );
    assert!(report.healthy, "no breaker is essential");
    let down = find(&report, "down.test:80");
    assert_eq!(down.state, State::Open);
    assert_eq!(down.half_open_in, Some(Duration::from_secs(10)));
    assert_eq!(
        down.consecutive_failures, 0,
        "the count starts again at the trip"
    );
    assert_eq!((down.opened, down.rejected), (1, 2));
    assert!(!down.essential);
    let cause = down.cause.as_deref().expect("an open breaker has a cause");
    assert!(cause.contains("3 failures"), "{cause}");
    assert!(cause.contains("503"), "{cause}");
    assert_eq!(
        down.failure_rate, None,
        "a consecutive-failures rule has no rate"
    );
    let up = find(&report, "up.test:80");
    assert_eq!(up.state, State::Closed);
    assert_eq!(
        (up.half_open_in, up.cause.as_deref(), up.opened, up.rejected),
        (None, None, 0, 0)
    );

    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        find(&health.report(), "down.test:80").half_open_in,
        Some(Duration::from_secs(6)),
        "the time left, not the open duration"
    );
    tokio::time::advance(Duration::from_secs(6)).await;
    let report = health.report();
    let down = find(&report, "down.test:80");
    assert_eq!(
        down.state,
        State::HalfOpen,
        "its open duration is over: it half-opens at the next call, and says so before one comes"
    );
    assert_eq!(
        down.half_open_in, None,
        "only an open breaker has a time to half-open"
    );
    assert!(down.cause.is_some(), "half-open still says why it opened");

    let _ = svc.clone().oneshot(get("http://down.test/")).await; // the probe fails
    let down = find(&health.report(), "down.test:80").clone();
    assert_eq!(down.state, State::Open);
    assert_eq!(down.half_open_in, Some(Duration::from_secs(10)));
    assert_eq!(down.opened, 2);

    // A request without a key (a relative URI, no Host header) uses the unkeyed breaker: from
    // then on it is listed, first.
    let _ = svc.clone().oneshot(get("/relative")).await;
    assert_eq!(
        names(&health.report()),
        ["unkeyed", "down.test:80", "up.test:80"],
        "the unkeyed breaker first, then the keys in order"
    );
}

#[tokio::test(start_paused = true)]
async fn unhealthy_only_while_an_essential_breaker_is_open_or_forced_open() {
    let layer = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(5))
        .per_host();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    let down_essential = layer.health().essential("down.test:80");
    let up_essential = layer.health().essential("up.test:80");
    let never_seen = layer.health().essential("other.test:80");

    call(&svc, "http://up.test/", 1).await;
    call(&svc, "http://down.test/", 1).await;
    assert!(down_essential.report().healthy, "one failure: still closed");
    call(&svc, "http://down.test/", 1).await;

    let report = down_essential.report();
    assert!(!report.healthy, "the essential breaker is open: {report:?}");
    assert!(find(&report, "down.test:80").essential);
    assert!(!find(&report, "up.test:80").essential);
    assert!(
        up_essential.report().healthy,
        "another host's open breaker does not make it unhealthy"
    );
    assert!(
        never_seen.report().healthy,
        "a key with no breaker yet is not open"
    );

    // No call comes once the open duration is over (as when a readiness probe took the instance
    // out of rotation): the report must not keep it out for ever.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        find(&down_essential.report(), "down.test:80").state,
        State::HalfOpen
    );
    assert!(
        down_essential.report().healthy,
        "half-open lets probes through: not down"
    );

    let up = layer.handle_for("up.test:80").expect("seen");
    up.force_open();
    assert!(!up_essential.report().healthy, "forced open is down");
    up.disable();
    let report = up_essential.report();
    assert!(report.healthy, "disabled lets every call through");
    assert_eq!(find(&report, "up.test:80").state, State::Disabled);
    assert_eq!(find(&report, "up.test:80").cause, None);
}

#[tokio::test(start_paused = true)]
async fn a_rate_rule_reports_the_failure_rate_of_its_window() {
    let layer = BreakerLayer::builder()
        .failure_rate(0.5)
        .count_window(20)
        .minimum_calls(20)
        .build()
        .unwrap()
        .name("mail");
    let health = layer.health();
    let report = health.report();
    assert_eq!(names(&report), ["mail"]);
    assert_eq!(
        report.breakers[0].failure_rate, None,
        "no call in the window yet: no rate"
    );
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&svc, "http://up.test/", 3).await;
    call(&svc, "http://down.test/", 1).await;
    let mail = &health.report().breakers[0];
    assert_eq!(mail.state, State::Closed);
    assert_eq!((mail.window_calls, mail.window_failures), (4, 1));
    assert_eq!(mail.failure_rate, Some(0.25));
    assert_eq!(mail.consecutive_failures, 0, "no consecutive-failures rule");
}

#[tokio::test(start_paused = true)]
async fn reading_never_keeps_a_key_from_eviction() {
    let layer = BreakerLayer::builder()
        .consecutive_failures(2)
        .per_host()
        .max_keys(1)
        .build()
        .unwrap();
    let health = layer.health();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&svc, "http://a.test/", 1).await;
    assert_eq!(names(&health.report()), ["a.test:80"]);
    call(&svc, "http://b.test/", 1).await;
    assert_eq!(
        names(&health.report()),
        ["b.test:80"],
        "the idle key was evicted for the new one although a reader exists"
    );
}

#[tokio::test(start_paused = true)]
async fn several_stacks_in_one_report_and_the_presets_breakers() {
    let mail = BreakerLayer::consecutive_failures(1).name("mail");
    let backstop = BackstopLayer::http(Duration::from_secs(1));
    let health = mail.health().and(backstop.health()).essential("mail");
    assert_eq!(
        names(&health.report()),
        ["mail"],
        "the preset's breakers are per host: none before a request"
    );

    let svc = ServiceBuilder::new()
        .layer(backstop)
        .service(service_fn(upstream));
    call(&svc, "http://up.test/", 1).await;
    assert_eq!(
        names(&health.report()),
        ["mail", "up.test:80"],
        "the preset's per-host breakers, as requests reach them"
    );
    let preset_breaker = find(&health.report(), "up.test:80").clone();
    assert_eq!(preset_breaker.state, State::Closed);
    assert_eq!(
        (preset_breaker.window_calls, preset_breaker.failure_rate),
        (1, Some(0.0)),
        "the preset's rule is a failure rate"
    );

    let mail_svc = ServiceBuilder::new()
        .layer(mail)
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&mail_svc, "http://down.test/", 1).await;
    assert!(
        !health.report().healthy,
        "an essential name applies across the combined layers"
    );
}

#[test]
fn serialises_states_as_words_and_durations_as_milliseconds_rounded_up() {
    let layer = BreakerLayer::new().name("mail");
    let json = serde_json::to_value(layer.health().essential("mail").report()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "healthy": true,
            "breakers": [{
                "name": "mail",
                "state": "closed",
                "essential": true,
                "failure_rate": null,
                "window_calls": 0,
                "window_failures": 0,
                "consecutive_failures": 0,
                "half_open_in_ms": null,
                "cause": null,
                "opened": 0,
                "rejected": 0,
                "send_rate": null,
                "send_rate_peak": null,
                "concurrency_limit": null,
            }]
        })
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_in_rounds_up_to_the_millisecond() {
    let layer = BreakerLayer::consecutive_failures(1)
        .open_for(Duration::from_micros(1_500))
        .name("mail");
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&svc, "http://down.test/", 1).await;
    let json = serde_json::to_value(layer.health().report()).unwrap();
    assert_eq!(json["breakers"][0]["state"], "open");
    assert_eq!(
        json["breakers"][0]["half_open_in_ms"], 2,
        "1.5 ms is 2, never 1"
    );
    assert!(json["breakers"][0]["cause"].is_string());
}

/// The route of the docs on a real axum server, read with a real reqwest client: `200` and the
/// JSON while healthy, `503` while the essential breaker is open, never cached.
#[cfg(feature = "axum")]
#[tokio::test]
async fn the_axum_route_answers_503_while_an_essential_breaker_is_open() {
    use axum::routing::get as route_get;

    let layer = BreakerLayer::new().name("mail");
    let health = layer.health().essential("mail");
    let base = support::serve(
        axum::Router::new().route("/health", route_get(move || async move { health.report() })),
    )
    .await;
    let client = reqwest::Client::new();

    let response = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["healthy"], true);
    assert_eq!(body["breakers"][0]["name"], "mail");

    layer.handle().force_open();
    let response = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["healthy"], false);
    assert_eq!(body["breakers"][0]["state"], "forced_open");
    assert_eq!(body["breakers"][0]["essential"], true);
}

/// A dispatcher's view of many providers, on real servers: four providers on 127.0.0.1, one
/// breaker per host, and the route of the docs with `unhealthy_when_open(0.5)`, read with a
/// real reqwest client. Two of four down is not more than half: `200`, each open breaker with
/// its host, cause and time to half-open. Three of four: `503`. No `unkeyed` entry: every
/// request had a host.
#[cfg(feature = "axum")]
#[tokio::test]
async fn many_providers_are_unhealthy_only_when_more_than_a_share_is_open() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::routing::{get as route_get, post};
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::Layer;

    let mut providers = Vec::new();
    for _ in 0..4 {
        let down = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&down);
        let router = axum::Router::new().route(
            "/send",
            post(move || {
                let down = flag.load(Ordering::SeqCst);
                async move {
                    if down {
                        http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        http::StatusCode::ACCEPTED
                    }
                }
            }),
        );
        let base = support::serve(router).await;
        providers.push((base, down));
    }
    let layer = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(60))
        .per_host();
    let health = layer.health().unhealthy_when_open(0.5);
    let route = health.clone();
    let admin = support::serve(
        axum::Router::new().route("/ready", route_get(move || async move { route.report() })),
    )
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = ClassifyLayer::http().layer(client);
    let stack = layer.layer(stack);
    let send = |base: &str| {
        let request = http::Request::post(format!("{base}/send"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        stack.clone().oneshot(request)
    };
    let reader = reqwest::Client::new();
    let ready = || async {
        let response = reader.get(format!("{admin}/ready")).send().await.unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        (status, body)
    };

    for (base, _) in &providers {
        send(base).await.unwrap();
    }
    let (status, body) = ready().await;
    assert_eq!(status, 200);
    let hosts: Vec<String> = providers
        .iter()
        .map(|(base, _)| base.trim_start_matches("http://").to_owned())
        .collect();
    let mut sorted = hosts.clone();
    sorted.sort();
    let names: Vec<&str> = body["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, sorted, "one breaker per host, no unkeyed one");

    // Two providers down: half of them is not more than half.
    for (base, down) in &providers[..2] {
        down.store(true, Ordering::SeqCst);
        for _ in 0..2 {
            send(base).await.unwrap_err();
        }
    }
    let (status, body) = ready().await;
    assert_eq!(status, 200, "{body}");
    for host in &hosts[..2] {
        let b = body["breakers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == host.as_str())
            .unwrap();
        assert_eq!(b["state"], "open");
        let cause = b["cause"].as_str().expect("an open breaker says why");
        assert!(cause.contains("503"), "{cause}");
        let half_open_in = b["half_open_in_ms"]
            .as_u64()
            .expect("and when it half-opens");
        assert!(
            half_open_in > 50_000 && half_open_in <= 60_000,
            "{half_open_in}"
        );
    }

    // A third: more than half.
    let (base, down) = &providers[2];
    down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        send(base).await.unwrap_err();
    }
    let (status, body) = ready().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["healthy"], false);
    assert!(!health.report().healthy);
    assert!(
        layer.health().unhealthy_when_open(0.75).report().healthy,
        "three of four is not more than 75 %"
    );
    assert!(
        !layer
            .health()
            .unhealthy_when_open(0.75)
            .and(layer.health().unhealthy_when_open(0.5))
            .report()
            .healthy,
        "combined, the smaller share applies"
    );
}

#[tokio::test(start_paused = true)]
async fn the_share_rule_counts_open_and_forced_open_breakers_not_half_open_ones() {
    let layer = BreakerLayer::consecutive_failures(1)
        .open_for(Duration::from_secs(10))
        .per_host();
    assert!(
        layer.health().unhealthy_when_open(0.0).report().healthy,
        "no breaker: nothing is down"
    );
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(ClassifyLayer::new(HttpClassifier::new()))
        .service(service_fn(upstream));
    call(&svc, "http://up.test/", 1).await;
    call(&svc, "http://down.test/", 1).await;
    let half = layer.health().unhealthy_when_open(0.5);
    assert!(half.report().healthy, "one of two is not more than half");
    assert!(!layer.health().unhealthy_when_open(0.4).report().healthy);
    assert!(
        !layer.health().unhealthy_when_open(-1.0).report().healthy,
        "below 0: any open breaker"
    );
    assert!(
        layer
            .health()
            .unhealthy_when_open(f64::NAN)
            .report()
            .healthy,
        "NaN: never"
    );
    layer.handle_for("up.test:80").unwrap().force_open();
    assert!(!half.report().healthy, "forced open is down: two of two");
    tokio::time::advance(Duration::from_secs(10)).await;
    layer.handle_for("up.test:80").unwrap().reset();
    assert!(
        half.report().healthy,
        "the open duration is over: half-open is not down"
    );
}
