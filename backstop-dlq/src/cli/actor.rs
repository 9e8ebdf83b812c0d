//! Who acts, for the audit trail: `--actor`, else the OS user.

/// The actor: `--actor` when given, else `$USER`, else `$LOGNAME` (empty values do not count).
pub(crate) fn who(flag: Option<&str>) -> Option<String> {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    flag.map(str::to_owned)
        .or_else(|| env("USER"))
        .or_else(|| env("LOGNAME"))
}

/// The actor of `action` (`re-drive`, `purge`, …), or `None` after saying on standard error
/// that the action needs one: the command then ends with status 2, having changed nothing.
pub(crate) fn required(flag: Option<&str>, action: &str) -> Option<String> {
    let who = who(flag);
    if who.is_none() {
        eprintln!(
            "refusing to {action}: the audit trail needs to know who acts, and neither --actor, \
             $USER nor $LOGNAME names anyone; add --actor NAME"
        );
    }
    who
}
