//! Decoding never panics: whatever bytes a store holds (a record written by an older version, by
//! hand, or by another tool), reading it gives a record or a clear error. Property tests feed
//! arbitrary stored bytes and JSON to the record decoder of each store: the JSON form (what Redis
//! stores and the CLI exports), SQLite rows of any column types, and Redis hashes of any bytes.
//! The memory store keeps records as values and decodes nothing.
//!
//! Also: credentials in store URLs never show in `Debug`, `Display` or errors.

mod redis_support;

use std::time::{Duration, SystemTime};

use backstop_test_support::Tests;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tower_backstop::dead_letter::record_of;
use tower_backstop::store::{Filter, Record, Store, redact_url};
use tower_backstop::{Class, Code, Envelope, Failure};

fn valid_json() -> serde_json::Value {
    let f: Failure = Failure::new(Class::TRANSIENT, Code::Timeout);
    let r = record_of(
        "m-1".into(),
        Envelope::new(vec![0u8, 255, 7]).with_metadata("method", "POST"),
        &f,
    );
    serde_json::to_value(&r).unwrap()
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        ".*".prop_map(serde_json::Value::from),
        "(utf8:|hex:)[0-9a-fA-F€ ]{0,9}".prop_map(serde_json::Value::from),
        "[0-9]{1,6}-[0-9]{2}-[0-9]{2}T[0-9:.]{0,14}Z?".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Reading a record back and using it (re-encoding, rebuilding a request) never panics.
fn use_record(record: &Record) {
    let _ = serde_json::to_vec(record);
    let _ = tower_backstop::resend::http_request(record, None);
    let _ = format!("{record:?}");
}

proptest! {
    #![proptest_config(Config::with_cases(512))]

    fn arbitrary_bytes_never_panic_the_json_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(record) = serde_json::from_slice::<Record>(&bytes) {
            use_record(&record);
        }
    }

    fn any_field_of_any_json_never_panics_the_json_decoder(
        field in prop_oneof![
            Just("id"), Just("tags"), Just("class"), Just("code"), Just("message"),
            Just("attempts"), Just("budget_spent"), Just("first_failed_at"),
            Just("last_failed_at"), Just("retry_at"), Just("status"), Just("resends"),
            Just("resolved_at"), Just("history"), Just("payload"), Just("payload_truncated"),
            Just("payload_len"), Just("content_type"), Just("metadata"), Just("headers"),
            Just("redacted_headers"),
        ],
        value in any_json(),
        drop in any::<bool>(),
    ) {
        let mut json = valid_json();
        let map = json.as_object_mut().unwrap();
        if drop {
            map.remove(field);
        } else {
            map.insert(field.to_owned(), value);
        }
        let text = serde_json::to_vec(&json).unwrap();
        if let Ok(record) = serde_json::from_slice::<Record>(&text) {
            use_record(&record);
        }
    }
}

fn a_hex_payload_with_a_multibyte_character_is_an_error() {
    let mut json = valid_json();
    json["payload"] = "hex:a€".into();
    let err = serde_json::from_value::<Record>(json).unwrap_err();
    assert!(err.to_string().contains("hex"), "{err}");
}

fn times_past_the_year_9999_read_back_as_its_end() {
    let mut json = valid_json();
    json["retry_at"] = "9999-12-31T23:59:59.999Z".into();
    let r: Record = serde_json::from_value(json).unwrap();
    assert!(
        serde_json::to_string(&r)
            .unwrap()
            .contains("9999-12-31T23:59:59.999Z")
    );
    let mut r2 = r.clone();
    r2.last_failed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 50);
    // Written clamped to the last millisecond RFC 3339 can say, not an error or a panic.
    let text = serde_json::to_string(&r2).unwrap();
    assert!(
        text.contains("\"last_failed_at\":\"9999-12-31T23:59:59.999Z\""),
        "{text}"
    );
}

fn any_sql_value() -> impl Strategy<Value = rusqlite::types::Value> {
    use rusqlite::types::Value;
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Integer),
        prop_oneof![Just(i64::MIN), Just(-1i64), Just(0), Just(i64::MAX)].prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Real),
        ".{0,12}".prop_map(Value::Text),
        prop_oneof![
            Just("dead"),
            Just("deferred"),
            Just("in_flight"),
            Just("[]"),
            Just("{}")
        ]
        .prop_map(|s| Value::Text(s.to_owned())),
        any_json().prop_map(|j| Value::Text(j.to_string())),
        any_json().prop_map(|j| Value::Text(j.to_string())),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Value::Blob),
    ]
}

/// Rows with any value of any type in every column (SQLite's columns are not strictly typed):
/// every read of the store gives records or errors.
fn arbitrary_sqlite_rows_never_panic_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl.db");
    let store = tower_backstop::store::SqliteStore::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config::with_cases(256));
    runner
        .run(&proptest::collection::vec(any_sql_value(), 21), |values| {
            raw.execute("DELETE FROM dead_letters", []).unwrap();
            let mut values = values;
            values[0] = rusqlite::types::Value::Text("row".into());
            let marks = (1..=21)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            // A null in a NOT NULL column is refused by SQLite itself: nothing to read then.
            if raw
                .execute(
                    &format!("INSERT INTO dead_letters VALUES ({marks})"),
                    rusqlite::params_from_iter(values),
                )
                .is_err()
            {
                return Ok(());
            }
            rt.block_on(read_everything(&store, "row"));
            Ok(())
        })
        .unwrap();
}

