//! Breakers shared by the processes of a fleet through the store they already share:
//! [`Fleet`] (the settings), [`FleetHandle`] (the task that publishes and applies), and
//! [`FleetOverride`] (an operator's word for the whole fleet).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::keyed::Registry;
use super::state::Shared;
use crate::Clock;
use crate::build_error::BuildError;
use crate::status::State;
use crate::store::{AuditAction, AuditEntry, Filter, FleetNote, Store, StoreError};

/// The version of the notes this crate writes; a note of a higher version is ignored.
const VERSION: u32 = 1;
/// The author of an operator's override.
pub(crate) const OPERATOR: &str = "operator";
/// How far ahead of this process's clock a peer's time may be before its note is ignored.
const SKEW: Duration = Duration::from_secs(60);
/// The longest an override or an open period read from a note may last.
const MAX_AHEAD: Duration = Duration::from_secs(7 * 24 * 3600);

/// How the breakers of one process take part in a fleet: the processes that share a dead-letter
/// store (Postgres, Redis, Redis Cluster, or one SQLite file on one machine) tell each other,
/// through it, what their breakers saw, and act on it together. Start it with
/// [`BreakerLayer::share`](super::BreakerLayer::share) or
/// [`BackstopLayer::share_breakers`](crate::preset::BackstopLayer::share_breakers).
///
/// A task of its own (never a call's path: a call reads its breaker's atomics as before) every
/// [`every`](Self::every):
/// - **publishes** each breaker's state as a [`FleetNote`] (`breaker:<name>`, written when it
///   changed and at least once a second, read for [`ttl`](Self::ttl)): open or closed, when it
///   opened, when it half-opens, when probes last closed it, and whether it opened on its own
///   failures;
/// - **opens** a closed breaker when a quorum of the fleet's processes that know that breaker
///   opened it on their own failures: at least [`quorum`](Self::quorum) processes (2) and more
///   than [`quorum_share`](Self::quorum_share) of them (half). One process whose own route to a
///   provider fails opens only its own breaker: the others open only on the word of a second
///   one, as Envoy's outlier detection ejects no more than `max_ejection_percent` of the hosts
///   on outliers' evidence. A breaker opened so does not count towards a quorum itself;
///   It also opens when the failing processes together meet its own rule: at least as many as
///   a quorum, each failing over the rule's rate, their calls together over its minimum and
///   its rate (or their failures in a row together at its count), so that a fleet pays about
///   one process's failures to learn that a provider is down, not one per process;
/// - **probes once for the fleet**: one process probes, the one that opened last on its own
///   failures (its probe failed most recently; ties by process id); every other open breaker
///   stays open until the prober's half-open time plus [`probe_grace`](Self::probe_grace)
///   (1 s), and closes without a probe of its own when the prober's succeeds. The prober probes
///   at least every [`probe_every`](Self::probe_every) (5 s), whatever its open duration grew
///   to. With no such process (every breaker opened on the fleet's word), the first to
///   half-open probes;
/// - **closes** an open or half-open breaker when another process's probes closed it after it
///   opened here (within [`every`](Self::every) twice, plus the store's round trips);
/// - **applies an operator's override** ([`FleetOverride`]): force open or disable until its
///   expiry, reset once; the later override wins; an expired one ends by itself (the breaker
///   is reset).
///
/// A store that is slow (each call bounded by [`timeout`](Self::timeout)) or down, or keeps no
/// notes, leaves every process on its own breakers; the task says so once and goes on trying.
/// A peer's note that cannot be read, comes from a newer version, or names a time more than a
/// minute ahead is ignored, counted ([`FleetStatus::ignored`]) and logged once per peer.
///
/// The processes' clocks are compared (a probe's time against an opening's): keep them in step
/// (NTP).
#[derive(Clone, Debug)]
pub struct Fleet {
    pub(crate) process: String,
    pub(crate) every: Duration,
    pub(crate) ttl: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) quorum: usize,
    pub(crate) share: f64,
    pub(crate) grace: Duration,
    pub(crate) probe_every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) clock: Clock,
}

impl Default for Fleet {
    fn default() -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        Fleet {
            process: format!("pid{}-{started:x}", std::process::id()),
            every: Duration::from_millis(250),
            ttl: Duration::from_secs(3),
            heartbeat: Duration::from_secs(1),
            quorum: 2,
            share: 0.5,
            grace: Duration::from_secs(1),
            probe_every: Duration::from_secs(5),
            timeout: Duration::from_millis(500),
            clock: Clock::system(),
        }
    }
}

