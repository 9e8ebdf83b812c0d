//! The in-process alerts agree with the Prometheus rules: every case of
//! `docs/alerts.test.yml` (the fresh process's first incident, the 5-minute outage, the burst of
//! permanent failures with every breaker closed, and the rest) is replayed through
//! `observe::Alerts` on tokio's paused clock, minute by minute, as the events that would have
//! made its series, and at each `eval_time` the alerts it has raised are those promtool expects
//! of `docs/alerts.yml` (the file CI runs `promtool test rules` on).
//!
//! A series' growth over a minute becomes that many events at the minute's mark: successful
//! attempts for `backstop_calls_total`, dead letters for `backstop_dead_letters_total`, a
//! transition when `backstop_breaker_state` moves, a backlog count for
//! `backstop_deferred_backlog`, a send-rate change for `backstop_send_rate` (its value, the
//! peak beside it, `NaN` as the limit lifted), and a failed attempt with the code of a new
//! `backstop_new_codes_total` series. A Prometheus rule with a `for:` fires that long after the
//! in-process alert is raised, so an in-process alert counts once it has been raised that long.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_yaml_ng::Value;
use tokio::time::Instant;
use tower_backstop::breaker::State;
use tower_backstop::observe::{Alert, Alerts, Event, Listener};
use tower_backstop::{Class, Code, Sent};

/// A series of the test file: its name, its labels and one value (or none) per minute.
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    values: Vec<Option<f64>>,
}

/// `name{a="x",b="y"}`.
fn parse_series(text: &str) -> (String, BTreeMap<String, String>) {
    let (name, rest) = text.split_once('{').unwrap_or((text, "}"));
    let labels = rest
        .trim_end_matches('}')
        .split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("label=value");
            (k.trim().to_owned(), v.trim().trim_matches('"').to_owned())
        })
        .collect();
    (name.to_owned(), labels)
}

/// promtool's expanding notation: `a`, `_`, `axn` (a, n + 1 times), `_xn` (n missing),
/// `a+bxn` and `a-bxn` (a, then n more steps of b).
fn parse_values(text: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for token in text.split_whitespace() {
        let Some((start, times)) = token.split_once('x') else {
            out.push((token != "_").then(|| token.parse().expect(token)));
            continue;
        };
        let n: usize = times.parse().expect(token);
        if start == "_" {
            out.extend(std::iter::repeat_n(None, n));
            continue;
        }
        let (a, step) = match start[1..].find(['+', '-']) {
            Some(i) => {
                let (a, step) = start.split_at(i + 1);
                (
                    a.parse::<f64>().expect(token),
                    step.parse::<f64>().expect(token),
                )
            }
            None => (start.parse::<f64>().expect(token), 0.0),
        };
        out.extend((0..=n).map(|i| Some(a + step * i as f64)));
    }
    out
}

/// `1m`, `72m`, `2h`.
fn minutes(text: &str) -> u64 {
    let (n, unit) = text.split_at(text.len() - 1);
    let n: u64 = n.parse().expect(text);
    match unit {
        "m" => n,
        "h" => n * 60,
        _ => panic!("a time in minutes or hours: {text}"),
    }
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {value:?}"))
}

/// Each alert's `for:` in `docs/alerts.yml`, in minutes.
fn waits() -> HashMap<String, u64> {
    let rules: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string("docs/alerts.yml").unwrap()).unwrap();
    let mut waits = HashMap::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            if let Some(alert) = rule["alert"].as_str() {
                let wait = rule["for"].as_str().map_or(0, minutes);
                waits.insert(alert.to_owned(), wait);
            }
        }
    }
    waits
}

/// The in-process rule of a Prometheus alert, or `None` for one `Alerts` does not have.
fn rule_of(alertname: &str) -> Option<&'static str> {
    match alertname {
        "BackstopDeadLetterSpike" => Some("dead_letter_spike"),
        "BackstopClassShare" => Some("class_share"),
        "BackstopBreakerOpen" => Some("breaker_open"),
        "BackstopSendRateLow" => Some("send_rate_low"),
        "BackstopBacklogGrowing" => Some("backlog_growing"),
        "BackstopNewCode" => Some("new_code"),
        "BackstopStoreErrors" | "BackstopSpooling" | "BackstopSpoolRefusing" => None,
        other => panic!("an alert this replay does not know: {other}"),
    }
}

