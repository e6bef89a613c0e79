//! The recorded history: what each client did (one JSON-lines file per client process) and
//! what the orchestrator injected (`faults.jsonl`).
//!
//! Every timestamp is [`clock::now_us`](crate::clock::now_us), taken *before* the observation it
//! dates where that matters (see [`Event::Check`]), so a pause between the two can only make the
//! history claim less than what happened, never more.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// How a client tried to acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `lock()`: unbounded wait, watched lease.
    Lock,
    /// `try_lock()`: one try, watched lease.
    TryLock,
    /// `try_lock_for(wait)`: bounded wait, watched lease.
    TryLockFor,
    /// `try_lock_with_lease(lease)`: one try, explicit lease.
    TryLockWithLease,
    /// `try_lock_for_with_lease(wait, lease)`: bounded wait, explicit lease.
    TryLockForWithLease,
    /// `lock_with_lease(lease)`: unbounded wait, explicit lease.
    LockWithLease,
    /// `schedule::run_once(lock, options, job)`: one try, explicit lease, maybe `unlock_after`.
    RunOnce,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Lock,
        Kind::TryLock,
        Kind::TryLockFor,
        Kind::TryLockWithLease,
        Kind::TryLockForWithLease,
        Kind::LockWithLease,
        Kind::RunOnce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock()",
            Kind::TryLock => "try_lock()",
            Kind::TryLockFor => "try_lock_for()",
            Kind::TryLockWithLease => "try_lock_with_lease()",
            Kind::TryLockForWithLease => "try_lock_for_with_lease()",
            Kind::LockWithLease => "lock_with_lease()",
            Kind::RunOnce => "run_once()",
        }
    }

    /// Whether the call may wait for the lock (and so must make progress once faults heal).
    pub fn waits(self) -> bool {
        matches!(
            self,
            Kind::Lock | Kind::TryLockFor | Kind::TryLockForWithLease | Kind::LockWithLease
        )
    }

    /// Whether the hold has an explicit lease, which nothing renews (the others are watched).
    pub fn explicit_lease(self) -> bool {
        matches!(
            self,
            Kind::TryLockWithLease
                | Kind::TryLockForWithLease
                | Kind::LockWithLease
                | Kind::RunOnce
        )
    }
}

/// Which side of a read/write lock an op asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Read,
    Write,
}

/// What a foreign-kind attempt asked for (`Begin::foreign`): an acquire of another kind than
/// the name's own, on a name in use by its own kind. The library must refuse it
/// (`LockError::WrongKind`) and write nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskedAs {
    /// `client.lock(name)`.
    Lock,
    /// `client.fair_lock(name)`.
    FairLock,
    /// `client.rw_lock(name).read()`.
    Read,
    /// `client.rw_lock(name).write()`.
    Write,
    /// `client.semaphore(name)`, one permit.
    Semaphore,
    /// `client.latch(name)`: `wait_for` (of zero for a try).
    Latch,
}

impl AskedAs {
    pub const ALL: [AskedAs; 6] = [
        AskedAs::Lock,
        AskedAs::FairLock,
        AskedAs::Read,
        AskedAs::Write,
        AskedAs::Semaphore,
        AskedAs::Latch,
    ];

    /// The kind's name as `LockError::WrongKind` says it (`held_as`, `asked_as`).
    pub fn kind_name(self) -> &'static str {
        match self {
            AskedAs::Lock | AskedAs::FairLock => "lock",
            AskedAs::Read | AskedAs::Write => "read/write lock",
            AskedAs::Semaphore => "semaphore",
            AskedAs::Latch => "count-down latch",
        }
    }
}

/// A count-down latch call (`Begin::latch`); its outcome is [`Event::LatchReturned`] (or
/// `Failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatchCall {
    /// `try_set_count(count)`: returns 1 when it set the count (the latch was open), 0 when
    /// the latch was counting down.
    Set { count: u32 },
    /// `count_down()`: returns the count left (0: it opened the latch, or the latch was open).
    CountDown,
    /// `wait_for(timeout)`: returns 1 when the latch opened, 0 at the timeout.
    Wait { timeout_ms: u64 },
    /// `count()`, read by a waiting party while its `wait_for` (op `of`) was under way:
    /// returns the count.
    Count { of: u64 },
}

/// How a hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseHow {
    /// `guard.unlock().await`: the outcome is known.
    Unlock,
    /// `drop(guard)`: released in the background.
    Drop,
    /// `run_once` released (or `unlock_after`) by itself.
    RunOnce,
}

