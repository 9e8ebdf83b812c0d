//! Keys of keyed breakers ([`KeyOf`], [`Authority`]), the unkeyed `()` and [`PerKey`]
//! markers, and the bounded map of one breaker per key.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::state::{Settings, Shared};
use crate::status::State;

/// The most bytes a [`Key`] holds inline; a longer key is moved to the heap.
const INLINE: usize = 272;

/// A breaker key being built: a small buffer on the stack, so that taking the key of a request
/// allocates nothing (a host name is at most 253 bytes, plus `:` and a port). A longer key moves
/// to a `String`. [`KeyOf::key`] writes it as a [`fmt::Write`].
pub(crate) struct Key {
    inline: [u8; INLINE],
    len: usize,
    heap: Option<String>,
}

impl Default for Key {
    fn default() -> Self {
        Key::new()
    }
}

impl Key {
    /// An empty key.
    pub(crate) fn new() -> Self {
        Key {
            inline: [0; INLINE],
            len: 0,
            heap: None,
        }
    }

    /// Appends `s` to the key.
    pub(crate) fn push_str(&mut self, s: &str) {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
            return;
        }
        let end = self.len + s.len();
        if end <= INLINE {
            self.inline[self.len..end].copy_from_slice(s.as_bytes());
            self.len = end;
        } else {
            let mut heap = String::with_capacity(end);
            heap.push_str(self.as_str());
            heap.push_str(s);
            self.heap = Some(heap);
        }
    }

    /// The key so far.
    pub(crate) fn as_str(&self) -> &str {
        match &self.heap {
            Some(heap) => heap,
            // Only whole `&str`s are copied in, so the bytes are valid UTF-8.
            None => std::str::from_utf8(&self.inline[..self.len]).unwrap_or_default(),
        }
    }

    /// Whether nothing was written.
    pub(crate) fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }
}

impl fmt::Write for Key {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Key").field(&self.as_str()).finish()
    }
}

/// Takes the key of a request: which breaker of a keyed [`BreakerLayer`](super::BreakerLayer)
/// guards it.
///
/// Implemented by [`Authority`] (the default, [`BreakerLayer::per_host`](super::BreakerLayer::per_host))
/// and by closures `Fn(&Req) -> Option<String>` ([`BreakerLayer::keyed_by`](super::BreakerLayer::keyed_by)).
/// A request without a key (the method returns `false`, or writes nothing) goes through the
/// layer's one [`unkeyed`](super::BreakerLayer::unkeyed) breaker.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot take a breaker key from a `{Req}`",
    note = "use `Authority` for `http::Request`s, or a closure `Fn(&Req) -> Option<String>`"
)]
pub trait KeyOf<Req>: Send + Sync + 'static {
    /// Writes the key of `req` into `key` (a buffer on the stack: writing allocates nothing for a
    /// key of up to 272 bytes); `false` when the request has none.
    ///
    /// ```
    /// use std::fmt::Write;
    /// use tower_backstop::breaker::KeyOf;
    ///
    /// /// One breaker per tenant, read from the request's `X-Tenant` header.
    /// struct Tenant;
    ///
    /// impl<B> KeyOf<http::Request<B>> for Tenant {
    ///     fn key(&self, req: &http::Request<B>, key: &mut dyn Write) -> bool {
    ///         match req.headers().get("x-tenant").and_then(|v| v.to_str().ok()) {
    ///             Some(tenant) => key.write_str(tenant).is_ok(),
    ///             None => false,
    ///         }
    ///     }
    /// }
    ///
    /// let req = http::Request::get("/").header("x-tenant", "acme").body(()).unwrap();
    /// let mut key = String::new();
    /// assert!(Tenant.key(&req, &mut key));
    /// assert_eq!(key, "acme");
    /// ```
    fn key(&self, req: &Req, key: &mut dyn fmt::Write) -> bool;
}

