use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::DeadLetter;
use super::RedactHeaders;
use super::RetrySchedule;
use crate::clock::Clock;
use crate::observe::{Hook, Listener};
use crate::request::Envelope;
use crate::store::Store;

/// The largest payload a record keeps by default, in bytes (64 KiB); a longer payload is stored
/// truncated, with [`Record::payload_truncated`](crate::store::Record::payload_truncated) set
/// ([`DeadLetterLayer::max_payload`]).
pub const DEFAULT_PAYLOAD_LIMIT: usize = 64 * 1024;

/// A function that extracts searchable tags (campaign, provider, tenant…) from a described
/// request. See [`DeadLetterLayer::tags`].
pub(crate) type TagFn = dyn Fn(&Envelope) -> Vec<(String, String)> + Send + Sync;

/// Where a [`DeadLetter`] service writes its records, and what it does with a record before it
/// writes it. One `Arc` of it per call, not one per field.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tags: Option<Arc<TagFn>>,
    pub(crate) payload_limit: usize,
    pub(crate) clock: Clock,
    pub(crate) redact: RedactHeaders,
    /// The durable attempt budget per message id, when set.
    pub(crate) budget: Option<u32>,
    /// The write-ahead claim's length, when write-ahead is on.
    pub(crate) write_ahead: Option<Duration>,
    pub(crate) listener: Hook,
    /// The second tier: deferrals of requests that used up their in-process attempts.
    pub(crate) schedule: RetrySchedule,
    /// The longest the failure's record write may take before the caller gets its failure.
    pub(crate) store_timeout: Duration,
    /// Whether [`DeadLetterLayer::retry_schedule`] chose it (the preset's default otherwise).
    pub(crate) schedule_chosen: bool,
    /// Where a record goes when the store does not take it.
    #[cfg(feature = "sqlite")]
    pub(crate) spool: Option<crate::store::Spool>,
}

impl Config {
    /// Writes to `store`, with the default payload limit, no tags, and the system clock.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Config {
            store,
            tags: None,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            clock: Clock::system(),
            redact: RedactHeaders::default(),
            budget: None,
            write_ahead: None,
            listener: Hook::default(),
            schedule: RetrySchedule::none(),
            schedule_chosen: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            #[cfg(feature = "sqlite")]
            spool: None,
        }
    }
}

impl Config {
    /// Puts what `envelope` describes into `record` as every record of this layer keeps it:
    /// headers split by the redaction list, payload (cut to the limit), content type,
    /// metadata and tags.
    pub(crate) fn fill(&self, record: &mut crate::store::Record, envelope: Envelope) {
        let (headers, redacted_headers) = self.redact.split(envelope.headers);
        record.headers = headers;
        record.redacted_headers = redacted_headers;
        record.payload_len = envelope.payload.len() as u64;
        record.payload = envelope.payload.to_vec();
        record.content_type = envelope.content_type;
        record.metadata = envelope.metadata;
        record.tags = envelope.tags;
        record.truncate_payload(self.payload_limit);
    }

    /// Whether the layer acts before the call: an attempt budget, write-ahead.
    #[inline]
    pub(crate) fn acts_before(&self) -> bool {
        self.budget.is_some() || self.write_ahead.is_some()
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("tags", &self.tags.is_some())
            .field("payload_limit", &self.payload_limit)
            .field("clock", &self.clock)
            .field("redact", &self.redact)
            .field("budget", &self.budget)
            .field("write_ahead", &self.write_ahead)
            .field("listener", &self.listener)
            .field("schedule", &self.schedule)
            .finish()
    }
}

/// Applies [`DeadLetter`] to a service: a request that finally fails is written to `store`.
#[derive(Clone)]
pub struct DeadLetterLayer {
    config: Arc<Config>,
}

