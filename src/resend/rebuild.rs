//! Rebuilding the request a record was made from, to send it again.

use bytes::Bytes;
use http_body_util::Full;

use crate::request::{Envelope, IDEMPOTENCY_KEY, MessageId};
use crate::store::{Record, StoreError};

/// Rebuilds the HTTP request a record was made from: the stored `method` (default `POST`) and
/// `uri` metadata, every header the record kept ([`Record::headers`], in order; the redacted
/// ones are left out: see [`http_request_restoring`]), the original
/// payload as a `Full<Bytes>` body, and a [`MessageId`] extension with the record's id, so that
/// the outcome updates the same record.
///
/// With `target`, the request goes there instead: a target with a path other than `/` is used
/// as it is; otherwise its scheme and authority replace the stored ones and the stored path and
/// query stay.
///
/// # Errors
///
/// [`StoreError`] when the payload was truncated, or the stored method or uri is missing or
/// malformed.
pub fn http_request(
    record: &Record,
    target: Option<&http::Uri>,
) -> Result<http::Request<Full<Bytes>>, StoreError> {
    http_request_restoring(record, target, |_, _| None)
}

/// [`http_request`] as a `reqwest::Request` (feature `reqwest`), for a [`Scheduler`](super::Scheduler)
/// or a [`Redrive`](super::Redrive) over a stack that wraps a `reqwest::Client`: the same method, URI, kept
/// headers and payload.
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use tower::ServiceBuilder;
/// use tower_backstop::BackstopLayer;
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop::resend::{Scheduler, reqwest_request};
/// use tower_backstop::store::MemoryStore;
///
/// # async fn run() {
/// let store = Arc::new(MemoryStore::new());
/// let stack = ServiceBuilder::new()
///     .layer(
///         BackstopLayer::http(Duration::from_secs(2))
///             .dead_letters(DeadLetterLayer::from_arc(store.clone())),
///     )
///     .service(reqwest::Client::new());
/// let scheduler = Scheduler::new(store, stack, |record| reqwest_request(record, None)).spawn();
/// // … on shutdown:
/// scheduler.shutdown().await;
/// # }
/// ```
///
/// # Errors
///
/// As [`http_request`]; also when reqwest refuses the URI (reqwest needs an absolute URL).
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub fn reqwest_request(
    record: &Record,
    target: Option<&http::Uri>,
) -> Result<reqwest::Request, StoreError> {
    let request = http_request(record, target)?.map(|_| record.payload.clone());
    reqwest::Request::try_from(request)
        .map_err(|e| StoreError::new(format!("record {}: {e}", record.id)))
}

/// [`http_request`], with the redacted headers ([`Record::redacted_headers`]) given back by
/// `restore`: called once per redacted header name (lower case) with the record, it returns
/// the value to send (a token fetched again, a signature computed again over the method, URI and
/// payload), or `None` to send the request without that header.
///
/// ```
/// use http::HeaderValue;
/// use tower_backstop::resend::http_request_restoring;
/// use tower_backstop::store::Record;
///
/// fn rebuild(record: &Record) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, tower_backstop::store::StoreError> {
///     http_request_restoring(record, None, |name, _record| match name {
///         "authorization" => Some(HeaderValue::from_static("Bearer fresh-token")),
///         _ => None,
///     })
/// }
/// ```
///
/// # Errors
///
/// As [`http_request`]; also when a kept header's name or value is not a valid HTTP header.
pub fn http_request_restoring<F>(
    record: &Record,
    target: Option<&http::Uri>,
    mut restore: F,
) -> Result<http::Request<Full<Bytes>>, StoreError>
where
    F: FnMut(&str, &Record) -> Option<http::HeaderValue>,
{
    if record.payload_truncated {
        return Err(StoreError::new(format!(
            "record {} has a truncated payload ({} of {} bytes kept) and cannot be re-sent",
            record.id,
            record.payload.len(),
            record.payload_len
        )));
    }
    let method = record
        .metadata
        .get("method")
        .map(String::as_str)
        .unwrap_or("POST");
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| StoreError::new(format!("record {}: bad method {method:?}", record.id)))?;
    let stored = record.metadata.get("uri");
    let uri: http::Uri = match (target, stored) {
        (Some(target), _) if target.path() != "/" || target.query().is_some() => target.clone(),
        (Some(target), stored) => {
            let stored: http::Uri =
                stored
                    .map(String::as_str)
                    .unwrap_or("/")
                    .parse()
                    .map_err(|e| {
                        StoreError::new(format!("record {}: bad stored uri: {e}", record.id))
                    })?;
            let mut parts = target.clone().into_parts();
            parts.path_and_query = stored.path_and_query().cloned();
            http::Uri::from_parts(parts).map_err(|e| {
                StoreError::new(format!("record {}: cannot build uri: {e}", record.id))
            })?
        }
        (None, Some(stored)) => stored
            .parse()
            .map_err(|e| StoreError::new(format!("record {}: bad stored uri: {e}", record.id)))?,
        (None, None) => {
            return Err(StoreError::new(format!(
                "record {} has no uri in its metadata; give a target",
                record.id
            )));
        }
    };
    let mut request = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from(record.payload.clone())))
        .map_err(|e| StoreError::new(format!("record {}: {e}", record.id)))?;
    let headers = request.headers_mut();
    for (name, value) in &record.headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            StoreError::new(format!(
                "record {}: bad stored header name {name:?}",
                record.id
            ))
        })?;
        let value = http::HeaderValue::from_bytes(value).map_err(|_| {
            StoreError::new(format!(
                "record {}: bad stored value of header {name}",
                record.id
            ))
        })?;
        headers.append(name, value);
    }
    // Records written before headers were kept still carry these two.
    if let Some(content_type) = &record.content_type
        && !headers.contains_key(http::header::CONTENT_TYPE)
    {
        let value = http::HeaderValue::from_str(content_type).map_err(|_| {
            StoreError::new(format!("record {}: bad stored content type", record.id))
        })?;
        headers.insert(http::header::CONTENT_TYPE, value);
    }
    if let Some(key) = record.metadata.get(IDEMPOTENCY_KEY.as_str())
        && !headers.contains_key(&IDEMPOTENCY_KEY)
    {
        let value = http::HeaderValue::from_str(key).map_err(|_| {
            StoreError::new(format!("record {}: bad stored idempotency key", record.id))
        })?;
        headers.insert(&IDEMPOTENCY_KEY, value);
    }
    for name in &record.redacted_headers {
        let Ok(header) = http::HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        if let Some(value) = restore(header.as_str(), record) {
            headers.append(header, value);
        }
    }
    request
        .extensions_mut()
        .insert(MessageId(record.id.clone()));
    Ok(request)
}

/// The envelope a record was made from, to write a new failure of it.
pub(crate) fn envelope_of(record: &Record) -> Envelope {
    let mut envelope = Envelope::new(record.payload.clone()).with_id(record.id.clone());
    envelope.content_type = record.content_type.clone();
    envelope.metadata = record.metadata.clone();
    envelope.tags = record.tags.clone();
    envelope.headers = record.headers.clone();
    envelope
}
