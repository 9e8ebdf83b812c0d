//! Layer order checks, made once when a layer wraps its inner service (never per call): a wrong
//! order that the compiler cannot reject is reported as a `tracing` warning that names the
//! misplaced or missing layer and the fix.
//!
//! The checks read the inner service's type name (`std::any::type_name`), so they see every
//! layer of this crate below the one being built, up to a layer that erases its inner type
//! (tower's `Buffer`, `BoxService`): past such a layer nothing is reported.

/// The layers whose place is checked.
// `DeadLetter` and `Resend` are built only with the dead-letter layer (feature `dead-letter`).
#[cfg_attr(not(feature = "dead-letter"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    DeadLetter,
    Retry,
    Breaker,
    Classify,
    /// `ReplayBufferLayer`: useful only above a layer that copies requests.
    ReplayBuffer,
    /// `BufferResponseLayer`: useful only below the classifier.
    BufferResponse,
    /// The service a `Scheduler` or a `Redrive` re-sends records through.
    Resend,
}

const DEAD_LETTER: &str = "tower_backstop::dead_letter::DeadLetter<";
const RETRY: &str = "tower_backstop::retry::Retry<";
const BREAKER: &str = "tower_backstop::breaker::Breaker<";
const CLASSIFY: &str = "tower_backstop::classify::Classify<";
/// The preset's dead-letter and retry layers in one service.
const DEAD_LETTER_RETRY: &str = "tower_backstop::dead_letter::with_retry::DeadLetterRetry<";
/// The preset's service: the retry, breaker, classify and timeout layers, and maybe a
/// dead-letter layer (its type does not say).
const PRESET: &str = "tower_backstop::preset::Backstop<";

/// Clients whose responses need a classifier to become failures (a 503 is an `Ok` response).
const CLIENTS: [&str; 3] = [
    "hyper_util::client::legacy::client::Client<",
    "reqwest::async_impl::client::Client",
    "tonic::transport::channel::Channel",
];

/// What is wrong with placing `role` directly above a service of type `inner`, if anything.
pub(crate) fn problem(role: Role, inner: &str) -> Option<&'static str> {
    let below = |layer: &str| inner.contains(layer);
    let client_without_classifier =
        CLIENTS.iter().any(|client| below(client)) && !below(CLASSIFY) && !below(PRESET);
    let retry_below = below(RETRY) || below(DEAD_LETTER_RETRY) || below(PRESET);
    let breaker_below = below(BREAKER) || below(PRESET);
    let dead_letter_below = below(DEAD_LETTER) || below(DEAD_LETTER_RETRY);
    match role {
        Role::ReplayBuffer if !retry_below && !dead_letter_below => Some(
            "ReplayBufferLayer has no RetryLayer or DeadLetterLayer below it, so the bodies it \
             buffers are never sent again or recorded: put it directly above RetryLayer (or \
             above the stack BackstopLayer builds)",
        ),
        Role::BufferResponse if below(CLASSIFY) || below(PRESET) => Some(
            "BufferResponseLayer is above ClassifyLayer, which has classified the response before \
             its body was read: put BufferResponseLayer directly below ClassifyLayer",
        ),
        Role::Classify if retry_below || breaker_below || dead_letter_below => Some(
            "ClassifyLayer is above RetryLayer, BreakerLayer or DeadLetterLayer, which then see \
             error responses as successes: put ClassifyLayer directly above TimeoutLayer, below \
             the others (or build the stack with BackstopLayer)",
        ),
        Role::Retry | Role::Breaker if dead_letter_below => Some(
            "DeadLetterLayer is below RetryLayer or BreakerLayer, so every failed attempt becomes \
             a dead letter, even for a request that then succeeds: put DeadLetterLayer outermost \
             (or build the stack with BackstopLayer)",
        ),
        Role::Resend if client_without_classifier => Some(
            "the service records are re-sent through has no ClassifyLayer, so an error response \
             (a 503, a gRPC UNAVAILABLE) counts as delivered and the record is marked resolved: \
             re-send through the same stack the calls go through (or one built with \
             BackstopLayer)",
        ),
        Role::DeadLetter | Role::Retry | Role::Breaker if client_without_classifier => Some(
            "no ClassifyLayer below this layer, so an error response (a 503, a gRPC UNAVAILABLE) \
             is returned as a success and never retried, counted or dead-lettered: add \
             ClassifyLayer directly above TimeoutLayer (or build the stack with BackstopLayer)",
        ),
        _ => None,
    }
}

