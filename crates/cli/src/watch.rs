//! `leasehold watch [PATTERN]`: a refreshing view of the locks under a prefix, for an operator
//! chasing a stuck job: name, kind, holder, hold count, lease left, clients queued for a turn,
//! the fencing token and the grants seen since the watch started.
//!
//! Each refresh is one `list` (SCAN, then the holders and lease of each lock pipelined) plus
//! one pipelined round trip reading every listed lock's turn queue length and fencing token.
//! Handoffs are counted by the token: a lock whose token changed between two refreshes was
//! granted anew at least once (grants shorter than the interval can hide between refreshes).
//! `--once` prints one frame and exits: for scripts, and for tests.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{HashesInterface, SortedSetsInterface};
use fred::types::Value;
use leasehold::{LockError, LockKeys};
use leasehold_core::protocol::FENCE_FIELD;
use leasehold_core::Prefix;

use crate::connect::connect;
use crate::list::{list, ListedLock};
use crate::render;

/// What a frame shows of one lock.
#[derive(Debug, Clone)]
pub struct WatchedLock {
    /// The lock as `list` read it.
    pub lock: ListedLock,
    /// Clients queued for a turn (`P:{N}:queue`).
    pub queued: u64,
    /// The current grant's fencing token.
    pub token: Option<String>,
    /// Grants seen since the watch started (token changes between frames).
    pub grants_seen: u64,
}

/// The `watch` command: a frame every `interval` until interrupted, or one with `once`.
pub async fn run(
    url: &str,
    prefix: &str,
    pattern: &str,
    interval: Duration,
    once: bool,
) -> anyhow::Result<()> {
    let client = connect(url, prefix).await?;
    let prefix = Prefix::new(prefix)?;
    let mut seen: HashMap<String, (Option<String>, u64)> = HashMap::new();
    let clear = !once && std::io::stdout().is_terminal();
    loop {
        let locks = frame(client.redis(), &prefix, pattern, &mut seen).await?;
        let mut out = String::new();
        if clear {
            out.push_str("\x1b[2J\x1b[H"); // clear the screen, cursor home
        }
        out.push_str(&describe(prefix.as_str(), pattern, &locks));
        print!("{out}");
        std::io::stdout().flush()?;
        if once {
            return Ok(());
        }
        tokio::time::sleep(interval).await;
    }
}

/// Reads one frame; `seen` carries each lock's last token and grant count between frames.
async fn frame(
    redis: &Client,
    prefix: &Prefix,
    pattern: &str,
    seen: &mut HashMap<String, (Option<String>, u64)>,
) -> anyhow::Result<Vec<WatchedLock>> {
    let locks = list(redis, prefix, pattern).await?;
    let pipeline = redis.pipeline();
    for lock in &locks {
        let keys = LockKeys::new(prefix, &lock.name)?;
        let _: () = pipeline
            .zcard(keys.queue())
            .await
            .map_err(LockError::from_redis)?;
        let _: () = pipeline
            .hget(keys.hash(), FENCE_FIELD)
            .await
            .map_err(LockError::from_redis)?;
    }
    let replies = pipeline.try_all::<Value>().await;
    let mut watched = Vec::with_capacity(locks.len());
    for (lock, pair) in locks.into_iter().zip(replies.chunks(2)) {
        let queued = pair
            .first()
            .and_then(|r| r.as_ref().ok())
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let token = pair
            .get(1)
            .and_then(|r| r.as_ref().ok())
            .and_then(Value::as_string);
        let (last, grants) = seen.entry(lock.name.clone()).or_insert((None, 0));
        if token.is_some() && *last != token {
            *grants += 1;
            last.clone_from(&token);
        }
        watched.push(WatchedLock {
            lock,
            queued,
            token,
            grants_seen: *grants,
        });
    }
    Ok(watched)
}

/// One frame as text.
pub fn describe(prefix: &str, pattern: &str, locks: &[WatchedLock]) -> String {
    let mut out = format!("leasehold watch: prefix {prefix:?}, names {pattern:?}\n");
    if locks.is_empty() {
        out.push_str("no locks held\n");
        return out;
    }
    let mut rows = vec![[
        "NAME", "KIND", "HOLDER", "HOLDS", "LEASE", "QUEUED", "TOKEN", "GRANTS",
    ]
    .map(String::from)
    .to_vec()];
    for watched in locks {
        let lock = &watched.lock;
        let (holder, holds) = match lock.holders.as_slice() {
            [one] => (one.owner.clone(), one.hold_count.to_string()),
            many => (
                format!("{} owners", many.len()),
                many.iter().map(|h| h.hold_count).sum::<u64>().to_string(),
            ),
        };
        let lease = lock.ttl_ms.map_or_else(
            || "no expiry".to_string(),
            |ms| render::duration(Duration::from_millis(ms)),
        );
        rows.push(vec![
            lock.name.clone(),
            "lock".into(),
            holder,
            holds,
            lease,
            watched.queued.to_string(),
            watched.token.clone().unwrap_or_else(|| "-".into()),
            watched.grants_seen.to_string(),
        ]);
    }
    out.push_str(&render::table(&rows));
    out
}
