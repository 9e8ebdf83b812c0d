//! The `Idempotency-Key` header, and whether an HTTP request may be sent more than once.

use http::{HeaderName, HeaderValue, Method};
use rand::Rng;

/// The `Idempotency-Key` request header (IETF draft-ietf-httpapi-idempotency-key-header).
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A fresh `Idempotency-Key` value: 128 random bits from the thread's random source, in the
/// UUID v4 text layout (RFC 9562 §5.4), 36 characters. Allocates one `HeaderValue`.
///
/// Stamp it once per logical request, **outside** [`RetryLayer`](crate::retry::RetryLayer) and
/// [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) (whose record id is then that key),
/// with tower-http's `SetRequestHeaderLayer::if_not_present`: every attempt then carries the same
/// key, and the retry layer treats the request as safe to send again
/// ([`Replay::retry_safe`](crate::Replay::retry_safe)). A request that already has a key keeps
/// it. The provider must honour the key (store the outcome per key and answer a repeat with it)
/// for this to prevent a double charge.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_backstop::request::{IDEMPOTENCY_KEY, new_idempotency_key};
/// use tower_backstop::retry::RetryLayer;
/// use tower_http::set_header::SetRequestHeaderLayer;
///
/// let layers = ServiceBuilder::new()
///     .layer(SetRequestHeaderLayer::if_not_present(
///         IDEMPOTENCY_KEY.clone(),
///         |_: &http::Request<String>| Some(new_idempotency_key()),
///     ))
///     .layer(RetryLayer::default());
/// # let _ = layers;
/// ```
pub fn new_idempotency_key() -> HeaderValue {
    let bits: u128 = rand::rng().random();
    // Version 4, variant 10xx (RFC 9562 §5.4).
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    let text = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    HeaderValue::from_str(&text).expect("hex digits and dashes are a valid header value")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uuid_v4_and_distinct() {
        let a = new_idempotency_key();
        let b = new_idempotency_key();
        assert_ne!(a, b);
        let a = a.to_str().unwrap();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
