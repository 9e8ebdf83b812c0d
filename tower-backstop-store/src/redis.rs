use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, Value};

use super::lease::rounds;
use super::query::newest_first;
use super::query::{
    Change, Claim, Counts, Filter, change_if_unchanged, claim, claimable, top_first,
};
use super::record::{DEFAULT_HISTORY_LIMIT, Record, Status, add_clamped, from_millis, to_millis};
use super::schedule::{from_micros, gap_micros, to_micros};
use super::{
    AuditEntry, BoxFuture, CountsCheck, FleetNote, Lease, SortKey, Store, StoreError, redact_url,
};

mod counts;
mod keyset;
mod sentinel;

pub use self::sentinel::OpenSentinel;
use self::sentinel::SentinelConnection;

/// A dead-letter store in Redis, shared by many instances (feature `redis`): one server
/// ([`connect`](RedisStore::connect)), a Redis Cluster
/// ([`connect_cluster`](RedisStore::connect_cluster)), or the primary that Redis Sentinel names
/// ([`connect_sentinel`](RedisStore::connect_sentinel)), followed through failovers.
///
/// Layout: every key starts with the key prefix (`backstop:dlq` by default) as a Redis hash tag,
/// `{prefix}:`, so that every key of one store hashes to one Cluster slot and each script, which
/// touches a record's key with its index keys, runs there. Two stores with different prefixes
/// have different tags, so in a Cluster they are on different slots (and usually on different
/// nodes). A prefix that already holds a hash tag (`{team}:dlq`, as this store advised before it
/// wrapped the prefix itself) is used as it is: its keys keep their names.
///
/// | key | type | what |
/// |---|---|---|
/// | `{prefix}:rec:{id}` | hash | the record (field `json`), its version (field `v`) and its durable attempt count (field `b`) |
/// | `{prefix}:retry` | sorted set | ids of deferred and in-flight records, scored by retry-at (ms) |
/// | `{prefix}:time` | sorted set | every id, scored by last failure time (ms) |
/// | `{prefix}:class:{class}`, `{prefix}:code:{code}`, `{prefix}:tag:{key}={value}` | sorted sets | the indexes, scored by last failure time |
/// | `{prefix}:{status}:time`, `{prefix}:{status}:class:{class}`, `{prefix}:{status}:code:{code}` (`{status}`: `dead`, `deferred`, `in_flight`, `resolved`), `{prefix}:waiting:time` (deferred and in flight) | sorted sets | the indexes by status, alone, by class and by code, scored by last failure time: the counts |
/// | `{prefix}:counted` | string | present when every record is in the indexes by status and class or code (see below) |
/// | `{prefix}:codes` | hash | each code's first sighting (ms) |
/// | `{prefix}:classes` | set | every class name written (what [`counts`](Store::counts) walks) |
/// | `{prefix}:audit` | list | the audit trail, newest first |
/// | `{prefix}:slot:{schedule}` | string | a send schedule's next free time (µs), for [`reserve_slot`](Store::reserve_slot); expires a minute after it |
/// | `{prefix}:notes` | hash | the fleet's notes ([`put_note`](Store::put_note)): field = the topic's length in bytes, `:`, the topic and the author; value = the note as JSON (times in ms) |
///
/// Versions before the hash tag named the keys `prefix:…` (no braces); such a store looks empty
/// to this version until its keys are renamed once, with
/// [`rename_untagged_keys`](RedisStore::rename_untagged_keys). One hash tag puts the whole store
/// on one slot, so on one shard of a Cluster: the Cluster gives it failover and room beside
/// other data, not throughput beyond one node's.
///
/// Searches whose filter names at most one indexed condition (a class, a code or one tag) and
/// perhaps a time range, and no status or ids, read one page straight off that index
/// (`ZREVRANGEBYSCORE … LIMIT`, with the ties at the page's edges read whole so that the order,
/// newest first then by id, is exact): their cost grows with the page, not with the store. Other
/// filters read the narrowest index whole and filter the records.
///
/// Keyset pages ([`search_after`](Store::search_after),
/// [`search_waiting_after`](Store::search_waiting_after), behind `list_after`) read a sorted set
/// from their key on (`ZREVRANGEBYSCORE`/`ZRANGEBYSCORE … LIMIT`, the ties of a score read whole
/// and put in id order). Their cost grows with the page, not with how deep it is, when the set
/// holds exactly what the filter matches: the dead records (all, of one class, of one code), the
/// resolved ones, or a class, a code or one tag without a status, and for the waiting records
/// only the empty filter. Any other filter (a tag with a status, a class with a code, a status
/// of the waiting records, a class of them) reads the narrowest set from the key on, a round of
/// at least 64 ids at a time, until the page is full: a page costs as many records as the set
/// holds between two matches, and a filter that few records match reads many.
///
/// [`counts`](Store::counts) and
/// [`count_by_class`](Store::count_by_class) count the index sets (`ZCOUNT`) per class and
/// per code and read no record; so does [`count`](Store::count) for a filter of a status, a
/// class or a code, or a status with a class or a code (the deferred records of the class
/// `circuit_open`), with a time range or not.
///
/// The write script keeps the indexes by status with the record, in the same script. A store
/// whose first record this version wrote is marked `counted`; one written by an earlier
/// version (whose records are not in the sets of the deferred, in-flight and resolved records
/// by class and code) counts those filters by reading the records until
/// [`check_counts`](Store::check_counts) with `repair` has written the sets again from the
/// records and marked it. The check reads every record (a few seconds per million), then the
/// size of each set (`ZCARD`); the two are not one snapshot, so a drift it reports while
/// writes go on may be a write made in between: check again. Its repair writes each drifted
/// set again in one `MULTI`.
///
/// Every write of a record is one Lua script that checks the record's version and writes the
/// record with its indexes, so a record, its attempt counts and its indexes change together, and
/// two instances that write the same id at once both land (the loser reads again and merges).
/// Claims ([`claim`](Store::claim), [`claim_due`](Store::claim_due)) are such versioned writes
/// too, made only if the record read is still claimable: of two claimers (re-drives, schedulers on
/// other instances) that read the same version, exactly one writes, and the other reads the
/// claim it lost to. A claim of due records first reserves them in one script, which moves each
/// one's entry in the retry index to the claim's end (so that the next claimer reads the next
/// records), then writes the claims together over the multiplexed connection.
/// [`put_many`](Store::put_many) sends a batch in one pipeline.
/// [`put_note`](Store::put_note) is one `HSET`, [`notes`](Store::notes) one `HGETALL`
/// filtered by expiry time; a read that finds expired notes deletes them (a script that deletes
/// each only if it is still the note read, so a newer one just written stays).
///
/// The connection to one server is the redis crate's `ConnectionManager`, re-established after
/// Redis restarts; the connection to a Cluster is the redis crate's cluster client, which follows
/// the Cluster's redirections and failovers; through Sentinel, one connection to the primary,
/// asked of the Sentinels again after the primary fails. The scripts are loaded again when a
/// server forgot them; calls made while Redis is down fail with a [`StoreError`].
///
/// A Redis without persistence that restarts comes back empty: run the store's Redis with
/// `appendonly yes` (`appendfsync everysec` may still lose about the last second of writes in a
/// crash). Replication is asynchronous: a write acknowledged by a primary that dies before a
/// replica has it is lost in the failover.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: String,
    /// What every key starts with: the prefix as a hash tag (see [`keyspace`]).
    keyspace: String,
    history_limit: usize,
    /// The server's URL, the Cluster's URLs, or the Sentinels' URLs, as given (with
    /// credentials).
    urls: Vec<String>,
}

/// A connection to one Redis server, to a Redis Cluster, or to the primary Sentinel names; cheap
/// to clone (each clone shares
/// the connection).
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
        }
    }
}

