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
///
/// A request type that is not `Replay` does not fit under [`RetryLayer`](crate::retry::RetryLayer)
/// or [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer), and the compiler says so:
///
/// ```compile_fail,E0277
/// use tower::{Service, ServiceBuilder, service_fn};
/// use tower_backstop::{BoxError, retry::RetryLayer};
///
/// struct Job; // neither `Clone` nor `Replay`
/// fn serves_jobs<S: Service<Job>>(_: S) {}
/// serves_jobs(
///     ServiceBuilder::new()
///         .layer(RetryLayer::default())
///         .service(service_fn(|_: Job| async { Ok::<(), BoxError>(()) })),
/// );
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be sent again: it does not implement `tower_backstop::Replay`",
    label = "RetryLayer and DeadLetterLayer need a copy of this request",
    note = "implement `Replay` (and `Describe`) for your request type; `http::Request<B>` is `Replay` when `B: Clone` (use `Full<Bytes>`, or put `ReplayBufferLayer` above `RetryLayer` for a streaming body); `reqwest::Request` is `Replay` with the `reqwest` feature"
)]
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
    /// The request's headers, in order, each a name (lower case for HTTP) and its value byte for
    /// byte (a value need not be UTF-8). The dead-letter layer redacts the secret ones
    /// ([`RedactHeaders`](crate::store::RedactHeaders)) before anything is written.
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

/// The `Idempotency-Key` header's value, when it is text.
pub(crate) fn key_header(headers: &http::HeaderMap) -> Option<&str> {
    headers.get(&IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok())
}

/// Whether an HTTP request may be sent twice: an idempotent method, or an `Idempotency-Key`.
fn http_retry_safe<B>(req: &http::Request<B>) -> bool {
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

// `do_not_recommend`: a body that is not `Clone` is reported with `Replay`'s own message, which
// names the fixes, not as a missing `Clone`.
#[diagnostic::do_not_recommend]
impl<B: Clone> Replay for http::Request<B> {
    #[inline]
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn retry_safe(&self) -> bool {
        http_retry_safe(self)
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
        assert_eq!(key_header(keyed.headers()), Some("k1"));
    }

    async fn collect(chunks: &[&'static [u8]], limit: usize) -> BufferedBody<Chunks> {
        let mut collect = Collect::new(chunks_body(chunks), limit);
        std::future::poll_fn(|cx| collect.poll_collect(cx))
            .await
            .unwrap()
    }

    type Chunks = http_body_util::StreamBody<
        futures_util::stream::Iter<
            std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>,
        >,
    >;

    fn chunks_body(chunks: &[&'static [u8]]) -> Chunks {
        let frames: Vec<_> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn buffer_limit_is_inclusive_and_a_partial_body_loses_nothing() {
        let body = collect(&[b"abc", b"def"], 6).await;
        assert!(body.is_complete());
        assert_eq!(body.bytes().unwrap(), &Bytes::from_static(b"abcdef"));
        assert_eq!(body.size_hint().exact(), Some(6));
        let copy = body.try_clone().unwrap();
        assert_eq!(copy.collect().await.unwrap().to_bytes(), "abcdef");

        let body = collect(&[b"abc", b"def", b"ghi"], 5).await;
        assert!(!body.is_complete());
        assert!(body.try_clone().is_none());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefghi");

        let request = http::Request::post("/")
            .body(collect(&[b"abc", b"def"], 5).await)
            .unwrap();
        assert!(
            request.replay().is_none(),
            "a partial body is not replayable"
        );
        let request = http::Request::post("/")
            .header("content-length", "6")
            .body(collect(&[b"abc", b"def"], 64).await)
            .unwrap();
        let copy = request.replay().unwrap();
        assert_eq!(copy.headers()["content-length"], "6");
        assert_eq!(
            copy.into_body().collect().await.unwrap().to_bytes(),
            "abcdef"
        );

        let empty = collect(&[], 0).await;
        assert!(empty.is_complete() && empty.is_end_stream());
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

/// A body read into memory, up to a byte limit: what
/// [`ReplayBufferLayer`](crate::retry::ReplayBufferLayer) makes of a request body so that it can
/// be replayed, and what [`BufferResponseLayer`](crate::classify::BufferResponseLayer) makes of
/// a response body so that a classifier can read it (a JSON error code, gRPC trailers).
///
/// - **Complete**: the whole body (and its trailers) fitted within the limit. It is sent again
///   byte for byte, with an exact size hint, so HTTP clients send the same `Content-Length`.
///   A request with a complete body can be replayed ([`Replay`]).
/// - **Partial**: the body was longer than the limit. It still streams every byte (the part
///   read, then the rest), but it cannot be copied: a request with a partial body is never
///   retried, and its failure says [`GiveUp::NotReplayable`](crate::GiveUp::NotReplayable).
#[derive(Debug)]
pub struct BufferedBody<B> {
    kind: Kind<B>,
}

#[derive(Debug)]
enum Kind<B> {
    Complete {
        data: Bytes,
        trailers: Option<http::HeaderMap>,
        sent_data: bool,
        sent_trailers: bool,
    },
    Partial {
        prefix: Option<Bytes>,
        rest: B,
    },
}

impl<B> BufferedBody<B> {
    /// A complete body holding `data` and, optionally, `trailers`.
    pub fn new(data: impl Into<Bytes>, trailers: Option<http::HeaderMap>) -> Self {
        BufferedBody {
            kind: Kind::Complete {
                data: data.into(),
                trailers,
                sent_data: false,
                sent_trailers: false,
            },
        }
    }

    fn partial(prefix: Bytes, rest: B) -> Self {
        BufferedBody {
            kind: Kind::Partial {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }

    /// Whether the whole body was read within the limit.
    pub fn is_complete(&self) -> bool {
        matches!(self.kind, Kind::Complete { .. })
    }

    /// The whole body, when it is complete.
    pub fn bytes(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Complete { data, .. } => Some(data),
            Kind::Partial { .. } => None,
        }
    }

    /// The trailers, when the body is complete and had any.
    pub fn trailers(&self) -> Option<&http::HeaderMap> {
        match &self.kind {
            Kind::Complete { trailers, .. } => trailers.as_ref(),
            Kind::Partial { .. } => None,
        }
    }

    /// A fresh copy of a complete body (nothing sent yet); `None` for a partial one.
    pub fn try_clone(&self) -> Option<Self> {
        match &self.kind {
            Kind::Complete { data, trailers, .. } => {
                Some(BufferedBody::new(data.clone(), trailers.clone()))
            }
            Kind::Partial { .. } => None,
        }
    }
}

impl<B> Body for BufferedBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        use bytes::Buf;
        use std::task::Poll;
        match &mut self.get_mut().kind {
            Kind::Complete {
                data,
                trailers,
                sent_data,
                sent_trailers,
            } => {
                if !*sent_data {
                    *sent_data = true;
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(http_body::Frame::data(data.clone()))));
                    }
                }
                if !*sent_trailers {
                    *sent_trailers = true;
                    if let Some(trailers) = trailers.clone() {
                        return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
                    }
                }
                Poll::Ready(None)
            }
            Kind::Partial { prefix, rest } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
                }
                match std::task::ready!(std::pin::Pin::new(rest).poll_frame(cx)) {
                    Some(Ok(frame)) => Poll::Ready(Some(Ok(
                        frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
                    ))),
                    Some(Err(e)) => Poll::Ready(Some(Err(e))),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Complete {
                data,
                trailers,
                sent_data,
                sent_trailers,
            } => (*sent_data || data.is_empty()) && (*sent_trailers || trailers.is_none()),
            Kind::Partial { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Complete {
                data, sent_data, ..
            } => http_body::SizeHint::with_exact(if *sent_data { 0 } else { data.len() as u64 }),
            Kind::Partial { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = http_body::SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(extra));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(extra));
                }
                hint
            }
        }
    }
}

