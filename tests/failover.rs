//! FailoverLayer and keyed breakers (`BreakerLayer::per_host`, `keyed_by`), on tokio's paused clock.

mod support;

use std::time::Duration;

use support::{Scripted, get, status};
use tower::{Layer, Service, ServiceExt};
use tower_backstop::breaker::{BreakerHandle, BreakerLayer, State};
use tower_backstop::classify::{Classify, ClassifyLayer, HttpClassifier};
use tower_backstop::failover::{Failover, FailoverLayer};
use tower_backstop::{Class, Failure};

type Response = http::Response<()>;

/// A scripted upstream behind the HTTP classifier.
type Classified = Classify<Scripted, HttpClassifier>;

/// `upstream` behind the HTTP classifier.
fn classified(upstream: &Scripted) -> Classified {
    ClassifyLayer::http().layer(upstream.clone())
}

/// `layer` over the classified `upstream`.
fn over<L: Layer<Classified>>(layer: L, upstream: &Scripted) -> L::Service {
    layer.layer(classified(upstream))
}

/// A failover from `primary` to `fallback` behind a breaker that opens for 10 s after 2
/// failures, with the breaker's handle.
fn failover(
    primary: &Scripted,
    fallback: &Scripted,
) -> (BreakerHandle, Failover<Classified, Classified>) {
    let layer = FailoverLayer::new(
        BreakerLayer::consecutive_failures(2).open_for(Duration::from_secs(10)),
        classified(fallback),
    );
    (layer.handle(), over(layer, primary))
}

/// Sends `req` through a clone of `svc` and returns its failure; panics on success.
async fn fail<S>(svc: &S, req: http::Request<String>) -> Failure<Response>
where
    S: Service<http::Request<String>, Error = Failure<Response>> + Clone,
    S::Response: std::fmt::Debug,
{
    svc.clone().oneshot(req).await.unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn with_the_primary_open_calls_reach_the_fallback_and_the_primary_is_probed_again() {
    // The primary fails three times, then recovers; the fallback always answers 202.
    let primary = Scripted::new([status(503), status(503), status(503)], status(200));
    let fallback = Scripted::always(status(202));
    let (handle, svc) = failover(&primary, &fallback);

    for _ in 0..2 {
        let f = fail(&svc, get("/")).await;
        assert_eq!(f.class(), Class::TRANSIENT);
    }
    assert_eq!(handle.state(), State::Open);

    // Open: every call goes to the fallback, none to the primary.
    for _ in 0..5 {
        assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 202);
    }
    assert_eq!((primary.calls(), fallback.calls()), (2, 5));
    assert_eq!(handle.stats().rejected, 5);

    // After the open duration the primary gets the probe; it fails, so the fallback again.
    tokio::time::advance(Duration::from_secs(10)).await;
    let f = fail(&svc, get("/")).await;
    assert_eq!(f.class(), Class::TRANSIENT, "the probe's own failure");
    assert_eq!(primary.calls(), 3);
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 202);
    assert_eq!(fallback.calls(), 6);

    // Next time the probe succeeds and the primary takes the traffic back.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    assert_eq!(handle.state(), State::Closed);
    for _ in 0..3 {
        assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), 200);
    }
    assert_eq!((primary.calls(), fallback.calls()), (7, 6));
}

#[tokio::test(start_paused = true)]
async fn the_fallback_is_polled_ready_only_when_the_primary_rejects() {
    let (fallback, mut fallback_handle) = tower_test::mock::pair::<&'static str, &'static str>();
    let layer = FailoverLayer::new(
        BreakerLayer::consecutive_failures(1).open_for(Duration::from_secs(30)),
        fallback,
    );
    let breaker = layer.handle();
    let (mut svc, mut primary) =
        tower_test::mock::spawn_layer::<&'static str, &'static str, _>(layer);
    // Closed: the fallback allows nothing, yet the primary is used.
    fallback_handle.allow(0);
    primary.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = tokio::spawn(svc.call("a"));
    let (req, send) = primary.next_request().await.unwrap();
    assert_eq!(req, "a");
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert_eq!(call.await.unwrap().unwrap_err().class(), Class::TRANSIENT);
    assert_eq!(breaker.state(), State::Open);
    // Open: readiness is the fallback's.
    assert!(svc.poll_ready().is_pending());
    fallback_handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let call = tokio::spawn(svc.call("b"));
    let (req, send) = fallback_handle.next_request().await.unwrap();
    assert_eq!(req, "b");
    send.send_response("from the fallback");
    assert_eq!(call.await.unwrap().unwrap(), "from the fallback");
}

