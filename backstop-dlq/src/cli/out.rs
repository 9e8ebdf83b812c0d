//! Standard output: lines that end the program quietly on a closed pipe, times, cut text, and
//! the tables and the record as `list` and `show` print them.

use std::time::{Duration, SystemTime};

use tower_backstop::store::Record;

use crate::host;

/// `println!` to standard output, except that a closed pipe (`backstop-dlq list | head`) ends the
/// program quietly with success, as the shell tools do, instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` with the same handling of a closed pipe.
macro_rules! out_raw {
    ($($arg:tt)*) => {
        $crate::cli::out::write_out(format_args!($($arg)*))
    };
}

/// Writes `args` to standard output and flushes; a closed pipe ends the program with success,
/// another error with failure.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("backstop-dlq: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// `t` as RFC 3339 in UTC, to the second.
pub(crate) fn time(t: SystemTime) -> String {
    // RFC 3339 ends with the year 9999; a later time (a record written by hand) shows as that.
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(t.min(last)).to_string()
}

/// `text` on one line, cut to `max` characters with `…`.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let text = text.replace(['\n', '\r', '\t'], " ");
    if text.chars().count() <= max {
        text
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

fn tags(r: &Record) -> String {
    r.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The record's message, and its root cause when the final word is another class (an open
/// breaker's rejection names the failure that opened it).
fn message_with_cause(r: &Record) -> String {
    match &r.cause {
        Some(cause) if cause.class != r.class => {
            format!("{} (cause: {})", r.message, cause.message)
        }
        _ => r.message.clone(),
    }
}

/// A plain table of records: a header, then left-aligned columns.
pub(crate) fn print_table(records: &[Record]) {
    let header = [
        "ID",
        "HOST",
        "CLASS",
        "CODE",
        "ATT",
        "STATUS",
        "DUE",
        "LAST FAILED",
        "TAGS",
        "MESSAGE",
    ];
    let rows: Vec<[String; 10]> = records
        .iter()
        .map(|r| {
            [
                cut(&r.id, 40),
                cut(&host::of(r).unwrap_or_else(|| "-".to_owned()), 60),
                r.class.clone(),
                r.code.clone(),
                r.attempts.to_string(),
                r.status.to_string(),
                r.retry_at.map(time).unwrap_or_else(|| "-".to_owned()),
                time(r.last_failed_at),
                cut(&tags(r), 40),
                cut(&message_with_cause(r), 100),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// `bytes` as lower-case hex digits.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One record in full, as `show` prints it.
pub(crate) fn print_record(r: &Record) {
    out!("id              {}", r.id);
    out!("status          {}", r.status);
    out!("host            {}", host::of(r).as_deref().unwrap_or("-"));
    out!("class           {}", r.class);
    out!("code            {}", r.code);
    out!("message         {}", r.message);
    if let Some(cause) = &r.cause {
        out!(
            "root cause      {} ({}) at {}: {}",
            cause.class,
            cause.code,
            time(cause.at),
            cause.message
        );
    }
    if let Some(breaker) = &r.breaker {
        out!("breaker         {breaker}");
    }
    out!(
        "attempts        {} (budget spent {}, re-sent {} times)",
        r.attempts,
        r.budget_spent,
        r.resends
    );
    out!("first failed    {}", time(r.first_failed_at));
    out!("last failed     {}", time(r.last_failed_at));
    if let Some(t) = r.retry_at {
        out!("retry at        {}", time(t));
    }
    if let Some(t) = r.resolved_at {
        out!("resolved at     {}", time(t));
    }
    if !r.tags.is_empty() {
        out!("tags            {}", tags(r));
    }
    for (k, v) in &r.metadata {
        out!("metadata        {k}: {v}");
    }
    print_request(r);
    out!("history (oldest first, last {}):", r.history.len());
    for e in &r.history {
        out!(
            "  {}  {}  {}  {} attempt(s)  {}",
            time(e.at),
            e.class,
            e.code,
            e.attempts,
            cut(&e.message, 80)
        );
    }
}

/// The request of a record: its headers (redacted ones by name only) and its payload.
fn print_request(r: &Record) {
    for (name, value) in &r.headers {
        match std::str::from_utf8(value) {
            Ok(text) => out!("header          {name}: {}", cut(text, 200)),
            Err(_) => out!("header          {name}: (not UTF-8) hex:{}", hex(value)),
        }
    }
    for name in &r.redacted_headers {
        out!("header          {name}: (redacted, not stored)");
    }
    out!(
        "payload         {} bytes{}{}",
        r.payload_len,
        if r.payload_truncated {
            format!(", truncated to {}", r.payload.len())
        } else {
            String::new()
        },
        r.content_type
            .as_deref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default()
    );
    match std::str::from_utf8(&r.payload) {
        Ok(text) => out!("{text}"),
        Err(_) => out!("{}", hex(&r.payload)),
    }
}
