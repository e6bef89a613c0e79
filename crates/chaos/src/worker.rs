//! `leasehold-chaos client`: one client process. Its tasks loop: acquire (a random lock kind),
//! check the lease, write to the fenced store, hold briefly, release, recording every step.
//! Now and then a task hands its guard to a task it spawns, which does the hold while the
//! first task goes on with its next operation (see [`hand_off`]). Now and then a task runs two
//! operations on one lock at once, as futures joined in one task: one owner, so the second
//! re-enters the first's grant or, through a non-reentrant handle, waits for it.
//!
//! A share of the operations (`--fair-percent`) go to fair locks (`client.fair_lock`, names of
//! their own: one name is always one kind). Before each of them the client reads, on its own
//! connection straight to Redis ([`Observer`]), whether the owner already had a place in the
//! line, a hold or a turn (`Floor`), and while a fair acquire waits it polls the owner's place
//! in the line (`Queued`): what the checker's fair-order rule needs.
//!
//! Another share (`--rw-percent`) goes to read/write locks (`client.rw_lock`, `rw-<i>`): reads
//! and writes through every acquire form, writers writing to the fenced store as the lock's
//! holders do (readers do not write). Now and then a writer downgrades (takes the read side
//! under its write, then lets the write go and goes on reading), and a reader asks for the
//! write side, which must be refused (`UpgradeRefused`): both are ops of their own, recorded
//! with the op they were asked under and whether that hold was still certainly held when the
//! call returned ([`Event::UnderHeld`]).
//!
//! Another (`--sem-percent`) goes to semaphores (`client.semaphore`, `sem-<i>`), acquiring 1 or
//! 2 of their `--sem-permits` permits through every acquire form (no store writes: several
//! holders at once is the point). Every op first calls `try_set_permits`, and so does a
//! ticker every [`PERMITS_TICK`] (a Redis restart loses the number of permits too: waiters
//! would otherwise wait for a number nobody sets again).
//!
//! SIGTERM: finish the current operation and stop (a waiter still waiting after
//! [`DRAIN_DEADLINE`] is recorded as abandoned), then print `DRAINED`. SIGUSR1: exit.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
use leasehold::{Lock, LockClient, LockError, LockGuard, Permit, RwLock, Semaphore};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};

use crate::clock::now_us;
use crate::history::{
    client_log_path, AskedAs, Event, EventLog, Kind, LatchCall, ReleaseHow, Side,
};
use crate::observer::Observer;
use crate::rng::Rng;
use crate::run::{Layout, LockType};
use crate::store::Store;

/// How long a stopping client lets its operations finish before recording them abandoned.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);
/// The longest explicit lease a client asks for (`*_with_lease`, `run_once`).
pub const MAX_EXPLICIT_LEASE: Duration = Duration::from_millis(1500);

/// Everything a client process is told on its command line.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub url: String,
    pub prefix: String,
    pub client: u32,
    pub gen: u32,
    pub dir: PathBuf,
    pub seed: u64,
    pub tasks: u32,
    pub resources: u32,
    pub fair_resources: u32,
    /// The share of operations on a fair lock (percent).
    pub fair_percent: u64,
    pub rw_resources: u32,
    /// The share of operations on a read/write lock (percent).
    pub rw_percent: u64,
    pub sem_resources: u32,
    /// The share of operations on a semaphore (percent).
    pub sem_percent: u64,
    /// Every semaphore's number of permits.
    pub sem_permits: u32,
    pub latch_resources: u32,
    /// The share of operations on a latch (percent).
    pub latch_percent: u64,
    /// How often (percent) an op, a hold or a latch party makes a foreign-kind attempt.
    pub foreign_percent: u64,
    /// Redis itself (not the proxy): the [`Observer`]'s connection.
    pub redis_addr: std::net::SocketAddr,
    /// The watchdog lease of watched holds.
    pub lease: Duration,
    pub command_timeout: Duration,
    /// Record every lease check as held (the checker's self-test; see `RunConfig`).
    pub ignore_lease: bool,
    /// Half the fair waiters cut in at the head of the line (the checker's self-test).
    pub cut_in_line: bool,
    /// Cluster mode: the nodes to discover the cluster from (`url` is then unused).
    pub cluster_seeds: Option<Vec<(String, u16)>>,
}

impl WorkerConfig {
    fn layout(&self) -> Layout {
        Layout {
            plain: self.resources,
            fair: self.fair_resources,
            rw: self.rw_resources,
            sem: self.sem_resources,
            latch: self.latch_resources,
        }
    }
}

/// Runs a client process to completion.
pub fn main(config: WorkerConfig) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(config))
}

struct Ctx {
    config: WorkerConfig,
    client: LockClient,
    log: EventLog,
    next_op: AtomicU64,
    in_flight: Mutex<HashSet<u64>>,
    store_path: PathBuf,
    /// The number of the next hand-off task (task loops are `0..tasks`).
    next_task: AtomicU32,
    /// Hand-off sections still running (finished ones are collected at each new hand-off).
    sections: Mutex<JoinSet<anyhow::Result<()>>>,
    /// The fair locks' lines, as Redis has them.
    observer: Observer,
}

impl Ctx {
    fn record(&self, event: Event) {
        self.log.record(&event);
    }

    /// `t` is read before `is_held()`: a pause in between can only make the record say less.
    fn check(&self, op: u64, guard: &LockGuard) -> bool {
        self.check_with(op, || guard.is_held())
    }

    /// [`Ctx::check`] of any holder: `is_held` is its `is_held()`.
    fn check_with(&self, op: u64, is_held: impl FnOnce() -> bool) -> bool {
        let t = now_us();
        let held = is_held() || self.config.ignore_lease;
        self.record(Event::Check {
            t,
            op,
            held,
            derived: false,
        });
        held
    }
}

