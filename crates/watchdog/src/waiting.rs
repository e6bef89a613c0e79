//! Fair-lock queue entries kept alive by the watchdog.
//!
//! A fair lock's waiter has an entry in Redis (`P:{N}:waiters`) with a deadline in server
//! time. The waiter's client renews that deadline in the same batches as its holds, every
//! `L/3`, for as long as the waiter waits; an entry whose client stopped renewing it (the
//! process died, or a cancelled wait's cleanup never ran) is dead at its deadline and skipped.
//! So a live waiter keeps its place however long it waits, and a dead one holds the line for at
//! most one lease `L`.

use std::fmt;
use std::sync::Arc;

use leasehold_core::HoldId;
use tokio::time::Instant;

use crate::service::{Shared, Watchdog};

/// One waiting owner's entry, renewed while it is on the table.
pub(crate) struct Waiting {
    pub(crate) hold: HoldId,
    /// Unique for the watchdog's lifetime: slots are reused, ids never.
    pub(crate) id: u64,
    /// When the next renewal is due; `None` while one is in flight.
    pub(crate) due: Option<Instant>,
}

/// Keeps one fair-lock waiter's queue entry renewed while it lives. Dropping it stops the
/// renewals; leaving the line in Redis is the waiter's own business (it happens at once when
/// the wait ends without the lock, or the entry lapses).
pub struct WaitingEntry {
    shared: Arc<Shared>,
    slot: usize,
    id: u64,
}

impl fmt::Debug for WaitingEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitingEntry")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for WaitingEntry {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        if state
            .waiting
            .get(self.slot)
            .is_some_and(|w| w.id == self.id)
        {
            let waiting = state.waiting.remove(self.slot);
            if let Some(due) = waiting.due {
                state.waiting_due.remove(&(due, self.slot));
            }
        }
    }
}

impl Watchdog {
    /// Renews `hold`'s fair-lock queue entry (just written by a try) from now on, every `L/3`
    /// with the holds, until the returned value is dropped.
    pub fn keep_waiting(&self, hold: &HoldId) -> WaitingEntry {
        let due = Instant::now() + self.shared.config.lease.duration() / 3;
        let mut state = self.shared.state.lock();
        state.next_id += 1;
        let id = state.next_id;
        let slot = state.waiting.insert(Waiting {
            hold: hold.clone(),
            id,
            due: Some(due),
        });
        state.waiting_due.insert((due, slot));
        let wake = state.planned.is_none_or(|planned| due < planned);
        drop(state);
        if wake {
            self.shared.changed.notify_one();
        }
        WaitingEntry {
            shared: self.shared.clone(),
            slot,
            id,
        }
    }

    /// Fair-lock queue entries renewed right now.
    pub fn waiting_entries(&self) -> usize {
        self.shared.state.lock().waiting.len()
    }
}
