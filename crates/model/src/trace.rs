//! A counterexample as text: one line per step, saying who did what, the reply, what was
//! published, and how Redis and the actor's phase changed.

use std::fmt::Write;

use crate::model::{Action, LockModel};
use crate::redis::{Data, Entry};
use crate::state::{Phase, State};

/// A key's value, short: `hash{a=1, ~fence=5000} px@15`.
fn show(entry: &Entry) -> String {
    let mut out = match &entry.data {
        Data::Str(s) => format!("{s:?}"),
        Data::Hash(h) => format!(
            "hash{{{}}}",
            h.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Data::ZSet(z) => format!(
            "zset{{{}}}",
            z.iter()
                .map(|(k, v)| format!("{k}:{}", crate::redis::number_text(v.0)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if let Some(at) = entry.expires_at {
        let _ = write!(out, " until {at}");
    }
    out
}

/// How Redis changed between two states.
fn redis_delta(before: &State, after: &State) -> String {
    let mut parts = Vec::new();
    for (key, entry) in &after.redis.keys {
        if before.redis.keys.get(key) != Some(entry) {
            parts.push(format!("{key} = {}", show(entry)));
        }
    }
    for key in before.redis.keys.keys() {
        if !after.redis.keys.contains_key(key) {
            parts.push(format!("{key} gone"));
        }
    }
    parts.join("; ")
}

fn phase(p: &Phase) -> String {
    match p {
        Phase::Sleep { wake_at } => format!("sleeps until {wake_at}"),
        Phase::Hold {
            token, until, lost, ..
        } => format!(
            "holds token {token} until {until}{}",
            if *lost { " (lost)" } else { "" }
        ),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Who an action is about.
fn actor(action: &Action) -> String {
    use Action::*;
    match *action {
        Lock { client, waiter }
        | Subscribe { client, waiter }
        | Wake { client, waiter }
        | Timer { client, waiter }
        | Release { client, waiter }
        | Renew { client, waiter }
        | LeaveLine { client, waiter }
        | TryLock { client, waiter }
        | Cancel { client, waiter } => format!("c{client}:w{waiter}"),
        Deliver { client }
        | RenewEntries { client }
        | Crash { client }
        | LoseMessages { client } => format!("c{client}"),
        ForceUnlock => "operator".into(),
        DataLoss => "redis".into(),
        Tick { .. } => "clock".into(),
    }
}

/// The trace of `actions` from the model's initial state, one line per step.
pub fn render(model: &LockModel, start: &State, actions: &[Action]) -> String {
    let mut out = String::new();
    let mut state = start.clone();
    for (i, action) in actions.iter().enumerate() {
        let (next, note) = model.step(&state, action);
        let what = match action {
            Action::Deliver { client } => format!(
                "Deliver {:?}",
                state.clients[*client as usize]
                    .inbox
                    .front()
                    .expect("a message")
            ),
            Action::Tick { to } => format!("Tick to {to}"),
            other => format!("{other:?}")
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let _ = write!(
            out,
            "{:>3}. t={:<3} {:<9} {what}",
            i + 1,
            state.now,
            actor(action)
        );
        if let Some(reply) = &note.reply {
            let _ = write!(out, ": {reply}");
        }
        if !note.published.is_empty() {
            let _ = write!(out, "; published {:?}", note.published);
        }
        let delta = redis_delta(&state, &next);
        if !delta.is_empty() {
            let _ = write!(out, " | {delta}");
        }
        let mut changes = Vec::new();
        for (ci, (a, b)) in state.clients.iter().zip(&next.clients).enumerate() {
            for (wi, (wa, wb)) in a.waiters.iter().zip(&b.waiters).enumerate() {
                if wa.phase != wb.phase {
                    changes.push(format!("c{ci}w{wi} {}", phase(&wb.phase)));
                }
            }
        }
        if !changes.is_empty() {
            let _ = write!(out, " => {}", changes.join(", "));
        }
        let lapsed = matches!(action, Action::Tick { .. } | Action::DataLoss);
        if let (Some(since), None, true) = (next.ghost.free_since, state.ghost.free_since, lapsed) {
            let _ = write!(out, " [the lock lapsed free at {since}, unannounced]");
        }
        let failing: Vec<&str> = crate::properties::all()
            .iter()
            .filter(|p| !(p.condition)(model, &next))
            .map(|p| p.name)
            .collect();
        out.push('\n');
        state = next;
        if !failing.is_empty() {
            // The checker's path may run on past the first failing state: stop there.
            let _ = writeln!(out, "     ^ fails here: {}", failing.join(", "));
            break;
        }
    }
    if let Some(broken) = &state.ghost.broken {
        let _ = writeln!(out, "     violation seen by the last step: {broken:?}");
    }
    out
}
