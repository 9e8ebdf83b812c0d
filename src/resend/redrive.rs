//! Re-drive on purpose: an explicit call with a filter, a dry run, a rate and a maximum count.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use tower_service::Service;

use super::rebuild::envelope_of;
use super::renew::Held;
use crate::breaker::{LimitedError, OpenError, PacedError};
use crate::build_error::BuildError;
use crate::clock::Clock;
use crate::dead_letter::{DeadLetterStatus, claim, record_of, resending};
use crate::failure::Failure;
use crate::observe::{Event, Hook, Listener};
use crate::retry::Attempts;
use crate::store::{
    AuditAction, AuditEntry, Change, Claim, Filter, Lease, Record, Status, Store, StoreError,
    add_clamped,
};

/// One record of a re-drive and how it ended: re-sent with success, failed again, or not sent.
/// Every variant names the record ([`id`](Outcome::id)) and its class before the re-drive
/// ([`class`](Outcome::class)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The service succeeded; the record is now [`Resolved`](Status::Resolved).
    Resolved {
        /// The record's id.
        id: String,
        /// Its class before the re-drive.
        class: String,
    },
    /// The service failed again; the record has the new failure (class, code, one more error
    /// in its history) and is dead or deferred again by its policy.
    Failed {
        /// The record's id.
        id: String,
        /// Its class before the re-drive.
        class: String,
        /// The new failure's class.
        new_class: String,
        /// The new failure's original code, as displayed (`http 503`).
        new_code: String,
        /// Whether the new failure was written to the store.
        recorded: bool,
    },
    /// Not sent.
    Skipped {
        /// The record's id.
        id: String,
        /// Its class before the re-drive.
        class: String,
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// The record's id.
    pub fn id(&self) -> &str {
        match self {
            Outcome::Resolved { id, .. }
            | Outcome::Failed { id, .. }
            | Outcome::Skipped { id, .. } => id,
        }
    }

    /// The record's class before the re-drive.
    pub fn class(&self) -> &str {
        match self {
            Outcome::Resolved { class, .. }
            | Outcome::Failed { class, .. }
            | Outcome::Skipped { class, .. } => class,
        }
    }

    /// `"resolved"`, `"failed"` or `"skipped"`: the outcome's label in events, metrics and
    /// the audit trail.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Resolved { .. } => "resolved",
            Outcome::Failed { .. } => "failed",
            Outcome::Skipped { .. } => "skipped",
        }
    }

    /// What happened, in words, for a failed or skipped record: `failed again: transient (http
    /// 503)` (with `, NOT recorded` when the new failure could not be written), or why it was
    /// skipped; empty for a resolved one.
    pub fn detail(&self) -> String {
        match self {
            Outcome::Resolved { .. } => String::new(),
            Outcome::Failed {
                new_class,
                new_code,
                recorded,
                ..
            } => format!(
                "failed again: {new_class} ({new_code}){}",
                if *recorded { "" } else { ", NOT recorded" }
            ),
            Outcome::Skipped { reason, .. } => reason.clone(),
        }
    }

    fn skipped(record: &Record, reason: impl Into<String>) -> Self {
        Outcome::Skipped {
            id: record.id.clone(),
            class: record.class.clone(),
            reason: reason.into(),
        }
    }
}

/// Why a re-drive skips a [`Resolved`](Status::Resolved) record unless it
/// [includes resolved records](Redrive::include_resolved): its [`Outcome::Skipped`] reason.
pub const ALREADY_DELIVERED: &str = "already delivered (resolved); re-drive with include_resolved (--include-resolved) to send it again";

/// What a re-drive did (or, for a dry run, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Every record considered, in the order sent, with how it ended.
    pub records: Vec<Outcome>,
}

impl RedriveReport {
    /// Records that succeeded.
    pub fn resolved(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Resolved { .. }))
    }

    /// Records that failed again.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Failed { .. }))
    }

    /// Records not sent.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skipped { .. }))
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.records.iter().filter(|r| f(r)).count()
    }
}