#[tokio::test(start_paused = true)]
async fn where_a_call_goes_is_decided_in_poll_ready_even_if_the_breaker_trips_before_call() {
    // Ready while closed: the call belongs to the primary. The breaker opens between
    // `poll_ready` and `call` (another clone tripped it); the call still goes to the primary, as
    // decided, and is neither rejected nor sent to the fallback.
    let primary = Scripted::always(status(200));
    let fallback = Scripted::always(status(202));
    let (handle, mut svc) = failover(&primary, &fallback);
    svc.ready().await.unwrap();
    handle.force_open();
    let response = svc.call(get("/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!((primary.calls(), fallback.calls()), (1, 0));
    // The next call is decided under the open breaker: the fallback.
    assert_eq!(
        svc.ready()
            .await
            .unwrap()
            .call(get("/"))
            .await
            .unwrap()
            .status(),
        202
    );
    assert_eq!((primary.calls(), fallback.calls()), (1, 1));
}

fn to(host: &str) -> http::Request<String> {
    http::Request::get(format!("http://{host}/v1"))
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn keyed_breakers_open_per_host() {
    let upstream = Scripted::new([status(503), status(503)], status(200));
    let layer = BreakerLayer::builder()
        .consecutive_failures(2)
        .open_for(Duration::from_secs(10))
        .per_host()
        .build()
        .unwrap();
    let svc = over(layer.clone(), &upstream);
    for _ in 0..2 {
        let _ = svc.clone().oneshot(to("a.test")).await;
    }
    let a = layer.handle_for("a.test:80").unwrap();
    assert_eq!(a.state(), State::Open);
    assert_eq!(a.name(), "a.test:80");
    let f = fail(&svc, to("a.test")).await;
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(f.retry_after(), Some(Duration::from_secs(10)));
    assert!(
        f.to_string()
            .contains("breaker \"a.test:80\" is open; half-opens in 10s"),
        "{f}"
    );
    // Another host has its own, closed breaker.
    assert_eq!(
        svc.clone()
            .oneshot(to("b.test:8080"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        layer.handle_for("b.test:8080").unwrap().state(),
        State::Closed
    );
    assert_eq!(layer.keys(), ["a.test:80", "b.test:8080"]);
    assert_eq!(upstream.calls(), 3);
}

/// The small input: a keyed breaker that opens after 2 failures, 4 keys at most, over a
/// service answering 503.
#[tokio::test(start_paused = true)]
async fn spellings_of_one_host_share_one_breaker_and_do_not_fill_the_keys() {
    let upstream = Scripted::always(status(503));
    let layer = BreakerLayer::builder()
        .consecutive_failures(2)
        .per_host()
        .max_keys(4)
        .build()
        .unwrap();
    let svc = over(layer.clone(), &upstream);
    let _ = svc.clone().oneshot(to("API.mail.test")).await;
    let _ = svc.clone().oneshot(to("api.mail.test")).await;
    assert_eq!(layer.keys(), ["api.mail.test:80"]);
    assert_eq!(
        layer.handle_for("api.mail.test:80").unwrap().state(),
        State::Open,
        "one breaker saw both failures"
    );
    for spelling in [
        "Api.Mail.Test",
        "api.mail.test.",
        "API.MAIL.TEST:80",
        "api.MAIL.test",
    ] {
        assert_eq!(fail(&svc, to(spelling)).await.class(), Class::CIRCUIT_OPEN);
    }
    assert_eq!(layer.keys(), ["api.mail.test:80"]);
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn keyed_breakers_are_bounded_and_evict_the_least_recently_used_idle_one() {
    let upstream = Scripted::always(status(503));
    let layer = BreakerLayer::builder()
        .consecutive_failures(3)
        .per_host()
        .max_keys(2)
        .build()
        .unwrap();
    let svc = over(layer.clone(), &upstream);
    // a.test trips its breaker.
    for _ in 0..3 {
        let _ = svc.clone().oneshot(to("a.test")).await;
    }
    assert_eq!(layer.handle_for("a.test:80").unwrap().state(), State::Open);
    let _ = svc.clone().oneshot(to("b.test")).await;
    // a.test is used again (rejected), so b.test is the least recently used when c.test comes.
    assert_eq!(fail(&svc, to("a.test")).await.class(), Class::CIRCUIT_OPEN);
    for host in ["c.test", "d.test", "e.test"] {
        let f = fail(&svc, to(host)).await;
        // Never another host's breaker: each new host's first call reaches the provider.
        assert_eq!(f.class(), Class::TRANSIENT, "{host}");
        assert_eq!(fail(&svc, to("a.test")).await.class(), Class::CIRCUIT_OPEN);
    }
    assert_eq!(layer.keys(), ["a.test:80", "e.test:80"]);
    assert_eq!(upstream.calls(), 3 + 1 + 3);

    // A held handle keeps its breaker: with both kept breakers in use, a new key's call goes
    // through a breaker of its own that is not kept.
    let _a = layer.handle_for("a.test:80").unwrap();
    let _e = layer.handle_for("e.test:80").unwrap();
    assert_eq!(fail(&svc, to("f.test")).await.class(), Class::TRANSIENT);
    assert_eq!(layer.keys(), ["a.test:80", "e.test:80"]);

    // A request without an authority or Host header goes to the `unkeyed` breaker.
    for _ in 0..3 {
        let _ = fail(&svc, get("/relative")).await;
    }
    assert_eq!(layer.unkeyed().state(), State::Open);
    assert_eq!(
        fail(&svc, get("/relative")).await.class(),
        Class::CIRCUIT_OPEN
    );
    assert_eq!(layer.keys(), ["a.test:80", "e.test:80"]);
}

/// Bad input: IP literals, IPv6 authorities and a missing authority each have a defined key.
#[tokio::test(start_paused = true)]
async fn ip_literals_ipv6_and_missing_authorities_have_defined_keys() {
    let upstream = Scripted::always(status(503));
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .per_host()
        .build()
        .unwrap();
    let svc = over(layer.clone(), &upstream);
    for host in [
        "127.0.0.1:3000",
        "[::1]",
        "[0:0:0:0:0:0:0:1]:80",
        "[FE80::1]:8443",
    ] {
        let _ = fail(&svc, to(host)).await;
    }
    let _ = fail(&svc, get("/relative")).await;
    assert_eq!(
        layer.keys(),
        ["127.0.0.1:3000", "[::1]:80", "[fe80::1]:8443"],
        "[::1] and [0:0:0:0:0:0:0:1]:80 are one origin"
    );
    assert_eq!(layer.unkeyed().state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn keyed_breakers_with_a_user_key() {
    let upstream = Scripted::always(status(503));
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .keyed_by(|req: &http::Request<String>| {
            req.uri().path().split('/').nth(1).map(str::to_owned)
        })
        .build()
        .unwrap();
    let svc = over(layer.clone(), &upstream);
    let _ = svc.clone().oneshot(get("/sendgrid/mail")).await;
    assert_eq!(
        fail(&svc, get("/sendgrid/mail")).await.class(),
        Class::CIRCUIT_OPEN
    );
    assert_eq!(
        fail(&svc, get("/postmark/mail")).await.class(),
        Class::TRANSIENT
    );
    assert_eq!(layer.keys(), ["postmark", "sendgrid"]);
}

/// The layer's own `per_host()` and `keyed_by()` build every key's breaker from the settings
/// made before them, and leave the unkeyed breaker alone.
#[tokio::test(start_paused = true)]
async fn per_host_and_keyed_by_on_the_layer_keep_its_settings() {
    let upstream = Scripted::always(status(503));
    let layer = BreakerLayer::consecutive_failures(2)
        .open_for(Duration::from_secs(7))
        .per_host();
    let svc = over(layer.clone(), &upstream);
    assert_eq!(fail(&svc, to("a.test")).await.class(), Class::TRANSIENT);
    assert_eq!(
        layer.handle_for("a.test:80").unwrap().state(),
        State::Closed,
        "one failure of two"
    );
    assert_eq!(fail(&svc, to("a.test")).await.class(), Class::TRANSIENT);
    let a = layer.handle_for("a.test:80").unwrap();
    assert_eq!((a.state(), a.name()), (State::Open, "a.test:80"));
    let f = fail(&svc, to("a.test")).await;
    assert_eq!(f.class(), Class::CIRCUIT_OPEN);
    assert_eq!(f.retry_after(), Some(Duration::from_secs(7)));
    assert!(
        layer.handle_for("b.test:80").is_none(),
        "no call to b.test yet"
    );
    assert_eq!(
        (layer.unkeyed().name(), layer.unkeyed().state()),
        ("unkeyed", State::Closed)
    );
    assert_eq!(upstream.calls(), 2);

    let layer = BreakerLayer::consecutive_failures(1).keyed_by(|req: &http::Request<String>| {
        req.headers()
            .get("x-provider")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let svc = over(layer.clone(), &upstream);
    let with = |provider: &str| {
        http::Request::get("http://mail.test/")
            .header("x-provider", provider)
            .body(String::new())
            .unwrap()
    };
    assert_eq!(fail(&svc, with("sendgrid")).await.class(), Class::TRANSIENT);
    assert_eq!(
        fail(&svc, with("sendgrid")).await.class(),
        Class::CIRCUIT_OPEN
    );
    assert_eq!(fail(&svc, with("postmark")).await.class(), Class::TRANSIENT);
    // No header: the unkeyed breaker, which trips on its own.
    assert_eq!(fail(&svc, get("/")).await.class(), Class::TRANSIENT);
    assert_eq!(layer.unkeyed().state(), State::Open);
    assert_eq!(layer.keys(), ["postmark", "sendgrid"]);
    assert_eq!(upstream.calls(), 5);
}
