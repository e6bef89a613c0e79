//! The command connection as leasehold uses it: a fred client whose every command carries the
//! options a lock command needs, whoever built and configured the client.

use std::time::Duration;

use std::future::Future;

use bytes_utils::Str;
use fred::clients::{Client, WithOptions};
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, ClusterInterface, LuaInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, FromValue, MultipleKeys, MultipleValues, Value};

/// A fred [`Client`] whose commands go out with [`lock_command_options`]. Every call of the
/// library goes through one, so the options hold on an application's own client too (one
/// built by [`LockClient::builder_from_client`](https://docs.rs/leasehold), whose connection
/// settings leasehold does not choose).
pub type Redis = WithOptions<Client>;

/// What every command of a lock needs from fred, set on each command:
///
/// - **one write attempt** (`max_attempts: 1`): fred resends a command in flight after a
///   reconnect unless told otherwise, and a state change must never go out twice (an acquire
///   sent twice would count a hold twice, a release would release twice). An unanswered
///   change is settled above fred, by a compare-and-set that knows what it sent;
/// - **no redirection followed** (`max_redirections: 0`): fred counts a `MOVED`/`ASK`
///   redirection as a write attempt, so under the line above it would fail the command anyway
///   (and an `ASK` followed that way stops a clustered client for good). With none allowed, it
///   reports the redirection (after resyncing its slot map on `MOVED`), and
///   [`resend_not_run`](crate::scripts::resend_not_run) sends the command again, knowing
///   nothing ran;
/// - **the command timeout**: fred times the command out by itself, so the hot path arms no
///   timer of its own when its budget is the whole timeout.
pub fn lock_command_options(timeout: Duration) -> Options {
    Options {
        max_attempts: Some(1),
        max_redirections: Some(0),
        timeout: Some(timeout),
        ..Options::default()
    }
}

/// A client leasehold built itself, whose connection settings are already what
/// [`lock_command_options`] sets (`LockClientBuilder::build`): its commands need no options of
/// their own.
pub fn own(client: &Client) -> Redis {
    client.with_options(&Options::default())
}

/// An application's client, whose connection settings are its own: every command leasehold
/// sends through it carries [`lock_command_options`] with `timeout`. It shares `client`'s
/// connections.
pub fn shared(client: &Client, timeout: Duration) -> Redis {
    client.with_options(&lock_command_options(timeout))
}

/// Whether `redis` is an application's client ([`shared`]).
pub fn is_shared(redis: &Redis) -> bool {
    redis.options().max_attempts.is_some()
}

/// A connection the scripts can be sent through: EVALSHA, with the options a lock command
/// needs in force.
pub trait ScriptConnection: ClusterInterface + Send + Sync {
    /// EVALSHA of `sha1` with `keys` and `args`.
    fn evalsha_script<R: FromValue>(
        &self,
        sha1: &Str,
        keys: MultipleKeys,
        args: MultipleValues,
    ) -> impl Future<Output = Result<R, FredError>> + Send;
}

/// A plain client sends what its own connection settings say (a client leasehold built has
/// them right: see `LockClientBuilder::build`).
impl ScriptConnection for Client {
    fn evalsha_script<R: FromValue>(
        &self,
        sha1: &Str,
        keys: MultipleKeys,
        args: MultipleValues,
    ) -> impl Future<Output = Result<R, FredError>> + Send {
        self.evalsha(sha1.clone(), keys, args)
    }
}

/// Over leasehold's own client ([`own`]), whose connection settings already are the options, the script
/// goes through fred's Lua interface on the client itself. Over an application's client
/// ([`shared`]) it
/// goes as a command of its own, which carries the options: fred 10.1 implements its Lua
/// interface for a plain client but not for one with per-command options. A custom command is
/// routed only by a slot given with it (by default fred hashes its first string argument, here
/// the SHA1): the slot of the first key, which a script's keys share. It costs a few
/// allocations more per call than the Lua interface.
impl ScriptConnection for Redis {
    fn evalsha_script<R: FromValue>(
        &self,
        sha1: &Str,
        keys: MultipleKeys,
        args: MultipleValues,
    ) -> impl Future<Output = Result<R, FredError>> + Send {
        let own = !is_shared(self);
        let sha1 = sha1.clone();
        async move {
            if own {
                return (**self).evalsha(sha1, keys, args).await;
            }
            let keys = keys.inner();
            let hash = keys.first().map_or(ClusterHash::Random, |key| {
                ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes()))
            });
            let args = match args {
                Value::Array(args) => args,
                Value::Null => Vec::new(),
                arg => vec![arg],
            };
            let mut all = Vec::with_capacity(2 + keys.len() + args.len());
            all.push(Value::String(sha1));
            all.push(Value::Integer(keys.len() as i64));
            all.extend(keys.into_iter().map(Value::from));
            all.extend(args);
            self.custom::<R, Value>(CustomCommand::new_static("EVALSHA", hash, false), all)
                .await
        }
    }
}
