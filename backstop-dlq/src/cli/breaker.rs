//! `breaker`: the fleet's breakers as the store's notes tell them, and an operator's override
//! of one for the whole fleet (force open, disable, reset), audited.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use tower_backstop::BoxError;
use tower_backstop::breaker::{FleetOverride, OverrideAction};

use super::actor;
use super::args::{Global, parse_duration};
use super::store::open;

/// `breaker`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct BreakerArgs {
    #[command(subcommand)]
    command: BreakerCommand,
}

#[derive(Subcommand, Debug)]
enum BreakerCommand {
    /// What each process of the fleet says of its breakers (processes that share their
    /// breakers through this store), and the overrides in force.
    List,
    /// Force a breaker open in every process of the fleet until `--for` has passed: every call
    /// to that provider is rejected (a provider's planned maintenance).
    ForceOpen(Override),
    /// Disable a breaker in every process until `--for` has passed: every call goes through
    /// and nothing is counted (a failure signal known to be wrong).
    Disable(Override),
    /// Close a breaker in every process now, once (its counts cleared), and end an override.
    Reset(Override),
}

/// An override's arguments.
#[derive(Args, Debug)]
struct Override {
    /// The breaker's name: a per-host breaker's `host:port` (`api.mail.test:443`).
    name: String,
    /// How long it lasts (`30m`, `2h`; at most 7 days). Not used by `reset`.
    #[arg(long = "for", default_value = "1h", value_parser = parse_duration)]
    duration: Duration,
    /// Why, for the audit trail and every process's health report.
    #[arg(long)]
    reason: String,
}

/// `breaker`: lists, or writes an override as the actor.
pub(crate) async fn breaker(
    g: &Global,
    a: &BreakerArgs,
    now: SystemTime,
) -> Result<ExitCode, BoxError> {
    let (o, action) = match &a.command {
        BreakerCommand::List => return list(g, now).await,
        BreakerCommand::ForceOpen(o) => (o, OverrideAction::ForceOpen),
        BreakerCommand::Disable(o) => (o, OverrideAction::Disable),
        BreakerCommand::Reset(o) => (o, OverrideAction::Reset),
    };
    let Some(actor) = actor::required(g.actor.as_deref(), action.as_str()) else {
        return Ok(ExitCode::from(2));
    };
    let over = match FleetOverride::new(&o.name, action, o.duration, &o.reason, actor, now) {
        Ok(over) => over,
        Err(e) => {
            eprintln!("refusing the override: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let store = open(g, true).await?;
    over.publish(&*store).await?;
    out!(
        "{} for the fleet (each process applies it within a second): {}",
        over.breaker,
        over.describe()
    );
    Ok(ExitCode::SUCCESS)
}

/// `breaker list`: each note, by breaker.
async fn list(g: &Global, now: SystemTime) -> Result<ExitCode, BoxError> {
    let store = open(g, false).await?;
    let mut notes = store.notes(now).await?;
    notes.sort_by(|a, b| (&a.topic, &a.author).cmp(&(&b.topic, &b.author)));
    if notes.is_empty() {
        out!("no process shares its breakers through this store now, and no override is in force");
    }
    for note in &notes {
        match FleetOverride::from_note(note) {
            Some(over) => out!(
                "{}  override by {}: {}",
                over.breaker,
                over.actor,
                over.describe()
            ),
            None => out!(
                "{}  {}: {}",
                note.topic.strip_prefix("breaker:").unwrap_or(&note.topic),
                note.author,
                note.body
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}
