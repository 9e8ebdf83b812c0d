//! Support for other crates' clients and servers, one file per crate, each behind a cargo
//! feature named after it: the impls of this crate's traits for their types (the orphan rule
//! means only this crate can write them) and the classification of their errors.

#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "hyper-util")]
mod hyper_util;
#[cfg(feature = "reqwest")]
pub(crate) mod reqwest;
#[cfg(feature = "tonic")]
pub(crate) mod tonic;
