//! The success path of `RetryLayer` next to a bare `service_fn` and tower's own `Retry`, in one
//! `benchmark_group`: our default policy, with a token-bucket budget (gRFC A6) and with a ratio
//! budget, beside tower's `Retry` with the same attempt cap and its `TpsBudget`. The harness is
//! that of `benches/overhead.rs` (tokio's `benches/time_timeout.rs` model): `iter_custom` times
//! a loop of `poll_ready` + `call` inside one `block_on` on a `current_thread` runtime.
//!
//! ```text
//! cargo bench --bench retry -- --warm-up-time 1 --measurement-time 2
//! ```

use std::fmt::Debug;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::time::Duration;

mod support;

use support::*;

use criterion::{Criterion, criterion_group, criterion_main};
use tower::Layer;
use tower::retry::budget::{Budget as _, TpsBudget};
use tower_backstop::retry::{Budget, RetryLayer, RetryPolicy};

/// tower's retry policy equivalent to ours: 3 attempts, every error retried, the request
/// cloned for each attempt, a `TpsBudget` deposited on success and withdrawn per retry.
#[derive(Clone, Debug)]
struct TowerPolicy {
    retries_left: usize,
    budget: Option<Arc<TpsBudget>>,
}

impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                if let Some(budget) = &self.budget {
                    budget.deposit();
                }
                None
            }
            Err(_) if self.retries_left > 0 => {
                if let Some(budget) = &self.budget
                    && !budget.withdraw()
                {
                    return None;
                }
                self.retries_left -= 1;
                Some(ready(()))
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

fn retry(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("retry_success");
    group.bench_function("bare", |b| run(&rt, b, bare()));
    group.bench_function("backstop_default", |b| {
        run(&rt, b, RetryLayer::default().layer(bare()))
    });
    group.bench_function("backstop_token_bucket", |b| {
        let policy = RetryPolicy::new().budget(Budget::token_bucket(10, 0.1).unwrap());
        run(&rt, b, policy.build().unwrap().layer(bare()))
    });
    group.bench_function("backstop_ratio_budget", |b| {
        let _guard = rt.enter();
        let policy =
            RetryPolicy::new().budget(Budget::ratio(0.2, 10, Duration::from_secs(10)).unwrap());
        run(&rt, b, policy.build().unwrap().layer(bare()))
    });
    group.bench_function("backstop_single_attempt", |b| {
        run(
            &rt,
            b,
            RetryPolicy::new()
                .max_attempts(1)
                .build()
                .unwrap()
                .layer(bare()),
        )
    });
    group.bench_function("tower", |b| {
        let policy = TowerPolicy {
            retries_left: 2,
            budget: None,
        };
        run(&rt, b, tower::retry::RetryLayer::new(policy).layer(bare()))
    });
    group.bench_function("tower_tps_budget", |b| {
        let policy = TowerPolicy {
            retries_left: 2,
            budget: Some(Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2))),
        };
        run(&rt, b, tower::retry::RetryLayer::new(policy).layer(bare()))
    });
    group.finish();
}

criterion_group!(benches, retry);
criterion_main!(benches);
