//! The checker: reads a run's history (client event logs, the store's write log, the faults,
//! what was left in Redis) and counts violations.
//!
//! Soundness rests on these facts:
//! - every timestamp comes from one clock (`CLOCK_MONOTONIC`, system-wide), so times taken by
//!   different processes compare without skew;
//! - a belief sample's time is read *before* `is_held()`, and `is_held()` only goes from true to
//!   false, so a true sample at `t` proves the holder believed from its grant through `t` even if
//!   the process was paused in between;
//! - the store reads its time under its write lock, so store times order writes exactly;
//! - an acquire's script ran after its `Begin` and before its `Granted` was taken; a release's
//!   script ran after the op's last record before the call and before its `Released`.
//!
//! The history can only under-report beliefs (samples are sparse), never over-report, so every
//! counted overlap happened.
//!
//! # Fencing tokens
//!
//! A token is strictly increasing per name, and unique among the names of one Redis Cluster
//! slot, which share that slot's counter (`P:{T}:fence`); the names of different slots have
//! counters of their own, each floored at the server time, which may meet, so their tokens may
//! be equal. So: the store accepted only increasing tokens per resource, each its writer's
//! grant's ([`FENCE_NON_INCREASING`], [`FENCE_UNKNOWN_TOKEN`]); no two new grants of names in
//! one slot got one token ([`FENCE_REUSED`], [`fence_reused_check`], the slot as
//! `leasehold_core::LockKeys::slot` computes it); and a grant whose acquire began after another
//! grant of the same name was recorded got a higher token ([`FENCE_ORDER`]; across a loss of
//! Redis's data counted apart, still a violation).
//!
//! # Two tasks in one critical section
//!
//! A critical section is identified by (client process, task), not by owner id: the task that
//! acquired, or from a `Handoff` event on, the task the guard was handed to. Two beliefs on one
//! lock that overlap are a violation when their owners differ ([`OVERLAP`]), and also under one
//! owner id when at some instant of the overlap two different tasks ran them
//! ([`OVERLAP_TWO_TASKS`]): a guard handed to a spawned task while the task that acquired it
//! asked again and re-entered the hold (ownership is the acquiring task). Only nested re-entry
//! within one task may overlap, and only as re-entry: one grant, one fencing token. Two
//! grants with different tokens overlapping in one task (futures joined in one task, where the
//! second replaced the first's grant under it) are counted too ([`OVERLAP_REPLACED`]). The
//! data-loss allowance of the overlap check applies to all three, and so does its soundness:
//! both sections are proven by true belief samples.
//!
//! # Waiters left waiting on a free lock
//!
//! A waiting call (`lock()`, `try_lock_for()` and their lease variants) must get a lock within
//! [`FREE_LOCK_BOUND_US`] (225 ms) of its becoming free ([`FREE_LOCK`]). "Free" means no hold
//! in Redis. The rule has three parts.
//!
//! 1. *Proven free.* Only two things prove a lock free at an instant: an `unlock()` that
//!    returned Ok for a first hold while no other op of its task was under way on the lock
//!    (then its script deleted the lock, which held no other owner's field), from the moment
//!    the call returned; and an explicit lease that certainly ran out (grant + lease, nothing
//!    renews it). A dropped guard (released in the background), an unlock that failed,
//!    `run_once` (its `unlock_after` tail holds the lock for nobody, and it hides release
//!    errors), watched holds of killed or paused clients and Redis restarts prove nothing: the
//!    history does not say when those holds ended.
//! 2. *Stays free until* the first hold that can have begun: a grant recorded between the
//!    proof's lower end and the free instant cancels it; after it, a grant whose acquire began
//!    later ends it at that begin (a `try_lock()` takes a free, unreserved lock ahead of the
//!    waiters), a grant whose acquire began earlier ends it at its recorded grant, and an
//!    acquire whose outcome the history cannot date ends it where it may have been granted:
//!    one that failed, one cut short by SIGKILL, any call while a fault that can delay or lose
//!    replies hit its client ([`hidden_grants`]). A waiter's own grant ends its wait, not the
//!    stretch it waited in.
//! 3. *Deadline.* The bound runs from the free instant (or the waiter's begin, if later). A
//!    fault on the waiter's client, or on every client, in effect in that time moves it to the
//!    bound after the fault's recovery: about 1.5 s after connections cut at one instant, up to
//!    4 s after a long outage ([`free_lock_recovery_us`] says why). Faults on other clients
//!    move no deadline (their hidden grants count in 2): a partitioned, paused or killed
//!    client whose turn it is loses it after the grace, and a killed holder's hold ends by its
//!    lease (or proves nothing).
//!
//! A waiter under way in the free stretch whose call had not returned by the deadline, while
//! the stretch lasted past it, is counted (once).
//!
//! Why each counted waiter happened: the lock was free at the start (the proofs rest on what
//! the scripts do and on the order facts above), nobody could have taken it before the
//! deadline except by a grant the history would show, and the waiter's call was still under
//! way. That last step dates a waiter's grant by when it was recorded, and orders the first
//! hold after the free instant by the recorded grants, which assumes that away from faults a
//! reply reaches its caller well within the 200 ms of the bound. A process starved of the CPU
//! for that long with no fault injected would break it, and would still be a waiter whose call
//! did not return within the bound of the lock becoming free.
//!
//! The 15 s stall check ([`STUCK`]) stays: it covers what this rule cannot prove, stalls on a
//! lock not provably free (a hold kept alive for ever, a key without a TTL) and waiters still
//! waiting at the stop.
//!
//! On a fair lock a free lock is the first live waiter's turn, reserved until that waiter's
//! entry would lapse; the rule holds as it is (the first waiter's grant ends the free stretch),
//! except that a waiter that cannot take its turn holds the others up for up to a lease:
//! [`line_holds`] adds those stretches to the hidden grants.
//!
//! # Arrival order on fair locks
//!
//! A fair lock serves its waiters in arrival order, skipping only a dead waiter, whose entry
//! is then removed (it comes back, if ever, at the back, with a new arrival). The clients read
//! the line on a connection of their own straight to Redis: just before each fair acquire,
//! whether its owner already had an entry, a hold or a turn there ([`Event::Floor`]); while a
//! fair acquire waits, its owner's entry's arrival every 2 ms ([`Event::Queued`]). A grant
//! whose acquire began while another owner's entry was in line, and after which that same
//! entry (same arrival) was still seen in line, went past a waiter that was ahead of it all
//! along ([`FAIR_ORDER`]; [`fair_order_check`] says why no fault excuses it). Order is only
//! judged from what the line showed, never from when calls began or returned: a waiter whose
//! entry lapsed under a fault may be passed, and shows a new arrival.
//!
//! The read/write lock has such a line too (one line of readers and writers in arrival
//! order), read and judged the same way, but for readers: a reader may go in beside a
//! reader ahead of it, so a grant is judged against every waiter ahead of it when either of
//! the two is a writer.
//!
//! One way a live waiter leaves the line is not a lapse: its own grant, whose reply was lost
//! (a command timeout under a slow link), rolled back in the background. The polls also read
//! whether the waiter's owner holds the lock in Redis, and another owner's grant after such a
//! rolled-back grant, while the waiter still waited, counts ([`rollback::LOST_GRANT`]; the
//! orchestrator slows mostly the client first in a fair or read/write line, past its command
//! timeout, to bring such replies about). (The semaphore's line is not read: a request's id
//! is its permit's, which the client learns only with the grant.)
//!
//! # One name, one kind; count-down latches
//!
//! Acquires of another kind on a name in use by its own kind must be refused as `WrongKind`
//! and change nothing ([`foreign`]: [`foreign::FOREIGN_GRANTED`],
//! [`foreign::FOREIGN_NOT_REFUSED`], [`foreign::FOREIGN_CHANGED`]; the cleanup's
//! [`SEMAPHORE_LEFT`] and [`LATCH_LEFT`]). Every waiter of a latch goes when its count
//! reaches zero, also when the next round starts at once ([`latch`]:
//! [`latch::LATCH_MISSED`]).
//!
//! # Read/write locks
//!
//! The overlap rule above, with readers allowed to share: two beliefs on one read/write lock
//! that overlap are a violation when at least one is a write and their owners differ
//! ([`RW_EXCLUSION`]), or, under one owner id, when two tasks ran them
//! ([`OVERLAP_TWO_TASKS`]) or two write grants replaced each other in one task
//! ([`OVERLAP_REPLACED`]); the data-loss allowance applies as to every overlap. A read and a
//! write of one owner in one task may overlap: that is a downgrade (the read asked for under
//! the write), unless the write is a new grant asked for after the read was granted and while
//! it was believed throughout, i.e. an upgrade ([`RW_UPGRADE`], [`exclusion_checks`] says why
//! that proves one). The workload also asks for upgrades on purpose: a write asked for under
//! a read hold must come back as `UpgradeRefused` whenever the read hold was still certainly
//! held when the call returned (the client refuses from its own table, without a round trip);
//! and a read asked for under a write hold (a downgrade) must not come back empty while the
//! write hold was certainly held ([`RW_DOWNGRADE`]; [`rw_checks`]). Fencing needs nothing
//! new: the tokens of one name rise over all its grants, read and write, so the fence rules
//! above judge them all, and only writers write to the store. The free-lock rule proves a
//! read/write lock free only by a write hold's end (a read's proves nothing: other readers may
//! hold), and a waiter in its line may hold the others up as on a fair lock.
//!
//! # Semaphores
//!
//! A permit's belief is judged as a hold's: from its grant to its last true `is_held()`. At
//! every instant, the permits of the beliefs that cover it must not exceed the semaphore's
//! number ([`SEMAPHORE_LIMIT`]): each of those acquisitions was granted by a script that kept
//! the permits taken within the number, and each was still leased in Redis then. Redis losing
//! its data loses the permits taken (and the number, which the clients set again): a belief
//! from an acquisition that began before such a loss is left out for up to its lease after
//! it, and an instant over the number only with them is counted apart
//! ([`SEMAPHORE_DATA_LOSS`]), as the overlaps after a loss are. Semaphores have no free-lock
//! rule (a waiter's permits being there is not provable from the history); the stall rule
//! covers their waiters.

mod foreign;
mod latch;
mod rollback;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;

use anyhow::Context;

use crate::history::{
    read_client_histories, read_faults, AskedAs, ClientHistory, Event, Fault, FaultKind, Kind,
    LatchCall, ReleaseHow, Side,
};
use crate::run::{Cleanup, Layout, LockType, RunConfig};
use crate::store::{Accepted, Refused, Store};
use crate::worker::MAX_EXPLICIT_LEASE;

/// A wait may stall this long without any fault to explain it (contention alone: a few
/// seconds at most with these hold times) before it counts as a waiter that never progressed.
pub const STALL_BOUND_US: i64 = 15_000_000;
/// How long after a fault healed its effects may still hold waiters up: a partitioned or paused
/// holder's lock lives until its lease runs out, reconnects back off up to 2 s.
fn recovery_us(config: &RunConfig) -> i64 {
    2 * config.lease.max(MAX_EXPLICIT_LEASE).as_micros() as i64 + 2_000_000
}

/// A waiter must have a free lock within this long when no fault is near: the grant's or the
/// wake-up's message, one try (a waiter told to look again), and the scheduling of the
/// processes.
pub const FREE_LOCK_BOUND_US: i64 = 225_000;
/// fred's first reconnect delay under the library's default policy, which the chaos clients
/// keep (50 ms doubling to 2 s, plus up to 100 ms of jitter).
const FIRST_RECONNECT_DELAY_US: i64 = 150_000;
/// fred's longest reconnect delay under that policy.
const MAX_RECONNECT_DELAY_US: i64 = 2_000_000;
/// A waiter's first backoff after a transient error (doubling up to the longest; an answer
/// resets it).
const MIN_WAIT_BACKOFF_US: i64 = 10_000;
/// A waiter's longest backoff after transient errors.
const MAX_WAIT_BACKOFF_US: i64 = 1_000_000;
/// How long after a fault healed a command sent during it may still reach Redis: the proxy
/// holds a chunk for at most its latency (400 ms at most in the orchestrator's faults).
const LATE_DELIVERY_US: i64 = 500_000;
/// Redis expires keys on its own millisecond clock: a key can outlive `set + ttl` on ours by
/// the rounding, and by any slew between the two clocks over a lease.
const EXPIRY_SLACK_US: i64 = 5_000;

/// After `fault` healed, how long a waiter of a client it hit may still miss a free lock:
/// - its connection may come back only after a pending reconnect delay (a release published
///   meanwhile is lost to it; the reconnect then wakes every waiter). Delays double only while
///   attempts fail, so the pending one is at most about twice the outage, from the first
///   delay up to the longest;
/// - it may be in a backoff after transient errors, which also doubles only while tries fail
///   (during the outage and the reconnect), up to the longest;
/// - a try sent just before the heal may run into the command timeout;
/// - a message or reply the proxy still held may arrive up to [`LATE_DELIVERY_US`] late.
///
/// So about 1.5 s after a fault that cut connections at one instant while Redis stayed
/// reachable, and 4 s after a long one (500 ms command timeout).
fn free_lock_recovery_us(fault: &Fault, config: &RunConfig) -> i64 {
    let outage = fault.end - fault.start;
    let reconnect = MAX_RECONNECT_DELAY_US.min(2 * outage + FIRST_RECONNECT_DELAY_US);
    let backoff = MAX_WAIT_BACKOFF_US.min(2 * (outage + reconnect) + MIN_WAIT_BACKOFF_US);
    reconnect + backoff + config.command_timeout.as_micros() as i64 + LATE_DELIVERY_US
}

/// Whether `fault` hit client `client` generation `gen`: faults on one client hit only it,
/// the others (Redis, every connection) hit everyone.
fn hits(fault: &Fault, client: u32, gen: u32) -> bool {
    match fault.client {
        None => true,
        Some(c) => c == client && fault.gen.is_none_or(|g| g == gen),
    }
}

/// Reads `dir` and checks it.
pub fn check(dir: &Path) -> anyhow::Result<Report> {
    let config: RunConfig = serde_json::from_str(
        &std::fs::read_to_string(dir.join("run.json")).context("reading run.json")?,
    )?;
    if config.redlock > 0 {
        return crate::redlock_check::check(dir);
    }
    let histories = read_client_histories(dir)?;
    let faults_path = dir.join("faults.jsonl");
    let faults = if faults_path.exists() {
        read_faults(&faults_path)?
    } else {
        Vec::new()
    };
    let cleanup: Cleanup = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cleanup.json")).context("reading cleanup.json")?,
    )?;
    let store = Store::open(&dir.join("store.db"))?;
    Ok(analyze(
        &config,
        &histories,
        &faults,
        &cleanup,
        &store.accepted()?,
        &store.refused()?,
    ))
}

type OpKey = (u32, u32, u64);

#[derive(Clone, Debug)]
struct Grant {
    t: i64,
    owner: String,
    token: Option<u64>,
    hold_count: u64,
}

#[derive(Clone, Debug)]
struct Op {
    key: OpKey,
    task: u32,
    kind: Kind,
    res: u32,
    begin: i64,
    /// The hold's lease in µs (explicit, or the watchdog's).
    lease: i64,
    /// When the acquire call returned.
    ended: Option<i64>,
    granted: Option<Grant>,
    failed: Option<String>,
    checks: Vec<(i64, bool)>,
    writes: Vec<(i64, u64, bool)>,
    released: Option<(i64, ReleaseHow, String)>,
    /// When the op was recorded as still running at the drain deadline.
    abandoned: Option<i64>,
    /// When the guard was handed to another task, and that task's number.
    handoff: Option<(i64, u32)>,
    /// The lock's name (`res-<i>`, `fair-<i>`, `rw-<i>` or `sem-<i>`).
    lock: String,
    ty: LockType,
    fair: bool,
    /// On a read/write lock, the side asked for.
    side: Option<Side>,
    /// On a semaphore, the permits asked for.
    permits: u32,
    /// The op of the same task whose hold this one was asked under (a downgrade or an upgrade
    /// attempt), and whether that hold was certainly held when the call returned.
    under: Option<u64>,
    under_held: Option<bool>,
    /// A fair op's owner just before the call ([`Event::Floor`]).
    floor: Option<FloorSeen>,
    /// A fair waiter's place in line, run by run ([`Event::Queued`]).
    queued: Vec<QueueRun>,
    /// A fair or read/write waiter's owner seen holding the lock in Redis while its call was
    /// under way ([`Event::HeldInRedis`]): (the grant ran after this, seen at, token, seen
    /// gone by).
    held_in_redis: Vec<(i64, i64, u64, Option<i64>)>,
    /// A bounded wait's `wait`, in µs.
    wait: Option<i64>,
    /// A foreign-kind attempt: what it asked for ([`Event::Begin`]'s `foreign`); kept apart
    /// from the other ops (`foreign::foreign_kind_check`).
    foreign: Option<AskedAs>,
    /// A latch call, and what it returned (`latch::latch_check`); kept apart too.
    latch: Option<LatchCall>,
    latch_value: Option<u64>,
    /// After a foreign-kind attempt, the hash's PTTL (sent, answered, pttl).
    after_foreign: Option<(i64, i64, i64)>,
}

/// What [`Event::Floor`] read: at some instant in [sent, answered], the owner had (or not) an
/// entry in the line, a hold.
#[derive(Clone, Copy, Debug)]
struct FloorSeen {
    sent: i64,
    entry: bool,
    held: bool,
}

impl FloorSeen {
    /// Nothing of the owner's at the lock: whatever the owner gets after, it gets anew.
    fn clean(&self) -> bool {
        !(self.entry || self.held)
    }
}

/// One [`Event::Queued`]: the entry with score `arrival` was in the line at some instant up
/// to `first` and at some instant from `last` on.
#[derive(Clone, Copy, Debug)]
struct QueueRun {
    first: i64,
    arrival: i64,
    last: i64,
}