impl Fleet {
    /// The defaults: a process id of the OS process id and its start time, every 250 ms, notes
    /// read for 3 s (written at least each second), a quorum of 2 and at least half, a probe
    /// grace of 1 s, store calls bounded by 500 ms, the system clock.
    pub fn new() -> Self {
        Fleet::default()
    }

    /// This process's id in the fleet (unique per process start; the default is the OS process
    /// id and the start time in milliseconds, in hex: `pid4242-19a3f0c1d2e`).
    pub fn process(mut self, id: impl Into<String>) -> Self {
        self.process = id.into();
        self
    }

    /// How often the task publishes and reads (250 ms; above zero).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How long a note is read after it was written (3 s; at least twice the heartbeat of
    /// 1 s): a process that died is out of every quorum that long after its last note.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The fewest processes, this one included, that must have opened a breaker on their own
    /// failures for the others to open it (2; at least 2, so that one process never opens the
    /// fleet's breakers alone).
    pub fn quorum(mut self, processes: usize) -> Self {
        self.quorum = processes;
        self
    }

    /// The share of the processes that know a breaker (this one included) which must have
    /// opened it on their own failures for the others to open it (0.5, within `(0.0, 1.0]`).
    pub fn quorum_share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// How long after the fleet's first half-open time a breaker opened on the fleet's word
    /// half-opens itself, if no process's probe closed it by then (1 s).
    pub fn probe_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The longest the fleet goes without a probe of an open breaker (5 s; above zero): the
    /// prober's open period is cut to it, whatever the breaker's own open duration grew to,
    /// so that a recovery is found that soon. One prober for the fleet at this period sends
    /// fewer probes than each process at its own doubling period would, over an outage of a
    /// few minutes or less.
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = every;
        self
    }

    /// The bound on each store call of the task (500 ms; above zero).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Where the notes' times come from (the system clock; [`Clock::tokio`] in tests on a
    /// paused clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub(crate) fn check(&self) -> Result<(), BuildError> {
        if self.every.is_zero() {
            return Err(BuildError::new("Fleet::every", "0s", "must be above zero"));
        }
        if self.timeout.is_zero() {
            return Err(BuildError::new(
                "Fleet::timeout",
                "0s",
                "must be above zero",
            ));
        }
        if self.ttl < self.heartbeat * 2 {
            return Err(BuildError::new(
                "Fleet::ttl",
                humantime::format_duration(self.ttl),
                "must be at least 2s (twice the heartbeat)",
            ));
        }
        if self.quorum < 2 {
            return Err(BuildError::new(
                "Fleet::quorum",
                self.quorum,
                "must be at least 2: one process alone must not open the fleet's breakers",
            ));
        }
        if !(self.share > 0.0 && self.share <= 1.0) {
            return Err(BuildError::new(
                "Fleet::quorum_share",
                self.share,
                "must be within (0.0, 1.0]",
            ));
        }
        if self.process.is_empty() || self.process == OPERATOR {
            return Err(BuildError::new(
                "Fleet::process",
                format!("{:?}", self.process),
                "must be a non-empty id other than \"operator\"",
            ));
        }
        Ok(())
    }
}

/// What an operator asks of one breaker for the whole fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OverrideAction {
    /// Reject every call until the override expires (a provider's planned maintenance).
    ForceOpen,
    /// Let every call through and count nothing until the override expires (a known-bad
    /// failure signal).
    Disable,
    /// Close the breaker now, once, in every process (its counts cleared).
    Reset,
}

impl OverrideAction {
    /// As shown and written: `force_open`, `disable`, `reset`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OverrideAction::ForceOpen => "force_open",
            OverrideAction::Disable => "disable",
            OverrideAction::Reset => "reset",
        }
    }
}

/// An operator's override of one breaker for every process of a fleet that shares its breakers
/// ([`Fleet`]), kept in the store as a [`FleetNote`] (topic `override:<name>`, author
/// `operator`) until it expires. A later override of the same breaker replaces it (the later
/// wins); each is written to the audit trail with its actor. Each process applies it within
/// a [`Fleet::every`] or two, shows it in its health report (the breaker's state and cause) and
/// metrics, and ends it by itself at its expiry. A reset is applied once by each process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FleetOverride {
    /// The breaker's name (a per-host breaker's `host:port`).
    pub breaker: String,
    /// What is asked.
    pub action: OverrideAction,
    /// When it ends (a reset's note is kept a minute, for the processes to read it).
    #[serde(with = "millis")]
    pub until: SystemTime,
    /// Why, in the operator's words.
    pub reason: String,
    /// Who.
    pub actor: String,
    /// When it was asked.
    #[serde(with = "millis")]
    pub at: SystemTime,
    #[serde(default = "version")]
    v: u32,
}

