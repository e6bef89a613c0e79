//! `leasehold list [PATTERN]`: the locks, semaphores and count-down latches under a prefix.
//!
//! Keys are found with `SCAN MATCH PREFIX:* TYPE hash` (never `KEYS`, which blocks Redis for
//! the whole keyspace), on every primary of a Redis Cluster; the fencing counter is a string,
//! the lines of waiters and the leases are zsets, a semaphore's `:wants` is skipped by its
//! name, and other kinds of keys are skipped. The holders, lease and line length of each lock
//! (a semaphore's permits, a latch's count) are then read with one pipelined round trip per
//! batch. A plain and a fair lock share one layout: both are listed as `lock`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error as RedisError;
use fred::interfaces::{ClientLike, HashesInterface, KeysInterface, SortedSetsInterface};
use fred::types::scan::ScanType;
use fred::types::{Key, Value};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use leasehold::{LockError, LockKeys};
use leasehold_core::Prefix;
use serde::Serialize;

use crate::connect::connect;
use crate::layout::{self, Holder, Kind, Mode, Permits};
use crate::{glob, render};

/// Keys asked for per SCAN page, and locks read per pipelined round trip.
const BATCH: usize = 500;

/// Replies read per lock: HGETALL and PTTL of the hash, ZCARD of the line of waiters, and the
/// first waiter (whose score tells a lock's line from a read/write lock's).
const READS_PER_LOCK: usize = 4;

