//! The long-outage scenario of `examples/soak.rs`: the provider is healthy, then answers every
//! request `503` for a long time, then recovers, while messages keep coming open loop and the
//! dead-letter scheduler runs beside the callers from the start, as in production. Every
//! message carries an idempotency key (a webhook dispatcher's events).
//!
//! What it measures, beside what the short outage reports: the scheduler's sends that reached
//! the provider during the outage against the breaker's half-open periods, the records that
//! ended dead only because of local rejections, whether records read during the outage name the
//! provider's failure as their root cause, and the time from recovery until the breaker closes
//! and from then until the backlog is delivered, against the drain time the scheduler's rate
//! allows.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, header};
use bytes::Bytes;
use http_body_util::Full;
use tokio::task::JoinSet;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_backstop::Failure;
use tower_backstop::breaker::{Authority, State};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::DeadLetterLayer;
use tower_backstop::resend::{Scheduler, http_request};
use tower_backstop::retry::RetryPolicy;
use tower_backstop::store::{Filter, Record, SqliteStore, Status, Store};
use tower_backstop::timeout::TimeoutLayer;

use super::{ATTEMPT_TIMEOUT, End, MAX_ATTEMPTS, Message, Req, Resp, client, readme_breaker};

/// The header the scheduler's re-sends carry, so that the provider can count them.
pub(crate) const RESEND_HEADER: &str = "x-backstop-resend";

/// The phases and rates of a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) healthy: Duration,
    pub(crate) down: Duration,
    pub(crate) after: Duration,
    /// Messages a second, open loop, through all three phases.
    pub(crate) rate: u32,
    /// The scheduler's re-sends a second ([`Scheduler::rate`]).
    pub(crate) drain_rate: u32,
}

/// What a run found.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) sent: usize,
    pub(crate) delivered: usize,
    pub(crate) delivered_once: usize,
    pub(crate) duplicates: usize,
    /// Dead letters whose final word is an open breaker's rejection: dead only because of
    /// local rejections.
    pub(crate) dead_local: usize,
    /// Dead letters that exhausted their attempts on the provider's real failures.
    pub(crate) dead_exhausted: usize,
    /// Still deferred or in flight when the run gave up waiting.
    pub(crate) waiting: usize,
    /// Neither delivered nor in the store.
    pub(crate) lost: usize,
    /// The scheduler's re-sends that reached the provider while it was down.
    pub(crate) resends_in_outage: u64,
    /// The breaker's half-open periods while the provider was down.
    pub(crate) half_open_periods: u64,
    /// Deferred records read halfway through the outage, and how many of them name the
    /// provider's failure (`http 503`) as their root cause.
    pub(crate) read_mid_outage: usize,
    pub(crate) named_cause: usize,
    /// One of them, to show.
    pub(crate) sample: Option<(String, String)>,
    /// Records outstanding (deferred or in flight) when the breaker closed after recovery.
    pub(crate) backlog: usize,
    pub(crate) recovery_to_close: Duration,
    /// From the breaker's closing until no record was deferred or in flight.
    pub(crate) drain: Duration,
    /// `backlog / drain_rate`: the drain time the scheduler's rate allows.
    pub(crate) drain_allowed: Duration,
}

