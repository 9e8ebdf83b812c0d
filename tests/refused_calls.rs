//! A call refused before it left (its breaker open, its send rate holding it back until its
//! turn, a deadline too short to start it) never becomes a dead letter for want of a copy of
//! the request: in every layer order the order check accepts, with every attempt cap and the
//! refusal on any attempt, the first and the last included, it is sent again, deferred, or
//! handed back with the class and code that say why.
//!
//! The grid (layer order × attempt cap × refusal kind × the attempt refused) is walked whole in
//! each case; proptest draws what surrounds it (the earlier attempts' answers, the backoff,
//! whether the retry layer waits for a breaker). Every case runs on tokio's paused clock with
//! the real layers over an in-process provider that counts, on its side, what it received.

mod support;

use std::collections::HashMap;
use std::future::{Ready, ready};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::dead_letter::{DeadLetterLayer, DeadLetterStatus, RetrySchedule};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, Jitter, RetryPolicy};
use tower_backstop::store::{MemoryStore, Status, Store};
use tower_backstop::{BackstopLayer, BoxError, Class, Code, Failure, Sent};

type Response = http::Response<()>;
type Stack = BoxCloneService<http::Request<String>, Response, Failure<Response>>;

/// The subject's idempotency key, and the neighbour's: the neighbour's call, through the same
/// breaker, is what opens it or lowers its send rate just before the subject's refused attempt.
const SUBJECT: &str = "subject";
const NEIGHBOUR: &str = "neighbour";

/// A provider that answers the subject's attempts before `refused_at` with `prior`, and 200
/// after; the neighbour with `neighbour`. It counts what it received per key.
#[derive(Clone)]
struct Provider {
    prior: u16,
    refused_at: u32,
    neighbour: u16,
    seen: Arc<Mutex<HashMap<String, Vec<u16>>>>,
}

impl Provider {
    fn answered(&self, key: &str) -> Vec<u16> {
        self.seen
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
}

impl Service<http::Request<String>> for Provider {
    type Response = Response;
    type Error = BoxError;
    type Future = Ready<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<String>) -> Self::Future {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        let mut seen = self.seen.lock().unwrap();
        let answers = seen.entry(key.clone()).or_default();
        let status = if key == NEIGHBOUR {
            self.neighbour
        } else if (answers.len() as u32 + 1) < self.refused_at {
            self.prior
        } else {
            200
        };
        answers.push(status);
        let mut response = http::Response::builder().status(status);
        if status == 429 {
            response = response.header("retry-after", "0");
        }
        ready(Ok(response.body(()).unwrap()))
    }
}

/// The layer orders the order check accepts (each stack classifies at the bottom).
#[derive(Clone, Copy, Debug)]
enum Order {
    RetryBreaker,
    BreakerRetry,
    DeadLetterRetryBreaker,
    DeadLetterBreakerRetry,
    DeadLetterBreaker,
    PresetWithStore,
    PresetWithoutStore,
}

const ORDERS: [Order; 7] = [
    Order::RetryBreaker,
    Order::BreakerRetry,
    Order::DeadLetterRetryBreaker,
    Order::DeadLetterBreakerRetry,
    Order::DeadLetterBreaker,
    Order::PresetWithStore,
    Order::PresetWithoutStore,
];

impl Order {
    fn has_store(self) -> bool {
        !matches!(
            self,
            Order::RetryBreaker | Order::BreakerRetry | Order::PresetWithoutStore
        )
    }
}

/// How the subject's attempt is refused before it leaves.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// The neighbour's failure opens the breaker.
    Open,
    /// The neighbour's 429 limits the send rate: the attempt must wait its turn.
    Paced,
    /// The overall deadline ends before the attempt could start.
    Deadline,
}

const REFUSALS: [Refusal; 3] = [Refusal::Open, Refusal::Paced, Refusal::Deadline];

/// What surrounds the grid's point, drawn by proptest.
#[derive(Clone, Copy, Debug)]
struct Around {
    /// The subject's answers before its refused attempt: 503 (transient) or 429 (throttled).
    prior: u16,
    /// The backoff between attempts, in milliseconds (no jitter).
    backoff_ms: u64,
    /// Whether the retry layer waits for an open breaker in process (up to 5 s).
    wait_for_breaker: bool,
    /// Whether the call has a deadline shorter than the breaker's open time and the send
    /// rate's first turn (1 s, against 2 s): the refused attempt cannot wait within it.
    tight_deadline: bool,
}

struct Case {
    order: Order,
    cap: u32,
    refusal: Refusal,
    at: u32,
    around: Around,
}

