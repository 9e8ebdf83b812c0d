//! [`Health`]: every breaker of a stack at a glance, for a `/health` or admin route, read
//! through each breaker's snapshot.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(any(feature = "serde", feature = "axum", feature = "dead-letter"))]
use serde::{Serialize, Serializer};

use crate::status::{BreakerSnapshot, State};

/// A reader of every breaker of one or more breaker layers (keyed ones included, each key's
/// breaker listed under its key), and when the process should count as down.
///
/// Take it from [`BreakerLayer::health`](crate::breaker::BreakerLayer::health) or
/// [`BackstopLayer::health`](crate::BackstopLayer::health), say when the report is unhealthy,
/// combine several stacks with [`and`](Self::and), and call [`report`](Self::report) on each
/// request of the route. It is cheap to clone (reference counts) and holds no breaker of a
/// keyed layer itself, so a key stays evictable. Each `report` takes the key map's read lock
/// once and a few atomic loads per breaker; the report's size is bounded by the keyed layer's
/// bound on keys (64 by default).
///
/// Two rules make a report unhealthy, and by default neither is set (the report is always
/// healthy, and lists the breakers):
///
/// - [`essential`](Self::essential): one named breaker is open (a process that sends all its
///   mail through one provider cannot serve without it);
/// - [`unhealthy_when_open`](Self::unhealthy_when_open): more than a share of the breakers is
///   open (a dispatcher with many customers can serve most of them while a few are down, and
///   is in trouble when most are).
///
/// # Readiness, not liveness
///
/// Point a *readiness* probe (Kubernetes' `readinessProbe`, a load balancer's health check)
/// at this route, never a *liveness* probe. Readiness takes the instance out of rotation
/// while it cannot do its work and puts it back when it can; liveness restarts it. A
/// provider's outage is not this process's fault: a restart does not mend it, it empties the
/// breakers, which then let every caller's requests through to the failing provider again,
/// and it loses what was held in memory. With every instance sharing the provider, a liveness
/// probe on it restarts them all at once. An open breaker is reported half-open once its open
/// duration is over, so a readiness probe that took the instance out lets it back in for the
/// probe call that can close it.
///
/// With the `axum` feature, a [`HealthReport`] is a response (`200 OK`, or `503 Service
/// Unavailable` while unhealthy), so a route is one line:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tower_backstop::BackstopLayer;
///
/// let backstop = BackstopLayer::http(Duration::from_secs(2));
/// // Unhealthy while the breaker of the mail provider's host is open.
/// let health = backstop.health().essential("mail.example.com:443");
/// let admin: Router = Router::new().route("/ready", get(move || async move { health.report() }));
/// // A dispatcher with many customers: unhealthy while more than half of them are down.
/// let health = backstop.health().unhealthy_when_open(0.5);
/// let admin = admin.route("/ready-many", get(move || async move { health.report() }));
/// # let _ = admin;
/// # }
/// ```
#[derive(Clone)]
pub struct Health {
    sources: Vec<Source>,
    essential: Vec<Box<str>>,
    /// Unhealthy while more than this share of the breakers listed is open.
    open_share: Option<f64>,
    /// The dead-letter layer's local spool, reported beside the breakers.
    #[cfg(feature = "sqlite")]
    spool: Option<crate::store::Spool>,
}

