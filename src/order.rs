//! Layer order checks, made once when a layer wraps its inner service (never per call): a wrong
//! order that the compiler cannot reject is reported as a `tracing` warning that names the
//! misplaced or missing layer and the fix.
//!
//! The checks read the inner service's type name (`std::any::type_name`), so they see every
//! layer of this crate below the one being built, up to a layer that erases its inner type
//! (tower's `Buffer`, `BoxService`): past such a layer nothing is reported.
//!
//! What they look for is itself a type name, never a path written by hand: the name of the
//! real type (`Retry<()>`, `Breaker<()>`, …) cut after its `<`, read in the check. A layer
//! renamed or moved to another module changes both sides alike, so no rename can quietly turn a
//! check off. Each layer names its own service type, beside its definition, for the marker of
//! this module that stands for it ([`Named`] for [`Retry`], …): this module imports no layer
//! (every layer calls it), and a marker that loses its name does not compile. The clients
//! (hyper-util's `Client`, reqwest's `Client`, tonic's `Channel`) are named from their real
//! types under their features; without a feature this crate cannot name the type, so it looks
//! for the path that client crate gives it, and a test holds each such path against the real
//! type's name.

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

/// A layer's service, as the checks look for it below another layer: its type's name up to
/// and including the first `<` ([`named`]), given by the layer's own module.
pub(crate) trait Named {
    /// The service type's name, cut after its first `<`.
    fn name() -> &'static str;
}

/// Stands for `retry::Retry`.
pub(crate) struct Retry;
/// Stands for `breaker::Breaker`, one breaker or keyed.
pub(crate) struct Breaker;
/// Stands for `classify::Classify`.
pub(crate) struct Classify;
/// Stands for `dead_letter::DeadLetter`.
#[cfg(feature = "dead-letter")]
pub(crate) struct DeadLetter;
/// Stands for the preset's dead-letter and retry layers in one service.
#[cfg(feature = "dead-letter")]
pub(crate) struct DeadLetterRetry;
/// Stands for the preset's service, `Backstop`: the retry, breaker, classify and timeout
/// layers, and maybe a dead-letter layer (its type does not say).
pub(crate) struct Preset;

/// The name of the type `T` up to and including its first `<` (all of it when it has no
/// parameters): what the name of any service of that type starts with.
pub(crate) fn named<T: ?Sized>() -> &'static str {
    let name = std::any::type_name::<T>();
    name.find('<').map_or(name, |at| &name[..=at])
}

/// Clients whose responses need a classifier to become failures (a 503 is an `Ok` response).
fn clients() -> [&'static str; 3] {
    [
        #[cfg(feature = "hyper-util")]
        named::<hyper_util::client::legacy::Client<(), ()>>(),
        #[cfg(not(feature = "hyper-util"))]
        HYPER_UTIL_CLIENT,
        #[cfg(feature = "reqwest")]
        named::<reqwest::Client>(),
        #[cfg(not(feature = "reqwest"))]
        REQWEST_CLIENT,
        #[cfg(feature = "tonic")]
        named::<tonic::transport::Channel>(),
        #[cfg(not(feature = "tonic"))]
        TONIC_CHANNEL,
    ]
}

// The clients' names as their crates give them, for a build without their feature; the tests
// hold each against the real type (the dev-dependencies have them all).
#[cfg_attr(feature = "hyper-util", allow(dead_code))]
const HYPER_UTIL_CLIENT: &str = "hyper_util::client::legacy::client::Client<";
#[cfg_attr(feature = "reqwest", allow(dead_code))]
const REQWEST_CLIENT: &str = "reqwest::async_impl::client::Client";
#[cfg_attr(feature = "tonic", allow(dead_code))]
const TONIC_CHANNEL: &str = "tonic::transport::channel::Channel";

