//! [`FleetNote`]: what one process of a fleet tells the others through the store it shares with
//! them (its breakers' states, an operator's override), and what the stores do with it.

use std::time::{Duration, SystemTime};

use super::StoreError;

/// One note a process (or an operator) keeps in the store for the rest of the fleet: the
/// latest word of `author` on `topic`. A store keeps one note per `(topic, author)`: a newer
/// [`put_note`](super::Store::put_note) replaces the older one. A note is no longer read once its
/// [`expires_at`](Self::expires_at) passed, so the word of a process that died ends by itself.
///
/// The store does not read [`body`](Self::body): its format is the writer's (the breakers of
/// `tower-backstop` write a versioned JSON object), and a reader ignores a body it cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetNote {
    /// What the note is about: for a breaker's state, `breaker:` and the breaker's name
    /// (`breaker:api.mail.test:443`); for an operator's override, `override:` and the name.
    pub topic: String,
    /// Who wrote it: a process's id (unique per process start), or `operator`.
    pub author: String,
    /// The note itself, in the writer's format (at most 64 KiB is sensible: it is read by every
    /// process, several times a second).
    pub body: String,
    /// When it was written, by the writer's clock.
    pub written_at: SystemTime,
    /// When it stops being read.
    pub expires_at: SystemTime,
}

impl FleetNote {
    /// A note of `author` on `topic`, written at `now`, read for `ttl`.
    pub fn new(
        topic: impl Into<String>,
        author: impl Into<String>,
        body: impl Into<String>,
        now: SystemTime,
        ttl: Duration,
    ) -> Self {
        FleetNote {
            topic: topic.into(),
            author: author.into(),
            body: body.into(),
            written_at: now,
            expires_at: super::add_clamped(now, ttl),
        }
    }
}

/// The error of a store that keeps no fleet notes.
pub(crate) fn no_notes() -> StoreError {
    StoreError::new("this store keeps no fleet notes")
}
