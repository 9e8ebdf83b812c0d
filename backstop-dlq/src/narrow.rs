//! What a store's [`Filter`] cannot say, applied here: the records' host and a group.
//!
//! Both are read off the records themselves (the host from the stored URI, the group from the
//! fingerprint), so they narrow the newest [`GROUP_LIMIT`] records that match the filter, like
//! the groups page.

use tower_backstop::store::{Filter, Record, Store, StoreError};

use super::GROUP_LIMIT;
use super::fingerprint::Fingerprint;
use super::host;

/// A host (`host` filter key) and a group (`group=` fingerprint key), each optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Narrow {
    /// The wanted host, [normalised](host::normalise).
    pub(crate) host: Option<String>,
    /// A group's fingerprint key.
    pub(crate) group: Option<String>,
}

impl Narrow {
    /// Whether it narrows nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.host.is_none() && self.group.is_none()
    }

    /// Whether `record` is of the host and of the group.
    pub(crate) fn keeps(&self, record: &Record) -> bool {
        let host_ok = self
            .host
            .as_deref()
            .is_none_or(|wanted| host::of(record).is_some_and(|h| host::matches(&h, wanted)));
        host_ok
            && self
                .group
                .as_deref()
                .is_none_or(|key| Fingerprint::of(record).key() == key)
    }

    /// Takes the `host=NAME` pairs out of `pairs` (the last one wins); the rest are the store
    /// filter's.
    ///
    /// # Errors
    ///
    /// A message naming the `host` key when its value is empty.
    pub(crate) fn split_host<S: AsRef<str>>(
        pairs: &[S],
    ) -> Result<(Vec<String>, Option<String>), String> {
        let mut rest = Vec::new();
        let mut wanted = None;
        for pair in pairs {
            match pair.as_ref().split_once('=') {
                Some(("host", value)) if value.trim().is_empty() => {
                    return Err(
                        "filter host: empty (give a host, api.mail.test or api.mail.test:443)"
                            .to_owned(),
                    );
                }
                Some(("host", value)) => wanted = Some(host::normalise(value)),
                _ => rest.push(pair.as_ref().to_owned()),
            }
        }
        Ok((rest, wanted))
    }
}

/// The records of `narrow` among the newest [`GROUP_LIMIT`] that match `filter`, the most
/// recently failed first.
pub(crate) async fn members(
    store: &dyn Store,
    filter: &Filter,
    narrow: &Narrow,
) -> Result<Vec<Record>, StoreError> {
    let mut records = store.search(filter, 0..GROUP_LIMIT).await?;
    records.retain(|r| narrow.keeps(r));
    Ok(records)
}

/// The filter an action applies to: `filter`, narrowed to the ids of [`members`] when `narrow`
/// says something. `None` when it selects no record: then there is nothing to act on, and never
/// the wider filter.
pub(crate) async fn action_filter(
    store: &dyn Store,
    filter: &Filter,
    narrow: &Narrow,
) -> Result<Option<Filter>, StoreError> {
    if narrow.is_empty() {
        return Ok(Some(filter.clone()));
    }
    let members = members(store, filter, narrow).await?;
    if members.is_empty() {
        return Ok(None);
    }
    let mut narrowed = filter.clone();
    narrowed.ids = members.into_iter().map(|r| r.id).collect();
    Ok(Some(narrowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_pair_is_taken_out() {
        let (rest, host) =
            Narrow::split_host(&["class=throttled", "host=API.test", "tag.a=b"]).unwrap();
        assert_eq!(rest, ["class=throttled", "tag.a=b"]);
        assert_eq!(host.as_deref(), Some("api.test"));
        let e = Narrow::split_host(&["host= "]).unwrap_err();
        assert!(e.contains("filter host: empty"), "{e}");
    }
}
