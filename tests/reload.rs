//! Settings changed while the stack runs (`Reload`, feature `serde`): a reload acts on the next
//! calls, a call in flight ends under the policy it started with, the breakers keep their state,
//! and a change that cannot work (by the handle, or a file half-written, with an unknown field or
//! a value out of range) is refused with the field named, the old settings still acting.
#![cfg(feature = "serde")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Scripted, get, status};
use tower::{Layer, ServiceExt};
use tower_backstop::breaker::State;
use tower_backstop::config::BackstopConfig;
use tower_backstop::event::Event;
use tower_backstop::retry::Attempts;
use tower_backstop::{BackstopLayer, Code, Reload};

const BASE: &str = r#"
attempt_timeout = "2s"

[retry]
max_attempts = 1

[breaker]
consecutive_failures = 5
open_for = "30s"
open_jitter = 0.0
"#;

fn read(text: &str) -> BackstopConfig {
    toml::from_str(text).unwrap_or_else(|e| panic!("{e}"))
}

/// `BASE` with `old` replaced by `new` (each present once).
fn with(old: &str, new: &str) -> BackstopConfig {
    assert_eq!(BASE.matches(old).count(), 1, "{old}");
    read(&BASE.replace(old, new))
}

/// What the reloads said: `(event, field, problem)`; `field` is the version for an applied one.
type Said = Arc<Mutex<Vec<(String, String, String)>>>;

fn stack(config: &BackstopConfig) -> (BackstopLayer, Reload, Said) {
    let said = Said::default();
    let heard = said.clone();
    let (layer, reload) = config
        .http()
        .unwrap()
        .listener(move |event: &Event<'_>| match *event {
            Event::SettingsReloaded { version, .. } => heard.lock().unwrap().push((
                event.name().to_owned(),
                version.to_string(),
                String::new(),
            )),
            Event::SettingsRefused { field, problem, .. } => heard.lock().unwrap().push((
                event.name().to_owned(),
                field.to_owned(),
                problem.to_owned(),
            )),
            _ => {}
        })
        .reloadable();
    (layer, reload, said)
}

fn breaker_state(layer: &BackstopLayer) -> State {
    let report = layer.health().report();
    let host = report.breakers.iter().find(|b| b.name == "a.test:80");
    host.expect("the host's breaker").state
}

