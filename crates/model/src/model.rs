//! The model: which steps are possible in a state, and what each does.
//!
//! Redis steps run the scripts atomically ([`crate::lua`]). Client steps follow the waiting
//! engine's documented steps (`src/wait.rs`: join the local queue, try, register interest,
//! sleep until a wake-up, the busy time or the deadline) and the notifier's handling of each
//! message (`crates/pubsub`). A try is one step: the script runs and its reply is read
//! together; a message published meanwhile is delivered after the reply, which is what the
//! engine's epoch and `Notify` permit make equivalent to delivery during the try.
//!
//! Time: a client that has something to do does it before the clock moves (scripts, replies,
//! subscribing and message delivery take less than the model's millisecond); the clock then
//! jumps to the next instant something is due (a timer, a standby, a key's expiry), never past
//! the horizon. Holders release, and faults strike, at any point.

use std::collections::VecDeque;

use leasehold_core::{LockKeys, Prefix};
use stateright::{Model, Property};

use crate::config::{Config, Kind, Variant};
use crate::lua::{self, Ran};
use crate::redis::{Call, Reply};
use crate::scripts::ModelScripts;
use crate::state::{Broken, Budget, Client, Ghost, Msg, Phase, State, Waiter};

/// The slack of the no-sleeping-on-a-free-lock bound: the engine wakes 1 ms after a busy time
/// (PTTL rounds down) and a standby 2 ms after the grace.
pub const FREE_LOCK_SLACK_MS: u64 = 2;

/// One step of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A waiter calls `lock()`: it joins its client's local queue (and, as its head, tries
    /// at once).
    Lock { client: u8, waiter: u8 },
    /// The head registers interest (subscribes the release channel), then tries at once.
    Subscribe { client: u8, waiter: u8 },
    /// A sleeping head wakes on a permit (a message, a standby, or a resync) and tries.
    Wake { client: u8, waiter: u8 },
    /// A sleeping head's timer fires: it tries (or sleeps on to an announced lease).
    Timer { client: u8, waiter: u8 },
    /// A client's standby (after another client's turn message) fires.
    Standby { client: u8 },
    /// The next message reaches a client.
    Deliver { client: u8 },
    /// A holder releases (release.lua).
    Release { client: u8, waiter: u8 },
    /// The watchdog renews a hold (renew.lua).
    Renew { client: u8, waiter: u8 },
    /// A waiting waiter gives up (its future is dropped).
    Cancel { client: u8, waiter: u8 },
    /// A cancelled client's background ZREM from the turn queue.
    LeaveQueue { client: u8 },
    /// Fair lock: a waiter calls `try_lock()` instead of `lock()`: one try, never queued.
    TryLock { client: u8, waiter: u8 },
    /// Fair lock: a cancelled waiter's background `fair/leave.lua`.
    LeaveLine { client: u8, waiter: u8 },
    /// Fair lock: the client's watchdog renews its waiters' entries that are due (renew.lua's
    /// queue-entry items, one call).
    RenewEntries { client: u8 },
    /// A client crashes: its holds and queue entry stay in Redis.
    Crash { client: u8 },
    /// A client's subscriber connection drops: undelivered messages are lost; on reconnect it
    /// wakes every head.
    LoseMessages { client: u8 },
    /// An operator force-unlocks the lock (force_unlock.lua).
    ForceUnlock,
    /// Redis restarts without its data (a millisecond passes); every subscriber reconnects.
    DataLoss,
    /// The clock moves to the next instant something is due.
    Tick { to: u64 },
}

impl Action {
    /// The client whose waiters this action may set trying.
    fn client(&self) -> Option<u8> {
        use Action::*;
        match *self {
            Lock { client, .. }
            | Subscribe { client, .. }
            | Wake { client, .. }
            | Timer { client, .. }
            | Cancel { client, .. }
            | Release { client, .. }
            | Standby { client }
            | Deliver { client } => Some(client),
            _ => None,
        }
    }
}

/// The model of one configuration.
pub struct LockModel {
    /// The bounds.
    pub config: Config,
    /// The scripts it runs.
    pub scripts: ModelScripts,
    keys: LockKeys,
}

/// What a step did besides changing the state: for the trace.
#[derive(Debug, Default)]
pub struct Note {
    /// The script or command run, and its reply.
    pub reply: Option<String>,
    /// Messages published.
    pub published: Vec<String>,
}

impl LockModel {
    /// The model of `config`.
    pub fn new(config: Config) -> LockModel {
        let scripts = ModelScripts::new(config.grace_ms, config.variant);
        let keys = LockKeys::new(&Prefix::default(), "x").expect("a valid name");
        LockModel {
            config,
            scripts,
            keys,
        }
    }