/// The breakers of one layer: calls its argument with a snapshot of each, in report order.
type Source = Arc<dyn Fn(&mut dyn FnMut(BreakerSnapshot<'_>)) + Send + Sync>;

impl Health {
    /// The breakers of one layer, read by `each`: it calls its argument with a snapshot of
    /// each breaker, in report order (a keyed layer's `unkeyed` breaker if it is listed, then
    /// its keys in sorted order).
    pub(crate) fn of(
        each: impl Fn(&mut dyn FnMut(BreakerSnapshot<'_>)) + Send + Sync + 'static,
    ) -> Self {
        Health {
            sources: vec![Arc::new(each)],
            essential: Vec::new(),
            open_share: None,
            #[cfg(feature = "sqlite")]
            spool: None,
        }
    }

    /// Reports `spool` too ([`HealthReport::spool`]): the records waiting in it to be
    /// forwarded, and whether the dead-letter store takes them. [`BackstopLayer::health`](crate::BackstopLayer::health)
    /// adds the spool of its dead-letter layer by itself. A spool does not make the report
    /// unhealthy: a store outage is not this process's to mend, and readiness is about its
    /// providers; alert on the spool instead (`backstop_spool_records`, `backstop_store_up`).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn spool(mut self, spool: &crate::store::Spool) -> Self {
        self.spool = Some(spool.clone());
        self
    }

    /// Marks the breaker named `name` as essential: while it is open (or forced open), the
    /// report is unhealthy. For a keyed layer the name is the key as its key function
    /// normalises it (for one breaker per host, `host:port` in lower case); a key that has no
    /// breaker yet (no request with it was seen, or it was evicted) is not open. A half-open
    /// breaker is not counted as down, since it is already letting probes through
    /// (resilience4j's health indicator reports half-open as `UNKNOWN`, not `DOWN`).
    pub fn essential(mut self, name: &str) -> Self {
        self.essential.push(name.into());
        self
    }

    /// Unhealthy while more than `share` (from 0.0 to 1.0) of the breakers listed is open or
    /// forced open: `0.5` is "more than half of the providers are down". Half-open is not
    /// down (probes are going through), and an empty report is healthy. For a dispatcher
    /// that calls many providers, where one customer's outage must not take the instance out
    /// but most of them down means the trouble is ours (a network or DNS fault, a bad
    /// deploy). A share outside `0.0..=1.0` is taken as the nearest bound (`0.0`: any open
    /// breaker; `1.0`: never); `NaN` as `1.0`. Combines with [`essential`](Self::essential):
    /// either rule makes the report unhealthy.
    pub fn unhealthy_when_open(mut self, share: f64) -> Self {
        self.open_share = Some(if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        });
        self
    }

    /// This reader and `other` as one: the report lists this one's breakers, then `other`'s,
    /// and the essential names of both apply to all of them; with a share of
    /// [`unhealthy_when_open`](Self::unhealthy_when_open) on both, the smaller applies, to all
    /// the breakers.
    pub fn and(mut self, other: Health) -> Self {
        self.sources.extend(other.sources);
        self.essential.extend(other.essential);
        self.open_share = match (self.open_share, other.open_share) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        #[cfg(feature = "sqlite")]
        if self.spool.is_none() {
            self.spool = other.spool;
        }
        self
    }

    /// Every breaker's state now, in layer order (a keyed layer's breaker of requests without a
    /// key, named `unkeyed`, once such a request used it, then its keys in sorted order), and
    /// whether the process is healthy by the rules set.
    pub fn report(&self) -> HealthReport {
        let mut breakers = Vec::new();
        for source in &self.sources {
            source(&mut |snapshot| breakers.push(self.read(snapshot)));
        }
        let essential_down = breakers.iter().any(|b| b.essential && b.is_open());
        let open = breakers.iter().filter(|b| b.is_open()).count();
        let too_many_down = self
            .open_share
            .is_some_and(|share| open as f64 > share * breakers.len() as f64);
        #[cfg(feature = "sqlite")]
        let spool = self.spool.as_ref().map(|spool| {
            let state = spool.state();
            SpoolHealth {
                records: state.records,
                bytes: state.bytes,
                max_bytes: state.max_bytes,
                store_up: state.store_up,
                quarantined: state.quarantined,
            }
        });
        #[cfg(not(feature = "sqlite"))]
        let spool = None;
        HealthReport {
            healthy: !essential_down && !too_many_down,
            breakers,
            spool,
        }
    }

    fn read(&self, snapshot: BreakerSnapshot<'_>) -> BreakerHealth {
        let mut state = snapshot.state;
        let mut half_open_in = None;
        if state == State::Open {
            match snapshot.retry_after {
                // The breaker half-opens at the next call once its open duration is over; it
                // is reported as it will act. Reported as still open, a readiness probe that
                // took the instance out of rotation would keep it out: no call would come.
                Some(Duration::ZERO) | None => state = State::HalfOpen,
                left => half_open_in = left,
            }
        }
        BreakerHealth {
            name: snapshot.name.to_string(),
            state,
            essential: self.essential.iter().any(|e| **e == *snapshot.name),
            failure_rate: snapshot.failure_rate,
            window_calls: snapshot.window_calls,
            window_failures: snapshot.window_failures,
            consecutive_failures: snapshot.consecutive_failures,
            half_open_in,
            cause: snapshot.cause,
            opened: snapshot.opened,
            rejected: snapshot.rejected,
            send_rate: snapshot.send_rate.map(|(rate, _)| rate),
            send_rate_peak: snapshot.send_rate.map(|(_, peak)| peak),
            concurrency_limit: snapshot.concurrency_limit,
        }
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("layers", &self.sources.len())
            .field("essential", &self.essential)
            .field("open_share", &self.open_share)
            .finish()
    }
}

/// What [`Health::report`] read: whether the process is healthy, and every breaker.
///
/// Serialised (serde) as JSON it reads
/// `{"healthy":false,"breakers":[{"name":"mail.example.com:443","state":"open","essential":true,
/// "failure_rate":0.6,"window_calls":20,"window_failures":12,"consecutive_failures":3,
/// "half_open_in_ms":850,"cause":"…","opened":1,"rejected":4}]}`: states in the lower-case
/// words of [`State::as_str`], durations in whole milliseconds, `null` where a field does not
/// apply. With the `axum` feature it is a response: that JSON with `Cache-Control: no-store`,
/// status `200 OK` when healthy and `503 Service Unavailable` when not (as a Kubernetes
/// readiness probe or a load balancer's health check expects; see [`Health`] on why not a
/// liveness probe).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(
    any(feature = "serde", feature = "axum", feature = "dead-letter"),
    derive(Serialize)
)]
#[non_exhaustive]
pub struct HealthReport {
    /// `false` while a breaker marked [essential](Health::essential) is open or forced open,
    /// or more than the share of [`unhealthy_when_open`](Health::unhealthy_when_open) is.
    pub healthy: bool,
    /// Every breaker, in the order of [`Health::report`].
    pub breakers: Vec<BreakerHealth>,
    /// The dead-letter layer's local spool, when one is reported ([`Health::spool`]); absent
    /// from the JSON otherwise.
    #[cfg_attr(
        any(feature = "serde", feature = "axum", feature = "dead-letter"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub spool: Option<SpoolHealth>,
}

/// The local spool in a [`HealthReport`]: what waits in it to be forwarded to the dead-letter
/// store, and whether the store takes it. JSON:
/// `{"records":12,"bytes":30512,"max_bytes":268435456,"store_up":false,"quarantined":0}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    any(feature = "serde", feature = "axum", feature = "dead-letter"),
    derive(Serialize)
)]
#[non_exhaustive]
pub struct SpoolHealth {
    /// Records waiting to be forwarded.
    pub records: u64,
    /// Their bytes (the records' JSON).
    pub bytes: u64,
    /// The spool's size cap in bytes: records past it are refused (not stored).
    pub max_bytes: u64,
    /// Whether the store answered the spool's last forwarding (`true` before any).
    pub store_up: bool,
    /// Records this process moved to the spool's quarantine file (past the age cap, or not
    /// decodable).
    pub quarantined: u64,
}