/// One line of a client's history. `op` numbers are per client process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The process connected and is about to start its tasks. `client_id` is the uuid that
    /// starts every owner id of this process.
    Start {
        t: i64,
        pid: u32,
        tasks: u32,
        client_id: String,
    },
    /// An acquire call starts (taken before the call: the script went out no earlier).
    /// `lease_ms`: the explicit lease (`hold_at_most` for run_once); `None` for watched holds.
    /// On a read/write lock, `side` says which; on a semaphore, `permits` how many the call
    /// asks for. `under`: the op of the same task whose hold this one was asked under (a read
    /// under a write: a downgrade; a write under a read: an upgrade, which must be refused).
    Begin {
        t: i64,
        op: u64,
        task: u32,
        kind: Kind,
        res: u32,
        lease_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        side: Option<Side>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        under: Option<u64>,
        /// A foreign-kind attempt: what it asked for on resource `res`, a name of another kind
        /// ([`AskedAs`]). Its outcome is `Granted` (then released at once), `NotGranted` or
        /// `Failed`; for a latch call, [`Event::LatchReturned`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        foreign: Option<AskedAs>,
        /// A count-down latch call ([`LatchCall`]), on a latch (`latch-<i>`) or, with
        /// `foreign`, on a name of another kind.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        latch: Option<LatchCall>,
        /// A bounded wait's `wait` (`try_lock_for` and its lease form), in ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// The acquire returned a hold (taken after the call returned). `token` is `None` for
    /// `run_once`, which exposes no guard; `hold_count` > 1 is a re-entry of a hold this owner
    /// already had (same grant, same token); 0 is unknown.
    Granted {
        t: i64,
        op: u64,
        owner: String,
        token: Option<u64>,
        hold_count: u64,
    },
    /// The acquire returned without a hold (busy, wait timed out, run_once skipped).
    NotGranted { t: i64, op: u64 },
    /// The acquire returned an error.
    Failed { t: i64, op: u64, error: String },
    /// `held` is `guard.is_held()`, read right after `t` was taken. `is_held()` only ever goes
    /// from true to false, so `held == true` means the holder believed its lease valid during
    /// the whole of [grant, t]. `derived`: no guard to ask (run_once): `held` is then
    /// `t < begin + hold_at_most - drift`, a lower bound of the library's own deadline.
    Check {
        t: i64,
        op: u64,
        held: bool,
        derived: bool,
    },
    /// A fenced write; `t` is read inside the store's write transaction (its serialization
    /// point), `accepted` whether the store took it.
    Write {
        t: i64,
        op: u64,
        token: u64,
        accepted: bool,
    },
    /// The hold was released (`outcome`: "ok", "not_held" or the error).
    Released {
        t: i64,
        op: u64,
        how: ReleaseHow,
        outcome: String,
    },
    /// The acquiring task handed the guard to a task it spawned (`to_task`, numbered after the
    /// client's task loops) and went straight on to its next operation: the op's later checks,
    /// write and release are that task's. Recorded before the spawn.
    Handoff { t: i64, op: u64, to_task: u32 },
    /// The op was still running at the drain deadline: a waiter that never progressed.
    Abandoned { t: i64, op: u64 },
    /// A fair-lock op's owner as Redis had it just before the acquire call, read in one script
    /// on the client's own connection straight to Redis (not the library's): sent at `t`,
    /// answered at `answered` (both before the op's `Begin`). `entry`: the owner had a place in
    /// the lock's line (`P:{N}:waiters`); `held`: it held the lock.
    Floor {
        t: i64,
        op: u64,
        answered: i64,
        entry: bool,
        held: bool,
    },
    /// A fair-lock waiter's place in line, seen by polling `ZSCORE P:{N}:waiters <owner>` on
    /// that connection while the acquire was under way: one event per run of polls that found
    /// the same `arrival` (the entry's score, server microseconds), recorded after the call.
    /// `t` is when the run's first poll was answered (the entry was there at some instant up to
    /// `t`), `last` when its last poll was sent (there at some instant from `last` on).
    Queued {
        t: i64,
        op: u64,
        arrival: i64,
        last: i64,
        polls: u32,
    },
    /// An op asked under another's hold (`Begin::under`) returned; `held` is that other hold's
    /// `is_held()` (the library's own, whatever `--ignore-lease` says), read right after `t`
    /// was taken: true means it was certainly held during the whole call.
    UnderHeld { t: i64, op: u64, held: bool },
    /// `try_set_permits` set semaphore `res`'s number of permits (it found none: the run's
    /// first, or Redis lost its data since); `op` when an op's own call set it.
    PermitsSet { t: i64, res: u32, op: Option<u64> },
    /// A latch call (`Begin::latch`) returned `value` (see [`LatchCall`]); taken after the call
    /// returned.
    LatchReturned { t: i64, op: u64, value: u64 },
    /// Right after a foreign-kind attempt on a semaphore's or a latch's name returned, the
    /// name's hash as Redis had it (read on the client's own connection straight to Redis,
    /// sent at `t`, answered at `answered`): its `PTTL` (-1: no TTL, as a semaphore's and a
    /// counting latch's hash must be; -2: no key).
    AfterForeign {
        t: i64,
        op: u64,
        answered: i64,
        pttl: i64,
    },
    /// A fair or read/write waiter's owner seen holding the lock in Redis (its field in the
    /// hash) while its acquire was still under way, by the polls that watch its place in line
    /// (`Queued`): one event per grant seen (by `token`, the grant's fencing token), `t` when
    /// the first poll that found it was sent, `answered` when it was answered, `since` when
    /// the last poll before it that found no hold was sent (the grant ran after it; the
    /// call's begin when there was none), `gone` when the first poll after it that found that
    /// grant gone was answered (it ended before then), if one did. Recorded after the call.
    HeldInRedis {
        t: i64,
        op: u64,
        answered: i64,
        since: i64,
        token: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gone: Option<i64>,
    },
    /// Every task stopped; what the client still had registered locally afterwards.
    Drained {
        t: i64,
        waiters: usize,
        channels: usize,
        holds: usize,
    },
}

