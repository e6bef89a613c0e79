//! What one check explores: how many clients and waiters, which faults and how many of each,
//! the protocol's timing, and which code (shipped, or a fix reverted).

/// Which code the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Variant {
    /// The shipped scripts and the shipped waiting engine.
    Shipped,
    /// `acquire.lua` with the reserved-turn fix reverted (the shipped script tells a waiter that
    /// finds the lock reserved for another client's turn the reservation's remaining time): such
    /// a waiter is told its own lease instead (fixture `pre_f1_reserved_busy.lua`).
    PreF1Fix,
    /// The waiting engine without the local FIFO (the shipped engine queues a client's waiters
    /// locally, and one of them at a time talks to Redis): every waiter of a client talks to
    /// Redis on its own, and a release message wakes all of them.
    PreF2Fix,
    /// Fair lock mutant (not a past bug): `fair/acquire.lua` grants a free lock to whoever
    /// tries, even when others are first in line (its grant condition always true).
    FairLineJumped,
    /// Fair lock mutant (not a past bug): the hand-on never drops dead entries (their deadline
    /// is never reached), so a dead waiter keeps being handed turns.
    FairNoDeadSkip,
}

/// Which kind of lock the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Kind {
    /// The plain lock (`client.lock(name)`): `acquire.lua`, `release.lua`, a turn queue of
    /// clients, each client's waiters in a local FIFO on the shared release channel.
    Plain,
    /// The fair lock (`client.fair_lock(name)`): `fair/acquire.lua`, `fair/release.lua`,
    /// `fair/leave.lua`; every waiter has its own entry in the line (renewed by its client's
    /// watchdog) and its own channel.
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
    /// The lease in model milliseconds.
    pub lease_ms: u64,
    /// The turn grace in model milliseconds (filled into the scripts).
    pub grace_ms: u64,
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
            grace_ms: 2,
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
