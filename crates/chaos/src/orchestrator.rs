//! `leasehold-chaos run`: starts Redis, one fault proxy per client and K client processes,
//! injects faults on a schedule drawn from the seed, stops the clients cleanly, checks what
//! they left in Redis, and runs the checker over the recorded history.
//!
//! Cluster mode (`run --cluster`) runs the same clients, history and checker against a Redis
//! Cluster ([`RedisCluster`]: 3 primaries with a replica each), the clients connected as
//! cluster clients from the nodes' addresses (no proxies: the cluster tells clients where
//! each slot is, at the nodes' own addresses), and the resources' slots placed on the three
//! primaries in turn before the clients start. Its faults ([`FaultKind::CLUSTER`]): a primary
//! killed (its replica promoted after the node timeout, the killed node then started again
//! and rejoining as a replica; the resources it served recorded as possibly lost, since
//! Cluster replicates asynchronously), `CLUSTER FAILOVER` (coordinated, lossless), a node
//! paused for less than the node timeout, the slot of a resource (mostly one in use) migrated
//! to another primary, every node's connections killed, and the clients paused or killed as
//! in the one-server run. [`Deployment`] is what differs between the two; the rest is shared.
//!
//! In the one-server run, added latency comes twice per round of the fault kinds, mostly on
//! the client first in a fair or read/write lock's line and past half its command timeout:
//! a grant's reply then comes too late, and the grant is rolled back in the background (the
//! case `checker::rollback` judges).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold_testkit::{ChildProcess, Proxy, RedisCluster, RedisServer, RespValue};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::{sleep, Instant};

use crate::checker;
use crate::clock::now_us;
use crate::history::{client_log_path, read_client_id, write_faults, Fault, FaultKind};
use crate::rng::Rng;
use crate::run::{Cleanup, LatchLeft, Layout, LockType, RunConfig, SemaphoreLeft};
use crate::store::Store;
use crate::worker::{DRAIN_DEADLINE, MAX_EXPLICIT_LEASE};

/// Key prefix of a run: every key and channel the clients use starts with `chaos:`.
pub const PREFIX: &str = "chaos";
/// No fault starts in the last part of the run, so every fault has healed before the stop.
const QUIET_TAIL: Duration = Duration::from_secs(2);

/// Runs a whole experiment; returns whether the checker found no violation.
pub fn main(config: RunConfig, out: Option<PathBuf>, keep: bool) -> anyhow::Result<bool> {
    let (dir, tempdir) = match out {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            (dir, None)
        }
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("leasehold-chaos-")
                .tempdir()?;
            (tmp.path().to_path_buf(), Some(tmp))
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(run(&config, &dir))?;
    print!("{report}");
    let passed = report.passed();
    match tempdir {
        Some(tmp) if keep || !passed => {
            let kept = tmp.keep();
            println!("history kept in {}", kept.display());
        }
        Some(_) => {}
        None => println!("history in {}", dir.display()),
    }
    Ok(passed)
}

struct Slot {
    child: Arc<ChildProcess>,
    gen: u32,
    /// The uuid that starts the owner ids of this process.
    client_id: String,
}

/// The Redis the clients use.
enum Deployment {
    /// One server, reached by each client through a fault proxy of its own.
    Single {
        redis: Arc<RedisServer>,
        proxies: Vec<Proxy>,
    },
    /// A Redis Cluster, reached directly as cluster clients. `slots[res]`: the slot of
    /// resource `res`'s keys.
    Cluster {
        cluster: Arc<RedisCluster>,
        slots: Vec<u16>,
    },
}

impl Deployment {
    /// Where `key` lives: the server, or the primary serving `key`'s slot now.
    async fn node_of(&self, key: &str) -> anyhow::Result<Arc<dyn Node>> {
        match self {
            Deployment::Single { redis, .. } => Ok(redis.clone()),
            Deployment::Cluster { cluster, .. } => {
                let (c, key) = (cluster.clone(), key.to_string());
                let node = blocking(move || c.owner_of_slot(c.key_slot(&key)?)).await??;
                Ok(ClusterNode::of(cluster, node))
            }
        }
    }

    /// Runs `args` where `key` lives.
    async fn key_command(&self, key: &str, args: Vec<String>) -> anyhow::Result<RespValue> {
        let node = self.node_of(key).await?;
        Ok(blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            node.command(&args)
        })
        .await??)
    }

    /// The servers that hold data: the one server, or the cluster's primaries (each with a
    /// name for the report).
    async fn data_nodes(&self) -> anyhow::Result<Vec<(String, Arc<dyn Node>)>> {
        match self {
            Deployment::Single { redis, .. } => Ok(vec![(String::new(), redis.clone() as _)]),
            Deployment::Cluster { cluster, .. } => {
                let c = cluster.clone();
                let primaries = blocking(move || c.primaries()).await??;
                Ok(primaries
                    .into_iter()
                    .map(|i| (node_label(cluster, i), ClusterNode::of(cluster, i)))
                    .collect())
            }
        }
    }

    /// Every server a client may be connected to: the one server, or every cluster node.
    fn all_nodes(&self) -> Vec<(String, Arc<dyn Node>)> {
        match self {
            Deployment::Single { redis, .. } => vec![(String::new(), redis.clone() as _)],
            Deployment::Cluster { cluster, .. } => (0..cluster.nodes().len())
                .map(|i| (node_label(cluster, i), ClusterNode::of(cluster, i)))
                .collect(),
        }
    }
}

