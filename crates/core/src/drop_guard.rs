//! [`DropGuard`]: run a closure when a scope is left early, unless disarmed.

use std::fmt;

/// Runs its closure when dropped, unless [`disarm`](DropGuard::disarm)ed first: the one shape
/// of every "if this future is dropped half-way, undo or settle what it started" in leasehold
/// (an acquire in flight, a release in flight, a waiter's place in a queue, a connection being
/// made).
#[must_use = "a drop guard runs its closure at the end of the scope it is bound to"]
pub struct DropGuard<F: FnOnce()> {
    on_drop: Option<F>,
}

impl<F: FnOnce()> DropGuard<F> {
    /// Arms `on_drop`.
    pub fn new(on_drop: F) -> DropGuard<F> {
        DropGuard {
            on_drop: Some(on_drop),
        }
    }

    /// Disarms the guard: the closure will not run.
    pub fn disarm(mut self) {
        self.on_drop = None;
    }
}

impl<F: FnOnce()> Drop for DropGuard<F> {
    fn drop(&mut self) {
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

impl<F: FnOnce()> fmt::Debug for DropGuard<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DropGuard")
            .field("armed", &self.on_drop.is_some())
            .finish()
    }
}
