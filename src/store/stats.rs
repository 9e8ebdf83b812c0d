//! Stats and alert signals over a dead-letter store, and their terminal dashboard.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::query::Counts;
use super::{Store, StoreError};

/// When the alert signals fire. The defaults follow the usual runbook of a mail pipeline:
/// a class above 20 % of the dead letters of the last 5 minutes, a dead-letter rate over the last
/// 5 minutes at least 3 times that of the hour before, a code never seen before.
///
/// Only outstanding dead letters ([`Dead`](super::Status::Dead) records) count: deferred records
/// are shown apart and resolved ones never. The two signals that compare with the past (the
/// rate spike and the new code) wait until the store has that past: a record that last failed
/// before the baseline period began. A new store, or one purged of everything older, raises
/// neither.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AlertRules {
    /// The recent window the signals look at. Default 5 minutes.
    pub window: Duration,
    /// A class whose share of the window's dead letters is above this fraction raises
    /// [`Alert::ClassShare`]. Default 0.2 (20 %).
    pub class_share: f64,
    /// The window must hold at least this many dead letters for the rate and share signals
    /// (one failure alone is 100 % of one). Default 5.
    pub min_count: u64,
    /// The baseline the rate is compared with: the dead letters of this period before the
    /// window. Default 1 hour.
    pub baseline: Duration,
    /// The window's rate at least this many times the baseline's raises [`Alert::RateSpike`].
    /// Default 3.0.
    pub spike_factor: f64,
    /// In-process alerts only ([`Alerts`](crate::event::Alerts)): the period over which a
    /// growing deferred backlog and falling deliveries raise [`Alert::BacklogGrowing`].
    /// Default 10 minutes.
    pub backlog_window: Duration,
    /// In-process alerts only: deliveries of the last `backlog_window` below this fraction of
    /// those of the one before count as falling. Default 0.5.
    pub delivery_drop: f64,
}

impl Default for AlertRules {
    fn default() -> Self {
        AlertRules {
            window: Duration::from_secs(5 * 60),
            class_share: 0.2,
            min_count: 5,
            baseline: Duration::from_secs(60 * 60),
            spike_factor: 3.0,
            backlog_window: Duration::from_secs(10 * 60),
            delivery_drop: 0.5,
        }
    }
}

/// An alert signal.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Alert {
    /// The dead-letter rate of the window is well above the baseline's.
    RateSpike {
        /// Dead letters per minute in the window.
        per_minute: f64,
        /// Dead letters per minute in the baseline period before it.
        baseline_per_minute: f64,
    },
    /// One class holds more than the configured share of the window's dead letters.
    ClassShare {
        /// The class.
        class: String,
        /// Its share, from 0 to 1.
        share: f64,
        /// Its dead letters in the window.
        count: u64,
        /// All dead letters in the window.
        total: u64,
    },
    /// A code the store had never seen appeared in the window.
    NewCode {
        /// The code.
        code: String,
        /// When it was first seen.
        first_seen: SystemTime,
    },
    /// A breaker opened (in-process alerts only): raised when it opens or is forced open,
    /// cleared when it closes or is disabled, not while it is half-open.
    BreakerOpen {
        /// The breaker's name (a keyed breaker's key).
        breaker: String,
    },
    /// The deferred backlog grew over the backlog window while deliveries fell (in-process
    /// alerts only).
    BacklogGrowing {
        /// The records waiting now.
        backlog: u64,
        /// How many more than a backlog window ago.
        grown_by: u64,
        /// Deliveries (successful attempts and re-sends) per minute over the last window.
        delivered_per_minute: f64,
        /// Deliveries per minute over the window before.
        before_per_minute: f64,
    },
}

impl Alert {
    /// The rule's name, stable, for a log field or a metric label: `dead_letter_spike`,
    /// `class_share`, `new_code`, `breaker_open`, `backlog_growing`.
    pub const fn rule(&self) -> &'static str {
        match self {
            Alert::RateSpike { .. } => "dead_letter_spike",
            Alert::ClassShare { .. } => "class_share",
            Alert::NewCode { .. } => "new_code",
            Alert::BreakerOpen { .. } => "breaker_open",
            Alert::BacklogGrowing { .. } => "backlog_growing",
        }
    }
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Alert::RateSpike {
                per_minute,
                baseline_per_minute,
            } => write!(
                f,
                "dead-letter rate {per_minute:.1}/min, baseline {baseline_per_minute:.1}/min"
            ),
            Alert::ClassShare {
                class,
                share,
                count,
                total,
            } => write!(
                f,
                "class {class} is {:.0}% of recent dead letters ({count} of {total})",
                share * 100.0
            ),
            Alert::NewCode { code, first_seen } => write!(
                f,
                "new code {code:?} first seen {}",
                humantime::format_rfc3339_seconds(super::record::truncate(*first_seen))
            ),
            Alert::BreakerOpen { breaker } => write!(f, "breaker {breaker} is open"),
            Alert::BacklogGrowing {
                backlog,
                grown_by,
                delivered_per_minute,
                before_per_minute,
            } => write!(
                f,
                "deferred backlog {backlog} (+{grown_by}) while deliveries fell to \
                 {delivered_per_minute:.1}/min from {before_per_minute:.1}/min"
            ),
        }
    }
}

