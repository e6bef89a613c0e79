//! The properties checked on every reachable state.
//!
//! Each is an invariant ("always"): a counterexample is a path from the start to a state where
//! it fails. Some are judged by the step that breaks them ([`Broken`], recorded in the ghost
//! state); the others by the state alone.

use stateright::Property;

use crate::model::{LockModel, FREE_LOCK_SLACK_MS};
use crate::redis::Data;
use crate::state::{Broken, Msg, Phase, State};

/// Property names, as the checker and the CLI report them.
pub mod names {
    /// Never two owners with a grant whose lease has not ended.
    pub const MUTUAL_EXCLUSION: &str = "mutual exclusion";
    /// Fencing tokens strictly increase, also across data loss.
    pub const FENCING: &str = "fencing tokens increase";
    /// F1: no head sleeps on a lock that became free without a message, past the bound.
    pub const NO_SLEEP_ON_FREE_LOCK: &str = "no waiter sleeps on a free lock (F1)";
    /// F2: within a client, waiters get the lock in the order they asked.
    pub const CLIENT_FIFO: &str = "FIFO within a client (F2)";
    /// Between clients: a lock reserved for a client's turn goes to that client (the fair
    /// lock: reserved for a waiter, to that waiter).
    pub const TURN_ORDER: &str = "a reserved turn goes to its client";
    /// Fair lock: `try_lock` never takes a place in the line.
    pub const TRY_NEVER_QUEUES: &str = "try_lock never queues (fair)";
    /// Fair lock: strict FIFO by arrival over every waiter of every client.
    pub const ARRIVAL_ORDER: &str = "FIFO by arrival across clients (fair)";
    /// Fair lock: a turn reserved for a dead waiter lasts no longer than its entry (one lease
    /// after its last renewal); one reserved for a waiter that left passes on when it leaves.
    pub const TURN_PASSES_ON: &str = "a dead or departed waiter's turn passes on (fair)";
    /// F3: a guard whose grant ended never reports held again.
    pub const LOST_STAYS_LOST: &str = "a lost guard stays lost (F3)";
    /// Once every client is done or crashed, nothing stays in Redis but what expires.
    pub const NOTHING_LEFT: &str = "nothing left behind";
    /// Every script run answers without an error, and none would stop half-way in a migrating
    /// Redis Cluster slot (see [`crate::lua::Ran::stopped_while_migrating`]).
    pub const NO_SCRIPT_ERROR: &str = "scripts never fail";
}

/// Every property.
pub fn all() -> Vec<Property<LockModel>> {
    vec![
        Property::always(names::MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
        Property::always(names::FENCING, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::FenceRegressed { .. }))
        }),
        Property::always(names::NO_SLEEP_ON_FREE_LOCK, |m: &LockModel, s: &State| {
            no_sleep_on_free_lock(m, s)
        }),
        Property::always(names::CLIENT_FIFO, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::ClientFifo { .. }))
        }),
        Property::always(names::TURN_ORDER, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::TurnTaken { .. }))
        }),
        Property::always(names::ARRIVAL_ORDER, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::ArrivalOrder { .. }))
        }),
        Property::always(names::TRY_NEVER_QUEUES, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::TryQueued { .. }))
        }),
        Property::always(names::TURN_PASSES_ON, |m: &LockModel, s: &State| {
            turn_passes_on(m, s)
        }),
        Property::always(names::LOST_STAYS_LOST, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::Revived { .. }))
        }),
        Property::always(names::NOTHING_LEFT, |m: &LockModel, s: &State| {
            nothing_left(m, s)
        }),
        Property::always(names::NO_SCRIPT_ERROR, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::ScriptError(_)))
        }),
    ]
}

/// Guards of live clients that hold a grant whose lease (as the client computes it) has not
/// ended and that was not ended early by force unlock or data loss (the operator's and the
/// deployment's doing, not the protocol's). At most one.
fn mutual_exclusion(s: &State) -> bool {
    let holding = s
        .clients
        .iter()
        .filter(|c| c.alive)
        .flat_map(|c| &c.waiters)
        .filter(|w| match w.phase {
            Phase::Hold {
                token, until, lost, ..
            } => !lost && until > s.now && !s.ghost.revoked.contains(&token),
            _ => false,
        })
        .count();
    holding <= 1
}

