//! A store that tells the parent about its claims: every call goes to the shared store; a claim
//! of due records writes `claimed <n>` on stdout, and each write that ends a claim (delivered,
//! failed again, held, given back: anything but a renewal) writes `ended`. The parent counts
//! what each child holds, so that it kills one while it holds claims.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tower_backstop::store::{
    AuditEntry, BoxFuture, Change, Claim, Counts, Filter, FleetNote, Lease, Record, Store,
    StoreError,
};

/// The shared store, with its claims told on stdout.
pub struct Tap(pub Arc<dyn Store>);

type Answer<T> = BoxFuture<'static, Result<T, StoreError>>;

/// Writes `ended` once `answer` is in, whatever it says: the claim is no longer this
/// process's to end.
fn ended<T: Send + 'static>(answer: Answer<T>) -> Answer<T> {
    Box::pin(async move {
        let answer = answer.await;
        println!("ended");
        answer
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
            if !claimed.is_empty() {
                println!("claimed {}", claimed.len());
            }
            Ok(claimed)
        })
    }

    fn delete(&self, filter: &Filter) -> Answer<u64> {
        self.0.delete(filter)
    }

    fn claim(&self, seen: &Record, until: SystemTime) -> Answer<Claim> {
        self.0.claim(seen, until)
    }

    fn change_if_unchanged(&self, seen: &Record, change: Change) -> Answer<Claim> {
        self.0.change_if_unchanged(seen, change)
    }

    fn change_claimed(&self, lease: &Lease, change: Change) -> Answer<Claim> {
        let renewal = matches!(change, Change::Renewed { .. });
        let answer = self.0.change_claimed(lease, change);
        if renewal { answer } else { ended(answer) }
    }

    fn put_claimed(&self, lease: &Lease, record: Record) -> Answer<Claim> {
        ended(self.0.put_claimed(lease, record))
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
