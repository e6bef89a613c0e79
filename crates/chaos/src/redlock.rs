//! The RedLock mode (`run --redlock N`): N independent redis-servers, and client processes
//! that take [`leasehold::RedLock`] quorum locks over all of them (`redlock_worker.rs`), each
//! through a proxy of its own per server, so that a partition or latency can hit one server
//! for everyone, or one client's link to one server.
//!
//! Faults, one at a time on a seeded schedule (every kind once per round of the deck):
//! - one server killed and restarted (its data lost, down for up to a second in between),
//!   paused, partitioned from every client, slowed past the per-server timeout, or its
//!   connections reset;
//! - one client's link to one server partitioned or slowed;
//! - a minority of the servers ((N-1)/2) down at once (each paused, partitioned or killed and
//!   restarted): a quorum is still there, acquires must go on;
//! - a majority (N/2+1) down at once (paused or partitioned): no acquire may be granted while
//!   it lasts (`QuorumUnreachable`, or a wait that times out);
//! - a client paused past its lease (mostly a holder), or killed and respawned.
//!
//! So at most a minority of the servers is down most of the time, and a majority now and then
//! (one fault in eleven). The history, the store's writes and what was left on each server are
//! judged by `redlock_check.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold_testkit::{ChildProcess, Proxy, RedisServer};
use serde::{Deserialize, Serialize};
use tokio::time::{sleep, Instant};

use crate::checker;
use crate::clock::now_us;
use crate::history::{Kind, ReleaseHow};
use crate::orchestrator::{
    blocking, drain_clients, exit_clients, is_fence_counter, pause_client, scan, strings,
};
use crate::rng::Rng;
use crate::run::RunConfig;
use crate::store::Store;
use crate::worker::MAX_EXPLICIT_LEASE;

/// Key prefix of a RedLock run, on every server.
pub const PREFIX: &str = "chaos";
/// No fault starts in the last part of the run, so every fault has healed before the stop.
const QUIET_TAIL: Duration = Duration::from_secs(2);

/// The name of RedLock resource `res`.
pub fn lock_name(res: u32) -> String {
    format!("rl-{res}")
}

/// One line of a RedLock client's history (`rl-events-c<client>-g<gen>.jsonl`). Server
/// numbers are the orchestrator's (the same in every client), not the RedLock's canonical
/// indices (which follow each client's proxy addresses): the client maps them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum QEvent {
    /// The process connected to every server. `client_ids`: the uuid that starts the owner
    /// ids of each of its clients, by server number.
    Start {
        t: i64,
        pid: u32,
        tasks: u32,
        client_ids: Vec<String>,
        /// The server number of each of the RedLock's canonical indices in this process (by
        /// its proxies' addresses: it differs between processes).
        #[serde(default)]
        canonical: Vec<u32>,
    },
    /// An acquire call starts (taken before the call).
    Begin {
        t: i64,
        op: u64,
        task: u32,
        kind: Kind,
        res: u32,
        lease_ms: Option<u64>,
        wait_ms: Option<u64>,
    },
    /// The call returned a quorum guard (taken after it returned): its token by server number
    /// (`None`: that server is not a member) and its members.
    Granted {
        t: i64,
        op: u64,
        tokens: Vec<Option<u64>>,
        members: Vec<u32>,
    },
    /// The call returned no guard (busy, or the wait ran out).
    NotGranted { t: i64, op: u64 },
    /// The call returned an error; `unreachable`: `QuorumUnreachable`.
    Failed {
        t: i64,
        op: u64,
        unreachable: bool,
        error: String,
    },
    /// `held` is `guard.is_held()`, read right after `t` was taken (only ever goes from true
    /// to false, so a true sample proves the belief from the grant through `t`).
    Check { t: i64, op: u64, held: bool },
    /// `guard.lost()` completed (fewer than a quorum of members still certainly valid).
    Lost { t: i64, op: u64 },
    /// The fenced write (`t` read inside the store's transaction).
    Write { t: i64, op: u64, accepted: bool },
    /// The guard was released (`unlock()`, with its outcome) or dropped.
    Released {
        t: i64,
        op: u64,
        how: ReleaseHow,
        outcome: String,
    },
    /// The op was still running at the drain deadline.
    Abandoned { t: i64, op: u64 },
    /// Every task stopped; what the process's clients still had registered, summed.
    Drained {
        t: i64,
        waiters: usize,
        channels: usize,
        holds: usize,
    },
}

