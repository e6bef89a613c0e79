//! One typed call per script: arguments in, a typed reply out.
//!
//! These functions send exactly one script call (plus SCRIPT LOAD after NOSCRIPT) and never
//! wait or retry: waiting and renewal policy live in the crates above.

use std::time::Duration;

use fred::interfaces::LuaInterface;
use fred::prelude::{Error as FredError, ErrorKind, Value};

use crate::scripts::{ACQUIRE, FORCE_UNLOCK, RELEASE, RENEW, ROLLBACK};
use crate::{FencingToken, LockKeys, Owner};

/// The publish command scripts use for release messages.
///
/// PUBLISH on a single node; Redis Cluster support would switch to SPUBLISH so the message stays
/// in the lock's slot.
pub const PUBLISH: &str = "PUBLISH";

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
    /// One hold released; `remaining` 0 means the lock is now free (and the release published).
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

fn int_at(values: &[Value], i: usize) -> Option<i64> {
    values.get(i).and_then(Value::as_i64)
}

/// Runs the acquire script for `owner` with a lease of `lease_ms` milliseconds.
pub async fn acquire<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
    lease_ms: u64,
) -> Result<Acquire, FredError> {
    let reply: Value = ACQUIRE
        .call(
            client,
            vec![keys.hash(), keys.fence()],
            vec![Value::from(owner.id()), Value::from(lease_ms as i64)],
        )
        .await?;
    let Value::Array(values) = &reply else {
        return Err(parse_error("acquire", &reply));
    };
    match (int_at(values, 0), int_at(values, 1), int_at(values, 2)) {
        (Some(1), Some(count), Some(fence)) if count > 0 && fence > 0 => Ok(Acquire::Granted {
            hold_count: count as u64,
            fence: FencingToken::new(fence as u64),
        }),
        (Some(0), Some(pttl), _) => Ok(Acquire::Held {
            ttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
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
        .call(
            client,
            keys.hash(),
            vec![owner.id(), keys.released(), PUBLISH],
        )
        .await?;
    let Value::Array(values) = &reply else {
        return Err(parse_error("release", &reply));
    };
    match (int_at(values, 0), int_at(values, 1)) {
        (Some(1), Some(remaining)) if remaining >= 0 => Ok(Release::Released {
            remaining: remaining as u64,
        }),
        (Some(0), _) => Ok(Release::NotHeld),
        _ => Err(parse_error("release", &reply)),
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
        .call(
            client,
            keys.hash(),
            vec![
                Value::from(owner.id()),
                Value::from(expected_count as i64),
                Value::from(keys.released()),
                Value::from(PUBLISH),
            ],
        )
        .await?;
    Ok(undone == 1)
}

/// Runs the renew script over `holds` (lock hash, owner id) with a lease of `lease_ms`.
/// Returns, in order, whether each hold was still held (and is now renewed).
///
/// On Redis Cluster every key of one call must share a slot: the caller groups by slot.
pub async fn renew<C: LuaInterface + Send + Sync>(
    client: &C,
    holds: &[(&str, &str)],
    lease_ms: u64,
) -> Result<Vec<bool>, FredError> {
    if holds.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = holds.iter().map(|(key, _)| *key).collect();
    let mut args = Vec::with_capacity(holds.len() + 1);
    args.push(Value::from(lease_ms as i64));
    args.extend(holds.iter().map(|(_, owner)| Value::from(*owner)));
    let reply: Value = RENEW.call(client, keys, args).await?;
    match &reply {
        Value::Array(values) if values.len() == holds.len() => {
            Ok(values.iter().map(|v| v.as_i64() == Some(1)).collect())
        }
        _ => Err(parse_error("renew", &reply)),
    }
}

/// Runs the force-unlock script: removes the lock whoever holds it and publishes the release.
/// Returns whether there was a lock.
pub async fn force_unlock<C: LuaInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
) -> Result<bool, FredError> {
    let removed: i64 = FORCE_UNLOCK
        .call(client, keys.hash(), vec![keys.released(), PUBLISH])
        .await?;
    Ok(removed == 1)
}
