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

/// The waiter's busy branch of `acquire.lua` before the fix of defect 1 (commit 5f92bad): a
/// waiter that finds the lock reserved for another client's turn is told its own lease, not the
/// reservation's remaining time.
pub const PRE_F1_RESERVED_BUSY: &str = include_str!("../fixtures/pre_f1_reserved_busy.lua");

/// Where the pre-fix branch goes: right after the waiter's client joined the turn queue and
/// before the shipped reply `{0, pttl}`.
const PRE_F1_ANCHOR: &str =
    "  redis.call('PEXPIRE', KEYS[3], math.max(pttl, tonumber(ARGV[2])) + 10000)\n";

/// The plain lock's scripts as the model runs them.
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
        });
        let mut acquire = shipped.acquire.lua().to_string();
        if variant == Variant::PreF1Fix {
            assert!(
                acquire.contains(PRE_F1_ANCHOR),
                "acquire.lua changed: the pre-fix branch of defect 1 has no anchor"
            );
            acquire = acquire.replacen(
                PRE_F1_ANCHOR,
                &format!("{PRE_F1_ANCHOR}{PRE_F1_RESERVED_BUSY}"),
                1,
            );
        }
        ModelScripts {
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
