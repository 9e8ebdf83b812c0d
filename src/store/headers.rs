//! Which request headers a dead-letter record keeps, and which it redacts.

use std::fmt;

/// The headers a dead-letter record never writes the value of: credentials and session
/// secrets. The record keeps the header's name in
/// [`Record::redacted_headers`](super::Record::redacted_headers), so that a re-drive knows to
/// restore it ([`http_request_restoring`](crate::resend::http_request_restoring)); its value is dropped
/// before the record leaves the process.
///
/// The default list is [`RedactHeaders::DEFAULT`]: `Authorization` and `Proxy-Authorization`
/// (RFC 9110 §11.6.2, §11.7.2), `Cookie` and `Set-Cookie` (RFC 6265), and the API-key headers in
/// common use (`X-Api-Key`, `Api-Key`, `X-Auth-Token`, `X-Amz-Security-Token`). Names compare
/// without regard to case.
///
/// ```
/// use tower_backstop::store::RedactHeaders;
///
/// let redact = RedactHeaders::default().and("x-signature").except("cookie");
/// assert!(redact.redacts("Authorization"));
/// assert!(redact.redacts("X-Signature"));
/// assert!(!redact.redacts("cookie"));
/// assert!(!redact.redacts("x-tenant"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedactHeaders {
    names: Vec<String>,
}

impl RedactHeaders {
    /// The headers redacted by default, lower case.
    pub const DEFAULT: &'static [&'static str] = &[
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
    pub fn none() -> Self {
        RedactHeaders { names: Vec::new() }
    }

    /// Also redacts the header `name`.
    pub fn and(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref().to_ascii_lowercase();
        if !self.names.contains(&name) {
            self.names.push(name);
        }
        self
    }

    /// No longer redacts the header `name`.
    pub fn except(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        self.names.retain(|n| !n.eq_ignore_ascii_case(name));
        self
    }

    /// Whether the header `name` is redacted.
    pub fn redacts(&self, name: &str) -> bool {
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