#[tokio::test(start_paused = true)]
async fn a_reload_changes_the_breaker_threshold_for_the_next_calls() {
    let (layer, reload, said) = stack(&read(BASE));
    let upstream = Scripted::always(status(503));
    let svc = layer.layer(upstream.clone());
    for _ in 0..3 {
        svc.clone()
            .oneshot(get("http://a.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(breaker_state(&layer), State::Closed, "3 failures of 5");

    reload
        .apply(&with(
            "consecutive_failures = 5",
            "consecutive_failures = 4",
        ))
        .unwrap();
    assert_eq!(reload.version(), 1);
    // The three failures in a row were kept: the fourth opens the breaker now.
    svc.clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(breaker_state(&layer), State::Open);
    let rejected = svc
        .clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(rejected.code(), Code::CircuitOpen);
    assert_eq!(upstream.calls(), 4, "the rejected call never left");
    assert_eq!(
        said.lock().unwrap()[0],
        ("settings_reloaded".into(), "1".into(), String::new())
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_in_flight_finishes_under_the_retry_policy_it_started_with() {
    let config = with(
        "max_attempts = 1",
        "max_attempts = 3\nbackoff = { kind = \"constant\", delay = \"1s\", jitter = \"none\" }",
    );
    let (layer, reload, _) = stack(&config);
    let upstream = Scripted::always(status(503));
    let svc = layer.layer(upstream.clone());
    let in_flight = tokio::spawn(svc.clone().oneshot(get("http://a.test/")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        upstream.calls(),
        1,
        "the first attempt is out, the second waits"
    );

    reload.apply(&read(BASE)).unwrap();
    let old = in_flight.await.unwrap().unwrap_err();
    assert_eq!(old.note::<Attempts>().map(Attempts::count), Some(3));
    assert_eq!(upstream.calls(), 3);
    // A call that starts after the reload: one attempt.
    let new = svc
        .clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(new.note::<Attempts>().map(Attempts::count), Some(1));
    assert_eq!(upstream.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_value_is_refused_with_its_field_and_the_old_settings_act() {
    let (layer, reload, said) = stack(&read(BASE));
    let upstream = Scripted::always(status(503));
    let svc = layer.layer(upstream.clone());

    let err = reload
        .apply(&with(
            "consecutive_failures = 5",
            "consecutive_failures = 0",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "breaker.consecutive_failures");
    // A breaker part that builds after a retry part that does not: nothing changed at all.
    let both = BASE.replace("consecutive_failures = 5", "consecutive_failures = 2")
        + "\n[retry.classes.throttled]\nmax_attempts = 0\n";
    let err = reload.apply(&read(&both)).unwrap_err();
    assert_eq!(err.path(), "retry.classes.throttled.max_attempts");
    assert_eq!(reload.version(), 0);
    assert_eq!(reload.config(), None);

    // Still 5 failures in a row to open, one attempt each.
    for _ in 0..4 {
        svc.clone()
            .oneshot(get("http://a.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(breaker_state(&layer), State::Closed);
    svc.clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(breaker_state(&layer), State::Open);
    assert_eq!(upstream.calls(), 5);

    let said = said.lock().unwrap();
    assert_eq!(said.len(), 2);
    assert_eq!(said[0].0, "settings_refused");
    assert_eq!(said[0].1, "breaker.consecutive_failures");
}

#[tokio::test(start_paused = true)]
async fn what_a_running_stack_cannot_take_is_refused_by_name() {
    let (_layer, reload, _) = stack(&read(BASE));
    let err = reload
        .apply(&with(
            "attempt_timeout = \"2s\"",
            "attempt_timeout = \"5s\"",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "attempt_timeout");
    let err = reload
        .apply(&with(
            "open_for = \"30s\"",
            "open_for = \"30s\"\ncount_window = 50",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "breaker.count_window");
    assert!(err.problem().contains("build a new stack"), "{err}");
    let err = reload
        .apply(&with(
            "open_for = \"30s\"",
            "open_for = \"30s\"\nfailure_classes = [\"transient\"]",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "breaker.failure_classes");
    let err = reload
        .apply(&with(
            "open_for = \"30s\"",
            "open_for = \"30s\"\nadaptive_rate = false",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "breaker.adaptive_rate");
    let err = reload
        .apply(&with(
            "open_for = \"30s\"",
            "open_for = \"30s\"\nadaptive_concurrency = true",
        ))
        .unwrap_err();
    assert_eq!(err.path(), "breaker.adaptive_concurrency");
    assert_eq!(reload.version(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_open_before_a_reload_stays_open() {
    let (layer, reload, _) = stack(&read(BASE));
    let upstream = Scripted::always(status(503));
    let svc = layer.layer(upstream.clone());
    for _ in 0..5 {
        svc.clone()
            .oneshot(get("http://a.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(breaker_state(&layer), State::Open);

    // A higher threshold and a shorter open duration: the breaker stays open for the 30 s it
    // opened for; the new duration applies from its next opening.
    let mut looser = with("consecutive_failures = 5", "consecutive_failures = 50");
    looser.breaker.open_for = Some(Duration::from_secs(1));
    reload.apply(&looser).unwrap();
    assert_eq!(breaker_state(&layer), State::Open);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rejected = svc
        .clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(rejected.code(), Code::CircuitOpen);
    assert_eq!(upstream.calls(), 5);

    tokio::time::sleep(Duration::from_secs(29)).await;
    // Half-open: the probe fails, and it opens for the new duration, 1 s.
    svc.clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 6);
    assert_eq!(breaker_state(&layer), State::Open);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    svc.clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(upstream.calls(), 7, "the next probe came after 1 s");
}

#[tokio::test(start_paused = true)]
async fn a_watched_file_is_applied_and_bad_writes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backstop.toml");
    std::fs::write(&path, BASE).unwrap();
    let (layer, reload, said) = stack(&read(BASE));
    let every = Duration::from_secs(1);
    let watch = reload.watch_file(&path, every, |text| toml::from_str::<BackstopConfig>(text));
    let upstream = Scripted::always(status(503));
    let svc = layer.layer(upstream.clone());
    let look = || tokio::time::sleep(every + Duration::from_millis(10));
    look().await;
    assert_eq!(reload.version(), 1, "the first look applies the file");

    // Each bad write is refused, named, and the old settings kept.
    let last_refusal = |said: &Said| said.lock().unwrap().last().cloned().unwrap();
    let half = &BASE[..BASE.find("consecutive_failures = 5").unwrap() + "consecutive_fail".len()];
    std::fs::write(&path, half).unwrap();
    look().await;
    assert_eq!(reload.version(), 1);
    let (event, field, problem) = last_refusal(&said);
    assert_eq!((event.as_str(), field.as_str()), ("settings_refused", ""));
    assert!(problem.contains("line 8"), "the parser's line: {problem}");

    std::fs::write(&path, BASE.replace("open_for", "open_four")).unwrap();
    look().await;
    assert_eq!(reload.version(), 1);
    let (_, _, problem) = last_refusal(&said);
    assert!(problem.contains("unknown field `open_four`"), "{problem}");

    std::fs::write(&path, BASE.replace("max_attempts = 1", "max_attempts = 0")).unwrap();
    look().await;
    assert_eq!(reload.version(), 1);
    let (_, field, _) = last_refusal(&said);
    assert_eq!(field, "retry.max_attempts");
    let refusals = said.lock().unwrap().len();
    look().await;
    assert_eq!(
        said.lock().unwrap().len(),
        refusals,
        "the same text is not tried again"
    );

    // The old settings act: 5 failures in a row to open.
    for _ in 0..4 {
        svc.clone()
            .oneshot(get("http://a.test/"))
            .await
            .unwrap_err();
    }
    assert_eq!(breaker_state(&layer), State::Closed);

    // Fixed: applied, the breaker's four failures in a row kept.
    std::fs::write(
        &path,
        BASE.replace("consecutive_failures = 5", "consecutive_failures = 4"),
    )
    .unwrap();
    look().await;
    assert_eq!(reload.version(), 2);
    assert_eq!(
        reload.config().unwrap().breaker.consecutive_failures,
        Some(4)
    );
    svc.clone()
        .oneshot(get("http://a.test/"))
        .await
        .unwrap_err();
    assert_eq!(breaker_state(&layer), State::Open);
    watch.abort();
}