/// A server to send commands to: the one server, or one node of the cluster.
pub(crate) trait Node: Send + Sync {
    fn command(&self, args: &[&str]) -> leasehold_testkit::Result<RespValue>;
}

impl Node for RedisServer {
    fn command(&self, args: &[&str]) -> leasehold_testkit::Result<RespValue> {
        RedisServer::command(self, args)
    }
}

/// Node `index` of a cluster (an index stays valid for the cluster's life).
struct ClusterNode {
    cluster: Arc<RedisCluster>,
    index: usize,
}

impl ClusterNode {
    fn of(cluster: &Arc<RedisCluster>, index: usize) -> Arc<dyn Node> {
        Arc::new(ClusterNode {
            cluster: cluster.clone(),
            index,
        })
    }
}

impl Node for ClusterNode {
    fn command(&self, args: &[&str]) -> leasehold_testkit::Result<RespValue> {
        self.cluster.node(self.index).command(args)
    }
}

/// `node 2 (port 40123): ` (empty for the one server: its reports stay as they were).
fn node_label(cluster: &RedisCluster, index: usize) -> String {
    format!("node {index} (port {}): ", cluster.node(index).port())
}

struct Env<'a> {
    config: &'a RunConfig,
    dir: &'a Path,
    exe: PathBuf,
    deployment: Deployment,
    slots: Vec<Slot>,
}

impl Env<'_> {
    fn spawn_client(&self, client: u32, gen: u32) -> anyhow::Result<Arc<ChildProcess>> {
        let c = self.config;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("client");
        match &self.deployment {
            Deployment::Single { redis, proxies } => {
                cmd.args(["--url", &proxies[client as usize].url()])
                    .args(["--redis-addr", &redis.addr().to_string()]);
            }
            Deployment::Cluster { cluster, .. } => {
                let seeds: Vec<String> = cluster
                    .seeds()
                    .iter()
                    .map(|(host, port)| format!("{host}:{port}"))
                    .collect();
                // `--url` and `--redis-addr` go unused: the clients and their observer of the
                // fair locks' lines start from the seeds.
                let first = cluster.node(0);
                cmd.args(["--url", &first.url()])
                    .args(["--redis-addr", &first.addr().to_string()])
                    .args(["--cluster-seeds", &seeds.join(",")]);
            }
        }
        cmd.args(["--prefix", PREFIX])
            .args(["--client", &client.to_string()])
            .args(["--gen", &gen.to_string()])
            .arg("--dir")
            .arg(self.dir)
            .args(["--seed", &c.seed.to_string()])
            .args(["--tasks", &c.tasks.to_string()])
            .args(["--resources", &c.resources.to_string()])
            .args(["--fair-resources", &c.fair_resources.to_string()])
            .args(["--fair-percent", &c.fair_percent.to_string()])
            .args(["--rw-resources", &c.rw_resources.to_string()])
            .args(["--rw-percent", &c.rw_percent.to_string()])
            .args(["--sem-resources", &c.sem_resources.to_string()])
            .args(["--sem-percent", &c.sem_percent.to_string()])
            .args(["--sem-permits", &c.sem_permits.to_string()])
            .args(["--latch-resources", &c.latch_resources.to_string()])
            .args(["--latch-percent", &c.latch_percent.to_string()])
            .args(["--foreign-percent", &c.foreign_percent.to_string()])
            .args(["--lease-ms", &c.lease.as_millis().to_string()])
            .args([
                "--command-timeout-ms",
                &c.command_timeout.as_millis().to_string(),
            ]);
        if c.ignore_lease {
            cmd.arg("--ignore-lease");
        }
        if c.cut_in_line {
            cmd.arg("--cut-in-line");
        }
        let child = Arc::new(ChildProcess::spawn(cmd)?);
        child
            .wait_for_line(|l| l == "READY", Duration::from_secs(90))
            .with_context(|| format!("client {client} gen {gen} did not start"))?;
        Ok(child)
    }

    /// Spawns a client and waits for it to connect (blocking reads, off the async workers).
    async fn spawn(&self, client: u32, gen: u32) -> anyhow::Result<Slot> {
        let child = tokio::task::block_in_place(|| self.spawn_client(client, gen))?;
        let client_id = read_client_id(&client_log_path(self.dir, client, gen))?;
        Ok(Slot {
            child,
            gen,
            client_id,
        })
    }

    /// Clients holding a lock or permits right now, by the owner ids in the hashes (a
    /// writer's or plain holder's field, or a reader's or permit's `~r:<id>`).
    async fn holders(&self) -> anyhow::Result<Vec<u32>> {
        self.clients_named(|lock, _| vec!["HKEYS".into(), lock])
            .await
    }

    /// Clients waiting in the line of a lock (plain, fair or read/write) or of a semaphore right
    /// now, by the owner ids in it.
    async fn queued(&self) -> anyhow::Result<Vec<u32>> {
        self.clients_named(|lock, _| {
            vec![
                "ZRANGE".into(),
                format!("{lock}:waiters"),
                "0".into(),
                "-1".into(),
            ]
        })
        .await
    }

    /// Clients first in the line of a fair or read/write lock right now.
    async fn line_heads(&self) -> anyhow::Result<Vec<u32>> {
        self.clients_named(|lock, ty| match ty {
            LockType::Fair | LockType::ReadWrite => vec![
                "ZRANGE".into(),
                format!("{lock}:waiters"),
                "0".into(),
                "0".into(),
            ],
            // Names nobody: a key no one uses.
            _ => vec![
                "ZRANGE".into(),
                format!("{lock}:none"),
                "0".into(),
                "0".into(),
            ],
        })
        .await
    }

    /// The resources held or waited on right now (their hash, or their line, is in Redis;
    /// none when Redis does not answer).
    async fn in_use(&self) -> Vec<u32> {
        let layout = Layout::of(self.config);
        let mut in_use = Vec::new();
        for res in 0..layout.total() {
            let key = format!("{PREFIX}:{{{}}}", layout.name(res));
            let args = [
                "EXISTS",
                &key,
                &format!("{key}:queue"),
                &format!("{key}:waiters"),
            ];
            let args = args.iter().map(|a| a.to_string()).collect();
            let found = self.deployment.key_command(&key, args).await;
            if found.is_ok_and(|n| n.as_int().unwrap_or(0) > 0) {
                in_use.push(res);
            }
        }
        in_use
    }

    /// The clients named by the command `command(lock key, kind)` run for every resource:
    /// owner ids and client ids both start with the client's uuid.
    async fn clients_named(
        &self,
        command: impl Fn(String, LockType) -> Vec<String>,
    ) -> anyhow::Result<Vec<u32>> {
        let mut clients = Vec::new();
        let layout = Layout::of(self.config);
        for res in 0..layout.total() {
            let key = format!("{PREFIX}:{{{}}}", layout.name(res));
            let args = command(key.clone(), layout.lock_type(res));
            let Ok(names) = strings(self.deployment.key_command(&key, args).await) else {
                continue; // Redis paused or restarting: no one to pick
            };
            for name in names {
                // `~r:<id>`: a reader's hold or a permit; other `~` fields name nobody.
                let name = name
                    .strip_prefix(leasehold_core::protocol::READ_FIELD_PREFIX)
                    .unwrap_or(&name);
                let uuid = name.split(':').next().unwrap_or_default();
                if let Some(i) = self.slots.iter().position(|s| s.client_id == uuid) {
                    clients.push(i as u32);
                }
            }
        }
        Ok(clients)
    }
}

