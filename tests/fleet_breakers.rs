//! Breakers shared by the processes of a fleet through one store (`Fleet`), on tokio's paused
//! clock: each "process" is a breaker layer of its own over a provider of its own (so its route
//! can fail alone), all sharing one `MemoryStore`.

#![cfg(feature = "dead-letter")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::breaker::{
    BreakerHandle, BreakerLayer, Fleet, FleetHandle, FleetOverride, OverrideAction, State,
};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::store::{AuditAction, FleetNote, MemoryStore, Store};
use tower_backstop::{Clock, Failure};

type Response = http::Response<String>;

/// One process: its breaker (one, named `provider`: opens after 3 failures in a row for 5 s,
/// doubling to 40 s), its route to the provider, and its share in the fleet.
struct Process {
    breaker: BreakerHandle,
    svc: tower::util::BoxCloneSyncService<http::Request<String>, Response, Failure<Response>>,
    /// Requests that reached the provider from this process.
    calls: Arc<AtomicUsize>,
    /// Whether this process's route to the provider works.
    up: Arc<AtomicBool>,
    fleet: FleetHandle,
}

fn layer() -> BreakerLayer {
    BreakerLayer::builder()
        .name("provider")
        .consecutive_failures(3)
        .open_doubling(Duration::from_secs(5), Duration::from_secs(40))
        .build()
        .unwrap()
}

fn process(store: &MemoryStore, id: &str) -> Process {
    process_on(Arc::new(store.clone()), id)
}

fn process_on(store: Arc<dyn Store>, id: &str) -> Process {
    process_with(store, id, layer())
}

fn process_with(store: Arc<dyn Store>, id: &str, layer: BreakerLayer) -> Process {
    let fleet = layer
        .share(store, Fleet::new().process(id).clock(Clock::tokio()))
        .unwrap();
    let (calls, up) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(true)),
    );
    let (c, u) = (Arc::clone(&calls), Arc::clone(&up));
    let provider = tower::service_fn(move |_req: http::Request<String>| {
        c.fetch_add(1, Ordering::SeqCst);
        let code = if u.load(Ordering::SeqCst) { 200 } else { 503 };
        async move {
            Ok::<_, Infallible>(
                http::Response::builder()
                    .status(code)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let breaker = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ClassifyLayer::http())
        .service(provider);
    Process {
        breaker,
        svc: tower::util::BoxCloneSyncService::new(svc),
        calls,
        up,
        fleet,
    }
}

fn fleet(store: &MemoryStore, n: usize) -> Vec<Process> {
    (1..=n).map(|i| process(store, &format!("p{i}"))).collect()
}

impl Process {
    /// One call, its outcome ignored.
    async fn call(&self) -> Result<Response, Failure<Response>> {
        self.svc
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await
    }

    async fn calls(&self, n: usize) {
        for _ in 0..n {
            let _ = self.call().await;
        }
    }
}

fn states(fleet: &[Process]) -> Vec<State> {
    fleet.iter().map(|p| p.breaker.state()).collect()
}

async fn pass(d: Duration) {
    tokio::time::sleep(d).await;
}

/// The provider goes down: the first process to see three failures opens, alone (one process is
/// not a quorum); once a second one opens on its own failures, the other two open on the
/// fleet's word within a second, without a call of their own reaching the provider.
#[tokio::test(start_paused = true)]
async fn a_quorum_of_two_opens_every_process_within_a_second() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 4);
    pass(Duration::from_millis(600)).await;
    for p in &fleet {
        p.up.store(false, Ordering::SeqCst);
    }
    fleet[0].calls(3).await;
    pass(Duration::from_secs(2)).await;
    assert_eq!(
        states(&fleet),
        [State::Open, State::Closed, State::Closed, State::Closed],
        "one process alone opens no other"
    );
    fleet[1].calls(3).await;
    pass(Duration::from_millis(1_000)).await;
    assert_eq!(states(&fleet), [State::Open; 4]);
    for p in &fleet[2..] {
        assert_eq!(p.calls.load(Ordering::SeqCst), 0);
        assert_eq!(p.fleet.status().opened_by_fleet, 1);
        let rejected = p.call().await.unwrap_err();
        assert_eq!(rejected.class(), tower_backstop::Class::CIRCUIT_OPEN);
        let cause = std::error::Error::source(&rejected)
            .and_then(|s| s.downcast_ref::<tower_backstop::breaker::OpenError>())
            .and_then(|e| e.cause())
            .unwrap();
        assert!(
            cause.starts_with("opened by the fleet: 2 of 4 processes found it open (first: p"),
            "{cause}"
        );
    }
}

