//! Every metric of `Metrics` against ground truth: the preset over four real providers on
//! 127.0.0.1 (axum servers that count, on their side, every request and every answer), through
//! retries, a breaker trip and its rejections, deferrals, the scheduler's re-sends and an
//! operator's re-drive, with the events recorded by a real Prometheus exporter
//! (`metrics-exporter-prometheus`) and read back by scraping its `/metrics` over loopback. Each
//! series is compared with what the providers received and answered, what the callers got, the
//! store's records, and the breakers' own counters.
//!
//! Real servers on loopback run on the real clock (tokio's paused clock would fire the timeouts
//! while a socket waits): the test waits for the store or the providers to reach a state,
//! never for a fixed time.
#![cfg(feature = "metrics")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State as Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::{Layer, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule};
use tower_backstop::observe::{HealthReport, Metrics};
use tower_backstop::resend::{Redrive, Scheduler, http_request};
use tower_backstop::retry::{Attempts, Backoff, RetryPolicy};
use tower_backstop::store::{Filter, MemoryStore, Status, Store};
use tower_backstop::{BackstopLayer, Class};

/// How a provider answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// 202, but message `N` with `N % 4 == 1` gets a 503 on its first arrival.
    Mail,
    /// 400; once fixed, 202 for even `N`.
    Bad,
    /// 503 while down, then 202.
    Sms,
    /// 429 with `Retry-After: 1` on a message's first two arrivals, then 202.
    Slow,
}

/// A provider: what it does, and what it received and answered.
struct Provider {
    kind: Kind,
    down: AtomicBool,
    fixed: AtomicBool,
    seen: Mutex<Seen>,
}

#[derive(Clone, Default)]
struct Seen {
    /// Answers by status.
    answers: BTreeMap<u16, u64>,
    /// Arrivals by message.
    arrivals: HashMap<String, u64>,
}

impl Seen {
    fn answered(&self, status: u16) -> u64 {
        self.answers.get(&status).copied().unwrap_or(0)
    }

    fn failures(&self) -> u64 {
        self.answers
            .iter()
            .filter(|(s, _)| **s >= 300)
            .map(|(_, n)| n)
            .sum()
    }

    fn requests(&self) -> u64 {
        self.answers.values().sum()
    }
}

async fn answer(Shared(p): Shared<Arc<Provider>>, headers: HeaderMap) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let n: u64 = key.rsplit('-').next().unwrap_or("").parse().unwrap_or(0);
    let mut seen = p.seen.lock().unwrap();
    let arrival = {
        let a = seen.arrivals.entry(key).or_default();
        *a += 1;
        *a
    };
    let status = match p.kind {
        Kind::Mail if n % 4 == 1 && arrival == 1 => 503,
        Kind::Mail => 202,
        Kind::Bad if p.fixed.load(Ordering::SeqCst) && n.is_multiple_of(2) => 202,
        Kind::Bad => 400,
        Kind::Sms if p.down.load(Ordering::SeqCst) => 503,
        Kind::Sms => 202,
        Kind::Slow if arrival <= 2 => 429,
        Kind::Slow => 202,
    };
    *seen.answers.entry(status).or_default() += 1;
    let status = StatusCode::from_u16(status).unwrap();
    if status == StatusCode::TOO_MANY_REQUESTS {
        (status, [("retry-after", "1")]).into_response()
    } else {
        status.into_response()
    }
}

async fn serve(router: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn provider(kind: Kind) -> (Arc<Provider>, std::net::SocketAddr) {
    let p = Arc::new(Provider {
        kind,
        down: AtomicBool::new(kind == Kind::Sms),
        fixed: AtomicBool::new(false),
        seen: Mutex::new(Seen::default()),
    });
    let router = axum::Router::new()
        .route("/send", axum::routing::post(answer))
        .with_state(Arc::clone(&p));
    (p, serve(router).await)
}

/// One sample of a Prometheus text exposition: its name, labels and value.
type Sample = (String, BTreeMap<String, String>, f64);

fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').expect("name value");
            let (name, labels) = key.split_once('{').unwrap_or((key, "}"));
            let labels = labels
                .trim_end_matches('}')
                .split("\",")
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .collect();
            (name.to_owned(), labels, value.parse().expect(value))
        })
        .collect()
}

