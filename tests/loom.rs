//! loom model checks of the breaker's atomics. Built only with `--cfg tower_backstop_loom`:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tower_backstop_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --profile loom -p tower-backstop --no-default-features --features dead-letter --test loom
//! ```
//!
//! Under this cfg the breaker's state word, counters and windows are loom's atomics, so loom
//! explores every interleaving of the threads below (up to the preemption bound). The cfg is not
//! the usual `--cfg loom` because tokio reads that one too and leaves out `tokio::net`, which our
//! dev-dependencies need (in every other build: under this cfg there are none, see `Cargo.toml`). Each model uses `open_for(0)`, so that the open → half-open transition does not depend on the
//! clock, and drives services by hand with a no-op waker.
#![cfg(tower_backstop_loom)]

use std::future::{Future, Pending, Ready, pending, ready};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::thread;
use tower::{Layer, Service, service_fn};
use tower_backstop::breaker::{Breaker, BreakerLayer, ResponseFuture, State};
use tower_backstop::{BoxError, Class, Failure};

type Hang = tower::util::ServiceFn<fn(()) -> Pending<Result<(), BoxError>>>;
type Answer = tower::util::ServiceFn<fn(()) -> Ready<Result<(), BoxError>>>;

fn hang() -> Hang {
    service_fn(|()| pending())
}

fn succeed() -> Answer {
    service_fn(|()| ready(Ok(())))
}

fn fail() -> Answer {
    service_fn(|()| {
        ready(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )
        .into()))
    })
}

/// `poll_ready` then `call`, without polling the response.
fn start<S>(svc: &mut Breaker<S>) -> ResponseFuture<S::Future, ()>
where
    S: Service<(), Response = ()>,
    S::Error: Into<Failure<()>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("a breaker over a ready service is ready: {other:?}"),
    }
    svc.call(())
}

/// Polls a response once.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

/// A breaker with `probes` permits, tripped by one failure, open for no time at all.
fn tripped(probes: u32) -> BreakerLayer {
    let layer = BreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::ZERO)
        .half_open_probes(probes)
        .close_after(1)
        .build()
        .unwrap();
    let mut failing = layer.layer(fail());
    let mut f = start(&mut failing);
    assert!(matches!(poll_once(&mut f), Poll::Ready(Err(_))));
    assert_eq!(layer.handle().state(), State::Open);
    layer
}

/// Starts a call on a hanging service: `Some(future)` holding its permit when admitted, `None`
/// when rejected.
fn try_probe(layer: &BreakerLayer) -> Option<ResponseFuture<Pending<Result<(), BoxError>>, ()>> {
    let mut svc = layer.layer(hang());
    let mut f = start(&mut svc);
    match poll_once(&mut f) {
        Poll::Pending => Some(f),
        Poll::Ready(Err(e)) => {
            assert_eq!(e.class(), Class::CIRCUIT_OPEN);
            None
        }
        Poll::Ready(Ok(())) => unreachable!("the inner service hangs"),
    }
}

fn racing_half_open_admits_exactly(threads: usize, probes: u32) {
    loom::model(move || {
        let layer = tripped(probes);
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let layer = layer.clone();
                thread::spawn(move || try_probe(&layer))
            })
            .collect();
        let admitted: Vec<_> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        let handle = layer.handle();
        assert_eq!(admitted.len(), probes as usize);
        assert_eq!(handle.state(), State::HalfOpen);
        let stats = handle.stats();
        assert_eq!(stats.half_opened, 1, "one thread made the transition");
        assert_eq!(stats.probes, u64::from(probes));
        assert_eq!(stats.rejected, (threads - probes as usize) as u64);
        // Every permit is taken: the next call is rejected; once the probes are dropped, their
        // permits are back.
        assert!(try_probe(&layer).is_none());
        drop(admitted);
        let again: Vec<_> = (0..probes).map(|_| try_probe(&layer)).collect();
        assert!(again.iter().all(Option::is_some));
    });
}

