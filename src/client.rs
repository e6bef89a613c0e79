//! [`LockClient`]: one per process; owns the Redis connections, the hold table (and its
//! watchdog) and the release listener.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use leasehold_core::scripts::Scripts;
use leasehold_core::telemetry::KindMetrics;
use leasehold_core::{ClientId, LockError, LockKeys, Owner, Prefix, Redis, ReplicaSync, Result};
use leasehold_pubsub::ReleaseNotifier;
use leasehold_watchdog::{Watchdog, WatchdogStats};
use tokio::time::Instant;

use crate::server_id::ServerIdentity;
use crate::Lock;

/// The least time a command gets, even at the very end of a bounded wait: a try at the
/// deadline still has this long to get its answer. A bounded call returns at most this long
/// after its deadline.
///
/// So a caller with a hard deadline of its own waits that much less:
///
/// ```no_run
/// # async fn demo(lock: leasehold::Lock) -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::LAST_TRY_BUDGET;
/// // The request must be answered within 2 s, the last try at the wait's end included.
/// let wait = Duration::from_secs(2).saturating_sub(LAST_TRY_BUDGET);
/// if let Some(guard) = lock.try_lock_for(wait).await? {
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
pub const LAST_TRY_BUDGET: Duration = Duration::from_millis(250);

/// Awaits a command future within a [`Budget`], with a tokio timer only when the budget needs
/// one. A macro, so the command future is built in place in each branch: moving a script call's
/// future (over a kilobyte) into a helper showed up as memcpy on the hot path.
macro_rules! within {
    ($budget:expr, $command:expr) => {
        if $budget.timer {
            tokio::time::timeout_at($budget.until, $command)
                .await
                .unwrap_or(Err(leasehold_core::LockError::Timeout))
        } else {
            $command.await
        }
    };
}
pub(crate) use within;

/// How much later than its budget a command may time out when the budget is (about) the whole
/// command timeout: then fred's own timeout ends it, and no tokio timer is armed.
const TIMER_SLACK: Duration = Duration::from_millis(20);

/// The time one command may take, its connection wait included.
pub(crate) struct Budget {
    /// The command goes out no earlier than this.
    pub(crate) sent_at: Instant,
    /// The reply must come by then.
    pub(crate) until: Instant,
    /// Whether a tokio timer must enforce `until` (fred's own timeout would come too late).
    pub(crate) timer: bool,
}

/// A distributed lock client: the entry point of leasehold.
///
/// Build one per process and share it (it is cheap to clone). It holds one command connection,
/// one pub/sub connection (opened on the first wait), and one watchdog task for all holds.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// use leasehold::LockClient;
///
/// let client = LockClient::connect(&url).await?;
/// assert_eq!(client.lease(), leasehold::DEFAULT_LEASE); // watched holds: 30 s, renewed
/// let lock = client.lock("inventory:42")?;
/// let guard = lock.try_lock().await?.expect("nobody else holds it");
/// println!("fencing token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id.as_str())
            .field("prefix", &self.inner.prefix)
            .field("lease", &self.inner.holds.lease().duration())
            .field("command_timeout", &self.inner.command_timeout)
            .finish_non_exhaustive()
    }
}

/// What every lock of one client shares.
pub(crate) struct ClientInner {
    /// The command connection: leasehold's own, or an application's
    /// ([`LockClient::builder_from_client`], which the application closes).
    pub(crate) redis: Redis,
    pub(crate) id: ClientId,
    pub(crate) prefix: Prefix,
    pub(crate) command_timeout: Duration,
    pub(crate) scripts: Arc<Scripts>,
    /// The hold table and its renewal service.
    pub(crate) holds: Watchdog,
    pub(crate) notifier: ReleaseNotifier,
    /// Every kind's metrics, each under its `kind` label (handles registered when the client
    /// was built).
    pub(crate) metrics: KindMetrics,
    /// How many replicas a grant, renewal and release must reach
    /// ([`LockClientBuilder::replica_sync`](crate::LockClientBuilder::replica_sync)).
    pub(crate) replica_sync: ReplicaSync,
    /// The server's identity, as a multi-lock orders its members by.
    pub(crate) server: ServerIdentity,
    /// How waiters are woken: messages, or a timer ([`crate::Waking`]).
    pub(crate) waking: crate::waking::WakingState,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // fred does not close a client on drop (the notifier quits its own subscriber). An
        // application's client is its own to close.
        if !leasehold_core::connection::is_shared(&self.redis) {
            crate::connect::quit_in_background(&*self.redis);
        }
    }
}

impl ClientInner {
    /// The identity of the server that holds `keys`, now (see [`ServerIdentity`]).
    pub(crate) fn server_identity(&self, keys: &LockKeys) -> String {
        self.server.of(&self.redis, keys)
    }

