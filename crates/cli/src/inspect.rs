//! `leasehold inspect NAME`: one lock, semaphore or count-down latch as Redis holds it right
//! now.
//!
//! Everything is read in one pipelined round trip (TYPE, HGETALL, PTTL, PUBSUB NUMSUB of the
//! release channel, ZRANGE of the line of waiters, their deadlines and a read/write lock's or a
//! semaphore's leases, HGETALL of the permits a semaphore's waiters want, and TIME for the
//! server's clock those deadlines are in); on a Redis Cluster, PUBSUB NUMSUB is asked of every
//! primary (a client subscribes on one of them).
//!
//! A plain and a fair lock share one layout (a release grants the lock to the head of the
//! line, `P:{N}:waiters`): nothing in Redis tells them apart, so both show as kind `lock`, with
//! their waiters in arrival order. It is a snapshot, not a transaction: a lock
//! released between two of those replies shows up half-gone, which an operator tool can live
//! with (run it again) and which keeps it free of scripts that would need their own ACL
//! permissions. A zset read that is refused (a key of another type, or the ACL denies it)
//! reads as empty; without TIME, this machine's clock stands in.

use std::collections::HashMap;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{
    ClientLike, HashesInterface, KeysInterface, PubsubInterface, SortedSetsInterface,
};
use fred::types::{ClusterHash, CustomCommand, Value};
use leasehold::{LockError, LockKeys};
use leasehold_core::protocol::FENCE_FIELD;
use serde::Serialize;

use crate::connect::connect;
use crate::layout::{self, Kind, Mode, Permits, Waiter};
use crate::render;

pub use crate::layout::Holder;

/// What a lock's (or a semaphore's, or a latch's) keys hold right now.
#[derive(Debug, Clone, Serialize)]
pub struct LockState {
    /// The lock name.
    pub name: String,
    /// The lock hash `P:{N}`.
    pub key: String,
    /// `reentrant` (a leasehold lock hash, of any [`lock_kind`](Self::lock_kind)), `semaphore`
    /// or `latch` (those hashes: not locks), `none` (not locked; no semaphore or latch either),
    /// or `foreign:<type>` for a key that is not a leasehold lock (another type, or a hash
    /// whose values are not what a lock keeps).
    pub kind: String,
    /// Which lock: `lock` (a plain or a fair lock: they share one layout, which cannot tell
    /// them apart) or `rwlock` (a read/write lock); `semaphore` or `latch` for those; `null`
    /// when `kind` is `none` or `foreign:...`.
    #[serde(serialize_with = "crate::layout::serialize_some_kind")]
    pub lock_kind: Option<Kind>,
    /// A read/write lock's mode, `read` or `write`; `null` for other kinds.
    pub mode: Option<Mode>,
    /// Each holder: owner id and hold count (one owner for an exclusive lock), and for a
    /// read/write lock each hold's role, token and lease; for a semaphore each acquisition:
    /// its id, permits, token and lease.
    pub holders: Vec<Holder>,
    /// Lease left in milliseconds; `null` when the key is absent or never expires (a
    /// semaphore's and a latch's hash never do: a semaphore's permits have their own leases).
    pub ttl_ms: Option<u64>,
    /// The key exists but has no expiry: it will never free itself (only force-unlock does).
    /// Always so for a semaphore and a latch, by design.
    pub no_expiry: bool,
    /// The fencing token of the current grant (the hash's `~fence` field: a read/write lock's
    /// writer's); `null` when free or only read-held (each reader has its own token).
    pub fence: Option<u64>,
    /// Who waits: the entries of the line (`queue`: a plain lock's waiting clients, a fair or
    /// read/write lock's or a semaphore's waiting owners, each of which hears on a channel of
    /// its own, `P:{N}:released:<client uuid or owner id>`), plus the connections subscribed
    /// to the release channel `P:{N}:released` itself: a latch's waiting clients (one per
    /// client process, however many of its tasks wait), and a RedLock's.
    pub waiters: u64,
    /// The line of waiters in the order they are served (`P:{N}:waiters`): a plain lock's one
    /// entry per waiting client (its first waiting task's owner id), a fair lock's one per
    /// waiting owner (the two look the same), a read/write lock's and a semaphore's one per
    /// waiting owner.
    pub queue: Vec<Waiter>,
    /// A lock's (plain or fair) clients with waiters in the line, in line order: the distinct
    /// client uuids of the line's entries (the part of each owner id before `:`), one per
    /// client however many of its tasks wait. Empty for a read/write lock and a semaphore
    /// (see `queue`).
    pub queued_clients: Vec<String>,
    /// A semaphore's number of permits (`~permits`; 0 when never set, negative after more
    /// were taken away than there were); `null` for other kinds.
    pub permits: Option<i64>,
    /// A semaphore's permits taken now (`~used`, expired acquisitions included until the
    /// semaphore's next call gives them back); `null` for other kinds.
    pub permits_taken: Option<i64>,
    /// A semaphore's permits not taken (negative when the number was lowered below what is
    /// taken); `null` for other kinds.
    pub permits_available: Option<i64>,
    /// A count-down latch's count (`~latch`: it opens, and its key goes, at zero); `null` for
    /// other kinds.
    pub count: Option<u64>,
}

