//! The gRPC classifier: `grpc-status` and `grpc-retry-pushback-ms`, from the response headers
//! (trailers-only responses) or from trailers that a buffering step put in reach.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};

use super::{Classifier, Verdict};
use crate::failure::{Class, Code};
use crate::grpc_wire::codes;
use crate::request::Trailers;

/// The gRPC classifier: maps `grpc-status` to a [`Class`], keeps the code as [`Code::Grpc`], and
/// reads `grpc-retry-pushback-ms` (gRFC A6).
///
/// # Default mapping
///
/// | `grpc-status` | class |
/// |---|---|
/// | `OK` (0) | success |
/// | `UNAVAILABLE` (14), `DEADLINE_EXCEEDED` (4) | [`Class::TRANSIENT`] |
/// | `RESOURCE_EXHAUSTED` (8) | [`Class::THROTTLED`] |
/// | `UNKNOWN` (2), `INTERNAL` (13), `CANCELLED` (1), `ABORTED` (10), `DATA_LOSS` (15), any other value | [`Class::UNKNOWN`] |
/// | `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7), `FAILED_PRECONDITION` (9), `OUT_OF_RANGE` (11), `UNIMPLEMENTED` (12), `UNAUTHENTICATED` (16) | [`Class::PERMANENT`] |
///
/// A server's `DEADLINE_EXCEEDED` is a timeout like our own per-attempt one: transient, and
/// its outcome unknown ([`Sent::Maybe`](crate::Sent::Maybe): the server may have done the
/// work), so a request that is not safe to send twice is not resent. Under an overall
/// deadline the retry layer writes the time left into `grpc-timeout`, so a server that ran out
/// of it is not asked again after the deadline. A response whose HTTP status is not 200 is
/// classified by its HTTP status, as [`HttpClassifier`](super::HttpClassifier) would.
/// [`map_code`](Self::map_code) overrides the mapping code by code.
///
/// # Where the status is read, and what is not covered
///
/// - **Trailers-only responses** (an error answered before any message, the usual form of a
///   unary error, and what tonic's server sends for an `Err(Status)`): `grpc-status` is in the
///   response headers, and the classifier sees it at once.
/// - **Status in trailers** (after the response messages): the classifier sees it only if the
///   body was read to the end before classification, by
///   [`BufferResponseLayer`](super::BufferResponseLayer) placed below
///   [`ClassifyLayer`](super::ClassifyLayer), which keeps the trailers where this classifier
///   finds them. That suits unary calls (one small message); it buffers the
///   response up to a byte limit.
/// - Without that buffering step, a response with no `grpc-status` header is a success at
///   classification time: its status arrives later, in the body, after the retry decision. A
///   streaming call that fails mid-stream is therefore not retried by this crate (gRFC A6 does
///   not retry once response messages were received either).
///
/// `grpc-retry-pushback-ms` (gRFC A6): a non-negative integer is a server hint in milliseconds;
/// a negative or unparseable value means "do not retry", and the retry layer stops with
/// [`GiveUp::ServerSaidNo`](crate::retry::GiveUp::ServerSaidNo).
#[derive(Clone, Debug, Default)]
pub struct GrpcClassifier {
    overrides: Option<Arc<Vec<(i32, Class)>>>,
}

impl GrpcClassifier {
    /// The default mapping, with no overrides.
    pub fn new() -> Self {
        GrpcClassifier::default()
    }

    /// Classifies `grpc-status` `code` as `class`, whatever the default says.
    pub fn map_code(mut self, code: i32, class: Class) -> Self {
        let overrides = Arc::make_mut(self.overrides.get_or_insert_with(Default::default));
        overrides.retain(|(c, _)| *c != code);
        overrides.push((code, class));
        self
    }

    /// The class of `grpc-status` `code`: `None` for success.
    pub fn class_of(&self, code: i32) -> Option<Class> {
        if let Some(overrides) = &self.overrides
            && let Some((_, class)) = overrides.iter().find(|(c, _)| *c == code)
        {
            return Some(*class);
        }
        default_class(code)
    }

    /// Classifies a gRPC status found in `headers` (response headers of a trailers-only
    /// response, or trailers): `None` when there is no `grpc-status` or it is `OK`.
    pub fn classify_status(&self, headers: &HeaderMap) -> Option<Verdict> {
        let value = headers.get("grpc-status")?;
        let code = match value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
        {
            Some(code) => code,
            None => {
                tracing::warn!(value = ?value, "malformed grpc-status, classified as UNKNOWN");
                codes::UNKNOWN
            }
        };
        let class = self.class_of(code)?;
        let verdict = Verdict::new(class, Code::Grpc(code));
        Some(match pushback(headers) {
            Pushback::None => verdict,
            Pushback::After(delay) => verdict.with_retry_after(delay),
            Pushback::DoNotRetry => verdict.with_no_retry(),
        })
    }
}

