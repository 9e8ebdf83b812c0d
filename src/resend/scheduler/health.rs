//! Whether the scheduler's store answers: said once when it stops, once when it is back.

use tokio::time::Instant;

use crate::observe::{Event, Hook};
use crate::store::StoreError;

/// The store as the scheduler's loop sees it. Every failed operation is an
/// [`Event::StoreError`]; the log says it once: a WARN at the first failure, DEBUG for the
/// others while it lasts, and an INFO with the time it took when an operation succeeds again.
#[derive(Debug)]
pub(super) struct Health {
    listener: Hook,
    /// Since when the store fails, if it does.
    down_since: Option<Instant>,
}

impl Health {
    pub(super) fn new(listener: Hook) -> Self {
        Health {
            listener,
            down_since: None,
        }
    }

    /// `operation` failed with `error`.
    pub(super) fn failed(&mut self, operation: &'static str, error: &StoreError) {
        self.listener.emit_ref(&Event::StoreError {
            operation,
            id: None,
            error,
        });
        if self.down_since.is_some() {
            tracing::debug!(operation, error = %error, "dead-letter store still unavailable");
            return;
        }
        self.down_since = Some(Instant::now());
        tracing::warn!(
            operation,
            error = %error,
            "dead-letter store unavailable: the scheduler keeps trying every poll; records wait \
             in the store, and claims in flight end at their lease"
        );
    }

    /// An operation succeeded.
    pub(super) fn ok(&mut self) {
        if let Some(since) = self.down_since.take() {
            tracing::info!(
                down_for = ?since.elapsed(),
                "dead-letter store available again: the scheduler resumes"
            );
        }
    }
}