/// One held lock in the listing (or a semaphore or a latch: they are listed while they exist,
/// whatever they hold).
#[derive(Debug, Clone, Serialize)]
pub struct ListedLock {
    /// The lock name.
    pub name: String,
    /// The lock hash.
    pub key: String,
    /// Owner ids and hold counts (for a read/write lock, with each hold's role and token; for
    /// a semaphore, each acquisition's id, permits and token).
    pub holders: Vec<Holder>,
    /// Lease left in milliseconds; `null` when the key never expires (a semaphore's and a
    /// latch's never do).
    pub ttl_ms: Option<u64>,
    /// `lock`, `rwlock`, `semaphore` or `latch`, as in `inspect --json` (a plain and a fair
    /// lock share one layout: both are a `lock`).
    #[serde(serialize_with = "crate::layout::serialize_kind")]
    pub lock_kind: Kind,
    /// A read/write lock's mode, `read` or `write`; `null` otherwise.
    pub mode: Option<Mode>,
    /// The current grant's fencing token (`~fence`; a read/write lock's writer's); `null`
    /// when only read-held or reserved.
    pub fence: Option<u64>,
    /// Entries in the line of waiters (`P:{N}:waiters`): a plain lock's waiting clients (one
    /// entry per client however many of its tasks wait), a fair or read/write lock's or a
    /// semaphore's waiting owners. A latch's waiters are not in a line (see `inspect`): 0.
    pub queued: u64,
    /// A semaphore's number of permits, as in `inspect --json`; `null` for other kinds.
    pub permits: Option<i64>,
    /// A semaphore's permits taken now; `null` for other kinds.
    pub permits_taken: Option<i64>,
    /// A semaphore's permits not taken; `null` for other kinds.
    pub permits_available: Option<i64>,
    /// A count-down latch's count; `null` for other kinds.
    pub count: Option<u64>,
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
    let keys: BTreeSet<String> = scan_keys(
        redis,
        format!("{}:*", glob::escape(prefix.as_str())),
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
    let now_us = layout::local_time_us();
    for batch in names.chunks(BATCH) {
        let pipeline = redis.pipeline();
        for (_, key) in batch {
            let waiters = format!("{key}:waiters");
            let _: () = pipeline.hgetall(key.as_str()).await.map_err(redis_error)?;
            let _: () = pipeline.pttl(key.as_str()).await.map_err(redis_error)?;
            let _: () = pipeline
                .zcard(waiters.as_str())
                .await
                .map_err(redis_error)?;
            let _: () = pipeline
                .zrange(waiters.as_str(), 0, 0, None, false, None, true)
                .await
                .map_err(redis_error)?;
        }
        let replies = pipeline.try_all::<Value>().await;
        // A batch that failed as a whole (timeout, lost connection) comes back as one error:
        // report it rather than list nothing.
        if replies.len() != READS_PER_LOCK * batch.len() {
            let error = replies.into_iter().find_map(Result::err);
            return Err(match error {
                Some(error) => redis_error(error).into(),
                None => anyhow::anyhow!(
                    "Redis answered a batch of {} reads short",
                    READS_PER_LOCK * batch.len()
                ),
            });
        }
        for ((name, key), reads) in batch.iter().zip(replies.chunks(READS_PER_LOCK)) {
            let [fields, pttl, waiters, head] = reads else {
                continue;
            };
            // A foreign key where a zset belongs counts as empty.
            let zcard = |reply: &Result<Value, _>| reply.as_ref().ok().and_then(Value::as_u64);
            let head = head.as_ref().ok().map(layout::scored).unwrap_or_default();
            let queued_kind = layout::kind_of_queue(head.first().map(|(_, s)| *s), now_us);
            // Released (or replaced by another type) since the scan: not a lock any more.
            let Some(reading) = fields
                .as_ref()
                .ok()
                .and_then(|v| v.clone().convert::<HashMap<String, String>>().ok())
                .and_then(|f| layout::read_hash(&f, queued_kind, &HashMap::new()))
            else {
                continue;
            };
            let pttl = pttl.as_ref().ok().and_then(Value::as_i64).unwrap_or(-2);
            if pttl == -2 {
                continue;
            }
            let permits = reading.permits;
            locks.push(ListedLock {
                name: name.clone(),
                key: key.clone(),
                holders: reading.holders,
                ttl_ms: u64::try_from(pttl).ok(),
                lock_kind: reading.kind,
                mode: reading.mode,
                fence: reading.fence,
                queued: zcard(waiters).unwrap_or(0),
                permits: permits.map(|p| p.total),
                permits_taken: permits.map(|p| p.taken),
                permits_available: permits.map(Permits::available),
                count: reading.count,
            });
        }
    }
    Ok(locks)
}

/// The keys matching `pattern` (`SCAN MATCH pattern [TYPE type]`, pages of [`BATCH`]): on a
/// Redis Cluster, of every primary (a plain SCAN would see one node's keys only); elsewhere of
/// the one server.
pub fn scan_keys(
    redis: &Client,
    pattern: String,
    r#type: Option<ScanType>,
) -> BoxStream<'static, Result<Key, RedisError>> {
    if redis.is_clustered() {
        redis
            .scan_cluster_buffered(pattern, Some(BATCH as u32), r#type)
            .boxed()
    } else {
        redis
            .scan_buffered(pattern, Some(BATCH as u32), r#type)
            .boxed()
    }
}

/// The lock name whose hash is `key` under `prefix`, or `None` for a key that is not one:
/// a fencing counter, a lock's own other keys (`P:{N}:waiters`, `:waiters:until`, `:leases`,
/// a semaphore's `:wants`, ...), or a key no name maps to.
pub fn lock_name(prefix: &Prefix, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix.as_str())?.strip_prefix(':')?;
    // `P:{N}` for a plain name; a name with its own hash tag is the key's rest as given.
    let wrapped = rest
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .filter(|inner| !inner.is_empty() && !inner.contains(['{', '}']));
    let candidate = match wrapped {
        Some(inner) => inner,
        // A tagged name ending like a lock's own key would be that key: `P:{N}:leases` is
        // lock N's leases, not a lock named `{N}:leases` (which the library refuses).
        None if layout::AUXILIARY_SUFFIXES
            .iter()
            .any(|suffix| rest.ends_with(suffix)) =>
        {
            return None
        }
        None => rest,
    };
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
    let mut rows = vec![["NAME", "KIND", "MODE", "HOLDERS", "QUEUED", "TTL"]
        .map(String::from)
        .to_vec()];
    for lock in &listing.locks {
        let holders = lock
            .holders
            .iter()
            .map(|h| match (h.permits, h.role) {
                (Some(n), _) => format!("{} ({n} permit{})", h.owner, plural(n as usize)),
                (None, Some(role)) => {
                    format!("{} x{} ({})", h.owner, h.hold_count, role.as_str())
                }
                (None, None) => format!("{} x{}", h.owner, h.hold_count),
            })
            .collect::<Vec<_>>()
            .join(", ");
        rows.push(vec![
            lock.name.clone(),
            lock.lock_kind.label().into(),
            mode_cell(lock),
            if holders.is_empty() {
                "-".into()
            } else {
                holders
            },
            queued_cell(lock),
            ttl_cell(lock),
        ]);
    }
    format!("{}{}\n", render::table(&rows), totals(&listing.locks))
}

/// `4 locks`, or with semaphores and latches among them `2 locks, 1 semaphore, 1 latch`.
fn totals(locks: &[ListedLock]) -> String {
    let count = |f: fn(Kind) -> bool| locks.iter().filter(|l| f(l.lock_kind)).count();
    let (n_locks, n_semaphores, n_latches) = (
        count(Kind::is_lock),
        count(|k| k == Kind::Semaphore),
        count(|k| k == Kind::Latch),
    );
    let mut parts = Vec::new();
    if n_locks > 0 || locks.is_empty() {
        parts.push(format!("{n_locks} lock{}", plural(n_locks)));
    }
    if n_semaphores > 0 {
        parts.push(format!("{n_semaphores} semaphore{}", plural(n_semaphores)));
    }
    if n_latches > 0 {
        parts.push(format!(
            "{n_latches} latch{}",
            if n_latches == 1 { "" } else { "es" }
        ));
    }
    parts.join(", ")
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A lock's MODE cell: a read/write lock's mode, `-` for the other locks; a semaphore's permits taken of its
/// number (`3/5 taken`), a latch's count (`count 2`).
pub fn mode_cell(lock: &ListedLock) -> String {
    match lock.lock_kind {
        Kind::Semaphore => format!(
            "{}/{} taken",
            lock.permits_taken.unwrap_or(0),
            lock.permits.unwrap_or(0)
        ),
        Kind::Latch => format!("count {}", lock.count.unwrap_or(0)),
        Kind::Lock | Kind::ReadWrite => lock.mode.map_or("-", Mode::as_str).to_string(),
    }
}

/// The QUEUED cell: entries queued; `-` for a latch, whose waiters do not queue.
pub fn queued_cell(lock: &ListedLock) -> String {
    if lock.lock_kind == Kind::Latch {
        "-".into()
    } else {
        lock.queued.to_string()
    }
}

/// The TTL (or LEASE) cell: the lease left; `no expiry` for a lock that never frees itself;
/// `-` for a semaphore or a latch, whose keys have no TTL by design (a semaphore's permits
/// have leases of their own: see `inspect`).
pub fn ttl_cell(lock: &ListedLock) -> String {
    match lock.ttl_ms {
        Some(ms) => render::duration(Duration::from_millis(ms)),
        None if lock.lock_kind.is_lock() => "no expiry".into(),
        None => "-".into(),
    }
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
        for suffix in layout::AUXILIARY_SUFFIXES {
            assert_eq!(
                name(&format!("leasehold:{{docs}}{suffix}")),
                None,
                "{suffix}"
            );
            assert_eq!(
                name(&format!("leasehold:a:{{b}}{suffix}")),
                None,
                "{suffix}"
            );
        }
        // Plain names may end that way: their key is wrapped in braces.
        assert_eq!(
            name("leasehold:{docs:leases}").as_deref(),
            Some("docs:leases")
        );
        assert_eq!(name("leasehold:{x:waiters}").as_deref(), Some("x:waiters"));
        // A semaphore's waiters' wants: a hash, skipped by name.
        assert_eq!(name("leasehold:{pool}:wants"), None);
        assert_eq!(
            name("leasehold:{pool:wants}").as_deref(),
            Some("pool:wants")
        );
    }

    fn listed(lock_kind: Kind) -> ListedLock {
        ListedLock {
            name: "x".into(),
            key: "leasehold:{x}".into(),
            holders: Vec::new(),
            ttl_ms: None,
            lock_kind,
            mode: None,
            fence: None,
            queued: 0,
            permits: None,
            permits_taken: None,
            permits_available: None,
            count: None,
        }
    }

    #[test]
    fn semaphore_and_latch_rows() {
        let mut semaphore = listed(Kind::Semaphore);
        (semaphore.permits, semaphore.permits_taken) = (Some(5), Some(3));
        semaphore.queued = 2;
        semaphore.holders.push(Holder {
            owner: "a:o1".into(),
            hold_count: 1,
            role: None,
            token: Some(4),
            lease_ms: None,
            permits: Some(3),
        });
        let mut latch = listed(Kind::Latch);
        latch.name = "y".into();
        latch.count = Some(2);
        let mut lock = listed(Kind::Lock);
        lock.name = "z".into();
        lock.holders.push(Holder {
            owner: "b:t1".into(),
            hold_count: 1,
            role: None,
            token: Some(5),
            lease_ms: None,
            permits: None,
        });
        let listing = Listing {
            prefix: "leasehold".into(),
            pattern: "*".into(),
            locks: vec![semaphore, latch, lock],
        };
        let text = describe(&listing);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1..],
            [
                "x     semaphore  3/5 taken  a:o1 (3 permits)  2       -",
                "y     latch      count 2    -                 -       -",
                "z     lock       -          b:t1 x1           0       no expiry",
                "1 lock, 1 semaphore, 1 latch",
            ],
            "{text}"
        );
        assert_eq!(totals(&listing.locks[2..]), "1 lock");
        assert_eq!(totals(&listing.locks[..1]), "1 semaphore");
    }
}
