//! What a run is, as both the orchestrator (which makes it) and the checker (which judges it)
//! see it: its settings and what it left behind. (Its own module: the orchestrator runs the
//! checker, and the checker only needs these.)

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The settings of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfig {
    pub duration: Duration,
    pub clients: u32,
    pub seed: u64,
    pub tasks: u32,
    /// Plain locks (`res-0` ...), shared by all clients.
    pub resources: u32,
    /// Fair locks (`fair-0` ...), numbered after the plain ones; a name is always one kind.
    #[serde(default)]
    pub fair_resources: u32,
    /// The share of operations (percent) on a fair lock.
    #[serde(default)]
    pub fair_percent: u64,
    /// Read/write locks (`rw-0` ...), numbered after the fair ones.
    #[serde(default)]
    pub rw_resources: u32,
    /// The share of operations (percent) on a read/write lock.
    #[serde(default)]
    pub rw_percent: u64,
    /// Semaphores (`sem-0` ...), numbered after the read/write locks.
    #[serde(default)]
    pub sem_resources: u32,
    /// The share of operations (percent) on a semaphore.
    #[serde(default)]
    pub sem_percent: u64,
    /// Every semaphore's number of permits.
    #[serde(default)]
    pub sem_permits: u32,
    /// Count-down latches (`latch-0` ...), numbered after the semaphores.
    #[serde(default)]
    pub latch_resources: u32,
    /// The share of operations (percent) on a latch.
    #[serde(default)]
    pub latch_percent: u64,
    /// The share of operations (percent) that are a foreign-kind attempt (an acquire of
    /// another kind on a name in use by its own: `worker::foreign_attempt`).
    #[serde(default)]
    pub foreign_percent: u64,
    /// Watchdog lease of the clients' watched holds.
    pub lease: Duration,
    pub command_timeout: Duration,
    /// Self-test of the checker: clients claim to hold their lease whatever `is_held()` says
    /// (a client that ignores lease loss), and often work on past it, so the checker must
    /// report overlaps (on every kind: two holders of a lock, a writer beside another owner,
    /// more permits than a semaphore has).
    #[serde(default)]
    pub ignore_lease: bool,
    /// Self-test of the checker: half the fair-lock waiters put themselves at the head of the
    /// line before they acquire (as a lock that let callers jump the line would), so the
    /// checker must report grants past waiters.
    #[serde(default)]
    pub cut_in_line: bool,
    /// RedLock mode (`--redlock N`): N independent servers, and every op on a
    /// [`leasehold::RedLock`] quorum lock over them (`redlock.rs`); 0: the one-server run.
    #[serde(default)]
    pub redlock: u32,
    /// Cluster mode (`--cluster`): a Redis Cluster of 3 primaries with a replica each, the
    /// clients connected to it as a cluster (no proxies), faults on its nodes
    /// (`orchestrator.rs`).
    #[serde(default)]
    pub cluster: bool,
    /// Report orphaned re-entries without failing the run (for investigating that class of
    /// bug, see `checker::orphan_check`; no test sets it).
    #[serde(default)]
    pub tolerate_orphaned_reentry: bool,
}

/// What was left after the clients stopped (saved as `cleanup.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Cleanup {
    /// Clients that died by themselves, never drained, or exited with an error.
    pub crashed: Vec<String>,
    /// Release channels still subscribed after every client drained (deadline passed).
    pub channels_left: Vec<String>,
    /// Keys other than the fencing counter right after the clients exited.
    pub keys_at_exit: Vec<String>,
    /// Of those, keys without a TTL: they would never go away.
    pub keys_without_ttl: Vec<String>,
    /// Keys other than the fencing counter still there after waiting for every TTL to run out.
    pub keys_left: Vec<String>,
    /// `P:{T}:fence`, the fencing counters of the slots used: kept by design (they keep tokens
    /// increasing), not counted (at most one per resource).
    pub fence_keys: usize,
    /// How long those keys took to disappear.
    pub expiry_wait_ms: u64,
    /// The semaphores' hashes and permit leases (`P:{sem-<i>}`, `P:{sem-<i>}:leases`): kept by
    /// design with no TTL (the number of permits is configuration), so left out of the key
    /// counts above and looked at in [`Cleanup::semaphores`] instead.
    #[serde(default)]
    pub semaphore_keys: Vec<String>,
    /// Each semaphore as it was once every other key had gone.
    #[serde(default)]
    pub semaphores: Vec<SemaphoreLeft>,
    /// The latches' hashes (`P:{latch-<i>}`): a latch still counting down keeps its count
    /// with no TTL by design, so left out of the key counts above and looked at in
    /// [`Cleanup::latches`] instead.
    #[serde(default)]
    pub latch_keys: Vec<String>,
    /// Each latch as it was once every other key had gone (those still there).
    #[serde(default)]
    pub latches: Vec<LatchLeft>,
}

