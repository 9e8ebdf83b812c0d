//! The check of a [`RedisStore`](super::RedisStore)'s index sets by status (alone, by class, by
//! code) against its records: what [`Store::check_counts`](crate::Store::check_counts) does.

use std::collections::{BTreeMap, BTreeSet};

use super::{COUNTED, RedisStore, redis_error};
use crate::StoreError;
use crate::check::{CountKey, CountsCheck};
use crate::query::Filter;
use crate::record::{Status, to_millis};

/// How many members one `ZADD` of a repair writes at most.
const ZADD_CHUNK: usize = 1_000;

const STATUSES: [Status; 4] = [
    Status::Dead,
    Status::Deferred,
    Status::InFlight,
    Status::Resolved,
];

/// The index set (after the store's hash tag) that counts `key`.
fn set_of(key: &CountKey) -> String {
    let status = key.0.as_str();
    match (&key.1, &key.2) {
        (Some(class), _) => format!("{status}:class:{class}"),
        (None, Some(code)) => format!("{status}:code:{code}"),
        (None, None) => format!("{status}:time"),
    }
}

impl RedisStore {
    /// Reads every record and counts, for each status, its records by class, by code and in
    /// all; compares those with the sizes of the index sets (`ZCARD`); with `repair`, writes
    /// each drifted set again from the records read (`DEL`, then `ZADD`, in one `MULTI`). A
    /// check that ends with every set right marks the store counted ([`COUNTED`]), so that
    /// [`count`](crate::Store::count) reads the sets of the deferred, in-flight and resolved
    /// records by class and code from then on.
    pub(super) async fn check_index_sets(&self, repair: bool) -> Result<CountsCheck, StoreError> {
        let records = self.matching(&Filter::new()).await?;
        let mut members: BTreeMap<CountKey, Vec<(i64, String)>> = BTreeMap::new();
        for r in &records {
            let ms = to_millis(r.last_failed_at);
            for key in [
                (r.status, Some(r.class.clone()), None),
                (r.status, None, Some(r.code.clone())),
                (r.status, None, None),
            ] {
                members.entry(key).or_default().push((ms, r.id.clone()));
            }
        }
        let mut conn = self.conn.clone();
        let (classes, codes): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("SMEMBERS")
            .arg(self.key("classes"))
            .cmd("HKEYS")
            .arg(self.key("codes"))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("check counts"))?;
        let mut keys: BTreeSet<CountKey> = members.keys().cloned().collect();
        for status in STATUSES {
            keys.insert((status, None, None));
            keys.extend(classes.iter().map(|c| (status, Some(c.clone()), None)));
            keys.extend(codes.iter().map(|c| (status, None, Some(c.clone()))));
        }
        let keys: Vec<CountKey> = keys.into_iter().collect();
        let mut sizes = redis::pipe();
        for key in &keys {
            sizes.cmd("ZCARD").arg(self.key(&set_of(key)));
        }
        let sizes: Vec<i64> = sizes
            .query_async(&mut conn)
            .await
            .map_err(redis_error("check counts"))?;
        let expected: BTreeMap<CountKey, u64> = members
            .iter()
            .map(|(k, m)| (k.clone(), m.len() as u64))
            .collect();
        let found: BTreeMap<CountKey, i64> = keys.into_iter().zip(sizes).collect();
        let mut check = CountsCheck::compare(&expected, &found);
        if repair && !check.is_clean() {
            let mut write = redis::pipe();
            write.atomic();
            for d in &check.drifts {
                let key = (d.status, d.class.clone(), d.code.clone());
                let set = self.key(&set_of(&key));
                write.cmd("DEL").arg(&set).ignore();
                for chunk in members
                    .get(&key)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .chunks(ZADD_CHUNK)
                {
                    write.cmd("ZADD").arg(&set).arg(chunk).ignore();
                }
            }
            let () = write
                .query_async(&mut conn)
                .await
                .map_err(redis_error("repair counts"))?;
            check.repaired = true;
        }
        if check.is_clean() || check.repaired {
            let () = redis::cmd("SET")
                .arg(self.key(COUNTED))
                .arg("1")
                .query_async(&mut conn)
                .await
                .map_err(redis_error("check counts"))?;
        }
        Ok(check)
    }
}
