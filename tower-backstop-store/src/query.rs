//! What to look for in a store: [`Filter`], and what comes back from a count,
//! [`Counts`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use super::record::{Record, Status};

/// Which records a search, a count, a re-drive or a purge applies to. Every condition set must
/// hold; an empty filter matches every record.
///
/// Times compare with [`Record::last_failed_at`]: `since` is inclusive, `until` exclusive.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_backstop_store::{Filter, Status};
///
/// let hour_ago = SystemTime::now() - Duration::from_secs(3600);
/// let filter = Filter::new()
///     .class("throttled")
///     .tag("campaign", "flash_sale_april")
///     .since(hour_ago)
///     .status(Status::Dead);
/// assert!(!filter.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// The class name, exactly.
    pub class: Option<String>,
    /// The original code as displayed (`http 503`), exactly.
    pub code: Option<String>,
    /// Tags that must all be present with these values.
    pub tags: BTreeMap<String, String>,
    /// Last failed at or after this time.
    pub since: Option<SystemTime>,
    /// Last failed before this time.
    pub until: Option<SystemTime>,
    /// The status.
    pub status: Option<Status>,
    /// One of these ids (empty: any id).
    pub ids: Vec<String>,
}

impl Filter {
    /// A filter that matches every record.
    pub fn new() -> Self {
        Filter::default()
    }

    /// Only records of this class.
    pub fn class(mut self, class: impl Into<String>) -> Self {
        self.class = Some(class.into());
        self
    }

    /// Only records with this original code (`http 503`, `io ConnectionReset`).
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Only records with tag `key` equal to `value`; several tags must all match.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// Only records that last failed at or after `t`.
    pub fn since(mut self, t: SystemTime) -> Self {
        self.since = Some(t);
        self
    }

    /// Only records that last failed before `t`.
    pub fn until(mut self, t: SystemTime) -> Self {
        self.until = Some(t);
        self
    }

    /// Only records with this status.
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    /// Only the record with this id (several calls: any of them).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.ids.push(id.into());
        self
    }

    /// Whether the filter has no condition, and so matches every record. Re-drives and purges
    /// refuse an empty filter.
    pub fn is_empty(&self) -> bool {
        self.class.is_none()
            && self.code.is_none()
            && self.tags.is_empty()
            && self.since.is_none()
            && self.until.is_none()
            && self.status.is_none()
            && self.ids.is_empty()
    }

    /// The statuses a list of this filter shows ([`list_page`](super::list_page)), in its
    /// order: the filter's one; else dead, then deferred and in flight (listed together, the
    /// soonest due first), then resolved when `resolved` asks for them.
    pub fn listed_statuses(&self, resolved: bool) -> Vec<Status> {
        match self.status {
            Some(s) => vec![s],
            None if resolved => vec![
                Status::Dead,
                Status::Deferred,
                Status::InFlight,
                Status::Resolved,
            ],
            None => vec![Status::Dead, Status::Deferred, Status::InFlight],
        }
    }

    /// Whether `record` meets every condition.
    pub fn matches(&self, record: &Record) -> bool {
        self.class.as_ref().is_none_or(|c| *c == record.class)
            && self.code.as_ref().is_none_or(|c| *c == record.code)
            && self.tags.iter().all(|(k, v)| record.tags.get(k) == Some(v))
            && self.since.is_none_or(|t| record.last_failed_at >= t)
            && self.until.is_none_or(|t| record.last_failed_at < t)
            && self.status.is_none_or(|s| s == record.status)
            && (self.ids.is_empty() || self.ids.contains(&record.id))
    }
}

