//! `leasehold unlock --force NAME`: release a lock whoever holds it.
//!
//! This is the operator's escape hatch for a lock whose holder is gone but whose lease is long
//! (or was set without expiry by hand). It is dangerous on a live holder: the holder is not
//! told until its next renewal finds the lock gone, and may write meanwhile (fencing tokens
//! protect a store that checks them). So it asks for the lock name to be typed back, and
//! without `--yes` it refuses outright when nobody is at a terminal to answer.
//!
//! As a release does, a force unlock grants the lock to the first live waiter in its line (a
//! plain or fair lock's; a read/write lock's head is told, or reserved the lock for its turn):
//! only that waiter is told, and it wakes holding the lock. The command reads the lock once
//! more afterwards to say who holds it now.
//!
//! A semaphore or a count-down latch under the name is refused: neither is a lock, and
//! removing one would drop every permit taken or release every waiter of the latch at once.
//! `Semaphore::delete` and `Latch::count_down` are the ways to do that on purpose.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::connect::connect;
use crate::inspect::{self, Holder};
use crate::layout::Kind;
use crate::render;

/// How the force-unlock was (or will be) confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// `--yes` was given.
    Given,
    /// Ask on the terminal once we know what the lock holds.
    Ask,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Outcome<'a> {
    name: &'a str,
    key: &'a str,
    /// Whether a lock was removed (false: it was not held).
    released: bool,
    /// Who held it just before.
    holders: &'a [Holder],
    /// Who holds it just after, read once more once it was removed: the first live waiter in
    /// line, granted it as by a release (or whoever took it since); empty when free (or
    /// nothing was removed); `null` when that read failed.
    holders_now: Option<&'a [Holder]>,
}

/// Checks, before connecting, that the command can be confirmed at all.
pub fn confirm_up_front(name: &str, yes: bool) -> anyhow::Result<Confirmation> {
    if yes {
        return Ok(Confirmation::Given);
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "refusing to force-unlock {name:?} without confirmation: stdin is not a terminal \
             (pass --yes to confirm from a script)"
        );
    }
    Ok(Confirmation::Ask)
}

