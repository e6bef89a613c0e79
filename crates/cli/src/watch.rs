//! `leasehold watch [PATTERN]`: a refreshing view of the locks (and semaphores and latches)
//! under a prefix, for an operator chasing a stuck job: name, kind, a read/write lock's mode (a
//! semaphore's permits taken, a latch's count), holder, hold count (a semaphore's permits
//! taken), lease left, entries queued, the fencing token and the grants seen since the watch
//! started.
//!
//! Each refresh is one `list` (SCAN, then the holders, lease, queue length and token of each
//! lock pipelined). Handoffs are counted by the token: a lock whose token changed between two
//! refreshes was granted anew at least once (grants shorter than the interval can hide between
//! refreshes). A read-held read/write lock has no `~fence`: its newest reader's token stands in
//! (a new reader counts as a grant); so does a semaphore's newest acquisition's. A latch has
//! no tokens. `--once` prints one frame and exits: for scripts, and for tests.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use fred::clients::Client;
use leasehold_core::Prefix;

use crate::connect::connect;
use crate::layout::{Kind, Mode};
use crate::list::{list, mode_cell, queued_cell, ttl_cell, ListedLock};
use crate::render;

/// What a frame shows of one lock.
#[derive(Debug, Clone)]
pub struct WatchedLock {
    /// The lock as `list` read it.
    pub lock: ListedLock,
    /// The current grant's fencing token (a read-held read/write lock's newest reader's, a
    /// semaphore's newest acquisition's).
    pub token: Option<u64>,
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
    let mut seen: HashMap<String, (Option<u64>, u64)> = HashMap::new();
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
    seen: &mut HashMap<String, (Option<u64>, u64)>,
) -> anyhow::Result<Vec<WatchedLock>> {
    let locks = list(redis, prefix, pattern).await?;
    let mut watched = Vec::with_capacity(locks.len());
    for lock in locks {
        let token = lock.fence.or_else(|| {
            lock.holders
                .iter()
                .filter(|h| h.role == Some(Mode::Read) || h.permits.is_some())
                .filter_map(|h| h.token)
                .max()
        });
        let (last, grants) = seen.entry(lock.name.clone()).or_insert((None, 0));
        if token.is_some() && *last != token {
            *grants += 1;
            *last = token;
        }
        watched.push(WatchedLock {
            lock,
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
        "NAME", "KIND", "MODE", "HOLDER", "HOLDS", "LEASE", "QUEUED", "TOKEN", "GRANTS",
    ]
    .map(String::from)
    .to_vec()];
    for watched in locks {
        let lock = &watched.lock;
        let (holder, holds) = match (lock.lock_kind, lock.holders.as_slice()) {
            (Kind::Latch, _) => ("-".to_string(), "-".to_string()),
            // A semaphore's holds are its permits taken.
            (Kind::Semaphore, holders) => (
                match holders {
                    [] => "-".to_string(),
                    [one] => one.owner.clone(),
                    many => format!("{} holders", many.len()),
                },
                lock.permits_taken.unwrap_or(0).to_string(),
            ),
            (_, [one]) => (one.owner.clone(), one.hold_count.to_string()),
            (kind, many) => (
                match kind {
                    Kind::ReadWrite => format!("{} holds", many.len()),
                    _ => format!("{} owners", many.len()),
                },
                many.iter().map(|h| h.hold_count).sum::<u64>().to_string(),
            ),
        };
        rows.push(vec![
            lock.name.clone(),
            lock.lock_kind.label().into(),
            mode_cell(lock),
            holder,
            holds,
            ttl_cell(lock),
            queued_cell(lock),
            watched
                .token
                .map_or_else(|| "-".to_string(), |t| t.to_string()),
            watched.grants_seen.to_string(),
        ]);
    }
    out.push_str(&render::table(&rows));
    out
}