impl Filter {
    /// The filter that `key=value` pairs describe, every one of which must hold: the vocabulary
    /// of `backstop-dlq --filter` and of the board's query strings.
    ///
    /// | key | value |
    /// |---|---|
    /// | `class` | the class name, exactly |
    /// | `code` | the original code as displayed (`http 503`), exactly |
    /// | `status` | `dead`, `deferred`, `in_flight` (or `in-flight`), `resolved` |
    /// | `id` | a record id; several: any of them |
    /// | `tag.NAME` | the tag `NAME` has this value |
    /// | `since`, `until` | an RFC 3339 time (`2026-04-01T00:00:00Z`), or a duration back from `now` (`15m`, `2h`, `7days`) |
    ///
    /// A later `class`, `code`, `status`, `since`, `until` or `tag.NAME` replaces an earlier one.
    /// No pairs at all give the empty filter.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tower_backstop_store::{Filter, Status};
    ///
    /// let now = SystemTime::now();
    /// let f = Filter::from_pairs(["class=throttled", "tag.campaign=spring", "since=2h"], now)?;
    /// assert_eq!(f, Filter::new().class("throttled").tag("campaign", "spring")
    ///     .since(now - Duration::from_secs(7200)));
    ///
    /// let bad = Filter::from_pairs(["colour=red"], now).unwrap_err();
    /// assert_eq!(bad.key(), "colour");
    /// # Ok::<(), tower_backstop_store::FilterError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`FilterError`] naming the pair that is not `key=value`, the unknown key, or the key
    /// whose value is not a status or a time.
    pub fn from_pairs<I>(pairs: I, now: SystemTime) -> Result<Filter, FilterError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut filter = Filter::new();
        for item in pairs {
            let item = item.as_ref();
            let Some((key, value)) = item.split_once('=') else {
                return Err(FilterError::new(
                    item,
                    format!("filter {item:?} is not key=value"),
                ));
            };
            filter = match key {
                "class" => filter.class(value),
                "code" => filter.code(value),
                "id" => filter.id(value),
                "status" => filter.status(
                    value
                        .parse::<Status>()
                        .map_err(|e| FilterError::new(key, format!("filter status: {e}")))?,
                ),
                "since" | "until" => {
                    let t = parse_time(value, now).ok_or_else(|| {
                        FilterError::new(
                            key,
                            format!(
                                "filter {key}: {value:?} is neither an RFC 3339 time \
                                 (2026-04-01T00:00:00Z) nor a duration back from now (15m, 2h)"
                            ),
                        )
                    })?;
                    if key == "since" {
                        filter.since(t)
                    } else {
                        filter.until(t)
                    }
                }
                _ => match key.strip_prefix("tag.") {
                    Some(tag) if !tag.is_empty() => filter.tag(tag, value),
                    _ => {
                        return Err(FilterError::new(
                            key,
                            format!(
                                "unknown filter key {key:?} (class, code, status, id, tag.NAME, \
                                 since, until)"
                            ),
                        ));
                    }
                },
            };
        }
        Ok(filter)
    }
}

/// An RFC 3339 time, or a duration back from `now` (clamped at the Unix epoch).
fn parse_time(s: &str, now: SystemTime) -> Option<SystemTime> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Some(t);
    }
    let back = humantime::parse_duration(s).ok()?;
    // `SystemTime` can go before the epoch on some platforms: clamp there by hand.
    Some(
        now.checked_sub(back)
            .filter(|t| *t >= std::time::UNIX_EPOCH)
            .unwrap_or(std::time::UNIX_EPOCH),
    )
}

/// A `key=value` filter that [`Filter::from_pairs`] cannot read: not `key=value`, an unknown
/// key, a status or a time that does not parse. [`key`](FilterError::key) names the key (or the
/// whole pair when it has no `=`); the message says what was wrong and what is expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterError {
    key: String,
    message: String,
}

impl FilterError {
    fn new(key: impl Into<String>, message: String) -> Self {
        FilterError {
            key: key.into(),
            message,
        }
    }