/// What is wrong with placing `role` directly above a service of type `inner`, if anything.
pub(crate) fn problem(role: Role, inner: &str) -> Option<&'static str> {
    let below = |layer: &str| inner.contains(layer);
    let preset = below(Preset::name());
    let classify = below(Classify::name());
    let client_without_classifier =
        clients().iter().any(|client| below(client)) && !classify && !preset;
    // Without the dead-letter layer (feature `dead-letter` off), no stack holds one.
    #[cfg(feature = "dead-letter")]
    let (dead_letter_retry, dead_letter) =
        (below(DeadLetterRetry::name()), below(DeadLetter::name()));
    #[cfg(not(feature = "dead-letter"))]
    let (dead_letter_retry, dead_letter) = (false, false);
    let retry_below = below(Retry::name()) || dead_letter_retry || preset;
    let breaker_below = below(Breaker::name()) || preset;
    let dead_letter_below = dead_letter || dead_letter_retry;
    match role {
        Role::ReplayBuffer if !retry_below && !dead_letter_below => Some(
            "ReplayBufferLayer has no RetryLayer or DeadLetterLayer below it, so the bodies it \
             buffers are never sent again or recorded: put it directly above RetryLayer (or \
             above the stack BackstopLayer builds)",
        ),
        Role::BufferResponse if classify || preset => Some(
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
    use std::any::type_name;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;

    use super::*;
    use crate::breaker::{Breaker, PerKey};
    use crate::classify::{Classify, HttpClassifier};
    use crate::dead_letter::{DeadLetter, WithRetry};
    use crate::preset::Backstop;
    use crate::retry::Retry;
    use crate::timeout::Timeout;

    /// A real client, as a stack of the tests wraps it.
    type HyperClient = Client<HttpConnector, Full<Bytes>>;
    type Classified = Classify<Timeout<HyperClient>, HttpClassifier>;

    #[test]
    fn right_order_is_quiet_and_each_wrong_one_is_named() {
        // Every name below is a real type's, as a stack built by hand would have it.
        let timeout = type_name::<Timeout<HyperClient>>();
        let classify = type_name::<Classified>();
        let breaker = type_name::<Breaker<Classified>>();
        let retry = type_name::<Retry<Breaker<Classified>>>();
        assert_eq!(problem(Role::Classify, timeout), None);
        assert_eq!(problem(Role::Breaker, classify), None);
        assert_eq!(problem(Role::Retry, breaker), None);
        assert_eq!(problem(Role::DeadLetter, retry), None);
        assert_eq!(problem(Role::Resend, retry), None);
        assert!(
            problem(Role::Resend, timeout)
                .unwrap()
                .starts_with("the service records are re-sent through has no ClassifyLayer")
        );
        // A plain service with no known client: nothing to say.
        assert_eq!(
            problem(
                Role::Retry,
                type_name::<tower::util::ServiceFn<fn(()) -> std::future::Ready<()>>>()
            ),
            None
        );

        assert!(
            problem(Role::Classify, retry)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
        let dead_letter = type_name::<DeadLetter<Classified>>();
        assert!(
            problem(Role::Retry, dead_letter)
                .unwrap()
                .starts_with("DeadLetterLayer is below")
        );
        assert!(
            problem(Role::Retry, timeout)
                .unwrap()
                .starts_with("no ClassifyLayer")
        );
        assert!(problem(Role::DeadLetter, type_name::<reqwest::Client>()).is_some());
        // The preset's service classifies, retries and breaks: a scheduler over it is quiet, a
        // classifier above it is not.
        let preset = type_name::<Backstop<HyperClient>>();
        assert_eq!(problem(Role::Resend, preset), None);
        // A replay buffer is quiet above a layer that copies requests, named above anything else.
        assert_eq!(problem(Role::ReplayBuffer, preset), None);
        assert_eq!(problem(Role::ReplayBuffer, retry), None);
        assert_eq!(problem(Role::ReplayBuffer, dead_letter), None);
        assert_eq!(problem(Role::BufferResponse, timeout), None);
        assert!(
            problem(Role::BufferResponse, classify)
                .unwrap()
                .starts_with("BufferResponseLayer is above ClassifyLayer")
        );
        assert!(
            problem(Role::ReplayBuffer, classify)
                .unwrap()
                .starts_with("ReplayBufferLayer has no RetryLayer")
        );
        assert_eq!(problem(Role::DeadLetter, preset), None);
        assert!(problem(Role::Classify, preset).is_some());

        // The combined dead-letter and retry layer, and the keyed breaker, are seen too.
        let keyed = type_name::<Breaker<Classified, PerKey>>();
        // The keyed breaker's real type name is the one breaker's, with a key type.
        assert!(keyed.starts_with(named::<Breaker<()>>()));
        assert_eq!(problem(Role::Retry, keyed), None);
        let combined = type_name::<WithRetry<Breaker<Classified, PerKey>>>();
        assert!(
            problem(Role::Classify, combined)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
        assert!(
            problem(Role::Breaker, combined)
                .unwrap()
                .starts_with("DeadLetterLayer is below")
        );
        assert!(
            problem(Role::Classify, keyed)
                .unwrap()
                .starts_with("ClassifyLayer is above")
        );
    }

    #[test]
    fn each_client_is_known_by_its_real_type_with_or_without_its_feature() {
        // The paths looked for without a feature are the real types' names.
        assert_eq!(named::<Client<(), ()>>(), HYPER_UTIL_CLIENT);
        assert_eq!(named::<reqwest::Client>(), REQWEST_CLIENT);
        assert_eq!(named::<tonic::transport::Channel>(), TONIC_CHANNEL);
        // Each client, bare, is named; classified, it is quiet.
        let bare = [
            type_name::<HyperClient>(),
            type_name::<reqwest::Client>(),
            type_name::<tonic::transport::Channel>(),
        ];
        for client in bare {
            assert!(
                problem(Role::Retry, client)
                    .unwrap()
                    .starts_with("no ClassifyLayer"),
                "{client}"
            );
        }
        let classified = [
            type_name::<Classified>(),
            type_name::<Classify<Timeout<reqwest::Client>, HttpClassifier>>(),
            type_name::<
                Classify<Timeout<tonic::transport::Channel>, crate::classify::GrpcClassifier>,
            >(),
        ];
        for stack in classified {
            assert_eq!(problem(Role::Retry, stack), None, "{stack}");
        }
    }

    #[test]
    fn a_name_is_cut_after_its_first_angle_bracket() {
        assert_eq!(named::<Retry<Vec<u8>>>(), named::<Retry<()>>());
        assert!(named::<Retry<()>>().ends_with("::Retry<"));
        assert_eq!(named::<u8>(), "u8");
    }
}
