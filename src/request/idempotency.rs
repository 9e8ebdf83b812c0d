//! The `Idempotency-Key` header, and whether an HTTP request may be sent more than once.

use http::{HeaderName, Method};

/// The `Idempotency-Key` request header (IETF draft-ietf-httpapi-idempotency-key-header).
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The `Idempotency-Key` header's value, when it is text.
pub(crate) fn key_header(headers: &http::HeaderMap) -> Option<&str> {
    headers.get(&IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok())
}

/// Whether an HTTP request may be sent twice: an idempotent method, or an `Idempotency-Key`.
pub(super) fn http_retry_safe<B>(req: &http::Request<B>) -> bool {
    retry_safe_head(req.method(), req.headers())
}

/// [`http_retry_safe`] from a request's method and headers, for any HTTP request type.
pub(crate) fn retry_safe_head(method: &Method, headers: &http::HeaderMap) -> bool {
    method_is_idempotent(method) || headers.contains_key(&IDEMPOTENCY_KEY)
}

fn method_is_idempotent(method: &Method) -> bool {
    // RFC 9110 §9.2.2: PUT, DELETE and the safe methods (GET, HEAD, OPTIONS, TRACE).
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
