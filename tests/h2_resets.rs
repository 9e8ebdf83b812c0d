//! HTTP/2 stream resets and `GOAWAY`, read once by the classifier: `REFUSED_STREAM` and a
//! `GOAWAY` that did not cover the stream prove the request was not processed (retried even
//! without a key); any other reset after the request left is outcome-unknown. Real servers on
//! 127.0.0.1: the h2 crate's server, and for the uncovered `GOAWAY` a server that writes the
//! frames itself; real clients: hyper-util's HTTP/2 client and a generated tonic client.
#![cfg(all(feature = "http2", feature = "tonic"))]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::classify::{ClassifyLayer, GrpcClassifier};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::timeout::TimeoutLayer;
use tower_backstop::{BackstopLayer, Class, Code, Failure, GrpcLayer, Sent};

/// What the server does with one stream.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// `RST_STREAM(REFUSED_STREAM)` at once, before reading anything.
    Refuse,
    /// Reads the whole request body, then resets the stream with this reason.
    ResetAfterReading(Reason),
    /// Sends response headers (200, no end of stream), then resets with `CANCEL`.
    ResetAfterHeaders,
    /// `200` with body `ok`; for gRPC, a `SERVING` health answer with `grpc-status: 0`.
    Serve,
}

/// An h2 server: stream `n` (counted over all connections) gets `script[n]`, or the last entry
/// after the end. Returns its address and the streams it saw.
async fn h2_server(script: Vec<Answer>, grpc: bool) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicU32::new(0));
    let seen = streams.clone();
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (seen, script) = (seen.clone(), script.clone());
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((request, respond))) = conn.accept().await {
                    let n = seen.fetch_add(1, Ordering::SeqCst) as usize;
                    let answer = script[n.min(script.len() - 1)];
                    tokio::spawn(answer_stream(answer, request, respond, grpc));
                }
            });
        }
    });
    (addr, streams)
}

async fn answer_stream(
    answer: Answer,
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    grpc: bool,
) {
    match answer {
        Answer::Refuse => respond.send_reset(Reason::REFUSED_STREAM),
        Answer::ResetAfterReading(reason) => {
            let mut body = request.into_body();
            while let Some(Ok(chunk)) = body.data().await {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            respond.send_reset(reason);
        }
        Answer::ResetAfterHeaders => {
            let mut stream = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            stream.send_data(Bytes::from_static(b"par"), false).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            stream.send_reset(Reason::CANCEL);
        }
        Answer::Serve if grpc => {
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut stream = respond.send_response(head, false).unwrap();
            // One length-prefixed message: HealthCheckResponse { status: SERVING (1) }.
            let message = Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 0x01]);
            stream.send_data(message, false).unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            stream.send_trailers(trailers).unwrap();
        }
        Answer::Serve => {
            let mut stream = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            stream.send_data(Bytes::from_static(b"ok"), true).unwrap();
        }
    }
}

/// A server whose first connection answers the first stream with `GOAWAY(last_stream_id = 0)`,
/// a `GOAWAY` that covers no stream, written frame by frame; later connections are served by
/// h2 with `200 ok`. Returns its address and the connections it accepted.
async fn goaway_server() -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicU32::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = listener.accept().await.unwrap();
            if seen.fetch_add(1, Ordering::SeqCst) > 0 {
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(tcp).await.unwrap();
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        tokio::spawn(answer_stream(Answer::Serve, request, respond, false));
                    }
                });
                continue;
            }
            tokio::spawn(async move {
                let mut preface = [0u8; 24];
                tcp.read_exact(&mut preface).await.unwrap();
                // Our SETTINGS (empty), then read frames until the first HEADERS.
                tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
                loop {
                    let mut head = [0u8; 9];
                    tcp.read_exact(&mut head).await.unwrap();
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let mut payload = vec![0u8; len];
                    tcp.read_exact(&mut payload).await.unwrap();
                    match (head[3], head[4] & 1) {
                        // The client's SETTINGS: acknowledge it.
                        (4, 0) => tcp.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap(),
                        // HEADERS: GOAWAY, last stream id 0, NO_ERROR.
                        (1, _) => {
                            let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                            tcp.write_all(&goaway).await.unwrap();
                            break;
                        }
                        _ => {}
                    }
                }
                // Hold the connection until the client closes it.
                let mut rest = Vec::new();
                let _ = tcp.read_to_end(&mut rest).await;
            });
        }
    });
    (addr, connections)
}

