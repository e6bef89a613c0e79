//! The properties checked on every reachable state.
//!
//! Each is an invariant ("always"): a counterexample is a path from the start to a state where
//! it fails. Some are judged by the step that breaks them ([`Broken`], recorded in the ghost
//! state); the others by the state alone.

use leasehold_core::protocol::{FENCE_FIELD, GRANTED_FIELD};
use stateright::Property;

use crate::model::{parse_owner, LockModel, FREE_LOCK_SLACK_MS};
use crate::redis::Data;
use crate::state::{Broken, Msg, Phase, State};

/// Property names, as the checker and the CLI report them.
pub mod names {
    /// Never two owners with a grant whose lease has not ended.
    pub const MUTUAL_EXCLUSION: &str = "mutual exclusion";
    /// Fencing tokens strictly increase, also across data loss.
    pub const FENCING: &str = "fencing tokens increase";
    /// No head sleeps on a free lock past the bound.
    pub const NO_SLEEP_ON_FREE_LOCK: &str = "no waiter sleeps on a free lock";
    /// Within a client, waiters of the plain lock get the lock in the order they asked.
    pub const CLIENT_FIFO: &str = "FIFO within a client";
    /// A grant the line makes goes to its earliest live arrival (every grant of the fair lock;
    /// every grant of the plain lock but a first try's).
    pub const ARRIVAL_ORDER: &str = "the line grants in arrival order";
    /// A grant a waiter took from a message is its grant in Redis.
    pub const HEARD_GRANT_HELD: &str = "a grant heard is held in Redis";
    /// A live waiter never lets a grant of the line run out untaken.
    pub const GRANT_TAKEN: &str = "a live waiter takes its grant";
    /// A grant to a waiter that gave up passes on when it leaves; one to a dead waiter lasts no
    /// longer than its entry would have.
    pub const GRANT_PASSES_ON: &str = "a grant to a departed or dead waiter passes on";
    /// Fair lock: `try_lock` never takes a place in the line.
    pub const TRY_NEVER_QUEUES: &str = "try_lock never queues (fair)";
    /// A guard whose grant ended never reports held again.
    pub const LOST_STAYS_LOST: &str = "a lost guard stays lost";
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
        Property::always(names::ARRIVAL_ORDER, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::ArrivalOrder { .. }))
        }),
        Property::always(names::HEARD_GRANT_HELD, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::HeardNotHeld { .. }))
        }),
        Property::always(names::GRANT_TAKEN, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::GrantLapsed { .. }))
        }),
        Property::always(names::GRANT_PASSES_ON, |m: &LockModel, s: &State| {
            grant_passes_on(m, s)
        }),
        Property::always(names::TRY_NEVER_QUEUES, |_, s: &State| {
            !matches!(s.ghost.broken, Some(Broken::TryQueued { .. }))
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
/// lock could have become free without telling it. However the lock became free (its last
/// hold released with nobody in line, a hold or a grant ran out, force unlock, the data was
/// lost), every sleeping head must wake within [`FREE_LOCK_SLACK_MS`] of it: by its timer, or
/// a wake-up already on its way (a permit, a message on its channel, a resync).
fn no_sleep_on_free_lock(m: &LockModel, s: &State) -> bool {
    let Some(since) = s.ghost.free_since else {
        return true;
    };
    let bound = since + FREE_LOCK_SLACK_MS;
    if m.config.horizon_ms < bound {
        return true;
    }
    s.clients.iter().filter(|c| c.alive).all(|c| {
        c.waiters.iter().enumerate().all(|(i, w)| match w.phase {
            Phase::Sleep { wake_at } => {
                // A message wakes its channel's head: the client's channel's (the plain lock),
                // or the waiter of its own channel (the fair lock).
                let own = m.fair().then_some(i as u8);
                let told = c
                    .inbox
                    .iter()
                    .any(|msg| *msg == Msg::Resync || msg.channel() == Some(own));
                wake_at <= bound || w.permit || told
            }
            _ => true,
        })
    })
}

/// Once no client will do anything more (every waiter done, or its client crashed) and no
/// background leave is pending, every key left but the fencing counter has a TTL: the lock
/// and its line go by themselves once the leases run out.
fn nothing_left(m: &LockModel, s: &State) -> bool {
    let finished = s.clients.iter().all(|c| {
        !c.alive
            || c.waiters
                .iter()
                .all(|w| w.phase == Phase::Done && !w.leaving)
    });
    if !finished {
        return true;
    }
    s.redis.keys.iter().all(|(key, entry)| {
        key == m.fence_key() || (entry.expires_at.is_some() && !matches!(entry.data, Data::Str(_)))
    })
}

/// `docs/fair-lock.md`'s bound on a grant nobody takes: while the lock is a grant of the line
/// (`~granted`) to an owner that no longer waits for it and does not hold it, that owner
/// either died (its client crashed, or its leave script has not run yet), and the grant lasts
/// no longer than its entry would have held the line (the deadline its entry was last given),
/// or it left (its leave script ran), and then the grant must have passed on: a grant to a
/// waiter nobody is must not stay.
fn grant_passes_on(m: &LockModel, s: &State) -> bool {
    let Some(entry) = s.redis.keys.get(m.hash_key()) else {
        return true;
    };
    let Data::Hash(h) = &entry.data else {
        return true;
    };
    if !h.contains_key(GRANTED_FIELD) {
        return true;
    }
    let Some((c, w)) = m.holder(s).as_deref().and_then(parse_owner) else {
        return false;
    };
    let client = &s.clients[c as usize];
    let waiter = &client.waiters[w as usize];
    // Taken: the grant is the owner's guard's (a crashed client's guard lasts its lease).
    let holds = matches!(waiter.phase, Phase::Hold { token, .. }
        if h.get(FENCE_FIELD) == Some(&token.to_string()));
    if holds {
        return true;
    }
    if client.alive {
        if waiter.phase.waiting() {
            return true;
        }
        if !waiter.leaving {
            return false; // it left: nothing will pass its grant on
        }
    }
    match (entry.expires_at, waiter.entry_until) {
        (Some(at), Some(until)) => at <= until,
        _ => false,
    }
}
