//! Text as Postgres keeps it: `text` and `jsonb` cannot hold the character NUL, which a record's
//! strings may (an id is any idempotency key). Every string the store writes into a `text` or
//! `jsonb` value goes through [`encode`], and comes back through [`decode`].
//!
//! The code is order-preserving and one-to-one: NUL becomes U+0001 U+0001, U+0001 becomes
//! U+0001 U+0002, every other character stays. Byte order (the `"C"` collation the table's ids
//! use, and Rust's `str` order) is kept, so pages ordered by id in SQL come out as every other
//! store orders them; equality is kept, so a filter's encoded value finds exactly the records
//! with that value. Text without NUL or U+0001, which is nearly all text, is stored as it is and
//! reads the same in `psql`.

use std::borrow::Cow;

const ESCAPE: char = '\u{1}';

/// `s` as stored: NUL and U+0001 escaped, everything else as it is.
pub(super) fn encode(s: &str) -> Cow<'_, str> {
    if !s.contains(['\0', ESCAPE]) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\u{1}\u{1}"),
            ESCAPE => out.push_str("\u{1}\u{2}"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The text that [`encode`] stored as `s`; an error for an escape that [`encode`] never writes
/// (a value written by hand or by another tool).
pub(super) fn decode(s: String) -> Result<String, String> {
    if !s.contains(ESCAPE) {
        return Ok(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\u{1}') => out.push('\0'),
            Some('\u{2}') => out.push(ESCAPE),
            other => {
                return Err(format!(
                    "stored text has U+0001 followed by {other:?}, which this store never writes"
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{decode, encode};

    const SAMPLES: &[&str] = &[
        "",
        "\0",
        "\u{1}",
        "\u{2}",
        "a",
        "a\0",
        "a\u{1}",
        "a\u{2}",
        "a\0b",
        "a\u{1}\0",
        "\0\0",
        "\u{1}\u{1}",
        "é \0 ☃",
        "A",
        "\u{7f}",
        "zz",
    ];

    #[test]
    fn round_trips_and_keeps_order_and_equality() {
        for a in SAMPLES {
            let ea = encode(a);
            assert!(!ea.contains('\0'), "{a:?}");
            assert_eq!(decode(ea.clone().into_owned()).unwrap(), *a);
            for b in SAMPLES {
                let eb = encode(b);
                assert_eq!(a.cmp(b), ea.cmp(&eb), "{a:?} vs {b:?}");
            }
        }
        assert!(matches!(encode("plain"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn an_escape_it_never_writes_is_an_error() {
        for bad in ["\u{1}", "a\u{1}b", "\u{1}\u{3}"] {
            assert!(decode(bad.to_owned()).is_err(), "{bad:?}");
        }
    }
}
