//! The model: which steps are possible in a state, and what each does.
//!
//! Redis steps run the scripts atomically ([`crate::lua`]). Client steps follow the waiting
//! engine's documented steps (`src/wait.rs`, `src/lock.rs`: join the local queue; as its head,
//! take a grant the channel heard, or try; register interest; sleep until a wake-up, the busy
//! bound or the deadline; give up) and the notifier's handling of each message
//! (`crates/pubsub`). A try is one step: the script runs and its reply is read together; a
//! message published meanwhile is delivered after the reply, which the holder's token the try
//! returns and the `Notify` permit make equivalent to delivery during the try.
//!
//! Time: a client that has something to do does it before the clock moves (scripts, replies,
//! subscribing, message delivery, background leaves and entry renewals take less than the
//! model's millisecond); the clock then jumps to the next instant something is due (a timer, a
//! renewal, a key's expiry, a lease's end), never past the horizon. Holders release, and faults
//! strike, at any point.

use std::collections::VecDeque;

use leasehold_core::protocol::{Message, FENCE_FIELD, GRANTED_FIELD};
use leasehold_core::{LockKeys, Prefix};
use stateright::{Model, Property};

use crate::config::{Config, Kind, Variant};
use crate::lua::{self, Ran};
use crate::redis::{Data, Reply};
use crate::scripts::ModelScripts;
use crate::state::{Broken, Budget, Client, Ghost, Msg, Phase, State, Waiter};

/// The slack of the no-sleeping-on-a-free-lock bound: the engine wakes 1 ms after a busy bound
/// (PTTL rounds down), and a grant made to a head lasts until its entry's deadline, which is
/// at least the bound its last busy try returned; 1 ms more is the key's expiry step.
pub const FREE_LOCK_SLACK_MS: u64 = 2;

/// One step of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A waiter calls `lock()`: it joins its client's local queue (and, as its head, tries
    /// at once).
    Lock { client: u8, waiter: u8 },
    /// The head registers interest (subscribes its channel), then tries at once, in line.
    Subscribe { client: u8, waiter: u8 },
    /// A sleeping head wakes on a permit (a message, a promotion, a resync): it takes the grant
    /// its channel heard for it, or tries.
    Wake { client: u8, waiter: u8 },
    /// A sleeping head's timer fires: it takes the grant its channel heard for it, or tries.
    Timer { client: u8, waiter: u8 },
    /// The next message reaches a client.
    Deliver { client: u8 },
    /// A holder releases (release.lua).
    Release { client: u8, waiter: u8 },
    /// The watchdog renews a hold (renew.lua).
    Renew { client: u8, waiter: u8 },
    /// A waiting waiter gives up (its future is dropped).
    Cancel { client: u8, waiter: u8 },
    /// Fair lock: a waiter calls `try_lock()` instead of `lock()`: one try, never queued.
    TryLock { client: u8, waiter: u8 },
    /// A given-up waiter's background `line/leave.lua`.
    LeaveLine { client: u8, waiter: u8 },
    /// The client's watchdog renews its waiters' entries that are due (renew.lua's
    /// line-entry items, one call).
    RenewEntries { client: u8 },
    /// A client crashes: its holds and line entries stay in Redis (its guards' phases stay
    /// as they were, for the properties; a crashed client takes no step).
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
    /// The scripts or commands run, and their replies.
    pub reply: Option<String>,
    /// Messages published.
    pub published: Vec<String>,
}

impl Note {
    fn said(&mut self, what: String, ran: &Ran) {
        self.reply = Some(match self.reply.take() {
            Some(before) => format!("{before}; {what}"),
            None => what,
        });
        self.published
            .extend(ran.published.iter().map(|(_, p)| p.clone()));
    }
}

