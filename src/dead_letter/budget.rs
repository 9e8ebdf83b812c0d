//! The durable attempt budget's refusal ([`DeadLetterLayer::attempt_budget`]).
//!
//! [`DeadLetterLayer::attempt_budget`]: super::DeadLetterLayer::attempt_budget

use std::fmt;

use crate::failure::{Class, Code, Failure};

/// The source of the failure for a message whose attempt budget was spent in earlier runs
/// ([`DeadLetterLayer::attempt_budget`](super::DeadLetterLayer::attempt_budget)): the inner
/// service was not called. The failure's class is [`Class::POISON`].
///
/// ```
/// use tower_backstop::Failure;
/// use tower_backstop::dead_letter::BudgetSpent;
///
/// fn refused_by_budget(failure: &Failure<()>) -> bool {
///     std::error::Error::source(failure).is_some_and(|s| s.is::<BudgetSpent>())
/// }
/// # let _ = refused_by_budget;
/// ```
#[derive(Debug)]
pub struct BudgetSpent {
    id: String,
    spent: u32,
    budget: u32,
}

impl BudgetSpent {
    /// The message id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The attempts counted against the budget ([`Record::budget_spent`]).
    ///
    /// [`Record::budget_spent`]: crate::store::Record::budget_spent
    pub fn spent(&self) -> u32 {
        self.spent
    }

    /// The budget.
    pub fn budget(&self) -> u32 {
        self.budget
    }
}

impl fmt::Display for BudgetSpent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} already used {} of its {} attempts in earlier runs; not sent again",
            self.id, self.spent, self.budget
        )
    }
}

impl std::error::Error for BudgetSpent {}

/// The failure for message `id`, refused with `spent` of `budget` attempts used: poison, with
/// [`BudgetSpent`] as its source, and a `tracing` error event.
pub(crate) fn refusal<R>(id: String, spent: u32, budget: u32) -> Failure<R> {
    tracing::error!(
        id = %id,
        spent,
        budget,
        class = %Class::POISON,
        "poison message: attempt budget spent in earlier runs"
    );
    Failure::new(Class::POISON, Code::Error).with_source(BudgetSpent { id, spent, budget })
}
