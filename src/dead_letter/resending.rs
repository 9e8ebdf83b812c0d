//! The record a re-send is for, so that the dead-letter layer tells a record that enters a
//! status once: a re-send or re-drive that fails and leaves the record in the status it had
//! (deferred again, dead again) writes the new failure but is no new dead letter.

use std::future::Future;

use tokio::task::futures::TaskLocalFuture;

use crate::store::Status;

tokio::task_local! {
    static RESENDING: Resending;
}

/// A re-send of record `id`, which had `status` before it was claimed.
pub(crate) struct Resending {
    id: String,
    status: Status,
}

/// Runs `call` (a re-send's call through the stack) as the re-send of `id`, which had `status`
/// before it was claimed (a record the scheduler claimed, in flight, was deferred).
pub(crate) fn scope<F: Future>(id: &str, status: Status, call: F) -> TaskLocalFuture<Resending, F> {
    let status = match status {
        Status::InFlight => Status::Deferred,
        other => other,
    };
    let resending = Resending {
        id: id.to_owned(),
        status,
    };
    RESENDING.scope(resending, call)
}

/// Whether writing record `id` with `status` leaves it in the status it had before the re-send
/// this task runs, if any.
pub(crate) fn is_repeat(id: &str, status: Status) -> bool {
    RESENDING
        .try_with(|r| r.id == id && r.status == status)
        .unwrap_or(false)
}

/// The status the record of the re-send this task runs had before it was claimed (deferred for
/// the scheduler's re-sends), if it runs one.
pub(crate) fn status() -> Option<Status> {
    RESENDING.try_with(|r| r.status).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_is_a_repeat_only_inside_the_resend_of_its_record_and_status() {
        assert!(
            !is_repeat("a", Status::Deferred),
            "no re-send: never a repeat"
        );
        scope("a", Status::InFlight, async {
            assert!(
                is_repeat("a", Status::Deferred),
                "claimed in flight: was deferred"
            );
            assert!(!is_repeat("a", Status::Dead), "a new status");
            assert!(!is_repeat("b", Status::Deferred), "another record");
        })
        .await;
        scope("a", Status::Dead, async {
            assert!(is_repeat("a", Status::Dead));
            assert!(!is_repeat("a", Status::Deferred));
        })
        .await;
    }
}