impl LockModel {
    /// The model of `config`.
    pub fn new(config: Config) -> LockModel {
        let scripts = ModelScripts::new(config.variant);
        let keys = LockKeys::new(&Prefix::default(), "x").expect("a valid name");
        let keys = match config.kind {
            Kind::Plain => keys,
            Kind::Fair => keys.fair(),
        };
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

    /// Owner ids: one per waiter (a task), `<client id>:<task>` as the real ones are.
    pub fn owner(client: u8, waiter: u8) -> String {
        format!("c{client}:w{waiter}")
    }

    /// Whether a client's waiters share one local FIFO (the plain lock). A fair lock's waiter
    /// is a line of its own (`Line::Own`): every waiter is its line's head.
    fn fifo(&self) -> bool {
        self.config.variant != Variant::NoLocalFifo && !self.fair()
    }

    /// Whether the model runs the fair lock.
    pub fn fair(&self) -> bool {
        self.config.kind == Kind::Fair
    }

    /// The watchdog's renewal period: a third of its lease.
    fn renew_period(&self) -> u64 {
        (self.config.lease_ms / 3).max(1)
    }

    /// The keys of the line's scripts (`commands::line_keys`, and `script_keys` for
    /// line/acquire.lua and force_unlock.lua): the hash, the fence counter, the waiters, their
    /// deadlines and the leases they asked for (`P:{N}:wants`).
    fn line_keys(&self) -> Vec<String> {
        vec![
            self.keys.hash().into(),
            self.keys.fence().into(),
            self.keys.waiters(),
            self.keys.waiters_until(),
            self.keys.wants(),
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

    /// The lock hash's fields, if it exists.
    fn lock_hash<'s>(
        &self,
        s: &'s State,
    ) -> Option<&'s std::collections::BTreeMap<String, String>> {
        match s.redis.keys.get(self.keys.hash()).map(|e| &e.data) {
            Some(Data::Hash(h)) => Some(h),
            _ => None,
        }
    }

    /// The owner the lock hash names (its field that is not a protocol word).
    pub fn holder(&self, s: &State) -> Option<String> {
        self.lock_hash(s)?
            .keys()
            .find(|f| !f.starts_with('~'))
            .cloned()
    }

    /// The line's entries: owner and arrival.
    fn arrivals(&self, s: &State) -> Vec<(String, f64)> {
        match s.redis.keys.get(&self.keys.waiters()).map(|e| &e.data) {
            Some(Data::ZSet(z)) => z.iter().map(|(k, v)| (k.clone(), v.0)).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether `owner` is a waiter of a live client that still waits.
    fn waits(s: &State, owner: &str) -> bool {
        parse_owner(owner).is_some_and(|(c, w)| {
            let c = &s.clients[c as usize];
            c.alive && c.waiters[w as usize].phase.waiting()
        })
    }

    /// Runs a script at the state's time; publishes its messages. `line_order`: a grant it
    /// makes is the line's, and must go to the earliest live arrival (every script but the
    /// plain lock's first try, which does not look at the line).
    fn script(
        &self,
        s: &mut State,
        lua: &str,
        keys: Vec<String>,
        argv: Vec<String>,
        line_order: bool,
    ) -> Ran {
        let before = line_order.then(|| (self.holder(s), self.arrivals(s)));
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
        if let (Some((held_by, arrivals)), Some(granted)) = (before, self.holder(s)) {
            if held_by.as_deref() != Some(granted.as_str()) {
                // A grant to `granted`: nobody who arrived before it (and kept that arrival)
                // may still wait. A grantee without an entry arrived now, after everyone.
                let mine = arrivals
                    .iter()
                    .find(|(o, _)| *o == granted)
                    .map_or(f64::INFINITY, |(_, a)| *a);
                let earlier = arrivals
                    .iter()
                    .find(|(o, a)| *a < mine && *o != granted && Self::waits(s, o));
                if let Some((earlier, _)) = earlier {
                    s.ghost.broken.get_or_insert(Broken::ArrivalOrder {
                        granted,
                        earlier: earlier.clone(),
                    });
                }
            }
        }
        self.publish(s, &ran.published);
        ran
    }

    /// Hands published messages to the client whose channel they are on, if it subscribed
    /// that channel. Nobody in the model listens on the release channel itself (a RedLock's
    /// waiters do).
    fn publish(&self, s: &mut State, published: &[(String, String)]) {
        let prefix = self.keys.waiter_channel_prefix();
        for (channel, payload) in published {
            let Some(rest) = channel.strip_prefix(prefix.as_str()) else {
                continue;
            };
            let (client, own) = match parse_owner(rest) {
                Some((c, w)) => (c, Some(w)),
                None => match rest.strip_prefix('c').and_then(|c| c.parse::<u8>().ok()) {
                    Some(c) => (c, None),
                    None => continue,
                },
            };
            let c = &mut s.clients[client as usize];
            let subscribed = match own {
                None => c.subscribed,
                Some(w) => c.waiters[w as usize].subscribed,
            };
            if !c.alive || !subscribed {
                continue;
            }
            let msg = match Message::parse(payload) {
                Message::Free => Msg::Look { own },
                Message::Granted {
                    fence,
                    lease_ms,
                    owner,
                } => Msg::Grant {
                    own,
                    fence,
                    lease: lease_ms,
                    // A grant named for another client's owner matches no waiter here.
                    waiter: parse_owner(owner)
                        .filter(|(c, _)| *c == client)
                        .map_or(u8::MAX, |(_, w)| w),
                },
            };
            c.inbox.push_back(msg);
        }
    }

    /// Wakes the head of a channel's local line: the client's channel's head (without the
    /// local FIFO, every waiting waiter), or the waiter of its own channel if it waits.
    fn wake_channel(&self, c: &mut Client, own: Option<u8>) {
        let heads: Vec<u8> = match own {
            Some(w) => c.queue.iter().copied().filter(|q| *q == w).collect(),
            None if self.fifo() => c.queue.front().copied().into_iter().collect(),
            None => c.queue.iter().copied().collect(),
        };
        for w in heads {
            c.waiters[w as usize].permit = true;
        }
    }

    /// Takes `waiter` out of its client's local queue; the next head is promoted and tries.
    fn leave_queue(&self, c: &mut Client, waiter: u8) {
        let was_head = c.queue.front() == Some(&waiter);
        c.queue.retain(|w| *w != waiter);
        c.waiters[waiter as usize].permit = false;
        if self.fifo() && was_head {
            if let Some(&next) = c.queue.front() {
                c.waiters[next as usize].phase = Phase::Try;
            }
        }
    }

    /// A step, and what it did (for the trace).
    pub fn step(&self, last: &State, action: &Action) -> (State, Note) {
        let mut s = last.clone();
        let mut note = Note::default();
        match *action {
            Action::Lock { client, waiter } => {
                let c = &mut s.clients[client as usize];
                c.queue.push_back(waiter);
                let head = self.is_head(c, waiter);
                let w = &mut c.waiters[waiter as usize];
                w.line_try = None;
                w.entered = false;
                w.entry_until = None;
                w.phase = if head { Phase::Try } else { Phase::Queued };
            }
            Action::Subscribe { client, waiter } => {
                let c = &mut s.clients[client as usize];
                if self.fair() {
                    c.waiters[waiter as usize].subscribed = true;
                } else {
                    c.subscribed = true;
                }
                c.waiters[waiter as usize].phase = Phase::Try;
            }
            Action::Wake { client, waiter } => {
                s.clients[client as usize].waiters[waiter as usize].permit = false;
                self.resume(&mut s, client, waiter, &mut note);
            }
            Action::Timer { client, waiter } => self.resume(&mut s, client, waiter, &mut note),
            Action::Deliver { client } => self.deliver(&mut s, client),
            Action::Release { client, waiter } => {
                let mut argv = vec![Self::owner(client, waiter), self.keys.released().into()];
                if self.fair() {
                    // `release_of_kind`: no token (the client knows its grant is the owner's
                    // current one), no settle, waiters on their owners' channels.
                    argv.extend(["", "", "", "", "o"].map(String::from));
                }
                let ran = self.script(&mut s, &self.scripts.release, self.line_keys(), argv, true);
                note.said(format!("release.lua -> {}", ran.reply), &ran);
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                w.cycles -= 1;
                w.phase = if w.cycles > 0 {
                    Phase::Idle
                } else {
                    Phase::Done
                };
            }
            Action::Renew { client, waiter } => self.renew(&mut s, client, waiter, &mut note),
            Action::Cancel { client, waiter } => {
                s.budget.cancels -= 1;
                let fair = self.fair();
                let c = &mut s.clients[client as usize];
                self.leave_queue(c, waiter);
                let w = &mut c.waiters[waiter as usize];
                w.phase = Phase::Done;
                // `Wait::drop`: the watchdog stops renewing the entry; a fair waiter (its
                // owner's last) always leaves its line in Redis, a plain lock's head once a
                // try of its put it there. The leave goes out in the background.
                w.renew_at = None;
                if fair || w.entered {
                    w.leaving = true;
                }
            }
            Action::TryLock { client, waiter } => {
                s.budget.tries -= 1;
                self.try_line(&mut s, client, waiter, &mut note, false);
            }
            Action::LeaveLine { client, waiter } => {
                s.clients[client as usize].waiters[waiter as usize].leaving = false;
                let ran = self.script(
                    &mut s,
                    &self.scripts.line_leave,
                    self.line_keys(),
                    vec![
                        Self::owner(client, waiter),
                        self.keys.waiter_channel_prefix(),
                        // The grant the client holds for the owner: none, it gave up.
                        String::new(),
                        if self.fair() { "" } else { "c" }.into(),
                    ],
                    true,
                );
                note.said(format!("line/leave.lua -> {}", ran.reply), &ran);
            }
            Action::RenewEntries { client } => self.renew_entries(&mut s, client, &mut note),
            Action::Crash { client } => {
                s.budget.crashes -= 1;
                let c = &mut s.clients[client as usize];
                c.alive = false;
                c.inbox.clear();
                c.queue.clear();
                for w in &mut c.waiters {
                    // A guard's grant stays in Redis until its lease ends; a wait is over.
                    if !matches!(w.phase, Phase::Hold { .. }) {
                        w.phase = Phase::Done;
                    }
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
                // A plain handle's force unlock tells a granted waiter on both its channels
                // (`''`): an operator's tool may not know which kind the name is.
                let ran = self.script(
                    &mut s,
                    &self.scripts.force_unlock,
                    self.line_keys(),
                    vec![
                        self.keys.released().into(),
                        self.keys.waiter_channel_prefix(),
                        if self.fair() { "o" } else { "" }.into(),
                    ],
                    true,
                );
                note.said(format!("force_unlock.lua -> {}", ran.reply), &ran);
            }
            Action::DataLoss => {
                s.budget.data_losses -= 1;
                self.revoke(&mut s);
                s.redis.keys.clear();
                s.now += 1;
                for c in s
                    .clients
                    .iter_mut()
                    .filter(|c| c.alive && subscribed_any(c))
                {
                    c.inbox.clear();
                    c.inbox.push_back(Msg::Resync);
                }
            }
            Action::Tick { to } => {
                let granted = self
                    .lock_hash(&s)
                    .filter(|h| h.contains_key(GRANTED_FIELD))
                    .and_then(|_| self.holder(&s));
                s.now = to;
                let gone = s.redis.expire_until(to);
                if let Some(owner) = granted.filter(|_| gone.iter().any(|k| k == self.keys.hash()))
                {
                    if Self::waits(&s, &owner) {
                        let (client, waiter) = parse_owner(&owner).expect("a model owner");
                        s.ghost
                            .broken
                            .get_or_insert(Broken::GrantLapsed { client, waiter });
                    }
                }
            }
        }
        // A waiter that is to try does so in the same step: waking (or joining, or
        // subscribing, or being promoted) and the try it leads to are one step of the model.
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
                    self.try_line(&mut s, client, waiter as u8, &mut note, true);
                } else {
                    self.try_plain(&mut s, client, waiter as u8, &mut note);
                }
            }
        }
        if s.redis.keys.contains_key(self.keys.hash()) {
            s.ghost.free_since = None;
        } else if s.ghost.free_since.is_none() {
            s.ghost.free_since = Some(s.now);
        }
        (s, note)
    }

    /// Force unlock and data loss end the current grant without its lease running out.
    fn revoke(&self, s: &mut State) {
        let token = self
            .lock_hash(s)
            .and_then(|h| h.get(FENCE_FIELD))
            .and_then(|t| t.parse().ok());
        if let Some(token) = token {
            if !s.ghost.revoked.contains(&token) {
                s.ghost.revoked.push(token);
            }
        }
    }

    /// The watchdog renews one hold (renew.lua with the grant's token).
    fn renew(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note) {
        let now = s.now;
        let Phase::Hold { token, .. } = s.clients[client as usize].waiters[waiter as usize].phase
        else {
            unreachable!("a renewal of a hold")
        };
        let ran = self.script(
            s,
            &self.scripts.renew,
            vec![self.keys.hash().into()],
            vec![
                self.config.lease_ms.to_string(),
                Self::owner(client, waiter),
                token.to_string(),
            ],
            false,
        );
        note.said(format!("renew.lua -> {}", ran.reply), &ran);
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

    /// The watchdog renews the client's line entries that are due, in one renew.lua call.
    fn renew_entries(&self, s: &mut State, client: u8, note: &mut Note) {
        let now = s.now;
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
        // A lock's entry, as the client renews it (commands::renew): the hash, the line, the
        // deadlines and the wants ('el'), so that a grant the line made to the waiter is kept
        // too.
        for &w in &due {
            keys.extend([
                self.keys.hash().to_string(),
                self.keys.waiters(),
                self.keys.waiters_until(),
                self.keys.wants(),
            ]);
            argv.extend([Self::owner(client, w), "el".to_string()]);
        }
        let ran = self.script(s, &self.scripts.renew, keys, argv, false);
        note.said(
            format!("renew.lua (entries {due:?}) -> {}", ran.reply),
            &ran,
        );
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

    /// A sleeping head wakes (`wait_for`'s loop): a grant its channel heard for this wait is
    /// taken without a try (`LockAttempt::heard`); otherwise it tries.
    fn resume(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note) {
        match self.heard(s, client, waiter) {
            Some((token, until)) => {
                let owner = Self::owner(client, waiter);
                let held = self.lock_hash(s).is_some_and(|h| {
                    h.get(&owner).map(String::as_str) == Some("1")
                        && h.get(FENCE_FIELD) == Some(&token.to_string())
                });
                if !held && !s.ghost.revoked.contains(&token) {
                    s.ghost.broken.get_or_insert(Broken::HeardNotHeld {
                        client,
                        waiter,
                        token,
                    });
                }
                let said = format!("{owner} takes the grant {token} it heard");
                note.reply = Some(match note.reply.take() {
                    Some(before) => format!("{before}; {said}"),
                    None => said,
                });
                self.granted(s, client, waiter, token, until);
            }
            None => s.clients[client as usize].waiters[waiter as usize].phase = Phase::Try,
        }
    }

    /// The grant the waiter's channel heard for this wait, if it may be taken without a try
    /// (`LockAttempt::heard`, `take_heard`): for its owner, with a token above the holder's
    /// token its last busy try in line saw, and that try at most half the grant's lease ago.
    /// Its token, and the end of its lease as the hold table counts it: the grant's lease
    /// (what was left of the waiter's entry when the line granted it) from that try.
    fn heard(&self, s: &State, client: u8, waiter: u8) -> Option<(u64, u64)> {
        let c = &s.clients[client as usize];
        let w = &c.waiters[waiter as usize];
        let (seen, sent_at) = w.line_try?;
        let (fence, lease, to) = if self.fair() { w.granted } else { c.granted }?;
        let fresh = fence > seen || self.config.variant == Variant::StaleGrantTaken;
        let recent = 2 * (s.now - sent_at) <= lease;
        (to == waiter && fresh && recent).then_some((fence, sent_at + lease))
    }

    /// The waiter got the lock (a try's grant, or one it heard): its guard's token and the end
    /// of its lease as the client computes it. It leaves its local queue (the next head
    /// tries) without telling Redis.
    fn granted(&self, s: &mut State, client: u8, waiter: u8, token: u64, until: u64) {
        if token <= s.ghost.last_fence {
            s.ghost.broken.get_or_insert(Broken::FenceRegressed {
                granted: token,
                before: s.ghost.last_fence,
            });
        }
        s.ghost.last_fence = s.ghost.last_fence.max(token);
        let c = &mut s.clients[client as usize];
        if !self.fair() {
            if let Some(&ahead) = c.queue.front().filter(|w| **w != waiter) {
                s.ghost.broken.get_or_insert(Broken::ClientFifo {
                    client,
                    waiter,
                    ahead,
                });
            }
        }
        self.leave_queue(c, waiter);
        let w = &mut c.waiters[waiter as usize];
        w.renew_at = None;
        w.line_try = None;
        w.entry_until = None;
        w.phase = Phase::Hold {
            token,
            until,
            renewals: self.config.renewals,
            lost: false,
        };
    }

    /// One try of a plain lock's head (`LockAttempt::try_once`): a plain try (acquire.lua)
    /// while the client's channel is not subscribed, else a try in line (line/acquire.lua 'w'
    /// on client channels, `kind_acquire`'s arguments).
    fn try_plain(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note) {
        let in_line = s.clients[client as usize].subscribed;
        let owner = Self::owner(client, waiter);
        let lease = self.config.lease_ms.to_string();
        let ran = if in_line {
            let argv = vec![
                owner.clone(),
                lease.clone(),
                "w".into(),
                String::new(),
                self.keys.waiter_channel_prefix(),
                lease,
                "c".into(),
                // A watched lease: the line grants it until the entry would have lapsed.
                String::new(),
            ];
            self.script(s, &self.scripts.line_acquire, self.line_keys(), argv, true)
        } else {
            let keys = vec![self.keys.hash().into(), self.keys.fence().into()];
            self.script(
                s,
                &self.scripts.acquire,
                keys,
                vec![owner.clone(), lease],
                false,
            )
        };
        let script = if in_line {
            "line/acquire.lua (w)"
        } else {
            "acquire.lua"
        };
        note.said(format!("{owner} {script} -> {}", ran.reply), &ran);
        self.answered(s, client, waiter, &ran.reply, in_line, true);
    }

    /// One try of a fair lock's waiter: every try of a waiting acquire is line/acquire.lua in
    /// mode 'w' (owner channels), subscribed or not. With `wait` false it is `try_lock`
    /// instead (mode 't', entry life 0): one try that never queues; not granted, the call
    /// ends (one cycle done).
    fn try_line(&self, s: &mut State, client: u8, waiter: u8, note: &mut Note, wait: bool) {
        let owner = Self::owner(client, waiter);
        let mode = if wait { "w" } else { "t" };
        let argv = vec![
            owner.clone(),
            self.config.lease_ms.to_string(),
            mode.into(),
            String::new(),
            self.keys.waiter_channel_prefix(),
            if wait { self.config.lease_ms } else { 0 }.to_string(),
            String::new(),
            String::new(),
        ];
        let ran = self.script(s, &self.scripts.line_acquire, self.line_keys(), argv, true);
        note.said(
            format!("{owner} line/acquire.lua ({mode}) -> {}", ran.reply),
            &ran,
        );
        if !wait && self.arrivals(s).iter().any(|(o, _)| *o == owner) {
            s.ghost
                .broken
                .get_or_insert(Broken::TryQueued { client, waiter });
        }
        self.answered(s, client, waiter, &ran.reply, true, wait);
    }

    /// The engine's reaction to a try's reply. Busy in line: the owner has (or kept) its entry
    /// with a deadline now + lease, its watchdog renews it from now on, and the holder's token
    /// in the reply tells a grant message of this wait from older ones; then the head sleeps on the
    /// bound, or (its channel not subscribed yet) registers interest and tries again at once.
    fn answered(
        &self,
        s: &mut State,
        client: u8,
        waiter: u8,
        reply: &Reply,
        in_line: bool,
        wait: bool,
    ) {
        let now = s.now;
        let lease = self.config.lease_ms;
        let granted = match reply {
            Reply::Bulk(t) => t.parse::<u64>().ok(),
            Reply::Int(t) => Some(*t as u64),
            _ => None,
        };
        let busy = match reply {
            Reply::Array(items) if items.first() == Some(&Reply::Int(0)) => Some(items),
            _ => None,
        };
        match (granted, busy) {
            (Some(token), _) => self.granted(s, client, waiter, token, now + lease),
            (None, Some(_)) if !wait => {
                // try_lock answered None: this call is over.
                let w = &mut s.clients[client as usize].waiters[waiter as usize];
                w.cycles -= 1;
                w.phase = if w.cycles > 0 {
                    Phase::Idle
                } else {
                    Phase::Done
                };
            }
            (None, Some(items)) => {
                let bound = match items.get(1) {
                    Some(Reply::Int(ms)) if *ms >= 0 => *ms as u64 + 1,
                    _ => 1000,
                };
                // The holder's token: a grant message with a larger one came after this try.
                let seen = match items.get(4) {
                    Some(Reply::Bulk(c)) => c.parse::<u64>().ok(),
                    Some(Reply::Int(c)) => Some(*c as u64),
                    _ => None,
                };
                let fair = self.fair();
                let period = self.renew_period();
                let c = &mut s.clients[client as usize];
                let subscribed = if fair {
                    c.waiters[waiter as usize].subscribed
                } else {
                    c.subscribed
                };
                let w = &mut c.waiters[waiter as usize];
                if in_line {
                    w.line_try = seen.map(|seen| (seen, now));
                    w.entered |= subscribed;
                    w.entry_until = Some(now + lease);
                    w.renew_at.get_or_insert(now + period);
                }
                w.phase = if subscribed {
                    Phase::Sleep {
                        wake_at: now + bound,
                    }
                } else {
                    // A grant before the subscription reached nobody: subscribe, then try
                    // again at once, in line.
                    Phase::Subscribe
                };
            }
            (None, None) => {
                // An error (already recorded as broken) or a re-entry reply: stop this waiter.
                let c = &mut s.clients[client as usize];
                self.leave_queue(c, waiter);
                c.waiters[waiter as usize].phase = Phase::Done;
                c.waiters[waiter as usize].renew_at = None;
            }
        }
    }

    /// `on_message`: one message reaches a client. A grant is kept as its channel's latest;
    /// either way the channel's head wakes.
    fn deliver(&self, s: &mut State, client: u8) {
        let fair = self.fair();
        let c = &mut s.clients[client as usize];
        let msg = c.inbox.pop_front().expect("a message");
        match msg {
            Msg::Resync => {
                if fair {
                    for w in c.queue.clone() {
                        self.wake_channel(c, Some(w));
                    }
                } else {
                    self.wake_channel(c, None);
                }
            }
            Msg::Look { own } => self.wake_channel(c, own),
            Msg::Grant {
                own,
                fence,
                lease,
                waiter,
            } => {
                let channel = match own {
                    Some(w) => &mut c.waiters[w as usize].granted,
                    None => &mut c.granted,
                };
                if channel.is_none_or(|(latest, _, _)| latest < fence) {
                    *channel = Some((fence, lease, waiter));
                }
                self.wake_channel(c, own);
            }
        }
    }

    /// Whether a client has work that must happen before the clock moves.
    fn urgent(&self, s: &State) -> bool {
        s.clients.iter().filter(|c| c.alive).any(|c| {
            !c.inbox.is_empty()
                || c.waiters.iter().any(|w| {
                    w.leaving
                        || w.renew_at.is_some_and(|at| at <= s.now)
                        || match w.phase {
                            Phase::Try | Phase::Subscribe => true,
                            Phase::Sleep { wake_at } => wake_at <= s.now || w.permit,
                            _ => false,
                        }
                })
        })
    }

    /// The next instant something is due: a timer, a renewal, a key's expiry, a lease's end.
    fn next_due(&self, s: &State) -> Option<u64> {
        let mut due: Vec<u64> = Vec::new();
        for c in s.clients.iter().filter(|c| c.alive) {
            for w in &c.waiters {
                due.extend(w.renew_at);
                match w.phase {
                    Phase::Sleep { wake_at } => due.push(wake_at),
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
        due.into_iter()
            .filter(|t| *t > s.now)
            .min()
            .map(|t| t.min(self.config.horizon_ms))
            .filter(|t| *t > s.now)
    }
}

/// Whether any channel of the client is subscribed.
fn subscribed_any(c: &Client) -> bool {
    c.subscribed || c.waiters.iter().any(|w| w.subscribed)
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
            granted: None,
            queue: VecDeque::new(),
            waiters: vec![
                Waiter {
                    phase: Phase::Idle,
                    cycles: cfg.cycles,
                    permit: false,
                    subscribed: false,
                    granted: None,
                    line_try: None,
                    entered: false,
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
            ghost: Ghost {
                free_since: Some(0),
                ..Ghost::default()
            },
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
                    Phase::Sleep { wake_at } => {
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
                if w.phase.waiting() && s.budget.cancels > 0 {
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
            if s.budget.losses > 0 && subscribed_any(c) && c.inbox.iter().any(|m| *m != Msg::Resync)
            {
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

/// A model owner id `c<client>:w<waiter>` as its indices.
pub fn parse_owner(owner: &str) -> Option<(u8, u8)> {
    let (c, w) = owner.strip_prefix('c')?.split_once(":w")?;
    Some((c.parse().ok()?, w.parse().ok()?))
}