/// One process's own route fails; the others' works: only its breaker opens, for as long as
/// its route fails, whatever it publishes.
#[tokio::test(start_paused = true)]
async fn a_process_whose_own_route_fails_opens_only_its_own_breaker() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 4);
    fleet[0].up.store(false, Ordering::SeqCst);
    for _ in 0..60 {
        for p in &fleet {
            p.calls(3).await;
        }
        pass(Duration::from_secs(1)).await;
    }
    assert_eq!(
        states(&fleet)[1..],
        [State::Closed; 3],
        "the others never open"
    );
    assert_ne!(fleet[0].breaker.state(), State::Closed);
    for p in &fleet[1..] {
        assert_eq!(p.fleet.status().opened_by_fleet, 0);
        assert_eq!(p.fleet.status().peers, 3);
    }
}

/// After the outage, one process probes (the one whose probe is due first); its success closes
/// the others within a second, before their own half-open time and without a probe of their
/// own.
#[tokio::test(start_paused = true)]
async fn one_probe_anywhere_closes_every_process() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 4);
    for p in &fleet {
        p.up.store(false, Ordering::SeqCst);
    }
    fleet[0].calls(3).await;
    pass(Duration::from_millis(300)).await;
    fleet[1].calls(3).await;
    pass(Duration::from_secs(1)).await;
    assert_eq!(states(&fleet), [State::Open; 4]);
    let before: Vec<usize> = fleet
        .iter()
        .map(|p| p.calls.load(Ordering::SeqCst))
        .collect();
    for p in &fleet {
        p.up.store(true, Ordering::SeqCst);
    }
    // Every process keeps calling, as live traffic would; the first opener half-opens at 5 s.
    let mut closed_at = None;
    for tick in 0..100 {
        for p in &fleet {
            let _ = p.call().await;
        }
        pass(Duration::from_millis(100)).await;
        if closed_at.is_none() && states(&fleet) == [State::Closed; 4] {
            closed_at = Some(tick);
            break;
        }
    }
    assert!(closed_at.is_some(), "{:?}", states(&fleet));
    let probes: Vec<usize> = fleet
        .iter()
        .zip(&before)
        .map(|(p, b)| p.calls.load(Ordering::SeqCst) - b)
        .collect();
    // The prober's probe, then the calls of the ticks after it closed: at most a second of
    // ticks elsewhere. No other process half-opened and probed on its own.
    assert!(probes.iter().any(|n| *n > 0), "{probes:?}");
    for p in &fleet[1..] {
        assert!(p.fleet.status().closed_by_fleet <= 1);
    }
    assert_eq!(
        fleet
            .iter()
            .map(|p| p.fleet.status().closed_by_fleet)
            .sum::<u64>(),
        3,
        "three processes closed on the prober's word"
    );
}