impl Event {
    pub fn op(&self) -> Option<u64> {
        match self {
            Event::Begin { op, .. }
            | Event::Granted { op, .. }
            | Event::NotGranted { op, .. }
            | Event::Failed { op, .. }
            | Event::Check { op, .. }
            | Event::Write { op, .. }
            | Event::Released { op, .. }
            | Event::Handoff { op, .. }
            | Event::Abandoned { op, .. }
            | Event::Floor { op, .. }
            | Event::Queued { op, .. }
            | Event::UnderHeld { op, .. }
            | Event::LatchReturned { op, .. }
            | Event::AfterForeign { op, .. }
            | Event::HeldInRedis { op, .. } => Some(*op),
            Event::Start { .. } | Event::Drained { .. } | Event::PermitsSet { .. } => None,
        }
    }
}

/// An append-only JSON-lines file. Each event is one `write` on an `O_APPEND` file, unbuffered,
/// so a SIGKILL loses at most the line being written (the reader skips a torn last line).
#[derive(Debug)]
pub struct EventLog {
    file: Mutex<File>,
}

impl EventLog {
    pub fn create(path: &Path) -> anyhow::Result<EventLog> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(EventLog {
            file: Mutex::new(file),
        })
    }

    pub fn record<E: Serialize>(&self, event: &E) {
        let mut line = serde_json::to_string(event).expect("events serialize");
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(line.as_bytes())
            .expect("writing the event log (disk full?)");
    }
}

/// The client id a client process recorded in its `Start` event.
pub fn read_client_id(path: &Path) -> anyhow::Result<String> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    for line in BufReader::new(file).lines() {
        if let Ok(Event::Start { client_id, .. }) = serde_json::from_str(&line?) {
            return Ok(client_id);
        }
    }
    anyhow::bail!("no start event in {}", path.display())
}

/// The file of client `client`, generation `gen` (a respawn after SIGKILL is a new generation).
pub fn client_log_path(dir: &Path, client: u32, gen: u32) -> PathBuf {
    dir.join(format!("events-c{client}-g{gen}.jsonl"))
}

/// One client process's history.
#[derive(Debug, Clone)]
pub struct ClientHistory {
    pub client: u32,
    pub gen: u32,
    pub events: Vec<Event>,
    /// Lines that did not parse (a line torn by SIGKILL).
    pub torn_lines: usize,
}

/// Reads every `events-c*-g*.jsonl` in `dir`.
pub fn read_client_histories(dir: &Path) -> anyhow::Result<Vec<ClientHistory>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((client, gen)) = name
            .strip_prefix("events-c")
            .and_then(|r| r.strip_suffix(".jsonl"))
            .and_then(|r| r.split_once("-g"))
        else {
            continue;
        };
        let (client, gen) = (client.parse()?, gen.parse()?);
        let mut events = Vec::new();
        let mut torn_lines = 0;
        for line in BufReader::new(File::open(&path)?).lines() {
            let line = line?;
            match serde_json::from_str(&line) {
                Ok(event) => events.push(event),
                Err(_) => torn_lines += 1,
            }
        }
        out.push(ClientHistory {
            client,
            gen,
            events,
            torn_lines,
        });
    }
    out.sort_by_key(|h| (h.client, h.gen));
    Ok(out)
}