    /// The key whose value is bad, the unknown key, or the pair that has no `=`.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FilterError {}

/// The filter as `key=value` pairs separated by spaces, the vocabulary of the command-line
/// tool's `--filter` (`class=throttled tag.campaign=spring status=dead since=2026-12-01T00:00:00.000Z`);
/// a value with a space or a quote in it is quoted (`code="http 503"`). Empty for the empty
/// filter.
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut pairs: Vec<(String, String)> = Vec::new();
        if let Some(class) = &self.class {
            pairs.push(("class".into(), class.clone()));
        }
        if let Some(code) = &self.code {
            pairs.push(("code".into(), code.clone()));
        }
        if let Some(status) = self.status {
            pairs.push(("status".into(), status.as_str().into()));
        }
        for (k, v) in &self.tags {
            pairs.push((format!("tag.{k}"), v.clone()));
        }
        if let Some(t) = self.since {
            pairs.push((
                "since".into(),
                humantime::format_rfc3339_millis(t).to_string(),
            ));
        }
        if let Some(t) = self.until {
            pairs.push((
                "until".into(),
                humantime::format_rfc3339_millis(t).to_string(),
            ));
        }
        for id in &self.ids {
            pairs.push(("id".into(), id.clone()));
        }
        for (i, (k, v)) in pairs.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            if v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == '"') {
                write!(f, "{k}={v:?}")?;
            } else {
                write!(f, "{k}={v}")?;
            }
        }
        Ok(())
    }
}

/// Counts of outstanding dead letters over a window: what [`Store::counts`](super::Store::counts)
/// returns.
///
/// Only [`Dead`](super::Status::Dead) records count as dead letters: a deferred record (or one in
/// flight) still waits for the scheduler and is counted apart, in
/// [`deferred`](Counts::deferred); a resolved one has healed and counts nowhere, so that alerts
/// never page about traffic that was delivered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Dead records whose last failure is in the window, in all.
    pub total: u64,
    /// Those records per class, the largest first (ties by name).
    pub by_class: Vec<(String, u64)>,
    /// Those records per original code, the largest first (ties by code).
    pub by_code: Vec<(String, u64)>,
    /// Codes the store saw for the first time in the window, with that time, the oldest first.
    pub new_codes: Vec<(String, SystemTime)>,
    /// Deferred and in-flight records whose last failure is in the window: outstanding, to be
    /// re-sent by the scheduler, not dead letters.
    pub deferred: u64,
}

impl Counts {
    /// Counts `records` whose last failure is at or after `since`; `first_seen` gives each code's
    /// first sighting.
    pub(crate) fn tally<'a>(
        since: SystemTime,
        records: impl IntoIterator<Item = &'a Record>,
        first_seen: impl IntoIterator<Item = (String, SystemTime)>,
    ) -> Counts {
        let mut by_class: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0;
        let mut deferred = 0;
        for r in records {
            if r.last_failed_at < since {
                continue;
            }
            match r.status {
                Status::Dead => {}
                Status::Deferred | Status::InFlight => {
                    deferred += 1;
                    continue;
                }
                Status::Resolved => continue,
            }
            total += 1;
            *by_class.entry(r.class.clone()).or_default() += 1;
            *by_code.entry(r.code.clone()).or_default() += 1;
        }
        let mut new_codes: Vec<(String, SystemTime)> = first_seen
            .into_iter()
            .filter(|(_, t)| *t >= since)
            .collect();
        new_codes.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        Counts {
            total,
            by_class: top_first(by_class),
            by_code: top_first(by_code),
            new_codes,
            deferred,
        }
    }
}