fn keyed_request(uri: &http::Uri, n: usize) -> Result<(String, Req), BoxError> {
    let id = format!("e-{n:06}");
    let body = serde_json::to_vec(&Message {
        id: id.clone(),
        to: format!("https://customer{}.example/hooks", n % 4),
    })?;
    let req = http::Request::post(uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", &id)
        .body(Full::new(Bytes::from(body)))?;
    Ok((id, req))
}

async fn outstanding(store: &dyn Store) -> Result<Vec<Record>, BoxError> {
    Ok(store
        .list(usize::MAX)
        .await?
        .into_iter()
        .filter(|r| matches!(r.status, Status::Deferred | Status::InFlight))
        .collect())
}

/// Runs the scenario against a fresh provider and a SQLite store in a temporary directory.
pub(crate) async fn run(plan: Plan) -> Result<Report, BoxError> {
    let (addr, provider) = super::start_provider(false).await?;
    let uri: http::Uri = format!("http://{addr}/v1/messages").parse()?;
    let key = Authority::key_of(&http::Request::post(uri.clone()).body(())?)
        .ok_or("the provider's URI has no authority")?;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("soak.db"))?);
    let breaker = readme_breaker()?;
    let typed = ServiceBuilder::new()
        .layer(DeadLetterLayer::from_arc(Arc::clone(&store)))
        .layer(
            RetryPolicy::new()
                .max_attempts(MAX_ATTEMPTS)
                .max_hint_delay(ATTEMPT_TIMEOUT)
                .build()?,
        )
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(ATTEMPT_TIMEOUT))
        .service(client());
    let svc = typed
        .clone()
        .map_err(|f: Failure<Resp>| -> BoxError { Box::new(f) });
    let scheduler = Scheduler::new(Arc::clone(&store), typed, |r: &Record| {
        http_request(r, None).map(|mut req| {
            req.headers_mut()
                .insert(RESEND_HEADER, HeaderValue::from_static("1"));
            req
        })
    })
    .poll_every(Duration::from_millis(100))
    .rate(plan.drain_rate)
    .spawn();

    let half_opened = || {
        breaker
            .handle_for(&key)
            .map_or(0, |h| h.stats().half_opened)
    };
    let start = Instant::now();
    let total = plan.healthy + plan.down + plan.after;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / plan.rate.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = JoinSet::new();
    let (mut n, mut half_opened_at_start, mut sampled) = (0, None, false);
    let (mut read_mid_outage, mut named_cause, mut sample) = (0, 0, None);
    let mut recovery = None;
    let mut half_open_periods = 0;
    loop {
        tick.tick().await;
        let now = start.elapsed();
        if now >= total {
            break;
        }
        let down = now >= plan.healthy && now < plan.healthy + plan.down;
        provider.outage.store(down, Ordering::SeqCst);
        if down && half_opened_at_start.is_none() {
            half_opened_at_start = Some(half_opened());
        }
        if !down && recovery.is_none() && now >= plan.healthy {
            recovery = Some(Instant::now());
            half_open_periods = half_opened() - half_opened_at_start.unwrap_or(0);
        }
        if down && !sampled && now >= plan.healthy + plan.down / 2 {
            sampled = true;
            let waiting = outstanding(&*store).await?;
            read_mid_outage = waiting.len();
            named_cause = waiting
                .iter()
                .filter(|r| r.cause.as_ref().is_some_and(|c| c.code == "http 503"))
                .count();
            sample = waiting.iter().find(|r| r.class == "circuit_open").map(|r| {
                (
                    r.message.clone(),
                    r.cause
                        .as_ref()
                        .map(|c| c.message.clone())
                        .unwrap_or_default(),
                )
            });
        }
        let (id, req) = keyed_request(&uri, n)?;
        n += 1;
        let svc = svc.clone();
        tasks.spawn(async move { (id, super::send(svc, req).await) });
    }
    provider.outage.store(false, Ordering::SeqCst);
    let recovery = recovery.unwrap_or_else(Instant::now);
    let resends_in_outage = provider.resend_outage_requests.load(Ordering::Relaxed);

    // When the breaker closes after the recovery, and what is outstanding then.
    let mut closed = None;
    let mut backlog = 0;
    let allowed_wait = Duration::from_secs(120) + plan.down;
    while recovery.elapsed() < allowed_wait {
        if breaker
            .handle_for(&key)
            .is_none_or(|h| h.state() == State::Closed)
        {
            closed = Some(Instant::now());
            backlog = outstanding(&*store).await?.len();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let closed = closed.unwrap_or_else(Instant::now);
    let mut messages = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        messages.push(joined?);
    }
    let drain_allowed = Duration::from_secs_f64(backlog as f64 / f64::from(plan.drain_rate));
    let give_up = closed + drain_allowed * 3 + Duration::from_secs(30);
    let mut settled = None;
    while Instant::now() < give_up {
        if outstanding(&*store).await?.is_empty() {
            settled = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    scheduler.shutdown().await;
    let settled = settled.unwrap_or_else(Instant::now);

    // Every record, the resolved ones too: a message delivered by a re-send is one.
    let records: std::collections::HashMap<String, Record> = store
        .search(&Filter::new(), 0..usize::MAX)
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    let ledger = provider.ledger();
    let mut report = Report {
        sent: messages.len(),
        delivered: 0,
        delivered_once: 0,
        duplicates: 0,
        dead_local: 0,
        dead_exhausted: 0,
        waiting: 0,
        lost: 0,
        resends_in_outage,
        half_open_periods,
        read_mid_outage,
        named_cause,
        sample,
        backlog,
        recovery_to_close: closed.saturating_duration_since(recovery),
        drain: settled.saturating_duration_since(closed),
        drain_allowed,
    };
    for (id, (end, record)) in &messages {
        let effects = ledger.effects.get(id).copied().unwrap_or(0);
        if effects > 1 {
            report.duplicates += 1;
        }
        let stored = record.as_ref().and_then(|r| records.get(r));
        let delivered = match (end, stored.map(|r| r.status)) {
            (End::Delivered, _) | (_, Some(Status::Resolved)) => true,
            (_, Some(Status::Dead)) => {
                if stored.is_some_and(|r| r.class == "circuit_open") {
                    report.dead_local += 1;
                } else {
                    report.dead_exhausted += 1;
                }
                false
            }
            (_, Some(_)) => {
                report.waiting += 1;
                false
            }
            (_, None) => {
                report.lost += 1;
                false
            }
        };
        if delivered {
            report.delivered += 1;
            if effects == 1 {
                report.delivered_once += 1;
            }
        }
    }
    Ok(report)
}