/// Pauses a client process (SIGSTOP) for `lasts`, then resumes it.
pub(crate) async fn pause_client(child: &Arc<ChildProcess>, lasts: Duration) -> anyhow::Result<()> {
    let paused = child.clone();
    blocking(move || paused.pause()).await??;
    sleep(lasts).await;
    let resumed = child.clone();
    blocking(move || resumed.resume()).await??;
    Ok(())
}

/// Runs a blocking call (the testkit's) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

async fn run(config: &RunConfig, dir: &Path) -> anyhow::Result<checker::Report> {
    if config.redlock > 0 {
        return crate::redlock::run(config, dir).await;
    }
    let on = if config.cluster {
        " (Redis Cluster: 3 primaries, a replica each)"
    } else {
        ""
    };
    println!(
        "leasehold chaos{on}: {} clients x {} tasks on {} locks, {} fair locks ({} % of the ops), \
         {} read/write locks ({} %), {} semaphores of {} permits ({} %) and {} latches ({} %), \
         foreign-kind attempts in {} % of the ops, for {:?}, seed {} (history in {})",
        config.clients,
        config.tasks,
        config.resources,
        config.fair_resources,
        config.fair_percent,
        config.rw_resources,
        config.rw_percent,
        config.sem_resources,
        config.sem_permits,
        config.sem_percent,
        config.latch_resources,
        config.latch_percent,
        config.foreign_percent,
        config.duration,
        config.seed,
        dir.display()
    );
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(config)?)?;
    Store::create(&dir.join("store.db"), Layout::of(config).total())?;
    let deployment = if config.cluster {
        start_cluster(config).await?
    } else {
        let redis = Arc::new(blocking(RedisServer::start).await??);
        let mut proxies = Vec::new();
        for _ in 0..config.clients {
            proxies.push(Proxy::start(redis.addr()).await?);
        }
        Deployment::Single { redis, proxies }
    };
    let mut env = Env {
        config,
        dir,
        exe: std::env::current_exe()?,
        deployment,
        slots: Vec::new(),
    };
    for client in 0..config.clients {
        let slot = env.spawn(client, 0).await?;
        env.slots.push(slot);
    }

    let started = Instant::now();
    let faults_until = started + config.duration.saturating_sub(QUIET_TAIL);
    let mut rng = Rng::new(config.seed).fork(u64::MAX);
    let mut deck = Vec::new();
    let mut faults = Vec::new();
    loop {
        sleep(Duration::from_millis(rng.range(400, 1500))).await;
        if Instant::now() >= faults_until {
            break;
        }
        if deck.is_empty() {
            // Every kind once per round, in a seeded order: short runs still see each kind.
            deck = FaultKind::of_run(config.cluster).to_vec();
            if !config.cluster && config.fair_percent + config.rw_percent > 0 {
                // Twice the added latency: it is what loses a waiter's grant reply (its
                // command timeout passes first), which the fair-order rules need to see.
                deck.push(FaultKind::ProxyLatency);
            }
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if config.cluster && faults.is_empty() {
                // The faults a cluster run is for come first, whatever the seed: a short run
                // (`cargo test`'s) still kills a primary and fails one over.
                for kind in [FaultKind::ClusterFailover, FaultKind::PrimaryKill] {
                    let at = deck.iter().position(|k| *k == kind);
                    let item = deck.remove(at.expect("every kind is in the deck"));
                    deck.push(item);
                }
            }
            if config.ignore_lease && faults.is_empty() {
                // The checker's self-test needs a holder paused past its lease (it then writes
                // anyway): first, whatever the seed and however few faults fit in the run.
                let pause = deck.iter().position(|k| *k == FaultKind::ClientPause);
                let last = deck.len() - 1;
                deck.swap(pause.expect("every kind is in the deck"), last);
            }
        }
        let kind = deck.pop().expect("refilled above");
        let fault = inject(&mut env, kind, &mut rng).await?;
        faults.push(fault);
        write_faults(&dir.join("faults.jsonl"), &faults)?;
    }
    sleep(config.duration.saturating_sub(started.elapsed())).await;

    let cleanup = stop(&env).await?;
    std::fs::write(
        dir.join("cleanup.json"),
        serde_json::to_string_pretty(&cleanup)?,
    )?;
    drop(env);
    checker::check(dir)
}