/// A latch's hash after the clients stopped: a latch still counting down holds its kind
/// (`~kind` = `latch`), its count (`~latch`) and its round's id (`~round`), and nothing else,
/// with no TTL.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatchLeft {
    pub name: String,
    /// Every field of the hash, with its value.
    pub fields: Vec<(String, String)>,
    /// `PTTL` of the hash (-1: none).
    pub pttl: i64,
}

impl LatchLeft {
    /// Anything but a count above zero with no TTL: a field of another kind (a lock's owner,
    /// a semaphore's permits), or a TTL.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        use leasehold_core::protocol::{KIND_FIELD, LATCH_FIELD, ROUND_FIELD};
        for (field, value) in &self.fields {
            let ok = match field.as_str() {
                LATCH_FIELD => value.parse::<i64>().is_ok_and(|n| n > 0),
                KIND_FIELD => value == leasehold_core::Stored::Latch.marker(),
                ROUND_FIELD => value.parse::<u64>().is_ok(),
                _ => false,
            };
            if !ok {
                problems.push(format!(
                    "{}: field {field:?} = {value:?} in a latch's hash",
                    self.name
                ));
            }
        }
        if self.pttl != -1 {
            problems.push(format!(
                "{}: a latch's hash with PTTL {} (a count has no TTL)",
                self.name, self.pttl
            ));
        }
        problems
    }
}

/// A semaphore after the clients stopped. Its number of permits stays by design; a permit
/// whose lease ran out stays listed until the next call on the semaphore gives it back (no
/// client is left to make one), so only permits still leased, or counts that do not add up,
/// are left over.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SemaphoreLeft {
    pub name: String,
    /// `~permits` (none: never set since Redis last lost its data).
    pub permits: Option<i64>,
    /// `~used`: the permits taken, as the semaphore counts them.
    pub used: i64,
    /// Each acquisition still in the hash: its id, its permits, and how long its lease still
    /// ran when looked at (ms, Redis time; negative: expired; `None`: not in the leases set).
    pub held: Vec<(String, i64, Option<i64>)>,
    /// Members of the leases set with no acquisition in the hash.
    pub leases_without_permits: usize,
    /// `PTTL` of the hash: -1 (none) by design; `None` in histories from before it was read.
    #[serde(default)]
    pub pttl: Option<i64>,
    /// Fields that are not a semaphore's (`~kind`, `~permits`, `~used`, `~r:<id>`, `~rf:<id>`,
    /// `~granted:<id>`):
    /// a lock's or a latch's, written by an acquire of another kind.
    #[serde(default)]
    pub other_fields: Vec<String>,
    /// The number of permits the clients set (`--sem-permits`); `None` in older histories.
    #[serde(default)]
    pub expected_permits: Option<i64>,
}

impl SemaphoreLeft {
    /// Permits still leased (a lease that outlived every client and the wait for every TTL),
    /// or bookkeeping that does not add up: `~used` against the acquisitions' permits, an
    /// acquisition without a lease, a lease without an acquisition.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let listed: i64 = self.held.iter().map(|(_, n, _)| n).sum();
        if listed != self.used {
            problems.push(format!(
                "{}: ~used is {} but the acquisitions listed hold {listed}",
                self.name, self.used
            ));
        }
        for (id, n, left) in &self.held {
            match left {
                Some(ms) if *ms > 0 => problems.push(format!(
                    "{}: {id} still holds {n} permits for {ms} ms after the clients stopped",
                    self.name
                )),
                Some(_) => {}
                None => problems.push(format!(
                    "{}: {id} holds {n} permits with no lease",
                    self.name
                )),
            }
        }
        if self.leases_without_permits > 0 {
            problems.push(format!(
                "{}: {} leases without permits",
                self.name, self.leases_without_permits
            ));
        }
        // The number is configuration: no TTL, and still what the clients set (their ticker
        // sets it again within 250 ms of a loss, and no fault starts in the run's last 2 s).
        if let Some(pttl) = self.pttl.filter(|&ms| ms != -1) {
            problems.push(format!(
                "{}: the semaphore's hash has PTTL {pttl} (it must have no TTL)",
                self.name
            ));
        }
        if let Some(expected) = self.expected_permits {
            if self.permits != Some(expected) {
                problems.push(format!(
                    "{}: ~permits is {:?}, the clients set {expected}",
                    self.name, self.permits
                ));
            }
        }
        for field in &self.other_fields {
            problems.push(format!(
                "{}: field {field:?} is not a semaphore's",
                self.name
            ));
        }
        problems
    }

    /// Expired permits still listed (given back by the next call on the semaphore).
    pub fn expired(&self) -> usize {
        self.held
            .iter()
            .filter(|(_, _, left)| left.is_some_and(|ms| ms <= 0))
            .count()
    }
}