/// What every key of a store with `prefix` starts with (without the `:` that follows): the
/// prefix as a Redis hash tag, `{prefix}`, so that all the store's keys share one Cluster slot;
/// or the prefix itself when it already holds a hash tag (a `{`, then a `}` with something
/// between), whose keys then share that tag's slot.
///
/// A prefix that is empty or starts with `}` makes an empty tag, which Redis ignores: on one
/// server that store works as any other, but a Cluster refuses its scripts (`CROSSSLOT`).
fn keyspace(prefix: &str) -> String {
    if has_hash_tag(prefix) {
        prefix.to_owned()
    } else {
        format!("{{{prefix}}}")
    }
}

/// Whether `key` has a Redis Cluster hash tag: a `{`, and after it a `}` with at least one
/// character between (what Redis hashes instead of the whole key).
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// `redis {url} prefix {prefix}` for one server, `redis cluster {url},{url}… prefix {prefix}`
/// for a Cluster, `redis sentinel {url},{url}… master {name} prefix {prefix}` through Sentinel,
/// the URLs' credentials hidden ([`redact_url`]).
impl std::fmt::Display for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = self.shown_urls();
        match &self.conn {
            Connection::Single(_) => write!(f, "redis {urls} prefix {}", self.prefix),
            Connection::Cluster(_) => write!(f, "redis cluster {urls} prefix {}", self.prefix),
            Connection::Sentinel(c) => write!(
                f,
                "redis sentinel {urls} master {} prefix {}",
                c.master(),
                self.prefix
            ),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shown_urls())
            .field("cluster", &matches!(self.conn, Connection::Cluster(_)))
            .field("sentinel", &matches!(self.conn, Connection::Sentinel(_)))
            .field("prefix", &self.prefix)
            .field("history_limit", &self.history_limit)
            .finish_non_exhaustive()
    }
}

/// A redis error as text, with the URL's credentials (and the password alone, should the error
/// quote it) hidden: the source of connection errors, which must not print a password.
#[derive(Debug)]
struct RedactedError(String);

impl RedactedError {
    fn of(error: &redis::RedisError, url: &str) -> Self {
        RedactedError(RedactedError::of_text(&error.to_string(), url))
    }

    /// `text` with `url` redacted, and its password alone too.
    fn of_text(text: &str, url: &str) -> String {
        let mut text = text.replace(url, &redact_url(url));
        if let Some(secret) = password(url).filter(|p| !p.is_empty()) {
            text = text.replace(secret, "***");
        }
        text
    }
}

impl std::fmt::Display for RedactedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedactedError {}

/// The password of a `scheme://user:password@host` URL, if it has one.
fn password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let userinfo = &rest[..rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())].rfind('@')?];
    userinfo.split_once(':').map(|(_, p)| p)
}

/// Writes a record if its version is still the one read. KEYS: record, time index, retry index,
/// codes, classes, the mark of complete counts, then `ARGV[7]` index keys to leave, then index
/// keys to join. A write into an empty store (an empty time index) marks its counts complete:
/// every record it will hold is in the index sets by status and class or code. ARGV: expected version
/// (`''`: no record yet), id, json, last failure ms, retry-at ms (`''`: none), code (`''`: do
/// not note), count of index keys to leave, the code's first sighting ms, the budget spent, the
/// class.
const WRITE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then v = '' end
if v ~= ARGV[1] then return 0 end
local nv = 1
if v ~= '' then nv = tonumber(v) + 1 end
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('SET', KEYS[6], '1') end
redis.call('HSET', KEYS[1], 'json', ARGV[3], 'v', nv, 'b', ARGV[9])
local leave = tonumber(ARGV[7])
for i = 7, 6 + leave do redis.call('ZREM', KEYS[i], ARGV[2]) end
for i = 7 + leave, #KEYS do redis.call('ZADD', KEYS[i], ARGV[4], ARGV[2]) end
redis.call('SADD', KEYS[5], ARGV[10])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
else
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if ARGV[6] ~= '' then redis.call('HSETNX', KEYS[4], ARGV[6], ARGV[8]) end
return 1
";

/// Reserves a slot of a send schedule ([`Store::reserve_slot`]). KEYS: the schedule. ARGV: now
/// and the gap, in microseconds. Keeps the schedule's next free time (a minute past it, then the
/// key expires) and returns the slot reserved. Lua's numbers are doubles: exact for these
/// times, which are below 2^53 microseconds until the year 2255.
const RESERVE: &str = r"
local now = tonumber(ARGV[1])
local slot = tonumber(redis.call('GET', KEYS[1]) or '0')
if now > slot then slot = now end
local after = slot + tonumber(ARGV[2])
local ttl = math.floor((after - now) / 1000) + 60000
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', ttl)
return slot
";

/// Deletes the expired fleet notes a reader saw ([`Store::notes`]), each only if it is still
/// the note the reader saw (a writer may have put a new one since). KEYS: the notes' hash.
/// ARGV: field, value, field, value… Returns how many it deleted.
const PRUNE_NOTES: &str = r"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
";

