//! Test infrastructure for leasehold: real `redis-server` processes, child processes and a
//! fault-injecting TCP proxy, for tests, benches and demos.
//!
//! * [`RedisServer`]: spawns `redis-server` on a free `127.0.0.1` port with a temporary
//!   `--dir` and no persistence; SIGKILLed and reaped on drop. Fault controls: `kill`,
//!   `pause`/`resume` (SIGSTOP/SIGCONT), `restart` (same port, data lost), plus `flushall`,
//!   `info`, `command_calls`, `has_command`, `client_list` and a raw
//!   [`command`](RedisServer::command).
//! * [`redis_for_tests`]: the Redis a plain (fault-free) test should use: `$REDIS_URL` if set,
//!   otherwise a spawned [`RedisServer`]. **Tests that inject faults always spawn their own
//!   server** with [`RedisServer::start`], since an external server cannot be killed or
//!   paused (the controls on [`TestRedis`] then return [`TestkitError::Unsupported`]).
//! * [`ChildProcess`]: a child OS process (e.g. a "holder" binary) whose stdout lines can be
//!   awaited with [`ChildProcess::wait_for_line`]; SIGKILLed and reaped on drop.
//! * [`Proxy`]: a loopback TCP proxy (needs a tokio runtime) with latency, partitions,
//!   closing all connections and dropping replies.
//! * [`RedisCluster`]: a real multi-node Redis Cluster (3 primaries with a replica each by
//!   default) with per-node faults, `CLUSTER FAILOVER` of a primary and the migration of one
//!   slot (with its keys) between primaries while clients run.
//! * [`SentinelSet`]: a primary, two replicas and three Sentinels (quorum 2) that replace a
//!   killed primary within seconds; [`SentinelSet::sentinel_hosts`] is what a Sentinel client
//!   connects to.
//! * [`resp`]: the minimal blocking RESP2 client the kit uses (no `fred` dependency).
//!
//! `redis-server` comes from `PATH` or from `$LEASEHOLD_REDIS_SERVER`, for every process the
//! kit starts (servers, cluster nodes, Sentinels); if missing, starting fails with
//! [`TestkitError::RedisNotFound`]. Redis 6.2 and 7.x and Valkey 9 (`valkey-server`) all
//! work: clusters are formed with commands 6.2 has (`CLUSTER ADDSLOTS`, not `ADDSLOTSRANGE`).
//!
//! No orphans: besides kill-on-drop, children spawned on Linux carry
//! `PR_SET_PDEATHSIG = SIGKILL`, so they die even if the test process is SIGKILLed. The death
//! signal fires when the thread that forked the child exits, so all children are forked from a
//! dedicated spawner thread that lives as long as the process.
//!
//! Unix only (signals, process groups).
//!
//! ```no_run
//! use leasehold_testkit::RedisServer;
//!
//! let redis = RedisServer::start()?;
//! redis.command(&["SET", "k", "v"])?;
//! redis.restart()?; // same port, data gone
//! assert!(redis.command(&["GET", "k"])?.is_nil());
//! # Ok::<(), leasehold_testkit::TestkitError>(())
//! ```
#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(unreachable_pub)]

#[cfg(not(unix))]
compile_error!("leasehold-testkit supports Unix only");

mod cluster;
mod doc;
mod error;
mod process;
mod proxy;
mod replica_pair;
pub mod resp;
mod sentinel;
mod server;
mod spawn;
mod target;

pub use cluster::{
    parse_cluster_nodes, ClusterNodeInfo, RedisCluster, SlotMigration, CLUSTER_SLOTS,
};
pub use doc::with_redis;
pub use error::{Result, TestkitError};
pub use process::ChildProcess;
pub use proxy::Proxy;
pub use replica_pair::ReplicaPair;
pub use resp::RespValue;
pub use sentinel::{Sentinel, SentinelSet, SENTINEL_SERVICE};
pub use server::{RedisServer, RedisServerBuilder, REDIS_SERVER_ENV};
pub use target::{redis_for_tests, RedisTarget, TestRedis, REDIS_URL_ENV};
