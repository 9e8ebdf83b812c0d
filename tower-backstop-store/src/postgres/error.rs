//! sqlx's errors as the store's.

use crate::StoreError;

/// A sqlx error as a [`StoreError`] about `what`, with the cause in words when it is one a
/// caller can act on: no free connection in time, a statement timeout, a lost connection.
pub(super) fn pg_error(what: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| {
        let why = match &e {
            sqlx::Error::PoolClosed => return StoreError::closed(),
            sqlx::Error::PoolTimedOut => {
                return StoreError::new(format!(
                    "postgres dead-letter store: {what}: no connection within the pool's acquire \
                     timeout (every connection busy, or the server unreachable)"
                ));
            }
            sqlx::Error::Database(db) if db.code().as_deref() == Some("57014") => {
                " (the statement ran past the statement timeout, or was cancelled)"
            }
            sqlx::Error::Io(_) => " (the connection to the server failed)",
            _ => "",
        };
        StoreError::with_source(format!("postgres dead-letter store: {what}{why}"), e)
    }
}
