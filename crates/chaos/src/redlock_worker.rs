//! `leasehold-chaos redlock-client`: one client process of a RedLock run. It connects one
//! [`LockClient`] per server (each through this client's own proxy to that server), builds one
//! [`RedLock`] over them, and its tasks loop: acquire a quorum lock (`rl-<i>`) through one of
//! the six acquire forms, check `is_held()`, write to the fenced store with the grant's
//! [`QuorumToken`](leasehold::QuorumToken), rest (now and then past a lease), check again,
//! release (`unlock()`, or now and then a drop). A watcher records when `guard.lost()`
//! completes. Every step goes to `rl-events-c<client>-g<gen>.jsonl`.
//!
//! The RedLock numbers its servers by address, and every client reaches the servers through
//! proxies of its own, whose addresses order differently in each client: the tokens and
//! members are recorded (and written to the store) by the orchestrator's server numbers, which
//! the client maps from its clients' ids.
//!
//! SIGTERM: finish the current operation and stop (a waiter still waiting after
//! [`DRAIN_DEADLINE`] is recorded as abandoned), then print `DRAINED`. SIGUSR1: exit.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use leasehold::{LockClient, LockError, QuorumGuard, QuorumLock, RedLock};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use crate::clock::now_us;
use crate::history::{EventLog, Kind, ReleaseHow};
use crate::redlock::{client_log_path, lock_name, QEvent};
use crate::rng::Rng;
use crate::store::Store;
use crate::worker::{DRAIN_DEADLINE, MAX_EXPLICIT_LEASE};

#[derive(Clone, Debug)]
pub struct QWorkerConfig {
    /// This client's proxy to each server, by server number.
    pub urls: Vec<String>,
    pub prefix: String,
    pub client: u32,
    pub gen: u32,
    pub dir: PathBuf,
    pub seed: u64,
    pub tasks: u32,
    pub resources: u32,
    pub lease: Duration,
    pub command_timeout: Duration,
    pub ignore_lease: bool,
}

pub fn main(config: QWorkerConfig) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(config))
}

struct Ctx {
    config: QWorkerConfig,
    /// By server number.
    clients: Vec<LockClient>,
    red: RedLock,
    /// The server number of each of the RedLock's canonical indices.
    server_of: Vec<u32>,
    log: EventLog,
    next_op: AtomicU64,
    in_flight: Mutex<HashSet<u64>>,
    store_path: PathBuf,
}

impl Ctx {
    fn record(&self, event: QEvent) {
        self.log.record(&event);
    }

    /// `t` read before `is_held()`: a pause in between can only make the record say less.
    fn check(&self, op: u64, guard: &QuorumGuard<'_>) -> bool {
        let t = now_us();
        let held = guard.is_held() || self.config.ignore_lease;
        self.record(QEvent::Check { t, op, held });
        held
    }

    /// The guard's token by server number.
    fn tokens(&self, guard: &QuorumGuard<'_>) -> Vec<Option<u64>> {
        let token = guard.fencing_token();
        let mut tokens = vec![None; self.clients.len()];
        for (index, server) in self.server_of.iter().enumerate() {
            tokens[*server as usize] = token.get(index).map(|t| t.get());
        }
        tokens
    }

    fn members(&self, guard: &QuorumGuard<'_>) -> Vec<u32> {
        let mut members: Vec<u32> = guard
            .members()
            .map(|(index, _)| self.server_of[index])
            .collect();
        members.sort_unstable();
        members
    }
}

async fn connect(config: &QWorkerConfig, url: &str) -> anyhow::Result<LockClient> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let built = LockClient::builder(url)
            .prefix(config.prefix.clone())
            .lease(config.lease)
            .command_timeout(config.command_timeout)
            .build()
            .await;
        match built {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() < deadline => {
                eprintln!(
                    "client {}: connect to {url} failed, retrying: {error}",
                    config.client
                );
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error).context("connecting to Redis"),
        }
    }
}

