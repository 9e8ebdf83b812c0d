//! Stamping an `Idempotency-Key` once per logical request.

use std::task::{Context, Poll};

use http::HeaderValue;
use rand::Rng;
use tower_layer::Layer;
use tower_service::Service;

use crate::request::IDEMPOTENCY_KEY;

/// Applies [`IdempotencyKey`]: gives every `http::Request` that has no `Idempotency-Key` header
/// a fresh one (IETF draft-ietf-httpapi-idempotency-key-header), once per logical request.
///
/// Put it **outside** [`RetryLayer`](super::RetryLayer) (and outside
/// [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer), whose record id is then that key):
/// the key is stamped once, before the retry layer copies the request, so every attempt carries
/// the same value, and the retry layer treats the request as safe to resend
/// ([`Replay::retry_safe`](crate::Replay::retry_safe)). The provider must honour the key (store
/// the outcome per key and answer a repeat with it) for this to prevent a double charge.
///
/// A key is 32 random hexadecimal digits in the UUID v4 layout (RFC 9562 §5.4), from the
/// thread's random source. Generating it allocates (a `HeaderValue`); a request that already has
/// a key is passed on untouched.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_backstop::retry::{IdempotencyKeyLayer, RetryLayer};
///
/// let layers = ServiceBuilder::new()
///     .layer(IdempotencyKeyLayer::new())
///     .layer(RetryLayer::default());
/// # let _ = layers;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct IdempotencyKeyLayer {
    _priv: (),
}

impl IdempotencyKeyLayer {
    /// The layer.
    pub const fn new() -> Self {
        IdempotencyKeyLayer { _priv: () }
    }
}

impl<S> Layer<S> for IdempotencyKeyLayer {
    type Service = IdempotencyKey<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKey { inner }
    }
}

/// Stamps an `Idempotency-Key` on requests that have none; see [`IdempotencyKeyLayer`].
#[derive(Clone, Debug)]
pub struct IdempotencyKey<S> {
    inner: S,
}

impl<S> IdempotencyKey<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        IdempotencyKey { inner }
    }
}

impl IdempotencyKey<()> {
    /// A fresh key: 128 random bits in the UUID v4 text layout.
    pub fn generate() -> HeaderValue {
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
}

impl<S, B> Service<http::Request<B>> for IdempotencyKey<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if !req.headers().contains_key(&IDEMPOTENCY_KEY) {
            req.headers_mut()
                .insert(IDEMPOTENCY_KEY.clone(), IdempotencyKey::generate());
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uuid_v4_and_distinct() {
        let a = IdempotencyKey::generate();
        let b = IdempotencyKey::generate();
        assert_ne!(a, b);
        let a = a.to_str().unwrap();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