#[test]
fn racing_open_to_half_open_admits_exactly_one_probe() {
    racing_half_open_admits_exactly(3, 1);
}

#[test]
fn racing_open_to_half_open_admits_exactly_two_probes() {
    racing_half_open_admits_exactly(3, 2);
}

#[test]
fn a_failure_and_a_success_racing_in_half_open_leave_a_consistent_state() {
    loom::model(|| {
        let layer = tripped(2);
        // Two probes admitted before either ends.
        let mut ok = start(&mut layer.layer(succeed()));
        let mut bad = start(&mut layer.layer(fail()));
        let handle = layer.handle();
        assert_eq!(handle.state(), State::HalfOpen);
        assert_eq!(handle.stats().probes, 2);
        let a = thread::spawn(move || poll_once(&mut ok).is_ready());
        let b = thread::spawn(move || poll_once(&mut bad).is_ready());
        assert!(a.join().unwrap() && b.join().unwrap());
        let stats = handle.stats();
        match handle.state() {
            // The success closed it first; the failure belonged to the closed period's
            // predecessor and changed nothing.
            State::Closed => assert_eq!((stats.closed, stats.opened), (1, 1)),
            // The failure re-opened it first; the late success changed nothing.
            State::Open => assert_eq!((stats.closed, stats.opened), (0, 2)),
            other => panic!("inconsistent state {other:?}: {stats:?}"),
        }
        // Either way the probe bookkeeping is clean: from open (duration zero) the next period
        // admits both probes again; from closed, calls go through.
        let p1 = try_probe(&layer);
        let p2 = try_probe(&layer);
        assert!(p1.is_some() && p2.is_some());
    });
}

#[test]
fn permits_return_on_drop_under_contention() {
    loom::model(|| {
        let layer = tripped(1);
        let l1 = layer.clone();
        let l2 = layer.clone();
        // One thread takes the probe and drops it; the other tries meanwhile.
        let a = thread::spawn(move || {
            let p = try_probe(&l1);
            let got = p.is_some();
            drop(p);
            got
        });
        let b = thread::spawn(move || {
            let p = try_probe(&l2);
            let got = p.is_some();
            drop(p);
            got
        });
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a || b, "the first to arrive gets the probe");
        // Whatever the order, both permits went back: one probe is admitted now, and only one.
        assert_eq!(layer.handle().state(), State::HalfOpen);
        let p = try_probe(&layer);
        assert!(p.is_some());
        assert!(try_probe(&layer).is_none());
    });
}

#[test]
fn a_call_that_finds_the_breaker_closed_by_a_racing_probe_is_let_through_as_a_closed_call() {
    loom::model(|| {
        let layer = tripped(1);
        let prober = layer.clone();
        // One thread takes the half-open period's only probe and succeeds with it, closing the
        // breaker; the other arrives while the breaker is open or half-open and may find it closed
        // by the time it acts on what it read.
        let a = thread::spawn(move || {
            let mut f = start(&mut prober.layer(succeed()));
            match poll_once(&mut f) {
                Poll::Ready(Ok(())) => true,
                Poll::Ready(Err(e)) => {
                    assert_eq!(e.class(), Class::CIRCUIT_OPEN);
                    false
                }
                Poll::Pending => unreachable!("the inner service answers at once"),
            }
        });
        let b = try_probe(&layer);
        let a_succeeded = a.join().unwrap();
        let handle = layer.handle();
        let stats = handle.stats();
        // One half-open period with one probe permit: whichever thread took it, exactly one
        // probe was admitted. A call let through after the probe closed the breaker is a closed
        // call, not a second probe.
        assert_eq!(stats.half_opened, 1, "{stats:?}");
        assert_eq!(stats.probes, 1, "{stats:?}");
        if a_succeeded {
            assert_eq!(handle.state(), State::Closed);
        } else {
            assert!(b.is_some(), "the hanging call holds the probe");
            assert_eq!(handle.state(), State::HalfOpen);
        }
        drop(b);
    });
}
