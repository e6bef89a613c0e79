//! [`LockClientBuilder`]: settings with defaults that work, and building a client.

use leasehold_core::telemetry::KindMetrics;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ConnectionConfig, PerformanceConfig, ReconnectPolicy};
use fred::types::Builder;
use leasehold_core::protocol::Protocol;
use leasehold_core::scripts::Scripts;
use leasehold_core::{ClientId, DropGuard, Lease, LockError, Prefix, Redis, ReplicaSync, Result};
use leasehold_pubsub::{NotifierSettings, ReleaseNotifier};
use leasehold_watchdog::{ScriptRenewer, Watchdog, WatchdogConfig};

use crate::client::{ClientInner, LockClient};
use crate::connect::{connect, quit_in_background};
use crate::server_id::ServerIdentity;
use crate::waking::{Waking, WakingState};

/// Default lease of watched holds: 30 s, renewed every 10 s (Redisson's `lockWatchdogTimeout`).
/// Example: [`LockClient`]'s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default command timeout: 5 s. Example: [`LockClientBuilder::command_timeout`]'s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client keeps a lock's release channel subscribed after its last waiter on that
/// lock left. Example: [`LockClientBuilder::subscription_linger`]'s.
pub const DEFAULT_SUBSCRIPTION_LINGER: Duration = Duration::from_secs(2);

/// Loads every script at connect, so the first lock does not pay a NOSCRIPT round trip
/// (reloading on NOSCRIPT stays in place for restarts and SCRIPT FLUSH).
///
/// On a cluster every primary needs them: SCRIPT LOAD reaches one node, so the scripts are
/// loaded on each primary (`script_load_cluster`).
async fn preload_scripts(redis: &Redis, scripts: &Scripts) -> Result<()> {
    use fred::interfaces::{ClientLike, LuaInterface};
    let clustered = redis.is_clustered();
    // Boxed: 17 of fred's command futures side by side are large enough to overflow a 2 MB
    // stack in a debug build (seen with Cluster's `script_load_cluster`).
    let loads = scripts.all().map(|script| {
        Box::pin(async move {
            if clustered {
                redis.script_load_cluster::<(), _>(script.lua()).await
            } else {
                redis.script_load::<(), _>(script.lua()).await
            }
        })
    });
    futures::future::try_join_all(loads)
        .await
        .map_err(LockError::from_redis)?;
    Ok(())
}

/// Whether the server knows `command` (`COMMAND INFO`): `SPUBLISH` came with Redis 7.0.
async fn has_command(redis: &Redis, command: &'static str, timeout: Duration) -> Result<bool> {
    use fred::types::{ClusterHash, CustomCommand, Value};
    let info = redis.custom::<Value, _>(
        CustomCommand::new_static("COMMAND", ClusterHash::Random, false),
        vec!["INFO", command],
    );
    let reply = match tokio::time::timeout(timeout, info).await {
        Ok(reply) => reply.map_err(LockError::from_redis)?,
        Err(_) => return Err(LockError::Timeout),
    };
    Ok(matches!(&reply, Value::Array(entries) if entries.first().is_some_and(|e| !e.is_null())))
}

/// Whether the server refuses the client's `PUBLISH` on its own channels (`NOPERM`: an ACL user
/// without the channel rights). The probe publishes an empty message on a channel no lock uses
/// (`PREFIX:{leasehold}:probe`), which reaches nobody.
async fn publish_refused(
    redis: &Redis,
    prefix: &Prefix,
    sharded: bool,
    timeout: Duration,
) -> Result<bool> {
    use fred::types::{ClusterHash, CustomCommand, Value};
    let channel = format!("{}:{{leasehold}}:probe", prefix.as_str());
    let command = if sharded {
        CustomCommand::new_static("SPUBLISH", ClusterHash::FirstKey, false)
    } else {
        CustomCommand::new_static("PUBLISH", ClusterHash::Random, false)
    };
    let publish = redis.custom::<Value, _>(command, vec![channel.as_str(), ""]);
    match tokio::time::timeout(timeout, publish).await {
        Ok(Ok(_)) => Ok(false),
        Ok(Err(error)) => match LockError::from_redis(error) {
            LockError::PermissionDenied(_) => Ok(true),
            error => Err(error),
        },
        Err(_) => Err(LockError::Timeout),
    }
}