/// What one scrape read.
struct Scrape(Vec<Sample>);

impl Scrape {
    /// The sum of the samples of `name` with every label of `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// The values of `label` among the samples of `name`.
    fn values_of(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter_map(|(_, labels, _)| labels.get(label).cloned())
            .collect()
    }
}

async fn scrape(client: &reqwest::Client, admin: std::net::SocketAddr) -> Scrape {
    let text = client
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Scrape(parse(&text))
}

/// Waits until `done` says so, at most 20 s.
async fn wait_until<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn request(addr: std::net::SocketAddr, key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{addr}/send"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// What the callers saw of their own calls.
#[derive(Default)]
struct Callers {
    /// Calls by the outcome `backstop_calls_total` names.
    calls: BTreeMap<&'static str, u64>,
    /// Calls that made more than one attempt, whatever their outcome.
    retried: u64,
    /// The messages that entered each (class, status), read from the store after each call.
    entered: BTreeMap<(String, Status), BTreeSet<String>>,
}

fn breaker<'a>(report: &'a HealthReport, name: &str) -> &'a tower_backstop::observe::BreakerHealth {
    report
        .breakers
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no breaker {name}: {report:?}"))
}

#[test]
fn every_series_agrees_with_the_providers_the_callers_and_the_store() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(handle))
    });
}

