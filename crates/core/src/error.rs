//! One error type for every lock operation, so callers can match on what went wrong, and the
//! one place where a Redis client error is classified.

use std::fmt;

use fred::error::{Error as FredError, ErrorKind};

/// Shorthand for `Result<T, LockError>`.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// What went wrong with a lock operation.
///
/// The variants separate what a caller reacts to differently: a lock that is not yours
/// ([`NotHeld`](Self::NotHeld)), a server that did not answer in time, so the outcome is unknown
/// ([`Timeout`](Self::Timeout)), a connection that is broken or a server that cannot serve right
/// now ([`Connection`](Self::Connection)), a refusal by Redis ([`Redis`](Self::Redis),
/// [`WrongType`](Self::WrongType), [`PermissionDenied`](Self::PermissionDenied)), a bad argument
/// caught before anything was sent ([`InvalidArgument`](Self::InvalidArgument)) and a hold whose
/// lease ran out ([`LeaseLost`](Self::LeaseLost)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The owner does not hold the lock: wrong owner, lease already expired, or double unlock.
    /// Nothing changed in Redis.
    #[error("lock {name:?} is not held by owner {owner}")]
    NotHeld {
        /// The lock name.
        name: String,
        /// The owner that tried to release.
        owner: String,
    },
    /// Redis did not answer in time (the command timeout, or what was left of a bounded wait).
    /// The command may or may not have run; leasehold settles a state change it cannot confirm,
    /// and a hold always ends with its lease.
    #[error("Redis did not answer in time: the outcome is unknown")]
    Timeout,
    /// The connection to Redis failed or was lost (including Redis being down at connect), or
    /// the server cannot serve right now (loading, busy, failing over).
    #[error("connection to Redis failed: {0}")]
    Connection(#[source] RedisError),
    /// Redis refused the command (ACL, or refused credentials): the user lacks a command, key
    /// or channel permission.
    #[error("Redis refused the command (check the ACL rule in docs/guide.md): {0}")]
    PermissionDenied(#[source] RedisError),
    /// A key of another type already sits where one of the lock's keys belongs.
    #[error("key {key:?} holds a value of another type (WRONGTYPE): it is not a leasehold key")]
    WrongType {
        /// The offending key.
        key: String,
    },
    /// Any other error reply from Redis.
    #[error("Redis error: {0}")]
    Redis(#[source] RedisError),
    /// A bad argument (empty or too long name, zero lease, ...), refused before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The hold's lease ran out (or the lock was taken away) while the work was still running.
    #[error("the lease on lock {name:?} was lost")]
    LeaseLost {
        /// The lock name.
        name: String,
    },
    /// The owner asked for a read/write lock's write side while it holds the read side: it
    /// would wait for itself (and two readers doing so would wait for each other). Refused at
    /// once; nothing changed. Release the read hold first, or take the write lock first and
    /// the read lock under it (downgrade).
    #[error(
        "the owner holds a read lock on {name:?}: it cannot wait for the write lock \
         (release the read lock first)"
    )]
    UpgradeRefused {
        /// The lock name.
        name: String,
    },
    /// A grant did not reach the replicas the client's replica sync policy asks for
    /// (`LockClientBuilder::replica_sync`) within its timeout: it was rolled back, nothing is
    /// held. Transient: a waiting acquire tries again (a bounded one until its deadline).
    #[error(
        "lock {name:?} was granted but reached {replicas} of the {required} replicas required in time: rolled back"
    )]
    NotReplicated {
        /// The lock name.
        name: String,
        /// Replicas that acknowledged the grant.
        replicas: u32,
        /// Replicas the policy asks for.
        required: u32,
    },
    /// The name is in use by another kind of lock: a read/write lock's acquire on a semaphore's
    /// name, a fair lock's on a latch's, and so on. One name is one resource, used as one kind;
    /// nothing was changed. `held_as` and `asked_as` name the kinds ("lock", "read/write lock",
    /// "semaphore", "count-down latch").
    #[error("{name:?} is a {held_as}, not a {asked_as}: nothing was changed")]
    WrongKind {
        /// The name.
        name: String,
        /// The kind the name is in use as.
        held_as: String,
        /// The kind the refused call is for.
        asked_as: String,
    },
    /// A change that cannot be undone (a latch's count or count-down, a semaphore's number of
    /// permits, a lease extended by hand) ran on the primary but did not reach the replicas the
    /// client's replica sync policy asks for within its timeout. It stands on the primary (it
    /// was not rolled back), and a failover before a replica has it loses it. Not transient:
    /// calling again would apply it again (count down twice, add twice; extending again is
    /// harmless). docs/deployments.md ("Replica sync") says what a failover can then do and
    /// what to do about it.
    #[error(
        "{name:?} was changed on the primary but the change reached {replicas} of the {required} \
         replicas required in time: it stands on the primary, and a failover before a replica \
         has it would lose it"
    )]
    AppliedNotReplicated {
        /// The latch's, semaphore's or lock's name.
        name: String,
        /// Replicas that acknowledged the change.
        replicas: u32,
        /// Replicas the policy asks for.
        required: u32,
    },
    /// A quorum lock (`RedLock`) could not reach a majority of its servers: fewer than
    /// `needed` of the `servers` answered, the others failed or did not answer within the
    /// per-server timeout. Nothing is held: what some servers granted was released. Transient:
    /// a later try may find the servers back.
    #[error(
        "only {answered} of {servers} Redis servers answered for lock {name:?}; a quorum needs \
         {needed} (last error: {last})"
    )]
    QuorumUnreachable {
        /// The lock name.
        name: String,
        /// How many servers answered (granted or busy).
        answered: usize,
        /// How many must answer for a quorum.
        needed: usize,
        /// How many servers the lock spans.
        servers: usize,
        /// The last server's error.
        #[source]
        last: Box<LockError>,
    },
}