/// One breaker in a [`HealthReport`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(
    any(feature = "serde", feature = "axum", feature = "dead-letter"),
    derive(Serialize)
)]
#[non_exhaustive]
pub struct BreakerHealth {
    /// The breaker's name: a keyed breaker's key (for one breaker per host, the provider's
    /// `host:port`); `unkeyed` for a keyed layer's requests without a key.
    pub name: String,
    /// Its state now. An open breaker whose open duration is over is reported half-open: it
    /// half-opens then by itself (on a tokio runtime), or at its next call.
    #[cfg_attr(
        any(feature = "serde", feature = "axum", feature = "dead-letter"),
        serde(serialize_with = "state_name")
    )]
    pub state: State,
    /// Whether it was marked [essential](Health::essential).
    pub essential: bool,
    /// Failed calls ÷ calls in the current window, from 0.0 to 1.0: `None` for a breaker
    /// without a failure-rate rule, or whose window holds no call.
    pub failure_rate: Option<f64>,
    /// Calls in the current window (rate rules only; 0 otherwise).
    pub window_calls: u64,
    /// Failed calls in the current window (rate rules only; 0 otherwise).
    pub window_failures: u64,
    /// Failures in a row towards a consecutive-failures rule (0 without that rule; back to 0
    /// when the breaker opens).
    pub consecutive_failures: u32,
    /// While open: the time left until it half-opens. `None` in any other state. Serialised
    /// as `half_open_in_ms`, whole milliseconds rounded up.
    #[cfg_attr(
        any(feature = "serde", feature = "axum", feature = "dead-letter"),
        serde(rename = "half_open_in_ms", serialize_with = "millis")
    )]
    pub half_open_in: Option<Duration>,
    /// While open, half-open or forced open: why it last opened, as the rejections' message
    /// gives it (the failures counted, over how long, and the last one's class, code and
    /// message), when it tripped on failures.
    pub cause: Option<String>,
    /// Times it opened since it was built (trips and failed probes, not forced opens).
    pub opened: u64,
    /// Calls it rejected since it was built.
    pub rejected: u64,
    /// While the provider's throttled answers limit it: the adaptive send rate now, in
    /// requests a second ([`AdaptiveRate`](crate::breaker::AdaptiveRate)). `None` while not
    /// limited, or without an adaptive rate. A limited rate does not make the report
    /// unhealthy: the provider is up and asks for less.
    pub send_rate: Option<f64>,
    /// While limited: the rate the provider took when the limit began (before its first
    /// throttled answer or over the limit's first measure, the larger), in requests a second.
    pub send_rate_peak: Option<f64>,
    /// While the provider's overload answers limit it: the adaptive concurrency limit now, in
    /// calls in flight at once ([`AdaptiveConcurrency`](crate::breaker::AdaptiveConcurrency)).
    /// `None` while not limited, or without an adaptive concurrency limit. A limit does not
    /// make the report unhealthy: the provider is up and takes fewer calls at once.
    pub concurrency_limit: Option<u32>,
}

impl BreakerHealth {
    /// Open or forced open: rejecting every call.
    fn is_open(&self) -> bool {
        matches!(self.state, State::Open | State::ForcedOpen)
    }
}

#[cfg(any(feature = "serde", feature = "axum", feature = "dead-letter"))]
fn state_name<S: Serializer>(state: &State, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

#[cfg(any(feature = "serde", feature = "axum", feature = "dead-letter"))]
fn millis<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => {
            let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 > 0);
            s.serialize_u64(u64::try_from(ms).unwrap_or(u64::MAX))
        }
        None => s.serialize_none(),
    }
}

#[cfg(feature = "axum")]
mod response {
    use axum_core::body::Body;
    use axum_core::response::{IntoResponse, Response};
    use http::{HeaderValue, StatusCode, header};

    use super::HealthReport;

    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    impl IntoResponse for HealthReport {
        /// The report as JSON, `200 OK` when healthy, `503 Service Unavailable` when not.
        fn into_response(self) -> Response {
            let status = if self.healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            // Only strings, numbers, booleans and `null`: serialising cannot fail.
            let body = serde_json::to_vec(&self).unwrap_or_default();
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
    }
}
