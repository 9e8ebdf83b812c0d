//! One run over one store: the provider, the children, the outage, the kill mid-drain and the
//! restart, and the wait until the store has settled.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::BoxError;
use tower_backstop::store::{Filter, Record, Status, Store};

use super::child::Settings;
use super::fleet::{Child, Event, Line};
use super::provider::{self, Provider, Resend, Seen};
use super::stores::{self, Kind};
use super::{CHILDREN, Plan, key_of};

/// What a run saw, for the report.
pub struct Outcome {
    pub kind: Kind,
    pub plan: Plan,
    pub keys: HashMap<String, Seen>,
    pub resends: Vec<Resend>,
    pub keyless: u64,
    /// Every record in the store at the end.
    pub records: Vec<Record>,
    pub down_at: Instant,
    pub recovered_at: Option<Instant>,
    pub backlog_at_recovery: u64,
    pub peak_backlog: u64,
    /// When the store had nothing outstanding and every share was acknowledged.
    pub settled_at: Option<Instant>,
    pub kill: Option<Kill>,
    /// The last outcome each child acknowledged, by key.
    pub acks: HashMap<String, String>,
    /// Children that exited when asked (their stdin closed), of those stopped.
    pub stopped_cleanly: usize,
    /// Exits nobody asked for.
    pub unexpected_exits: Vec<String>,
    /// With `--store-outage`: what the store's outage and the spools did.
    pub store_outage: Option<StoreOutage>,
    /// Children chosen to be killed but found holding no claim once stopped, and let go on
    /// (by index), before the kill.
    pub spared: Vec<usize>,
    /// The breakers and the requests on the wire, as the children told them.
    pub breakers: super::breakers::Log,
    /// When the provider went down and came back, in unix ms.
    pub down_ms: u128,
    pub recovered_ms: Option<u128>,
}

/// The store's outage: when, and what the processes' spools held and when they drained.
#[derive(Default)]
pub struct StoreOutage {
    pub stopped_at: Option<Instant>,
    pub started_at: Option<Instant>,
    /// The most records the spools held together.
    pub peak_spooled: u64,
    /// When the spools were last seen going from some records to none, after the store's
    /// return.
    pub drained_at: Option<Instant>,
    /// Records the spools hold at the end.
    pub left: u64,
    /// Looks at the store that failed while it was down or coming back (the parent's own).
    pub failed_looks: usize,
}

/// The kill mid-drain and what followed.
pub struct Kill {
    pub index: usize,
    /// When it was stopped (SIGSTOP) before the kill: its claims stood still from then on.
    pub at: Instant,
    /// Outstanding records and re-sends since the recovery, at the kill.
    pub backlog: u64,
    pub resends_before: usize,
    /// Records in flight at the kill (any process's).
    pub in_flight: usize,
    /// Of those, the ones the parent saw the killed process hold while it was stopped, before
    /// the kill: in flight under the last claim its tap told of them (claims whose answer was
    /// still on its way to it are not among them).
    pub held: usize,
    /// Those not yet seen changed: each with its fencing token and the end of its claim.
    pending: Vec<Claimed>,
    /// Deferred records due no later than the latest end of a claim in flight at the kill:
    /// ahead of the killed process's claims in the retry-at order in which schedulers claim.
    pub due_ahead: usize,
    /// The killed process's claims: claimed again (by another scheduler) after this long.
    pub taken_over: Vec<(String, Duration)>,
    /// Claims of live processes, finished by them.
    pub finished_by_holder: usize,
    /// Messages of the killed child's share it had not acknowledged: handed to the new process.
    pub unacked: HashSet<String>,
    pub restart_ready_after: Option<Duration>,
}

impl Kill {
    /// Whether no claim held at the kill is still waiting.
    pub fn tracked_all(&self) -> bool {
        self.pending.is_empty()
    }

    /// Keys whose claim at the kill is still unchanged.
    pub fn still_held(&self) -> Vec<String> {
        self.pending.iter().map(|c| c.id.clone()).collect()
    }