/// An operator forces the provider's breaker open for the fleet: every process applies it within
/// a second, rejects every call, and shows the override; at its expiry each resets by itself.
/// Two operators at once: the later override wins, and both are in the audit trail.
#[tokio::test(start_paused = true)]
async fn an_operators_override_applies_everywhere_and_ends_by_itself() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 3);
    fleet[0].calls(1).await;
    pass(Duration::from_millis(300)).await;
    let now = Clock::tokio().now();
    let maintenance = FleetOverride::new(
        "provider",
        OverrideAction::ForceOpen,
        Duration::from_secs(60),
        "planned maintenance",
        "alice",
        now,
    )
    .unwrap();
    maintenance.publish(&store).await.unwrap();
    pass(Duration::from_millis(1_000)).await;
    assert_eq!(states(&fleet), [State::ForcedOpen; 3]);
    for p in &fleet {
        let rejected = p.call().await.unwrap_err();
        let cause = std::error::Error::source(&rejected)
            .and_then(|s| s.downcast_ref::<tower_backstop::breaker::OpenError>())
            .and_then(|e| e.cause())
            .unwrap();
        assert!(
            cause.contains("operator's override for the fleet by alice: force_open until ")
                && cause.ends_with(": planned maintenance"),
            "{cause}"
        );
        assert_eq!(
            p.calls.load(Ordering::SeqCst),
            usize::from(p.fleet.status().process == "p1")
        );
        assert_eq!(p.fleet.status().overrides, vec![maintenance.clone()]);
    }
    // Bob disables it a moment later: the later override wins.
    pass(Duration::from_secs(1)).await;
    let later = Clock::tokio().now();
    let disable = FleetOverride::new(
        "provider",
        OverrideAction::Disable,
        Duration::from_secs(30),
        "the health signal is wrong",
        "bob",
        later,
    )
    .unwrap();
    disable.publish(&store).await.unwrap();
    pass(Duration::from_millis(1_000)).await;
    assert_eq!(states(&fleet), [State::Disabled; 3]);
    let audit = store.audit(0..10).await.unwrap();
    let actors: Vec<(&str, AuditAction)> =
        audit.iter().map(|e| (e.actor.as_str(), e.action)).collect();
    assert_eq!(
        actors,
        [
            ("bob", AuditAction::Breaker),
            ("alice", AuditAction::Breaker)
        ]
    );
    assert_eq!(audit[0].filter, "breaker=provider");
    // At its expiry the override ends by itself: every breaker is closed again.
    pass(Duration::from_secs(30)).await;
    assert_eq!(states(&fleet), [State::Closed; 3]);
    for p in &fleet {
        assert!(p.fleet.status().overrides.is_empty());
    }
}

/// A reset for the fleet closes an open breaker in every process, once: a later opening is
/// not undone by the same reset.
#[tokio::test(start_paused = true)]
async fn a_reset_for_the_fleet_is_applied_once() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 2);
    fleet[0].up.store(false, Ordering::SeqCst);
    fleet[0].calls(3).await;
    assert_eq!(fleet[0].breaker.state(), State::Open);
    let reset = FleetOverride::new(
        "provider",
        OverrideAction::Reset,
        Duration::ZERO,
        "provider says it is fixed",
        "carol",
        Clock::tokio().now(),
    )
    .unwrap();
    reset.publish(&store).await.unwrap();
    pass(Duration::from_millis(600)).await;
    assert_eq!(states(&fleet), [State::Closed; 2]);
    fleet[0].calls(3).await;
    pass(Duration::from_secs(2)).await;
    assert_eq!(
        fleet[0].breaker.state(),
        State::Open,
        "the reset is not applied twice"
    );
}