    /// How long a command may take: the command timeout, or what is left until `deadline`, but
    /// at least [`LAST_TRY_BUDGET`].
    pub(crate) fn budget(&self, deadline: Option<Instant>) -> Duration {
        match deadline {
            None => self.command_timeout,
            Some(deadline) => deadline
                .saturating_duration_since(Instant::now())
                .max(LAST_TRY_BUDGET)
                .min(self.command_timeout),
        }
    }

    /// Starts a command's budget: waits (within it) for the command connection when it is being
    /// re-established, since state changes go out with a single attempt and fred cannot queue
    /// them for us. The command is then sent no earlier than `sent_at`.
    pub(crate) async fn start(&self, budget: Duration) -> Budget {
        let now = Instant::now();
        let until = now + budget;
        if self.redis.is_connected() {
            return Budget {
                sent_at: now,
                until,
                // fred times every command out after the command timeout by itself, so a tokio
                // timer (registering and cancelling one costs on the hot path) is armed only
                // when the budget ends clearly earlier than that.
                timer: budget + TIMER_SLACK < self.command_timeout,
            };
        }
        let _ = tokio::time::timeout_at(until, self.redis.wait_for_connect()).await;
        Budget {
            sent_at: Instant::now(),
            until,
            timer: true,
        }
    }

    /// Replica sync of a change that cannot be rolled back (a latch's count or count-down, a
    /// semaphore's number of permits), made just before on this client's connection: waits
    /// for the replicas as the policy says, like a grant. A shortfall is
    /// [`LockError::AppliedNotReplicated`]: the change ran on the primary and stays there (a
    /// blind undo could undo someone else's change since). Nothing is sent without a policy.
    pub(crate) async fn sync_change(&self, keys: &LockKeys) -> Result<()> {
        if self.replica_sync.is_none() {
            return Ok(());
        }
        // Boxed: without a policy, the common case, this future is never built.
        match Box::pin(self.replica_sync.require(&self.redis, keys)).await {
            Ok(_) => Ok(()),
            Err(LockError::NotReplicated {
                name,
                replicas,
                required,
            }) => Err(LockError::AppliedNotReplicated {
                name,
                replicas,
                required,
            }),
            Err(error) => Err(error),
        }
    }

    /// Runs one command within `budget`, connection wait included. For reads, and for state
    /// changes that are safe to send again (settling is a compare-and-set).
    pub(crate) async fn call<T>(
        &self,
        budget: Duration,
        command: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let budget = self.start(budget).await;
        within!(budget, command)
    }
}