    /// The lock hash key.
    pub fn hash_key(&self) -> &str {
        self.keys.hash()
    }

    /// The fencing counter key.
    pub fn fence_key(&self) -> &str {
        self.keys.fence()
    }

    fn client_id(client: u8) -> String {
        format!("c{client}")
    }

    /// Owner ids: one per waiter (a task), the client's id first as in the real owner ids.
    fn owner(client: u8, waiter: u8) -> String {
        format!("c{client}w{waiter}")
    }

    /// Whether a client's waiters share one local FIFO (the plain lock). A fair lock's waiter
    /// is a line of its own (`Line::Own`): every waiter is its line's head.
    fn fifo(&self) -> bool {
        self.config.variant != Variant::PreF2Fix && !self.fair()
    }

    /// Whether the model runs the fair lock.
    pub fn fair(&self) -> bool {
        self.config.kind == Kind::Fair
    }

    /// The watchdog's renewal period: a third of its lease.
    fn renew_period(&self) -> u64 {
        (self.config.lease_ms / 3).max(1)
    }

    /// The fair lock's keys in `fair/acquire.lua`'s order (the release and leave scripts take
    /// the hash again in place of the fencing counter).
    fn fair_keys(&self, fence: bool) -> Vec<String> {
        vec![
            self.keys.hash().into(),
            if fence {
                self.keys.fence()
            } else {
                self.keys.hash()
            }
            .into(),
            self.keys.waiters(),
            self.keys.waiters_until(),
        ]
    }

    /// Whether this waiter talks to Redis now: the head of its local queue (or, without the
    /// local FIFO, any waiter that waits).
    fn is_head(&self, c: &Client, waiter: u8) -> bool {
        if self.fifo() {
            c.queue.front() == Some(&waiter)
        } else {
            c.queue.contains(&waiter)
        }
    }

    /// Runs a script at the state's time; publishes its messages.
    fn script(&self, s: &mut State, lua: &str, keys: Vec<String>, argv: Vec<String>) -> Ran {
        let ran = lua::run(lua, &keys, &argv, &mut s.redis, s.now);
        if let Reply::Error(e) = &ran.reply {
            s.ghost.broken.get_or_insert(Broken::ScriptError(e.clone()));
        }
        if let Some(command) = &ran.stopped_while_migrating {
            s.ghost.broken.get_or_insert(Broken::ScriptError(format!(
                "ERR Script attempted to access a non local key in a cluster node (while its \
                 slot migrates): {command}, a key the script emptied"
            )));
        }
        self.publish(s, &ran.published);
        ran
    }

    /// Hands published messages to every live client subscribed to the release channel.
    fn publish(&self, s: &mut State, published: &[(String, String)]) {
        let prefix = self.keys.waiter_channel_prefix();
        for (channel, payload) in published {
            if let Some(owner) = channel.strip_prefix(prefix.as_str()) {
                // A fair lock's waiter channel: only that waiter's client hears it, and only
                // once that waiter subscribed.
                let (client, waiter) = parse_owner(owner);
                let c = &mut s.clients[client as usize];
                if c.alive && c.waiters[waiter as usize].subscribed {
                    c.inbox.push_back(Msg::FreeFor(waiter));
                }
                continue;
            }
            if channel != self.keys.released() {
                continue;
            }
            let msg = match payload.as_str() {
                "*" => Msg::Free,
                p if p.starts_with('-') => Msg::Taken(p[1..].parse().unwrap_or(0)),
                p => Msg::Turn(p[1..].parse().expect("a model client id")),
            };
            for c in s.clients.iter_mut().filter(|c| c.alive && c.subscribed) {
                c.inbox.push_back(msg.clone());
            }
        }
    }

    /// Wakes the head (`Queue::wake_head`); without the local FIFO, every waiting waiter.
    fn wake_head(&self, c: &mut Client) {
        let heads: Vec<u8> = if self.fifo() {
            c.queue.front().copied().into_iter().collect()
        } else {
            c.queue.iter().copied().collect()
        };
        for w in heads {
            c.waiters[w as usize].permit = true;
        }
    }

    /// When a waiter becomes head: try at once, or with a busy hint (the waiter before it got
    /// the lock) sleep for a wake-up when subscribed, else subscribe first (`wait_for`).
    fn start_head(&self, c: &mut Client, waiter: u8, hint: Option<u64>, now: u64) {
        let epoch = c.epoch;
        let phase = match hint {
            Some(busy) if c.subscribed => self.sleep_phase(c, Some(busy as i64), epoch, now, false),
            Some(_) => Phase::Subscribe,
            None => Phase::Try,
        };
        c.waiters[waiter as usize].phase = phase;
    }

