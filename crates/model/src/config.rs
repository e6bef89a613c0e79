//! What one check explores: how many clients and waiters, which faults and how many of each,
//! the protocol's timing, and which code (shipped, a proposed fix, or a mutant).

/// Which code the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Variant {
    /// The shipped scripts and the shipped waiting engine.
    Shipped,
    /// The waiting engine without the local FIFO (the shipped engine queues a client's waiters
    /// of the plain lock locally, and one of them at a time talks to Redis): every waiter of a
    /// client talks to Redis on its own, and a message on the client's channel wakes all of
    /// them.
    NoLocalFifo,
    /// The waiting engine taking a grant it heard without comparing its token with the
    /// holder's token its last busy try returned: a grant message of an earlier wait of the
    /// same owner passes for this wait's.
    StaleGrantTaken,
    /// `line/hand_on.lua` (inlined in release.lua, line/acquire.lua, line/leave.lua and
    /// force_unlock.lua) without the dead-entry drop: no entry's deadline is ever that early,
    /// so a dead head of the line is granted the lock.
    HandOnNoDeadDrop,
    /// `line/acquire.lua` that lets a waiter jump the line: a try that finds the lock free takes
    /// it whoever is first in line (no hand-on to the line's head, the grant condition always
    /// true).
    LineJumped,
    /// `line/leave.lua` with its first check as it first shipped (found by this model): it
    /// returned at once unless both line keys were sorted sets, so a waiter whose grant took
    /// the last entry out of the line (the line keys are gone) never passed that grant on.
    LeaveIgnoresEmptiedLine,
    /// `line/leave.lua` that forgets to pass on an untaken grant: a waiter that gives up after
    /// the line granted it the lock (before it heard of it) only takes its entry out.
    LeaveKeepsGrant,
    /// `release.lua` that never grants the line's head: the last hold always deletes the lock
    /// and publishes `*` on the release channel, which no waiter of the plain or fair lock
    /// listens to.
    ReleaseNoHandOn,
}

/// Which kind of lock the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Kind {
    /// The plain lock (`client.lock(name)`): `acquire.lua` for a waiter's first try,
    /// `line/acquire.lua` (client channels) for its later ones, `release.lua`,
    /// `line/leave.lua`; a client's waiters in a local FIFO whose head alone has an entry in
    /// the line, and hears on its client's channel.
    Plain,
    /// The fair lock (`client.fair_lock(name)`): `line/acquire.lua` (owner channels) for every
    /// try, `release.lua`, `line/leave.lua`; every waiter has its own entry in the line
    /// (renewed by its client's watchdog) and its own channel.
    Fair,
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Config {
    /// Clients (processes), each with its own id, subscriber and local queue.
    pub clients: u8,
    /// Waiters (tasks) per client, each a distinct owner.
    pub waiters: u8,
    /// Lock-and-unlock cycles per waiter.
    pub cycles: u8,
    /// The lease in model milliseconds (also the watchdog lease and a line entry's life).
    pub lease_ms: u64,
    /// The model clock does not pass this instant.
    pub horizon_ms: u64,
    /// At most this many client crashes.
    pub crashes: u8,
    /// At most this many subscriber connection drops (messages lost, then every head woken).
    pub losses: u8,
    /// At most this many cancelled waits.
    pub cancels: u8,
    /// At most this many force unlocks.
    pub force_unlocks: u8,
    /// At most this many Redis data losses (restart without persistence).
    pub data_losses: u8,
    /// Watchdog renewals per grant.
    pub renewals: u8,
    /// Fair lock: at most this many `try_lock` calls (each in place of a `lock()` cycle).
    pub tries: u8,
    /// Which code runs.
    pub variant: Variant,
    /// Which kind of lock.
    pub kind: Kind,
}

impl Config {
    /// The bound `just test` checks: two clients, faults one of each.
    pub fn small(variant: Variant) -> Config {
        Config {
            clients: 2,
            waiters: 2,
            cycles: 1,
            lease_ms: 10,
            horizon_ms: 40,
            crashes: 1,
            losses: 1,
            cancels: 1,
            force_unlocks: 0,
            data_losses: 0,
            renewals: 0,
            tries: 0,
            variant,
            kind: Kind::Plain,
        }
    }
}