impl LockState {
    /// Whether the lock is held right now (never for a semaphore or a
    /// latch: they are not locks).
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
    let (waiters_key, until_key, leases_key, wants_key) = (
        keys.waiters(),
        keys.waiters_until(),
        keys.leases(),
        keys.wants(),
    );
    // Queuing in a pipeline sends nothing and cannot fail on the wire.
    let _: () = pipeline.r#type(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline.hgetall(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline.pttl(keys.hash()).await.map_err(redis_error)?;
    let _: () = pipeline
        .pubsub_numsub(keys.released())
        .await
        .map_err(redis_error)?;
    for zset in [&waiters_key, &until_key, &leases_key] {
        let _: () = pipeline
            .zrange(zset.as_str(), 0, -1, None, false, None, true)
            .await
            .map_err(redis_error)?;
    }
    let _: () = pipeline
        .hgetall(wants_key.as_str())
        .await
        .map_err(redis_error)?;
    // The server's clock, from the node of the lock's slot: deadlines are in its time.
    let _: () = pipeline
        .custom(
            CustomCommand::new_static("TIME", ClusterHash::Custom(keys.slot()), false),
            Vec::<Value>::new(),
        )
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
    // Subscribers of the release channel: a latch's waiters (a lock's hear on their own).
    let mut subscribed = next().ok().map_or(0, |v| numsub_count(&v));
    if redis.is_clustered() {
        // PUBSUB NUMSUB counts the subscribers of the node asked, and clients subscribe on
        // the node of their own id's slot (fred): count on every primary.
        subscribed = cluster_numsub(redis, keys.released()).await?;
    }
    // A foreign key where a zset belongs reads as empty.
    let mut zset = || next().ok().map_or_else(Vec::new, |v| layout::scored(&v));
    let (line, until, leases) = (zset(), zset(), zset());
    // A semaphore's waiters' wants (a count, then `:<ms>` for a fixed lease); a foreign key, or
    // values that are not counts, read as none.
    let wanted: HashMap<String, u64> = next()
        .ok()
        .and_then(|v| v.convert::<HashMap<String, String>>().ok())
        .map(|m| {
            m.into_iter()
                .filter_map(|(id, n)| {
                    let count = n.split_once(':').map_or(n.as_str(), |(count, _)| count);
                    Some((id, count.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let now_us = next()
        .ok()
        .and_then(|v| layout::time_us(&v))
        .unwrap_or_else(layout::local_time_us);
    let now_ms = (now_us / 1_000) as i64;
    let leases: HashMap<String, i64> = leases
        .into_iter()
        .map(|(member, deadline)| (member, deadline as i64 - now_ms))
        .collect();
    let queued_kind = layout::kind_of_queue(line.first().map(|(_, score)| *score), now_us);

    let fence = fields
        .as_ref()
        .and_then(|f| f.get(FENCE_FIELD))
        .and_then(|s| s.parse().ok());
    let reading = fields
        .as_ref()
        .and_then(|f| layout::read_hash(f, queued_kind, &leases));
    let (kind, reading) = match key_type.as_str() {
        "none" => ("none".to_string(), None),
        "hash" => match reading {
            Some(reading) if reading.kind.is_lock() => ("reentrant".to_string(), Some(reading)),
            Some(reading) => (reading.kind.label().to_string(), Some(reading)),
            None => ("foreign:hash".to_string(), None),
        },
        other => (format!("foreign:{other}"), None),
    };
    // The queue is read by the lock's kind; with no lock, by what its keys say (a semaphore
    // whose permits were never set has waiters and their wants, and no hash).
    let queue_kind = reading
        .as_ref()
        .map(|r| r.kind)
        .or((!wanted.is_empty()).then_some(Kind::Semaphore))
        .or(queued_kind)
        .unwrap_or(Kind::Lock);
    let queue = layout::queue(queue_kind, &line, &until, &wanted, now_us);
    let queued_clients = if queue_kind == Kind::Lock {
        clients_in_line(&queue)
    } else {
        Vec::new()
    };
    let waiters = queue.len() as u64 + subscribed;
    let permits = reading.as_ref().and_then(|r| r.permits);
    let count = reading.as_ref().and_then(|r| r.count);
    Ok(LockState {
        name: keys.name().to_string(),
        key: keys.hash().to_string(),
        kind,
        lock_kind: reading.as_ref().map(|r| r.kind),
        mode: reading.as_ref().and_then(|r| r.mode),
        holders: reading.map(|r| r.holders).unwrap_or_default(),
        ttl_ms: u64::try_from(pttl).ok(),
        no_expiry: pttl == -1,
        fence,
        waiters,
        queue,
        queued_clients,
        permits: permits.map(|p| p.total),
        permits_taken: permits.map(|p| p.taken),
        permits_available: permits.map(Permits::available),
        count,
    })
}

/// The distinct clients of a lock's line, in line order: each entry's client uuid (the part of
/// its owner id before `:`).
fn clients_in_line(queue: &[Waiter]) -> Vec<String> {
    let mut clients: Vec<String> = Vec::new();
    for waiter in queue {
        let client = waiter.owner.split(':').next().unwrap_or_default();
        if !clients.iter().any(|c| c == client) {
            clients.push(client.to_string());
        }
    }
    clients
}

/// Subscribers of `channel` on every primary of a cluster (those fred is connected to): plain
/// subscribers (`PUBSUB NUMSUB`) and shard subscribers (`PUBSUB SHARDNUMSUB`: on Redis
/// Cluster 7+ the library's waiters subscribe to their lock's shard; a server before 7 counts
/// none).
async fn cluster_numsub(redis: &Client, channel: &str) -> anyhow::Result<u64> {
    use fred::types::{ClusterHash, CustomCommand};
    let counts = redis
        .active_connections()
        .into_iter()
        .map(|node| async move {
            let on_node = redis.with_cluster_node(node);
            let reply: Value = on_node
                .pubsub_numsub(channel)
                .await
                .map_err(LockError::from_redis)?;
            let sharded: Option<Value> = on_node
                .custom(
                    CustomCommand::new_static("PUBSUB", ClusterHash::Random, false),
                    vec!["SHARDNUMSUB", channel],
                )
                .await
                .ok();
            anyhow::Ok(numsub_count(&reply) + sharded.as_ref().map_or(0, numsub_count))
        });
    Ok(futures::future::try_join_all(counts)
        .await?
        .into_iter()
        .sum())
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
    match state.lock_kind {
        Some(Kind::Semaphore) => return describe_semaphore(state),
        Some(Kind::Latch) => return describe_latch(state),
        _ => {}
    }
    let mut rows = vec![
        vec!["lock".into(), state.name.clone()],
        vec!["key".into(), state.key.clone()],
    ];
    let kind = match (state.kind.as_str(), state.lock_kind) {
        ("none", _) if state.queue.iter().any(|w| w.permits.is_some()) => {
            "none (not locked; the waiters below wait for permits of a semaphore whose number \
             was never set)"
                .to_string()
        }
        ("none", _) => "none (not locked)".to_string(),
        ("reentrant", Some(Kind::ReadWrite)) => "rwlock (reentrant read/write lock)".to_string(),
        // Plain or fair: one layout, the waiters served in arrival order alike.
        ("reentrant", _) => {
            "lock (reentrant; plain or fair, which look the same: waiters are served in arrival \
             order)"
                .to_string()
        }
        (other, _) => format!("{other} (not a leasehold lock: left alone)"),
    };
    rows.push(vec!["kind".into(), kind]);
    if state.lock_kind == Some(Kind::ReadWrite) {
        let readers = state
            .holders
            .iter()
            .filter(|h| h.role == Some(Mode::Read))
            .count();
        let mode = match state.mode {
            Some(Mode::Write) => "write".to_string(),
            Some(Mode::Read) => format!("read ({readers} reader{})", plural(readers)),
            None => "none".to_string(),
        };
        rows.push(vec!["mode".into(), mode]);
    }
    for holder in &state.holders {
        rows.push(holder_row(holder));
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
        Some(token) if state.lock_kind == Some(Kind::ReadWrite) => {
            format!("{token} (the writer's token; the next grant gets more)")
        }
        Some(token) => format!("{token} (this grant's token; the next grant gets more)"),
        None if state.mode == Some(Mode::Read) => {
            "none (read-held: each reader has its own token, above)".into()
        }
        None => "none (not held)".into(),
    };
    rows.push(vec!["fence".into(), fence]);
    rows.extend(queue_rows(state));
    rows.push(vec!["waiters".into(), waiters_text(state)]);
    render::table(&rows)
}

/// A semaphore: its permits, each acquisition and the line of waiters.
fn describe_semaphore(state: &LockState) -> String {
    let mut rows = vec![
        vec!["semaphore".into(), state.name.clone()],
        vec!["key".into(), state.key.clone()],
        vec![
            "kind".into(),
            "semaphore (permits; waiters are served in arrival order)".into(),
        ],
    ];
    let (total, taken) = (state.permits.unwrap_or(0), state.permits_taken.unwrap_or(0));
    let available = state.permits_available.unwrap_or(total - taken);
    let mut permits = format!("{total} total, {taken} taken, {available} available");
    if available < 0 {
        permits.push_str(" (the number was lowered below what is taken: acquisitions wait)");
    }
    rows.push(vec!["permits".into(), permits]);
    for holder in &state.holders {
        let mut text = format!(
            "{}  permits {}",
            holder.owner,
            holder.permits.unwrap_or(holder.hold_count)
        );
        if let Some(token) = holder.token {
            text.push_str(&format!("  token {token}"));
        }
        text.push_str("  lease ");
        text.push_str(&match holder.lease_ms {
            Some(ms) => life(ms, "(its permits return at the semaphore's next call)"),
            None => "unknown (no entry in :leases)".into(),
        });
        rows.push(vec!["holder".into(), text]);
    }
    if state.holders.is_empty() {
        rows.push(vec!["holders".into(), "none (no permits taken)".into()]);
    }
    rows.extend(queue_rows(state));
    render::table(&rows)
}

/// A count-down latch: its count and the clients waiting for zero.
fn describe_latch(state: &LockState) -> String {
    let count = state.count.unwrap_or(0);
    render::table(&[
        vec!["latch".into(), state.name.clone()],
        vec!["key".into(), state.key.clone()],
        vec!["kind".into(), "latch (count-down latch)".into()],
        vec![
            "count".into(),
            format!("{count} (it opens at zero: Latch::count_down counts it down)"),
        ],
        vec![
            "waiters".into(),
            format!(
                "{} client{} subscribed to the release channel (waiting for zero)",
                state.waiters,
                plural(state.waiters as usize)
            ),
        ],
    ])
}

/// The waiters row of a lock: `2 in line` (the queue above), and the connections subscribed to
/// the release channel, if any (a lock's waiters in line hear on channels of their own).
fn waiters_text(state: &LockState) -> String {
    let in_line = state.queue.len() as u64;
    let subscribed = state.waiters.saturating_sub(in_line);
    let mut text = format!("{in_line} in line");
    if subscribed > 0 {
        text = format!(
            "{}: {text}, {subscribed} client{} subscribed to the release channel",
            state.waiters,
            plural(subscribed as usize)
        );
    }
    text
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A holder's row: `holder OWNER  hold count N` for a lock, plain or fair (and a reservation);
/// a read/write lock's writer and readers with their token and lease.
fn holder_row(holder: &Holder) -> Vec<String> {
    let label = match holder.role {
        Some(Mode::Write) => "writer",
        Some(Mode::Read) => "reader",
        None => "holder",
    };
    let mut text = format!("{}  hold count {}", holder.owner, holder.hold_count);
    if holder.role.is_some() {
        if let Some(token) = holder.token {
            text.push_str(&format!("  token {token}"));
        }
        text.push_str("  lease ");
        text.push_str(&match holder.lease_ms {
            Some(ms) => life(ms, "(dropped at the lock's next call)"),
            None => "unknown (no entry in :leases)".into(),
        });
    }
    vec![label.into(), text]
}

/// `12.0 s left`, or `ran out 200 ms ago` and what happens then.
fn life(ms: i64, after: &str) -> String {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        format!("{} left", render::duration(d))
    } else {
        format!("ran out {} ago {after}", render::duration(d))
    }
}

/// The queue: the line's waiters in order, a lock's (plain or fair: a plain lock's entry is its
/// waiting client's first waiting task), a read/write lock's (R/W for what each wants), a
/// semaphore's with the permits each wants.
fn queue_rows(state: &LockState) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let owner = if state.lock_kind == Some(Kind::Semaphore) {
        "semaphore"
    } else {
        "lock"
    };
    for (i, waiter) in state.queue.iter().enumerate() {
        let wants = waiter.wants.map_or("", |m| m.letter());
        let entry = match waiter.entry_ms {
            Some(ms) => life(
                ms,
                &format!("(its client is gone; dropped at the {owner}'s next call)"),
            ),
            None => "without a deadline".into(),
        };
        let permits = waiter.permits.map_or_else(String::new, |n| {
            format!("  wants {n} permit{}", plural(n as usize))
        });
        lines.push(format!(
            "{}. {}{}{}{permits}  waiting {}  entry {entry}",
            i + 1,
            wants,
            if wants.is_empty() { "" } else { " " },
            waiter.owner,
            render::duration(Duration::from_millis(waiter.waiting_ms)),
        ));
    }
    if lines.is_empty() {
        lines.push("empty".into());
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(i, line)| {
            vec![
                if i == 0 {
                    "queue".into()
                } else {
                    String::new()
                },
                line,
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numsub_replies() {
        let reply = Value::Array(vec![Value::from("ch"), Value::from(3_i64)]);
        assert_eq!(numsub_count(&reply), 3);
        assert_eq!(numsub_count(&Value::Null), 0);
    }

    fn state(lock_kind: Kind, mode: Option<Mode>, holders: Vec<Holder>) -> LockState {
        LockState {
            name: "docs".into(),
            key: "leasehold:{docs}".into(),
            kind: "reentrant".into(),
            lock_kind: Some(lock_kind),
            mode,
            holders,
            ttl_ms: Some(29_000),
            no_expiry: false,
            fence: None,
            waiters: 0,
            queue: Vec::new(),
            queued_clients: Vec::new(),
            permits: None,
            permits_taken: None,
            permits_available: None,
            count: None,
        }
    }

    #[test]
    fn read_write_lock_text() {
        let reader = |owner: &str, lease_ms| Holder {
            owner: owner.into(),
            hold_count: 1,
            role: Some(Mode::Read),
            token: Some(7),
            lease_ms: Some(lease_ms),
            permits: None,
        };
        let mut s = state(
            Kind::ReadWrite,
            Some(Mode::Read),
            vec![reader("a:t1", 12_000), reader("b:t2", -200)],
        );
        s.queue.push(Waiter {
            owner: "c:t3".into(),
            wants: Some(Mode::Write),
            waiting_ms: 1_500,
            entry_ms: Some(29_800),
            permits: None,
        });
        let text = describe(&s);
        assert!(text.contains("kind     rwlock"), "{text}");
        assert!(text.contains("mode     read (2 readers)"), "{text}");
        assert!(
            text.contains("reader   a:t1  hold count 1  token 7  lease 12.0 s left"),
            "{text}"
        );
        assert!(text.contains("lease ran out 200 ms ago"), "{text}");
        assert!(text.contains("fence    none (read-held"), "{text}");
        assert!(
            text.contains("queue    1. W c:t3  waiting 1.5 s  entry 29.8 s left"),
            "{text}"
        );
    }

    #[test]
    fn plain_lock_text_keeps_its_rows() {
        let mut s = state(
            Kind::Lock,
            None,
            vec![Holder {
                owner: "a:t1".into(),
                hold_count: 2,
                role: None,
                token: Some(9),
                lease_ms: None,
                permits: None,
            }],
        );
        // A plain lock's line: one entry per waiting client (a fair lock's looks the same).
        let waiter = |owner: &str, waiting_ms| Waiter {
            owner: owner.into(),
            wants: None,
            waiting_ms,
            entry_ms: Some(20_000),
            permits: None,
        };
        s.queue = vec![waiter("c1:t4", 2_000), waiter("c2:t1", 1_000)];
        s.queued_clients = clients_in_line(&s.queue);
        s.waiters = 2;
        assert_eq!(s.queued_clients, ["c1", "c2"]);
        let text = describe(&s);
        assert!(text.contains("holder   a:t1  hold count 2\n"), "{text}");
        assert!(
            text.contains("kind     lock (reentrant; plain or fair"),
            "{text}"
        );
        assert!(!text.contains("mode"), "{text}");
        assert!(
            text.contains(
                "queue    1. c1:t4  waiting 2.0 s  entry 20.0 s left\n         \
                 2. c2:t1  waiting 1.0 s  entry 20.0 s left\n"
            ),
            "{text}"
        );
        assert!(text.contains("waiters  2 in line\n"), "{text}");
        // Subscribers of the release channel (a RedLock's waiters) are counted apart.
        s.waiters = 3;
        let text = describe(&s);
        assert!(
            text.contains("waiters  3: 2 in line, 1 client subscribed to the release channel"),
            "{text}"
        );
    }

    #[test]
    fn clients_of_a_line() {
        let waiter = |owner: &str| Waiter {
            owner: owner.into(),
            wants: None,
            waiting_ms: 0,
            entry_ms: None,
            permits: None,
        };
        // A fair lock's line may hold several owners of one client: it is listed once, where
        // its first entry stands.
        let line = [waiter("b:o1"), waiter("a:o2"), waiter("b:o3"), waiter("c")];
        assert_eq!(clients_in_line(&line), ["b", "a", "c"]);
        assert!(clients_in_line(&[]).is_empty());
    }

    #[test]
    fn semaphore_text() {
        let holder = |owner: &str, permits, token, lease_ms| Holder {
            owner: owner.into(),
            hold_count: 1,
            role: None,
            token: Some(token),
            lease_ms: Some(lease_ms),
            permits: Some(permits),
        };
        let mut s = state(
            Kind::Semaphore,
            None,
            vec![holder("a:o1", 2, 10, 12_000), holder("b:o2", 1, 11, -300)],
        );
        s.kind = "semaphore".into();
        s.ttl_ms = None;
        s.no_expiry = true;
        (s.permits, s.permits_taken, s.permits_available) = (Some(3), Some(3), Some(0));
        s.queue.push(Waiter {
            owner: "c:o3".into(),
            wants: None,
            waiting_ms: 800,
            entry_ms: Some(-5),
            permits: Some(2),
        });
        let text = describe(&s);
        assert!(
            text.starts_with(
                "semaphore  docs
"
            ),
            "{text}"
        );
        assert!(text.contains("kind       semaphore ("), "{text}");
        assert!(
            text.contains(
                "permits    3 total, 3 taken, 0 available
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "holder     a:o1  permits 2  token 10  lease 12.0 s left
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "holder     b:o2  permits 1  token 11  lease ran out 300 ms ago (its permits \
                 return at the semaphore's next call)"
            ),
            "{text}"
        );
        assert!(
            text.contains("queue      1. c:o3  wants 2 permits  waiting 800 ms  entry ran out"),
            "{text}"
        );
        assert!(
            text.contains("dropped at the semaphore's next call"),
            "{text}"
        );
        assert!(
            !text.contains("fence") && !text.contains("lease    "),
            "{text}"
        );

        s.holders.clear();
        s.queue.clear();
        (s.permits, s.permits_taken, s.permits_available) = (Some(1), Some(2), Some(-1));
        let text = describe(&s);
        assert!(text.contains("holders    none"), "{text}");
        assert!(
            text.contains("-1 available (the number was lowered"),
            "{text}"
        );
        assert!(text.contains("queue      empty"), "{text}");
    }

    #[test]
    fn latch_text() {
        let mut s = state(Kind::Latch, None, Vec::new());
        s.kind = "latch".into();
        s.count = Some(2);
        s.waiters = 1;
        let text = describe(&s);
        assert!(
            text.starts_with(
                "latch    docs
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kind     latch (count-down latch)
"
            ),
            "{text}"
        );
        assert!(text.contains("count    2 (it opens at zero"), "{text}");
        assert!(
            text.contains("waiters  1 client subscribed to the release channel"),
            "{text}"
        );
    }
}
