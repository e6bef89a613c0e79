//! The Lua scripts: one per state change, each in its own `.lua` file beside this one.
//!
//! Every script is sent with EVALSHA; when Redis answers NOSCRIPT (after a restart, a failover
//! or SCRIPT FLUSH) it is loaded with SCRIPT LOAD and sent again. NOSCRIPT means the script did
//! not run, so the second send can never apply a change twice.

use std::sync::LazyLock;

use bytes_utils::Str;
use fred::interfaces::LuaInterface;
use fred::prelude::{Error as FredError, FromValue};
use fred::types::scripts::Script;
use fred::types::{MultipleKeys, MultipleValues};

/// A Lua script with its SHA1, loaded on demand.
#[derive(Debug)]
pub struct LuaScript {
    name: &'static str,
    lua: &'static str,
    sha1: Str,
}

impl LuaScript {
    fn new(name: &'static str, lua: &'static str) -> LuaScript {
        LuaScript {
            name,
            lua,
            sha1: Script::from_lua(lua).sha1().to_string().into(),
        }
    }

    /// The script's name (its file name without `.lua`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source.
    pub fn lua(&self) -> &'static str {
        self.lua
    }

    /// The SHA1 that EVALSHA sends.
    pub fn sha1(&self) -> &str {
        &self.sha1
    }

    /// Runs the script with EVALSHA, loading it first when Redis answers NOSCRIPT; `build`
    /// makes the keys and arguments, and is called again only for that resend.
    ///
    /// Keeping a copy of the keys and arguments instead, for a resend that almost never happens
    /// (scripts are preloaded at connect), cost two allocations per acquire and per release,
    /// and a copy of up to 1,000 keys per renewal batch.
    pub async fn call<R, C, F>(&self, client: &C, build: F) -> Result<R, FredError>
    where
        R: FromValue,
        C: LuaInterface + Send + Sync,
        F: Fn() -> (MultipleKeys, MultipleValues) + Send,
    {
        let (keys, args) = build();
        match client.evalsha(self.sha1.clone(), keys, args).await {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                client.script_load::<(), _>(self.lua).await?;
                let (keys, args) = build();
                client.evalsha(self.sha1.clone(), keys, args).await
            }
            result => result,
        }
    }
}

macro_rules! script {
    ($(#[$doc:meta])* $static:ident, $file:literal) => {
        $(#[$doc])*
        pub static $static: LazyLock<LuaScript> =
            LazyLock::new(|| LuaScript::new($file, include_str!(concat!("scripts/", $file, ".lua"))));
    };
}

script!(
    /// Acquire or re-enter; raises the fence on each new grant (`scripts/acquire.lua`).
    ACQUIRE,
    "acquire"
);
script!(
    /// Release one hold; publishes when the lock becomes free (`scripts/release.lua`).
    RELEASE,
    "release"
);
script!(
    /// Undo an acquire whose reply never arrived (`scripts/rollback.lua`).
    ROLLBACK,
    "rollback"
);
script!(
    /// Let the last hold end later instead of now (`scripts/release_after.lua`).
    RELEASE_AFTER,
    "release_after"
);
script!(
    /// Renew many holds in one call (`scripts/renew.lua`).
    RENEW,
    "renew"
);
script!(
    /// Remove a lock whoever holds it and wake its waiters (`scripts/force_unlock.lua`).
    FORCE_UNLOCK,
    "force_unlock"
);

/// Every script, for preloading and tests.
pub fn all() -> [&'static LuaScript; 6] {
    [
        &ACQUIRE,
        &RELEASE,
        &RELEASE_AFTER,
        &ROLLBACK,
        &RENEW,
        &FORCE_UNLOCK,
    ]
}
