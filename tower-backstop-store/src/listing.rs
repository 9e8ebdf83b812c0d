//! What "the list of records" means, once for every reader: [`Store::list`], the command line's
//! `backstop-dlq list` and the board's list show the same records in the same order, a page at
//! a time by position ([`list_page`]) or after a cursor ([`list_after`]).

use std::cmp::Ordering;
use std::ops::Range;

use super::cursor::{Cursor, Part, fingerprint};
use super::query::Filter;
use super::record::{Record, Status};
use super::{Store, StoreError};

/// Where a record stands in a list: the dead letters first, then the records waiting for the
/// scheduler, then (only when asked for) the resolved ones.
fn rank(status: Status) -> u8 {
    match status {
        Status::Dead => 0,
        Status::Deferred | Status::InFlight => 1,
        Status::Resolved => 2,
    }
}

/// The order of every list of records: [`Dead`](Status::Dead) records first, the most
/// recently failed first; then the [`Deferred`](Status::Deferred) and
/// [`InFlight`](Status::InFlight) ones together, the soonest due (retry-at) first; then the
/// [`Resolved`](Status::Resolved) ones, the most recently failed first. Ties by id.
///
/// It is the order of [`Store::list`] and [`list_page`]; sort records read another way (a page
/// narrowed in memory, say) with it to show them as a list does.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_backstop_store::{ErrorEntry, Record, Status, list_order};
///
/// let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
/// let record = |id: &str, status, failed: u64, due: u64| {
///     let mut r = Record::new(id, ErrorEntry::new(t + Duration::from_secs(failed), "transient", "http 503", "", 1));
///     r.status = status;
///     r.retry_at = (due > 0).then(|| t + Duration::from_secs(due));
///     r
/// };
/// let mut records = vec![
///     record("late", Status::Deferred, 9, 600),
///     record("healed", Status::Resolved, 5, 0),
///     record("old", Status::Dead, 1, 0),
///     record("soon", Status::InFlight, 2, 60),
///     record("new", Status::Dead, 8, 0),
/// ];
/// records.sort_by(list_order);
/// let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
/// assert_eq!(ids, ["new", "old", "soon", "late", "healed"]);
/// ```
pub fn list_order(a: &Record, b: &Record) -> Ordering {
    rank(a.status)
        .cmp(&rank(b.status))
        .then_with(|| match rank(a.status) {
            1 => a.retry_at.cmp(&b.retry_at),
            _ => b.last_failed_at.cmp(&a.last_failed_at),
        })
        .then_with(|| a.id.cmp(&b.id))
}

/// One page of a list of records ([`list_page`]), and what the whole list holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The records at the page's positions, in [`list_order`].
    pub records: Vec<Record>,
    /// How many records the list holds, on every page.
    pub total: u64,
    /// Those per status, in the list's order: dead, deferred, in flight, then resolved when
    /// listed (or the filter's one status alone).
    pub by_status: Vec<(Status, u64)>,
}

/// The positions `page` (counted from 0) of the list of the records that match `filter`, in
/// [`list_order`]: what `backstop-dlq list` prints and the board's list shows, and, for the
/// empty filter from position 0, what [`Store::list`] returns.
///
/// The list holds the outstanding records: [`Dead`](Status::Dead),
/// [`Deferred`](Status::Deferred) and [`InFlight`](Status::InFlight); with `with_resolved` the
/// [`Resolved`](Status::Resolved) ones too, after them. A filter that names a status lists that
/// status alone (resolved ones included when it names them).
///
/// It costs one [`Store::count`] per status and one read per part of the list that the page
/// overlaps (dead, waiting, resolved): [`Store::search`] for the dead and the resolved ones,
/// [`Store::search_waiting`] for the others, each of the page's length. Nothing is read whole
/// to be sorted, whatever the store's size (a store's own `search_waiting` may read more: see
/// its docs). A page by position still reads and skips every record before it: a page 100,000
/// records deep costs hundreds of milliseconds in SQLite and Postgres. [`list_after`] reads the
/// same list after a cursor, at the cost of the first page wherever it is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_backstop_store::StoreError> {
/// use tower_backstop_store::{Filter, MemoryStore, list_page};
///
/// let store = MemoryStore::new();
/// let first = list_page(&store, &Filter::new().class("throttled"), false, 0..50).await?;
/// assert_eq!((first.records.len(), first.total), (0, 0));
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`StoreError`] when the store is closed or cannot be read.
pub async fn list_page(
    store: &dyn Store,
    filter: &Filter,
    with_resolved: bool,
    page: Range<usize>,
) -> Result<Listing, StoreError> {
    let mut by_status = Vec::new();
    for status in filter.listed_statuses(with_resolved) {
        let n = store.count(&filter.clone().status(status)).await?;
        by_status.push((status, n));
    }
    let total = by_status.iter().map(|(_, n)| n).sum();
    let mut records = Vec::new();
    let mut start = 0usize;
    for part in [0u8, 1, 2] {
        let statuses: Vec<Status> = by_status
            .iter()
            .filter(|(s, _)| rank(*s) == part)
            .map(|(s, _)| *s)
            .collect();
        let n: u64 = by_status
            .iter()
            .filter(|(s, _)| rank(*s) == part)
            .map(|(_, n)| n)
            .sum();
        let end = start.saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
        // The overlap of the page with this part's positions [start, end).
        let (from, to) = (page.start.max(start), page.end.min(end));
        if from < to {
            let range = from - start..to - start;
            let read = match (part, statuses.as_slice()) {
                // Both waiting statuses: the store's due-ordered read of them together.
                (1, [_, _]) => store.search_waiting(filter, range).await?,
                (_, [status]) => {
                    let one = filter.clone().status(*status);
                    if part == 1 {
                        store.search_waiting(&one, range).await?
                    } else {
                        store.search(&one, range).await?
                    }
                }
                _ => Vec::new(),
            };
            records.extend(read);
        }
        start = end;
    }
    Ok(Listing {
        records,
        total,
        by_status,
    })
}

