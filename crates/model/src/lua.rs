//! Runs a script's Lua text the way Redis does: Lua 5.1, `KEYS` and `ARGV`, `redis.call` and
//! `redis.pcall` over the model's [`Redis`], `redis.error_reply`/`status_reply`, and Redis's
//! conversions between Lua values and replies.
//!
//! One Lua state per checker thread, with each script text compiled once: compiling the scripts
//! for every step would cost more than running them. A script keeps nothing between runs (Redis
//! forbids globals, and `KEYS`/`ARGV` and the command functions are set for each run), so
//! sharing the state is as good as a fresh one.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use mlua::{Function, Lua, MultiValue, Table, Value};

use crate::redis::{number_text, Call, Redis, Reply};

struct Engine {
    lua: Lua,
    compiled: HashMap<String, Function>,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// What Redis's Lua library offers besides `call` and `pcall`, which are set per run.
const PRELUDE: &str = r#"
redis = {}
function redis.error_reply(e) return {err = e} end
function redis.status_reply(s) return {ok = s} end
"#;

fn engine() -> Engine {
    let lua = Lua::new();
    lua.load(PRELUDE).exec().expect("prelude");
    Engine {
        lua,
        compiled: HashMap::new(),
    }
}

/// The outcome of one script run: its reply and the messages it published, in order.
#[derive(Debug)]
pub struct Ran {
    /// The script's reply (a Lua error becomes [`Reply::Error`]).
    pub reply: Reply,
    /// (channel, payload) of every PUBLISH, in order.
    pub published: Vec<(String, String)>,
    /// The first command that would have stopped this run had its slot been migrating (Redis
    /// Cluster): every key the script names was there when it began (else Redis would not
    /// have run it then), and the command names a key that the script itself emptied before.
    /// Redis stops such a script there ("non local key"); the model runs it on.
    pub stopped_while_migrating: Option<String>,
}

/// Runs `script` atomically on `redis` at `now` (model milliseconds).
pub fn run(script: &str, keys: &[String], argv: &[String], redis: &mut Redis, now: u64) -> Ran {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let engine = slot.get_or_insert_with(engine);
        let function = match engine.compiled.get(script) {
            Some(f) => f.clone(),
            None => {
                let f = engine
                    .lua
                    .load(script)
                    .set_name("script")
                    .into_function()
                    .unwrap_or_else(|e| panic!("a shipped script does not compile: {e}"));
                engine.compiled.insert(script.to_string(), f.clone());
                f
            }
        };
        execute(&engine.lua, &function, keys, argv, redis, now)
    })
}

fn execute(
    lua: &Lua,
    function: &Function,
    keys: &[String],
    argv: &[String],
    redis: &mut Redis,
    now: u64,
) -> Ran {
    let mut published = Vec::new();
    // The error a failed redis.call raised: the script's reply, as Redis sends it.
    let raised: RefCell<Option<String>> = RefCell::new(None);
    // Keys this run emptied, and the first command naming one again (see `Ran`).
    let all_there = keys.iter().all(|k| redis.exists(k, now));
    let emptied: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    let stopped: RefCell<Option<String>> = RefCell::new(None);
    let result = {
        let state = RefCell::new((&mut *redis, &mut published));
        lua.scope(|scope| {
            let command = |lua: &Lua, args: MultiValue, protected: bool| -> mlua::Result<Value> {
                let args = arguments(args)?;
                let reply = {
                    let mut state = state.borrow_mut();
                    let (redis, published) = &mut *state;
                    let named = Redis::command_keys(&args);
                    if all_there {
                        let mut emptied = emptied.borrow_mut();
                        if let Some(key) = named.iter().find(|k| emptied.contains(*k)) {
                            stopped
                                .borrow_mut()
                                .get_or_insert_with(|| format!("{} on {key}", args[0]));
                        }
                        let there: Vec<bool> = named.iter().map(|k| redis.exists(k, now)).collect();
                        let reply = redis.execute(&args, &mut Call { now, published });
                        for (key, was) in named.iter().zip(there) {
                            if was && !redis.exists(key, now) {
                                emptied.insert(key.clone());
                            }
                        }
                        reply
                    } else {
                        redis.execute(&args, &mut Call { now, published })
                    }
                };
                if let (Reply::Error(e), false) = (&reply, protected) {
                    *raised.borrow_mut() = Some(e.clone());
                    return Err(mlua::Error::RuntimeError(e.clone()));
                }
                to_lua(lua, &reply)
            };
            let call = scope.create_function(move |lua, args| command(lua, args, false))?;
            let pcall = scope.create_function(move |lua, args| command(lua, args, true))?;
            let globals = lua.globals();
            let redis_table: Table = globals.get("redis")?;
            redis_table.set("call", call)?;
            redis_table.set("pcall", pcall)?;
            globals.set(
                "KEYS",
                lua.create_sequence_from(keys.iter().map(String::as_str))?,
            )?;
            globals.set(
                "ARGV",
                lua.create_sequence_from(argv.iter().map(String::as_str))?,
            )?;
            let value: Value = function.call(())?;
            from_lua(&value)
        })
    };
    let reply = match result {
        Ok(reply) => reply,
        Err(error) => Reply::Error(
            raised
                .into_inner()
                .unwrap_or_else(|| format!("ERR script error: {error}")),
        ),
    };
    Ran {
        reply,
        published,
        stopped_while_migrating: stopped.into_inner(),
    }
}