async fn inject(env: &mut Env<'_>, kind: FaultKind, rng: &mut Rng) -> anyhow::Result<Fault> {
    let clients = env.config.clients;
    let mut client = rng.below(u64::from(clients)) as u32;
    if kind == FaultKind::ClientPause && rng.chance(70) {
        // Mostly pause a holder: its lease runs out while it is stopped, someone else takes
        // the lock, and its write (if it was about to write) arrives late.
        let holders = env.holders().await?;
        if !holders.is_empty() {
            client = holders[rng.below(holders.len() as u64) as usize];
        }
    }
    if kind == FaultKind::ProxyLatency && rng.chance(70) {
        // Mostly slow the client first in the line of a fair or read/write lock, past its
        // command timeout (below): its grant's reply then comes too late, the grant is rolled
        // back in the background, and the waiter must keep its place all the same.
        let mut heads = env.line_heads().await?;
        if heads.is_empty() {
            heads = env.queued().await?;
        }
        if !heads.is_empty() {
            client = heads[rng.below(heads.len() as u64) as usize];
        }
    }
    if kind == FaultKind::ClientKill && rng.chance(70) {
        // Mostly kill a client waiting in line: its entry stays until it lapses, so a release
        // grants the lock to a waiter that never takes it, and the other waiters must not
        // sleep through it: they are held up by one lease at most, and keep their order.
        let queued = env.queued().await?;
        if !queued.is_empty() {
            client = queued[rng.below(queued.len() as u64) as usize];
        }
    }
    let gen = env.slots[client as usize].gen;
    let longest_lease = env.config.lease.max(MAX_EXPLICIT_LEASE);
    let start = now_us();
    let mut target = Some(client);
    let mut lost = None;
    let detail = match kind {
        FaultKind::ClientPause => {
            let lasts = longest_lease + Duration::from_millis(rng.range(100, 1500));
            pause_client(&env.slots[client as usize].child, lasts).await?;
            format!("{lasts:?}")
        }
        FaultKind::ClientKill => {
            let child = env.slots[client as usize].child.clone();
            blocking(move || child.kill()).await??;
            let killed_at = now_us();
            env.slots[client as usize] = env.spawn(client, gen + 1).await?;
            format!(
                "generation {} ready after {} ms",
                gen + 1,
                (now_us() - killed_at) / 1000
            )
        }
        FaultKind::KillPubsubConnections | FaultKind::KillCommandConnections => {
            target = None;
            let kind_arg = if kind == FaultKind::KillPubsubConnections {
                "pubsub"
            } else {
                "normal"
            };
            let mut killed = 0;
            for (_, node) in env.deployment.all_nodes() {
                let reply =
                    blocking(move || node.command(&["CLIENT", "KILL", "TYPE", kind_arg])).await?;
                killed += reply?.as_int().unwrap_or(-1);
            }
            format!("{killed} connections")
        }
        _ => {
            target = None;
            match &env.deployment {
                Deployment::Single { redis, proxies } => {
                    target = Some(client);
                    single_fault(redis, proxies, kind, client, rng, &mut target).await?
                }
                Deployment::Cluster { cluster, slots } => {
                    let hot = if kind == FaultKind::SlotMigration {
                        env.in_use().await
                    } else {
                        Vec::new()
                    };
                    let (detail, lost_here) =
                        cluster_fault(cluster, slots, env.config, kind, rng, hot).await?;
                    lost = Some(lost_here);
                    detail
                }
            }
        }
    };
    Ok(Fault {
        kind,
        client: target,
        gen: target.map(|_| gen),
        start,
        end: now_us(),
        detail,
        lost,
    })
}

