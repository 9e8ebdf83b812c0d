//! [`CountsCheck`]: what [`Store::check_counts`](super::Store::check_counts) found when it
//! recounted the records and compared the recount with the store's counters.

use std::collections::BTreeMap;

use super::record::Status;

/// One key of a store's counters: the records of one status, class and original code (`None`:
/// of every class, of every code).
pub(crate) type CountKey = (Status, Option<String>, Option<String>);

/// A counter that disagreed with a recount of the records: the records of one
/// [`status`](CountDrift::status), [`class`](CountDrift::class) and original
/// [`code`](CountDrift::code), how many there are ([`expected`](CountDrift::expected)) and
/// what the counter said ([`found`](CountDrift::found)). A counter the store lacks for records
/// it holds is found at 0.
///
/// SQLite and Postgres count by status, class and code together: both are set. Redis keeps its
/// counters (index sets) by status and class, by status and code, and by status alone, apart:
/// a drift of one of those names the class alone, the code alone, or neither.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CountDrift {
    /// The status of the records counted.
    pub status: Status,
    /// Their class name; `None`: a counter of every class.
    pub class: Option<String>,
    /// Their original code as displayed (`http 503`); `None`: a counter of every code.
    pub code: Option<String>,
    /// How many records of that status, class and code the store holds: the recount.
    pub expected: u64,
    /// What the counter said: never negative (the stores never let a counter go below 0; one
    /// that would have is a drift, found at 0).
    pub found: u64,
}

/// What [`Store::check_counts`](super::Store::check_counts) found: how many keys of the
/// counters it compared with a recount of the records, every one that
/// [`drifted`](CountsCheck::drifts), and whether it [`repaired`](CountsCheck::repaired) them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CountsCheck {
    /// How many keys (status × class × code) the check compared: every key with a record or a
    /// counter. 0 for a store that keeps no counters (its counts read the records themselves).
    pub keys: u64,
    /// The keys whose counter disagreed with the recount, in order of status, class and code.
    pub drifts: Vec<CountDrift>,
    /// Whether the drifted counters were set to the recount (asked for and done). `false`
    /// when there was nothing to repair.
    pub repaired: bool,
}

impl CountsCheck {
    /// Compares `expected` (the recount) with `found` (the counters) over the keys of
    /// either, and notes every key where they differ. A negative counter is found at 0.
    pub(crate) fn compare(
        expected: &BTreeMap<CountKey, u64>,
        found: &BTreeMap<CountKey, i64>,
    ) -> CountsCheck {
        let mut keys: Vec<&CountKey> = expected.keys().chain(found.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut drifts = Vec::new();
        for key in &keys {
            let want = expected.get(*key).copied().unwrap_or(0);
            let have = found.get(*key).copied().unwrap_or(0);
            if i64::try_from(want).ok() != Some(have) {
                let (status, class, code) = (*key).clone();
                drifts.push(CountDrift {
                    status,
                    class,
                    code,
                    expected: want,
                    found: u64::try_from(have).unwrap_or(0),
                });
            }
        }
        CountsCheck {
            keys: keys.len() as u64,
            drifts,
            repaired: false,
        }
    }

    /// Whether every counter agreed with the recount.
    pub fn is_clean(&self) -> bool {
        self.drifts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_either_side_are_compared_and_negatives_read_as_zero() {
        let key = |s, c: &str| (s, Some(c.to_owned()), Some("http 503".to_owned()));
        let expected = BTreeMap::from([(key(Status::Dead, "a"), 3), (key(Status::Dead, "b"), 1)]);
        let found = BTreeMap::from([
            (key(Status::Dead, "a"), 3),
            (key(Status::Dead, "b"), -2),
            (key(Status::Resolved, "a"), 4),
        ]);
        let check = CountsCheck::compare(&expected, &found);
        assert_eq!(check.keys, 3);
        assert_eq!(check.drifts.len(), 2);
        assert_eq!((check.drifts[0].expected, check.drifts[0].found), (1, 0));
        assert_eq!(check.drifts[1].status, Status::Resolved);
        assert_eq!((check.drifts[1].expected, check.drifts[1].found), (0, 4));
    }
}