async fn run(config: WorkerConfig) -> anyhow::Result<()> {
    // Handlers first: the orchestrator signals only after READY.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut exit = signal(SignalKind::user_defined1())?;
    let log = EventLog::create(&client_log_path(&config.dir, config.client, config.gen))?;
    crate::trace::log_to(
        &config
            .dir
            .join(format!("trace-c{}-g{}.log", config.client, config.gen)),
    )?;
    let client = connect(&config).await?;
    let owner = client.new_owner();
    let client_id = owner.id().split(':').next().unwrap_or_default().to_string();
    log.record(&Event::Start {
        t: now_us(),
        pid: std::process::id(),
        tasks: config.tasks,
        client_id,
    });
    let observer = match &config.cluster_seeds {
        Some(seeds) => Observer::start(
            seeds
                .iter()
                .map(|(host, port)| format!("{host}:{port}").parse())
                .collect::<Result<_, _>>()?,
        )?,
        None => Observer::start(vec![config.redis_addr])?,
    };
    let ctx = Arc::new(Ctx {
        observer,
        store_path: config.dir.join("store.db"),
        next_task: AtomicU32::new(config.tasks),
        config,
        client,
        log,
        next_op: AtomicU64::new(1),
        in_flight: Mutex::new(HashSet::new()),
        sections: Mutex::new(JoinSet::new()),
    });
    if ctx.config.sem_resources > 0 {
        // Runs until the process exits: it also gives back expired permits while the others
        // drain (every call on a semaphore does).
        tokio::spawn(keep_permits_set(ctx.clone()));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let root = Rng::new(ctx.config.seed)
        .fork(u64::from(ctx.config.client) << 32 | u64::from(ctx.config.gen));
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
    let mut sections = std::mem::take(&mut *ctx.sections.lock().unwrap());
    while let Ok(Some(section)) =
        tokio::time::timeout_at(drain_deadline, sections.join_next()).await
    {
        section_result(section)?;
    }
    let abandoned: Vec<u64> = ctx.in_flight.lock().unwrap().iter().copied().collect();
    for op in abandoned {
        ctx.record(Event::Abandoned { t: now_us(), op });
    }
    for task in &tasks {
        task.abort();
    }
    sections.abort_all();
    // Guards dropped by aborted tasks release in the background; unsubscribes are spawned
    // too. Wait (bounded) until nothing is registered locally any more.
    let settle = Instant::now() + Duration::from_secs(10);
    let counts = || {
        (ctx.client.waiters(), ctx.client.subscribed_channels(), {
            let stats = ctx.client.watchdog_stats();
            stats.holds + stats.fixed
        })
    };
    while counts() != (0, 0, 0) && Instant::now() < settle {
        sleep(Duration::from_millis(10)).await;
    }
    let (waiters, channels, holds) = counts();
    ctx.record(Event::Drained {
        t: now_us(),
        waiters,
        channels,
        holds,
    });
    println!("DRAINED waiters={waiters} channels={channels} holds={holds}");
    let _ = tokio::time::timeout(Duration::from_secs(300), exit.recv()).await;
    Ok(())
}

/// How client `client` wakes its waiters: every third client (2, 5, ...) by timer, without a
/// subscriber, the others by release messages. Both ways run against the same names at once:
/// a timer client's releases must still wake the others, and the same rules hold for its
/// waiters (the timer's longest delay is well within the free-lock bound).
pub fn waking_of(client: u32) -> leasehold::Waking {
    if client % 3 == 2 {
        leasehold::Waking::timer()
    } else {
        leasehold::Waking::PubSub
    }
}

/// Connects (to the one server through the client's proxy, or as a cluster client from the
/// seeds), retrying while a fault keeps Redis unreachable (fred fails fast at connect).
async fn connect(config: &WorkerConfig) -> anyhow::Result<LockClient> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let builder = match &config.cluster_seeds {
            Some(seeds) => LockClient::builder_from_config(fred::types::config::Config {
                server: fred::types::config::ServerConfig::new_clustered(seeds.clone()),
                ..Default::default()
            }),
            None => LockClient::builder(&config.url),
        };
        let built = builder
            .prefix(config.prefix.clone())
            .lease(config.lease)
            .command_timeout(config.command_timeout)
            .waking(waking_of(config.client))
            .build()
            .await;
        match built {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() < deadline => {
                eprintln!(
                    "client {}: connect failed, retrying: {error}",
                    config.client
                );
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error).context("connecting to Redis"),
        }
    }
}

/// One client task: an owner of its own (the default per-task owner).
async fn task_loop(
    ctx: Arc<Ctx>,
    task: u32,
    mut rng: Rng,
    store: Store,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut store = Some(store);
    let mut handed_off = None;
    while !*stop.borrow() {
        let op = ctx.next_op.fetch_add(1, Ordering::Relaxed);
        ctx.in_flight.lock().unwrap().insert(op);
        // Right after a hand-off, often the same lock again: the case where the task's own
        // next acquire meets the hold it handed away.
        let res = match handed_off {
            Some(res) if rng.chance(50) => res,
            _ => pick_lock(&ctx.config, &mut rng),
        };
        if handed_off.is_none() && rng.chance(ctx.config.foreign_percent) {
            // A foreign-kind attempt on any name (judged where the history shows the name's
            // own kind there all along).
            let total = ctx.config.layout().total();
            let on = rng.below(u64::from(total)) as u32;
            let foreign = ctx.next_op.fetch_add(1, Ordering::Relaxed);
            foreign_attempt(&ctx, task, foreign, on, &mut rng).await?;
        }
        if rng.chance(JOINED_PERCENT) {
            // Two ops of this task at once on one lock, as futures joined in one task: one
            // owner, so the second re-enters the first's grant (or, through a non-reentrant
            // handle, waits for it), and never gets a grant of its own alongside it.
            let op2 = ctx.next_op.fetch_add(1, Ordering::Relaxed);
            ctx.in_flight.lock().unwrap().insert(op2);
            let mut rng2 = rng.fork(op2);
            let mut store2 = None;
            let (first, second) = tokio::join!(
                one_op(&ctx, task, op, res, &mut rng, &mut store, true),
                one_op(&ctx, task, op2, res, &mut rng2, &mut store2, true),
            );
            let (first, second) = (first?, second?);
            debug_assert!(
                first.is_none() && second.is_none(),
                "joined ops hand nothing off"
            );
            handed_off = None;
            let mut in_flight = ctx.in_flight.lock().unwrap();
            in_flight.remove(&op);
            in_flight.remove(&op2);
        } else {
            handed_off = one_op(&ctx, task, op, res, &mut rng, &mut store, false).await?;
            if handed_off.is_none() {
                // A hand-off section finishes its op itself.
                ctx.in_flight.lock().unwrap().remove(&op);
            }
        }
        sleep(Duration::from_millis(rng.range(0, 30))).await;
    }
    Ok(())
}

const KIND_WEIGHTS: [u64; 7] = [3, 2, 3, 2, 2, 2, 2];

