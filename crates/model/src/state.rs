//! The model's state: Redis, the clients (their subscriber, local queue and waiters), the
//! clock, the faults still allowed, and ghost facts the properties read.

use std::collections::VecDeque;

use crate::redis::Redis;

/// One message on one of a client's channels, as its notifier receives it (`crates/pubsub`).
/// `own` is the channel: `None` the client's own (`P:{N}:released:<client id>`, the plain
/// lock's), `Some(w)` waiter `w`'s (`P:{N}:released:<owner id>`, the fair lock's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Msg {
    /// `*`: look again.
    Look { own: Option<u8> },
    /// `=<fence>:<lease ms>:<owner>`: the line granted the lock to that owner (a waiter of
    /// this client), with that lease from the moment it ran.
    Grant {
        own: Option<u8>,
        fence: u64,
        lease: u64,
        waiter: u8,
    },
    /// Not a message: the subscriber lost messages (reconnect, lagged) and wakes every head.
    Resync,
}

impl Msg {
    /// The channel it came on (`None` for a resync, which is every channel's).
    pub fn channel(&self) -> Option<Option<u8>> {
        match *self {
            Msg::Look { own } | Msg::Grant { own, .. } => Some(own),
            Msg::Resync => None,
        }
    }
}

/// Where a waiter is in the waiting engine (`src/wait.rs`), or in its guard's life.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not waiting: about to call `lock()` (cycles left) or done.
    Idle,
    /// In the local queue behind another waiter: waits to be promoted (`until_head`).
    Queued,
    /// The head, about to try: a plain try while the channel is not subscribed (the plain
    /// lock), a try in line once it is (and every try of the fair lock).
    Try,
    /// The head, about to register interest (subscribe), then try at once.
    Subscribe,
    /// The head, asleep until a wake-up or `wake_at` (its last busy try's bound + 1 ms).
    Sleep { wake_at: u64 },
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

impl Phase {
    /// Whether the waiter is in a wait (`lock()` has not returned).
    pub fn waiting(&self) -> bool {
        matches!(
            self,
            Phase::Queued | Phase::Try | Phase::Subscribe | Phase::Sleep { .. }
        )
    }
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
    /// Fair lock: the latest grant its own channel heard (token, lease, waiter named).
    pub granted: Option<(u64, u64, u8)>,
    /// This wait's last busy try in line: the holder's token it returned and when it was sent.
    /// A grant message with a larger token is for this wait (`LockAttempt::heard`).
    pub line_try: Option<(u64, u64)>,
    /// A try of this wait was answered busy in line: its owner has an entry in Redis.
    pub entered: bool,
    /// The deadline its entry in the line was last given (by a busy try in line or a renewal,
    /// `now + lease`): a dead waiter holds the line, or a grant of it, no longer than this.
    pub entry_until: Option<u64>,
    /// When its client's watchdog renews its entry next (every lease / 3 from its first busy
    /// try in line until its wait ends).
    pub renew_at: Option<u64>,
    /// A given-up wait's `line/leave.lua`, sent in the background, not yet run.
    pub leaving: bool,
}

/// One client (a process with one subscriber connection).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// False once crashed.
    pub alive: bool,
    /// Some channel of this client is subscribed; for the plain lock, the client's channel.
    pub subscribed: bool,
    /// Published, not yet delivered messages, in publish order.
    pub inbox: VecDeque<Msg>,
    /// Plain lock: the latest grant the client's channel heard (token, lease, waiter named).
    pub granted: Option<(u64, u64, u8)>,
    /// The local FIFO of waiting waiters (indices), oldest first; its front is the head.
    pub queue: VecDeque<u8>,
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
    /// The highest fencing token a guard got so far.
    pub last_fence: u64,
    /// Tokens whose grant was ended by force unlock or data loss, not by its lease.
    pub revoked: Vec<u64>,
    /// Since when the lock has been free (no lock hash), however it became so.
    pub free_since: Option<u64>,
    /// The first violation a step itself detected (a property reads it).
    pub broken: Option<Broken>,
}

/// A violation seen while taking a step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Broken {
    /// A guard's token was not above every earlier guard's.
    FenceRegressed { granted: u64, before: u64 },
    /// A waiter got the lock while an earlier waiter of its client still waited.
    ClientFifo { client: u8, waiter: u8, ahead: u8 },
    /// A grant of the line went to an owner while a live waiter that arrived earlier (and kept
    /// its arrival) still waited.
    ArrivalOrder { granted: String, earlier: String },
    /// A waiter took a grant it heard of that Redis does not hold for it (nor was it ended by
    /// force unlock or data loss).
    HeardNotHeld { client: u8, waiter: u8, token: u64 },
    /// A grant the line made to a live waiter that still waited ran out before it took it.
    GrantLapsed { client: u8, waiter: u8 },
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
