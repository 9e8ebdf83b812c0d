//! Policies as data (`config`, feature `serde`): a file read with TOML or JSON builds the
//! layers it describes, which then behave as it says (paused clock, in-process upstream); a
//! file that cannot work is an error naming the field; a configuration serialises back.
#![cfg(feature = "serde")]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{Scripted, get, status, status_with};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_backstop::Class;
use tower_backstop::breaker::State;
use tower_backstop::config::{
    BackoffConfig, BackstopConfig, BreakerConfig, ClassConfig, ConfigError, RetryConfig,
    TimeoutConfig,
};
use tower_backstop::retry::{Backoff, Jitter, RetryPolicy};

const MAIL: &str = r#"
attempt_timeout = "2s"

[retry]
max_attempts = 4
deadline = "1m"
backoff = { kind = "constant", delay = "250ms", jitter = "none" }
budget = { kind = "token_bucket", max_tokens = 10, token_ratio = 0.1 }

[retry.classes.throttled]
max_attempts = 2

[retry.classes.unknown]
retry = false

[breaker]
consecutive_failures = 5
open_for = "30s"
max_keys = 8
"#;

fn read(text: &str) -> BackstopConfig {
    toml::from_str(text).unwrap_or_else(|e| panic!("{e}"))
}

fn build_err(text: &str) -> ConfigError {
    read(text)
        .http()
        .expect_err("a configuration that cannot work")
}