/// Peers' notes that cannot be read, come from a newer version, or name a time far ahead are
/// ignored and counted; they open nothing.
#[tokio::test(start_paused = true)]
async fn bad_notes_from_peers_are_ignored_and_counted() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 1);
    let now = Clock::tokio().now();
    let ttl = Duration::from_secs(60);
    let open = |v: u32, opened_at: u64| {
        format!(
            r#"{{"v":{v},"state":"open","own":true,"opened_at":{opened_at},"half_opens_at":{opened_at}}}"#
        )
    };
    let now_ms = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (author, body) in [
        ("garbled", "{not json".to_owned()),
        ("newer", open(2, now_ms)),
        ("future", open(1, now_ms + 3_600_000)),
        ("future-2", open(1, now_ms + 3_600_000)),
    ] {
        store
            .put_note(FleetNote::new("breaker:provider", author, body, now, ttl))
            .await
            .unwrap();
    }
    // A forged override, not from an operator's pen.
    store
        .put_note(FleetNote::new(
            "override:provider",
            "operator",
            "{\"x\":1}",
            now,
            ttl,
        ))
        .await
        .unwrap();
    fleet[0].calls(1).await;
    pass(Duration::from_millis(1_100)).await;
    assert_eq!(fleet[0].breaker.state(), State::Closed);
    let status = fleet[0].fleet.status();
    assert!(status.ignored >= 5, "{status:?}");
    assert_eq!(status.peers, 0);
}

/// The store fails: each process acts on its own breakers (it opens on its own failures, and a
/// peer opens none), says the store is down, and shares again once it answers.
#[tokio::test(start_paused = true)]
async fn a_store_that_fails_leaves_each_process_on_its_own() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 3);
    pass(Duration::from_millis(600)).await;
    store.close();
    for p in &fleet[..2] {
        p.up.store(false, Ordering::SeqCst);
        p.calls(3).await;
    }
    pass(Duration::from_secs(2)).await;
    assert_eq!(states(&fleet), [State::Open, State::Open, State::Closed]);
    let status = fleet[2].fleet.status();
    assert!(!status.store_up);
    assert!(status.error.unwrap().contains("closed"));
    assert_eq!(fleet[2].fleet.status().opened_by_fleet, 0);
}

/// A process that starts while the fleet has the breaker open learns the fleet's half-open
/// time, not the stale one of the records; one that starts after a peer's probe closed it
/// does not open.
#[tokio::test(start_paused = true)]
async fn a_restarted_process_learns_the_fleets_view() {
    use tower_backstop::store::{ErrorEntry, Record, Status};
    let store = MemoryStore::new();
    let now = Clock::tokio().now();
    // A record held by a process that died, to a half-open time 40 s ahead.
    let mut r = Record::new(
        "m-1",
        ErrorEntry::new(now, "circuit_open", "circuit open", "open", 1),
    );
    r.status = Status::Deferred;
    r.breaker = Some("provider".to_owned());
    r.retry_at = Some(now + Duration::from_secs(40));
    store.put(r).await.unwrap();
    // The running processes say it half-opens in 5 s.
    let word = |state: &str, half: u64| {
        format!(
            r#"{{"v":1,"state":"{state}","own":true,"opened_at":{half},"half_opens_at":{half}}}"#
        )
    };
    let in_5s = (now + Duration::from_secs(5))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    store
        .put_note(FleetNote::new(
            "breaker:provider",
            "p1",
            word("open", in_5s),
            now,
            Duration::from_secs(3),
        ))
        .await
        .unwrap();
    let fresh = layer();
    assert_eq!(fresh.learn_from(&store).await.unwrap(), 1);
    let left = fresh.handle().retry_after().unwrap();
    assert!(left <= Duration::from_secs(5), "{left:?}");
    // A peer has it closed: the provider is not known to be down.
    store
        .put_note(FleetNote::new(
            "breaker:provider",
            "p2",
            r#"{"v":1,"state":"closed"}"#,
            now,
            Duration::from_secs(3),
        ))
        .await
        .unwrap();
    let fresh = layer();
    assert_eq!(fresh.learn_from(&store).await.unwrap(), 0);
    assert_eq!(fresh.handle().state(), State::Closed);
}

