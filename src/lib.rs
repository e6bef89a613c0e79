//! Distributed locks for async Rust on Redis.
//!
//! ```
//! # leasehold_testkit::with_redis(|url| async move {
//! use leasehold::LockClient;
//!
//! let client = LockClient::connect(&url).await?;          // e.g. "redis://127.0.0.1:6379"
//! let lock = client.lock("inventory:42")?;
//! let guard = lock.lock().await?;                          // waits, woken by pub/sub
//! let token = guard.fencing_token();                       // send it with your writes
//! // ... sell the last item; the watchdog keeps the lease alive meanwhile ...
//! guard.unlock().await?;
//! # let _ = token;
//! # Ok::<(), leasehold::LockError>(()) });
//! ```
//!
//! - Kinds on one machinery: the reentrant [`Lock`] (or non-reentrant), the fair lock
//!   ([`LockClient::fair_lock`]: strict arrival order over every waiter), the read/write lock
//!   ([`RwLock`]), the [`Semaphore`] with owned, leased permits, and the count-down [`Latch`].
//! - Reentrant per owner (by default the current tokio task), with hold counts.
//! - Watchdog renewal for holds without an explicit lease; lost-lease detection on the guard
//!   ([`LockGuard::is_held`], [`LockGuard::lost`], [`LockGuard::run_while_held`]).
//! - Waiters in one line in Redis: a release grants the lock to the first live waiter and tells
//!   only it, never by polling.
//! - [`FencingToken`]s that keep increasing even when Redis loses its data.
//!
//! See `docs/guide.md` for the guarantees and their limits.
//!
//! # Architecture
//! The facade is thin types over shared machinery, as `tokio::sync`'s locks are over one
//! semaphore:
//!
//! ```text
//! builder, connect   settings; connecting (a failed or dropped connect closes its connection)
//! client             LockClient: the command connection, the hold table, the release listener
//! wait               the waiting engine: line up, try, register interest, sleep until a
//!                    grant (taken without a try), a wake-up, the busy time or the deadline;
//!                    generic over one `Attempt`
//! release            releases, and settling commands whose reply never came
//! lock, guard        every kind's handle, attempt and guard: the plain lock (acquire.lua, and
//!                    the line's scripts while it waits), the fair lock (line/*.lua,
//!                    release.lua) and a read/write lock's sides (rw/*.lua)
//! multi_lock         MultiLock: several Lock handles taken all or none, in canonical order
//! red_lock           RedLock: one Lock handle per independent server, held by a quorum
//! rw_lock            RwLock: two Lock handles on one name
//! semaphore          Semaphore and Permit: a Lock handle whose every acquisition is a hold of
//!                    its own id (sem/*.lua; a release grants the waiters at the head whose
//!                    permits fit, as the lock's line grants its head)
//! latch              Latch: a count-down latch waited on through the engine (latch/*.lua)
//! schedule           run-once jobs on top of the lock
//! ```
//! Below it: `leasehold-core` (keys, leases, owners, protocol words, each kind's traits,
//! scripts, errors), `leasehold-watchdog` (the hold table and renewal) and `leasehold-pubsub`
//! (the subscriber and each lock's local line of waiters). What differs between the kinds is
//! declared once, in `leasehold_core::kind` (which scripts, which keys, who stands in Redis's
//! line, whether `unlock_after` is allowed, which other side a read/write lock looks at); the
//! commands, the engine, the CLI and the chaos checker read it. A new kind of lock is a row
//! there, its scripts in core, and an attempt and a guard here; the waiting, the hold
//! bookkeeping, renewal and settling are shared.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod builder;
mod client;
mod connect;
mod guard;
mod hold;
mod latch;
mod lock;
mod multi_lock;
mod red_lock;
mod release;
mod rw_lock;
pub mod schedule;
mod semaphore;
mod server_id;
mod wait;
mod waking;

pub use builder::{
    LockClientBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_LEASE, DEFAULT_SUBSCRIPTION_LINGER,
};
pub use client::{LockClient, LAST_TRY_BUDGET};
pub use guard::LockGuard;
pub use hold::Hold;
pub use latch::Latch;
pub use leasehold_core::{
    FencingToken, Lease, LockError, LockKeys, LockKind, Owner, RedisError, ReplicaSync, Result,
    Synced, MAX_LEASE, MAX_NAME_LEN,
};
pub use leasehold_watchdog::{LostReason, WatchdogStats};
pub use lock::Lock;
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use red_lock::{QuorumGuard, QuorumLock, QuorumToken, RedLock, DEFAULT_SERVER_TIMEOUT};
pub use rw_lock::RwLock;
pub use semaphore::{Permit, Semaphore};
pub use waking::Waking;
