//! What every layer's configuration is made of (feature `serde`): the [`ConfigError`] that names
//! a field by its path, durations in humane form, classes by name, and [`config_of!`], which
//! writes a configuration once from its builder's methods.
//!
//! The builders' chained methods ([`RetryPolicy`](crate::retry::RetryPolicy),
//! [`breaker::Builder`](crate::breaker::Builder)) stay the one place where a setting is defined:
//! its meaning, its default, its limits, its checks in `build()`. A configuration is one line
//! per setting that names the method it calls, and [`config_of!`] makes from that line both the
//! field (optional, left out when serialised if it was not given) and the code that calls the
//! method. So a field cannot be read and then forgotten, and a method renamed or retyped breaks
//! the build at its line.
//!
//! The other way, a builder that keeps its settings in the very struct that serde reads, was
//! not taken: a retry policy and a breaker are built over a base of their own
//! ([`RetryPolicy::grpc`](crate::retry::RetryPolicy::grpc), the preset's breaker rule) and hold
//! what no file can say (a listener, a key function, a status check), so a file is applied over
//! a builder rather than being one.

use std::collections::BTreeMap;
use std::fmt;

use crate::build_error::BuildError;
use crate::failure::Class;

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
pub(crate) fn class_named(name: &str, custom: &[Class], path: &str) -> Result<Class, ConfigError> {
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
pub(crate) fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// A field of a configuration made by [`config_of!`]: whether it was given, and its value.
pub(crate) trait Given {
    /// What the builder's method takes.
    type Value;

    /// The value, when the field was given.
    fn given(&self) -> Option<Self::Value>;

    /// Whether the field was left out (and so is left out when serialised).
    fn absent(&self) -> bool;
}

impl<T: Clone> Given for Option<T> {
    type Value = T;

    fn given(&self) -> Option<T> {
        self.clone()
    }

    fn absent(&self) -> bool {
        self.is_none()
    }
}

/// A table (the retry policy's classes by name): given when it has an entry.
impl<K: Clone, V: Clone> Given for BTreeMap<K, V> {
    type Value = Self;

    fn given(&self) -> Option<Self> {
        (!self.is_empty()).then(|| self.clone())
    }

    fn absent(&self) -> bool {
        self.is_empty()
    }
}

/// A configuration of a builder, one line per setting:
///
/// ```text
/// config_of! {
///     /// The struct's docs, derives and serde attributes.
///     pub struct RetryConfig {
///         /// The field's docs, and its serde attributes.
///         max_attempts: Option<u32> => policy.max_attempts(max_attempts),
///     }
///     fn set_fields(&self, at, policy: RetryPolicy, custom: &[Class]);
/// }
/// ```
///
/// makes the struct, each field public, `#[serde(default)]` and skipped when serialised if it
/// was not given ([`Given`]), and `fn set_fields(&self, at: &str, policy, custom) ->
/// Result<RetryPolicy, ConfigError>`, which for each field given, in the order written, binds
/// its value to the field's name and sets `policy` to the expression after `=>` (which may use
/// `at`, the path of this section, and `?`).
macro_rules! config_of {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_attr:meta])*
                $field:ident: $field_ty:ty => $set:expr,
            )*
        }
        fn $apply:ident $(<$($generic:ident),*>)? (
            &self, $at:ident, $builder:ident: $builder_ty:ty $(, $param:ident: $param_ty:ty)* $(,)?
        );
    ) => {
        $(#[$attr])*
        pub struct $name {
            $(
                $(#[$field_attr])*
                #[serde(default, skip_serializing_if = "crate::settings::Given::absent")]
                pub $field: $field_ty,
            )*
        }

        impl $name {
            /// Sets each field given on the builder, by its method, in the order of the
            /// fields; errors at paths under `at`.
            fn $apply $(<$($generic),*>)? (
                &self,
                $at: &str,
                mut $builder: $builder_ty,
                $($param: $param_ty),*
            ) -> Result<$builder_ty, crate::settings::ConfigError> {
                $(
                    if let Some($field) = crate::settings::Given::given(&self.$field) {
                        $builder = $set;
                    }
                )*
                Ok($builder)
            }
        }
    };
}

pub(crate) use config_of;

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
        value: &Option<Duration>,
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
    use std::time::Duration;

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
