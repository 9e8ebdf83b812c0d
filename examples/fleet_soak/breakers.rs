//! The breakers of the fleet, as the soak measures them: each child tells its breakers' states
//! (`breaker <state> <unix ms>` at each change, looked at every 20 ms) and the requests it put
//! on the wire (`attempts <n> <unix ms>`, a running count, every 100 ms when it changed); the
//! parent reads when the processes opened after the provider went down, how many requests met
//! the down provider, when they closed after it came back, and how soon the backlog drained.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_backstop::breaker::State;
use tower_backstop::observe::Health;

/// Now, in milliseconds since the epoch.
pub fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// Child: prints each change of the breakers' states (every breaker of the stack; the soak has
/// one provider, so one breaker).
pub async fn tell_states(health: Health) {
    let mut told: Option<State> = None;
    loop {
        let report = health.report();
        // The least healthy state of the stack's breakers.
        let state = report
            .breakers
            .iter()
            .map(|b| b.state)
            .max_by_key(|s| rank(*s));
        if let Some(state) = state
            && told != Some(state)
        {
            println!("breaker {} {}", state.as_str(), unix_ms());
            told = Some(state);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rank(s: State) -> u8 {
    match s {
        State::Closed | State::Disabled => 0,
        State::HalfOpen => 1,
        _ => 2,
    }
}

/// Child: prints the running count of requests put on the wire, every 100 ms when it changed.
pub async fn tell_attempts(count: Arc<AtomicU64>) {
    let mut told = None;
    loop {
        let n = count.load(Ordering::Relaxed);
        if told != Some(n) {
            println!("attempts {n} {}", unix_ms());
            told = Some(n);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Parent: what the children told, each line with the child's index and start.
#[derive(Debug, Default)]
pub struct Log {
    /// `(index, generation, state, unix ms)`.
    pub states: Vec<(usize, u32, String, u128)>,
    /// `(index, generation, running count, unix ms)`.
    pub attempts: Vec<(usize, u32, u64, u128)>,
}

/// What the report says of the breakers.
#[derive(Debug, Default)]
pub struct Measured {
    /// Each original process's first opening after the provider went down, in seconds after it.
    pub opened: Vec<Option<f64>>,
    /// Requests that met the down provider, by process (all starts of a child together).
    pub attempts_down: Vec<u64>,
    /// Each process's first closing after the recovery, in seconds after it (processes alive
    /// then).
    pub closed: Vec<Option<f64>>,
}

impl Measured {
    /// Seconds between the first and the last of `times` (all must be there).
    pub fn spread(times: &[Option<f64>]) -> Option<f64> {
        let all: Option<Vec<f64>> = times.iter().copied().collect();
        let all = all?;
        let min = all.iter().copied().fold(f64::INFINITY, f64::min);
        let max = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (!all.is_empty()).then_some(max - min)
    }

    /// The fleet's requests to the down provider over the most one process sent.
    pub fn fleet_over_one(&self) -> Option<f64> {
        let most = *self.attempts_down.iter().max()?;
        (most > 0).then(|| self.attempts_down.iter().sum::<u64>() as f64 / most as f64)
    }
}

impl Log {
    /// Reads the log against the provider's outage: down at `down_ms`, back at `up_ms`.
    pub fn measure(&self, children: usize, down_ms: u128, up_ms: Option<u128>) -> Measured {
        let secs = |ms: u128, from: u128| (ms as f64 - from as f64) / 1_000.0;
        let opened = (0..children)
            .map(|i| {
                self.states
                    .iter()
                    .filter(|(index, generation, state, at)| {
                        *index == i && *generation == 0 && state == "open" && *at >= down_ms
                    })
                    .map(|(.., at)| secs(*at, down_ms))
                    .next()
            })
            .collect();
        let count_at = |i: usize, generation: u32, t: u128| {
            self.attempts
                .iter()
                .filter(|(index, g, _, at)| *index == i && *g == generation && *at <= t)
                .map(|(_, _, n, _)| *n)
                .next_back()
                .unwrap_or(0)
        };
        let up = up_ms.unwrap_or(u128::MAX);
        let attempts_down = (0..children)
            .map(|i| {
                let generations: std::collections::BTreeSet<u32> = self
                    .attempts
                    .iter()
                    .filter(|(index, ..)| *index == i)
                    .map(|(_, g, ..)| *g)
                    .collect();
                generations
                    .into_iter()
                    .map(|g| count_at(i, g, up).saturating_sub(count_at(i, g, down_ms)))
                    .sum()
            })
            .collect();
        let closed = match up_ms {
            None => Vec::new(),
            Some(up) => (0..children)
                .map(|i| {
                    self.states
                        .iter()
                        .filter(|(index, _, state, at)| {
                            *index == i && state == "closed" && *at >= up
                        })
                        .map(|(.., at)| secs(*at, up))
                        .next()
                })
                .collect(),
        };
        Measured {
            opened,
            attempts_down,
            closed,
        }
    }
}