/// Settings out of range are refused, naming the setting.
#[tokio::test]
async fn fleet_settings_out_of_range_are_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let layer = layer();
    for (fleet, setting) in [
        (Fleet::new().quorum(1), "Fleet::quorum"),
        (Fleet::new().quorum_share(0.0), "Fleet::quorum_share"),
        (Fleet::new().every(Duration::ZERO), "Fleet::every"),
        (Fleet::new().ttl(Duration::from_secs(1)), "Fleet::ttl"),
        (Fleet::new().process("operator"), "Fleet::process"),
    ] {
        let err = layer.share(Arc::clone(&store), fleet).unwrap_err();
        assert_eq!(err.setting(), setting, "{err}");
    }
    let err = FleetOverride::new(
        "provider",
        OverrideAction::ForceOpen,
        Duration::ZERO,
        "",
        "me",
        std::time::SystemTime::now(),
    )
    .unwrap_err();
    assert_eq!(err.setting(), "duration");
}

/// Outside a tokio runtime there is no task to start: a clear error, not a panic.
#[test]
fn sharing_outside_a_runtime_is_an_error() {
    let err = layer()
        .share(Arc::new(MemoryStore::new()), Fleet::new())
        .unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}

/// Per-host breakers are shared by their `host:port`: a process that never called a host
/// learns the fleet's open breaker for it, and its first call there is rejected without
/// reaching the provider; another host is not touched.
#[tokio::test(start_paused = true)]
async fn per_host_breakers_are_shared_by_host_even_with_a_process_that_never_called() {
    let store = MemoryStore::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut procs = Vec::new();
    for i in 1..=3 {
        let layer = BreakerLayer::consecutive_failures(3)
            .open_for(Duration::from_secs(10))
            .per_host();
        let fleet = layer
            .share(
                Arc::new(store.clone()),
                Fleet::new().process(format!("p{i}")).clock(Clock::tokio()),
            )
            .unwrap();
        let c = Arc::clone(&calls);
        let provider = tower::service_fn(move |req: http::Request<String>| {
            c.fetch_add(1, Ordering::SeqCst);
            let code = if req.uri().host() == Some("down.test") {
                503
            } else {
                200
            };
            async move {
                Ok::<_, Infallible>(
                    http::Response::builder()
                        .status(code)
                        .body(String::new())
                        .unwrap(),
                )
            }
        });
        let svc = ServiceBuilder::new()
            .layer(layer.clone())
            .layer(ClassifyLayer::http())
            .service(provider);
        procs.push((layer, svc, fleet));
    }
    let get = |uri: &str| http::Request::get(uri).body(String::new()).unwrap();
    for (_, svc, _) in &procs[..2] {
        for _ in 0..3 {
            let _ = svc.clone().oneshot(get("http://down.test/")).await;
        }
    }
    pass(Duration::from_secs(1)).await;
    let (layer, svc, fleet) = &procs[2];
    assert_eq!(
        layer.handle_for("down.test:80").map(|h| h.state()),
        Some(State::Open)
    );
    assert_eq!(fleet.status().opened_by_fleet, 1);
    let before = calls.load(Ordering::SeqCst);
    assert!(svc.clone().oneshot(get("http://down.test/")).await.is_err());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "rejected before the provider"
    );
    assert!(svc.clone().oneshot(get("http://up.test/")).await.is_ok());
    assert_eq!(
        layer.handle_for("up.test:80").unwrap().state(),
        State::Closed
    );
}

