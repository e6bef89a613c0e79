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
    pub resources: u32,
    /// Watchdog lease of the clients' watched holds.
    pub lease: Duration,
    pub command_timeout: Duration,
    /// Self-test of the checker: clients claim to hold their lease whatever `is_held()` says
    /// (a client that ignores lease loss), so the checker must report overlaps.
    #[serde(default)]
    pub ignore_lease: bool,
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
