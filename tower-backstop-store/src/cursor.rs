//! Keyset paging: where a list stopped ([`Cursor`], [`SortKey`]) and what is wrong with a token
//! that cannot be read ([`CursorError`]).
//!
//! A cursor holds the part of the list it stopped in and the sort key of the last record shown;
//! the next page is the records strictly after that key. Reading a page after a cursor costs
//! the same at the first page as deep in the list: the stores read it off an index from the key
//! on, where a page by position (`OFFSET`) reads and skips every record before it.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query::Filter;
use super::record::{Record, Status};

/// The sort key of a record in its part of a list, which keyset reads
/// ([`Store::search_after`](super::Store::search_after),
/// [`Store::search_waiting_after`](super::Store::search_waiting_after)) resume after: the last
/// failure time and the id for dead and resolved records (listed the most recently failed
/// first), the retry-at time and the id for deferred and in-flight ones (the soonest due first).
/// Ties of time are ordered by id (byte order), the order of every list ([`list_order`](super::list_order)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SortKey {
    /// The last failure time (dead and resolved records) or the retry-at time (waiting ones).
    pub at: SystemTime,
    /// The record's id.
    pub id: String,
}

impl SortKey {
    /// The key `(at, id)`.
    pub fn new(at: SystemTime, id: impl Into<String>) -> Self {
        SortKey { at, id: id.into() }
    }

    /// Whether a record at `(at, id)` comes after this key in the order of the most recently
    /// failed first (an earlier time, or the same time and a greater id).
    pub fn precedes_newest_first(&self, at: SystemTime, id: &str) -> bool {
        at < self.at || (at == self.at && id > self.id.as_str())
    }

    /// Whether a record at `(at, id)` comes after this key in the order of the soonest due
    /// first (a later time, or the same time and a greater id).
    pub fn precedes_soonest_first(&self, at: SystemTime, id: &str) -> bool {
        at > self.at || (at == self.at && id > self.id.as_str())
    }
}

/// The parts of a list, in its order: dead letters, then the records waiting for the scheduler
/// (deferred and in flight), then the resolved ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Part {
    Dead = 0,
    Waiting = 1,
    Resolved = 2,
}

impl Part {
    pub(crate) const ALL: [Part; 3] = [Part::Dead, Part::Waiting, Part::Resolved];

    pub(crate) fn of(status: Status) -> Part {
        match status {
            Status::Dead => Part::Dead,
            Status::Deferred | Status::InFlight => Part::Waiting,
            Status::Resolved => Part::Resolved,
        }
    }

    fn from_byte(b: u8) -> Option<Part> {
        Part::ALL.into_iter().find(|p| *p as u8 == b)
    }
}

/// Where a list stopped: an opaque token that [`list_after`](super::list_after) resumes from,
/// made by it ([`Page::next`](super::Page::next)) for one filter and one choice of resolved
/// records. It holds the part of the list it stopped in (dead, waiting or resolved), the sort
/// key of the last record shown ([`SortKey`]), and a fingerprint of the filter it was made for.
///
/// As text ([`Display`](fmt::Display), [`FromStr`]) it is URL-safe base64 without padding
/// (`A-Z a-z 0-9 - _`), about 70 characters for an id of 20 bytes: it goes in a query string or
/// a command line as it is. The token carries a checksum, so a token cut short or with a
/// character changed is refused ([`CursorError`]) rather than read as another position. It is
/// not signed: whoever can list can make a cursor for any position, which shows them nothing
/// they could not list.
///
/// A cursor stays good while the store changes: the next page is the records strictly after its
/// key, whether or not the last record shown is still there. A record written meanwhile before
/// the key is not shown; one written after it is. The filter's time range (`since`, `until`) is
/// not part of the fingerprint: a range relative to now (`since=2h`) moves between two pages,
/// and each page is read with the range as it is then.
///
/// ```
/// use tower_backstop_store::Cursor;
///
/// let bad = "not-a-cursor".parse::<Cursor>().unwrap_err();
/// assert!(bad.to_string().starts_with("invalid cursor"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cursor {
    part: Part,
    key: SortKey,
    fingerprint: u64,
}

/// The version of the token's layout, its first byte.
const VERSION: u8 = 1;

/// Version, part, time (16 bytes), fingerprint (8): what comes before the id.
const HEAD: usize = 1 + 1 + 16 + 8;

/// The checksum at the end of the token.
const SUM: usize = 4;

impl Cursor {
    /// The cursor just after `record` in a list of `fingerprint`.
    pub(crate) fn after(record: &Record, fingerprint: u64) -> Cursor {
        let part = Part::of(record.status);
        let at = match part {
            Part::Waiting => record.retry_at.unwrap_or(UNIX_EPOCH),
            Part::Dead | Part::Resolved => record.last_failed_at,
        };
        Cursor {
            part,
            key: SortKey::new(at, record.id.clone()),
            fingerprint,
        }
    }

