//! Which request headers a dead-letter record keeps, and which it redacts.

use std::fmt;

/// The headers a dead-letter record never writes the value of: credentials and session
/// secrets. Set with the dead-letter layer's
/// [`redact_header`](crate::dead_letter::DeadLetterLayer::redact_header),
/// [`keep_header`](crate::dead_letter::DeadLetterLayer::keep_header) and
/// [`keep_all_headers`](crate::dead_letter::DeadLetterLayer::keep_all_headers). Names compare
/// without regard to case.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedactHeaders {
    names: Vec<String>,
}

impl RedactHeaders {
    /// The headers redacted by default, lower case.
    pub(crate) const DEFAULT: &'static [&'static str] = &[
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-amz-security-token",
    ];

    /// Redacts no header at all: every value is written. Only for stores that are as secret as
    /// the credentials themselves.
    pub(crate) fn none() -> Self {
        RedactHeaders { names: Vec::new() }
    }

    /// Also redacts the header `name`.
    pub(crate) fn and(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref().to_ascii_lowercase();
        if !self.names.contains(&name) {
            self.names.push(name);
        }
        self
    }

    /// No longer redacts the header `name`.
    pub(crate) fn except(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        self.names.retain(|n| !n.eq_ignore_ascii_case(name));
        self
    }

    /// Whether the header `name` is redacted.
    pub(crate) fn redacts(&self, name: &str) -> bool {
        self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// Splits `headers` into those kept (in order) and the names of those redacted (lower case,
    /// each once, in order of first appearance).
    pub(crate) fn split(
        &self,
        headers: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
        let mut kept = Vec::new();
        let mut redacted: Vec<String> = Vec::new();
        for (name, value) in headers {
            if self.redacts(&name) {
                let name = name.to_ascii_lowercase();
                if !redacted.contains(&name) {
                    redacted.push(name);
                }
            } else {
                kept.push((name, value));
            }
        }
        (kept, redacted)
    }
}

impl Default for RedactHeaders {
    fn default() -> Self {
        RedactHeaders {
            names: Self::DEFAULT.iter().map(|&n| n.to_owned()).collect(),
        }
    }
}

impl fmt::Debug for RedactHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.names).finish()
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::RedactHeaders;

    #[test]
    fn names_are_added_and_removed_without_regard_to_case() {
        let redact = RedactHeaders::default().and("x-signature").except("cookie");
        assert!(redact.redacts("Authorization"));
        assert!(redact.redacts("X-Signature"));
        assert!(!redact.redacts("cookie"));
        assert!(!redact.redacts("x-tenant"));
        assert!(!RedactHeaders::none().redacts("authorization"));
    }
}
