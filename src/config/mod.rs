//! Policies as data: the retry policy, the breaker rule, the timeout and the preset's settings,
//! read from TOML, JSON, YAML or any other [serde](https://serde.rs) format, so that operators
//! tune attempts, delays and breaker rules per provider without a rebuild.
//!
//! Every type here is a plain `Deserialize + Serialize` struct whose fields are optional (but
//! the preset's `attempt_timeout`, and the parts of a tagged section such as a backoff's `base`):
//! a field left out keeps the default of the layer it configures (the preset's, for
//! [`BackstopConfig`]), so a file says only what it changes. Unknown fields are an error (a typo
//! never passes silently). Durations are written in humane form, as the `humantime` crate reads
//! them: `"250ms"`, `"30s"`, `"5m"`, `"1h 30m"`; a negative or unitless duration is an error.
//!
//! Reading a file checks its shape; building checks its meaning, with the same rules as the
//! builders ([`RetryPolicy::build`](crate::retry::RetryPolicy::build),
//! [`breaker::Builder::build`](crate::breaker::Builder::build)), and a [`ConfigError`] names the
//! field by its path in the file:
//!
//! ```
//! use tower_backstop::config::BackstopConfig;
//!
//! let config: BackstopConfig = toml::from_str(
//!     r#"
//!     attempt_timeout = "2s"
//!
//!     [retry]
//!     max_attempts = 5
//!     deadline = "30s"
//!     backoff = { kind = "exponential", base = "200ms", cap = "10s", jitter = "full" }
//!
//!     [retry.classes.throttled]
//!     max_attempts = 0
//!
//!     [breaker]
//!     failure_rate = 0.5
//!     open_for = "30s"
//!     "#,
//! )?;
//! let err = config.http().unwrap_err();
//! assert_eq!(err.path(), "retry.classes.throttled.max_attempts");
//! assert_eq!(
//!     err.to_string(),
//!     "retry.classes.throttled.max_attempts: must be at least 1 (write `retry = false` to never retry the class)"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A configuration serialises back (for display, or to write a file), with the fields it was
//! given: what was left out is left out, and means the default.
//!
//! Class names are those of the built-in classes (`transient`, `throttled`, `unknown`,
//! `permanent`, `poison`, `circuit_open`, `outcome_unknown`) plus the ones a caller passes to the
//! `*_with_classes` methods; any other name is an error that lists the known ones.

use std::fmt;
use std::time::Duration;

use crate::BuildError;
use crate::failure::Class;

mod breaker;
mod preset;
mod retry;

pub use self::breaker::{BreakerConfig, OpenDoubling, SlowCalls, TimeWindow};
pub use self::preset::{BackstopConfig, TimeoutConfig};
pub use self::retry::{BackoffConfig, BudgetConfig, ClassConfig, HedgeConfig, RetryConfig};

/// A configuration that reads but cannot work, found when it is built: the field, by its path
/// in the configuration (`retry.classes.throttled.max_attempts`, `breaker.failure_rate`), and
/// what is wrong with it.
///
/// Displayed as `path: problem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    problem: String,
}

impl ConfigError {
    pub(crate) fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            problem: problem.into(),
        }
    }

    /// The error of a builder, at the field that set it: `prefix` is the path of the section
    /// (`retry`, `breaker`), and the builder's setting names the field (`Budget::ratio(window)`
    /// is `budget.window`, `ClassPolicy::max_attempts` is `max_attempts`).
    pub(crate) fn from_build(prefix: &str, err: &BuildError) -> Self {
        let setting = err.setting();
        let field = match setting.split_once("::") {
            Some(("Backoff", "schedule")) => "backoff.delays".to_owned(),
            Some(("ClassPolicy", method)) => method.to_owned(),
            Some((ty, rest)) => {
                let section = ty.to_ascii_lowercase();
                match rest.split_once('(') {
                    Some((_, arg)) => format!("{section}.{}", arg.trim_end_matches(')')),
                    None => section,
                }
            }
            // A method of several arguments: `hedge(delay)` is `hedge.delay`.
            None => match setting.split_once('(') {
                Some((method, arg)) => format!("{method}.{}", arg.trim_end_matches(')')),
                None => setting.to_owned(),
            },
        };
        ConfigError::new(join(prefix, &field), err.problem())
    }

    /// The field, by its path from the root of the configuration, dot-separated
    /// (`retry.classes.throttled.max_attempts`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with the field's value.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// The built-in classes, by name.
const BUILT_IN: [Class; 7] = [
    Class::TRANSIENT,
    Class::THROTTLED,
    Class::UNKNOWN,
    Class::PERMANENT,
    Class::POISON,
    Class::CIRCUIT_OPEN,
    Class::OUTCOME_UNKNOWN,
];