/// The waiting engine's invariant (`src/wait.rs`): a head never sleeps past the moment the
/// lock could have become free without telling it. When the lock lapsed silently (a hold or a
/// reservation ran out, or the data was lost), every sleeping head must wake within
/// [`FREE_LOCK_SLACK_MS`] of it: by its timer, a standby, or a wake-up already on its way.
fn no_sleep_on_free_lock(m: &LockModel, s: &State) -> bool {
    let Some(since) = s.ghost.free_silently_since else {
        return true;
    };
    let bound = since + FREE_LOCK_SLACK_MS;
    s.clients.iter().filter(|c| c.alive).all(|c| {
        let told = c
            .inbox
            .iter()
            .any(|m| matches!(m, Msg::Free | Msg::Turn(_) | Msg::Resync));
        let standby = c
            .standby
            .is_some_and(|(epoch, at)| epoch == c.epoch && at <= bound);
        c.waiters.iter().enumerate().all(|(i, w)| match w.phase {
            Phase::Sleep { wake_at, .. } => {
                // A fair lock's waiter is told only on its own channel.
                let told = told
                    || c.inbox
                        .iter()
                        .any(|m| *m == Msg::FreeFor(i as u8) || *m == Msg::Resync);
                wake_at <= bound || w.permit || told || standby || m.config.horizon_ms < bound
            }
            _ => true,
        })
    })
}

/// Once no client will do anything more (every waiter done, or its client crashed) and no
/// background clean-up is pending, every key left but the fencing counter has a TTL: the
/// lock, its reservation and the turn queue all go by themselves once the leases run out.
fn nothing_left(m: &LockModel, s: &State) -> bool {
    let finished = s
        .clients
        .iter()
        .all(|c| !c.alive || (!c.leaving && c.waiters.iter().all(|w| w.phase == Phase::Done)));
    if !finished {
        return true;
    }
    s.redis.keys.iter().all(|(key, entry)| {
        key == m.fence_key() || (entry.expires_at.is_some() && !matches!(entry.data, Data::Str(_)))
    })
}

/// The fair lock's documented bound on a turn nobody takes (`docs/fair-lock.md`): when the
/// lock is reserved (`~turn:<owner>` its only field) for an owner that no longer waits, the
/// reservation lapses by that owner's entry deadline if it died (its client crashed, or its
/// leave script never ran yet): one lease after its last renewal, or the turn grace after the
/// reservation when that is later (`hand_on.lua`'s floor); and not at all if it left
/// (its leave script ran: the turn passed on then). Sleepers must then wake within the slack
/// of the lapse: "no waiter sleeps on a free lock" checks that.
fn turn_passes_on(m: &LockModel, s: &State) -> bool {
    if !m.fair() {
        return true;
    }
    let Some(entry) = s.redis.keys.get(m.hash_key()) else {
        return true;
    };
    let Data::Hash(h) = &entry.data else {
        return true;
    };
    let Some(owner) = h.keys().find_map(|f| f.strip_prefix("~turn:")) else {
        return true;
    };
    let Some((c, w)) = owner
        .strip_prefix('c')
        .and_then(|r| r.split_once('w'))
        .and_then(|(c, w)| Some((c.parse::<usize>().ok()?, w.parse::<usize>().ok()?)))
    else {
        return false;
    };
    let client = &s.clients[c];
    let waiter = &client.waiters[w];
    let waiting = matches!(
        waiter.phase,
        Phase::Queued | Phase::Try | Phase::Subscribe | Phase::Sleep { .. }
    );
    if client.alive && waiting {
        return true;
    }
    if client.alive && !waiter.leaving {
        return false; // it left (or never waited): nothing will pass its turn on
    }
    // A reservation lasts what is left of the head's entry, but at least the turn grace
    // (`hand_on.lua`): one made just before the entry's deadline outlives it by the grace.
    match (entry.expires_at, waiter.entry_until) {
        (Some(at), Some(until)) => at <= until + m.config.grace_ms,
        _ => false,
    }
}
