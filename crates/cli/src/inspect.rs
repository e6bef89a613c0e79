//! `leasehold inspect NAME`: one lock as Redis holds it right now.
//!
//! Everything is read in one pipelined round trip (TYPE, HGETALL, PTTL, PUBSUB
//! NUMSUB). It is a snapshot, not a transaction: a lock released between two of those replies
//! shows up half-gone, which an operator tool can live with (run it again) and which keeps it
//! free of scripts that would need their own ACL permissions.

use std::collections::HashMap;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{HashesInterface, KeysInterface, PubsubInterface};
use fred::types::Value;
use leasehold::{LockError, LockKeys};
use serde::Serialize;

use crate::connect::connect;
use crate::render;

/// What a lock's keys hold right now.
#[derive(Debug, Clone, Serialize)]
pub struct LockState {
    /// The lock name.
    pub name: String,
    /// The lock hash `P:{N}`.
    pub key: String,
    /// `reentrant` (a leasehold lock hash), `none` (not locked), or `foreign:<type>` for a key
    /// that is not a leasehold lock (another type, or a hash whose values are not hold counts).
    pub kind: String,
    /// Owner id and hold count of each holder (one for a reentrant lock).
    pub holders: Vec<Holder>,
    /// Lease left in milliseconds; `null` when the key is absent or never expires.
    pub ttl_ms: Option<u64>,
    /// The key exists but has no expiry: it will never free itself (only force-unlock does).
    pub no_expiry: bool,
    /// The fencing token of the current grant (the hash's `~fence` field); `null` when free.
    pub fence: Option<u64>,
    /// Connections subscribed to the release channel: one per waiting client process, not per
    /// waiting task (a client shares one subscription among its waiters).
    pub waiters: u64,
}

/// One owner's holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// `<client uuid>:<local id>`.
    pub owner: String,
    /// Nested holds of this owner.
    pub hold_count: u64,
}

impl LockState {
    /// Whether the lock is held right now.
    pub fn is_locked(&self) -> bool {
        self.kind == "reentrant"
    }
}

/// The `inspect` command.
pub async fn run(url: &str, prefix: &str, name: &str, json: bool) -> anyhow::Result<()> {
    let client = connect(url, prefix).await?;
    let lock = client.lock(name)?;
    let state = fetch(client.redis(), lock.keys()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&state)?);
    } else {
        print!("{}", describe(&state));
    }
    Ok(())
}

/// Reads the state of the lock `keys` in one round trip.
pub async fn fetch(redis: &Client, keys: &LockKeys) -> anyhow::Result<LockState> {
    let pipeline = redis.pipeline();
    let redis_error = LockError::from_redis;
    // Queuing in a pipeline sends nothing and cannot fail on the wire.
    let _: () = pipeline.r#type(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline.hgetall(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline.pttl(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline
        .pubsub_numsub(keys.released())
        .await
        .map_err(redis_error)?;
    let mut replies = pipeline.try_all::<Value>().await.into_iter();
    let mut next = || replies.next().unwrap_or(Ok(Value::Null));

    let key_type = next()
        .map_err(redis_error)?
        .as_string()
        .unwrap_or_else(|| "none".into());
    // A WRONGTYPE error here just means the key is not a hash; TYPE already says what it is.
    let fields = next()
        .ok()
        .and_then(|v| v.convert::<HashMap<String, String>>().ok());
    let pttl = next().map_err(redis_error)?.as_i64().unwrap_or(-2);
    let fence = fields
        .as_ref()
        .and_then(|f| f.get(FENCE_FIELD))
        .and_then(|s| s.parse().ok());
    let waiters = next().ok().map_or(0, |v| numsub_count(&v));

    let (kind, holders) = match key_type.as_str() {
        "none" => ("none".to_string(), Vec::new()),
        "hash" => match fields.as_ref().and_then(holders_of) {
            Some(holders) => ("reentrant".to_string(), holders),
            None => ("foreign:hash".to_string(), Vec::new()),
        },
        other => (format!("foreign:{other}"), Vec::new()),
    };
    Ok(LockState {
        name: keys.name().to_string(),
        key: keys.hash().to_string(),
        kind,
        holders,
        ttl_ms: u64::try_from(pttl).ok(),
        no_expiry: pttl == -1,
        fence,
        waiters,
    })
}