    /// `Wait::sleep`: until the busy time + 1 ms (no bound: 1 s), shortened to an announced
    /// lease taken after `since`.
    fn sleep_phase(
        &self,
        c: &Client,
        busy: Option<i64>,
        since: u32,
        now: u64,
        short: bool,
    ) -> Phase {
        let mut wake_at = now + busy.filter(|b| *b >= 0).map_or(1000, |b| b as u64 + 1);
        if let Some((at, until)) = c.taken {
            if at > since {
                wake_at = wake_at.min(until + 1);
            }
        }
        Phase::Sleep {
            wake_at,
            since,
            short,
        }
    }

    /// Takes `waiter` out of its client's local queue; the next head is promoted with `hint`.
    /// Returns whether the queue is now empty.
    fn leave_queue(&self, c: &mut Client, waiter: u8, hint: Option<u64>, now: u64) -> bool {
        let was_head = c.queue.front() == Some(&waiter);
        c.queue.retain(|w| *w != waiter);
        c.waiters[waiter as usize].permit = false;
        if self.fifo() && was_head {
            if let Some(&next) = c.queue.front() {
                self.start_head(c, next, hint, now);
            }
        }
        c.queue.is_empty()
    }

    /// A step, and what it did (for the trace).
    pub fn step(&self, last: &State, action: &Action) -> (State, Note) {
        let mut s = last.clone();
        let mut note = Note::default();
        let now = s.now;
        match *action {
            Action::Lock { client, waiter } => {
                let c = &mut s.clients[client as usize];
                c.queue.push_back(waiter);
                let head = self.is_head(c, waiter);
                c.waiters[waiter as usize].phase = if head { Phase::Try } else { Phase::Queued };
            }
            Action::Subscribe { client, waiter } => {
                let c = &mut s.clients[client as usize];
                c.subscribed = true;
                c.waiters[waiter as usize].subscribed = true;
                c.waiters[waiter as usize].phase = Phase::Try;
            }
            Action::Wake { client, waiter } => {
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                w.permit = false;
                w.phase = Phase::Try;
            }
            Action::Timer { client, waiter } => {
                let c = &mut s.clients[client as usize];
                let Phase::Sleep { since, short, .. } = c.waiters[waiter as usize].phase else {
                    unreachable!("a timer of a sleeper")
                };
                // `sleep_while_busy`: a short busy time (a reservation) whose taker announced
                // its lease: sleep on until that hold could end.
                let rest = c
                    .taken
                    .filter(|(at, until)| *at > since && *until > now)
                    .map(|(_, until)| until);
                c.waiters[waiter as usize].phase = match rest {
                    Some(until) if short => Phase::Sleep {
                        wake_at: until + 1,
                        since,
                        short: false,
                    },
                    _ => Phase::Try,
                };
            }
            Action::Standby { client } => {
                let c = &mut s.clients[client as usize];
                let (epoch, _) = c.standby.take().expect("a standby");
                if c.epoch == epoch {
                    self.wake_head(c);
                }
            }
            Action::Deliver { client } => self.deliver(&mut s, client),
            Action::Release { client, waiter } => {
                let ran = if self.fair() {
                    self.script(
                        &mut s,
                        &self.scripts.fair_release,
                        self.fair_keys(false),
                        vec![
                            Self::owner(client, waiter),
                            self.keys.waiter_channel_prefix(),
                        ],
                    )
                } else {
                    self.script(
                        &mut s,
                        &self.scripts.release,
                        vec![self.keys.hash().into(), self.keys.queue().into()],
                        vec![Self::owner(client, waiter), self.keys.released().into()],
                    )
                };
                let script = if self.fair() {
                    "fair/release.lua"
                } else {
                    "release.lua"
                };
                note.reply = Some(format!("{script} -> {}", ran.reply));
                note.published = ran.published.iter().map(|(_, p)| p.clone()).collect();
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                w.cycles -= 1;
                w.phase = if w.cycles > 0 {
                    Phase::Idle
                } else {
                    Phase::Done
                };
            }
            Action::Renew { client, waiter } => {
                let Phase::Hold { token, .. } =
                    s.clients[client as usize].waiters[waiter as usize].phase
                else {
                    unreachable!("a renewal of a hold")
                };
                let ran = self.script(
                    &mut s,
                    &self.scripts.renew,
                    vec![self.keys.hash().into()],
                    vec![
                        self.config.lease_ms.to_string(),
                        Self::owner(client, waiter),
                        token.to_string(),
                    ],
                );
                note.reply = Some(format!("renew.lua -> {}", ran.reply));
                let renewed = ran.reply == Reply::Array(vec![Reply::Int(1)]);
                if renewed && s.ghost.revoked.contains(&token) {
                    s.ghost.broken.get_or_insert(Broken::Revived {
                        client,
                        waiter,
                        token,
                    });
                }
                let lease = self.config.lease_ms;
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                if let Phase::Hold {
                    until,
                    renewals,
                    lost,
                    ..
                } = &mut w.phase
                {
                    *renewals -= 1;
                    if renewed {
                        *until = now + lease;
                    } else {
                        *lost = true;
                    }
                }
            }
            Action::Cancel { client, waiter } => {
                s.budget.cancels -= 1;
                let fair = self.fair();
                let c = &mut s.clients[client as usize];
                let empty = self.leave_queue(c, waiter, None, now);
                let w = &mut c.waiters[waiter as usize];
                w.phase = Phase::Done;
                if fair {
                    // `Wait::drop` with an own entry: the leave script goes out in the
                    // background, subscribed or not; the watchdog stops renewing the entry.
                    w.leaving = true;
                    w.renew_at = None;
                } else if empty && c.subscribed {
                    c.leaving = true;
                }
            }
            Action::TryLock { client, waiter } => {
                s.budget.tries -= 1;
                self.try_fair(&mut s, client, waiter, &mut note, false);
            }
            Action::LeaveLine { client, waiter } => {
                s.clients[client as usize].waiters[waiter as usize].leaving = false;
                let ran = self.script(
                    &mut s,
                    &self.scripts.fair_leave,
                    self.fair_keys(false),
                    vec![
                        Self::owner(client, waiter),
                        self.keys.waiter_channel_prefix(),
                    ],
                );
                note.reply = Some(format!("fair/leave.lua -> {}", ran.reply));
                note.published = ran.published.iter().map(|(_, p)| p.clone()).collect();
            }
            Action::RenewEntries { client } => {
                let period = self.renew_period();
                let due: Vec<u8> = s.clients[client as usize]
                    .waiters
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| w.renew_at.is_some_and(|at| at <= now))
                    .map(|(i, _)| i as u8)
                    .collect();
                let mut keys = Vec::new();
                let mut argv = vec![self.config.lease_ms.to_string()];
                for &w in &due {
                    keys.extend([self.keys.waiters(), self.keys.waiters_until()]);
                    argv.extend([Self::owner(client, w), String::new()]);
                }
                let ran = self.script(&mut s, &self.scripts.renew, keys, argv);
                note.reply = Some(format!("renew.lua (entries {due:?}) -> {}", ran.reply));
                let renewed = match &ran.reply {
                    Reply::Array(items) => items.iter().map(|r| *r == Reply::Int(1)).collect(),
                    _ => vec![false; due.len()],
                };
                let lease = self.config.lease_ms;
                for (&w, ok) in due.iter().zip(renewed) {
                    let w = &mut s.clients[client as usize].waiters[w as usize];
                    w.renew_at = Some(now + period);
                    if ok {
                        w.entry_until = Some(now + lease);
                    }
                }
            }
            Action::LeaveQueue { client } => {
                s.clients[client as usize].leaving = false;
                let mut published = Vec::new();
                let reply = s.redis.execute(
                    &[
                        "ZREM".into(),
                        self.keys.queue().into(),
                        Self::client_id(client),
                    ],
                    &mut Call {
                        now,
                        published: &mut published,
                    },
                );
                note.reply = Some(format!("ZREM queue c{client} -> {reply}"));
            }
            Action::Crash { client } => {
                s.budget.crashes -= 1;
                let c = &mut s.clients[client as usize];
                c.alive = false;
                c.inbox.clear();
                c.queue.clear();
                c.standby = None;
                c.leaving = false;
                for w in &mut c.waiters {
                    w.phase = Phase::Done;
                    w.permit = false;
                    w.leaving = false;
                    w.renew_at = None;
                }
            }
            Action::LoseMessages { client } => {
                s.budget.losses -= 1;
                let c = &mut s.clients[client as usize];
                c.inbox.clear();
                c.inbox.push_back(Msg::Resync);
            }
            Action::ForceUnlock => {
                s.budget.force_unlocks -= 1;
                self.revoke(&mut s);
                let prefix = self.keys.waiter_channel_prefix();
                let ran = self.script(
                    &mut s,
                    &self.scripts.force_unlock,
                    vec![
                        self.keys.hash().into(),
                        self.keys.hash().into(),
                        self.keys.waiters(),
                        self.keys.waiters_until(),
                        self.keys.leases(),
                    ],
                    vec![self.keys.released().into(), prefix, String::new()],
                );
                note.reply = Some(format!("force_unlock.lua -> {}", ran.reply));
                note.published = ran.published.iter().map(|(_, p)| p.clone()).collect();
            }
            Action::DataLoss => {
                s.budget.data_losses -= 1;
                self.revoke(&mut s);
                if s.redis.keys.contains_key(self.keys.hash()) {
                    s.ghost.free_silently_since = Some(now + 1);
                }
                s.redis.keys.clear();
                s.now += 1;
                for c in s.clients.iter_mut().filter(|c| c.alive && c.subscribed) {
                    c.inbox.clear();
                    c.inbox.push_back(Msg::Resync);
                }
            }
            Action::Tick { to } => {
                s.now = to;
                let gone = s.redis.expire_until(to);
                if gone.iter().any(|k| k == self.keys.hash()) {
                    s.ghost.free_silently_since = Some(to);
                }
            }
        }
        // A waiter that is to try does so in the same step: waking (or joining, or
        // subscribing) and the try it leads to are one step of the model.
        if let Some(client) = action.client() {
            while let Some(waiter) = s.clients[client as usize]
                .waiters
                .iter()
                .position(|w| w.phase == Phase::Try)
            {
                if s.ghost.broken.is_some() {
                    break;
                }
                if self.fair() {
                    self.try_fair(&mut s, client, waiter as u8, &mut note, true);
                } else {
                    self.try_lock(&mut s, client, waiter as u8, &mut note);
                }
            }
        }
        if s.redis.keys.contains_key(self.keys.hash()) {
            s.ghost.free_silently_since = None;
        }
        (s, note)
    }

    /// Force unlock and data loss end the current grant without its lease running out.
    fn revoke(&self, s: &mut State) {
        let token = match s.redis.keys.get(self.keys.hash()).map(|e| &e.data) {
            Some(crate::redis::Data::Hash(h)) => h.get("~fence").and_then(|t| t.parse().ok()),
            _ => None,
        };
        if let Some(token) = token {
            if !s.ghost.revoked.contains(&token) {
                s.ghost.revoked.push(token);
            }
        }
    }

    /// The client's reservation, if the lock hash is a turn reservation.
    fn reserved_for(&self, s: &State) -> Option<String> {
        match s.redis.keys.get(self.keys.hash()).map(|e| &e.data) {
            Some(crate::redis::Data::Hash(h)) => h
                .keys()
                .find_map(|f| f.strip_prefix("~turn:"))
                .map(str::to_string),
            _ => None,
        }
    }

    /// One try (`wait_for`'s loop body): acquire.lua as a plain try or, subscribed, as a
    /// waiter (`commands::acquire`'s arguments), then the engine's reaction to the reply.
    fn try_lock(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note) {
        let now = s.now;
        let c = &s.clients[client as usize];
        let as_waiter = c.subscribed;
        let more = c.queue.len() > 1;
        let epoch = c.epoch;
        let mut keys = vec![self.keys.hash().to_string(), self.keys.fence().to_string()];
        let mut argv = vec![
            Self::owner(client, waiter),
            self.config.lease_ms.to_string(),
        ];
        if as_waiter {
            keys.push(self.keys.queue().into());
            argv.extend([
                "w".into(),
                Self::client_id(client),
                if more { "1" } else { "0" }.into(),
                self.keys.released().into(),
            ]);
        }
        let reserved = self.reserved_for(s);
        let ran = self.script(s, &self.scripts.acquire, keys, argv);
        let said = format!(
            "c{client}w{waiter} acquire.lua{} -> {}",
            if as_waiter { " (waiter)" } else { "" },
            ran.reply
        );
        note.reply = Some(match note.reply.take() {
            Some(before) => format!("{before}; {said}"),
            None => said,
        });
        note.published
            .extend(ran.published.iter().map(|(_, p)| p.clone()));
        let granted = match &ran.reply {
            Reply::Bulk(t) => t.parse::<u64>().ok(),
            Reply::Int(t) => Some(*t as u64),
            _ => None,
        };
        let c = &mut s.clients[client as usize];
        match (granted, &ran.reply) {
            (Some(token), _) => {
                if token <= s.ghost.last_fence {
                    s.ghost.broken.get_or_insert(Broken::FenceRegressed {
                        granted: token,
                        before: s.ghost.last_fence,
                    });
                }
                s.ghost.last_fence = s.ghost.last_fence.max(token);
                if let Some(r) = reserved.filter(|r| *r != Self::client_id(client)) {
                    s.ghost.broken.get_or_insert(Broken::TurnTaken {
                        client,
                        reserved_for: r,
                    });
                }
                if let Some(&ahead) = c.queue.front().filter(|w| **w != waiter) {
                    s.ghost.broken.get_or_insert(Broken::ClientFifo {
                        client,
                        waiter,
                        ahead,
                    });
                }
                self.leave_queue(c, waiter, Some(self.config.lease_ms), now);
                c.waiters[waiter as usize].phase = Phase::Hold {
                    token,
                    until: now + self.config.lease_ms,
                    renewals: self.config.renewals,
                    lost: false,
                };
            }
            (None, Reply::Array(items)) if items.first() == Some(&Reply::Int(0)) => {
                let busy = match items.get(1) {
                    Some(Reply::Int(ms)) => Some(*ms),
                    _ => None,
                };
                c.waiters[waiter as usize].phase = if as_waiter {
                    let short = busy.is_some_and(|b| b >= 0 && b as u64 <= self.config.grace_ms);
                    self.sleep_phase(c, busy, epoch, now, short)
                } else {
                    // A release before the subscription reached nobody: subscribe, then try
                    // again at once as a waiter.
                    Phase::Subscribe
                };
            }
            _ => {
                // An error (already recorded as broken) or a re-entry reply: stop this waiter.
                self.leave_queue(c, waiter, None, now);
                c.waiters[waiter as usize].phase = Phase::Done;
            }
        }
    }

    /// One try of a fair lock's waiter (`wait_for` with `Line::Own`, `LockAttempt::try_once`'s
    /// `FairWaiter` mode): every try of a waiting acquire is `fair/acquire.lua` in mode 'w',
    /// subscribed or not, with `kind_acquire`'s arguments. Busy: the first busy try queued the
    /// owner (the watchdog renews its entry from then on); unsubscribed, it subscribes its own
    /// channel and tries again at once; subscribed, it sleeps until its message or the bound.
    ///
    /// With `wait` false it is `try_lock` instead (`AcquireMode::Try`: mode 't', entry life 0):
    /// one try that never queues; not granted, the call ends (one cycle done).
    fn try_fair(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note, wait: bool) {
        let now = s.now;
        let owner = Self::owner(client, waiter);
        let subscribed = s.clients[client as usize].waiters[waiter as usize].subscribed;
        let epoch = s.clients[client as usize].epoch;
        // Arrivals before the script, for the order the grant must respect.
        let arrivals: Vec<(String, f64)> = match s.redis.keys.get(&self.keys.waiters()) {
            Some(e) => match &e.data {
                crate::redis::Data::ZSet(z) => z.iter().map(|(k, v)| (k.clone(), v.0)).collect(),
                _ => Vec::new(),
            },
            None => Vec::new(),
        };
        let reserved = self.reserved_for(s);
        let mode = if wait { "w" } else { "t" };
        let argv = vec![
            owner.clone(),
            self.config.lease_ms.to_string(),
            mode.into(),
            String::new(),
            self.keys.waiter_channel_prefix(),
            if wait { self.config.lease_ms } else { 0 }.to_string(),
            String::new(),
        ];
        let ran = self.script(s, &self.scripts.fair_acquire, self.fair_keys(true), argv);
        let said = format!("{owner} fair/acquire.lua ({mode}) -> {}", ran.reply);
        if !wait {
            let queued = match s.redis.keys.get(&self.keys.waiters()).map(|e| &e.data) {
                Some(crate::redis::Data::ZSet(z)) => z.contains_key(&owner),
                _ => false,
            };
            if queued {
                s.ghost
                    .broken
                    .get_or_insert(Broken::TryQueued { client, waiter });
            }
        }
        note.reply = Some(match note.reply.take() {
            Some(before) => format!("{before}; {said}"),
            None => said,
        });
        note.published
            .extend(ran.published.iter().map(|(_, p)| p.clone()));
        let granted = match &ran.reply {
            Reply::Bulk(t) => t.parse::<u64>().ok(),
            Reply::Int(t) => Some(*t as u64),
            _ => None,
        };
        match (granted, &ran.reply) {
            (Some(token), _) => {
                if token <= s.ghost.last_fence {
                    s.ghost.broken.get_or_insert(Broken::FenceRegressed {
                        granted: token,
                        before: s.ghost.last_fence,
                    });
                }
                s.ghost.last_fence = s.ghost.last_fence.max(token);
                if let Some(r) = reserved.filter(|r| *r != owner) {
                    s.ghost.broken.get_or_insert(Broken::TurnTaken {
                        client,
                        reserved_for: r,
                    });
                }
                // FIFO by arrival: no live waiter that arrived earlier (and still has that
                // arrival) waits on. A grantee without an entry arrived now, after everyone.
                let mine = arrivals
                    .iter()
                    .find(|(o, _)| *o == owner)
                    .map_or(f64::INFINITY, |(_, a)| *a);
                let earlier = arrivals.iter().find(|(o, a)| {
                    *a < mine && *o != owner && {
                        let (c, w) = parse_owner(o);
                        let oc = &s.clients[c as usize];
                        oc.alive
                            && matches!(
                                oc.waiters[w as usize].phase,
                                Phase::Queued | Phase::Try | Phase::Subscribe | Phase::Sleep { .. }
                            )
                    }
                });
                if let Some((earlier, _)) = earlier {
                    s.ghost.broken.get_or_insert(Broken::ArrivalOrder {
                        client,
                        waiter,
                        earlier: earlier.clone(),
                    });
                }
                let c = &mut s.clients[client as usize];
                self.leave_queue(c, waiter, None, now);
                let w = &mut c.waiters[waiter as usize];
                w.renew_at = None;
                w.entry_until = None;
                w.phase = Phase::Hold {
                    token,
                    until: now + self.config.lease_ms,
                    renewals: self.config.renewals,
                    lost: false,
                };
            }
            (None, Reply::Array(items)) if !wait && items.first() == Some(&Reply::Int(0)) => {
                // try_lock answered None: this call is over.
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                w.cycles -= 1;
                w.phase = if w.cycles > 0 {
                    Phase::Idle
                } else {
                    Phase::Done
                };
            }
            (None, Reply::Array(items)) if items.first() == Some(&Reply::Int(0)) => {
                let busy = match items.get(1) {
                    Some(Reply::Int(ms)) => Some(*ms),
                    _ => None,
                };
                let period = self.renew_period();
                let lease = self.config.lease_ms;
                let c = &mut s.clients[client as usize];
                let phase = if subscribed {
                    let short = busy.is_some_and(|b| b >= 0 && b as u64 <= self.config.grace_ms);
                    self.sleep_phase(c, busy, epoch, now, short)
                } else {
                    Phase::Subscribe
                };
                let w = &mut c.waiters[waiter as usize];
                // The try queued the owner (or kept its place) with a deadline now + lease.
                w.entry_until = Some(now + lease);
                w.renew_at.get_or_insert(now + period);
                w.phase = phase;
            }
            _ => {
                let c = &mut s.clients[client as usize];
                self.leave_queue(c, waiter, None, now);
                c.waiters[waiter as usize].phase = Phase::Done;
                c.waiters[waiter as usize].renew_at = None;
            }
        }
    }

    /// `on_message`: one release-channel message reaches a client.
    fn deliver(&self, s: &mut State, client: u8) {
        let now = s.now;
        let grace = self.config.grace_ms;
        let c = &mut s.clients[client as usize];
        let msg = c.inbox.pop_front().expect("a message");
        if msg == Msg::Resync {
            self.wake_head(c);
            return;
        }
        c.epoch += 1;
        let epoch = c.epoch;
        match msg {
            Msg::Taken(lease) => {
                c.taken = Some((epoch, now + lease));
                // A sleeping head re-reads `taken_since` and shortens its timer.
                for w in &mut c.waiters {
                    if let Phase::Sleep { wake_at, since, .. } = &mut w.phase {
                        if epoch > *since {
                            *wake_at = (*wake_at).min(now + lease + 1);
                        }
                    }
                }
            }
            Msg::Free => self.wake_head(c),
            Msg::FreeFor(w) => {
                // The waiter's own line: its head (itself, while it waits) is woken.
                if c.queue.contains(&w) {
                    c.waiters[w as usize].permit = true;
                }
            }
            Msg::Turn(id) if id == client => self.wake_head(c),
            Msg::Turn(_) => {
                if !c.queue.is_empty() {
                    c.standby = Some((epoch, now + grace + 2));
                }
            }
            Msg::Resync => unreachable!(),
        }
    }

    /// Whether a client has work that must happen before the clock moves.
    fn urgent(&self, s: &State) -> bool {
        s.clients.iter().filter(|c| c.alive).any(|c| {
            !c.inbox.is_empty()
                || c.leaving
                || c.standby.is_some_and(|(_, at)| at <= s.now)
                || c.waiters
                    .iter()
                    .any(|w| w.leaving || w.renew_at.is_some_and(|at| at <= s.now))
                || c.waiters.iter().any(|w| match w.phase {
                    Phase::Try | Phase::Subscribe => true,
                    Phase::Sleep { wake_at, .. } => wake_at <= s.now || w.permit,
                    _ => false,
                })
        })
    }

    /// The next instant something is due: a timer, a standby, a key's expiry, a lease's end.
    fn next_due(&self, s: &State) -> Option<u64> {
        let mut due: Vec<u64> = Vec::new();
        for c in s.clients.iter().filter(|c| c.alive) {
            due.extend(c.standby.map(|(_, at)| at));
            for w in &c.waiters {
                due.extend(w.renew_at);
                match w.phase {
                    Phase::Sleep { wake_at, .. } => due.push(wake_at),
                    Phase::Hold { until, .. } => due.push(until),
                    _ => {}
                }
            }
        }
        due.extend(
            s.redis
                .keys
                .values()
                .filter_map(|e| e.expires_at.map(|at| at + 1)),
        );
        if let Some(since) = s.ghost.free_silently_since {
            due.push(since + FREE_LOCK_SLACK_MS + 1);
        }
        due.into_iter()
            .filter(|t| *t > s.now)
            .min()
            .map(|t| t.min(self.config.horizon_ms))
            .filter(|t| *t > s.now)
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.config;
        let client = Client {
            alive: true,
            subscribed: false,
            inbox: VecDeque::new(),
            epoch: 0,
            taken: None,
            standby: None,
            queue: VecDeque::new(),
            leaving: false,
            waiters: vec![
                Waiter {
                    phase: Phase::Idle,
                    cycles: cfg.cycles,
                    permit: false,
                    subscribed: false,
                    entry_until: None,
                    renew_at: None,
                    leaving: false,
                };
                cfg.waiters as usize
            ],
        };
        vec![State {
            now: 0,
            redis: Default::default(),
            clients: vec![client; cfg.clients as usize],
            budget: Budget {
                crashes: cfg.crashes,
                losses: cfg.losses,
                cancels: cfg.cancels,
                force_unlocks: cfg.force_unlocks,
                data_losses: cfg.data_losses,
                tries: cfg.tries,
            },
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.ghost.broken.is_some() {
            return; // the property reports it; nothing after matters
        }
        for (ci, c) in s.clients.iter().enumerate() {
            let client = ci as u8;
            if !c.alive {
                continue;
            }
            if !c.inbox.is_empty() {
                actions.push(Action::Deliver { client });
            }
            if c.standby.is_some_and(|(_, at)| at <= s.now) {
                actions.push(Action::Standby { client });
            }
            if c.leaving {
                actions.push(Action::LeaveQueue { client });
            }
            if c.waiters
                .iter()
                .any(|w| w.renew_at.is_some_and(|at| at <= s.now))
            {
                actions.push(Action::RenewEntries { client });
            }
            for (wi, w) in c.waiters.iter().enumerate() {
                let waiter = wi as u8;
                if w.leaving {
                    actions.push(Action::LeaveLine { client, waiter });
                }
                match w.phase {
                    Phase::Idle => {
                        actions.push(Action::Lock { client, waiter });
                        if self.fair() && s.budget.tries > 0 {
                            actions.push(Action::TryLock { client, waiter });
                        }
                    }
                    Phase::Subscribe => actions.push(Action::Subscribe { client, waiter }),
                    Phase::Sleep { wake_at, .. } => {
                        if w.permit {
                            actions.push(Action::Wake { client, waiter });
                        } else if wake_at <= s.now {
                            actions.push(Action::Timer { client, waiter });
                        }
                    }
                    Phase::Hold {
                        until,
                        renewals,
                        lost,
                        ..
                    } => {
                        actions.push(Action::Release { client, waiter });
                        if renewals > 0 && !lost && until > s.now {
                            actions.push(Action::Renew { client, waiter });
                        }
                    }
                    // A try happens within the step that led to it.
                    Phase::Try | Phase::Queued | Phase::Done => {}
                }
                let waiting = matches!(
                    w.phase,
                    Phase::Queued | Phase::Try | Phase::Subscribe | Phase::Sleep { .. }
                );
                if waiting && s.budget.cancels > 0 {
                    actions.push(Action::Cancel { client, waiter });
                }
            }
            let active = c
                .waiters
                .iter()
                .any(|w| w.phase != Phase::Done || w.leaving);
            if s.budget.crashes > 0 && active {
                actions.push(Action::Crash { client });
            }
            if s.budget.losses > 0 && c.subscribed && c.inbox.iter().any(|m| *m != Msg::Resync) {
                actions.push(Action::LoseMessages { client });
            }
        }
        if s.budget.force_unlocks > 0 && s.redis.keys.contains_key(self.keys.hash()) {
            actions.push(Action::ForceUnlock);
        }
        if s.budget.data_losses > 0 && s.redis.keys.contains_key(self.keys.hash()) {
            actions.push(Action::DataLoss);
        }
        if !self.urgent(s) {
            if let Some(to) = self.next_due(s) {
                actions.push(Action::Tick { to });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        Some(self.step(last, &action).0)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}

/// A model owner id `c<client>w<waiter>` as its indices.
fn parse_owner(owner: &str) -> (u8, u8) {
    let (c, w) = owner
        .strip_prefix('c')
        .and_then(|r| r.split_once('w'))
        .expect("a model owner id");
    (
        c.parse().expect("a client index"),
        w.parse().expect("a waiter index"),
    )
}
