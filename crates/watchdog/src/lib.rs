//! Lease renewal for leasehold: one [`Watchdog`] per client keeps every watched hold alive, and
//! every hold, watched or not, can tell when its lease is lost ([`LeaseState`]).
//!
//! A hold acquired without an explicit lease gets lease `L` (default 30 s) and is renewed every
//! `L/3`. One task per client serves all holds; each tick renews every due hold with one script
//! call per batch (default 1,000 holds), so 10,000 holds cost about ten round trips per tick,
//! not ten thousand. Holds that fall due close together are renewed together: a hold may be
//! renewed up to `L/6` early so that its neighbours share its round trip.
//!
//! # Why lost-lease detection matters
//! A lock on Redis is a lease: after `L` without renewal, someone else may take it. A process
//! that stalls (a stop-the-world pause, a swapped-out VM, a network partition) keeps running its
//! critical section afterwards, unaware. [`LeaseState`] knows the latest instant at which the
//! lease is still certainly valid (send time of the last confirmed acquire or renewal, plus `L`,
//! minus a drift allowance) and reports the hold lost as soon as that instant passes or a renewal
//! finds the owner gone. Code can check it before a side effect, or run the work under it so it is
//! cancelled. This narrows the window; it cannot close it: a pause can fall between the check and
//! the write. Fencing tokens, checked by the store that receives the write, are the real
//! protection.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod lease;
mod service;

pub use lease::{drift_for, valid_until, LeaseState};
pub use service::{Hold, RenewFuture, Renewer, Watchdog, WatchdogConfig, WatchdogStats};