/// One page of a list read by cursor ([`list_after`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The records of the page, in [`list_order`]: at most the limit asked for.
    pub records: Vec<Record>,
    /// Where the next page starts, when the list goes on after this page; `None` at its end.
    pub next: Option<Cursor>,
}

/// Up to `limit` records of the list of the records that match `filter`, in [`list_order`],
/// after `after` (from the start for `None`): the same list as [`list_page`]'s, read by keyset
/// instead of by position, so that a page deep in the list costs what the first one does.
/// [`Page::next`] resumes it; it is `None` once the list has no more records.
///
/// The list holds the outstanding records: [`Dead`](Status::Dead), then
/// [`Deferred`](Status::Deferred) and [`InFlight`](Status::InFlight) together; with
/// `with_resolved` the [`Resolved`](Status::Resolved) ones too, after them. A filter that names
/// a status lists that status alone. A cursor resumes only the list it was made for (the same
/// filter but for its time range, and the same `with_resolved`); see [`Cursor`] for what a
/// cursor holds and how a page after it reads a store that changed meanwhile.
///
/// It reads at most `limit + 1` records, with one keyset read per part of the list the page
/// reaches ([`Store::search_after`] for the dead and the resolved ones,
/// [`Store::search_waiting_after`] for the others), and counts nothing. A `limit` of 0 reads
/// nothing and returns an empty page with no cursor.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_backstop_store::StoreError> {
/// use std::time::{Duration, SystemTime};
/// use tower_backstop_store::{ErrorEntry, Filter, MemoryStore, Record, Store, list_after};
///
/// let store = MemoryStore::new();
/// let t = SystemTime::now();
/// for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
///     let failed = t - Duration::from_secs(i as u64);
///     store.put(Record::new(id, ErrorEntry::new(failed, "transient", "http 503", "", 1))).await?;
/// }
/// let first = list_after(&store, &Filter::new(), false, None, 2).await?;
/// assert_eq!(first.records.len(), 2);
/// let token = first.next.expect("a third record follows").to_string();
///
/// // Later, from the token (a query string, a command line):
/// let rest = list_after(&store, &Filter::new(), false, Some(&token.parse()?), 2).await?;
/// assert_eq!(rest.records[0].id, "c");
/// assert!(rest.next.is_none());
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`StoreError`] when the store is closed or cannot be read, or when `after` was made for
/// another list, with the message of that [`CursorError`](crate::CursorError) (check a cursor first with
/// [`Cursor::check`] to tell the two apart).
pub async fn list_after(
    store: &dyn Store,
    filter: &Filter,
    with_resolved: bool,
    after: Option<&Cursor>,
    limit: usize,
) -> Result<Page, StoreError> {
    let fingerprint = fingerprint(filter, with_resolved);
    let statuses = filter.listed_statuses(with_resolved);
    if let Some(cursor) = after {
        cursor.check(filter, with_resolved)?;
    }
    if limit == 0 {
        return Ok(Page::default());
    }
    let want = limit.saturating_add(1);
    let mut records: Vec<Record> = Vec::new();
    for part in Part::ALL {
        let in_part: Vec<Status> = statuses
            .iter()
            .copied()
            .filter(|s| Part::of(*s) == part)
            .collect();
        let key = match after {
            Some(c) if c.part() > part => continue,
            Some(c) if c.part() == part => Some(c.key()),
            _ => None,
        };
        if in_part.is_empty() || records.len() >= want {
            continue;
        }
        let n = want - records.len();
        let read = match (part, in_part.as_slice()) {
            // Both waiting statuses: the store's due-ordered read of them together.
            (Part::Waiting, [_, _]) => store.search_waiting_after(filter, key, n),
            (Part::Waiting, [status, ..]) => {
                store.search_waiting_after(&filter.clone().status(*status), key, n)
            }
            (_, [status, ..]) => store.search_after(&filter.clone().status(*status), key, n),
            (_, []) => continue,
        };
        records.extend(read.await?);
    }
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().map(|r| Cursor::after(r, fingerprint))
    } else {
        None
    };
    Ok(Page { records, next })
}
