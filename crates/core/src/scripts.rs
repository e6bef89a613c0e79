//! The Lua scripts: one per state change, each in its own `.lua` file beside this one.
//!
//! The files name the protocol's words as placeholders (`@FENCE@`, `@GRANTED@`, `@EXPIRING@`,
//! `@FREE@`, `@GRANT@`, `@PUBLISH@`) and the shared pieces they inline (`@NEXT_FENCE@`,
//! `@JOIN_LINE@`, `@KEEP_PLACE@`, `@RELEASE_HOLD@`, `@HAND_ON@`, `@LINE_COMMON@`, `@RW_COMMON@`,
//! `@SEM_COMMON@`); [`Scripts::new`] fills them in from [`crate::protocol`] when a client is
//! built, so Rust and Lua share one definition.
//!
//! Every script is sent with EVALSHA; when Redis answers NOSCRIPT (after a restart, a failover
//! or SCRIPT FLUSH) it is loaded with SCRIPT LOAD and sent again. NOSCRIPT means the script did
//! not run, so the second send can never apply a change twice.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes_utils::Str;
use fred::interfaces::ClusterInterface;
use fred::prelude::{Error as FredError, FromValue};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, MultipleKeys, MultipleValues, Value};

use crate::connection::ScriptConnection;
use tokio::time::Instant;

use crate::error::{classify, Class};
use crate::protocol::{
    Protocol, EXPIRING_FIELD, FENCE_FIELD, FREE_PAYLOAD, GRANTED_FIELD, GRANT_PAYLOAD, KIND_FIELD,
    LATCH_FIELD, MODE_FIELD, PERMITS_FIELD, READ_FENCE_FIELD_PREFIX, READ_FIELD_PREFIX,
    ROUND_FIELD, USED_FIELD, WRITER_FIELD,
};

/// A Lua script with its SHA1.
#[derive(Debug)]
pub struct LuaScript {
    lua: String,
    sha1: Str,
}

impl LuaScript {
    fn new(template: &str, protocol: &Protocol) -> LuaScript {
        let lua = fill(template, protocol);
        let sha1 = Script::from_lua(lua.as_str()).sha1().to_string().into();
        LuaScript { lua, sha1 }
    }

    /// The Lua source, protocol words filled in.
    pub fn lua(&self) -> &str {
        &self.lua
    }

    /// The SHA1 that EVALSHA sends.
    pub fn sha1(&self) -> &str {
        &self.sha1
    }

    /// Runs the script with EVALSHA, loading it first when Redis answers NOSCRIPT; `build`
    /// makes the keys and arguments, and is called again only for a resend.
    ///
    /// A resend happens only when the server said that the script did not run: after
    /// `NOSCRIPT` (the script is loaded, on every primary of a cluster, and sent again), and
    /// on a cluster after `MOVED`, `ASK` or `TRYAGAIN` ([`resend_not_run`]).
    ///
    /// Keeping a copy of the keys and arguments instead, for a resend that almost never happens
    /// (scripts are preloaded at connect), cost two allocations per acquire and per release,
    /// and a copy of up to 1,000 keys per renewal batch.
    pub async fn call<R, C, F>(&self, client: &C, build: F) -> Result<R, FredError>
    where
        R: FromValue,
        C: ScriptConnection,
        F: Fn() -> (MultipleKeys, MultipleValues) + Send,
    {
        let send = || {
            let (keys, args) = build();
            client.evalsha_script(&self.sha1, keys, args)
        };
        match resend_not_run(send).await {
            Err(error) if classify(&error) == Class::NoScript => {
                load(client, &self.lua).await?;
                resend_not_run(send).await
            }
            result => result,
        }
    }
}

