//! A durable attempt budget per message id, kept in the dead-letter store.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::failure::{Class, Code, Failure};
use crate::request::Describe;
use crate::store::{BoxFuture, Store, StoreError};

/// Refuses a message whose whole attempt budget was spent in earlier runs, without calling the
/// inner service: the message is poison.
///
/// For queue consumers, where the same message comes back after a crash or a restart. Put it
/// right inside a [`DeadLetterLayer`](super::DeadLetterLayer) over the same store, and around the
/// retry layer:
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_backstop::dead_letter::{AttemptBudgetLayer, DeadLetterLayer};
/// use tower_backstop::store::MemoryStore;
/// use tower_backstop::retry::{RetryLayer, RetryPolicy};
///
/// let store = MemoryStore::new();
/// let stack = ServiceBuilder::new()
///     .layer(DeadLetterLayer::new(store.clone()))
///     .layer(AttemptBudgetLayer::new(store, 5))
///     .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)));
/// # let _ = stack;
/// ```
///
/// The count lives in the store, in the dead-letter record of the message id
/// ([`Record::budget_spent`](crate::store::Record::budget_spent)): the dead-letter layer adds each final failure's attempts to it in
/// the same transaction as the rest of the record, so it survives restarts. Before each call whose
/// id is known ([`Describe::message_id`]: the `Idempotency-Key`, or a
/// [`MessageId`](crate::MessageId)), this layer reads the record; when `budget_spent` has reached
/// the budget, the call fails at once with class [`Class::POISON`] and code
/// [`Code::AttemptBudgetSpent`], and the dead-letter layer above records it (adding no attempt). A
/// re-drive on purpose sets the count back to zero.
///
/// This costs one store read per call with an id, success or not, so use it where a message may
/// come back across restarts; requests without an id pass straight through. When the store cannot
/// be read, the call goes through and a `tracing` warning says so: the guard fails open.
#[derive(Clone)]
pub struct AttemptBudgetLayer {
    store: Arc<dyn Store>,
    budget: u32,
}

impl AttemptBudgetLayer {
    /// A budget of `attempts` per message id (the first call included), across restarts,
    /// counted in `store`. A budget of 0 is taken as 1.
    pub fn new(store: impl Store, attempts: u32) -> Self {
        AttemptBudgetLayer::from_arc(Arc::new(store), attempts)
    }

    /// The same, over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>, attempts: u32) -> Self {
        AttemptBudgetLayer {
            store,
            budget: attempts.max(1),
        }
    }
}

impl fmt::Debug for AttemptBudgetLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptBudgetLayer")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for AttemptBudgetLayer {
    type Service = AttemptBudget<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AttemptBudget {
            inner,
            store: Arc::clone(&self.store),
            budget: self.budget,
        }
    }
}

/// The service of [`AttemptBudgetLayer`].
#[derive(Clone)]
pub struct AttemptBudget<S> {
    inner: S,
    store: Arc<dyn Store>,
    budget: u32,
}

impl<S: fmt::Debug> fmt::Debug for AttemptBudget<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptBudget")
            .field("inner", &self.inner)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// The message's attempt budget is spent.
#[derive(Debug)]
pub struct BudgetSpent {
    id: String,
    spent: u32,
    budget: u32,
}

impl fmt::Display for BudgetSpent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} already used {} of its {} attempts in earlier runs; not sent again",
            self.id, self.spent, self.budget
        )
    }
}

impl std::error::Error for BudgetSpent {}

impl<S, Req> Service<Req> for AttemptBudget<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<Failure<S::Response>>,
    Req: Describe,
{
    type Response = S::Response;
    type Error = Failure<S::Response>;
    type Future = BudgetFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(id) = req.message_id().map(str::to_owned) else {
            return BudgetFuture {
                state: BudgetState::Called {
                    future: self.inner.call(req),
                },
            };
        };
        // Take the service that is ready, leave a clone.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        BudgetFuture {
            state: BudgetState::Checking {
                check: self.store.budget_spent(&id),
                request: Some(req),
                service: Some(service),
                id,
                budget: self.budget,
            },
        }
    }
}

pin_project! {
    /// Response future of [`AttemptBudget`]: the store read, then the inner call.
    pub struct BudgetFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: BudgetState<S, Req>,
    }
}

pin_project! {
    #[project = BudgetProj]
    enum BudgetState<S, Req>
    where
        S: Service<Req>,
    {
        Checking {
            check: BoxFuture<'static, Result<Option<u32>, StoreError>>,
            request: Option<Req>,
            service: Option<S>,
            id: String,
            budget: u32,
        },
        Called {
            #[pin]
            future: S::Future,
        },
    }
}

impl<S, Req> fmt::Debug for BudgetFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetFuture").finish_non_exhaustive()
    }
}

impl<S, Req> Future for BudgetFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<Failure<S::Response>>,
{
    type Output = Result<S::Response, Failure<S::Response>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                BudgetProj::Checking {
                    check,
                    request,
                    service,
                    id,
                    budget,
                } => {
                    let spent = match ready!(check.as_mut().poll(cx)) {
                        Ok(spent) => spent.unwrap_or(0),
                        Err(error) => {
                            tracing::warn!(
                                id = %id,
                                error = %error,
                                "attempt budget not checked: the dead-letter store cannot be read"
                            );
                            0
                        }
                    };
                    if spent >= *budget {
                        tracing::error!(
                            id = %id,
                            spent,
                            budget = *budget,
                            class = %Class::POISON,
                            "poison message: attempt budget spent in earlier runs"
                        );
                        let failure = Failure::new(Class::POISON, Code::AttemptBudgetSpent)
                            .with_source(BudgetSpent {
                                id: std::mem::take(id),
                                spent,
                                budget: *budget,
                            });
                        return Poll::Ready(Err(failure));
                    }
                    let (Some(mut service), Some(request)) = (service.take(), request.take())
                    else {
                        panic!("attempt budget future polled after completion");
                    };
                    let future = service.call(request);
                    this.state.set(BudgetState::Called { future });
                }
                BudgetProj::Called { future } => {
                    return Poll::Ready(ready!(future.poll(cx)).map_err(Into::into));
                }
            }
        }
    }
}
