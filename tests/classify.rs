//! ClassifyLayer on its own and under RetryLayer: panics, user classes and mappings, hints.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::{ClassifyLayer, Panicked};
use tower_backstop::retry::{RetryLayer, RetryPolicy};
use tower_backstop::{BoxError, Class, Code, GiveUp};

#[tokio::test(start_paused = true)]
async fn a_panicking_inner_future_is_poison_never_retried_and_the_service_keeps_serving() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(5)))
        .layer(ClassifyLayer::new(|_: &String| None))
        .service(tower::service_fn(move |req: &'static str| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if req == "bad" {
                    panic!("template exploded on {req}");
                }
                Ok::<_, BoxError>(format!("sent {req}"))
            }
        }));

    let failure = svc.clone().oneshot("bad").await.unwrap_err();
    assert_eq!(failure.class(), Class::POISON);
    assert_eq!(failure.code(), Code::Panic);
    assert_eq!(failure.give_up(), Some(GiveUp::NotRetryable));
    assert_eq!(failure.attempts(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never retried");
    let source = std::error::Error::source(&failure).unwrap();
    let panicked = source.downcast_ref::<Panicked>().unwrap();
    assert_eq!(panicked.message(), "template exploded on bad");

    // The same service (and its clones) keeps serving, also alongside a panicking call.
    assert_eq!(svc.clone().oneshot("good").await.unwrap(), "sent good");
    let (a, b) = tokio::join!(svc.clone().oneshot("bad"), svc.clone().oneshot("ok"));
    assert_eq!(a.unwrap_err().class(), Class::POISON);
    assert_eq!(b.unwrap(), "sent ok");
}

#[tokio::test]
async fn a_panic_with_a_non_string_payload_is_still_poison() {
    let svc = ServiceBuilder::new()
        .layer(ClassifyLayer::new(|_: &()| None))
        .service(tower::service_fn(|_: ()| async {
            std::panic::panic_any(42u32);
            #[allow(unreachable_code)]
            Ok::<(), BoxError>(())
        }));
    let failure = svc.oneshot(()).await.unwrap_err();
    assert_eq!(failure.class(), Class::POISON);
    assert!(failure.to_string().contains("not a string"), "{failure}");
}