/// A fault of the one-server run on Redis or on the proxies (`target`: the client it hit,
/// `None` when it hit every client).
async fn single_fault(
    redis: &Arc<RedisServer>,
    proxies: &[Proxy],
    kind: FaultKind,
    client: u32,
    rng: &mut Rng,
    target: &mut Option<u32>,
) -> anyhow::Result<String> {
    Ok(match kind {
        FaultKind::ProxyLatency => {
            // Mostly above half the command timeout (500 ms by default): replies come back
            // after the caller gave up on them (lost replies, settled in the background).
            let latency = if rng.chance(60) {
                Duration::from_millis(rng.range(260, 400))
            } else {
                Duration::from_millis(rng.range(50, 260))
            };
            let lasts = Duration::from_millis(rng.range(500, 2500));
            let proxy = &proxies[client as usize];
            proxy.set_latency(latency);
            sleep(lasts).await;
            proxy.set_latency(Duration::ZERO);
            format!("{latency:?} each way for {lasts:?}")
        }
        FaultKind::ProxyPartition => {
            let lasts = Duration::from_millis(rng.range(300, 3000));
            let proxy = &proxies[client as usize];
            proxy.partition();
            sleep(lasts).await;
            // Reset before healing: bytes were dropped, so these connections are out of sync.
            proxy.close_all();
            proxy.heal();
            format!("{lasts:?}")
        }
        FaultKind::ProxyCloseAll => {
            if rng.chance(50) {
                *target = None;
                for proxy in proxies {
                    proxy.close_all();
                }
                "every client".to_string()
            } else {
                proxies[client as usize].close_all();
                "one client".to_string()
            }
        }
        FaultKind::RedisRestart => {
            *target = None;
            let redis = redis.clone();
            blocking(move || redis.restart()).await??;
            "data lost".to_string()
        }
        FaultKind::RedisPause => {
            *target = None;
            let lasts = Duration::from_millis(rng.range(200, 1500));
            let r = redis.clone();
            blocking(move || r.pause()).await??;
            sleep(lasts).await;
            let r = redis.clone();
            blocking(move || r.resume()).await??;
            format!("{lasts:?}")
        }
        _ => bail!("{kind:?} is not a fault of the one-server run"),
    })
}

/// Starts the cluster and puts the resources' slots on the primaries in turn (before any
/// client runs, so nothing moves but empty slots): every primary serves some lock names.
async fn start_cluster(config: &RunConfig) -> anyhow::Result<Deployment> {
    let layout = Layout::of(config);
    let keys: Vec<String> = (0..layout.total())
        .map(|res| format!("{PREFIX}:{{{}}}", layout.name(res)))
        .collect();
    let started = Instant::now();
    let (cluster, slots, placed) = blocking(move || -> anyhow::Result<_> {
        let cluster = Arc::new(RedisCluster::start()?);
        let primaries = cluster.primaries()?;
        let mut slots = Vec::new();
        let mut placed = Vec::new();
        for (res, key) in keys.iter().enumerate() {
            let slot = cluster.key_slot(key)?;
            let to = primaries[res % primaries.len()];
            cluster.migrate_slot(slot, to)?;
            slots.push(slot);
            placed.push(format!("{} on node {to}", layout.name(res as u32)));
        }
        Ok((cluster, slots, placed))
    })
    .await??;
    println!(
        "cluster formed in {:?} (ports {}); {}",
        started.elapsed(),
        cluster
            .seeds()
            .iter()
            .map(|(_, port)| port.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        placed.join(", ")
    );
    Ok(Deployment::Cluster { cluster, slots })
}

/// The resources whose slot primary `node` serves.
fn resources_on(cluster: &RedisCluster, slots: &[u16], node: usize) -> anyhow::Result<Vec<u32>> {
    let mut on = Vec::new();
    for (res, &slot) in slots.iter().enumerate() {
        if cluster.owner_of_slot(slot)? == node {
            on.push(res as u32);
        }
    }
    Ok(on)
}

/// The primaries with a replica to take over from them.
fn primaries_with_replica(cluster: &RedisCluster) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for p in cluster.primaries()? {
        if !cluster.replicas_of(p)?.is_empty() {
            out.push(p);
        }
    }
    if out.is_empty() {
        bail!("no primary has a replica");
    }
    Ok(out)
}

