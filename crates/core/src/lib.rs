//! The core of [leasehold](https://docs.rs/leasehold): what a lock *is* in Redis.
//!
//! This crate holds the key layout ([`LockKeys`]), owner ids ([`Owner`], [`ClientId`]), the Lua
//! scripts that make every state change one atomic step ([`scripts`]), their typed replies
//! ([`commands`]) and the error type ([`LockError`]). It never waits and owns no timers: waiting
//! lives in `leasehold-pubsub`, lease renewal in `leasehold-watchdog`, and the user-facing API in
//! the `leasehold` facade.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod commands;
mod error;
mod fence;
mod keys;
mod lease;
mod owner;
pub mod scripts;

pub use error::{LockError, Result};
pub use fence::FencingToken;
pub use keys::{LockKeys, Prefix, DEFAULT_PREFIX, MAX_NAME_LEN};
pub use lease::{lease_millis, MAX_LEASE};
pub use owner::{ClientId, Owner};