    /// Looks at each claim held at the kill. Claimed again (a higher fencing token), or
    /// changed only after the claim's end (taken, then given back at once by a scheduler whose
    /// breaker was open, which lowers the token again): it was the killed process's, taken
    /// over. Renewed, or changed before the claim's end: its holder was alive.
    async fn look(&mut self, store: &dyn Store) -> Result<(), BoxError> {
        let mut waiting = Vec::new();
        for claim in std::mem::take(&mut self.pending) {
            let record = store.get(&claim.id).await?;
            let unchanged = record.as_ref().is_some_and(|r| {
                r.status == Status::InFlight
                    && r.resends == claim.token
                    && r.retry_at == Some(claim.until)
            });
            let taken = record.as_ref().is_some_and(|r| r.resends > claim.token)
                || SystemTime::now() >= claim.until;
            if unchanged {
                waiting.push(claim);
            } else if taken {
                self.taken_over.push((claim.id, self.at.elapsed()));
            } else {
                self.finished_by_holder += 1;
            }
        }
        self.pending = waiting;
        Ok(())
    }
}

/// A claim in flight at the kill.
struct Claimed {
    id: String,
    token: u32,
    /// Its end: the record's retry-at while claimed.
    until: SystemTime,
}

fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()
}

/// Who took a claim: the child, its start, and the claim's fencing token and end (Unix
/// milliseconds).
#[derive(Clone, Copy)]
struct Taker {
    index: usize,
    generation: u32,
    token: u32,
    until_ms: u64,
}

impl Taker {
    /// Whether `record` is in flight under this claim: its token, and its end (to the
    /// millisecond, as the stores keep it). A later claim of a record given back carries the
    /// same token, but ends later.
    fn holds(&self, record: &Record) -> bool {
        record.lease().is_some_and(|lease| {
            let until = unix_ms(lease.until);
            lease.token == self.token && until.abs_diff(u128::from(self.until_ms)) <= 1
        })
    }
}

/// The children and what they said.
struct Fleet {
    settings: Vec<Settings>,
    children: Vec<Child>,
    events: mpsc::UnboundedReceiver<Event>,
    sender: mpsc::UnboundedSender<Event>,
    ready: Vec<bool>,
    done: Vec<bool>,
    /// The last claim of each record the children's lines told: the record's id, who took it
    /// (index and start) and the claim.
    claims: HashMap<String, Taker>,
    /// Records in each child's spool, as its lines tell.
    spooled: Vec<u64>,
    /// The children's breakers and requests on the wire, as their lines tell.
    breakers: super::breakers::Log,
    /// `(index, generation)` of the processes whose stdout closed.
    closed: HashSet<(usize, u32)>,
    acks: Vec<HashMap<String, String>>,
    start_ms: Option<u128>,
    restarted_at: Option<Instant>,
    restart_ready_after: Option<Duration>,
    unexpected_exits: Vec<String>,
    /// `(index, generation)` of the processes killed on purpose.
    killed: HashSet<(usize, u32)>,
    stopping: bool,
}

impl Fleet {
    fn start(settings: Vec<Settings>) -> Result<Fleet, BoxError> {
        let (sender, events) = mpsc::unbounded_channel();
        let children = settings
            .iter()
            .map(|s| Child::spawn(s, 0, &sender))
            .collect::<Result<Vec<_>, _>>()?;
        let n = children.len();
        Ok(Fleet {
            settings,
            children,
            events,
            sender,
            ready: vec![false; n],
            done: vec![false; n],
            claims: HashMap::new(),
            spooled: vec![0; n],
            breakers: super::breakers::Log::default(),
            closed: HashSet::new(),
            acks: vec![HashMap::new(); n],
            start_ms: None,
            restarted_at: None,
            restart_ready_after: None,
            unexpected_exits: Vec::new(),
            killed: HashSet::new(),
            stopping: false,
        })
    }

