//! Whether the scheduler's store answers: said once when it stops, once when it is back, and
//! readable at any time ([`SchedulerHandle::store_health`](super::SchedulerHandle::store_health)).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::observe::{Event, Hook};
use crate::store::StoreError;

/// What a [`Scheduler`](super::Scheduler) knows of its store, as
/// [`SchedulerHandle::store_health`](super::SchedulerHandle::store_health) reads it: whether
/// its last store operation failed, since when, and why.
///
/// The scheduler rides through a store that fails: it keeps every record (they wait in the
/// store), backs off its claims, and tries the outcome of each re-send again until it is
/// written (see [`Scheduler`](super::Scheduler)). Every failed operation is also an
/// [`Event::StoreError`](crate::observe::Event::StoreError).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreHealth {
    /// Since when the store fails, on the scheduler's clock ([`Scheduler::clock`]): the time of
    /// the first failure since an operation last succeeded. `None` while it answers.
    ///
    /// [`Scheduler::clock`]: super::Scheduler::clock
    pub failing_since: Option<SystemTime>,
    /// The operation that failed last, while the store fails (`"claim"`, `"next_due"`,
    /// `"count"`, `"update"`, `"renew"`, `"slot"`, `"prune"`), else `None`.
    pub operation: Option<&'static str>,
    /// The store's last error, as displayed, while the store fails, else `None`. A store call
    /// that did not answer in time reads `dead-letter store did not answer within …`.
    pub last_error: Option<String>,
    /// The store operations that failed since the scheduler started.
    pub failures: u64,
}

impl StoreHealth {
    /// Whether the store fails now (its last operation failed).
    pub fn is_failing(&self) -> bool {
        self.failing_since.is_some()
    }
}

/// The store as the scheduler's loop and its re-sends see it. Every failed operation is an
/// [`Event::StoreError`]; the log says it once: a WARN at the first failure, DEBUG for the
/// others while it lasts, and an INFO with the time it took when an operation succeeds again.
/// Clones share one state.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    listener: Hook,
    clock: Clock,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    public: StoreHealth,
    /// Since when the store fails, on tokio's clock, for the log.
    down_since: Option<Instant>,
}

impl Health {
    pub(crate) fn new(listener: Hook, clock: Clock) -> Self {
        Health {
            listener,
            clock,
            state: Arc::default(),
        }
    }

    /// What is known now.
    pub(crate) fn read(&self) -> StoreHealth {
        self.state.lock().expect("health poisoned").public.clone()
    }

    /// `operation` failed with `error` (on the record `id`, if it names one).
    pub(crate) fn failed(&self, operation: &'static str, error: &StoreError) {
        self.failed_on(operation, None, error);
    }

    /// `operation` on the record `id` failed with `error`.
    pub(crate) fn failed_on(&self, operation: &'static str, id: Option<&str>, error: &StoreError) {
        self.listener.emit_ref(&Event::StoreError {
            operation,
            id,
            error,
        });
        let first = {
            let mut state = self.state.lock().expect("health poisoned");
            state.public.failures += 1;
            state.public.operation = Some(operation);
            state.public.last_error = Some(error.to_string());
            let first = state.down_since.is_none();
            if first {
                state.down_since = Some(Instant::now());
                state.public.failing_since = Some(self.clock.now());
            }
            first
        };
        if !first {
            tracing::debug!(operation, error = %error, "dead-letter store still unavailable");
            return;
        }
        tracing::warn!(
            operation,
            error = %error,
            "dead-letter store unavailable: the scheduler backs off and keeps trying; records \
             wait in the store, and the outcome of each re-send is tried again until written"
        );
    }

    /// An operation succeeded.
    pub(crate) fn ok(&self) {
        let since = {
            let mut state = self.state.lock().expect("health poisoned");
            let Some(since) = state.down_since.take() else {
                return;
            };
            state.public.failing_since = None;
            state.public.operation = None;
            state.public.last_error = None;
            since
        };
        tracing::info!(
            down_for = ?since.elapsed(),
            "dead-letter store available again: the scheduler resumes"
        );
    }
}