/// What the orchestrator injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Added latency on one client's proxy, both directions.
    ProxyLatency,
    /// One client's proxy drops all traffic; its connections are reset before healing (a TCP
    /// connection that lost bytes is out of sync, as after a real partition ended by a reset).
    ProxyPartition,
    /// Every connection of one client (or of all clients) reset.
    ProxyCloseAll,
    /// SIGSTOP a client process past its lease, then SIGCONT (a GC-like pause).
    ClientPause,
    /// SIGKILL a client process; a new generation is spawned in its place.
    ClientKill,
    /// Redis SIGKILLed and restarted on the same port: all data lost.
    RedisRestart,
    /// Redis SIGSTOPped, then SIGCONTed.
    RedisPause,
    /// `CLIENT KILL TYPE pubsub`: every subscriber connection.
    KillPubsubConnections,
    /// `CLIENT KILL TYPE normal`: every command connection.
    KillCommandConnections,
    /// Cluster mode: a primary SIGKILLed; its replica is promoted after the node timeout, then
    /// the killed node is started again and rejoins as a replica. Replication is
    /// asynchronous: writes the primary acknowledged but had not yet sent to its replica are
    /// lost ([`Fault::lost`] lists the resources it served).
    PrimaryKill,
    /// Cluster mode: `CLUSTER FAILOVER` on a primary's replica (coordinated: the replica
    /// catches up first, so no write is lost).
    ClusterFailover,
    /// Cluster mode: one node (primary or replica) SIGSTOPped, then SIGCONTed, for less than
    /// the node timeout.
    NodePause,
    /// Cluster mode: the slot of a resource (mostly one held or waited on) moved to another
    /// primary, the clients caught in the middle (`ASK`, `TRYAGAIN`, then `MOVED`).
    SlotMigration,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::ProxyLatency,
        FaultKind::ProxyPartition,
        FaultKind::ProxyCloseAll,
        FaultKind::ClientPause,
        FaultKind::ClientKill,
        FaultKind::RedisRestart,
        FaultKind::RedisPause,
        FaultKind::KillPubsubConnections,
        FaultKind::KillCommandConnections,
    ];

    /// The faults of a cluster run (`--cluster`): no proxies there (the cluster tells clients
    /// the nodes' own addresses), and Redis faults per node.
    pub const CLUSTER: [FaultKind; 8] = [
        FaultKind::ClientPause,
        FaultKind::ClientKill,
        FaultKind::PrimaryKill,
        FaultKind::ClusterFailover,
        FaultKind::NodePause,
        FaultKind::SlotMigration,
        FaultKind::KillPubsubConnections,
        FaultKind::KillCommandConnections,
    ];

    /// The kinds of a run: [`FaultKind::CLUSTER`] in cluster mode, else [`FaultKind::ALL`].
    pub fn of_run(cluster: bool) -> &'static [FaultKind] {
        if cluster {
            &FaultKind::CLUSTER
        } else {
            &FaultKind::ALL
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ProxyLatency => "proxy latency",
            FaultKind::ProxyPartition => "proxy partition + reset",
            FaultKind::ProxyCloseAll => "proxy close all connections",
            FaultKind::ClientPause => "client SIGSTOP past its lease",
            FaultKind::ClientKill => "client SIGKILL + respawn",
            FaultKind::RedisRestart => "Redis restart (data lost)",
            FaultKind::RedisPause => "Redis SIGSTOP",
            FaultKind::KillPubsubConnections => "CLIENT KILL TYPE pubsub",
            FaultKind::KillCommandConnections => "CLIENT KILL TYPE normal",
            FaultKind::PrimaryKill => "primary SIGKILL, failover, rejoin",
            FaultKind::ClusterFailover => "CLUSTER FAILOVER (coordinated)",
            FaultKind::NodePause => "cluster node SIGSTOP",
            FaultKind::SlotMigration => "slot migration (ASK, then MOVED)",
        }
    }
}

/// One injected fault: active from `start` until `end` (healed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    /// The client it hit (proxy faults, pauses, kills), if one.
    pub client: Option<u32>,
    /// That client's generation at the time.
    pub gen: Option<u32>,
    pub start: i64,
    pub end: i64,
    pub detail: String,
    /// Resources whose Redis data this fault may have lost, from `start` on (cluster mode:
    /// those on a killed primary, or on a paused one that a replica replaced). `None`: as the
    /// kind says ([`FaultKind::RedisRestart`] loses every resource's data, the others none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<Vec<u32>>,
}

impl Fault {
    /// Whether this fault may have lost resource `res`'s data in Redis.
    pub fn lost_data_of(&self, res: u32) -> bool {
        match &self.lost {
            Some(resources) => resources.contains(&res),
            None => self.kind == FaultKind::RedisRestart,
        }
    }

    /// Whether it may have lost anyone's data.
    pub fn lost_data(&self) -> bool {
        self.lost
            .as_ref()
            .map_or(self.kind == FaultKind::RedisRestart, |r| !r.is_empty())
    }
}

pub fn write_faults(path: &Path, faults: &[Fault]) -> anyhow::Result<()> {
    let mut text = String::new();
    for fault in faults {
        text.push_str(&serde_json::to_string(fault)?);
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

pub fn read_faults(path: &Path) -> anyhow::Result<Vec<Fault>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}
