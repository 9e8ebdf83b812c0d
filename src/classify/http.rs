use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header::RETRY_AFTER};

use super::{Classifier, Verdict};
use crate::failure::{Class, Code, Sent};
use crate::http_wire::ResponseHead;

/// The HTTP classifier: maps a response's status to a [`Class`] and reads `Retry-After`.
///
/// The default mapping is in the [module docs](super). [`map_status`](Self::map_status) and
/// [`success`](Self::success) override it status by status; the overrides are built once and
/// shared by clones, so classifying allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct HttpClassifier {
    overrides: Option<Arc<Vec<Override>>>,
    /// The statuses that prove the request was not processed; `None` is the default list.
    not_sent: Option<Arc<[StatusCode]>>,
}

/// A status and its class; `None` is success.
type Override = (StatusCode, Option<Class>);

impl HttpClassifier {
    /// The default mapping, with no overrides.
    pub fn new() -> Self {
        HttpClassifier::default()
    }

    fn set(mut self, status: StatusCode, class: Option<Class>) -> Self {
        let overrides = Arc::make_mut(self.overrides.get_or_insert_with(Default::default));
        overrides.retain(|(s, _)| *s != status);
        overrides.push((status, class));
        self
    }

    /// Classifies `status` as `class`, whatever the default says.
    pub fn map_status(self, status: StatusCode, class: Class) -> Self {
        self.set(status, Some(class))
    }

    /// Counts `status` as a success, whatever the default says.
    pub fn success(self, status: StatusCode) -> Self {
        self.set(status, None)
    }

    /// The statuses after which the request certainly was not processed ([`Sent::No`]), so
    /// that the retry layer may send again even a request that is not safe to send twice. By
    /// default 408, 425, 429 and 503: each says the server did not act on the request (RFC 9110
    /// §15.5.9 and §15.6.4, RFC 8470 §5.2, RFC 6585 §4). Every other failing status is
    /// [`Sent::Yes`].
    ///
    /// A provider whose 503 may come after it acted (a gateway in front of a slow backend) is
    /// told apart by leaving 503 out:
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_backstop::classify::HttpClassifier;
    ///
    /// let classifier = HttpClassifier::new().not_sent_statuses(&[
    ///     StatusCode::REQUEST_TIMEOUT,
    ///     StatusCode::TOO_EARLY,
    ///     StatusCode::TOO_MANY_REQUESTS,
    /// ]);
    /// # let _ = classifier;
    /// ```
    pub fn not_sent_statuses(mut self, statuses: &[StatusCode]) -> Self {
        self.not_sent = Some(Arc::from(statuses));
        self
    }

    /// Whether a failure of `status` proves the request was not processed (see
    /// [`not_sent_statuses`](Self::not_sent_statuses)).
    pub fn sent_of(&self, status: StatusCode) -> Sent {
        match self.not_sent.as_deref() {
            // The default list is the one every HTTP failure has (`Sent::of`).
            None => Sent::of(Code::Http(status)),
            Some(statuses) if statuses.contains(&status) => Sent::No,
            Some(_) => Sent::Yes,
        }
    }

    /// A classifier that also reads the response body, for providers that put their own error
    /// code in it (a JSON `{"ErrorCode": 406}`, or a 200 with `{"ok": false}`).
    ///
    /// `f` sees the status and the whole body of every response, success or not, and returns
    /// a verdict to override the status mapping, or `None` to keep it. It needs the body in
    /// memory: put [`BufferResponseLayer`](super::BufferResponseLayer) below the
    /// [`ClassifyLayer`](super::ClassifyLayer) (the classifier then works on
    /// `http::Response<BufferedBody<B>>`). A body above the buffer's limit is classified by its
    /// status alone. The server's `Retry-After` is kept when `f` gives no hint of its own.
    pub fn with_body<F>(self, f: F) -> BodyClassifier<F>
    where
        F: Fn(StatusCode, &[u8]) -> Option<Verdict>,
    {
        BodyClassifier { http: self, f }
    }

    /// The class of `status`: `None` for success.
    pub fn class_of(&self, status: StatusCode) -> Option<Class> {
        if let Some(overrides) = &self.overrides
            && let Some((_, class)) = overrides.iter().find(|(s, _)| *s == status)
        {
            return *class;
        }
        default_class(status)
    }
}

