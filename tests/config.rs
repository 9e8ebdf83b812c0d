//! A configuration that cannot work is a `BuildError` from `build` (or from the fallible
//! constructor), naming the setting and the value; a valid one builds.

use std::time::Duration;

use tower_backstop::BuildError;
use tower_backstop::Class;
use tower_backstop::breaker::BreakerLayer;
use tower_backstop::retry::{Backoff, Budget, ClassPolicy, RetryPolicy};

/// The error's setting and message, checking that the message names the setting and the value.
fn check(err: BuildError, setting: &str, value: &str) {
    assert_eq!(err.setting(), setting, "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("invalid configuration: `{setting}` is {value}: ")),
        "{message}"
    );
}

fn retry_err(policy: RetryPolicy) -> BuildError {
    policy.build().expect_err("an invalid policy")
}

#[test]
fn zero_attempts_is_an_error() {
    check(
        retry_err(RetryPolicy::new().max_attempts(0)),
        "max_attempts",
        "0",
    );
    // With a schedule: still no call to make.
    let schedule = Backoff::schedule([1, 5, 30].map(Duration::from_secs)).unwrap();
    check(
        retry_err(RetryPolicy::new().max_attempts(0).backoff(schedule.clone())),
        "max_attempts",
        "0",
    );
    check(
        retry_err(RetryPolicy::new().class(
            Class::new("soft_bounce"),
            ClassPolicy::retry().max_attempts(0),
        )),
        "ClassPolicy::max_attempts",
        "0 for class `soft_bounce`",
    );
    check(
        retry_err(RetryPolicy::new().retry_at_most(Class::UNKNOWN, 0)),
        "ClassPolicy::max_attempts",
        "0 for class `unknown`",
    );
    // 1 is valid: never retry.
    RetryPolicy::new().max_attempts(1).build().expect("valid");
    RetryPolicy::new()
        .retry_at_most(Class::UNKNOWN, 1)
        .build()
        .expect("valid");
}

#[test]
fn a_backoff_that_cannot_work_is_an_error() {
    let err = retry_err(
        RetryPolicy::new().backoff(Backoff::exponential(Duration::ZERO, Duration::from_secs(1))),
    );
    assert_eq!(err.setting(), "backoff");
    assert!(err.to_string().contains("from zero never waits"), "{err}");
    let err = retry_err(RetryPolicy::new().backoff(Backoff::exponential(
        Duration::from_secs(2),
        Duration::from_secs(1),
    )));
    assert_eq!(err.setting(), "backoff");
    assert!(
        err.to_string().contains("cap is below its first delay"),
        "{err}"
    );
    let err = retry_err(RetryPolicy::new().backoff(Backoff::linear(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(500),
    )));
    assert_eq!(err.setting(), "backoff");
    let err = retry_err(
        RetryPolicy::new()
            .backoff(Backoff::constant(Duration::from_secs(2)).capped_at(Duration::from_secs(1))),
    );
    assert_eq!(err.setting(), "backoff");
    let err = retry_err(
        RetryPolicy::new().class(
            Class::TRANSIENT,
            ClassPolicy::retry().backoff(
                Backoff::schedule([5, 10].map(Duration::from_secs))
                    .unwrap()
                    .capped_at(Duration::from_secs(1)),
            ),
        ),
    );
    assert_eq!(err.setting(), "ClassPolicy::backoff");
    assert!(err.to_string().contains("for class `transient`"), "{err}");
    // Immediate retries are spelled as a zero constant: valid.
    RetryPolicy::new()
        .backoff(Backoff::constant(Duration::ZERO))
        .build()
        .expect("valid");
    // A linear rule from zero grows: valid.
    RetryPolicy::new()
        .backoff(Backoff::linear(
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        .build()
        .expect("valid");
}

#[test]
fn bounds_above_max_delay_are_errors() {
    check(
        retry_err(
            RetryPolicy::new()
                .max_delay(Duration::from_secs(1))
                .max_hint_delay(Duration::from_secs(5)),
        ),
        "max_hint_delay",
        "5s",
    );
    check(
        retry_err(
            RetryPolicy::new()
                .max_delay(Duration::from_secs(1))
                .wait_for_breaker(Duration::from_secs(2)),
        ),
        "wait_for_breaker",
        "2s",
    );
    // Within it, and the deliberate zeros, are valid.
    RetryPolicy::new()
        .max_delay(Duration::from_secs(5))
        .max_hint_delay(Duration::from_secs(5))
        .wait_for_breaker(Duration::from_secs(2))
        .build()
        .expect("valid");
    RetryPolicy::new()
        .max_delay(Duration::ZERO)
        .deadline(Duration::ZERO)
        .build()
        .expect("valid");
}

#[test]
fn budgets_and_schedules_name_the_argument() {
    check(
        Budget::token_bucket(0, 0.1).unwrap_err(),
        "Budget::token_bucket(max_tokens)",
        "0",
    );
    check(
        Budget::ratio(0.5, 0, Duration::ZERO).unwrap_err(),
        "Budget::ratio(window)",
        "0ns",
    );
    check(
        Backoff::schedule([]).unwrap_err(),
        "Backoff::schedule",
        "[]",
    );
}

#[test]
fn breaker_errors_carry_the_value() {
    check(
        BreakerLayer::builder()
            .failure_rate(1.5)
            .build()
            .unwrap_err(),
        "failure_rate",
        "1.5",
    );
    check(
        BreakerLayer::builder()
            .failure_rate(f64::NAN)
            .build()
            .unwrap_err(),
        "failure_rate",
        "NaN",
    );
    check(
        BreakerLayer::builder().count_window(0).build().unwrap_err(),
        "count_window",
        "0",
    );
    check(
        BreakerLayer::builder()
            .time_window(Duration::ZERO, 10)
            .build()
            .unwrap_err(),
        "time_window",
        "0ns × 10",
    );
    check(
        BreakerLayer::builder()
            .per_host()
            .max_keys(0)
            .build()
            .unwrap_err(),
        "max_keys",
        "0",
    );
    let err = BreakerLayer::builder()
        .open_doubling(Duration::from_secs(1), Duration::from_secs(30))
        .open_jitter(f64::NAN)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "open_jitter");
    assert!(err.to_string().contains("NaN"), "{err}");
}

#[test]
fn build_errors_are_std_errors() {
    fn boxed(e: BuildError) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(e)
    }
    let e = boxed(RetryPolicy::new().max_attempts(0).build().unwrap_err());
    assert!(e.to_string().contains("`max_attempts`"));
}