impl DeadLetterLayer {
    /// The store this layer writes to.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.config.store
    }

    /// A layer that writes dead letters to `store`, keeping payloads up to
    /// [`DEFAULT_PAYLOAD_LIMIT`] bytes and no tags. Keep a clone of
    /// the store to search it.
    pub fn new(store: impl Store) -> Self {
        DeadLetterLayer::from_arc(Arc::new(store))
    }

    /// A layer over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        DeadLetterLayer {
            config: Arc::new(Config::new(store)),
        }
    }

    /// Tags each record with what `f` extracts from the described request (its payload,
    /// content type and metadata), added to the tags the request's
    /// [`Describe`](crate::Describe) set. Runs on the failure path only.
    ///
    /// ```
    /// use tower_backstop::dead_letter::DeadLetterLayer;
    /// use tower_backstop::store::MemoryStore;
    ///
    /// let layer = DeadLetterLayer::new(MemoryStore::new()).tags(|envelope| {
    ///     let message: serde_json::Value =
    ///         serde_json::from_slice(&envelope.payload).unwrap_or_default();
    ///     let mut tags = Vec::new();
    ///     if let Some(campaign) = message["campaign"].as_str() {
    ///         tags.push(("campaign".to_owned(), campaign.to_owned()));
    ///     }
    ///     tags
    /// });
    /// ```
    pub fn tags<F>(mut self, f: F) -> Self
    where
        F: Fn(&Envelope) -> Vec<(String, String)> + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.config).tags = Some(Arc::new(f));
        self
    }

    /// Hands the layer's events to `listener`: each record written
    /// ([`Event::DeadLetterStored`](crate::observe::Event::DeadLetterStored), dead or deferred)
    /// and each write the store failed
    /// ([`Event::StoreError`](crate::observe::Event::StoreError), operation `"put"`). See
    /// [`observe`](crate::observe). On the failure path only.
    pub fn listener(mut self, listener: impl Listener) -> Self {
        Arc::make_mut(&mut self.config).listener = Hook::new(listener);
        self
    }

    /// The same listener as another layer's, for the preset.
    pub(crate) fn with_hook(mut self, hook: &Hook) -> Self {
        Arc::make_mut(&mut self.config).listener = hook.clone();
        self
    }

    /// Keeps at most `bytes` of each payload; a longer payload is stored cut, with
    /// [`Record::payload_truncated`](crate::store::Record::payload_truncated) set, and cannot be
    /// re-sent. The default is [`DEFAULT_PAYLOAD_LIMIT`] (64 KiB). 0 is not an error: it keeps
    /// no payload at all (for requests whose bodies must not be stored), and such records are
    /// kept for inspection only.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).payload_limit = bytes;
        self
    }

    /// Also redacts the header `name` (any case): its value is never written, only its name,
    /// in [`Record::redacted_headers`](crate::store::Record::redacted_headers), so that a
    /// re-drive knows to restore it
    /// ([`http_request_restoring`](crate::resend::http_request_restoring)).
    ///
    /// Redacted by default: `Authorization` and `Proxy-Authorization` (RFC 9110 §11.6.2,
    /// §11.7.2), `Cookie` and `Set-Cookie` (RFC 6265), and the API-key headers in common use
    /// (`X-Api-Key`, `Api-Key`, `X-Auth-Token`, `X-Amz-Security-Token`). Every other header is
    /// kept whole and sent again on re-drive.
    ///
    /// ```
    /// use tower_backstop::dead_letter::DeadLetterLayer;
    /// use tower_backstop::store::MemoryStore;
    ///
    /// let layer = DeadLetterLayer::new(MemoryStore::new())
    ///     .redact_header("x-signature")
    ///     .keep_header("cookie");
    /// ```
    pub fn redact_header(mut self, name: impl AsRef<str>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.redact = std::mem::take(&mut config.redact).and(name);
        self
    }

    /// Writes the value of the header `name` (any case) although it is redacted by default or
    /// by an earlier [`redact_header`](Self::redact_header).
    pub fn keep_header(mut self, name: impl AsRef<str>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.redact = std::mem::take(&mut config.redact).except(name);
        self
    }

    /// Redacts no header at all: every value is written, credentials included. Only for stores
    /// that are as secret as the credentials themselves. A later
    /// [`redact_header`](Self::redact_header) still applies.
    pub fn keep_all_headers(mut self) -> Self {
        Arc::make_mut(&mut self.config).redact = RedactHeaders::none();
        self
    }

    /// The clock for record times (failure times, retry-at). Default [`Clock::system`]; tests on
    /// tokio's paused clock use [`Clock::tokio`], the same clock as their
    /// [`Scheduler`](crate::resend::Scheduler).
    pub fn clock(mut self, clock: Clock) -> Self {
        Arc::make_mut(&mut self.config).clock = clock;
        self
    }
}