pub fn client_log_path(dir: &Path, client: u32, gen: u32) -> PathBuf {
    dir.join(format!("rl-events-c{client}-g{gen}.jsonl"))
}

/// A client process's RedLock history.
#[derive(Clone, Debug)]
pub struct QHistory {
    pub client: u32,
    pub gen: u32,
    pub events: Vec<QEvent>,
    pub torn_lines: usize,
}

/// Every `rl-events-c*-g*.jsonl` in `dir`.
pub fn read_histories(dir: &Path) -> anyhow::Result<Vec<QHistory>> {
    use std::io::BufRead;
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((client, gen)) = name
            .strip_prefix("rl-events-c")
            .and_then(|r| r.strip_suffix(".jsonl"))
            .and_then(|r| r.split_once("-g"))
        else {
            continue;
        };
        let (client, gen) = (client.parse()?, gen.parse()?);
        let mut events = Vec::new();
        let mut torn_lines = 0;
        for line in std::io::BufReader::new(std::fs::File::open(&path)?).lines() {
            match serde_json::from_str(&line?) {
                Ok(event) => events.push(event),
                Err(_) => torn_lines += 1,
            }
        }
        out.push(QHistory {
            client,
            gen,
            events,
            torn_lines,
        });
    }
    out.sort_by_key(|h| (h.client, h.gen));
    Ok(out)
}

/// What the orchestrator injected in a RedLock run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QFaultKind {
    /// One server SIGKILLed, down a while, restarted on its port: its data lost.
    ServerRestart,
    /// One server SIGSTOPped, then SIGCONTed.
    ServerPause,
    /// Every client's proxy to one server drops all traffic; connections reset on healing.
    ServerPartition,
    /// Every client's proxy to one server adds latency (often past the per-server timeout).
    ServerLatency,
    /// Every client connection to one server reset.
    ServerCloseAll,
    /// One client's proxy to one server partitioned.
    LinkPartition,
    /// One client's proxy to one server slowed.
    LinkLatency,
    /// (N-1)/2 servers down at once, each paused, partitioned or killed and restarted.
    MinorityDown,
    /// N/2+1 servers down at once (paused or partitioned): no quorum anywhere.
    MajorityDown,
    /// SIGSTOP a client process past its lease (mostly a holder), then SIGCONT.
    ClientPause,
    /// SIGKILL a client process; a new generation is spawned in its place.
    ClientKill,
}

impl QFaultKind {
    pub const ALL: [QFaultKind; 11] = [
        QFaultKind::ServerRestart,
        QFaultKind::ServerPause,
        QFaultKind::ServerPartition,
        QFaultKind::ServerLatency,
        QFaultKind::ServerCloseAll,
        QFaultKind::LinkPartition,
        QFaultKind::LinkLatency,
        QFaultKind::MinorityDown,
        QFaultKind::MajorityDown,
        QFaultKind::ClientPause,
        QFaultKind::ClientKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QFaultKind::ServerRestart => "server restart (data lost)",
            QFaultKind::ServerPause => "server SIGSTOP",
            QFaultKind::ServerPartition => "server partitioned from all",
            QFaultKind::ServerLatency => "server latency for all",
            QFaultKind::ServerCloseAll => "server connections reset",
            QFaultKind::LinkPartition => "one client-server link partitioned",
            QFaultKind::LinkLatency => "one client-server link latency",
            QFaultKind::MinorityDown => "a minority of servers down",
            QFaultKind::MajorityDown => "a majority of servers down",
            QFaultKind::ClientPause => "client SIGSTOP past its lease",
            QFaultKind::ClientKill => "client SIGKILL + respawn",
        }
    }

    /// Whether the fault hits one client only (the others see nothing of it).
    pub fn client_only(self) -> bool {
        matches!(
            self,
            QFaultKind::LinkPartition
                | QFaultKind::LinkLatency
                | QFaultKind::ClientPause
                | QFaultKind::ClientKill
        )
    }
}