/// Loads `lua` with SCRIPT LOAD; on a cluster on every primary (the one that answered NOSCRIPT
/// may be any of them, or a replica just promoted), one command per primary routed by a slot
/// it serves.
pub async fn load<C: ClusterInterface + Send + Sync>(
    client: &C,
    lua: &str,
) -> Result<(), FredError> {
    let script_load = |hash| {
        client.custom::<Value, Value>(
            CustomCommand::new_static("SCRIPT", hash, false),
            vec!["LOAD".into(), lua.into()],
        )
    };
    let Some(state) = client
        .cached_cluster_state()
        .filter(|_| client.is_clustered())
    else {
        script_load(ClusterHash::Random).await?;
        return Ok(());
    };
    let mut primaries = std::collections::BTreeMap::new();
    for range in state.slots() {
        primaries
            .entry(range.primary.clone())
            .or_insert(range.start);
    }
    // One after the other: a reload is rare (a restart, a failover, SCRIPT FLUSH).
    for slot in primaries.into_values() {
        script_load(ClusterHash::Custom(slot)).await?;
    }
    Ok(())
}

/// Sends a command, and sends it again while a cluster answers that it did not run it: the
/// slot has a new owner (`MOVED`, after a failover or a migration) or is migrating (`ASK`,
/// `TRYAGAIN`). Pauses start at 1 ms and double up to 50 ms; after [`NOT_RUN_PATIENCE`] the
/// last error is returned (callers bound the wait with their own budget first).
///
/// # Why leasehold redirects, not fred
/// The client is built so that fred never writes a state change twice
/// (`max_command_attempts: 1`: a resent acquire would count a hold twice). fred counts a
/// redirection as a write attempt, so under that setting it fails a redirected command anyway,
/// and fred 10.1 does not follow `ASK` correctly in any case: it sends `ASKING` to the
/// importing node and then the command to the old owner again, until its attempts run out and
/// its router stops for good. So the client allows no redirections (`max_redirections: 0`):
/// fred resyncs its slot map on `MOVED` and reports the redirection, and it is sent again here,
/// where it is certain that nothing ran.
///
/// `ASK` is not followed to the importing node: that needs `ASKING` and the command on one
/// connection with nothing between them. A lock's scripts touch several keys, so the importing
/// node would answer `TRYAGAIN` until every key had moved anyway. A command on a migrating slot
/// waits for the migration's end (`MOVED`); a slot with a few lock keys moves in milliseconds.
pub async fn resend_not_run<T, F, Fut>(send: F) -> Result<T, FredError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, FredError>>,
{
    let mut pause = Duration::from_millis(1);
    let mut patience = None;
    loop {
        let error = match send().await {
            Err(error) if classify(&error) == Class::NotRun => error,
            result => return result,
        };
        let until = *patience.get_or_insert_with(|| Instant::now() + NOT_RUN_PATIENCE);
        if Instant::now() + pause > until {
            return Err(error);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_NOT_RUN_PAUSE);
    }
}

/// How long [`resend_not_run`] keeps resending a command that a cluster redirected or asked to
/// try again (a slot migrating or failing over) before it reports a connection error.
pub const NOT_RUN_PATIENCE: Duration = Duration::from_secs(10);
/// The longest pause between those resends (they start at 1 ms and double).
const MAX_NOT_RUN_PAUSE: Duration = Duration::from_millis(50);

/// Replaces the protocol placeholders of a script file.
fn fill(template: &str, protocol: &Protocol) -> String {
    // The hand-on pieces first: they name the fence piece themselves.
    let mut lua = template
        .replace("@HAND_ON@", files::LINE_HAND_ON)
        .replace("@SEM_COMMON@", files::SEM_COMMON)
        .replace("@RW_COMMON@", files::RW_COMMON)
        .replace("@LINE_COMMON@", files::LINE_COMMON)
        .replace("@NEXT_FENCE@", files::NEXT_FENCE)
        .replace("@JOIN_LINE@", files::JOIN_LINE)
        .replace("@KEEP_PLACE@", files::KEEP_PLACE)
        .replace("@RELEASE_HOLD@", files::RELEASE_HOLD)
        .replace("@PERMITS@", PERMITS_FIELD)
        .replace("@USED@", USED_FIELD)
        .replace("@LATCH@", LATCH_FIELD)
        .replace("@ROUND@", ROUND_FIELD)
        .replace("@KIND@", KIND_FIELD)
        .replace("@READ_FENCE@", READ_FENCE_FIELD_PREFIX)
        .replace("@READ@", READ_FIELD_PREFIX)
        .replace("@MODE@", MODE_FIELD)
        .replace("@WRITER@", WRITER_FIELD)
        .replace("@FENCE@", FENCE_FIELD)
        .replace("@GRANTED@", GRANTED_FIELD)
        .replace("@EXPIRING@", EXPIRING_FIELD)
        .replace("@FREE@", FREE_PAYLOAD)
        .replace("@GRANT@", GRANT_PAYLOAD);
    if protocol.silent {
        // Evaluates the channel and message as the call would, and sends nothing.
        lua = lua.replace("redis.call('@PUBLISH@',", "select(1,");
    }
    let lua = lua.replace(
        "@PUBLISH@",
        if protocol.sharded {
            "SPUBLISH"
        } else {
            "PUBLISH"
        },
    );
    debug_assert!(!lua.contains('@'), "a placeholder was left unfilled");
    lua
}