/// An acquire form for what `run_once` does not apply to (semaphores, downgrades, upgrades).
fn kind_but_run_once(rng: &mut Rng) -> Kind {
    Kind::ALL[rng.weighted(&KIND_WEIGHTS[..6])]
}

/// The share of read/write-lock ops that read.
const READ_PERCENT: u64 = 50;
/// How often a write hold is downgraded (read taken under it, then the write let go).
const DOWNGRADE_PERCENT: u64 = 25;
/// How often a reader asks for the write side (an upgrade, which must be refused).
const UPGRADE_PERCENT: u64 = 20;
/// The share of semaphore ops that take one permit (the others take two).
const ONE_PERMIT_PERCENT: u64 = 60;
/// How often each client sets the semaphores' number of permits if it is gone.
pub const PERMITS_TICK: Duration = Duration::from_millis(250);
/// How often a guard from `lock()` or `try_lock_for()` is handed to a spawned task. Low: until
/// the library makes the hand-off explicit, each one whose task asks for the same lock again
/// while the section still runs is a violation (two tasks in one critical section).
const HANDOFF_PERCENT: u64 = 8;

/// How often a task runs two ops at once on one lock (futures joined in one task).
const JOINED_PERCENT: u64 = 10;

/// How often an op acquires through [`leasehold::Lock::non_reentrant`].
const NON_REENTRANT_PERCENT: u64 = 25;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The error's variant, for grouping in the report, then its message (a `WrongKind`'s kinds
/// also as `[held_as=..., asked_as=...]`, which the checker reads).
fn describe(error: &LockError) -> String {
    if let LockError::WrongKind {
        held_as, asked_as, ..
    } = error
    {
        return format!("wrong_kind: {error} [held_as={held_as}, asked_as={asked_as}]");
    }
    let kind = match error {
        LockError::NotHeld { .. } => "not_held",
        LockError::Timeout => "timeout",
        LockError::Connection(_) => "connection",
        LockError::PermissionDenied(_) => "permission_denied",
        LockError::WrongType { .. } => "wrong_type",
        LockError::Redis(_) => "redis",
        LockError::InvalidArgument(_) => "invalid_argument",
        LockError::LeaseLost { .. } => "lease_lost",
        LockError::UpgradeRefused { .. } => "upgrade_refused",
        _ => "other",
    };
    format!("{kind}: {error}")
}

/// One operation on resource `res`. Returns `Some(res)` when the guard was handed to a spawned
/// task, which finishes the op (see [`hand_off`]).
async fn one_op(
    ctx: &Arc<Ctx>,
    task: u32,
    op: u64,
    res: u32,
    rng: &mut Rng,
    store: &mut Option<Store>,
    joined: bool,
) -> anyhow::Result<Option<u32>> {
    let layout = ctx.config.layout();
    let ty = layout.lock_type(res);
    let name = layout.name(res);
    if ty == LockType::Semaphore {
        sem_op(ctx, task, op, res, rng).await?;
        return Ok(None);
    }
    if ty == LockType::Latch {
        latch_op(ctx, task, op, res, rng).await?;
        return Ok(None);
    }
    let kind = Kind::ALL[rng.weighted(&KIND_WEIGHTS)];
    let fair = ty == LockType::Fair;
    let rw = match ty {
        LockType::ReadWrite => Some(ctx.client.rw_lock(&name)?),
        _ => None,
    };
    let side = rw.as_ref().map(|_| {
        if rng.chance(READ_PERCENT) {
            Side::Read
        } else {
            Side::Write
        }
    });
    let lock = match (&rw, side) {
        (Some(rw), Some(Side::Read)) => rw.read().clone(),
        (Some(rw), _) => rw.write().clone(),
        (None, _) if fair => ctx.client.fair_lock(&name)?,
        (None, _) => ctx.client.lock(&name)?,
    };
    // Some ops through a non-reentrant handle: their tries use the script's no-re-entry mode.
    // Joined with a sibling op, such an op waits for the sibling's hold instead of
    // re-entering it, and the checker's overlap rules see any second grant.
    let lock = if rng.chance(NON_REENTRANT_PERCENT) {
        lock.non_reentrant()
    } else {
        lock
    };
    let wait = ms(rng.range(50, 1500));
    let lease = ms(rng.range(200, MAX_EXPLICIT_LEASE.as_millis() as u64));
    let explicit = kind.explicit_lease();
    // The owner's entry, hold and turn just before the call (see `Event::Floor`), on the
    // locks with a line of owners in arrival order: fair and read/write locks.
    let owner = lock.owner();
    let lined = fair || rw.is_some();
    let floor = if lined {
        ctx.observer.floor(lock.keys(), owner.id()).await
    } else {
        None
    };
    let begin = now_us();
    ctx.record(Event::Begin {
        t: begin,
        op,
        task,
        kind,
        res,
        lease_ms: explicit.then_some(lease.as_millis() as u64),
        side,
        permits: None,
        under: None,
        foreign: None,
        latch: None,
        wait_ms: matches!(kind, Kind::TryLockFor | Kind::TryLockForWithLease)
            .then_some(wait.as_millis() as u64),
    });
    if let Some(floor) = floor {
        ctx.record(Event::Floor {
            t: floor.sent,
            op,
            answered: floor.received,
            entry: floor.value.entry,
            held: floor.value.held,
        });
    }
    if fair && kind.waits() && ctx.config.cut_in_line && rng.chance(50) {
        ctx.observer
            .cut_in_line(lock.keys(), owner.id(), ctx.config.lease)
            .await;
    }
    if kind == Kind::RunOnce {
        run_once_op(ctx, op, rng, &lock, begin, lease).await?;
        return Ok(None);
    }
    let call = acquire(&lock, kind, wait, lease);
    let mut line = Line::default();
    let result = if lined && kind.waits() {
        watching_the_line(&ctx.observer, &lock, owner.id(), call, &mut line).await
    } else {
        call.await
    };
    let t = now_us();
    for run in line.runs {
        ctx.record(Event::Queued {
            t: run.first,
            op,
            arrival: run.arrival,
            last: run.last,
            polls: run.polls,
        });
    }
    for seen in line.held {
        ctx.record(Event::HeldInRedis {
            t: seen.sent,
            op,
            answered: seen.answered,
            since: seen.since.unwrap_or(begin),
            token: seen.token,
            gone: seen.gone,
        });
    }
    match result {
        Ok(Some(guard)) => {
            ctx.record(Event::Granted {
                t,
                op,
                owner: guard.owner().to_string(),
                token: Some(guard.fencing_token().get()),
                hold_count: guard.hold_count(),
            });
            // Not from joined ops: a sibling may already have re-entered the grant, and
            // handing one of its guards away would put two tasks in it by the caller's own
            // doing (the two-task rule would count it).
            if !joined
                && matches!(kind, Kind::Lock | Kind::TryLockFor)
                && rng.chance(HANDOFF_PERCENT)
            {
                hand_off(ctx, op, res, side, rng.fork(op), guard)?;
                return Ok(Some(res));
            }
            let held = Held {
                op,
                task,
                res,
                side,
                rw: rw.as_ref(),
            };
            hold(ctx, held, rng, store, guard).await?;
        }
        Ok(None) => ctx.record(Event::NotGranted { t, op }),
        Err(error) => {
            ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            });
            // Errors come fast while Redis is unreachable; do not spin.
            sleep(ms(rng.range(20, 100))).await;
        }
    }
    Ok(None)
}

