//! `DeadLetterRetryLayer` (the dead-letter layer directly above the retry layer, as the preset
//! builds them) makes one copy of each request where the two layers stacked make two, and records exactly
//! what they record. On tokio's paused clock, with in-process services.

use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use super::DeadLetterRetryLayer;
use crate::dead_letter::{DeadLetterLayer, DeadLetterStatus};
use crate::failure::{BoxError, Class, Code, Failure};
use crate::request::{Describe, Envelope, Replay};
use crate::retry::{Attempts, GiveUp, RetryLayer, RetryPolicy};
use crate::store::{Filter, MemoryStore, Status, Store};
use tower::{Layer, ServiceExt, service_fn};

/// A request that counts its copies; `replayable: false` cannot be copied at all.
struct Counted {
    body: &'static str,
    copies: Arc<AtomicUsize>,
    replayable: bool,
}

impl Counted {
    fn new(body: &'static str, replayable: bool) -> (Self, Arc<AtomicUsize>) {
        let copies = Arc::new(AtomicUsize::new(0));
        let req = Counted {
            body,
            copies: copies.clone(),
            replayable,
        };
        (req, copies)
    }
}

impl Replay for Counted {
    fn replay(&self) -> Option<Self> {
        if !self.replayable {
            return None;
        }
        self.copies.fetch_add(1, Ordering::SeqCst);
        Some(Counted {
            body: self.body,
            copies: self.copies.clone(),
            replayable: true,
        })
    }
}

impl Describe for Counted {
    fn message_id(&self) -> Option<&str> {
        Some(self.body)
    }

    async fn describe(self) -> Envelope {
        Envelope::new(self.body).with_id(format!("id-{}", self.body))
    }
}

/// An upstream answering each call with the next of its outcomes (the last one repeats).
#[derive(Clone)]
struct Upstream {
    outcomes: Arc<Vec<Result<(), Failure>>>,
    calls: Arc<AtomicUsize>,
}

impl tower::Service<Counted> for Upstream {
    type Response = ();
    type Error = Failure;
    type Future = Ready<Result<(), Failure>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Counted) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        ready(match &self.outcomes[n.min(self.outcomes.len() - 1)] {
            Ok(()) => Ok(()),
            Err(f) => {
                let failure = Failure::new(f.class(), f.code());
                Err(match f.retry_after() {
                    Some(hint) => failure.with_retry_after(hint),
                    None => failure,
                })
            }
        })
    }
}

fn transient() -> Result<(), Failure> {
    Err(Failure::new(Class::TRANSIENT, Code::Error))
}

fn no_jitter() -> RetryPolicy {
    RetryPolicy::new().backoff(
        crate::retry::Backoff::constant(Duration::from_millis(10))
            .jitter(crate::retry::Jitter::None),
    )
}

/// Calls `layer` over `outcomes` once; returns the result, the copies made, the calls made and
/// the store's records.
/// The outcome, the copies made, the upstream's calls, and the records written.
type Ran = (Result<(), Failure>, usize, usize, Vec<crate::store::Record>);

async fn run<L>(
    layer: L,
    store: &MemoryStore,
    outcomes: Vec<Result<(), Failure>>,
    replayable: bool,
) -> Ran
where
    L: Layer<Upstream>,
    L::Service: tower::Service<Counted, Response = (), Error = Failure>,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = Upstream {
        outcomes: Arc::new(outcomes),
        calls: calls.clone(),
    };
    let (req, copies) = Counted::new("hello", replayable);
    let result = layer.layer(upstream).oneshot(req).await;
    // Every record written, whatever its status.
    let records = store
        .search(&Filter::new(), 0..100)
        .await
        .expect("the memory store searches");
    (
        result,
        copies.load(Ordering::SeqCst),
        calls.load(Ordering::SeqCst),
        records,
    )
}

/// The two layers stacked as usual: dead letters above retry.
fn stacked(
    store: &MemoryStore,
    policy: RetryPolicy,
) -> tower::layer::util::Stack<RetryLayer, DeadLetterLayer> {
    tower::layer::util::Stack::new(policy.build().unwrap(), DeadLetterLayer::new(store.clone()))
}

/// The two layers built as one, sharing the copy.
fn shared(store: &MemoryStore, policy: RetryPolicy) -> DeadLetterRetryLayer {
    DeadLetterRetryLayer::new(DeadLetterLayer::new(store.clone()), policy.build().unwrap())
}

