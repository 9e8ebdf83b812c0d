//! Wake-ups through `LISTEN`/`NOTIFY`, an option of the store: each write that may make a record
//! due sooner (a deferred record written, a claim given back) notifies a channel of the store's
//! schema, and each scheduler listens on it.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::watch;

/// The longest channel name Postgres keeps whole (`NAMEDATALEN` − 1 bytes); `pg_notify` refuses
/// a longer one and `LISTEN` cuts it.
const MAX_CHANNEL: usize = 63;

/// The channel of the store whose tables are in `schema`: `{schema}_due`, or, when that is longer
/// than Postgres allows, `backstop_due_` and a 64-bit FNV-1a hash of the schema name in hex (the
/// same in every process).
pub(super) fn channel(schema: &str) -> Arc<str> {
    let name = format!("{schema}_due");
    if name.len() <= MAX_CHANNEL {
        return Arc::from(name);
    }
    let hash = schema.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    Arc::from(format!("backstop_due_{hash:016x}"))
}

/// How long to wait before listening again after the listening connection failed.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

/// A receiver that changes on each notification of `channel`, from a task that listens on a
/// connection of `pool` (taken out of it for as long as the receiver lives) and listens again
/// after a failure. Each (re)start of the listening counts as a wake-up: a notification sent
/// while nobody listened is not lost.
pub(super) fn listen(pool: PgPool, channel: Arc<str>) -> watch::Receiver<u64> {
    let (wake, woken) = watch::channel(0u64);
    tokio::spawn(async move {
        let mut failed = false;
        while !wake.is_closed() {
            if failed {
                tokio::select! {
                    () = wake.closed() => return,
                    () = tokio::time::sleep(RELISTEN_AFTER) => {}
                }
            }
            failed = true;
            let mut listener = match PgListener::connect_with(&pool).await {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::debug!(%error, "cannot listen for due wake-ups; trying again");
                    continue;
                }
            };
            if let Err(error) = listener.listen(&channel).await {
                tracing::debug!(%error, "cannot listen for due wake-ups; trying again");
                continue;
            }
            wake.send_modify(|n| *n = n.wrapping_add(1));
            loop {
                tokio::select! {
                    () = wake.closed() => return,
                    received = listener.recv() => match received {
                        Ok(_) => wake.send_modify(|n| *n = n.wrapping_add(1)),
                        Err(error) => {
                            tracing::debug!(%error, "due wake-ups interrupted; listening again");
                            break;
                        }
                    },
                }
            }
        }
    });
    woken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_name_fits_postgres_and_stays_apart_per_schema() {
        assert_eq!(&*channel("backstop"), "backstop_due");
        let long = "s".repeat(60);
        let other = format!("{}t", "s".repeat(59));
        let (a, b) = (channel(&long), channel(&other));
        assert!(a.len() <= MAX_CHANNEL && b.len() <= MAX_CHANNEL, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, channel(&long), "the same in every process");
        assert!(a.starts_with("backstop_due_"));
        // 59 bytes and "_due" is 63: kept whole.
        assert_eq!(channel(&"s".repeat(59)).len(), 63);
    }
}
