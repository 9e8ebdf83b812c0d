//! Running one statement of the store, straight on the pool or, behind a transaction pooler
//! (PgBouncer's `pool_mode = transaction`), in a transaction of its own.
//!
//! sqlx runs a statement with arguments in two exchanges: `Parse`/`Describe`/`Sync`, then
//! `Bind`/`Execute`/`Sync`. A transaction pooler may give the client another server connection
//! at each `Sync` that leaves no transaction open, so:
//!
//! - a named statement (sqlx's `sqlx_s_N`, which sqlx 0.8 prepares for every persistent query,
//!   even with its statement cache off) is missing on the next server connection, or already
//!   exists there ("prepared statement "sqlx_s_1" already exists");
//! - an unnamed statement outside a transaction is bound on whatever server connection comes
//!   next: "bind message supplies 1 parameters, but prepared statement "" requires 2", or,
//!   when the other client's unnamed statement takes as many parameters, **that other
//!   statement runs** with these arguments.
//!
//! Inside `BEGIN` … `COMMIT` the pooler keeps one server connection for the client, so each
//! statement runs unnamed (never persisted) in a transaction of its own.

use sqlx::postgres::{PgQueryResult, PgRow};
use sqlx::{Executor, Postgres, Transaction};

use super::PostgresStore;
use super::row::PgQuery;

/// How the store runs its statements: chosen when it is opened.
#[derive(Clone, Debug, Default)]
pub(super) struct Mode {
    /// Behind a transaction pooler: each statement unnamed, in a transaction of its own.
    pub(super) pooled: bool,
    /// Run first in each of those transactions: `SET LOCAL statement_timeout = …` (a pooler
    /// refuses the startup parameter `options` that sets it otherwise).
    pub(super) set_timeout: Option<String>,
}

impl Mode {
    /// Whether sqlx may prepare the store's statements by name and keep them (not behind a
    /// transaction pooler, where the next server connection would not have them).
    pub(super) fn persistent(&self) -> bool {
        !self.pooled
    }
}

impl PostgresStore {
    /// A transaction of the pool, its statement timeout set.
    pub(super) async fn pooled_begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if let Some(set) = &self.mode.set_timeout {
            tx.execute(set.as_str()).await?;
        }
        Ok(tx)
    }

    /// `query.fetch_all`, as the store's mode runs it.
    pub(super) async fn fetch_all(&self, query: PgQuery<'_>) -> Result<Vec<PgRow>, sqlx::Error> {
        if !self.mode.pooled {
            return query.fetch_all(&self.pool).await;
        }
        let mut tx = self.pooled_begin().await?;
        let rows = query.persistent(false).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// `query.fetch_one`, as the store's mode runs it.
    pub(super) async fn fetch_one(&self, query: PgQuery<'_>) -> Result<PgRow, sqlx::Error> {
        if !self.mode.pooled {
            return query.fetch_one(&self.pool).await;
        }
        let mut tx = self.pooled_begin().await?;
        let row = query.persistent(false).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// `query.fetch_optional`, as the store's mode runs it.
    pub(super) async fn fetch_optional(
        &self,
        query: PgQuery<'_>,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        if !self.mode.pooled {
            return query.fetch_optional(&self.pool).await;
        }
        let mut tx = self.pooled_begin().await?;
        let row = query.persistent(false).fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// `query.execute`, as the store's mode runs it.
    pub(super) async fn execute(&self, query: PgQuery<'_>) -> Result<PgQueryResult, sqlx::Error> {
        if !self.mode.pooled {
            return query.execute(&self.pool).await;
        }
        let mut tx = self.pooled_begin().await?;
        let done = query.persistent(false).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done)
    }
}