impl Op {
    /// [grant, last true belief sample]: when the holder certainly believed its lease valid.
    fn belief(&self) -> Option<(i64, i64)> {
        let grant = self.granted.as_ref()?;
        let last = self
            .checks
            .iter()
            .filter(|(_, held)| *held)
            .map(|(t, _)| *t)
            .max()?;
        (last >= grant.t).then_some((grant.t, last))
    }

    /// The critical section's identity at `t`: (client, generation, task). The task is the one
    /// that acquired, or from a hand-off on the one the guard went to.
    fn task_at(&self, t: i64) -> (u32, u32, u32) {
        let (client, gen, _) = self.key;
        match self.handoff {
            Some((at, to_task)) if t >= at => (client, gen, to_task),
            _ => (client, gen, self.task),
        }
    }

    /// When the acquire call returned, or for a waiter still waiting at the drain deadline,
    /// when it was given up; `None` when its process was killed first.
    fn call_end(&self) -> Option<i64> {
        self.ended.or(self.abandoned)
    }

    /// When the op was over: released (holds), or its call ended (the rest); `None` while it
    /// may still have been going on (a hold never released, a process killed).
    fn over_at(&self) -> Option<i64> {
        match &self.granted {
            Some(_) => self.released.as_ref().map(|(t, _, _)| *t),
            None => self.call_end(),
        }
    }

    /// The last instant recorded for the hold before its release call went out.
    fn last_before_release(&self) -> Option<i64> {
        let grant = self.granted.as_ref()?;
        let checks = self.checks.iter().map(|(t, _)| *t);
        let writes = self.writes.iter().map(|(t, _, _)| *t);
        let handoff = self.handoff.iter().map(|(t, _)| *t);
        Some(checks.chain(writes).chain(handoff).fold(grant.t, i64::max))
    }

    fn finished_at(&self) -> Option<i64> {
        match (&self.granted, self.released.as_ref()) {
            (Some(_), Some((t, _, _))) => Some(*t),
            (Some(_), None) => None,
            (None, _) => self.ended,
        }
    }

    /// Whether its holder writes to the store: holders of locks, and writers of read/write locks
    /// (not those asked for under a read); not readers, permit holders, nor `run_once`.
    fn writes(&self) -> bool {
        let writer = match self.ty {
            LockType::Plain | LockType::Fair => true,
            LockType::ReadWrite => self.side == Some(Side::Write) && self.under.is_none(),
            LockType::Semaphore | LockType::Latch => false,
        };
        writer && self.kind != Kind::RunOnce
    }

    /// A write of a read/write lock.
    fn is_write(&self) -> bool {
        self.side == Some(Side::Write)
    }

    /// The owner: a task's ops all run under the task's own owner id.
    fn owner_key(&self) -> (u32, u32, u32) {
        let (client, gen, _) = self.key;
        (client, gen, self.task)
    }

    fn describe(&self) -> String {
        let (client, gen, op) = self.key;
        if let Some(call) = self.latch {
            let call = match call {
                LatchCall::Set { count } => format!("try_set_count({count})"),
                LatchCall::CountDown => "count_down()".into(),
                LatchCall::Wait { timeout_ms } => format!("wait_for({timeout_ms} ms)"),
                LatchCall::Count { .. } => "count()".into(),
            };
            let asked = self.foreign.map_or(String::new(), |_| " (foreign)".into());
            return format!(
                "client {client} gen {gen} op {op} ({call}{asked} on {}, returned {:?})",
                self.lock, self.latch_value
            );
        }
        let grant = self.granted.as_ref();
        let what = match (self.side, self.under) {
            (Some(Side::Read), None) => " read".to_string(),
            (Some(Side::Write), None) => " write".to_string(),
            (Some(Side::Read), Some(under)) => format!(" read under op {under}'s write"),
            (Some(Side::Write), Some(under)) => format!(" write under op {under}'s read"),
            (None, _) if self.ty == LockType::Semaphore => format!(" x{}", self.permits),
            (None, _) => String::new(),
        };
        format!(
            "client {client} gen {gen} op {op} ({}, {}{what}, owner {}, token {:?})",
            self.kind.name(),
            self.lock,
            grant.map_or("-", |g| g.owner.as_str()),
            grant.and_then(|g| g.token)
        )
    }
}

/// One line of the checks table.
#[derive(Clone, Debug)]
pub struct CheckLine {
    pub name: &'static str,
    pub count: usize,
    /// A violation unless zero; otherwise counted and shown only.
    pub must_be_zero: bool,
    pub note: String,
}

impl CheckLine {
    /// A check whose count must be 0, with no note.
    pub(crate) fn must_be_zero(name: &'static str, count: usize) -> CheckLine {
        CheckLine {
            name,
            count,
            must_be_zero: true,
            note: String::new(),
        }
    }
}

/// The outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub operations: Vec<(String, [usize; 4])>,
    pub other_stats: Vec<(String, String)>,
    pub faults: Vec<(&'static str, usize)>,
    pub checks: Vec<CheckLine>,
    pub samples: Vec<String>,
}

impl Report {
    pub fn violations(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.must_be_zero)
            .map(|c| c.count)
            .sum()
    }

    pub fn passed(&self) -> bool {
        self.violations() == 0
    }

    /// The count of the check named `name`.
    #[cfg(test)]
    pub fn count(&self, name: &str) -> usize {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map_or_else(|| panic!("no check named {name:?}"), |c| c.count)
    }
}

pub const FENCE_NON_INCREASING: &str = "fence: accepted writes with a non-increasing token";
pub const FENCE_UNKNOWN_TOKEN: &str = "fence: accepted writes whose token no grant handed out";
pub const UNEXPLAINED_ERRORS: &str =
    "errors: no acquire or release failed with an error no fault explains (a Redis error reply, WRONGTYPE, a refused argument or permission)";
pub const FENCE_REUSED: &str = "fence: one token handed to two grants of one Cluster slot";
pub const FENCE_ORDER: &str = "fence: token not above an earlier grant's (real-time order)";
pub const FENCE_RESTART: &str = "fence: tokens that went backwards across a Redis restart";
pub const OVERLAP: &str = "exclusion: overlapping holds, both holders believed valid";
pub const OVERLAP_TWO_TASKS: &str =
    "exclusion: two tasks' critical sections overlapping under one owner id";
pub const OVERLAP_REPLACED: &str =
    "exclusion: two grants at once under one owner in one task (one replaced the other)";
pub const OVERLAP_DATA_LOSS: &str = "exclusion: overlaps after Redis lost its data";
pub const LATE_WRITES: &str = "exclusion: writes landing after the writer's lease, in another hold";
pub const ORPHANED: &str =
    "release: acquires that re-entered a hold their owner had let go of (unlock left it held)";
pub const RW_EXCLUSION: &str =
    "exclusion: write holds overlapping another owner's hold, both believed";
pub const RW_UPGRADE: &str = "rw: upgrades not refused (a write granted over a read of its owner)";
pub const RW_DOWNGRADE: &str =
    "rw: downgrades not granted while the owner certainly held the write side";
pub const SEMAPHORE_LIMIT: &str =
    "semaphore: more permits believed held at once than the semaphore has";
pub const SEMAPHORE_DATA_LOSS: &str = "semaphore: over the number only after Redis lost its data";
pub const SEMAPHORE_LEFT: &str =
    "cleanup: semaphores with permits leased, counts off, a TTL or others' fields";
pub const LATCH_LEFT: &str = "cleanup: latches left with anything but their count, or a TTL";
pub const FAIR_ORDER: &str =
    "fair: acquires granted past a waiter that was in line ahead of them all along";
pub const STUCK: &str = "liveness: waiters that never progressed after faults healed";
pub const FREE_LOCK: &str = "liveness: waiters left waiting on a free lock past the bound";
pub const KEYS_LEFT: &str =
    "cleanup: keys left after every TTL ran out (the fencing counter excluded)";
pub const KEYS_NO_TTL: &str = "cleanup: keys without a TTL (the fencing counter excluded)";
pub const CHANNELS_LEFT: &str = "cleanup: subscriptions left after the clients drained";
pub const LOCAL_LEFT: &str =
    "cleanup: waiters, subscriptions or holds still registered in a client";
pub const CRASHED: &str = "clients: crashed or not stopped cleanly";

pub const FENCE_FAILOVER: &str =
    "fence: tokens that went backwards across a failover that lost writes";
pub const OVERLAP_FAILOVER: &str = "exclusion: overlaps after a failover that lost writes";
pub const SEMAPHORE_FAILOVER: &str =
    "semaphore: over the number only after a failover that lost writes";

/// The names of the checks that allow for Redis losing data, by mode: a restart of the one
/// server, or in cluster mode a primary killed before its replica had every write (Redis
/// Cluster replicates asynchronously), which only loses the data of the slots it served.
struct Labels {
    fence_restart: &'static str,
    overlap_data_loss: &'static str,
    semaphore_data_loss: &'static str,
    past_loss: &'static str,
    losses: &'static str,
}

impl Labels {
    fn of(config: &RunConfig) -> Labels {
        if config.cluster {
            Labels {
                fence_restart: FENCE_FAILOVER,
                overlap_data_loss: OVERLAP_FAILOVER,
                semaphore_data_loss: SEMAPHORE_FAILOVER,
                past_loss: "believed past its lease after a failover lost writes: ",
                losses: "failovers that may have lost writes",
            }
        } else {
            Labels {
                fence_restart: FENCE_RESTART,
                overlap_data_loss: OVERLAP_DATA_LOSS,
                semaphore_data_loss: SEMAPHORE_DATA_LOSS,
                past_loss: "believed past its lease after Redis lost its data: ",
                losses: "Redis restarts",
            }
        }
    }
}

/// Checks a history (pure: the unit tests feed it made-up histories).
pub fn analyze(
    config: &RunConfig,
    histories: &[ClientHistory],
    faults: &[Fault],
    cleanup: &Cleanup,
    accepted: &[Accepted],
    refused: &[Refused],
) -> Report {
    let mut report = Report::default();
    let layout = Layout::of(config);
    let mut ops: BTreeMap<OpKey, Op> = BTreeMap::new();
    // When `try_set_permits` found a semaphore without its number: whether an op's own call
    // set it (else the ticker's).
    let mut permits_set: Vec<bool> = Vec::new();
    // (semaphore, when its number was set): its hash is there from then on, until Redis loses
    // its data.
    let mut permits_set_at: Vec<(u32, i64)> = Vec::new();
    let mut drained = HashSet::new();
    let mut local_left = 0;
    let mut torn = 0;
    for history in histories {
        torn += history.torn_lines;
        for event in &history.events {
            if let Event::Drained {
                waiters,
                channels,
                holds,
                ..
            } = event
            {
                drained.insert((history.client, history.gen));
                if waiters + channels + holds > 0 {
                    local_left += 1;
                    report.samples.push(format!(
                        "client {} gen {} drained with waiters={waiters} channels={channels} holds={holds}",
                        history.client, history.gen
                    ));
                }
            }
            if let Event::PermitsSet { op, t, res } = event {
                permits_set.push(op.is_some());
                permits_set_at.push((*res, *t));
            }
            let Some(op) = event.op() else { continue };
            let key = (history.client, history.gen, op);
            if let Event::Begin {
                t,
                task,
                kind,
                res,
                lease_ms,
                side,
                permits,
                under,
                foreign,
                latch,
                wait_ms,
                ..
            } = event
            {
                let lease = lease_ms.map_or(config.lease, std::time::Duration::from_millis);
                ops.insert(
                    key,
                    Op {
                        key,
                        task: *task,
                        kind: *kind,
                        res: *res,
                        begin: *t,
                        lease: lease.as_micros() as i64,
                        ended: None,
                        granted: None,
                        failed: None,
                        checks: Vec::new(),
                        writes: Vec::new(),
                        released: None,
                        abandoned: None,
                        handoff: None,
                        lock: layout.name(*res),
                        ty: layout.lock_type(*res),
                        fair: layout.lock_type(*res) == LockType::Fair,
                        side: *side,
                        permits: permits.unwrap_or(0),
                        under: *under,
                        under_held: None,
                        floor: None,
                        queued: Vec::new(),
                        held_in_redis: Vec::new(),
                        foreign: *foreign,
                        latch: *latch,
                        wait: wait_ms.map(|ms| ms as i64 * 1000),
                        latch_value: None,
                        after_foreign: None,
                    },
                );
                continue;
            }
            let Some(entry) = ops.get_mut(&key) else {
                continue;
            };
            match event {
                Event::Granted {
                    t,
                    owner,
                    token,
                    hold_count,
                    ..
                } => {
                    entry.ended = Some(*t);
                    entry.granted = Some(Grant {
                        t: *t,
                        owner: owner.clone(),
                        token: *token,
                        hold_count: *hold_count,
                    });
                }
                Event::NotGranted { t, .. } => entry.ended = Some(*t),
                Event::Failed { t, error, .. } => {
                    entry.ended = Some(*t);
                    entry.failed = Some(error.clone());
                }
                Event::Check { t, held, .. } => entry.checks.push((*t, *held)),
                Event::Write {
                    t, token, accepted, ..
                } => entry.writes.push((*t, *token, *accepted)),
                Event::Released {
                    t, how, outcome, ..
                } => entry.released = Some((*t, *how, outcome.clone())),
                Event::Abandoned { t, .. } => entry.abandoned = Some(*t),
                Event::Handoff { t, to_task, .. } => entry.handoff = Some((*t, *to_task)),
                Event::Floor {
                    t,
                    entry: in_line,
                    held,
                    ..
                } => {
                    entry.floor = Some(FloorSeen {
                        sent: *t,
                        entry: *in_line,
                        held: *held,
                    });
                }
                Event::Queued {
                    t, arrival, last, ..
                } => entry.queued.push(QueueRun {
                    first: *t,
                    arrival: *arrival,
                    last: *last,
                }),
                Event::UnderHeld { held, .. } => entry.under_held = Some(*held),
                Event::LatchReturned { t, value, .. } => {
                    entry.ended = Some(*t);
                    entry.latch_value = Some(*value);
                }
                Event::AfterForeign {
                    t, answered, pttl, ..
                } => entry.after_foreign = Some((*t, *answered, *pttl)),
                Event::HeldInRedis {
                    t,
                    since,
                    token,
                    gone,
                    ..
                } => entry.held_in_redis.push((*since, *t, *token, *gone)),
                Event::Begin { .. }
                | Event::Start { .. }
                | Event::Drained { .. }
                | Event::PermitsSet { .. } => {}
            }
        }
    }

    // Foreign-kind attempts and latch calls have rules of their own; every other rule judges
    // the ops of each name's own kind.
    let (foreign_ops, ops): (BTreeMap<OpKey, Op>, BTreeMap<OpKey, Op>) =
        ops.into_iter().partition(|(_, o)| o.foreign.is_some());
    let (latch_ops, ops): (BTreeMap<OpKey, Op>, BTreeMap<OpKey, Op>) =
        ops.into_iter().partition(|(_, o)| o.latch.is_some());
    operations(&mut report, &ops, &latch_ops, accepted, refused);
    for &kind in FaultKind::of_run(config.cluster) {
        report.faults.push((
            kind.name(),
            faults.iter().filter(|f| f.kind == kind).count(),
        ));
    }
    // When Redis may have lost a resource's data: a restart (every resource), or in cluster
    // mode a primary killed before its replica had every write (the resources it served).
    let losses: Vec<&Fault> = faults.iter().filter(|f| f.lost_data()).collect();
    let restart_within = |res: u32, from: i64, to: i64| {
        losses
            .iter()
            .any(|f| f.lost_data_of(res) && f.start <= to && f.end >= from)
    };

    // The end of the last loss of `res`'s data in [from, to]: Redis lost it before then.
    let last_restart_within = |res: u32, from: i64, to: i64| {
        losses
            .iter()
            .filter(|f| f.lost_data_of(res) && f.start <= to && f.end >= from)
            .map(|f| f.end)
            .max()
    };
    let labels = Labels::of(config);
    fence_checks(
        &mut report,
        &ops,
        accepted,
        &restart_within,
        &layout,
        &labels,
    );
    let upgraded = exclusion_checks(&mut report, &ops, faults, &last_restart_within, &labels);
    rw_checks(&mut report, &ops, upgraded, &last_restart_within);
    semaphore_check(
        &mut report,
        config,
        &ops,
        &last_restart_within,
        &permits_set,
        &losses,
        &labels,
    );
    liveness_check(&mut report, config, &ops, faults, &drained);
    let foreign_holds = foreign::foreign_holds(&foreign_ops, config);
    free_lock_check(&mut report, config, &ops, faults, &foreign_holds);
    orphan_check(&mut report, config, &ops);
    fair_order_check(&mut report, &ops);
    rollback::lost_grant_check(&mut report, &ops, faults, &losses);
    latch::latch_check(&mut report, &latch_ops, faults);
    let there = foreign::NativeThere::new(&ops, &latch_ops, &permits_set_at, &losses);
    foreign::foreign_kind_check(&mut report, config, &foreign_ops, &ops, &latch_ops, &there);

    report.checks.push(CheckLine {
        name: KEYS_LEFT,
        count: cleanup.keys_left.len(),
        must_be_zero: true,
        note: format!(
            "{} at exit, gone after {} ms; fencing counter kept by design: {}",
            cleanup.keys_at_exit.len(),
            cleanup.expiry_wait_ms,
            cleanup.fence_keys
        ),
    });
    report.checks.push(CheckLine::must_be_zero(
        KEYS_NO_TTL,
        cleanup.keys_without_ttl.len(),
    ));
    report.checks.push(CheckLine::must_be_zero(
        CHANNELS_LEFT,
        cleanup.channels_left.len(),
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(LOCAL_LEFT, local_left));
    let semaphore_problems: Vec<String> = cleanup
        .semaphores
        .iter()
        .flat_map(|s| s.problems())
        .collect();
    report.checks.push(CheckLine {
        name: SEMAPHORE_LEFT,
        count: semaphore_problems.len(),
        must_be_zero: true,
        note: format!(
            "kept by design: {} semaphore keys (the number of permits), with {} expired permits \
             still listed (the next call on the semaphore gives them back)",
            cleanup.semaphore_keys.len(),
            cleanup
                .semaphores
                .iter()
                .map(|s| s.expired())
                .sum::<usize>()
        ),
    });
    report.samples.extend(semaphore_problems);
    let latch_problems: Vec<String> = cleanup.latches.iter().flat_map(|l| l.problems()).collect();
    report.checks.push(CheckLine {
        name: LATCH_LEFT,
        count: latch_problems.len(),
        must_be_zero: true,
        note: format!(
            "kept by design: {} latch keys (a count not yet counted down has no TTL)",
            cleanup.latch_keys.len()
        ),
    });
    report.samples.extend(latch_problems);
    report
        .checks
        .push(CheckLine::must_be_zero(CRASHED, cleanup.crashed.len()));
    for key in cleanup
        .keys_left
        .iter()
        .chain(&cleanup.keys_without_ttl)
        .chain(&cleanup.channels_left)
    {
        report.samples.push(format!("left in Redis: {key}"));
    }
    report.samples.extend(cleanup.crashed.iter().cloned());
    if torn > 0 {
        report
            .other_stats
            .push(("event lines torn by SIGKILL".into(), torn.to_string()));
    }
    report
}

fn operations(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    latch_ops: &BTreeMap<OpKey, Op>,
    accepted: &[Accepted],
    refused: &[Refused],
) {
    let mut total = [0; 4];
    for kind in Kind::ALL {
        let mut row = [0; 4];
        for op in ops.values().filter(|o| o.kind == kind) {
            row[0] += 1;
            if op.granted.is_some() {
                row[1] += 1;
            } else if op.failed.is_some() {
                row[3] += 1;
            } else if op.ended.is_some() {
                row[2] += 1;
            }
        }
        for i in 0..4 {
            total[i] += row[i];
        }
        report.operations.push((kind.name().to_string(), row));
    }
    report.operations.push(("total".into(), total));

    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops.values() {
        if let Some(error) = &op.failed {
            *errors
                .entry(error.split(':').next().unwrap_or("?"))
                .or_default() += 1;
        }
    }
    let list = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !errors.is_empty() {
        report
            .other_stats
            .push(("acquire errors by kind".into(), list(&errors)));
    }
    let mut releases: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops.values() {
        if let Some((_, how, outcome)) = &op.released {
            let what = match how {
                ReleaseHow::Unlock => match outcome.split(':').next().unwrap_or("?") {
                    "ok" => "unlock ok",
                    "not_held" => "unlock not_held",
                    "timeout" => "unlock timeout",
                    "connection" => "unlock connection",
                    _ => "unlock other error",
                },
                ReleaseHow::Drop => "dropped",
                ReleaseHow::RunOnce => "run_once",
            };
            *releases.entry(what).or_default() += 1;
        }
    }
    report
        .other_stats
        .push(("releases".into(), list(&releases)));
    // No fault explains a permanent error: faults give timeouts, connection errors and lost
    // holds, never a Redis error reply, WRONGTYPE, a refused argument or permission. (The
    // cluster mode found releases stopped half-way by a migrating slot this way, reported as
    // a Redis error, which no other check counted.)
    const UNEXPLAINED: [&str; 4] = [
        "redis",
        "wrong_type",
        "invalid_argument",
        "permission_denied",
    ];
    let mut unexplained = Vec::new();
    for op in ops.values().chain(latch_ops.values()) {
        let acquire = op.failed.as_deref();
        let release = op.released.as_ref().map(|(_, _, outcome)| outcome.as_str());
        for error in [acquire, release].into_iter().flatten() {
            if UNEXPLAINED.contains(&error.split(':').next().unwrap_or("?")) {
                unexplained.push(error.to_string());
            }
        }
    }
    report.checks.push(CheckLine {
        name: UNEXPLAINED_ERRORS,
        count: unexplained.len(),
        must_be_zero: true,
        note: unexplained.first().cloned().unwrap_or_default(),
    });
    report.other_stats.push((
        "fenced writes".into(),
        format!("{} accepted, {} refused", accepted.len(), refused.len()),
    ));
    let lost_before_write = ops
        .values()
        .filter(|o| o.granted.is_some() && o.writes() && o.writes.is_empty())
        .filter(|o| o.checks.iter().any(|(_, held)| !held))
        .count();
    report.other_stats.push((
        "holds that saw is_held() false before writing (no write sent)".into(),
        lost_before_write.to_string(),
    ));
    let waits: Vec<i64> = ops
        .values()
        .filter(|o| o.kind.waits())
        .filter_map(|o| o.ended.map(|e| e - o.begin))
        .collect();
    if let Some(max) = waits.iter().max() {
        report
            .other_stats
            .push(("longest acquire wait".into(), format!("{} ms", max / 1000)));
    }
}

fn fence_checks(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    accepted: &[Accepted],
    restart_within: &dyn Fn(u32, i64, i64) -> bool,
    layout: &Layout,
    labels: &Labels,
) {
    // The store's own invariant, from its log.
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut non_increasing = 0;
    let mut unknown = 0;
    for write in accepted {
        if let Some(prev) = last.insert(write.resource, write.token) {
            if write.token <= prev {
                non_increasing += 1;
                report.samples.push(format!(
                    "store accepted token {} on {} after {prev}",
                    write.token,
                    layout.name(write.resource)
                ));
            }
        }
        let granted = ops
            .get(&(write.client, write.gen, write.op))
            .and_then(|o| o.granted.as_ref())
            .and_then(|g| g.token);
        if granted != Some(write.token) {
            unknown += 1;
            report.samples.push(format!(
                "store accepted token {} from client {} gen {} op {}, whose grant was {granted:?}",
                write.token, write.client, write.gen, write.op
            ));
        }
    }

    // New grants (re-entries share their grant's token and are left out).
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops.values() {
        if let Some(Grant {
            token: Some(_),
            hold_count: 1,
            ..
        }) = &op.granted
        {
            by_res.entry(op.res).or_default().push(op);
        }
    }
    let (reused, across_slots) = fence_reused_check(report, &by_res, layout);
    let mut order = 0;
    let mut across_restart = 0;
    for grants in by_res.values_mut() {
        // A grant whose acquire went out after another grant's reply came back ran later in
        // Redis, so its token must be higher.
        grants.sort_by_key(|o| o.granted.as_ref().map(|g| g.t));
        let mut prefix_max: Vec<(u64, usize)> = Vec::with_capacity(grants.len());
        for (i, op) in grants.iter().enumerate() {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            let best = match prefix_max.last() {
                Some(&(max, at)) if max >= token => (max, at),
                _ => (token, i),
            };
            prefix_max.push(best);
        }
        for op in grants.iter() {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            let earlier =
                grants.partition_point(|o| o.granted.as_ref().map_or(0, |g| g.t) < op.begin);
            if earlier == 0 {
                continue;
            }
            let (max, at) = prefix_max[earlier - 1];
            if token <= max {
                let before = grants[at];
                let before_t = before.granted.as_ref().map_or(0, |g| g.t);
                if restart_within(op.res, before_t, op.begin) {
                    across_restart += 1;
                } else {
                    order += 1;
                }
                report.samples.push(format!(
                    "token {token} of {} is not above token {max} of {}, granted before it began",
                    op.describe(),
                    before.describe()
                ));
            }
        }
    }
    report.checks.push(CheckLine::must_be_zero(
        FENCE_NON_INCREASING,
        non_increasing,
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_UNKNOWN_TOKEN, unknown));
    report.checks.push(CheckLine {
        name: FENCE_REUSED,
        count: reused,
        must_be_zero: true,
        note: format!(
            "allowed: {across_slots} tokens handed out in two slots or more (each slot has a \
                 counter of its own)"
        ),
    });
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_ORDER, order));
    report.checks.push(CheckLine::must_be_zero(
        labels.fence_restart,
        across_restart,
    ));
}