/// The hash field that keeps the current grant's fencing token.
const FENCE_FIELD: &str = "~fence";

/// The holders of a lock hash, or `None` when a value is not a hold count (not our hash).
/// `~fence` is the grant's token, not a holder. Other fields starting with `~` are
/// reservations, not owners: `~turn:<client>` (the lock is kept for that client's turn for a
/// moment after a release) and `~expiring` (a run-once job's "hold at least" tail); they are
/// listed as they are.
pub fn holders_of(fields: &HashMap<String, String>) -> Option<Vec<Holder>> {
    let mut holders = fields
        .iter()
        .filter(|(field, _)| field.as_str() != FENCE_FIELD)
        .map(|(owner, count)| {
            let hold_count = count
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0 || owner.starts_with('~'))?;
            Some(Holder {
                owner: owner.clone(),
                hold_count,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    if holders.is_empty() {
        return None;
    }
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    Some(holders)
}

/// The count in a `PUBSUB NUMSUB channel` reply (`[channel, count]`, or a map in RESP3).
fn numsub_count(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items.get(1).and_then(Value::as_u64).unwrap_or(0),
        Value::Map(map) => map
            .clone()
            .inner()
            .values()
            .next()
            .and_then(Value::as_u64)
            .unwrap_or(0),
        _ => 0,
    }
}

/// The human-readable account of `state`.
pub fn describe(state: &LockState) -> String {
    let mut rows = vec![
        vec!["lock".into(), state.name.clone()],
        vec!["key".into(), state.key.clone()],
    ];
    let kind = match state.kind.as_str() {
        "none" => "none (not locked)".to_string(),
        "reentrant" => "reentrant".to_string(),
        other => format!("{other} (not a leasehold lock: left alone)"),
    };
    rows.push(vec!["kind".into(), kind]);
    for holder in &state.holders {
        rows.push(vec![
            "holder".into(),
            format!("{}  hold count {}", holder.owner, holder.hold_count),
        ]);
    }
    if state.kind != "none" {
        let lease = match (state.ttl_ms, state.no_expiry) {
            (Some(ms), _) => format!("{} left", render::duration(Duration::from_millis(ms))),
            (None, true) if state.is_locked() => {
                "no expiry: it never frees itself (see unlock --force)".into()
            }
            (None, true) => "no expiry".into(),
            (None, false) => "gone just now".into(),
        };
        rows.push(vec!["lease".into(), lease]);
    }
    let fence = match state.fence {
        Some(token) => format!("{token} (this grant's token; the next grant gets more)"),
        None => "none (not held)".into(),
    };
    rows.push(vec!["fence".into(), fence]);
    rows.push(vec![
        "waiters".into(),
        format!(
            "{} client{} subscribed to the release channel",
            state.waiters,
            if state.waiters == 1 { "" } else { "s" }
        ),
    ]);
    render::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_counts_parse() {
        let fields = HashMap::from([("b:t1".to_string(), "2".to_string())]);
        assert_eq!(
            holders_of(&fields),
            Some(vec![Holder {
                owner: "b:t1".into(),
                hold_count: 2
            }])
        );
        let foreign = HashMap::from([("field".to_string(), "hello".to_string())]);
        assert_eq!(holders_of(&foreign), None);
        assert_eq!(holders_of(&HashMap::new()), None);
    }

    #[test]
    fn numsub_replies() {
        let reply = Value::Array(vec![Value::from("ch"), Value::from(3_i64)]);
        assert_eq!(numsub_count(&reply), 3);
        assert_eq!(numsub_count(&Value::Null), 0);
    }
}
