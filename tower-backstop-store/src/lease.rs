//! [`Lease`]: a claim on a record, with the token that fences the claimer's writes.

use std::time::{SystemTime, UNIX_EPOCH};

use super::StoreError;
use super::record::{ErrorEntry, Record, Status};

/// A claim on one record: which record, the fencing token of the claim, and until when no one
/// else claims it. What [`Record::lease`] reads off a record a claim returned
/// ([`Store::claim_due`](super::Store::claim_due), [`Store::claim`](super::Store::claim)).
///
/// **The token** is the record's resend count as the claim wrote it. Every claim adds one to
/// that count, and only the holder of a claim gives its resend back
/// ([`Change::Held`](super::Change::Held), through
/// [`change_claimed`](super::Store::change_claimed)), so no later claim of the record is ever
/// in flight with the same count: the token names this claim and no other. A claimer that
/// stalls past its lease (a long pause, a lost connection) and wakes up after another claimer
/// took the record holds a stale token, and every write it makes through the token
/// ([`Store::change_claimed`](super::Store::change_claimed),
/// [`Store::put_claimed`](super::Store::put_claimed)) changes nothing. (A record deleted and
/// written anew starts its count again from zero: a claim older than the deletion could match
/// a new claim of the new record only if it outlived both; nothing in this crate keeps one
/// that long.)
///
/// **The end** ([`until`](Lease::until)) is the record's retry-at time while it is claimed:
/// after it, the record is due again and any claimer may take it. The holder pushes it back by
/// renewing the claim ([`Change::Renewed`](super::Change::Renewed)). A claim that ended but
/// that no one took since still holds: its token still matches, and a renewal or a finishing
/// write goes through.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_backstop_store::{Change, Claim, ErrorEntry, MemoryStore, Record, Status, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let now = SystemTime::now();
/// let mut record = Record::new("msg-1", ErrorEntry::new(now, "throttled", "http 429", "slow down", 1));
/// (record.status, record.retry_at) = (Status::Deferred, Some(now));
/// store.put(record).await.unwrap();
///
/// let claimed = store.claim_due(now, 10, Duration::from_secs(10)).await.unwrap();
/// let lease = claimed[0].lease().expect("a claimed record is in flight");
/// assert_eq!((lease.id.as_str(), lease.token), ("msg-1", 1));
/// // … sent and delivered: finish the claim, only while it is still ours.
/// let done = store.change_claimed(&lease, Change::Resolved { at: now }).await.unwrap();
/// assert!(matches!(done, Claim::Claimed(r) if r.status == Status::Resolved));
/// // A second finish of the same claim finds it ended.
/// let again = store.change_claimed(&lease, Change::Dead).await.unwrap();
/// assert!(matches!(again, Claim::ClaimedElsewhere { .. }));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The claimed record's id.
    pub id: String,
    /// The fencing token: the record's resend count as the claim wrote it.
    pub token: u32,
    /// The end of the claim (the record's retry-at time while it is claimed), unless renewed.
    pub until: SystemTime,
}

impl Lease {
    /// A lease on the record `id`, with fencing token `token`, until `until`: what
    /// [`Record::lease`] returns for a claimed record. A store of your own rarely needs it.
    pub fn new(id: impl Into<String>, token: u32, until: SystemTime) -> Self {
        Lease {
            id: id.into(),
            token,
            until,
        }
    }

    /// The record as the claim left it, as far as a compare-and-set reads it (the id, status
    /// [`InFlight`](Status::InFlight), and the token as resend count): the `seen` record of
    /// [`Store::change_if_unchanged`](super::Store::change_if_unchanged).
    pub(crate) fn as_seen(&self) -> Record {
        let mut seen = Record::new(self.id.clone(), ErrorEntry::new(UNIX_EPOCH, "", "", "", 0));
        seen.status = Status::InFlight;
        seen.resends = self.token;
        seen.retry_at = Some(self.until);
        seen
    }

    /// Refuses a record of another id than the lease's for [`Store::put_claimed`](super::Store::put_claimed).
    pub(crate) fn check_id(&self, record: &Record) -> Result<(), StoreError> {
        if record.id == self.id {
            Ok(())
        } else {
            Err(StoreError::new(format!(
                "put_claimed: the record {:?} is not the claimed record {:?}",
                record.id, self.id
            )))
        }
    }

    /// Whether `record` is still held by this claim: in flight with the lease's token.
    pub(crate) fn holds(&self, record: &Record) -> bool {
        record.status == Status::InFlight && record.resends == self.token
    }
}

impl Record {
    /// The claim this record is under, when it is one a claim wrote
    /// ([`InFlight`](Status::InFlight) with a retry-at time): its id, its resend count as the
    /// fencing token, and its retry-at time as the end of the claim. `None` for a record that
    /// is not in flight.
    pub fn lease(&self) -> Option<Lease> {
        match (self.status, self.retry_at) {
            (Status::InFlight, Some(until)) => {
                Some(Lease::new(self.id.clone(), self.resends, until))
            }
            _ => None,
        }
    }
}

/// Splits a batch of changes under claims into rounds in which no record appears twice: round
/// `k` holds the `k`-th change of each record, each with its position in `changes`. Applying
/// the rounds one after the other applies each record's changes in the batch's order (a
/// renewal, then the resolution of the same claim), while the changes of one round may go
/// together (one statement, one pipeline). A batch without a repeated record is one round.
pub(crate) fn rounds<C>(changes: Vec<(Lease, C)>) -> Vec<Vec<(usize, Lease, C)>> {
    let mut rounds: Vec<Vec<(usize, Lease, C)>> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, (lease, change)) in changes.into_iter().enumerate() {
        let times = seen.entry(lease.id.clone()).or_insert(0);
        if rounds.len() <= *times {
            rounds.push(Vec::new());
        }
        rounds[*times].push((i, lease, change));
        *times += 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_splits_into_rounds_without_a_repeated_record() {
        let lease = |id: &str| Lease::new(id, 1, UNIX_EPOCH);
        let batch = vec![
            (lease("a"), "renew a"),
            (lease("b"), "resolve b"),
            (lease("a"), "resolve a"),
            (lease("c"), "resolve c"),
            (lease("a"), "again a"),
        ];
        let rounds: Vec<Vec<(usize, &str)>> = rounds(batch)
            .into_iter()
            .map(|round| round.into_iter().map(|(i, _, c)| (i, c)).collect())
            .collect();
        assert_eq!(
            rounds,
            [
                vec![(0, "renew a"), (1, "resolve b"), (3, "resolve c")],
                vec![(2, "resolve a")],
                vec![(4, "again a")],
            ]
        );
        assert!(super::rounds::<()>(Vec::new()).is_empty());
    }
}
