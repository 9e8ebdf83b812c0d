//! The headers every response of the board carries: no framing, no sniffing, no caching, a
//! content security policy for pages without scripts, and a `Content-Type` with its charset.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderName, HeaderValue};

use super::html::PageError;

/// The board's content security policy: nothing loads but the page's own inline style (the
/// pages have no script, image, font or frame), forms go to the board's own origin only, and no
/// other site may frame it.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The headers set on every response, replacing any the handler set.
const HEADERS: [(HeaderName, &str); 5] = [
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    // Pages carry the CSRF token, payloads and headers of records: never kept by a cache.
    (header::CACHE_CONTROL, "no-store"),
    // Links carry filters (tags, hosts): never sent to another site.
    (header::REFERRER_POLICY, "no-referrer"),
];

/// Sets the board's headers on the response to `request`. A response without a `Content-Type`
/// gets `text/html; charset=utf-8`; an error without one (axum's `405 Method Not Allowed`, whose
/// `Allow` header the router adds afterwards) becomes the board's error page first.
pub(crate) async fn secure(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    let mut response = if response.headers().contains_key(header::CONTENT_TYPE) {
        response
    } else if response.status().is_client_error() || response.status().is_server_error() {
        let status = response.status();
        let (mut parts, _) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        let message = if status == http::StatusCode::METHOD_NOT_ALLOWED {
            format!("this page does not answer {method}")
        } else {
            "the board cannot answer this request".to_owned()
        };
        let (page_parts, body) = PageError::new(status, message).into_response().into_parts();
        parts.headers.extend(page_parts.headers);
        Response::from_parts(parts, body)
    } else {
        let mut response = response;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        response
    };
    let headers = response.headers_mut();
    for (name, value) in HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The board's answer to an address it has no page for: 404, as its error page.
pub(crate) async fn not_found() -> PageError {
    PageError::new(http::StatusCode::NOT_FOUND, "the board has no page here")
}
