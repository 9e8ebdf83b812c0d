//! The audit trail: who re-drove, purged or pruned what, when, and what came of it.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::query::Filter;
use super::{Store, StoreError};

/// What an operator (or a job) did to the records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AuditAction {
    /// Records re-sent on purpose ([`Redrive`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Redrive.html)).
    Redrive,
    /// Records deleted on purpose ([`purge`]).
    Purge,
    /// Records removed by a [`Retention`](super::Retention).
    Prune,
    /// A breaker forced open, disabled or reset for the whole fleet by an operator (its name
    /// in `filter` as `breaker=<name>`, what was done and why in `outcome`).
    Breaker,
}

impl AuditAction {
    /// The action as stored and shown: `redrive`, `purge`, `prune`, `breaker`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AuditAction::Redrive => "redrive",
            AuditAction::Purge => "purge",
            AuditAction::Prune => "prune",
            AuditAction::Breaker => "breaker",
        }
    }

    /// The action named by [`as_str`](Self::as_str), if any.
    pub fn parse(s: &str) -> Option<Self> {
        [
            AuditAction::Redrive,
            AuditAction::Purge,
            AuditAction::Prune,
            AuditAction::Breaker,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One entry of the audit trail: a re-drive, purge or prune, who did it, when, on which
/// records, what the dry run counted, how many records it sent or removed, and its outcome.
/// Every store keeps the trail ([`Store::append_audit`], [`Store::audit`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// When it ended.
    #[serde(with = "super::record::time_text")]
    pub at: SystemTime,
    /// Who: the name an authorisation hook gave, the OS user for the command-line tool, or the
    /// name a library caller set (`"library"` when none was).
    pub actor: String,
    /// What was done.
    pub action: AuditAction,
    /// Which records: the filter as `key=value` pairs, as the command-line tool takes them
    /// (empty for a prune, which says its bounds in `outcome`).
    pub filter: String,
    /// How many records the dry run before it counted, when there was one.
    pub planned: Option<u64>,
    /// Records sent (a re-drive) or removed (a purge, a prune).
    pub sent: u64,
    /// What came of it, in words: `resolved 3, failed 1, skipped 0`, `deleted 12`.
    pub outcome: String,
}

impl AuditEntry {
    /// An entry of `action` by `actor` on the records of `filter`, at the current time, with
    /// nothing planned, sent or said yet.
    pub fn new(action: AuditAction, actor: impl Into<String>, filter: &Filter) -> Self {
        AuditEntry {
            at: SystemTime::now(),
            actor: actor.into(),
            action,
            filter: filter.to_string(),
            planned: None,
            sent: 0,
            outcome: String::new(),
        }
    }

    /// The dry run's count.
    pub fn planned(mut self, n: u64) -> Self {
        self.planned = Some(n);
        self
    }

    /// Records sent or removed.
    pub fn sent(mut self, n: u64) -> Self {
        self.sent = n;
        self
    }

    /// What came of it.
    pub fn outcome(mut self, outcome: impl Into<String>) -> Self {
        self.outcome = outcome.into();
        self
    }

    /// When it ended (default: when the entry was made).
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = at;
        self
    }
}

/// Deletes the records that match `filter` and records it in the audit trail as done by
/// `actor`; returns how many were deleted. An empty filter is refused: nothing is deleted.
///
/// The deletion and its audit entry are two writes: when the entry cannot be written, the
/// records are gone and the error says so.
///
/// # Errors
///
/// [`StoreError`] for an empty filter, when the store is closed, or when a write fails.
pub async fn purge(store: &dyn Store, filter: &Filter, actor: &str) -> Result<u64, StoreError> {
    if filter.is_empty() {
        return Err(StoreError::new(
            "refusing to purge every record: give a filter",
        ));
    }
    let deleted = store.delete(filter).await?;
    let entry = AuditEntry::new(AuditAction::Purge, actor, filter)
        .sent(deleted)
        .outcome(format!("deleted {deleted}"));
    store.append_audit(entry).await.map_err(|e| {
        StoreError::with_source(
            format!("{deleted} records deleted, but the audit entry was not written"),
            e,
        )
    })?;
    Ok(deleted)
}