/// Command arguments as Redis takes them from Lua: strings, and numbers as their text.
fn arguments(args: MultiValue) -> mlua::Result<Vec<String>> {
    args.into_iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.to_str()?.to_string()),
            Value::Integer(i) => Ok(i.to_string()),
            Value::Number(n) => Ok(number_text(n)),
            _ => Err(mlua::Error::RuntimeError(
                "Lua redis lib command arguments must be strings or integers".into(),
            )),
        })
        .collect()
}

/// A reply as Lua sees it: nil is `false`, status and error replies are tables.
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Int(i) => Value::Number(*i as f64),
        Reply::Bulk(s) => Value::String(lua.create_string(s)?),
        Reply::Nil => Value::Boolean(false),
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.set("ok", s.as_str())?;
            Value::Table(t)
        }
        Reply::Error(e) => {
            let t = lua.create_table()?;
            t.set("err", e.as_str())?;
            Value::Table(t)
        }
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// A script's return value as Redis replies it: numbers are truncated to integers, `false` is
/// nil, a table is an error, a status or an array up to its first nil.
fn from_lua(value: &Value) -> mlua::Result<Reply> {
    Ok(match value {
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(n.trunc() as i64),
        Value::String(s) => Reply::Bulk(s.to_str()?.to_string()),
        Value::Boolean(true) => Reply::Int(1),
        Value::Boolean(false) | Value::Nil => Reply::Nil,
        Value::Table(t) => {
            if let Value::String(e) = t.get::<Value>("err")? {
                Reply::Error(e.to_str()?.to_string())
            } else if let Value::String(s) = t.get::<Value>("ok")? {
                Reply::Status(s.to_str()?.to_string())
            } else {
                let mut items = Vec::new();
                for i in 1.. {
                    let item: Value = t.get(i)?;
                    if item.is_nil() {
                        break;
                    }
                    items.push(from_lua(&item)?);
                }
                Reply::Array(items)
            }
        }
        other => {
            return Err(mlua::Error::RuntimeError(format!(
                "a script returned a {}",
                other.type_name()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_lua_conversions() {
        let mut redis = Redis::default();
        let ran = run(
            "redis.call('HSET', KEYS[1], 'a', ARGV[1]) \
             local t = redis.call('TIME') \
             local missing = redis.call('HGET', KEYS[1], 'b') \
             local bad = redis.pcall('INCR', KEYS[1]) \
             return {redis.call('HGET', KEYS[1], 'a'), t[1], t[2], missing == false, bad.err ~= nil, 7.9}",
            &["k".into()],
            &["v".into()],
            &mut redis,
            2_003,
        );
        assert_eq!(
            ran.reply,
            Reply::Array(vec![
                Reply::Bulk("v".into()),
                Reply::Bulk("3".into()),
                Reply::Bulk("3000".into()),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(7),
            ])
        );
    }

    #[test]
    fn a_command_on_a_key_the_script_emptied_would_stop_it_while_its_slot_migrates() {
        let mut redis = Redis::default();
        let keys = ["h".to_string(), "z".to_string()];
        let set_up = "redis.call('HSET', KEYS[1], 'a', '1') redis.call('ZADD', KEYS[2], 1, 'm')";
        let cases = [
            // Deleted, then written again: stopped.
            (
                "redis.call('DEL', KEYS[1]) redis.call('HSET', KEYS[1], 'b', '1')",
                Some("HSET on h"),
            ),
            // Emptied by removing its last member, then read: stopped.
            (
                "redis.call('ZREM', KEYS[2], 'm') return redis.call('ZCARD', KEYS[2])",
                Some("ZCARD on z"),
            ),
            // Replaced in place, then deleted as the last command on it: runs whole.
            (
                "redis.call('HSET', KEYS[1], 'b', '1') redis.call('HDEL', KEYS[1], 'a') \
              redis.call('PEXPIRE', KEYS[1], 10) redis.call('DEL', KEYS[1])",
                None,
            ),
        ];
        for (lua, stopped) in cases {
            run(set_up, &keys, &[], &mut redis, 0);
            let ran = run(lua, &keys, &[], &mut redis, 0);
            assert_eq!(ran.stopped_while_migrating.as_deref(), stopped, "{lua}");
        }
        // A key that was not there when the script began: Redis would not have run it while
        // the slot migrates (TRYAGAIN), so nothing it does then counts.
        run(
            "redis.call('DEL', KEYS[1], KEYS[2])",
            &keys,
            &[],
            &mut redis,
            0,
        );
        let ran = run(
            "redis.call('HSET', KEYS[1], 'a', '1') redis.call('DEL', KEYS[1]) \
             return redis.call('EXISTS', KEYS[1])",
            &keys,
            &[],
            &mut redis,
            0,
        );
        assert_eq!(ran.stopped_while_migrating, None);
    }

    #[test]
    fn a_failed_call_is_the_scripts_error() {
        let mut redis = Redis::default();
        let ran = run(
            "redis.call('SET', KEYS[1], 'x') return redis.call('HGET', KEYS[1], 'f')",
            &["k".into()],
            &[],
            &mut redis,
            0,
        );
        assert!(matches!(ran.reply, Reply::Error(e) if e.starts_with("WRONGTYPE")));
        let ran = run("return redis.call('FLUSHALL')", &[], &[], &mut redis, 0);
        assert!(matches!(ran.reply, Reply::Error(e) if e.contains("unknown command")));
    }
}