/// Reserves the due records for a claim ([`Store::claim_due`]), atomically: the ids of the
/// retry index due at `now`, the earliest first, at most `limit`, each one's score moved to the
/// claim's end (so that no other claimer reads it while this one writes its claim), returned
/// with the record's JSON and version. KEYS: the retry index. ARGV: now and the claim's end in
/// milliseconds, the limit, the prefix of the records' keys (which share the index's hash
/// tag, so they live on its node of a Redis Cluster). Returns id, json, version, id, …
const RESERVE_DUE: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local rec = redis.call('HMGET', ARGV[4] .. id, 'json', 'v')
  if rec[1] then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    out[#out + 1] = id
    out[#out + 1] = rec[1]
    out[#out + 1] = rec[2] or ''
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
";

/// Where a record's index entries were when it was read: the keys of the sets that hold its
/// id, and the score they hold it at (its last failure). What a write that replaces the record
/// leaves, kept instead of the record itself.
struct Indexed {
    keys: Vec<String>,
    last_failed_at: SystemTime,
}

/// How many expired notes one read deletes at most.
const NOTES_PRUNED: usize = 100;

/// The scripts the store loads, and loads again when the server forgot them.
const SCRIPTS: [&str; 4] = [WRITE, RESERVE, PRUNE_NOTES, RESERVE_DUE];

/// The most rounds of one claim ([`Store::claim_due`]): each reserves what is due and writes
/// the claims.
const CLAIM_ROUNDS: usize = 8;

/// The key (under the store's hash tag) that marks the index sets by status and class or code
/// complete: present when every record of the store is in them (a store whose first record
/// this version wrote, or one that [`Store::check_counts`] repaired).
const COUNTED: &str = "counted";

/// How many times a write is tried again when another writer changed the record in between.
const CAS_TRIES: usize = 64;

/// The `ZRANGEBYSCORE` bounds of a filter's time range: `since` inclusive, `until` exclusive.
/// The sizes of the time index and of the indexes by status ([`RedisStore::index_sizes`]).
struct IndexSizes {
    all: u64,
    dead: u64,
    waiting: u64,
    resolved: u64,
    deferred: u64,
    in_flight: u64,
}

impl IndexSizes {
    /// Whether every record is in the dead, waiting or resolved index.
    fn by_status_complete(&self) -> bool {
        self.all == self.dead + self.waiting + self.resolved
    }
}

fn score_range(filter: &Filter) -> (String, String) {
    let min = filter
        .since
        .map(|t| to_millis(t).to_string())
        .unwrap_or_else(|| "-inf".to_owned());
    let max = filter
        .until
        .map(|t| format!("({}", to_millis(t)))
        .unwrap_or_else(|| "+inf".to_owned());
    (min, max)
}

/// Whether `rest`, what follows `prefix:` in a key, is a key of the store's layout.
fn untagged_layout(rest: &[u8]) -> bool {
    const FAMILIES: [&[u8]; 8] = [
        b"rec:",
        b"class:",
        b"code:",
        b"tag:",
        b"dead:",
        b"deferred:",
        b"in_flight:",
        b"resolved:",
    ];
    const NAMES: [&[u8]; 7] = [
        b"time",
        b"retry",
        b"codes",
        b"classes",
        b"audit",
        b"waiting:time",
        b"counted",
    ];
    FAMILIES.iter().any(|f| rest.starts_with(f)) || NAMES.contains(&rest)
}

/// `text` with the characters that `SCAN … MATCH` reads as a pattern escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A fleet note as the notes' hash keeps it: the field (topic and author, the topic's length in
/// bytes first, so that no pair of them makes another's field) and the value, JSON.
fn note_entry(note: &FleetNote) -> Result<(String, String), StoreError> {
    let field = format!("{}:{}{}", note.topic.len(), note.topic, note.author);
    let value = serde_json::to_string(&StoredNote {
        topic: Cow::Borrowed(&note.topic),
        author: Cow::Borrowed(&note.author),
        body: Cow::Borrowed(&note.body),
        written_at_ms: to_millis(note.written_at),
        expires_at_ms: to_millis(note.expires_at),
    })
    .map_err(|e| StoreError::with_source("redis dead-letter store: encode note", e))?;
    Ok((field, value))
}

/// Decodes a note of the notes' hash: any bytes give a note or an error, never a panic.
fn decode_note(json: &str) -> Result<FleetNote, StoreError> {
    let note: StoredNote<'_> = serde_json::from_str(json)
        .map_err(|e| StoreError::with_source("redis dead-letter store: decode note", e))?;
    Ok(FleetNote {
        topic: note.topic.into_owned(),
        author: note.author.into_owned(),
        body: note.body.into_owned(),
        written_at: from_millis(note.written_at_ms),
        expires_at: from_millis(note.expires_at_ms),
    })
}

/// The JSON of a fleet note in the notes' hash (its topic and author too: the field is only
/// what makes it one per topic and author).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredNote<'a> {
    #[serde(borrow)]
    topic: Cow<'a, str>,
    #[serde(borrow)]
    author: Cow<'a, str>,
    #[serde(borrow)]
    body: Cow<'a, str>,
    written_at_ms: i64,
    expires_at_ms: i64,
}

fn redis_error(what: &str) -> impl FnOnce(redis::RedisError) -> StoreError + '_ {
    move |e| StoreError::with_source(format!("redis dead-letter store: {what}"), e)
}

fn encode(record: &Record) -> Result<String, StoreError> {
    serde_json::to_string(record)
        .map_err(|e| StoreError::with_source("redis dead-letter store: encode record", e))
}

/// Decodes a stored record from its bytes: any bytes give a record or an error, never a panic.
fn decode(json: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(json)
        .map_err(|e| StoreError::with_source("redis dead-letter store: decode record", e))
}

impl RedisStore {
    /// Connects to the Redis server at `url` (`redis://127.0.0.1:6379`, `redis://:password@host/2`)
    /// with the key prefix `backstop:dlq`, a 2 s connection timeout and a 5 s response timeout,
    /// keeping the last [`DEFAULT_HISTORY_LIMIT`](super::DEFAULT_HISTORY_LIMIT) errors per record.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the URL is malformed, the server cannot be reached, or the scripts
    /// cannot be loaded.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        RedisStore::connect_with_timeouts(
            url,
            Some(Duration::from_secs(2)),
            Some(Duration::from_secs(5)),
        )
        .await
    }

    /// Connects like [`connect`](RedisStore::connect), with these timeouts for connecting and for
    /// each response (`None`: wait as long as it takes). Tests on tokio's paused clock need
    /// `None`: a paused clock jumps ahead while a socket waits and would fire the timeouts at
    /// once.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the URL is malformed, the server cannot be reached, or the scripts
    /// cannot be loaded.
    pub async fn connect_with_timeouts(
        url: &str,
        connection: Option<Duration>,
        response: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let client = Client::open(url).map_err(|e| {
            StoreError::with_source(
                format!("redis dead-letter store: bad url {:?}", redact_url(url)),
                RedactedError::of(&e, url),
            )
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(connection)
            .set_response_timeout(response)
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| {
                StoreError::with_source(
                    format!(
                        "cannot connect to redis dead-letter store {}",
                        redact_url(url)
                    ),
                    RedactedError::of(&e, url),
                )
            })?;
        RedisStore::opened(Connection::Single(conn), vec![url.to_owned()]).await
    }

    /// Connects to the Redis Cluster that `urls` name (one or more of its nodes, each
    /// `redis://host:port`, `redis://:password@host:port`; the others are found from them), with
    /// the key prefix `backstop:dlq`, a 2 s connection timeout and a 5 s response timeout,
    /// keeping the last [`DEFAULT_HISTORY_LIMIT`](super::DEFAULT_HISTORY_LIMIT) errors per record.
    ///
    /// Every key of the store is under one hash tag (see [`RedisStore`]), so its scripts and
    /// pipelines run on the one node that owns its slot; the redis crate's cluster client follows
    /// redirections when the Cluster moves that slot or fails over.
    ///
    /// ```no_run
    /// use tower_backstop_store::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_backstop_store::StoreError> {
    /// let store = RedisStore::connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .await?
    ///     .with_prefix("mail:dlq");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError`] when no URL is given or one is malformed, when no node can be reached or
    /// they do not form a Cluster (a plain server is refused), or when the scripts cannot be
    /// loaded.
    pub async fn connect_cluster(urls: &[&str]) -> Result<Self, StoreError> {
        RedisStore::connect_cluster_with_timeouts(
            urls,
            Some(Duration::from_secs(2)),
            Some(Duration::from_secs(5)),
        )
        .await
    }

    /// Connects like [`connect_cluster`](RedisStore::connect_cluster), with these timeouts for
    /// connecting to each node and for each response. `None` leaves the redis crate's cluster
    /// default: 1 s to connect, no limit on a response.
    ///
    /// # Errors
    ///
    /// As [`connect_cluster`](RedisStore::connect_cluster).
    pub async fn connect_cluster_with_timeouts(
        urls: &[&str],
        connection: Option<Duration>,
        response: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let shown = urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",");
        let redacted = |e: &redis::RedisError| {
            let mut text = e.to_string();
            for url in urls {
                text = RedactedError::of_text(&text, url);
            }
            RedactedError(text)
        };
        if urls.is_empty() {
            return Err(StoreError::new(
                "redis dead-letter store: a cluster needs at least one node's url",
            ));
        }
        let mut builder = ClusterClient::builder(urls.iter().copied());
        if let Some(timeout) = connection {
            builder = builder.connection_timeout(timeout);
        }
        if let Some(timeout) = response {
            builder = builder.response_timeout(timeout);
        }
        let client = builder.build().map_err(|e| {
            StoreError::with_source(
                format!("redis dead-letter store: bad cluster urls {shown:?}"),
                redacted(&e),
            )
        })?;
        let conn = client.get_async_connection().await.map_err(|e| {
            StoreError::with_source(
                format!("cannot connect to redis dead-letter store cluster {shown}"),
                redacted(&e),
            )
        })?;
        let urls = urls.iter().map(|u| (*u).to_owned()).collect();
        RedisStore::opened(Connection::Cluster(conn), urls).await
    }

    /// Opens the store on the primary that the Redis Sentinels at `sentinels` (each
    /// `redis://host:26379`, `redis://:password@host:26379` for a Sentinel that asks for one)
    /// name `master` (the name in their `sentinel monitor` line), following it through
    /// failovers: set options on the returned [`OpenSentinel`], then `.await` it. By default the
    /// key prefix `backstop:dlq`, a 2 s connection timeout and a 5 s response timeout, no login
    /// to the primary, database 0.
    ///
    /// The store keeps one connection to the primary. When a call on it fails as a lost primary
    /// would (the connection refused, dropped or timed out) or answers `READONLY` (a primary
    /// demoted to a replica), that call fails with a [`StoreError`] and the next one asks the
    /// Sentinels for the primary again, and checks with `ROLE` that it is one; calls fail until
    /// the Sentinels have promoted a replica (their `down-after-milliseconds` and the failover),
    /// then go to it. A call is never retried on the new primary by the store: whether a write
    /// whose answer was lost landed is not known, so it is reported as failed.
    ///
    /// Replication is asynchronous: a write the old primary acknowledged but had not yet sent to
    /// the replica that is promoted is lost in the failover. Redis's `WAIT numreplicas timeout`
    /// after a write would bound that (it waits until that many replicas have the write); the
    /// store does not send it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_backstop_store::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_backstop_store::StoreError> {
    /// let store = RedisStore::connect_sentinel(
    ///     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .primary_auth(None, "secret")
    /// .timeouts(Some(Duration::from_secs(1)), Some(Duration::from_secs(2)))
    /// .await?
    /// .with_prefix("mail:dlq");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`OpenSentinel`]: no Sentinel URL or a malformed one, no Sentinel that knows `master`,
    /// a primary that cannot be reached or refuses the login, scripts that cannot be loaded.
    pub fn connect_sentinel(sentinels: &[&str], master: &str) -> OpenSentinel {
        OpenSentinel::new(sentinels, master)
    }

    /// The store over `conn`, its scripts loaded, with the default prefix and history limit.
    async fn opened(mut conn: Connection, urls: Vec<String>) -> Result<Self, StoreError> {
        for script in SCRIPTS {
            Script::new(script)
                .load_async(&mut conn)
                .await
                .map_err(redis_error("load script"))?;
        }
        let prefix = "backstop:dlq".to_owned();
        Ok(RedisStore {
            conn,
            keyspace: keyspace(&prefix),
            prefix,
            history_limit: DEFAULT_HISTORY_LIMIT,
            urls,
        })
    }

    /// The URLs with their credentials hidden, joined by commas.
    fn shown_urls(&self) -> String {
        self.urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Uses `prefix` for every key (for example one prefix per application or per test): the
    /// keys are then `{prefix}:…`, one hash tag per store (see [`RedisStore`]).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self.keyspace = keyspace(&self.prefix);
        self
    }

    /// Keeps the last `limit` errors per record (at least one).
    pub fn with_history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Renames the keys that a version before the hash tag wrote for this store's prefix
    /// (`prefix:rec:{id}`, `prefix:time`…) to this version's names (`{prefix}:rec:{id}`…), and
    /// returns how many it renamed: a store upgraded from such a version looks empty until this
    /// runs once. Run it on one server, with the store's prefix set
    /// ([`with_prefix`](RedisStore::with_prefix)), while no instance of the older version writes
    /// to it; running it again renames nothing. A prefix that already holds a hash tag kept its
    /// key names, and has nothing to rename.
    ///
    /// The keys renamed are those of the store's layout (see [`RedisStore`]): a second store
    /// whose prefix is this one followed by `:rec:`, `:class:`, `:code:`, `:tag:` or `:dead:`
    /// would be caught too.
    ///
    /// ```no_run
    /// use tower_backstop_store::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_backstop_store::StoreError> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?.with_prefix("mail:dlq");
    /// let renamed = store.rename_untagged_keys().await?;
    /// println!("renamed {renamed} keys");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError`] on a Cluster (a version before the hash tag could not have written there),
    /// when this version already wrote records under the new names (the two would need merging:
    /// nothing is renamed), or when Redis fails; keys renamed before a failure stay renamed, and
    /// running it again goes on with the rest.
    pub async fn rename_untagged_keys(&self) -> Result<u64, StoreError> {
        if self.keyspace == self.prefix {
            return Ok(0);
        }
        let Connection::Single(conn) = &self.conn else {
            return Err(StoreError::new(
                "redis dead-letter store: untagged keys are renamed on one server (connect), not \
                 in a cluster or through sentinel",
            ));
        };
        let mut conn = conn.clone();
        // Both time indexes: records under both names, which renaming would not merge. (The
        // new one alone is a store already renamed, or renamed in part by a run that failed.)
        let (new, old): (bool, bool) = redis::pipe()
            .cmd("EXISTS")
            .arg(self.key("time"))
            .cmd("EXISTS")
            .arg(format!("{}:time", self.prefix))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("rename untagged keys"))?;
        if new && old {
            return Err(StoreError::new(format!(
                "redis dead-letter store: {} already holds records under the new key names; \
                 rename the old keys by hand (RENAME each {}:… key) after merging them",
                self.prefix, self.prefix
            )));
        }
        self.rename_matching(&mut conn, &format!("{}:*", glob_escape(&self.prefix)))
            .await
    }

    /// Renames each key that matches `pattern` (`SCAN … MATCH`) and is one of the layout's
    /// ([`untagged_layout`]) from `prefix:…` to `{prefix}:…`, and returns how many.
    async fn rename_matching(
        &self,
        conn: &mut ConnectionManager,
        pattern: &str,
    ) -> Result<u64, StoreError> {
        let mut cursor = 0u64;
        let mut renamed = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(conn)
                .await
                .map_err(redis_error("rename untagged keys"))?;
            let keys: Vec<Vec<u8>> = keys
                .into_iter()
                .filter(|k| untagged_layout(&k[self.prefix.len() + 1..]))
                .collect();
            if keys.is_empty() && next == 0 {
                return Ok(renamed);
            }
            if keys.is_empty() {
                cursor = next;
                continue;
            }
            let mut pipe = redis::pipe();
            for key in &keys {
                let mut new = self.keyspace.as_bytes().to_vec();
                new.extend_from_slice(&key[self.prefix.len()..]);
                pipe.cmd("RENAMENX").arg(key).arg(new);
            }
            let done: Vec<bool> = pipe
                .query_async(conn)
                .await
                .map_err(redis_error("rename untagged keys"))?;
            renamed += done.iter().filter(|d| **d).count() as u64;
            if let Some(i) = done.iter().position(|d| !d) {
                return Err(StoreError::new(format!(
                    "redis dead-letter store: {} exists under its new name too; rename it by hand",
                    String::from_utf8_lossy(&keys[i])
                )));
            }
            if next == 0 {
                return Ok(renamed);
            }
            cursor = next;
        }
    }

    /// The key `rest` of this store (`rec:{id}`, `time`, `class:{class}`…) under its hash tag:
    /// `{prefix}:{rest}`. Every key the store reads or writes is made here, so that all of them
    /// share the store's Cluster slot; a new kind of key must be made here too.
    fn key(&self, rest: &str) -> String {
        format!("{}:{rest}", self.keyspace)
    }

    fn record_key(&self, id: &str) -> String {
        self.key(&format!("rec:{id}"))
    }

    /// The index keys of `record`: its class, code and tags, and its status for the counts.
    fn index_keys(&self, record: &Record) -> Vec<String> {
        let mut keys = vec![
            self.key(&format!("class:{}", record.class)),
            self.key(&format!("code:{}", record.code)),
        ];
        for (k, v) in &record.tags {
            keys.push(self.key(&format!("tag:{k}={v}")));
        }
        // By status, for the counts: every status alone, by class and by code, and the
        // deferred and in-flight ones together.
        let status = record.status.as_str();
        keys.push(self.key(&format!("{status}:time")));
        keys.push(self.key(&format!("{status}:class:{}", record.class)));
        keys.push(self.key(&format!("{status}:code:{}", record.code)));
        if matches!(record.status, Status::Deferred | Status::InFlight) {
            keys.push(self.key("waiting:time"));
        }
        keys
    }

    /// Where `record`'s index entries are: what a write that replaces it leaves.
    fn indexed(&self, record: &Record) -> Indexed {
        Indexed {
            keys: self.index_keys(record),
            last_failed_at: record.last_failed_at,
        }
    }

    /// The `EVALSHA` of the write script for `record`, replacing the record whose entries are
    /// `old` (read at `version`).
    fn write_cmd(
        &self,
        record: &Record,
        old: Option<Indexed>,
        version: &str,
        note_code: bool,
    ) -> Result<redis::Cmd, StoreError> {
        let same_time = old
            .as_ref()
            .is_some_and(|o| o.last_failed_at == record.last_failed_at);
        let mut leave = old.map(|o| o.keys).unwrap_or_default();
        let mut join = self.index_keys(record);
        // Every index entry's score is the record's last failure: while it did not move, the
        // entries the old and the new record share stay as they are (a claim or its
        // acknowledgement changes the status's entries alone).
        if same_time {
            let shared: Vec<String> = leave.iter().filter(|k| join.contains(k)).cloned().collect();
            leave.retain(|k| !shared.contains(k));
            join.retain(|k| !shared.contains(k));
        }
        let retry = match (record.status, record.retry_at) {
            (Status::Deferred | Status::InFlight, Some(t)) => to_millis(t).to_string(),
            _ => String::new(),
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(Script::new(WRITE).get_hash())
            .arg(6 + leave.len() + join.len())
            .arg(self.record_key(&record.id))
            .arg(self.key("time"))
            .arg(self.key("retry"))
            .arg(self.key("codes"))
            .arg(self.key("classes"))
            .arg(self.key(COUNTED))
            .arg(&leave)
            .arg(&join)
            .arg(version)
            .arg(&record.id)
            .arg(encode(record)?)
            .arg(to_millis(record.last_failed_at))
            .arg(retry)
            .arg(if note_code { record.code.as_str() } else { "" })
            .arg(leave.len())
            .arg(to_millis(record.last_failed_at))
            .arg(record.budget_spent)
            .arg(&record.class);
        Ok(cmd)
    }

    /// Runs a script command; when the server forgot the scripts (a restart, `SCRIPT FLUSH`),
    /// loads them again and runs it once more.
    async fn eval<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                for script in SCRIPTS {
                    Script::new(script).load_async(&mut conn).await?;
                }
                cmd.query_async(&mut conn).await
            }
            other => other,
        }
    }

    /// Reserves up to `limit` records due at `now` for a claim until `now + lease`
    /// ([`RESERVE_DUE`]): each with its version.
    async fn reserve_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<(Record, String)>, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(Script::new(RESERVE_DUE).get_hash())
            .arg(1)
            .arg(self.key("retry"))
            .arg(to_millis(now))
            .arg(to_millis(add_clamped(now, lease)))
            .arg(limit)
            .arg(self.record_key(""));
        let reply: Vec<Vec<u8>> = self
            .eval(&cmd)
            .await
            .map_err(redis_error("claim records"))?;
        reply
            .chunks_exact(3)
            .map(|r| {
                let version = String::from_utf8(r[2].clone()).map_err(|e| {
                    StoreError::with_source(
                        "redis dead-letter store: record version is not text",
                        e,
                    )
                })?;
                Ok((decode(&r[1])?, version))
            })
            .collect()
    }

    /// Reads the record with `id` and its version.
    async fn read(&self, id: &str) -> Result<(Option<Record>, String), StoreError> {
        let mut conn = self.conn.clone();
        let (json, version): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(self.record_key(id))
            .arg("json")
            .arg("v")
            .query_async(&mut conn)
            .await
            .map_err(redis_error("read record"))?;
        let record = json.as_deref().map(decode).transpose()?;
        let version = String::from_utf8(version.unwrap_or_default()).map_err(|e| {
            StoreError::with_source("redis dead-letter store: record version is not text", e)
        })?;
        Ok((record, version))
    }

    /// Read, change, write if unchanged; again if another writer came first.
    async fn read_modify_write(
        &self,
        id: &str,
        note_code: bool,
        change: impl Fn(Option<Record>) -> Option<Record>,
    ) -> Result<Option<Record>, StoreError> {
        for _ in 0..CAS_TRIES {
            let (old, version) = self.read(id).await?;
            let before = old.as_ref().map(|o| self.indexed(o));
            let Some(new) = change(old) else {
                return Ok(None);
            };
            let written: i64 = self
                .eval(&self.write_cmd(&new, before, &version, note_code)?)
                .await
                .map_err(redis_error("write record"))?;
            if written == 1 {
                return Ok(Some(new));
            }
        }
        Err(StoreError::new(format!(
            "redis dead-letter store: record {id} kept changing, gave up after {CAS_TRIES} tries"
        )))
    }

    async fn put_batch(&self, records: Vec<Record>) -> Result<(), StoreError> {
        if records.is_empty() {
            // Nothing to write: an empty pipeline is an error to the redis crate.
            return Ok(());
        }
        let limit = self.history_limit;
        // Fold repeated ids within the batch first, in order.
        let mut batch: Vec<Record> = Vec::with_capacity(records.len());
        let mut at: HashMap<String, usize> = HashMap::new();
        for record in records {
            match at.get(&record.id) {
                Some(&i) => batch[i].merge_bounded(record, limit),
                None => {
                    at.insert(record.id.clone(), batch.len());
                    batch.push(record);
                }
            }
        }
        let mut conn = self.conn.clone();
        // One pipeline to read, one to write; a record another writer changed in between is
        // written again on its own.
        let mut read = redis::pipe();
        for record in &batch {
            read.cmd("HMGET")
                .arg(self.record_key(&record.id))
                .arg("json")
                .arg("v");
        }
        let olds: Vec<(Option<Vec<u8>>, Option<String>)> = read
            .query_async(&mut conn)
            .await
            .map_err(redis_error("read records"))?;
        let mut write = redis::pipe();
        let mut merged = Vec::with_capacity(batch.len());
        for (mut record, (json, version)) in batch.into_iter().zip(olds) {
            let old = json.as_deref().map(decode).transpose()?;
            let new = match &old {
                Some(old) => {
                    let mut m = old.clone();
                    m.merge_bounded(record.clone(), limit);
                    m
                }
                None => {
                    record.bound_history(limit);
                    record.clone()
                }
            };
            write.add_command(self.write_cmd(
                &new,
                old.as_ref().map(|o| self.indexed(o)),
                version.as_deref().unwrap_or(""),
                true,
            )?);
            merged.push(record);
        }
        let written: Vec<i64> = match write.query_async(&mut conn).await {
            // The server forgot the scripts: none of the batch was written; load and again.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                for script in SCRIPTS {
                    Script::new(script)
                        .load_async(&mut conn)
                        .await
                        .map_err(redis_error("load script"))?;
                }
                write.query_async(&mut conn).await
            }
            other => other,
        }
        .map_err(redis_error("write records"))?;
        for (record, ok) in merged.into_iter().zip(written) {
            if ok != 1 {
                self.put_one(record).await?;
            }
        }
        Ok(())
    }

    async fn put_one(&self, record: Record) -> Result<(), StoreError> {
        let limit = self.history_limit;
        let id = record.id.clone();
        self.read_modify_write(&id, true, move |old| {
            Some(match old {
                Some(mut old) => {
                    old.merge_bounded(record.clone(), limit);
                    old
                }
                None => {
                    let mut new = record.clone();
                    new.bound_history(limit);
                    new
                }
            })
        })
        .await
        .map(drop)
    }

    /// The records with these ids, in order, skipping ids with no record.
    /// The records with these ids that match `filter`, newest first.
    async fn fetch_matching(
        &self,
        ids: &[String],
        filter: &Filter,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records: Vec<Record> = self
            .fetch(ids)
            .await?
            .into_iter()
            .filter(|r| filter.matches(r))
            .collect();
        newest_first(&mut records);
        Ok(records)
    }

    async fn fetch(&self, ids: &[String]) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(512) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HGET").arg(self.record_key(id)).arg("json");
            }
            let jsons: Vec<Option<Vec<u8>>> = pipe
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read records"))?;
            for json in jsons.into_iter().flatten() {
                out.push(decode(&json)?);
            }
        }
        Ok(out)
    }

    /// The one index that alone answers `filter` (with its time range), if there is one: at most
    /// one of class, code and a single tag, and no status or ids.
    fn sole_index(&self, filter: &Filter) -> Option<String> {
        if filter.status.is_some() || !filter.ids.is_empty() {
            return None;
        }
        let conditions = usize::from(filter.class.is_some())
            + usize::from(filter.code.is_some())
            + filter.tags.len();
        if conditions > 1 {
            return None;
        }
        Some(self.narrowest_index(filter))
    }

    /// The sizes of the time index and of the indexes by status.
    async fn index_sizes(&self) -> Result<IndexSizes, StoreError> {
        let mut conn = self.conn.clone();
        let (all, dead, waiting, resolved, deferred, in_flight) = redis::pipe()
            .cmd("ZCARD")
            .arg(self.key("time"))
            .cmd("ZCARD")
            .arg(self.key("dead:time"))
            .cmd("ZCARD")
            .arg(self.key("waiting:time"))
            .cmd("ZCARD")
            .arg(self.key("resolved:time"))
            .cmd("ZCARD")
            .arg(self.key("deferred:time"))
            .cmd("ZCARD")
            .arg(self.key("in_flight:time"))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("count records"))?;
        Ok(IndexSizes {
            all,
            dead,
            waiting,
            resolved,
            deferred,
            in_flight,
        })
    }

    /// Whether the indexes by status hold every record (records written by a version before
    /// they were kept are in none; the deferred and in-flight indexes came after the waiting
    /// one, so records written before them are only in the latter).
    async fn status_indexes_complete(&self) -> Result<bool, StoreError> {
        let n = self.index_sizes().await?;
        Ok(n.by_status_complete() && n.waiting == n.deferred + n.in_flight)
    }

    /// An index whose members are exactly the records that `filter` matches, but for its times
    /// (which are the index's scores): the filter's one class, code or tag index, or the time
    /// index, for a filter without a status; the dead records' index, by class or code or all
    /// of them, for the dead ones; the index of the resolved, the deferred or the in-flight
    /// records for those. `None` when there is none (several conditions, ids, or indexes by
    /// status that do not hold every record).
    async fn exact_index(&self, filter: &Filter) -> Result<Option<String>, StoreError> {
        if let Some(index) = self.sole_index(filter) {
            return Ok(Some(index));
        }
        if !filter.ids.is_empty() || !filter.tags.is_empty() {
            return Ok(None);
        }
        let Some(status) = filter.status.map(Status::as_str) else {
            return Ok(None);
        };
        let (key, needs_mark) = match (&filter.class, &filter.code) {
            (None, None) => (format!("{status}:time"), false),
            (Some(class), None) => (format!("{status}:class:{class}"), status != "dead"),
            (None, Some(code)) => (format!("{status}:code:{code}"), status != "dead"),
            _ => return Ok(None),
        };
        // The sets by class and code of the deferred, in-flight and resolved records hold every
        // such record only once the store is marked counted.
        let complete =
            self.status_indexes_complete().await? && (!needs_mark || self.counts_marked().await?);
        Ok(complete.then(|| self.key(&key)))
    }

    /// Whether the store is marked counted ([`COUNTED`]).
    async fn counts_marked(&self) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        redis::cmd("EXISTS")
            .arg(self.key(COUNTED))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("count records"))
    }

    /// The narrowest index for `filter`: its class's, else its code's, else its first tag's, else
    /// the time index.
    fn narrowest_index(&self, filter: &Filter) -> String {
        if let Some(class) = &filter.class {
            self.key(&format!("class:{class}"))
        } else if let Some(code) = &filter.code {
            self.key(&format!("code:{code}"))
        } else if let Some((k, v)) = filter.tags.iter().next() {
            self.key(&format!("tag:{k}={v}"))
        } else {
            self.key("time")
        }
    }

    /// One page of `index` between the filter's times, newest first, ties by id: read with
    /// `LIMIT`, then the ties at the page's edges read whole and put in id order.
    async fn page_of(
        &self,
        index: &str,
        filter: &Filter,
        page: Range<usize>,
    ) -> Result<Vec<Record>, StoreError> {
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let (min, max) = score_range(filter);
        let mut conn = self.conn.clone();
        let hits: Vec<(String, i64)> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(index)
            .arg(&max)
            .arg(&min)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(i64::try_from(page.start).unwrap_or(i64::MAX))
            // Redis reads a count as a signed 64-bit number; a negative one means "all".
            .arg(i64::try_from(page.len()).unwrap_or(-1))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("search records"))?;
        let (Some(&(_, high)), Some(&(_, low))) = (hits.first(), hits.last()) else {
            return Ok(Vec::new());
        };
        // Redis orders equal scores by id descending; we order them ascending. Read every id
        // with a score between the page's first and last, and how many come before them.
        let (above, mut window): (usize, Vec<(String, i64)>) = redis::pipe()
            .cmd("ZCOUNT")
            .arg(index)
            .arg(format!("({high}"))
            .arg(&max)
            .cmd("ZREVRANGEBYSCORE")
            .arg(index)
            .arg(high)
            .arg(low)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .map_err(redis_error("search records"))?;
        window.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let start = page.start.saturating_sub(above).min(window.len());
        let end = start.saturating_add(page.len()).min(window.len());
        let ids: Vec<String> = window.drain(start..end).map(|(id, _)| id).collect();
        self.fetch_matching(&ids, filter).await
    }

    /// Counts of the records last failed at or after `since` from the index sets: the dead
    /// ones per class and per code, and the deferred and in-flight ones; `None` when the indexes
    /// by status do not hold every record (records written by a version before they were kept),
    /// and the records are read instead.
    async fn counts_from_indexes(&self, since: SystemTime) -> Result<Option<Counts>, StoreError> {
        if !self.index_sizes().await?.by_status_complete() {
            return Ok(None);
        }
        let mut conn = self.conn.clone();
        let (classes, codes): (Vec<String>, BTreeMap<String, i64>) = redis::pipe()
            .cmd("SMEMBERS")
            .arg(self.key("classes"))
            .cmd("HGETALL")
            .arg(self.key("codes"))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("count records"))?;
        let from = to_millis(since);
        let mut pipe = redis::pipe();
        for key in ["dead:time".to_owned(), "waiting:time".to_owned()]
            .into_iter()
            .chain(classes.iter().map(|c| format!("dead:class:{c}")))
            .chain(codes.keys().map(|c| format!("dead:code:{c}")))
        {
            pipe.cmd("ZCOUNT").arg(self.key(&key)).arg(from).arg("+inf");
        }
        let counted: Vec<u64> = pipe
            .query_async(&mut conn)
            .await
            .map_err(redis_error("count records"))?;
        let (total, deferred) = (
            counted.first().copied().unwrap_or(0),
            counted.get(1).copied().unwrap_or(0),
        );
        let rest = counted.get(2..).unwrap_or_default();
        let (per_class, per_code) = rest.split_at(classes.len().min(rest.len()));
        let nonzero = |names: Vec<String>, counts: &[u64]| {
            top_first(
                names
                    .into_iter()
                    .zip(counts.iter().copied())
                    .filter(|(_, n)| *n > 0),
            )
        };
        let mut new_codes: Vec<(String, SystemTime)> = codes
            .iter()
            .map(|(c, ms)| (c.clone(), from_millis(*ms)))
            .filter(|(_, t)| *t >= since)
            .collect();
        new_codes.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        Ok(Some(Counts {
            total,
            by_class: nonzero(classes, per_class),
            by_code: nonzero(codes.into_keys().collect(), per_code),
            new_codes,
            deferred,
        }))
    }

    /// One page of the deferred and in-flight records that match `filter`, the soonest due
    /// first, ties by id: the order of the retry index (`ZRANGE` orders equal scores by id). A
    /// filter that says nothing is read a page at a time off that index; any other reads the
    /// whole index and filters the records.
    async fn waiting_page(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> Result<Vec<Record>, StoreError> {
        if page.is_empty() || matches!(filter.status, Some(Status::Dead | Status::Resolved)) {
            return Ok(Vec::new());
        }
        let waiting = |r: &Record| {
            matches!(r.status, Status::Deferred | Status::InFlight)
                && r.retry_at.is_some()
                && filter.matches(r)
        };
        let mut conn = self.conn.clone();
        if filter.is_empty() {
            // Redis reads a stop index as signed; -1 is the last member.
            let stop = page
                .end
                .checked_sub(1)
                .and_then(|e| i64::try_from(e).ok())
                .unwrap_or(-1);
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.key("retry"))
                .arg(i64::try_from(page.start).unwrap_or(i64::MAX))
                .arg(stop)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("search waiting records"))?;
            return Ok(self
                .fetch(&ids)
                .await?
                .into_iter()
                .filter(waiting)
                .collect());
        }
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.key("retry"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(redis_error("search waiting records"))?;
        Ok(self
            .fetch(&ids)
            .await?
            .into_iter()
            .filter(waiting)
            .skip(page.start)
            .take(page.len())
            .collect())
    }

    /// Every record that matches `filter`, newest first, read through the narrowest index.
    async fn matching(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        let ids: Vec<String> = if filter.ids.is_empty() {
            let waiting_only = matches!(filter.status, Some(Status::Deferred | Status::InFlight))
                && filter.class.is_none()
                && filter.code.is_none()
                && filter.tags.is_empty();
            let index = if waiting_only && self.status_indexes_complete().await? {
                // Deferred and in-flight records share one index: read it, then filter.
                self.key("waiting:time")
            } else {
                self.narrowest_index(filter)
            };
            let max = filter
                .until
                .map(|t| format!("({}", to_millis(t)))
                .unwrap_or_else(|| "+inf".to_owned());
            let min = filter
                .since
                .map(|t| to_millis(t).to_string())
                .unwrap_or_else(|| "-inf".to_owned());
            let mut conn = self.conn.clone();
            redis::cmd("ZREVRANGEBYSCORE")
                .arg(index)
                .arg(max)
                .arg(min)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("search records"))?
        } else {
            filter.ids.clone()
        };
        self.fetch_matching(&ids, filter).await
    }
}

