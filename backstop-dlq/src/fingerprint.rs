//! Fingerprints: which dead letters are "the same failure", for the groups page.

use std::fmt::Write as _;

use tower_backstop::store::Record;

/// A record's fingerprint: its host, its class, its code, and its message with what varies from
/// one message to the next masked (numbers, hex and UUID-like ids, IP addresses, emails), so that
/// `timeout after 3012 ms to 10.0.0.7` and `timeout after 2999 ms to 10.0.0.9` are one group. The
/// host stays (the message's masked addresses are often the host): two customers failing the
/// same way are two groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Fingerprint {
    /// The record's host (`host:port`), empty when it has none.
    pub(crate) host: String,
    pub(crate) class: String,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl Fingerprint {
    pub(crate) fn of(record: &Record) -> Self {
        Fingerprint {
            host: super::host::of(record).unwrap_or_default(),
            class: record.class.clone(),
            code: record.code.clone(),
            message: mask(&record.message),
        }
    }

    /// A stable key for links (`?group=…`): FNV-1a 64 of the four parts, 16 hex digits. Stable
    /// across processes and versions of Rust, unlike `std`'s hasher.
    pub(crate) fn key(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [&self.host, &self.class, &self.code, &self.message] {
            for b in part.bytes().chain([0xff]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

/// Characters that stay inside one token: an email, an address with a port, an id.
fn in_token(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '@' | '%' | '+')
}

/// `message` with numbers as `<n>`, hex ids as `<hex>`, UUIDs as `<uuid>`, IP addresses as
/// `<ip>` and emails as `<email>`.
pub(crate) fn mask(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(c) = rest.chars().next() {
        if in_token(c) {
            let end = rest.find(|c: char| !in_token(c)).unwrap_or(rest.len());
            mask_token(&rest[..end], &mut out);
            rest = &rest[end..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn mask_token(token: &str, out: &mut String) {
    // Trailing punctuation (`at 10.0.0.1.`, `port 80:`) is not part of the value.
    let core = token.trim_end_matches(['.', ':', '-', '_']);
    let tail = &token[core.len()..];
    if let Some(kind) = whole(core) {
        out.push_str(kind);
    } else {
        mask_parts(core, out);
    }
    out.push_str(tail);
}

/// The mask of a token that is one value as a whole: an email, an IP address (with a port),
/// a UUID.
fn whole(t: &str) -> Option<&'static str> {
    if let Some((user, domain)) = t.split_once('@')
        && !user.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
    {
        return Some("<email>");
    }
    if is_ipv4(t)
        || is_ipv4(
            t.rsplit_once(':')
                .map_or("", |(a, p)| if digits(p) { a } else { "" }),
        )
    {
        return Some("<ip>");
    }
    if is_ipv6(t) {
        return Some("<ip>");
    }
    if is_uuid(t) {
        return Some("<uuid>");
    }
    None
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_ipv4(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| digits(p) && p.len() <= 3 && p.parse::<u16>().is_ok_and(|n| n <= 255))
}

fn is_ipv6(t: &str) -> bool {
    let t = t.trim_start_matches('[').trim_end_matches(']');
    // A zone (`fe80::1%eth0`) belongs to the address.
    let t = t.split('%').next().unwrap_or(t);
    t.matches(':').count() >= 2
        && t.bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        && (t.contains("::")
            || t.bytes().any(|b| b.is_ascii_alphabetic())
            || t.split(':').count() == 8)
}

fn is_uuid(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Masks the alphanumeric parts of a token one by one: a hex id (8 hex digits or more, with a
/// digit, or `0x…`) as `<hex>`, each run of digits in any other part as `<n>`.
fn mask_parts(t: &str, out: &mut String) {
    let mut rest = t;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !c.is_alphanumeric())
            .unwrap_or(rest.len());
        let (part, after) = rest.split_at(end);
        let is_hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        if (part.len() >= 8 && is_hex(part) && part.bytes().any(|b| b.is_ascii_digit()))
            || (part.len() > 2 && part.starts_with("0x") && is_hex(&part[2..]))
        {
            out.push_str("<hex>");
        } else {
            let mut in_digits = false;
            for c in part.chars() {
                if c.is_ascii_digit() {
                    if !in_digits {
                        out.push_str("<n>");
                    }
                    in_digits = true;
                } else {
                    in_digits = false;
                    out.push(c);
                }
            }
        }
        let mut chars = after.chars();
        if let Some(sep) = chars.next() {
            let _ = out.write_char(sep);
        }
        rest = chars.as_str();
    }
}

#[cfg(test)]
mod tests {
    use super::{Fingerprint, mask};
    use tower_backstop::store::{ErrorEntry, Record};

    #[test]
    fn two_hosts_failing_the_same_way_are_two_fingerprints() {
        let to = |id: &str, uri: &str, message: &str| {
            let at = std::time::SystemTime::now();
            let mut r = Record::new(id, ErrorEntry::new(at, "transient", "http 503", message, 1));
            r.metadata.insert("uri".into(), uri.into());
            Fingerprint::of(&r)
        };
        let a1 = to("1", "https://a.test/v1", "503 for message 17");
        let a2 = to("2", "https://A.test:443/v1", "503 for message 18");
        let b = to("3", "https://b.test/v1", "503 for message 17");
        assert_eq!(a1.key(), a2.key());
        assert_eq!(a1.host, "a.test:443");
        assert_ne!(a1.key(), b.key());
    }

    #[test]
    fn what_varies_is_masked() {
        for (message, masked) in [
            (
                "timeout after 3012 ms to 10.0.0.7:443",
                "timeout after <n> ms to <ip>",
            ),
            (
                "rejected recipient bob@example.com.",
                "rejected recipient <email>.",
            ),
            (
                "no message 0b4f6a0e-1c2d-4e5f-9a8b-7c6d5e4f3a2b here",
                "no message <uuid> here",
            ),
            ("id msg-00deadbeef42 failed", "id msg-<hex> failed"),
            ("addr 0x7fff0a at fe80::1%eth0", "addr <hex> at <ip>"),
            ("host [2001:db8::2]:25 said 421", "host [<ip>]:<n> said <n>"),
            (
                "http 503: Service Unavailable",
                "http <n>: Service Unavailable",
            ),
            ("café 12€", "café <n>€"),
            ("", ""),
        ] {
            assert_eq!(mask(message), masked, "{message}");
        }
    }

    #[test]
    fn the_same_failure_with_other_numbers_is_one_fingerprint() {
        assert_eq!(
            mask("quota 17 of 100 for tenant 4411 at 192.168.1.20"),
            mask("quota 99 of 100 for tenant 5 at 192.168.1.3")
        );
        assert_ne!(mask("quota exceeded"), mask("mailbox full"));
    }
}
