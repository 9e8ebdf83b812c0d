//! From a query string (or a form) to a [`Filter`], and the pages of records it selects.

use std::ops::Range;
use std::time::SystemTime;

use super::html::PageError;
use super::narrow::{self, Narrow};
use tower_backstop::store::{Filter, Listing, Record, Status, Store, StoreError, list_order};

/// The keys of a query string or form that are the board's own, not a filter's.
const BOARD_KEYS: &[&str] = &[
    "page",
    "after",
    "resolved",
    "group",
    "window",
    "view",
    "csrf",
    "rate",
    "max",
    "planned",
    "include_resolved",
];

/// A query string or a form, split: the filter's pairs as given (for links and hidden fields),
/// the filter they describe, what narrows it further (a host, a group), and the board's own keys.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scope {
    /// The pairs of the filter as they came (`class`, `host`, `tag` as `NAME=value`,
    /// `tag.NAME`, …), empty values left out.
    pub(crate) pairs: Vec<(String, String)>,
    /// What the store's part of them describes.
    pub(crate) filter: Filter,
    /// The host (`host=…`) and the group (`group=…`, a fingerprint key), narrowing the filter.
    pub(crate) narrow: Narrow,
    /// The board's other keys, as given.
    pub(crate) board: Vec<(String, String)>,
}

impl Scope {
    /// Reads `pairs` (a query string or a form): every key that is not the board's own is a
    /// filter key of [`Filter::from_pairs`], or `host`; the filter form's `tag` field is
    /// `NAME=value`.
    pub(crate) fn read(pairs: Vec<(String, String)>, now: SystemTime) -> Result<Self, PageError> {
        let mut scope = Scope::default();
        let mut filter_pairs = Vec::new();
        for (key, value) in pairs {
            if BOARD_KEYS.contains(&key.as_str()) {
                if key == "group" && !value.is_empty() {
                    scope.narrow.group = Some(value.clone());
                }
                scope.board.push((key, value));
                continue;
            }
            if value.is_empty() {
                // An empty field of the filter form: no condition.
                continue;
            }
            let pair = if key == "tag" {
                if !value.contains('=') || value.starts_with('=') {
                    return Err(PageError::bad_request(format!(
                        "filter tag: {value:?} is not NAME=value (campaign=spring)"
                    )));
                }
                format!("tag.{value}")
            } else {
                format!("{key}={value}")
            };
            filter_pairs.push(pair);
            scope.pairs.push((key, value));
        }
        let (filter_pairs, host) =
            Narrow::split_host(&filter_pairs).map_err(PageError::bad_request)?;
        scope.narrow.host = host;
        scope.filter = Filter::from_pairs(&filter_pairs, now)
            .map_err(|e| PageError::bad_request(format!("bad filter: {e}")))?;
        Ok(scope)
    }

    /// The board key `key`'s value, the last one given.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.board
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the board key `key` is set: a ticked checkbox or a link's `1` (`1`, `true`,
    /// `on`, `yes`).
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("1" | "true" | "on" | "yes"))
    }

    /// The board key `key` as a number, `default` when absent or empty.
    pub(crate) fn number(&self, key: &str, default: usize) -> Result<usize, PageError> {
        match self.get(key) {
            None | Some("") => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| PageError::bad_request(format!("{key}: {v:?} is not a whole number"))),
        }
    }

    /// Whether the scope selects every record: no filter, no host, no group.
    pub(crate) fn is_everything(&self) -> bool {
        self.filter.is_empty() && self.narrow.is_empty()
    }

    /// The pairs for links: the filter's (the host's among them), and the group when there is
    /// one.
    pub(crate) fn link_pairs(&self) -> Vec<(String, String)> {
        let mut pairs = self.pairs.clone();
        if let Some(group) = &self.narrow.group {
            pairs.push(("group".to_owned(), group.clone()));
        }
        pairs
    }

    /// The filter an action applies to: the filter, narrowed to the ids of the host's and the
    /// group's records when there are (of the newest [`GROUP_LIMIT`](super::GROUP_LIMIT) records
    /// that match). `None` when that leaves no record: then there is nothing to act on, and
    /// never the wider filter.
    pub(crate) async fn action_filter(
        &self,
        store: &dyn Store,
    ) -> Result<Option<Filter>, StoreError> {
        narrow::action_filter(store, &self.filter, &self.narrow).await
    }
}

/// The records at positions `page` of the list of `filter` narrowed by `narrow` (a host, a
/// group): its members among the newest [`GROUP_LIMIT`](super::GROUP_LIMIT) that match
/// `filter`, of the list's statuses ([`Filter::listed_statuses`]), in the order of every list
/// ([`list_order`]), and the counts of what it lists. Without a narrowing the board reads
/// [`list_page`](tower_backstop::store::list_page) instead.
pub(crate) async fn narrowed_page(
    store: &dyn Store,
    filter: &Filter,
    narrow: &Narrow,
    resolved: bool,
    page: Range<usize>,
) -> Result<Listing, StoreError> {
    let members = narrow::members(store, filter, narrow).await?;
    let statuses = filter.listed_statuses(resolved);
    let by_status: Vec<(Status, u64)> = statuses
        .iter()
        .map(|s| (*s, members.iter().filter(|r| r.status == *s).count() as u64))
        .collect();
    let mut sorted: Vec<Record> = members
        .into_iter()
        .filter(|r| statuses.contains(&r.status))
        .collect();
    sorted.sort_by(list_order);
    let mut listing = Listing::default();
    listing.total = sorted.len() as u64;
    listing.records = sorted
        .into_iter()
        .skip(page.start)
        .take(page.len())
        .collect();
    listing.by_status = by_status;
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn form_fields_become_a_filter() {
        let now = SystemTime::now();
        let s = Scope::read(
            pairs(&[
                ("class", "throttled"),
                ("code", ""),
                ("tag", "campaign=spring"),
                ("tag.tenant", "acme"),
                ("page", "3"),
                ("group", "00ff"),
            ]),
            now,
        )
        .unwrap();
        assert_eq!(
            s.filter,
            Filter::new()
                .class("throttled")
                .tag("campaign", "spring")
                .tag("tenant", "acme")
        );
        assert_eq!(s.number("page", 1).unwrap(), 3);
        assert_eq!(s.narrow.group.as_deref(), Some("00ff"));
        assert_eq!(s.pairs.len(), 3);
        let s = Scope::read(pairs(&[("host", "Mail.test:443"), ("class", "x")]), now).unwrap();
        assert_eq!(s.filter, Filter::new().class("x"));
        assert_eq!(s.narrow.host.as_deref(), Some("mail.test:443"));
        assert_eq!(s.pairs.len(), 2, "the host goes along in links");
        assert!(!s.is_everything());
    }

    #[test]
    fn bad_fields_are_named() {
        let now = SystemTime::now();
        let e = Scope::read(pairs(&[("colour", "red")]), now).unwrap_err();
        assert!(e.message.contains("\"colour\""), "{}", e.message);
        let e = Scope::read(pairs(&[("tag", "campaign")]), now).unwrap_err();
        assert!(e.message.contains("NAME=value"), "{}", e.message);
        let s = Scope::read(pairs(&[("page", "two")]), now).unwrap();
        assert!(s.number("page", 1).unwrap_err().message.contains("\"two\""));
    }
}
