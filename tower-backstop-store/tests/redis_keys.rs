//! The Redis store's keys: every key of one store under its hash tag, so in one Cluster slot;
//! another prefix, another slot; a Cluster's nodes each holding whole stores; the keys of a
//! version before the hash tag renamed once; and a plain server refused as a Cluster. Against a
//! real server and a real Cluster (see `tests/conformance.rs` for how they are found).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use backstop_test_support::{Service, Tests, redis_cluster_urls, redis_url};
use redis::cluster_routing::Slot;
use tower_backstop_store::{
    AuditAction, AuditEntry, ErrorEntry, Filter, FleetNote, Record, RedisStore, Status, Store,
};

fn record(id: &str, tag: &str) -> Record {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let mut r = Record::new(id, ErrorEntry::new(t, "transient", "http 503", "boom", 1));
    r.tags.insert("campaign".into(), tag.into());
    r
}

/// Writes records of every status, with tags, and an audit entry: a key of every kind.
async fn fill(store: &RedisStore) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let mut waiting = record("w-1", "spring");
    waiting.status = Status::Deferred;
    waiting.retry_at = Some(t);
    let mut claimed = record("c-1", "summer");
    claimed.status = Status::Deferred;
    claimed.retry_at = Some(t);
    let mut resolved = record("r-1", "spring");
    resolved.status = Status::Resolved;
    resolved.resolved_at = Some(t);
    store
        .put_many(vec![
            record("d-1", "spring"),
            record("d-2 {odd}", "summer"),
            waiting,
            claimed,
            resolved,
        ])
        .await
        .unwrap();
    let due = store
        .claim_due(t + Duration::from_secs(1), 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    store
        .append_audit(AuditEntry::new(AuditAction::Purge, "ops", &Filter::new()))
        .await
        .unwrap();
}

/// Puts a fleet note whose topic and author have braces: the notes' key.
async fn note(store: &RedisStore) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let note = FleetNote::new("breaker:{a}", "p-{1}", "{}", t, Duration::from_secs(5));
    store.put_note(note).await.unwrap();
}

