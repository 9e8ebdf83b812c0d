//! Where a record goes: its host (`host:port`), and the breaker a re-send of it meets.

use tower_backstop::breaker::Authority;
use tower_backstop::store::Record;

/// The record's target authority, `host:port` as a per-host breaker keys it (lower case, the
/// scheme's default port when the URI names none): from its stored URI, else the key of the
/// breaker that rejected it. `None` when it has neither.
pub(crate) fn of(record: &Record) -> Option<String> {
    record
        .metadata
        .get("uri")
        .and_then(|uri| of_uri(uri))
        .or_else(|| record.breaker.clone())
}

/// The authority of `uri`, keyed as a per-host breaker keys it; `None` for a relative URI or
/// one that does not parse.
pub(crate) fn of_uri(uri: &str) -> Option<String> {
    let request = http::Request::get(uri).body(()).ok()?;
    Authority::key_of(&request)
}

/// The breaker a re-send of `record` meets: the target's host when the re-drive sends to a
/// `target` with one, else the breaker that rejected the record, else its host.
pub(crate) fn breaker_of(record: &Record, target: Option<&http::Uri>) -> Option<String> {
    if let Some(host) = target.and_then(|t| of_uri(&t.to_string())) {
        return Some(host);
    }
    record.breaker.clone().or_else(|| of(record))
}

/// `wanted` as the `host` filter key compares it: lower case, without a trailing dot.
pub(crate) fn normalise(wanted: &str) -> String {
    let wanted = wanted.trim().to_ascii_lowercase();
    match wanted.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{}:{port}", name.trim_end_matches('.'))
        }
        _ => wanted.trim_end_matches('.').to_owned(),
    }
}

/// Whether the record host `host` (`name:port`) is the `wanted` one ([`normalise`]d): the same
/// `name:port`, or the same name when `wanted` names no port.
pub(crate) fn matches(host: &str, wanted: &str) -> bool {
    if host == wanted {
        return true;
    }
    match host.rsplit_once(':') {
        // `wanted` without a port: `[::1]` against `[::1]:80`, `api.test` against `api.test:443`.
        Some((name, _)) => name == wanted,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_backstop::store::ErrorEntry;

    fn record(uri: Option<&str>, breaker: Option<&str>) -> Record {
        let mut r = Record::new(
            "r",
            ErrorEntry::new(std::time::SystemTime::now(), "transient", "http 503", "", 1),
        );
        if let Some(uri) = uri {
            r.metadata.insert("uri".into(), uri.into());
        }
        r.breaker = breaker.map(str::to_owned);
        r
    }

    #[test]
    fn the_host_comes_from_the_uri_then_the_breaker() {
        assert_eq!(
            of(&record(Some("https://API.Mail.test./v1"), Some("other:1"))).as_deref(),
            Some("api.mail.test:443")
        );
        assert_eq!(
            of(&record(Some("http://[0:0::1]:8080/x"), None)).as_deref(),
            Some("[::1]:8080")
        );
        assert_eq!(
            of(&record(Some("/relative"), Some("api.mail.test:443"))).as_deref(),
            Some("api.mail.test:443")
        );
        assert_eq!(of(&record(None, None)), None);
    }

    #[test]
    fn a_target_decides_the_breaker_a_resend_meets() {
        let r = record(Some("http://a.test/v1"), Some("tenant-7"));
        assert_eq!(breaker_of(&r, None).as_deref(), Some("tenant-7"));
        let target: http::Uri = "http://B.test:8080".parse().unwrap();
        assert_eq!(
            breaker_of(&r, Some(&target)).as_deref(),
            Some("b.test:8080")
        );
        let plain = record(Some("http://a.test/v1"), None);
        assert_eq!(breaker_of(&plain, None).as_deref(), Some("a.test:80"));
    }

    #[test]
    fn a_wanted_host_matches_with_or_without_its_port() {
        assert_eq!(normalise(" API.test.:443 "), "api.test:443");
        assert_eq!(normalise("api.test."), "api.test");
        assert_eq!(normalise("[::1]"), "[::1]");
        assert!(matches("api.test:443", &normalise("api.test")));
        assert!(matches("api.test:443", &normalise("api.test:443")));
        assert!(!matches("api.test:443", &normalise("api.test:80")));
        assert!(!matches("api.test.evil:443", &normalise("api.test")));
        assert!(matches("[::1]:80", &normalise("[::1]")));
    }
}