/// A fault on the cluster's nodes ([`FaultKind::PrimaryKill`], [`FaultKind::ClusterFailover`],
/// [`FaultKind::NodePause`], [`FaultKind::SlotMigration`]), healed and the cluster healthy
/// again when it returns. Returns its detail and the resources whose data it may have lost
/// (those served by a primary that was killed, or replaced while paused). `hot`: resources in
/// use, whose slots a migration prefers.
async fn cluster_fault(
    cluster: &Arc<RedisCluster>,
    slots: &[u16],
    config: &RunConfig,
    kind: FaultKind,
    rng: &mut Rng,
    hot: Vec<u32>,
) -> anyhow::Result<(String, Vec<u32>)> {
    let cluster = cluster.clone();
    let slots = slots.to_vec();
    let pick = rng.next_u64() as usize;
    match kind {
        FaultKind::PrimaryKill => {
            blocking(move || -> anyhow::Result<_> {
                let primaries = primaries_with_replica(&cluster)?;
                let p = primaries[pick % primaries.len()];
                let lost = resources_on(&cluster, &slots, p)?;
                let port = cluster.node(p).port();
                let killed = Instant::now();
                cluster.kill(p)?;
                cluster.wait_taken_over(p)?;
                let taken_over = killed.elapsed();
                cluster.rejoin(p)?;
                Ok((
                    format!(
                        "node {p} (port {port}) killed, its replica serving after {} ms, the \
                         node back as a replica after {} ms; resources on it: {lost:?}",
                        taken_over.as_millis(),
                        killed.elapsed().as_millis()
                    ),
                    lost,
                ))
            })
            .await?
        }
        FaultKind::ClusterFailover => {
            blocking(move || -> anyhow::Result<_> {
                let primaries = primaries_with_replica(&cluster)?;
                let p = primaries[pick % primaries.len()];
                let began = Instant::now();
                let promoted = cluster.failover(p)?;
                Ok((
                    format!(
                        "node {promoted} took over from node {p} in {} ms",
                        began.elapsed().as_millis()
                    ),
                    Vec::new(), // coordinated: the replica caught up first
                ))
            })
            .await?
        }
        FaultKind::NodePause => {
            // Below the node timeout (2 s), so the cluster does not fail the node over.
            let lasts = Duration::from_millis(rng.range(200, 1200));
            blocking(move || -> anyhow::Result<_> {
                let node = pick % cluster.nodes().len();
                let primary = cluster.primaries()?.contains(&node);
                let on = if primary {
                    resources_on(&cluster, &slots, node)?
                } else {
                    Vec::new()
                };
                cluster.pause(node)?;
                std::thread::sleep(lasts);
                cluster.resume(node)?;
                cluster.wait_healthy("the cluster after a node pause", Duration::from_secs(20))?;
                // Should a replica have taken over all the same (a loaded machine), the writes
                // the paused primary had not sent it are lost: counted as after a primary kill.
                let replaced = primary && !cluster.primaries()?.contains(&node);
                let role = if primary { "primary" } else { "replica" };
                Ok((
                    format!(
                        "{role} node {node} for {lasts:?}{}",
                        if replaced {
                            " (replaced by its replica meanwhile)"
                        } else {
                            ""
                        }
                    ),
                    if replaced { on } else { Vec::new() },
                ))
            })
            .await?
        }
        FaultKind::SlotMigration => {
            // Mostly a slot with a lock in it, held or waited on.
            let res = if !hot.is_empty() && rng.chance(80) {
                hot[rng.below(hot.len() as u64) as usize]
            } else {
                rng.below(slots.len() as u64) as u32
            };
            let dwell = Duration::from_millis(rng.range(100, 800));
            let name = Layout::of(config).name(res);
            blocking(move || -> anyhow::Result<_> {
                let slot = slots[res as usize];
                let from = cluster.owner_of_slot(slot)?;
                let others: Vec<usize> = cluster
                    .primaries()?
                    .into_iter()
                    .filter(|&p| p != from)
                    .collect();
                let to = others[pick % others.len()];
                let moved = cluster.migrate_slot_with(slot, to, dwell)?;
                Ok((
                    format!(
                        "slot {slot} ({name}) from node {from} to node {to}, {moved} keys, half \
                         moved for {dwell:?}"
                    ),
                    Vec::new(),
                ))
            })
            .await?
        }
        _ => bail!("{kind:?} is not a fault of the cluster run"),
    }
}

/// The first half of a stop: SIGTERM to every client still running (those that are not are
/// recorded in `crashed`), then each one's `DRAINED`.
pub(crate) async fn drain_clients(
    children: &[(Arc<ChildProcess>, u32)],
    crashed: &mut Vec<String>,
) -> anyhow::Result<()> {
    for (client, (child, gen)) in children.iter().enumerate() {
        if !child.is_running() {
            crashed.push(format!(
                "client {client} gen {gen} exited during the run: {:?}",
                child.try_wait()
            ));
            continue;
        }
        kill(Pid::from_raw(child.pid() as i32), Signal::SIGTERM)?;
    }
    let mut readers = Vec::new();
    for (child, _) in children {
        let child = child.clone();
        readers.push(tokio::task::spawn_blocking(move || {
            child.wait_for_line(
                |l| l.starts_with("DRAINED"),
                DRAIN_DEADLINE + Duration::from_secs(20),
            )
        }));
    }
    for (client, reader) in readers.into_iter().enumerate() {
        if let Err(error) = reader.await? {
            crashed.push(format!("client {client} did not drain: {error}"));
        }
    }
    Ok(())
}

