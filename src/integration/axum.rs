//! `axum` (feature `axum`): a handler that calls an upstream through the stack can return the
//! [`Failure`] itself.

use axum_core::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header::RETRY_AFTER};

use crate::failure::{Class, Code, Failure};

/// The answer a proxying handler gives for a failed upstream call:
///
/// - the upstream's own response, when the failure is one (a 404, a 503 with its
///   `Retry-After`): the client sees what the provider said;
/// - an open breaker ([`Class::CIRCUIT_OPEN`]): `503 Service Unavailable` with `Retry-After`, the
///   time left until half-open in whole seconds, rounded up (RFC 9110 §15.6.4, §10.2.3);
/// - a timeout ([`Code::Timeout`]): `504 Gateway Timeout` (RFC 9110 §15.6.5);
/// - anything else (a refused connection, an unknown error): `502 Bad Gateway` (RFC 9110 §15.6.3).
///
/// The body of the answers we make is the failure's class and code in plain text (for example
/// `transient (timeout)`), never the upstream's error message.
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
        let body = format!("{class} ({code})");
        if class == Class::CIRCUIT_OPEN {
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            if let Some(delay) = retry_after {
                let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
            }
            return response;
        }
        let status = if code == Code::Timeout {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::BAD_GATEWAY
        };
        (status, body).into_response()
    }
}
