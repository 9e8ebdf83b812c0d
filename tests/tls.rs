//! TLS errors are configuration errors, not refused connections: a certificate the client does
//! not trust, or an `https://` URL on a plain-HTTP port, is permanent ([`Code::Tls`]), never
//! retried, with the cause in the source chain; a refused connection stays transient. A real
//! rustls server on 127.0.0.1 with a certificate generated in the test (rcgen), and reqwest's
//! rustls client.
#![cfg(feature = "reqwest")]

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::classify::{ClassifyLayer, classify_error};
use tower_backstop::retry::{Attempts, Backoff, GiveUp, RetryPolicy};
use tower_backstop::{Class, Code, Failure, Sent};

/// A TLS server for `localhost` whose certificate is self-signed (generated here), answering
/// `200 ok` over HTTP/1.1. Returns its address, the connections it accepted, and the
/// certificate (to trust it in the control case).
async fn tls_server() -> (
    SocketAddr,
    Arc<AtomicU32>,
    pki_types::CertificateDer<'static>,
) {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = generated.cert.der().clone();
    let key = pki_types::PrivateKeyDer::Pkcs8(pki_types::PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)
    .unwrap();
    let (addr, accepted) = serve(Some(TlsAcceptor::from(Arc::new(config)))).await;
    (addr, accepted, cert)
}

/// A plain-HTTP server (no TLS) that counts its connections.
async fn plain_server() -> (SocketAddr, Arc<AtomicU32>) {
    serve(None).await
}

/// An HTTP/1.1 server on 127.0.0.1 answering `200 ok` behind `tls` (or in the clear), counting
/// the connections it accepted.
async fn serve(tls: Option<TlsAcceptor>) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU32::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                    ))
                });
                let http1 = hyper::server::conn::http1::Builder::new();
                match tls {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(tcp).await {
                            let _ = http1.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                    None => {
                        let _ = http1.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// reqwest's rustls client (no system roots: the generated certificate is trusted only when
/// `trust` gives it) under classification and five attempts.
fn stack(
    trust: Option<&pki_types::CertificateDer<'static>>,
) -> impl Service<reqwest::Request, Response = reqwest::Response, Error = Failure<reqwest::Response>>
+ Clone {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .resolve("localhost", "127.0.0.1:0".parse().unwrap());
    if let Some(cert) = trust {
        builder = builder.add_root_certificate(reqwest::Certificate::from_der(cert).unwrap());
    }
    let client = builder.build().unwrap();
    ServiceBuilder::new()
        .layer(
            RetryPolicy::new()
                .max_attempts(5)
                .backoff(Backoff::constant(Duration::from_millis(1)))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::http())
        .service(client)
}

fn get(url: &str) -> reqwest::Request {
    reqwest::Request::new(http::Method::GET, url.parse().unwrap())
}

/// The source chain's messages, outermost first.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut current = error.source();
    while let Some(e) = current {
        parts.push(e.to_string());
        current = e.source();
    }
    parts.join(": ")
}

#[tokio::test]
async fn a_self_signed_certificate_is_permanent_and_tried_once() {
    let (addr, accepted, cert) = tls_server().await;
    let url = format!("https://localhost:{}/", addr.port());

    // The control: trusting the certificate, the same server answers.
    let response = stack(Some(&cert)).oneshot(get(&url)).await.unwrap();
    assert_eq!(response.text().await.unwrap(), "ok");
    assert_eq!(accepted.swap(0, Ordering::SeqCst), 1);

    let failure = stack(None).oneshot(get(&url)).await.unwrap_err();
    assert_eq!(failure.class(), Class::PERMANENT);
    assert_eq!(failure.code(), Code::Tls);
    assert_eq!(failure.sent(), Sent::No);
    let attempts = failure.notes().get::<Attempts>().expect("attempts note");
    assert_eq!(attempts.count(), 1);
    assert_eq!(attempts.give_up(), GiveUp::NotRetryable);
    // The cause is in the chain: rustls's own words.
    let text = chain(&failure);
    assert!(text.contains("certificate"), "{text}");
    // One handshake, not five.
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_https_url_on_a_plain_http_port_is_permanent_and_tried_once() {
    let (addr, accepted) = plain_server().await;
    let url = format!("https://localhost:{}/", addr.port());
    let failure = stack(None).oneshot(get(&url)).await.unwrap_err();
    assert_eq!(failure.class(), Class::PERMANENT, "{}", chain(&failure));
    assert_eq!(failure.code(), Code::Tls);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // The same port over http:// answers: the port was never the problem.
    let response = stack(None)
        .oneshot(get(&format!("http://localhost:{}/", addr.port())))
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "ok");
}

#[tokio::test]
async fn a_refused_connection_stays_transient_and_is_retried() {
    // A port with nothing listening: bind, read the port, close.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let failure = stack(None)
        .oneshot(get(&format!("https://localhost:{port}/")))
        .await
        .unwrap_err();
    assert_eq!(failure.class(), Class::TRANSIENT);
    assert_eq!(
        failure.code(),
        Code::Io(std::io::ErrorKind::ConnectionRefused)
    );
    let attempts = failure.notes().get::<Attempts>().unwrap();
    assert_eq!(attempts.count(), 5);
}

/// An error that only wraps another, as a user's or a library's error type does.
#[derive(Debug)]
struct Wrapped(&'static str, Box<dyn StdError + Send + Sync>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl StdError for Wrapped {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.1)
    }
}

#[tokio::test]
async fn a_tls_error_wrapped_in_several_layers_of_source_is_still_tls() {
    let (addr, _accepted, _cert) = tls_server().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let error = client
        .execute(get(&format!("https://localhost:{}/", addr.port())))
        .await
        .unwrap_err();
    let wrapped = Wrapped(
        "outer",
        Box::new(Wrapped(
            "middle",
            Box::new(Wrapped("inner", Box::new(error))),
        )),
    );
    assert_eq!(classify_error(&wrapped), (Class::PERMANENT, Code::Tls));
    // Boxed, as tower's `Buffer` or a user's `?` leaves it: classified the same.
    let failure: Failure = Failure::from(tower_backstop::BoxError::from(wrapped));
    assert_eq!(
        (failure.class(), failure.code()),
        (Class::PERMANENT, Code::Tls)
    );
    // An io error of the same kind outside a connect error is not a TLS error.
    let plain = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad bytes in a file");
    assert_eq!(
        classify_error(&Wrapped("outer", Box::new(plain))),
        (Class::UNKNOWN, Code::Io(std::io::ErrorKind::InvalidData))
    );
}