    /// Takes in every line written so far.
    fn absorb(&mut self) -> Result<(), BoxError> {
        while let Ok(Event {
            index,
            generation,
            line,
        }) = self.events.try_recv()
        {
            let current = self.children[index].generation == generation;
            match line {
                Line::Ack { key, outcome } => {
                    self.acks[index].insert(key, outcome);
                }
                Line::Ready if current => {
                    self.ready[index] = true;
                    if let (true, Some(ms)) = (generation > 0, self.start_ms) {
                        self.children[index].go(ms)?;
                        self.restart_ready_after = self.restarted_at.map(|at| at.elapsed());
                    }
                }
                Line::Done if current => self.done[index] = true,
                Line::Claim {
                    token,
                    until_ms,
                    id,
                } => {
                    let taker = Taker {
                        index,
                        generation,
                        token,
                        until_ms,
                    };
                    self.claims.insert(id, taker);
                }
                Line::Spool(n) if current => self.spooled[index] = n,
                Line::Breaker(state, ms) => {
                    self.breakers.states.push((index, generation, state, ms))
                }
                Line::Attempts(n, ms) => self.breakers.attempts.push((index, generation, n, ms)),
                Line::Closed => {
                    self.closed.insert((index, generation));
                    if !self.stopping && !self.killed.contains(&(index, generation)) {
                        self.unexpected_exits
                            .push(format!("child {index} (start {generation}) exited"));
                    }
                }
                Line::Other(text) => eprintln!("child {index}: {text}"),
                _ => {}
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self, bound: Duration) -> Result<(), BoxError> {
        let give_up = Instant::now() + bound;
        while !self.ready.iter().all(|r| *r) {
            if Instant::now() >= give_up || !self.unexpected_exits.is_empty() {
                return Err(format!("the children were not ready within {bound:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.absorb()?;
        }
        Ok(())
    }

    fn go(&mut self, start_ms: u128) -> Result<(), BoxError> {
        self.start_ms = Some(start_ms);
        self.children.iter_mut().try_for_each(|c| c.go(start_ms))
    }

    /// How many of `in_flight` (the records the store shows in flight) each child's current
    /// process holds: those in flight under the last claim its tap told of them. A claim the
    /// store shows but no tap told yet (its answer on its way) is no one's here.
    fn held(&self, in_flight: &[Record]) -> Vec<usize> {
        let mut held = vec![0; self.children.len()];
        for record in in_flight {
            let Some(taker) = self.claims.get(&record.id) else {
                continue;
            };
            let current = self.children[taker.index].generation == taker.generation;
            if current && taker.holds(record) {
                held[taker.index] += 1;
            }
        }
        held
    }

    /// The child holding the most of `in_flight`, when it holds at least 4 (a batch being
    /// sent), or at least 1 once `waited` passed 3 s.
    fn holder(&self, in_flight: &[Record], waited: Duration) -> Option<usize> {
        let least = if waited > Duration::from_secs(3) {
            1
        } else {
            4
        };
        let held = self.held(in_flight);
        (0..held.len())
            .max_by_key(|i| held[*i])
            .filter(|i| held[*i] >= least)
    }

    fn all_done(&self) -> bool {
        self.done.iter().all(|d| *d)
    }

    /// SIGKILLs child `index` and waits until it is gone.
    fn kill(&mut self, index: usize) -> Result<(), BoxError> {
        self.killed.insert((index, self.children[index].generation));
        self.children[index].kill()
    }

    /// Starts the killed child `index` again, once its last line is read, with the messages of
    /// its share it had not acknowledged; returns those.
    async fn restart(&mut self, index: usize) -> Result<HashSet<String>, BoxError> {
        let generation = self.children[index].generation;
        let give_up = Instant::now() + Duration::from_secs(5);
        while !self.closed.contains(&(index, generation)) && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.absorb()?;
        }
        let settings = &mut self.settings[index];
        let acked: HashSet<String> = self.acks[index].keys().cloned().collect();
        let unacked = (index..settings.messages)
            .step_by(settings.children)
            .map(key_of)
            .filter(|k| !acked.contains(k))
            .collect();
        settings.skip = acked;
        self.ready[index] = false;
        self.done[index] = false;
        self.restarted_at = Some(Instant::now());
        self.children[index] = Child::spawn(settings, generation + 1, &self.sender)?;
        Ok(unacked)
    }

    /// Closes every child's stdin and waits for each; how many exited by themselves.
    async fn stop(&mut self) -> usize {
        self.stopping = true;
        let mut clean = 0;
        for child in &mut self.children {
            clean += usize::from(child.stop(Duration::from_secs(20)).await);
        }
        clean
    }
}

/// Runs the soak over the store at `url` in a namespace of its own, removed afterwards; with
/// a store outage, over a server of the same kind of its own instead.
pub async fn run(url: &str, plan: Plan) -> Result<Outcome, BoxError> {
    let kind = Kind::of(url)?;
    if kind == Kind::Sentinel && plan.store_outage.is_none() {
        return Err("--store sentinel starts a primary, a replica and a Sentinel of its own: run it with --store-outage".into());
    }
    if let Some((after, _)) = plan.store_outage {
        let mut plan = plan;
        if kind == Kind::Sentinel {
            // The primary is killed and not started again: the store is back when the
            // Sentinel has promoted the replica (one second after the primary stopped
            // answering, then the failover), which the run waits for from 1 s on.
            plan.store_outage = Some((after, Duration::from_secs(1)));
        }
        let mut server = stores::Server::start(kind)?;
        let url = server.url();
        let spools = tempfile::tempdir()?;
        let outcome = run_on(&url, plan, kind, Some((&mut server, spools.path()))).await;
        return outcome;
    }
    run_on(url, plan, kind, None).await
}

/// The run over the store at `url`, with the server to stop and the spools' directory when the
/// store goes down.
async fn run_on(
    url: &str,
    plan: Plan,
    kind: Kind,
    outage: Option<(&mut stores::Server, &std::path::Path)>,
) -> Result<Outcome, BoxError> {
    let namespace = format!(
        "fleet_soak_{}_{}",
        std::process::id(),
        unix_ms(SystemTime::now())
    );
    // Opened here first, so that the schema exists before the children start.
    let store = stores::open(url, &namespace, 3).await?;
    let outcome = drive(url, &namespace, Arc::clone(&store), plan, kind, outage).await;
    drop(store);
    if let Err(e) = stores::remove(url, &namespace).await {
        eprintln!("fleet_soak: could not remove {namespace}: {e}");
    }
    outcome
}

fn settings(
    url: &str,
    namespace: &str,
    provider: &Provider,
    plan: Plan,
    spools: Option<&std::path::Path>,
) -> Vec<Settings> {
    (0..CHILDREN)
        .map(|index| Settings {
            store: url.to_owned(),
            namespace: namespace.to_owned(),
            provider: provider.addr,
            index,
            children: CHILDREN,
            messages: plan.messages,
            window: plan.window(),
            fleet_rate: plan.fleet_rate,
            skip: HashSet::new(),
            share_breakers: plan.share_breakers,
            spool: spools
                .filter(|_| plan.spool)
                .map(|dir| dir.join(format!("spool-{index}.db"))),
        })
        .collect()
}

/// Re-sends that reached the provider since `since`.
fn resends_since(provider: &Provider, since: Instant) -> usize {
    let since = since.into_std();
    provider.resends().iter().filter(|r| r.at >= since).count()
}

/// The timeline: the outage, the kill once the drain is under way, the wait until settled.
async fn drive(
    url: &str,
    namespace: &str,
    store: Arc<dyn Store>,
    plan: Plan,
    kind: Kind,
    outage: Option<(&mut stores::Server, &std::path::Path)>,
) -> Result<Outcome, BoxError> {
    let (mut server, spools) = outage.unzip();
    let provider = provider::start().await?;
    println!(
        "\n== fleet soak over {}: {CHILDREN} processes, {} messages over {:?}; provider {} refuses connections from {:?} for {:?}; fleet rate {}",
        kind.name(),
        plan.messages,
        plan.window(),
        provider.addr,
        plan.healthy,
        plan.down,
        plan.fleet_rate
            .map_or("off (50 a second per process)".to_owned(), |r| format!(
                "{r} a second"
            )),
    );
    if let (Some((after, _)), Kind::Sentinel) = (plan.store_outage, kind) {
        println!(
            "   the Redis primary (of this run's own, beside a replica and a Sentinel) killed {after:?} into the provider's outage and not started again: the Sentinel promotes the replica; each process spools what the store does not take"
        );
    } else if let Some((after, length)) = plan.store_outage {
        println!(
            "   the store ({}, a server of this run's own) stopped hard {after:?} into the provider's outage, for {length:?}; each process spools what it does not take",
            kind.name()
        );
    }
    let mut fleet = Fleet::start(settings(url, namespace, &provider, plan, spools))?;
    fleet.wait_ready(Duration::from_secs(60)).await?;
    let lead = Duration::from_millis(500);
    let t0 = Instant::now() + lead;
    fleet.go(unix_ms(SystemTime::now() + lead))?;
    let (down_at, up_at, end) = (
        t0 + plan.healthy,
        t0 + plan.healthy + plan.down,
        t0 + plan.window(),
    );
    let mut outcome = Outcome {
        kind,
        plan,
        keys: HashMap::new(),
        resends: Vec::new(),
        keyless: 0,
        records: Vec::new(),
        down_at,
        recovered_at: None,
        backlog_at_recovery: 0,
        peak_backlog: 0,
        settled_at: None,
        kill: None,
        acks: HashMap::new(),
        stopped_cleanly: 0,
        unexpected_exits: Vec::new(),
        store_outage: plan.store_outage.map(|_| StoreOutage::default()),
        spared: Vec::new(),
        breakers: super::breakers::Log::default(),
        down_ms: 0,
        recovered_ms: None,
    };
    let (store_down_at, store_up_at) = plan
        .store_outage
        .map(|(after, length)| (down_at + after, down_at + after + length))
        .unzip();
    let (mut went_down, mut armed) = (false, None);
    let mut backlog = 0;
    loop {
        // Closer looks while waiting for the moment to kill: claims come and go in batches.
        let tick = if armed.is_some() { 10 } else { 100 };
        tokio::time::sleep(Duration::from_millis(tick)).await;
        fleet.absorb()?;
        let now = Instant::now();
        if !went_down && now >= down_at {
            provider.set_up(false);
            outcome.down_ms = super::breakers::unix_ms();
            went_down = true;
        }
        if let (Some(server), Some(so)) = (server.as_deref_mut(), outcome.store_outage.as_mut()) {
            store_outage_step(server, so, &fleet, now, store_down_at, store_up_at)?;
        }
        let store_down = outcome
            .store_outage
            .as_ref()
            .is_some_and(|so| so.stopped_at.is_some() && so.started_at.is_none());
        // The parent's own looks may still fail for a moment after the store's return (its
        // pool reconnecting).
        let store_back = outcome.store_outage.as_ref().is_some_and(|so| {
            so.started_at
                .is_some_and(|at| at.elapsed() < Duration::from_secs(10))
        });
        match stores::outstanding(&*store).await {
            Ok(n) => backlog = n,
            // The parent's own looks fail while the store is down: the last count stands.
            Err(_) if store_down || store_back => {
                if let Some(so) = outcome.store_outage.as_mut() {
                    so.failed_looks += 1;
                }
            }
            Err(e) => return Err(e),
        }
        outcome.peak_backlog = outcome.peak_backlog.max(backlog);
        if went_down && outcome.recovered_at.is_none() && now >= up_at {
            provider.set_up(true);
            outcome.recovered_ms = Some(super::breakers::unix_ms());
            outcome.recovered_at = Some(now);
            outcome.backlog_at_recovery = backlog;
        }
        if let (Some(recovered), None) = (outcome.recovered_at, &outcome.kill) {
            let resends = resends_since(&provider, recovered);
            let tries_left = outcome.spared.len() < MAX_SPARED;
            if resends >= plan.kill_after_resends && backlog > 0 && tries_left {
                let since: &mut Instant = armed.get_or_insert(now);
                let waited = now.duration_since(*since);
                // Whose claims the records in flight are, from the store and the taps.
                let holder = match in_flight(&*store).await {
                    Ok(in_flight) => {
                        fleet.absorb()?;
                        fleet.holder(&in_flight, waited)
                    }
                    Err(_) if store_down || store_back => None,
                    Err(e) => return Err(e),
                };
                if let Some(index) = holder {
                    match kill(&mut fleet, index, &*store, backlog, resends).await? {
                        Some(kill) => {
                            outcome.kill = Some(kill);
                            armed = None;
                        }
                        None => outcome.spared.push(index),
                    }
                }
            }
        }
        if let Some(kill) = outcome.kill.as_mut() {
            kill.look(&*store).await?;
            kill.restart_ready_after = fleet.restart_ready_after;
        }
        let tracked = outcome.kill.as_ref().is_none_or(Kill::tracked_all);
        let spooled: u64 = fleet.spooled.iter().sum();
        if now >= end && fleet.all_done() && backlog == 0 && tracked && spooled == 0 && !store_down
        {
            outcome.settled_at = Some(now);
            break;
        }
        if now >= end + plan.settle_bound {
            break;
        }
    }
    finish(outcome, fleet, &provider, &*store).await
}

/// The store's outage at its times: stopped hard at `down_at`, started again at `up_at`; and
/// the spools' depth, its peak and when it drained after the store's return.
fn store_outage_step(
    server: &mut stores::Server,
    so: &mut StoreOutage,
    fleet: &Fleet,
    now: Instant,
    down_at: Option<Instant>,
    up_at: Option<Instant>,
) -> Result<(), BoxError> {
    if so.stopped_at.is_none() && down_at.is_some_and(|at| now >= at) {
        tokio::task::block_in_place(|| server.stop());
        so.stopped_at = Some(Instant::now());
        println!("store stopped hard");
    }
    if so.stopped_at.is_some() && so.started_at.is_none() && up_at.is_some_and(|at| now >= at) {
        tokio::task::block_in_place(|| server.start_again())?;
        so.started_at = Some(Instant::now());
        println!("store started again");
    }
    let spooled: u64 = fleet.spooled.iter().sum();
    so.peak_spooled = so.peak_spooled.max(spooled);
    if so.started_at.is_some() && spooled == 0 && so.drained_at.is_none() {
        so.drained_at = Some(now);
    }
    if spooled > 0 {
        so.drained_at = None;
    }
    Ok(())
}

/// The records in flight in the store (any process's claims).
async fn in_flight(store: &dyn Store) -> Result<Vec<Record>, BoxError> {
    let filter = Filter::new().status(Status::InFlight);
    Ok(store.search(&filter, 0..usize::MAX).await?)
}

/// How long a stopped child's store writes already sent are given to land before the parent
/// reads the store: on loopback, a write takes a few milliseconds.
const SETTLE: Duration = Duration::from_millis(100);

/// How many chosen children may be found holding no claim once stopped (each let go on)
/// before the parent stops choosing: the drain is then over, or nearly.
const MAX_SPARED: usize = 20;

/// Kills child `index` mid-drain while it holds claims, and restarts it. It is first stopped
/// (SIGSTOP), so that its claims stay as they are while the parent looks: once the store
/// writes it had sent have landed, the parent reads the records in flight, whose claims the
/// stopped process holds among them, and kills it (SIGKILL) only when it holds at least one;
/// otherwise it lets it go on (SIGCONT) and returns `None`, to choose again.
async fn kill(
    fleet: &mut Fleet,
    index: usize,
    store: &dyn Store,
    backlog: u64,
    resends_before: usize,
) -> Result<Option<Kill>, BoxError> {
    let at = Instant::now();
    let pid = fleet.children[index].pid();
    tokio::task::block_in_place(|| fleet.children[index].pause())?;
    tokio::time::sleep(SETTLE).await;
    // The killed process's claims, beside those of the live ones.
    let claims = match in_flight(store).await {
        Ok(claims) => claims,
        Err(e) => {
            fleet.children[index].resume()?;
            return Err(e);
        }
    };
    fleet.absorb()?;
    let held = fleet.held(&claims)[index];
    if held == 0 {
        fleet.children[index].resume()?;
        println!(
            "child {index} (pid {pid}), chosen to be killed, held no claim once stopped ({} records in flight): let go on, choosing again",
            claims.len()
        );
        return Ok(None);
    }
    println!(
        "killing child {index} (pid {pid}) with SIGKILL while it holds {held} claims (stopped with SIGSTOP {} ms before, {} records in flight): {resends_before} re-sends since the recovery, {backlog} records outstanding",
        at.elapsed().as_millis(),
        claims.len()
    );
    fleet.kill(index)?;
    let unacked = fleet.restart(index).await?;
    // A claimed record's retry-at is the end of its claim.
    let lease_end = claims.iter().filter_map(|r| r.retry_at).max();
    let deferred = store
        .search(&Filter::new().status(Status::Deferred), 0..usize::MAX)
        .await?;
    let due_ahead = deferred
        .iter()
        .filter(|r| r.retry_at.zip(lease_end).is_some_and(|(at, end)| at <= end))
        .count();
    Ok(Some(Kill {
        index,
        at,
        backlog,
        resends_before,
        in_flight: claims.len(),
        held,
        pending: claims
            .into_iter()
            .filter_map(|r| {
                let until = r.retry_at?;
                Some(Claimed {
                    id: r.id,
                    token: r.resends,
                    until,
                })
            })
            .collect(),
        due_ahead,
        taken_over: Vec::new(),
        finished_by_holder: 0,
        unacked,
        restart_ready_after: None,
    }))
}

async fn finish(
    mut outcome: Outcome,
    mut fleet: Fleet,
    provider: &Provider,
    store: &dyn Store,
) -> Result<Outcome, BoxError> {
    outcome.stopped_cleanly = fleet.stop().await;
    fleet.absorb()?;
    if let Some(so) = outcome.store_outage.as_mut() {
        so.left = fleet.spooled.iter().sum();
    }
    outcome.unexpected_exits = std::mem::take(&mut fleet.unexpected_exits);
    outcome.breakers = std::mem::take(&mut fleet.breakers);
    outcome.acks = fleet.acks.into_iter().flatten().collect();
    outcome.keys = provider.keys();
    outcome.resends = provider.resends();
    outcome.keyless = provider.keyless();
    outcome.records = store.list(usize::MAX).await?;
    Ok(outcome)
}
