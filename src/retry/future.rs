use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::SystemTime;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::policy::{Decision, RetryEvent, RetryPolicy, Spare};
use crate::failure::{Failure, GiveUp};
use crate::request::Replay;

pin_project! {
    /// Response future of [`Retry`](super::Retry): a state machine of attempt, delay (a timer
    /// stored inline) and readiness, with its own attempt count per logical request.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        service: S,
        spare: Option<Req>,
        spare_state: Spare,
        attempts: u32,
        first_failed_at: Option<SystemTime>,
        last: Option<Failure<S::Response>>,
        policy: RetryPolicy,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called {
            #[pin]
            future: F,
        },
        Sleeping {
            #[pin]
            sleep: Sleep,
        },
        Readying,
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    pub(crate) fn new(
        future: S::Future,
        service: S,
        spare: Option<Req>,
        spare_state: Spare,
        policy: RetryPolicy,
    ) -> Self {
        ResponseFuture {
            state: State::Called { future },
            service,
            spare,
            spare_state,
            attempts: 1,
            first_failed_at: None,
            last: None,
            policy,
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
    Req: Replay,
{
    type Output = Result<S::Response, Failure<S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let mut failure = match ready!(future.poll(cx)) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err(e) => e.into(),
                    };
                    let attempts = *this.attempts;
                    this.first_failed_at.get_or_insert_with(SystemTime::now);
                    match this.policy.decide(&failure, attempts, *this.spare_state) {
                        Decision::Stop(reason) => {
                            tracing::info!(
                                attempts,
                                class = %failure.class(),
                                code = %failure.code(),
                                reason = reason.as_str(),
                                "giving up"
                            );
                            failure.note_attempts(attempts, *this.first_failed_at, reason);
                            return Poll::Ready(Err(failure));
                        }
                        Decision::Retry(delay, source) => {
                            let event = RetryEvent {
                                attempt: attempts,
                                class: failure.class(),
                                code: failure.code(),
                                delay,
                                source,
                            };
                            tracing::info!(
                                attempt = attempts,
                                class = %event.class,
                                code = %event.code,
                                delay = ?delay,
                                why = ?source,
                                "retrying"
                            );
                            this.policy.notify(&event);
                            *this.last = Some(failure);
                            this.state.set(State::Sleeping {
                                sleep: tokio::time::sleep(delay),
                            });
                        }
                    }
                }
                StateProj::Sleeping { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    if let Err(e) = ready!(this.service.poll_ready(cx)) {
                        let mut failure: Failure<S::Response> = e.into();
                        failure.note_attempts(
                            *this.attempts,
                            *this.first_failed_at,
                            GiveUp::NotReady,
                        );
                        return Poll::Ready(Err(failure));
                    }
                    let Some(request) = this.spare.take() else {
                        // decide() only retries with a spare; keep the last failure if not.
                        let mut failure = this
                            .last
                            .take()
                            .expect("retry future lost its last failure");
                        failure.note_attempts(
                            *this.attempts,
                            *this.first_failed_at,
                            GiveUp::NotReplayable,
                        );
                        return Poll::Ready(Err(failure));
                    };
                    *this.attempts += 1;
                    if *this.attempts < this.policy.attempts() {
                        match request.replay() {
                            Some(copy) => *this.spare = Some(copy),
                            None => *this.spare_state = Spare::NotReplayable,
                        }
                    }
                    *this.last = None;
                    let future = this.service.call(request);
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}
