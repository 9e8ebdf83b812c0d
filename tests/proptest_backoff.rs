//! Property tests for every delay rule and every jitter: for attempts 1..10,000 and any base,
//! step and cap, every delay is a valid `Duration` (finite, ≥ 0 by construction), never above
//! the cap after jitter, and computing it never panics.
//!
//! The cases other libraries got wrong: exponential overflow after ~64 doublings, jitter turning
//! NaN near attempt 1025 (float arithmetic on an infinite delay), and a cap applied before jitter
//! letting additive jitter run 25 % over it.

use std::time::Duration;

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tower_backstop::retry::{Backoff, Jitter};

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        // Everyday values.
        (0u64..120_000).prop_map(Duration::from_millis),
        // Anything at all, up to Duration::MAX.
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

fn any_jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
        Just(Jitter::Additive),
    ]
}

fn any_rule() -> impl Strategy<Value = Backoff> {
    prop_oneof![
        any_duration().prop_map(Backoff::constant),
        (any_duration(), any_duration(), any_duration())
            .prop_map(|(base, step, cap)| Backoff::linear(base, step, cap)),
        (any_duration(), any_duration()).prop_map(|(base, cap)| Backoff::exponential(base, cap)),
        proptest::collection::vec(any_duration(), 1..8)
            .prop_map(|delays| Backoff::schedule(delays).expect("non-empty")),
    ]
}

fn attempts() -> impl Strategy<Value = u32> {
    prop_oneof![
        1u32..10_000,
        Just(64),
        Just(65),
        Just(1024),
        Just(1025),
        Just(u32::MAX)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn every_delay_is_bounded_by_the_cap_after_jitter(
        rule in any_rule(),
        cap in proptest::option::of(any_duration()),
        jitter in any_jitter(),
        failed in attempts(),
        previous in proptest::option::of(any_duration()),
        seed in any::<u64>(),
    ) {
        let backoff = match cap {
            Some(cap) => rule.capped_at(cap),
            None => rule,
        }
        .jitter(jitter);
        let cap = backoff.cap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let nominal = backoff.nominal(failed);
        prop_assert!(nominal <= cap);
        let delay = backoff.delay_with(failed, previous, &mut rng);
        prop_assert!(delay <= cap, "{delay:?} > cap {cap:?}");
        match jitter {
            Jitter::None => prop_assert_eq!(delay, nominal),
            Jitter::Full => prop_assert!(delay <= nominal),
            Jitter::Equal => prop_assert!(delay >= nominal / 2 && delay <= nominal),
            // At least the rule's value, at most 25 % above it, and never above the cap.
            Jitter::Additive => {
                prop_assert!(delay >= nominal);
                prop_assert!(delay <= nominal.saturating_add(nominal / 4));
            }
            _ => {}
        }
    }

    #[test]
    fn a_whole_series_of_ten_thousand_attempts_never_panics(
        rule in any_rule(),
        jitter in any_jitter(),
        seed in any::<u64>(),
    ) {
        let backoff = rule.jitter(jitter);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut previous = None;
        for failed in (1..10_000).step_by(37).chain([64, 65, 1024, 1025, 9_999]) {
            let delay = backoff.delay_with(failed, previous, &mut rng);
            prop_assert!(delay <= backoff.cap());
            previous = Some(delay);
        }
    }

    #[test]
    fn exponential_never_shrinks_before_the_cap(
        base in any_duration(),
        cap in any_duration(),
        failed in 1u32..10_000,
    ) {
        let backoff = Backoff::exponential(base, cap).jitter(Jitter::None);
        prop_assert!(backoff.nominal(failed + 1) >= backoff.nominal(failed));
    }
}
