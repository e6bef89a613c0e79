//! `leasehold list [PATTERN]`: the locks under a prefix.
//!
//! Keys are found with `SCAN MATCH PREFIX:* TYPE hash` (never `KEYS`, which blocks Redis for
//! the whole keyspace); the fencing counter is a string and other kinds of keys are skipped. The
//! holders and lease of each lock are then read with one pipelined round trip per batch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{HashesInterface, KeysInterface};
use fred::types::scan::ScanType;
use fred::types::Value;
use futures::TryStreamExt;
use leasehold::{LockError, LockKeys};
use leasehold_core::Prefix;
use serde::Serialize;

use crate::connect::connect;
use crate::inspect::{holders_of, Holder};
use crate::{glob, render};

/// Keys asked for per SCAN page, and locks read per pipelined round trip.
const BATCH: usize = 500;

/// One held lock in the listing.
#[derive(Debug, Clone, Serialize)]
pub struct ListedLock {
    /// The lock name.
    pub name: String,
    /// The lock hash.
    pub key: String,
    /// Owner ids and hold counts.
    pub holders: Vec<Holder>,
    /// Lease left in milliseconds; `null` when the key never expires.
    pub ttl_ms: Option<u64>,
}

/// The whole listing, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Listing {
    /// The key prefix searched.
    pub prefix: String,
    /// The glob the names matched.
    pub pattern: String,
    /// The locks, sorted by name.
    pub locks: Vec<ListedLock>,
}

/// The `list` command.
pub async fn run(url: &str, prefix: &str, pattern: &str, json: bool) -> anyhow::Result<()> {
    let client = connect(url, prefix).await?;
    let prefix = Prefix::new(prefix)?;
    let locks = list(client.redis(), &prefix, pattern).await?;
    let listing = Listing {
        prefix: prefix.to_string(),
        pattern: pattern.to_string(),
        locks,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        print!("{}", describe(&listing));
    }
    Ok(())
}

/// The locks under `prefix` whose names match `pattern`, sorted by name.
pub async fn list(
    redis: &Client,
    prefix: &Prefix,
    pattern: &str,
) -> anyhow::Result<Vec<ListedLock>> {
    let redis_error = LockError::from_redis;
    let keys: BTreeSet<String> = redis
        .scan_buffered(
            format!("{}:*", glob::escape(prefix.as_str())),
            Some(BATCH as u32),
            Some(ScanType::Hash),
        )
        .map_err(redis_error)
        .try_filter_map(|key| async move { Ok(key.as_str().map(str::to_string)) })
        .try_collect()
        .await?;
    // SCAN may return a key twice (rehashing); the set removes duplicates and sorts.
    let names: BTreeMap<String, String> = keys
        .into_iter()
        .filter_map(|key| lock_name(prefix, &key).map(|name| (name, key)))
        .filter(|(name, _)| glob::matches(pattern, name))
        .collect();

    let mut locks = Vec::with_capacity(names.len());
    let names: Vec<(String, String)> = names.into_iter().collect();
    for batch in names.chunks(BATCH) {
        let pipeline = redis.pipeline();
        for (_, key) in batch {
            let _: () = pipeline.hgetall(key.as_str()).await.map_err(redis_error)?;
            let _: () = pipeline.pttl(key.as_str()).await.map_err(redis_error)?;
        }
        let replies = pipeline.try_all::<Value>().await;
        // A batch that failed as a whole (timeout, lost connection) comes back as one error:
        // report it rather than list nothing.
        if replies.len() != 2 * batch.len() {
            let error = replies.into_iter().find_map(Result::err);
            return Err(match error {
                Some(error) => redis_error(error).into(),
                None => {
                    anyhow::anyhow!("Redis answered a batch of {} reads short", 2 * batch.len())
                }
            });
        }
        for ((name, key), pair) in batch.iter().zip(replies.chunks(2)) {
            let [fields, pttl] = pair else { continue };
            // Released (or replaced by another type) since the scan: not a lock any more.
            let Some(holders) = fields
                .as_ref()
                .ok()
                .and_then(|v| v.clone().convert::<HashMap<String, String>>().ok())
                .as_ref()
                .and_then(holders_of)
            else {
                continue;
            };
            let pttl = pttl.as_ref().ok().and_then(Value::as_i64).unwrap_or(-2);
            if pttl == -2 {
                continue;
            }
            locks.push(ListedLock {
                name: name.clone(),
                key: key.clone(),
                holders,
                ttl_ms: u64::try_from(pttl).ok(),
            });
        }
    }
    Ok(locks)
}

/// The lock name whose hash is `key` under `prefix`, or `None` for a key that is not one:
/// a fencing counter, another kind's key (`P:{N}:...`), or a key no name maps to.
pub fn lock_name(prefix: &Prefix, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix.as_str())?.strip_prefix(':')?;
    // `P:{N}` for a plain name; a name with its own hash tag is the key's rest as given.
    let candidate = rest
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .filter(|inner| !inner.is_empty() && !inner.contains(['{', '}']))
        .unwrap_or(rest);
    let keys = LockKeys::new(prefix, candidate).ok()?;
    (keys.hash() == key).then(|| candidate.to_string())
}

/// The human-readable listing.
pub fn describe(listing: &Listing) -> String {
    if listing.locks.is_empty() {
        return format!(
            "no locks under prefix {:?} match {:?}\n",
            listing.prefix, listing.pattern
        );
    }
    let mut rows = vec![vec!["NAME".into(), "HOLDERS".into(), "TTL".into()]];
    for lock in &listing.locks {
        let holders = lock
            .holders
            .iter()
            .map(|h| format!("{} x{}", h.owner, h.hold_count))
            .collect::<Vec<_>>()
            .join(", ");
        let ttl = lock.ttl_ms.map_or_else(
            || "no expiry".to_string(),
            |ms| render::duration(Duration::from_millis(ms)),
        );
        rows.push(vec![lock.name.clone(), holders, ttl]);
    }
    let n = listing.locks.len();
    format!(
        "{}{n} lock{}\n",
        render::table(&rows),
        if n == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_keys() {
        let p = Prefix::default();
        let name = |key: &str| lock_name(&p, key);
        assert_eq!(
            name("leasehold:{inventory:42}").as_deref(),
            Some("inventory:42")
        );
        assert_eq!(
            name("leasehold:order:{42}:pay").as_deref(),
            Some("order:{42}:pay")
        );
        assert_eq!(name("leasehold:fence"), None);
        assert_eq!(name("leasehold:{1742}:fence"), None);
        assert_eq!(name("leasehold:{inventory:42}:queue"), None);
        assert_eq!(name("leasehold:plain"), None);
        assert_eq!(name("other:{x}"), None);
        assert_eq!(name("leaseholdx:{x}"), None);
        assert_eq!(name("leasehold:{}"), None);
    }
}