/// One injected fault, active from `start` until `end` (healed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QFault {
    pub kind: QFaultKind,
    /// The servers it hit.
    pub servers: Vec<u32>,
    /// The client it hit (link faults, pauses, kills), if one.
    pub client: Option<u32>,
    pub gen: Option<u32>,
    pub start: i64,
    pub end: i64,
    /// Servers that lost their data, each with the instant it was killed (SIGKILL sent after).
    #[serde(default)]
    pub data_lost: Vec<(u32, i64)>,
    /// For [`QFaultKind::MajorityDown`]: from when (every server down) until when (none healed
    /// yet) no quorum could answer anyone.
    #[serde(default)]
    pub no_quorum: Option<(i64, i64)>,
    pub detail: String,
}

/// What was left on the servers after the clients stopped (`rl-cleanup.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QCleanup {
    pub crashed: Vec<String>,
    /// `server: channel` still subscribed after every client drained.
    pub channels_left: Vec<String>,
    /// `server: key` (not a fencing counter) right after the clients exited.
    pub keys_at_exit: Vec<String>,
    /// Of those, keys without a TTL.
    pub keys_without_ttl: Vec<String>,
    /// Keys still there once every TTL could have run out.
    pub keys_left: Vec<String>,
    /// Fencing counters (kept by design), on all servers.
    pub fence_keys: usize,
    pub expiry_wait_ms: u64,
    /// Script calls (EVALSHA) each server counted since its last start: tries, releases and
    /// renewals. A restart resets a server's count, so the sum is a lower bound.
    #[serde(default)]
    pub server_script_calls: Vec<u64>,
}

struct Slot {
    child: Arc<ChildProcess>,
    gen: u32,
    /// The uuids of its clients' owner ids (one per server).
    client_ids: Vec<String>,
}

struct Env<'a> {
    config: &'a RunConfig,
    dir: &'a Path,
    exe: PathBuf,
    servers: Vec<Arc<RedisServer>>,
    /// `proxies[client][server]`.
    proxies: Vec<Vec<Proxy>>,
    slots: Vec<Slot>,
}

impl Env<'_> {
    fn spawn_client(&self, client: u32, gen: u32) -> anyhow::Result<Arc<ChildProcess>> {
        let c = self.config;
        let urls: Vec<String> = self.proxies[client as usize]
            .iter()
            .map(Proxy::url)
            .collect();
        let mut cmd = Command::new(&self.exe);
        cmd.arg("redlock-client")
            .args(["--urls", &urls.join(",")])
            .args(["--prefix", PREFIX])
            .args(["--client", &client.to_string()])
            .args(["--gen", &gen.to_string()])
            .arg("--dir")
            .arg(self.dir)
            .args(["--seed", &c.seed.to_string()])
            .args(["--tasks", &c.tasks.to_string()])
            .args(["--resources", &c.resources.to_string()])
            .args(["--lease-ms", &c.lease.as_millis().to_string()])
            .args([
                "--command-timeout-ms",
                &c.command_timeout.as_millis().to_string(),
            ]);
        if c.ignore_lease {
            cmd.arg("--ignore-lease");
        }
        let child = Arc::new(ChildProcess::spawn(cmd)?);
        child
            .wait_for_line(|l| l == "READY", Duration::from_secs(90))
            .with_context(|| format!("redlock client {client} gen {gen} did not start"))?;
        Ok(child)
    }

    async fn spawn(&self, client: u32, gen: u32) -> anyhow::Result<Slot> {
        let child = tokio::task::block_in_place(|| self.spawn_client(client, gen))?;
        let path = client_log_path(self.dir, client, gen);
        let text = std::fs::read_to_string(&path)?;
        let client_ids = text
            .lines()
            .find_map(|l| match serde_json::from_str(l) {
                Ok(QEvent::Start { client_ids, .. }) => Some(client_ids),
                _ => None,
            })
            .with_context(|| format!("no start event in {}", path.display()))?;
        Ok(Slot {
            child,
            gen,
            client_ids,
        })
    }

    /// Clients holding a member of some RedLock on some server right now, by the owner ids in
    /// the lock hashes (servers paused or down are skipped).
    async fn holders(&self) -> Vec<u32> {
        let mut holders = Vec::new();
        for server in &self.servers {
            for res in 0..self.config.resources {
                let redis = server.clone();
                let key = format!("{PREFIX}:{{{}}}", lock_name(res));
                let Ok(Ok(names)) =
                    blocking(move || strings(redis.command(&["HKEYS", &key]))).await
                else {
                    continue;
                };
                for name in names {
                    let uuid = name.split(':').next().unwrap_or_default();
                    if let Some(i) = self
                        .slots
                        .iter()
                        .position(|s| s.client_ids.iter().any(|id| id == uuid))
                    {
                        holders.push(i as u32);
                    }
                }
            }
        }
        holders
    }
}