pub(crate) fn default_class(status: StatusCode) -> Option<Class> {
    match status.as_u16() {
        100..=399 => None,
        408 | 425 | 502 | 503 | 504 => Some(Class::TRANSIENT),
        429 => Some(Class::THROTTLED),
        400..=499 => Some(Class::PERMANENT),
        _ => Some(Class::UNKNOWN),
    }
}

impl HttpClassifier {
    /// The verdict on a response's status and headers, for any HTTP response type
    /// (`http::Response`, `reqwest::Response`): `None` for success.
    pub(crate) fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Verdict> {
        // On the retry layer's attempt span, when there is one (the span of the future that
        // polls this classification).
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            tracing::Span::current().record("http.response.status_code", status.as_u16());
        }
        let class = self.class_of(status)?;
        let verdict = Verdict::new(class, Code::Http(status)).with_sent(self.sent_of(status));
        Some(match retry_after_hint(headers) {
            Some(delay) => verdict.with_retry_after(delay),
            None => verdict,
        })
    }
}

impl<R: ResponseHead> Classifier<R> for HttpClassifier {
    fn classify_response(&self, response: &R) -> Option<Verdict> {
        self.classify_head(response.status(), response.headers())
    }
}

/// The server's delay hint in `headers`, as a positive delay from now: `Retry-After` (RFC 9110
/// §10.2.3) when present and valid, else a rate-limit reset header (see
/// [`rate_limit_reset_hint`]). A malformed value is logged and ignored; a time in the past, or
/// zero, gives no hint.
pub(crate) fn retry_after_hint(headers: &HeaderMap) -> Option<Duration> {
    retry_after_header(headers).or_else(|| rate_limit_reset_hint(headers, SystemTime::now()))
}

/// An [`HttpClassifier`] that also reads the buffered body; see [`HttpClassifier::with_body`].
#[derive(Clone)]
pub struct BodyClassifier<F> {
    http: HttpClassifier,
    f: F,
}

impl<F> fmt::Debug for BodyClassifier<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyClassifier")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl<B, F> Classifier<http::Response<crate::request::BufferedBody<B>>> for BodyClassifier<F>
where
    F: Fn(StatusCode, &[u8]) -> Option<Verdict>,
{
    fn classify_response(
        &self,
        response: &http::Response<crate::request::BufferedBody<B>>,
    ) -> Option<Verdict> {
        let by_status = self.http.classify_response(response);
        let Some(body) = response.body().bytes() else {
            return by_status;
        };
        match (self.f)(response.status(), body) {
            Some(verdict) if verdict.retry_after.is_none() => {
                let hint = by_status.and_then(|v| v.retry_after);
                Some(match hint {
                    Some(delay) => verdict.with_retry_after(delay),
                    None => verdict,
                })
            }
            Some(verdict) => Some(verdict),
            None => by_status,
        }
    }
}

/// The longest wait a rate-limit reset header may name: a week. A reset further ahead is
/// nonsense (a misread unit, a clock far off) and is ignored, never turned into a deferral of
/// years; quotas reset within a day in every API we know of.
pub const MAX_RESET_HINT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Unix times in seconds from this value up (2001-09-09); below it, delta-seconds.
const EPOCH_SECONDS_FROM: u64 = 1_000_000_000;
/// Unix times in milliseconds from this value up (13 digits, 2001-09-09 in milliseconds).
const EPOCH_MILLIS_FROM: u64 = 1_000_000_000_000;

