//! `check-counts`: recount the records and compare the recount with the store's counters.

use std::process::ExitCode;

use clap::Args;
use tower_backstop::BoxError;

use super::args::Global;
use super::store::open;

/// The exit status of a check that found drifted counters and did not repair them.
const DRIFTED: u8 = 3;

/// `check-counts`' arguments.
#[derive(Args, Debug)]
pub(crate) struct CheckCounts {
    /// Set each drifted counter to the recount.
    #[arg(long)]
    repair: bool,
}

/// `check-counts`: one line per drifted counter (status, class, code, expected, found), then
/// a summary; exit status 3 when a counter drifted and `--repair` was not given.
pub(crate) async fn check_counts(g: &Global, a: &CheckCounts) -> Result<ExitCode, BoxError> {
    let store = open(g, a.repair).await?;
    let check = store.check_counts(a.repair).await?;
    if !check.drifts.is_empty() {
        out!(
            "{:<10}  {:<24}  {:<24}  {:>10}  {:>10}",
            "status",
            "class",
            "code",
            "expected",
            "found"
        );
    }
    for d in &check.drifts {
        out!(
            "{:<10}  {:<24}  {:<24}  {:>10}  {:>10}",
            d.status,
            d.class.as_deref().unwrap_or("*"),
            d.code.as_deref().unwrap_or("*"),
            d.expected,
            d.found
        );
    }
    let n = check.drifts.len();
    if n == 0 {
        out!(
            "counts agree with the records ({} keys checked)",
            check.keys
        );
        return Ok(ExitCode::SUCCESS);
    }
    if check.repaired {
        out!(
            "{n} drifted counters repaired ({} keys checked)",
            check.keys
        );
        return Ok(ExitCode::SUCCESS);
    }
    out!(
        "{n} drifted counters ({} keys checked); run again with --repair to set them to the \
         recount",
        check.keys
    );
    Ok(ExitCode::from(DRIFTED))
}
