//! What every benchmark shares: the request, the bare inner service, the runtime, and the one
//! way calls are driven, so that every entry of every group is measured the same way.
#![allow(dead_code)]

use std::fmt::Debug;
use std::future::{Ready, poll_fn, ready};
use std::hint::black_box;
use std::time::Instant;

use criterion::Bencher;
use tokio::runtime::Runtime;
use tower::{Service, service_fn};
use tower_backstop::BoxError;

/// The request: `&'static str` is `Replay` and `Describe`, and free to copy.
pub const REQUEST: &str = "hello";

pub type Req = &'static str;

/// What a bare service answers: a ready `T`.
pub type Answer<T> = Ready<Result<T, BoxError>>;

/// A `service_fn` that is ready at once and answers `T` at once.
pub type BareOf<T> = tower::util::ServiceFn<fn(Req) -> Answer<T>>;

/// The bare inner service, echoing the request.
pub type Bare = BareOf<Req>;

/// The bare inner service: ready at once, answers at once.
pub fn bare() -> Bare {
    service_fn(|req: Req| ready(Ok(req)))
}

/// A current-thread runtime with time enabled (the timeout and retry layers need it).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current_thread runtime")
}

/// Times `iters` calls of `svc` (`poll_ready` + `call`) inside one `block_on`: tokio's
/// `benches/time_timeout.rs` model.
pub fn run<S>(rt: &Runtime, b: &mut Bencher<'_>, mut svc: S)
where
    S: Service<Req>,
    S::Error: Debug,
{
    b.iter_custom(|iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                poll_fn(|cx| svc.poll_ready(cx))
                    .await
                    .expect("service ready");
                let response = svc.call(black_box(REQUEST)).await.expect("call succeeds");
                black_box(response);
            }
            start.elapsed()
        })
    });
}