/// Reads the rate-limit reset headers, in this order, as a positive delay from `now`:
///
/// - `RateLimit-Reset` (draft-ietf-httpapi-ratelimit-headers): delta-seconds;
/// - `X-RateLimit-Reset` (GitHub, GitLab, many others) and `X-Rate-Limit-Reset` (Twitter/X and
///   others): delta-seconds below 1,000,000,000; a Unix time in **seconds** from
///   1,000,000,000 (10 digits); a Unix time in **milliseconds** from 1,000,000,000,000
///   (13 digits).
///
/// An absolute time is never reached early: the wait lasts until its whole second (or whole
/// millisecond) has passed, since a server that truncates its clock is still in the reset second
/// until it ends. A value that is not a plain non-negative integer (a sign, a fraction, a word)
/// is malformed: logged and ignored. A value too large for 64 bits, or naming a wait above
/// [`MAX_RESET_HINT`], is ignored as nonsense. A reset in the past, or zero, gives no hint. In
/// each case the next header is tried, then the class's backoff applies.
pub fn rate_limit_reset_hint(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    for name in ["ratelimit-reset", "x-ratelimit-reset", "x-rate-limit-reset"] {
        let Some(value) = headers.get(name) else {
            continue;
        };
        let parsed = value
            .to_str()
            .ok()
            .map(|v| v.trim_matches([' ', '\t']))
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .map(|v| v.parse::<u64>().ok());
        let Some(number) = parsed else {
            tracing::warn!(header = name, value = ?value, "ignoring malformed rate-limit reset");
            continue;
        };
        let absolute = name != "ratelimit-reset";
        let delay = match number {
            None => None,
            Some(n) if absolute && n >= EPOCH_MILLIS_FROM => {
                until(now, Duration::from_millis(n.saturating_add(1)))
            }
            Some(n) if absolute && n >= EPOCH_SECONDS_FROM => {
                until(now, Duration::from_secs(n.saturating_add(1)))
            }
            Some(n) => Some(Duration::from_secs(n)),
        };
        match delay {
            Some(d) if d <= MAX_RESET_HINT => return (d > Duration::ZERO).then_some(d),
            _ => tracing::warn!(
                header = name,
                value = ?value,
                "ignoring a rate-limit reset absurdly far ahead"
            ),
        }
    }
    None
}