/// [`FENCE_REUSED`]: no token handed to two new grants of names that share a fencing
/// counter. The counters are one per Redis Cluster slot (`P:{T}:fence`, `T` a tag of the
/// slot: `leasehold_core::LockKeys::fence`), in the one-server run as in a cluster, so a token
/// is unique among the names of one slot (and strictly increasing per name: [`FENCE_ORDER`]);
/// two slots' counters both start from the server time and may meet, so the names of
/// different slots may be handed equal tokens. Returns the count, and how many tokens were
/// handed out in more than one slot (allowed).
fn fence_reused_check(
    report: &mut Report,
    by_res: &BTreeMap<u32, Vec<&Op>>,
    layout: &Layout,
) -> (usize, usize) {
    let mut reused = 0;
    let mut seen: HashMap<(u16, u64), &Op> = HashMap::new();
    // Tokens handed out in more than one slot: allowed, counted for the report.
    let mut slots_of: HashMap<u64, HashSet<u16>> = HashMap::new();
    for (&res, grants) in by_res {
        let slot = slot_of_name(&layout.name(res));
        for op in grants {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            slots_of.entry(token).or_default().insert(slot);
            if let Some(other) = seen.insert((slot, token), op) {
                reused += 1;
                report.samples.push(format!(
                    "token {token} granted twice in slot {slot}: {} and {}",
                    other.describe(),
                    op.describe()
                ));
            }
        }
    }
    let across = slots_of.values().filter(|slots| slots.len() > 1).count();
    (reused, across)
}

/// The Redis Cluster slot of lock `name`'s keys, and so of its fencing counter (the prefix
/// takes no part: the slot is the name's, or its hash tag's).
fn slot_of_name(name: &str) -> u16 {
    leasehold_core::LockKeys::new(&leasehold_core::Prefix::default(), name).map_or_else(
        |_| leasehold_core::slot::key_slot(name.as_bytes()),
        |k| k.slot(),
    )
}

struct Belief<'a> {
    op: &'a Op,
    from: i64,
    to: i64,
}

/// The overlap rules (see the module's docs), on every kind but semaphores. Returns the
/// writes granted over their owner's read (upgrades), with a finding each.
///
/// Why a read `r` and a write `w` of one owner in one task prove an upgrade when `w` is a new
/// grant (hold count 1), `r`'s grant was recorded before `w`'s call began, and `r` was believed
/// at some instant at or after `w`'s grant was recorded: `r`'s hold was in Redis from its
/// script to its last true `is_held()`, so all through `w`'s call; and since `is_held()` was
/// still true after `w`'s call, the client never marked that read grant lost meanwhile, so the
/// client's table had it when `w`'s call looked (before any round trip) and had to refuse,
/// unless the owner held the write side too (then `w` is a re-entry, hold count above 1). A
/// downgrade is the other order (the read asked for under the write); ops whose calls ran at
/// once (joined futures) and `run_once` reads (whose belief is derived) are not judged.
fn exclusion_checks(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    last_restart_within: &dyn Fn(u32, i64, i64) -> Option<i64>,
    labels: &Labels,
) -> BTreeMap<OpKey, String> {
    let mut by_res: BTreeMap<u32, Vec<Belief<'_>>> = BTreeMap::new();
    for op in ops.values().filter(|o| o.ty != LockType::Semaphore) {
        if let Some((from, to)) = op.belief() {
            by_res
                .entry(op.res)
                .or_default()
                .push(Belief { op, from, to });
        }
    }
    let mut violations = 0;
    let mut rw_violations = 0;
    let mut two_tasks = 0;
    let mut replaced = 0;
    let mut data_loss = 0;
    let mut upgraded = BTreeMap::new();
    let (mut readers_shared, mut downgraded) = (0, 0);
    for beliefs in by_res.values_mut() {
        beliefs.sort_by_key(|b| b.from);
        for (i, a) in beliefs.iter().enumerate() {
            // Sorted by start: `b` overlaps `a` when it starts before `a` ends (both ends are
            // instants at which the holder believed, so touching counts).
            for b in beliefs[i + 1..].iter().take_while(|b| b.from <= a.to) {
                let (oa, ob) = (
                    a.op.granted.as_ref().expect("belief needs a grant"),
                    b.op.granted.as_ref().expect("belief needs a grant"),
                );
                let overlap_end = a.to.min(b.to);
                // One owner id: a nested re-entry while one task runs both sections (one grant,
                // one token), two critical sections at once when two tasks do. Two grants of
                // one owner in one task (different tokens: futures joined in the task, one
                // grant replacing the other under its guard) are no re-entry.
                let one_owner = oa.owner == ob.owner;
                let one_task = two_tasks_at(a.op, b.op, b.from, overlap_end).is_none();
                let two_grants = matches!((oa.token, ob.token), (Some(x), Some(y)) if x != y);
                let rw = a.op.ty == LockType::ReadWrite;
                // Readers share a read/write lock (under one owner id too).
                if rw && !a.op.is_write() && !b.op.is_write() {
                    readers_shared += 1;
                    continue;
                }
                // A read and a write of one owner in one task: a downgrade, unless the write was
                // granted over the read (see above).
                let mut upgrade = false;
                if rw && one_owner && one_task && a.op.is_write() != b.op.is_write() {
                    let (r, w) = if a.op.is_write() { (b, a) } else { (a, b) };
                    let w_grant = w.op.granted.as_ref().expect("belief needs a grant");
                    // (A `run_once` read's belief is derived from its lease, not `is_held()`.)
                    let judged = r.op.kind != Kind::RunOnce && w_grant.hold_count == 1;
                    if judged && r.from < w.op.begin && r.to >= w_grant.t {
                        upgrade = true;
                    } else {
                        downgraded += 1;
                        continue;
                    }
                }
                if one_owner && one_task && !two_grants && !upgrade {
                    continue;
                }
                // Redis losing its data between the first acquire and the second grant lets
                // both in; the first holder cannot know until its next renewal, and believes
                // at most one lease past the loss (its deadline is a lease after the last
                // renewal it sent before). Believing longer than that is a violation.
                let why = match last_restart_within(a.op.res, a.op.begin, ob.t) {
                    Some(lost_by) if overlap_end <= lost_by + a.op.lease => {
                        data_loss += 1;
                        continue;
                    }
                    Some(_) => labels.past_loss,
                    None => "",
                };
                let what = if upgrade {
                    "a write granted over its owner's read (an upgrade), "
                } else if one_owner && one_task {
                    replaced += 1;
                    "two grants under one owner id in one task, "
                } else if one_owner {
                    two_tasks += 1;
                    "two tasks under one owner id, "
                } else if rw {
                    rw_violations += 1;
                    "a write and another owner's hold, "
                } else {
                    violations += 1;
                    ""
                };
                let finding = format!(
                    "{why}{what}overlap of {} ms: {} believed [{}, {}], {} believed [{}, {}]",
                    (a.to.min(b.to) - b.from) / 1000,
                    a.op.describe(),
                    a.from,
                    a.to,
                    b.op.describe(),
                    b.from,
                    b.to
                );
                if upgrade {
                    let w = if a.op.is_write() { a.op } else { b.op };
                    upgraded.entry(w.key).or_insert(finding);
                } else {
                    report.samples.push(finding);
                }
            }
        }
    }
    report
        .checks
        .push(CheckLine::must_be_zero(OVERLAP, violations));
    report.checks.push(CheckLine {
        name: RW_EXCLUSION,
        count: rw_violations,
        must_be_zero: true,
        note: format!(
            "not counted: {readers_shared} overlaps of readers, {downgraded} of a write and its \
             owner's read in one task (downgrades, or calls under way at once)"
        ),
    });
    report
        .checks
        .push(CheckLine::must_be_zero(OVERLAP_TWO_TASKS, two_tasks));
    report
        .checks
        .push(CheckLine::must_be_zero(OVERLAP_REPLACED, replaced));
    report.checks.push(CheckLine {
        name: labels.overlap_data_loss,
        count: data_loss,
        must_be_zero: false,
        note: "allowed: the holder cannot know before its next renewal".into(),
    });

    // Writes whose writer's belief is not known to cover the moment the store applied them
    // (it checked, then was paused or delayed) while another owner believed it held the lock.
    let mut late = 0;
    let mut late_paused = 0;
    let mut late_refused = 0;
    for op in ops.values() {
        let Some(grant) = &op.granted else { continue };
        for &(t, _, accepted) in &op.writes {
            if op.checks.iter().any(|&(c, held)| held && c >= t) {
                continue;
            }
            let others = by_res.get(&op.res).into_iter().flatten().any(|b| {
                b.from <= t
                    && t <= b.to
                    && b.op
                        .granted
                        .as_ref()
                        .is_some_and(|g| g.owner != grant.owner)
            });
            if !others {
                continue;
            }
            late += 1;
            if !accepted {
                late_refused += 1;
            }
            let since = op
                .checks
                .iter()
                .filter(|&&(c, held)| held && c < t)
                .map(|&(c, _)| c)
                .max()
                .unwrap_or(grant.t);
            let (client, gen, _) = op.key;
            if faults.iter().any(|f| {
                f.kind == FaultKind::ClientPause
                    && f.client == Some(client)
                    && f.gen == Some(gen)
                    && f.start <= t
                    && f.end >= since
            }) {
                late_paused += 1;
            }
        }
    }
    report.checks.push(CheckLine {
        name: LATE_WRITES,
        count: late,
        must_be_zero: false,
        note: format!(
            "allowed: {late_paused} paused between check and write (cannot know), {late_refused} refused by the fence"
        ),
    });
    upgraded
}