/// An error from Redis or from the connection to it, as the source of a [`LockError`]. Its
/// text is the client's or the server's own.
pub struct RedisError(FredError);

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.details())
    }
}

impl fmt::Debug for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisError({:?}: {})", self.0.kind(), self.0.details())
    }
}

impl std::error::Error for RedisError {}

impl RedisError {
    /// An error with this message, as if the connection had failed with it.
    pub fn connection(message: impl Into<String>) -> RedisError {
        RedisError(FredError::new(ErrorKind::IO, message.into()))
    }
}

/// What a Redis client error means for leasehold, decided once from its structure: fred's error
/// kind, and for a server's error reply its code (the first word, by the RESP convention), plus,
/// for a leasehold script's own `WRONGTYPE <i>` reply, the index of the offending key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Timeout,
    Connection,
    NoScript,
    PermissionDenied,
    /// WRONGTYPE; `Some(i)`: the script named its KEYS[i] (1-based).
    WrongType(Option<usize>),
    /// A read/write lock's acquire script refused an upgrade (`UPGRADE ...`).
    Upgrade,
    /// A script refused a name in use by another kind (`WRONGKIND <held> <asked>`).
    WrongKind,
    /// A script refused a number out of its documented range (`RANGE ...`); nothing changed.
    Range,
    /// The command certainly did not run and may be sent again: a cluster node redirected it
    /// (`MOVED`/`ASK`, which the client is built not to follow: see
    /// [`crate::scripts::resend_not_run`]) or answered `TRYAGAIN` (a multi-key command during
    /// its slot's migration).
    NotRun,
    Other,
}

/// fred's words when a command met `MOVED` or `ASK` and may not be redirected (the client
/// sets `max_redirections: 0`). fred has synced its slot map first on `MOVED`.
const REDIRECTED: &str = "Too many redirections.";

/// How servers other than Redis 7 word an ACL refusal of a command inside a script: Redis 6.2
/// (with no error code) and Valkey.
const SCRIPT_ACL_REFUSALS: [&str; 2] = ["user executing the script can't", "ACL failure in script"];

/// Server error codes after which a retry later may succeed: the server is loading, running a
/// long script, failing over, or its cluster is reconfiguring.
const UNAVAILABLE_CODES: [&str; 5] = ["LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN"];

