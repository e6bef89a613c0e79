//! `leasehold-chaos run`: starts Redis, one fault proxy per client and K client processes,
//! injects faults on a schedule drawn from the seed, stops the clients cleanly, checks what
//! they left in Redis, and runs the checker over the recorded history.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold_testkit::{ChildProcess, Proxy, RedisServer, RespValue};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::{sleep, Instant};

use crate::checker;
use crate::clock::now_us;
use crate::history::{client_log_path, read_client_id, write_faults, Fault, FaultKind};
use crate::rng::Rng;
use crate::run::{Cleanup, Layout, LockType, RunConfig, SemaphoreLeft};
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

struct Env<'a> {
    config: &'a RunConfig,
    dir: &'a Path,
    exe: PathBuf,
    redis: Arc<RedisServer>,
    proxies: Vec<Proxy>,
    slots: Vec<Slot>,
}

impl Env<'_> {
    fn spawn_client(&self, client: u32, gen: u32) -> anyhow::Result<Arc<ChildProcess>> {
        let c = self.config;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("client")
            .args(["--url", &self.proxies[client as usize].url()])
            .args(["--prefix", PREFIX])
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
            .args(["--redis-addr", &self.redis.addr().to_string()])
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

    /// Clients queued for a turn right now, by the client ids in the turn queues, or waiting
    /// in the line of a fair or read/write lock or of a semaphore, by the ids in it.
    async fn queued(&self) -> anyhow::Result<Vec<u32>> {
        self.clients_named(|lock, ty| {
            let line = if ty == LockType::Plain {
                "queue"
            } else {
                "waiters"
            };
            vec![
                "ZRANGE".into(),
                format!("{lock}:{line}"),
                "0".into(),
                "-1".into(),
            ]
        })
        .await
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
            let redis = self.redis.clone();
            let args = command(
                format!("{PREFIX}:{{{}}}", layout.name(res)),
                layout.lock_type(res),
            );
            let Ok(names) = blocking(move || strings(redis.command(&args))).await? else {
                continue; // Redis paused or restarting: no one to pick
            };
            for name in names {
                // `~r:<id>`: a reader's hold or a permit; other `~` fields name nobody.
                let name = name.strip_prefix("~r:").unwrap_or(&name);
                let uuid = name.split(':').next().unwrap_or_default();
                if let Some(i) = self.slots.iter().position(|s| s.client_id == uuid) {
                    clients.push(i as u32);
                }
            }
        }
        Ok(clients)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

async fn run(config: &RunConfig, dir: &Path) -> anyhow::Result<checker::Report> {
    if config.redlock > 0 {
        return crate::redlock::run(config, dir).await;
    }
    println!(
        "leasehold chaos: {} clients x {} tasks on {} locks, {} fair locks ({} % of the ops), \
         {} read/write locks ({} %) and {} semaphores of {} permits ({} %) for {:?}, seed {} \
         (history in {})",
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
        config.duration,
        config.seed,
        dir.display()
    );
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(config)?)?;
    Store::create(&dir.join("store.db"), Layout::of(config).total())?;
    let redis = Arc::new(blocking(RedisServer::start).await??);
    let mut proxies = Vec::new();
    for _ in 0..config.clients {
        proxies.push(Proxy::start(redis.addr()).await?);
    }
    let mut env = Env {
        config,
        dir,
        exe: std::env::current_exe()?,
        redis,
        proxies,
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
            deck = FaultKind::ALL.to_vec();
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i as u64 + 1) as usize);
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
    if kind == FaultKind::ClientKill && rng.chance(70) {
        // Mostly kill a client queued for a turn: its id stays in the queue, so a release
        // reserves the lock for a turn nobody takes, and the other waiters must not sleep
        // through it. On a fair lock its entry stays in the line until it lapses: the waiters
        // behind it are held up by one lease at most, and keep their order.
        let queued = env.queued().await?;
        if !queued.is_empty() {
            client = queued[rng.below(queued.len() as u64) as usize];
        }
    }
    let gen = env.slots[client as usize].gen;
    let longest_lease = env.config.lease.max(MAX_EXPLICIT_LEASE);
    let start = now_us();
    let mut target = Some(client);
    let detail = match kind {
        FaultKind::ProxyLatency => {
            let latency = Duration::from_millis(rng.range(50, 400));
            let lasts = Duration::from_millis(rng.range(500, 2500));
            let proxy = &env.proxies[client as usize];
            proxy.set_latency(latency);
            sleep(lasts).await;
            proxy.set_latency(Duration::ZERO);
            format!("{latency:?} each way for {lasts:?}")
        }
        FaultKind::ProxyPartition => {
            let lasts = Duration::from_millis(rng.range(300, 3000));
            let proxy = &env.proxies[client as usize];
            proxy.partition();
            sleep(lasts).await;
            // Reset before healing: bytes were dropped, so these connections are out of sync.
            proxy.close_all();
            proxy.heal();
            format!("{lasts:?}")
        }
        FaultKind::ProxyCloseAll => {
            if rng.chance(50) {
                target = None;
                for proxy in &env.proxies {
                    proxy.close_all();
                }
                "every client".to_string()
            } else {
                env.proxies[client as usize].close_all();
                "one client".to_string()
            }
        }
        FaultKind::ClientPause => {
            let lasts = longest_lease + Duration::from_millis(rng.range(100, 1500));
            let child = env.slots[client as usize].child.clone();
            blocking(move || child.pause()).await??;
            sleep(lasts).await;
            let child = env.slots[client as usize].child.clone();
            blocking(move || child.resume()).await??;
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
        FaultKind::RedisRestart => {
            target = None;
            let redis = env.redis.clone();
            blocking(move || redis.restart()).await??;
            "data lost".to_string()
        }
        FaultKind::RedisPause => {
            target = None;
            let lasts = Duration::from_millis(rng.range(200, 1500));
            let redis = env.redis.clone();
            blocking(move || redis.pause()).await??;
            sleep(lasts).await;
            let redis = env.redis.clone();
            blocking(move || redis.resume()).await??;
            format!("{lasts:?}")
        }
        FaultKind::KillPubsubConnections | FaultKind::KillCommandConnections => {
            target = None;
            let kind_arg = if kind == FaultKind::KillPubsubConnections {
                "pubsub"
            } else {
                "normal"
            };
            let redis = env.redis.clone();
            let killed =
                blocking(move || redis.command(&["CLIENT", "KILL", "TYPE", kind_arg])).await??;
            format!("{} connections", killed.as_int().unwrap_or(-1))
        }
    };
    Ok(Fault {
        kind,
        client: target,
        gen: target.map(|_| gen),
        start,
        end: now_us(),
        detail,
    })
}