impl DeadLetterLayer {
    /// A durable attempt budget of `attempts` per message id (the first call included), counted
    /// in the layer's store across restarts. A budget of 0 is taken as 1, not rejected: no
    /// message can be given fewer than its first call, and 1 is the most cautious budget there
    /// is (one pass, then poison), so the reading fails safe.
    ///
    /// For queue consumers, where the same message comes back after a crash or a restart. The
    /// count lives in the message's record ([`Record::budget_spent`]): each final failure adds
    /// its attempts to it in the same write as the rest of the record, so it survives restarts.
    /// Before each call whose id is known ([`Describe::message_id`](crate::Describe::message_id):
    /// the `Idempotency-Key`, or a [`MessageId`](crate::MessageId)), the layer reads that count;
    /// when it has reached the budget, the inner service is not called: the call fails at once
    /// with class [`Class::POISON`](crate::Class::POISON) and a [`BudgetSpent`](super::BudgetSpent)
    /// source, and the layer records it (adding no attempt). A re-drive on purpose sets the count
    /// back to zero.
    ///
    /// This costs one store read per call with an id, success or not, so use it where a message
    /// may come back across restarts; requests without an id pass straight through. When the
    /// store cannot be read, the call goes through and a `tracing` warning says so: the budget
    /// fails open.
    ///
    /// The budget is read before the retry layer's first call, so this layer keeps its own copy
    /// of each request: [`BackstopLayer`](crate::BackstopLayer), which otherwise shares one copy
    /// between this layer and the retry layer, stacks the two as separate layers when a budget
    /// is set.
    ///
    /// ```
    /// use tower::ServiceBuilder;
    /// use tower_backstop::dead_letter::DeadLetterLayer;
    /// use tower_backstop::retry::{RetryLayer, RetryPolicy};
    /// use tower_backstop::store::MemoryStore;
    ///
    /// let stack = ServiceBuilder::new()
    ///     .layer(DeadLetterLayer::new(MemoryStore::new()).attempt_budget(5))
    ///     .layer(RetryPolicy::new().max_attempts(3).build().unwrap());
    /// # let _ = stack;
    /// ```
    ///
    /// [`Record::budget_spent`]: crate::store::Record::budget_spent
    pub fn attempt_budget(mut self, attempts: u32) -> Self {
        Arc::make_mut(&mut self.config).budget = Some(attempts.max(1));
        self
    }

    /// The longest the caller waits for each store call the layer makes on its way
    /// ([`DEFAULT_STORE_TIMEOUT`], 1 s, by default): its failure's record write, and with
    /// [`attempt_budget`](Self::attempt_budget) or [`write_ahead`](Self::write_ahead) the
    /// reads and writes before the call (the budget's read, the write-ahead write and the
    /// failure's record write share one such wait: the failure's write gets what the calls
    /// before the call left of it) and the write-ahead record's resolution after a success; an
    /// [`Outbox`](super::Outbox)'s write too. What each does when the store does not answer
    /// in time (or fails):
    ///
    /// - the attempt budget's read: the call goes out as if the budget were not spent (the
    ///   budget is not known), said at WARN and as an
    ///   [`Event::StoreError`](crate::observe::Event::StoreError) (operation `"read"`);
    /// - the write-ahead write: the call goes out without write-ahead, said at WARN and as an
    ///   event (operation `"write_ahead"`); a failure is then written as without write-ahead.
    ///   A write that timed out may still land when a slow store answers: its record is then
    ///   sent again by a scheduler after its lease, with its idempotency key;
    /// - a renewal of the write-ahead claim while the call is out: tried again, as today;
    /// - the resolution after a success: the caller has its response after one try; the
    ///   resolution is tried again on a task of its own, backing off, until the claim ends (a
    ///   record still not resolved is sent again by a scheduler after its lease, said at WARN);
    /// - the failure's record write: as follows.
    ///
    /// A store that fails or does not answer within it (a database restarting, a pool waiting
    /// for a connection, a hung network) costs the caller at most this much for its failure's
    /// record: its failure comes back with
    /// [`DeadLetterStatus::NotStored`](super::DeadLetterStatus::NotStored) and the store's
    /// error (`dead-letter store did not answer within 1s`), and a request that was to be
    /// deferred says [`GiveUp::NotStored`](crate::retry::GiveUp::NotStored), not deferred. A
    /// write that took longer may still land when a slow store answers: the record keeps the
    /// request's id (its idempotency key), so sending it again finds it. A zero timeout is
    /// raised to 1 ms.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).store_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Keeps what the store does not take in `spool`, a bounded durable file on local disk,
    /// and forwards it into the store as soon as the store answers again (feature `sqlite`).
    ///
    /// A failure's record that the store fails to write, or does not write within the
    /// [`store_timeout`](Self::store_timeout), goes to the spool: the caller's failure says
    /// [`DeadLetterStatus::Spooled`](super::DeadLetterStatus::Spooled) with the store's error,
    /// and a request that was to be deferred stays deferred (its retry-at holds: the record is
    /// due when forwarded, if not before). The store's write and the spool's together take at
    /// most the store timeout (the spool's share is 100 ms, or half the timeout if it is
    /// shorter). Only what the spool refuses too (full, its disk failing) comes back
    /// [`NotStored`](super::DeadLetterStatus::NotStored), with both errors.
    ///
    /// The forwarder is a task of its own (one per spool, whatever the number of layers or
    /// services sharing it), started when the layer wraps a service inside a tokio runtime, or
    /// else on the first record spooled; it forwards what a spool held at open too, so that a
    /// process restarted during a store outage forwards what it had spooled. It retries every
    /// second at most while the store fails. See [`Spool`](crate::store::Spool) for the caps,
    /// the quarantine file and the lock that keeps one process per spool, and
    /// [`Spool::forward`](crate::store::Spool::forward) for how forwarding stays idempotent.
    /// [`Event::Spool`](crate::observe::Event::Spool) tells each record spooled or refused and
    /// each forwarding; the `metrics` feature turns them into `backstop_spool_*` metrics.
    ///
    /// ```
    /// use tower_backstop::dead_letter::DeadLetterLayer;
    /// use tower_backstop::store::{MemoryStore, Spool};
    ///
    /// # let dir = std::env::temp_dir().join(format!("spool-layer-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let spool = Spool::open(dir.join("dead-letters.spool")).unwrap();
    /// let layer = DeadLetterLayer::new(MemoryStore::new()).spool(spool);
    /// # let _ = layer; std::fs::remove_dir_all(dir).unwrap();
    /// ```
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn spool(mut self, spool: crate::store::Spool) -> Self {
        Arc::make_mut(&mut self.config).spool = Some(spool);
        self
    }