/// A whole RedLock experiment: servers, proxies, clients, faults, the stop, the checker.
pub async fn run(config: &RunConfig, dir: &Path) -> anyhow::Result<checker::Report> {
    let n = config.redlock;
    println!(
        "leasehold chaos (RedLock): {} servers (quorum {}), {} clients x {} tasks on {} \
         RedLocks for {:?}, seed {} (history in {})",
        n,
        n / 2 + 1,
        config.clients,
        config.tasks,
        config.resources,
        config.duration,
        config.seed,
        dir.display()
    );
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(config)?)?;
    Store::create(&dir.join("store.db"), 0)?;
    Store::create_quorum(&dir.join("store.db"), config.resources)?;
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(Arc::new(blocking(RedisServer::start).await??));
    }
    let mut proxies = Vec::new();
    for _ in 0..config.clients {
        let mut row = Vec::new();
        for server in &servers {
            row.push(Proxy::start(server.addr()).await?);
        }
        proxies.push(row);
    }
    let mut env = Env {
        config,
        dir,
        exe: std::env::current_exe()?,
        servers,
        proxies,
        slots: Vec::new(),
    };
    for client in 0..config.clients {
        let slot = env.spawn(client, 0).await?;
        env.slots.push(slot);
    }

    let started = Instant::now();
    let faults_until = started + config.duration.saturating_sub(QUIET_TAIL);
    let mut rng = Rng::new(config.seed).fork(u64::MAX - 1);
    let mut deck = Vec::new();
    let mut faults = Vec::new();
    loop {
        sleep(Duration::from_millis(rng.range(300, 1200))).await;
        if Instant::now() >= faults_until {
            break;
        }
        if deck.is_empty() {
            deck = QFaultKind::ALL.to_vec();
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if config.ignore_lease && faults.is_empty() {
                // The self-test needs a holder paused past its lease: first.
                let pause = deck.iter().position(|k| *k == QFaultKind::ClientPause);
                let last = deck.len() - 1;
                deck.swap(pause.expect("every kind is in the deck"), last);
            }
        }
        let kind = deck.pop().expect("refilled above");
        let fault = inject(&mut env, kind, &mut rng).await?;
        faults.push(fault);
        let mut text = String::new();
        for fault in &faults {
            text.push_str(&serde_json::to_string(fault)?);
            text.push('\n');
        }
        std::fs::write(dir.join("rl-faults.jsonl"), text)?;
    }
    sleep(config.duration.saturating_sub(started.elapsed())).await;

    let cleanup = stop(&env).await?;
    std::fs::write(
        dir.join("rl-cleanup.json"),
        serde_json::to_string_pretty(&cleanup)?,
    )?;
    drop(env);
    crate::redlock_check::check(dir)
}

/// How one server of a multi-server fault goes down.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Down {
    Pause,
    Partition,
    Kill,
}

/// Takes `server` down the `how` way; returns the instant its data was lost, for a kill.
async fn take_down(env: &Env<'_>, server: usize, how: Down) -> anyhow::Result<Option<i64>> {
    match how {
        Down::Pause => {
            let redis = env.servers[server].clone();
            blocking(move || redis.pause()).await??;
            Ok(None)
        }
        Down::Partition => {
            for row in &env.proxies {
                row[server].partition();
            }
            Ok(None)
        }
        Down::Kill => {
            let t = now_us();
            let redis = env.servers[server].clone();
            blocking(move || redis.kill()).await??;
            Ok(Some(t))
        }
    }
}