type Body = Full<Bytes>;

/// hyper-util's HTTP/2 client under classification and retry (at most 3 attempts, 1 ms apart).
fn http_stack(
    attempts: u32,
) -> impl Service<
    http::Request<Body>,
    Response = http::Response<hyper::body::Incoming>,
    Error = Failure<http::Response<hyper::body::Incoming>>,
> + Clone {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Body>();
    ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(attempts)
                .backoff(Backoff::constant(Duration::from_millis(1)))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(client)
}

fn post(addr: SocketAddr, key: Option<&str>) -> http::Request<Body> {
    let mut builder = http::Request::post(format!("http://{addr}/send"));
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap()
}

fn attempts(failure: &Failure<impl Sized>) -> Attempts {
    *failure.notes().get::<Attempts>().expect("attempts note")
}

#[tokio::test]
async fn refused_stream_is_not_sent_so_a_keyless_post_is_retried() {
    let (addr, streams) = h2_server(vec![Answer::Refuse, Answer::Serve], false).await;
    let response = http_stack(3).oneshot(post(addr, None)).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    assert_eq!(streams.load(Ordering::SeqCst), 2);

    // Refused every time: transient, not sent, the reset reason kept.
    let (addr, streams) = h2_server(vec![Answer::Refuse], false).await;
    let failure = http_stack(3).oneshot(post(addr, None)).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::Reset(7));
    assert_eq!(failure.sent(), Sent::No);
    assert_eq!(failure.code().to_string(), "http2 reset REFUSED_STREAM (7)");
    assert_eq!(attempts(&failure).count(), 3);
    assert_eq!(attempts(&failure).give_up(), GiveUp::AttemptsExhausted);
    assert_eq!(streams.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_reset_after_the_request_left_is_outcome_unknown() {
    // A keyless POST: the server read it, then reset: not resent.
    let (addr, streams) = h2_server(
        vec![Answer::ResetAfterReading(Reason::CANCEL), Answer::Serve],
        false,
    )
    .await;
    let failure = http_stack(3).oneshot(post(addr, None)).await.unwrap_err();
    assert_eq!(failure.class(), Class::OUTCOME_UNKNOWN);
    assert_eq!(failure.code(), Code::Reset(8));
    assert_eq!(failure.sent(), Sent::Maybe);
    assert_eq!(attempts(&failure).give_up(), GiveUp::NotIdempotent);
    assert_eq!(streams.load(Ordering::SeqCst), 1);

    // With an idempotency key the same reset is retried, and the second attempt answers.
    let (addr, streams) = h2_server(
        vec![Answer::ResetAfterReading(Reason::CANCEL), Answer::Serve],
        false,
    )
    .await;
    let response = http_stack(3)
        .oneshot(post(addr, Some("order-7")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(streams.load(Ordering::SeqCst), 2);

    // INTERNAL_ERROR after reading: outcome unknown too, with its own reason.
    let (addr, _) = h2_server(
        vec![Answer::ResetAfterReading(Reason::INTERNAL_ERROR)],
        false,
    )
    .await;
    let failure = http_stack(3).oneshot(post(addr, None)).await.unwrap_err();
    assert_eq!(failure.code(), Code::Reset(2));
    assert_eq!(failure.sent(), Sent::Maybe);
}

#[tokio::test]
async fn a_goaway_that_did_not_cover_the_stream_is_not_sent() {
    let (addr, connections) = goaway_server().await;
    // A keyless POST: the server said it did not process it, so it goes again, on a new
    // connection.
    let response = http_stack(3).oneshot(post(addr, None)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(connections.load(Ordering::SeqCst), 2);

    let (addr, _) = goaway_server().await;
    let failure = http_stack(1).oneshot(post(addr, None)).await.unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(failure.code(), Code::GoAway(0));
    assert_eq!(failure.sent(), Sent::No);
}

#[tokio::test]
async fn a_reset_on_a_stream_that_already_has_a_response_reaches_the_body_reader() {
    // The response came: the call succeeded, once; the reset is the body's error, for the
    // caller reading it. Nothing panics, nothing is resent.
    let (addr, streams) = h2_server(vec![Answer::ResetAfterHeaders], false).await;
    let response = http_stack(3).oneshot(post(addr, Some("k"))).await.unwrap();
    assert_eq!(response.status(), 200);
    let error = response.into_body().collect().await.unwrap_err();
    let (class, code) = tower_backstop::classify::classify_error(&error);
    assert_eq!((class, code), (Class::TRANSIENT, Code::Reset(8)));
    assert_eq!(streams.load(Ordering::SeqCst), 1);
}

fn health_client(
    addr: SocketAddr,
) -> HealthClient<
    tower_backstop::Grpc<
        tower_backstop::Backstop<
            tonic::transport::Channel,
            GrpcClassifier,
            tower_backstop::breaker::BreakerLayer,
        >,
    >,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(
            BackstopLayer::grpc(Duration::from_secs(2)).retry(
                RetryPolicy::grpc()
                    .backoff(Backoff::constant(Duration::from_millis(1)))
                    .build()
                    .unwrap(),
            ),
        )
        .service(channel);
    HealthClient::new(stack)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn under_tonic_a_refused_stream_is_retried_then_unavailable_with_the_failure() {
    let (addr, streams) = h2_server(vec![Answer::Refuse, Answer::Serve], true).await;
    let answer = health_client(addr).check(check()).await.unwrap();
    assert_eq!(answer.into_inner().status(), ServingStatus::Serving);
    assert_eq!(streams.load(Ordering::SeqCst), 2);

    let (addr, streams) = h2_server(vec![Answer::Refuse], true).await;
    let status = health_client(addr).check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let failure = GrpcLayer::failure(&status).expect("the failure behind the status");
    assert_eq!(failure.code(), Code::Reset(7));
    assert_eq!(failure.sent(), Sent::No);
    assert_eq!(attempts(failure).count(), 5);
    assert_eq!(attempts(failure).give_up(), GiveUp::AttemptsExhausted);
    assert_eq!(streams.load(Ordering::SeqCst), 5);

    // A reset after the server read the call: UNAVAILABLE too, with the reason kept.
    let (addr, _) = h2_server(vec![Answer::ResetAfterReading(Reason::CANCEL)], true).await;
    let status = health_client(addr).check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(GrpcLayer::failure(&status).unwrap().code(), Code::Reset(8));
}

#[tokio::test]
async fn under_tonic_a_timeout_of_ours_is_deadline_exceeded_with_the_failure() {
    // A server that never answers: the per-attempt timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(tcp).await.unwrap();
        let mut held = Vec::new();
        while let Some(Ok(stream)) = conn.accept().await {
            held.push(stream);
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(GrpcLayer::new())
        .layer(RetryPolicy::grpc().max_attempts(1).build().unwrap())
        .layer(ClassifyLayer::new(GrpcClassifier::new()))
        .layer(TimeoutLayer::new(Duration::from_millis(50)))
        .service(channel);
    let status = HealthClient::new(stack).check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    let failure = GrpcLayer::failure(&status).unwrap();
    assert_eq!(failure.code(), Code::Timeout);
    assert_eq!(attempts(failure).count(), 1);
}
