//! The model's state: Redis, the clients (their subscriber, local queue and waiters), the
//! clock, the faults still allowed, and ghost facts the properties read.

use std::collections::VecDeque;

use crate::redis::Redis;

/// One release-channel message as a client receives it (`crates/pubsub`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Msg {
    /// `*`: the lock is free.
    Free,
    /// A client id: the lock is reserved for that client's turn.
    Turn(u8),
    /// `-<ms>`: a queued client took its turn, with that lease.
    Taken(u64),
    /// A fair lock's `*` on one waiter's own channel (`P:{N}:released:<owner>`): the lock is
    /// reserved for that waiter (its index in the client).
    FreeFor(u8),
    /// Not a message: the subscriber lost messages (reconnect, lagged) and wakes every head.
    Resync,
}

/// Where a waiter is in the waiting engine (`src/wait.rs`), or in its guard's life.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not waiting: about to call `lock()` (cycles left) or done.
    Idle,
    /// In the local queue behind another waiter: waits to be promoted (`until_head`).
    Queued,
    /// The head, about to try (as a waiter when the channel is subscribed).
    Try,
    /// The head, about to register interest (subscribe), then try at once.
    Subscribe,
    /// The head, asleep until a wake-up, `wake_at`, or (`short`: the busy time was within the
    /// grace) a second sleep on an announced lease; `since` is the epoch of its try.
    Sleep {
        wake_at: u64,
        since: u32,
        short: bool,
    },
    /// Holds a grant: its token, the end of its lease as the client computes it, the watchdog
    /// renewals left, and whether a renewal found it gone.
    Hold {
        token: u64,
        until: u64,
        renewals: u8,
        lost: bool,
    },
    /// Finished: every cycle done, or the wait cancelled, or its client crashed.
    Done,
}

/// One waiter (a task: one owner id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// Where it is.
    pub phase: Phase,
    /// Lock cycles still to do (including the current one).
    pub cycles: u8,
    /// A wake-up that came while it was not asleep (tokio `Notify`'s permit).
    pub permit: bool,
    /// Fair lock: its own channel is subscribed (and stays so, as a lingering subscription).
    pub subscribed: bool,
    /// Fair lock: the deadline its entry in the line was last given (by a queueing try or a
    /// renewal, `now + lease`): a dead waiter holds the line no longer than this.
    pub entry_until: Option<u64>,
    /// Fair lock: when its client's watchdog renews its entry next (every lease / 3 from its
    /// first busy try until its wait ends).
    pub renew_at: Option<u64>,
    /// Fair lock: a cancelled wait's `fair/leave.lua`, sent in the background, not yet run.
    pub leaving: bool,
}

/// One client (a process with one subscriber connection).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// False once crashed.
    pub alive: bool,
    /// The release channel is subscribed (as far as Redis is concerned).
    pub subscribed: bool,
    /// Published, not yet delivered messages, in publish order.
    pub inbox: VecDeque<Msg>,
    /// Messages received so far (`Place::epoch`).
    pub epoch: u32,
    /// The latest "taken" message: its epoch and until when that hold lasts at most.
    pub taken: Option<(u32, u64)>,
    /// A pending standby after another client's turn message: its epoch and when it fires.
    pub standby: Option<(u32, u64)>,
    /// The local FIFO of waiting waiters (indices), oldest first; its front is the head.
    pub queue: VecDeque<u8>,
    /// A background ZREM of this client from the turn queue, sent by its last waiter's cancel.
    pub leaving: bool,
    /// The waiters.
    pub waiters: Vec<Waiter>,
}

/// The faults still allowed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Crashes left.
    pub crashes: u8,
    /// Subscriber connection drops left.
    pub losses: u8,
    /// Cancelled waits left.
    pub cancels: u8,
    /// Force unlocks left.
    pub force_unlocks: u8,
    /// Data losses left.
    pub data_losses: u8,
    /// Fair lock: `try_lock` calls left.
    pub tries: u8,
}

/// Facts about the history that the properties need and Redis does not keep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The highest fencing token granted so far.
    pub last_fence: u64,
    /// Tokens whose grant was ended by force unlock or data loss, not by its lease.
    pub revoked: Vec<u64>,
    /// Since when the lock has been free without a message (a hold or a reservation lapsed,
    /// or the data was lost).
    pub free_silently_since: Option<u64>,
    /// The first violation a step itself detected (a property reads it).
    pub broken: Option<Broken>,
}

/// A violation seen while taking a step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Broken {
    /// A grant's token was not above every earlier one.
    FenceRegressed { granted: u64, before: u64 },
    /// A waiter got the lock while an earlier waiter of its client still waited.
    ClientFifo { client: u8, waiter: u8, ahead: u8 },
    /// A grant went to another client while the lock was reserved for one's turn.
    TurnTaken { client: u8, reserved_for: String },
    /// Fair lock: a waiter got the lock while a live waiter that arrived earlier (and kept its
    /// arrival) still waited.
    ArrivalOrder {
        client: u8,
        waiter: u8,
        earlier: String,
    },
    /// Fair lock: a `try_lock` left its owner in the line.
    TryQueued { client: u8, waiter: u8 },
    /// A renewal extended a grant that had ended (the guard reports held again).
    Revived { client: u8, waiter: u8, token: u64 },
    /// A script answered an error.
    ScriptError(String),
}

/// The whole model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The model clock, milliseconds.
    pub now: u64,
    /// Redis's keyspace.
    pub redis: Redis,
    /// The clients.
    pub clients: Vec<Client>,
    /// Faults left.
    pub budget: Budget,
    /// History facts.
    pub ghost: Ghost,
}