pub(crate) fn classify(error: &FredError) -> Class {
    if error.kind() == &ErrorKind::Routing && error.details() == REDIRECTED {
        return Class::NotRun;
    }
    match error.kind() {
        ErrorKind::Timeout => return Class::Timeout,
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Routing => {
            return Class::Connection
        }
        ErrorKind::Auth => return Class::PermissionDenied,
        _ => {}
    }
    let details = error.details();
    // A command a script ran was refused by the ACL. Redis 7 words it "ERR ... NOPERM ..."
    // (below); Valkey "ERR ACL failure in script: User u has no permissions to run the 'zadd'
    // command"; Redis 6.2 "The user executing the script can't run this command or subcommand"
    // (or "can't access at least one of the keys", "can't publish to the channel"), as
    // "ERR Error running script ..." or, for a command, with no code at all: "@user_script:
    // 165: The user executing the script can't run this command or subcommand".
    if SCRIPT_ACL_REFUSALS
        .iter()
        .any(|words| details.contains(words))
    {
        return Class::PermissionDenied;
    }
    let mut words = details.split_whitespace();
    let code = words.next().unwrap_or("");
    // A server error reply starts with an upper-case code; fred's own failures (a command it
    // could not route or write, a connection lost under it) are sentences.
    let is_code = !code.is_empty()
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !is_code {
        return match error.kind() {
            ErrorKind::Unknown | ErrorKind::Protocol => Class::Connection,
            _ => Class::Other,
        };
    }
    match code {
        "NOSCRIPT" => Class::NoScript,
        "NOPERM" | "NOAUTH" | "WRONGPASS" => Class::PermissionDenied,
        "WRONGTYPE" => Class::WrongType(words.next().and_then(|w| w.parse().ok())),
        "UPGRADE" => Class::Upgrade,
        "WRONGKIND" => Class::WrongKind,
        "RANGE" => Class::Range,
        "TRYAGAIN" => Class::NotRun,
        code if UNAVAILABLE_CODES.contains(&code) => Class::Connection,
        // Inside a script Redis 7 reports a refused command as "ERR ... script: ..." with the
        // ACL's own words.
        "ERR" if details.contains("NOPERM") => Class::PermissionDenied,
        // A script stopped half-way because its slot started migrating under it (a key it
        // deleted, or one that moved, is no longer local): what ran stays. The outcome is
        // unknown, as after a lost reply: the caller settles it and may try again.
        "ERR" if details.contains("non local key") => Class::Connection,
        _ => Class::Other,
    }
}

impl LockError {
    /// Whether the error is transient (timeout, connection, or a quorum of servers unreachable):
    /// retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Timeout
                | LockError::Connection(_)
                | LockError::QuorumUnreachable { .. }
                | LockError::NotReplicated { .. }
        )
    }

    /// Maps an error of the Redis client to the variant a caller can act on, for code that runs
    /// its own commands through [`LockClient::redis`](https://docs.rs/leasehold). A WRONGTYPE
    /// reply names no key here (leasehold's own commands name theirs).
    pub fn from_redis(error: FredError) -> LockError {
        from_fred(error, &[])
    }
}

impl LockError {
    /// Fills in the lock name of an error made without one.
    pub(crate) fn naming(self, lock: &str) -> LockError {
        match self {
            LockError::UpgradeRefused { name } if name.is_empty() => LockError::UpgradeRefused {
                name: lock.to_string(),
            },
            LockError::WrongKind {
                name,
                held_as,
                asked_as,
            } if name.is_empty() => LockError::WrongKind {
                name: lock.to_string(),
                held_as,
                asked_as,
            },
            other => other,
        }
    }
}

