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

/// The most digits a `grpc-timeout` value may have (gRPC over HTTP/2: `TimeoutValue → {positive
/// integer as ASCII string of at most 8 digits}`).
const TIMEOUT_DIGITS_MAX: u128 = 99_999_999;

/// The units of `grpc-timeout`, coarsest first, in nanoseconds.
const TIMEOUT_UNITS: [(u128, u8); 6] = [
    (3_600_000_000_000, b'H'),
    (60_000_000_000, b'M'),
    (1_000_000_000, b'S'),
    (1_000_000, b'm'),
    (1_000, b'u'),
    (1, b'n'),
];

/// `left` as a `grpc-timeout` value (gRPC over HTTP/2, `Timeout → "grpc-timeout"
/// TimeoutValue TimeoutUnit`): the coarsest unit that holds it exactly in at most 8 digits
/// (`2S`, `1500m`), else the finest unit that holds it in 8 digits, rounded down (so never
/// above `left`: `1234567u` for 1.2345678 s); `99999999H` past that.
// Written by the client side only (`GrpcRequest`, feature `tonic`); tested in any build.
#[cfg_attr(not(feature = "tonic"), allow(dead_code))]
pub(crate) fn encode_timeout(left: Duration) -> http::HeaderValue {
    let nanos = left.as_nanos();
    let exact = TIMEOUT_UNITS
        .iter()
        .find(|(size, _)| nanos.is_multiple_of(*size) && nanos / size <= TIMEOUT_DIGITS_MAX);
    let (value, unit) = match exact {
        Some(&(size, unit)) => (nanos / size, unit),
        None => TIMEOUT_UNITS
            .iter()
            .rev()
            .find(|(size, _)| nanos / size <= TIMEOUT_DIGITS_MAX)
            .map_or((TIMEOUT_DIGITS_MAX, b'H'), |&(size, unit)| {
                (nanos / size, unit)
            }),
    };
    let mut text = value.to_string();
    text.push(char::from(unit));
    http::HeaderValue::try_from(text).expect("digits and a letter are a valid header value")
}

/// A `grpc-timeout` value read back: `None` when it is malformed (empty, more than 8 digits,
/// a sign or a space, an unknown unit), which gRPC servers treat as no timeout. `0n` is a
/// zero timeout: the deadline has already passed.
pub(crate) fn parse_timeout(value: &http::HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let size = TIMEOUT_UNITS.iter().find(|(_, u)| *u == unit)?.0;
    let value: u128 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let nanos = value * size;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(left: Duration) -> String {
        encode_timeout(left).to_str().unwrap().to_owned()
    }

    #[test]
    fn timeouts_are_written_in_the_coarsest_exact_unit_within_eight_digits() {
        assert_eq!(encoded(Duration::from_secs(2)), "2S");
        assert_eq!(encoded(Duration::from_secs(7200)), "2H");
        assert_eq!(encoded(Duration::from_secs(90)), "90S");
        assert_eq!(encoded(Duration::from_secs(120)), "2M");
        assert_eq!(encoded(Duration::from_millis(1500)), "1500m");
        assert_eq!(encoded(Duration::from_nanos(1)), "1n");
        assert_eq!(encoded(Duration::ZERO), "0H");
        assert_eq!(encoded(Duration::from_nanos(99_999_999)), "99999999n");
    }

    #[test]
    fn inexact_timeouts_are_rounded_down_in_the_finest_unit_that_fits() {
        // 1.234567891 s: 10 digits in ns; 1234567 µs (rounded down, 891 ns lost).
        assert_eq!(encoded(Duration::from_nanos(1_234_567_891)), "1234567u");
        // 100,000,001 ns: 9 digits; 100000 µs.
        assert_eq!(encoded(Duration::from_nanos(100_000_001)), "100000u");
        // Every encoding is at most 8 digits and never above the time left.
        for nanos in [1u64, 999, 123_456_789, 987_654_321_012, u64::MAX] {
            let left = Duration::from_nanos(nanos);
            let text = encoded(left);
            assert!(text.len() <= 9, "{text}");
            let back = parse_timeout(&encode_timeout(left)).unwrap();
            assert!(back <= left, "{text}: {back:?} > {left:?}");
        }
        // Past 99,999,999 hours: the largest value.
        assert_eq!(encoded(Duration::MAX), "99999999H");
    }

    #[test]
    fn malformed_timeouts_are_ignored() {
        for bad in [
            "",
            "S",
            "5",
            "123456789S",
            "5s",
            "5x",
            "-5S",
            "+5S",
            " 5S",
            "5 S",
            "1.5S",
        ] {
            let value = http::HeaderValue::from_str(bad).unwrap();
            assert_eq!(parse_timeout(&value), None, "{bad:?}");
        }
        let value = http::HeaderValue::from_bytes(b"5\xffS").unwrap();
        assert_eq!(parse_timeout(&value), None);
        for (good, left) in [
            ("0n", Duration::ZERO),
            ("30m", Duration::from_millis(30)),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
            ("00000010S", Duration::from_secs(10)),
            ("7u", Duration::from_micros(7)),
            ("2M", Duration::from_secs(120)),
        ] {
            let value = http::HeaderValue::from_static(good);
            assert_eq!(parse_timeout(&value), Some(left), "{good}");
        }
    }
}
