//! The operator's tool for [tower-backstop](https://docs.rs/tower-backstop)'s dead letters: the
//! `backstop-dlq` command line and the dead-letter board.
//!
//! `cargo install backstop-dlq` gives the command line (list, show, stats, re-drive, purge,
//! prune, reconcile, audit, and `serve` for the board) over a SQLite file, a Redis URL or a
//! Postgres URL; run `backstop-dlq --help`, or see the `cli` module. An app that wants the board
//! in its own router depends on this crate with `default-features = false` (and the store
//! feature it uses, `sqlite`, `redis` or `postgres`) and mounts [`Board`].
//!
//! | feature | what | default |
//! |---|---|---|
//! | `cli` | the `backstop-dlq` binary (clap, a hyper-util client to re-drive through, a runtime) | yes |
//! | `sqlite` | open a SQLite store file | yes |
//! | `redis` | open a `redis://` store | yes |
//! | `postgres` | open a `postgres://` store | yes |
//!
//! # The board
//!
//! Web pages over a [`Store`] for the people who look after it. [`Board`] builds an axum [`Router`] that you mount in your own app. Its pages are server
//! rendered HTML that works without JavaScript:
//!
//! | route | page |
//! |---|---|
//! | `GET /` | the overview: outstanding dead letters and deferred records, the breakers (live ones from [`Board::breakers`], with their adaptive send rate while a throttling provider limits it; those the store's newest [`BREAKER_SCAN`] records an open breaker deferred name, with their retry-at; and what the fleet's notes say, [`Store::notes`] read once: each process's state, at most [`FLEET_PROCESSES`] a breaker, and an operator's [`FleetOverride`](tower_backstop::breaker::FleetOverride) in force), the top classes and codes over `?window=24h`, the dead-letter rate over that window, the alert rules' state |
//! | `GET /records` | the list, with each record's host, filtered by the `key=value` vocabulary of [`Filter::from_pairs`](tower_backstop::store::Filter::from_pairs) (`class`, `code`, `status`, `tag` as `NAME=value` or `tag.NAME`, `since`, `until`, `id`) and `host` (`api.mail.test:443`, or a name for any port: read off the records, so among the newest [`GROUP_LIMIT`] that match the rest), outstanding first, [`PAGE_SIZE`] a page: the next page after a cursor (`?after=TOKEN`, the "next" link; as fast at any depth), or by number (`?page=N`, which reads every record before the page; the way a list narrowed to a host or a group pages) |
//! | `GET /groups` | the records grouped by fingerprint (host, class, code, and the message with numbers, ids, addresses and emails masked: two hosts failing alike are two groups), over the newest [`GROUP_LIMIT`] that match |
//! | `GET /records/{id}` | one record: status, times, tags, headers (redacted ones by name only), payload as text, JSON or hex, history and root cause |
//! | `GET /audit` | the audit trail (re-drives, purges, prunes, breaker overrides), newest first |
//! | `POST /redrive/preview`, `POST /redrive/run` | a re-drive's dry run (with a warning, and how many records it concerns, when they go to a host whose breaker is open, live or by the store's retry-at, and another when some were already delivered), then the run |
//! | `POST /purge/preview`, `POST /purge/run` | a purge's count, then the purge |
//! | `POST /breaker/override` | an operator's override of one breaker for every process that shares its breakers through the store: `breaker` (its name), `action` (`force_open` or `disable` for `for`, a duration such as `30m` or `2h`, at most 7 days; or `reset`) and `reason`, all required; written with [`FleetOverride::publish`](tower_backstop::breaker::FleetOverride::publish) as the hook's actor (the note and the audit entry); each process applies it within a second |
//!
//! # Safe by default
//!
//! A board is read-only: it shows no action form and answers every `POST` with 403, until
//! [`Board::authorize`] gives it a hook that names the actor of a request (from its
//! [`Parts`]: a header your authentication middleware sets, an extension). The hook runs for
//! every request; `None` makes that request read-only. The overview's breaker override forms
//! show only to an actor, and only while the store's notes can be read. Each action form carries a random
//! per-board token that the `POST` must send back (compared in constant time), so another site
//! cannot make an operator's browser act. Actions never apply to everything: an empty filter is
//! refused (400). Re-drives need a service to send through ([`Board::redrive_through`]).
//! A re-drive never sends again a message already delivered by accident: when its records
//! include resolved ones (`status=resolved`, or a resolved record's own page), the preview says
//! how many and the run is refused (400) unless its form carries the preview's confirmation,
//! the ticked box "send again the records already delivered" (`include_resolved=1`); the audit
//! entry of such a run says how many it sent again.
//!
//! Every response, whatever its status (pages, errors, axum's own rejections), carries `X-Frame-Options:
//! DENY`, `Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; form-action
//! 'self'; frame-ancestors 'none'; base-uri 'none'` (the pages have no script),
//! `X-Content-Type-Options: nosniff`, `Cache-Control: no-store`, `Referrer-Policy: no-referrer`
//! and a `Content-Type` with its charset.
//!
//! The board does not authenticate anyone: mount it behind your own authentication.
//!
//! # Example
//!
//! Read-only, mounted under `/dead-letters`:
//!
//! ```
//! use std::sync::Arc;
//! use backstop_dlq::Board;
//! use tower_backstop::store::{MemoryStore, Store};
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! let app: axum::Router = axum::Router::new().nest("/dead-letters", Board::new(store).router());
//! # let _ = app;
//! ```
//!
//! # Customised
//!
//! Re-drives and purges for the requests your auth middleware marked with `x-operator`,
//! re-driven through a client stack to another host:
//!
//! ```
//! use std::sync::Arc;
//! use backstop_dlq::Board;
//! use tower_backstop::store::{MemoryStore, Store};
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! # let client = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
//! #     Ok::<_, tower_backstop::BoxError>(http::Response::new(())) });
//! let board = Board::new(store)
//!     .authorize(|parts: &http::request::Parts| {
//!         let who = parts.headers.get("x-operator")?.to_str().ok()?;
//!         Some(who.to_owned())
//!     })
//!     .redrive_through(client)
//!     .redrive_target("http://mail.internal:8080".parse().unwrap());
//! let app: axum::Router = axum::Router::new().nest("/dead-letters", board.router());
//! # let _ = app;
//! ```

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::routing::{get, post};
use bytes::Bytes;
use http::request::Parts;
use http_body_util::Full;
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;
use tower_service::Service;