/// The acquire call of `kind` (not `run_once`) on `lock`.
async fn acquire(
    lock: &Lock,
    kind: Kind,
    wait: Duration,
    lease: Duration,
) -> Result<Option<LockGuard<'_>>, LockError> {
    match kind {
        Kind::Lock => lock.lock().await.map(Some),
        Kind::TryLock => lock.try_lock().await,
        Kind::TryLockFor => lock.try_lock_for(wait).await,
        Kind::TryLockWithLease => lock.try_lock_with_lease(lease).await,
        Kind::TryLockForWithLease => lock.try_lock_for_with_lease(wait, lease).await,
        Kind::LockWithLease => lock.lock_with_lease(lease).await.map(Some),
        Kind::RunOnce => unreachable!("run_once is an op of its own"),
    }
}

/// Plain locks are picked uniformly, and so are the locks of each other kind; `fair_percent`
/// of the ops go to a fair lock, then `rw_percent` to a read/write lock, `sem_percent` to a
/// semaphore and `latch_percent` to a latch (shares past 100 % are cut, in that order).
fn pick_lock(config: &WorkerConfig, rng: &mut Rng) -> u32 {
    let layout = config.layout();
    let roll = rng.below(100);
    let shares = [
        (LockType::Fair, config.fair_resources, config.fair_percent),
        (LockType::ReadWrite, config.rw_resources, config.rw_percent),
        (
            LockType::Semaphore,
            config.sem_resources,
            config.sem_percent,
        ),
        (
            LockType::Latch,
            config.latch_resources,
            config.latch_percent,
        ),
    ];
    let mut edge = 0;
    for (ty, count, percent) in shares {
        if count == 0 {
            continue;
        }
        edge += percent;
        if roll < edge {
            return layout.first(ty) + rng.below(u64::from(count)) as u32;
        }
    }
    rng.below(u64::from(config.resources)) as u32
}

/// One semaphore op: `try_set_permits`, then an acquisition of 1 or 2 permits and its hold.
async fn sem_op(ctx: &Arc<Ctx>, task: u32, op: u64, res: u32, rng: &mut Rng) -> anyhow::Result<()> {
    let kind = kind_but_run_once(rng);
    let permits = if rng.chance(ONE_PERMIT_PERCENT) { 1 } else { 2 };
    let wait = ms(rng.range(50, 1500));
    let lease = ms(rng.range(200, MAX_EXPLICIT_LEASE.as_millis() as u64));
    let semaphore = ctx.client.semaphore(&ctx.config.layout().name(res))?;
    set_permits(ctx, &semaphore, res, Some(op)).await;
    ctx.record(Event::Begin {
        t: now_us(),
        op,
        task,
        kind,
        res,
        lease_ms: kind.explicit_lease().then_some(lease.as_millis() as u64),
        side: None,
        permits: Some(permits),
        under: None,
        foreign: None,
        latch: None,
        wait_ms: matches!(kind, Kind::TryLockFor | Kind::TryLockForWithLease)
            .then_some(wait.as_millis() as u64),
    });
    let result = match kind {
        Kind::Lock => semaphore.acquire(permits).await.map(Some),
        Kind::TryLock => semaphore.try_acquire(permits).await,
        Kind::TryLockFor => semaphore.try_acquire_for(permits, wait).await,
        Kind::TryLockWithLease => {
            semaphore
                .try_acquire_for_with_lease(permits, Duration::ZERO, lease)
                .await
        }
        Kind::TryLockForWithLease => {
            semaphore
                .try_acquire_for_with_lease(permits, wait, lease)
                .await
        }
        Kind::LockWithLease => semaphore.acquire_with_lease(permits, lease).await.map(Some),
        Kind::RunOnce => unreachable!("not drawn for semaphores"),
    };
    let t = now_us();
    match result {
        Ok(Some(permit)) => {
            ctx.record(Event::Granted {
                t,
                op,
                owner: permit.id().to_string(),
                token: Some(permit.fencing_token().get()),
                hold_count: 1,
            });
            hold_permit(ctx, task, op, res, rng, permit).await?;
        }
        Ok(None) => ctx.record(Event::NotGranted { t, op }),
        Err(error) => {
            ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            });
            sleep(ms(rng.range(20, 100))).await;
        }
    }
    Ok(())
}

/// A permit's hold: lease checks around short rests (now and then a long one), then its
/// release or drop. Permit holders do not write to the store: several hold at once.
async fn hold_permit(
    ctx: &Arc<Ctx>,
    task: u32,
    op: u64,
    res: u32,
    rng: &mut Rng,
    permit: Permit,
) -> anyhow::Result<()> {
    ctx.check_with(op, || permit.is_held());
    foreign_in_hold(ctx, task, res, rng).await?;
    sleep(ms(rng.range(5, 60))).await;
    ctx.check_with(op, || permit.is_held());
    sleep(ms(rest(ctx, rng))).await;
    ctx.check_with(op, || permit.is_held());
    if rng.chance(80) {
        let outcome = match permit.release().await {
            Ok(()) => "ok".to_string(),
            Err(error) => describe(&error),
        };
        ctx.record(Event::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Unlock,
            outcome,
        });
    } else {
        drop(permit);
        ctx.record(Event::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Drop,
            outcome: "background".into(),
        });
    }
    Ok(())
}

