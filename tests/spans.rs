//! Spans: each call of the retry layer is a `backstop.call` span, each attempt a
//! `backstop.attempt` child carrying OpenTelemetry's HTTP client fields, so that a
//! `tracing-opentelemetry` user gets the attempts as child spans with no glue. A capturing
//! `tracing-subscriber` layer records every span's fields and parent; on tokio's paused clock
//! with in-process services, then against a real axum server with hyper-util's client.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Scripted, Step, get, no_jitter, status};
use tower::{ServiceBuilder, ServiceExt};
use tower_backstop::classify::ClassifyLayer;
use tower_backstop::retry::RetryPolicy;
use tower_backstop::timeout::TimeoutLayer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The tests of this binary run one at a time: `tracing` caches each callsite's interest
/// process-wide, and a thread-local subscriber set while another thread's is being dropped can
/// miss spans (as tests/breaker_tracing.rs notes).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A span as the subscriber saw it: name, parent's name, fields, and whether it closed.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Captures spans, in order of creation, by id.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(u64, Seen)>>>);

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            parent: ctx
                .span(id)
                .and_then(|s| s.parent())
                .map(|p| p.name().to_owned()),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().push((id.into_u64(), seen));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, seen)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, seen)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            seen.closed = true;
        }
    }
}

impl Capture {
    fn spans(&self) -> Vec<Seen> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }

    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::registry().with(self.clone())
    }
}

fn field<'a>(span: &'a Seen, name: &str) -> Option<&'a str> {
    span.fields.get(name).map(String::as_str)
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_a_client_span_under_the_call() {
    let _serial = SERIAL.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(Scripted::new([status(503)], status(200)));
    let response = svc
        .oneshot(get("http://mail.test:8025/v1/send"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let spans = capture.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["backstop.call", "backstop.attempt", "backstop.attempt"],
        "{spans:#?}"
    );
    let (call, first, second) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(call.parent, None);
    assert_eq!(field(call, "attempts"), Some("2"));
    for attempt in [first, second] {
        assert_eq!(attempt.parent.as_deref(), Some("backstop.call"));
        assert_eq!(field(attempt, "otel.kind"), Some("client"));
        assert_eq!(field(attempt, "otel.name"), Some("GET"));
        assert_eq!(field(attempt, "http.request.method"), Some("GET"));
        assert_eq!(field(attempt, "server.address"), Some("mail.test"));
        assert_eq!(field(attempt, "server.port"), Some("8025"));
        assert!(attempt.closed, "an attempt's span closes when it ends");
    }
    assert_eq!(field(first, "attempt"), Some("1"));
    assert_eq!(
        field(first, "http.request.resend_count"),
        None,
        "the first attempt is not a resend"
    );
    assert_eq!(field(first, "http.response.status_code"), Some("503"));
    assert_eq!(field(first, "error.type"), Some("503"));
    assert_eq!(field(first, "otel.status_code"), Some("ERROR"));

    assert_eq!(field(second, "attempt"), Some("2"));
    assert_eq!(field(second, "http.request.resend_count"), Some("1"));
    assert_eq!(field(second, "http.response.status_code"), Some("200"));
    assert_eq!(field(second, "error.type"), None, "a success has no error");
    assert_eq!(field(second, "otel.status_code"), None);
}

/// A failure with no HTTP answer (a per-attempt timeout) has its class as `error.type`, and
/// the default port of the scheme is recorded when the URI has none.
#[tokio::test(start_paused = true)]
async fn a_timeout_has_its_class_as_error_type() {
    let _serial = SERIAL.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(2)
                .backoff(no_jitter(10))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .layer(TimeoutLayer::new(Duration::from_secs(1)))
        .service(Scripted::always(Step::After(
            Duration::from_secs(5),
            Box::new(status(200)),
        )));
    svc.oneshot(get("https://mail.test/")).await.unwrap_err();
    let spans = capture.spans();
    let attempts: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.name == "backstop.attempt")
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for attempt in attempts {
        assert_eq!(field(attempt, "error.type"), Some("transient"));
        assert_eq!(field(attempt, "http.response.status_code"), None);
        assert_eq!(field(attempt, "server.port"), Some("443"));
        assert!(attempt.closed);
    }
}