/// The wait from `now` until `since_epoch` after the Unix epoch; zero when it has passed, `None`
/// when the time is not representable.
fn until(now: SystemTime, since_epoch: Duration) -> Option<Duration> {
    let at = std::time::UNIX_EPOCH.checked_add(since_epoch)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn retry_after_header(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?;
    let Ok(text) = value.to_str() else {
        tracing::warn!(value = ?value, "ignoring Retry-After that is not visible ASCII");
        return None;
    };
    match parse_retry_after(text, SystemTime::now()) {
        Some(delay) if delay > Duration::ZERO => Some(delay),
        Some(_) => None,
        None => {
            tracing::warn!(
                value = text,
                "ignoring malformed Retry-After: neither delay-seconds nor an HTTP-date"
            );
            None
        }
    }
}

/// Parses a `Retry-After` value (RFC 9110 §10.2.3) into a delay counted from `now`.
///
/// - delay-seconds (`1*DIGIT`): that many seconds; a number too large for a `u64` saturates to
///   `u64::MAX` seconds rather than failing, so that the retry layer sees "far too long".
/// - HTTP-date (IMF-fixdate and the two obsolete forms, parsed by the `httpdate` crate): the time
///   from `now` until that date, exact to the nanosecond so a retry is never sent before the
///   named instant; a date at or before `now` gives [`Duration::ZERO`].
///
/// Anything else (a sign, a fraction, an exponent, a word) is malformed: `None`, like
/// [`rate_limit_reset_hint`]'s answer to a value it cannot read.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim_matches([' ', '\t']);
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    httpdate::parse_http_date(value)
        .ok()
        .map(|date| date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classifier_decides_sent_once_by_status() {
        let c = HttpClassifier::new();
        for (status, sent) in [
            (408, Sent::No),
            (425, Sent::No),
            (429, Sent::No),
            (503, Sent::No),
            (500, Sent::Yes),
            (502, Sent::Yes),
            (504, Sent::Yes),
            (404, Sent::Yes),
        ] {
            let v = c.classify_response(&response(status, None)).unwrap();
            assert_eq!(v.sent, sent, "{status}");
            assert_eq!(v.into_failure::<()>().sent(), sent, "{status}");
        }
        // A list of the user's own replaces the default, and a success has no verdict at all.
        let c = HttpClassifier::new().not_sent_statuses(&[StatusCode::BAD_GATEWAY]);
        let sent = |s| c.classify_response(&response(s, None)).unwrap().sent;
        assert_eq!(sent(502), Sent::No);
        assert_eq!(sent(503), Sent::Yes);
        assert_eq!(sent(429), Sent::Yes);
        assert!(c.classify_response(&response(200, None)).is_none());
    }

    fn response(status: u16, retry_after: Option<&str>) -> http::Response<()> {
        let mut b = http::Response::builder().status(status);
        if let Some(v) = retry_after {
            b = b.header("retry-after", v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn default_mapping() {
        let c = HttpClassifier::new();
        for (status, class) in [
            (200, None),
            (202, None),
            (304, None),
            (408, Some(Class::TRANSIENT)),
            (502, Some(Class::TRANSIENT)),
            (503, Some(Class::TRANSIENT)),
            (504, Some(Class::TRANSIENT)),
            (429, Some(Class::THROTTLED)),
            (500, Some(Class::UNKNOWN)),
            (599, Some(Class::UNKNOWN)),
            (501, Some(Class::UNKNOWN)),
            (400, Some(Class::PERMANENT)),
            (404, Some(Class::PERMANENT)),
            (422, Some(Class::PERMANENT)),
        ] {
            let v = c.classify_response(&response(status, None));
            assert_eq!(v.map(|v| v.class), class, "status {status}");
        }
    }

    #[test]
    fn overrides_win() {
        let c = HttpClassifier::new()
            .map_status(StatusCode::NOT_FOUND, Class::TRANSIENT)
            .success(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(c.class_of(StatusCode::NOT_FOUND), Some(Class::TRANSIENT));
        assert_eq!(c.class_of(StatusCode::SERVICE_UNAVAILABLE), None);
        assert_eq!(c.class_of(StatusCode::BAD_REQUEST), Some(Class::PERMANENT));
    }

    #[test]
    fn a_body_verdict_keeps_its_own_hint_else_takes_the_status_hint() {
        use crate::request::BufferedBody;
        let response = |status: u16, retry_after: &str, body: &'static str| {
            http::Response::builder()
                .status(status)
                .header(RETRY_AFTER, retry_after)
                .body(BufferedBody::<()>::new(body, None))
                .unwrap()
        };
        let c = HttpClassifier::new().with_body(|_, body: &[u8]| match body {
            b"quota" => Some(Verdict::new(Class::THROTTLED, Code::Provider(1))),
            b"quota-in-2s" => Some(
                Verdict::new(Class::THROTTLED, Code::Provider(2))
                    .with_retry_after(Duration::from_secs(2)),
            ),
            _ => None,
        });
        let v = c.classify_response(&response(429, "5", "quota")).unwrap();
        assert_eq!(
            (v.code, v.retry_after),
            (Code::Provider(1), Some(Duration::from_secs(5)))
        );
        let v = c
            .classify_response(&response(429, "5", "quota-in-2s"))
            .unwrap();
        assert_eq!(
            (v.code, v.retry_after),
            (Code::Provider(2), Some(Duration::from_secs(2)))
        );
        // Nothing said by the body: the status decides.
        let v = c.classify_response(&response(503, "5", "{}")).unwrap();
        assert_eq!(
            (v.class, v.retry_after),
            (Class::TRANSIENT, Some(Duration::from_secs(5)))
        );
        assert_eq!(
            format!("{c:?}"),
            format!("BodyClassifier {{ http: {:?}, .. }}", HttpClassifier::new())
        );
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::now();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        for bad in ["-1", "nan", "1e999", "soon", "", "1.5", "+3"] {
            assert!(parse_retry_after(bad, now).is_none(), "{bad:?}");
        }
        let later = now + Duration::from_secs(120);
        let date = httpdate::fmt_http_date(later);
        let d = parse_retry_after(&date, now).unwrap();
        assert!(
            d > Duration::from_secs(118) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 1999 23:59:59 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn reset_values_of_every_shape_have_a_defined_meaning() {
        use std::time::UNIX_EPOCH;
        let headers = |name: &'static str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(name, value.parse().unwrap());
            h
        };
        // Now is 0.3 s before a whole second T.
        let t = 1_800_000_000u64;
        let now = UNIX_EPOCH + Duration::from_secs(t) - Duration::from_millis(300);
        let hint = |name, value: &str| rate_limit_reset_hint(&headers(name, value), now);
        // An absolute reset second is never reached early: the wait lasts until T + 1.
        for name in ["x-ratelimit-reset", "x-rate-limit-reset"] {
            assert_eq!(
                hint(name, &t.to_string()),
                Some(Duration::from_millis(1_300))
            );
            // Epoch milliseconds (13 digits): 30 s ahead, to the millisecond.
            let ms = t * 1000 + 30_000;
            assert_eq!(
                hint(name, &ms.to_string()),
                Some(Duration::from_millis(30_301))
            );
            // Delta-seconds.
            assert_eq!(hint(name, "30"), Some(Duration::from_secs(30)));
        }
        // `RateLimit-Reset` is always delta-seconds.
        assert_eq!(hint("ratelimit-reset", "30"), Some(Duration::from_secs(30)));
        // Bad input: ignored, never a panic, never a deferral of years.
        for bad in [
            "-5",
            "+5",
            " ",
            "1.5",
            "0x10",
            "soon",
            "",
            "99999999999999999999999",
            "18446744073709551615",
            "9999999999999",
            "4000000000",
        ] {
            for name in ["ratelimit-reset", "x-ratelimit-reset", "x-rate-limit-reset"] {
                assert_eq!(hint(name, bad), None, "{name}: {bad:?}");
            }
        }
        // A week ahead is still a hint; a second more is nonsense.
        let week = 7 * 24 * 3600;
        assert_eq!(MAX_RESET_HINT, Duration::from_secs(week));
        assert_eq!(
            hint("ratelimit-reset", &week.to_string()),
            Some(MAX_RESET_HINT)
        );
        assert_eq!(hint("ratelimit-reset", &(week + 1).to_string()), None);
        // A past reset, or zero: no hint.
        assert_eq!(hint("x-ratelimit-reset", "1000000000"), None);
        assert_eq!(hint("ratelimit-reset", "0"), None);
        // A nonsense first header does not hide a good later one.
        let mut both = headers("ratelimit-reset", "soon");
        both.insert("x-rate-limit-reset", "12".parse().unwrap());
        assert_eq!(
            rate_limit_reset_hint(&both, now),
            Some(Duration::from_secs(12))
        );
    }

    #[test]
    fn rate_limit_reset_headers_are_hints() {
        let c = HttpClassifier::new();
        let r = |name: &str, value: &str| {
            http::Response::builder()
                .status(429)
                .header(name, value)
                .body(())
                .unwrap()
        };
        let hint = |resp| c.classify_response(&resp).unwrap().retry_after;
        assert_eq!(
            hint(r("ratelimit-reset", "30")),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            hint(r("x-ratelimit-reset", "12")),
            Some(Duration::from_secs(12))
        );
        let now = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let d = hint(r("x-ratelimit-reset", &(now + 100).to_string())).unwrap();
        // Until the whole reset second has passed.
        assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(101),
            "{d:?}"
        );
        assert_eq!(
            hint(r("x-ratelimit-reset", "1000000000")),
            None,
            "in the past"
        );
        assert_eq!(hint(r("ratelimit-reset", "-5")), None);
        assert_eq!(hint(r("ratelimit-reset", "soon")), None);
        // Retry-After wins.
        let both = http::Response::builder()
            .status(503)
            .header("retry-after", "7")
            .header("ratelimit-reset", "60")
            .body(())
            .unwrap();
        assert_eq!(hint(both), Some(Duration::from_secs(7)));
    }

    #[test]
    fn malformed_or_past_hint_is_no_hint() {
        let c = HttpClassifier::new();
        for v in [
            "-1",
            "nan",
            "1e999",
            "soon",
            "Fri, 31 Dec 1999 23:59:59 GMT",
            "0",
        ] {
            let verdict = c.classify_response(&response(429, Some(v))).unwrap();
            assert_eq!(verdict.class, Class::THROTTLED);
            assert_eq!(verdict.retry_after, None, "{v}");
        }
        let verdict = c
            .classify_response(&response(503, Some("9999999999")))
            .unwrap();
        assert_eq!(
            verdict.retry_after,
            Some(Duration::from_secs(9_999_999_999))
        );
    }
}