fn version() -> u32 {
    VERSION
}

/// How long a reset's note is kept.
const RESET_KEPT: Duration = Duration::from_secs(60);

impl FleetOverride {
    /// `action` on `breaker` for `duration` from `now` (a reset ignores `duration`), by
    /// `actor`, because of `reason`.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] when the name is empty, or `duration` is zero or longer than 7 days
    /// for a force-open or a disable.
    pub fn new(
        breaker: impl Into<String>,
        action: OverrideAction,
        duration: Duration,
        reason: impl Into<String>,
        actor: impl Into<String>,
        now: SystemTime,
    ) -> Result<Self, BuildError> {
        let breaker = breaker.into();
        if breaker.is_empty() {
            return Err(BuildError::new("breaker", "\"\"", "names no breaker"));
        }
        let duration = match action {
            OverrideAction::Reset => RESET_KEPT,
            _ if duration.is_zero() || duration > MAX_AHEAD => {
                return Err(BuildError::new(
                    "duration",
                    humantime::format_duration(duration),
                    "must be above zero and at most 7 days",
                ));
            }
            _ => duration,
        };
        // Kept to the millisecond, as the note says it.
        let now = from_ms(ms(now));
        Ok(FleetOverride {
            breaker,
            action,
            until: crate::store::add_clamped(now, duration),
            reason: reason.into(),
            actor: actor.into(),
            at: now,
            v: VERSION,
        })
    }

    /// The override as the note the store keeps.
    pub fn to_note(&self) -> FleetNote {
        let body = serde_json::to_string(self).unwrap_or_default();
        FleetNote {
            topic: format!("override:{}", self.breaker),
            author: OPERATOR.to_owned(),
            body,
            written_at: self.at,
            expires_at: self.until,
        }
    }

    /// The override a note holds, if it is one this version reads.
    pub fn from_note(note: &FleetNote) -> Option<Self> {
        if note.author != OPERATOR || !note.topic.starts_with("override:") {
            return None;
        }
        serde_json::from_str::<FleetOverride>(&note.body)
            .ok()
            .filter(|o| o.v <= VERSION && note.topic["override:".len()..] == o.breaker)
    }

    /// Writes the override for the fleet, then its audit entry.
    ///
    /// # Errors
    ///
    /// The store's [`StoreError`]: it keeps no notes (then nothing is written), or a write
    /// failed (the override may be written without its audit entry: the error says which).
    pub async fn publish(&self, store: &dyn Store) -> Result<(), StoreError> {
        store.put_note(self.to_note()).await?;
        let mut entry = AuditEntry::new(AuditAction::Breaker, self.actor.clone(), &Filter::new())
            .at(self.at)
            .outcome(self.describe());
        entry.filter = format!("breaker={}", self.breaker);
        store.append_audit(entry).await.map_err(|e| {
            StoreError::with_source("the override is written, but not its audit entry", e)
        })
    }

    /// In words: `force_open until 2026-12-07T16:00:00.000Z: provider maintenance`.
    pub fn describe(&self) -> String {
        match self.action {
            OverrideAction::Reset => format!("reset: {}", self.reason),
            action => format!(
                "{} until {}: {}",
                action.as_str(),
                humantime::format_rfc3339_millis(self.until),
                self.reason
            ),
        }
    }
}

/// A breaker's state as a process tells the fleet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Word {
    v: u32,
    state: String,
    /// Opened on its own failures (not on the fleet's word, not learned).
    #[serde(default)]
    own: bool,
    /// When it last opened, in ms since the epoch.
    #[serde(default)]
    opened_at: Option<u64>,
    /// When it half-opens, while open.
    #[serde(default)]
    half_opens_at: Option<u64>,
    /// When probes last closed it.
    #[serde(default)]
    closed_at: Option<u64>,
    #[serde(default)]
    cause: Option<String>,
    /// While closed and failing: the calls and failures it counts now (its window's, or its
    /// failures in a row for both); zeros while nothing fails.
    #[serde(default)]
    calls: u64,
    #[serde(default)]
    failures: u64,
}