/// A hedged copy is an attempt span of its own, a resend under the call; the slow first
/// attempt's span closes when the copy's answer ends the call.
#[tokio::test(start_paused = true)]
async fn a_hedged_copy_is_an_attempt_span_of_its_own() {
    let _serial = SERIAL.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .hedge(Duration::from_millis(100), 1)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(Scripted::new(
            [Step::After(Duration::from_secs(1), Box::new(status(200)))],
            status(503),
        ));
    // The copy fails at once with a 503, set aside; the first attempt answers at 1 s.
    svc.oneshot(get("http://mail.test/")).await.unwrap();
    let spans = capture.spans();
    let attempts: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.name == "backstop.attempt")
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let (first, copy) = (attempts[0], attempts[1]);
    assert_eq!(field(first, "attempt"), Some("1"));
    assert_eq!(field(first, "http.response.status_code"), Some("200"));
    assert_eq!(field(copy, "attempt"), Some("2"));
    assert_eq!(copy.parent.as_deref(), Some("backstop.call"));
    assert_eq!(field(copy, "http.request.resend_count"), Some("1"));
    assert_eq!(field(copy, "error.type"), Some("503"));
    assert_eq!(field(copy, "otel.status_code"), Some("ERROR"));
    assert!(first.closed && copy.closed);
    assert_eq!(field(&spans[0], "attempts"), Some("2"));
}

/// The inner service is called inside the attempt's span, the first attempt's too, so that what
/// the client logs or spans while it starts the request belongs to the attempt.
#[tokio::test(start_paused = true)]
async fn the_inner_call_is_made_inside_the_attempts_span() {
    let _serial = SERIAL.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let current = Arc::new(Mutex::new(Vec::new()));
    let seen = current.clone();
    let upstream = tower::service_fn(move |_: http::Request<String>| {
        let span = tracing::Span::current();
        seen.lock().unwrap().push(span.metadata().map(|m| m.name()));
        let n = seen.lock().unwrap().len();
        async move {
            let mut response = http::Response::new(());
            if n == 1 {
                *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, tower_backstop::BoxError>(response)
        }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(upstream);
    svc.oneshot(get("http://mail.test/")).await.unwrap();
    assert_eq!(
        *current.lock().unwrap(),
        [Some("backstop.attempt"), Some("backstop.attempt")]
    );
}

/// Against a real server: the spans of a call through hyper-util's client, the attempts
/// children of the call, the server's 503 then 200 on them.
#[tokio::test]
async fn a_real_call_has_its_attempts_as_child_spans() {
    use std::sync::atomic::{AtomicU32, Ordering};

    let hits = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/send",
        axum::routing::get(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let _serial = SERIAL.lock().await;
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::new().backoff(no_jitter(10)).build().unwrap())
        .layer(ClassifyLayer::http())
        .service(client);
    let request = http::Request::get(format!("http://{addr}/send"))
        .body(http_body_util::Full::default())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    let spans = capture.spans();
    let attempts: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.name == "backstop.attempt")
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    assert_eq!(
        attempts
            .iter()
            .map(|a| field(a, "http.response.status_code"))
            .collect::<Vec<_>>(),
        [Some("503"), Some("200")]
    );
    assert!(
        attempts
            .iter()
            .all(|a| a.parent.as_deref() == Some("backstop.call"))
    );
    let port = addr.port().to_string();
    assert_eq!(field(attempts[1], "server.address"), Some("127.0.0.1"));
    assert_eq!(field(attempts[1], "server.port"), Some(port.as_str()));
    assert_eq!(field(attempts[1], "http.request.resend_count"), Some("1"));
}