async fn run(handle: metrics_exporter_prometheus::PrometheusHandle) {
    let (mail, mail_addr) = provider(Kind::Mail).await;
    let (bad, bad_addr) = provider(Kind::Bad).await;
    let (sms, sms_addr) = provider(Kind::Sms).await;
    let (slow, slow_addr) = provider(Kind::Slow).await;
    let providers = [
        ("mail", &mail, mail_addr),
        ("bad", &bad, bad_addr),
        ("sms", &sms, sms_addr),
        ("slow", &slow, slow_addr),
    ];
    let admin = serve(axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    ))
    .await;
    let scraper = reqwest::Client::new();

    // Every failure code counts as new at once, so that the new-code counter has something to
    // count in a short run.
    let metrics = Metrics::new().learn_codes_for(Duration::ZERO);
    let store: Arc<MemoryStore> = Arc::new(MemoryStore::new());
    let backstop = BackstopLayer::http(Duration::from_millis(500))
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Backoff::constant(Duration::from_millis(10)))
                .build()
                .unwrap(),
        )
        // One breaker per provider: 5 failures in a row open it for 300 ms. A 429 is the
        // provider asking for time, not failing: it trips nothing here. The slow provider
        // throttles each message's first arrivals whatever the rate, so the adaptive send rate
        // (its metrics are checked in tests/send_rate.rs) is off here; the mail provider's 503s
        // and the slow one's 429s come whatever the calls in flight, so the adaptive
        // concurrency limit (tests/concurrency_limit.rs) is off too.
        .breaker(
            BreakerLayer::builder()
                .without_adaptive_rate()
                .without_adaptive_concurrency()
                .consecutive_failures(5)
                .open_for(Duration::from_millis(300))
                .failure_classes(&[Class::TRANSIENT, Class::UNKNOWN])
                .per_host()
                .build()
                .unwrap(),
        )
        .listener(metrics.clone());
    let health = backstop.health();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stack = backstop
        // Dead at once, without the second tier (tested in tests/retry_schedule.rs).
        .dead_letters(
            DeadLetterLayer::from_arc(store.clone()).retry_schedule(RetrySchedule::none()),
        )
        .layer(client);

    // Phase 1: the callers, 12 messages to each provider, one at a time.
    let mut callers = Callers::default();
    for n in 0..12 {
        for (name, _, addr) in &providers {
            let key = format!("{name}-{n}");
            let outcome = match stack.clone().oneshot(request(*addr, &key)).await {
                Ok(_) => {
                    let retried = providers
                        .iter()
                        .find(|(p, _, _)| p == name)
                        .is_some_and(|(_, p, _)| p.seen.lock().unwrap().arrivals[&key] > 1);
                    if retried {
                        callers.retried += 1;
                        "success_with_retry"
                    } else {
                        "success_without_retry"
                    }
                }
                Err(failure) => {
                    let Some(DeadLetterStatus::Stored { id }) = failure.note::<DeadLetterStatus>()
                    else {
                        panic!("not stored: {failure}");
                    };
                    let record = store.get(id).await.unwrap().unwrap();
                    callers
                        .entered
                        .entry((record.class.clone(), record.status))
                        .or_default()
                        .insert(id.clone());
                    let attempts = failure.note::<Attempts>().expect("the retry layer's note");
                    if attempts.count() > 1 {
                        callers.retried += 1;
                    }
                    match attempts.count() {
                        _ if attempts.is_deferred() => "deferred",
                        0 | 1 => "failed_without_retry",
                        _ => "failed_with_retry",
                    }
                }
            };
            *callers.calls.entry(outcome).or_default() += 1;
        }
    }
    let before: Vec<Seen> = providers
        .iter()
        .map(|(_, p, _)| p.seen.lock().unwrap().clone())
        .collect();
    let first = scrape(&scraper, admin).await;
    let report = health.report();
    check_calls_and_attempts(&first, &callers, &before);
    check_breakers(&first, &report, &providers.map(|(_, _, a)| a.to_string()));
    check_dead_letters(&first, &callers.entered);
    assert!(
        callers
            .entered
            .keys()
            .any(|(c, s)| c == "circuit_open" && *s == Status::Deferred),
        "the SMS breaker's rejections were deferred: {:?}",
        callers.entered.keys()
    );

    // Phase 2: the scheduler re-sends the deferred records. The SMS provider is still down for
    // two of its probes, then recovers; the slow one answers 429 once more, then 202.
    let deferred_at_start = store.counts(std::time::UNIX_EPOCH).await.unwrap().deferred;
    let scheduler = |stack| {
        Scheduler::new(store.clone() as Arc<dyn Store>, stack, |record| {
            http_request(record, None)
        })
        .poll_every(Duration::from_millis(20))
        .rate(1000)
        .backlog_every(Duration::from_secs(3600))
        .listener(metrics.clone())
        .spawn()
    };
    let running = scheduler(stack.clone());
    wait_until("two failed probes of the SMS provider", || async {
        sms.seen.lock().unwrap().answered(503) >= before[2].answered(503) + 2
    })
    .await;
    sms.down.store(false, Ordering::SeqCst);
    wait_until("every deferred record delivered", || async {
        store.counts(std::time::UNIX_EPOCH).await.unwrap().deferred == 0
    })
    .await;
    running.shutdown().await;
    let after_resends: Vec<Seen> = providers
        .iter()
        .map(|(_, p, _)| p.seen.lock().unwrap().clone())
        .collect();
    let second = scrape(&scraper, admin).await;
    check_resends(
        &first,
        &second,
        &before,
        &after_resends,
        &health.report(),
        &report,
    );
    assert_eq!(
        second.sum("backstop_deferred_backlog", &[]),
        deferred_at_start as f64,
        "the scheduler's one count, at its start"
    );
    check_dead_letters(&second, &callers.entered);

    // A scheduler's count of the drained store.
    scheduler(stack.clone()).shutdown().await;
    let third = scrape(&scraper, admin).await;
    assert_eq!(third.sum("backstop_deferred_backlog", &[]), 0.0);

    // Phase 3: the caller's bug is fixed and the permanent failures are re-driven: the even
    // messages go through, the odd ones fail for good again.
    bad.fixed.store(true, Ordering::SeqCst);
    let redrive = Redrive::new(Filter::new().class("permanent"), 1000, 100)
        .unwrap()
        .listener(metrics.clone())
        .run(&*store, stack.clone(), |record| http_request(record, None))
        .await
        .unwrap();
    let last = scrape(&scraper, admin).await;
    let bad_now = bad.seen.lock().unwrap().clone();
    assert_eq!(
        (redrive.resolved(), redrive.failed(), redrive.skipped()),
        (6, 6, 0),
        "{redrive:?}"
    );
    let delta = |name: &str, with: &[(&str, &str)]| last.sum(name, with) - third.sum(name, with);
    for (outcome, n) in [
        ("resolved", redrive.resolved()),
        ("failed", redrive.failed()),
        ("skipped", redrive.skipped()),
    ] {
        assert_eq!(
            last.sum("backstop_redrives_total", &[("outcome", outcome)]),
            n as f64,
            "re-drives {outcome}"
        );
    }
    let bad_before = &after_resends[1];
    assert_eq!(
        delta(
            "backstop_calls_total",
            &[("outcome", "success_without_retry")]
        ),
        (bad_now.answered(202) - bad_before.answered(202)) as f64
    );
    assert_eq!(
        delta(
            "backstop_calls_total",
            &[("outcome", "failed_without_retry")]
        ),
        (bad_now.answered(400) - bad_before.answered(400)) as f64
    );
    assert_eq!(
        delta(
            "backstop_attempts_total",
            &[("class", "permanent"), ("processed", "yes")]
        ),
        (bad_now.answered(400) - bad_before.answered(400)) as f64
    );
    // A record re-driven that fails for good again was already a dead letter.
    check_dead_letters(&last, &callers.entered);

    // Over the whole run: every request a provider received is one attempt, and nothing else
    // is; every failure code the providers answered is counted once as new.
    let received: u64 = providers
        .iter()
        .map(|(_, p, _)| p.seen.lock().unwrap().requests())
        .sum();
    assert_eq!(last.sum("backstop_attempts_total", &[]), received as f64);
    assert_eq!(
        last.sum("backstop_attempt_duration_seconds_count", &[]),
        received as f64
    );
    let codes: BTreeSet<String> = providers
        .iter()
        .flat_map(|(_, p, _)| {
            let seen = p.seen.lock().unwrap().clone();
            seen.answers
                .into_keys()
                .filter(|s| *s >= 300)
                .map(|s| format!("http {s}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(last.values_of("backstop_new_codes_total", "code"), codes);
    assert_eq!(
        last.sum("backstop_new_codes_total", &[]),
        codes.len() as f64
    );
    check_breakers(
        &last,
        &health.report(),
        &providers.map(|(_, _, a)| a.to_string()),
    );
}

/// Phase 1: calls by outcome as the callers saw them; attempts, their durations and the
/// retries as the providers answered them.
fn check_calls_and_attempts(scrape: &Scrape, callers: &Callers, seen: &[Seen]) {
    for (outcome, n) in &callers.calls {
        assert_eq!(
            scrape.sum("backstop_calls_total", &[("outcome", outcome)]),
            *n as f64,
            "calls {outcome}"
        );
    }
    let answered = |status: u16| seen.iter().map(|s| s.answered(status)).sum::<u64>() as f64;
    for (class, processed, status) in [
        ("success", "yes", 202),
        ("transient", "no", 503),
        ("permanent", "yes", 400),
        ("throttled", "no", 429),
    ] {
        assert_eq!(
            scrape.sum(
                "backstop_attempts_total",
                &[("class", class), ("processed", processed)]
            ),
            answered(status),
            "attempts of class {class}: the {status} answers"
        );
        assert_eq!(
            scrape.sum(
                "backstop_attempt_duration_seconds_count",
                &[("class", class)]
            ),
            answered(status),
            "durations of class {class}"
        );
    }
    assert_eq!(
        scrape.sum("backstop_attempts_total", &[("class", "circuit_open")]),
        0.0,
        "a rejection is not an attempt"
    );
    // One pass per message: every arrival after a message's first is a retry that went out.
    let retries: u64 = seen
        .iter()
        .flat_map(|s| s.arrivals.values())
        .map(|n| n.saturating_sub(1))
        .sum();
    assert!(retries > 0);
    assert_eq!(
        scrape.sum("backstop_retry_delay_seconds_count", &[]),
        retries as f64,
        "retry delays count the retries that went out"
    );
    // Every call that retried, a deferred one too.
    assert_eq!(
        scrape.sum("backstop_call_retries_count", &[]),
        callers.retried as f64
    );
}

/// Each breaker's rejections, openings and state, as the breaker itself counts them.
fn check_breakers(scrape: &Scrape, report: &HealthReport, names: &[String]) {
    for name in names {
        let b = breaker(report, name);
        assert_eq!(
            scrape.sum("backstop_breaker_rejections_total", &[("breaker", name)]),
            b.rejected as f64,
            "rejections of {name}"
        );
        assert_eq!(
            scrape.sum(
                "backstop_breaker_transitions_total",
                &[("breaker", name), ("to", "open")]
            ),
            b.opened as f64,
            "openings of {name}"
        );
        if b.opened > 0 {
            assert_eq!(
                scrape.sum(
                    "backstop_breaker_state",
                    &[("breaker", name), ("state", b.state.as_str())]
                ),
                1.0,
                "state of {name}"
            );
        }
    }
    let sms_opened = names.iter().map(|n| breaker(report, n).opened).sum::<u64>();
    assert!(sms_opened > 0, "a breaker tripped");
}

/// Dead letters by class and status: the messages that entered it, once each.
fn check_dead_letters(scrape: &Scrape, entered: &BTreeMap<(String, Status), BTreeSet<String>>) {
    let mut expected = BTreeMap::new();
    for ((class, status), ids) in entered {
        let status = match status {
            Status::Dead => "dead",
            Status::Deferred => "deferred",
            other => panic!("a record written {other:?}"),
        };
        expected.insert((class.clone(), status.to_owned()), ids.len() as f64);
    }
    let mut scraped = BTreeMap::new();
    for (name, labels, value) in &scrape.0 {
        if name == "backstop_dead_letters_total" {
            scraped.insert((labels["class"].clone(), labels["status"].clone()), *value);
        }
    }
    assert_eq!(scraped, expected, "dead letters by class and status");
}

/// Phase 2: the scheduler's re-sends by outcome, against the providers' answers and the SMS
/// breaker's rejections, and the calls the re-sends made.
fn check_resends(
    first: &Scrape,
    second: &Scrape,
    before: &[Seen],
    after: &[Seen],
    report: &HealthReport,
    earlier: &HealthReport,
) {
    let delta = |name: &str, with: &[(&str, &str)]| second.sum(name, with) - first.sum(name, with);
    let grew = |f: &dyn Fn(&Seen) -> u64| -> u64 {
        before.iter().zip(after).map(|(b, a)| f(a) - f(b)).sum()
    };
    let delivered = grew(&|s| s.answered(202));
    let failed = grew(&Seen::failures);
    // Each failed SMS probe's retry met the breaker it re-opened.
    let sms_probes_failed = after[2].answered(503) - before[2].answered(503);
    let rejected: u64 = report
        .breakers
        .iter()
        .map(|b| {
            b.rejected
                - earlier
                    .breakers
                    .iter()
                    .find(|e| e.name == b.name)
                    .map_or(0, |e| e.rejected)
        })
        .sum();
    let held = rejected - sms_probes_failed;
    assert!(sms_probes_failed >= 2 && delivered > 0);
    assert_eq!(
        second.sum("backstop_resends_total", &[("outcome", "delivered")]),
        delivered as f64,
        "delivered: one 2xx each"
    );
    assert_eq!(
        second.sum("backstop_resends_total", &[("outcome", "failed")]),
        failed as f64,
        "failed: each reached the provider once"
    );
    assert_eq!(
        second.sum("backstop_resends_total", &[("outcome", "held")]),
        held as f64,
        "held: rejected before anything was sent"
    );
    assert_eq!(
        delta(
            "backstop_calls_total",
            &[("outcome", "success_without_retry")]
        ),
        delivered as f64
    );
    assert_eq!(
        delta("backstop_calls_total", &[("outcome", "deferred")]),
        (failed + held) as f64,
        "every re-send that did not deliver was deferred again"
    );
    assert_eq!(
        delta("backstop_retry_delay_seconds_count", &[]),
        0.0,
        "no retry of a re-send went out: each met the re-opened breaker, or was deferred"
    );
    assert_eq!(
        delta("backstop_attempts_total", &[]),
        grew(&Seen::requests) as f64
    );
}