/// The `unlock --force` command.
pub async fn run(
    url: &str,
    prefix: &str,
    name: &str,
    confirmation: Confirmation,
    json: bool,
) -> anyhow::Result<()> {
    let client = connect(url, prefix).await?;
    let lock = client.lock(name)?;
    let state = inspect::fetch(client.redis(), lock.keys()).await?;
    if state.kind.starts_with("foreign:") {
        bail!(
            "key {} holds a {}, not a leasehold lock: leaving it alone",
            state.key,
            state.kind.trim_start_matches("foreign:")
        );
    }
    match state.lock_kind {
        Some(Kind::Semaphore) => bail!(
            "{name:?} is a semaphore ({}/{} permits taken), not a lock: unlock --force leaves \
             it alone; its permits return when released or when their leases end, and \
             Semaphore::delete removes it with every permit taken",
            state.permits_taken.unwrap_or(0),
            state.permits.unwrap_or(0),
        ),
        Some(Kind::Latch) => bail!(
            "{name:?} is a count-down latch (count {}), not a lock: unlock --force leaves it \
             alone; Latch::count_down counts it down (it opens, and goes, at zero)",
            state.count.unwrap_or(0),
        ),
        _ => {}
    }
    if state.is_locked() && confirmation == Confirmation::Ask {
        let typed = ask(&state).await?;
        if typed != name {
            bail!("aborted: {typed:?} is not the lock name {name:?}; nothing was changed");
        }
        // The operator confirmed what was shown; if the lock changed hands while they typed,
        // they did not confirm removing the new holder.
        let now = inspect::fetch(client.redis(), lock.keys()).await?;
        if grants(&now) != grants(&state) {
            bail!(
                "aborted: {name:?} changed hands while you confirmed (now {}); nothing was \
                 changed, run the command again",
                if now.is_locked() {
                    "held by another grant"
                } else {
                    "free"
                }
            );
        }
    }
    // A read/write lock is unlocked through its own handle: its script hands it on to its
    // line's head as a read/write lock's release does.
    let released = state.is_locked()
        && if state.lock_kind == Some(Kind::ReadWrite) {
            client.rw_lock(name)?.write().force_unlock().await?
        } else {
            lock.force_unlock().await?
        };
    // Who holds it now: the removal is done, so a failed read only leaves that unsaid.
    let after = if released {
        inspect::fetch(client.redis(), lock.keys()).await.ok()
    } else {
        None
    };
    let holders_now = after.as_ref().map_or(&[][..], |now| {
        if now.is_locked() {
            &now.holders[..]
        } else {
            &[]
        }
    });
    if json {
        let outcome = Outcome {
            name,
            key: &state.key,
            released,
            holders: &state.holders,
            holders_now: (after.is_some() || !released).then_some(holders_now),
        };
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else if released {
        let holders = state
            .holders
            .iter()
            .map(holder_text)
            .collect::<Vec<_>>()
            .join(", ");
        // The rule, not a claim about who got it: someone may have taken it since.
        let rule = if state.lock_kind == Some(Kind::ReadWrite) {
            "a force unlock serves the head of the line, as a release does"
        } else {
            "a force unlock grants the lock to the first live waiter in line, as a release does"
        };
        let list = |holders: Vec<&Holder>| {
            holders
                .into_iter()
                .map(holder_text)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (reserved, held): (Vec<&Holder>, Vec<&Holder>) =
            holders_now.iter().partition(|h| h.owner.starts_with('~'));
        let now = match after {
            None => rule.to_string(),
            Some(_) if holders_now.is_empty() => "it is free now".to_string(),
            Some(_) if held.is_empty() => {
                let fields: Vec<&str> = reserved.iter().map(|h| h.owner.as_str()).collect();
                format!("it is now reserved ({}): {rule}", fields.join(", "))
            }
            Some(_) => format!("it is now held by {}: {rule}", list(held)),
        };
        println!("force-unlocked {name:?}: it was held by {holders}; {now}");
    } else {
        println!("{name:?} was not locked: nothing to do");
    }
    Ok(())
}

/// The grants a lock is held under: each holder and the token it holds by (a plain or fair
/// lock's one grant, a read/write lock's writer and each reader; a reservation). A change means
/// the lock changed hands; a hold count that changed (a re-entry) does not.
fn grants(state: &inspect::LockState) -> Vec<(&str, Option<&'static str>, Option<u64>)> {
    let mut grants: Vec<_> = state
        .holders
        .iter()
        .map(|h| (h.owner.as_str(), h.role.map(|r| r.as_str()), h.token))
        .collect();
    grants.sort_unstable();
    grants.push(("~fence", None, state.fence));
    grants
}

/// `OWNER (hold count N)`, with a read/write lock's side: `OWNER (write hold count N)`.
fn holder_text(holder: &Holder) -> String {
    match holder.role {
        Some(role) => format!(
            "{} ({} hold count {})",
            holder.owner,
            role.as_str(),
            holder.hold_count
        ),
        None => format!("{} (hold count {})", holder.owner, holder.hold_count),
    }
}

/// Shows who holds the lock and reads the confirmation from the terminal.
async fn ask(state: &inspect::LockState) -> anyhow::Result<String> {
    let mut prompt = format!("lock {:?} (key {}) is held by\n", state.name, state.key);
    for holder in &state.holders {
        prompt.push_str(&format!("  {}\n", holder_text(holder)));
    }
    if let Some(ms) = state.ttl_ms {
        prompt.push_str(&format!(
            "with {} of lease left.\n",
            render::duration(Duration::from_millis(ms))
        ));
    } else if state.no_expiry {
        prompt.push_str("with no expiry: it would never free itself.\n");
    }
    prompt.push_str(
        "The holder is not told until its next renewal and may still be writing.\n\
         Type the lock name to confirm: ",
    );
    // Reading the terminal blocks; keep it off the runtime thread.
    tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let mut stderr = std::io::stderr().lock();
        stderr.write_all(prompt.as_bytes())?;
        stderr.flush()?;
        let mut line = String::new();
        let read = std::io::stdin().lock().read_line(&mut line)?;
        if read == 0 {
            bail!("aborted: no confirmation (end of input); nothing was changed");
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    })
    .await
    .context("the confirmation prompt failed")?
}