pub(crate) fn from_fred(error: FredError, keys: &[&str]) -> LockError {
    match classify(&error) {
        Class::Timeout => LockError::Timeout,
        // Still redirected after `resend_not_run`'s resends: the slot is migrating for longer.
        Class::Connection | Class::NotRun => LockError::Connection(RedisError(error)),
        Class::PermissionDenied => LockError::PermissionDenied(RedisError(error)),
        Class::WrongType(index) => {
            let key = index
                .and_then(|i| keys.get(i.checked_sub(1)?))
                .or(keys.first())
                .map_or_else(String::new, |k| k.to_string());
            LockError::WrongType { key }
        }
        Class::Upgrade => LockError::UpgradeRefused {
            name: String::new(),
        },
        Class::WrongKind => {
            // `WRONGKIND <held> <asked> ...`: the kinds by their words (see `kind_word`).
            let mut words = error.details().split_whitespace().skip(1);
            let mut next = || kind_word(words.next().unwrap_or("")).to_string();
            let held_as = next();
            let asked_as = next();
            LockError::WrongKind {
                name: String::new(),
                held_as,
                asked_as,
            }
        }
        Class::Range => LockError::InvalidArgument(
            error
                .details()
                .trim_start_matches("RANGE")
                .trim()
                .to_string(),
        ),
        Class::NoScript | Class::Other => match error.kind() {
            ErrorKind::Config | ErrorKind::Url => {
                LockError::InvalidArgument(error.details().to_string())
            }
            _ => LockError::Redis(RedisError(error)),
        },
    }
}

/// A kind as a script names it in a `WRONGKIND` reply, in words for the error.
pub(crate) fn kind_word(word: &str) -> &str {
    match crate::Stored::from_marker(word) {
        Some(stored) => stored.described(),
        None => word,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> FredError {
        fred::error::Error::new(ErrorKind::Unknown, text.to_string())
    }

    #[test]
    fn classes() {
        let keys = ["lock", "fence", "queue"];
        assert!(matches!(
            from_fred(reply("WRONGTYPE 3 the waiters key holds another type"), &keys),
            LockError::WrongType { key } if key == "queue"
        ));
        assert!(matches!(
            from_fred(reply("WRONGTYPE Operation against a key holding the wrong kind of value"), &keys),
            LockError::WrongType { key } if key == "lock"
        ));
        assert!(matches!(
            from_fred(
                reply("NOPERM this user has no permissions to run the 'publish' command"),
                &keys
            ),
            LockError::PermissionDenied(_)
        ));
        // The same refusal in the words of Valkey 9 and of Redis 6.2 (no error code there).
        assert!(matches!(
            from_fred(
                reply("ERR ACL failure in script: User nozadd has no permissions to run the 'zadd' command"),
                &keys
            ),
            LockError::PermissionDenied(_)
        ));
        assert!(matches!(
            from_fred(
                reply("@user_script: 165: The user executing the script can't run this command or subcommand"),
                &keys
            ),
            LockError::PermissionDenied(_)
        ));
        assert!(matches!(
            from_fred(
                reply("ERR Error running script (call to f_6a93): @user_script:72: @user_script: 72: The user executing the script can't publish to the channel mentioned in the command"),
                &keys
            ),
            LockError::PermissionDenied(_)
        ));
        assert!(matches!(
            from_fred(reply("Failed to route command."), &keys),
            LockError::Connection(_)
        ));
        assert!(matches!(
            from_fred(
                reply("LOADING Redis is loading the dataset in memory"),
                &keys
            ),
            LockError::Connection(_)
        ));
        assert!(matches!(
            from_fred(reply("ERR value is not an integer or out of range"), &keys),
            LockError::Redis(_)
        ));
        assert!(matches!(
            from_fred(
                FredError::new(ErrorKind::Timeout, "Request timed out."),
                &keys
            ),
            LockError::Timeout
        ));
        assert_eq!(
            classify(&reply("NOSCRIPT No matching script.")),
            Class::NoScript
        );
        assert_eq!(
            classify(&reply(
                "TRYAGAIN Multiple keys request during rehashing of slot"
            )),
            Class::NotRun
        );
        assert_eq!(
            classify(&reply(
                "ERR Script attempted to access a non local key in a cluster node script: x"
            )),
            Class::Connection
        );
        assert_eq!(
            classify(&FredError::new(ErrorKind::Routing, REDIRECTED)),
            Class::NotRun
        );
        assert!(matches!(
            from_fred(FredError::new(ErrorKind::Routing, REDIRECTED), &keys),
            LockError::Connection(_)
        ));
    }
}
