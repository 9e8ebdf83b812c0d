//! [`SendSlot`]: the place in its breaker's queue that a call held back by the adaptive send
//! rate (or the adaptive concurrency limit) carries up on its failure, for a retry layer to
//! wait its turn with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::limit;
use super::rate::Ticket;
use super::state::Shared;
use crate::failure::Note;

/// The place a paced call took in its breaker's queue, on its failure: a retry layer that
/// waits for its turn asks [`ready`](Self::ready) when it wakes (sleeping again while the turn
/// has not come, the rate having fallen), then redeems it just before it sends, so that the
/// breaker lets that call through at once. Dropped unredeemed, its turn goes to the next in
/// line.
pub(crate) struct SendSlot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ticket: Queue,
    pub(crate) redeemed: bool,
}

/// Which queue of its breaker a slot is in, with its place there.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Queue {
    /// The adaptive send rate's.
    Rate(Ticket),
    /// The adaptive concurrency limit's.
    Limit(limit::Ticket),
}

impl SendSlot {
    /// `None` when the turn came (the caller sends now, and the breaker lets it through);
    /// else the time until it comes, at the rate (or the limit) now.
    pub(crate) fn ready(&mut self) -> Option<Duration> {
        let now = self.shared.now_nanos();
        let turn = match &mut self.ticket {
            Queue::Rate(ticket) => self.shared.pacer()?.redeem(ticket, now),
            Queue::Limit(ticket) => self.shared.limiter()?.redeem(*ticket, now),
        };
        match turn {
            Ok(()) => {
                self.redeemed = true;
                None
            }
            Err(left) => Some(left),
        }
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        if self.redeemed {
            return;
        }
        let now = self.shared.now_nanos();
        match self.ticket {
            Queue::Rate(ticket) => {
                if let Some(pacer) = self.shared.pacer() {
                    pacer.give_back(ticket, now);
                }
            }
            Queue::Limit(ticket) => {
                if let Some(limiter) = self.shared.limiter() {
                    limiter.give_back(ticket, now);
                }
            }
        }
    }
}

impl fmt::Debug for SendSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendSlot")
            .field("breaker", &self.shared.name)
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl Note for SendSlot {}