/// The ops a read/write-lock op was asked under: downgrades (a read under the owner's write)
/// and upgrade attempts (a write under the owner's read).
///
/// An upgrade attempt whose read hold was still certainly held when the call returned
/// (`is_held()` true after it: the read grant was not marked lost at any point of the call)
/// must be refused: the client's table had that read grant when the call looked at it, before
/// any round trip, and refuses at once unless the owner also held the write side (a re-entry:
/// a grant with a hold count above 1). Any other outcome is counted with the writes the overlap
/// rule found granted over their owner's read ([`RW_UPGRADE`]). An attempt whose read hold
/// was no longer certainly held may rightly go to Redis: counted, not judged.
///
/// A downgrade whose write hold was certainly held through the call must not come back empty
/// ([`RW_DOWNGRADE`]): the acquire script grants a read to the owner of the write side at
/// once, whoever waits; unless Redis lost its data since the write's acquire began (the write
/// hold may be gone from Redis while its holder still believes), counted apart. Errors
/// (timeouts, lost connections) are not judged.
fn rw_checks(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    mut upgraded: BTreeMap<OpKey, String>,
    last_restart_within: &dyn Fn(u32, i64, i64) -> Option<i64>,
) {
    let rw_ops = || ops.values().filter(|o| o.ty == LockType::ReadWrite);
    let (mut attempts, mut refused, mut reentered, mut unjudged) = (0, 0, 0, 0);
    let mut upgrades_after_loss = 0;
    let (mut downgrades, mut at_once, mut refused_by_loss, mut dg_errors) = (0, 0, 0, 0);
    let mut downgrade_refused = 0;
    // Refusals outside the attempts (joined ops, a write after an unseen read hold).
    let mut other_refusals = 0;
    for op in rw_ops() {
        let refusal = op
            .failed
            .as_deref()
            .is_some_and(|e| e.starts_with("upgrade_refused"));
        let Some(under) = op.under else {
            other_refusals += usize::from(refusal);
            continue;
        };
        let (client, gen, _) = op.key;
        if op.is_write() {
            attempts += 1;
            if refusal {
                refused += 1;
                continue;
            }
            if op.under_held != Some(true) {
                unjudged += 1;
                continue;
            }
            if op.granted.as_ref().is_some_and(|g| g.hold_count > 1) {
                reentered += 1;
                continue;
            }
            // Redis lost its data since the read's acquire began: the read hold may be gone
            // from Redis while its holder still believes it (until its next renewal), and a
            // re-entry of the owner's write then finds nothing and is granted afresh.
            let read_began = ops
                .get(&(client, gen, under))
                .map_or(op.begin, |read| read.begin);
            let op_end = op.call_end().unwrap_or(i64::MAX);
            if op.granted.is_some() && last_restart_within(op.res, read_began, op_end).is_some() {
                upgrades_after_loss += 1;
                upgraded.remove(&op.key);
                continue;
            }
            let outcome = match (&op.granted, &op.failed, op.ended) {
                (Some(_), _, _) => "granted".to_string(),
                (None, Some(error), _) => format!("failed ({error})"),
                (None, None, Some(_)) => "not granted".to_string(),
                (None, None, None) => continue, // never returned: the stall rule's
            };
            upgraded.entry(op.key).or_insert_with(|| {
                format!(
                    "an upgrade attempt came back {outcome}, not UpgradeRefused, while the read \
                     hold of op {under} was certainly held: {}",
                    op.describe()
                )
            });
        } else {
            downgrades += 1;
            if op.granted.is_some() {
                at_once += 1;
                continue;
            }
            if op.failed.is_some() {
                dg_errors += 1;
                continue;
            }
            let (Some(end), Some(true)) = (op.ended, op.under_held) else {
                continue;
            };
            let write_began = ops
                .get(&(client, gen, under))
                .map_or(op.begin, |write| write.begin);
            if last_restart_within(op.res, write_began, end).is_some() {
                refused_by_loss += 1;
                continue;
            }
            downgrade_refused += 1;
            report.samples.push(format!(
                "a downgrade came back without the read while the write hold of op {under} was \
                 certainly held: {}",
                op.describe()
            ));
        }
    }
    let reads = rw_ops().filter(|o| !o.is_write()).count();
    let granted = rw_ops().filter(|o| o.granted.is_some()).count();
    report.other_stats.push((
        "rw-lock ops".into(),
        format!(
            "{} calls ({reads} reads, {} writes), {granted} granted; {downgrades} downgrades \
             ({at_once} granted at once, {dg_errors} errors); {attempts} upgrade attempts \
             ({refused} refused, {reentered} re-entered the owner's write, {unjudged} not \
             judged: the read no longer certainly held); {other_refusals} other acquires \
             refused as upgrades",
            rw_ops().count(),
            rw_ops().count() - reads,
        ),
    ));
    let count = upgraded.len();
    report.samples.extend(upgraded.into_values());
    report.checks.push(CheckLine {
        name: RW_UPGRADE,
        count,
        must_be_zero: true,
        note: format!(
            "{attempts} attempts judged against the read hold they were asked under, {refused} \
             refused; not counted: {upgrades_after_loss} granted after Redis lost its data"
        ),
    });
    report.checks.push(CheckLine {
        name: RW_DOWNGRADE,
        count: downgrade_refused,
        must_be_zero: true,
        note: format!(
            "{downgrades} downgrades, {at_once} granted; not counted: {refused_by_loss} after \
             Redis lost its data"
        ),
    });
}

/// The permits believed held at once on each semaphore (see the module's docs). Judged at
/// every instant the sum can rise: each grant's start, and each instant a belief from before a
/// loss of Redis's data stops being excused (a lease after the loss). Each op found starting
/// an instant over the number (or believing past its excuse) is counted once: as a violation
/// if the beliefs not excused by a loss are over the number, else apart.
///
/// Why the excused ones are excluded soundly and the rest not: a belief from an acquisition
/// that began after the last loss was granted in the Redis of the instant, which counts its
/// permits until its lease ends in Redis, after the holder stops believing; those permits
/// never exceed the number (set again after a loss by the clients, the same number). A
/// holder from before a loss believes at most a lease past it, as a lock's holder.
fn semaphore_check(
    report: &mut Report,
    config: &RunConfig,
    ops: &BTreeMap<OpKey, Op>,
    last_restart_within: &dyn Fn(u32, i64, i64) -> Option<i64>,
    permits_set: &[bool],
    losses: &[&Fault],
    labels: &Labels,
) {
    let number = i64::from(config.sem_permits);
    let mut by_res: BTreeMap<u32, Vec<Belief<'_>>> = BTreeMap::new();
    for op in ops.values().filter(|o| o.ty == LockType::Semaphore) {
        if let Some((from, to)) = op.belief() {
            by_res
                .entry(op.res)
                .or_default()
                .push(Belief { op, from, to });
        }
    }
    let mut over: BTreeMap<OpKey, bool> = BTreeMap::new();
    let mut most = 0;
    for beliefs in by_res.values() {
        // (instant, the op it is about)
        let mut instants: Vec<(i64, &Op)> = beliefs.iter().map(|b| (b.from, b.op)).collect();
        for b in beliefs {
            let lost = losses
                .iter()
                .filter(|f| f.lost_data_of(b.op.res) && f.end >= b.op.begin);
            for lost_by in lost.map(|f| f.end) {
                let excused_until = lost_by + b.op.lease;
                if excused_until < b.to {
                    instants.push((excused_until.max(b.from) + 1, b.op));
                }
            }
        }
        for (t, blamed) in instants {
            let covering = beliefs.iter().filter(|b| b.from <= t && t <= b.to);
            let (mut total, mut fresh) = (0, 0);
            let mut holders = Vec::new();
            for b in covering {
                let n = i64::from(b.op.permits);
                total += n;
                let excused = last_restart_within(b.op.res, b.op.begin, t)
                    .is_some_and(|lost_by| t <= lost_by + b.op.lease);
                if !excused {
                    fresh += n;
                }
                holders.push(format!(
                    "{} believed [{}, {}]{}",
                    b.op.describe(),
                    b.from,
                    b.to,
                    if excused {
                        " (from before a data loss)"
                    } else {
                        ""
                    }
                ));
            }
            most = most.max(total);
            if total <= number {
                continue;
            }
            let violation = fresh > number;
            let seen = over.entry(blamed.key).or_insert(false);
            if violation && !*seen {
                *seen = true;
                report.samples.push(format!(
                    "{total} permits of {} believed held at {t} ({fresh} not excused by a data \
                     loss), the number being {number}: {}",
                    blamed.lock,
                    holders.join("; ")
                ));
            }
        }
    }
    let violations = over.values().filter(|v| **v).count();
    let sem_ops = || ops.values().filter(|o| o.ty == LockType::Semaphore);
    let granted = sem_ops().filter(|o| o.granted.is_some()).count();
    let ones = sem_ops().filter(|o| o.permits == 1).count();
    report.other_stats.push((
        "semaphore ops".into(),
        format!(
            "{} calls ({ones} for 1 permit, {} for 2), {granted} granted; most permits believed \
             held at once: {most} of {number}; number of permits set {} times ({} by the ticker) \
             over {} {}",
            sem_ops().count(),
            sem_ops().count() - ones,
            permits_set.len(),
            permits_set.iter().filter(|by_op| !**by_op).count(),
            losses.len(),
            labels.losses,
        ),
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(SEMAPHORE_LIMIT, violations));
    report.checks.push(CheckLine {
        name: labels.semaphore_data_loss,
        count: over.len() - violations,
        must_be_zero: false,
        note: "allowed: a holder from before the loss cannot know before its next renewal".into(),
    });
}

/// An instant in [from, to] at which `a` and `b` (holds of one owner id) ran their critical
/// sections in two different tasks, if there is one. Each op's task changes at most once (at
/// its hand-off), so the pair of tasks is constant between those instants: looking at the ends
/// and at the hand-offs inside [from, to] covers every stretch.
fn two_tasks_at(a: &Op, b: &Op, from: i64, to: i64) -> Option<i64> {
    let handoffs = [a.handoff, b.handoff].into_iter().flatten().map(|(t, _)| t);
    [from, to]
        .into_iter()
        .chain(handoffs.filter(|t| (from..=to).contains(t)))
        .find(|&t| a.task_at(t) != b.task_at(t))
}

/// (client, generation, task, lock, side): one owner id's ops on one lock's side.
type OwnerSide = (u32, u32, u32, u32, Option<Side>);

/// A task holds one guard at a time, so a grant with a hold count above 1 re-entered a hold
/// that outlived its owner's guards. After a dropped guard that is the background release not
/// having run yet (a benign race); after anything else the hold was orphaned in Redis: an
/// acquire that got no reply and whose rollback did not run, or a release that got no reply.
/// Its owner's next `unlock()` then returns Ok yet leaves the lock held, for another lease, or
/// for as long as the owner keeps re-acquiring it. A re-entry of a hold that a hand-off section
/// (same owner id, another task) was still working under is not an orphan: it is counted by the
/// two-task rule when the sections overlap.
fn orphan_check(report: &mut Report, config: &RunConfig, ops: &BTreeMap<OpKey, Op>) {
    // Hold counts are per side on a read/write lock; a permit is never re-entered.
    let mut by_owner: BTreeMap<OwnerSide, Vec<&Op>> = BTreeMap::new();
    for op in ops.values().filter(|o| o.ty != LockType::Semaphore) {
        let (client, gen, _) = op.key;
        by_owner
            .entry((client, gen, op.task, op.res, op.side))
            .or_default()
            .push(op);
    }
    let (mut orphaned, mut racing_drop, mut handed_off, mut joined) = (0, 0, 0, 0);
    let (mut after_no_hold, mut after_release, mut after_unlock) = (0, 0, 0);
    for sequence in by_owner.values_mut() {
        sequence.sort_by_key(|o| o.begin);
        for (i, pair) in sequence.windows(2).enumerate() {
            let (previous, op) = (pair[0], pair[1]);
            let Some(grant) = op.granted.as_ref().filter(|g| g.hold_count > 1) else {
                continue;
            };
            let section_alive = |p: &&Op| {
                p.handoff.is_some()
                    && p.granted.is_some()
                    && p.released.as_ref().is_none_or(|(t, _, _)| *t >= grant.t)
            };
            if sequence[..=i].iter().any(section_alive) {
                handed_off += 1;
                continue;
            }
            // An op of the same task that ran alongside (joined futures) and held this very
            // grant when it was re-entered: a re-entry, not an orphan. (`run_once` records no
            // token: its hold counts when it was under way.)
            let sibling_holds = |p: &&Op| {
                p.key != op.key
                    && p.granted.as_ref().is_some_and(|g| {
                        g.t <= grant.t && (g.token.is_none() || g.token == grant.token)
                    })
                    && p.released.as_ref().is_none_or(|(t, _, _)| *t >= grant.t)
            };
            if sequence.iter().any(sibling_holds) {
                joined += 1;
                continue;
            }
            match &previous.released {
                Some((_, ReleaseHow::Drop, _)) => {
                    racing_drop += 1;
                    continue;
                }
                Some((_, ReleaseHow::Unlock, outcome)) if outcome != "ok" => after_release += 1,
                Some(_) => after_unlock += 1,
                None => after_no_hold += 1,
            }
            orphaned += 1;
            report.samples.push(format!(
                "re-entered an orphaned hold (hold count {}): {}; the owner's previous op: {}",
                op.granted.as_ref().map_or(0, |g| g.hold_count),
                op.describe(),
                previous.describe()
            ));
        }
    }
    report.checks.push(CheckLine {
        name: ORPHANED,
        count: orphaned,
        must_be_zero: !config.tolerate_orphaned_reentry,
        note: format!(
            "{after_no_hold} after an op without a hold, {after_release} after an unanswered \
             release, {after_unlock} after a clean unlock (a retry within the call, or a chain); \
             not counted: {racing_drop} racing a dropped guard's background release, \
             {handed_off} re-entering a hold a hand-off section still used, {joined} re-entering \
             a hold a joined op of the same task still used{}",
            if config.tolerate_orphaned_reentry {
                " (tolerated: known library bug)"
            } else {
                ""
            }
        ),
    });
}

/// Grants on fair locks past a waiter that was in line ahead of them all along. A pair of ops
/// on one fair lock, under two owners, is judged when
/// - `b`'s floor ([`Event::Floor`], read on the client's own connection just before the call)
///   found nothing of its owner's at the lock: no entry in the line, no hold, no turn; and
/// - `a`'s owner had an entry in the line before that floor was read: a run of polls of
///   `a`'s place ([`Event::Queued`]) began before the floor was sent.
///
/// Then `b` must not be granted while that entry is still in line: if the same run (the same
/// arrival) was seen again after `b`'s grant was recorded, `b` was granted past `a`.
///
/// Why such a grant can only be a bug. Commands run in Redis one at a time, each at an instant
/// between its sending and its reply, on the run's one clock, so: `a`'s entry was in the line
/// before `b`'s floor ran, `b`'s scripts ran after it, and `b`'s grant ran before the grant was
/// recorded, before the last poll that still found `a`'s entry. An entry keeps its arrival from
/// the try that queued it until it is removed, and one that comes back (after it lapsed, was
/// given up, or Redis lost its data) gets a new arrival, later than any in line: the same
/// arrival at both ends means the entry never left the line in between. Anything `b`'s owner
/// had in line at the lock came after `a`'s entry (the floor found nothing of it): an entry
/// of its own queued behind `a`'s, and a grant or a turn only through a grant or a turn of its
/// own. The fair scripts hand a free lock (and reserve a turn) only to the first live entry,
/// removing the dead ones ahead of it first. So at `b`'s grant `a`'s entry was live (it was not
/// removed) and ahead of `b`: the lock was `a`'s turn, not `b`'s, whatever faults hit either
/// client (`a` paused, cut off or killed loses its place only by its entry's removal, which
/// the run shows). A grant of `b`'s owner through an orphaned hold needs such a grant first;
/// one through its earlier entry or hold is what the floor rules out (those acquires are
/// counted, not judged).
///
/// On a read/write lock's line the same holds between a writer and anyone, one of them
/// ahead: a writer enters only first in line, and a reader only with no writer waiting
/// before it (`docs/read-write-lock.md`), the dead entries pruned first (`rw/common.lua`).
/// Whether an entry is a writer's is read from its score (odd), not from the op that polled
/// it: the entry is the owner's, and may be a joined op's of the other side.
fn fair_order_check(report: &mut Report, ops: &BTreeMap<OpKey, Op>) {
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops
        .values()
        .filter(|o| o.fair || o.ty == LockType::ReadWrite)
    {
        by_res.entry(op.res).or_default().push(op);
    }
    let mut stats = FairStats::default();
    let (mut past, mut rw_judged) = (0, 0);
    for lock in by_res.values() {
        for b in lock {
            if b.fair {
                stats.op(b, lock);
            }
            let (Some(floor), Some(grant)) = (b.floor, b.granted.as_ref()) else {
                continue;
            };
            if !floor.clean() {
                continue;
            }
            if b.fair {
                stats.judged_grants += 1;
            } else {
                rw_judged += 1;
            }
            let mut overtaken = None;
            for a in lock.iter().filter(|a| a.owner_key() != b.owner_key()) {
                // Of `a`'s runs in line before `b`'s floor, the one seen last; a pair counts when
                // it was still seen after the floor (`a` was in line when `b` began).
                // Readers in line may go in together: on a read/write lock a reader is judged
                // only against writers' entries ahead of it (odd scores: the entry's own kind,
                // which may be a joined op's of the same owner), a writer against every entry.
                let reader_b = b.ty == LockType::ReadWrite && b.side == Some(Side::Read);
                let Some(run) = a
                    .queued
                    .iter()
                    .filter(|run| run.first < floor.sent)
                    .filter(|run| !reader_b || run.arrival % 2 == 1)
                    .max_by_key(|run| run.last)
                    .filter(|run| run.last >= floor.sent)
                else {
                    continue;
                };
                stats.pairs += 1;
                if run.last > grant.t && overtaken.is_none() {
                    overtaken = Some((a, run));
                }
            }
            if let Some((a, run)) = overtaken {
                past += 1;
                report.samples.push(format!(
                    "granted past a waiter in line ahead of it: {} was granted by {} although the \
                     entry (arrival {}) of {} was in line before the acquire began at {} (its \
                     owner having nothing at the lock then) and still at {}",
                    b.describe(),
                    grant.t,
                    run.arrival,
                    a.describe(),
                    floor.sent,
                    run.last
                ));
            }
        }
    }
    report.other_stats.push((
        "fair-lock ops".into(),
        format!(
            "{} calls, {} granted; {} waits seen in line, {} of them came back with a new \
             arrival",
            stats.ops, stats.granted, stats.seen_in_line, stats.back_in_line
        ),
    ));
    report.checks.push(CheckLine {
        name: FAIR_ORDER,
        count: past,
        must_be_zero: true,
        note: format!(
            "{} grants judged against the {} waiters in line when they began (and {rw_judged} on \
             read/write locks); not judged: {} whose owner already had an entry ({} of them from \
             an earlier wait, not a joined op), {} a hold, {} whose owner's state could not be \
             read",
            stats.judged_grants,
            stats.pairs,
            stats.entry,
            stats.inherited,
            stats.held,
            stats.no_floor
        ),
    });
}

/// What the fair-order rule saw, for the report.
#[derive(Default)]
struct FairStats {
    ops: usize,
    granted: usize,
    seen_in_line: usize,
    back_in_line: usize,
    no_floor: usize,
    entry: usize,
    /// Of `entry`: no other op of the owner was under way on the lock (the entry was left by
    /// an earlier wait whose leave had not run yet).
    inherited: usize,
    held: usize,
    judged_grants: usize,
    pairs: usize,
}

impl FairStats {
    fn op(&mut self, op: &Op, lock: &[&Op]) {
        self.ops += 1;
        if op.granted.is_some() {
            self.granted += 1;
        }
        if !op.queued.is_empty() {
            self.seen_in_line += 1;
        }
        if op.queued.windows(2).any(|w| w[0].arrival != w[1].arrival) {
            self.back_in_line += 1;
        }
        let Some(floor) = op.floor else {
            self.no_floor += 1;
            return;
        };
        if floor.entry {
            self.entry += 1;
            // (A joined op reads its floor before its `Begin`, maybe before its sibling's.)
            let sibling = lock.iter().any(|o| {
                let start = o.floor.map_or(o.begin, |f| f.sent.min(o.begin));
                o.key != op.key
                    && o.owner_key() == op.owner_key()
                    && start <= floor.sent
                    && o.over_at().is_none_or(|end| end >= floor.sent)
            });
            if !sibling {
                self.inherited += 1;
            }
        }
        self.held += usize::from(floor.held);
    }
}

fn liveness_check(
    report: &mut Report,
    config: &RunConfig,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    drained: &HashSet<(u32, u32)>,
) {
    let recovery = recovery_us(config);
    let mut windows: Vec<(i64, i64)> = faults.iter().map(|f| (f.start, f.end + recovery)).collect();
    windows.sort();
    let mut stuck = 0;
    let mut longest_unexplained = 0;
    for op in ops.values() {
        let (client, gen, _) = op.key;
        let end = match op.finished_at() {
            Some(end) => end,
            None if op.abandoned.is_some() => {
                stuck += 1;
                report.samples.push(format!(
                    "still waiting at the drain deadline: {}",
                    op.describe()
                ));
                continue;
            }
            // Cut short by SIGKILL: nothing to say.
            None if !drained.contains(&(client, gen)) => continue,
            None => {
                stuck += 1;
                report.samples.push(format!(
                    "never finished, yet its client drained: {}",
                    op.describe()
                ));
                continue;
            }
        };
        // The longest stretch of this operation with no fault (or its recovery) around.
        let mut cursor = op.begin;
        let mut gap = 0;
        for &(s, e) in &windows {
            if e < cursor {
                continue;
            }
            if s > end {
                break;
            }
            gap = gap.max(s - cursor);
            cursor = cursor.max(e);
        }
        gap = gap.max(end - cursor);
        longest_unexplained = longest_unexplained.max(gap);
        if gap > STALL_BOUND_US {
            stuck += 1;
            report.samples.push(format!(
                "no progress for {} ms with no fault around: {}",
                gap / 1000,
                op.describe()
            ));
        }
    }
    report.checks.push(CheckLine {
        name: STUCK,
        count: stuck,
        must_be_zero: true,
        note: format!(
            "longest operation stretch without a fault nearby: {} ms (bound {} ms)",
            longest_unexplained / 1000,
            STALL_BOUND_US / 1000
        ),
    });
}

/// An instant from which a lock was certainly free: no hold in Redis, at most a turn
/// reservation (which only delays the other clients by the grace).
struct FreeFrom<'a> {
    /// The lock was free at `at`, and stays free until a hold can have begun after it.
    at: i64,
    /// The lock became free at some instant in [since, at], so a hold that began after that
    /// instant was granted by a script that ran after `since`.
    since: i64,
    /// The op whose release or lease end proves it.
    op: &'a Op,
    how: FreedBy,
}

