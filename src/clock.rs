//! [`Clock`]: where the times of dead-letter records come from.

use std::time::SystemTime;

/// Where record times come from: the failure and retry-at times the
/// [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) writes, and the times the
/// [`Scheduler`](crate::resend::Scheduler), [`Redrive`](crate::resend::Redrive) and
/// [`Reconciler`](crate::resend::Reconciler) compare and write.
///
/// [`Clock::system`] reads the system clock. [`Clock::tokio`] counts tokio's clock from the
/// system time when it was made, so that tests on tokio's paused clock (`start_paused`,
/// `advance`) move record times too.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    anchor: Option<(SystemTime, tokio::time::Instant)>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock { anchor: None }
    }

    /// Tokio's clock, anchored at the system time now. Call it inside a tokio runtime.
    pub fn tokio() -> Self {
        Clock {
            anchor: Some((SystemTime::now(), tokio::time::Instant::now())),
        }
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        match self.anchor {
            None => SystemTime::now(),
            Some((system, instant)) => system + instant.elapsed(),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}
