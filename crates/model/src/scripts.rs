//! The scripts the model runs: the shipped text from `leasehold-core` (placeholders filled by
//! [`Scripts::new`] for the model's protocol), and for a reverted variant the same text with
//! one fix taken back out.
//!
//! Nothing here copies a `.lua` file: a change to a shipped script changes the model at once.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_core::protocol::Protocol;
use leasehold_core::scripts::Scripts;

use crate::config::Variant;

/// The waiter's busy branch of `acquire.lua` without the reserved-turn fix: a waiter that finds
/// the lock reserved for another client's turn is told its own lease, not the reservation's
/// remaining time.
pub const PRE_F1_RESERVED_BUSY: &str = include_str!("../fixtures/pre_f1_reserved_busy.lua");

/// Where the reverted branch goes: right after the waiter's client joined the turn queue and
/// before the shipped reply `{0, pttl}`.
const PRE_F1_ANCHOR: &str =
    "  redis.call('PEXPIRE', KEYS[3], math.max(pttl, tonumber(ARGV[2])) + 10000)\n";

/// `fair/acquire.lua`'s condition for a grant: the lock is this owner's, or nobody (live) is
/// before it in line.
const FAIR_GRANT_CHECK: &str = "if mine or not first or first == owner then";
/// [`Variant::FairLineJumped`]: every try that finds the lock free (or its own) is granted.
const FAIR_GRANT_CHECK_OFF: &str = "if true then";
/// `hand_on.lua`'s range of dead entries (deadline at or before now).
const DEAD_RANGE: &str = "'-inf', now_ms, 'LIMIT'";
/// [`Variant::FairNoDeadSkip`]: no deadline is ever that early.
const DEAD_RANGE_OFF: &str = "'-inf', 0, 'LIMIT'";

/// `lua` with `from` replaced by `to`.
///
/// # Panics
/// When `from` is not in the shipped text: the mutant must be redone against the new script.
fn mutate(lua: &str, from: &str, to: &str) -> String {
    assert!(
        lua.contains(from),
        "a fair script changed: no {from:?} to mutate"
    );
    lua.replace(from, to)
}

/// The plain and fair lock's scripts as the model runs them.
#[derive(Debug)]
pub struct ModelScripts {
    /// `acquire.lua` (reverted in [`Variant::PreF1Fix`]).
    pub acquire: String,
    /// `release.lua`.
    pub release: String,
    /// `renew.lua`.
    pub renew: String,
    /// `force_unlock.lua`.
    pub force_unlock: String,
    /// `fair/acquire.lua`.
    pub fair_acquire: String,
    /// `fair/release.lua`.
    pub fair_release: String,
    /// `fair/leave.lua`.
    pub fair_leave: String,
}

impl ModelScripts {
    /// The scripts for a turn grace of `grace_ms` and `variant`.
    ///
    /// # Panics
    /// When a reverted variant's anchor is no longer in the shipped text: the revert must be
    /// redone against the new script, not silently skipped.
    pub fn new(grace_ms: u64, variant: Variant) -> ModelScripts {
        let shipped = Scripts::new(Protocol {
            turn_grace: Duration::from_millis(grace_ms),
            ..Protocol::default()
        });
        let mut acquire = shipped.acquire.lua().to_string();
        if variant == Variant::PreF1Fix {
            assert!(
                acquire.contains(PRE_F1_ANCHOR),
                "acquire.lua changed: the reverted reserved-turn branch has no anchor"
            );
            acquire = acquire.replacen(
                PRE_F1_ANCHOR,
                &format!("{PRE_F1_ANCHOR}{PRE_F1_RESERVED_BUSY}"),
                1,
            );
        }
        let mut fair_acquire = shipped.fair_acquire.lua().to_string();
        let mut fair_release = shipped.fair_release.lua().to_string();
        let mut fair_leave = shipped.fair_leave.lua().to_string();
        match variant {
            Variant::FairLineJumped => {
                fair_acquire = mutate(&fair_acquire, FAIR_GRANT_CHECK, FAIR_GRANT_CHECK_OFF);
            }
            Variant::FairNoDeadSkip => {
                for lua in [&mut fair_acquire, &mut fair_release, &mut fair_leave] {
                    *lua = mutate(lua, DEAD_RANGE, DEAD_RANGE_OFF);
                }
            }
            _ => {}
        }
        ModelScripts {
            fair_acquire,
            fair_release,
            fair_leave,
            acquire,
            release: shipped.release.lua().to_string(),
            renew: shipped.renew.lua().to_string(),
            force_unlock: shipped.force_unlock.lua().to_string(),
        }
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