async fn run(config: QWorkerConfig) -> anyhow::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut exit = signal(SignalKind::user_defined1())?;
    let log = EventLog::create(&client_log_path(&config.dir, config.client, config.gen))?;
    crate::trace::log_to(
        &config
            .dir
            .join(format!("rl-trace-c{}-g{}.log", config.client, config.gen)),
    )?;
    let mut clients = Vec::new();
    for url in &config.urls {
        clients.push(connect(&config, url).await?);
    }
    // Each process reaches the servers through proxies of its own, so the servers are named
    // (by the orchestrator's number, zero-padded so that name order is number order): every
    // process then numbers them alike, as RedLock::named promises.
    let red = RedLock::named(
        clients
            .iter()
            .enumerate()
            .map(|(i, client)| (format!("server-{i:03}"), client.clone())),
    )?;
    // Matched by client id (a uuid per client, kept by clones); with the names above this is
    // the identity, and the report checks that every process had one order.
    let server_of = red
        .clients()
        .iter()
        .map(|client| {
            let server = clients
                .iter()
                .position(|c| c.id() == client.id())
                .context("a RedLock client of no server")?;
            Ok(server as u32)
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    let client_ids = clients.iter().map(|c| c.id().to_string()).collect();
    let ctx = Arc::new(Ctx {
        store_path: config.dir.join("store.db"),
        config,
        clients,
        red,
        server_of,
        log,
        next_op: AtomicU64::new(1),
        in_flight: Mutex::new(HashSet::new()),
    });
    ctx.record(QEvent::Start {
        t: now_us(),
        pid: std::process::id(),
        tasks: ctx.config.tasks,
        client_ids,
        canonical: ctx.server_of.clone(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let root = Rng::new(ctx.config.seed)
        .fork(u64::from(ctx.config.client) << 32 | u64::from(ctx.config.gen) | 1 << 63);
    let mut tasks = Vec::new();
    for task in 0..ctx.config.tasks {
        let store = Store::open(&ctx.store_path)?;
        tasks.push(tokio::spawn(task_loop(
            ctx.clone(),
            task,
            root.fork(u64::from(task)),
            store,
            stop_rx.clone(),
        )));
    }
    println!("READY");

    terminate.recv().await;
    let _ = stop_tx.send(true);
    let drain_deadline = Instant::now() + DRAIN_DEADLINE;
    for task in &mut tasks {
        match tokio::time::timeout_at(drain_deadline, &mut *task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error.context("client task failed")),
            Ok(Err(join)) => anyhow::bail!("client task panicked: {join}"),
            Err(_) => break,
        }
    }
    let abandoned: Vec<u64> = ctx.in_flight.lock().unwrap().iter().copied().collect();
    for op in abandoned {
        ctx.record(QEvent::Abandoned { t: now_us(), op });
    }
    for task in &tasks {
        task.abort();
    }
    let settle = Instant::now() + Duration::from_secs(10);
    let counts = || {
        ctx.clients.iter().fold((0, 0, 0), |(w, c, h), client| {
            let stats = client.watchdog_stats();
            (
                w + client.waiters(),
                c + client.subscribed_channels(),
                h + stats.holds + stats.fixed,
            )
        })
    };
    while counts() != (0, 0, 0) && Instant::now() < settle {
        sleep(Duration::from_millis(10)).await;
    }
    let (waiters, channels, holds) = counts();
    ctx.record(QEvent::Drained {
        t: now_us(),
        waiters,
        channels,
        holds,
    });
    println!("DRAINED waiters={waiters} channels={channels} holds={holds}");
    let _ = tokio::time::timeout(Duration::from_secs(300), exit.recv()).await;
    Ok(())
}

const KIND_WEIGHTS: [u64; 6] = [3, 2, 3, 2, 2, 2];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn describe(error: &LockError) -> String {
    let kind = match error {
        LockError::QuorumUnreachable { .. } => "quorum_unreachable",
        LockError::NotHeld { .. } => "not_held",
        LockError::Timeout => "timeout",
        LockError::Connection(_) => "connection",
        LockError::Redis(_) => "redis",
        LockError::LeaseLost { .. } => "lease_lost",
        _ => "other",
    };
    format!("{kind}: {error}")
}

async fn task_loop(
    ctx: Arc<Ctx>,
    task: u32,
    mut rng: Rng,
    store: Store,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut store = Some(store);
    let locks: Vec<QuorumLock> = (0..ctx.config.resources)
        .map(|res| ctx.red.lock(&lock_name(res)))
        .collect::<Result<_, _>>()?;
    while !*stop.borrow() {
        let op = ctx.next_op.fetch_add(1, Ordering::Relaxed);
        ctx.in_flight.lock().unwrap().insert(op);
        let res = rng.below(u64::from(ctx.config.resources)) as u32;
        one_op(
            &ctx,
            task,
            op,
            res,
            &locks[res as usize],
            &mut rng,
            &mut store,
        )
        .await?;
        ctx.in_flight.lock().unwrap().remove(&op);
        sleep(ms(rng.range(0, 30))).await;
    }
    Ok(())
}

async fn one_op(
    ctx: &Arc<Ctx>,
    task: u32,
    op: u64,
    res: u32,
    lock: &QuorumLock,
    rng: &mut Rng,
    store: &mut Option<Store>,
) -> anyhow::Result<()> {
    let kind = Kind::ALL[rng.weighted(&KIND_WEIGHTS)];
    let wait = ms(rng.range(50, 1500));
    let lease = ms(rng.range(300, MAX_EXPLICIT_LEASE.as_millis() as u64));
    ctx.record(QEvent::Begin {
        t: now_us(),
        op,
        task,
        kind,
        res,
        lease_ms: kind.explicit_lease().then_some(lease.as_millis() as u64),
        wait_ms: matches!(kind, Kind::TryLockFor | Kind::TryLockForWithLease)
            .then_some(wait.as_millis() as u64),
    });
    let result = match kind {
        Kind::Lock => lock.lock().await.map(Some),
        Kind::TryLock => lock.try_lock().await,
        Kind::TryLockFor => lock.try_lock_for(wait).await,
        Kind::TryLockWithLease => lock.try_lock_with_lease(lease).await,
        Kind::TryLockForWithLease => lock.try_lock_for_with_lease(wait, lease).await,
        Kind::LockWithLease => lock.lock_with_lease(lease).await.map(Some),
        Kind::RunOnce => unreachable!("not drawn"),
    };
    let t = now_us();
    match result {
        Ok(Some(guard)) => {
            ctx.record(QEvent::Granted {
                t,
                op,
                tokens: ctx.tokens(&guard),
                members: ctx.members(&guard),
            });
            // The hold goes on whatever lost() says (under --ignore-lease it must); the
            // watcher only records when the library said the quorum was lost.
            let watcher = async {
                guard.lost().await;
                ctx.record(QEvent::Lost { t: now_us(), op });
                std::future::pending::<()>().await;
            };
            let outcome = tokio::select! {
                outcome = hold(ctx, op, res, rng, store, &guard) => outcome,
                () = watcher => unreachable!("the watcher never ends"),
            };
            outcome?;
            release(ctx, op, rng, guard).await;
        }
        Ok(None) => ctx.record(QEvent::NotGranted { t, op }),
        Err(error) => {
            ctx.record(QEvent::Failed {
                t,
                op,
                unreachable: matches!(error, LockError::QuorumUnreachable { .. }),
                error: describe(&error),
            });
            sleep(ms(rng.range(20, 100))).await;
        }
    }
    Ok(())
}

/// How long a hold rests before its release: now and then past a lease (often under
/// `--ignore-lease`, the checker's self-test).
fn rest(ctx: &Ctx, rng: &mut Rng) -> u64 {
    let long = if ctx.config.ignore_lease { 40 } else { 8 };
    if rng.chance(long) {
        rng.range(1200, 2500)
    } else {
        rng.range(5, 120)
    }
}

async fn hold(
    ctx: &Arc<Ctx>,
    op: u64,
    res: u32,
    rng: &mut Rng,
    store: &mut Option<Store>,
    guard: &QuorumGuard<'_>,
) -> anyhow::Result<()> {
    let tokens = ctx.tokens(guard);
    ctx.check(op, guard);
    sleep(ms(rng.range(5, 60))).await;
    if ctx.check(op, guard) {
        // Preparing the write: a pause that lands here makes a late write.
        sleep(ms(rng.range(20, 150))).await;
        let conn = store.take().expect("the task's store connection");
        let (client, gen) = (ctx.config.client, ctx.config.gen);
        let (conn, written) = tokio::task::spawn_blocking(move || {
            let mut conn = conn;
            let written = conn.write_quorum(res, &tokens, client, gen, op);
            (conn, written)
        })
        .await?;
        *store = Some(conn);
        let (accepted, t) = written?;
        ctx.record(QEvent::Write { t, op, accepted });
        ctx.check(op, guard);
    }
    sleep(ms(rest(ctx, rng))).await;
    ctx.check(op, guard);
    Ok(())
}

async fn release(ctx: &Ctx, op: u64, rng: &mut Rng, guard: QuorumGuard<'_>) {
    if rng.chance(80) {
        let outcome = match guard.unlock().await {
            Ok(()) => "ok".to_string(),
            Err(error) => describe(&error),
        };
        ctx.record(QEvent::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Unlock,
            outcome,
        });
    } else {
        drop(guard);
        ctx.record(QEvent::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Drop,
            outcome: "background".into(),
        });
    }
}
