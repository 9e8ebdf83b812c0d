//! The figures of one cell and stack, the markdown table, and what `--check` asserts.

use std::fmt::Write as _;
use std::time::Duration;

use crate::Stack;
use crate::grid::{Cell, Mode};
use crate::provider::{Counts, Slice};
use crate::throttle::ClientCounts;

/// The start of a run left out of the steady goodput: the bucket's first burst, and a stack's
/// first cut.
pub const STEADY_FROM: u64 = 2;
/// The start of a run left out of the 429 share.
const THROTTLED_FROM: usize = 1;

/// One stack's run in one cell, both sides.
pub struct Row {
    pub cell: Cell,
    pub stack: Stack,
    /// `--seconds`: a run's length, or a third's in `change` mode.
    pub seconds: u64,
    pub clients: ClientCounts,
    /// The client process's CPU time (user and system) during the run.
    pub cpu: Duration,
    pub provider: Counts,
    /// The provider process's CPU time (user and system), start to exit.
    pub provider_cpu: Duration,
}

/// The figures of a row.
pub struct Figures {
    /// Goodput from the start to the end of the load, a share of the quota.
    pub whole: f64,
    /// Goodput a second over the same time.
    pub whole_per_second: f64,
    /// Goodput in the steady window, a share of the quota: one window, or one per third in
    /// `change` mode.
    pub steady: Vec<f64>,
    /// 429s among the requests received after the first second, in per cent.
    pub throttled: f64,
    pub failed: u64,
    /// Failed calls among all calls, in per cent.
    pub failed_share: f64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    /// Seconds from each quota change until the provider's counts track the new quota
    /// (`change` mode): `None` in a pair when they never did before the next third.
    pub track: Option<[Option<u64>; 2]>,
    /// Client CPU time per call, in microseconds.
    pub cpu_per_call: f64,
    pub duplicates: u64,
}

impl Row {
    fn slice(&self, k: u64) -> Slice {
        let slices = &self.provider.slices;
        slices.get(k as usize).copied().unwrap_or_default()
    }

    fn reference(&self, k: u64) -> f64 {
        self.cell.reference_at(k as f64, self.seconds as f64)
    }

    /// The provider's 200s over the slices `range`, as a share of the quota over them.
    fn goodput(&self, range: std::ops::Range<u64>) -> f64 {
        let admitted: u64 = range.clone().map(|k| self.slice(k).admitted).sum();
        let quota: f64 = range.map(|k| self.reference(k)).sum();
        admitted as f64 / quota.max(f64::MIN_POSITIVE)
    }

    /// The steady windows: from 2 s to the end of the load, or each third's last half.
    fn steady_windows(&self) -> Vec<std::ops::Range<u64>> {
        let load = self.cell.load_seconds(self.seconds);
        match self.cell.mode {
            Mode::Change => {
                let third = self.seconds;
                let half = third.div_ceil(2);
                (0..3).map(|j| j * third + half..(j + 1) * third).collect()
            }
            Mode::Rate | Mode::Concurrency => {
                std::iter::once(STEADY_FROM.min(load)..load).collect()
            }
        }
    }

    /// After the change at `change` seconds, the end of the first second from which on, every
    /// second to the end of that third, the provider admitted at least 90 % of the new quota
    /// (rounded down to whole requests) and answered fewer than 10 % of what it received `429`,
    /// counted from the change.
    fn track(&self, change: u64) -> Option<u64> {
        let end = change + self.seconds;
        let least = (0.9 * self.reference(change)).floor() as u64;
        let tracking = |k: u64| {
            let s = self.slice(k);
            s.admitted >= least && (s.throttled == 0 || 10 * s.throttled < s.received)
        };
        let first = (change..end).rev().take_while(|&k| tracking(k)).last()?;
        Some(first + 1 - change)
    }

    pub fn figures(&self) -> Figures {
        let load = self.cell.load_seconds(self.seconds);
        let after = &self.provider.slices[THROTTLED_FROM.min(self.provider.slices.len())..];
        let throttled: u64 = after.iter().map(|s| s.throttled).sum();
        let received: u64 = after.iter().map(|s| s.received).sum();
        let admitted: u64 = (0..load).map(|k| self.slice(k).admitted).sum();
        let calls = self.clients.succeeded + self.clients.failed;
        Figures {
            whole: self.goodput(0..load),
            whole_per_second: admitted as f64 / load as f64,
            steady: self
                .steady_windows()
                .into_iter()
                .map(|w| self.goodput(w))
                .collect(),
            throttled: 100.0 * throttled as f64 / received.max(1) as f64,
            failed: self.clients.failed,
            failed_share: 100.0 * self.clients.failed as f64 / calls.max(1) as f64,
            p50: self.clients.latency(0.50),
            p99: self.clients.latency(0.99),
            track: (self.cell.mode == Mode::Change)
                .then(|| [self.track(self.seconds), self.track(2 * self.seconds)]),
            cpu_per_call: self.cpu.as_secs_f64() * 1e6 / calls.max(1) as f64,
            duplicates: self.provider.duplicates,
        }
    }
}

