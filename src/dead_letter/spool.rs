//! The dead-letter layer's local spool: where a record goes when the store does not take it,
//! and the forwarder that moves it into the store when it answers.

use std::time::Duration;

use super::layer::Config;
use crate::store::{Lease, Record};

/// The share of the store timeout kept for the spool's write, when there is a spool: the store
/// gets the rest, so that the two together take at most the store timeout.
const SPOOL_SHARE: Duration = Duration::from_millis(100);

/// How long the store write of a failure's record may take: the whole store timeout, less the
/// spool's share when there is a spool (at most half the timeout).
pub(crate) fn store_bound(config: &Config) -> Duration {
    if has_spool(config) {
        let timeout = config.store_timeout;
        timeout - SPOOL_SHARE.min(timeout / 2)
    } else {
        config.store_timeout
    }
}

fn has_spool(config: &Config) -> bool {
    #[cfg(feature = "sqlite")]
    {
        config.spool.is_some()
    }
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = config;
        false
    }
}

/// A copy of the record and its claim for the spool, taken before the store write consumes
/// them; `None` without a spool (nothing copied).
pub(crate) fn copy(config: &Config, record: &Record, lease: Option<&Lease>) -> Option<Spare> {
    has_spool(config).then(|| Spare {
        record: record.clone(),
        lease: lease.cloned(),
    })
}

/// What [`copy`] kept (never made without the `sqlite` feature: no spool then).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) struct Spare {
    record: Record,
    lease: Option<Lease>,
}

/// Writes `spare` to the layer's spool within what is left of the store timeout: `Ok` when
/// the spool took it, `Err` with why not (full, its disk failing, too slow).
pub(crate) async fn put(
    config: &std::sync::Arc<Config>,
    spare: Spare,
    left: Duration,
) -> Result<(), String> {
    #[cfg(feature = "sqlite")]
    if let Some(spool) = &config.spool {
        let written = super::bounded::bounded(left, spool.put(spare.record, spare.lease)).await;
        let result = match written {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err(format!(
                "the spool did not answer within {}",
                humantime::format_duration(left)
            )),
        };
        let state = spool.state();
        config.listener.emit_ref(&crate::observe::Event::Spool {
            outcome: if result.is_ok() { "spooled" } else { "refused" },
            count: 1,
            records: state.records,
            bytes: state.bytes,
            store_up: false,
        });
        if result.is_ok() && !spool.is_forwarding() {
            start_forwarder(config);
        }
        return result;
    }
    let _ = (config, spare, left);
    Err("no spool".into())
}

/// Starts the spool's forwarder for the layer's store, once per spool, when in a tokio runtime
/// (else the first failure's write starts it).
pub(crate) fn start_forwarder(config: &std::sync::Arc<Config>) {
    #[cfg(feature = "sqlite")]
    if let Some(spool) = &config.spool
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        let listener = config.listener.clone();
        let mut down = false;
        let forward = spool.forward(
            std::sync::Arc::clone(&config.store),
            config.store_timeout,
            move |spool, result| report(&listener, spool, result, &mut down),
        );
        runtime.spawn(forward);
    }
    let _ = config;
}

/// Tells `listener` what a forwarding did.
#[cfg(feature = "sqlite")]
fn report(
    listener: &crate::observe::Hook,
    spool: &tower_backstop_store::Spool,
    result: Result<tower_backstop_store::Forwarded, &tower_backstop_store::SpoolError>,
    down: &mut bool,
) {
    let state = spool.state();
    let tell = |outcome, count| {
        listener.emit_ref(&crate::observe::Event::Spool {
            outcome,
            count,
            records: state.records,
            bytes: state.bytes,
            store_up: state.store_up,
        });
    };
    match result {
        Ok(done) => {
            *down = false;
            tracing::info!(spool = %spool.path().display(), written = done.written, already_there = done.already_there, superseded = done.superseded, quarantined = done.quarantined, left = state.records, "spooled records forwarded to the dead-letter store");
            for (outcome, count) in [
                ("forwarded", done.written),
                ("already_there", done.already_there),
                ("superseded", done.superseded),
                ("quarantined", done.quarantined),
            ] {
                if count > 0 {
                    tell(outcome, count);
                }
            }
        }
        Err(e) => {
            // Once per outage at WARN; each try after it at DEBUG.
            if !std::mem::replace(down, true) {
                tracing::warn!(spool = %spool.path().display(), error = %e, waiting = state.records, "dead-letter store not taking the spooled records; trying again every second at most");
            } else {
                tracing::debug!(spool = %spool.path().display(), error = %e, waiting = state.records, "dead-letter store still not taking the spooled records");
            }
            tell("store_down", 0);
        }
    }
}