/// Sorts counts the largest first, ties by name.
pub(crate) fn top_first(counts: impl IntoIterator<Item = (String, u64)>) -> Vec<(String, u64)> {
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// A change to one record that is not a new failure: what re-drives and the scheduler write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Someone re-drives the record on purpose: status [`InFlight`](Status::InFlight) with
    /// `retry_at = until` (the claim), one more resend, and the durable attempt budget starts
    /// again from zero.
    Redriving {
        /// The end of the claim.
        until: SystemTime,
    },
    /// A re-send succeeded: status [`Resolved`](Status::Resolved), `resolved_at = at`, no
    /// retry-at.
    Resolved {
        /// When.
        at: SystemTime,
    },
    /// Stop scheduling it: status [`Dead`](Status::Dead), no retry-at.
    Dead,
    /// A status check of the provider found the request delivered
    /// ([`Reconciler`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Reconciler.html)): status [`Resolved`](Status::Resolved),
    /// `resolved_at = at`, no retry-at, and the metadata entry `reconciled: delivered`.
    Reconciled {
        /// When.
        at: SystemTime,
    },
    /// A status check of the provider found the request never delivered: it is sent again as if
    /// it had never been processed, by the [`Scheduler`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html): status
    /// [`Deferred`](Status::Deferred) with `retry_at`, and the metadata entry
    /// `reconciled: not_delivered`.
    NotDelivered {
        /// When to send it again.
        retry_at: SystemTime,
    },
    /// A scheduler claimed the record but did not send it to the provider (its breaker is open,
    /// or rejected it locally): status [`Deferred`](Status::Deferred) with `retry_at`, and the
    /// resend its claim counted is given back, so that only real sends count against the
    /// scheduler's [`max_resends`](https://docs.rs/tower-backstop/latest/tower_backstop/resend/struct.Scheduler.html#method.max_resends).
    Held {
        /// When to look at it again (the breaker's half-open time).
        retry_at: SystemTime,
    },
    /// The holder of a claim renews it while its re-send is in flight: the record stays
    /// [`InFlight`](Status::InFlight), with `retry_at = until`, the new end of the claim. Meant
    /// for [`Store::change_claimed`](super::Store::change_claimed), which writes it only while
    /// the claim holds.
    Renewed {
        /// The new end of the claim.
        until: SystemTime,
    },
    /// The holder of a claim gives it back unfinished (a scheduler shutting down with a re-send
    /// still in flight, which may have reached the provider): status
    /// [`Deferred`](Status::Deferred) with `retry_at`, so that another scheduler takes it then;
    /// the resend the claim counted stays counted. (A claim given back unsent is
    /// [`Held`](Change::Held), which gives the resend back too.)
    Released {
        /// When the record is due again (for a give-back at shutdown: now).
        retry_at: SystemTime,
    },
}

impl Change {
    /// Applies the change to `record`.
    pub fn apply(self, record: &mut Record) {
        match self {
            Change::Redriving { until } => {
                record.status = Status::InFlight;
                record.retry_at = Some(super::record::truncate(until));
                record.resends = record.resends.saturating_add(1);
                record.budget_spent = 0;
            }
            Change::Resolved { at } => {
                record.status = Status::Resolved;
                record.resolved_at = Some(super::record::truncate(at));
                record.retry_at = None;
            }
            Change::Dead => {
                record.status = Status::Dead;
                record.retry_at = None;
            }
            Change::Reconciled { at } => {
                record.status = Status::Resolved;
                record.resolved_at = Some(super::record::truncate(at));
                record.retry_at = None;
                record
                    .metadata
                    .insert("reconciled".to_owned(), "delivered".to_owned());
            }
            Change::NotDelivered { retry_at } => {
                record.status = Status::Deferred;
                record.retry_at = Some(super::record::truncate(retry_at));
                record
                    .metadata
                    .insert("reconciled".to_owned(), "not_delivered".to_owned());
            }
            Change::Held { retry_at } => {
                record.status = Status::Deferred;
                record.retry_at = Some(super::record::truncate(retry_at));
                record.resends = record.resends.saturating_sub(1);
            }
            Change::Renewed { until } => {
                record.status = Status::InFlight;
                record.retry_at = Some(super::record::truncate(until));
            }
            Change::Released { retry_at } => {
                record.status = Status::Deferred;
                record.retry_at = Some(super::record::truncate(retry_at));
            }
        }
    }
}

/// What came of a compare-and-set claim ([`Store::claim`](super::Store::claim)) or change
/// ([`Store::change_if_unchanged`](super::Store::change_if_unchanged)), or of a write under a
/// claim ([`Store::change_claimed`](super::Store::change_claimed),
/// [`Store::put_claimed`](super::Store::put_claimed)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The record was as it was read and is now claimed (or changed): the record as written (for a
    /// claim: [`InFlight`](Status::InFlight), `retry_at` the end of the claim, one more resend).
    Claimed(Box<Record>),
    /// Someone else changed the record since it was read (another re-drive, a scheduler, an
    /// operator, a new failure's status), or, for a write under a claim, the claim ended (it
    /// expired and another claimer took the record, or someone changed it): nothing was written,
    /// and the caller must not send it.
    ClaimedElsewhere {
        /// The record's status now.
        status: Status,
        /// Its resend count now.
        resends: u32,
    },
    /// The record is no longer in the store (deleted meanwhile): nothing was written.
    Missing,
}

