//! What the examples share: waiting for a dead-letter scheduler to settle a store.

use std::time::{Duration, Instant};

use tower_backstop::store::{Status, Store, StoreError};

/// Waits until no record in `store` is deferred or in flight (the scheduler has settled every
/// one), polling every 100 ms, for at most `give_up`.
///
/// # Errors
///
/// The store's, when it cannot be listed.
pub async fn until_settled(store: &dyn Store, give_up: Duration) -> Result<(), StoreError> {
    let give_up = Instant::now() + give_up;
    while Instant::now() < give_up {
        let waiting = store
            .list(usize::MAX)
            .await?
            .iter()
            .filter(|r| matches!(r.status, Status::Deferred | Status::InFlight))
            .count();
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