/// What an alert is about: its class, breaker or code; empty for the others.
fn detail(alert: &Alert) -> String {
    match alert {
        Alert::ClassShare { class, .. } => class.clone(),
        Alert::BreakerOpen { breaker } | Alert::SendRateLow { breaker, .. } => breaker.clone(),
        Alert::NewCode { code, .. } => code.clone(),
        _ => String::new(),
    }
}

/// The label that says what a Prometheus alert is about, as `detail` does.
fn expected_detail(labels: &Value) -> String {
    ["class", "breaker", "code"]
        .iter()
        .find_map(|k| labels[*k].as_str())
        .unwrap_or("")
        .to_owned()
}

fn code_of(text: &str) -> Code {
    let status = text
        .strip_prefix("http ")
        .and_then(|n| n.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("a code this replay does not know: {text}"));
    Code::Http(http::StatusCode::from_u16(status).unwrap())
}

fn state_of(name: &str) -> State {
    match name {
        "closed" => State::Closed,
        "open" => State::Open,
        "half_open" => State::HalfOpen,
        "forced_open" => State::ForcedOpen,
        "disabled" => State::Disabled,
        other => panic!("a state: {other}"),
    }
}

/// A class named as in the file (a `Class` keeps a `&'static str`).
fn class(name: &str) -> Class {
    Class::new(Box::leak(name.to_owned().into_boxed_str()))
}

/// Hands `alerts` the events of minute `m`: each series' growth since the minute before, the
/// breakers' moves, their send rates and the backlog's count.
fn replay_minute(
    alerts: &Alerts,
    series: &[Series],
    m: usize,
    breakers: &mut HashMap<String, State>,
) {
    let at = |s: &Series, m: usize| s.values.get(m).copied().flatten();
    for s in series {
        let Some(now) = at(s, m) else { continue };
        let before = m.checked_sub(1).and_then(|p| at(s, p));
        let grown = (now - before.unwrap_or(0.0)).max(0.0) as u64;
        match s.name.as_str() {
            "backstop_calls_total" => {
                for _ in 0..grown {
                    alerts.on_event(&Event::AttemptEnded {
                        attempt: 1,
                        class: None,
                        code: None,
                        sent: Sent::Yes,
                        duration: Duration::ZERO,
                    });
                }
            }
            "backstop_dead_letters_total" => {
                let class = class(&s.labels["class"]);
                let deferred = s.labels["status"] == "deferred";
                for _ in 0..grown {
                    alerts.on_event(&Event::DeadLetterStored {
                        id: "m",
                        class,
                        code: Code::Error,
                        deferred,
                    });
                }
            }
            "backstop_breaker_state" if now == 1.0 => {
                let breaker = &s.labels["breaker"];
                let to = state_of(&s.labels["state"]);
                let from = breakers
                    .insert(breaker.clone(), to)
                    .unwrap_or(State::Closed);
                if from != to {
                    alerts.on_event(&Event::BreakerTransition {
                        breaker,
                        from,
                        to,
                        reason: "replay",
                    });
                }
            }
            // The gauge as the breaker sets it at each change told: NaN once lifted.
            "backstop_send_rate" => {
                let breaker = &s.labels["breaker"];
                let peak = series
                    .iter()
                    .find(|p| {
                        p.name == "backstop_send_rate_peak" && p.labels["breaker"] == *breaker
                    })
                    .and_then(|p| at(p, m))
                    .expect("a peak beside each send rate");
                alerts.on_event(&Event::SendRate {
                    breaker,
                    rate: (!now.is_nan()).then_some(now),
                    peak,
                    reason: "replay",
                });
            }
            "backstop_deferred_backlog" => alerts.on_event(&Event::Backlog {
                deferred: now as u64,
            }),
            "backstop_new_codes_total" if before.is_none() => {
                let code = code_of(&s.labels["code"]);
                alerts.on_event(&Event::AttemptEnded {
                    attempt: 1,
                    class: Some(Class::PERMANENT),
                    code: Some(code),
                    sent: Sent::Yes,
                    duration: Duration::ZERO,
                });
            }
            _ => {}
        }
    }
    // An event the rules ignore, as a process has every few seconds (a call, the scheduler's
    // backlog count): the rules measured over windows are evaluated on it.
    alerts.on_event(&Event::HedgeSent {
        attempt: 2,
        after: Duration::ZERO,
    });
}