/// The default key of an HTTP request: its host and port, normalised, so that every spelling
/// of one origin shares one breaker.
///
/// The host comes from the URI's authority, else from the `Host` header. Then:
///
/// - the host is lower-cased (host names are case-insensitive, RFC 3986 §3.2.2) and a trailing
///   dot is removed (`api.mail.test.` is `api.mail.test`);
/// - the port is the explicit one, else the scheme's default (`http` and `ws` 80, `https` and
///   `wss` 443, RFC 9110 §4.2); a URI with no scheme (a `Host` header with a relative URI) and
///   no port keeps the host alone;
/// - an IPv6 literal is written in its canonical form (RFC 5952: `[0:0::1]` is `[::1]`), in
///   brackets; an IPv4 literal is kept as written; a zone or a literal that does not parse is
///   kept lower-cased;
/// - user information (`user@`) is not part of the key.
///
/// A request with no authority and no valid `Host` header (a relative URI), or with an empty
/// host, has no key. Taking the key allocates nothing.
///
/// ```
/// use tower_backstop::breaker::Authority;
/// # fn key(uri: &str) -> String {
/// #     let req = http::Request::get(uri).body(()).unwrap();
/// #     Authority::key_of(&req).unwrap()
/// # }
/// assert_eq!(key("https://API.mail.test./send"), "api.mail.test:443");
/// assert_eq!(key("http://api.mail.test:8080/"), "api.mail.test:8080");
/// assert_eq!(key("http://[0:0::1]/"), "[::1]:80");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Authority;

impl Authority {
    /// The key of `req` as a `String`, or `None` when it has none (a convenience for logs and
    /// tests; the layer itself takes keys without allocating).
    pub fn key_of<B>(req: &http::Request<B>) -> Option<String> {
        let mut key = Key::new();
        Authority
            .key(req, &mut key)
            .then(|| key.as_str().to_owned())
    }
}

fn default_port(scheme: Option<&str>) -> Option<u16> {
    let scheme = scheme?;
    if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("wss") {
        Some(443)
    } else if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("ws") {
        Some(80)
    } else {
        None
    }
}

/// Writes `host` (as it appears in an authority: a name, an IPv4 literal, or an IPv6 literal in
/// brackets) and `port` into `key`, normalised; `false` for an empty host.
pub(crate) fn write_authority(host: &str, port: Option<u16>, key: &mut dyn fmt::Write) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        match inner.parse::<Ipv6Addr>() {
            Ok(ip) => {
                let _ = write!(key, "[{ip}]");
            }
            Err(_) => push_lower(key, host),
        }
    } else {
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.is_empty() {
            return false;
        }
        push_lower(key, host);
    }
    if let Some(port) = port {
        let _ = write!(key, ":{port}");
    }
    true
}

fn push_lower(key: &mut dyn fmt::Write, s: &str) {
    if !s.bytes().any(|b| b.is_ascii_uppercase()) {
        let _ = key.write_str(s);
        return;
    }
    for chunk in s.split_inclusive(|c: char| c.is_ascii_uppercase()) {
        match chunk.char_indices().last() {
            Some((i, c)) if c.is_ascii_uppercase() => {
                let _ = key.write_str(&chunk[..i]);
                let _ = key.write_char(c.to_ascii_lowercase());
            }
            _ => {
                let _ = key.write_str(chunk);
            }
        }
    }
}

impl<B> KeyOf<http::Request<B>> for Authority {
    fn key(&self, req: &http::Request<B>, key: &mut dyn fmt::Write) -> bool {
        let uri = req.uri();
        let scheme = uri.scheme_str();
        if let Some(authority) = uri.authority() {
            let port = authority.port_u16().or_else(|| default_port(scheme));
            return write_authority(authority.host(), port, key);
        }
        let Some(host) = req
            .headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<http::uri::Authority>().ok())
        else {
            return false;
        };
        let port = host.port_u16().or_else(|| default_port(scheme));
        write_authority(host.host(), port, key)
    }
}

impl<Req, F> KeyOf<Req> for F
where
    F: Fn(&Req) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, req: &Req, key: &mut dyn fmt::Write) -> bool {
        match self(req) {
            Some(k) => key.write_str(&k).is_ok(),
            None => false,
        }
    }
}

/// One breaker per key that `F` takes from the request, at most `max_keys` of them: what
/// [`BreakerLayer::per_host`](super::BreakerLayer::per_host) and
/// [`BreakerLayer::keyed_by`](super::BreakerLayer::keyed_by) make. It appears only as a type
/// parameter. Its key defaults to [`Authority`], so `BreakerLayer<PerKey>` (what
/// [`per_host`](super::BreakerLayer::per_host) returns) keeps one breaker per host.
#[derive(Clone, Copy, Debug)]
pub struct PerKey<F = Authority> {
    pub(crate) key: F,
    pub(crate) max_keys: usize,
}

