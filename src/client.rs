//! [`LockClient`]: one per process, owns the Redis connections, the watchdog and the listener.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::Config;
use fred::types::Builder;
use futures::future::{BoxFuture, FutureExt, Shared};
use leasehold_core::{commands, ClientId, LockError, LockKeys, Owner, Prefix, Result};
use leasehold_pubsub::ReleaseNotifier;
use leasehold_watchdog::{Watchdog, WatchdogStats};
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use crate::builder::{connect, LockClientBuilder};
use crate::Lock;

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
            .field("lease", &self.inner.lease)
            .field("command_timeout", &self.inner.command_timeout)
            .finish_non_exhaustive()
    }
}

/// One owner's holds on one lock (cloning it copies no strings).
type HoldKey = (LockKeys, Owner);

/// A repair in flight, awaitable by several acquires.
type Repair = Shared<BoxFuture<'static, ()>>;

pub(crate) struct ClientInner {
    pub(crate) redis: Client,
    pub(crate) id: ClientId,
    pub(crate) prefix: Prefix,
    pub(crate) lease: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) watchdog: Watchdog,
    notifier: OnceCell<ReleaseNotifier>,
    subscriber_builder: Builder,
    /// Live fixed-lease guards per (lock, owner); watched guards are counted by the watchdog.
    /// The hold count an unanswered acquire would produce is their sum plus one, which is what
    /// the rollback of such an acquire checks for.
    local_holds: Mutex<HashMap<HoldKey, u64>>,
    /// Repairs of unanswered acquires and releases in flight per (lock, owner), tagged with a
    /// generation. The owner's next acquire waits for them: a repair that arrived after a fresh
    /// grant would take that grant away.
    repairs: Mutex<HashMap<HoldKey, (u64, Repair)>>,
    repair_generation: std::sync::atomic::AtomicU64,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let redis = self.redis.clone();
        let subscriber = self.notifier.get().map(|n| n.subscriber().clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = redis.quit().await;
                if let Some(subscriber) = subscriber {
                    let _ = subscriber.quit().await;
                }
            });
        }
    }
}