fn default_class(code: i32) -> Option<Class> {
    use codes::*;
    match code {
        OK => None,
        UNAVAILABLE | DEADLINE_EXCEEDED => Some(Class::TRANSIENT),
        RESOURCE_EXHAUSTED => Some(Class::THROTTLED),
        INVALID_ARGUMENT | NOT_FOUND | ALREADY_EXISTS | PERMISSION_DENIED | FAILED_PRECONDITION
        | OUT_OF_RANGE | UNIMPLEMENTED | UNAUTHENTICATED => Some(Class::PERMANENT),
        _ => Some(Class::UNKNOWN),
    }
}

enum Pushback {
    None,
    After(Duration),
    DoNotRetry,
}

/// `grpc-retry-pushback-ms` per gRFC A6: a non-negative integer of milliseconds, else "do not
/// retry".
fn pushback(headers: &HeaderMap) -> Pushback {
    let Some(value) = headers.get("grpc-retry-pushback-ms") else {
        return Pushback::None;
    };
    match value.to_str().ok().map(str::trim) {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            Pushback::After(Duration::from_millis(v.parse::<u64>().unwrap_or(u64::MAX)))
        }
        _ => Pushback::DoNotRetry,
    }
}

impl<B> Classifier<http::Response<B>> for GrpcClassifier {
    fn classify_response(&self, response: &http::Response<B>) -> Option<Verdict> {
        if response.status() != StatusCode::OK {
            // Not a gRPC answer at all (a proxy's 503, a 404): classify it as HTTP.
            let status = response.status();
            let verdict = Verdict::new(super::http::default_class(status)?, Code::Http(status));
            return Some(match super::http::retry_after_hint(response.headers()) {
                Some(delay) => verdict.with_retry_after(delay),
                None => verdict,
            });
        }
        self.classify_status(response.headers()).or_else(|| {
            response
                .extensions()
                .get::<Trailers>()
                .and_then(|t| self.classify_status(&t.0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(headers: &[(&str, &str)]) -> http::Response<()> {
        let mut b = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn a_code_mapped_again_takes_its_latest_class_and_leaves_the_others() {
        let c = GrpcClassifier::new()
            .map_code(14, Class::PERMANENT)
            .map_code(8, Class::TRANSIENT)
            .map_code(14, Class::UNKNOWN);
        assert_eq!(c.class_of(14), Some(Class::UNKNOWN));
        assert_eq!(c.class_of(8), Some(Class::TRANSIENT));
        assert_eq!(c.class_of(3), Some(Class::PERMANENT));
    }

    #[test]
    fn default_mapping_follows_the_design() {
        let c = GrpcClassifier::new();
        for (code, class) in [
            (0, None),
            (14, Some(Class::TRANSIENT)),
            (4, Some(Class::TRANSIENT)),
            (8, Some(Class::THROTTLED)),
            (2, Some(Class::UNKNOWN)),
            (1, Some(Class::UNKNOWN)),
            (13, Some(Class::UNKNOWN)),
            (3, Some(Class::PERMANENT)),
            (7, Some(Class::PERMANENT)),
            (16, Some(Class::PERMANENT)),
            (5, Some(Class::PERMANENT)),
            (9, Some(Class::PERMANENT)),
            (99, Some(Class::UNKNOWN)),
        ] {
            let v = c.classify_response(&response(&[("grpc-status", &code.to_string())]));
            assert_eq!(v.map(|v| v.class), class, "code {code}");
            if let Some(v) = v {
                assert_eq!(v.code, Code::Grpc(code));
            }
        }
        // A server's DEADLINE_EXCEEDED is a timeout like ours: it may have done the work.
        let v = c
            .classify_response(&response(&[("grpc-status", "4")]))
            .unwrap();
        assert_eq!(v.sent, crate::Sent::Maybe);
        // No status in headers: success at classification time.
        assert_eq!(c.classify_response(&response(&[])), None);
        // A malformed status is UNKNOWN, not success.
        let v = c
            .classify_response(&response(&[("grpc-status", "x")]))
            .unwrap();
        assert_eq!(v.class, Class::UNKNOWN);
    }

    #[test]
    fn pushback_is_a_hint_or_a_refusal() {
        let c = GrpcClassifier::new();
        let v = c
            .classify_response(&response(&[
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "1500"),
            ]))
            .unwrap();
        assert_eq!(v.retry_after, Some(Duration::from_millis(1500)));
        assert!(!v.no_retry);
        for bad in ["-1", "soon", "1.5", ""] {
            let v = c
                .classify_response(&response(&[
                    ("grpc-status", "14"),
                    ("grpc-retry-pushback-ms", bad),
                ]))
                .unwrap();
            assert!(v.no_retry, "{bad:?}");
            assert_eq!(v.retry_after, None);
        }
    }

    #[test]
    fn trailers_in_extensions_and_overrides() {
        const OVERLOADED: Class = Class::new("overloaded");
        let c = GrpcClassifier::new().map_code(codes::ABORTED, OVERLOADED);
        let mut r = response(&[]);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "10".parse().unwrap());
        r.extensions_mut().insert(Trailers(trailers));
        let v = c.classify_response(&r).unwrap();
        assert_eq!((v.class, v.code), (OVERLOADED, Code::Grpc(10)));
        // A non-200 answer is classified as HTTP.
        let r = http::Response::builder().status(503).body(()).unwrap();
        assert_eq!(c.classify_response(&r).unwrap().class, Class::TRANSIENT);
    }
}
