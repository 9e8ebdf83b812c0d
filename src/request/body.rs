//! [`BufferedBody`]: a body read into memory up to a limit, and the collector that reads it.

use bytes::Bytes;
use http_body::Body;

use super::idempotency::http_retry_safe;
use super::replay::Replay;

/// A body read into memory, up to a byte limit: what
/// [`ReplayBufferLayer`](super::ReplayBufferLayer) makes of a request body so that it can
/// be replayed, and what [`BufferResponseLayer`](super::BufferResponseLayer) makes of
/// a response body so that a classifier can read it (a JSON error code, gRPC trailers).
///
/// - **Complete**: the whole body (and its trailers) fitted within the limit. It is sent again
///   byte for byte, with an exact size hint, so HTTP clients send the same `Content-Length`.
///   A request with a complete body can be replayed ([`Replay`]).
/// - **Partial**: the body was longer than the limit. It still streams every byte (the part
///   read, then the rest), but it cannot be copied: a request with a partial body is never
///   retried, and its failure says [`GiveUp::NotReplayable`](crate::retry::GiveUp::NotReplayable).
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

    fn record_span(&self, span: &tracing::Span) {
        super::replay::record_http_span(span, self.method(), self.uri());
    }

    fn time_left(&self, header: Option<&http::HeaderName>) -> Option<std::time::Duration> {
        super::replay::read_time_left(self.headers(), header)
    }

    fn set_time_left(&mut self, left: &crate::request::TimeLeft<'_>) {
        super::replay::write_time_left(self.headers_mut(), left);
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

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
}
