//! The cases of keyset paging: [`list_after`] pages the list of [`list_order`] with no duplicate
//! and no gap, refuses a cursor it cannot use, and resumes a stale one after its key.

use std::collections::HashSet;

use super::{Backend, Opened, at, deferred, every, ids, open, rec};
use crate::cursor::Cursor;
use crate::{Change, Filter, Record, Status, Store, list_after, list_order};

/// A list of 150 records made for paging: 90 dead ones whose failure times tie in sevens, of two
/// classes and codes, a third of them tagged; 40 waiting ones (deferred and in flight) whose
/// retry-at times tie in fives; 20 resolved ones.
async fn seed_many(o: &Opened) {
    let mut batch = Vec::new();
    for i in 0..150u64 {
        let (class, code) = if i % 2 == 0 {
            ("throttled", "http 429")
        } else {
            ("transient", "http 503")
        };
        let mut r = rec(&format!("p-{i:03}"), class, code, at((i % 7) * 1_000));
        if i % 3 == 0 {
            r.tags.insert("campaign".into(), "spring".into());
        }
        if (90..130).contains(&i) {
            r = deferred(r, at(60_000 + (i % 5) * 60_000));
            if i % 4 == 0 {
                r.status = Status::InFlight;
            }
        }
        batch.push(r);
    }
    o.store.put_many(batch).await.unwrap();
    for i in 130..150u64 {
        let id = format!("p-{i:03}");
        o.store
            .update(&id, Change::Resolved { at: at(70_000) })
            .await
            .unwrap();
    }
}

/// The list of `filter` as every reader must show it: every record that matches it and is
/// listed, in [`list_order`], read whole.
async fn reference(store: &dyn Store, filter: &Filter, with_resolved: bool) -> Vec<String> {
    let statuses = filter.listed_statuses(with_resolved);
    let mut all: Vec<Record> = every(store)
        .await
        .into_iter()
        .filter(|r| filter.matches(r) && statuses.contains(&r.status))
        .collect();
    all.sort_by(list_order);
    all.into_iter().map(|r| r.id).collect()
}

/// The whole list of `filter`, a page of `limit` at a time through the cursor of each page.
async fn by_cursor(
    store: &dyn Store,
    filter: &Filter,
    with_resolved: bool,
    limit: usize,
) -> Vec<String> {
    let mut shown = Vec::new();
    let mut after: Option<Cursor> = None;
    loop {
        let page = list_after(store, filter, with_resolved, after.as_ref(), limit)
            .await
            .unwrap_or_else(|e| panic!("{filter} (limit {limit}): {e}"));
        shown.extend(page.records.iter().map(|r| r.id.clone()));
        match page.next {
            Some(next) => {
                assert_eq!(page.records.len(), limit, "{filter}: a short page goes on");
                // Through its text, as a command line or a link carries it.
                after = Some(next.to_string().parse().unwrap());
            }
            None => return shown,
        }
        assert!(shown.len() <= 1_000, "{filter}: the pages never end");
    }
}

/// Paging a whole list by cursor gives exactly the list, in its order, with no duplicate and
/// no gap: for the empty filter (with and without resolved records), by status, by class, by
/// class and code, by tag and status, at several page sizes (ties of time cut by pages).
pub(in crate::testing) async fn pages_by_cursor_are_the_list(b: &dyn Backend) {
    let o = open(b, "cursor_pages", 10).await;
    seed_many(&o).await;
    let filters = [
        (Filter::new(), false),
        (Filter::new(), true),
        (Filter::new().status(Status::Dead), false),
        (Filter::new().status(Status::Deferred), false),
        (Filter::new().status(Status::InFlight), false),
        (Filter::new().status(Status::Resolved), false),
        (Filter::new().class("throttled"), false),
        (Filter::new().class("transient"), true),
        (Filter::new().class("throttled").code("http 429"), false),
        (
            Filter::new().tag("campaign", "spring").status(Status::Dead),
            false,
        ),
        (Filter::new().tag("campaign", "spring"), true),
        (Filter::new().class("poison"), false),
    ];
    for (filter, with_resolved) in &filters {
        let want = reference(&*o.store, filter, *with_resolved).await;
        for limit in [7, 50, 1_000] {
            let got = by_cursor(&*o.other, filter, *with_resolved, limit).await;
            assert_eq!(
                got, want,
                "{filter} (resolved: {with_resolved}), limit {limit}"
            );
        }
        let unique: HashSet<&String> = want.iter().collect();
        assert_eq!(unique.len(), want.len(), "{filter}: no duplicate");
    }
    // One record a page, through every tie.
    let want = reference(&*o.store, &Filter::new(), true).await;
    assert_eq!(want.len(), 150);
    assert_eq!(by_cursor(&*o.store, &Filter::new(), true, 1).await, want);
    let none = list_after(&*o.store, &Filter::new(), false, None, 0).await;
    assert!(
        none.unwrap().records.is_empty(),
        "a limit of 0 reads nothing"
    );
}

