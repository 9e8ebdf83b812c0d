//! A store that tells the parent about its claims: every call goes to the shared store, and
//! each claim this process wins (of due records, or of one record) or renews writes
//! `claim <token> <until> <id>` on stdout: the claim's fencing token, its end (Unix
//! milliseconds) and its record's id. The parent holds these against the records the store
//! shows in flight: a record in flight with the token and the end this process last told of it
//! is this process's claim. (The token alone is not enough: a claim given back lowers the
//! record's resend count again, so the next claim of the record, by any process, carries the
//! same token.) Nothing is told of a claim's end: the store says which claims still hold,
//! where a count of lines drifts (a write retried, a claim given back through another call, a
//! claim taken again by its own holder).

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_backstop::store::{
    AuditEntry, BoxFuture, Change, Claim, Counts, CountsCheck, Filter, FleetNote, Lease, Record,
    SortKey, Store, StoreError,
};

/// The shared store, with its claims told on stdout.
pub struct Tap(pub Arc<dyn Store>);

type Answer<T> = BoxFuture<'static, Result<T, StoreError>>;

/// Writes `claim <token> <until> <id>` for each claimed record in `records` (as the store
/// returned it), in one write of stdout.
fn tell_claims<'a>(records: impl IntoIterator<Item = &'a Record>) {
    let mut out = std::io::stdout().lock();
    for lease in records.into_iter().filter_map(Record::lease) {
        let until = lease.until.duration_since(UNIX_EPOCH).unwrap_or_default();
        let _ = writeln!(
            out,
            "claim {} {} {}",
            lease.token,
            until.as_millis(),
            lease.id
        );
    }
    let _ = out.flush();
}

/// Tells the claim `answer` returns, if it is one (a claim won, or renewed).
fn tell_claim(answer: Answer<Claim>) -> Answer<Claim> {
    Box::pin(async move {
        let claim = answer.await?;
        if let Claim::Claimed(record) = &claim {
            tell_claims([&**record]);
        }
        Ok(claim)
    })
}

impl Store for Tap {
    fn put_many(&self, records: Vec<Record>) -> Answer<()> {
        self.0.put_many(records)
    }

    fn put(&self, record: Record) -> Answer<()> {
        self.0.put(record)
    }

    fn get(&self, id: &str) -> Answer<Option<Record>> {
        self.0.get(id)
    }

    fn search(&self, filter: &Filter, page: Range<usize>) -> Answer<Vec<Record>> {
        self.0.search(filter, page)
    }

    fn count(&self, filter: &Filter) -> Answer<u64> {
        self.0.count(filter)
    }

    fn search_waiting(&self, filter: &Filter, page: Range<usize>) -> Answer<Vec<Record>> {
        self.0.search_waiting(filter, page)
    }

    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> Answer<Vec<Record>> {
        self.0.search_after(filter, after, limit)
    }

    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> Answer<Vec<Record>> {
        self.0.search_waiting_after(filter, after, limit)
    }

    fn check_counts(&self, repair: bool) -> Answer<CountsCheck> {
        self.0.check_counts(repair)
    }

    fn list(&self, limit: usize) -> Answer<Vec<Record>> {
        self.0.list(limit)
    }

    fn counts(&self, since: SystemTime) -> Answer<Counts> {
        self.0.counts(since)
    }

    fn count_by_class(&self) -> Answer<Vec<(String, u64)>> {
        self.0.count_by_class()
    }

    fn update(&self, id: &str, change: Change) -> Answer<Option<Record>> {
        self.0.update(id, change)
    }

    fn claim_due(&self, now: SystemTime, limit: usize, lease: Duration) -> Answer<Vec<Record>> {
        let claimed = self.0.claim_due(now, limit, lease);
        Box::pin(async move {
            let claimed = claimed.await?;
            tell_claims(&claimed);
            Ok(claimed)
        })
    }

    fn delete(&self, filter: &Filter) -> Answer<u64> {
        self.0.delete(filter)
    }

    fn claim(&self, seen: &Record, until: SystemTime) -> Answer<Claim> {
        tell_claim(self.0.claim(seen, until))
    }

    fn change_if_unchanged(&self, seen: &Record, change: Change) -> Answer<Claim> {
        // `Redriving` claims the record (what `claim` does).
        let claim = matches!(change, Change::Redriving { .. });
        let answer = self.0.change_if_unchanged(seen, change);
        if claim { tell_claim(answer) } else { answer }
    }

    fn change_claimed(&self, lease: &Lease, change: Change) -> Answer<Claim> {
        // A renewal moves the claim's end: told like a claim. Any other change ends the claim
        // (the store shows it).
        let renewal = matches!(change, Change::Renewed { .. });
        let answer = self.0.change_claimed(lease, change);
        if renewal { tell_claim(answer) } else { answer }
    }

    fn applies_batches(&self) -> bool {
        self.0.applies_batches()
    }

    fn change_claimed_many(&self, changes: Vec<(Lease, Change)>) -> Answer<Vec<Claim>> {
        // The renewals among them, to be told.
        let renewals: Vec<bool> = changes
            .iter()
            .map(|(_, c)| matches!(c, Change::Renewed { .. }))
            .collect();
        let answer = self.0.change_claimed_many(changes);
        Box::pin(async move {
            let claims = answer.await?;
            let renewed = claims
                .iter()
                .zip(renewals)
                .filter_map(|(c, renewal)| match c {
                    Claim::Claimed(record) if renewal => Some(&**record),
                    _ => None,
                });
            tell_claims(renewed);
            Ok(claims)
        })
    }

    fn put_claimed(&self, lease: &Lease, record: Record) -> Answer<Claim> {
        self.0.put_claimed(lease, record)
    }

    fn next_due(&self) -> Answer<Option<SystemTime>> {
        self.0.next_due()
    }

    fn reserve_slot(&self, schedule: &str, gap: Duration, now: SystemTime) -> Answer<SystemTime> {
        self.0.reserve_slot(schedule, gap, now)
    }

    fn wake_ups(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.0.wake_ups()
    }

    fn release_held(&self, breaker: &str, now: SystemTime) -> Answer<Option<u64>> {
        self.0.release_held(breaker, now)
    }

    fn put_note(&self, note: FleetNote) -> Answer<()> {
        self.0.put_note(note)
    }

    fn notes(&self, now: SystemTime) -> Answer<Vec<FleetNote>> {
        self.0.notes(now)
    }

    fn append_audit(&self, entry: AuditEntry) -> Answer<()> {
        self.0.append_audit(entry)
    }

    fn audit(&self, page: Range<usize>) -> Answer<Vec<AuditEntry>> {
        self.0.audit(page)
    }

    fn budget_spent(&self, id: &str) -> Answer<Option<u32>> {
        self.0.budget_spent(id)
    }
}
