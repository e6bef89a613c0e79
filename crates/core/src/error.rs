//! One error type for every lock operation, so callers can match on what went wrong.

use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};

/// Shorthand for `Result<T, LockError>`.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// What went wrong with a lock operation.
///
/// The variants separate what a caller reacts to differently: a lock that is not yours
/// ([`NotHeld`](Self::NotHeld)), a server that did not answer in time, so the outcome is unknown
/// ([`Timeout`](Self::Timeout)), a broken connection ([`Connection`](Self::Connection)), a
/// refusal by Redis ([`Redis`](Self::Redis), [`WrongType`](Self::WrongType),
/// [`PermissionDenied`](Self::PermissionDenied)), a bad argument caught before anything was sent
/// ([`InvalidArgument`](Self::InvalidArgument)) and a hold whose lease ran out
/// ([`LeaseLost`](Self::LeaseLost)).
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
    /// Redis did not answer within the command timeout. The command may or may not have run;
    /// leasehold undoes an acquire it cannot confirm, and a hold always ends with its lease.
    #[error("Redis did not answer within {0:?}: the outcome is unknown")]
    Timeout(Duration),
    /// The connection to Redis failed or was lost (including Redis being down at connect).
    #[error("connection to Redis failed: {0}")]
    Connection(#[source] FredError),
    /// Redis refused the command (ACL): the user lacks a command, key or channel permission.
    #[error("Redis refused the command (check the ACL rule in docs/guide.md): {0}")]
    PermissionDenied(String),
    /// A key of another type already sits where the lock's keys belong.
    #[error("key {key:?} holds a value of another type (WRONGTYPE): it is not a leasehold lock")]
    WrongType {
        /// The offending key, as Redis reported it.
        key: String,
    },
    /// Any other error reply from Redis, with its message.
    #[error("Redis error: {0}")]
    Redis(String),
    /// A bad argument (empty or too long name, zero lease, ...), refused before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The hold's lease ran out (or the lock was taken away) while the work was still running.
    #[error("the lease on lock {name:?} was lost")]
    LeaseLost {
        /// The lock name.
        name: String,
    },
}

impl LockError {
    /// Whether the error is transient (timeout or connection): retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, LockError::Timeout(_) | LockError::Connection(_))
    }

    /// Maps a fred error to the variant a caller can act on. `timeout` is the command timeout
    /// that was in force, reported in [`LockError::Timeout`].
    pub fn from_redis(error: FredError, timeout: Duration) -> LockError {
        let details = error.details();
        if let Some(rest) = details.strip_prefix("WRONGTYPE ") {
            let key = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            return LockError::WrongType { key };
        }
        if details.starts_with("WRONGTYPE") {
            return LockError::WrongType { key: String::new() };
        }
        // NOPERM at the top level; inside a script Redis says "The user executing the script
        // can't run this command or subcommand" / "...no permissions to access ...".
        if details.starts_with("NOPERM")
            || details.contains("user executing the script")
            || *error.kind() == ErrorKind::Auth
        {
            return LockError::PermissionDenied(details.to_string());
        }
        match error.kind() {
            ErrorKind::Timeout => LockError::Timeout(timeout),
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Routing => {
                LockError::Connection(error)
            }
            ErrorKind::Config | ErrorKind::Url => LockError::InvalidArgument(details.to_string()),
            // fred's "Failed to route command." means no connection was there to write to.
            _ if details.contains("onnection") || details.contains("route command") => {
                LockError::Connection(error)
            }
            _ => LockError::Redis(details.to_string()),
        }
    }
}
