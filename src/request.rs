//! What the retry and dead-letter layers need from a request: a copy for the next attempt
//! ([`Replay`]) and a description for a dead-letter record ([`Describe`]).
//!
//! Both are implemented for `http::Request<B>` with a cloneable body (`Full<Bytes>`, `String`,
//! `Bytes`, `Vec<u8>`, `()`…) and for `String`, `&'static str`, `Bytes` and `Vec<u8>` requests.
//! Implement them for your own request type (a queue message, a command struct) to use the layers
//! around a non-HTTP service.

use std::collections::BTreeMap;
use std::future::Future;

use bytes::Bytes;
use http::{HeaderName, Method};
use http_body::Body;
use http_body_util::BodyExt;

/// The `Idempotency-Key` request header (IETF draft-ietf-httpapi-idempotency-key-header).
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A request that can be sent again.
///
/// The retry layer takes one copy per attempt and the dead-letter layer keeps one to describe a
/// failure; both happen once per call, so for the success path to allocate nothing, the copy
/// must be cheap (`Bytes`, `Full<Bytes>`, an `Arc`).
pub trait Replay: Sized {
    /// A copy of this request for another attempt, or `None` when it cannot be replayed (a
    /// streaming body that was not buffered). A request with no copy is never retried.
    fn replay(&self) -> Option<Self>;

    /// Whether sending this request more than once is safe. For HTTP: the method is idempotent
    /// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE; RFC 9110 §9.2.2), or the request carries an
    /// `Idempotency-Key` header. The default is `true`.
    fn retry_safe(&self) -> bool {
        true
    }

    /// The idempotency key this request carries, if any; the dead-letter layer uses it as the
    /// record's id. The default is `None`.
    fn idempotency_key(&self) -> Option<&str> {
        None
    }
}

/// What a dead-letter record keeps of a request: its payload and what is needed to send it again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Envelope {
    /// The id the record should have: an idempotency key or a message id. `None` lets the
    /// dead-letter layer generate one.
    pub id: Option<String>,
    /// The original payload, byte for byte.
    pub payload: Bytes,
    /// The payload's media type, when known (`Content-Type`).
    pub content_type: Option<String>,
    /// Request metadata needed to re-send it (for HTTP: `method`, `uri`, and the
    /// `idempotency-key` header).
    pub metadata: BTreeMap<String, String>,
    /// Searchable labels (campaign, provider, tenant…). A [`Describe`] implementation may set
    /// them; the dead-letter layer's tag function
    /// ([`DeadLetterLayer::tags`](crate::dead_letter::DeadLetterLayer::tags)) adds to them.
    pub tags: BTreeMap<String, String>,
}

impl Envelope {
    /// An envelope holding `payload` and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Envelope {
            payload: payload.into(),
            ..Envelope::default()
        }
    }

    /// Sets the record id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the payload's media type.
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Adds one metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Adds one tag.
    pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }
}

/// A message id carried in an `http::Request`'s extensions (not sent on the wire).
///
/// When a request has no `Idempotency-Key` header, its dead-letter record gets this id instead of
/// a generated one. Re-drives and the scheduler set it on the requests they rebuild from a record
/// ([`http_request`](crate::dead_letter::http_request)), so that the outcome updates the same
/// record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageId(pub String);

/// A request that can be described in a dead-letter record.
///
/// Called on the failure path only, with the copy the dead-letter layer kept; it may allocate and
/// may await (to collect an HTTP body).
pub trait Describe {
    /// The record's payload and metadata.
    fn describe(self) -> impl Future<Output = Envelope> + Send;

    /// The id the record of this request will have, when it is known before the call: what
    /// [`AttemptBudgetLayer`](crate::dead_letter::AttemptBudgetLayer) looks up. For HTTP: the
    /// [`MessageId`] extension, else the `Idempotency-Key` header. The default is `None`.
    fn message_id(&self) -> Option<&str> {
        None
    }
}

fn method_is_idempotent(method: &Method) -> bool {
    // RFC 9110 §9.2.2: PUT, DELETE and the safe methods (GET, HEAD, OPTIONS, TRACE).
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

impl<B: Clone> Replay for http::Request<B> {
    #[inline]
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn retry_safe(&self) -> bool {
        method_is_idempotent(self.method()) || self.headers().contains_key(&IDEMPOTENCY_KEY)
    }

    fn idempotency_key(&self) -> Option<&str> {
        self.headers()
            .get(&IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
    }
}

impl<B> Describe for http::Request<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    fn message_id(&self) -> Option<&str> {
        match self.extensions().get::<MessageId>() {
            Some(MessageId(id)) => Some(id),
            None => self
                .headers()
                .get(&IDEMPOTENCY_KEY)
                .and_then(|v| v.to_str().ok()),
        }
    }

    async fn describe(self) -> Envelope {
        let (parts, body) = self.into_parts();
        let mut envelope = Envelope::default();
        if let Some(key) = parts
            .headers
            .get(&IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
        {
            envelope.id = Some(key.to_owned());
            envelope
                .metadata
                .insert(IDEMPOTENCY_KEY.as_str().to_owned(), key.to_owned());
        }
        if let Some(MessageId(id)) = parts.extensions.get::<MessageId>() {
            envelope.id = Some(id.clone());
        }
        envelope.content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        envelope
            .metadata
            .insert("method".to_owned(), parts.method.to_string());
        envelope
            .metadata
            .insert("uri".to_owned(), parts.uri.to_string());
        match body.collect().await {
            Ok(collected) => envelope.payload = collected.to_bytes(),
            Err(_) => {
                envelope.metadata.insert(
                    "payload_error".to_owned(),
                    "body could not be read".to_owned(),
                );
            }
        }
        envelope
    }
}

macro_rules! plain_payload {
    ($($ty:ty),*) => {$(
        impl Replay for $ty {
            #[inline]
            fn replay(&self) -> Option<Self> {
                Some(self.clone())
            }
        }

        impl Describe for $ty {
            async fn describe(self) -> Envelope {
                Envelope::new(Bytes::from(self))
            }
        }
    )*};
}

plain_payload!(String, &'static str, Bytes, Vec<u8>);

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[test]
    fn idempotency_follows_rfc_9110() {
        let get = http::Request::get("/").body(()).unwrap();
        let post = http::Request::post("/").body(()).unwrap();
        let keyed = http::Request::post("/")
            .header("Idempotency-Key", "k1")
            .body(())
            .unwrap();
        assert!(get.retry_safe());
        assert!(!post.retry_safe());
        assert!(keyed.retry_safe());
        assert_eq!(keyed.idempotency_key(), Some("k1"));
    }

    #[tokio::test]
    async fn describe_collects_body_and_metadata() {
        let req = http::Request::post("http://mail.test/v1/messages")
            .header("Idempotency-Key", "msg-7")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"to\":\"a@b\"}")))
            .unwrap();
        let env = req.describe().await;
        assert_eq!(env.id.as_deref(), Some("msg-7"));
        assert_eq!(&env.payload[..], b"{\"to\":\"a@b\"}");
        assert_eq!(env.content_type.as_deref(), Some("application/json"));
        assert_eq!(env.metadata["method"], "POST");
        assert_eq!(env.metadata["uri"], "http://mail.test/v1/messages");
    }
}
