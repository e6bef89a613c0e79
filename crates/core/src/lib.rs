//! The core of [leasehold](https://docs.rs/leasehold): what a lock *is* in Redis.
//!
//! This crate holds the key layout ([`LockKeys`], one Cluster slot per lock), owner ids
//! ([`Owner`], [`ClientId`], [`HoldId`]), leases ([`Lease`]), the protocol's words
//! ([`protocol`]), the Lua scripts that make every state change one atomic step ([`scripts`]),
//! their typed calls ([`commands`]) and the error type ([`LockError`]). It never waits and owns
//! no timers.
//!
//! # Architecture
//! ```text
//! core       keys, leases, owners, protocol words, scripts, typed calls, errors  (this crate)
//! watchdog   the client's hold table: every live grant, its lease state, renewal in batches,
//!            pending settles of unanswered commands
//! pubsub     one subscriber per client: release messages, and each lock's local FIFO of waiters
//! leasehold  the facade: LockClient, the waiting engine (try, register interest, sleep until a
//!            wake-up, the holder's lease or the deadline), and each kind as a thin type (Lock)
//! ```
//! Each kind's traits are declared once ([`kind`]); a new kind of lock is a row there, new
//! scripts here, a small attempt adapter and a guard in the facade; it reuses the hold table, the waiting engine and the settling of unanswered commands.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod commands;
pub mod connection;
mod drop_guard;
mod error;
mod fence;
mod keys;
pub mod kind;
mod lease;
mod owner;
pub mod protocol;
pub mod replica_sync;
pub mod scripts;
pub mod slot;
pub mod telemetry;

pub use connection::Redis;
pub use drop_guard::DropGuard;
pub use error::{LockError, RedisError, Result};
pub use fence::FencingToken;
pub use keys::{LockKeys, Prefix, DEFAULT_PREFIX, MAX_NAME_LEN};
pub use kind::{LockKind, Stored};
pub use lease::{Lease, MAX_LEASE};
pub use owner::{ClientId, HoldId, Owner};
pub use replica_sync::{ReplicaSync, Synced};