    /// The sort key of the last record shown: the next page is the records after it.
    pub fn key(&self) -> &SortKey {
        &self.key
    }

    /// Whether this cursor resumes the list of `filter` (with resolved records when
    /// `with_resolved`): the list it was made for, but perhaps for the filter's time range.
    ///
    /// # Errors
    ///
    /// [`CursorError`] when it was made for another filter, or with resolved records for a list
    /// without them (or the other way round).
    pub fn check(&self, filter: &Filter, with_resolved: bool) -> Result<(), CursorError> {
        let listed = filter
            .listed_statuses(with_resolved)
            .into_iter()
            .any(|s| Part::of(s) == self.part);
        if self.fingerprint == fingerprint(filter, with_resolved) && listed {
            Ok(())
        } else {
            Err(CursorError::other_list())
        }
    }

    pub(crate) fn part(&self) -> Part {
        self.part
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEAD + self.key.id.len() + SUM);
        bytes.push(VERSION);
        bytes.push(self.part as u8);
        bytes.extend_from_slice(&nanos(self.key.at).to_be_bytes());
        bytes.extend_from_slice(&self.fingerprint.to_be_bytes());
        bytes.extend_from_slice(self.key.id.as_bytes());
        let sum = fnv1a(&bytes) as u32;
        bytes.extend_from_slice(&sum.to_be_bytes());
        bytes
    }

    fn from_bytes(bytes: &[u8]) -> Result<Cursor, CursorError> {
        if bytes.len() < HEAD + SUM {
            return Err(CursorError::damaged());
        }
        let (body, sum) = bytes.split_at(bytes.len() - SUM);
        if sum != (fnv1a(body) as u32).to_be_bytes() {
            return Err(CursorError::damaged());
        }
        if body[0] != VERSION {
            return Err(CursorError::new(format!(
                "invalid cursor: its layout is version {}, this version reads {VERSION}; \
                 list from the first page again",
                body[0]
            )));
        }
        let part = Part::from_byte(body[1]).ok_or_else(CursorError::damaged)?;
        let at = from_nanos(i128::from_be_bytes(
            body[2..18].try_into().expect("16 bytes"),
        ))
        .ok_or_else(CursorError::damaged)?;
        let fingerprint = u64::from_be_bytes(body[18..HEAD].try_into().expect("8 bytes"));
        let id = std::str::from_utf8(&body[HEAD..]).map_err(|_| CursorError::damaged())?;
        Ok(Cursor {
            part,
            key: SortKey::new(at, id),
            fingerprint,
        })
    }
}

impl fmt::Display for Cursor {
    /// The token: URL-safe base64 without padding.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&text::encode(&self.to_bytes()))
    }
}

impl FromStr for Cursor {
    type Err = CursorError;

    /// Reads a token that [`Display`](fmt::Display) wrote.
    ///
    /// # Errors
    ///
    /// [`CursorError`] when `token` is not URL-safe base64, is cut short or changed (its
    /// checksum does not match), or is of another version of the layout.
    fn from_str(token: &str) -> Result<Cursor, CursorError> {
        let token = token.trim();
        match text::decode(token) {
            Some(bytes) => Cursor::from_bytes(&bytes),
            // Made of the token's characters, but no token's text: one cut short or changed.
            None if !token.is_empty() && token.bytes().all(text::is_digit) => {
                Err(CursorError::damaged())
            }
            None => Err(CursorError::new(
                "invalid cursor: not a cursor token (a token is made of A-Z a-z 0-9 - _)"
                    .to_owned(),
            )),
        }
    }
}

/// A cursor that cannot be used: a token that is not one, or that was cut short or changed
/// ([`Cursor::from_str`]), or a cursor made for another list (another filter, or with resolved
/// records where this list has none: [`list_after`](super::list_after)). The message says which,
/// and what to do: list from the first page again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorError {
    message: String,
}

impl CursorError {
    fn new(message: String) -> Self {
        CursorError { message }
    }

    fn damaged() -> Self {
        CursorError::new(
            "invalid cursor: the token is damaged (cut short or changed: its checksum does not \
             match); copy it whole, or list from the first page again"
                .to_owned(),
        )
    }

