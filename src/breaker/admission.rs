//! [`Admission`]: a breaker as a caller outside this module uses it (the server flavour): ask for
//! a permit, get a [`Ticket`] or the time left until half-open, report on the ticket how the
//! call ended. A ticket dropped before that gives its permit back.

use std::sync::Arc;
use std::time::Duration;

use super::future::Guard;
use super::state::{Outcome, Shared};
use crate::failure::Class;

/// One breaker's door: [`ask`](Self::ask) before each call. Cheap to clone (a reference count).
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    shared: Arc<Shared>,
}

impl Admission {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Admission { shared }
    }

    /// A ticket for one call, or, while the breaker rejects calls, `Err` with the time left until
    /// it half-opens (`None` when forced open). A rejection is counted, logged and given to the
    /// breaker's listener like the breaker layer's own.
    #[inline]
    pub(crate) fn ask(&self) -> Result<Ticket, Option<Duration>> {
        match self.shared.admit() {
            Ok(permit) => Ok(Ticket {
                guard: Guard::new(&self.shared, permit),
            }),
            Err(rejection) => Err(rejection.retry_after()),
        }
    }
}

/// One admitted call's permit. Report how the call ended with [`finish`](Self::finish); drop it
/// (or [`release`](Self::release) it) to give the permit back with nothing counted.
#[derive(Debug)]
pub(crate) struct Ticket {
    guard: Guard,
}

impl Ticket {
    /// Records how the call ended: `None` a success, `Some(class)` a failure of that class
    /// (counted when the breaker counts that class). Only the first report counts.
    #[inline]
    pub(crate) fn finish(&mut self, failure: Option<Class>) {
        self.guard.finish_with(match failure {
            None => Outcome::Success,
            Some(class) => Outcome::Failure(class),
        });
    }

    /// Gives the permit back with nothing counted: the call never reached what the breaker
    /// guards (refused as overloaded in this process).
    #[inline]
    pub(crate) fn release(&mut self) {
        self.guard.release();
    }
}