fn latency(d: Option<Duration>) -> String {
    match d {
        None => "-".to_owned(),
        Some(d) if d < Duration::from_millis(10) => format!("{:.1} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{} ms", d.as_millis()),
    }
}

fn percent(share: f64) -> String {
    format!("{:.0} %", 100.0 * share)
}

fn track(seconds: Option<u64>) -> String {
    seconds.map_or("never".to_owned(), |s| format!("{s} s"))
}

/// The markdown table: one row per cell and stack.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out += "| cell | stack | goodput, run | goodput, steady | 429s after 1 s | failed | p50 | p99 | tracks cut / raise | client CPU per call | duplicates |\n";
    out += "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for row in rows {
        let f = row.figures();
        let steady = match f.steady.as_slice() {
            [one] => percent(*one),
            thirds => {
                let each: Vec<String> =
                    thirds.iter().map(|s| format!("{:.0}", 100.0 * s)).collect();
                let least = thirds.iter().copied().fold(f64::INFINITY, f64::min);
                format!("{} ({})", percent(least), each.join(" · "))
            }
        };
        let failed = match f.failed {
            0 => "0".to_owned(),
            n => format!("{n} ({:.1} %)", f.failed_share),
        };
        let tracks = f.track.map_or("-".to_owned(), |[cut, raise]| {
            format!("{} / {}", track(cut), track(raise))
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} ({:.1}/s) | {steady} | {:.1} % | {failed} | {} | {} | {tracks} | {:.0} µs | {} |",
            row.cell.name(),
            row.stack.name(),
            percent(f.whole),
            f.whole_per_second,
            f.throttled,
            latency(f.p50),
            latency(f.p99),
            f.cpu_per_call,
            f.duplicates,
        );
    }
    out
}

/// The failed calls of each row, by reason (the five most frequent), as markdown bullets.
pub fn reasons(rows: &[Row]) -> String {
    let mut out = String::new();
    for row in rows.iter().filter(|row| row.clients.failed > 0) {
        let mut reasons: Vec<_> = row.clients.reasons.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let each: Vec<String> = reasons
            .iter()
            .take(5)
            .map(|(reason, n)| format!("{n} × `{reason}`"))
            .collect();
        let _ = writeln!(
            out,
            "- `{}`, {}: {}",
            row.cell.name(),
            row.stack.name(),
            each.join("; ")
        );
    }
    out
}

/// A target a backstop row missed.
pub struct Miss {
    pub cell: String,
    pub figure: &'static str,
    pub value: String,
    pub target: String,
}

/// The backstop rows against the targets; `notes` gets a line for each target that could not
/// be judged.
pub fn check(rows: &[Row], notes: &mut Vec<String>) -> Vec<Miss> {
    let mut misses = Vec::new();
    for row in rows.iter().filter(|row| row.stack == Stack::Backstop) {
        let cell = row.cell.name();
        let f = row.figures();
        let mut miss = |figure, value: String, target: &str| {
            misses.push(Miss {
                cell: cell.clone(),
                figure,
                value,
                target: target.to_owned(),
            })
        };
        let (steady_target, steady_label) = match row.cell.mode {
            Mode::Concurrency => (0.8, "≥ 80 % of the capacity"),
            Mode::Rate | Mode::Change => (0.9, "≥ 90 % of the quota"),
        };
        let thirds = [
            "steady goodput, 1st third",
            "steady goodput, 2nd third",
            "steady goodput, 3rd third",
        ];
        for (i, steady) in f.steady.iter().enumerate() {
            if *steady < steady_target {
                let figure = match f.steady.len() {
                    1 => "steady goodput",
                    _ => thirds[i.min(2)],
                };
                miss(figure, percent(*steady), steady_label);
            }
        }
        if f.whole < 0.85 {
            miss("goodput over the run", percent(f.whole), "≥ 85 %");
        }
        if f.throttled > 10.0 {
            miss("429s after 1 s", format!("{:.1} %", f.throttled), "≤ 10 %");
        }
        if f.failed_share > 1.0 {
            miss("failed calls", format!("{:.1} %", f.failed_share), "≤ 1 %");
        }
        if f.duplicates > 0 {
            miss("duplicates", f.duplicates.to_string(), "0");
        }
        for (change, seconds) in ["tracks the cut", "tracks the raise"]
            .into_iter()
            .zip(f.track.iter().flatten())
        {
            if seconds.is_none_or(|s| s > 3) {
                miss(change, track(*seconds), "≤ 3 s");
            }
        }
        let peer = rows
            .iter()
            .find(|r| r.stack == Stack::Adaptive && r.cell.name() == cell);
        match (f.p99, peer.and_then(|peer| peer.clients.latency(0.99))) {
            (Some(ours), Some(theirs)) if ours.as_secs_f64() > 1.2 * theirs.as_secs_f64() => miss(
                "p99",
                latency(Some(ours)),
                &format!("≤ 1.2 × tower-resilience's {}", latency(Some(theirs))),
            ),
            (Some(_), Some(_)) => {}
            _ => notes.push(format!(
                "`{cell}`: p99 not compared (no successful call in one of the two stacks, or tower-resilience not run)"
            )),
        }
    }
    misses
}
