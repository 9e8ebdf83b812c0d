//! The outbox: requests put in the store to be sent later by the scheduler.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use super::layer::Config;
use super::write_ahead::{OUTBOX, queued_record};
use crate::request::Describe;
use crate::store::{Record, Status, Store, StoreError};

/// Sends later, durably: puts a request in a dead-letter [`Store`] for a
/// [`Scheduler`](crate::resend::Scheduler) to send through its stack, as soon as it sees it or
/// at a time given. Once [`send_later`](Outbox::send_later) returns, the request is in the store
/// and survives the death of the process; the scheduler (of this process or any other on the
/// store) sends it, and writes the outcome as for any re-send: resolved when delivered, deferred
/// or dead, with the failure, when not.
///
/// The record is the one the dead-letter layer would write for the request (its id is the
/// `Idempotency-Key` or a [`MessageId`](crate::MessageId), else a generated one; the payload,
/// the headers with the secret ones redacted, the tags), with status
/// [`Deferred`](Status::Deferred), its retry-at time the time to send, class
/// [`QUEUED`](super::QUEUED) and code `outbox`, no attempt and an empty history: it waits like
/// a deferred request (`backstop-dlq list` shows it as deferred, [`Counts::deferred`] counts
/// it), never as a dead letter or a failure. The scheduler's re-send of it is its first send,
/// counted as a re-send ([`Record::resends`], the scheduler's
/// [`Event::Resent`](crate::observe::Event::Resent)).
///
/// With Postgres, [`record`](Outbox::record) builds the record and `PostgresStore::put_in`
/// writes it on the caller's own connection, inside the caller's transaction: the business row
/// and the request to send commit together, or neither does.
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, SystemTime};
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop::store::{MemoryStore, Status, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_backstop::store::StoreError> {
/// let store = Arc::new(MemoryStore::new());
/// let layer = DeadLetterLayer::from_arc(store.clone());
/// let outbox = layer.outbox();
/// let request = http::Request::post("https://api.mail.test/v1/messages")
///     .header("idempotency-key", "welcome-42")
///     .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
///     .unwrap();
/// // Sent by the scheduler in an hour.
/// let at = SystemTime::now() + Duration::from_secs(3600);
/// let id = outbox.send_later(request, Some(at)).await?;
/// let record = store.get(&id).await?.unwrap();
/// assert_eq!((id.as_str(), record.status), ("welcome-42", Status::Deferred));
/// # Ok(()) }
/// ```
///
/// [`Counts::deferred`]: crate::store::Counts::deferred
#[derive(Clone)]
pub struct Outbox {
    config: Arc<Config>,
}

impl Outbox {
    /// An outbox over `store`, describing requests as a
    /// [`DeadLetterLayer::new`](super::DeadLetterLayer::new) does (the default redaction, the
    /// [`DEFAULT_PAYLOAD_LIMIT`](super::DEFAULT_PAYLOAD_LIMIT), no tags, the system clock). For
    /// your layer's settings, take [`DeadLetterLayer::outbox`](super::DeadLetterLayer::outbox).
    pub fn new(store: impl Store) -> Self {
        Outbox::from_arc(Arc::new(store))
    }

    /// An outbox over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Outbox::from_config(Arc::new(Config::new(store)))
    }

    pub(crate) fn from_config(config: Arc<Config>) -> Self {
        Outbox { config }
    }

    /// Puts `request` in the store, to be sent at `at` (`None`: now, that is at the
    /// scheduler's next look), and returns its record id. A record with the same id already in
    /// the store is merged with it, as the dead-letter layer's writes are, and so is scheduled
    /// again, whatever its status.
    ///
    /// # Errors
    ///
    /// As [`record`](Outbox::record), and a [`StoreError`] when the store cannot be written
    /// (nothing is written then) or does not answer within the layer's
    /// [`store_timeout`](super::DeadLetterLayer::store_timeout) (1 s by default: `dead-letter
    /// store did not answer within 1s`; a slow store may still write it: call again, the
    /// record of the same id is merged, never doubled).
    pub async fn send_later<Req: Describe>(
        &self,
        request: Req,
        at: Option<SystemTime>,
    ) -> Result<String, StoreError> {
        let record = self.record(request, at).await?;
        let id = record.id.clone();
        let put = self.config.store.put(record);
        super::bounded::bounded_call(self.config.store_timeout, put).await?;
        Ok(id)
    }

    /// The record [`send_later`](Outbox::send_later) writes for `request`, not written: for a
    /// write in a transaction of your own (`PostgresStore::put_in`), or in a batch
    /// ([`Store::put_many`]).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the request cannot be sent later as it is stored: its body could
    /// not be read, or it is longer than the payload limit (the record would be cut and could
    /// not be sent). The request is given back to no one then: send it yourself, or raise the
    /// limit ([`DeadLetterLayer::max_payload`](super::DeadLetterLayer::max_payload)).
    pub async fn record<Req: Describe>(
        &self,
        request: Req,
        at: Option<SystemTime>,
    ) -> Result<Record, StoreError> {
        let at = at.unwrap_or_else(|| self.config.clock.now());
        let message = format!(
            "queued to be sent at {}",
            humantime::format_rfc3339_millis(crate::store::truncate(at))
        );
        let record =
            queued_record(&self.config, request, Status::Deferred, at, OUTBOX, message).await;
        if let Some(error) = record.metadata.get("payload_error") {
            return Err(StoreError::new(format!(
                "outbox: request {:?} not stored: {error}",
                record.id
            )));
        }
        if record.payload_truncated {
            return Err(StoreError::new(format!(
                "outbox: request {:?} not stored: its payload of {} bytes is longer than the \
                 payload limit of {} bytes, and a cut payload cannot be sent",
                record.id, record.payload_len, self.config.payload_limit
            )));
        }
        Ok(record)
    }
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("config", &self.config)
            .finish()
    }
}