impl<F> PerKey<F> {
    pub(crate) const fn new(key: F) -> Self {
        PerKey { key, max_keys: 64 }
    }
}

/// One key's breaker, and when it was last used (in `Registry::epoch` units).
struct Entry {
    shared: Arc<Shared>,
    last_used: AtomicU64,
}

/// The breakers of a keyed layer (`K` is a [`PerKey`]), one per key seen (bounded), built from
/// one template.
pub(crate) struct Registry<K> {
    keys: K,
    /// The bound, changed by a reload (see [`retune`](Self::retune)).
    max_keys: AtomicUsize,
    /// What a new key's breaker is built from, changed by a reload.
    template: RwLock<Settings>,
    breakers: RwLock<HashMap<Box<str>, Entry>>,
    /// Advanced each time a key is added: a coarse clock for "least recently used" that the hot
    /// path only reads.
    epoch: AtomicU64,
    /// Whether a request without a key went through the layer's `unkeyed` breaker: until then
    /// a health report does not list it.
    keyless: AtomicBool,
}

impl<F> Registry<PerKey<F>> {
    pub(crate) fn new(keys: PerKey<F>, template: Settings) -> Self {
        Registry {
            max_keys: AtomicUsize::new(keys.max_keys.max(1)),
            keys,
            template: RwLock::new(template),
            breakers: RwLock::default(),
            epoch: AtomicU64::new(0),
            keyless: AtomicBool::new(false),
        }
    }

    /// The key function.
    pub(crate) fn key_of(&self) -> &F {
        &self.keys.key
    }
}

impl<K: Clone> Registry<K> {
    /// An empty registry with this one's key function and bound, and `template`.
    pub(crate) fn with_template(&self, template: Settings) -> Self {
        Registry {
            keys: self.keys.clone(),
            max_keys: AtomicUsize::new(self.max_keys()),
            template: RwLock::new(template),
            breakers: RwLock::default(),
            epoch: AtomicU64::new(0),
            keyless: AtomicBool::new(false),
        }
    }
}

impl<K> Registry<K> {
    /// The settings every new key's breaker is built from.
    pub(crate) fn template(&self) -> Settings {
        self.template
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys.load(Ordering::Relaxed)
    }

    /// Takes the thresholds of `template` (of the same shape as the current one) for every
    /// key's breaker, kept and new, each keeping its state, and `max_keys` as the bound: a
    /// lower bound evicts idle breakers as new keys come, never a breaker in use.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn retune(&self, template: &Settings, max_keys: usize) {
        // Under the map's write lock, so that no key is made from the old template after it.
        let map = self
            .breakers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *self
            .template
            .write()
            .unwrap_or_else(PoisonError::into_inner) = template.clone();
        self.max_keys.store(max_keys.max(1), Ordering::Relaxed);
        for entry in map.values() {
            entry.shared.retune(template);
        }
    }

    /// A request without a key is going through the `unkeyed` breaker.
    #[inline]
    pub(crate) fn keyless_call(&self) {
        if !self.keyless.load(Ordering::Relaxed) {
            self.keyless.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a request without a key ever went through the `unkeyed` breaker.
    pub(crate) fn had_keyless_call(&self) -> bool {
        self.keyless.load(Ordering::Relaxed)
    }

    /// The breaker of `key`, made (and kept, within the bound) if it is new.
    pub(crate) fn get(&self, key: &str) -> Arc<Shared> {
        // A poisoned lock only means another thread panicked while inserting: the map is whole.
        {
            let read = self.breakers.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = read.get(key) {
                let epoch = self.epoch.load(Ordering::Relaxed);
                // Written only when it changed, so that a busy key's line is not written by
                // every call.
                if entry.last_used.load(Ordering::Relaxed) != epoch {
                    entry.last_used.store(epoch, Ordering::Relaxed);
                }
                return Arc::clone(&entry.shared);
            }
        }
        self.insert(key)
    }

    /// The breaker of `key`, if it is kept.
    pub(crate) fn find(&self, key: &str) -> Option<Arc<Shared>> {
        let map = self.breakers.read().unwrap_or_else(PoisonError::into_inner);
        map.get(key).map(|entry| Arc::clone(&entry.shared))
    }

    /// Calls `f` with each key's breaker, in key order, under the map's read lock (no `Arc`
    /// is cloned, so reading never keeps a breaker from eviction).
    pub(crate) fn each(&self, f: &mut dyn FnMut(&Shared)) {
        let map = self.breakers.read().unwrap_or_else(PoisonError::into_inner);
        let mut entries: Vec<(&Box<str>, &Entry)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (_, entry) in entries {
            f(&entry.shared);
        }
    }

    /// The keys that have a breaker, sorted.
    pub(crate) fn keys(&self) -> Vec<String> {
        let map = self.breakers.read().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<String> = map.keys().map(|k| k.to_string()).collect();
        keys.sort();
        keys
    }

    #[cold]
    fn insert(&self, key: &str) -> Arc<Shared> {
        let mut map = self
            .breakers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get(key) {
            return Arc::clone(&entry.shared);
        }
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let shared = Shared::new(&self.template().named(key));
        let max_keys = self.max_keys();
        // A loop: after a reload lowered the bound, each new key evicts down to it.
        while map.len() >= max_keys {
            // Evict an idle breaker (no call in flight, no handle held): a closed one first,
            // then the least recently used. Its state goes with it, and the key starts afresh
            // if it comes back; an open breaker, which is what protects a failing host, goes
            // last.
            let idle = map
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.shared) == 1)
                .min_by_key(|(_, e)| {
                    (
                        e.shared.state() != State::Closed,
                        e.last_used.load(Ordering::Relaxed),
                    )
                })
                .map(|(k, _)| k.clone());
            match idle {
                Some(old) => {
                    tracing::debug!(evicted = &*old, key, "idle breaker evicted for a new key");
                    map.remove(&old);
                }
                None => {
                    // Every breaker has calls in flight: this call gets a breaker of its own,
                    // kept nowhere, rather than another key's.
                    tracing::debug!(
                        key,
                        max_keys,
                        "every keyed breaker is in use; this call's breaker is not kept"
                    );
                    return shared;
                }
            }
        }
        map.insert(
            key.into(),
            Entry {
                shared: Arc::clone(&shared),
                last_used: AtomicU64::new(epoch),
            },
        );
        shared
    }
}

