//! One typed call per script: arguments in, a typed reply out.
//!
//! These functions send exactly one script call (plus SCRIPT LOAD after NOSCRIPT) and never
//! wait or retry: waiting and renewal policy live in the crates above.

use std::time::Duration;

use fred::interfaces::LuaInterface;
use fred::prelude::{Error as FredError, ErrorKind, Value};
use fred::types::Key;

use crate::scripts::{ACQUIRE, FORCE_UNLOCK, RELEASE, RELEASE_AFTER, RENEW, ROLLBACK};
use crate::{FencingToken, LockKeys, Owner};

/// How long a released lock stays reserved for the client whose turn it is, and how long other
/// clients wait before trying themselves when that client does not take it (crashed, or its
/// waiter left). Loopback handoffs take well under a millisecond; 25 ms also covers a LAN.
///
/// The release script has this value written in (it is not sent with each call); a test keeps
/// the two equal. The scripts also name PUBLISH directly: Redis Cluster support would ship
/// variants with SPUBLISH, so the message stays in the lock's slot.
pub const TURN_GRACE: Duration = Duration::from_millis(25);

/// The reply of the acquire script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Granted: `hold_count` 1 for a new grant, more for a re-entry.
    Granted {
        /// The owner's hold count after this acquire.
        hold_count: u64,
        /// The fencing token of the grant this hold belongs to.
        fence: FencingToken,
    },
    /// Held by another owner.
    Held {
        /// The remaining lease of the current holder (`None`: the key has no TTL).
        ttl: Option<Duration>,
    },
}

/// The reply of the release script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// One hold released; `remaining` 0 means the owner's last hold is gone. After `release`
    /// the release was published and the lock is free, or reserved for a queued client's turn;
    /// after `release_after` the lock stays, owned by nobody, until its tail runs out.
    Released {
        /// Holds the owner still has.
        remaining: u64,
    },
    /// The owner held nothing; nothing changed.
    NotHeld,
}

fn parse_error(script: &str, value: &Value) -> FredError {
    FredError::new(
        ErrorKind::Parse,
        format!("unexpected reply from the {script} script: {value:?}"),
    )
}

/// An integer reply element; scripts may also answer decimal text (fencing tokens).
fn int_at(values: &[Value], i: usize) -> Option<i64> {
    let value = values.get(i)?;
    value.as_i64().or_else(|| {
        value
            .as_bytes()
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
    })
}

/// A subscribed waiter's place in the turn queue (see `scripts/acquire.lua`).
#[derive(Clone, Copy, Debug)]
pub struct Waiter<'a> {
    /// The waiter's client id ([`ClientId::as_str`](crate::ClientId::as_str)).
    pub client: &'a str,
    /// Whether that client has other waiters on this lock (it then stays queued after this
    /// waiter's turn, at the back).
    pub more: bool,
}

/// Runs the acquire script for `owner` with a lease of `lease_ms` milliseconds. A subscribed
/// `waiter` joins the turn queue when the lock is held, and takes its turn when granted.
pub async fn acquire<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
    lease_ms: u64,
    waiter: Option<Waiter<'_>>,
) -> Result<Acquire, FredError> {
    let reply: Value = ACQUIRE
        .call(client, || {
            let mut key_list = Vec::with_capacity(3);
            key_list.push(Key::from(keys.hash_str()));
            key_list.push(Key::from(keys.fence_str()));
            let mut args = Vec::with_capacity(5);
            args.push(Value::from(owner.id_str().clone()));
            args.push(Value::from(lease_ms as i64));
            // A plain try sends only what the grant needs (see the script's header).
            if let Some(w) = &waiter {
                key_list.push(Key::from(keys.queue_str()));
                args.push(Value::from(w.client));
                args.push(Value::from(if w.more { "1" } else { "0" }));
                args.push(Value::from(keys.released_str().clone()));
            }
            (key_list.into(), Value::Array(args))
        })
        .await?;
    let values = match &reply {
        Value::Array(values) => values,
        // A new grant answers its token alone.
        scalar => {
            return match int_at(std::slice::from_ref(scalar), 0) {
                Some(fence) if fence > 0 => Ok(Acquire::Granted {
                    hold_count: 1,
                    fence: FencingToken::new(fence as u64),
                }),
                _ => Err(parse_error("acquire", &reply)),
            };
        }
    };
    match (int_at(values, 0), int_at(values, 1)) {
        (Some(0), Some(pttl)) => Ok(Acquire::Held {
            ttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
        }),
        // A re-entry reports fence 0 only if someone removed the hash's `~fence` under a live
        // lock; the hold is real, so it is returned (a fenced store refuses token 0 anyway).
        (Some(count), Some(fence)) if count > 1 && fence >= 0 => Ok(Acquire::Granted {
            hold_count: count as u64,
            fence: FencingToken::new(fence as u64),
        }),
        _ => Err(parse_error("acquire", &reply)),
    }
}