impl LockClient {
    /// A handle on the lock `name`. Cheap; nothing is sent until you lock.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`](crate::LockError::InvalidArgument) for an empty name, one over
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, with control characters, or with braces that
    /// are not a well-formed hash tag.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        let keys = LockKeys::new(&self.inner.prefix, name)?;
        Ok(Lock::new(self.inner.clone(), keys))
    }

    /// A handle on the fair lock `name`: waiters get it in the order they arrived, across
    /// every waiter of every client, each woken alone on its turn (see `docs/fair-lock.md`).
    /// It is a [`Lock`] in every other way: reentrant (or [`Lock::non_reentrant`]), watched,
    /// fenced, cancel safe.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.fair_lock("payouts")?;
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_fair());
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    pub fn fair_lock(&self, name: &str) -> Result<Lock> {
        let keys = LockKeys::new(&self.inner.prefix, name)?.fair();
        Ok(Lock::new(self.inner.clone(), keys))
    }

    /// A handle on the read/write lock `name`: many readers or one writer, through
    /// [`RwLock::read`](crate::RwLock::read) and [`RwLock::write`](crate::RwLock::write) (see
    /// [`RwLock`](crate::RwLock) for the policy).
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    pub fn rw_lock(&self, name: &str) -> Result<crate::RwLock> {
        let keys = LockKeys::new(&self.inner.prefix, name)?;
        Ok(crate::RwLock::new(
            Lock::new(self.inner.clone(), keys.clone()),
            &keys,
        ))
    }

    /// A handle on the count-down latch `name` (see [`Latch`](crate::Latch)).
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    pub fn latch(&self, name: &str) -> Result<crate::Latch> {
        let keys = LockKeys::new(&self.inner.prefix, name)?;
        Ok(crate::Latch::new(self.inner.clone(), keys))
    }

    /// A handle on the semaphore `name` (see [`Semaphore`](crate::Semaphore)).
    ///
    /// # Errors
    /// As [`LockClient::lock`].
    pub fn semaphore(&self, name: &str) -> Result<crate::Semaphore> {
        let keys = LockKeys::new(&self.inner.prefix, name)?;
        Ok(crate::Semaphore::new(
            Lock::new(self.inner.clone(), keys.clone()),
            &keys,
        ))
    }

    /// The locks `locks` (possibly of other clients too), to be taken together, all or none:
    /// see [`MultiLock`](crate::MultiLock).
    ///
    /// # Errors
    /// As [`MultiLock::new`](crate::MultiLock::new).
    pub fn multi_lock(&self, locks: impl IntoIterator<Item = Lock>) -> Result<crate::MultiLock> {
        crate::MultiLock::new(locks)
    }

    /// A new explicit owner: holds taken under it are shared by every task that uses it (see
    /// [`Lock::with_owner`]).
    pub fn new_owner(&self) -> Owner {
        self.inner.id.new_owner()
    }

    /// The owner the current task acquires under by default: another task is another owner,
    /// and waits for this one's holds instead of re-entering them.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("ledger")?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.owner(), &client.current_owner());
    /// assert!(client.current_owner().id().starts_with(client.id()));
    /// let elsewhere = tokio::spawn({
    ///     let client = client.clone();
    ///     async move { client.current_owner() }
    /// });
    /// assert_ne!(elsewhere.await.unwrap(), client.current_owner());
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn current_owner(&self) -> Owner {
        self.inner.id.current_owner()
    }

    /// This client's id: a random uuid, the first part of every owner id it makes, and the
    /// name release messages use for this client's turn. Example:
    /// [`LockClient::current_owner`]'s.
    pub fn id(&self) -> &str {
        self.inner.id.as_str()
    }

    /// The key prefix. Example:
    /// [`LockClientBuilder::prefix`](crate::LockClientBuilder::prefix)'s.
    pub fn prefix(&self) -> &str {
        self.inner.prefix.as_str()
    }

    /// The lease of watched holds (renewed every lease/3). Example: [`LockClient`]'s.
    pub fn lease(&self) -> Duration {
        self.inner.holds.lease().duration()
    }

    /// The underlying fred client (for commands leasehold does not wrap): leasehold's own, or
    /// the application's one it was built from
    /// ([`LockClient::builder_from_client`](crate::LockClient::builder_from_client)). Commands
    /// sent through it carry the client's own settings, not the options leasehold sets on each
    /// of its commands ([`leasehold_core::connection::lock_command_options`]).
    pub fn redis(&self) -> &Client {
        &self.inner.redis
    }

    /// Waiters of this client in a lock's queue right now: its acquires (and latch waits) still
    /// waiting, a gauge of contention.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("report")?;
    /// let guard = lock.lock().await?;
    /// let waiting = tokio::spawn({
    ///     let lock = lock.clone();
    ///     async move { lock.lock().await.map(|g| g.detach()) } // another task: it waits
    /// });
    /// while client.subscribed_channels() == 0 {
    ///     tokio::time::sleep(Duration::from_millis(10)).await; // until it listens for releases
    /// }
    /// assert_eq!(client.waiters(), 1);
    /// guard.unlock().await?;
    /// waiting.await.unwrap()?.unlock().await?;
    /// assert_eq!(client.waiters(), 0);
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn waiters(&self) -> usize {
        self.inner.notifier.waiters()
    }

    /// Release channels this client is subscribed to right now (lingering ones included, for
    /// [`subscription_linger`](crate::LockClientBuilder::subscription_linger) after their last
    /// waiter left). Example: [`LockClient::waiters`]'s.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.notifier.subscribed_channels()
    }

    /// Whether this client's waiters are woken by a timer rather than by release messages:
    /// chosen with [`Waking::Timer`](crate::Waking::Timer), or taken by
    /// [`Waking::Auto`](crate::Waking::Auto) when the server refused pub/sub.
    pub fn wakes_by_timer(&self) -> bool {
        self.inner.waking.by_timer()
    }

    /// The hold table's counters: how many holds this client keeps, and how their renewals
    /// fare. For monitoring: a rising `lost` count means holders lost leases they still meant
    /// to keep, and rising `errors`, renewals that did not reach Redis.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let (nightly, hourly) = (client.lock("nightly")?, client.lock("hourly")?);
    /// let watched = nightly.lock().await?; // renewed by the watchdog
    /// let fixed = hourly.lock_with_lease(Duration::from_secs(60)).await?; // never renewed
    /// let stats = client.watchdog_stats();
    /// assert_eq!((stats.holds, stats.fixed), (1, 1));
    /// println!("{} renewals, {} lost, {} failed calls", stats.renewed, stats.lost, stats.errors);
    /// # let _ = (watched, fixed);
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.inner.holds.stats()
    }
}
