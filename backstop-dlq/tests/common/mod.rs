//! What the tests of the command line and the board share: the output of a `backstop-dlq`
//! process, and the CSRF token of a board form.
// Each test file uses a part of it.
#![allow(dead_code)]

use std::process::Output;

/// What the process wrote to standard output.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What the process wrote to standard error.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The CSRF token of the first form of a board page.
pub fn csrf(html: &str) -> String {
    let v = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .expect("a csrf field");
    v[..v.find('"').unwrap()].to_owned()
}
