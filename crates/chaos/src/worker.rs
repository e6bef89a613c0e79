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
use leasehold::{Lock, LockClient, LockError, LockGuard};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};

use crate::clock::now_us;
use crate::history::{client_log_path, Event, EventLog, Kind, ReleaseHow};
use crate::observer::Observer;
use crate::rng::Rng;
use crate::run::lock_name;
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
    /// Redis itself (not the proxy): the [`Observer`]'s connection.
    pub redis_addr: std::net::SocketAddr,
    /// The watchdog lease of watched holds.
    pub lease: Duration,
    pub command_timeout: Duration,
    /// Record every lease check as held (the checker's self-test; see `RunConfig`).
    pub ignore_lease: bool,
    /// Half the fair waiters cut in at the head of the line (the checker's self-test).
    pub cut_in_line: bool,
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
        let t = now_us();
        let held = guard.is_held() || self.config.ignore_lease;
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
    let observer = Observer::start(config.redis_addr)?;
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

/// Connects, retrying while a fault keeps Redis unreachable (fred fails fast at connect).
async fn connect(config: &WorkerConfig) -> anyhow::Result<LockClient> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let built = LockClient::builder(&config.url)
            .prefix(config.prefix.clone())
            .lease(config.lease)
            .command_timeout(config.command_timeout)
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

/// The error's variant, for grouping in the report, then its message.
fn describe(error: &LockError) -> String {
    let kind = match error {
        LockError::NotHeld { .. } => "not_held",
        LockError::Timeout => "timeout",
        LockError::Connection(_) => "connection",
        LockError::PermissionDenied(_) => "permission_denied",
        LockError::WrongType { .. } => "wrong_type",
        LockError::Redis(_) => "redis",
        LockError::InvalidArgument(_) => "invalid_argument",
        LockError::LeaseLost { .. } => "lease_lost",
        _ => "other",
    };
    format!("{kind}: {error}")
}

/// One operation on lock `res`. Returns `Some(res)` when the guard was handed to a spawned
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
    let kind = Kind::ALL[rng.weighted(&KIND_WEIGHTS)];
    let plain = ctx.config.resources;
    let fair = crate::run::is_fair(res, plain);
    let name = lock_name(res, plain);
    let lock = if fair {
        ctx.client.fair_lock(&name)?
    } else {
        ctx.client.lock(&name)?
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
    // The owner's entry, hold and turn just before the call (see `Event::Floor`).
    let owner = lock.owner();
    let floor = if fair {
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
    });
    if let Some(floor) = floor {
        ctx.record(Event::Floor {
            t: floor.sent,
            op,
            answered: floor.received,
            entry: floor.value.entry,
            held: floor.value.held,
            turn: floor.value.turn,
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
    let call = async {
        match kind {
            Kind::Lock => lock.lock().await.map(Some),
            Kind::TryLock => lock.try_lock().await,
            Kind::TryLockFor => lock.try_lock_for(wait).await,
            Kind::TryLockWithLease => lock.try_lock_with_lease(lease).await,
            Kind::TryLockForWithLease => lock.try_lock_for_with_lease(wait, lease).await,
            Kind::LockWithLease => lock.lock_with_lease(lease).await.map(Some),
            Kind::RunOnce => unreachable!("handled above"),
        }
    };
    let mut line = Vec::new();
    let result = if fair && kind.waits() {
        watching_the_line(&ctx.observer, &lock, owner.id(), call, &mut line).await
    } else {
        call.await
    };
    let t = now_us();
    for run in line {
        ctx.record(Event::Queued {
            t: run.first,
            op,
            arrival: run.arrival,
            last: run.last,
            polls: run.polls,
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
                hand_off(ctx, op, res, rng.fork(op), guard)?;
                return Ok(Some(res));
            }
            hold(ctx, op, res, rng, store, guard).await?;
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

/// Plain locks are picked uniformly, and so are fair ones; `fair_percent` of the ops go to
/// a fair one.
fn pick_lock(config: &WorkerConfig, rng: &mut Rng) -> u32 {
    if config.fair_resources > 0 && rng.chance(config.fair_percent) {
        config.resources + rng.below(u64::from(config.fair_resources)) as u32
    } else {
        rng.below(u64::from(config.resources)) as u32
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

/// Runs the fair acquire `call`, polling `owner`'s place in the line of `lock` alongside
/// until it returns; the runs of polls that found the same arrival go to `line`. A poll that
/// found no entry ends a run; one that failed (Redis paused or restarting) does not: an entry
/// that went and came back has a new arrival.
async fn watching_the_line<T>(
    observer: &Observer,
    lock: &Lock,
    owner: &str,
    call: impl Future<Output = T>,
    line: &mut Vec<Run>,
) -> T {
    let poll = async {
        loop {
            if let Some(answer) = observer.arrival(lock.keys(), owner).await {
                match (answer.value, line.last_mut()) {
                    (Some(arrival), Some(run)) if run.open && run.arrival == arrival => {
                        run.last = answer.sent;
                        run.polls += 1;
                    }
                    (Some(arrival), _) => line.push(Run {
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
    sections.spawn(section(ctx.clone(), op, res, rng, guard.detach()));
    Ok(())
}

/// The spawned half of a hand-off: the hold, in a task of its own, with its own store
/// connection (opened at its first write).
async fn section(
    ctx: Arc<Ctx>,
    op: u64,
    res: u32,
    mut rng: Rng,
    guard: LockGuard<'static>,
) -> anyhow::Result<()> {
    hold(&ctx, op, res, &mut rng, &mut None, guard).await?;
    ctx.in_flight.lock().unwrap().remove(&op);
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

async fn hold(
    ctx: &Arc<Ctx>,
    op: u64,
    res: u32,
    rng: &mut Rng,
    store: &mut Option<Store>,
    guard: LockGuard<'_>,
) -> anyhow::Result<()> {
    let token = guard.fencing_token().get();
    ctx.check(op, &guard);
    sleep(ms(rng.range(5, 60))).await;
    if ctx.check(op, &guard) {
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
    // Now and then hold across several renewals (or past an explicit lease).
    let rest = if rng.chance(8) {
        rng.range(1200, 2500)
    } else {
        rng.range(5, 120)
    };
    sleep(ms(rest)).await;
    ctx.check(op, &guard);
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
    Ok(())
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