/// `try_set_permits`, recording when it set the number (it was gone); errors are left to the
/// next try.
async fn set_permits(ctx: &Ctx, semaphore: &Semaphore, res: u32, op: Option<u64>) {
    let permits = ctx.config.sem_permits;
    if let Ok(true) = semaphore.try_set_permits(permits).await {
        ctx.record(Event::PermitsSet {
            t: now_us(),
            res,
            op,
        });
    }
}

/// Every [`PERMITS_TICK`], the number of permits of every semaphore, set again if Redis lost
/// it: so that a waiter never waits for a number nobody sets (every op sets it first too, but
/// all the tasks may be waiting).
async fn keep_permits_set(ctx: Arc<Ctx>) {
    let layout = ctx.config.layout();
    let first = layout.first(LockType::Semaphore);
    let semaphores: Vec<(u32, Semaphore)> = (first..first + layout.sem)
        .filter_map(|res| Some((res, ctx.client.semaphore(&layout.name(res)).ok()?)))
        .collect();
    loop {
        for (res, semaphore) in &semaphores {
            set_permits(&ctx, semaphore, *res, None).await;
        }
        sleep(PERMITS_TICK).await;
    }
}

/// How often a waiting fair acquire's place in line is looked at.
const LINE_POLL: Duration = Duration::from_millis(2);

/// A run of polls that found the owner's entry with one score.
struct Run {
    /// When the first poll of the run was answered.
    first: i64,
    arrival: i64,
    /// When the last poll of the run was sent.
    last: i64,
    polls: u32,
    /// Whether the next poll that finds this score extends the run (no poll found the entry
    /// missing since).
    open: bool,
}

/// What the polls of a waiting acquire saw: its runs in line, and each grant of its owner
/// seen in Redis while the call was under way.
#[derive(Default)]
struct Line {
    runs: Vec<Run>,
    held: Vec<HeldSeen>,
    /// When the last poll that found no hold was sent.
    no_hold: Option<i64>,
}

/// One grant of a waiter's owner seen in Redis ([`Event::HeldInRedis`]).
struct HeldSeen {
    /// When the last poll before it that found no hold was sent.
    since: Option<i64>,
    /// When the first poll that found it was sent, and answered.
    sent: i64,
    answered: i64,
    token: u64,
    /// When the first poll after it that did not find it was answered.
    gone: Option<i64>,
}

/// Runs the fair or read/write acquire `call`, polling `owner`'s place in the line of `lock`
/// alongside until it returns; the runs of polls that found the same arrival go to `line`, and
/// so does each grant the polls found the owner holding in Redis. A poll that found no entry
/// ends a run; one that failed (Redis paused or restarting) does not: an entry that went and
/// came back has a new arrival.
async fn watching_the_line<T>(
    observer: &Observer,
    lock: &Lock,
    owner: &str,
    call: impl Future<Output = T>,
    line: &mut Line,
) -> T {
    let poll = async {
        loop {
            if let Some(answer) = observer.watch(lock.keys(), owner).await {
                let now = answer.value.token;
                for seen in line.held.iter_mut() {
                    if seen.gone.is_none() && now != Some(seen.token) {
                        seen.gone = Some(answer.received);
                    }
                }
                match now {
                    Some(token) if !line.held.iter().any(|seen| seen.token == token) => {
                        line.held.push(HeldSeen {
                            since: line.no_hold,
                            sent: answer.sent,
                            answered: answer.received,
                            token,
                            gone: None,
                        });
                    }
                    Some(_) => {}
                    None => line.no_hold = Some(answer.sent),
                }
                match (answer.value.arrival, line.runs.last_mut()) {
                    (Some(arrival), Some(run)) if run.open && run.arrival == arrival => {
                        run.last = answer.sent;
                        run.polls += 1;
                    }
                    (Some(arrival), _) => line.runs.push(Run {
                        first: answer.received,
                        arrival,
                        last: answer.sent,
                        polls: 1,
                        open: true,
                    }),
                    (None, Some(run)) => run.open = false,
                    (None, None) => {}
                }
            }
            sleep(LINE_POLL).await;
        }
    };
    tokio::select! {
        biased;
        out = call => out,
        () = poll => unreachable!("the poll loop never ends"),
    }
}

/// `let g = lock.lock().await?; tokio::spawn(work(g));`: the hold (checks, fenced write,
/// release) runs in a new task, recorded as a task of its own (`Handoff`), while the caller
/// goes straight on to its next operation. The checker then sees whether the caller's next
/// acquire of the same lock re-entered the hold the section still works under (two tasks in
/// one critical section) or waited for it.
fn hand_off(
    ctx: &Arc<Ctx>,
    op: u64,
    res: u32,
    side: Option<Side>,
    rng: Rng,
    guard: LockGuard<'_>,
) -> anyhow::Result<()> {
    let to_task = ctx.next_task.fetch_add(1, Ordering::Relaxed);
    ctx.record(Event::Handoff {
        t: now_us(),
        op,
        to_task,
    });
    let mut sections = ctx.sections.lock().unwrap();
    // Collect finished sections, so that one that failed fails this client task.
    while let Some(finished) = sections.try_join_next() {
        section_result(finished)?;
    }
    // A guard leaves its task only detached: the caller's next acquire then waits for it.
    let held = Held {
        op,
        task: to_task,
        res,
        side,
        rw: None,
    };
    sections.spawn(section(ctx.clone(), held, rng, guard.detach()));
    Ok(())
}

/// The spawned half of a hand-off: the hold, in a task of its own, with its own store
/// connection (opened at its first write). (No downgrade nor upgrade there: the section's
/// task is another owner.)
async fn section(
    ctx: Arc<Ctx>,
    held: Held<'static>,
    mut rng: Rng,
    guard: LockGuard<'static>,
) -> anyhow::Result<()> {
    hold(&ctx, held, &mut rng, &mut None, guard).await?;
    ctx.in_flight.lock().unwrap().remove(&held.op);
    Ok(())
}

/// A finished section's outcome: its error, or its panic as an error.
fn section_result(
    joined: Result<anyhow::Result<()>, tokio::task::JoinError>,
) -> anyhow::Result<()> {
    match joined {
        Ok(result) => result.context("hand-off section failed"),
        Err(join) => anyhow::bail!("hand-off section panicked: {join}"),
    }
}