/// Warns once, when the layer is built, if `role` above `S` is a wrong order.
#[inline]
pub(crate) fn check<S>(role: Role) {
    let inner = std::any::type_name::<S>();
    if let Some(problem) = problem(role, inner) {
        tracing::warn!(layer = ?role, inner, "layer order: {problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_order_is_quiet_and_each_wrong_one_is_named() {
        let timeout =
            "tower_backstop::timeout::Timeout<hyper_util::client::legacy::client::Client<C, B>>";
        let classify =
            format!("{CLASSIFY}{timeout}, tower_backstop::classify::http::HttpClassifier>");
        let breaker = format!("{BREAKER}{classify}>");
        let retry = format!("{RETRY}{breaker}>");
        assert_eq!(problem(Role::Classify, timeout), None);
        assert_eq!(problem(Role::Breaker, &classify), None);
        assert_eq!(problem(Role::Retry, &breaker), None);
        assert_eq!(problem(Role::DeadLetter, &retry), None);
        assert_eq!(problem(Role::Resend, &retry), None);
        assert!(
            problem(Role::Resend, timeout)
                .unwrap()
                .starts_with("the service records are re-sent through has no ClassifyLayer")
        );
        // A plain service with no known client: nothing to say.
        assert_eq!(
            problem(Role::Retry, "tower::util::service_fn::ServiceFn<F>"),
            None
        );

        assert!(
            problem(Role::Classify, &retry)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
        let dead_letter = format!("{DEAD_LETTER}{classify}>");
        assert!(
            problem(Role::Retry, &dead_letter)
                .unwrap()
                .starts_with("DeadLetterLayer is below")
        );
        assert!(
            problem(Role::Retry, timeout)
                .unwrap()
                .starts_with("no ClassifyLayer")
        );
        assert!(problem(Role::DeadLetter, "reqwest::async_impl::client::Client").is_some());
        // The preset's service classifies, retries and breaks: a scheduler over it is quiet, a
        // classifier above it is not.
        let preset = format!(
            "{PRESET}hyper_util::client::legacy::client::Client<C, B>, \
             tower_backstop::classify::http::HttpClassifier>"
        );
        assert_eq!(problem(Role::Resend, &preset), None);
        // A replay buffer is quiet above a layer that copies requests, named above anything else.
        assert_eq!(problem(Role::ReplayBuffer, &preset), None);
        assert_eq!(problem(Role::ReplayBuffer, &retry), None);
        assert_eq!(problem(Role::ReplayBuffer, &dead_letter), None);
        assert_eq!(problem(Role::BufferResponse, timeout), None);
        assert!(
            problem(Role::BufferResponse, &classify)
                .unwrap()
                .starts_with("BufferResponseLayer is above ClassifyLayer")
        );
        assert!(
            problem(Role::ReplayBuffer, &classify)
                .unwrap()
                .starts_with("ReplayBufferLayer has no RetryLayer")
        );
        assert_eq!(problem(Role::DeadLetter, &preset), None);
        assert!(problem(Role::Classify, &preset).is_some());

        // The combined dead-letter and retry layer, and the keyed breaker, are seen too.
        let keyed = format!(
            "{BREAKER}{classify}, tower_backstop::breaker::keyed::PerKey<\
             tower_backstop::breaker::keyed::Authority>>"
        );
        // The keyed breaker's real type name is the one breaker's, with a key type.
        assert!(
            std::any::type_name::<crate::breaker::Breaker<(), crate::breaker::PerKey>>()
                .starts_with(BREAKER)
        );
        assert_eq!(problem(Role::Retry, &keyed), None);
        let combined = format!("{DEAD_LETTER_RETRY}{keyed}>");
        assert!(
            problem(Role::Classify, &combined)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
        assert!(
            problem(Role::Breaker, &combined)
                .unwrap()
                .starts_with("DeadLetterLayer is below")
        );
        assert!(
            problem(Role::Classify, &keyed)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
    }
}