/// The keys matching `pattern` on the server behind `conn`.
async fn keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> BTreeSet<Vec<u8>> {
    let mut cursor = 0u64;
    let mut out = BTreeSet::new();
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(conn)
            .await
            .unwrap();
        out.extend(batch);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn unique(what: &str) -> String {
    format!(
        "backstop-test:{what}:{}:{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

async fn every_key_of_a_store_is_under_its_hash_tag() {
    let a = unique("slots-a");
    // A second prefix whose tag hashes to another slot.
    let b = (0..)
        .map(|i| format!("{a}-{i}"))
        .find(|b| Slot::for_key(b) != Slot::for_key(&a))
        .unwrap();
    let mut conn = connection(&redis_url()).await;
    for prefix in [&a, &b] {
        let store = RedisStore::connect(&redis_url())
            .await
            .unwrap()
            .with_prefix(prefix.as_str());
        fill(&store).await;
        note(&store).await;
        let tagged = keys(&mut conn, &format!("{{{prefix}}}:*")).await;
        // 5 records, the time, retry and status indexes, the class, code, tag and dead ones,
        // the codes, the classes and the audit trail.
        assert!(tagged.len() >= 20, "{} keys", tagged.len());
        for key in &tagged {
            assert_eq!(
                Slot::for_key(key),
                Slot::for_key(prefix),
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        assert!(
            tagged.iter().any(|k| k.ends_with(b":rec:d-2 {odd}")),
            "a record key, whose id has braces, under the tag"
        );
        assert!(
            tagged.iter().any(|k| k.ends_with(b":notes")),
            "the notes' key under the tag"
        );
        assert!(keys(&mut conn, &format!("{prefix}:*")).await.is_empty());
    }
    assert_ne!(Slot::for_key(&a), Slot::for_key(&b));
}

/// A prefix that already holds a hash tag keeps its key names (those of the versions before the
/// tag was added).
async fn a_prefix_with_a_hash_tag_is_used_as_it_is() {
    let tag = unique("tagged");
    let prefix = format!("{{{tag}}}:dlq");
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(prefix.as_str());
    fill(&store).await;
    let mut conn = connection(&redis_url()).await;
    let named = keys(&mut conn, &format!("{prefix}:*")).await;
    assert!(named.len() >= 20, "{} keys", named.len());
    assert!(
        named
            .iter()
            .all(|k| Slot::for_key(k) == Slot::for_key(&tag))
    );
    assert_eq!(store.rename_untagged_keys().await.unwrap(), 0);
}

/// A store written by a version before the hash tag (its keys `prefix:…`) looks empty, and
/// holds everything again once its keys are renamed; a second rename renames nothing.
async fn untagged_keys_are_renamed_once() {
    let prefix = unique("rename");
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(prefix.as_str());
    fill(&store).await;
    // Every record, the resolved one too (`list` shows the outstanding ones only).
    let every = Filter::new();
    let before = store.search(&every, 0..100).await.unwrap();
    let counts_before = store.counts(SystemTime::UNIX_EPOCH).await.unwrap();
    assert_eq!(before.len(), 5);
    // Back to the old names, as the version before the tag wrote them.
    let mut conn = connection(&redis_url()).await;
    let tagged = keys(&mut conn, &format!("{{{prefix}}}:*")).await;
    for key in &tagged {
        let mut old = prefix.as_bytes().to_vec();
        old.extend_from_slice(&key[prefix.len() + 2..]);
        let () = redis::cmd("RENAME")
            .arg(key)
            .arg(old)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // A key of another store whose prefix starts with this one is not touched.
    let other = format!("{prefix}:tenant2:time");
    let () = redis::cmd("ZADD")
        .arg(&other)
        .arg(1)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        store.search(&every, 0..100).await.unwrap().is_empty(),
        "looks empty"
    );

    let renamed = store.rename_untagged_keys().await.unwrap();
    assert_eq!(renamed, tagged.len() as u64);
    assert_eq!(store.search(&every, 0..100).await.unwrap(), before);
    let counts = store.counts(SystemTime::UNIX_EPOCH).await.unwrap();
    assert_eq!(
        (counts.total, counts.deferred, counts.by_class),
        (
            counts_before.total,
            counts_before.deferred,
            counts_before.by_class
        )
    );
    let spring = store
        .search(&Filter::new().tag("campaign", "spring"), 0..10)
        .await
        .unwrap();
    assert_eq!(spring.len(), 3);
    assert_eq!(store.audit(0..10).await.unwrap().len(), 1);
    assert_eq!(store.rename_untagged_keys().await.unwrap(), 0);
    assert_eq!(keys(&mut conn, &other).await.len(), 1, "not renamed");

    // Records under both names: refused, nothing renamed.
    let () = redis::cmd("ZADD")
        .arg(format!("{prefix}:time"))
        .arg(1)
        .arg("old")
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = store.rename_untagged_keys().await.unwrap_err();
    assert!(
        refused.to_string().contains("already holds records"),
        "{refused}"
    );
}

/// Against the Cluster: each store's keys are all on one node, and stores whose tags hash to
/// different nodes' slots are on those nodes.
async fn each_store_of_a_cluster_is_on_the_node_of_its_slot() {
    let urls = redis_cluster_urls();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    // The slot ranges of each node, from the node itself.
    let mut ranges: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    let mut first = connection(&urls[0]).await;
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut first)
        .await
        .unwrap();
    for entry in slots {
        let redis::Value::Array(parts) = entry else {
            panic!("{entry:?}")
        };
        let (start, end): (i64, i64) = (
            redis::FromRedisValue::from_redis_value(parts[0].clone()).unwrap(),
            redis::FromRedisValue::from_redis_value(parts[1].clone()).unwrap(),
        );
        let redis::Value::Array(node) = &parts[2] else {
            panic!("{parts:?}")
        };
        let port: i64 = redis::FromRedisValue::from_redis_value(node[1].clone()).unwrap();
        ranges
            .entry(format!("redis://127.0.0.1:{port}"))
            .or_default()
            .push((start, end));
    }
    assert!(
        ranges.len() >= 2,
        "a cluster of several masters: {ranges:?}"
    );
    let base = unique("cluster");
    for (node, node_ranges) in &ranges {
        // A prefix whose tag's slot this node serves.
        let mut conn = connection(node).await;
        let prefix = (0..)
            .map(|i| format!("{base}-{i}"))
            .find(|p| {
                let slot = crc16_slot(p);
                node_ranges.iter().any(|(s, e)| (*s..=*e).contains(&slot))
            })
            .unwrap();
        let store = RedisStore::connect_cluster(&refs)
            .await
            .unwrap()
            .with_prefix(prefix.as_str());
        fill(&store).await;
        note(&store).await;
        // Every record, the resolved one too (`list` shows the outstanding ones only).
        assert_eq!(store.search(&Filter::new(), 0..10).await.unwrap().len(), 5);
        let here = keys(&mut conn, &format!("{{{prefix}}}:*")).await;
        assert!(here.len() >= 20, "{node}: {} keys", here.len());
        assert!(here.iter().any(|k| k.ends_with(b":notes")), "{node}: notes");
        for other in ranges.keys().filter(|n| *n != node) {
            let mut conn = connection(other).await;
            assert!(keys(&mut conn, &format!("{{{prefix}}}:*")).await.is_empty());
        }
        assert!(
            store.to_string().starts_with("redis cluster redis://"),
            "{store}"
        );
    }
}

/// The slot of a hash tag, as Redis computes it (CRC16/XMODEM modulo 16384): what
/// `CLUSTER KEYSLOT` answers.
fn crc16_slot(tag: &str) -> i64 {
    let mut crc: u16 = 0;
    for byte in tag.as_bytes() {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    i64::from(crc % 16_384)
}

/// A plain server is refused as a Cluster; no URL is refused; the password never shows.
async fn a_plain_server_is_not_a_cluster() {
    let error = RedisStore::connect_cluster(&[&redis_url()])
        .await
        .unwrap_err();
    assert!(error.to_string().contains("cluster"), "{error}");
    let none = RedisStore::connect_cluster(&[]).await.unwrap_err();
    assert!(none.to_string().contains("at least one"), "{none}");
}

async fn a_cluster_password_never_shows() {
    let error = RedisStore::connect_cluster(&["redis://:hunter2@127.0.0.1:1"])
        .await
        .unwrap_err();
    let text = format!("{error} {error:?} {:?}", std::error::Error::source(&error));
    assert!(!text.contains("hunter2"), "{text}");
}

/// Dead, deferred and resolved records of two classes.
async fn fill_counted(store: &RedisStore) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let mut records = Vec::new();
    for i in 0..3 {
        records.push(record(&format!("d-{i}"), "spring"));
    }
    for i in 0..4 {
        let mut r = record(&format!("w-{i}"), "spring");
        r.class = "circuit_open".into();
        r.status = Status::Deferred;
        r.retry_at = Some(t);
        records.push(r);
    }
    for i in 0..2 {
        let mut r = record(&format!("r-{i}"), "spring");
        r.status = Status::Resolved;
        r.resolved_at = Some(t);
        records.push(r);
    }
    store.put_many(records).await.unwrap();
}

/// An index set changed by hand (a member removed, one added) is a drift the check reports,
/// expected and found, and repairs when asked; the deferred records of a class are counted off
/// their set, so the count is right again after the repair.
async fn a_counter_set_changed_by_hand_is_reported_and_repaired() {
    let prefix = unique("counts-drift");
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(prefix.as_str());
    fill_counted(&store).await;
    let held = Filter::new().status(Status::Deferred).class("circuit_open");
    assert_eq!(store.count(&held).await.unwrap(), 4);
    assert!(store.check_counts(false).await.unwrap().is_clean());
    let mut conn = connection(&redis_url()).await;
    let () = redis::pipe()
        .cmd("ZREM")
        .arg(format!("{{{prefix}}}:deferred:class:circuit_open"))
        .arg("w-0")
        .ignore()
        .cmd("ZADD")
        .arg(format!("{{{prefix}}}:dead:code:http 503"))
        .arg(0)
        .arg("ghost")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(store.count(&held).await.unwrap(), 3, "read off the set");
    let found = store.check_counts(false).await.unwrap();
    assert!(!found.repaired);
    let drifts: Vec<_> = found
        .drifts
        .iter()
        .map(|d| {
            (
                d.status,
                d.class.as_deref(),
                d.code.as_deref(),
                d.expected,
                d.found,
            )
        })
        .collect();
    assert_eq!(
        drifts,
        [
            (Status::Dead, None, Some("http 503"), 3, 4),
            (Status::Deferred, Some("circuit_open"), None, 4, 3),
        ]
    );
    let repaired = store.check_counts(true).await.unwrap();
    assert!(repaired.repaired);
    assert_eq!(repaired.drifts, found.drifts);
    assert!(store.check_counts(false).await.unwrap().is_clean());
    assert_eq!(store.count(&held).await.unwrap(), 4);
}

/// A store written before the sets by status and class (here: its set of deferred records of
/// a class gone, and the store not marked counted) counts by reading its records, which the
/// check finds drifted; once repaired, it counts off the sets again.
async fn a_store_written_before_the_sets_is_counted_from_its_records_until_repaired() {
    let prefix = unique("counts-before");
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(prefix.as_str());
    fill_counted(&store).await;
    let mut conn = connection(&redis_url()).await;
    let () = redis::pipe()
        .cmd("DEL")
        .arg(format!("{{{prefix}}}:deferred:class:circuit_open"))
        .arg(format!("{{{prefix}}}:counted"))
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let held = Filter::new().status(Status::Deferred).class("circuit_open");
    assert_eq!(
        store.count(&held).await.unwrap(),
        4,
        "read from the records"
    );
    let found = store.check_counts(false).await.unwrap();
    assert_eq!(found.drifts.len(), 1, "{found:?}");
    assert_eq!((found.drifts[0].expected, found.drifts[0].found), (4, 0));
    assert!(store.check_counts(true).await.unwrap().repaired);
    let marked: bool = redis::cmd("EXISTS")
        .arg(format!("{{{prefix}}}:counted"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(marked, "marked counted once repaired");
    assert_eq!(store.count(&held).await.unwrap(), 4);
}

fn main() {
    let mut tests = Tests::new();
    tests.current(
        "a_cluster_password_never_shows",
        a_cluster_password_never_shows,
    );
    tests.needs(Service::Redis).current(
        "every_key_of_a_store_is_under_its_hash_tag",
        every_key_of_a_store_is_under_its_hash_tag,
    );
    tests.needs(Service::Redis).current(
        "a_prefix_with_a_hash_tag_is_used_as_it_is",
        a_prefix_with_a_hash_tag_is_used_as_it_is,
    );
    tests.needs(Service::Redis).current(
        "untagged_keys_are_renamed_once",
        untagged_keys_are_renamed_once,
    );
    tests.needs(Service::Redis).current(
        "a_plain_server_is_not_a_cluster",
        a_plain_server_is_not_a_cluster,
    );
    tests.needs(Service::Redis).current(
        "a_counter_set_changed_by_hand_is_reported_and_repaired",
        a_counter_set_changed_by_hand_is_reported_and_repaired,
    );
    tests.needs(Service::Redis).current(
        "a_store_written_before_the_sets_is_counted_from_its_records_until_repaired",
        a_store_written_before_the_sets_is_counted_from_its_records_until_repaired,
    );
    tests.needs(Service::RedisCluster).current(
        "each_store_of_a_cluster_is_on_the_node_of_its_slot",
        each_store_of_a_cluster_is_on_the_node_of_its_slot,
    );
    tests.run();
}