/// A re-drive: re-sends the dead letters that match a filter through a service stack, on
/// purpose, at most `rate` per second and at most `max` of them.
///
/// Nothing is re-driven by default: the filter must say something ([`Filter::is_empty`] is
/// refused), and the rate and the maximum are required. Unless the filter names a status, only
/// [`Dead`](Status::Dead) and [`Deferred`](Status::Deferred) records are taken, the most
/// recently failed first. [`plan`](Redrive::plan) is the dry run: the records that
/// [`run`](Redrive::run) would consider, sending nothing.
///
/// A message already delivered is not sent again by accident: a filter that names
/// [`Resolved`](Status::Resolved) plans those records, but `run` skips each one
/// ([`Outcome::Skipped`] with the reason [`ALREADY_DELIVERED`]) unless the re-drive
/// [includes resolved records](Redrive::include_resolved) on purpose; then they are sent again
/// and its audit entry says how many were (`deliberately re-sent 2 already delivered
/// (include_resolved)`).
///
/// Each record is rebuilt into a request (for HTTP, [`http_request`](super::http_request)) that keeps its id and
/// idempotency key, and sent through the service given, which should be the same stack as the
/// original (with its [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) over the same store). Before
/// sending, the record becomes [`InFlight`](Status::InFlight) and its durable attempt budget
/// starts again; a success makes it [`Resolved`](Status::Resolved); a new failure is merged into
/// it (attempts, history, class), by the stack's dead-letter layer, or by the re-drive when the
/// stack has none. A record with a truncated payload is skipped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_backstop::resend::{Redrive, http_request};
/// use tower_backstop::store::{Filter, MemoryStore, Store};
///
/// let store = MemoryStore::new();
/// let redrive = Redrive::new(Filter::new().class("throttled"), 50, 200)?;
/// let would_send = redrive.plan(&store).await?; // the dry run
/// assert!(would_send.is_empty());
/// let service = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
///     Ok::<_, tower_backstop::BoxError>(http::Response::new(()))
/// });
/// let report = redrive
///     .run(&store, service, |record| http_request(record, None))
///     .await?;
/// assert_eq!(report.records.len(), 0);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Redrive {
    filter: Filter,
    interval: Duration,
    max: usize,
    lease: Duration,
    clock: Clock,
    listener: Hook,
    actor: String,
    include_resolved: bool,
}

impl Redrive {
    /// A re-drive of the records matching `filter`, at most `per_second` messages per second and
    /// at most `max` messages.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] naming the argument when the filter is empty (that would re-drive
    /// everything: `"Redrive::new(filter)"`), or the rate or the maximum is zero
    /// (`"Redrive::new(per_second)"`, `"Redrive::new(max)"`).
    pub fn new(filter: Filter, per_second: u32, max: usize) -> Result<Self, BuildError> {
        if filter.is_empty() {
            return Err(BuildError::new(
                "Redrive::new(filter)",
                "empty",
                "refusing to re-drive every dead letter: give a filter (class, code, tag, time \
                 range, status or ids)",
            ));
        }
        if per_second == 0 {
            return Err(BuildError::new(
                "Redrive::new(per_second)",
                0,
                "a re-drive rate must be at least 1 message per second",
            ));
        }
        if max == 0 {
            return Err(BuildError::new(
                "Redrive::new(max)",
                0,
                "a re-drive maximum must be at least 1 message",
            ));
        }
        Ok(Redrive {
            filter,
            interval: Duration::from_secs(1) / per_second,
            max,
            lease: super::DEFAULT_LEASE,
            clock: Clock::system(),
            listener: Hook::default(),
            actor: "library".to_owned(),
            include_resolved: false,
        })
    }

    /// Who runs the re-drive, for the audit trail ([`AuditEntry::actor`]): the operator's name.
    /// Default `"library"`.
    pub fn actor(mut self, who: impl Into<String>) -> Self {
        self.actor = who.into();
        self
    }

    /// How long each claim of a record lasts ([`InFlight`](Status::InFlight)) while it is
    /// re-sent: the claim is renewed every third of it while the stack and the provider take
    /// their time, and if the re-drive dies, a [`Scheduler`](super::Scheduler) takes the record
    /// up once it ends. Default [`DEFAULT_LEASE`](super::DEFAULT_LEASE), 10 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The clock for record times. Default [`Clock::system`].
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Hands each record's outcome to `listener` ([`Event::Redriven`]: resolved, failed or
    /// skipped). See [`observe`](crate::observe).
    pub fn listener(mut self, listener: impl Listener) -> Self {
        self.listener = Hook::new(listener);
        self
    }

    /// Sends again, on purpose, the [`Resolved`](Status::Resolved) records the filter selects
    /// (only a filter that names that status selects them): messages that were already
    /// delivered. Default `false`: `run` skips each of them ([`Outcome::Skipped`], reason
    /// [`ALREADY_DELIVERED`]) and sends nothing for it. With `true`, they are claimed and sent
    /// like the others, and the audit entry of the run says how many already delivered records
    /// it sent again. It changes what `run` does with the planned records, never which records
    /// [`plan`](Redrive::plan) selects.
    pub fn include_resolved(mut self, yes: bool) -> Self {
        self.include_resolved = yes;
        self
    }