/// What a name is used as. One name is always one kind (the kinds share their keys and read
/// each other's fields differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockType {
    /// `client.lock`: `res-<i>`.
    Plain,
    /// `client.fair_lock`: `fair-<i>`.
    Fair,
    /// `client.rw_lock`: `rw-<i>`.
    ReadWrite,
    /// `client.semaphore`: `sem-<i>`.
    Semaphore,
    /// `client.latch`: `latch-<i>`.
    Latch,
}

/// How the resources of a run are numbered: the plain locks first, then the fair locks, the
/// read/write locks and the semaphores, each kind numbered from 0 in its own names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub plain: u32,
    pub fair: u32,
    pub rw: u32,
    pub sem: u32,
    pub latch: u32,
}

impl Layout {
    pub fn of(config: &RunConfig) -> Layout {
        Layout {
            plain: config.resources,
            fair: config.fair_resources,
            rw: config.rw_resources,
            sem: config.sem_resources,
            latch: config.latch_resources,
        }
    }

    /// Every resource: `0..total()`.
    pub fn total(&self) -> u32 {
        self.plain + self.fair + self.rw + self.sem + self.latch
    }

    /// The first resource of each kind, with its count.
    fn ranges(&self) -> [(LockType, u32, u32); 5] {
        let fair = self.plain;
        let rw = fair + self.fair;
        let sem = rw + self.rw;
        let latch = sem + self.sem;
        [
            (LockType::Plain, 0, self.plain),
            (LockType::Fair, fair, self.fair),
            (LockType::ReadWrite, rw, self.rw),
            (LockType::Semaphore, sem, self.sem),
            (LockType::Latch, latch, self.latch),
        ]
    }

    /// The resources of kind `ty`.
    pub fn of_type(&self, ty: LockType) -> std::ops::Range<u32> {
        self.ranges()
            .into_iter()
            .find(|(t, _, _)| *t == ty)
            .map_or(0..0, |(_, first, count)| first..first + count)
    }

    /// The first resource of kind `ty`.
    pub fn first(&self, ty: LockType) -> u32 {
        self.ranges()
            .into_iter()
            .find(|(t, _, _)| *t == ty)
            .map_or(0, |(_, first, _)| first)
    }

    /// The kind of resource `res` (past the end: a latch, as numbered).
    pub fn lock_type(&self, res: u32) -> LockType {
        self.ranges()
            .into_iter()
            .find(|(_, first, count)| res >= *first && res < first + count)
            .map_or(LockType::Latch, |(ty, _, _)| ty)
    }

    /// The name of resource `res`: `res-<i>`, `fair-<i>`, `rw-<i>` or `sem-<i>`.
    pub fn name(&self, res: u32) -> String {
        let ty = self.lock_type(res);
        let i = res - self.first(ty);
        match ty {
            LockType::Plain => format!("res-{i}"),
            LockType::Fair => format!("fair-{i}"),
            LockType::ReadWrite => format!("rw-{i}"),
            LockType::Semaphore => format!("sem-{i}"),
            LockType::Latch => format!("latch-{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names() {
        let layout = Layout {
            plain: 3,
            fair: 1,
            rw: 2,
            sem: 1,
            latch: 1,
        };
        assert_eq!(layout.name(0), "res-0");
        assert_eq!(layout.name(2), "res-2");
        assert_eq!(layout.name(3), "fair-0");
        assert_eq!(layout.name(4), "rw-0");
        assert_eq!(layout.name(5), "rw-1");
        assert_eq!(layout.name(6), "sem-0");
        assert_eq!(layout.name(7), "latch-0");
        assert_eq!(layout.total(), 8);
        assert_eq!(layout.of_type(LockType::ReadWrite), 4..6);
        assert_eq!(layout.lock_type(3), LockType::Fair);
        assert_eq!(layout.lock_type(2), LockType::Plain);
        assert_eq!(layout.lock_type(5), LockType::ReadWrite);
        assert_eq!(layout.first(LockType::Semaphore), 6);
        // No fair locks: the read/write locks follow the plain ones.
        let layout = Layout {
            plain: 1,
            fair: 0,
            rw: 1,
            sem: 0,
            latch: 0,
        };
        assert_eq!(layout.name(1), "rw-0");
    }
}
