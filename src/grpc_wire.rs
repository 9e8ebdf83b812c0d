//! The gRPC wire format that both sides speak: the status codes, and the trailers-only answer
//! the server flavours send. Shared by the classifier and the server flavours, so that neither
//! imports the other.

use std::time::Duration;

/// gRPC status codes (the numeric values of `grpc-status`, as in `google.rpc.Code`).
pub mod codes {
    /// Not an error.
    pub const OK: i32 = 0;
    /// The operation was cancelled, typically by the caller.
    pub const CANCELLED: i32 = 1;
    /// Unknown error.
    pub const UNKNOWN: i32 = 2;
    /// The client specified an invalid argument.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The deadline expired before the operation could complete.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// Some requested entity was not found.
    pub const NOT_FOUND: i32 = 5;
    /// The entity that a client attempted to create already exists.
    pub const ALREADY_EXISTS: i32 = 6;
    /// The caller does not have permission.
    pub const PERMISSION_DENIED: i32 = 7;
    /// Some resource has been exhausted (a quota, the file system).
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// The system is not in a state required for the operation.
    pub const FAILED_PRECONDITION: i32 = 9;
    /// The operation was aborted (a concurrency conflict).
    pub const ABORTED: i32 = 10;
    /// The operation was attempted past the valid range.
    pub const OUT_OF_RANGE: i32 = 11;
    /// The operation is not implemented.
    pub const UNIMPLEMENTED: i32 = 12;
    /// Internal error.
    pub const INTERNAL: i32 = 13;
    /// The service is currently unavailable.
    pub const UNAVAILABLE: i32 = 14;
    /// Unrecoverable data loss or corruption.
    pub const DATA_LOSS: i32 = 15;
    /// The request does not have valid authentication credentials.
    pub const UNAUTHENTICATED: i32 = 16;
}

/// A trailers-only gRPC answer (HTTP 200, `content-type: application/grpc`, the status in the
/// headers): what the server flavours send for a timeout and an open breaker. `pushback` becomes
/// `grpc-retry-pushback-ms` (gRFC A6), in whole milliseconds rounded up.
pub(crate) fn trailers_only<B: Default>(
    code: i32,
    message: &'static str,
    pushback: Option<Duration>,
) -> http::Response<B> {
    let mut response = http::Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", http::HeaderValue::from(code));
    headers.insert("grpc-message", http::HeaderValue::from_static(message));
    if let Some(left) = pushback {
        let millis = left.as_nanos().div_ceil(1_000_000);
        headers.insert(
            "grpc-retry-pushback-ms",
            http::HeaderValue::from(u64::try_from(millis).unwrap_or(u64::MAX)),
        );
    }
    response
}