async fn bring_up(env: &Env<'_>, server: usize, how: Down) -> anyhow::Result<()> {
    match how {
        Down::Pause => {
            let redis = env.servers[server].clone();
            blocking(move || redis.resume()).await??;
        }
        Down::Partition => {
            for row in &env.proxies {
                // Reset before healing: bytes were dropped, these connections are out of sync.
                row[server].close_all();
                row[server].heal();
            }
        }
        Down::Kill => {
            let redis = env.servers[server].clone();
            blocking(move || redis.restart()).await??;
        }
    }
    Ok(())
}

/// `k` distinct servers of `n`, drawn from `rng`.
fn pick_servers(rng: &mut Rng, n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    all.truncate(k);
    all.sort_unstable();
    all
}

async fn inject(env: &mut Env<'_>, kind: QFaultKind, rng: &mut Rng) -> anyhow::Result<QFault> {
    let n = env.servers.len();
    let clients = env.config.clients;
    let mut client = rng.below(u64::from(clients)) as u32;
    if kind == QFaultKind::ClientPause && rng.chance(70) {
        let holders = env.holders().await;
        if !holders.is_empty() {
            client = holders[rng.below(holders.len() as u64) as usize];
        }
    }
    let server = rng.below(n as u64) as usize;
    let gen = env.slots[client as usize].gen;
    let start = now_us();
    let mut servers = vec![server as u32];
    let mut target = kind.client_only().then_some(client);
    let mut data_lost = Vec::new();
    let mut no_quorum = None;
    let detail = match kind {
        QFaultKind::ServerRestart => {
            let down = Duration::from_millis(rng.range(0, 1000));
            data_lost.push((
                server as u32,
                take_down(env, server, Down::Kill).await?.unwrap(),
            ));
            sleep(down).await;
            bring_up(env, server, Down::Kill).await?;
            format!("server {server} down {down:?}")
        }
        QFaultKind::ServerPause | QFaultKind::ServerPartition => {
            let how = if kind == QFaultKind::ServerPause {
                Down::Pause
            } else {
                Down::Partition
            };
            let lasts = Duration::from_millis(rng.range(200, 2500));
            take_down(env, server, how).await?;
            sleep(lasts).await;
            bring_up(env, server, how).await?;
            format!("server {server} for {lasts:?}")
        }
        QFaultKind::ServerLatency => {
            let latency = Duration::from_millis(rng.range(20, 300));
            let lasts = Duration::from_millis(rng.range(500, 2500));
            for row in &env.proxies {
                row[server].set_latency(latency);
            }
            sleep(lasts).await;
            for row in &env.proxies {
                row[server].set_latency(Duration::ZERO);
            }
            format!("server {server}: {latency:?} each way for {lasts:?}")
        }
        QFaultKind::ServerCloseAll => {
            for row in &env.proxies {
                row[server].close_all();
            }
            format!("server {server}")
        }
        QFaultKind::LinkPartition => {
            let lasts = Duration::from_millis(rng.range(300, 3000));
            let proxy = &env.proxies[client as usize][server];
            proxy.partition();
            sleep(lasts).await;
            proxy.close_all();
            proxy.heal();
            format!("client {client} - server {server} for {lasts:?}")
        }
        QFaultKind::LinkLatency => {
            let latency = Duration::from_millis(rng.range(20, 300));
            let lasts = Duration::from_millis(rng.range(500, 2500));
            let proxy = &env.proxies[client as usize][server];
            proxy.set_latency(latency);
            sleep(lasts).await;
            proxy.set_latency(Duration::ZERO);
            format!("client {client} - server {server}: {latency:?} each way for {lasts:?}")
        }
        QFaultKind::MinorityDown | QFaultKind::MajorityDown => {
            let k = if kind == QFaultKind::MinorityDown {
                (n - 1) / 2
            } else {
                n / 2 + 1
            };
            let picked = pick_servers(rng, n, k);
            let lasts = Duration::from_millis(rng.range(500, 2500));
            let mut hows = Vec::new();
            for &s in &picked {
                let how = match rng.below(if kind == QFaultKind::MinorityDown {
                    3
                } else {
                    2
                }) {
                    0 => Down::Pause,
                    1 => Down::Partition,
                    _ => Down::Kill,
                };
                if let Some(t) = take_down(env, s, how).await? {
                    data_lost.push((s as u32, t));
                }
                hows.push(how);
            }
            let all_down = now_us();
            sleep(lasts).await;
            let healing = now_us();
            for (&s, &how) in picked.iter().zip(&hows) {
                bring_up(env, s, how).await?;
            }
            if kind == QFaultKind::MajorityDown {
                no_quorum = Some((all_down, healing));
            }
            servers = picked.iter().map(|&s| s as u32).collect();
            let list: Vec<String> = picked
                .iter()
                .zip(&hows)
                .map(|(s, how)| format!("{s} {how:?}"))
                .collect();
            format!("servers [{}] for {lasts:?}", list.join(", "))
        }
        QFaultKind::ClientPause => {
            servers.clear();
            let lasts = env.config.lease.max(MAX_EXPLICIT_LEASE)
                + Duration::from_millis(rng.range(100, 1500));
            pause_client(&env.slots[client as usize].child, lasts).await?;
            format!("client {client} for {lasts:?}")
        }
        QFaultKind::ClientKill => {
            servers.clear();
            let child = env.slots[client as usize].child.clone();
            blocking(move || child.kill()).await??;
            let killed_at = now_us();
            env.slots[client as usize] = env.spawn(client, gen + 1).await?;
            format!(
                "client {client}: generation {} ready after {} ms",
                gen + 1,
                (now_us() - killed_at) / 1000
            )
        }
    };
    if !kind.client_only() {
        target = None;
    }
    Ok(QFault {
        kind,
        servers,
        client: target,
        gen: target.map(|_| gen),
        start,
        end: now_us(),
        data_lost,
        no_quorum,
        detail,
    })
}