/// What `backstop-dlq stats` shows: counts over a window, the recent rate, and the alert
/// signals. Its `Display` is the terminal dashboard.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Stats {
    /// When the stats were taken.
    pub at: SystemTime,
    /// The window of [`counts`](Stats::counts).
    pub window: Duration,
    /// Dead letters whose last failure is in the window, by class and code, top first.
    pub counts: Counts,
    /// Dead letters per minute over the rules' recent window.
    pub per_minute: f64,
    /// Whether the store holds the history the rate spike and the new-code signals compare
    /// with (a record that last failed before the baseline period); without it they do not fire.
    pub has_baseline: bool,
    /// The rules the alerts were computed with.
    pub rules: AlertRules,
    /// The signals that fired.
    pub alerts: Vec<Alert>,
}

impl AlertRules {
    /// The rate spike and class-share signals of a window that holds `total` dead letters
    /// (`by_class`, per class) after a baseline period that held `baseline_total`;
    /// `has_baseline` when that period is really in the past of what was counted. Shared by
    /// [`Stats`] (over a store) and the in-process [`Alerts`](crate::event::Alerts).
    pub(crate) fn measure<'a>(
        &self,
        total: u64,
        baseline_total: u64,
        has_baseline: bool,
        by_class: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Vec<Alert> {
        let mut alerts = Vec::new();
        if total < self.min_count {
            return alerts;
        }
        let rate = per_minute(total, self.window);
        let baseline_rate = per_minute(baseline_total, self.baseline);
        if has_baseline && rate >= self.spike_factor * baseline_rate {
            alerts.push(Alert::RateSpike {
                per_minute: rate,
                baseline_per_minute: baseline_rate,
            });
        }
        for (class, count) in by_class {
            let share = count as f64 / total as f64;
            if share > self.class_share {
                alerts.push(Alert::ClassShare {
                    class: class.to_owned(),
                    share,
                    count,
                    total,
                });
            }
        }
        alerts
    }
}

fn per_minute(count: u64, over: Duration) -> f64 {
    let minutes = over.as_secs_f64() / 60.0;
    if minutes > 0.0 {
        count as f64 / minutes
    } else {
        0.0
    }
}

impl Stats {
    /// Reads the counts of the last `window` from `store` and computes the alert signals of
    /// `rules`, at time `now`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot be read.
    pub async fn gather(
        store: &dyn Store,
        now: SystemTime,
        window: Duration,
        rules: AlertRules,
    ) -> Result<Stats, StoreError> {
        let since = |d: Duration| now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH);
        let counts = store.counts(since(window)).await?;
        let recent = store.counts(since(rules.window)).await?;
        let with_baseline = store.counts(since(rules.window + rules.baseline)).await?;
        let rate = per_minute(recent.total, rules.window);
        let baseline_start = since(rules.window + rules.baseline);
        let has_baseline = !store
            .search(&super::Filter::new().until(baseline_start), 0..1)
            .await?
            .is_empty();
        let by_class = recent.by_class.iter().map(|(c, n)| (c.as_str(), *n));
        let baseline_total = with_baseline.total.saturating_sub(recent.total);
        let mut alerts = rules.measure(recent.total, baseline_total, has_baseline, by_class);
        // A new code of a dead letter: deferred records are not dead letters.
        let dead_codes: Vec<&str> = recent.by_code.iter().map(|(c, _)| c.as_str()).collect();
        for (code, first_seen) in &recent.new_codes {
            if has_baseline && dead_codes.contains(&code.as_str()) {
                alerts.push(Alert::NewCode {
                    code: code.clone(),
                    first_seen: *first_seen,
                });
            }
        }
        Ok(Stats {
            at: now,
            window,
            counts,
            per_minute: rate,
            has_baseline,
            rules,
            alerts,
        })
    }
}

/// A bar of `n` out of `max`, `width` cells wide.
fn bar(n: u64, max: u64, width: usize) -> String {
    let cells = if max == 0 {
        0
    } else {
        ((n as f64 / max as f64) * width as f64).ceil() as usize
    };
    "█".repeat(cells.min(width))
}

fn table(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    rows: &[(String, u64)],
    total: u64,
) -> fmt::Result {
    writeln!(f, "{title}")?;
    if rows.is_empty() {
        return writeln!(f, "  (none)");
    }
    let max = rows.first().map_or(0, |r| r.1);
    let name_width = rows
        .iter()
        .map(|r| r.0.chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    for (name, n) in rows.iter().take(10) {
        let share = if total > 0 {
            *n as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        writeln!(
            f,
            "  {name:<name_width$} {n:>7} {share:>5.1}%  {}",
            bar(*n, max, 30)
        )?;
    }
    if rows.len() > 10 {
        writeln!(f, "  … and {} more", rows.len() - 10)?;
    }
    Ok(())
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dead letters, last {} (at {})",
            humantime::format_duration(self.window),
            humantime::format_rfc3339_seconds(self.at)
        )?;
        writeln!(
            f,
            "dead {}   rate {:.1}/min over the last {}",
            self.counts.total,
            self.per_minute,
            humantime::format_duration(self.rules.window)
        )?;
        writeln!(
            f,
            "deferred {} (waiting for the scheduler, not dead letters; resolved records are not counted)",
            self.counts.deferred
        )?;
        writeln!(f)?;
        table(f, "top classes", &self.counts.by_class, self.counts.total)?;
        writeln!(f)?;
        table(f, "top codes", &self.counts.by_code, self.counts.total)?;
        writeln!(f)?;
        if !self.has_baseline {
            writeln!(
                f,
                "(no history before the last {}: the rate and new-code alerts wait for it)",
                humantime::format_duration(self.rules.window + self.rules.baseline)
            )?;
        }
        if self.alerts.is_empty() {
            writeln!(f, "alerts: none")?;
        } else {
            writeln!(f, "alerts:")?;
            for alert in &self.alerts {
                writeln!(f, "  ! {alert}")?;
            }
        }
        Ok(())
    }
}
