//! The identity of the server a client's locks live on: what a [`MultiLock`](crate::MultiLock)
//! orders the members of one name on different servers by, and how it tells one lock listed
//! twice.
//!
//! It must be the same in every process whatever address reaches the server (one process may
//! say `127.0.0.1`, another `localhost`, a third a proxy of its own): taken in different orders
//! by two processes, two members of one name on two servers would each be held by one process
//! waiting for the other's. So it is read from the server, or given by the caller:
//!
//! - a name given to [`LockClientBuilder::server_name`](crate::LockClientBuilder::server_name):
//!   `name:NAME`;
//! - one server, or the primary a Sentinel client is connected to: its `run_id` (`INFO
//!   server`), read at connect and again after every reconnect, since a restarted server (or a
//!   promoted replica) has another: `run_id:ID`;
//! - a Redis Cluster: the node id of the primary serving the lock's slot, from the client's
//!   slot map (resynced by fred on `MOVED`): `node:ID`;
//! - a server that refuses `INFO` (an ACL without `+info`): its address as configured,
//!   `address:HOST:PORT`, which only orders alike processes that use the same address.
//!
//! docs/multi-lock.md ("Which server is which") says what this means for users.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface, EventInterface};
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, CustomCommand, Value};
use leasehold_core::Redis;
use leasehold_core::{LockError, LockKeys, Result};
use parking_lot::RwLock;
use tokio::task::JoinHandle;

use crate::Lock;

impl Lock {
    /// The identity of the server this lock lives on, as a [`MultiLock`](crate::MultiLock)
    /// orders its members by: `name:NAME` for a client given
    /// [`LockClientBuilder::server_name`](crate::LockClientBuilder::server_name), the server's
    /// `run_id:ID` (read at connect and again after every reconnect), on Redis Cluster the
    /// `node:ID` of the primary serving the lock's slot now, or `address:HOST:PORT` for a
    /// server that refuses `INFO`. Every process should see the same identity for one server;
    /// compare it across processes to check.
    pub fn server_identity(&self) -> String {
        self.client().server_identity(self.keys())
    }
}

/// How a client names its server (see the module docs).
pub(crate) enum ServerIdentity {
    /// Given by the caller.
    Named(String),
    /// A Redis Cluster: the node serving each lock's slot.
    Cluster,
    /// Read from the server: its run id, refreshed after every reconnect by `refresher`.
    Read {
        current: Arc<RwLock<String>>,
        refresher: JoinHandle<()>,
    },
}

impl Drop for ServerIdentity {
    fn drop(&mut self) {
        if let ServerIdentity::Read { refresher, .. } = self {
            refresher.abort();
        }
    }
}

impl ServerIdentity {
    /// The identity of `redis`'s server: `name` if given, the cluster's slot map on a cluster,
    /// otherwise the server's run id, read now (within `timeout`) and again after every
    /// reconnect. Call it once `redis` is connected.
    pub(crate) async fn new(
        redis: &Redis,
        name: Option<String>,
        timeout: Duration,
    ) -> Result<ServerIdentity> {
        if let Some(name) = name {
            return Ok(ServerIdentity::Named(format!("name:{name}")));
        }
        if redis.is_clustered() {
            return Ok(ServerIdentity::Cluster);
        }
        // Taken before the first read: a reconnect between the two is not missed (the first
        // connection's own announcement, if still queued, costs one more read).
        let reconnects = redis.reconnect_rx();
        let current = Arc::new(RwLock::new(read(redis, timeout).await?));
        let refresher = tokio::spawn(refresh(
            redis.clone(),
            Arc::downgrade(&current),
            reconnects,
            timeout,
        ));
        Ok(ServerIdentity::Read { current, refresher })
    }

    /// The identity of the server that holds `keys`, now.
    pub(crate) fn of(&self, redis: &Redis, keys: &LockKeys) -> String {
        match self {
            ServerIdentity::Named(name) => name.clone(),
            ServerIdentity::Read { current, .. } => current.read().clone(),
            ServerIdentity::Cluster => {
                let slot = keys.slot();
                redis
                    .cached_cluster_state()
                    .and_then(|state| {
                        state
                            .slots()
                            .iter()
                            .find(|range| range.start <= slot && slot <= range.end)
                            .map(|range| format!("node:{}", range.id))
                    })
                    // Not mapped (the map is being rebuilt): the seeds as configured.
                    .unwrap_or_else(|| address(redis))
            }
        }
    }
}

/// The server's identity as it reports it: `run_id:ID`, or its configured address when it
/// refuses `INFO`.
async fn read(redis: &Redis, timeout: Duration) -> Result<String> {
    let info = redis.custom::<Value, _>(
        CustomCommand::new_static("INFO", ClusterHash::Random, false),
        vec!["server"],
    );
    let reply = match tokio::time::timeout(timeout, info).await {
        Ok(reply) => reply.map_err(LockError::from_redis),
        Err(_) => Err(LockError::Timeout),
    };
    let text = match reply {
        Ok(reply) => reply.into_string().unwrap_or_default(),
        Err(LockError::PermissionDenied(error)) => {
            tracing::warn!(
                %error,
                "INFO refused: a multi-lock orders this client's server by its configured \
                 address (allow +info, or name the server with LockClientBuilder::server_name)"
            );
            return Ok(address(redis));
        }
        Err(error) => return Err(error),
    };
    text.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| format!("run_id:{}", id.trim()))
        .ok_or_else(|| {
            LockError::Redis(leasehold_core::RedisError::connection(
                "INFO server has no run_id: cannot tell this server from another",
            ))
        })
}

/// The configured address, `address:HOST:PORT` (no credentials).
fn address(redis: &Redis) -> String {
    match &redis.client_config().server {
        ServerConfig::Centralized { server } => format!("address:{}:{}", server.host, server.port),
        other => {
            let hosts: Vec<String> = other.hosts().iter().map(|h| h.to_string()).collect();
            format!("address:{}", hosts.join(","))
        }
    }
}

/// Reads the run id again after every reconnect (a restarted server, or the replica a Sentinel
/// client follows to after a failover, has another), until the client goes. A read that fails
/// is tried again with backoff, until the next reconnect takes over.
async fn refresh(
    redis: Redis,
    current: std::sync::Weak<RwLock<String>>,
    mut reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    timeout: Duration,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match reconnects.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
        let mut delay = Duration::from_millis(50);
        loop {
            let Some(current) = current.upgrade() else {
                return;
            };
            match read(&redis, timeout).await {
                Ok(identity) => {
                    let mut slot = current.write();
                    if *slot != identity {
                        tracing::debug!(from = %*slot, to = %identity, "the server's identity changed");
                        *slot = identity;
                    }
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "reading the server's identity failed; retrying");
                }
            }
            drop(current);
            // A newer reconnect starts a fresh read.
            match tokio::time::timeout(delay, reconnects.recv()).await {
                Err(_) => delay = (delay * 2).min(Duration::from_secs(5)),
                Ok(Err(RecvError::Closed)) => return,
                Ok(_) => delay = Duration::from_millis(50),
            }
        }
    }
}
