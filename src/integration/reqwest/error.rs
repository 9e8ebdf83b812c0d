//! What a `reqwest::Error` in an error's source chain says, read by
//! [`classify_error`](crate::classify::classify_error). In a file of its own, apart from the
//! impls beside it (which name the classifier's types), so that the classifier can call in here
//! without an import circle.

use std::error::Error;

/// Whether `error` is a `reqwest::Error` of a connection that could not be made (refused, DNS,
/// connect timeout): reqwest says no byte of the request was sent.
pub(crate) fn is_connect(error: &(dyn Error + 'static)) -> bool {
    error
        .downcast_ref::<reqwest::Error>()
        .is_some_and(reqwest::Error::is_connect)
}

/// Whether `error` is a `reqwest::Error` that is a timeout (reqwest's own or the connection's).
pub(crate) fn is_timeout(error: &(dyn Error + 'static)) -> bool {
    error
        .downcast_ref::<reqwest::Error>()
        .is_some_and(reqwest::Error::is_timeout)
}
