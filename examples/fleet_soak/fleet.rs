//! The children as OS processes: this example's binary run again with the `child` role, their
//! lines read on a thread each, SIGKILL, and their stdin closed to stop them.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use tokio::sync::mpsc;
use tower::BoxError;

use super::child::Settings;

/// A line a child wrote, or its end.
#[derive(Debug)]
pub enum Line {
    Ready,
    Ack {
        key: String,
        outcome: String,
    },
    Done,
    Bye,
    /// It claimed (or renewed its claim of) the record `id`: the claim's fencing token and its
    /// end, in Unix milliseconds.
    Claim {
        token: u32,
        until_ms: u64,
        id: String,
    },
    /// Its local spool holds this many records now.
    Spool(u64),
    /// Its breaker's state changed, at a unix time in ms.
    Breaker(String, u128),
    /// Requests it put on the wire so far, at a unix time in ms.
    Attempts(u64, u128),
    Other(String),
    /// Its stdout closed: it exited or was killed.
    Closed,
}

/// A line from child `index`, started the `generation`-th time (0 first).
#[derive(Debug)]
pub struct Event {
    pub index: usize,
    pub generation: u32,
    pub line: Line,
}

fn parse(line: String) -> Line {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("ready"), None, _) => Line::Ready,
        (Some("done"), None, _) => Line::Done,
        (Some("bye"), None, _) => Line::Bye,
        (Some("claim"), Some(token), Some(until)) => {
            // The id is the rest of the line, whatever it holds.
            let id = line.splitn(4, ' ').nth(3).unwrap_or_default().to_owned();
            match (token.parse(), until.parse()) {
                (Ok(token), Ok(until_ms)) if !id.is_empty() => Line::Claim {
                    token,
                    until_ms,
                    id,
                },
                _ => Line::Other(line),
            }
        }
        (Some("spool"), Some(n), None) => n.parse().map_or(Line::Other(line), Line::Spool),
        (Some("breaker"), Some(state), Some(ms)) => match ms.parse() {
            Ok(ms) => Line::Breaker(state.to_owned(), ms),
            Err(_) => Line::Other(line),
        },
        (Some("attempts"), Some(n), Some(ms)) => match (n.parse(), ms.parse()) {
            (Ok(n), Ok(ms)) => Line::Attempts(n, ms),
            _ => Line::Other(line),
        },
        (Some("ack"), Some(key), Some(outcome)) => Line::Ack {
            key: key.to_owned(),
            outcome: outcome.to_owned(),
        },
        _ => Line::Other(line),
    }
}

/// One child process.
pub struct Child {
    pub generation: u32,
    process: std::process::Child,
    stdin: Option<ChildStdin>,
}