impl Store for RedisStore {
    fn put_many(&self, records: Vec<Record>) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            if records.len() == 1 {
                let record = records.into_iter().next().expect("one record");
                this.put_one(record).await
            } else {
                this.put_batch(records).await
            }
        })
    }

    fn get(&self, id: &str) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let this = self.clone();
        let id = id.to_owned();
        Box::pin(async move { Ok(this.read(&id).await?.0) })
    }

    fn search(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let this = self.clone();
        let filter = filter.clone();
        Box::pin(async move {
            if let Some(index) = this.exact_index(&filter).await? {
                return this.page_of(&index, &filter, page).await;
            }
            Ok(this
                .matching(&filter)
                .await?
                .into_iter()
                .skip(page.start)
                .take(page.len())
                .collect())
        })
    }

    fn search_waiting(
        &self,
        filter: &Filter,
        page: Range<usize>,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let this = self.clone();
        let filter = filter.clone();
        Box::pin(async move { this.waiting_page(&filter, page).await })
    }

    fn search_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let this = self.clone();
        let (filter, after) = (filter.clone(), after.cloned());
        Box::pin(async move { this.newest_after(&filter, after.as_ref(), limit).await })
    }

    fn search_waiting_after(
        &self,
        filter: &Filter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let this = self.clone();
        let (filter, after) = (filter.clone(), after.cloned());
        Box::pin(async move { this.soonest_after(&filter, after.as_ref(), limit).await })
    }

    fn count(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let this = self.clone();
        let filter = filter.clone();
        Box::pin(async move {
            let Some(index) = this.exact_index(&filter).await? else {
                return Ok(this.matching(&filter).await?.len() as u64);
            };
            let (min, max) = score_range(&filter);
            let mut conn = this.conn.clone();
            redis::cmd("ZCOUNT")
                .arg(index)
                .arg(min)
                .arg(max)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("count records"))
        })
    }

    fn counts(&self, since: SystemTime) -> BoxFuture<'static, Result<Counts, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            if let Some(counts) = this.counts_from_indexes(since).await? {
                return Ok(counts);
            }
            let records = this.matching(&Filter::new().since(since)).await?;
            let mut conn = this.conn.clone();
            let codes: BTreeMap<String, i64> = redis::cmd("HGETALL")
                .arg(this.key("codes"))
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read codes"))?;
            Ok(Counts::tally(
                since,
                &records,
                codes.into_iter().map(|(c, ms)| (c, from_millis(ms))),
            ))
        })
    }

    fn check_counts(&self, repair: bool) -> BoxFuture<'static, Result<CountsCheck, StoreError>> {
        let this = self.clone();
        Box::pin(async move { this.check_index_sets(repair).await })
    }

    fn update(
        &self,
        id: &str,
        change: Change,
    ) -> BoxFuture<'static, Result<Option<Record>, StoreError>> {
        let this = self.clone();
        let id = id.to_owned();
        Box::pin(async move {
            this.read_modify_write(&id, false, move |old| {
                old.map(|mut r| {
                    change.apply(&mut r);
                    r
                })
            })
            .await
        })
    }

    fn claim_due(
        &self,
        now: SystemTime,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut claimed = Vec::new();
            // Each round reserves the due ids in one script (their scores moved to the claim's
            // end, so that the other claimers read the next ones), then writes each claim
            // with a versioned write, together over the multiplexed connection. A record
            // changed in between keeps the other writer's change (its write set its index
            // entry again) and is not claimed. A round that reserves nothing ends it.
            for _ in 0..CLAIM_ROUNDS {
                if claimed.len() >= limit {
                    break;
                }
                let reserved = this.reserve_due(now, limit - claimed.len(), lease).await?;
                if reserved.is_empty() {
                    break;
                }
                let writes = reserved.into_iter().filter_map(|(mut record, version)| {
                    if !claimable(&record, now) {
                        return None;
                    }
                    let old = this.indexed(&record);
                    claim(&mut record, now, lease);
                    let cmd = this.write_cmd(&record, Some(old), &version, false);
                    let this = this.clone();
                    Some(async move {
                        let written: i64 = this
                            .eval(&cmd?)
                            .await
                            .map_err(redis_error("claim records"))?;
                        Ok::<_, StoreError>((written == 1).then_some(record))
                    })
                });
                for record in futures_util::future::join_all(writes).await {
                    claimed.extend(record?);
                }
            }
            Ok(claimed)
        })
    }

    fn change_if_unchanged(
        &self,
        seen: &Record,
        change: Change,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let this = self.clone();
        let seen = seen.clone();
        Box::pin(async move {
            for _ in 0..CAS_TRIES {
                let (mut old, version) = this.read(&seen.id).await?;
                let before = old.as_ref().map(|o| this.indexed(o));
                let claim = change_if_unchanged(old.as_mut(), &seen, change);
                let Claim::Claimed(new) = &claim else {
                    return Ok(claim);
                };
                let written: i64 = this
                    .eval(&this.write_cmd(new, before, &version, false)?)
                    .await
                    .map_err(redis_error("claim record"))?;
                if written == 1 {
                    return Ok(claim);
                }
            }
            Err(StoreError::new(format!(
                "redis dead-letter store: record {} kept changing, gave up changing it after \
                 {CAS_TRIES} tries",
                seen.id
            )))
        })
    }

    fn change_claimed_many(
        &self,
        changes: Vec<(Lease, Change)>,
    ) -> BoxFuture<'static, Result<Vec<Claim>, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut claims: Vec<Option<Claim>> = (0..changes.len()).map(|_| None).collect();
            for round in rounds(changes) {
                // The changes of a round (no record twice) go out together over the
                // multiplexed connection, each its own versioned write.
                let (at, writes): (Vec<usize>, Vec<_>) = round
                    .into_iter()
                    .map(|(i, lease, change)| (i, this.change_claimed(&lease, change)))
                    .unzip();
                let answers = futures_util::future::join_all(writes).await;
                for (i, claim) in at.into_iter().zip(answers) {
                    if let Some(slot) = claims.get_mut(i) {
                        *slot = Some(claim?);
                    }
                }
            }
            Ok(claims.into_iter().flatten().collect())
        })
    }

    fn applies_batches(&self) -> bool {
        true
    }

    fn put_claimed(
        &self,
        lease: &Lease,
        record: Record,
    ) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let this = self.clone();
        let lease = lease.clone();
        Box::pin(async move {
            lease.check_id(&record)?;
            for _ in 0..CAS_TRIES {
                let (old, version) = this.read(&lease.id).await?;
                let Some(current) = old else {
                    return Ok(Claim::Missing);
                };
                if !lease.holds(&current) {
                    return Ok(Claim::ClaimedElsewhere {
                        status: current.status,
                        resends: current.resends,
                    });
                }
                let before = this.indexed(&current);
                let mut merged = current;
                merged.merge_bounded(record.clone(), this.history_limit);
                let written: i64 = this
                    .eval(&this.write_cmd(&merged, Some(before), &version, true)?)
                    .await
                    .map_err(redis_error("write record"))?;
                if written == 1 {
                    return Ok(Claim::Claimed(Box::new(merged)));
                }
            }
            Err(StoreError::new(format!(
                "redis dead-letter store: record {} kept changing, gave up writing its failure \
                 after {CAS_TRIES} tries",
                lease.id
            )))
        })
    }

    fn next_due(&self) -> BoxFuture<'static, Result<Option<SystemTime>, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut conn = this.conn.clone();
            let first: Vec<(String, i64)> = redis::cmd("ZRANGE")
                .arg(this.key("retry"))
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read the next due time"))?;
            Ok(first.first().map(|(_, ms)| from_millis(*ms)))
        })
    }

    fn reserve_slot(
        &self,
        schedule: &str,
        gap: Duration,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<SystemTime, StoreError>> {
        let this = self.clone();
        let key = self.key(&format!("slot:{schedule}"));
        Box::pin(async move {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(Script::new(RESERVE).get_hash())
                .arg(1)
                .arg(key)
                .arg(to_micros(now))
                .arg(gap_micros(gap));
            let slot: i64 = this
                .eval(&cmd)
                .await
                .map_err(redis_error("reserve a send slot"))?;
            Ok(from_micros(slot))
        })
    }

    fn budget_spent(&self, id: &str) -> BoxFuture<'static, Result<Option<u32>, StoreError>> {
        let this = self.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let mut conn = this.conn.clone();
            let (budget, json_len): (Option<String>, u64) = redis::pipe()
                .cmd("HGET")
                .arg(this.record_key(&id))
                .arg("b")
                .cmd("HSTRLEN")
                .arg(this.record_key(&id))
                .arg("json")
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read attempt budget"))?;
            match budget {
                Some(b) => b.parse().map(Some).map_err(|e| {
                    StoreError::with_source(
                        format!("redis dead-letter store: record {id} has a bad attempt count"),
                        e,
                    )
                }),
                // A record written before the count had its own field: read it whole.
                None if json_len > 0 => Ok(this.read(&id).await?.0.map(|r| r.budget_spent)),
                None => Ok(None),
            }
        })
    }

    fn put_note(&self, note: FleetNote) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let (field, value) = note_entry(&note)?;
            let mut conn = this.conn.clone();
            redis::cmd("HSET")
                .arg(this.key("notes"))
                .arg(field)
                .arg(value)
                .query_async::<()>(&mut conn)
                .await
                .map_err(redis_error("write note"))
        })
    }

    fn notes(&self, now: SystemTime) -> BoxFuture<'static, Result<Vec<FleetNote>, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let key = this.key("notes");
            let mut conn = this.conn.clone();
            let entries: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read notes"))?;
            let mut notes = Vec::with_capacity(entries.len());
            let mut expired = Vec::new();
            for (field, value) in entries {
                let note = decode_note(&value)?;
                if note.expires_at > now {
                    notes.push(note);
                } else {
                    expired.push((field, value));
                }
            }
            if !expired.is_empty() {
                // Whoever reads them first deletes them (at most `NOTES_PRUNED` a read): one
                // more round trip, only then. The notes read stand whether it works or not.
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(Script::new(PRUNE_NOTES).get_hash())
                    .arg(1)
                    .arg(&key);
                for (field, value) in expired.iter().take(NOTES_PRUNED) {
                    cmd.arg(field).arg(value);
                }
                if let Err(e) = this.eval::<u64>(&cmd).await {
                    tracing::warn!(
                        error = %e,
                        "redis dead-letter store: cannot delete expired notes; they are kept, \
                         unread, until a later read deletes them"
                    );
                }
            }
            Ok(notes)
        })
    }

    fn append_audit(&self, entry: AuditEntry) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            let json = serde_json::to_string(&entry).map_err(|e| {
                StoreError::with_source("redis dead-letter store: encode audit entry", e)
            })?;
            let mut conn = this.conn.clone();
            redis::cmd("LPUSH")
                .arg(this.key("audit"))
                .arg(json)
                .query_async::<()>(&mut conn)
                .await
                .map_err(redis_error("write audit entry"))
        })
    }

    fn audit(&self, page: Range<usize>) -> BoxFuture<'static, Result<Vec<AuditEntry>, StoreError>> {
        let this = self.clone();
        Box::pin(async move {
            if page.is_empty() {
                return Ok(Vec::new());
            }
            let mut conn = this.conn.clone();
            // LRANGE's end is inclusive; -1 is the end of the list.
            let end = i64::try_from(page.end - 1).unwrap_or(-1);
            let items: Vec<String> = redis::cmd("LRANGE")
                .arg(this.key("audit"))
                .arg(i64::try_from(page.start).unwrap_or(i64::MAX))
                .arg(end)
                .query_async(&mut conn)
                .await
                .map_err(redis_error("read audit trail"))?;
            items
                .iter()
                .map(|json| {
                    serde_json::from_str(json).map_err(|e| {
                        StoreError::with_source("redis dead-letter store: decode audit entry", e)
                    })
                })
                .collect()
        })
    }

    fn delete(&self, filter: &Filter) -> BoxFuture<'static, Result<u64, StoreError>> {
        let this = self.clone();
        let filter = filter.clone();
        Box::pin(async move {
            let records = this.matching(&filter).await?;
            if records.is_empty() {
                return Ok(0);
            }
            let mut pipe = redis::pipe();
            for r in &records {
                pipe.cmd("DEL").arg(this.record_key(&r.id)).ignore();
                for key in this
                    .index_keys(r)
                    .into_iter()
                    .chain([this.key("time"), this.key("retry")])
                {
                    pipe.cmd("ZREM").arg(key).arg(&r.id).ignore();
                }
            }
            let mut conn = this.conn.clone();
            let () = pipe
                .query_async(&mut conn)
                .await
                .map_err(redis_error("delete records"))?;
            Ok(records.len() as u64)
        })
    }
}