/// The class called `name`, among the built-in ones and `custom`.
fn class_named(name: &str, custom: &[Class], path: &str) -> Result<Class, ConfigError> {
    if let Some(class) = BUILT_IN
        .iter()
        .chain(custom)
        .find(|c| c.name() == name)
        .copied()
    {
        return Ok(class);
    }
    let known: Vec<&str> = BUILT_IN.iter().chain(custom).map(|c| c.name()).collect();
    Err(ConfigError::new(
        path,
        format!("no class is named `{name}` (known: {})", known.join(", ")),
    ))
}

/// `prefix.field`, or `field` at the root.
fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// Serde of an optional duration in humane form (`"250ms"`, `"30s"`), through `humantime`.
pub(crate) mod humane {
    use std::time::Duration;

    use serde::de::Error as _;
    use serde::{Deserializer, Serializer};

    pub(crate) fn parse(text: &str) -> Result<Duration, String> {
        if text.trim_start().starts_with('-') {
            return Err(format!(
                "invalid duration `{text}`: a duration cannot be negative; write a number and a unit, as \"250ms\", \"30s\" or \"5m\""
            ));
        }
        humantime::parse_duration(text.trim()).map_err(|e| {
            format!("invalid duration `{text}` ({e}): write a number and a unit, as \"250ms\", \"30s\" or \"5m\"")
        })
    }

    /// Reads a duration's text; a number without quotes is an error that says how to write it.
    struct Text;

    impl serde::de::Visitor<'_> for Text {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration as a string with a unit, as \"250ms\" or \"30s\"")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Err(E::custom(format_args!(
                "invalid duration {v}: a duration needs a unit and quotes, as \"{v}s\" or \"{v}ms\""
            )))
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Err(E::custom(format_args!(
                "invalid duration {v}: a duration needs a unit and quotes, as \"{v}s\" or \"{v}ms\" (and cannot be negative)"
            )))
        }

        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
            Err(E::custom(format_args!(
                "invalid duration {v}: a duration needs a unit and quotes, as \"{v}s\""
            )))
        }
    }

    /// The text of a duration field.
    pub(crate) fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_any(Text)
    }

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<super::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text = text(d)?;
        parse(&text).map(Some).map_err(D::Error::custom)
    }

    /// A duration that must be given (a field of a tagged section).
    pub(crate) mod required {
        use std::time::Duration;

        use serde::de::Error as _;
        use serde::{Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(&humantime::format_duration(*value))
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            let text = super::text(d)?;
            super::parse(&text).map_err(D::Error::custom)
        }
    }

    /// A list of durations.
    pub(crate) mod list {
        use std::time::Duration;

        use serde::de::Error as _;
        use serde::ser::SerializeSeq;
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            value: &[Duration],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(value.len()))?;
            for d in value {
                seq.serialize_element(&humantime::format_duration(*d).to_string())?;
            }
            seq.end()
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<Duration>, D::Error> {
            let texts = Vec::<String>::deserialize(d)?;
            texts
                .iter()
                .map(|t| super::parse(t).map_err(D::Error::custom))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_settings_map_to_field_paths() {
        let path = |setting: &'static str| {
            ConfigError::from_build("retry", &BuildError::new(setting, 0, "bad"))
                .path()
                .to_owned()
        };
        assert_eq!(path("max_attempts"), "retry.max_attempts");
        assert_eq!(path("Budget::ratio(window)"), "retry.budget.window");
        assert_eq!(
            path("Budget::token_bucket(max_tokens)"),
            "retry.budget.max_tokens"
        );
        assert_eq!(path("Backoff::schedule"), "retry.backoff.delays");
        assert_eq!(path("ClassPolicy::backoff"), "retry.backoff");
        assert_eq!(path("hedge(max_copies)"), "retry.hedge.max_copies");
        let top = ConfigError::from_build("", &BuildError::new("failure_rate", 2, "bad"));
        assert_eq!(top.to_string(), "failure_rate: bad");
    }

    #[test]
    fn humane_durations_read_and_reject() {
        assert_eq!(humane::parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(humane::parse(" 1m 30s "), Ok(Duration::from_secs(90)));
        for bad in ["-5s", "5", "soon", ""] {
            let err = humane::parse(bad).unwrap_err();
            assert!(
                err.starts_with(&format!("invalid duration `{bad}`")),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_class_names_list_the_known_ones() {
        const SOFT: Class = Class::new("soft_bounce");
        assert_eq!(
            class_named("soft_bounce", &[SOFT], "p"),
            Ok(SOFT),
            "a custom class is found"
        );
        assert_eq!(class_named("throttled", &[], "p"), Ok(Class::THROTTLED));
        let err = class_named("throtled", &[SOFT], "retry.classes.throtled").unwrap_err();
        assert_eq!(err.path(), "retry.classes.throtled");
        assert!(
            err.problem()
                .starts_with("no class is named `throtled` (known: transient, throttled,")
        );
        assert!(err.problem().ends_with("outcome_unknown, soft_bounce)"));
    }
}