fn ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::SystemTime;

    pub(super) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(super::ms(*t))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        u64::deserialize(d).map(super::from_ms)
    }
}

/// Where the fleet's task stands, for a health route or a test: see [`FleetHandle::status`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetStatus {
    /// This process's id.
    pub process: String,
    /// The other processes whose notes were read last time.
    pub peers: usize,
    /// Whether the last round trip to the store worked.
    pub store_up: bool,
    /// The last store error, while it fails.
    pub error: Option<String>,
    /// Peers' notes ignored so far (unreadable, from a newer version, or from the future).
    pub ignored: u64,
    /// The overrides in force, by breaker name.
    pub overrides: Vec<FleetOverride>,
    /// Breakers this process opened on the fleet's word, so far.
    pub opened_by_fleet: u64,
    /// Breakers this process closed because a peer's probe succeeded, so far.
    pub closed_by_fleet: u64,
}

/// The breakers of a layer, whatever its key type.
pub(crate) trait Breakers: Send + Sync + 'static {
    /// Every breaker kept.
    fn all(&self) -> Vec<Arc<Shared>>;
    /// The breaker of `name`, made if the layer is keyed and it is new; `None` for an unkeyed
    /// layer of another name.
    fn named(&self, name: &str) -> Option<Arc<Shared>>;
}

pub(crate) struct LayerBreakers<K> {
    pub(crate) unkeyed: Arc<Shared>,
    pub(crate) keys: Option<Arc<Registry<K>>>,
}

impl<K: Send + Sync + 'static> Breakers for LayerBreakers<K> {
    fn all(&self) -> Vec<Arc<Shared>> {
        match &self.keys {
            None => vec![Arc::clone(&self.unkeyed)],
            Some(keys) => keys.keys().iter().filter_map(|k| keys.find(k)).collect(),
        }
    }

    fn named(&self, name: &str) -> Option<Arc<Shared>> {
        match &self.keys {
            None => (*self.unkeyed.name == *name).then(|| Arc::clone(&self.unkeyed)),
            Some(keys) => Some(keys.get(name)),
        }
    }
}

/// The task that shares a layer's breakers with the fleet; it stops when dropped (or
/// [`stop`](Self::stop)ped). Keep it as long as the layer's services serve.
#[derive(Debug)]
pub struct FleetHandle {
    status: Arc<Mutex<FleetStatus>>,
    task: tokio::task::JoinHandle<()>,
}

impl FleetHandle {
    /// Where the task stands now.
    pub fn status(&self) -> FleetStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops sharing: the breakers act alone from now on (their notes expire in the fleet's
    /// reads within their ttl).
    pub fn stop(self) {}
}

impl Drop for FleetHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the task on the current tokio runtime.
pub(crate) fn start(
    breakers: Arc<dyn Breakers>,
    store: Arc<dyn Store>,
    fleet: Fleet,
) -> Result<FleetHandle, BuildError> {
    fleet.check()?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        BuildError::new(
            "share",
            "no tokio runtime",
            "call it inside a tokio runtime: it starts a task",
        )
    })?;
    let status = Arc::new(Mutex::new(FleetStatus {
        process: fleet.process.clone(),
        store_up: true,
        ..FleetStatus::default()
    }));
    let task = Task {
        breakers,
        store,
        fleet,
        status: Arc::clone(&status),
        said: HashMap::new(),
        by_fleet: HashSet::new(),
        applied: HashMap::new(),
        warned: HashSet::new(),
        closed_here: HashMap::new(),
        down_said: false,
    };
    let task = runtime.spawn(task.run());
    Ok(FleetHandle { status, task })
}

/// A peer's word on one breaker.
struct Peer {
    author: String,
    word: Word,
}

struct Task {
    breakers: Arc<dyn Breakers>,
    store: Arc<dyn Store>,
    fleet: Fleet,
    status: Arc<Mutex<FleetStatus>>,
    /// What was last published for each breaker, and when.
    said: HashMap<String, (Word, Instant)>,
    /// The breakers this process opened on the fleet's word (they do not count in a quorum).
    by_fleet: HashSet<String>,
    /// The override applied to each breaker: its action and when it was asked.
    applied: HashMap<String, (OverrideAction, SystemTime)>,
    /// The peers whose ignored note was logged.
    warned: HashSet<String>,
    /// When this process last closed each breaker on a peer's word.
    closed_here: HashMap<String, SystemTime>,
    /// Whether the store's failure was logged.
    down_said: bool,
}