/// Replays one case; the mismatches, as text.
async fn replay(case: &Value, waits: &HashMap<String, u64>) -> Vec<String> {
    assert_eq!(
        str_of(case, "interval"),
        "1m",
        "the replay steps by the minute"
    );
    let series: Vec<Series> = case["input_series"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| {
            let (name, labels) = parse_series(str_of(s, "series"));
            let values = parse_values(str_of(s, "values"));
            Series {
                name,
                labels,
                values,
            }
        })
        .collect();
    let mut checks: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for check in case["alert_rule_test"].as_sequence().unwrap() {
        let at = minutes(str_of(check, "eval_time"));
        checks.entry(at).or_default().push(check);
    }
    let raised: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let book = Arc::clone(&raised);
    let alerts = Alerts::new().on_alert(move |alert, firing| {
        let key = format!("{}/{}", alert.rule(), detail(alert));
        let mut book = book.lock().unwrap();
        if firing {
            book.insert(key, Instant::now());
        } else {
            book.remove(&key);
        }
    });
    let start = Instant::now();
    let mut breakers = HashMap::new();
    let mut problems = Vec::new();
    let last = checks.keys().copied().max().unwrap_or(0);
    for m in 0..=last {
        tokio::time::advance((start + Duration::from_secs(m * 60)) - Instant::now()).await;
        replay_minute(&alerts, &series, m as usize, &mut breakers);
        for check in checks.get(&m).into_iter().flatten() {
            let alertname = str_of(check, "alertname");
            let Some(rule) = rule_of(alertname) else {
                continue;
            };
            let wait = Duration::from_secs(waits[alertname] * 60);
            let expected: BTreeSet<String> = check["exp_alerts"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|a| expected_detail(&a["exp_labels"]))
                .collect();
            let book = raised.lock().unwrap();
            let firing: BTreeSet<String> = alerts
                .active()
                .iter()
                .filter(|a| a.rule() == rule)
                .map(detail)
                .filter(|d| {
                    book.get(&format!("{rule}/{d}"))
                        .is_some_and(|at| Instant::now() - *at >= wait)
                })
                .collect();
            if firing != expected {
                problems.push(format!(
                    "{alertname} at {m}m: Prometheus {expected:?}, in process {firing:?}"
                ));
            }
        }
    }
    problems
}

#[tokio::test(start_paused = true)]
async fn every_case_of_the_prometheus_rules_fires_the_same_alerts_in_process() {
    let file: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string("docs/alerts.test.yml").unwrap()).unwrap();
    let waits = waits();
    let cases = file["tests"].as_sequence().unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (i, case) in cases.iter().enumerate() {
        checked += case["alert_rule_test"].as_sequence().unwrap().len();
        for problem in replay(case, &waits).await {
            problems.push(format!("case {i}: {problem}"));
        }
    }
    assert!(
        checked >= 40,
        "the file's cases were read: {checked} checks"
    );
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The replay itself: promtool's notation, read as promtool reads it.
#[test]
fn the_expanding_notation_is_read_as_promtool_reads_it() {
    assert_eq!(
        parse_values("0+1x2 _ 5x1 _x2 9-3x2"),
        [
            Some(0.0),
            Some(1.0),
            Some(2.0),
            None,
            Some(5.0),
            Some(5.0),
            None,
            None,
            Some(9.0),
            Some(6.0),
            Some(3.0),
        ]
    );
    let (name, labels) = parse_series(r#"backstop_new_codes_total{instance="a",code="http 503"}"#);
    assert_eq!(name, "backstop_new_codes_total");
    assert_eq!(labels["code"], "http 503");
}