/// The preset shares its breakers through its dead-letter store: a breaker it made is in the
/// store's notes, under this process's id; without a store it says what is missing.
#[tokio::test(start_paused = true)]
async fn the_preset_shares_through_its_dead_letter_store_and_needs_one() {
    use tower_backstop::BackstopLayer;
    use tower_backstop::dead_letter::DeadLetterLayer;
    let err = BackstopLayer::http(Duration::from_secs(2))
        .share_breakers(Fleet::new())
        .unwrap_err();
    assert_eq!(err.setting(), "share_breakers");
    assert!(err.to_string().contains("dead_letters"), "{err}");

    let store = MemoryStore::new();
    let preset = BackstopLayer::http(Duration::from_secs(2))
        .dead_letters(DeadLetterLayer::new(store.clone()).clock(Clock::tokio()));
    let fleet = preset
        .share_breakers(Fleet::new().process("web-1").clock(Clock::tokio()))
        .unwrap();
    let provider = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new(String::new()))
    });
    let svc = ServiceBuilder::new().layer(preset).service(provider);
    let request = http::Request::get("http://mail.test/")
        .body(String::new())
        .unwrap();
    svc.oneshot(request).await.unwrap();
    pass(Duration::from_millis(600)).await;
    let notes = store.notes(Clock::tokio().now()).await.unwrap();
    let topics: Vec<(&str, &str)> = notes
        .iter()
        .map(|n| (n.topic.as_str(), n.author.as_str()))
        .collect();
    assert_eq!(topics, [("breaker:mail.test:80", "web-1")]);
    assert!(
        notes[0].body.contains(r#""state":"closed""#),
        "{}",
        notes[0].body
    );
    assert!(fleet.status().store_up);
}

/// The provider goes down for every process at once, each sending a little: the failing
/// processes' failures together meet the rule (3 in a row, counted across two of them), so the
/// whole fleet opens after about one process's worth of failures, not one per process.
#[tokio::test(start_paused = true)]
async fn the_fleet_pays_about_one_processs_failures_to_open() {
    let store = MemoryStore::new();
    let fleet = fleet(&store, 4);
    pass(Duration::from_millis(600)).await;
    for p in &fleet {
        p.up.store(false, Ordering::SeqCst);
    }
    // Two failures each in two processes: neither trips alone (3 in a row), together they
    // are 4.
    fleet[0].calls(2).await;
    fleet[1].calls(2).await;
    pass(Duration::from_secs(1)).await;
    assert_eq!(states(&fleet), [State::Open; 4]);
    let sent: usize = fleet.iter().map(|p| p.calls.load(Ordering::SeqCst)).sum();
    assert_eq!(sent, 4, "one process alone would have sent 3");
    let rejected = fleet[3].call().await.unwrap_err();
    let cause = std::error::Error::source(&rejected)
        .and_then(|s| s.downcast_ref::<tower_backstop::breaker::OpenError>())
        .and_then(|e| e.cause())
        .unwrap();
    assert!(
        cause.starts_with(
            "opened by the fleet: 2 of 4 processes failing, 4 of their 4 calls failed"
        ),
        "{cause}"
    );
    // One failing process alone is never enough, however many calls it fails.
    let store = MemoryStore::new();
    let fleet = fleet_of(&store, 3);
    fleet[0].up.store(false, Ordering::SeqCst);
    fleet[0].calls(2).await;
    pass(Duration::from_secs(1)).await;
    assert_eq!(states(&fleet), [State::Closed; 3]);
}

fn fleet_of(store: &MemoryStore, n: usize) -> Vec<Process> {
    fleet(store, n)
}

