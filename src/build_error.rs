//! [`BuildError`]: the one error of every fallible builder in the crate.

use std::fmt;

/// A configuration that cannot work, returned by every fallible constructor and `build` of the
/// crate ([`breaker::Builder::build`](crate::breaker::Builder::build),
/// [`RetryPolicy::build`](crate::retry::RetryPolicy::build),
/// [`Budget::token_bucket`](crate::retry::Budget::token_bucket),
/// [`Budget::ratio`](crate::retry::Budget::ratio),
/// [`Backoff::schedule`](crate::retry::Backoff::schedule)): it names the setting
/// ([`setting`](Self::setting)) and says what is wrong with it, with the value given.
///
/// It is found when the layer is built, never at call time: a layer that was built is valid.
///
/// ```
/// use tower_backstop::breaker::BreakerLayer;
///
/// let err = BreakerLayer::builder().failure_rate(1.5).build().unwrap_err();
/// assert_eq!(err.setting(), "failure_rate");
/// assert_eq!(
///     err.to_string(),
///     "invalid configuration: `failure_rate` is 1.5: the failure rate must be within (0.0, 1.0]"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    setting: &'static str,
    value: String,
    problem: &'static str,
}

impl BuildError {
    /// `setting` was given `value` (as written in the message: `1.5`, `0`, `500ms`), which is
    /// wrong because of `problem`.
    pub(crate) fn new(
        setting: &'static str,
        value: impl fmt::Display,
        problem: &'static str,
    ) -> Self {
        BuildError {
            setting,
            value: value.to_string(),
            problem,
        }
    }

    /// The setting that is wrong: the name of the method that sets it (`"failure_rate"`,
    /// `"max_attempts"`, `"backoff"`), prefixed with its type when the method is a constructor
    /// or belongs to a part of the configuration (`"Backoff::schedule"`,
    /// `"ClassPolicy::max_attempts"`), and followed by the argument when the method takes
    /// several (`"Budget::ratio(window)"`).
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// What is wrong with the value, without the setting's name.
    #[cfg(feature = "serde")]
    pub(crate) fn problem(&self) -> &'static str {
        self.problem
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: `{}` is {}: {}",
            self.setting, self.value, self.problem
        )
    }
}

impl std::error::Error for BuildError {}
