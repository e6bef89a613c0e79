//! The scripts the model runs: the shipped text from `leasehold-core` (placeholders filled by
//! [`Scripts::new`]), and for a mutant the same text with one piece changed.
//!
//! Nothing here copies a `.lua` file: a change to a shipped script changes the model at once.

use std::collections::BTreeSet;

use leasehold_core::protocol::Protocol;
use leasehold_core::scripts::Scripts;

use crate::config::Variant;

/// `line/hand_on.lua`'s read of the dead entries (deadline at or before now), as inlined in
/// every script that hands a lock on.
pub const DEAD_RANGE: &str = "local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms,";
/// [`Variant::HandOnNoDeadDrop`]: no deadline is ever that early.
const DEAD_RANGE_OFF: &str = "local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', 0,";
/// `line/acquire.lua`: a free lock whose line has others first goes to the line's first live
/// waiter (the hand-on).
pub const LINE_HAND_ON_CHECK: &str = "if not mine and first and first ~= owner then";
/// `line/acquire.lua`'s condition for a grant: the lock is this owner's, or nobody (live) is
/// before it in line.
pub const LINE_GRANT_CHECK: &str = "if mine or not first or first == owner then";
/// `line/leave.lua`: whether the leaving owner holds a grant of the line its client never took.
pub const LEAVE_UNTAKEN: &str =
    "untaken = fields[1] == '1' and fields[3] ~= false and fields[2] ~= ARGV[3]";
/// `line/leave.lua`'s first check: keys of another type are left alone, absent ones are an
/// empty line (the release that granted the waiter may have emptied it).
pub const LEAVE_LINE_CHECK: &str = "  local kind = redis.call('TYPE', KEYS[i])['ok']\n  \
     if kind ~= 'zset' and kind ~= 'none' then\n";
/// [`Variant::LeaveIgnoresEmptiedLine`]: the check as it first shipped, which also returned for
/// absent line keys, before it looked at the grant.
const LEAVE_LINE_CHECK_BEFORE: &str = "  if redis.call('TYPE', KEYS[i])['ok'] ~= 'zset' then\n";
/// `release.lua`: whether there is a line to hand the lock to.
pub const RELEASE_LINE_CHECK: &str =
    "if redis.call('EXISTS', KEYS[3]) == 1 or (ARGV[5] and ARGV[5] ~= '') then";

/// `lua` with `from` (which must be there exactly `count` times) replaced by `to`.
///
/// # Panics
/// When `from` is not in the shipped text as often as expected: the mutant must be redone
/// against the new script, not silently skipped.
fn mutate(lua: &str, from: &str, to: &str, count: usize) -> String {
    assert_eq!(
        lua.matches(from).count(),
        count,
        "a shipped script changed: {from:?} is not there to mutate"
    );
    lua.replace(from, to)
}

/// The plain and fair lock's scripts as the model runs them.
#[derive(Debug)]
pub struct ModelScripts {
    /// `acquire.lua`: a plain lock's first try.
    pub acquire: String,
    /// `release.lua`: the plain and the fair lock's release.
    pub release: String,
    /// `renew.lua`: holds and line entries.
    pub renew: String,
    /// `force_unlock.lua`.
    pub force_unlock: String,
    /// `line/acquire.lua`: a fair lock's every try, a waiting plain lock's later tries.
    pub line_acquire: String,
    /// `line/leave.lua`: a waiter that gives up.
    pub line_leave: String,
}

impl ModelScripts {
    /// The scripts of `variant`.
    ///
    /// # Panics
    /// When a mutant's anchor is no longer in the shipped text.
    pub fn new(variant: Variant) -> ModelScripts {
        let shipped = Scripts::new(Protocol::default());
        let mut scripts = ModelScripts {
            acquire: shipped.acquire.lua().to_string(),
            release: shipped.release.lua().to_string(),
            renew: shipped.renew.lua().to_string(),
            force_unlock: shipped.force_unlock.lua().to_string(),
            line_acquire: shipped.line_acquire.lua().to_string(),
            line_leave: shipped.line_leave.lua().to_string(),
        };
        match variant {
            Variant::HandOnNoDeadDrop => {
                for lua in [
                    &mut scripts.release,
                    &mut scripts.line_acquire,
                    &mut scripts.line_leave,
                    &mut scripts.force_unlock,
                ] {
                    *lua = mutate(lua, DEAD_RANGE, DEAD_RANGE_OFF, 1);
                }
            }
            Variant::LineJumped => {
                let lua = &mut scripts.line_acquire;
                *lua = mutate(lua, LINE_HAND_ON_CHECK, "if false then", 1);
                *lua = mutate(lua, LINE_GRANT_CHECK, "if true then", 1);
            }
            Variant::LeaveKeepsGrant => {
                let lua = &mut scripts.line_leave;
                *lua = mutate(lua, LEAVE_UNTAKEN, "untaken = false", 1);
            }
            Variant::LeaveIgnoresEmptiedLine => {
                let lua = &mut scripts.line_leave;
                *lua = mutate(lua, LEAVE_LINE_CHECK, LEAVE_LINE_CHECK_BEFORE, 1);
            }
            Variant::ReleaseNoHandOn => {
                let lua = &mut scripts.release;
                *lua = mutate(lua, RELEASE_LINE_CHECK, "if false then", 1);
            }
            Variant::Shipped | Variant::NoLocalFifo | Variant::StaleGrantTaken => {}
        }
        scripts
    }
}

/// Every shipped script's text (all kinds), for the check that the model implements every
/// command they call.
pub fn every_shipped_script() -> Vec<String> {
    Scripts::new(Protocol::default())
        .all()
        .iter()
        .map(|s| s.lua().to_string())
        .collect()
}

/// The same scripts as a Redis Cluster 7+ client runs them (sharded pub/sub: `SPUBLISH`).
pub fn every_shipped_sharded_script() -> Vec<String> {
    Scripts::new(Protocol {
        sharded: true,
        ..Protocol::default()
    })
    .all()
    .iter()
    .map(|s| s.lua().to_string())
    .collect()
}

/// The command names a script passes to `redis.call` or `redis.pcall` as a literal.
///
/// Also reports `?` for a call whose command is not a literal string: the model could not
/// know what it runs.
pub fn commands_called(lua: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for prefix in ["redis.call(", "redis.pcall("] {
        for (at, _) in lua.match_indices(prefix) {
            let rest = lua[at + prefix.len()..].trim_start();
            let quoted = rest
                .strip_prefix('\'')
                .and_then(|r| r.split_once('\''))
                .or_else(|| rest.strip_prefix('"').and_then(|r| r.split_once('"')));
            match quoted {
                Some((name, _)) => found.insert(name.to_ascii_uppercase()),
                None => found.insert("?".to_string()),
            };
        }
    }
    found
}