/// What a hold is: its op and task, and on a read/write lock its side and (in the task that
/// acquired it) the handle to downgrade or to ask for an upgrade with.
#[derive(Clone, Copy)]
struct Held<'a> {
    op: u64,
    task: u32,
    res: u32,
    side: Option<Side>,
    rw: Option<&'a RwLock>,
}

/// How long a hold rests before its release: now and then across several renewals (or past
/// an explicit lease). Under `--ignore-lease` (the checker's self-test) often: a client that
/// ignores its lease is caught when it works past it, and a short run must show it on every
/// kind (a semaphore only shows it when its other permits are taken meanwhile).
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
    held: Held<'_>,
    rng: &mut Rng,
    store: &mut Option<Store>,
    guard: LockGuard<'_>,
) -> anyhow::Result<()> {
    let Held { op, res, .. } = held;
    let token = guard.fencing_token().get();
    ctx.check(op, &guard);
    foreign_in_hold(ctx, held.task, res, rng).await?;
    sleep(ms(rng.range(5, 60))).await;
    // Readers do not write: the store's fence is for writers.
    if held.side != Some(Side::Read) && ctx.check(op, &guard) {
        // Preparing the write: a pause that lands here makes a late write, which the store
        // must refuse once a newer holder wrote.
        sleep(ms(rng.range(20, 150))).await;
        let conn = store.take();
        let path = ctx.store_path.clone();
        let (client, gen) = (ctx.config.client, ctx.config.gen);
        let (conn, written) = tokio::task::spawn_blocking(move || {
            // A hand-off section has no connection yet: it opens one here, off the workers.
            let mut conn = match conn.map_or_else(|| Store::open(&path), Ok) {
                Ok(conn) => conn,
                Err(error) => return (None, Err(error)),
            };
            let written = conn.write(res, token, client, gen, op);
            (Some(conn), written)
        })
        .await?;
        *store = conn;
        let (accepted, t) = written?;
        ctx.record(Event::Write {
            t,
            op,
            token,
            accepted,
        });
        ctx.check(op, &guard);
    }
    if held.side == Some(Side::Write) && held.rw.is_some() && rng.chance(DOWNGRADE_PERCENT) {
        return downgrade(ctx, held, rng, guard).await;
    }
    finish(ctx, held, rng, guard).await
}

/// The end of a hold: a rest, a check, for a reader now and then an upgrade attempt, and the
/// release.
async fn finish(
    ctx: &Arc<Ctx>,
    held: Held<'_>,
    rng: &mut Rng,
    guard: LockGuard<'_>,
) -> anyhow::Result<()> {
    sleep(ms(rest(ctx, rng))).await;
    ctx.check(held.op, &guard);
    if held.side == Some(Side::Read) && held.rw.is_some() && rng.chance(UPGRADE_PERCENT) {
        upgrade(ctx, held, rng, &guard).await;
    }
    release(ctx, held.op, rng, guard).await;
    Ok(())
}

/// `guard.unlock()` (recording its outcome), or now and then a drop (released in the
/// background).
async fn release(ctx: &Ctx, op: u64, rng: &mut Rng, guard: LockGuard<'_>) {
    if rng.chance(80) {
        let outcome = match guard.unlock().await {
            Ok(()) => "ok".to_string(),
            Err(error) => describe(&error),
        };
        ctx.record(Event::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Unlock,
            outcome,
        });
    } else {
        drop(guard);
        ctx.record(Event::Released {
            t: now_us(),
            op,
            how: ReleaseHow::Drop,
            outcome: "background".into(),
        });
    }
}

/// A new op asked under the hold `held` on its read/write lock, for `side`: its `Begin` and,
/// once the call returned, whether `under` was still certainly held and the outcome. Returns
/// the op and the call's result.
async fn under<'l>(
    ctx: &Ctx,
    held: Held<'_>,
    side: Side,
    lock: &'l Lock,
    rng: &mut Rng,
    under: &LockGuard<'_>,
) -> (u64, Result<Option<LockGuard<'l>>, LockError>) {
    let op = ctx.next_op.fetch_add(1, Ordering::Relaxed);
    ctx.in_flight.lock().unwrap().insert(op);
    let kind = kind_but_run_once(rng);
    let wait = ms(rng.range(50, 1500));
    let lease = ms(rng.range(200, MAX_EXPLICIT_LEASE.as_millis() as u64));
    ctx.record(Event::Begin {
        t: now_us(),
        op,
        task: held.task,
        kind,
        res: held.res,
        lease_ms: kind.explicit_lease().then_some(lease.as_millis() as u64),
        side: Some(side),
        permits: None,
        under: Some(held.op),
        foreign: None,
        latch: None,
        wait_ms: None,
    });
    let result = acquire(lock, kind, wait, lease).await;
    let t = now_us();
    ctx.record(Event::UnderHeld {
        t,
        op,
        held: under.is_held(),
    });
    match &result {
        Ok(Some(guard)) => ctx.record(Event::Granted {
            t,
            op,
            owner: guard.owner().to_string(),
            token: Some(guard.fencing_token().get()),
            hold_count: guard.hold_count(),
        }),
        Ok(None) => ctx.record(Event::NotGranted { t, op }),
        Err(error) => ctx.record(Event::Failed {
            t,
            op,
            error: describe(error),
        }),
    }
    (op, result)
}

/// Downgrade: the read side taken under the write hold `held` (granted at once, whoever
/// waits), then the write let go, and the read held on as a hold of its own.
async fn downgrade(
    ctx: &Arc<Ctx>,
    held: Held<'_>,
    rng: &mut Rng,
    write: LockGuard<'_>,
) -> anyhow::Result<()> {
    let rw = held.rw.expect("downgrades only where the handle is");
    let (op, result) = under(ctx, held, Side::Read, rw.read(), rng, &write).await;
    release(ctx, held.op, rng, write).await;
    match result {
        Ok(Some(read)) => {
            ctx.check(op, &read);
            let read_held = Held {
                op,
                side: Some(Side::Read),
                ..held
            };
            finish(ctx, read_held, rng, read).await?;
        }
        Ok(None) => {}
        Err(_) => sleep(ms(rng.range(20, 100))).await,
    }
    ctx.in_flight.lock().unwrap().remove(&op);
    Ok(())
}