/// [`run`] through the two layers built as one (`shared_copy`) or stacked.
async fn run_either(
    shared_copy: bool,
    store: &MemoryStore,
    policy: RetryPolicy,
    outcomes: Vec<Result<(), Failure>>,
    replayable: bool,
) -> Ran {
    if shared_copy {
        run(shared(store, policy), store, outcomes, replayable).await
    } else {
        run(stacked(store, policy), store, outcomes, replayable).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_success_makes_one_copy_instead_of_two() {
    let store = MemoryStore::new();
    let (result, copies, calls, records) = run(
        stacked(&store, RetryPolicy::new()),
        &store,
        vec![Ok(())],
        true,
    )
    .await;
    assert!(result.is_ok());
    assert_eq!(
        (copies, calls, records.len()),
        (2, 1, 0),
        "stacked: two copies"
    );

    let (result, copies, calls, records) = run(
        shared(&store, RetryPolicy::new()),
        &store,
        vec![Ok(())],
        true,
    )
    .await;
    assert!(result.is_ok());
    assert_eq!(
        (copies, calls, records.len()),
        (1, 1, 0),
        "shared: one copy"
    );
    // The default policy too (no policy reference kept per call).
    let (result, copies, _, _) = run(
        shared(&store, RetryPolicy::default()),
        &store,
        vec![Ok(())],
        true,
    )
    .await;
    assert!(result.is_ok());
    assert_eq!(copies, 1);
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_request_is_recorded_the_same_from_the_retry_layers_copy() {
    for (name, shared_copy) in [("stacked", false), ("shared", true)] {
        let store = MemoryStore::new();
        let policy = no_jitter().max_attempts(3);
        let (result, copies, calls, records) =
            run_either(shared_copy, &store, policy, vec![transient()], true).await;
        let failure = result.expect_err("every attempt fails");
        assert_eq!(calls, 3, "{name}");
        // One copy per attempt, the last included (a breaker below may refuse any attempt,
        // and a refused one is sent again or deferred from its copy); stacked, the dead-letter
        // layer keeps its own besides.
        let expected = if shared_copy { 3 } else { 4 };
        assert_eq!(copies, expected, "{name}");
        assert_eq!(
            failure.note::<Attempts>().map(Attempts::give_up),
            Some(GiveUp::AttemptsExhausted),
            "{name}"
        );
        assert!(
            matches!(failure.note::<DeadLetterStatus>(), Some(DeadLetterStatus::Stored { id }) if id == "id-hello"),
            "{name}: {failure:?}"
        );
        assert_eq!(records.len(), 1, "{name}");
        assert_eq!(records[0].payload, b"hello", "{name}");
        assert_eq!(records[0].attempts, 3, "{name}");
        assert_eq!(records[0].status, Status::Dead, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_retried_still_comes_back_for_its_record() {
    // One attempt only: the retry layer keeps no spare on its own, but under the shared layer
    // it keeps one for the record.
    let store = MemoryStore::new();
    let (result, copies, calls, records) = run(
        shared(&store, RetryPolicy::new().max_attempts(1)),
        &store,
        vec![transient()],
        true,
    )
    .await;
    assert!(result.is_err());
    assert_eq!((copies, calls), (1, 1));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].payload, b"hello");

    // A permanent failure, not retried.
    let store = MemoryStore::new();
    let permanent = Err(Failure::new(Class::PERMANENT, Code::Error));
    let (result, _, calls, records) =
        run(shared(&store, no_jitter()), &store, vec![permanent], true).await;
    assert_eq!(
        result
            .unwrap_err()
            .note::<Attempts>()
            .map(Attempts::give_up),
        Some(GiveUp::NotRetryable)
    );
    assert_eq!(calls, 1);
    assert_eq!(records[0].payload, b"hello");
}

#[tokio::test(start_paused = true)]
async fn a_deferred_or_deadline_ended_request_keeps_its_payload() {
    // A delay above max_delay: deferred, with a retry-at time.
    let store = MemoryStore::new();
    let throttled = Err(
        Failure::new(Class::THROTTLED, Code::Error).with_retry_after(Duration::from_secs(3600))
    );
    let (result, _, calls, records) =
        run(shared(&store, no_jitter()), &store, vec![throttled], true).await;
    assert!(
        result
            .unwrap_err()
            .note::<Attempts>()
            .is_some_and(Attempts::is_deferred)
    );
    assert_eq!(calls, 1);
    assert_eq!(records[0].status, Status::Deferred);
    assert_eq!(records[0].payload, b"hello");

    // A zero deadline: the first failure is already past it.
    let store = MemoryStore::new();
    let (result, _, calls, records) = run(
        shared(&store, no_jitter().deadline(Duration::ZERO)),
        &store,
        vec![transient()],
        true,
    )
    .await;
    assert_eq!(
        result
            .unwrap_err()
            .note::<Attempts>()
            .map(Attempts::give_up),
        Some(GiveUp::DeadlineExceeded)
    );
    assert_eq!(calls, 1);
    assert_eq!(records[0].payload, b"hello");
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_copied_is_recorded_without_its_payload_as_before() {
    for shared_copy in [false, true] {
        let store = MemoryStore::new();
        let (result, copies, calls, records) =
            run_either(shared_copy, &store, no_jitter(), vec![transient()], false).await;
        assert_eq!(
            result
                .unwrap_err()
                .note::<Attempts>()
                .map(Attempts::give_up),
            Some(GiveUp::NotReplayable)
        );
        assert_eq!((copies, calls), (0, 1));
        assert_eq!(records.len(), 1);
        assert!(records[0].payload.is_empty());
        assert!(records[0].metadata.contains_key("payload_missing"));
        // The record still has the id the request names, found without copying it.
        assert_eq!(records[0].id, "hello", "shared copy: {shared_copy}");
    }
}

#[test]
fn the_shared_layer_is_clone_send_and_sync() {
    fn check<S: Clone + Send + Sync + 'static>(_: &S) {}
    let svc = DeadLetterRetryLayer::new(
        DeadLetterLayer::new(MemoryStore::new()),
        RetryLayer::default(),
    )
    .layer(service_fn(|_: Counted| ready(Ok::<_, BoxError>(()))));
    check(&svc);
}