fn read_err(text: &str) -> String {
    toml::from_str::<BackstopConfig>(text)
        .expect_err("a file that does not read")
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn the_file_sets_attempts_and_delays() {
    let layer = read(MAIL).http().unwrap();
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    let failure = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    // Four attempts, 250 ms apart (constant, no jitter).
    let at: Vec<_> = upstream.seen().iter().map(|s| s.at).collect();
    assert_eq!(at.len(), 4);
    for pair in at.windows(2) {
        assert_eq!(pair[1] - pair[0], Duration::from_millis(250));
    }
}

#[tokio::test(start_paused = true)]
async fn a_class_section_changes_that_class_only() {
    // Throttled: at most 2 attempts, the server's hint still honoured.
    let layer = read(MAIL).http().unwrap();
    let upstream = Scripted::always(status_with(429, "retry-after", "1"));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(upstream.clone());
    let failure = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::THROTTLED);
    let at: Vec<_> = upstream.seen().iter().map(|s| s.at).collect();
    assert_eq!(at.len(), 2);
    assert_eq!(at[1] - at[0], Duration::from_secs(1));

    // Unknown (a 500): never retried.
    let upstream = Scripted::always(status(500));
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    let failure = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(failure.class(), Class::UNKNOWN);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_section_sets_the_rule() {
    let config: BreakerConfig = toml::from_str(
        r#"
        consecutive_failures = 2
        open_for = "10s"
        name = "mail"
        "#,
    )
    .unwrap();
    let breaker = config.build().unwrap();
    let handle = breaker.handle();
    assert_eq!(handle.name(), "mail");
    // The fields are public, for a configuration made in code.
    let mut retry = RetryConfig::default();
    retry.max_attempts = Some(1);
    let retry = retry.build().unwrap();
    let upstream = Scripted::always(status(503));
    let svc = ServiceBuilder::new()
        .layer(retry)
        .layer(breaker)
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(upstream.clone());
    for _ in 0..2 {
        svc.clone()
            .oneshot(get("http://mail.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(handle.state(), State::Open);
    assert_eq!(handle.retry_after(), Some(Duration::from_secs(10)));
    let rejected = svc.oneshot(get("http://mail.test/")).await.unwrap_err();
    assert_eq!(rejected.class(), Class::CIRCUIT_OPEN);
    assert_eq!(upstream.calls(), 2);
}

#[test]
fn the_preset_keeps_its_defaults_for_what_the_file_leaves_out() {
    let config = read("attempt_timeout = \"500ms\"");
    assert_eq!(config, BackstopConfig::new(Duration::from_millis(500)));
    // An empty section changes nothing either; the preset builds.
    read("attempt_timeout = \"1s\"\n[retry]\n[breaker]\n")
        .http()
        .unwrap();
    // A class given only `max_attempts` keeps the rest of its rule: throttled still slows down
    // (a default of the policy), unknown keeps its backoff.
    let mut throttled = ClassConfig::default();
    throttled.max_attempts = Some(2);
    let mut config = RetryConfig::default();
    config.classes = BTreeMap::from([("throttled".to_owned(), throttled)]);
    let policy = config.apply(RetryPolicy::new(), &[]).unwrap();
    assert_eq!(policy.attempts_for(Class::THROTTLED), Some(2));
    assert_eq!(policy.attempts_for(Class::TRANSIENT), Some(3));
    assert_eq!(policy.attempts_for(Class::UNKNOWN), Some(2));
    // Only a backoff for `unknown`: its cap of 2 attempts stays; a count for `permanent`, which
    // the policy never retries, makes it retried.
    let config: RetryConfig = toml::from_str(
        r#"
        classes.unknown = { backoff = { kind = "constant", delay = "1s" } }
        classes.permanent = { max_attempts = 2 }
        "#,
    )
    .unwrap();
    let policy = config.apply(RetryPolicy::new(), &[]).unwrap();
    assert_eq!(policy.attempts_for(Class::UNKNOWN), Some(2));
    assert_eq!(
        *policy.backoff_for(Class::UNKNOWN),
        Backoff::constant(Duration::from_secs(1))
    );
    assert_eq!(policy.attempts_for(Class::PERMANENT), Some(2));
    assert_eq!(policy.attempts_for(Class::POISON), None);
}

#[tokio::test(start_paused = true)]
async fn give_up_long_delays_chooses_between_giving_up_and_deferring() {
    use tower_backstop::retry::{Attempts, GiveUp};
    for (give_up, expected) in [(true, GiveUp::HintTooLong), (false, GiveUp::Deferred)] {
        let config: RetryConfig = toml::from_str(&format!(
            "max_delay = \"1s\"\ngive_up_long_delays = {give_up}"
        ))
        .unwrap();
        let svc = ServiceBuilder::new()
            .layer(config.build().unwrap())
            .layer(tower_backstop::classify::ClassifyLayer::http())
            .service(Scripted::always(status_with(429, "retry-after", "3600")));
        let failure = svc.oneshot(get("http://api.test/")).await.unwrap_err();
        assert_eq!(
            failure.note::<Attempts>().map(Attempts::give_up),
            Some(expected)
        );
    }
}

#[test]
fn custom_classes_are_named_by_the_caller() {
    const SOFT_BOUNCE: Class = Class::new("soft_bounce");
    let config: RetryConfig = toml::from_str(
        r#"
        [classes.soft_bounce]
        max_attempts = 5
        backoff = { kind = "schedule", delays = ["1m", "5m", "30m"], jitter = "none" }
        "#,
    )
    .unwrap();
    let policy = config
        .apply(RetryPolicy::new().max_attempts(5), &[SOFT_BOUNCE])
        .unwrap();
    assert_eq!(policy.attempts_for(SOFT_BOUNCE), Some(5));
    assert_eq!(
        *policy.backoff_for(SOFT_BOUNCE),
        Backoff::schedule([60, 300, 1800].map(Duration::from_secs))
            .unwrap()
            .jitter(Jitter::None)
    );
    // Without it, the name is unknown.
    let err = config.build().unwrap_err();
    assert_eq!(err.path(), "classes.soft_bounce");
    assert!(
        err.problem().starts_with("no class is named `soft_bounce`"),
        "{err}"
    );
}

#[test]
fn json_reads_the_same_settings() {
    let json = r#"{
        "attempt_timeout": "2s",
        "retry": {
            "max_attempts": 4,
            "deadline": "1m",
            "backoff": { "kind": "constant", "delay": "250ms", "jitter": "none" },
            "budget": { "kind": "token_bucket", "max_tokens": 10, "token_ratio": 0.1 },
            "classes": { "throttled": { "max_attempts": 2 }, "unknown": { "retry": false } }
        },
        "breaker": { "consecutive_failures": 5, "open_for": "30s", "max_keys": 8 }
    }"#;
    let from_json: BackstopConfig = serde_json::from_str(json).unwrap();
    assert_eq!(from_json, read(MAIL));
}

#[test]
fn yaml_reads_the_same_settings() {
    let yaml = r#"
attempt_timeout: 2s
retry:
  max_attempts: 4
  deadline: 1m
  backoff: { kind: constant, delay: 250ms, jitter: none }
  budget: { kind: token_bucket, max_tokens: 10, token_ratio: 0.1 }
  classes:
    throttled: { max_attempts: 2 }
    unknown: { retry: false }
breaker:
  consecutive_failures: 5
  open_for: 30s
  max_keys: 8
"#;
    let from_yaml: BackstopConfig = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(from_yaml, read(MAIL));
    let back = serde_yaml_ng::to_string(&from_yaml).unwrap();
    assert_eq!(
        serde_yaml_ng::from_str::<BackstopConfig>(&back).unwrap(),
        from_yaml
    );
    let err = serde_yaml_ng::from_str::<BackstopConfig>("attempt_timeout: 2s\nretyr: {}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `retyr`"), "{err}");
}

#[test]
fn a_configuration_serialises_back_with_humane_durations() {
    let config = read(MAIL);
    let text = toml::to_string(&config).unwrap();
    assert!(text.contains("attempt_timeout = \"2s\""), "{text}");
    assert!(text.contains("deadline = \"1m\""), "{text}");
    assert!(text.contains("delay = \"250ms\""), "{text}");
    assert!(!text.contains("max_delay"), "left out stays out: {text}");
    assert_eq!(read(&text), config);
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<BackstopConfig>(&json).unwrap(),
        config
    );
}

#[test]
fn errors_of_meaning_name_the_field() {
    let cases = [
        (
            "[retry]\nmax_attempts = 0",
            "retry.max_attempts",
            "a request needs at least 1 call (1 means never retry)",
        ),
        (
            "[retry.classes.throttled]\nmax_attempts = 0",
            "retry.classes.throttled.max_attempts",
            "must be at least 1 (write `retry = false` to never retry the class)",
        ),
        (
            "[retry.classes.unknown]\nretry = false\nmax_attempts = 2",
            "retry.classes.unknown.max_attempts",
            "has no effect: the class is never retried (`retry = false`)",
        ),
        (
            "[retry.classes.throtled]\nmax_attempts = 2",
            "retry.classes.throtled",
            "no class is named `throtled` (known: transient, throttled, unknown, permanent, poison, circuit_open, outcome_unknown)",
        ),
        (
            "[retry]\nbackoff = { kind = \"exponential\", base = \"0s\", cap = \"1s\" }",
            "retry.backoff",
            "",
        ),
        (
            "[retry.classes.transient]\nbackoff = { kind = \"linear\", base = \"5s\", step = \"1s\", cap = \"1s\" }",
            "retry.classes.transient.backoff",
            "",
        ),
        (
            "[retry]\nbackoff = { kind = \"schedule\", delays = [] }",
            "retry.backoff.delays",
            "needs at least one delay",
        ),
        (
            "[retry]\nbudget = { kind = \"ratio\", ratio = 0.1, min_per_second = 1, window = \"0s\" }",
            "retry.budget.window",
            "the window must be between 1 s and 1 h",
        ),
        (
            "[retry]\nbudget = { kind = \"token_bucket\", max_tokens = 0, token_ratio = 0.1 }",
            "retry.budget.max_tokens",
            "a token bucket holds 1..=1000 tokens (gRFC A6)",
        ),
        (
            "[retry]\nmax_delay = \"1s\"\nmax_hint_delay = \"1m\"",
            "retry.max_hint_delay",
            "above `max_delay`, which bounds server hints too, so it would never apply",
        ),
        (
            "[retry]\nhedge = { delay = \"50ms\", max_copies = 9 }",
            "retry.hedge.max_copies",
            "hedging sends 1..=4 copies (gRFC A6 caps an RPC at 5 attempts)",
        ),
        (
            "[retry]\ndeadline = \"1s\"\nhedge = { delay = \"2s\", max_copies = 1 }",
            "retry.hedge.delay",
            "not below the deadline, so no copy could ever be sent",
        ),
        (
            "[breaker]\nfailure_rate = 1.5",
            "breaker.failure_rate",
            "the failure rate must be within (0.0, 1.0]",
        ),
        (
            "[breaker]\nhalf_open_probes = 0",
            "breaker.half_open_probes",
            "half-open probes must be within 1..=1000",
        ),
        ("[breaker]\nmax_keys = 0", "breaker.max_keys", ""),
        (
            "[breaker]\nopen_for = \"1s\"\nopen_doubling = { base = \"1s\", cap = \"8s\" }",
            "breaker.open_doubling",
            "excludes `open_for`: give one of them",
        ),
        (
            "[breaker]\ncount_window = 10\ntime_window = { width = \"1s\", buckets = 10 }",
            "breaker.time_window",
            "excludes `count_window`: give one of them",
        ),
        (
            "[breaker]\nfailure_classes = [\"transient\", \"flaky\"]",
            "breaker.failure_classes",
            "no class is named `flaky`",
        ),
        (
            "[breaker.adaptive_rate]\nfloor = 0.0",
            "breaker.adaptive_rate.floor",
            "the lowest send rate must be above 0.0 requests a second",
        ),
        (
            "[breaker.adaptive_rate]\ndecrease = 1.0",
            "breaker.adaptive_rate.decrease",
            "the share kept must be within (0.0, 1.0)",
        ),
        (
            "[breaker.adaptive_rate]\nregrowth = \"0s\"",
            "breaker.adaptive_rate.regrowth",
            "must be from 10ms to 60s",
        ),
        (
            "[breaker.adaptive_rate]\nmeasure_window = \"2m\"",
            "breaker.adaptive_rate.measure_window",
            "must be from 10ms to 60s",
        ),
        (
            "[breaker.adaptive_rate]\nmeasured_decrease = 1.5",
            "breaker.adaptive_rate.measured_decrease",
            "the share of the measured rate must be within (0.0, 1.0]",
        ),
        (
            "[breaker.adaptive_rate]\nlift_after = \"0s\"",
            "breaker.adaptive_rate.lift_after",
            "the quiet time before the limit is lifted must be above zero",
        ),
        (
            "[breaker.adaptive_concurrency]\nmax = 0",
            "breaker.adaptive_concurrency.max",
            "the highest limit must be at least 1 call",
        ),
        (
            "[breaker.adaptive_concurrency]\ndecrease = 0.2",
            "breaker.adaptive_concurrency.decrease",
            "the share kept must be within [0.5, 1.0)",
        ),
        (
            "[breaker.adaptive_concurrency]\nlatency_tolerance = 1.0",
            "breaker.adaptive_concurrency.latency_tolerance",
            "the latency tolerance must be above 1.0",
        ),
        (
            "[breaker.adaptive_concurrency]\nlift_after = \"0s\"",
            "breaker.adaptive_concurrency.lift_after",
            "the quiet time before the limit is lifted must be above zero",
        ),
    ];
    for (body, path, problem) in cases {
        let err = build_err(&format!("attempt_timeout = \"1s\"\n{body}"));
        assert_eq!(err.path(), path, "{body}: {err}");
        assert!(err.problem().starts_with(problem), "{body}: {err}");
        assert!(!err.problem().is_empty(), "{body}");
        assert_eq!(err.to_string(), format!("{path}: {}", err.problem()));
    }
    // A gRPC channel has one breaker: no keys.
    let err = read("attempt_timeout = \"1s\"\n[breaker]\nmax_keys = 4")
        .grpc()
        .unwrap_err();
    assert_eq!(err.path(), "breaker.max_keys");
    // And the standalone builders report from their own root.
    let err = toml::from_str::<BreakerConfig>("failure_rate = 0")
        .unwrap()
        .build_per_host()
        .unwrap_err();
    assert_eq!(err.path(), "failure_rate");
}

#[test]
fn errors_of_shape_name_the_field_and_the_line() {
    // A typo is never ignored.
    let err = read_err("attempt_timeout = \"1s\"\n[retry]\nmax_attempt = 3");
    assert!(err.contains("unknown field `max_attempt`"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    let err = read_err("attempt_timeout = \"1s\"\n[retry.classes.throttled]\nattempts = 3");
    assert!(err.contains("unknown field `attempts`"), "{err}");
    let err = read_err(
        "attempt_timeout = \"1s\"\n[retry]\nbackoff = { kind = \"constant\", delay = \"1s\", base = \"1s\" }",
    );
    assert!(err.contains("unknown field `base`"), "{err}");
    let err = read_err("attempt_timeout = \"1s\"\n[retry]\nbackoff = { kind = \"fibonacci\" }");
    assert!(err.contains("unknown variant `fibonacci`"), "{err}");
    // Durations: negative, unitless, nonsense.
    for bad in ["-5s", "5", "soon"] {
        let err = read_err(&format!("attempt_timeout = \"{bad}\""));
        assert!(err.contains(&format!("invalid duration `{bad}`")), "{err}");
    }
    let err = read_err("attempt_timeout = 5");
    assert!(
        err.contains("invalid duration 5: a duration needs a unit and quotes, as \"5s\""),
        "{err}"
    );
    let err = read_err("attempt_timeout = \"-5s\"");
    assert!(err.contains("a duration cannot be negative"), "{err}");
    // A negative count does not read as a count.
    let err = read_err("attempt_timeout = \"1s\"\n[retry]\nmax_attempts = -1");
    assert!(
        err.contains("max_attempts") || err.contains("line 3"),
        "{err}"
    );
    // The timeout is required.
    let err = read_err("[retry]\nmax_attempts = 3");
    assert!(err.contains("missing field `attempt_timeout`"), "{err}");
    // A jitter that does not exist.
    let err = read_err(
        "attempt_timeout = \"1s\"\n[retry]\nbackoff = { kind = \"constant\", delay = \"1s\", jitter = \"some\" }",
    );
    assert!(err.contains("unknown variant `some`"), "{err}");
}

#[test]
fn backoff_kinds_build_what_they_say() {
    let read_backoff = |text: &str| -> Backoff {
        let config: RetryConfig = toml::from_str(&format!("backoff = {text}")).unwrap();
        config
            .apply(RetryPolicy::new(), &[])
            .unwrap()
            .backoff_for(Class::TRANSIENT)
            .clone()
    };
    let ms = Duration::from_millis;
    assert_eq!(
        read_backoff(r#"{ kind = "exponential", base = "100ms", cap = "20s" }"#),
        Backoff::exponential(ms(100), ms(20_000))
    );
    assert_eq!(
        read_backoff(
            r#"{ kind = "linear", base = "1s", step = "500ms", cap = "10s", jitter = "equal" }"#
        ),
        Backoff::linear(ms(1000), ms(500), ms(10_000)).jitter(Jitter::Equal)
    );
    assert_eq!(
        read_backoff(r#"{ kind = "constant", delay = "2s", cap = "5s", jitter = "additive" }"#),
        Backoff::constant(ms(2000))
            .jitter(Jitter::Additive)
            .capped_at(ms(5000))
    );
    // What it reads is what it writes.
    let config = BackoffConfig::Exponential {
        base: ms(100),
        cap: ms(20_000),
        jitter: Some(Jitter::Decorrelated),
    };
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Wrap {
        backoff: BackoffConfig,
    }
    let text = toml::to_string(&Wrap {
        backoff: config.clone(),
    })
    .unwrap();
    assert!(text.contains("kind = \"exponential\""), "{text}");
    assert!(text.contains("jitter = \"decorrelated\""), "{text}");
    assert_eq!(toml::from_str::<Wrap>(&text).unwrap().backoff, config);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_section_bounds_each_call() {
    let config: TimeoutConfig = toml::from_str("timeout = \"100ms\"").unwrap();
    let upstream = tower::service_fn(|()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, tower_backstop::BoxError>(())
    });
    let started = tokio::time::Instant::now();
    let err = config
        .layer()
        .layer(upstream)
        .oneshot(())
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert!(err.is::<tower_backstop::timeout::Elapsed>(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_hedge_section_sends_a_copy_of_a_slow_request() {
    let config: RetryConfig =
        toml::from_str("hedge = { delay = \"100ms\", max_copies = 1 }").unwrap();
    let upstream = Scripted::new(
        [support::Step::After(
            Duration::from_secs(1),
            Box::new(status(200)),
        )],
        status(200),
    );
    let svc = ServiceBuilder::new()
        .layer(config.build().unwrap())
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(upstream.clone());
    let started = tokio::time::Instant::now();
    svc.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(upstream.calls(), 2);
    assert!(
        toml::to_string(&config)
            .unwrap()
            .contains("delay = \"100ms\"")
    );
}

/// A call through the breaker `text` configures to a provider that always answers 429, then
/// (past the limit's first measure: three seconds when nothing is admitted) three more: the
/// breaker's send rate afterwards, and the calls the provider received.
async fn three_throttled_calls(text: &str) -> (Option<f64>, usize) {
    let config: BreakerConfig = toml::from_str(text).unwrap();
    let layer = config.build().unwrap();
    let handle = layer.handle();
    let upstream = Scripted::always(status_with(429, "retry-after", "1"));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(tower_backstop::classify::ClassifyLayer::http())
        .service(upstream.clone());
    let _ = svc.clone().oneshot(get("/")).await;
    tokio::time::advance(Duration::from_secs(3)).await;
    for _ in 0..3 {
        let _ = svc.clone().oneshot(get("/")).await;
    }
    (handle.send_rate(), upstream.calls())
}

#[tokio::test(start_paused = true)]
async fn the_breaker_section_turns_the_adaptive_rate_on_or_off() {
    // On by default, and with settings: a 429 limits the rate and holds the next calls back.
    for text in [
        "",
        "adaptive_rate = true",
        "adaptive_rate = { floor = 2.0 }",
    ] {
        let (rate, calls) = three_throttled_calls(text).await;
        let rate = rate.unwrap_or_else(|| panic!("{text:?}: limited"));
        if text.contains("floor") {
            assert!(rate >= 2.0, "{text:?}: {rate}");
        }
        assert!(calls < 4, "{text:?}: a call was held back");
    }
    // Off: every call reaches the provider.
    assert_eq!(
        three_throttled_calls("adaptive_rate = false").await,
        (None, 4)
    );
    // Unknown fields of the table are errors of shape.
    let err = toml::from_str::<BreakerConfig>("adaptive_rate = { flor = 1.0 }").unwrap_err();
    assert!(err.to_string().contains("adaptive_rate"), "{err}");
}