/// The script files, as shipped (placeholders unfilled).
pub mod files {
    /// `acquire.lua`: acquire, re-enter, or queue as a waiter.
    pub const ACQUIRE: &str = include_str!("scripts/acquire.lua");
    /// `release.lua`: release one hold of a plain or fair lock (or settle an unanswered
    /// command); grants the lock to the first live waiter in line.
    pub const RELEASE: &str = include_str!("scripts/release.lua");
    /// `release_after.lua`: let the last hold end later instead of now.
    pub const RELEASE_AFTER: &str = include_str!("scripts/release_after.lua");
    /// `renew.lua`: renew many holds in one call.
    pub const RENEW: &str = include_str!("scripts/renew.lua");
    /// `force_unlock.lua`: remove a lock whoever holds it and wake its waiters.
    pub const FORCE_UNLOCK: &str = include_str!("scripts/force_unlock.lua");
    /// `line/acquire.lua`: acquire, re-enter or wait in line: a fair lock's tries, and a
    /// waiting plain lock's.
    pub const LINE_ACQUIRE: &str = include_str!("scripts/line/acquire.lua");
    /// `line/leave.lua`: a lock's waiter gives up its place (and a grant it never took).
    pub const LINE_LEAVE: &str = include_str!("scripts/line/leave.lua");
    /// `next_fence.lua`: the next fencing token, inlined where a script that grants says
    /// `@NEXT_FENCE@` (not a script itself).
    pub const NEXT_FENCE: &str = include_str!("scripts/next_fence.lua");
    /// `release_hold.lua`: a lock release's checks and count, inlined where a script says
    /// `@RELEASE_HOLD@` (not a script itself).
    pub const RELEASE_HOLD: &str = include_str!("scripts/release_hold.lua");
    /// `join_line.lua`: a waiter keeps or takes its place in a line of waiters, inlined where
    /// a script says `@JOIN_LINE@` (not a script itself).
    pub const JOIN_LINE: &str = include_str!("scripts/join_line.lua");
    /// `keep_place.lua`: a settle puts a waiter whose try it takes back where it stood in line,
    /// inlined where a release script says `@KEEP_PLACE@` (not a script itself).
    pub const KEEP_PLACE: &str = include_str!("scripts/keep_place.lua");
    /// `line/hand_on.lua`: a release grants the first live waiter, inlined where a lock's
    /// script says `@HAND_ON@` (not a script itself).
    pub const LINE_HAND_ON: &str = include_str!("scripts/line/hand_on.lua");
    /// `rw/acquire.lua`: acquire, re-enter or queue for a read/write lock's read or write side.
    pub const RW_ACQUIRE: &str = include_str!("scripts/rw/acquire.lua");
    /// `rw/release.lua`: release one read or write hold; tells the head of the line.
    pub const RW_RELEASE: &str = include_str!("scripts/rw/release.lua");
    /// `rw/leave.lua`: a read/write lock's waiter gives up its place.
    pub const RW_LEAVE: &str = include_str!("scripts/rw/leave.lua");
    /// `rw/common.lua`: the layout and helpers inlined where a script says `@RW_COMMON@`.
    pub const RW_COMMON: &str = include_str!("scripts/rw/common.lua");
    /// `sem/acquire.lua`: acquire permits of a semaphore, or queue for them.
    pub const SEM_ACQUIRE: &str = include_str!("scripts/sem/acquire.lua");
    /// `sem/release.lua`: give one acquisition's permits back.
    pub const SEM_RELEASE: &str = include_str!("scripts/sem/release.lua");
    /// `sem/leave.lua`: a semaphore's waiter gives up its place.
    pub const SEM_LEAVE: &str = include_str!("scripts/sem/leave.lua");
    /// `sem/set.lua`: set, try to set or change the number of permits; delete.
    pub const SEM_SET: &str = include_str!("scripts/sem/set.lua");
    /// `line/common.lua`: what every line with an entry per waiter shares (emptied keys,
    /// walking the line, refusing other kinds, a grant's token, lease and message), inlined
    /// where the semaphore's and the read/write lock's common pieces say `@LINE_COMMON@`.
    pub const LINE_COMMON: &str = include_str!("scripts/line/common.lua");
    /// `sem/common.lua`: the layout and helpers inlined where a script says `@SEM_COMMON@`.
    pub const SEM_COMMON: &str = include_str!("scripts/sem/common.lua");
    /// `latch/count_down.lua`: count a latch down; at zero it opens.
    pub const LATCH_COUNT_DOWN: &str = include_str!("scripts/latch/count_down.lua");
    /// `latch/set_count.lua`: set a latch's count if it is not set.
    pub const LATCH_SET_COUNT: &str = include_str!("scripts/latch/set_count.lua");
}