impl<B> Replay for http::Request<BufferedBody<B>> {
    fn replay(&self) -> Option<Self> {
        let body = self.body().try_clone()?;
        let mut copy = http::Request::new(body);
        *copy.method_mut() = self.method().clone();
        *copy.uri_mut() = self.uri().clone();
        *copy.version_mut() = self.version();
        *copy.headers_mut() = self.headers().clone();
        *copy.extensions_mut() = self.extensions().clone();
        Some(copy)
    }

    fn retry_safe(&self) -> bool {
        http_retry_safe(self)
    }
}

/// Reads a body into a [`BufferedBody`], up to `limit` bytes: the state of a buffering future.
#[derive(Debug)]
pub(crate) struct Collect<B> {
    body: Option<B>,
    chunks: bytes::BytesMut,
    first: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    limit: usize,
}

impl<B> Collect<B>
where
    B: Body + Unpin,
{
    pub(crate) fn new(body: B, limit: usize) -> Self {
        Collect {
            body: Some(body),
            chunks: bytes::BytesMut::new(),
            first: None,
            trailers: None,
            limit,
        }
    }

    fn take_data(&mut self) -> Bytes {
        match self.first.take() {
            Some(first) if self.chunks.is_empty() => first,
            Some(first) => {
                let mut all = bytes::BytesMut::with_capacity(first.len() + self.chunks.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&self.chunks);
                all.freeze()
            }
            None => std::mem::take(&mut self.chunks).freeze(),
        }
    }

    fn len(&self) -> usize {
        self.first.as_ref().map_or(0, Bytes::len) + self.chunks.len()
    }

    /// Polls the body until it ends (complete) or passes the limit (partial). Call again only
    /// after `Pending`.
    pub(crate) fn poll_collect(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<BufferedBody<B>, B::Error>> {
        use bytes::Buf;
        use std::task::Poll;
        loop {
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(Ok(BufferedBody::new(Bytes::new(), None)));
            };
            match std::task::ready!(std::pin::Pin::new(body).poll_frame(cx)) {
                None => {
                    self.body = None;
                    let data = self.take_data();
                    return Poll::Ready(Ok(BufferedBody::new(data, self.trailers.take())));
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let data = data.copy_to_bytes(data.remaining());
                        if self.first.is_none() && self.chunks.is_empty() {
                            self.first = Some(data);
                        } else {
                            self.chunks.extend_from_slice(&data);
                        }
                        if self.len() > self.limit
                            && let Some(rest) = self.body.take()
                        {
                            let prefix = self.take_data();
                            return Poll::Ready(Ok(BufferedBody::partial(prefix, rest)));
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            match &mut self.trailers {
                                Some(existing) => existing.extend(trailers),
                                None => self.trailers = Some(trailers),
                            }
                        }
                    }
                },
            }
        }
    }
}
