use std::sync::Arc;

use tower_layer::Layer;

use super::{DeadLetter, Store};

/// Applies [`DeadLetter`] to a service: a request that finally fails is written to `store`.
#[derive(Clone)]
pub struct DeadLetterLayer {
    store: Arc<dyn Store>,
}

impl DeadLetterLayer {
    /// A layer that writes dead letters to `store`. Keep a clone of the store to search it.
    pub fn new(store: impl Store) -> Self {
        DeadLetterLayer {
            store: Arc::new(store),
        }
    }

    /// A layer over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        DeadLetterLayer { store }
    }
}

impl std::fmt::Debug for DeadLetterLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterLayer").finish_non_exhaustive()
    }
}

impl<S> Layer<S> for DeadLetterLayer {
    type Service = DeadLetter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetter::new(inner, Arc::clone(&self.store))
    }
}