    /// Whether this re-drive sends resolved records again
    /// ([`include_resolved`](Redrive::include_resolved)).
    pub fn includes_resolved(&self) -> bool {
        self.include_resolved
    }

    /// The dry run: the records [`run`](Redrive::run) would consider, in order, without sending
    /// anything. Records `run` skips are included: those with a truncated payload, and
    /// [`Resolved`](Status::Resolved) ones unless the re-drive
    /// [includes resolved records](Redrive::include_resolved) (count them with
    /// `record.status == Status::Resolved` to warn of them).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot be read.
    pub async fn plan(&self, store: &dyn Store) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        let mut page = 0..self.max.min(500);
        loop {
            let batch = store.search(&self.filter, page.clone()).await?;
            let done = batch.len() < page.len();
            out.extend(batch.into_iter().filter(|r| {
                self.filter.status.is_some() || matches!(r.status, Status::Dead | Status::Deferred)
            }));
            if done || out.len() >= self.max {
                break;
            }
            page = page.end..page.end.saturating_add(page.len());
        }
        out.truncate(self.max);
        Ok(out)
    }

    /// Re-sends the planned records through `service`, one at a time, at most the rate, building
    /// each request with `rebuild`, and records each outcome.
    ///
    /// A `service` that is a known client (hyper-util, reqwest, tonic) with no
    /// [`ClassifyLayer`](crate::classify::ClassifyLayer) in it is reported by a `tracing` warning
    /// (an error response would count as delivered).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot be read to plan. A store error while re-sending one
    /// record does not stop the others: that record is reported as skipped or failed.
    pub async fn run<S, Req, F, E>(
        &self,
        store: &dyn Store,
        mut service: S,
        mut rebuild: F,
    ) -> Result<RedriveReport, StoreError>
    where
        S: Service<Req>,
        S::Error: Into<Failure<S::Response>>,
        F: FnMut(&Record) -> Result<Req, E>,
        E: fmt::Display,
    {
        // A client with no classifier would count an error response as delivered.
        crate::order::check::<S>(crate::order::Role::Resend);
        let plan = self.plan(store).await?;
        let planned = plan.len() as u64;
        let mut report = RedriveReport::default();
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resolved_resent = 0u64;
        let mut resolved_skipped = 0u64;
        for record in plan {
            let already_delivered = record.status == Status::Resolved;
            let outcome = if already_delivered && !self.include_resolved {
                resolved_skipped += 1;
                Outcome::skipped(&record, ALREADY_DELIVERED)
            } else {
                match rebuild(&record) {
                    Err(e) => Outcome::skipped(&record, e.to_string()),
                    Ok(request) => {
                        ticks.tick().await;
                        self.send_one(store, &mut service, &record, request).await
                    }
                }
            };
            if already_delivered && !matches!(outcome, Outcome::Skipped { .. }) {
                resolved_resent += 1;
            }
            tracing::info!(id = %record.id, class = %record.class, outcome = ?outcome, "re-drive");
            self.listener.emit_ref(&Event::Redriven {
                id: &record.id,
                outcome: outcome.word(),
            });
            report.records.push(outcome);
        }
        let entry = AuditEntry::new(AuditAction::Redrive, self.actor.clone(), &self.filter)
            .at(self.clock.now())
            .planned(planned)
            .sent((report.resolved() + report.failed()) as u64)
            .outcome(audit_outcome(&report, resolved_resent, resolved_skipped));
        if let Err(e) = store.append_audit(entry).await {
            // The records were sent and their outcomes written: the run stands, the trail
            // misses its entry, and says so here.
            self.listener.emit_ref(&Event::StoreError {
                operation: "audit",
                id: None,
                error: &e,
            });
            tracing::warn!(error = %e, "re-drive done, but its audit entry was not written");
        }
        Ok(report)
    }

    /// Claims `record` (compare-and-set on the record as planned) and sends `request` under
    /// that claim: how it ended.
    async fn send_one<S, Req>(
        &self,
        store: &dyn Store,
        service: &mut S,
        record: &Record,
        request: Req,
    ) -> Outcome
    where
        S: Service<Req>,
        S::Error: Into<Failure<S::Response>>,
    {
        let until = add_clamped(self.clock.now(), self.lease);
        match claim_for_redrive(store, record, until).await {
            Err(skipped) => skipped,
            Ok(lease) => {
                let claimed = tokio::time::Instant::now();
                let mut held = Held::new(store, lease, self.lease, claimed, self.clock);
                resend(service, record, request, &mut held, &self.clock)
                    .await
                    .0
            }
        }
    }
}

