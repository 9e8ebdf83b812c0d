//! [`Stats`]: the counts of a dead-letter store over a window and the alert signals they raise,
//! and their terminal dashboard (`backstop-dlq stats`).

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::observe::{Alert, AlertRules, Baseline, per_minute};
use tower_backstop_store::{Counts, Filter, Store, StoreError};

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
            .search(&Filter::new().until(baseline_start), 0..1)
            .await?
            .is_empty();
        let by_class = recent.by_class.iter().map(|(c, n)| (c.as_str(), *n));
        let baseline_total = with_baseline.total.saturating_sub(recent.total);
        let baseline = if has_baseline {
            Baseline::Known(baseline_total)
        } else {
            Baseline::Unknown
        };
        let mut alerts = rules.measure(recent.total, baseline, by_class);
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

/// A window as an operator writes it: whole hours under a week in hours (`24h`, `48h`, not
/// `1day`), anything else as `humantime` prints it (`15m`, `7days`, `1h 5m`).
fn span(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() == 0 && secs > 0 && secs.is_multiple_of(3600) && secs < 7 * 86_400 {
        format!("{}h", secs / 3600)
    } else {
        humantime::format_duration(d).to_string()
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dead letters, last {} (at {})",
            span(self.window),
            humantime::format_rfc3339_seconds(self.at)
        )?;
        writeln!(
            f,
            "dead {}   rate {:.1}/min over the last {}",
            self.counts.total,
            self.per_minute,
            span(self.rules.window)
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
                span(self.rules.window + self.rules.baseline)
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
