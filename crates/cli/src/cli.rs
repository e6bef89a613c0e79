//! The command line: every subcommand and flag, parsed by clap.
//!
//! Kept apart from the code that runs the commands so `--help` can be read in one place.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The Redis used when neither `--url` nor `REDIS_URL` names one.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// Inspect, list and force-unlock leasehold locks in Redis (and see its semaphores and
/// count-down latches), or play the demo.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, propagate_version = true)]
pub struct Cli {
    /// Redis URL, as the library takes it: `redis://[user:pass@]host:port[/db]`, `rediss://`
    /// (TLS), `redis-cluster://[user:pass@]host:port?node=host:port&node=...`,
    /// `redis-sentinel://[user:pass@]host:port[/db]?sentinelServiceName=NAME&node=...`
    /// [default: $REDIS_URL, else redis://127.0.0.1:6379]. `demo` starts its own redis-server
    /// when neither is given.
    #[arg(long, global = true, env = "REDIS_URL", hide_env_values = true)]
    pub url: Option<String>,

    /// Key prefix of the locks: keys are `PREFIX:{NAME}`.
    #[arg(long, global = true, default_value = leasehold_core::DEFAULT_PREFIX)]
    pub prefix: String,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The Redis URL given by `--url` or `REDIS_URL`; an empty one counts as not given (as
    /// in leasehold-testkit), so `REDIS_URL= leasehold demo` starts its own server.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref().filter(|url| !url.trim().is_empty())
    }

    /// The Redis URL to connect to: `--url`, then `REDIS_URL`, then the local default.
    pub fn url_or_default(&self) -> &str {
        self.url().unwrap_or(DEFAULT_URL)
    }
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show one lock: its kind (lock, rwlock: a plain and a fair lock share one layout, so
    /// both show as lock), holders and hold counts (a read/write lock's mode, writer and
    /// readers with their tokens and leases), lease left, fencing token and the line of
    /// waiters in arrival order. A semaphore: its permits total, taken and available, each holder's permits,
    /// token and lease, and its waiters with the permits each wants. A latch: its count.
    Inspect {
        /// The lock name, as given to `client.lock(NAME)` (or `semaphore`, `latch`).
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the locks, semaphores and latches under the prefix (SCAN, never KEYS), with kind,
    /// mode (a semaphore's permits taken, a latch's count), holders, queue length and lease
    /// left.
    List {
        /// Glob on the lock name (`*`, `?`, `[a-z]`, `\` escapes).
        #[arg(default_value = "*")]
        pattern: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A refreshing view of the locks (and semaphores and latches) under the prefix: kind,
    /// mode, holder, hold count, lease left, entries queued, fencing token and the grants seen
    /// while watching.
    Watch {
        /// Glob on the lock name (`*`, `?`, `[a-z]`, `\` escapes).
        #[arg(default_value = "*")]
        pattern: String,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
    },
    /// Release a lock whoever holds it: as a release does, it grants the lock to the first
    /// live waiter in line (a read/write lock's head is served). A semaphore or a latch is
    /// refused: it is not a lock.
    Unlock {
        /// Required: this removes someone else's hold. The holder only notices at its next
        /// renewal, so it may still be working on the resource meanwhile.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation (needed when stdin is not a terminal).
        #[arg(long, short)]
        yes: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The lock name.
        name: String,
    },
    /// Play three scenarios with real OS processes as pods: inventory (oversell, lock,
    /// fencing), a daily report that must run once, and a long job kept alive by the watchdog.
    /// Uses SQLite, or PostgreSQL when DATABASE_URL is set. `--failover`: a lock through a
    /// failover of a primary and replica of its own, without and with replica sync.
    Demo(DemoArgs),
    /// One pod of the demo (run by `leasehold demo`, not by hand).
    #[command(hide = true)]
    Pod(PodArgs),
}

/// Where `leasehold demo` plays: its own redis-server by default, or `--url`/`REDIS_URL`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct DemoArgs {
    /// Start a local Redis Cluster (3 primaries with a replica each) and play on it; the pods
    /// connect with a redis-cluster:// URL.
    #[arg(long, conflicts_with = "sentinel")]
    pub cluster: bool,
    /// Start a local primary with two replicas and three Sentinels and play on it; the pods
    /// connect with a redis-sentinel:// URL.
    #[arg(long)]
    pub sentinel: bool,
    /// Play a failover instead of the three scenarios: a primary and a replica of its own, the
    /// primary killed and the replica promoted; the lock is granted twice without replica sync,
    /// kept with `ReplicaSync::Replicas` (refused with --url, REDIS_URL, --cluster, --sentinel).
    #[arg(long)]
    pub failover: bool,
}

/// Arguments of a demo pod process.
#[derive(Debug, Args)]
pub struct PodArgs {
    /// The lease of the pod's client, in milliseconds (the watchdog renews every third).
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: u64,
    /// The pod's job.
    #[command(subcommand)]
    pub role: PodRole,
}

/// Where the demo's inventory lives.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// SQLite database file.
    #[arg(long, conflicts_with = "pg_table")]
    pub sqlite: Option<PathBuf>,
    /// PostgreSQL table (the server comes from DATABASE_URL).
    #[arg(long)]
    pub pg_table: Option<String>,
}

/// The jobs a demo pod can run.
#[derive(Debug, Clone, Subcommand)]
pub enum PodRole {
    /// Sell units of a product until it is sold out.
    Shop {
        #[command(flatten)]
        store: StoreArgs,
        /// Take the product's lock around each sale.
        #[arg(long)]
        locked: bool,
        /// Time spent "processing the order" between reading and writing the stock.
        #[arg(long, default_value_t = 40)]
        work_ms: u64,
    },
    /// Lock with a short explicit lease, read the stock, freeze (SIGSTOP), then write fenced.
    StaleWriter {
        #[command(flatten)]
        store: StoreArgs,
        /// The explicit lease, in milliseconds.
        #[arg(long, default_value_t = 1_000)]
        hold_ms: u64,
    },
    /// Lock (waiting as needed), read the stock and sell one unit with a fenced write.
    FreshWriter {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// The scheduled daily report: run it unless another pod is running it.
    Report {
        /// How long the report takes.
        #[arg(long, default_value_t = 1_500)]
        job_ms: u64,
    },
    /// Hold the lock for a job longer than the lease; the watchdog keeps it alive.
    LongJob {
        /// How long the job takes.
        #[arg(long, default_value_t = 3_000)]
        job_ms: u64,
    },
    /// Wait for the long job's lock with `lock()`.
    LongWait,
}