fn policy(case: &Case) -> RetryPolicy {
    let backoff = Duration::from_millis(case.around.backoff_ms);
    let mut policy = RetryPolicy::new()
        .max_attempts(case.cap)
        .backoff(Backoff::constant(backoff).jitter(Jitter::None));
    if case.around.wait_for_breaker {
        policy = policy.wait_for_breaker(Duration::from_secs(5));
    }
    if let Refusal::Deadline = case.refusal {
        // Attempt `at` would start `(at - 1)` backoffs in: the deadline ends just before.
        let start = backoff * (case.at - 1);
        policy = policy.deadline(start.saturating_sub(Duration::from_micros(500)));
    } else if case.around.tight_deadline {
        policy = policy.deadline(Duration::from_secs(1));
    }
    policy
}

/// The subject's stack in `case.order`, over `breaker` (shared with the neighbour's stack).
fn stack(case: &Case, breaker: &BreakerLayer, store: &MemoryStore, provider: &Provider) -> Stack {
    let classified = ClassifyLayer::http().layer(provider.clone());
    let retry = policy(case).build().unwrap();
    let dead_letters = || DeadLetterLayer::new(store.clone());
    match case.order {
        Order::RetryBreaker => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(retry)
                .layer(breaker.clone())
                .service(classified),
        ),
        Order::BreakerRetry => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(breaker.clone())
                .layer(retry)
                .service(classified),
        ),
        Order::DeadLetterRetryBreaker => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(dead_letters())
                .layer(retry)
                .layer(breaker.clone())
                .service(classified),
        ),
        Order::DeadLetterBreakerRetry => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(dead_letters())
                .layer(breaker.clone())
                .layer(retry)
                .service(classified),
        ),
        Order::DeadLetterBreaker => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(dead_letters())
                .layer(breaker.clone())
                .service(classified),
        ),
        Order::PresetWithStore => BoxCloneService::new(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(retry)
                .dead_letters(dead_letters().retry_schedule(RetrySchedule::none()))
                .breaker(breaker.clone())
                .layer(provider.clone()),
        ),
        Order::PresetWithoutStore => BoxCloneService::new(
            BackstopLayer::http(Duration::from_secs(1))
                .retry(retry)
                .breaker(breaker.clone())
                .layer(provider.clone()),
        ),
    }
}

fn request(key: &str) -> http::Request<String> {
    support::post_with_key("http://api.test/send", "{}", key)
}

/// What one case ended with.
struct Ended {
    result: Result<Response, Failure<Response>>,
    subject: Vec<u16>,
    record: Option<tower_backstop::store::Record>,
    /// Whether the subject's refused attempt was in fact refused (not every point of the grid
    /// reaches it: a breaker above the retry layer only sees the first attempt).
    refused: bool,
}

async fn run(case: &Case) -> Ended {
    let (neighbour_answer, breaker) = match case.refusal {
        Refusal::Open => (
            // Only 500 (unknown) counts: the subject's 503s and 429s leave it closed.
            500,
            BreakerLayer::builder()
                .consecutive_failures(1)
                .failure_classes(&[Class::UNKNOWN])
                .open_for(Duration::from_secs(2))
                .build()
                .unwrap(),
        ),
        Refusal::Paced | Refusal::Deadline => (
            429,
            BreakerLayer::builder()
                .consecutive_failures(1000)
                .build()
                .unwrap(),
        ),
    };
    let provider = Provider {
        prior: case.around.prior,
        refused_at: case.at,
        neighbour: neighbour_answer,
        seen: Arc::default(),
    };
    let store = MemoryStore::new();
    let subject = stack(case, &breaker, &store, &provider);
    // The neighbour goes through the breaker alone, once.
    let neighbour = ServiceBuilder::new()
        .layer(breaker.clone())
        .layer(ClassifyLayer::http())
        .service(provider.clone());
    let trigger = !matches!(case.refusal, Refusal::Deadline);
    if trigger && case.at == 1 {
        let _ = neighbour.clone().oneshot(request(NEIGHBOUR)).await;
    }
    let call = tokio::spawn(subject.oneshot(request(SUBJECT)));
    if trigger && case.at > 1 {
        // Within a millisecond of the attempt before the refused one reaching the provider:
        // before its backoff (50 ms at least) ends.
        let mut looks = 0;
        while provider.answered(SUBJECT).len() < (case.at - 1) as usize && !call.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            looks += 1;
            assert!(
                looks < 100_000,
                "the subject never reached attempt {}",
                case.at - 1
            );
        }
        if !call.is_finished() {
            let _ = neighbour.clone().oneshot(request(NEIGHBOUR)).await;
        }
    }
    let result = call.await.unwrap();
    let subject = provider.answered(SUBJECT);
    let refused = (subject.len() as u32) < case.at
        || subject
            .iter()
            .take(case.at as usize)
            .filter(|s| **s == 200)
            .count()
            == 0;
    let record = store.get(SUBJECT).await.unwrap();
    Ended {
        result,
        subject,
        record,
        refused,
    }
}

