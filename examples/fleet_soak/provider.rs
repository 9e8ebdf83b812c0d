//! The loopback provider: an axum server that commits each `Idempotency-Key` once, answers
//! `202 Accepted`, and can be taken down (its port then refuses connections) and brought back
//! on the same port.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tower::{BoxError, Service};

/// The header the schedulers' re-sends carry (added by the rebuild closure of each child), with
/// the index of the child that sent it.
pub const RESEND_HEADER: &str = "x-fleet-resend";

/// What the provider saw of one idempotency key.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// Side effects committed under the key: 1 is exactly once.
    pub effects: u32,
    /// Requests that arrived with the key and were answered `202`: each one a delivery, the
    /// first of which committed the key.
    pub requests: u32,
    /// When the key was committed.
    pub committed_at: Option<Instant>,
}

/// One re-send that reached the provider: when, from which child, and whether it committed the
/// key (`false`: the key was committed before, by the caller or another re-send).
#[derive(Clone, Copy, Debug)]
pub struct Resend {
    pub at: Instant,
    pub child: usize,
    pub committed: bool,
}

#[derive(Default)]
struct Ledger {
    keys: HashMap<String, Seen>,
    resends: Vec<Resend>,
    /// Requests without a key (answered 400; the children always send one).
    keyless: u64,
}

/// The provider's state, shared with the parent that reads it.
pub struct Provider {
    ledger: Mutex<Ledger>,
    up: watch::Sender<bool>,
    pub addr: SocketAddr,
}

impl Provider {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the provider saw of each key.
    pub fn keys(&self) -> HashMap<String, Seen> {
        self.ledger().keys.clone()
    }

    /// The re-sends that reached it, in arrival order.
    pub fn resends(&self) -> Vec<Resend> {
        self.ledger().resends.clone()
    }

    /// Requests without an idempotency key.
    pub fn keyless(&self) -> u64 {
        self.ledger().keyless
    }

    /// Takes the provider down (`false`): the listener is dropped, so its port refuses
    /// connections, and every open connection is closed; or brings it back (`true`) on the same
    /// port.
    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }
}

async fn accept(
    State(provider): State<Arc<Provider>>,
    headers: HeaderMap,
    _body: axum::body::Bytes,
) -> Response {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        provider.ledger().keyless += 1;
        return (StatusCode::BAD_REQUEST, "an Idempotency-Key is required").into_response();
    };
    let resend_by = headers
        .get(RESEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut ledger = provider.ledger();
    let seen = ledger.keys.entry(key.to_owned()).or_default();
    seen.requests += 1;
    let committed = seen.effects == 0;
    if committed {
        seen.effects = 1;
        seen.committed_at = Some(Instant::now());
    }
    if let Some(child) = resend_by {
        ledger.resends.push(Resend {
            at: Instant::now(),
            child,
            committed,
        });
    }
    StatusCode::ACCEPTED.into_response()
}

/// A port below the kernel's ephemeral range, so that no outgoing connection of the children
/// takes it as its local port while the provider is down and the port can be bound again.
async fn bind_fixed() -> Result<TcpListener, BoxError> {
    let start = std::process::id() % 10_000;
    for offset in 0..2_000u32 {
        let port = u16::try_from(20_000 + (start + offset * 7) % 10_000)?;
        if let Ok(listener) = bind(SocketAddr::from(([127, 0, 0, 1], port))) {
            return Ok(listener);
        }
    }
    Err("no free port between 20000 and 30000 on 127.0.0.1".into())
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    // Rebinding while the closed connections of the last run are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Starts the provider, up.
pub async fn start() -> Result<Arc<Provider>, BoxError> {
    let listener = bind_fixed().await?;
    let (up, _) = watch::channel(true);
    let provider = Arc::new(Provider {
        ledger: Mutex::default(),
        up,
        addr: listener.local_addr()?,
    });
    let router = Router::new()
        .route("/v1/messages", post(accept))
        .with_state(Arc::clone(&provider));
    tokio::spawn(serve(Arc::clone(&provider), listener, router));
    Ok(provider)
}

/// Accepts while up; while down, holds no listener and no connection.
async fn serve(provider: Arc<Provider>, mut listener: TcpListener, router: Router) {
    let mut up = provider.up.subscribe();
    loop {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        tokio::spawn(connection(stream, router.clone(), provider.up.subscribe()));
                    }
                }
                changed = up.wait_for(|up| !*up) => {
                    if changed.is_err() { return; }
                    break;
                }
            }
        }
        drop(listener);
        if up.wait_for(|up| *up).await.is_err() {
            return;
        }
        listener = loop {
            match bind(provider.addr) {
                Ok(listener) => break listener,
                Err(e) => {
                    eprintln!(
                        "provider: cannot bind {} again ({e}); retrying",
                        provider.addr
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        };
    }
}

/// Serves one connection until it ends or the provider goes down (then it is closed).
async fn connection(stream: tokio::net::TcpStream, router: Router, mut up: watch::Receiver<bool>) {
    let service = hyper::service::service_fn(move |req: http::Request<_>| {
        let mut router = router.clone();
        async move {
            let req = req.map(axum::body::Body::new);
            Ok::<_, Infallible>(router.call(req).await.into_response())
        }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = up.wait_for(|up| !*up) => {}
    }
}
