//! `axum` (feature `axum`): a handler that calls an upstream through the stack can return the
//! [`Failure`] itself.

use axum_core::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header::RETRY_AFTER};

use crate::failure::{Class, Code, Failure};
use crate::http_wire::{DEFAULT_OVERLOADED_RETRY_AFTER, retry_after_secs};

/// The answer a proxying handler gives for a failed upstream call:
///
/// | failure | answer |
/// |---|---|
/// | it holds the upstream's response (a 404, a 503 with its `Retry-After`) | that response: the client sees what the provider said |
/// | [`Class::THROTTLED`] | `429 Too Many Requests` (RFC 6585 §4), with `Retry-After` from the server's hint |
/// | an open breaker ([`Class::CIRCUIT_OPEN`]) or a load-shed rejection ([`Code::Overloaded`]) | `503 Service Unavailable` (RFC 9110 §15.6.4), with `Retry-After`: the time left until half-open, or for a rejection [`DEFAULT_OVERLOADED_RETRY_AFTER`](crate::server::DEFAULT_OVERLOADED_RETRY_AFTER) |
/// | a timeout ([`Code::Timeout`], a server's `DEADLINE_EXCEEDED`) | `504 Gateway Timeout` (RFC 9110 §15.6.5) |
/// | an HTTP status whose response is gone (a failure found again inside a boxed error) | that status, with `Retry-After` from the hint |
/// | anything else (a refused connection, a reset, a TLS error, an unknown error) | `502 Bad Gateway` (RFC 9110 §15.6.3): a proxy's answer for an upstream failure |
///
/// `Retry-After` is in whole seconds, rounded up, at least 1 (RFC 9110 §10.2.3,
/// delay-seconds), and left out when there is no hint. The body of the answers we make is the
/// failure's class and code in plain text (for example `transient (timeout)`), never the
/// upstream's error message.
///
/// The same answer comes back however many wrappers stand between the handler and the
/// failure: a `BoxError` from tower's `Buffer` (whose `ServiceError` keeps the failure in its
/// source), a user error whose `source()` chain holds it, or a plain `BoxError` converted with
/// `Failure::from` (which finds the failure again, else classifies the error):
///
/// ```
/// use axum::response::IntoResponse;
/// use tower_backstop::{BoxError, Failure};
///
/// fn answer(error: BoxError) -> axum::response::Response {
///     // The trait's method: the inherent `Failure::into_response` is the upstream's response.
///     IntoResponse::into_response(Failure::<axum::response::Response>::from(error))
/// }
/// # let _ = answer;
/// ```
///
/// Note that `failure.into_response()` called as a method is [`Failure::into_response`] (the
/// upstream's response, an `Option`); axum calls this trait's method for a handler's `Err`.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<R: IntoResponse> IntoResponse for Failure<R> {
    fn into_response(self) -> Response {
        let class = self.class();
        let code = self.code();
        let retry_after = self.retry_after();
        // The inherent `Failure::into_response` (the upstream's response, if any), not this
        // trait's method.
        if let Some(response) = Failure::into_response(self) {
            return response.into_response();
        }
        let status = if class == Class::THROTTLED {
            StatusCode::TOO_MANY_REQUESTS
        } else if class == Class::CIRCUIT_OPEN || code == Code::Overloaded {
            StatusCode::SERVICE_UNAVAILABLE
        } else if code == Code::Timeout
            || code == Code::Grpc(crate::grpc_wire::codes::DEADLINE_EXCEEDED)
        {
            StatusCode::GATEWAY_TIMEOUT
        } else if let Code::Http(status) = code {
            status
        } else {
            StatusCode::BAD_GATEWAY
        };
        let mut response = (status, format!("{class} ({code})")).into_response();
        // A load-shed rejection says nothing of when capacity returns: the server flavour's
        // default.
        let retry_after =
            retry_after.or((code == Code::Overloaded).then_some(DEFAULT_OVERLOADED_RETRY_AFTER));
        if let Some(delay) = retry_after {
            response.headers_mut().insert(
                RETRY_AFTER,
                HeaderValue::from(retry_after_secs(delay).max(1)),
            );
        }
        response
    }
}