/// Whether `current` is still the record `seen` was read as: the same status and the same resend
/// count. Every claim adds one resend, so a record claimed and released again in between (a
/// status that went dead → in flight → dead) does not pass for unchanged.
pub(crate) fn unchanged_since(current: &Record, seen: &Record) -> bool {
    current.status == seen.status && current.resends == seen.resends
}

/// The compare-and-set change of `current`, the record now in the store: applies `change` (in
/// place) if it is unchanged since `seen`.
pub(crate) fn change_if_unchanged(
    current: Option<&mut Record>,
    seen: &Record,
    change: Change,
) -> Claim {
    match current {
        None => Claim::Missing,
        Some(current) if unchanged_since(current, seen) => {
            change.apply(current);
            Claim::Claimed(Box::new(current.clone()))
        }
        Some(current) => Claim::ClaimedElsewhere {
            status: current.status,
            resends: current.resends,
        },
    }
}

/// What a claim does to a due record: status [`InFlight`](Status::InFlight), `retry_at` the end
/// of the lease, one more resend.
pub(crate) fn claim(record: &mut Record, now: SystemTime, lease: Duration) {
    record.status = Status::InFlight;
    record.retry_at = Some(super::record::add_clamped(now, lease));
    record.resends = record.resends.saturating_add(1);
}

/// Whether a record may be claimed by a scheduler at `now`.
pub(crate) fn claimable(record: &Record, now: SystemTime) -> bool {
    matches!(record.status, Status::Deferred | Status::InFlight)
        && record.retry_at.is_some_and(|t| t <= now)
}

/// Sorts records the most recently failed first, ties by id: the order of every search.
pub(crate) fn newest_first(records: &mut [Record]) {
    records.sort_by(|a, b| {
        b.last_failed_at
            .cmp(&a.last_failed_at)
            .then_with(|| a.id.cmp(&b.id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_read_every_key() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let f = Filter::from_pairs(
            [
                "class=throttled",
                "code=http 503",
                "status=in-flight",
                "id=a",
                "id=b",
                "tag.campaign=spring=2",
                "since=1h",
                "until=1970-01-01T02:00:00Z",
            ],
            now,
        )
        .unwrap();
        let want = Filter::new()
            .class("throttled")
            .code("http 503")
            .status(Status::InFlight)
            .id("a")
            .id("b")
            .tag("campaign", "spring=2")
            .since(now - Duration::from_secs(3600))
            .until(SystemTime::UNIX_EPOCH + Duration::from_secs(7200));
        assert_eq!(f, want);
        assert!(
            Filter::from_pairs(Vec::<String>::new(), now)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_pairs_name_the_key() {
        let now = SystemTime::now();
        for (pair, key, says) in [
            ("colour=red", "colour", "unknown filter key"),
            ("tag.=x", "tag.", "unknown filter key"),
            ("class", "class", "not key=value"),
            ("status=gone", "status", "\"gone\""),
            ("since=yesterday", "since", "neither an RFC 3339 time"),
            ("until=2026-13-01T00:00:00Z", "until", "neither"),
        ] {
            let e = Filter::from_pairs([pair], now).unwrap_err();
            assert_eq!(e.key(), key, "{pair}");
            assert!(e.to_string().contains(says), "{pair}: {e}");
        }
    }

    #[test]
    fn a_duration_longer_than_the_epoch_clamps() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(5);
        let f = Filter::from_pairs(["since=1h"], now).unwrap();
        assert_eq!(f.since, Some(SystemTime::UNIX_EPOCH));
    }
}
