use tower_layer::Layer;

use super::{Classify, HttpClassifier};

/// Applies [`Classify`] to a service: turns each attempt's `Result<Response, E>` into success or
/// a [`Failure`](crate::Failure).
///
/// `C` is the [`Classifier`](super::Classifier): [`HttpClassifier`] for `http::Response`s (the
/// default of [`ClassifyLayer::http`]), or your own.
#[derive(Clone, Debug)]
pub struct ClassifyLayer<C> {
    classifier: C,
}

impl<C> ClassifyLayer<C> {
    /// A layer that classifies with `classifier`.
    pub fn new(classifier: C) -> Self {
        ClassifyLayer { classifier }
    }
}

impl ClassifyLayer<HttpClassifier> {
    /// A layer with the default HTTP mapping of [`HttpClassifier::new`].
    pub fn http() -> Self {
        ClassifyLayer::new(HttpClassifier::new())
    }
}

impl<S, C: Clone> Layer<S> for ClassifyLayer<C> {
    type Service = Classify<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::order::check::<S>(crate::order::Role::Classify);
        Classify::new(inner, self.classifier.clone())
    }
}

// How the order checks find this layer's service below another layer.
impl crate::order::Named for crate::order::Classify {
    fn name() -> &'static str {
        crate::order::named::<Classify<(), ()>>()
    }
}
