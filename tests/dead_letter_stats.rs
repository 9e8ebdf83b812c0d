//! Stats and alert signals: counts over a window, the dead-letter rate against its baseline, a
//! class above 20 % of the last 5 minutes, a code never seen before.

use std::time::{Duration, SystemTime};

use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{Alert, AlertRules, MemoryStore, Record, Stats, Store};
use tower_backstop::{Class, Code, Envelope, Failure};

fn rec(id: String, class: &'static str, code: &str, t: SystemTime) -> Record {
    let f: Failure = Failure::new(Class::new(class), Code::Error);
    let mut r = record_of(id, Envelope::new("p"), &f);
    r.code = code.to_owned();
    r.first_failed_at = t;
    r.last_failed_at = t;
    r
}

/// `n` records of one class and code, one a second back from `now`, ids `prefix0`, `prefix1`...
fn burst(prefix: &str, class: &'static str, code: &str, n: u32, now: SystemTime) -> Vec<Record> {
    (0..n)
        .map(|i| {
            rec(
                format!("{prefix}{i}"),
                class,
                code,
                now - Duration::from_secs(u64::from(i)),
            )
        })
        .collect()
}

const MIN: Duration = Duration::from_secs(60);

#[tokio::test]
async fn steady_traffic_raises_no_alert() {
    let now = SystemTime::now();
    let store = MemoryStore::new();
    // An hour of dead letters, 2 a minute, spread over four classes and one code each, all
    // codes seen long before.
    let classes = ["transient", "throttled", "unknown", "permanent"];
    let mut batch = Vec::new();
    for c in classes {
        batch.push(rec(format!("old-{c}"), c, c, now - 300 * MIN));
    }
    for m in 0..65u32 {
        for k in 0..2u32 {
            let c = classes[((m * 2 + k) % 4) as usize];
            batch.push(rec(format!("m{m}-{k}"), c, c, now - m * MIN - MIN / 2));
        }
    }
    store.put_many(batch).await.unwrap();
    let mut rules = AlertRules::default();
    rules.class_share = 0.3;
    let stats = Stats::gather(&store, now, Duration::from_secs(3600), rules)
        .await
        .unwrap();
    assert!(stats.alerts.is_empty(), "{:?}", stats.alerts);
    assert_eq!(stats.counts.total, 120);
    assert!(
        (stats.per_minute - 2.0).abs() < 1e-9,
        "{}",
        stats.per_minute
    );
}

#[tokio::test]
async fn a_spike_a_dominant_class_and_a_new_code_raise_their_alerts() {
    let now = SystemTime::now();
    let store = MemoryStore::new();
    let mut batch = Vec::new();
    // Baseline: one a minute over the last hour, code "http 503", first seen long ago.
    batch.push(rec(
        "first".into(),
        "transient",
        "http 503",
        now - 600 * MIN,
    ));
    for m in 6..66u32 {
        batch.push(rec(format!("b{m}"), "transient", "http 503", now - m * MIN));
    }
    // Last 5 minutes: 40 dead letters, 30 of them one class with a code never seen before.
    batch.extend(burst(
        "r",
        "rendering_failure",
        "TEMPLATE_VARIABLE_MISSING",
        30,
        now,
    ));
    batch.extend(burst("t", "transient", "http 503", 10, now));
    store.put_many(batch).await.unwrap();
    let stats = Stats::gather(
        &store,
        now,
        Duration::from_secs(24 * 3600),
        AlertRules::default(),
    )
    .await
    .unwrap();
    assert_eq!(stats.counts.by_class[0], ("transient".to_owned(), 71));
    assert_eq!(
        stats.counts.by_class[1],
        ("rendering_failure".to_owned(), 30)
    );

    let spike = stats.alerts.iter().find_map(|a| match a {
        Alert::RateSpike {
            per_minute,
            baseline_per_minute,
        } => Some((*per_minute, *baseline_per_minute)),
        _ => None,
    });
    let (rate, baseline) = spike.expect("a rate spike");
    assert!((rate - 8.0).abs() < 1e-9, "{rate}");
    assert!((baseline - 1.0).abs() < 0.1, "{baseline}");

    let shares: Vec<(&str, u64, u64)> = stats
        .alerts
        .iter()
        .filter_map(|a| match a {
            Alert::ClassShare {
                class,
                count,
                total,
                ..
            } => Some((class.as_str(), *count, *total)),
            _ => None,
        })
        .collect();
    // 30 of 40 is above 20 %; transient's 10 of 40 (25 %) too.
    assert_eq!(
        shares,
        [("rendering_failure", 30, 40), ("transient", 10, 40)]
    );

    let new: Vec<&str> = stats
        .alerts
        .iter()
        .filter_map(|a| match a {
            Alert::NewCode { code, .. } => Some(code.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(new, ["TEMPLATE_VARIABLE_MISSING"]);

    let dashboard = stats.to_string();
    assert!(dashboard.contains("top classes"), "{dashboard}");
    assert!(
        dashboard.contains("class rendering_failure is 75% of recent dead letters (30 of 40)"),
        "{dashboard}"
    );
    assert!(
        dashboard.contains("new code \"TEMPLATE_VARIABLE_MISSING\""),
        "{dashboard}"
    );
}

#[tokio::test]
async fn too_few_dead_letters_for_a_share_alert() {
    let now = SystemTime::now();
    let store = MemoryStore::new();
    store
        .put(rec("only".into(), "poison", "x", now - 600 * MIN))
        .await
        .unwrap();
    store
        .put(rec("one".into(), "poison", "x", now))
        .await
        .unwrap();
    let stats = Stats::gather(&store, now, MIN, AlertRules::default())
        .await
        .unwrap();
    // One dead letter is 100 % of one: below min_count, no share or rate alert.
    assert!(stats.alerts.is_empty(), "{:?}", stats.alerts);
}