/// What proves a lock free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FreedBy {
    /// A clean `unlock()` of the owner's only hold ([`freed_by_unlock`]).
    Unlock,
    /// An explicit lease that ran out ([`lease_ran_out`]).
    LeaseEnd,
}

impl FreedBy {
    fn name(self) -> &'static str {
        match self {
            FreedBy::Unlock => "unlock",
            FreedBy::LeaseEnd => "lease end",
        }
    }
}

/// One lock's ops, seen from the free-lock rule.
struct LockOps<'a> {
    ops: Vec<&'a Op>,
    /// For each op, when its acquire may have taken the lock without the history showing when
    /// (see [`hidden_grants`]), or, on a fair lock, its place in line may have held the others
    /// up ([`line_holds`]).
    hidden: Vec<Vec<(i64, i64)>>,
    /// When a foreign-kind attempt may have taken the lock's name (`foreign::foreign_holds`).
    foreign: Vec<(i64, i64)>,
}

/// When `op`'s acquire may have taken the lock without a `Granted` event dating it, as windows
/// in which such a hold may have begun (when it ends does not matter here):
/// - an acquire that failed: its script may have run, and its rollback runs in the background;
/// - one cut short by SIGKILL (`killed`: when its process was gone): until then;
/// - any call while a fault that can delay or lose a command's reply hit its client (or every
///   client): a try whose reply was lost or late and was then rolled back, or a grant whose
///   reply was held up. Such a try ran at most [`LATE_DELIVERY_US`] before the fault began
///   (replies take far less without one) and at most that long after a command sent by the
///   end of the fault (or of the call). Killing the subscriber connections loses no reply.
fn hidden_grants(op: &Op, faults: &[Fault], killed: Option<i64>) -> Vec<(i64, i64)> {
    let (client, gen, _) = op.key;
    let mut windows = Vec::new();
    let end = match (op.call_end(), killed) {
        (Some(end), _) => end,
        (None, Some(killed)) => killed,
        (None, None) => i64::MAX - 2 * LATE_DELIVERY_US,
    };
    // (An upgrade refused took nothing: the client or the script refuses with nothing changed.)
    let refused = op
        .failed
        .as_deref()
        .is_some_and(|e| e.starts_with("upgrade_refused"));
    if (op.failed.is_some() && !refused) || op.call_end().is_none() {
        windows.push((op.begin, end + LATE_DELIVERY_US));
    }
    for fault in faults {
        if fault.kind == FaultKind::KillPubsubConnections || !hits(fault, client, gen) {
            continue;
        }
        let from = op.begin.max(fault.start - LATE_DELIVERY_US);
        let to = end.min(fault.end + LATE_DELIVERY_US) + LATE_DELIVERY_US;
        if from <= end && fault.end + LATE_DELIVERY_US >= op.begin {
            windows.push((from, to));
        }
    }
    windows
}

/// When a fair-lock waiter may hold up the line without the history showing it, as windows
/// like [`hidden_grants`]'s: a release grants a fair lock to the first live entry in line,
/// whose client alone is told, and the grant lasts until its entry would have lapsed (one lease
/// after its last renewal), so a waiter that cannot take its grant keeps the others waiting:
/// - one cut short by SIGKILL: its entry lives on for a lease after the kill (still under way
///   at the end: for ever);
/// - while a fault hits its client (a lost wake-up counts too: killing the subscriber
///   connections), and until that fault's recovery has passed ([`free_lock_recovery_us`]) and
///   then its entry has lapsed; also for a fault that begins just after the call, which can
///   stop the background leave of a waiter that gave up.
fn line_holds(
    op: &Op,
    faults: &[Fault],
    killed: Option<i64>,
    config: &RunConfig,
) -> Vec<(i64, i64)> {
    let (client, gen, _) = op.key;
    let entry_life = config.lease.as_micros() as i64 + EXPIRY_SLACK_US;
    let mut windows = Vec::new();
    let end = match (op.call_end(), killed) {
        (Some(end), _) => end,
        (None, Some(killed)) => {
            windows.push((op.begin, killed + entry_life));
            killed
        }
        (None, None) => {
            windows.push((op.begin, i64::MAX));
            return windows;
        }
    };
    let leave_sent_by = end + config.command_timeout.as_micros() as i64 + LATE_DELIVERY_US;
    for fault in faults.iter().filter(|f| hits(f, client, gen)) {
        let from = op.begin.max(fault.start - LATE_DELIVERY_US);
        let to = fault.end + free_lock_recovery_us(fault, config) + entry_life;
        if fault.start - LATE_DELIVERY_US <= leave_sent_by && to >= op.begin {
            windows.push((from, to));
        }
    }
    windows
}

/// Whether another op of `op`'s task (the same owner id) was under way on the same lock at
/// some point of [from, to]: a re-entry, an orphaned hold or a hand-off section could then
/// keep the lock held past `op`'s release.
fn task_busy(op: &Op, same_task: &[&Op], from: i64, to: i64) -> bool {
    same_task.iter().any(|o| {
        !std::ptr::eq(*o, op) && o.begin <= to && o.over_at().is_none_or(|end| end >= from)
    })
}

/// Whether the end of `op`'s hold can free its lock: any hold of a lock, a write of a
/// read/write lock (a write grant excludes every other owner's hold, and its owner's reads
/// are ops of its task, which [`task_busy`] sees); not a read, which other readers may share.
fn frees(op: &Op) -> bool {
    op.ty != LockType::ReadWrite || op.is_write()
}

/// `guard.unlock()` returned Ok for a first hold (`hold_count == 1`: no hold of anyone else at
/// the grant) while no other op of its task was under way on the lock: the release script then
/// took the owner's only hold and deleted the lock (or left a turn reservation), after the op's
/// last record before the call and before the call returned. A dropped guard (released in the
/// background, when is unknown), a failed unlock and `run_once` (which may hand the lock to
/// nobody until its `hold_at_least` tail runs out, and hides release errors) prove nothing.
fn freed_by_unlock<'a>(op: &'a Op, same_task: &[&Op]) -> Option<FreeFrom<'a>> {
    if !frees(op) {
        return None;
    }
    let (at, how, outcome) = op.released.as_ref()?;
    let clean = *how == ReleaseHow::Unlock && outcome == "ok";
    if !clean || op.granted.as_ref()?.hold_count != 1 || task_busy(op, same_task, op.begin, *at) {
        return None;
    }
    Some(FreeFrom {
        at: *at,
        since: op.last_before_release()?,
        op,
        how: FreedBy::Unlock,
    })
}

/// An explicit lease that certainly ran out: the acquire script set the key to expire a lease
/// after it ran (no later than the grant was recorded), nothing renews an explicit lease, and
/// only a re-entry of the same owner could raise it (so: a first hold, and no other op of its
/// task under way). The hold is gone by `at` however it ended (a killed or paused client
/// included). At the grant nobody else held the lock; a later hold is granted after this one
/// ended, so after its grant was recorded (`since`) — unless the grant's reply came later than
/// its lease, or Redis lost its data in between, which needs a fault: an op with `hidden`
/// grants proves nothing. Nor does `run_once`, which reports no hold count (it may have
/// re-entered an orphaned hold of its task, which may outlive the lease).
fn lease_ran_out<'a>(op: &'a Op, same_task: &[&Op], hidden: &[(i64, i64)]) -> Option<FreeFrom<'a>> {
    let grant = op.granted.as_ref()?;
    if !frees(op) {
        return None;
    }
    let guard_with_lease = op.kind.explicit_lease() && op.kind != Kind::RunOnce;
    if !guard_with_lease || grant.hold_count != 1 || !hidden.is_empty() {
        return None;
    }
    let at = grant.t + op.lease + EXPIRY_SLACK_US;
    if task_busy(op, same_task, op.begin, at) {
        return None;
    }
    Some(FreeFrom {
        at,
        since: grant.t,
        op,
        how: FreedBy::LeaseEnd,
    })
}

/// How long a lock stays certainly free after a proof: until the first hold that can have
/// begun. A grant whose acquire began after the free instant may have taken the lock as early
/// as that begin (a `try_lock()` takes a free, unreserved lock ahead of the waiters); a waiter
/// that began before is dated by its recorded grant, since the first hold granted after the
/// lock came free is the first whose grant is recorded (every later one needs that hold
/// released, which its holder does after recording its grant). A hidden grant (see
/// [`hidden_grants`]) may have begun anywhere in its window.
struct FreeStretch<'a> {
    /// The earliest a hidden grant may have begun (`i64::MAX`: none may have).
    hidden: i64,
    /// The two earliest instants a recorded grant may have begun at, with their ops.
    grants: [(i64, Option<&'a Op>); 2],
}

impl FreeStretch<'_> {
    /// Until when the lock stayed free for `waiter`: its own grant ends its wait, not the free
    /// stretch it waited in.
    fn until_for(&self, waiter: &Op) -> i64 {
        let grant = match self.grants {
            [(_, Some(first)), (second, _)] if std::ptr::eq(first, waiter) => second,
            [(first, _), _] => first,
        };
        grant.min(self.hidden)
    }
}

/// The stretch for which `free` keeps a lock free, or `None` if a grant recorded in [since, at]
/// may have taken the lock before `at` already.
fn free_stretch<'a>(free: &FreeFrom<'_>, lock: &LockOps<'a>) -> Option<FreeStretch<'a>> {
    let mut stretch = FreeStretch {
        hidden: i64::MAX,
        grants: [(i64::MAX, None); 2],
    };
    for (op, hidden) in lock.ops.iter().zip(&lock.hidden) {
        if std::ptr::eq(*op, free.op) {
            continue;
        }
        if let Some(grant) = op.granted.as_ref().filter(|g| g.t >= free.since) {
            if grant.t <= free.at {
                return None;
            }
            let from = if op.begin >= free.at {
                op.begin
            } else {
                grant.t
            };
            if from < stretch.grants[1].0 {
                stretch.grants[1] = (from, Some(*op));
                stretch.grants.sort_by_key(|(t, _)| *t);
            }
        }
        for &(from, to) in hidden {
            if to >= free.since {
                stretch.hidden = stretch.hidden.min(from.max(free.at));
            }
        }
    }
    for &(from, to) in &lock.foreign {
        if to >= free.since {
            stretch.hidden = stretch.hidden.min(from.max(free.at));
        }
    }
    Some(stretch)
}

/// When a waiter of `client`/`gen` on a lock free from `from` must have it: the bound after
/// `from`, or, when a fault on its client or on every client is in effect in that time (from
/// its start until its recovery, see [`free_lock_recovery_us`], has passed), the bound after
/// that recovery. Also whether no fault came into it (the strict bound). `faults` are sorted
/// by start.
fn wait_deadline(
    from: i64,
    (client, gen): (u32, u32),
    faults: &[Fault],
    config: &RunConfig,
) -> (i64, bool) {
    let mut deadline = from + FREE_LOCK_BOUND_US;
    let mut strict = true;
    for fault in faults.iter().filter(|f| hits(f, client, gen)) {
        if fault.start > deadline {
            break;
        }
        let recovered = fault.end + free_lock_recovery_us(fault, config);
        if recovered >= from {
            deadline = deadline.max(recovered + FREE_LOCK_BOUND_US);
            strict = false;
        }
    }
    (deadline, strict)
}

/// One waiting call measured against one free stretch.
struct Wait {
    /// Since when it waited on the free lock: the free instant, or its begin if later.
    from: i64,
    /// Until when the lock stayed free for it ([`FreeStretch::until_for`]).
    until: i64,
    /// When its call returned (or it was given up at the drain deadline).
    end: i64,
    /// When it must have had the lock ([`wait_deadline`]).
    deadline: i64,
    /// Whether no fault moved the deadline.
    strict: bool,
}

impl Wait {
    /// `waiter` in the stretch `free` proves, if it was waiting on the lock while free.
    fn new(
        free: &FreeFrom<'_>,
        stretch: &FreeStretch<'_>,
        waiter: &Op,
        faults: &[Fault],
        config: &RunConfig,
    ) -> Option<Wait> {
        let end = waiter.call_end()?;
        let from = free.at.max(waiter.begin);
        let until = stretch.until_for(waiter);
        if !waiter.kind.waits() || from >= until || end <= from {
            return None;
        }
        let (client, gen, _) = waiter.key;
        let (deadline, strict) = wait_deadline(from, (client, gen), faults, config);
        Some(Wait {
            from,
            until,
            end,
            deadline,
            strict,
        })
    }

    /// The lock stayed free past the deadline, and the waiter was still waiting then.
    fn left_waiting(&self) -> bool {
        self.until > self.deadline && self.end > self.deadline
    }

    fn describe(&self, free: &FreeFrom<'_>, waiter: &Op) -> String {
        let taken = match self.until {
            i64::MAX => "nobody took it".to_string(),
            until => format!("nobody took it for {} ms", (until - self.from) / 1000),
        };
        format!(
            "waited {} ms on a free lock (free after the {} of {}; {taken}; bound {} ms{}): {}",
            (self.end - self.from) / 1000,
            free.how.name(),
            free.op.describe(),
            (self.deadline - self.from) / 1000,
            if self.strict { "" } else { ", a fault near" },
            waiter.describe()
        )
    }
}