/// Every way a store reads records.
async fn read_everything(store: &dyn Store, id: &str) {
    if let Ok(Some(record)) = store.get(id).await {
        use_record(&record);
        let _ = store.claim(&record, SystemTime::now()).await;
    }
    let _ = store.search(&Filter::new().class("x"), 0..5).await;
    if let Ok(records) = store.list(5).await {
        records.iter().for_each(use_record);
    }
    let _ = store.counts(SystemTime::UNIX_EPOCH).await;
    let _ = store.budget_spent(id).await;
    let _ = store
        .claim_due(SystemTime::now(), 5, Duration::from_secs(1))
        .await;
    // A new failure of the same id merges into what is stored, or fails clearly.
    let f: Failure = Failure::new(Class::TRANSIENT, Code::Timeout);
    let _ = store
        .put(record_of(id.to_owned(), Envelope::new("x"), &f))
        .await;
}

/// Redis hashes holding any bytes in the record's fields.
#[cfg(feature = "redis")]
fn arbitrary_redis_hashes_never_panic_the_reader() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(redis_support::redis_store("decode"));
    let client = redis::Client::open(redis_support::redis_url()).unwrap();
    let conn = rt
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    let bytes = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        any_json().prop_map(|j| j.to_string().into_bytes()),
        any_json().prop_map(|j| {
            let mut json = valid_json();
            json["history"] = j;
            json.to_string().into_bytes()
        }),
    ];
    let mut runner = TestRunner::new(Config::with_cases(128));
    runner
        .run(
            &(bytes, ".{0,4}", ".{0,4}", any::<bool>()),
            |(json, version, budget, index)| {
                let key = format!("{{{}}}:rec:row", store.prefix());
                let mut conn = conn.clone();
                rt.block_on(async {
                    let () = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    let () = redis::cmd("HSET")
                        .arg(&key)
                        .arg("json")
                        .arg(&json)
                        .arg("v")
                        .arg(&version)
                        .arg("b")
                        .arg(&budget)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    if index {
                        for set in ["time", "retry", "class:x"] {
                            let () = redis::cmd("ZADD")
                                .arg(format!("{{{}}}:{set}", store.prefix()))
                                .arg(0)
                                .arg("row")
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                        }
                    }
                    read_everything(&store, "row").await;
                });
                Ok(())
            },
        )
        .unwrap();
}

fn urls_lose_their_credentials() {
    for (url, shown) in [
        ("redis://:hunter2@db:6379/2", "redis://***@db:6379/2"),
        (
            "rediss://admin:hunter2@db.example:6380",
            "rediss://***@db.example:6380",
        ),
        ("redis://a@b:hunter2@db/0", "redis://***@db/0"),
        (
            "redis://db:6379/0?password=x",
            "redis://db:6379/0?password=x",
        ),
        ("redis:/:hunter2@db", "***@db"),
        ("redis://db/x@y", "redis://db/x@y"),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}

#[cfg(feature = "redis")]
async fn redis_store_urls_never_show_the_password() {
    use tower_backstop::store::RedisStore;
    // A malformed URL.
    let err = RedisStore::connect("redis://:hunter2@db:notaport/0")
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("***@db"), "{text}");
    // Nobody listening.
    let err = RedisStore::connect_with_timeouts(
        "redis://user:hunter2@127.0.0.1:1/0",
        Some(Duration::from_millis(200)),
        Some(Duration::from_millis(200)),
    )
    .await
    .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("hunter2"), "{text}");
}

/// A store that connected: `Debug` and `Display`.
#[cfg(feature = "redis")]
async fn a_connected_redis_store_never_shows_the_password() {
    use tower_backstop::store::RedisStore;
    // A store that connected: `Debug` and `Display`. Redis accepts any password when it has
    // none set (`AUTH` fails, so use the default user's name only when Redis has no password).
    let store = redis_support::redis_store("redacted").await;
    for text in [format!("{store:?}"), format!("{store}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    let url = redis_support::redis_url().replace("redis://", "redis://default:hunter2@");
    if let Ok(store) = RedisStore::connect(&url).await {
        for text in [format!("{store:?}"), format!("{store}")] {
            assert!(!text.contains("hunter2") && text.contains("***@"), "{text}");
        }
    }
}

fn main() {
    let mut tests = Tests::new();
    tests.sync(
        "arbitrary_bytes_never_panic_the_json_decoder",
        arbitrary_bytes_never_panic_the_json_decoder,
    );
    tests.sync(
        "any_field_of_any_json_never_panics_the_json_decoder",
        any_field_of_any_json_never_panics_the_json_decoder,
    );
    tests.sync(
        "a_hex_payload_with_a_multibyte_character_is_an_error",
        a_hex_payload_with_a_multibyte_character_is_an_error,
    );
    tests.sync(
        "times_past_the_year_9999_read_back_as_its_end",
        times_past_the_year_9999_read_back_as_its_end,
    );
    tests.sync(
        "arbitrary_sqlite_rows_never_panic_the_reader",
        arbitrary_sqlite_rows_never_panic_the_reader,
    );
    #[cfg(feature = "redis")]
    tests.needs(backstop_test_support::Service::Redis).sync(
        "arbitrary_redis_hashes_never_panic_the_reader",
        arbitrary_redis_hashes_never_panic_the_reader,
    );
    tests.sync("urls_lose_their_credentials", urls_lose_their_credentials);
    #[cfg(feature = "redis")]
    tests.current(
        "redis_store_urls_never_show_the_password",
        redis_store_urls_never_show_the_password,
    );
    #[cfg(feature = "redis")]
    tests.needs(backstop_test_support::Service::Redis).current(
        "a_connected_redis_store_never_shows_the_password",
        a_connected_redis_store_never_shows_the_password,
    );
    tests.run();
}