/// The second half: SIGUSR1 to every drained client, and its exit status.
pub(crate) async fn exit_clients(
    children: &[(Arc<ChildProcess>, u32)],
    crashed: &mut Vec<String>,
) -> anyhow::Result<()> {
    for (client, (child, gen)) in children.iter().enumerate() {
        if child.is_running() {
            kill(Pid::from_raw(child.pid() as i32), Signal::SIGUSR1)?;
        }
        let child = child.clone();
        let status = blocking(move || child.wait_timeout(Duration::from_secs(20))).await?;
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => crashed.push(format!("client {client} gen {gen} exited with {status}")),
            Err(error) => crashed.push(format!("client {client} gen {gen} did not exit: {error}")),
        }
    }
    Ok(())
}

/// Stops every client cleanly and records what was left in Redis (on every node of a
/// cluster: channels on any node, keys on the primaries).
async fn stop(env: &Env<'_>) -> anyhow::Result<Cleanup> {
    let mut cleanup = Cleanup::default();
    let children: Vec<(Arc<ChildProcess>, u32)> = env
        .slots
        .iter()
        .map(|slot| (slot.child.clone(), slot.gen))
        .collect();
    drain_clients(&children, &mut cleanup.crashed).await?;

    // Every client is idle and still connected: no release channel may stay subscribed.
    // (Unsubscribing runs in the background, hence a deadline rather than one look.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = Vec::new();
        for (label, node) in env.deployment.all_nodes() {
            let channels = blocking(move || -> anyhow::Result<_> {
                let pattern = format!("{PREFIX}:*");
                let mut channels = strings(node.command(&["PUBSUB", "CHANNELS", &pattern]))?;
                // Sharded channels (`SSUBSCRIBE`, Redis 7), on the node serving their slot.
                if let Ok(sharded) = strings(node.command(&["PUBSUB", "SHARDCHANNELS", &pattern])) {
                    channels.extend(sharded);
                }
                Ok(channels)
            })
            .await??;
            left.extend(channels.into_iter().map(|c| format!("{label}{c}")));
        }
        if left.is_empty() || Instant::now() >= deadline {
            cleanup.channels_left = left;
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }

    exit_clients(&children, &mut cleanup.crashed).await?;

    // Keys: lock hashes end with their lease, turn reservations with the 25 ms grace, turn
    // queues with max(lease) + 10 s after the last waiter joined. The fencing counter stays by
    // design, and so do the semaphores' hashes and permit leases (looked at below).
    let layout = Layout::of(env.config);
    let first_sem = layout.first(LockType::Semaphore);
    let semaphores: Vec<String> = (first_sem..first_sem + layout.sem)
        .map(|res| format!("{PREFIX}:{{{}}}", layout.name(res)))
        .collect();
    let semaphore_key = |key: &str| {
        semaphores
            .iter()
            .any(|hash| key == hash || key.strip_prefix(hash.as_str()) == Some(":leases"))
    };
    // A latch still counting down keeps its count with no TTL by design (looked at below).
    let latches: Vec<String> = layout
        .of_type(LockType::Latch)
        .map(|res| format!("{PREFIX}:{{{}}}", layout.name(res)))
        .collect();
    let exited = Instant::now();
    let deadline = exited + env.config.lease.max(MAX_EXPLICIT_LEASE) + Duration::from_secs(15);
    let nodes = env.deployment.data_nodes().await?;
    let mut first = true;
    loop {
        let mut others = Vec::new();
        let mut fences = 0;
        for (label, node) in &nodes {
            let n = node.clone();
            let keys = blocking(move || scan(&*n, &format!("{PREFIX}:*"))).await??;
            for key in keys {
                if is_fence_counter(&key) {
                    fences += 1;
                } else if semaphore_key(&key) {
                    if first {
                        cleanup.semaphore_keys.push(format!("{label}{key}"));
                    }
                } else if latches.contains(&key) {
                    if first {
                        cleanup.latch_keys.push(format!("{label}{key}"));
                    }
                } else {
                    others.push((label.clone(), node.clone(), key));
                }
            }
        }
        if first {
            first = false;
            cleanup.fence_keys = fences;
            for (label, node, key) in &others {
                cleanup.keys_at_exit.push(format!("{label}{key}"));
                let (node, k) = (node.clone(), key.clone());
                let ttl = blocking(move || node.command(&["PTTL", &k])).await??;
                if ttl.as_int() == Some(-1) {
                    cleanup.keys_without_ttl.push(format!("{label}{key}"));
                }
            }
        }
        if others.is_empty() || Instant::now() >= deadline {
            cleanup.keys_left = others
                .into_iter()
                .map(|(label, _, key)| format!("{label}{key}"))
                .collect();
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    cleanup.expiry_wait_ms = exited.elapsed().as_millis() as u64;
    for hash in semaphores {
        let node = env.deployment.node_of(&hash).await?;
        let mut left = blocking(move || semaphore_left(&*node, &hash)).await??;
        left.expected_permits = Some(i64::from(env.config.sem_permits));
        cleanup.semaphores.push(left);
    }
    for hash in latches {
        let node = env.deployment.node_of(&hash).await?;
        if let Some(left) = blocking(move || latch_left(&*node, &hash)).await?? {
            cleanup.latches.push(left);
        }
    }
    Ok(cleanup)
}

/// Latch `hash` as Redis has it, if it is there: its fields and its TTL.
fn latch_left(redis: &dyn Node, hash: &str) -> anyhow::Result<Option<LatchLeft>> {
    let items = strings(redis.command(&["HGETALL", hash]))?;
    if items.is_empty() {
        return Ok(None);
    }
    let fields = items
        .chunks(2)
        .filter_map(|pair| Some((pair.first()?.clone(), pair.get(1)?.clone())))
        .collect();
    let pttl = redis.command(&["PTTL", hash])?.as_int().unwrap_or(-2);
    Ok(Some(LatchLeft {
        name: hash.to_string(),
        fields,
        pttl,
    }))
}

/// Semaphore `hash` as Redis has it: its number, its count of permits taken, and each
/// acquisition still listed with how long its lease still runs.
fn semaphore_left(redis: &dyn Node, hash: &str) -> anyhow::Result<SemaphoreLeft> {
    let pairs = |reply: RespValue| -> anyhow::Result<Vec<(String, String)>> {
        let items = strings(Ok::<_, anyhow::Error>(reply))?;
        Ok(items
            .chunks(2)
            .filter_map(|pair| Some((pair.first()?.clone(), pair.get(1)?.clone())))
            .collect())
    };
    let fields = pairs(redis.command(&["HGETALL", hash])?)?;
    let leases_key = format!("{hash}:leases");
    let leases = pairs(redis.command(&["ZRANGE", &leases_key, "0", "-1", "WITHSCORES"])?)?;
    let time = strings(redis.command(&["TIME"]))?;
    let now_ms = match &time[..] {
        [secs, micros] => secs.parse::<i64>()? * 1000 + micros.parse::<i64>()? / 1000,
        _ => bail!("TIME reply {time:?}"),
    };
    let number = |field: &str| {
        fields
            .iter()
            .find(|(f, _)| f == field)
            .and_then(|(_, v)| v.parse::<i64>().ok())
    };
    let lease_of = |member: &str| {
        leases
            .iter()
            .find(|(m, _)| m == member)
            .and_then(|(_, score)| score.parse::<f64>().ok())
            .map(|deadline| deadline as i64 - now_ms)
    };
    let held: Vec<(String, i64, Option<i64>)> = fields
        .iter()
        .filter(|(f, _)| f.starts_with(leasehold_core::protocol::READ_FIELD_PREFIX))
        .map(|(f, v)| {
            let id = f
                .trim_start_matches(leasehold_core::protocol::READ_FIELD_PREFIX)
                .to_string();
            (id, v.parse().unwrap_or(0), lease_of(f))
        })
        .collect();
    let leases_without_permits = leases
        .iter()
        .filter(|(m, _)| !fields.iter().any(|(f, _)| f == m))
        .count();
    use leasehold_core::protocol::{
        GRANTED_FIELD_PREFIX, KIND_FIELD, PERMITS_FIELD, READ_FENCE_FIELD_PREFIX,
        READ_FIELD_PREFIX, USED_FIELD,
    };
    // (`~kind` is a semaphore's only with the value `semaphore`.)
    let other_fields = fields
        .iter()
        .filter(|(f, v)| f != KIND_FIELD || v != leasehold_core::Stored::Semaphore.marker())
        .map(|(f, _)| f)
        .filter(|f| ![PERMITS_FIELD, USED_FIELD].contains(&f.as_str()))
        .filter(|f| {
            ![
                READ_FIELD_PREFIX,
                READ_FENCE_FIELD_PREFIX,
                GRANTED_FIELD_PREFIX,
            ]
            .iter()
            .any(|prefix| f.starts_with(prefix))
        })
        .cloned()
        .collect();
    let pttl = redis.command(&["PTTL", hash])?.as_int();
    Ok(SemaphoreLeft {
        name: hash.to_string(),
        permits: number(PERMITS_FIELD),
        used: number(USED_FIELD).unwrap_or(0),
        held,
        leases_without_permits,
        pttl,
        other_fields,
        expected_permits: None,
    })
}

/// The strings of an array reply.
pub(crate) fn strings<E: Into<anyhow::Error>>(
    reply: Result<RespValue, E>,
) -> anyhow::Result<Vec<String>> {
    let reply = reply.map_err(Into::into)?;
    let Some(items) = reply.as_array() else {
        bail!("expected an array, got {reply:?}");
    };
    Ok(items.iter().filter_map(|v| v.as_str()).collect())
}

/// Whether `key` is a slot's fencing counter, `P:{<digits>}:fence` (the layout of
/// `leasehold::LockKeys::fence`).
pub(crate) fn is_fence_counter(key: &str) -> bool {
    key.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix(":{"))
        .and_then(|rest| rest.strip_suffix("}:fence"))
        .is_some_and(|tag| !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_digit()))
}

/// Every key of `redis` matching `pattern`, sorted.
pub(crate) fn scan(redis: &dyn Node, pattern: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = redis.command(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])?;
        let parts = reply.as_array().context("SCAN reply")?;
        cursor = parts[0].as_str().context("SCAN cursor")?;
        out.extend(strings(Ok::<_, anyhow::Error>(parts[1].clone()))?);
        if cursor == "0" {
            break;
        }
    }
    out.sort();
    Ok(out)
}