impl Task {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.fleet.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.round().await;
        }
    }

    fn status(&self, f: impl FnOnce(&mut FleetStatus)) {
        f(&mut self.status.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn store_failed(&mut self, what: &str, e: &StoreError) {
        if !self.down_said {
            self.down_said = true;
            tracing::warn!(process = %self.fleet.process, error = %e, "cannot {what} the fleet's breaker notes: each breaker acts on its own until the store answers");
        }
        let error = format!("{what}: {e}");
        self.status(|s| {
            s.store_up = false;
            s.error = Some(error);
        });
    }

    async fn round(&mut self) {
        let now = self.fleet.clock.now();
        let read = tokio::time::timeout(self.fleet.timeout, self.store.notes(now)).await;
        let notes = match read {
            Ok(Ok(notes)) => notes,
            Ok(Err(e)) => return self.store_failed("read", &e),
            Err(_) => return self.store_failed("read", &StoreError::new("timed out")),
        };
        if self.down_said {
            self.down_said = false;
            tracing::info!(process = %self.fleet.process, "the fleet's breaker notes are read again");
        }
        let (peers, overrides, authors) = self.sort(notes, now);
        self.apply_overrides(&overrides, now);
        for (name, peers) in &peers {
            if overrides.contains_key(name) {
                continue;
            }
            if let Some(shared) = self.breakers.named(name) {
                self.apply(&shared, peers, now);
            }
        }
        self.publish(now).await;
        let by_override: Vec<FleetOverride> = overrides.into_values().collect();
        self.status(|s| {
            s.peers = authors;
            s.overrides = by_override;
        });
    }

    /// The peers' words by breaker, the overrides in force by breaker, and how many peers
    /// wrote.
    fn sort(
        &mut self,
        notes: Vec<FleetNote>,
        now: SystemTime,
    ) -> (
        HashMap<String, Vec<Peer>>,
        HashMap<String, FleetOverride>,
        usize,
    ) {
        let mut peers: HashMap<String, Vec<Peer>> = HashMap::new();
        let mut overrides: HashMap<String, FleetOverride> = HashMap::new();
        let mut authors = HashSet::new();
        let ahead = crate::store::add_clamped(now, SKEW);
        for note in notes {
            if note.author == self.fleet.process {
                continue;
            }
            if note.author == OPERATOR {
                match FleetOverride::from_note(&note) {
                    Some(o) if o.at <= ahead && o.until <= ahead + MAX_AHEAD => {
                        let later = overrides.get(&o.breaker).is_none_or(|old| old.at < o.at);
                        if later {
                            overrides.insert(o.breaker.clone(), o);
                        }
                    }
                    _ => self.ignore(&note, "an override this version cannot read"),
                }
                continue;
            }
            let Some(name) = note.topic.strip_prefix("breaker:") else {
                continue;
            };
            let word = match serde_json::from_str::<Word>(&note.body) {
                Ok(word) if word.v > VERSION => {
                    self.ignore(&note, "a note from a newer version");
                    continue;
                }
                Ok(word) => word,
                Err(_) => {
                    self.ignore(&note, "a note that cannot be read");
                    continue;
                }
            };
            let future = |t: Option<u64>, limit: SystemTime| t.is_some_and(|t| from_ms(t) > limit);
            if note.written_at > ahead
                || future(word.opened_at, ahead)
                || future(word.closed_at, ahead)
                || future(word.half_opens_at, ahead + MAX_AHEAD)
            {
                self.ignore(
                    &note,
                    "a note that names a time ahead of this process's clock",
                );
                continue;
            }
            authors.insert(note.author.clone());
            peers.entry(name.to_owned()).or_default().push(Peer {
                author: note.author,
                word,
            });
        }
        (peers, overrides, authors.len())
    }

    fn ignore(&mut self, note: &FleetNote, why: &str) {
        self.status(|s| s.ignored += 1);
        if self.warned.insert(note.author.clone()) {
            tracing::warn!(process = %self.fleet.process, author = %note.author, topic = %note.topic, "ignored {why} (said once per author)");
        }
    }

    /// Applies the overrides in force, and ends those that expired or were replaced.
    fn apply_overrides(&mut self, overrides: &HashMap<String, FleetOverride>, now: SystemTime) {
        for (name, o) in overrides {
            if self.applied.get(name) == Some(&(o.action, o.at)) {
                continue;
            }
            let Some(shared) = self.breakers.named(name) else {
                continue;
            };
            if o.until <= now {
                continue;
            }
            tracing::warn!(process = %self.fleet.process, breaker = %name, actor = %o.actor, "operator's override for the fleet: {}", o.describe());
            match o.action {
                OverrideAction::ForceOpen => {
                    shared.force_open();
                    shared.overridden(format!(
                        "operator's override for the fleet by {}: {}",
                        o.actor,
                        o.describe()
                    ));
                }
                OverrideAction::Disable => shared.disable(),
                OverrideAction::Reset => shared.reset(),
            }
            self.by_fleet.remove(name);
            self.applied.insert(name.clone(), (o.action, o.at));
        }
        let ended: Vec<String> = self
            .applied
            .iter()
            .filter(|(name, (action, _))| {
                *action != OverrideAction::Reset && !overrides.contains_key(*name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in ended {
            self.applied.remove(&name);
            if let Some(shared) = self.breakers.named(&name)
                && matches!(shared.state(), State::ForcedOpen | State::Disabled)
            {
                tracing::info!(process = %self.fleet.process, breaker = %name, "the operator's override ended; the breaker is reset");
                shared.reset();
            }
        }
    }

    /// Acts on the peers' words on one breaker.
    fn apply(&mut self, shared: &Shared, peers: &[Peer], now: SystemTime) {
        let state = shared.state();
        if state == State::Closed {
            self.by_fleet.remove(&*shared.name);
        }
        // The first process to half-open, whoever opened it.
        let first_half_open = peers
            .iter()
            .filter(|p| p.word.state == "open")
            .filter_map(|p| p.word.half_opens_at)
            .min()
            .map(from_ms);
        match state {
            State::Closed => self.open_on_evidence(shared, peers, first_half_open, now),
            State::Open | State::HalfOpen => {
                let (opened, _) = shared.opened_and_closed_at();
                let opened = opened.map(|at| self.wall_of(shared, at, now));
                if !self.close_on_probe(shared, peers, opened, now) && state == State::Open {
                    self.wait_for_prober(shared, peers, opened, first_half_open, now);
                }
            }
            State::ForcedOpen | State::Disabled => {}
        }
    }

    /// A closed breaker: opens it when a quorum of the peers opened it on their own failures,
    /// or the failing processes' failures together meet its rule. A peer's opening older than
    /// this breaker's last close (its own probe's, or the fleet's) is no evidence: the provider
    /// answered here since.
    fn open_on_evidence(
        &mut self,
        shared: &Shared,
        peers: &[Peer],
        first_half_open: Option<SystemTime>,
        now: SystemTime,
    ) {
        let name = &*shared.name;
        let (_, closed) = shared.opened_and_closed_at();
        let closed = closed
            .map(|at| self.wall_of(shared, at, now))
            .max(self.closed_here.get(name).copied());
        let fresh =
            |p: &Peer| closed.is_none_or(|c| p.word.opened_at.is_some_and(|o| from_ms(o) > c));
        let own_open: Vec<&Peer> = peers
            .iter()
            .filter(|p| p.word.own && matches!(p.word.state.as_str(), "open" | "half_open"))
            .filter(|p| fresh(p))
            .collect();
        let knowing = peers.len() + 1;
        let needed = self
            .fleet
            .quorum
            .max((knowing as f64 * self.fleet.share).ceil() as usize);
        let learned = if own_open.len() >= needed {
            let cause = own_open.iter().find_map(|p| p.word.cause.as_deref());
            format!(
                "opened by the fleet: {} of {knowing} processes found it open (first: {}); {}",
                own_open.len(),
                own_open[0].author,
                cause.unwrap_or("cause unknown")
            )
        } else {
            let evidence: Vec<&Peer> = peers
                .iter()
                .filter(|p| p.word.state == "closed" || fresh(p))
                .collect();
            let Some((n, calls, failures)) = fleet_fails(shared, &evidence, needed) else {
                return;
            };
            format!(
                "opened by the fleet: {n} of {knowing} processes failing, {failures} of their \
                 {calls} calls failed"
            )
        };
        let until = match first_half_open {
            Some(first) => crate::store::add_clamped(first.max(now), self.fleet.grace),
            None => crate::store::add_clamped(now, shared.next_open_duration()),
        };
        if shared.open_learned(
            instant_of(until, now),
            learned,
            "opened on the fleet's word",
        ) {
            self.by_fleet.insert(name.to_owned());
            self.status(|s| s.opened_by_fleet += 1);
        }
    }

    /// An open or half-open breaker that opened at `opened`: closes it when a peer's probes
    /// closed theirs since; whether a peer did.
    fn close_on_probe(
        &mut self,
        shared: &Shared,
        peers: &[Peer],
        opened: Option<SystemTime>,
        now: SystemTime,
    ) -> bool {
        let name = &*shared.name;
        let closed_after = peers.iter().find(|p| {
            p.word.state == "closed"
                && p.word
                    .closed_at
                    .is_some_and(|c| opened.is_none_or(|o| from_ms(c) > o))
        });
        let Some(peer) = closed_after else {
            return false;
        };
        if shared.close_for_fleet() {
            self.closed_here.insert(name.to_owned(), now);
            tracing::info!(process = %self.fleet.process, breaker = %name, by = %peer.author, "breaker closed: a probe succeeded in another process");
            self.by_fleet.remove(name);
            self.status(|s| s.closed_by_fleet += 1);
        }
        true
    }

    /// Probe once for the fleet: one prober, the process that opened last on its own failures
    /// (its probe failed most recently; ties by id), and the others wait for its probe, a grace
    /// after its half-open time; with none such, the process that half-opens first probes. The
    /// prober probes at least every `probe_every`, whatever its own open duration grew to.
    fn wait_for_prober(
        &self,
        shared: &Shared,
        peers: &[Peer],
        opened: Option<SystemTime>,
        first_half_open: Option<SystemTime>,
        now: SystemTime,
    ) {
        let Some(mine) = shared.half_opens_at() else {
            return;
        };
        let mine = self.wall_of(shared, mine, now);
        let me_own = !self.by_fleet.contains(&*shared.name);
        let my_open = opened.map(ms).unwrap_or(0);
        let prober = peers
            .iter()
            .filter(|p| p.word.own && p.word.state == "open")
            .filter_map(|p| Some((p.word.opened_at?, p.author.as_str(), p.word.half_opens_at?)))
            .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let wait = match prober {
            Some((at, author, half))
                if !me_own || (at, author) > (my_open, self.fleet.process.as_str()) =>
            {
                Some(from_ms(half))
            }
            Some(_) => None,
            None => first_half_open.filter(|first| *first < mine),
        };
        if let Some(wait) = wait {
            let until = crate::store::add_clamped(wait.max(now), self.fleet.grace);
            if until > mine {
                shared.stay_open_until(instant_of(until, now));
            }
        } else if let Some(opened) = opened {
            // This process is the prober: the fleet learns of a recovery that soon.
            let latest = crate::store::add_clamped(opened, self.fleet.probe_every);
            if latest < mine {
                shared.open_at_most_until(instant_of(latest.max(now), now));
            }
        }
    }

    /// A time on `shared`'s clock (nanoseconds since it was made) as a wall time.
    fn wall_of(&self, shared: &Shared, nanos: u64, now: SystemTime) -> SystemTime {
        let now_nanos = shared.now_nanos();
        if nanos <= now_nanos {
            now.checked_sub(Duration::from_nanos(now_nanos - nanos))
                .unwrap_or(now)
        } else {
            crate::store::add_clamped(now, Duration::from_nanos(nanos - now_nanos))
        }
    }

    /// Publishes each breaker's word when it changed, or at the heartbeat.
    async fn publish(&mut self, now: SystemTime) {
        let at = Instant::now();
        let mut notes = Vec::new();
        for shared in self.breakers.all() {
            let word = self.word_of(&shared, now);
            let name = shared.name.to_string();
            let due = match self.said.get(&name) {
                Some((said, when)) => {
                    *said != word || at.duration_since(*when) >= self.fleet.heartbeat
                }
                None => true,
            };
            if due {
                let body = serde_json::to_string(&word).unwrap_or_default();
                notes.push((
                    name.clone(),
                    word,
                    FleetNote::new(
                        format!("breaker:{name}"),
                        self.fleet.process.clone(),
                        body,
                        now,
                        self.fleet.ttl,
                    ),
                ));
            }
        }
        for (name, word, note) in notes {
            match tokio::time::timeout(self.fleet.timeout, self.store.put_note(note)).await {
                Ok(Ok(())) => {
                    self.said.insert(name, (word, at));
                    self.status(|s| {
                        s.store_up = true;
                        s.error = None;
                    });
                }
                Ok(Err(e)) => return self.store_failed("write", &e),
                Err(_) => return self.store_failed("write", &StoreError::new("timed out")),
            }
        }
    }

    fn word_of(&self, shared: &Shared, now: SystemTime) -> Word {
        let state = shared.state();
        let (opened, closed) = shared.opened_and_closed_at();
        let wall = |n: u64| ms(self.wall_of(shared, n, now));
        let open = matches!(state, State::Open | State::HalfOpen);
        // A breaker opened on the fleet's word keeps the failures it had counted: they are
        // still evidence for the processes that have not opened yet.
        let by_fleet = self.by_fleet.contains(&*shared.name);
        let (calls, failures) = if state == State::Closed || (open && by_fleet) {
            failing(shared)
        } else {
            (0, 0)
        };
        Word {
            calls,
            failures,
            v: VERSION,
            state: state.as_str().to_owned(),
            own: open && !self.by_fleet.contains(&*shared.name),
            opened_at: opened.map(wall),
            half_opens_at: shared.half_opens_at().map(wall),
            closed_at: closed.map(wall),
            cause: open.then(|| shared.snapshot().cause).flatten(),
        }
    }
}

/// The calls and failures a closed breaker counts now, as the fleet weighs them: its window's
/// under a rate rule, while its failures are over the rule's rate; its failures in a row under
/// the consecutive rule; zeros otherwise (so that the note of a healthy breaker, or of one
/// with a few failures now and then, does not change with each call).
fn failing(shared: &Shared) -> (u64, u64) {
    let stats = shared.stats();
    match shared.rule() {
        (_, Some((rate, _)))
            if stats.window_failures > 0
                && stats.window_failures as f64 >= rate * stats.window_calls as f64 =>
        {
            (stats.window_calls, stats.window_failures)
        }
        (Some(_), _) if stats.consecutive_failures > 0 => {
            let n = u64::from(stats.consecutive_failures);
            (n, n)
        }
        _ => (0, 0),
    }
}

/// Whether the fleet's failing processes, together, meet `shared`'s own rule: at least
/// `needed` of them (this one included when it fails) each over the rule's rate, and their
/// calls together over its minimum and its rate (or their failures in a row together at its
/// count). One failing process is never enough.
fn fleet_fails(shared: &Shared, peers: &[&Peer], needed: usize) -> Option<(usize, u64, u64)> {
    let mine = failing(shared);
    let (consecutive, rate) = shared.rule();
    let over = |(calls, failures): (u64, u64)| {
        calls > 0
            && match rate {
                Some((rate, _)) => failures as f64 >= rate * calls as f64,
                None => failures == calls,
            }
    };
    let failing: Vec<(u64, u64)> = peers
        .iter()
        .filter(|p| p.word.state == "closed" || !p.word.own)
        .map(|p| (p.word.calls, p.word.failures))
        .chain(std::iter::once(mine))
        .filter(|w| over(*w))
        .collect();
    if failing.len() < needed {
        return None;
    }
    let calls: u64 = failing.iter().map(|w| w.0).sum();
    let failures: u64 = failing.iter().map(|w| w.1).sum();
    let met = match (rate, consecutive) {
        (Some((rate, minimum)), _) => calls >= minimum && failures as f64 >= rate * calls as f64,
        (None, Some(n)) => failures >= u64::from(n),
        (None, None) => false,
    };
    met.then_some((failing.len(), calls, failures))
}

/// The tokio instant of the wall time `t`, `now` being the wall time now.
fn instant_of(t: SystemTime, now: SystemTime) -> Instant {
    Instant::now() + t.duration_since(now).unwrap_or_default()
}

/// What a fleet's notes say of one breaker, for a process that starts.
pub(crate) enum Said {
    /// A process that knows it has it closed: the provider is not known to be down.
    Closed,
    /// Every process that knows it has it open: the earliest half-open time among them.
    OpenUntil(SystemTime),
}

/// What `notes` say of the breaker `name`; `None` when no process wrote of it.
pub(crate) fn fleet_says(notes: &[FleetNote], name: &str) -> Option<Said> {
    let topic = format!("breaker:{name}");
    let words: Vec<Word> = notes
        .iter()
        .filter(|n| n.topic == topic && n.author != OPERATOR)
        .filter_map(|n| serde_json::from_str::<Word>(&n.body).ok())
        .filter(|w| w.v <= VERSION)
        .collect();
    if words.is_empty() {
        return None;
    }
    if words.iter().any(|w| w.state == "closed") {
        return Some(Said::Closed);
    }
    let until = words.iter().filter_map(|w| w.half_opens_at).min();
    Some(Said::OpenUntil(until.map_or(UNIX_EPOCH, from_ms)))
}