/// An upgrade attempt: the write side asked for under the read hold `held`; it must come back
/// as `UpgradeRefused` at once. (Granted anyway, the write is checked and let go at once, so
/// the checker's overlap rules see it too.)
async fn upgrade(ctx: &Arc<Ctx>, held: Held<'_>, rng: &mut Rng, read: &LockGuard<'_>) {
    let rw = held.rw.expect("upgrades only where the handle is");
    let (op, result) = under(ctx, held, Side::Write, rw.write(), rng, read).await;
    if let Ok(Some(write)) = result {
        ctx.check(op, &write);
        release(ctx, op, rng, write).await;
    }
    ctx.in_flight.lock().unwrap().remove(&op);
}

/// `run_once` hands its job no guard, so the job's belief is derived: it may count on the lock
/// until `begin + hold_at_most - drift` (the acquire went out after `begin`, and the library's
/// own deadline is send time + lease - drift).
async fn run_once_op(
    ctx: &Arc<Ctx>,
    op: u64,
    rng: &mut Rng,
    lock: &leasehold::Lock,
    begin: i64,
    hold_at_most: Duration,
) -> anyhow::Result<()> {
    let hold_at_least = if rng.chance(50) {
        Duration::ZERO
    } else {
        ms(rng.range(20, hold_at_most.as_millis() as u64 / 2))
    };
    let valid_until =
        begin + (hold_at_most - leasehold::Lease::new(hold_at_most)?.drift()).as_micros() as i64;
    let job_time = ms(rng.range(10, 300));
    let owner = lock.owner().to_string();
    let job_ctx = ctx.clone();
    let job = async move {
        let t = now_us();
        job_ctx.record(Event::Granted {
            t,
            op,
            owner,
            token: None,
            hold_count: 0,
        });
        job_ctx.record(Event::Check {
            t,
            op,
            held: t < valid_until,
            derived: true,
        });
        sleep(job_time).await;
        let t = now_us();
        job_ctx.record(Event::Check {
            t,
            op,
            held: t < valid_until,
            derived: true,
        });
    };
    let options = RunOnceOptions::at_most(hold_at_most).at_least(hold_at_least);
    match run_once(lock, options, job).await {
        Ok(RunOnce::Ran(())) => ctx.record(Event::Released {
            t: now_us(),
            op,
            how: ReleaseHow::RunOnce,
            outcome: "ok".into(),
        }),
        Ok(RunOnce::Skipped) => ctx.record(Event::NotGranted { t: now_us(), op }),
        Err(error) => {
            ctx.record(Event::Failed {
                t: now_us(),
                op,
                error: describe(&error),
            });
            sleep(ms(rng.range(20, 100))).await;
        }
    }
    Ok(())
}

/// How long after a latch wait began its party reads the count ([`LatchCall::Count`]): by
/// then the wait has certainly looked at the latch once, away from faults (a round trip).
pub const LATCH_READ_AFTER: Duration = Duration::from_millis(250);
/// The longest latch wait (`wait_for`) a party makes.
pub const MAX_LATCH_WAIT: Duration = Duration::from_secs(4);
/// How often the party whose count-down opened a latch starts the next round at once.
const NEXT_ROUND_PERCENT: u64 = 60;

/// One latch op: a party sets a count (2 or 3, if the latch is open), counts down, or waits
/// (`wait_for`, with a read of the count a little after the wait began). A count-down that
/// opens the latch is often followed at once by the next round's count, set by the same
/// party; one that leaves the latch counting is now and then followed by a foreign-kind
/// attempt on the latch's name, bracketed by the count-down and a read of the count (what
/// the checker needs to know the latch was counting all along).
async fn latch_op(
    ctx: &Arc<Ctx>,
    task: u32,
    op: u64,
    res: u32,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let latch = ctx.client.latch(&ctx.config.layout().name(res))?;
    let roll = rng.below(100);
    if roll < 25 {
        let count = rng.range(2, 4) as u32;
        latch_call(ctx, task, op, res, &latch, LatchCall::Set { count }).await;
    } else if roll < 60 {
        let left = latch_call(ctx, task, op, res, &latch, LatchCall::CountDown).await;
        match left {
            Some(0) if rng.chance(NEXT_ROUND_PERCENT) => {
                let next = ctx.next_op.fetch_add(1, Ordering::Relaxed);
                let count = rng.range(2, 4) as u32;
                latch_call(ctx, task, next, res, &latch, LatchCall::Set { count }).await;
            }
            Some(left) if left > 0 && rng.chance(ctx.config.foreign_percent) => {
                let foreign = ctx.next_op.fetch_add(1, Ordering::Relaxed);
                foreign_attempt(ctx, task, foreign, res, rng).await?;
                let read = ctx.next_op.fetch_add(1, Ordering::Relaxed);
                latch_call(ctx, task, read, res, &latch, LatchCall::Count { of: op }).await;
            }
            _ => {}
        }
    } else {
        let timeout = ms(rng.range(500, MAX_LATCH_WAIT.as_millis() as u64));
        let wait = LatchCall::Wait {
            timeout_ms: timeout.as_millis() as u64,
        };
        let read = ctx.next_op.fetch_add(1, Ordering::Relaxed);
        let read_latch = latch.clone();
        tokio::join!(latch_call(ctx, task, op, res, &latch, wait), async {
            sleep(LATCH_READ_AFTER).await;
            let call = LatchCall::Count { of: op };
            latch_call(ctx, task, read, res, &read_latch, call).await
        });
    }
    Ok(())
}

/// One latch call, recorded (`Begin` with its [`LatchCall`], then `LatchReturned` or
/// `Failed`); returns its value.
async fn latch_call(
    ctx: &Ctx,
    task: u32,
    op: u64,
    res: u32,
    latch: &leasehold::Latch,
    call: LatchCall,
) -> Option<u64> {
    ctx.record(Event::Begin {
        t: now_us(),
        op,
        task,
        kind: if matches!(call, LatchCall::Wait { .. }) {
            Kind::TryLockFor
        } else {
            Kind::TryLock
        },
        res,
        lease_ms: None,
        side: None,
        permits: None,
        under: None,
        foreign: None,
        latch: Some(call),
        wait_ms: None,
    });
    let result = match call {
        LatchCall::Set { count } => latch.try_set_count(count).await.map(u64::from),
        LatchCall::CountDown => latch.count_down().await,
        LatchCall::Wait { timeout_ms } => latch.wait_for(ms(timeout_ms)).await.map(u64::from),
        LatchCall::Count { .. } => latch.count().await,
    };
    let t = now_us();
    match result {
        Ok(value) => {
            ctx.record(Event::LatchReturned { t, op, value });
            Some(value)
        }
        Err(error) => {
            ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            });
            None
        }
    }
}