impl Child {
    /// Starts child `settings.index` (its `generation`-th start); its lines go to `events`.
    pub fn spawn(
        settings: &Settings,
        generation: u32,
        events: &mpsc::UnboundedSender<Event>,
    ) -> Result<Child, BoxError> {
        let mut command = Command::new(std::env::current_exe()?);
        command.arg("child").args(arguments(settings));
        if !settings.skip.is_empty() {
            let keys: Vec<&str> = settings.skip.iter().map(String::as_str).collect();
            command.arg("--skip").arg(keys.join(","));
        }
        let mut process = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = process.stdout.take().ok_or("the child has no stdout")?;
        let (events, index) = (events.clone(), settings.index);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let line = parse(line);
                if events
                    .send(Event {
                        index,
                        generation,
                        line,
                    })
                    .is_err()
                {
                    return;
                }
            }
            let _ = events.send(Event {
                index,
                generation,
                line: Line::Closed,
            });
        });
        Ok(Child {
            generation,
            stdin: process.stdin.take(),
            process,
        })
    }

    /// Tells it the start of the window.
    pub fn go(&mut self, start_unix_ms: u128) -> Result<(), BoxError> {
        let stdin = self.stdin.as_mut().ok_or("the child's stdin is closed")?;
        writeln!(stdin, "go {start_unix_ms}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// SIGSTOP: every thread of it stops where it is, its claims with it, until
    /// [`resume`](Child::resume) or [`kill`](Child::kill). Waits until Linux shows it stopped
    /// (at most 1 s; where there is no `/proc`, not at all).
    pub fn pause(&mut self) -> Result<(), BoxError> {
        self.signal(Signal::STOP)?;
        let stat = format!("/proc/{}/stat", self.pid());
        for _ in 0..1000 {
            // The state is the field after the command's name, which ends at the last `)`.
            let Ok(text) = std::fs::read_to_string(&stat) else {
                break;
            };
            let state = text
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if matches!(state, Some('T' | 't')) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// SIGCONT: a paused child goes on.
    pub fn resume(&mut self) -> Result<(), BoxError> {
        self.signal(Signal::CONT)
    }

    fn signal(&self, signal: Signal) -> Result<(), BoxError> {
        let pid = i32::try_from(self.pid())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or("the child's pid is not a process id")?;
        kill_process(pid, signal)?;
        Ok(())
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill(&mut self) -> Result<(), BoxError> {
        self.process.kill()?;
        self.process.wait()?;
        Ok(())
    }

    /// Closes its stdin (it shuts its scheduler down and exits), waits at most `bound` for it to
    /// exit, then kills it; whether it exited by itself.
    pub async fn stop(&mut self, bound: Duration) -> bool {
        self.stdin = None;
        let give_up = tokio::time::Instant::now() + bound;
        while tokio::time::Instant::now() < give_up {
            if let Ok(Some(_)) = self.process.try_wait() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.kill();
        false
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // A parent that fails part-way leaves no child behind.
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// The command line of a child (without `--skip`).
fn arguments(s: &Settings) -> Vec<String> {
    let mut args = vec![
        "--store".to_owned(),
        s.store.clone(),
        "--namespace".to_owned(),
        s.namespace.clone(),
        "--provider".to_owned(),
        s.provider.to_string(),
        "--index".to_owned(),
        s.index.to_string(),
        "--children".to_owned(),
        s.children.to_string(),
        "--messages".to_owned(),
        s.messages.to_string(),
        "--window-ms".to_owned(),
        s.window.as_millis().to_string(),
    ];
    if let Some(rate) = s.fleet_rate {
        args.extend(["--fleet-rate".to_owned(), rate.to_string()]);
    }
    if let Some(path) = &s.spool {
        args.extend(["--spool".to_owned(), path.display().to_string()]);
    }
    if s.share_breakers {
        args.push("--share-breakers".to_owned());
    }
    args
}

/// Reads a child's command line back (what follows `child`).
pub fn settings_from(args: &[String]) -> Result<Settings, BoxError> {
    let value = |name: &str| -> Result<&str, BoxError> {
        let at = args
            .iter()
            .position(|a| a == name)
            .ok_or_else(|| format!("child: {name} is missing"))?;
        Ok(args
            .get(at + 1)
            .ok_or_else(|| format!("child: {name} has no value"))?)
    };
    let skip: HashSet<String> = match value("--skip") {
        Ok(keys) => keys.split(',').map(str::to_owned).collect(),
        Err(_) => HashSet::new(),
    };
    Ok(Settings {
        store: value("--store")?.to_owned(),
        namespace: value("--namespace")?.to_owned(),
        provider: value("--provider")?.parse()?,
        index: value("--index")?.parse()?,
        children: value("--children")?.parse()?,
        messages: value("--messages")?.parse()?,
        window: Duration::from_millis(value("--window-ms")?.parse()?),
        fleet_rate: value("--fleet-rate").ok().map(str::parse).transpose()?,
        spool: value("--spool").ok().map(std::path::PathBuf::from),
        share_breakers: args.iter().any(|a| a == "--share-breakers"),
        skip,
    })
}
