//! Fencing tokens: the number a store checks to refuse writes from a holder whose lease ended.

use std::fmt;

/// The fencing token of one grant of a lock.
///
/// Strictly increasing across grants of one lock name, unchanged by re-entry. It is raised to
/// at least the Redis server time in microseconds on every new grant, so it keeps increasing even
/// after Redis lost the counter (restart without persistence, failover before replication), as
/// long as the server clock does not step back.
///
/// Pass it with every write to the protected resource and let the store keep the highest token
/// it accepted, refusing lower ones:
///
/// ```sql
/// UPDATE inventory SET stock = stock - :qty, last_fence = :fence
///  WHERE product_id = :id AND last_fence < :fence;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The raw value, for storing next to the protected data. Fits in an SQL `BIGINT`.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl From<FencingToken> for i64 {
    /// Tokens stay below 2^53 until the year 2255, so this never truncates in practice; it
    /// saturates rather than wrapping.
    fn from(token: FencingToken) -> i64 {
        i64::try_from(token.0).unwrap_or(i64::MAX)
    }
}
