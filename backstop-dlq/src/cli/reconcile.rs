//! `reconcile`: ask the provider what became of each outcome-unknown dead letter.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use clap::Args;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_backstop::resend::Reconciler;
use tower_backstop::retry::Delivery;
use tower_backstop::{BoxError, Envelope};

use super::args::{FilterArgs, Global, parse_duration};
use super::store::open;
use crate::narrow;

/// `reconcile`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Reconcile {
    #[command(flatten)]
    filter: FilterArgs,
    /// The status URL; `{id}` is replaced by the message id (percent-encoded).
    #[arg(long)]
    status_url: String,
    /// Take the message id from this top-level field of the JSON payload instead of the
    /// record id.
    #[arg(long)]
    id_from_json: Option<String>,
    /// Records in all, at most.
    #[arg(long, default_value_t = 1000)]
    max: usize,
    /// Timeout of each status request (`5s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
}

/// `reconcile`: each outcome-unknown record of the filter, asked about and changed.
pub(crate) async fn reconcile(
    g: &Global,
    a: &Reconcile,
    now: SystemTime,
) -> Result<ExitCode, BoxError> {
    if !a.status_url.contains("{id}") {
        eprintln!("the status URL must contain {{id}}, where the message id goes");
        return Ok(ExitCode::from(2));
    }
    let (filter, narrow) = a.filter.build(now)?;
    let store = open(g, true).await?;
    let Some(filter) = narrow::action_filter(&*store, &filter, &narrow).await? else {
        out!("reconciled 0: no record matches");
        return Ok(ExitCode::SUCCESS);
    };
    let check = http_status_check(a.status_url.clone(), a.id_from_json.clone(), a.timeout);
    let report = Reconciler::new(check)
        .filter(filter)
        .max(a.max)
        .run(&*store)
        .await?;
    for id in &report.delivered {
        out!("{id}  delivered: resolved");
    }
    for id in &report.not_delivered {
        out!("{id}  not delivered: deferred, to be sent again");
    }
    for id in &report.unknown {
        out!("{id}  still unknown");
    }
    for (id, why) in &report.skipped {
        out!("{id}  skipped: {why}");
    }
    out!(
        "reconciled {}: {} delivered, {} not delivered, {} still unknown, {} skipped",
        report.delivered.len()
            + report.not_delivered.len()
            + report.unknown.len()
            + report.skipped.len(),
        report.delivered.len(),
        report.not_delivered.len(),
        report.unknown.len(),
        report.skipped.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// A status check's answer, boxed.
type Checked = Pin<Box<dyn Future<Output = Delivery> + Send>>;

/// The HTTP status check of `reconcile`: `GET` `url` with `{id}` replaced; 200 → delivered,
/// 404 → not delivered, anything else (an error, no answer within `timeout`) → unknown.
fn http_status_check(
    url: String,
    id_from_json: Option<String>,
    timeout: Duration,
) -> impl Fn(Envelope) -> Checked + Send + Sync + 'static {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    move |envelope: Envelope| {
        let id = match &id_from_json {
            None => envelope.id.clone(),
            Some(field) => serde_json::from_slice::<serde_json::Value>(&envelope.payload)
                .ok()
                .and_then(|v| v.get(field).and_then(|id| id.as_str()).map(str::to_owned)),
        };
        let uri = id.and_then(|id| {
            url.replace("{id}", &crate::html::encode(&id))
                .parse::<http::Uri>()
                .ok()
        });
        let client = client.clone();
        Box::pin(async move {
            let Some(uri) = uri else {
                return Delivery::Unknown;
            };
            match tokio::time::timeout(timeout, client.get(uri)).await {
                Ok(Ok(r)) if r.status() == http::StatusCode::OK => Delivery::Delivered,
                Ok(Ok(r)) if r.status() == http::StatusCode::NOT_FOUND => Delivery::NotDelivered,
                _ => Delivery::Unknown,
            }
        })
    }
}