/// Runs the release script: releases one hold of `owner`.
pub async fn release<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
) -> Result<Release, FredError> {
    let reply: Value = RELEASE
        .call(client, || {
            (
                vec![Key::from(keys.hash_str()), Key::from(keys.queue_str())].into(),
                Value::Array(vec![
                    Value::from(owner.id_str().clone()),
                    Value::from(keys.released_str().clone()),
                ]),
            )
        })
        .await?;
    parse_release("release", reply)
}

/// Runs the release-after script: the owner's last hold stays (owned by nobody) for
/// `after_ms` more milliseconds; a re-entered hold is released as usual.
pub async fn release_after<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
    after_ms: u64,
) -> Result<Release, FredError> {
    let reply: Value = RELEASE_AFTER
        .call(client, || {
            (
                Key::from(keys.hash_str()).into(),
                Value::Array(vec![
                    Value::from(owner.id_str().clone()),
                    Value::from(after_ms as i64),
                ]),
            )
        })
        .await?;
    parse_release("release_after", reply)
}

fn parse_release(script: &str, reply: Value) -> Result<Release, FredError> {
    match reply.as_i64() {
        Some(-1) => Ok(Release::NotHeld),
        Some(remaining) if remaining >= 0 => Ok(Release::Released {
            remaining: remaining as u64,
        }),
        _ => Err(parse_error(script, &reply)),
    }
}

/// Runs the rollback script: takes back one hold of `owner` if its count is exactly
/// `expected_count` (what an unanswered acquire would have produced). Returns whether it did.
pub async fn rollback<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
    expected_count: u64,
) -> Result<bool, FredError> {
    let undone: i64 = ROLLBACK
        .call(client, || {
            (
                Key::from(keys.hash_str()).into(),
                Value::Array(vec![
                    Value::from(owner.id_str().clone()),
                    Value::from(expected_count as i64),
                    Value::from(keys.released_str().clone()),
                ]),
            )
        })
        .await?;
    Ok(undone == 1)
}

/// Runs the renew script over `holds` (lock, owner) with a lease of `lease_ms`.
/// Returns, in order, whether each hold was still held (and is now renewed).
///
/// On Redis Cluster every key of one call must share a slot: the caller groups by slot.
pub async fn renew<C: LuaInterface + Send + Sync>(
    client: &C,
    holds: &[(LockKeys, Owner)],
    lease_ms: u64,
) -> Result<Vec<bool>, FredError> {
    if holds.is_empty() {
        return Ok(Vec::new());
    }
    let reply: Value = RENEW
        .call(client, || {
            let keys: Vec<Key> = holds
                .iter()
                .map(|(keys, _)| Key::from(keys.hash_str()))
                .collect();
            let mut args = Vec::with_capacity(holds.len() + 1);
            args.push(Value::from(lease_ms as i64));
            args.extend(
                holds
                    .iter()
                    .map(|(_, owner)| Value::from(owner.id_str().clone())),
            );
            (keys.into(), Value::Array(args))
        })
        .await?;
    match &reply {
        Value::Array(values) if values.len() == holds.len() => {
            Ok(values.iter().map(|v| v.as_i64() == Some(1)).collect())
        }
        _ => Err(parse_error("renew", &reply)),
    }
}

/// Takes `client_id` out of the lock's turn queue (its last waiter gave up). One ZREM: a
/// plain command, not a state change that needs a script.
pub async fn leave_queue<C: fred::interfaces::SortedSetsInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    client_id: &str,
) -> Result<(), FredError> {
    client.zrem::<(), _, _>(keys.queue(), client_id).await
}

/// Runs the force-unlock script: removes the lock whoever holds it and publishes the release.
/// Returns whether there was a lock.
pub async fn force_unlock<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
) -> Result<bool, FredError> {
    let removed: i64 = FORCE_UNLOCK
        .call(client, || {
            (
                Key::from(keys.hash_str()).into(),
                Value::Array(vec![Value::from(keys.released_str().clone())]),
            )
        })
        .await?;
    Ok(removed == 1)
}

#[cfg(test)]
mod tests {
    use super::TURN_GRACE;
    use crate::scripts::RELEASE;

    #[test]
    fn release_script_reserves_turns_for_turn_grace() {
        let pexpire = format!(
            "redis.call('PEXPIRE', KEYS[1], '{}')",
            TURN_GRACE.as_millis()
        );
        assert!(
            RELEASE.lua().contains(&pexpire),
            "release.lua must use TURN_GRACE"
        );
    }
}
