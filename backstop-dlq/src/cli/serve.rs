//! `serve`: the dead-letter board on its own listener.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tower_backstop::BoxError;

use super::actor;
use super::args::{Global, parse_duration};
use super::redrive::{stack, target};
use super::store::open;
use crate::Board;

/// `serve`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct Serve {
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: std::net::SocketAddr,
    /// Allow an address that is not loopback (put your own authentication in front).
    #[arg(long)]
    allow_remote: bool,
    /// Allow re-drives and purges, as `--actor` (else the OS user, `$USER` or `$LOGNAME`).
    #[arg(long)]
    allow_actions: bool,
    /// Re-drive to here instead of each record's own URI (as `redrive --target`).
    #[arg(long)]
    target: Option<String>,
    /// Attempts per re-driven message (the first included).
    #[arg(long, default_value_t = 3)]
    attempts: u32,
    /// Timeout per attempt of a re-drive (`10s`, `500ms`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
}

/// `serve`: refuses an address that is not loopback without `--allow-remote`, and actions
/// without an actor; prints the address, then serves until killed.
pub(crate) async fn serve(g: &Global, a: &Serve) -> Result<ExitCode, BoxError> {
    if !a.bind.ip().is_loopback() && !a.allow_remote {
        eprintln!(
            "refusing to serve the board on {}, which is not a loopback address: add \
             --allow-remote (and put your own authentication in front)",
            a.bind
        );
        return Ok(ExitCode::from(2));
    }
    let actor = if a.allow_actions {
        match actor::required(g.actor.as_deref(), "serve the board with actions") {
            Some(actor) => Some(actor),
            None => return Ok(ExitCode::from(2)),
        }
    } else {
        None
    };
    let target = target(a.target.as_deref())?;
    let store = open(g, actor.is_some()).await?;
    let mut board = Board::new(Arc::clone(&store));
    if let Some(actor) = actor.clone() {
        // Every request acts as the one actor the command line names.
        board = board
            .authorize(move |_| Some(actor.clone()))
            .redrive_through(stack(Arc::clone(&store), a.attempts, a.timeout)?);
        if let Some(target) = target {
            board = board.redrive_target(target);
        }
    }
    let listener = tokio::net::TcpListener::bind(a.bind).await?;
    out!(
        "serving the dead-letter board on http://{}/ ({})",
        listener.local_addr()?,
        match &actor {
            Some(a) => format!("actions allowed, as {a}"),
            None => "read-only".to_owned(),
        }
    );
    axum::serve(listener, board.router()).await?;
    Ok(ExitCode::SUCCESS)
}