/// The scripts of one protocol setting, built once per setting and shared by its clients.
#[derive(Debug)]
pub struct Scripts {
    /// The protocol the scripts were built for.
    pub protocol: Protocol,
    /// Acquire or re-enter; raises the fence on each new grant (`scripts/acquire.lua`).
    pub acquire: LuaScript,
    /// Release one hold of a plain or fair lock; grants the lock to the first live waiter in
    /// line, or publishes it free (`scripts/release.lua`). With an expected hold count it
    /// settles an unanswered acquire or release instead.
    pub release: LuaScript,
    /// Let the last hold end later instead of now (`scripts/release_after.lua`).
    pub release_after: LuaScript,
    /// Renew many holds in one call (`scripts/renew.lua`).
    pub renew: LuaScript,
    /// Remove a lock whoever holds it and wake its waiters (`scripts/force_unlock.lua`).
    pub force_unlock: LuaScript,
    /// Acquire, re-enter or wait in line for a lock (`scripts/line/acquire.lua`).
    pub line_acquire: LuaScript,
    /// A lock's waiter leaves the line (`scripts/line/leave.lua`).
    pub line_leave: LuaScript,
    /// Acquire, re-enter or queue for a read/write lock (`scripts/rw/acquire.lua`).
    pub rw_acquire: LuaScript,
    /// Release one read or write hold, or settle (`scripts/rw/release.lua`).
    pub rw_release: LuaScript,
    /// A read/write lock's waiter leaves the line (`scripts/rw/leave.lua`).
    pub rw_leave: LuaScript,
    /// Acquire permits of a semaphore, or queue (`scripts/sem/acquire.lua`).
    pub sem_acquire: LuaScript,
    /// Give permits back, or settle (`scripts/sem/release.lua`).
    pub sem_release: LuaScript,
    /// A semaphore's waiter leaves the line (`scripts/sem/leave.lua`).
    pub sem_leave: LuaScript,
    /// Set or change a semaphore's permits, or delete it (`scripts/sem/set.lua`).
    pub sem_set: LuaScript,
    /// Count a latch down (`scripts/latch/count_down.lua`).
    pub latch_count_down: LuaScript,
    /// Set a latch's count (`scripts/latch/set_count.lua`).
    pub latch_set_count: LuaScript,
}

/// The three scripts every family of kinds has ([`Scripts::of`]).
#[derive(Clone, Copy, Debug)]
pub struct FamilyScripts<'a> {
    /// Acquire, re-enter, or wait in line.
    pub acquire: &'a LuaScript,
    /// Release one hold (and grant the line's head), or settle an unanswered command.
    pub release: &'a LuaScript,
    /// A waiter leaves the line, passing on a grant it never took.
    pub leave: &'a LuaScript,
}