/// What the free-lock rule saw, for the report's note.
#[derive(Default)]
struct FreeLockStats {
    by_unlock: usize,
    by_lease: usize,
    strict_checks: usize,
    fault_checks: usize,
    longest_strict: i64,
}

impl FreeLockStats {
    fn proof(&mut self, how: FreedBy) {
        match how {
            FreedBy::Unlock => self.by_unlock += 1,
            FreedBy::LeaseEnd => self.by_lease += 1,
        }
    }

    fn wait(&mut self, wait: &Wait) {
        if wait.strict {
            self.strict_checks += 1;
            self.longest_strict = self
                .longest_strict
                .max(wait.end.min(wait.until) - wait.from);
        } else {
            self.fault_checks += 1;
        }
    }
}

/// The ops of each (client, generation, acquiring task, lock): one owner id's ops on one lock.
type TaskOps<'a> = HashMap<(u32, u32, u32, u32), Vec<&'a Op>>;

/// Each lock's ops with their hidden grants, and each task's ops per lock.
fn lock_ops<'a>(
    ops: &'a BTreeMap<OpKey, Op>,
    faults: &[Fault],
    config: &RunConfig,
) -> (Vec<LockOps<'a>>, TaskOps<'a>) {
    // When a killed process was certainly gone: the kill fault ended after the SIGKILL.
    let killed: HashMap<(u32, u32), i64> = faults
        .iter()
        .filter(|f| f.kind == FaultKind::ClientKill)
        .filter_map(|f| Some(((f.client?, f.gen?), f.end)))
        .collect();
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    let mut by_task: TaskOps<'a> = HashMap::new();
    for op in ops
        .values()
        .filter(|o| !matches!(o.ty, LockType::Semaphore | LockType::Latch))
    {
        let (client, gen, _) = op.key;
        by_res.entry(op.res).or_default().push(op);
        by_task
            .entry((client, gen, op.task, op.res))
            .or_default()
            .push(op);
    }
    let locks = by_res
        .into_values()
        .map(|ops| {
            let hidden = ops
                .iter()
                .map(|op| {
                    let (client, gen, _) = op.key;
                    let killed = killed.get(&(client, gen)).copied();
                    let mut windows = hidden_grants(op, faults, killed);
                    if (op.fair || op.ty == LockType::ReadWrite) && op.kind.waits() {
                        windows.extend(line_holds(op, faults, killed, config));
                    }
                    windows
                })
                .collect();
            LockOps {
                ops,
                hidden,
                foreign: Vec::new(),
            }
        })
        .collect();
    (locks, by_task)
}