/// The audit entry's outcome of a re-drive: `resolved 3, failed 1, skipped 0`, and what became
/// of records already delivered: `; deliberately re-sent 2 already delivered
/// (include_resolved)`, or `; skipped 2 already delivered (resolved)`.
fn audit_outcome(report: &RedriveReport, resolved_resent: u64, resolved_skipped: u64) -> String {
    let mut outcome = format!(
        "resolved {}, failed {}, skipped {}",
        report.resolved(),
        report.failed(),
        report.skipped()
    );
    if resolved_resent > 0 {
        outcome.push_str(&format!(
            "; deliberately re-sent {resolved_resent} already delivered (include_resolved)"
        ));
    }
    if resolved_skipped > 0 {
        outcome.push_str(&format!(
            "; skipped {resolved_skipped} already delivered (resolved)"
        ));
    }
    outcome
}

/// An open breaker in the stack rejected a re-send: its last word is the breaker's.
#[derive(Clone, Debug)]
pub(crate) struct Rejected {
    /// The breaker's name (a keyed breaker's key).
    pub(crate) breaker: String,
    /// The time left until it half-opens; `None` when forced open.
    pub(crate) half_opens_in: Option<Duration>,
    /// Why it is open ([`OpenError::cause`]).
    pub(crate) cause: Option<String>,
    /// Whether an earlier attempt of the re-send reached the provider (and failed) before a
    /// retry met the open breaker: the re-send was sent, though its last word is the breaker's.
    pub(crate) reached: bool,
    /// Whether the rejection was written under the re-send's claim (else the claim had passed
    /// to another sender, or the store failed, and the record is not the re-send's to give back).
    pub(crate) written: bool,
    /// Held back by the breaker's adaptive send rate or concurrency limit (its turn is
    /// `half_opens_in` away), not rejected by an open breaker.
    pub(crate) paced: bool,
}

/// Claims `record` for a re-drive until `until`, compare-and-set on the status and resend count
/// it was read with ([`Store::claim`]): its lease, or why it is skipped.
async fn claim_for_redrive(
    store: &dyn Store,
    record: &Record,
    until: std::time::SystemTime,
) -> Result<Lease, Outcome> {
    match store.claim(record, until).await {
        Ok(Claim::Claimed(claimed)) => claimed
            .lease()
            .ok_or_else(|| Outcome::skipped(record, "the claim wrote no lease")),
        Ok(Claim::Missing) => Err(Outcome::skipped(
            record,
            "the record is no longer in the store",
        )),
        Ok(Claim::ClaimedElsewhere { status, resends }) => Err(Outcome::skipped(
            record,
            format!(
                "claimed elsewhere: the record is now {status} with {resends} re-sends \
                 (it was {} with {} when read); not sent",
                record.status, record.resends
            ),
        )),
        Err(e) => Err(Outcome::skipped(
            record,
            format!("cannot claim the record: {e}"),
        )),
    }
}