impl Scripts {
    /// The scripts of a family of kinds.
    pub fn of(&self, family: crate::kind::Family) -> FamilyScripts<'_> {
        use crate::kind::Family;
        match family {
            Family::Line => FamilyScripts {
                acquire: &self.line_acquire,
                release: &self.release,
                leave: &self.line_leave,
            },
            Family::ReadWrite => FamilyScripts {
                acquire: &self.rw_acquire,
                release: &self.rw_release,
                leave: &self.rw_leave,
            },
            Family::Semaphore => FamilyScripts {
                acquire: &self.sem_acquire,
                release: &self.sem_release,
                leave: &self.sem_leave,
            },
        }
    }

    /// The scripts for `protocol`, built on first use and shared afterwards.
    pub fn for_protocol(protocol: Protocol) -> Arc<Scripts> {
        static BUILT: LazyLock<Mutex<HashMap<Protocol, Arc<Scripts>>>> =
            LazyLock::new(Mutex::default);
        let mut built = BUILT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        built
            .entry(protocol)
            .or_insert_with(|| Arc::new(Scripts::new(protocol)))
            .clone()
    }

    /// Builds every script for `protocol`.
    pub fn new(protocol: Protocol) -> Scripts {
        Scripts {
            protocol,
            acquire: LuaScript::new(files::ACQUIRE, &protocol),
            release: LuaScript::new(files::RELEASE, &protocol),
            release_after: LuaScript::new(files::RELEASE_AFTER, &protocol),
            renew: LuaScript::new(files::RENEW, &protocol),
            force_unlock: LuaScript::new(files::FORCE_UNLOCK, &protocol),
            line_acquire: LuaScript::new(files::LINE_ACQUIRE, &protocol),
            line_leave: LuaScript::new(files::LINE_LEAVE, &protocol),
            rw_acquire: LuaScript::new(files::RW_ACQUIRE, &protocol),
            rw_release: LuaScript::new(files::RW_RELEASE, &protocol),
            rw_leave: LuaScript::new(files::RW_LEAVE, &protocol),
            sem_acquire: LuaScript::new(files::SEM_ACQUIRE, &protocol),
            sem_release: LuaScript::new(files::SEM_RELEASE, &protocol),
            sem_leave: LuaScript::new(files::SEM_LEAVE, &protocol),
            sem_set: LuaScript::new(files::SEM_SET, &protocol),
            latch_count_down: LuaScript::new(files::LATCH_COUNT_DOWN, &protocol),
            latch_set_count: LuaScript::new(files::LATCH_SET_COUNT, &protocol),
        }
    }

    /// Every script, for preloading and tests.
    pub fn all(&self) -> [&LuaScript; 16] {
        [
            &self.acquire,
            &self.release,
            &self.release_after,
            &self.renew,
            &self.force_unlock,
            &self.line_acquire,
            &self.line_leave,
            &self.rw_acquire,
            &self.rw_release,
            &self.rw_leave,
            &self.sem_acquire,
            &self.sem_release,
            &self.sem_leave,
            &self.sem_set,
            &self.latch_count_down,
            &self.latch_set_count,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_words_are_filled_in() {
        let scripts = Scripts::new(Protocol::default());
        for script in scripts.all() {
            assert!(!script.lua().contains('@'), "{}", script.lua());
        }
        assert!(scripts.acquire.lua().contains("'~fence'"));
        let default = Scripts::for_protocol(Protocol::default());
        assert!(Arc::ptr_eq(
            &default,
            &Scripts::for_protocol(Protocol::default())
        ));
        // On Redis Cluster 7+ every message goes over sharded pub/sub, none over PUBLISH.
        let sharded = Scripts::new(Protocol {
            sharded: true,
            ..Protocol::default()
        });
        for script in sharded.all() {
            assert!(!script.lua().contains("'PUBLISH'"), "{}", script.lua());
        }
        assert!(sharded.release.lua().contains("redis.call('SPUBLISH'"));
        // A client whose server refuses PUBLISH: no script publishes, each still evaluates
        // what it would have sent.
        let silent = Scripts::new(Protocol {
            silent: true,
            ..Protocol::default()
        });
        for script in silent.all() {
            assert!(!script.lua().contains("PUBLISH"), "{}", script.lua());
        }
        assert!(silent.release.lua().contains("select(1, ARGV[2]"));
    }
}
