//! [`Describe`]: what a dead-letter record keeps of a request, in an [`Envelope`].

use std::collections::BTreeMap;
use std::future::Future;

use bytes::Bytes;
use http::Method;
use http_body::Body;
use http_body_util::BodyExt;

use super::idempotency::{IDEMPOTENCY_KEY, key_header};

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
    /// The request's headers, in order, each a name (lower case for HTTP) and its value byte for
    /// byte (a value need not be UTF-8). The dead-letter layer redacts the secret ones
    /// ([`DeadLetterLayer::redact_header`](crate::dead_letter::DeadLetterLayer::redact_header)) before anything is written.
    pub headers: Vec<(String, Vec<u8>)>,
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

    /// Adds one header (`name`, and its value as bytes).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
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
/// ([`http_request`](crate::resend::http_request)), so that the outcome updates the same
/// record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageId(pub String);

/// A request that can be described in a dead-letter record.
///
/// Called on the failure path only, with the copy the dead-letter layer kept; it may allocate and
/// may await (to collect an HTTP body).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be described in a dead-letter record: it does not implement `tower_backstop::Describe`",
    label = "DeadLetterLayer keeps a description of this request",
    note = "implement `Describe` for your request type (an `Envelope` with its payload and id); `reqwest::Request` is `Describe` with the `reqwest` feature"
)]
pub trait Describe {
    /// The record's payload and metadata.
    fn describe(self) -> impl Future<Output = Envelope> + Send;

    /// The id the record of this request will have, when it is known before the call: what
    /// [`DeadLetterLayer::attempt_budget`](crate::dead_letter::DeadLetterLayer::attempt_budget)
    /// looks up. For HTTP: the [`MessageId`] extension, else the `Idempotency-Key` header. The
    /// default is `None`.
    fn message_id(&self) -> Option<&str> {
        None
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
            None => key_header(self.headers()),
        }
    }

    async fn describe(self) -> Envelope {
        let (parts, body) = self.into_parts();
        let mut envelope = envelope_head(&parts.method, parts.uri.to_string(), &parts.headers);
        if let Some(MessageId(id)) = parts.extensions.get::<MessageId>() {
            envelope.id = Some(id.clone());
        }
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

/// What an HTTP request's [`Envelope`] keeps of its head, for any HTTP request type: method, URI,
/// `Content-Type`, and the `Idempotency-Key` as id and metadata.
pub(crate) fn envelope_head(method: &Method, uri: String, headers: &http::HeaderMap) -> Envelope {
    let mut envelope = Envelope::default();
    if let Some(key) = key_header(headers) {
        envelope.id = Some(key.to_owned());
        envelope
            .metadata
            .insert(IDEMPOTENCY_KEY.as_str().to_owned(), key.to_owned());
    }
    envelope.content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    envelope
        .metadata
        .insert("method".to_owned(), method.to_string());
    envelope.metadata.insert("uri".to_owned(), uri);
    // Every header, in order, values byte for byte; the dead-letter layer redacts secrets
    // before anything is written.
    envelope.headers = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    envelope
}

macro_rules! plain_payload {
    ($($ty:ty),*) => {$(
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
