//! Claims of a SQLite store shared by several processes (here, several `SqliteStore`s opened on
//! one file, each with its own connection): claimers racing over the same due records never
//! both claim one, and a batch whose claim of one record passed to another claimer acknowledges
//! the rest and changes nothing of that one.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_backstop_store::{Change, Claim, ErrorEntry, Record, SqliteStore, Status, Store};

const LEASE: Duration = Duration::from_secs(10);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// `count` records deferred to `due`, ids `m-0000`…
fn due(count: usize, due: SystemTime) -> Vec<Record> {
    (0..count)
        .map(|i| {
            let entry = ErrorEntry::new(at(0), "transient", "http 503", "unavailable", 1);
            let mut r = Record::new(format!("m-{i:04}"), entry);
            r.status = Status::Deferred;
            r.retry_at = Some(due);
            r
        })
        .collect()
}

/// Claims batches of `batch` at `now` and resolves each record under its claim, as a scheduler
/// does, until nothing is due; the ids it claimed.
async fn drain(store: SqliteStore, now: SystemTime, batch: usize) -> Vec<String> {
    let mut claimed = Vec::new();
    loop {
        let due = store.claim_due(now, batch, LEASE).await.unwrap();
        if due.is_empty() {
            return claimed;
        }
        for record in due {
            let lease = record.lease().expect("a claimed record is in flight");
            let acked = store
                .change_claimed(&lease, Change::Resolved { at: now })
                .await
                .unwrap();
            assert!(
                matches!(acked, Claim::Claimed(_)),
                "{}: {acked:?}",
                record.id
            );
            claimed.push(record.id);
        }
    }
}

/// Four claimers, each with its own connection to the file, drain 2,000 due records in batches:
/// every record is claimed by exactly one of them and acknowledged by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claimers_never_both_claim_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put_many(due(2_000, at(0))).await.unwrap();
    let claimers: Vec<_> = (0..4)
        .map(|_| {
            let store = SqliteStore::open(&path).unwrap();
            tokio::spawn(drain(store, at(1), 25))
        })
        .collect();
    let mut all = Vec::new();
    for claimer in claimers {
        all.extend(claimer.await.unwrap());
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 2_000, "as many claims as records");
    assert_eq!(distinct.len(), 2_000, "no record claimed twice");
    let resolved = store
        .count(&tower_backstop_store::Filter::new().status(Status::Resolved))
        .await
        .unwrap();
    assert_eq!(resolved, 2_000);
    assert_eq!(store.next_due().await.unwrap(), None);
}

/// A claimer stalls past its lease with a batch of five; another process claims the first of
/// them meanwhile. The stalled claimer's acknowledgements go through for the four it still
/// holds, and change nothing of the fifth: it stays the other claimer's, which finishes it.
#[tokio::test]
async fn a_batch_whose_claim_of_one_record_was_lost_acknowledges_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost.db");
    let (a, b) = (
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    );
    a.put_many(due(5, at(0))).await.unwrap();
    let batch = a.claim_due(at(1), 5, LEASE).await.unwrap();
    assert_eq!(batch.len(), 5);
    // After the lease, the other process takes the earliest of them (by retry-at, then id).
    let after_lease = at(1) + LEASE + Duration::from_secs(1);
    let taken = b.claim_due(after_lease, 1, LEASE).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].id, "m-0000");
    assert_eq!(taken[0].resends, 2, "the second claim's token");

    let mut acked = Vec::new();
    for record in &batch {
        let lease = record.lease().unwrap();
        let claim = a
            .change_claimed(&lease, Change::Resolved { at: after_lease })
            .await
            .unwrap();
        acked.push((record.id.as_str(), claim));
    }
    for (id, claim) in &acked {
        if *id == "m-0000" {
            assert_eq!(
                *claim,
                Claim::ClaimedElsewhere {
                    status: Status::InFlight,
                    resends: 2
                },
                "the lost claim writes nothing"
            );
        } else {
            assert!(
                matches!(claim, Claim::Claimed(r) if r.status == Status::Resolved),
                "{id}: {claim:?}"
            );
        }
    }
    let lost = a.get("m-0000").await.unwrap().unwrap();
    assert_eq!((lost.status, lost.resends), (Status::InFlight, 2));
    // The other claimer still holds it, and its acknowledgement goes through.
    let lease = taken[0].lease().unwrap();
    let done = b
        .change_claimed(&lease, Change::Resolved { at: after_lease })
        .await
        .unwrap();
    assert!(matches!(done, Claim::Claimed(r) if r.status == Status::Resolved));
}