/// Stops every client cleanly and records what was left in Redis.
async fn stop(env: &Env<'_>) -> anyhow::Result<Cleanup> {
    let mut cleanup = Cleanup::default();
    for (client, slot) in env.slots.iter().enumerate() {
        if !slot.child.is_running() {
            cleanup.crashed.push(format!(
                "client {client} gen {} exited during the run: {:?}",
                slot.gen,
                slot.child.try_wait()
            ));
            continue;
        }
        kill(Pid::from_raw(slot.child.pid() as i32), Signal::SIGTERM)?;
    }
    let mut readers = Vec::new();
    for slot in &env.slots {
        let child = slot.child.clone();
        readers.push(tokio::task::spawn_blocking(move || {
            child.wait_for_line(
                |l| l.starts_with("DRAINED"),
                DRAIN_DEADLINE + Duration::from_secs(20),
            )
        }));
    }
    for (client, reader) in readers.into_iter().enumerate() {
        if let Err(error) = reader.await? {
            cleanup
                .crashed
                .push(format!("client {client} did not drain: {error}"));
        }
    }

    // Every client is idle and still connected: no release channel may stay subscribed.
    // (Unsubscribing runs in the background, hence a deadline rather than one look.)
    let redis = env.redis.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let redis = redis.clone();
        let channels = blocking(move || {
            strings(redis.command(&["PUBSUB", "CHANNELS", &format!("{PREFIX}:*")]))
        })
        .await??;
        if channels.is_empty() || Instant::now() >= deadline {
            cleanup.channels_left = channels;
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }

    for (client, slot) in env.slots.iter().enumerate() {
        if slot.child.is_running() {
            kill(Pid::from_raw(slot.child.pid() as i32), Signal::SIGUSR1)?;
        }
        let child = slot.child.clone();
        let status = blocking(move || child.wait_timeout(Duration::from_secs(20))).await?;
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => cleanup.crashed.push(format!(
                "client {client} gen {} exited with {status}",
                slot.gen
            )),
            Err(error) => cleanup.crashed.push(format!(
                "client {client} gen {} did not exit: {error}",
                slot.gen
            )),
        }
    }

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
    let exited = Instant::now();
    let deadline = exited + env.config.lease.max(MAX_EXPLICIT_LEASE) + Duration::from_secs(15);
    let mut first = true;
    loop {
        let redis = env.redis.clone();
        let keys = blocking(move || scan(&redis, &format!("{PREFIX}:*"))).await??;
        let (fences, others): (Vec<String>, Vec<String>) =
            keys.into_iter().partition(|k| is_fence_counter(k));
        let (kept, others): (Vec<String>, Vec<String>) =
            others.into_iter().partition(|k| semaphore_key(k));
        if first {
            first = false;
            cleanup.fence_keys = fences.len();
            cleanup.semaphore_keys = kept;
            cleanup.keys_at_exit = others.clone();
            for key in &others {
                let redis = env.redis.clone();
                let k = key.clone();
                let ttl = blocking(move || redis.command(&["PTTL", &k])).await??;
                if ttl.as_int() == Some(-1) {
                    cleanup.keys_without_ttl.push(key.clone());
                }
            }
        }
        if others.is_empty() || Instant::now() >= deadline {
            cleanup.keys_left = others;
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    cleanup.expiry_wait_ms = exited.elapsed().as_millis() as u64;
    for hash in semaphores {
        let redis = env.redis.clone();
        cleanup
            .semaphores
            .push(blocking(move || semaphore_left(&redis, &hash)).await??);
    }
    Ok(cleanup)
}

/// Semaphore `hash` as Redis has it: its number, its count of permits taken, and each
/// acquisition still listed with how long its lease still runs.
fn semaphore_left(redis: &RedisServer, hash: &str) -> anyhow::Result<SemaphoreLeft> {
    let pairs = |reply: RespValue| -> anyhow::Result<Vec<(String, String)>> {
        let items = strings(Ok(reply))?;
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
        .filter(|(f, _)| f.starts_with("~r:"))
        .map(|(f, v)| {
            let id = f.trim_start_matches("~r:").to_string();
            (id, v.parse().unwrap_or(0), lease_of(f))
        })
        .collect();
    let leases_without_permits = leases
        .iter()
        .filter(|(m, _)| !fields.iter().any(|(f, _)| f == m))
        .count();
    Ok(SemaphoreLeft {
        name: hash.to_string(),
        permits: number("~permits"),
        used: number("~used").unwrap_or(0),
        held,
        leases_without_permits,
    })
}

fn strings(reply: leasehold_testkit::Result<RespValue>) -> anyhow::Result<Vec<String>> {
    let reply = reply?;
    let Some(items) = reply.as_array() else {
        bail!("expected an array, got {reply:?}");
    };
    Ok(items.iter().filter_map(|v| v.as_str()).collect())
}

/// Whether `key` is a slot's fencing counter, `P:{<digits>}:fence` (the layout of
/// `leasehold::LockKeys::fence`).
fn is_fence_counter(key: &str) -> bool {
    key.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix(":{"))
        .and_then(|rest| rest.strip_suffix("}:fence"))
        .is_some_and(|tag| !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_digit()))
}

fn scan(redis: &RedisServer, pattern: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = redis.command(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])?;
        let parts = reply.as_array().context("SCAN reply")?;
        cursor = parts[0].as_str().context("SCAN cursor")?;
        out.extend(strings(Ok(parts[1].clone()))?);
        if cursor == "0" {
            break;
        }
    }
    out.sort();
    Ok(out)
}