use tower_backstop::Failure;
use tower_backstop::observe::Health;
use tower_backstop::store::{AlertRules, Store};

mod actions;
mod breakers;
#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
mod filter;
mod fingerprint;
mod fleet;
mod headers;
mod host;
mod html;
mod narrow;
mod pages;
mod record;

use self::html::Ctx;

/// The examples of the README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Records per page of the list (`GET /records`): 50.
pub const PAGE_SIZE: usize = 50;

/// The groups page, a group's list and a group's actions look at the newest this many
/// records that match the filter: 5,000. The page says so when there are more.
pub const GROUP_LIMIT: usize = 5_000;

/// The overview's breaker panel, a re-drive preview and `backstop-dlq stats` read the newest
/// this many of the records an open breaker deferred (deferred, of class `circuit_open`) for the
/// breakers they name and their retry-at: 500. The panel says how many of how many it read.
pub const BREAKER_SCAN: usize = 500;

/// The overview's breaker panel lists at most this many processes of the fleet for each
/// breaker, by id (it counts them all): 20.
pub const FLEET_PROCESSES: usize = 20;

/// The record page shows at most this many bytes of a payload (64 KiB), with a note when the
/// payload is longer; the hex view shows a quarter of that.
pub const PAYLOAD_PREVIEW: usize = 64 * 1024;

/// The re-drive form's default rate, messages per second: 10 (as `backstop-dlq redrive`).
pub const DEFAULT_RATE: u32 = 10;

/// The re-drive form's default maximum, messages: 100 (as `backstop-dlq redrive`).
pub const DEFAULT_MAX: usize = 100;

/// The largest maximum a re-drive form may ask for: 10,000.
pub const MAX_REDRIVE: usize = 10_000;

/// What a re-drive sends through, erased.
type Sender = BoxCloneSyncService<http::Request<Full<Bytes>>, (), Failure<()>>;

/// The authorisation hook: the actor of a request, or `None` for read-only.
type Authorize = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The dead-letter board: a builder of the [`Router`] of its pages over a store. See the
/// [crate docs](crate) for the routes and the safety rules.
///
/// Defaults: read-only (no [`authorize`](Board::authorize) hook), no re-drive service, each
/// record re-sent to its own URI, [`AlertRules::default`] for the overview's alert state, no
/// live breakers (the overview shows what the store knows of them).
#[derive(Clone)]
pub struct Board {
    store: Arc<dyn Store>,
    authorize: Option<Authorize>,
    sender: Option<Sender>,
    target: Option<http::Uri>,
    rules: AlertRules,
    health: Option<Health>,
}

impl fmt::Debug for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Board")
            .field("actions", &self.authorize.is_some())
            .field("redrive", &self.sender.is_some())
            .field("target", &self.target)
            .field("rules", &self.rules)
            .field("breakers", &self.health)
            .finish_non_exhaustive()
    }
}