/// The property, for one case: the outcome is a delivery, a deferral, or a failure handed back
/// that says why; never a give-up for want of a copy, never a dead letter of a refusal, never a
/// second delivery.
fn check(case: &Case, ended: &Ended) -> Result<(), String> {
    let what = format!(
        "{:?} cap {} {:?} at attempt {} {:?}: provider saw {:?}",
        case.order, case.cap, case.refusal, case.at, case.around, ended.subject
    );
    let delivered = ended.subject.iter().filter(|s| **s == 200).count();
    if delivered > 1 {
        return Err(format!("{what}: delivered {delivered} times"));
    }
    let failure = match &ended.result {
        Ok(response) if response.status() == 200 => {
            if delivered != 1 {
                return Err(format!("{what}: a success the provider never sent"));
            }
            return Ok(());
        }
        Ok(response) => return Err(format!("{what}: unclassified {}", response.status())),
        Err(failure) => failure,
    };
    let attempts = failure.note::<Attempts>();
    if attempts.map(Attempts::give_up) == Some(GiveUp::NotReplayable) {
        return Err(format!("{what}: given up as not replayable: {failure}"));
    }
    let refusal = matches!(failure.code(), Code::CircuitOpen | Code::Paced);
    if refusal && failure.sent() != Sent::No {
        return Err(format!("{what}: a refusal not marked unsent: {failure}"));
    }
    if case.order.has_store() {
        let Some(record) = &ended.record else {
            return Err(format!("{what}: no record for a failure: {failure}"));
        };
        if refusal && record.status != Status::Deferred && failure.retry_after().is_some() {
            return Err(format!(
                "{what}: a refusal stored {:?}, not deferred: {failure}",
                record.status
            ));
        }
        if record.status == Status::Dead
            && (record.code == Code::CircuitOpen.to_string()
                || record.code == Code::Paced.to_string())
        {
            return Err(format!("{what}: a dead letter of a refusal: {record:?}"));
        }
        // The caller reads what the record says.
        let stored = matches!(
            failure.note::<DeadLetterStatus>(),
            Some(DeadLetterStatus::Stored { .. })
        );
        let says_deferred = attempts.is_some_and(Attempts::is_deferred)
            || (attempts.is_none() && failure.retry_after().is_some());
        if !stored || says_deferred != (record.status == Status::Deferred) {
            return Err(format!(
                "{what}: the caller reads {:?} / deferred {says_deferred}, the record is {:?}",
                failure.note::<DeadLetterStatus>(),
                record.status
            ));
        }
    } else if refusal && attempts.is_some_and(|a| a.give_up() == GiveUp::AttemptsExhausted) {
        return Err(format!(
            "{what}: a refusal counted as the last attempt: {failure}"
        ));
    }
    Ok(())
}

fn around() -> impl Strategy<Value = Around> {
    (
        prop_oneof![Just(503u16), Just(429u16)],
        prop_oneof![Just(50u64), Just(100), Just(400)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(prior, backoff_ms, wait_for_breaker, tight_deadline)| Around {
                prior,
                backoff_ms,
                wait_for_breaker,
                tight_deadline,
            },
        )
}

#[test]
fn a_refused_call_is_sent_again_deferred_or_handed_back_never_dead_for_want_of_a_copy() {
    let mut runner = TestRunner::new(Config::with_cases(16));
    let refused_last = Arc::new(Mutex::new(0u32));
    let counted = Arc::clone(&refused_last);
    runner
        .run(&around(), move |around| {
            for order in ORDERS {
                for cap in 1..=4 {
                    for refusal in REFUSALS {
                        for at in 1..=cap {
                            if matches!(refusal, Refusal::Deadline) && at == 1 {
                                // A first attempt always starts.
                                continue;
                            }
                            let case = Case {
                                order,
                                cap,
                                refusal,
                                at,
                                around,
                            };
                            let ended = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .start_paused(true)
                                .build()
                                .unwrap()
                                .block_on(run(&case));
                            if ended.refused && at == cap && cap > 1 {
                                *counted.lock().unwrap() += 1;
                            }
                            check(&case, &ended).map_err(TestCaseError::fail)?;
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // The grid reached the case the property is about: the last allowed attempt refused.
    assert!(*refused_last.lock().unwrap() > 0);
}