/// Checks at build that the server runs the command the replica sync policy sends after every
/// state change, so that a deployment that refuses it fails here rather than at the first
/// grant: a server that lacks it (`WAITAOF` before Redis 7.2), one that renamed it away
/// (`rename-command WAIT ""`), a managed service that does not offer it (serverless ones answer
/// "unknown command"), or an ACL user without the permission. The probe asks for no copy, so
/// the server answers at once: `WAIT 0 1`, `WAITAOF 0 0 1`.
async fn probe_replica_sync(redis: &Redis, policy: ReplicaSync, timeout: Duration) -> Result<()> {
    use fred::types::{ClusterHash, CustomCommand, Value};
    let (command, args, policy_name, otherwise): (_, Vec<Value>, _, _) = match policy {
        ReplicaSync::Replicas { .. } => (
            "WAIT",
            vec![0.into(), 1.into()],
            "ReplicaSync::Replicas",
            "use ReplicaSync::None (fencing tokens still order the holders) or a deployment that \
             allows WAIT",
        ),
        ReplicaSync::Aof { .. } => (
            "WAITAOF",
            vec![0.into(), 0.into(), 1.into()],
            "ReplicaSync::Aof",
            "use ReplicaSync::Replicas",
        ),
        _ => return Ok(()),
    };
    let probe = redis.custom::<Value, _>(
        CustomCommand::new_static(command, ClusterHash::Random, false),
        args,
    );
    let error = match tokio::time::timeout(timeout, probe).await {
        Err(_) => return Err(LockError::Timeout),
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(error)) => error,
    };
    match LockError::from_redis(error.clone()) {
        LockError::PermissionDenied(_) => Err(LockError::from_redis(fred::error::Error::new(
            error.kind().clone(),
            format!(
                "{} ({policy_name} sends {command} after every grant, renewal and release: add \
                 +{} to the user's ACL rule, or {otherwise})",
                error.details(),
                command.to_ascii_lowercase()
            ),
        ))),
        LockError::Redis(_) => Err(LockError::InvalidArgument(format!(
            "{policy_name} needs {command}{}, which this server refused ({}): {otherwise}",
            if command == "WAITAOF" {
                " (Redis 7.2 or later)"
            } else {
                ""
            },
            error.details()
        ))),
        other => Err(other),
    }
}

impl LockClient {
    /// A builder for a client of the Redis at `url` (`redis://[user:pass@]host:port[/db]`).
    /// A bad URL is reported by [`LockClientBuilder::build`].
    pub fn builder(url: &str) -> LockClientBuilder {
        #[cfg(not(feature = "tls"))]
        if ["rediss", "valkeys"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            // fred without a TLS feature only logs a warning and connects in the clear.
            return LockClientBuilder::new(Err(LockError::InvalidArgument(
                "a TLS URL (rediss://) needs leasehold's `tls` feature, which is off in this \
                 build"
                    .into(),
            )));
        }
        LockClientBuilder::new(
            Config::from_url(url)
                .map_err(|e| LockError::InvalidArgument(format!("bad Redis URL: {}", e.details()))),
        )
    }

    /// A builder from a fred [`Config`] (TLS, Sentinel, credentials...).
    pub fn builder_from_config(config: Config) -> LockClientBuilder {
        LockClientBuilder::new(Ok(config))
    }