/// A store that hangs on the fleet's notes: each round gives up after `Fleet::timeout`, every
/// process acts on its own breakers (one process's failures open no other), and the calls
/// never wait on the store. Once the store answers again, the fleet acts together again.
#[tokio::test(start_paused = true)]
async fn a_store_that_hangs_bounds_each_round_and_leaves_each_process_on_its_own() {
    use backstop_test_support::{Fault, FaultyStore, Op};
    let memory = MemoryStore::new();
    let faulty = Arc::new(FaultyStore::new(Arc::new(memory.clone())));
    let procs: Vec<Process> = (1..=3)
        .map(|i| process_on(Arc::clone(&faulty) as Arc<dyn Store>, &format!("p{i}")))
        .collect();
    faulty.set_for_each(&[Op::Notes, Op::PutNote], Fault::Hang);
    // Two processes open on their own failures while the store hangs: the third stays closed.
    for p in &procs[..2] {
        p.up.store(false, Ordering::SeqCst);
        p.calls(3).await;
    }
    pass(Duration::from_secs(3)).await;
    assert_eq!(states(&procs), [State::Open, State::Open, State::Closed]);
    let status = procs[2].fleet.status();
    assert!(!status.store_up);
    assert_eq!(status.error.as_deref(), Some("read: timed out"));
    // Each round gave up at its bound: about one read every `every + timeout`.
    let reads = faulty.calls(Op::Notes);
    assert!(reads >= 3 * 3, "{reads} reads in 3 s by 3 processes");
    faulty.set_for_each(&[Op::Notes, Op::PutNote], Fault::Answer);
    pass(Duration::from_secs(1)).await;
    assert!(procs[2].fleet.status().store_up);
    assert_eq!(
        states(&procs),
        [State::Open; 3],
        "the fleet acts together again"
    );
}

/// The preset's rule (half of 100 calls, 20 at least; open 1 s doubling to 30 s, jittered) over
/// a 12 s outage with live traffic in every process: each breaker opens, probes fail and
/// re-open it several times; one process probes for the fleet, at least every 5 s, so after
/// the recovery the first probe comes within 5 s (a lone process's open time had grown to 8 s
/// or more), and its success closes every process within a second.
#[tokio::test(start_paused = true)]
async fn after_a_long_outage_one_probe_closes_every_process() {
    let store = MemoryStore::new();
    let fleet: Vec<Process> = (1..=4)
        .map(|i| {
            let layer = BreakerLayer::builder()
                .name("provider")
                .failure_rate(0.5)
                .count_window(100)
                .minimum_calls(20)
                .open_doubling(Duration::from_secs(1), Duration::from_secs(30))
                .open_jitter(0.5)
                .build()
                .unwrap();
            process_with(Arc::new(store.clone()), &format!("p{i}"), layer)
        })
        .collect();
    pass(Duration::from_secs(1)).await;
    for p in &fleet {
        p.up.store(false, Ordering::SeqCst);
    }
    for _ in 0..120 {
        for p in &fleet {
            p.calls(1).await;
        }
        pass(Duration::from_millis(100)).await;
    }
    assert!(
        fleet.iter().all(|p| p.breaker.state() != State::Closed),
        "{:?}",
        states(&fleet)
    );
    for p in &fleet {
        p.up.store(true, Ordering::SeqCst);
    }
    let opened_before: Vec<u64> = fleet
        .iter()
        .map(|p| p.fleet.status().opened_by_fleet)
        .collect();
    let mut first = None;
    for tick in 0..400 {
        for p in &fleet {
            p.calls(1).await;
        }
        pass(Duration::from_millis(50)).await;
        let closed = fleet
            .iter()
            .filter(|p| p.breaker.state() == State::Closed)
            .count();
        if closed > 0 && first.is_none() {
            first = Some(tick);
        }
        if closed == 4 {
            let first_close = first.unwrap() as f64 * 0.05;
            assert!(
                first_close <= 5.5,
                "the first closed {first_close} s after the recovery"
            );
            let within = (tick - first.unwrap()) as f64 * 0.05;
            assert!(within <= 1.0, "all closed {within} s after the first");
            // And they stay closed: a peer's opening from before the recovery opens nothing.
            for _ in 0..60 {
                for p in &fleet {
                    p.calls(1).await;
                }
                pass(Duration::from_millis(50)).await;
                assert_eq!(states(&fleet), [State::Closed; 4]);
            }
            let opened_after: Vec<u64> = fleet
                .iter()
                .map(|p| p.fleet.status().opened_by_fleet)
                .collect();
            assert_eq!(opened_after, opened_before, "no opening on stale evidence");
            return;
        }
    }
    panic!("not every process closed: {:?}", states(&fleet));
}