/// A cursor that was changed, forged, cut short, is not a token at all, or was made for another
/// list (another filter, or with resolved records) is refused with an error that says which;
/// never read as another page.
pub(in crate::testing) async fn bad_cursors_are_refused(b: &dyn Backend) {
    let o = open(b, "cursor_bad", 10).await;
    seed_many(&o).await;
    let throttled = Filter::new().class("throttled");
    let page = list_after(&*o.store, &throttled, true, None, 5)
        .await
        .unwrap();
    let token = page
        .next
        .expect("more than 5 throttled records")
        .to_string();

    // Changed: each character in turn, and the id inside it forged without its checksum.
    for i in [0, token.len() / 2, token.len() - 1] {
        let mut bytes = token.clone().into_bytes();
        bytes[i] = if bytes[i] == b'x' { b'y' } else { b'x' };
        let changed = String::from_utf8(bytes).unwrap();
        let e = changed.parse::<Cursor>().unwrap_err().to_string();
        assert!(e.contains("invalid cursor"), "{changed}: {e}");
    }
    let cut = token[..token.len() - 3].parse::<Cursor>().unwrap_err();
    assert!(cut.to_string().contains("damaged"), "{cut}");
    for garbled in ["", "not a cursor", "%2F%2F", "AAAAAAAAAAAAAAAA", "p-001"] {
        let e = garbled.parse::<Cursor>().unwrap_err().to_string();
        assert!(e.starts_with("invalid cursor: "), "{garbled:?}: {e}");
    }

    // Well made, with a checksum that holds, for another list.
    let cursor: Cursor = token.parse().unwrap();
    for (other, with_resolved) in [
        (Filter::new().class("transient"), true),
        (Filter::new(), true),
        (throttled.clone().status(Status::Dead), true),
        (throttled.clone().tag("campaign", "spring"), true),
        (throttled.clone(), false),
    ] {
        let e = list_after(&*o.store, &other, with_resolved, Some(&cursor), 5)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid cursor") && e.contains("another list"),
            "{other} (resolved: {with_resolved}): {e}"
        );
        assert!(cursor.check(&other, with_resolved).is_err());
    }
    let forged = Cursor::after(&rec("p-001", "transient", "http 503", at(0)), 0x1234);
    let forged: Cursor = forged.to_string().parse().unwrap();
    let e = list_after(&*o.store, &throttled, true, Some(&forged), 5).await;
    assert!(e.unwrap_err().to_string().contains("another list"));

    // The list it was made for, with a time range added: the same list, the range applied.
    let since = throttled.clone().since(at(0));
    assert!(cursor.check(&since, true).is_ok());
    let next = list_after(&*o.store, &since, true, Some(&cursor), 5).await;
    assert_eq!(next.unwrap().records.len(), 5);
}

/// A stale cursor: the last record shown was deleted, and records were written before it and
/// after it (ties of its time included); the next page is the records after its key, in the
/// list as it is now. The same in the waiting part, its last record claimed meanwhile.
pub(in crate::testing) async fn a_stale_cursor_gives_the_next_page(b: &dyn Backend) {
    let o = open(b, "cursor_stale", 10).await;
    seed_many(&o).await;
    let dead = Filter::new().status(Status::Dead);
    let first = list_after(&*o.store, &dead, false, None, 10).await.unwrap();
    let cursor = first.next.clone().unwrap();
    let last = first.records.last().unwrap().clone();
    let before: Vec<String> = reference(&*o.store, &dead, false).await;
    let want_unchanged: Vec<String> = before[10..].to_vec();

    o.store
        .delete(&Filter::new().id(last.id.clone()))
        .await
        .unwrap();
    let t = last.last_failed_at;
    let ms = |d: i64| t.checked_add(std::time::Duration::from_millis(d as u64));
    o.store
        .put_many(vec![
            // Before the key: newer, or the same time and a smaller id.
            rec("n-newer", "transient", "http 503", ms(500).unwrap()),
            rec("a-tie-before", "transient", "http 503", t),
            // After it: the same time and a greater id, or older.
            rec("z-tie-after", "transient", "http 503", t),
            rec(
                "o-older",
                "transient",
                "http 503",
                t - std::time::Duration::from_millis(1),
            ),
        ])
        .await
        .unwrap();
    let next = list_after(&*o.other, &dead, false, Some(&cursor), 1_000)
        .await
        .unwrap();
    let got = ids(&next.records);
    let key = cursor.key();
    let now = reference(&*o.store, &dead, false).await;
    let mut after_key: Vec<Record> = every(&*o.store)
        .await
        .into_iter()
        .filter(|r| now.contains(&r.id) && key.precedes_newest_first(r.last_failed_at, &r.id))
        .collect();
    after_key.sort_by(list_order);
    assert_eq!(
        got,
        ids(&after_key),
        "the records after the key, as the list is now"
    );
    assert!(got.contains(&"z-tie-after") && got.contains(&"o-older"));
    let unchanged: Vec<&str> = got
        .iter()
        .copied()
        .filter(|id| !["z-tie-after", "o-older"].contains(id))
        .collect();
    assert_eq!(
        unchanged, want_unchanged,
        "no record that did not change is lost or shown twice"
    );
    assert!(!got.contains(&"n-newer") && !got.contains(&"a-tie-before"));
    assert!(next.next.is_none());

    // In the waiting part: the last shown is claimed (due later) meanwhile.
    let waiting = Filter::new().status(Status::Deferred);
    let first = list_after(&*o.store, &waiting, false, None, 4)
        .await
        .unwrap();
    let last = first.records.last().unwrap().clone();
    let want: Vec<String> = reference(&*o.store, &waiting, false).await[4..].to_vec();
    o.store
        .update(&last.id, Change::Held { retry_at: at(0) })
        .await
        .unwrap();
    let next = list_after(&*o.store, &waiting, false, first.next.as_ref(), 1_000)
        .await
        .unwrap();
    assert_eq!(
        ids(&next.records),
        want,
        "the held record is now before the key"
    );
}
