//! The hold table and lease renewal for leasehold: one [`Watchdog`] per client knows every hold
//! the client has (its grant, its fencing token, its guards), keeps the watched ones alive, and
//! tells every guard when its lease is lost.
//!
//! # The hold table
//! Every hold is keyed by [`HoldId`](leasehold_core::HoldId) (lock keys and owner). An entry
//! carries:
//! - the **grant** the client knows, with its fencing token and its [`LeaseState`]: re-entrant
//!   guards of one owner share it; a new grant of the same owner replaces it and marks the old
//!   one lost (Redis no longer had it);
//! - the **guards** counted by kind: *watched* (renewed) and *fixed* (an explicit lease, never
//!   renewed). A grant is on the renewal schedule while it has a watched guard;
//! - **settles** in flight: background repairs of commands whose reply never came. Every acquire
//!   and release of the hold waits for them, so a late repair can never undo a fresh change;
//! - **detached** guards of a task owner: they live in another task, so the task no longer
//!   re-enters through them.
//!
//! # Renewal
//! A watched grant gets lease `L` (default 30 s) and is renewed every `L/3`. One task per client
//! serves all holds; each tick renews every due grant with one script call per batch (default
//! 1,000 holds; on Redis Cluster one batch never mixes slots), so 10,000 holds cost about ten
//! round trips per tick, not ten thousand. Grants that fall due close together are renewed
//! together: a grant may be renewed up to `L/6` early so that its neighbours share its round
//! trip. A renewal carries the grant's fencing token and extends only that grant.
//!
//! # Why lost-lease detection matters
//! A lock on Redis is a lease: after `L` without renewal, someone else may take it. A process
//! that stalls (a swapped-out VM, a network partition) keeps running its critical section
//! afterwards, unaware. [`LeaseState`] knows the latest instant at which the lease is still
//! certainly valid (send time of the last confirmed acquire or renewal, plus `L`, minus a drift
//! allowance) and reports the hold lost as soon as that instant passes or a renewal finds the
//! grant gone. This narrows the window; it cannot close it. Fencing tokens, checked by the store
//! that receives the write, are the real protection.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod lease;
mod service;
mod table;
mod waiting;

pub use lease::{LeaseState, LostReason};
pub use service::{RenewFuture, Renewer, ScriptRenewer, Watchdog, WatchdogConfig, WatchdogStats};
pub use table::{AcquireTicket, HeldGrant, HoldGuard, LeaseMode, Prepared, ReleaseTicket, Settle};
pub use waiting::WaitingEntry;
