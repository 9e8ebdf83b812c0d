//! What the retry and dead-letter layers need from a request: a copy for the next attempt
//! ([`Replay`]) and a description for a dead-letter record ([`Describe`]); and the two layers
//! that read a body into memory on its way through, a request's ([`ReplayBufferLayer`], for a
//! body that cannot be copied as it is) and a response's ([`BufferResponseLayer`], for a
//! classifier that reads it).
//!
//! Both are implemented for `http::Request<B>` with a cloneable body (`Full<Bytes>`, `String`,
//! `Bytes`, `Vec<u8>`, `()`…) and for `String`, `&'static str`, `Bytes` and `Vec<u8>` requests.
//! Implement them for your own request type (a queue message, a command struct) to use the layers
//! around a non-HTTP service.

mod body;
mod buffer;
pub(crate) mod describe;
pub(crate) mod idempotency;
pub(crate) mod replay;

pub use self::body::BufferedBody;
pub(crate) use self::buffer::Trailers;
pub use self::buffer::{
    BufferResponse, BufferResponseFuture, BufferResponseLayer, ReplayBuffer, ReplayBufferFuture,
    ReplayBufferLayer,
};
pub use self::describe::{Describe, Envelope, MessageId};
pub use self::idempotency::{IDEMPOTENCY_KEY, new_idempotency_key};
#[cfg(feature = "reqwest")]
pub(crate) use self::replay::record_destination;
pub use self::replay::{Replay, TimeLeft};