impl Board {
    /// A read-only board over `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Board {
            store,
            authorize: None,
            sender: None,
            target: None,
            rules: AlertRules::default(),
            health: None,
        }
    }

    /// Allows actions (re-drive, purge, a breaker's override for the fleet) for the requests `hook` names an actor for: it gets the
    /// request's [`Parts`] (headers, extensions, URI) and returns the actor's name, recorded in
    /// the audit trail, or `None` to keep that request read-only. Without a hook the board is
    /// read-only for everyone.
    pub fn authorize<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.authorize = Some(Arc::new(hook));
        self
    }

    /// The service re-drives send through: normally the same stack as the original calls, with
    /// its [`DeadLetterLayer`](tower_backstop::dead_letter::DeadLetterLayer) over the same store, so that
    /// a request that fails again updates its record. Each record is rebuilt with
    /// [`http_request`](tower_backstop::resend::http_request) (to [`redrive_target`](Board::redrive_target)
    /// when set). Without one the board offers no re-drive.
    pub fn redrive_through<S>(mut self, service: S) -> Self
    where
        S: Service<http::Request<Full<Bytes>>> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
        S::Response: 'static,
        S::Error: Into<Failure<S::Response>> + 'static,
    {
        let erased = service
            .map_response(|_| ())
            .map_err(|e: S::Error| e.into().map_response(drop));
        self.sender = Some(BoxCloneSyncService::new(erased));
        self
    }

    /// Re-drives send to `target` instead of each record's own URI: `http://host:port` keeps
    /// each record's path; a URI with a path replaces it (as
    /// [`http_request`](tower_backstop::resend::http_request)'s target).
    pub fn redrive_target(mut self, target: http::Uri) -> Self {
        self.target = Some(target);
        self
    }

    /// The rules whose state the overview shows. Default [`AlertRules::default`].
    pub fn alert_rules(mut self, rules: AlertRules) -> Self {
        self.rules = rules;
        self
    }

    /// The live breakers of the app the board is mounted in, read on each request of the
    /// overview and of a re-drive preview: the overview lists each one's state, time to
    /// half-open, cause and (while a throttling provider limits it) send rate beside what the
    /// store knows, and a re-drive preview warns when the
    /// records go to one that is open. Take it from
    /// [`BreakerLayer::health`](tower_backstop::breaker::BreakerLayer::health) or
    /// [`BackstopLayer::health`](tower_backstop::BackstopLayer::health) of the stack the app
    /// calls its providers through (several combined with [`Health::and`]). Without it the
    /// board knows a breaker only from the records it deferred (their breaker key and
    /// retry-at).
    pub fn breakers(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// The router of the board's pages, to mount with
    /// [`Router::nest`](axum::Router::nest) (links follow the mount point) or to serve as it is.
    /// Each call makes a new CSRF secret.
    pub fn router(self) -> Router {
        let mut secret = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut secret);
        let shared = Arc::new(Shared {
            csrf: secret.iter().map(|b| format!("{b:02x}")).collect(),
            board: self,
        });
        Router::new()
            .route("/", get(pages::overview))
            .route("/records", get(pages::list))
            .route("/records/{id}", get(record::show))
            .route("/groups", get(pages::groups))
            .route("/audit", get(pages::audit))
            .route("/redrive/preview", post(actions::redrive_preview))
            .route("/redrive/run", post(actions::redrive_run))
            .route("/purge/preview", post(actions::purge_preview))
            .route("/purge/run", post(actions::purge_run))
            .route("/breaker/override", post(fleet::override_breaker))
            .fallback(headers::not_found)
            .layer(axum::middleware::from_fn(headers::secure))
            .with_state(shared)
    }
}

/// What every handler reads.
struct Shared {
    board: Board,
    csrf: String,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("board", &self.board)
            .finish_non_exhaustive()
    }
}

type BoardState = Arc<Shared>;

impl FromRequestParts<BoardState> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &BoardState,
    ) -> Result<Self, Self::Rejection> {
        // Nested under a prefix, the request's URI has it stripped; the original has it.
        let inner = parts.uri.path().to_owned();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or_else(|| inner.clone(), |u| u.0.path().to_owned());
        let base = match original.strip_suffix(inner.as_str()) {
            Some(base) => base.to_owned(),
            None if inner == "/" => original.trim_end_matches('/').to_owned(),
            None => String::new(),
        };
        let actor = state.board.authorize.as_ref().and_then(|hook| hook(parts));
        Ok(Ctx {
            base,
            actor,
            csrf: state.csrf.clone(),
        })
    }
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"ab"));
        assert!(!super::constant_time_eq(b"", b"a"));
    }
}