#[cfg(all(test, not(tower_backstop_loom)))]
mod tests {
    use super::*;

    fn key_of(uri: &str, host: Option<&str>) -> Option<String> {
        let mut req = http::Request::get(uri);
        if let Some(host) = host {
            req = req.header(http::header::HOST, host);
        }
        Authority::key_of(&req.body(()).unwrap())
    }

    #[test]
    fn authorities_are_normalised() {
        let cases = [
            ("https://API.Mail.Test/x", None, Some("api.mail.test:443")),
            (
                "https://api.mail.test.:443/x",
                None,
                Some("api.mail.test:443"),
            ),
            ("http://api.mail.test/", None, Some("api.mail.test:80")),
            ("HTTP://api.mail.test:80/", None, Some("api.mail.test:80")),
            (
                "http://api.mail.test:8080/",
                None,
                Some("api.mail.test:8080"),
            ),
            ("wss://Chat.test/", None, Some("chat.test:443")),
            ("ftp://files.test/", None, Some("files.test")),
            ("http://user:pw@api.test/", None, Some("api.test:80")),
            ("http://127.0.0.1:3000/", None, Some("127.0.0.1:3000")),
            ("http://[::1]/", None, Some("[::1]:80")),
            ("http://[0:0:0:0:0:0:0:1]:8443/", None, Some("[::1]:8443")),
            ("https://[2001:DB8::A]/", None, Some("[2001:db8::a]:443")),
            ("/relative", Some("API.mail.test"), Some("api.mail.test")),
            (
                "/relative",
                Some("api.mail.test:8025"),
                Some("api.mail.test:8025"),
            ),
            ("/relative", Some("[::1]:80"), Some("[::1]:80")),
            ("/relative", None, None),
            ("/relative", Some("bad host"), None),
            ("/relative", Some(""), None),
        ];
        for (uri, host, want) in cases {
            assert_eq!(key_of(uri, host).as_deref(), want, "{uri} {host:?}");
        }
    }

    #[test]
    fn a_long_key_moves_to_the_heap_whole() {
        let mut key = Key::new();
        let long = "a".repeat(200);
        key.push_str(&long);
        key.push_str(&long);
        assert_eq!(key.as_str().len(), 400);
        assert!(key.as_str().bytes().all(|b| b == b'a'));
        let mut key = Key::new();
        push_lower(&mut key, "ÄbC.Test");
        assert_eq!(key.as_str(), "Äbc.test");
    }
}