    /// The spool given to [`spool`](Self::spool), if any.
    #[cfg(feature = "sqlite")]
    pub(crate) fn spool_ref(&self) -> Option<&crate::store::Spool> {
        self.config.spool.as_ref()
    }
}

/// How long the dead-letter layer waits for its store to write a failure's record before the
/// caller gets the failure as not stored: 1 s, Sidekiq's default network timeout for Redis.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(1);

impl DeadLetterLayer {
    /// The second tier of retries: a request that used up its in-process attempts (a retry
    /// layer below gave up with [`GiveUp::AttemptsExhausted`] or [`GiveUp::BudgetExhausted`])
    /// is stored deferred, due after `schedule`'s delay for its class and pass, for a
    /// [`Scheduler`](crate::resend::Scheduler) over the same store to re-send; dead when the
    /// class's delays are used up. See [`RetrySchedule`] for the classes, the default delays
    /// (5 s, 1 min, 15 min for transient failures) and which requests qualify.
    ///
    /// Off ([`RetrySchedule::none`]) by default for this layer, since a deferred record waits
    /// for a scheduler; [`BackstopLayer`](crate::BackstopLayer) turns [`RetrySchedule::new`] on
    /// for a layer whose schedule was not set here. On the failure path only.
    ///
    /// ```
    /// use tower_backstop::dead_letter::{DeadLetterLayer, RetrySchedule};
    /// use tower_backstop::store::MemoryStore;
    ///
    /// let layer = DeadLetterLayer::new(MemoryStore::new()).retry_schedule(RetrySchedule::new());
    /// # let _ = layer;
    /// ```
    ///
    /// [`GiveUp::AttemptsExhausted`]: crate::retry::GiveUp::AttemptsExhausted
    /// [`GiveUp::BudgetExhausted`]: crate::retry::GiveUp::BudgetExhausted
    pub fn retry_schedule(mut self, schedule: RetrySchedule) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.schedule = schedule;
        config.schedule_chosen = true;
        self
    }

    /// The default schedule, unless one was chosen: what the preset does with its layer.
    pub(crate) fn default_schedule(mut self) -> Self {
        if !self.config.schedule_chosen {
            Arc::make_mut(&mut self.config).schedule = RetrySchedule::new();
        }
        self
    }

    /// Write-ahead: stores each request before its first attempt, so that a process that dies
    /// while the call is out (in a backoff sleep, waiting on the provider) loses nothing. Off by
    /// default. The claim lasts [`DEFAULT_WRITE_AHEAD_LEASE`](super::DEFAULT_WRITE_AHEAD_LEASE)
    /// (10 s) unless renewed; see [`write_ahead_lease`](Self::write_ahead_lease).
    ///
    /// Before the inner service is called, the request is written to the store as an
    /// [`InFlight`](crate::store::Status::InFlight) record of class
    /// [`QUEUED`](super::QUEUED) (code `write-ahead`, no attempt, nothing in its history): a
    /// claim held by the call, with the end of its lease as its retry-at time, renewed every
    /// third of the lease while the call is out. Then:
    ///
    /// - **success**: the record is [`Resolved`](crate::store::Status::Resolved) (kept like
    ///   a re-send's, for the audit trail; a [`Retention`](crate::store::Retention) prunes it),
    ///   and the response comes back once that write is done;
    /// - **failure**: the record is written as every failure is (dead, or deferred for the
    ///   [`Scheduler`](crate::resend::Scheduler)), under the claim
    ///   ([`Store::put_claimed`](crate::store::Store::put_claimed));
    /// - **the process dies**: the claim ends at its lease, and a `Scheduler` on the same
    ///   store takes the record and sends it ([`http_request`](crate::resend::http_request)
    ///   rebuilds it). A request that already reached the provider is then sent a second time:
    ///   give requests an `Idempotency-Key` (it is the record's id, and re-sends keep it) so
    ///   that the provider delivers it once.
    ///
    /// **Cost**: on every call, success or not, a write and a read of the record before the
    /// first attempt and a write after it, a renewal every third of the lease while it is out,
    /// a second copy of the request (free for `Bytes` bodies), and the allocations of those
    /// writes: the success path is no longer allocation-free, and each call waits on the store
    /// before it goes out. The figures per store are in the crate's `docs/performance.md`.
    ///
    /// **A store that cannot be written** does not stop the call: the request goes out without
    /// its record, a `tracing` error says so, and the listener sees an
    /// [`Event::StoreError`](crate::observe::Event::StoreError) with operation `write_ahead`. A
    /// provider outage and a store outage together would otherwise stop all traffic; the
    /// request is then exactly as safe as without write-ahead. A failure of that call is still
    /// written as usual, if the store is back by then.
    ///
    /// A re-send by a [`Scheduler`](crate::resend::Scheduler) or a
    /// [`Redrive`](crate::resend::Redrive) through this layer writes nothing ahead: its record
    /// is already in the store, claimed. A request whose body cannot be copied (a stream) is
    /// sent without write-ahead.
    ///
    /// The write merges into a record of the same id already in the store, as every write of
    /// this layer does. A call made with the id of a record that another process is sending at
    /// that moment (the same `Idempotency-Key` sent twice at once) takes that record's claim
    /// over: both sends go out, and the idempotency key is what makes them one delivery.
    ///
    /// ```
    /// use tower::ServiceBuilder;
    /// use tower_backstop::dead_letter::DeadLetterLayer;
    /// use tower_backstop::retry::RetryPolicy;
    /// use tower_backstop::store::MemoryStore;
    ///
    /// let stack = ServiceBuilder::new()
    ///     .layer(DeadLetterLayer::new(MemoryStore::new()).write_ahead())
    ///     .layer(RetryPolicy::new().max_attempts(3).build().unwrap());
    /// # let _ = stack;
    /// ```
    pub fn write_ahead(self) -> Self {
        self.write_ahead_lease(super::DEFAULT_WRITE_AHEAD_LEASE)
    }

    /// Write-ahead ([`write_ahead`](Self::write_ahead)) with claims of `lease` (at least 3
    /// ms), renewed every third of it while the call is out. Shorter lets a scheduler take
    /// over a dead process's requests sooner; longer rides out a store that answers slowly for
    /// longer before a claim ends under a call still out (which is then sent twice).
    pub fn write_ahead_lease(mut self, lease: Duration) -> Self {
        Arc::make_mut(&mut self.config).write_ahead = Some(lease.max(Duration::from_millis(3)));
        self
    }

    /// An [`Outbox`](super::Outbox) over this layer's store, which describes, tags, redacts
    /// and cuts requests as this layer does.
    pub fn outbox(&self) -> super::Outbox {
        super::Outbox::from_config(Arc::clone(&self.config))
    }

    /// Whether the layer acts before the call (an attempt budget, write-ahead), and so keeps
    /// its own copy of each request.
    pub(crate) fn needs_own_copy(&self) -> bool {
        self.config.acts_before()
    }
}

impl fmt::Debug for DeadLetterLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for DeadLetterLayer {
    type Service = DeadLetter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::DeadLetter);
        super::spool::start_forwarder(&self.config);
        DeadLetter {
            inner,
            config: self.config.clone(),
            acts_before: self.config.acts_before(),
        }
    }
}

// How the order checks find this layer's service below another layer.
impl crate::order::Named for crate::order::DeadLetter {
    fn name() -> &'static str {
        crate::order::named::<DeadLetter<()>>()
    }
}
