//! [`LockClientBuilder`]: settings with defaults that work, and connecting.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ConnectionConfig, PerformanceConfig, ReconnectPolicy};
use fred::types::Builder;
use leasehold_core::{LockError, Prefix, Result};
use leasehold_watchdog::{Watchdog, WatchdogConfig};

use crate::client::{ClientInner, LockClient};

/// Default lease of watched holds: 30 s, renewed every 10 s (Redisson's `lockWatchdogTimeout`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default command timeout: 5 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects `client` (the command or the subscriber connection), bounded by `timeout`, and
/// turns a failure into one clear error: fred fails fast when Redis is down, and says little.
pub(crate) async fn connect<C: ClientLike>(client: &C, timeout: Duration) -> Result<()> {
    let server = client
        .client_config()
        .server
        .hosts()
        .first()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let failed = |detail: String| {
        // The hint fits a refused or silent server, not a TLS handshake that failed.
        let tls = detail.contains("ertificate") || detail.to_lowercase().contains("tls");
        let hint = if tls {
            " (check the CA and the server certificate)"
        } else {
            " (is redis-server running? check the URL or REDIS_URL)"
        };
        LockError::Connection(fred::error::Error::new(
            fred::error::ErrorKind::IO,
            format!("cannot connect to Redis at {server}: {detail}{hint}"),
        ))
    };
    match tokio::time::timeout(timeout, client.init()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => {
            let _ = client.quit().await;
            if error.details().starts_with("NOPERM") || error.details().contains("WRONGPASS") {
                return Err(LockError::PermissionDenied(error.details().to_string()));
            }
            Err(failed(error.to_string()))
        }
        Err(_) => {
            let _ = client.quit().await;
            Err(failed(format!("no answer within {timeout:?}")))
        }
    }
}

/// Loads every script at connect, so the first lock does not pay a NOSCRIPT round trip
/// (reloading on NOSCRIPT stays in place for restarts and SCRIPT FLUSH).
async fn preload_scripts(redis: &Client) -> std::result::Result<(), fred::error::Error> {
    use fred::interfaces::LuaInterface;
    let loads =
        leasehold_core::scripts::all().map(|script| redis.script_load::<String, _>(script.lua()));
    futures::future::try_join_all(loads).await?;
    Ok(())
}

/// Builds a [`LockClient`]; every setting has a default that works.
#[must_use = "a builder does nothing until .build().await"]
pub struct LockClientBuilder {
    config: Result<Config>,
    prefix: String,
    lease: Duration,
    command_timeout: Duration,
    reconnect: ReconnectPolicy,
    renew_batch: usize,
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
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("command_timeout", &self.command_timeout)
            .field("renew_batch", &self.renew_batch)
            .finish_non_exhaustive()
    }
}

impl LockClientBuilder {
    pub(crate) fn new(config: Result<Config>) -> LockClientBuilder {
        LockClientBuilder {
            config,
            prefix: leasehold_core::DEFAULT_PREFIX.to_string(),
            lease: DEFAULT_LEASE,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            // Unlimited attempts, 50 ms doubling to 2 s: a lock client should come back by itself.
            reconnect: ReconnectPolicy::new_exponential(0, 50, 2_000, 2),
            renew_batch: 1000,
        }
    }

    /// Key prefix (default `leasehold`): keys are `PREFIX:{NAME}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease of holds taken without an explicit lease (default 30 s); the watchdog renews them
    /// every lease/3 while the guard lives.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait for any Redis reply (default 5 s; above zero, at most
    /// [`MAX_LEASE`](crate::MAX_LEASE)). A timed-out acquire is treated as "unknown" and undone
    /// in the background.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Reconnect policy (default: exponential 50 ms..2 s, unlimited attempts).
    pub fn reconnect_policy(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// Most holds the watchdog renews in one script call (default 1,000).
    pub fn renew_batch_size(mut self, size: usize) -> Self {
        self.renew_batch = size.max(1);
        self
    }

    /// Connects and starts the watchdog.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL, prefix, lease or timeout;
    /// [`LockError::Connection`] when Redis cannot be reached;
    /// [`LockError::PermissionDenied`] for refused credentials.
    pub async fn build(self) -> Result<LockClient> {
        let config = self.config?;
        let prefix = Prefix::new(&self.prefix)?;
        leasehold_core::lease_millis(self.lease)?;
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
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(self.reconnect.clone())
            .set_connection_config(ConnectionConfig {
                connection_timeout: self.command_timeout,
                internal_command_timeout: self.command_timeout,
                // State changes must never be sent twice: fred resends in-flight commands after
                // a reconnect unless this is 1. A resent acquire would count a hold twice, a
                // resent release would release twice. Unknown outcomes are settled above fred
                // (ClientInner::spawn_repair).
                max_command_attempts: 1,
                ..ConnectionConfig::default()
            })
            .set_performance_config(PerformanceConfig {
                default_command_timeout: self.command_timeout,
                ..PerformanceConfig::default()
            });
        let redis = builder
            .build()
            .map_err(|e| LockError::from_redis(e, self.command_timeout))?;
        connect(&redis, self.command_timeout).await?;
        preload_scripts(&redis)
            .await
            .map_err(|e| LockError::from_redis(e, self.command_timeout))?;
        let watchdog = Watchdog::start(
            redis.clone(),
            WatchdogConfig {
                lease: self.lease,
                batch_size: self.renew_batch,
            },
        );
        Ok(LockClient {
            inner: Arc::new(ClientInner::new(
                redis,
                prefix,
                self.lease,
                self.command_timeout,
                watchdog,
                builder,
            )),
        })
    }
}