/// The family of a name's own kind, as `LockError::WrongKind` tells them apart: a plain and
/// a fair lock are both "lock" (their hashes look alike), so asking for one on the other's
/// name is not a foreign-kind attempt.
fn family(ty: LockType) -> &'static str {
    match ty {
        LockType::Plain | LockType::Fair => "lock",
        LockType::ReadWrite => "read/write lock",
        LockType::Semaphore => "semaphore",
        LockType::Latch => "count-down latch",
    }
}

/// A foreign-kind attempt on resource `res`'s name: an acquire of a kind of another family
/// than the name's own ([`AskedAs`]; a latch's is a `wait_for`, of zero for a try), one try or
/// a short bounded wait, from a fresh owner
/// (it must not meet its task's own holds). The library must refuse it with
/// `LockError::WrongKind` and write nothing; granted anyway, it is let go at once. On a
/// semaphore's or a latch's name the hash's TTL is read right after ([`Event::AfterForeign`]):
/// neither may have one.
async fn foreign_attempt(
    ctx: &Arc<Ctx>,
    task: u32,
    op: u64,
    res: u32,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let layout = ctx.config.layout();
    let (ty, name) = (layout.lock_type(res), layout.name(res));
    let asked: Vec<AskedAs> = AskedAs::ALL
        .into_iter()
        .filter(|a| a.kind_name() != family(ty))
        .collect();
    let asked = asked[rng.below(asked.len() as u64) as usize];
    let wait = if rng.chance(50) {
        None
    } else {
        Some(ms(rng.range(50, 300)))
    };
    let kind = if wait.is_some() {
        Kind::TryLockFor
    } else {
        Kind::TryLock
    };
    // A latch's wait only: it writes nothing. (`try_set_count` on a name that holds nothing
    // would set a count, with no TTL, on a lock's or semaphore's name, for good.)
    let latch_call = LatchCall::Wait {
        timeout_ms: wait.unwrap_or_default().as_millis() as u64,
    };
    let latch = (asked == AskedAs::Latch).then_some(latch_call);
    let side = match asked {
        AskedAs::Read => Some(Side::Read),
        AskedAs::Write => Some(Side::Write),
        _ => None,
    };
    ctx.record(Event::Begin {
        t: now_us(),
        op,
        task,
        kind,
        res,
        lease_ms: None,
        side,
        permits: (asked == AskedAs::Semaphore).then_some(1),
        under: None,
        foreign: Some(asked),
        latch,
        wait_ms: wait.map(|w| w.as_millis() as u64),
    });
    let owner = ctx.client.new_owner();
    let lock = match asked {
        AskedAs::Lock => Some(ctx.client.lock(&name)?.with_owner(owner)),
        AskedAs::FairLock => Some(ctx.client.fair_lock(&name)?.with_owner(owner)),
        AskedAs::Read => Some(ctx.client.rw_lock(&name)?.with_owner(owner).read().clone()),
        AskedAs::Write => Some(ctx.client.rw_lock(&name)?.with_owner(owner).write().clone()),
        AskedAs::Semaphore | AskedAs::Latch => None,
    };
    if let Some(lock) = lock {
        let result = match wait {
            Some(wait) => lock.try_lock_for(wait).await,
            None => lock.try_lock().await,
        };
        let t = now_us();
        match result {
            Ok(Some(guard)) => {
                ctx.record(Event::Granted {
                    t,
                    op,
                    owner: guard.owner().to_string(),
                    token: Some(guard.fencing_token().get()),
                    hold_count: guard.hold_count(),
                });
                let outcome = guard
                    .unlock()
                    .await
                    .map_or_else(|e| describe(&e), |()| "ok".into());
                ctx.record(Event::Released {
                    t: now_us(),
                    op,
                    how: ReleaseHow::Unlock,
                    outcome,
                });
            }
            Ok(None) => ctx.record(Event::NotGranted { t, op }),
            Err(error) => ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            }),
        }
    } else if asked == AskedAs::Semaphore {
        let semaphore = ctx.client.semaphore(&name)?;
        let result = match wait {
            Some(wait) => semaphore.try_acquire_for(1, wait).await,
            None => semaphore.try_acquire(1).await,
        };
        let t = now_us();
        match result {
            Ok(Some(permit)) => {
                ctx.record(Event::Granted {
                    t,
                    op,
                    owner: permit.id().to_string(),
                    token: Some(permit.fencing_token().get()),
                    hold_count: 1,
                });
                let outcome = permit
                    .release()
                    .await
                    .map_or_else(|e| describe(&e), |()| "ok".into());
                ctx.record(Event::Released {
                    t: now_us(),
                    op,
                    how: ReleaseHow::Unlock,
                    outcome,
                });
            }
            Ok(None) => ctx.record(Event::NotGranted { t, op }),
            Err(error) => ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            }),
        }
    } else {
        let latch = ctx.client.latch(&name)?;
        let result = latch.wait_for(wait.unwrap_or_default()).await;
        let t = now_us();
        match result {
            Ok(value) => ctx.record(Event::LatchReturned {
                t,
                op,
                value: u64::from(value),
            }),
            Err(error) => ctx.record(Event::Failed {
                t,
                op,
                error: describe(&error),
            }),
        }
    }
    if matches!(ty, LockType::Semaphore | LockType::Latch) {
        let keys = leasehold_core::LockKeys::new(
            &leasehold_core::Prefix::new(&ctx.config.prefix)?,
            &name,
        )?;
        if let Some(answer) = ctx.observer.pttl(keys.hash()).await {
            ctx.record(Event::AfterForeign {
                t: answer.sent,
                op,
                answered: answer.received,
                pttl: answer.value,
            });
        }
    }
    Ok(())
}

/// Now and then ([`WorkerConfig::foreign_percent`]), a foreign-kind attempt on the name of
/// the hold `op` (another op of the same task, numbered now), made while the hold is believed
/// (the checks around it show it was there all along).
async fn foreign_in_hold(ctx: &Arc<Ctx>, task: u32, res: u32, rng: &mut Rng) -> anyhow::Result<()> {
    if !rng.chance(ctx.config.foreign_percent) {
        return Ok(());
    }
    let op = ctx.next_op.fetch_add(1, Ordering::Relaxed);
    foreign_attempt(ctx, task, op, res, rng).await
}