    /// A builder over an application's own fred [`Client`]: lock commands share its
    /// connections, so a service opens no second set it would have to configure apart. The
    /// client must be initialized (`init()`) by the application, which also closes it:
    /// dropping the lock client leaves it open.
    ///
    /// Every command leasehold sends through it carries the options a lock command needs
    /// ([`leasehold_core::connection::lock_command_options`]): one write attempt (a state
    /// change is never resent after a reconnect), no redirection followed by fred (leasehold
    /// resends a redirected command itself, knowing nothing ran) and the builder's command
    /// timeout. They are set per command, so the application's own commands keep its
    /// settings. What leasehold takes from the client as it is: the server and its
    /// credentials, TLS, the protocol version (RESP2 or RESP3) and the reconnect policy, which
    /// must exist (a client that never reconnects would lose every hold at the first dropped
    /// connection: [`build`](LockClientBuilder::build) refuses it). Release messages need a
    /// connection of their own (a subscriber): it is opened from the client's configuration.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use fred::prelude::*;
    /// let app = fred::clients::Client::new(Config::from_url(&url)?, None, None, Some(ReconnectPolicy::default()));
    /// app.init().await?;
    /// let locks = leasehold::LockClient::builder_from_client(&app).build().await?;
    /// let report = locks.lock("report:nightly")?;
    /// let guard = report.lock().await?;
    /// let _: () = app.set("report:nightly:started", 1, None, None, false).await?;
    /// guard.unlock().await?;
    /// drop(locks);
    /// app.quit().await?; // the application's client is the application's to close
    /// # Ok::<(), Box<dyn std::error::Error>>(()) });
    /// ```
    pub fn builder_from_client(client: &Client) -> LockClientBuilder {
        let mut builder = LockClientBuilder::new(Ok(client.client_config()));
        if let Some(policy) = client.client_reconnect_policy() {
            builder.reconnect = policy;
        }
        builder.shared = Some(client.clone());
        builder
    }

    /// Connects with the defaults: prefix `leasehold`, lease 30 s, command timeout 5 s.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL, [`LockError::Connection`] when Redis cannot
    /// be reached (fred fails fast: a server that is down errors at once).
    ///
    /// # Cancel safety
    /// Cancel safe: a connection made before the future was dropped is closed.
    pub async fn connect(url: &str) -> Result<LockClient> {
        LockClient::builder(url).build().await
    }
}

/// Builds a [`LockClient`]; every setting has a default that works.
#[must_use = "a builder does nothing until .build().await"]
pub struct LockClientBuilder {
    config: Result<Config>,
    /// The application's client to share ([`LockClient::builder_from_client`]).
    shared: Option<Client>,
    prefix: String,
    lease: Duration,
    command_timeout: Duration,
    reconnect: ReconnectPolicy,
    renew_batch: usize,
    linger: Duration,
    replica_sync: ReplicaSync,
    sharded_pubsub: bool,
    server_name: Option<String>,
    max_hold: Option<Duration>,
    waking: Waking,
}

/// Shows the server, never the credentials in the fred `Config`.
impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = match &self.config {
            Ok(config) => format!("{:?}", config.server.hosts()),
            Err(error) => format!("invalid: {error}"),
        };
        f.debug_struct("LockClientBuilder")
            .field("server", &server)
            .field("shared_client", &self.shared.is_some())
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("command_timeout", &self.command_timeout)
            .field("renew_batch", &self.renew_batch)
            .field("subscription_linger", &self.linger)
            .field("replica_sync", &self.replica_sync)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .field("server_name", &self.server_name)
            .field("max_hold", &self.max_hold)
            .field("waking", &self.waking)
            .finish_non_exhaustive()
    }
}

impl LockClientBuilder {
    pub(crate) fn new(config: Result<Config>) -> LockClientBuilder {
        LockClientBuilder {
            config,
            shared: None,
            prefix: leasehold_core::DEFAULT_PREFIX.to_string(),
            lease: DEFAULT_LEASE,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            // Unlimited attempts, 50 ms doubling to 2 s: a lock client should come back by itself.
            reconnect: ReconnectPolicy::new_exponential(0, 50, 2_000, 2),
            renew_batch: 1000,
            linger: DEFAULT_SUBSCRIPTION_LINGER,
            replica_sync: ReplicaSync::None,
            sharded_pubsub: true,
            server_name: None,
            max_hold: None,
            waking: Waking::Auto,
        }
    }