/// Sends `request` (rebuilt from `record`) through `service` under the claim `held` (made by
/// the scheduler's claim of due records, or by a re-drive's compare-and-set claim), renewing it
/// while the stack and the provider take their time, and writes the outcome only while the
/// claim holds ([`Store::change_claimed`], [`Store::put_claimed`]): a claim that passed to
/// another sender before the request went out is not sent, and one that passed while it was
/// out changes nothing. The second value says when an open breaker rejected the re-send
/// locally.
pub(crate) async fn resend<S, Req>(
    service: &mut S,
    record: &Record,
    request: Req,
    held: &mut Held<'_>,
    clock: &Clock,
) -> (Outcome, Option<Rejected>)
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
{
    let ready = held.renewing(|cx| service.poll_ready(cx)).await;
    let result = match ready {
        Ok(()) => {
            if !held.confirm().await {
                let reason = "claim ended before the re-send went out: another sender took the \
                              record; not sent";
                return (Outcome::skipped(record, reason), None);
            }
            // Run as the re-send of this record: a failure that leaves it as it was is no new
            // dead letter for the stack's dead-letter layer.
            let mut call = pin!(resending::scope(
                &record.id,
                record.status,
                service.call(request)
            ));
            let lease = held.lease().clone();
            held.renewing(|cx| claim::under(lease.clone(), || call.as_mut().poll(cx)))
                .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(_) => {
            delivered(record, held, clock).await;
            let resolved = Outcome::Resolved {
                id: record.id.clone(),
                class: record.class.clone(),
            };
            (resolved, None)
        }
        Err(e) => failed_again(record, held, clock, e.into()).await,
    }
}

/// A re-send succeeded: the record becomes resolved, if its claim still holds. A store that
/// fails is tried again (see [`Held::settle`]): a record left in flight would be sent again.
async fn delivered(record: &Record, held: &mut Held<'_>, clock: &Clock) {
    let at = clock.now();
    let change = Change::Resolved { at };
    let written = held
        .settle(Some(change), true, |store, lease| {
            store.change_claimed(lease, change)
        })
        .await;
    match written {
        Ok(Claim::Claimed(_)) => {}
        Ok(Claim::ClaimedElsewhere { status, resends }) => tracing::warn!(
            id = %record.id,
            status = %status,
            resends,
            "re-sent and delivered, but its claim had passed to another sender before the \
             outcome could be written; the record is left as they wrote it (if they send it \
             again, its idempotency key lets the provider tell)"
        ),
        Ok(Claim::Missing) => {
            tracing::info!(id = %record.id, "re-sent and delivered; the record was deleted meanwhile")
        }
        Err(e) => {
            tracing::error!(id = %record.id, error = %e, "re-sent, but the outcome could not be written before the claim ended")
        }
    }
}

/// A re-send failed again: its outcome, with the new failure written by the stack's dead-letter
/// layer, or here when the stack has none (in both cases only while the claim holds). When the
/// layer could not write it (the store failed), the claim is given back here, due again a lease
/// later, its re-send counted ([`Change::Released`]), tried again while the store fails.
async fn failed_again<R>(
    record: &Record,
    held: &mut Held<'_>,
    clock: &Clock,
    failure: Failure<R>,
) -> (Outcome, Option<Rejected>) {
    let written = match failure.note::<DeadLetterStatus>() {
        Some(DeadLetterStatus::Stored { .. }) => true,
        Some(DeadLetterStatus::NotStored { .. }) => {
            let retry_at = add_clamped(clock.now(), held.length());
            let change = Change::Released { retry_at };
            let released = held
                .settle(Some(change), false, |store, lease| {
                    store.change_claimed(lease, change)
                })
                .await;
            if let Err(e) = released {
                tracing::error!(id = %record.id, error = %e, "re-sent and failed again; neither the failure nor the claim's end could be written: due again at its lease's end");
            }
            false
        }
        Some(_) => false,
        None => {
            // No dead-letter layer in the stack: write the new failure here.
            let mut new = record_of(record.id.clone(), envelope_of(record), &failure);
            new.redacted_headers = record.redacted_headers.clone();
            let put = held
                .settle(None, false, |store, lease| {
                    store.put_claimed(lease, new.clone())
                })
                .await;
            match put {
                Ok(Claim::Claimed(_)) => true,
                Ok(_) => {
                    tracing::info!(id = %record.id, "re-sent and failed again after the claim had passed to another sender; the failure is not written over theirs");
                    false
                }
                Err(e) => {
                    tracing::error!(id = %record.id, error = %e, "re-sent and failed again; the failure could not be written");
                    false
                }
            }
        }
    };
    let source = std::error::Error::source(&failure);
    let reached = failure.note::<Attempts>().is_some_and(|a| a.count() > 0);
    let rejected = match (
        source.and_then(|s| s.downcast_ref::<OpenError>()),
        source.and_then(|s| s.downcast_ref::<PacedError>()),
    ) {
        (Some(open), _) => Some(Rejected {
            breaker: open.breaker().to_owned(),
            half_opens_in: failure.retry_after(),
            cause: open.cause(),
            reached,
            written,
            paced: false,
        }),
        (None, Some(paced)) => Some(Rejected {
            breaker: paced.breaker().to_owned(),
            half_opens_in: Some(paced.wait()),
            cause: None,
            reached,
            written,
            paced: true,
        }),
        // Held back by the concurrency limit: as by the send rate.
        (None, None) => source
            .and_then(|s| s.downcast_ref::<LimitedError>())
            .map(|limited| Rejected {
                breaker: limited.breaker().to_owned(),
                half_opens_in: Some(limited.wait()),
                cause: None,
                reached,
                written,
                paced: true,
            }),
    };
    let failed = Outcome::Failed {
        id: record.id.clone(),
        class: record.class.clone(),
        new_class: failure.class().name().to_owned(),
        new_code: failure.code().to_string(),
        recorded: written,
    };
    (failed, rejected)
}