/// Waiters left waiting on a free lock: for every instant the history proves a lock free
/// ([`freed_by_unlock`], [`lease_ran_out`]) and the stretch it stays certainly free
/// ([`free_stretch`]), every waiting call that was under way then and had not returned by the
/// deadline ([`wait_deadline`]) while the lock was still free is a violation.
fn free_lock_check(
    report: &mut Report,
    config: &RunConfig,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    foreign_holds: &BTreeMap<u32, Vec<(i64, i64)>>,
) {
    let mut faults = faults.to_vec();
    faults.sort_by_key(|f| f.start);
    let (mut locks, by_task) = lock_ops(ops, &faults, config);
    // Foreign-kind attempts that may have taken a lock's name: holds the history cannot date.
    for lock in &mut locks {
        if let Some(windows) = lock.ops.first().and_then(|o| foreign_holds.get(&o.res)) {
            lock.foreign = windows.clone();
        }
    }
    let mut stats = FreeLockStats::default();
    let mut stuck: HashSet<OpKey> = HashSet::new();
    for lock in &locks {
        for (op, hidden) in lock.ops.iter().zip(&lock.hidden) {
            let (client, gen, _) = op.key;
            let same_task = &by_task[&(client, gen, op.task, op.res)];
            let proofs = [
                freed_by_unlock(op, same_task),
                lease_ran_out(op, same_task, hidden),
            ];
            for free in proofs.into_iter().flatten() {
                let Some(stretch) = free_stretch(&free, lock).filter(|s| s.hidden > free.at) else {
                    continue;
                };
                stats.proof(free.how);
                for waiter in &lock.ops {
                    if stuck.contains(&waiter.key) {
                        continue;
                    }
                    let Some(wait) = Wait::new(&free, &stretch, waiter, &faults, config) else {
                        continue;
                    };
                    stats.wait(&wait);
                    if wait.left_waiting() {
                        stuck.insert(waiter.key);
                        report.samples.push(wait.describe(&free, waiter));
                    }
                }
            }
        }
    }
    let longest_recovery = faults
        .iter()
        .map(|f| free_lock_recovery_us(f, config))
        .max()
        .unwrap_or(0);
    report.checks.push(CheckLine {
        name: FREE_LOCK,
        count: stuck.len(),
        must_be_zero: true,
        note: format!(
            "locks proven free {} times ({} after an unlock, {} after a lease ran out); waits on \
             them checked: {} against {} ms, {} with a fault's recovery (up to {} ms) added; \
             longest with no fault near: {} ms",
            stats.by_unlock + stats.by_lease,
            stats.by_unlock,
            stats.by_lease,
            stats.strict_checks,
            FREE_LOCK_BOUND_US / 1000,
            stats.fault_checks,
            longest_recovery / 1000,
            stats.longest_strict / 1000
        ),
    });
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\noperations")?;
        writeln!(
            f,
            "  {:<28} {:>8} {:>8} {:>12} {:>8}",
            "kind", "calls", "granted", "not granted", "errors"
        )?;
        for (name, row) in &self.operations {
            writeln!(
                f,
                "  {:<28} {:>8} {:>8} {:>12} {:>8}",
                name, row[0], row[1], row[2], row[3]
            )?;
        }
        for (name, value) in &self.other_stats {
            writeln!(f, "  {name}: {value}")?;
        }
        writeln!(f, "\nfaults injected")?;
        for (name, count) in &self.faults {
            writeln!(f, "  {name:<40} {count:>6}")?;
        }
        writeln!(
            f,
            "  {:<40} {:>6}",
            "total",
            self.faults.iter().map(|(_, c)| c).sum::<usize>()
        )?;
        writeln!(f, "\nchecks")?;
        for check in &self.checks {
            let verdict = match (check.must_be_zero, check.count) {
                (true, 0) => "ok",
                (true, _) => "VIOLATION",
                (false, _) => "counted",
            };
            writeln!(f, "  {:<72} {:>6}  {verdict}", check.name, check.count)?;
            if !check.note.is_empty() {
                writeln!(f, "      {}", check.note)?;
            }
        }
        if !self.samples.is_empty() {
            writeln!(f, "\nfindings (first 30)")?;
            for sample in self.samples.iter().take(30) {
                writeln!(f, "  {sample}")?;
            }
        }
        let violations = self.violations();
        if violations == 0 {
            writeln!(f, "\nresult: PASS (0 violations)")
        } else {
            writeln!(f, "\nresult: FAIL ({violations} violations)")
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::*;

    pub(super) fn config() -> RunConfig {
        RunConfig {
            duration: Duration::from_secs(10),
            clients: 2,
            seed: 1,
            tasks: 1,
            // res-0 plain, res 1 the fair lock fair-0, res 2 the read/write lock rw-0, res 3 the
            // semaphore sem-0 (3 permits).
            resources: 1,
            fair_resources: 1,
            fair_percent: 25,
            rw_resources: 1,
            rw_percent: 20,
            sem_resources: 1,
            sem_percent: 20,
            sem_permits: 3,
            // res 4: the latch latch-0.
            latch_resources: 1,
            latch_percent: 10,
            foreign_percent: 4,
            lease: Duration::from_secs(1),
            command_timeout: Duration::from_millis(500),
            ignore_lease: false,
            cut_in_line: false,
            tolerate_orphaned_reentry: false,
            redlock: 0,
            cluster: false,
        }
    }

    /// A hold of `owner` on res-0: begins at `begin`, granted at `granted`, believed until
    /// `held_until`, a false check at `lost` (if any), released at `released`.
    #[allow(clippy::too_many_arguments)] // reason: a test fixture that spells out one hold
    pub(super) fn hold(
        op: u64,
        owner: &str,
        token: u64,
        begin: i64,
        granted: i64,
        held_until: i64,
        lost: Option<i64>,
        released: i64,
    ) -> Vec<Event> {
        let mut events = vec![
            Event::Begin {
                t: begin,
                op,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: None,
                wait_ms: None,
            },
            Event::Granted {
                t: granted,
                op,
                owner: owner.into(),
                token: Some(token),
                hold_count: 1,
            },
            Event::Check {
                t: held_until,
                op,
                held: true,
                derived: false,
            },
        ];
        if let Some(t) = lost {
            events.push(Event::Check {
                t,
                op,
                held: false,
                derived: false,
            });
        }
        events.push(Event::Released {
            t: released,
            op,
            how: ReleaseHow::Unlock,
            outcome: "ok".into(),
        });
        events
    }

    pub(super) fn history(client: u32, events: Vec<Event>) -> ClientHistory {
        let mut all = events;
        all.push(Event::Drained {
            t: 1_000_000_000,
            waiters: 0,
            channels: 0,
            holds: 0,
        });
        ClientHistory {
            client,
            gen: 0,
            events: all,
            torn_lines: 0,
        }
    }

    pub(super) fn run(
        histories: &[ClientHistory],
        faults: &[Fault],
        accepted: &[Accepted],
    ) -> Report {
        analyze(
            &config(),
            histories,
            faults,
            &Cleanup::default(),
            accepted,
            &[],
        )
    }

    #[test]
    fn disjoint_holds_pass() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 1100, 1500, None, 1600)),
        ];
        let report = run(&h, &[], &[]);
        assert!(report.passed(), "{report}");
    }

    #[test]
    fn overlapping_beliefs_are_a_violation() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP), 1, "{report}");
        assert!(!report.passed());
    }

    #[test]
    fn belief_ends_at_the_last_true_sample() {
        // a believed until 400, was told false at 900: b's hold from 600 does not overlap.
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 400, Some(900), 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        assert!(run(&h, &[], &[]).passed());
    }

    #[test]
    fn overlap_after_a_restart_is_counted_apart() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        let restart = Fault {
            kind: FaultKind::RedisRestart,
            client: None,
            gen: None,
            start: 300,
            end: 450,
            detail: String::new(),
            lost: None,
        };
        let report = run(&h, std::slice::from_ref(&restart), &[]);
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(OVERLAP_DATA_LOSS), 1);
        assert!(report.passed());
        // Still believing more than a lease (1 s here) after the loss is not excused.
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 2_000_000, None, 2_000_100)),
            history(1, hold(1, "b", 11, 500, 600, 1_900_000, None, 1_900_100)),
        ];
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(OVERLAP), 1, "{report}");
    }

    #[test]
    fn a_cluster_failover_excuses_overlaps_only_on_the_killed_primarys_resources() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        let failover = |kind, lost: Vec<u32>| Fault {
            kind,
            client: None,
            gen: None,
            start: 300,
            end: 450,
            detail: String::new(),
            lost: Some(lost),
        };
        let cluster = RunConfig {
            cluster: true,
            ..config()
        };
        let check = |fault: Fault| analyze(&cluster, &h, &[fault], &Cleanup::default(), &[], &[]);
        // The killed primary served res-0 (the overlap's): Cluster's limit, counted apart.
        let report = check(failover(FaultKind::PrimaryKill, vec![0]));
        assert_eq!(report.count(OVERLAP), 0, "{report}");
        assert_eq!(report.count(OVERLAP_FAILOVER), 1, "{report}");
        assert!(report.passed());
        // It served another resource: res-0's data was not lost, the overlap is a violation.
        let report = check(failover(FaultKind::PrimaryKill, vec![1, 2]));
        assert_eq!(report.count(OVERLAP), 1, "{report}");
        assert_eq!(report.count(OVERLAP_FAILOVER), 0, "{report}");
        // A coordinated failover loses nothing: no excuse either.
        let report = check(failover(FaultKind::ClusterFailover, Vec::new()));
        assert_eq!(report.count(OVERLAP), 1, "{report}");
    }

    #[test]
    fn same_owner_is_not_an_overlap() {
        let h = [history(
            0,
            [
                hold(1, "a", 10, 0, 100, 900, None, 1000),
                hold(2, "a", 10, 500, 600, 700, None, 800),
            ]
            .concat(),
        )];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP), 0);
    }

    #[test]
    fn two_grants_of_one_owner_in_one_task_overlap() {
        // Futures joined in one task: the second got a grant of its own (another token) while
        // the first still believed in its own.
        let h = [history(
            0,
            [
                hold(1, "a", 10, 0, 100, 900, None, 1000),
                hold(2, "a", 11, 500, 600, 700, None, 800),
            ]
            .concat(),
        )];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP_REPLACED), 1, "{report}");
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 0);
    }

    #[test]
    fn re_entering_a_joined_ops_hold_is_no_orphan() {
        // Two ops of one task at once: the second re-enters the first's grant (hold count 2)
        // while the first still holds it.
        let mut second = hold(2, "a", 10, 500, 600, 700, None, 800);
        for event in &mut second {
            if let Event::Granted { hold_count, .. } = event {
                *hold_count = 2;
            }
        }
        let h = [history(
            0,
            [hold(1, "a", 10, 0, 100, 900, None, 1000), second].concat(),
        )];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(ORPHANED), 0, "{report}");
        assert_eq!(report.count(OVERLAP_REPLACED), 0, "{report}");
    }

    #[test]
    fn tokens_must_follow_real_time() {
        let h = [
            history(0, hold(1, "a", 20, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FENCE_ORDER), 1, "{report}");
        // Concurrent acquires may be ordered either way.
        let h = [
            history(0, hold(1, "a", 20, 0, 450, 460, None, 470)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        assert_eq!(run(&h, &[], &[]).count(FENCE_ORDER), 0);
    }

    /// Two new grants with token 10: a hold of `res-0` and one of the lock `res` (a plain
    /// lock of a config with `plain` of them).
    fn equal_tokens(plain: u32, res: u32) -> Report {
        let config = RunConfig {
            resources: plain,
            ..config()
        };
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 200, None, 300)),
            history(1, on(res, hold(1, "b", 10, 0, 150, 250, None, 350))),
        ];
        analyze(&config, &h, &[], &Cleanup::default(), &[], &[])
    }

    #[test]
    fn a_token_is_unique_per_cluster_slot_not_per_run() {
        // res-0 and fair-0 hash to different slots: their counters may meet (the cluster
        // run's `lock` of res-0 and read of rw-0 both got token 1796182117094579).
        assert_ne!(slot_of_name("res-0"), slot_of_name("fair-0"));
        let report = equal_tokens(1, 1);
        assert_eq!(report.count(FENCE_REUSED), 0, "{report}");
        assert!(report.passed(), "{report}");
        let line = report
            .checks
            .iter()
            .find(|c| c.name == FENCE_REUSED)
            .unwrap();
        assert!(line.note.starts_with("allowed: 1 tokens"), "{}", line.note);
        // Two names of one slot share its counter: one token twice is a violation.
        let names = (0..10_000).map(|i| format!("res-{i}"));
        let twin = names
            .skip(1)
            .position(|name| slot_of_name(&name) == slot_of_name("res-0"))
            .map(|i| i as u32 + 1)
            .expect("some res-<i> below 10,000 shares res-0's slot");
        let report = equal_tokens(twin + 1, twin);
        assert_eq!(report.count(FENCE_REUSED), 1, "{report}");
        assert!(!report.passed());
        // And so is one name (concurrent grants, so not an order violation).
        let report = equal_tokens(1, 0);
        assert_eq!(report.count(FENCE_REUSED), 1, "{report}");
        assert_eq!(report.count(FENCE_ORDER), 0, "{report}");
    }

    #[test]
    fn tokens_backwards_across_a_restart() {
        let h = [
            history(0, hold(1, "a", 20, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        let restart = Fault {
            kind: FaultKind::RedisRestart,
            client: None,
            gen: None,
            start: 320,
            end: 350,
            detail: String::new(),
            lost: None,
        };
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(FENCE_RESTART), 1, "{report}");
        assert_eq!(report.count(FENCE_ORDER), 0);
    }

    #[test]
    fn store_log_checks() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 11, 400, 500, 600, None, 700)),
        ];
        let write = |client, token, t| Accepted {
            seq: t,
            resource: 0,
            token,
            client,
            gen: 0,
            op: 1,
            t,
        };
        assert!(run(&h, &[], &[write(0, 10, 150), write(1, 11, 550)]).passed());
        let report = run(&h, &[], &[write(1, 11, 150), write(0, 10, 550)]);
        assert_eq!(report.count(FENCE_NON_INCREASING), 1);
        let report = run(&h, &[], &[write(0, 12, 150)]);
        assert_eq!(report.count(FENCE_UNKNOWN_TOKEN), 1);
    }

    #[test]
    fn late_writes_are_counted_not_failed() {
        // a checked at 200, was paused, its write landed at 1500 during b's hold.
        let mut a = hold(1, "a", 10, 0, 100, 200, Some(1600), 1700);
        a.insert(
            3,
            Event::Write {
                t: 1500,
                op: 1,
                token: 10,
                accepted: false,
            },
        );
        let h = [
            history(0, a),
            history(1, hold(1, "b", 11, 1100, 1200, 1800, None, 1900)),
        ];
        let pause = Fault {
            kind: FaultKind::ClientPause,
            client: Some(0),
            gen: Some(0),
            start: 250,
            end: 1400,
            detail: String::new(),
            lost: None,
        };
        let report = run(&h, &[pause], &[]);
        assert_eq!(report.count(LATE_WRITES), 1, "{report}");
        assert!(report.passed());
        let late = report
            .checks
            .iter()
            .find(|c| c.name == LATE_WRITES)
            .unwrap();
        assert!(late.note.contains("1 paused"), "{}", late.note);
        assert!(late.note.contains("1 refused"), "{}", late.note);
    }

    #[test]
    fn abandoned_and_stalled_waiters_fail() {
        let mut h = history(
            0,
            vec![Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: None,
                wait_ms: None,
            }],
        );
        h.events.insert(
            1,
            Event::Abandoned {
                t: 40_000_000,
                op: 1,
            },
        );
        assert_eq!(run(&[h], &[], &[]).count(STUCK), 1);

        let slow = vec![
            Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: None,
                wait_ms: None,
            },
            Event::NotGranted {
                t: STALL_BOUND_US + 30_000_000,
                op: 1,
            },
        ];
        let h = [history(0, slow.clone())];
        assert_eq!(run(&h, &[], &[]).count(STUCK), 1);
        // The same wait with faults all along is explained.
        let faults: Vec<Fault> = (0..10)
            .map(|i| Fault {
                kind: FaultKind::ProxyPartition,
                client: Some(0),
                gen: Some(0),
                start: i * 5_000_000,
                end: i * 5_000_000 + 1_000_000,
                detail: String::new(),
                lost: None,
            })
            .collect();
        assert_eq!(run(&h, &faults, &[]).count(STUCK), 0);
    }

    #[test]
    fn reentering_an_orphaned_hold_is_a_violation() {
        let mut reentered = hold(2, "a", 10, 500, 600, 700, None, 800);
        if let Event::Granted { hold_count, .. } = &mut reentered[1] {
            *hold_count = 2;
        }
        let failed = vec![
            Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::TryLock,
                res: 0,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: None,
                wait_ms: None,
            },
            Event::Failed {
                t: 400,
                op: 1,
                error: "timeout: no reply".into(),
            },
        ];
        let h = [history(0, [failed, reentered.clone()].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(ORPHANED), 1, "{report}");
        let tolerant = RunConfig {
            tolerate_orphaned_reentry: true,
            ..config()
        };
        assert!(analyze(&tolerant, &h, &[], &Cleanup::default(), &[], &[]).passed());
        // After a dropped guard it is the background release racing: not counted.
        let mut dropped = hold(1, "a", 10, 0, 100, 200, None, 300);
        if let Some(Event::Released { how, .. }) = dropped.last_mut() {
            *how = ReleaseHow::Drop;
        }
        let h = [history(0, [dropped, reentered].concat())];
        assert_eq!(run(&h, &[], &[]).count(ORPHANED), 0);
    }

    /// A `lock()` on res-0 that begins at `begin` and is granted (a first hold of `owner`) at
    /// `granted`, then released at once.
    pub(super) fn waiter(op: u64, owner: &str, token: u64, begin: i64, granted: i64) -> Vec<Event> {
        hold(
            op,
            owner,
            token,
            begin,
            granted,
            granted,
            None,
            granted + 1_000,
        )
    }

    fn set_hold_count(events: &mut [Event], count: u64) {
        for event in events {
            if let Event::Granted { hold_count, .. } = event {
                *hold_count = count;
            }
        }
    }

    pub(super) fn fault(kind: FaultKind, client: Option<u32>, start: i64, end: i64) -> Fault {
        Fault {
            kind,
            client,
            gen: client.map(|_| 0),
            start,
            end,
            detail: String::new(),
            lost: None,
        }
    }

    /// a unlocks at 1 ms; b, waiting since 0.5 ms, gets the lock at `b_granted`.
    fn release_then_wait(b_granted: i64) -> Vec<ClientHistory> {
        vec![
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1_000)),
            history(1, waiter(1, "b", 11, 500, b_granted)),
        ]
    }

    #[test]
    fn a_waiter_left_on_a_free_lock_fails() {
        let report = run(&release_then_wait(601_000), &[], &[]);
        assert_eq!(report.count(FREE_LOCK), 1, "{report}");
        assert!(!report.passed());
        // Giving up after waiting that long on the free lock fails just the same.
        let gave_up = vec![
            Event::Begin {
                t: 500,
                op: 1,
                task: 0,
                kind: Kind::TryLockFor,
                res: 0,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: None,
                wait_ms: None,
            },
            Event::NotGranted { t: 601_000, op: 1 },
        ];
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1_000)),
            history(1, gave_up),
        ];
        assert_eq!(run(&h, &[], &[]).count(FREE_LOCK), 1);
        // So does one that began on the free lock (its own grant ends its wait, not the free
        // stretch): a release reserving a turn for a client that crashed in the queue.
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1_000)),
            history(1, waiter(1, "b", 11, 2_000, 1_002_000)),
        ];
        assert_eq!(run(&h, &[], &[]).count(FREE_LOCK), 1);
    }

    #[test]
    fn a_waiter_woken_within_the_bound_passes() {
        let h = release_then_wait(1_000 + FREE_LOCK_BOUND_US - 1_000);
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FREE_LOCK), 0, "{report}");
        assert!(report.passed());
    }

    #[test]
    fn a_fault_near_lengthens_the_bound() {
        let h = release_then_wait(601_000);
        // Every subscriber connection killed just before the release: the wake-up may be lost,
        // and the bound runs from the reconnect.
        let pubsub = fault(FaultKind::KillPubsubConnections, None, 900, 900);
        assert_eq!(
            run(&h, std::slice::from_ref(&pubsub), &[]).count(FREE_LOCK),
            0
        );
        // The waiter's client partitioned until 0.4 s: its tries may have been granted unseen
        // (then rolled back), so the lock is not even known free.
        let partition = fault(FaultKind::ProxyPartition, Some(1), 0, 400_000);
        assert_eq!(run(&h, &[partition], &[]).count(FREE_LOCK), 0);
        // A fault on another client explains nothing, nor one long healed.
        let elsewhere = fault(FaultKind::ProxyPartition, Some(2), 0, 400_000);
        assert_eq!(run(&h, &[elsewhere], &[]).count(FREE_LOCK), 1);
        let long_ago = fault(
            FaultKind::KillPubsubConnections,
            None,
            -9_000_000,
            -9_000_000,
        );
        assert_eq!(run(&h, &[long_ago], &[]).count(FREE_LOCK), 1);
        // Slower than even the longer bound still fails.
        let h = release_then_wait(9_000_000);
        assert_eq!(run(&h, &[pubsub], &[]).count(FREE_LOCK), 1);
    }

    #[test]
    fn a_try_lock_that_takes_the_free_lock_ends_it() {
        // c's try_lock takes the lock 50 ms after a let it go, ahead of the waiting b, and holds
        // it (dropping its guard: no proof of when it ended) until just before b gets it.
        let mut c = hold(1, "c", 12, 50_000, 50_500, 500_000, None, 600_000);
        if let Event::Begin { kind, .. } = &mut c[0] {
            *kind = Kind::TryLock;
        }
        if let Some(Event::Released { how, .. }) = c.last_mut() {
            *how = ReleaseHow::Drop;
        }
        let mut h = release_then_wait(601_000);
        h.push(history(2, c));
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FREE_LOCK), 0, "{report}");
    }

    #[test]
    fn an_explicit_lease_that_ran_out_frees_the_lock() {
        // a's 300 ms lease: its guard dropped at 250 µs (released in the background, when is
        // unknown), but the lock is free by 100 µs + 300 ms at the latest.
        let mut a = hold(1, "a", 10, 0, 100, 200, None, 250);
        if let Event::Begin { kind, lease_ms, .. } = &mut a[0] {
            (*kind, *lease_ms) = (Kind::LockWithLease, Some(300));
        }
        if let Some(Event::Released { how, .. }) = a.last_mut() {
            *how = ReleaseHow::Drop;
        }
        let waited = |granted| {
            [
                history(0, a.clone()),
                history(1, waiter(1, "b", 11, 150, granted)),
            ]
        };
        assert_eq!(run(&waited(900_000), &[], &[]).count(FREE_LOCK), 1);
        assert_eq!(run(&waited(400_000), &[], &[]).count(FREE_LOCK), 0);
    }

    #[test]
    fn releasing_a_hold_its_task_reentered_proves_nothing() {
        // Op 1 is handed off; its task re-enters (op 2, hold count 2) and keeps the lock until
        // 1.5 s, so the section's unlock at 1 ms left the lock held and b waits rightly.
        let mut handed = hold(1, "a", 10, 0, 100, 900, None, 1_000);
        handed.insert(
            2,
            Event::Handoff {
                t: 150,
                op: 1,
                to_task: 7,
            },
        );
        let mut reentered = hold(2, "a", 10, 200, 210, 700, None, 1_500_000);
        set_hold_count(&mut reentered, 2);
        let h = [
            history(0, [handed, reentered].concat()),
            history(1, waiter(1, "b", 11, 500, 1_501_000)),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FREE_LOCK), 0, "{report}");
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 1, "{report}");
    }

    #[test]
    fn two_tasks_of_one_owner_overlapping_fail() {
        // Op 1's guard goes to task 7 at 150; task 0 goes on and re-enters (op 2, hold count 2)
        // at 210 while task 7 still works under the hold (believed until 900).
        let mut handed = hold(1, "a", 10, 0, 100, 900, None, 1_000);
        handed.insert(
            2,
            Event::Handoff {
                t: 150,
                op: 1,
                to_task: 7,
            },
        );
        let mut reentered = hold(2, "a", 10, 200, 210, 700, None, 800);
        set_hold_count(&mut reentered, 2);
        let h = [history(0, [handed.clone(), reentered.clone()].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 1, "{report}");
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(ORPHANED), 0, "a hand-off is no orphan");
        assert!(!report.passed());
        // Two task loops under one owner id overlap just the same.
        let mut other_task = hold(2, "a", 10, 200, 210, 700, None, 800);
        if let Event::Begin { task, .. } = &mut other_task[0] {
            *task = 1;
        }
        let h = [history(
            0,
            [hold(1, "a", 10, 0, 100, 900, None, 1_000), other_task].concat(),
        )];
        assert_eq!(run(&h, &[], &[]).count(OVERLAP_TWO_TASKS), 1);
    }

    #[test]
    fn nested_reentry_within_one_task_passes() {
        // Op 2 re-enters op 1's hold in the same task and is done (believed until 700) before
        // op 1 is handed off at 750: one task at a time ran the critical section.
        let mut outer = hold(1, "a", 10, 0, 100, 900, None, 1_000);
        outer.insert(
            2,
            Event::Handoff {
                t: 750,
                op: 1,
                to_task: 7,
            },
        );
        let mut inner = hold(2, "a", 10, 500, 600, 700, None, 720);
        set_hold_count(&mut inner, 2);
        let h = [history(0, [outer, inner].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 0, "{report}");
        assert!(report.passed(), "{report}");
    }

    /// The fair lock of [`config`].
    pub(super) const FAIR: u32 = 1;

    /// `events` moved to lock `res`.
    pub(super) fn on(res: u32, mut events: Vec<Event>) -> Vec<Event> {
        for event in &mut events {
            if let Event::Begin { res: r, .. } = event {
                *r = res;
            }
        }
        events
    }

    /// A fair op's floor, read at `t` (just before its `Begin`), found nothing of its owner's.
    pub(super) fn clean_floor(op: u64, t: i64) -> Event {
        Event::Floor {
            t,
            op,
            answered: t + 50,
            entry: false,
            held: false,
        }
    }

    /// A run of polls that found `op`'s owner in line with `arrival` from `first` to `last`.
    pub(super) fn queued(op: u64, arrival: i64, first: i64, last: i64) -> Event {
        Event::Queued {
            t: first,
            op,
            arrival,
            last,
            polls: 10,
        }
    }

    /// a holds the fair lock from 0 to 900 ms; b queues behind it (its entry, arrival
    /// 1_000_010, seen from 10 ms to `b_last`) and is granted at 901 ms; c begins at 20 ms,
    /// its floor clean, and is granted at `c_granted`.
    fn line(c_granted: i64, b_last: i64) -> Vec<ClientHistory> {
        let mut a = on(FAIR, hold(1, "a", 10, 0, 100, 800_000, None, 900_000));
        a.insert(1, clean_floor(1, -50));
        let mut b = on(FAIR, waiter(1, "b", 11, 5_000, 901_000));
        b.insert(1, clean_floor(1, 4_900));
        b.insert(2, queued(1, 1_000_010, 10_000, b_last));
        let mut c = on(FAIR, waiter(1, "c", 12, 20_100, c_granted));
        c.insert(1, clean_floor(1, 20_000));
        vec![history(0, a), history(1, b), history(2, c)]
    }

    #[test]
    fn a_grant_past_a_waiter_in_line_fails() {
        // c, which began after b was in line, got the lock first, while b's entry (the same
        // arrival) was still in line after c's grant.
        let report = run(&line(900_500, 900_900), &[], &[]);
        assert_eq!(report.count(FAIR_ORDER), 1, "{report}");
        assert!(!report.passed());
        // Faults on b's client change nothing: a waiter that lost its place has a new arrival.
        let pause = fault(FaultKind::ClientPause, Some(1), 30_000, 600_000);
        let restart = fault(FaultKind::RedisRestart, None, 30_000, 40_000);
        assert_eq!(
            run(&line(900_500, 900_900), &[pause, restart], &[]).count(FAIR_ORDER),
            1
        );
    }

    #[test]
    fn grants_in_arrival_order_pass() {
        // b (in line first) is granted at 901 ms, c after it.
        let report = run(&line(1_000_000, 900_900), &[], &[]);
        assert_eq!(report.count(FAIR_ORDER), 0, "{report}");
        assert!(report.passed(), "{report}");
        let judged = report.checks.iter().find(|c| c.name == FAIR_ORDER).unwrap();
        // a, b and c each got the lock with nothing of theirs there before; c was judged
        // against b.
        assert!(
            judged
                .note
                .starts_with("3 grants judged against the 1 waiters"),
            "{}",
            judged.note
        );
    }

    #[test]
    fn a_waiter_that_left_the_line_may_be_passed() {
        // b's entry went at 400 ms (it lapsed while b's client was cut off): it came back with
        // a new arrival, behind c.
        let mut h = line(900_500, 400_000);
        h[1].events
            .insert(3, queued(1, 1_500_000, 950_000, 951_000));
        let cut = fault(FaultKind::ProxyPartition, Some(1), 30_000, 1_600_000);
        let report = run(&h, &[cut], &[]);
        assert_eq!(report.count(FAIR_ORDER), 0, "{report}");
        // b only seen in line after c's floor was read: c arrived first.
        let mut h = line(900_500, 900_900);
        h[1].events[2] = queued(1, 1_000_010, 25_000, 900_900);
        assert_eq!(run(&h, &[], &[]).count(FAIR_ORDER), 0);
    }

    #[test]
    fn an_owner_already_in_line_or_holding_is_not_judged() {
        // c's owner had an entry of its own when c began (an earlier wait's, whose leave had
        // not run yet): c may be ahead of b.
        for (entry, held) in [(true, false), (false, true)] {
            let mut h = line(900_500, 900_900);
            h[2].events[1] = Event::Floor {
                t: 20_000,
                op: 1,
                answered: 20_050,
                entry,
                held,
            };
            let report = run(&h, &[], &[]);
            assert_eq!(report.count(FAIR_ORDER), 0, "{report}");
        }
        // Nor is one whose floor could not be read.
        let mut h = line(900_500, 900_900);
        h[2].events.remove(1);
        assert_eq!(run(&h, &[], &[]).count(FAIR_ORDER), 0);
        // Nor a pair under one owner (joined ops of one task).
        let mut h = line(900_500, 900_900);
        let c = h.remove(2);
        let renumbered: Vec<Event> = c
            .events
            .into_iter()
            .filter(|e| !matches!(e, Event::Drained { .. }))
            .map(|mut e| {
                match &mut e {
                    Event::Begin { op, .. }
                    | Event::Floor { op, .. }
                    | Event::Granted { op, .. }
                    | Event::Check { op, .. }
                    | Event::Released { op, .. } => *op = 2,
                    _ => {}
                }
                e
            })
            .collect();
        h[1].events.splice(0..0, renumbered);
        assert_eq!(run(&h, &[], &[]).count(FAIR_ORDER), 0);
    }

    /// On the read/write lock: a `a_side` waiter queued from 10 ms (its entry still in line at
    /// 900.9 ms) and a `b_side` acquire that began at 20 ms, its floor clean, granted at 900.5
    /// ms, past it.
    /// (The entry's score is its arrival × 2, + 1 for a writer's: `entry_side`.)
    fn rw_line_of(a_side: Side, entry_side: Side, b_side: Side) -> Vec<ClientHistory> {
        let mut a = rw(a_side, None, waiter(1, "a", 11, 5_000, 950_000));
        a.insert(1, clean_floor(1, 4_900));
        let score = 2_000_020 + i64::from(entry_side == Side::Write);
        a.insert(2, queued(1, score, 10_000, 900_900));
        let mut b = rw(b_side, None, waiter(1, "b", 12, 20_100, 900_500));
        b.insert(1, clean_floor(1, 20_000));
        vec![history(1, a), history(2, b)]
    }

    fn rw_line(a_side: Side, b_side: Side) -> Vec<ClientHistory> {
        rw_line_of(a_side, a_side, b_side)
    }

    #[test]
    fn the_read_write_lines_order_is_judged_but_readers_share() {
        for (a, b) in [
            (Side::Write, Side::Read),
            (Side::Read, Side::Write),
            (Side::Write, Side::Write),
        ] {
            let report = run(&rw_line(a, b), &[], &[]);
            assert_eq!(report.count(FAIR_ORDER), 1, "{a:?} then {b:?}: {report}");
        }
        // A reader may go in beside a reader ahead of it.
        let report = run(&rw_line(Side::Read, Side::Read), &[], &[]);
        assert_eq!(report.count(FAIR_ORDER), 0, "{report}");
        // The entry is a reader's (a joined read of the writer's owner queued it): a reader
        // may pass it, whatever the op that saw it asked for (seen in a 60 s run).
        let report = run(&rw_line_of(Side::Write, Side::Read, Side::Read), &[], &[]);
        assert_eq!(report.count(FAIR_ORDER), 0, "{report}");
        let report = run(&rw_line_of(Side::Read, Side::Write, Side::Read), &[], &[]);
        assert_eq!(report.count(FAIR_ORDER), 1, "{report}");
    }

    #[test]
    fn a_semaphore_or_latch_left_with_another_kinds_marks_fails_the_cleanup() {
        let semaphore = |pttl, other: &[&str], permits| crate::run::SemaphoreLeft {
            name: "chaos:{sem-0}".into(),
            permits: Some(permits),
            pttl: Some(pttl),
            other_fields: other.iter().map(|f| f.to_string()).collect(),
            expected_permits: Some(3),
            ..Default::default()
        };
        let latch = |fields: &[(&str, &str)], pttl| crate::run::LatchLeft {
            name: "chaos:{latch-0}".into(),
            fields: fields
                .iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect(),
            pttl,
        };
        let check = |s, l| {
            let cleanup = Cleanup {
                semaphores: vec![s],
                latches: vec![l],
                ..Cleanup::default()
            };
            analyze(&config(), &[], &[], &cleanup, &[], &[])
        };
        let counting = || latch(&[("~latch", "2")], -1);
        assert!(check(semaphore(-1, &[], 3), counting()).passed());
        // A TTL (a read/write lock's prune put one there), a lock's field, the number gone.
        assert_eq!(
            check(semaphore(800, &[], 3), counting()).count(SEMAPHORE_LEFT),
            1
        );
        let fields = ["~mode", "x:o1"];
        assert_eq!(
            check(semaphore(-1, &fields, 3), counting()).count(SEMAPHORE_LEFT),
            2
        );
        assert_eq!(
            check(semaphore(-1, &[], 0), counting()).count(SEMAPHORE_LEFT),
            1
        );
        // A latch's hash with a lock's field or a TTL.
        let report = check(
            semaphore(-1, &[], 3),
            latch(&[("~latch", "2"), ("x:o1", "1")], -1),
        );
        assert_eq!(report.count(LATCH_LEFT), 1, "{report}");
        let report = check(semaphore(-1, &[], 3), latch(&[("~latch", "2")], 700));
        assert_eq!(report.count(LATCH_LEFT), 1, "{report}");
    }

    /// a unlocks the fair lock at 1 ms; k, a waiter queued before, was killed at -600 ms (its
    /// entry stays in line until it lapses, a lease later, and a release grants it the lock);
    /// w, waiting since 0.5 ms, gets the lock at 1.2 s.
    fn killed_in_line(res: u32) -> (Vec<ClientHistory>, Fault) {
        let a = on(res, hold(1, "a", 10, 0, 100, 900, None, 1_000));
        let k = vec![Event::Begin {
            t: -900_000,
            op: 1,
            task: 0,
            kind: Kind::Lock,
            res,
            lease_ms: None,
            side: None,
            permits: None,
            under: None,
            foreign: None,
            latch: None,
            wait_ms: None,
        }];
        let k = ClientHistory {
            client: 2,
            gen: 0,
            events: k,
            torn_lines: 0,
        };
        let w = on(res, waiter(1, "w", 11, 500, 1_200_000));
        let kill = fault(FaultKind::ClientKill, Some(2), -600_100, -600_000);
        (vec![history(0, a), history(1, w), k], kill)
    }

    #[test]
    fn a_killed_waiter_holds_a_fair_line_for_a_lease() {
        let (h, kill) = killed_in_line(FAIR);
        let report = run(&h, std::slice::from_ref(&kill), &[]);
        assert_eq!(report.count(FREE_LOCK), 0, "{report}");
        // On a plain lock the turn passes after the grace: w waited too long.
        let (h, kill) = killed_in_line(0);
        assert_eq!(run(&h, &[kill], &[]).count(FREE_LOCK), 1);
    }

    /// The read/write lock and the semaphore of [`config`].
    pub(super) const RW: u32 = 2;
    pub(super) const SEM: u32 = 3;

    /// `events` made an op on the read/write lock for `side`, asked under op `under` if any.
    pub(super) fn rw(side: Side, under: Option<u64>, events: Vec<Event>) -> Vec<Event> {
        let mut events = on(RW, events);
        for event in &mut events {
            if let Event::Begin {
                side: s, under: u, ..
            } = event
            {
                (*s, *u) = (Some(side), under);
            }
        }
        events
    }

    /// `events` made an acquisition of `permits` permits of the semaphore.
    pub(super) fn sem(permits: u32, events: Vec<Event>) -> Vec<Event> {
        let mut events = on(SEM, events);
        for event in &mut events {
            if let Event::Begin { permits: p, .. } = event {
                *p = Some(permits);
            }
        }
        events
    }

    /// Whether the op asked under another's hold found it still held when its call returned.
    fn under_held(op: u64, t: i64, held: bool) -> Event {
        Event::UnderHeld { t, op, held }
    }

    #[test]
    fn a_writer_overlapping_a_reader_fails() {
        // a writes from 100 to 900 µs; b reads from 600 to 700.
        let h = [
            history(
                0,
                rw(Side::Write, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            ),
            history(
                1,
                rw(Side::Read, None, hold(1, "b", 11, 500, 600, 700, None, 800)),
            ),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(RW_EXCLUSION), 1, "{report}");
        assert_eq!(report.count(OVERLAP), 0);
        assert!(!report.passed());
        // A reader first, then a writer, just the same; and two writers.
        let h = [
            history(
                0,
                rw(Side::Read, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            ),
            history(
                1,
                rw(
                    Side::Write,
                    None,
                    hold(1, "b", 11, 500, 600, 700, None, 800),
                ),
            ),
        ];
        assert_eq!(run(&h, &[], &[]).count(RW_EXCLUSION), 1);
        let h = [
            history(
                0,
                rw(Side::Write, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            ),
            history(
                1,
                rw(
                    Side::Write,
                    None,
                    hold(1, "b", 11, 500, 600, 700, None, 800),
                ),
            ),
        ];
        assert_eq!(run(&h, &[], &[]).count(RW_EXCLUSION), 1);
        // Right after Redis lost its data, counted apart.
        let restart = fault(FaultKind::RedisRestart, None, 300, 450);
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(RW_EXCLUSION), 0, "{report}");
        assert_eq!(report.count(OVERLAP_DATA_LOSS), 1);
    }

    #[test]
    fn readers_overlapping_pass() {
        let h = [
            history(
                0,
                rw(Side::Read, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            ),
            history(
                1,
                rw(Side::Read, None, hold(1, "b", 11, 500, 600, 700, None, 800)),
            ),
            history(
                2,
                rw(Side::Read, None, hold(1, "c", 12, 550, 650, 950, None, 990)),
            ),
        ];
        let report = run(&h, &[], &[]);
        assert!(report.passed(), "{report}");
        let line = report
            .checks
            .iter()
            .find(|c| c.name == RW_EXCLUSION)
            .unwrap();
        assert!(
            line.note.starts_with("not counted: 3 overlaps of readers"),
            "{}",
            line.note
        );
        // Then a writer after them all.
        let mut h = h.to_vec();
        h.push(history(
            3,
            rw(
                Side::Write,
                None,
                hold(1, "d", 13, 995, 1100, 1200, None, 1300),
            ),
        ));
        assert!(run(&h, &[], &[]).passed());
    }

    #[test]
    fn a_downgrade_passes_and_an_upgrade_fails() {
        // a writes (op 1), then reads under its write (op 2), then lets the write go.
        let mut read = rw(
            Side::Read,
            Some(1),
            hold(2, "a", 11, 500, 600, 1_500, None, 1_600),
        );
        read.insert(1, under_held(2, 600, true));
        let h = [history(
            0,
            [
                rw(Side::Write, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
                read,
            ]
            .concat(),
        )];
        let report = run(&h, &[], &[]);
        assert!(report.passed(), "{report}");
        // a reads (op 1), then is granted a write (op 2, a new grant) while still reading.
        let upgraded = [
            rw(Side::Read, None, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            rw(
                Side::Write,
                None,
                hold(2, "a", 11, 500, 600, 700, None, 800),
            ),
        ]
        .concat();
        let report = run(&[history(0, upgraded.clone())], &[], &[]);
        assert_eq!(report.count(RW_UPGRADE), 1, "{report}");
        assert_eq!(report.count(OVERLAP_REPLACED), 0);
        // A re-entry of a write the owner held too (its read being a downgrade) is fine.
        let mut reentered = upgraded;
        set_hold_count(&mut reentered[5..], 2);
        assert_eq!(run(&[history(0, reentered)], &[], &[]).count(RW_UPGRADE), 0);
    }

    /// a reads (op 1, believed until 900 µs) and asks for the write side under it (op 2),
    /// which ends with `outcome` at 600; the read was still held then (`held`).
    fn upgrade_attempt(outcome: Event, held: bool) -> Vec<ClientHistory> {
        let attempt = rw(
            Side::Write,
            Some(1),
            vec![
                Event::Begin {
                    t: 500,
                    op: 2,
                    task: 0,
                    kind: Kind::TryLockFor,
                    res: RW,
                    lease_ms: None,
                    side: None,
                    permits: None,
                    under: None,
                    foreign: None,
                    latch: None,
                    wait_ms: None,
                },
                under_held(2, 600, held),
                outcome,
            ],
        );
        let read = rw(Side::Read, None, hold(1, "a", 10, 0, 100, 900, None, 1000));
        vec![history(0, [read, attempt].concat())]
    }

    #[test]
    fn an_upgrade_attempt_must_be_refused() {
        let refused = Event::Failed {
            t: 600,
            op: 2,
            error: "upgrade_refused: the owner holds a read lock".into(),
        };
        let report = run(&upgrade_attempt(refused, true), &[], &[]);
        assert!(report.passed(), "{report}");
        let not_granted = Event::NotGranted { t: 600, op: 2 };
        let report = run(&upgrade_attempt(not_granted.clone(), true), &[], &[]);
        assert_eq!(report.count(RW_UPGRADE), 1, "{report}");
        let timeout = Event::Failed {
            t: 600,
            op: 2,
            error: "timeout: no reply".into(),
        };
        assert_eq!(
            run(&upgrade_attempt(timeout, true), &[], &[]).count(RW_UPGRADE),
            1
        );
        // The read's lease was lost during the call: the write may rightly go to Redis.
        assert!(run(&upgrade_attempt(not_granted, false), &[], &[]).passed());
    }

    /// An upgrade attempt granted afresh (hold count 1) after Redis lost its data since the
    /// read's acquire began: the read may be gone from Redis while its holder still believes
    /// it, and the owner's write (held too, re-entered by the attempt) was lost with it.
    #[test]
    fn an_upgrade_granted_after_redis_lost_its_data_is_counted_apart() {
        let granted = Event::Granted {
            t: 600,
            op: 2,
            owner: "a".into(),
            token: Some(30),
            hold_count: 1,
        };
        let report = run(&upgrade_attempt(granted.clone(), true), &[], &[]);
        assert_eq!(report.count(RW_UPGRADE), 1, "{report}");
        let restart = fault(FaultKind::RedisRestart, None, 300, 450);
        let report = run(&upgrade_attempt(granted, true), &[restart], &[]);
        assert_eq!(report.count(RW_UPGRADE), 0, "{report}");
    }

    #[test]
    fn a_downgrade_not_granted_fails() {
        let write = rw(Side::Write, None, hold(1, "a", 10, 0, 100, 900, None, 1000));
        let downgrade = |held| {
            let read = rw(
                Side::Read,
                Some(1),
                vec![
                    Event::Begin {
                        t: 500,
                        op: 2,
                        task: 0,
                        kind: Kind::TryLock,
                        res: RW,
                        lease_ms: None,
                        side: None,
                        permits: None,
                        under: None,
                        foreign: None,
                        latch: None,
                        wait_ms: None,
                    },
                    under_held(2, 600, held),
                    Event::NotGranted { t: 600, op: 2 },
                ],
            );
            vec![history(0, [write.clone(), read].concat())]
        };
        let report = run(&downgrade(true), &[], &[]);
        assert_eq!(report.count(RW_DOWNGRADE), 1, "{report}");
        assert!(run(&downgrade(false), &[], &[]).passed());
        // Redis lost the write hold: counted apart.
        let restart = fault(FaultKind::RedisRestart, None, 300, 450);
        assert_eq!(
            run(&downgrade(true), &[restart], &[]).count(RW_DOWNGRADE),
            0
        );
    }

    #[test]
    fn write_tokens_must_be_above_earlier_reads() {
        let h = [
            history(
                0,
                rw(Side::Read, None, hold(1, "a", 20, 0, 100, 200, None, 300)),
            ),
            history(
                1,
                rw(
                    Side::Write,
                    None,
                    hold(1, "b", 15, 400, 500, 600, None, 700),
                ),
            ),
        ];
        assert_eq!(run(&h, &[], &[]).count(FENCE_ORDER), 1);
    }

    #[test]
    fn a_read_release_proves_no_read_write_lock_free() {
        // a reads until 1 ms; w, waiting to write since 0.5 ms, gets it at 601 ms: another
        // reader may have held it (on a write's release, w would have waited too long).
        let w = rw(Side::Write, None, waiter(1, "w", 11, 500, 601_000));
        let h = [
            history(
                0,
                rw(Side::Read, None, hold(1, "a", 10, 0, 100, 900, None, 1_000)),
            ),
            history(1, w.clone()),
        ];
        assert_eq!(run(&h, &[], &[]).count(FREE_LOCK), 0);
        let h = [
            history(
                0,
                rw(
                    Side::Write,
                    None,
                    hold(1, "a", 10, 0, 100, 900, None, 1_000),
                ),
            ),
            history(1, w),
        ];
        assert_eq!(run(&h, &[], &[]).count(FREE_LOCK), 1);
    }

    /// Acquisitions of the semaphore (3 permits): a takes 2 from 100 µs to 900, b takes
    /// `b_permits` from 600 to 700.
    fn permits(b_permits: u32) -> Vec<ClientHistory> {
        vec![
            history(0, sem(2, hold(1, "a", 10, 0, 100, 900, None, 1000))),
            history(
                1,
                sem(b_permits, hold(1, "b", 11, 500, 600, 700, None, 800)),
            ),
        ]
    }

    #[test]
    fn more_permits_than_the_number_fail() {
        let report = run(&permits(2), &[], &[]);
        assert_eq!(report.count(SEMAPHORE_LIMIT), 1, "{report}");
        assert!(!report.passed());
        // Permit holders overlap by design: no other overlap rule judges them.
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(RW_EXCLUSION), 0);
        // Exactly the number passes.
        let report = run(&permits(1), &[], &[]);
        assert!(report.passed(), "{report}");
        assert!(
            report
                .other_stats
                .iter()
                .any(|(name, v)| name == "semaphore ops" && v.contains("3 of 3")),
            "{report}"
        );
        // Three at once, one each, pass; a fourth fails.
        let one = |client, owner, begin, to| {
            history(
                client,
                sem(
                    1,
                    hold(
                        1,
                        owner,
                        20 + u64::from(client),
                        begin,
                        begin + 10,
                        to,
                        None,
                        to + 10,
                    ),
                ),
            )
        };
        let h = [
            one(0, "a", 0, 500),
            one(1, "b", 100, 500),
            one(2, "c", 200, 500),
        ];
        assert!(run(&h, &[], &[]).passed());
        let mut h = h.to_vec();
        h.push(one(3, "d", 300, 400));
        assert_eq!(run(&h, &[], &[]).count(SEMAPHORE_LIMIT), 1);
    }

    #[test]
    fn permits_over_the_number_after_a_data_loss_are_counted_apart() {
        let restart = fault(FaultKind::RedisRestart, None, 300, 450);
        let report = run(&permits(2), std::slice::from_ref(&restart), &[]);
        assert_eq!(report.count(SEMAPHORE_LIMIT), 0, "{report}");
        assert_eq!(report.count(SEMAPHORE_DATA_LOSS), 1);
        assert!(report.passed());
        // A holder from before the loss believing more than a lease (1 s) after it is not
        // excused from then on (b's grant, over the number only with a, still is).
        let h = [
            history(
                0,
                sem(2, hold(1, "a", 10, 0, 100, 2_000_000, None, 2_000_100)),
            ),
            history(
                1,
                sem(2, hold(1, "b", 11, 500, 600, 1_900_000, None, 1_900_100)),
            ),
        ];
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(SEMAPHORE_LIMIT), 1, "{report}");
        assert!(
            report.samples.iter().any(|s| s.contains("at 1000451")),
            "{report}"
        );
    }

    #[test]
    fn semaphore_permits_left_leased_fail_the_cleanup() {
        let left = |lease_left| crate::run::SemaphoreLeft {
            name: "chaos:{sem-0}".into(),
            permits: Some(3),
            used: 2,
            held: vec![("x:o1".into(), 2, lease_left)],
            leases_without_permits: 0,
            ..Default::default()
        };
        let check = |semaphore| {
            let cleanup = Cleanup {
                semaphore_keys: vec!["chaos:{sem-0}".into(), "chaos:{sem-0}:leases".into()],
                semaphores: vec![semaphore],
                ..Cleanup::default()
            };
            analyze(&config(), &[], &[], &cleanup, &[], &[])
        };
        // Expired, waiting for the next call to give it back: by design.
        assert!(check(left(Some(-5))).passed());
        assert_eq!(check(left(Some(20_000))).count(SEMAPHORE_LEFT), 1);
        assert_eq!(check(left(None)).count(SEMAPHORE_LEFT), 1);
        let mut wrong = left(Some(-5));
        wrong.used = 3;
        assert_eq!(check(wrong).count(SEMAPHORE_LEFT), 1);
    }
}
