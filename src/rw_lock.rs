//! [`RwLock`]: a distributed read/write lock, as two [`Lock`] handles on one name.

use std::fmt;

use leasehold_core::{LockKeys, LockKind, Owner};

use crate::Lock;

/// A handle on one distributed read/write lock: many readers or one writer.
///
/// [`RwLock::read`] and [`RwLock::write`] are [`Lock`] handles on its two sides, so every way
/// to acquire a lock (`lock`, `try_lock`, `try_lock_for`, explicit leases) and everything a
/// guard does (watchdog renewal, the lost-lease signal, fencing tokens, cancel safety) works
/// the same on both. Both sides are reentrant per owner.
///
/// The policy (see `docs/read-write-lock.md`):
/// - **One line in arrival order** for readers and writers waiting. A writer enters when nobody
///   holds the lock and it is first in line; a reader enters while no writer holds it and no
///   writer waits before it. So a waiting writer stops the readers that come after it (writers
///   do not starve under a steady stream of readers), and readers that came before a writer go
///   before it (readers do not starve under a stream of writers either).
/// - **Releasing the write lock** lets every reader at the head of the line in at once (each is
///   told on its own channel); the last read release hands the lock to the writer first in
///   line.
/// - **Downgrade**: the owner of the write lock may take the read lock (at once, whoever
///   waits), then release the write lock and keep reading.
/// - **No upgrade**: a reader asking for the write lock gets
///   [`LockError::UpgradeRefused`](crate::LockError::UpgradeRefused) at once instead of waiting
///   for itself.
/// - **Each hold has its own lease**: a crashed reader's hold ends with its lease and does not
///   pin the lock for the others.
/// - **Fencing**: every grant, read or write, carries a token from the same counter as the
///   plain lock's, so tokens of one name strictly increase over all its grants. A write token
///   is larger than every token granted before it: a store that keeps the highest token it
///   applied refuses a stale writer, as with the plain lock. A read token places the read
///   among the writes: when the store has applied a write token larger than a reader's token,
///   what that reader read may be stale (a later writer got in after its lease was lost), so
///   anything the reader derives from it (a cache fill, a report) can be refused by the same
///   check.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// let client = leasehold::LockClient::connect(&url).await?;
/// let config = client.rw_lock("config")?;
/// assert_eq!(config.name(), "config");
/// let (a, b) = tokio::join!(config.read().lock(), async {
///     // another task: another owner, reading at the same time
///     tokio::spawn({
///         let config = config.clone();
///         async move { config.read().lock().await.map(|g| g.detach()) }
///     })
///     .await
///     .unwrap()
/// });
/// let (a, b) = (a?, b?);
/// a.unlock().await?;
/// b.unlock().await?;
/// let writer = config.write().lock().await?; // alone now
/// writer.unlock().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct RwLock {
    read: Lock,
    write: Lock,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.read.name())
            .field("key", &self.read.keys().hash())
            .finish()
    }
}

impl RwLock {
    pub(crate) fn new(lock: Lock, keys: &LockKeys) -> RwLock {
        RwLock {
            read: lock.clone().with_keys(keys.of_kind(LockKind::Read)),
            write: lock.with_keys(keys.of_kind(LockKind::Write)),
        }
    }

    /// The lock name. Example: [`RwLock`]'s.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// The read side: shared with every other reader, excluded by a writer. Example:
    /// [`RwLock`]'s.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The write side: exclusive. Example: [`RwLock`]'s.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// This handle, acquiring both sides under `owner` instead of the current task (see
    /// [`Lock::with_owner`]).
    pub fn with_owner(self, owner: Owner) -> RwLock {
        RwLock {
            read: self.read.with_owner(owner.clone()),
            write: self.write.with_owner(owner),
        }
    }
}
