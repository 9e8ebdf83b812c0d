//! `reqwest` (feature `reqwest`): the five layers wrap a `reqwest::Client` as it is.
//!
//! - [`Replay`] for `reqwest::Request`: a copy by `try_clone`. A request whose body is a stream
//!   cannot be copied: it is sent once, and its failure says
//!   [`GiveUp::NotReplayable`](crate::retry::GiveUp::NotReplayable). Safe to resend: an idempotent
//!   method (RFC 9110 §9.2.2) or an `Idempotency-Key` header, as for `http::Request`.
//! - [`Describe`] for `reqwest::Request`: method, URL, `Content-Type`, `Idempotency-Key` (the
//!   record id) and the body bytes, in the same [`Envelope`] fields as an `http::Request`.
//! - [`Authority`](crate::breaker::Authority) keys a `reqwest::Request` for
//!   [`BreakerLayer::per_host`](crate::breaker::BreakerLayer::per_host) (one breaker per host,
//!   the default of [`BackstopLayer`](crate::BackstopLayer)) exactly as an `http::Request`: host
//!   lower-cased without a trailing dot, the scheme's default port.
//! - [`HttpClassifier`] classifies a `reqwest::Response` by status and hint headers
//!   (`Retry-After`, `RateLimit-Reset`, `X-RateLimit-Reset`) exactly as an `http::Response`.
//! - [`classify_error`](crate::classify::classify_error) reads a `reqwest::Error`: a timeout
//!   (reqwest's own or the connection's) is [`Code::Timeout`](crate::Code::Timeout), transient; a connect error (refused,
//!   DNS, connect timeout: no byte of the request was sent) is transient with
//!   [`Code::Io`](crate::Code::Io)`(ConnectionRefused)`, the proof that lets even a keyless POST be resent.
//! - `reqwest::Error` converts into [`Failure`] with that class and code, so that a layer of ours
//!   may sit directly over a `reqwest::Client`: the stack then compiles in any order, and a wrong
//!   one is reported by the order checks (a `tracing` warning when it is built) instead of a
//!   compile error that names no layer.

use crate::breaker::{Authority, KeyOf};
use crate::failure::{BoxError, Failure};
use crate::http_wire::ResponseHead;
use crate::request::describe::envelope_head;
use crate::request::idempotency::{key_header, retry_safe_head};
use crate::request::{Describe, Envelope, Replay};

pub(crate) mod error;

#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl KeyOf<reqwest::Request> for Authority {
    /// The URL's host (lower-cased by the URL parser, a trailing dot removed) and its port or the
    /// scheme's default; no key for a URL without a host.
    fn key(&self, req: &reqwest::Request, key: &mut dyn std::fmt::Write) -> bool {
        let url = req.url();
        match url.host_str() {
            Some(host) => {
                crate::breaker::keyed::write_authority(host, url.port_or_known_default(), key)
            }
            None => false,
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl Replay for reqwest::Request {
    #[inline]
    fn replay(&self) -> Option<Self> {
        self.try_clone()
    }

    fn retry_safe(&self) -> bool {
        retry_safe_head(self.method(), self.headers())
    }

    fn time_left(&self, header: Option<&http::HeaderName>) -> Option<std::time::Duration> {
        crate::request::replay::read_time_left(self.headers(), header)
    }

    fn set_time_left(&mut self, left: &crate::request::TimeLeft<'_>) {
        crate::request::replay::write_time_left(self.headers_mut(), left);
    }

    fn record_span(&self, span: &tracing::Span) {
        let url = self.url();
        crate::request::record_destination(
            span,
            self.method().as_str(),
            url.host_str(),
            url.port_or_known_default(),
        );
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl Describe for reqwest::Request {
    fn message_id(&self) -> Option<&str> {
        key_header(self.headers())
    }

    async fn describe(self) -> Envelope {
        let mut envelope = envelope_head(self.method(), self.url().to_string(), self.headers());
        match self.body().map(|body| body.as_bytes()) {
            None => {}
            Some(Some(bytes)) => envelope.payload = bytes::Bytes::copy_from_slice(bytes),
            Some(None) => {
                envelope.metadata.insert(
                    "payload_error".to_owned(),
                    "streaming body, not kept".to_owned(),
                );
            }
        }
        envelope
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl ResponseHead for reqwest::Response {
    #[inline]
    fn status(&self) -> http::StatusCode {
        reqwest::Response::status(self)
    }

    #[inline]
    fn headers(&self) -> &http::HeaderMap {
        reqwest::Response::headers(self)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl<R: 'static> From<reqwest::Error> for Failure<R> {
    /// The error classified with [`classify_error`] (a timeout is [`Code::Timeout`](crate::Code::Timeout), a connect
    /// error a refused connection) and kept as the source.
    ///
    /// [`classify_error`]: crate::classify::classify_error
    fn from(error: reqwest::Error) -> Self {
        Failure::from(BoxError::from(error))
    }
}
