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
    /// Watchdog lease of the clients' watched holds.
    pub lease: Duration,
    pub command_timeout: Duration,
    /// Self-test of the checker: clients claim to hold their lease whatever `is_held()` says
    /// (a client that ignores lease loss), so the checker must report overlaps.
    #[serde(default)]
    pub ignore_lease: bool,
    /// Self-test of the checker: half the fair-lock waiters put themselves at the head of the
    /// line before they acquire (as a lock that let callers jump the line would), so the
    /// checker must report grants past waiters.
    #[serde(default)]
    pub cut_in_line: bool,
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
}

/// The name of lock `res` when there are `plain` plain locks: `res-<i>` for `0..plain`, then
/// `fair-<i>` for the fair locks numbered after them.
pub fn lock_name(res: u32, plain: u32) -> String {
    if is_fair(res, plain) {
        format!("fair-{}", res - plain)
    } else {
        format!("res-{res}")
    }
}

/// Whether lock `res` is a fair lock (numbered after the `plain` plain ones).
pub fn is_fair(res: u32, plain: u32) -> bool {
    res >= plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names() {
        assert_eq!(lock_name(0, 3), "res-0");
        assert_eq!(lock_name(2, 3), "res-2");
        assert_eq!(lock_name(3, 3), "fair-0");
        assert!(is_fair(4, 3) && !is_fair(2, 3));
    }
}