    fn other_list() -> Self {
        CursorError::new(
            "invalid cursor: it was made for another list (another filter, or with resolved \
             records and without); list from the first page again"
                .to_owned(),
        )
    }
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CursorError {}

/// The fingerprint of a list: its filter but for the time range, and whether it lists resolved
/// records. FNV-1a over a canonical, length-prefixed form: stable across processes and versions.
pub(crate) fn fingerprint(filter: &Filter, with_resolved: bool) -> u64 {
    let mut bytes = vec![VERSION, u8::from(with_resolved)];
    let mut field = |tag: u8, value: Option<&str>| {
        bytes.push(tag);
        if let Some(v) = value {
            bytes.extend_from_slice(&(v.len() as u64).to_be_bytes());
            bytes.extend_from_slice(v.as_bytes());
        }
    };
    field(b'c', filter.class.as_deref());
    field(b'o', filter.code.as_deref());
    field(b's', filter.status.map(|s| s.as_str()));
    for (k, v) in &filter.tags {
        field(b't', Some(k));
        field(b'v', Some(v));
    }
    let mut ids: Vec<&str> = filter.ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        field(b'i', Some(id));
    }
    fnv1a(&bytes)
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Nanoseconds since the Unix epoch, negative before it.
fn nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The time `n` nanoseconds after the Unix epoch, if the platform can hold it.
fn from_nanos(n: i128) -> Option<SystemTime> {
    let secs = u64::try_from(n.unsigned_abs() / 1_000_000_000).ok()?;
    let d = Duration::new(secs, (n.unsigned_abs() % 1_000_000_000) as u32);
    if n >= 0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    }
}

/// URL-safe base64 without padding (RFC 4648 §5): the text of a token.
mod text {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    /// Whether `c` is a character of a token.
    pub(super) fn is_digit(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
    }

    pub(super) fn encode(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The bytes of `text`; `None` for a text that no bytes encode to (a character outside
    /// the alphabet, a length no bytes have, or a last character with bits set past the data:
    /// one text per bytes).
    pub(super) fn decode(text: &str) -> Option<Vec<u8>> {
        URL_SAFE_NO_PAD.decode(text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(id: &str, at: SystemTime) -> Cursor {
        Cursor {
            part: Part::Waiting,
            key: SortKey::new(at, id),
            fingerprint: fingerprint(&Filter::new().class("throttled"), false),
        }
    }

    #[test]
    fn the_text_round_trips_every_length() {
        for len in 0..40u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            let token = text::encode(&bytes);
            assert!(!token.contains(['+', '/', '=']));
            assert_eq!(text::decode(&token), Some(bytes), "{len}");
        }
        assert_eq!(text::encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(text::encode(b"fo"), "Zm8");
        assert_eq!(text::decode("Z"), None);
        assert_eq!(text::decode("Zm9v+"), None);
    }

    #[test]
    fn a_token_round_trips() {
        let t = UNIX_EPOCH + Duration::from_nanos(1_780_000_000_123_456_789);
        for c in [
            cursor("m-1", t),
            cursor("", UNIX_EPOCH),
            cursor("ünï \0 code", UNIX_EPOCH - Duration::from_secs(5)),
        ] {
            let token = c.to_string();
            assert_eq!(token.parse::<Cursor>(), Ok(c), "{token}");
        }
    }

    #[test]
    fn a_changed_or_cut_token_is_refused() {
        let token = cursor("m-1", UNIX_EPOCH).to_string();
        for i in 0..token.len() {
            let mut changed = token.clone().into_bytes();
            changed[i] = if changed[i] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(changed).unwrap();
            let e = changed.parse::<Cursor>().unwrap_err();
            assert!(e.to_string().starts_with("invalid cursor"), "{i}: {e}");
        }
        for len in 1..token.len() {
            // Cut short: said to be damaged, whether or not the rest still reads as base64.
            let e = token[..len].parse::<Cursor>().unwrap_err();
            assert!(e.to_string().contains("damaged"), "{len}: {e}");
        }
        // The last character changed, its spare bits set: damaged too.
        let mut last = token.clone().into_bytes();
        let end = last.len() - 1;
        last[end] = if last[end] == b'_' { b'-' } else { b'_' };
        let e = String::from_utf8(last)
            .unwrap()
            .parse::<Cursor>()
            .unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
        assert!("".parse::<Cursor>().is_err());
        for not_a_token in ["a b", "abc=", "é"] {
            let e = not_a_token.parse::<Cursor>().unwrap_err();
            assert!(
                e.to_string().contains("not a cursor token"),
                "{not_a_token:?}: {e}"
            );
        }
    }

    #[test]
    fn the_fingerprint_is_the_list_but_its_times() {
        let f = Filter::new().class("throttled").tag("campaign", "spring");
        let base = fingerprint(&f, false);
        assert_eq!(base, fingerprint(&f.clone().since(UNIX_EPOCH), false));
        assert_ne!(base, fingerprint(&f, true));
        assert_ne!(base, fingerprint(&f.clone().status(Status::Dead), false));
        assert_ne!(base, fingerprint(&Filter::new().class("throttled"), false));
        assert_ne!(
            fingerprint(&Filter::new().class("ab"), false),
            fingerprint(&Filter::new().code("ab"), false)
        );
        assert_eq!(
            fingerprint(&Filter::new().id("a").id("b"), false),
            fingerprint(&Filter::new().id("b").id("a"), false)
        );
    }
}
