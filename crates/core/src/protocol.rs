//! The protocol's words, defined once: the lock hash's special fields and the channel
//! messages. Rust uses these constants, and the Lua scripts get them filled
//! in when they are built ([`crate::scripts::Scripts::new`]), so the two cannot drift apart.

/// Hash field holding the fencing token of the grant (`@FENCE@` in the scripts). Fields starting
/// with `~` are never owners: owner ids start with a uuid.
pub const FENCE_FIELD: &str = "~fence";

/// Hash field of a lock whose grant the line made (`@GRANTED@`): a release (or a waiter
/// leaving, or a force unlock) granted the lock to the first live waiter in line, which wakes
/// holding it. That waiter's own try takes such a grant as its own, and a waiter that gave up
/// before it heard of the grant hands it on when it leaves.
pub const GRANTED_FIELD: &str = "~granted";

/// Prefix of a semaphore hash field marking an acquisition's permits as a grant the line made
/// (`~granted:<id>`, `@GRANTED@:` in the scripts): a release granted them to that waiter, which
/// wakes holding them. Its own try takes such a grant as its own, and a waiter that gave up
/// before it heard of it hands the permits on when it leaves.
pub const GRANTED_FIELD_PREFIX: &str = "~granted:";

/// Hash field of a lock whose last hold was handed to nobody by `unlock_after` (`@EXPIRING@`):
/// the lock stays until its tail runs out.
pub const EXPIRING_FIELD: &str = "~expiring";

/// Read/write lock hash field: `r` while only readers hold it, `w` while a writer does
/// (`@MODE@`). Its presence marks the hash as a read/write lock's.
pub const MODE_FIELD: &str = "~mode";

/// Read/write lock hash field naming the writer's owner id (`@WRITER@`).
pub const WRITER_FIELD: &str = "~writer";

/// Prefix of a read/write lock hash field counting one owner's read holds (`~r:<owner>`,
/// `@READ@`); also that read hold's member in the leases zset.
pub const READ_FIELD_PREFIX: &str = "~r:";

/// Prefix of a read/write lock hash field holding one owner's read grant token
/// (`~rf:<owner>`, `@READ_FENCE@`).
pub const READ_FENCE_FIELD_PREFIX: &str = "~rf:";

/// Semaphore hash field: the number of permits (`@PERMITS@`).
pub const PERMITS_FIELD: &str = "~permits";

/// Semaphore hash field: the permits taken now (`@USED@`).
pub const USED_FIELD: &str = "~used";

/// Count-down latch hash field: the count (`@LATCH@`).
pub const LATCH_FIELD: &str = "~latch";

/// Count-down latch hash field: the id of the round counting down (`@ROUND@`), a fencing token
/// of the name's slot, so that ids never repeat.
pub const ROUND_FIELD: &str = "~round";

/// Hash field naming the kind a name is in use as (`@KIND@`): `rw`, `semaphore` or `latch`. A
/// lock's hash (plain or fair) has none. Every acquire refuses a name of another kind with
/// [`LockError::WrongKind`](crate::LockError::WrongKind) before it writes anything.
pub const KIND_FIELD: &str = "~kind";

/// Payload of a release with nobody in line (also force unlock, settled repairs, and a wake-up
/// on a waiter's own channel: look again), `@FREE@` in the scripts.
pub const FREE_PAYLOAD: &str = "*";

/// Prefix of the payload a waiter hears on its own channel when the line granted it the lock
/// (`@GRANT@`): `=<fencing token>:<lease ms>:<owner id>`. The waiter wakes holding the grant.
pub const GRANT_PAYLOAD: &str = "=";

/// One message on a lock's channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Look again: the lock may be free (nobody was in line, or it was force-unlocked or
    /// settled).
    Free,
    /// The line granted the lock to this waiter, with this fencing token and lease.
    Granted {
        /// The grant's token.
        fence: u64,
        /// The grant's lease in milliseconds, from the moment the release ran.
        lease_ms: u64,
        /// The field the grant's hold is counted in: the owner id (a semaphore's acquisition
        /// id), or a read/write lock reader's `~r:<owner id>`.
        owner: &'a str,
    },
}

impl<'a> Message<'a> {
    /// Reads a payload. Anything that is not a grant is a wake-up.
    pub fn parse(payload: &'a str) -> Message<'a> {
        if let Some(grant) = payload.strip_prefix(GRANT_PAYLOAD) {
            let mut parts = grant.splitn(3, ':');
            if let (Some(fence), Some(lease), Some(owner)) =
                (parts.next(), parts.next(), parts.next())
            {
                if let (Ok(fence), Ok(lease_ms)) = (fence.parse(), lease.parse()) {
                    return Message::Granted {
                        fence,
                        lease_ms,
                        owner,
                    };
                }
            }
        }
        Message::Free
    }

    /// The payload as published.
    pub fn payload(self) -> String {
        match self {
            Message::Free => FREE_PAYLOAD.to_string(),
            Message::Granted {
                fence,
                lease_ms,
                owner,
            } => format!("{GRANT_PAYLOAD}{fence}:{lease_ms}:{owner}"),
        }
    }
}

/// How the scripts publish. Every client of one deployment should use the same values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Protocol {
    /// Release messages go over sharded pub/sub (`SPUBLISH`; waiters `SSUBSCRIBE`): on Redis
    /// Cluster 7+, so that a message reaches only the nodes of the lock's shard. Otherwise
    /// `PUBLISH`, which a cluster sends to every node.
    pub sharded: bool,
    /// The scripts publish nothing: the server refuses the client's `PUBLISH` (an ACL without
    /// channel rights), and its waiters wake by timer. Every `PUBLISH` call of a script is then
    /// a no-op (`select(1, channel, message)`), so that one script text serves both.
    pub silent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for message in [
            Message::Free,
            Message::Granted {
                fence: 1_700_000_000_000_001,
                lease_ms: 30_000,
                owner: "c0ffee:t7",
            },
        ] {
            assert_eq!(Message::parse(&message.payload()), message);
        }
    }
}