    /// Key prefix (default `leasehold`): keys are `PREFIX:{NAME}`. Applications that share
    /// one Redis take a prefix each, so that their lock names never meet.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use leasehold::LockClient;
    /// let billing = LockClient::builder(&url).prefix("billing").build().await?;
    /// assert_eq!(billing.prefix(), "billing");
    /// let lock = billing.lock("invoice:42")?;
    /// assert_eq!(lock.name(), "invoice:42"); // the name as given: the prefix is in the keys
    /// assert_eq!(lock.keys().hash(), "billing:{invoice:42}");
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease of holds taken without an explicit lease (default 30 s); the watchdog renews them
    /// every lease/3 while the guard lives. Example: [`max_hold`](Self::max_hold)'s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait for any Redis reply (default 5 s; above zero, at most
    /// [`MAX_LEASE`](crate::MAX_LEASE)). A timed-out state change is treated as "unknown" and
    /// settled in the background.
    ///
    /// ```no_run
    /// # async fn demo() -> leasehold::Result<()> {
    /// use leasehold::{LockClient, DEFAULT_COMMAND_TIMEOUT};
    /// // Redis in another region: give every reply twice the default before it counts as lost.
    /// let client = LockClient::builder("redis://locks.eu-west.internal:6379")
    ///     .command_timeout(DEFAULT_COMMAND_TIMEOUT * 2)
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Reconnect policy (default: exponential 50 ms..2 s, unlimited attempts). Over an
    /// application's client ([`LockClient::builder_from_client`]) the client keeps its own, and
    /// this sets the policy of the subscriber leasehold opens beside it (by default the
    /// client's).
    pub fn reconnect_policy(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// Most holds the watchdog renews in one script call (default 1,000). A process that keeps
    /// many thousands of watched holds may lower it: Redis runs one script at a time, so a
    /// smaller batch makes each renewal call block the server's other clients for less long, at
    /// the cost of more round trips. Zero counts as 1.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use leasehold::LockClient;
    /// let client = LockClient::builder(&url).renew_batch_size(200).build().await?;
    /// let lock = client.lock("shard:17")?;
    /// let guard = lock.lock().await?; // renewed in calls of at most 200 holds
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn renew_batch_size(mut self, size: usize) -> Self {
        self.renew_batch = size.max(1);
        self
    }

    /// How waiters learn that what they wait for may be free (default [`Waking::Auto`]: release
    /// messages over pub/sub, and a timer where the deployment refuses pub/sub).
    ///
    /// [`Waking::Timer`] needs no pub/sub at all, for proxies and services without it: every
    /// kind of lock works the same, a waiter noticing a release only at its next look (up to
    /// the timer's longest delay later). See [`Waking`] for the trade-off.
    ///
    /// ```no_run
    /// # async fn demo() -> leasehold::Result<()> {
    /// use leasehold::{LockClient, Waking};
    ///
    /// // Behind a proxy that refuses SUBSCRIBE.
    /// let client = LockClient::builder("redis://proxy:6379")
    ///     .waking(Waking::timer())
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn waking(mut self, waking: Waking) -> Self {
        self.waking = waking;
        self
    }

    /// How long a lock's release channel stays subscribed after this client's last waiter on
    /// it left (default [`DEFAULT_SUBSCRIPTION_LINGER`]). A process that waits for the same lock
    /// again within that time pays no SUBSCRIBE and no first try that is known to fail.
    ///
    /// ```no_run
    /// # async fn demo() -> leasehold::Result<()> {
    /// use leasehold::{LockClient, DEFAULT_SUBSCRIPTION_LINGER};
    /// // Workers that wait for the same few locks every few seconds keep their channels.
    /// let client = LockClient::builder("redis://127.0.0.1:6379")
    ///     .subscription_linger(DEFAULT_SUBSCRIPTION_LINGER * 5)
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Replica sync (default [`ReplicaSync::None`]): after every grant, renewal and release of
    /// every kind of lock, and every change of a latch's count or a semaphore's number of
    /// permits, wait until the primary reports that the change reached `replicas`
    /// replicas (`WAIT`) or their append-only files (`WAITAOF`, Redis 7.2+).
    ///
    /// - A **grant** is reported only then. One that did not reach them within the timeout is
    ///   rolled back and fails with [`LockError::NotReplicated`] (transient: `lock()` and
    ///   bounded waits try again). [`LockGuard::replica_sync`](crate::LockGuard::replica_sync)
    ///   says what a grant reached.
    /// - A **renewal** that did not reach them counts as failed: the hold keeps the deadline of
    ///   its last synced renewal, and is lost (the guard's lost signal) if that passes.
    /// - A **release** is never failed for lack of replicas (the lock is free on the primary
    ///   either way); a shortfall is logged at WARN.
    /// - A change of a **latch's count** or a **semaphore's number of permits** returns once
    ///   the replicas have it. One that did not reach them cannot be rolled back blindly
    ///   (another client may have changed it since): it stands on the primary and fails with
    ///   [`LockError::AppliedNotReplicated`] (not transient: calling again applies it again).
    ///
    /// The wait costs a round trip plus the replication delay on every state change, and a
    /// replica that does not answer delays the client's other commands on that primary's
    /// connection by up to the timeout. It narrows the window in which a failover loses a
    /// grant; it does not close it (docs/deployments.md). Per lock: build a second client with
    /// another policy. [`build`](Self::build) checks that the server runs the policy's command
    /// (`WAIT 0 1` or `WAITAOF 0 0 1`, which wait for nothing) and refuses the policy otherwise.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// use leasehold::{LockClient, ReplicaSync};
    /// let client = LockClient::builder("redis-sentinel://127.0.0.1:26379/0?sentinelServiceName=locks")
    ///     .replica_sync(ReplicaSync::Replicas { replicas: 1, timeout: Duration::from_millis(50) })
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn replica_sync(mut self, policy: ReplicaSync) -> Self {
        self.replica_sync = policy;
        self
    }

    /// Whether, on Redis Cluster 7+, release messages go over sharded pub/sub (default
    /// `true`): `SPUBLISH` reaches only the nodes of the lock's shard, where `PUBLISH` is sent
    /// to every node of the cluster. The subscriber follows a channel's slot when it moves
    /// (checked every [`SHARD_CHECK`](leasehold_pubsub::SHARD_CHECK) while waiting).
    /// Standalone and Sentinel deployments always use `PUBLISH`.
    ///
    /// Every client of one cluster must agree: a waiter subscribed one way does not hear a
    /// release published the other way (it then wakes only on its timer, the holder's lease).
    /// Turn it off while a rolling upgrade from leasehold 0.1 (which published with `PUBLISH`
    /// on clusters too) is under way, and on again once every client runs this version.
    pub fn sharded_pubsub(mut self, sharded: bool) -> Self {
        self.sharded_pubsub = sharded;
        self
    }

    /// The name this client's server goes by in a [`MultiLock`](crate::MultiLock)'s order
    /// (by default the server's own `run_id`, read at connect and after every reconnect; on
    /// Redis Cluster, the node id of the primary serving each lock's slot).
    ///
    /// A multi-lock takes locks of one name on several servers in the order of their servers'
    /// identities, so every process must see each server under the same identity: a name
    /// survives restarts and failovers, where a `run_id` changes (docs/multi-lock.md, "Which
    /// server is which"). Give every client of one server the same name in every process, and
    /// different servers different names; name all of a deployment's servers or none. Like
    /// [`RedLock::named`](crate::RedLock::named), for locks of one name on several servers.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The longest the watchdog keeps a hold alive (default: no limit). A hold renewed by the
    /// watchdog (taken without an explicit lease) is renewed only while less than `max_hold`
    /// has passed since its grant; after that renewals stop, the hold lapses in Redis when its
    /// last lease ends, and the guard's [`lost`](crate::LockGuard::lost) signal fires with
    /// [`lost_reason`](crate::LockGuard::lost_reason) `Some(LostReason::MaxHold)`
    /// ([`LostReason`](crate::LostReason)). So a watched hold lasts at least `max_hold` (while
    /// its renewals succeed) and less than `max_hold` + the [lease](Self::lease): a stuck job
    /// cannot keep a lock for ever.
    ///
    /// Counted per grant from the send time of the acquire that granted it; re-entries of a
    /// grant share its clock. It applies to every kind's watched holds and permits of this
    /// client; holds with an explicit lease are never renewed anyway (and
    /// [`LockGuard::extend`](crate::LockGuard::extend) is not capped). Per lock: build a
    /// second client with another setting.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// use leasehold::{LockClient, LostReason};
    /// let client = LockClient::builder(&url)
    ///     .lease(Duration::from_millis(300))
    ///     .max_hold(Duration::from_millis(500))
    ///     .build()
    ///     .await?;
    /// let lock = client.lock("nightly")?;
    /// let guard = lock.lock().await?;
    /// guard.lost().await; // within 500 ms + 300 ms of the grant
    /// assert_eq!(guard.lost_reason(), Some(LostReason::MaxHold));
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Connects and starts the watchdog.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL, prefix, lease, grace, timeout or
    /// `max_hold` (1 ms to [`MAX_LEASE`](crate::MAX_LEASE));
    /// [`LockError::Connection`] when Redis cannot be reached;
    /// [`LockError::PermissionDenied`] for refused credentials or a user that may not load the
    /// scripts. With [replica sync](Self::replica_sync), a deployment that refuses its command
    /// is refused here: `InvalidArgument` where the server does not know `WAIT` (renamed away,
    /// a managed service without it) or `WAITAOF` (before Redis 7.2), `PermissionDenied` where
    /// the user's ACL leaves it out.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection made before the future was dropped (or before an error) is
    /// closed.
    pub async fn build(self) -> Result<LockClient> {
        let config = self.config?;
        let prefix = Prefix::new(&self.prefix)?;
        let lease = Lease::new(self.lease)?;
        if self.lease < Duration::from_millis(30) {
            return Err(LockError::InvalidArgument(format!(
                "watchdog lease {:?} is under 30 ms: renewals every lease/3 would not keep up",
                self.lease
            )));
        }
        if self.command_timeout.is_zero() || self.command_timeout > leasehold_core::MAX_LEASE {
            return Err(LockError::InvalidArgument(format!(
                "command timeout {:?} must be above zero and at most {:?}",
                self.command_timeout,
                leasehold_core::MAX_LEASE
            )));
        }
        self.replica_sync.validate(self.command_timeout)?;
        if let Some(max_hold) = self.max_hold {
            Lease::new(max_hold).map_err(|_| {
                LockError::InvalidArgument(format!(
                    "max_hold {max_hold:?} must be 1 ms to {:?}",
                    leasehold_core::MAX_LEASE
                ))
            })?;
        }
        self.waking.validate()?;
        if self.server_name.as_deref().is_some_and(str::is_empty) {
            return Err(LockError::InvalidArgument(
                "a server name must not be empty".into(),
            ));
        }
        if self
            .shared
            .as_ref()
            .is_some_and(|app| app.client_reconnect_policy().is_none())
        {
            return Err(LockError::InvalidArgument(
                "the application's client has no reconnect policy: leasehold needs one (a hold \
                 would be lost for good at the first dropped connection); build the client with \
                 one, e.g. ReconnectPolicy::new_exponential(0, 50, 2_000, 2)"
                    .into(),
            ));
        }
        let options = leasehold_core::connection::lock_command_options(self.command_timeout);
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(self.reconnect.clone())
            .set_connection_config(ConnectionConfig {
                connection_timeout: self.command_timeout,
                internal_command_timeout: self.command_timeout,
                // As every command's options say (`lock_command_options`), for the commands
                // fred sends by itself too, and for the subscriber: a SUBSCRIBE resent behind
                // an UNSUBSCRIBE would leave a channel subscribed that the notifier let go.
                max_command_attempts: options.max_attempts.unwrap_or(1),
                max_redirections: options.max_redirections.unwrap_or(0),
                ..match &self.shared {
                    Some(app) => app.connection_config().clone(),
                    None => ConnectionConfig::default(),
                }
            })
            .set_performance_config(PerformanceConfig {
                default_command_timeout: self.command_timeout,
                ..match &self.shared {
                    Some(app) => app.perf_config(),
                    None => PerformanceConfig::default(),
                }
            });
        let shared = self.shared.is_some();
        let redis = match self.shared {
            // Initialized by the application; it may be reconnecting right now.
            Some(app) => {
                if !app.is_connected()
                    && tokio::time::timeout(self.command_timeout, app.wait_for_connect())
                        .await
                        .is_err()
                {
                    return Err(LockError::Connection(
                        leasehold_core::RedisError::connection(format!(
                            "the application's client did not connect within {:?} (call its \
                             init() before building a lock client over it)",
                            self.command_timeout
                        )),
                    ));
                }
                leasehold_core::connection::shared(&app, self.command_timeout)
            }
            None => {
                let own = builder.build().map_err(LockError::from_redis)?;
                leasehold_core::connection::own(&own)
            }
        };
        // From here on, an error or a dropped future closes the connection (our own).
        let close_on_failure = DropGuard::new({
            let redis = redis.clone();
            move || {
                if !shared {
                    quit_in_background(&*redis);
                }
            }
        });
        if !shared {
            connect(&*redis, self.command_timeout).await?;
        }
        Box::pin(probe_replica_sync(
            &redis,
            self.replica_sync,
            self.command_timeout,
        ))
        .await?;
        // Sharded pub/sub on a cluster that has it (Redis 7+), unless turned off.
        let sharded = redis.is_clustered()
            && self.sharded_pubsub
            && Box::pin(has_command(&redis, "SPUBLISH", self.command_timeout)).await?;
        // Whether the server refuses our PUBLISH (an ACL without channel rights): then the
        // scripts publish nothing, or every release would fail. Asked only where a refusal
        // changes something: with Waking::PubSub it stays an error.
        let silent = self.waking != Waking::PubSub
            && Box::pin(publish_refused(
                &redis,
                &prefix,
                sharded,
                self.command_timeout,
            ))
            .await?;
        if silent && self.waking == Waking::Auto {
            tracing::warn!(
                "the server refuses PUBLISH on leasehold's channels: waiters are woken by a \
                 timer (a release is noticed up to {:?} late); grant the channel rights \
                 (&{}:*), or choose Waking::Timer to say so",
                Waking::TIMER_MAX,
                prefix.as_str()
            );
        }
        let protocol = Protocol { sharded, silent };
        let scripts = Scripts::for_protocol(protocol);
        match tokio::time::timeout(self.command_timeout, preload_scripts(&redis, &scripts)).await {
            Ok(result) => result?,
            Err(_) => return Err(LockError::Timeout),
        }
        let server = Box::pin(ServerIdentity::new(
            &redis,
            self.server_name,
            self.command_timeout,
        ))
        .await?;
        // The subscriber has the same connection settings (see above); a redirected
        // SSUBSCRIBE is sent again by the notifier.
        let subscriber = builder
            .build_subscriber_client()
            .map_err(LockError::from_redis)?;
        let id = ClientId::random();
        let notifier = ReleaseNotifier::new(
            subscriber,
            NotifierSettings {
                linger: self.linger,
                connect_timeout: self.command_timeout,
                sharded,
            },
        );
        let holds = Watchdog::start(
            ScriptRenewer {
                client: redis.clone(),
                scripts: scripts.clone(),
                timeout: self.command_timeout,
                sync: self.replica_sync,
            },
            WatchdogConfig {
                lease,
                batch_size: self.renew_batch,
                group_by_slot: redis.is_clustered(),
                max_hold: self.max_hold,
            },
        );
        close_on_failure.disarm();
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                redis,
                id,
                prefix,
                command_timeout: self.command_timeout,
                scripts,
                holds,
                notifier,
                metrics: KindMetrics::register(),
                replica_sync: self.replica_sync,
                server,
                waking: WakingState::new(self.waking, silent),
            }),
        })
    }
}
