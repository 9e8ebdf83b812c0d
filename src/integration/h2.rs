//! `h2` (feature `http2`, on with `tonic`): the HTTP/2 stream resets and `GOAWAY` that hyper,
//! tonic and reqwest carry in their errors' source chain, read by
//! [`classify_error`](crate::classify::classify_error).

use std::error::Error;

use crate::failure::{Class, Code};

/// The verdict on `error` if it is an HTTP/2 reset or `GOAWAY` the server sent (RFC 9113 §6.4,
/// §6.8): `REFUSED_STREAM` and a `GOAWAY` that did not cover the stream (the only streams h2
/// fails with the server's `GOAWAY`; the covered ones run to their end) are transient and not
/// sent; `ENHANCE_YOUR_CALM` is throttled; `INADEQUATE_SECURITY` and `HTTP_1_1_REQUIRED` are
/// permanent (a configuration that no retry fixes); any other reset is transient, its outcome
/// unknown. `None` for any other error, and for a reset or `GOAWAY` of our own side or an io
/// error inside h2, which are left to the rest of the chain.
pub(crate) fn verdict(error: &(dyn Error + 'static)) -> Option<(Class, Code)> {
    let error = error.downcast_ref::<h2::Error>()?;
    if !error.is_remote() {
        return None;
    }
    let reason = u32::from(error.reason()?);
    if error.is_go_away() {
        return Some((Class::TRANSIENT, Code::GoAway(reason)));
    }
    if !error.is_reset() {
        return None;
    }
    let class = match h2::Reason::from(reason) {
        h2::Reason::ENHANCE_YOUR_CALM => Class::THROTTLED,
        h2::Reason::INADEQUATE_SECURITY | h2::Reason::HTTP_1_1_REQUIRED => Class::PERMANENT,
        _ => Class::TRANSIENT,
    };
    Some((class, Code::Reset(reason)))
}
