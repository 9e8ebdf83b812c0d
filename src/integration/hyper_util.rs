//! `hyper-util` (feature `hyper-util`): a layer of ours may sit directly over a hyper-util
//! client.
//!
//! `hyper_util::client::legacy::Error` converts into [`Failure`], classified by
//! [`classify_error`]: a connect error is transient even without an io error in its chain. The
//! stack then compiles in any order, and a wrong one is reported by the order checks (a
//! `tracing` warning when it is built) instead of a compile error that names no layer.
//!
//! [`classify_error`]: crate::classify::classify_error

use std::error::Error;

use crate::failure::{BoxError, Failure};

/// Whether `error` is a hyper-util client error of a connection that could not be made:
/// transient, even when no io error stands below it in the chain.
pub(crate) fn is_connect(error: &(dyn Error + 'static)) -> bool {
    error
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect)
}

#[cfg_attr(docsrs, doc(cfg(feature = "hyper-util")))]
impl<R: 'static> From<hyper_util::client::legacy::Error> for Failure<R> {
    /// The error classified with [`classify_error`] (a connect error is transient) and kept as
    /// the source.
    ///
    /// [`classify_error`]: crate::classify::classify_error
    fn from(error: hyper_util::client::legacy::Error) -> Self {
        Failure::from(BoxError::from(error))
    }
}
