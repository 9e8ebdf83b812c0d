//! The shapes the sweep measures: each cell is one provider (its mode, its quota, its
//! `Retry-After`) and one load (its callers).

use std::fmt;
use std::time::Duration;

/// How long the provider works on each request it admits in `concurrency` mode.
pub const WORK: Duration = Duration::from_millis(50);

/// The quotas of the full grid, requests a second.
const QUOTAS: [u32; 5] = [5, 20, 50, 200, 1000];
/// The callers of the full grid, as multiples of the quota (of the capacity in `concurrency`
/// mode).
const CALLER_FACTORS: [u32; 2] = [2, 8];
/// The quota of the `Retry-After` cells (0, 2 and none), with 8× callers.
const RETRY_AFTER_QUOTA: u32 = 50;

/// What the provider limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A token bucket of Q a second, burst Q.
    Rate,
    /// The same bucket, Q for the first third of the run, 0.4·Q for the second, 1.6·Q for the
    /// last.
    Change,
    /// At most L requests in flight, each taking [`WORK`].
    Concurrency,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Rate => "rate",
            Mode::Change => "change",
            Mode::Concurrency => "concurrency",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        [Mode::Rate, Mode::Change, Mode::Concurrency]
            .into_iter()
            .find(|mode| mode.name() == name)
    }
}

/// What a `429` says of when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// `Retry-After: N` (seconds).
    Seconds(u32),
    /// No `Retry-After` header.
    Absent,
}

impl fmt::Display for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryAfter::Seconds(seconds) => write!(f, "{seconds}"),
            RetryAfter::Absent => f.write_str("none"),
        }
    }
}

impl RetryAfter {
    pub fn parse(text: &str) -> Option<RetryAfter> {
        match text {
            "none" => Some(RetryAfter::Absent),
            seconds => seconds.parse().ok().map(RetryAfter::Seconds),
        }
    }
}

/// One provider shape and one load.
#[derive(Clone, Debug)]
pub struct Cell {
    pub mode: Mode,
    /// The quota a second (`rate`, `change`: the first third's), or in `concurrency` mode the
    /// limit of requests in flight.
    pub quota: u32,
    pub callers: usize,
    pub retry_after: RetryAfter,
}

impl Cell {
    fn new(mode: Mode, quota: u32, factor: u32, retry_after: RetryAfter) -> Cell {
        let cell = Cell {
            mode,
            quota,
            callers: 0,
            retry_after,
        };
        let callers = (cell.nominal() * f64::from(factor)).round() as usize;
        Cell { callers, ..cell }
    }

    /// Its name, for `--cells` and the table: `rate-q50-c400`, `rate-q50-c400-ra-none`,
    /// `change-q50-c100`, `concurrency-l20-c800`. The `Retry-After` is named when it is not 1.
    pub fn name(&self) -> String {
        let limit = match self.mode {
            Mode::Concurrency => format!("l{}", self.quota),
            Mode::Rate | Mode::Change => format!("q{}", self.quota),
        };
        let retry_after = match self.retry_after {
            RetryAfter::Seconds(1) => String::new(),
            RetryAfter::Seconds(seconds) => format!("-ra{seconds}"),
            RetryAfter::Absent => "-ra-none".to_owned(),
        };
        format!(
            "{}-{limit}-c{}{retry_after}",
            self.mode.name(),
            self.callers
        )
    }

    /// The nominal rate a second: the quota, or in `concurrency` mode the capacity, L ÷ 50 ms.
    pub fn nominal(&self) -> f64 {
        match self.mode {
            Mode::Rate | Mode::Change => f64::from(self.quota),
            Mode::Concurrency => f64::from(self.quota) / WORK.as_secs_f64(),
        }
    }

    /// The provider's quota a second at `t` seconds into the run (`third`: a third's length in
    /// seconds): in `concurrency` mode its capacity.
    pub fn quota_at(&self, t: f64, third: f64) -> f64 {
        let nominal = self.nominal();
        match self.mode {
            Mode::Change if t >= 2.0 * third => 1.6 * nominal,
            Mode::Change if t >= third => 0.4 * nominal,
            _ => nominal,
        }
    }

    /// What the run's goodput is a share of, at `t`: the quota of the moment, or at most what
    /// the callers could send (in `concurrency` mode each call holds a caller for 50 ms at
    /// least; in this grid the callers are at least 2× the quota, so it is always the quota).
    pub fn reference_at(&self, t: f64, third: f64) -> f64 {
        let quota = self.quota_at(t, third);
        match self.mode {
            Mode::Concurrency => quota.min(self.callers as f64 / WORK.as_secs_f64()),
            Mode::Rate | Mode::Change => quota,
        }
    }

    /// The lowest quota of the run.
    pub fn lowest_quota(&self) -> f64 {
        match self.mode {
            Mode::Change => 0.4 * self.nominal(),
            Mode::Rate | Mode::Concurrency => self.nominal(),
        }
    }

    /// The seconds of load: `seconds`, or three thirds of `seconds` each in `change` mode.
    pub fn load_seconds(&self, seconds: u64) -> u64 {
        match self.mode {
            Mode::Change => 3 * seconds,
            Mode::Rate | Mode::Concurrency => seconds,
        }
    }
}

/// The full grid: every quota with callers at 2× and 8× in `rate` and `change` mode
/// (`Retry-After: 1`), `concurrency` mode (limit `limit`) with 2× and 8× its capacity, and
/// `Retry-After` 0, 2 and none at quota 50 with 8× callers.
pub fn full(limit: u32) -> Vec<Cell> {
    let one = RetryAfter::Seconds(1);
    let mut cells = Vec::new();
    for mode in [Mode::Rate, Mode::Change] {
        for quota in QUOTAS {
            for factor in CALLER_FACTORS {
                cells.push(Cell::new(mode, quota, factor, one));
            }
        }
    }
    for factor in CALLER_FACTORS {
        cells.push(Cell::new(Mode::Concurrency, limit, factor, one));
    }
    for retry_after in [
        RetryAfter::Seconds(0),
        RetryAfter::Seconds(2),
        RetryAfter::Absent,
    ] {
        cells.push(Cell::new(Mode::Rate, RETRY_AFTER_QUOTA, 8, retry_after));
    }
    cells
}

/// The small form: one cell of each shape.
pub fn small(limit: u32) -> Vec<Cell> {
    let one = RetryAfter::Seconds(1);
    vec![
        Cell::new(Mode::Rate, 20, 8, one),
        Cell::new(Mode::Rate, 200, 8, one),
        Cell::new(Mode::Change, 50, 2, one),
        Cell::new(Mode::Concurrency, limit, 2, one),
        Cell::new(Mode::Rate, RETRY_AFTER_QUOTA, 8, RetryAfter::Absent),
    ]
}