/// Stops every client cleanly and records what was left on each server.
async fn stop(env: &Env<'_>) -> anyhow::Result<QCleanup> {
    let mut cleanup = QCleanup::default();
    let children: Vec<(Arc<ChildProcess>, u32)> = env
        .slots
        .iter()
        .map(|slot| (slot.child.clone(), slot.gen))
        .collect();
    drain_clients(&children, &mut cleanup.crashed).await?;

    // Every client idle and still connected: no release channel may stay subscribed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = Vec::new();
        for (i, server) in env.servers.iter().enumerate() {
            let redis = server.clone();
            let channels = blocking(move || {
                strings(redis.command(&["PUBSUB", "CHANNELS", &format!("{PREFIX}:*")]))
            })
            .await??;
            left.extend(channels.into_iter().map(|c| format!("server {i}: {c}")));
        }
        if left.is_empty() || Instant::now() >= deadline {
            cleanup.channels_left = left;
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }

    exit_clients(&children, &mut cleanup.crashed).await?;

    // Every member ends with its lease (or its release); the fencing counters stay by design.
    let exited = Instant::now();
    let deadline = exited + env.config.lease.max(MAX_EXPLICIT_LEASE) + Duration::from_secs(15);
    let mut first = true;
    loop {
        let mut others = Vec::new();
        let mut fences = 0;
        for (i, server) in env.servers.iter().enumerate() {
            let redis = server.clone();
            let keys = blocking(move || scan(&*redis, &format!("{PREFIX}:*"))).await??;
            for key in keys {
                if is_fence_counter(&key) {
                    fences += 1;
                } else {
                    others.push((i, key));
                }
            }
        }
        if first {
            first = false;
            cleanup.fence_keys = fences;
            for (i, key) in &others {
                cleanup.keys_at_exit.push(format!("server {i}: {key}"));
                let redis = env.servers[*i].clone();
                let k = key.clone();
                let ttl = blocking(move || redis.command(&["PTTL", &k])).await??;
                if ttl.as_int() == Some(-1) {
                    cleanup.keys_without_ttl.push(format!("server {i}: {key}"));
                }
            }
        }
        if others.is_empty() || Instant::now() >= deadline {
            cleanup.keys_left = others
                .into_iter()
                .map(|(i, key)| format!("server {i}: {key}"))
                .collect();
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    cleanup.expiry_wait_ms = exited.elapsed().as_millis() as u64;
    for server in &env.servers {
        let redis = server.clone();
        cleanup
            .server_script_calls
            .push(blocking(move || redis.command_calls("evalsha")).await??);
    }
    Ok(cleanup)
}
