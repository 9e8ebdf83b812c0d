//! The HTTP wire forms the layers share: a response's head as a classifier reads it, and
//! `Retry-After` in whole seconds with its default for a load-shed rejection.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

/// An HTTP response whose status and headers a classifier reads:
/// [`HttpClassifier`](crate::classify::HttpClassifier) classifies any `ResponseHead`, by its
/// status and its hint headers (`Retry-After`, rate-limit resets).
///
/// Implemented for `http::Response<B>` and, with the `reqwest` feature, `reqwest::Response`;
/// implement it for another client's response type to classify that one too.
pub trait ResponseHead {
    /// The response's status code.
    fn status(&self) -> StatusCode;
    /// The response's headers.
    fn headers(&self) -> &HeaderMap;
}

impl<B> ResponseHead for http::Response<B> {
    #[inline]
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    #[inline]
    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
    }
}

/// The `Retry-After` of [`ServerLayer`](crate::server::ServerLayer)'s answer to a call refused as
/// overloaded: 1 second, the smallest whole delay-seconds value of RFC 9110 §10.2.3 (a load-shed
/// rejection says nothing of when capacity returns, so the client comes back soon, with its own
/// backoff and jitter).
pub const DEFAULT_OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The `Retry-After` delay-seconds for `left`, rounded up so that a client never comes back
/// before the breaker half-opens.
pub(crate) fn retry_after_secs(left: Duration) -> u64 {
    let secs = left.as_secs();
    if left.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}