impl ClientInner {
    pub(crate) fn new(
        redis: Client,
        prefix: Prefix,
        lease: Duration,
        command_timeout: Duration,
        watchdog: Watchdog,
        subscriber_builder: Builder,
    ) -> ClientInner {
        ClientInner {
            redis,
            id: ClientId::random(),
            prefix,
            lease,
            command_timeout,
            watchdog,
            notifier: OnceCell::new(),
            subscriber_builder,
            local_holds: Mutex::new(HashMap::new()),
            repairs: Mutex::new(HashMap::new()),
            repair_generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn map_err(&self, error: fred::error::Error) -> LockError {
        LockError::from_redis(error, self.command_timeout)
    }

    /// Waits (up to the command timeout) for the command connection when it is being
    /// re-established, so a command issued right after a disconnect is not failed at once:
    /// state changes go out with a single attempt, so fred cannot queue them for us.
    pub(crate) async fn ready(&self) {
        if !self.redis.is_connected() {
            let _ = tokio::time::timeout(self.command_timeout, self.redis.wait_for_connect()).await;
        }
    }

    /// The release listener, connected on first use.
    pub(crate) async fn notifier(&self) -> Result<&ReleaseNotifier> {
        self.notifier
            .get_or_try_init(|| async {
                let subscriber = self
                    .subscriber_builder
                    .build_subscriber_client()
                    .map_err(|e| self.map_err(e))?;
                // Connected in its own task: a waiter dropped mid-connect must not leave a
                // half-made connection behind.
                let connect = {
                    let subscriber = subscriber.clone();
                    let timeout = self.command_timeout;
                    tokio::spawn(async move { connect(&subscriber, timeout).await })
                };
                match connect.await {
                    Ok(Ok(())) => Ok(ReleaseNotifier::start(subscriber, self.id.as_str())),
                    Ok(Err(error)) => Err(error),
                    Err(join) => Err(LockError::Redis(format!(
                        "subscriber connect task failed: {join}"
                    ))),
                }
            })
            .await
    }

    /// The release listener if it was ever started.
    pub(crate) fn notifier_if_started(&self) -> Option<&ReleaseNotifier> {
        self.notifier.get()
    }

    /// Settles, in the background, a state change of `owner` on this lock whose reply never
    /// came (an acquire, or a release), with the rollback script: "if the owner's hold count
    /// is `expected`, take one hold back". For an unanswered acquire `expected` is the count it
    /// would have produced; for an unanswered release, the count before it. Either way the
    /// script is a compare-and-set, so it is resent until Redis gives a definite answer (a
    /// lost reply here would leave an orphaned hold that the owner would later re-enter), or
    /// until `give_up_after`, when the hold has ended with its lease anyway.
    ///
    /// The same owner's next acquire on this lock waits for it ([`Self::settled`]), so a late
    /// repair can never take back a fresh grant.
    pub(crate) fn spawn_repair(
        self: &Arc<Self>,
        keys: &LockKeys,
        owner: &Owner,
        expected: u64,
        give_up_after: Duration,
    ) {
        if tokio::runtime::Handle::try_current().is_err() {
            return; // no runtime to run it on: the lease ends the hold
        }
        let key = (keys.clone(), owner.clone());
        let this = self.clone();
        let (keys, owner) = key.clone();
        let mut repairs = self.repairs.lock();
        // Repairs of one owner on one lock run in order: each waits for the one before.
        let previous = repairs.get(&key).map(|(_, pending)| pending.clone());
        let generation = self
            .repair_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let done_key = key.clone();
        let repair = async move {
            if let Some(previous) = previous {
                previous.await;
            }
            let deadline = tokio::time::Instant::now() + give_up_after;
            let mut delay = Duration::from_millis(10);
            loop {
                this.ready().await;
                match commands::rollback(&this.redis, &keys, &owner, expected).await {
                    Ok(undone) => {
                        tracing::debug!(lock = %keys.name(), undone, "unanswered command settled");
                        break;
                    }
                    Err(error) => {
                        let error = this.map_err(error);
                        if !error.is_transient() || tokio::time::Instant::now() + delay >= deadline {
                            tracing::warn!(lock = %keys.name(), %error, "could not settle an unanswered command; the lease will end the hold");
                            break;
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                }
            }
            let mut repairs = this.repairs.lock();
            if repairs.get(&done_key).is_some_and(|(g, _)| *g == generation) {
                repairs.remove(&done_key);
            }
        }
        .boxed()
        .shared();
        repairs.insert(key, (generation, repair.clone()));
        drop(repairs);
        tokio::spawn(repair);
    }

    /// Waits up to `within` for pending repairs of `owner` on this lock; false if one is still
    /// running (Redis is not answering: the caller should not send a new acquire yet).
    pub(crate) async fn settled(&self, keys: &LockKeys, owner: &Owner, within: Duration) -> bool {
        let pending = {
            let repairs = self.repairs.lock();
            if repairs.is_empty() {
                return true;
            }
            repairs
                .get(&(keys.clone(), owner.clone()))
                .map(|(_, p)| p.clone())
        };
        match pending {
            Some(pending) => tokio::time::timeout(within, pending).await.is_ok(),
            None => true,
        }
    }

    pub(crate) fn local_holds(&self, keys: &LockKeys, owner: &Owner) -> u64 {
        let key = (keys.clone(), owner.clone());
        let fixed = self.local_holds.lock().get(&key).copied().unwrap_or(0);
        fixed + self.watchdog.holds_of(keys, owner)
    }

    pub(crate) fn add_local_hold(&self, keys: &LockKeys, owner: &Owner) {
        let key = (keys.clone(), owner.clone());
        *self.local_holds.lock().entry(key).or_insert(0) += 1;
    }

    pub(crate) fn remove_local_hold(&self, keys: &LockKeys, owner: &Owner) {
        let key = (keys.clone(), owner.clone());
        let mut holds = self.local_holds.lock();
        if let Some(count) = holds.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                holds.remove(&key);
            }
        }
    }
}

impl LockClient {
    /// A builder for a client of the Redis at `url` (`redis://[user:pass@]host:port[/db]`).
    /// A bad URL is reported by [`LockClientBuilder::build`].
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder::new(
            Config::from_url(url)
                .map_err(|e| LockError::InvalidArgument(format!("bad Redis URL: {}", e.details()))),
        )
    }

    /// A builder from a fred [`Config`] (TLS, Sentinel, credentials...).
    pub fn builder_from_config(config: Config) -> LockClientBuilder {
        LockClientBuilder::new(Ok(config))
    }

    /// Connects with the defaults: prefix `leasehold`, lease 30 s, command timeout 5 s.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL, [`LockError::Connection`] when Redis cannot
    /// be reached (fred fails fast: a server that is down errors at once).
    pub async fn connect(url: &str) -> Result<LockClient> {
        LockClient::builder(url).build().await
    }

    /// A handle on the lock `name`. Cheap; nothing is sent until you lock.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for an empty name, one over
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, with control characters, or with braces that
    /// are not a well-formed hash tag.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        let keys = LockKeys::new(&self.inner.prefix, name)?;
        Ok(Lock::new(self.inner.clone(), keys))
    }

    /// A new explicit owner: holds taken under it are shared by every task that uses it (see
    /// [`Lock::with_owner`]).
    pub fn new_owner(&self) -> Owner {
        self.inner.id.new_owner()
    }

    /// The owner the current task acquires under by default.
    pub fn current_owner(&self) -> Owner {
        self.inner.id.current_owner()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.inner.prefix.as_str()
    }

    /// The lease of watched holds (renewed every lease/3).
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The underlying fred client (for commands leasehold does not wrap).
    pub fn redis(&self) -> &Client {
        &self.inner.redis
    }

    /// Waiters of this client currently registered for a release wake-up.
    pub fn waiters(&self) -> usize {
        self.inner.notifier_if_started().map_or(0, |n| n.waiters())
    }

    /// Release channels this client is subscribed to (or unsubscribing from) right now.
    pub fn subscribed_channels(&self) -> usize {
        self.inner
            .notifier_if_started()
            .map_or(0, |n| n.subscribed_channels())
    }

    /// The watchdog's counters.
    pub fn watchdog_stats(&self) -> WatchdogStats {
        self.inner.watchdog.stats()
    }
}
