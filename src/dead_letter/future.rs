use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::layer::Config;
use super::record::record_at;
use crate::failure::{DeadLetterStatus, Failure};
use crate::request::{Describe, Envelope};
use crate::store::{BoxFuture, Record, StoreError};

pin_project! {
    /// Response future of [`DeadLetter`](super::DeadLetter): the inner call, then, on failure,
    /// the one store write that failure needs.
    pub struct ResponseFuture<F, Req, R> {
        #[pin]
        state: State<F, R>,
        kept: Kept<Req>,
        config: Arc<Config>,
    }
}

/// What the dead-letter layer keeps of a request while it is sent.
pub(crate) enum Kept<Req> {
    /// Its own copy.
    Copy(Req),
    /// Nothing yet: the retry layer below hands its unsent copy up with the failure.
    HandedBack,
    /// No copy could be made (a streaming body): only the record id the request names
    /// ([`Describe::message_id`]), taken before the call so that the record keeps it.
    Uncopyable(Option<String>),
}

impl<Req: Describe> Kept<Req> {
    /// `copy` of `req` if there is one, else what the record can still keep of it.
    #[inline]
    pub(crate) fn of(req: &Req, copy: Option<Req>) -> Self {
        match copy {
            Some(copy) => Kept::Copy(copy),
            None => Kept::Uncopyable(req.message_id().map(str::to_owned)),
        }
    }
}

type Write = BoxFuture<'static, (String, Result<(), StoreError>)>;

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Called {
            #[pin]
            future: F,
        },
        Writing {
            write: Write,
            failure: Option<Failure<R>>,
        },
    }
}

impl<F, Req, R> ResponseFuture<F, Req, R> {
    pub(crate) fn new(future: F, kept: Kept<Req>, config: Arc<Config>) -> Self {
        ResponseFuture {
            state: State::Called { future },
            kept,
            config,
        }
    }
}

fn generated_id() -> String {
    format!("msg-{:032x}", rand::random::<u128>())
}

impl<F, Req, R, E> Future for ResponseFuture<F, Req, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
    Req: Describe + Send + 'static,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let mut failure: Failure<R> = match ready!(future.poll(cx)) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err(e) => e.into(),
                    };
                    // Our own copy, or the retry layer's unsent one (`RetryLayer::dead_letters`).
                    let (kept, id) = match std::mem::replace(this.kept, Kept::HandedBack) {
                        Kept::Copy(copy) => (Some(copy), None),
                        Kept::HandedBack => (failure.take_request::<Req>(), None),
                        Kept::Uncopyable(id) => (None, id),
                    };
                    let config = this.config.clone();
                    // Everything the record needs from the failure, taken now: the failure
                    // itself goes back to the caller.
                    let draft = record_at(
                        String::new(),
                        Envelope::default(),
                        &failure,
                        this.config.clock.now(),
                    );
                    let write: Write = Box::pin(async move {
                        let mut envelope = match kept {
                            Some(request) => request.describe().await,
                            None => {
                                let mut envelope = Envelope::default().with_metadata(
                                    "payload_missing",
                                    "the request could not be copied before the call",
                                );
                                envelope.id = id;
                                envelope
                            }
                        };
                        if let Some(tags) = &config.tags {
                            envelope.tags.extend(tags(&envelope));
                        }
                        let id = envelope.id.clone().unwrap_or_else(generated_id);
                        let (headers, redacted_headers) = config.redact.split(envelope.headers);
                        let mut record = Record {
                            headers,
                            redacted_headers,
                            id: id.clone(),
                            payload_len: envelope.payload.len() as u64,
                            payload: envelope.payload.to_vec(),
                            content_type: envelope.content_type,
                            metadata: envelope.metadata,
                            tags: envelope.tags,
                            ..draft
                        };
                        record.truncate_payload(config.payload_limit);
                        (id, config.store.put(record).await)
                    });
                    this.state.set(State::Writing {
                        write,
                        failure: Some(failure),
                    });
                }
                StateProj::Writing { write, failure } => {
                    let (id, result) = ready!(write.as_mut().poll(cx));
                    let mut failure = failure
                        .take()
                        .expect("dead-letter future polled after completion");
                    match result {
                        Ok(()) if failure.is_deferred() => {
                            // Kept for the scheduler's re-send: expected, not a dead letter.
                            tracing::info!(
                                id = %id,
                                class = %failure.class(),
                                code = %failure.code(),
                                attempts = failure.attempts(),
                                retry_at = ?failure.retry_at(),
                                "deferred request stored for a re-send"
                            );
                            failure.note_dead_letter(DeadLetterStatus::Stored { id });
                        }
                        Ok(()) => {
                            tracing::warn!(
                                id = %id,
                                class = %failure.class(),
                                code = %failure.code(),
                                attempts = failure.attempts().max(1),
                                "dead letter stored"
                            );
                            failure.note_dead_letter(DeadLetterStatus::Stored { id });
                        }
                        Err(error) => {
                            tracing::error!(
                                id = %id,
                                class = %failure.class(),
                                code = %failure.code(),
                                error = %error,
                                "dead letter could not be written"
                            );
                            failure.note_dead_letter(DeadLetterStatus::NotStored {
                                id,
                                error: Box::new(error),
                            });
                        }
                    }
                    return Poll::Ready(Err(failure));
                }
            }
        }
    }
}
