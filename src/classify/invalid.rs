//! [`Invalid`]: the error of a request that failed your validation, which is poison.

use std::fmt;

/// The error for a request that failed validation before it was sent (a missing field, a
/// malformed recipient, a template that does not render), with the reason.
///
/// [`classify_error`](super::classify_error), and so `Failure::from(BoxError)`, makes it a
/// [`Class::POISON`](crate::Class::POISON) failure with [`Code::Error`](crate::Code::Error) and
/// this error as its source: it is never retried (it would fail the same way every time), and a
/// [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) above records it once, with the
/// reason in the record's message.
///
/// Validate with tower's own `filter` (cargo feature `filter` of `tower`), below the retry
/// layer: a rejected request never reaches the services below it.
///
/// ```
/// use tower::filter::FilterLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_backstop::classify::Invalid;
/// use tower_backstop::dead_letter::DeadLetterLayer;
/// use tower_backstop::retry::RetryLayer;
/// use tower_backstop::store::{MemoryStore, Store};
/// use tower_backstop::{BoxError, Class};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let svc = ServiceBuilder::new()
///     .layer(DeadLetterLayer::new(store.clone()))
///     .layer(RetryLayer::default())
///     .layer(FilterLayer::new(|job: String| {
///         if job.contains('@') { Ok(job) } else { Err(Invalid::new("invalid recipient email")) }
///     }))
///     .service(service_fn(|_: String| async { Ok::<_, BoxError>(()) }));
/// let failure = svc.oneshot("nobody".to_owned()).await.unwrap_err();
/// assert_eq!(failure.class(), Class::POISON);
/// assert_eq!(
///     store.list(10).await.unwrap()[0].message,
///     "invalid request, not sent: invalid recipient email"
/// );
/// # }
/// ```
#[derive(Debug)]
pub struct Invalid {
    reason: String,
}

impl Invalid {
    /// A request rejected for `reason` (lower case, no final period).
    pub fn new(reason: impl Into<String>) -> Self {
        Invalid {
            reason: reason.into(),
        }
    }

    /// The validator's reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid request, not sent: {}", self.reason)
    }
}

impl std::error::Error for Invalid {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{BoxError, Class, Code, Failure};

    #[test]
    fn an_invalid_request_is_poison_with_its_reason() {
        let (class, code) = super::super::classify_error(&Invalid::new("no recipient"));
        assert_eq!((class, code), (Class::POISON, Code::Error));
        let failure: Failure = Failure::from(BoxError::from(Invalid::new("no recipient")));
        assert_eq!(failure.class(), Class::POISON);
        assert_eq!(failure.message(), "invalid request, not sent: no recipient");
    }
}
