//! Support for other crates' clients and servers, one file per crate, each behind a cargo
//! feature named after it: the impls of this crate's traits for their types (the orphan rule
//! means only this crate can write them) and the classification of their errors.
//!
//! What `classify_error` reads off a foreign error (a reqwest connect error or timeout, tonic's
//! `TimeoutExpired`, an h2 reset or `GOAWAY`, a hyper-util connect error) is a plain function on
//! `&dyn Error` in that crate's file, which imports nothing from `classify`; reqwest's sits in
//! `reqwest/error.rs`, apart from its impls, which name the classifier's types.

#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "http2")]
pub(crate) mod h2;
#[cfg(feature = "hyper-util")]
pub(crate) mod hyper_util;
#[cfg(feature = "reqwest")]
pub(crate) mod reqwest;
#[cfg(feature = "tonic")]
pub(crate) mod tonic;
