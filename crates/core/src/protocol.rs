//! The protocol's words, defined once: the lock hash's special fields, the release-channel
//! messages and the turn grace. Rust uses these constants, and the Lua scripts get them filled
//! in when they are built ([`crate::scripts::Scripts::new`]), so the two cannot drift apart.

use std::time::Duration;

/// Hash field holding the fencing token of the grant (`@FENCE@` in the scripts). Fields starting
/// with `~` are never owners: owner ids start with a uuid.
pub const FENCE_FIELD: &str = "~fence";

/// Prefix of the hash field that reserves a released lock for one client's turn
/// (`~turn:<client id>`, `@TURN@` in the scripts). While reserved it is the hash's only field.
pub const TURN_FIELD_PREFIX: &str = "~turn:";

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

/// Payload of a release with nobody queued (also force unlock and settled repairs): one waiter
/// of each subscribed client wakes (`@FREE@`).
pub const FREE_PAYLOAD: &str = "*";

/// Prefix of the payload published when a queued client took its turn (`@TAKEN@`), followed by
/// the new hold's lease in milliseconds (`-30000`): other clients stop their standby timers, and
/// a waiter that found the lock reserved for that turn learns how long it is now held at most,
/// without asking again.
pub const TAKEN_PAYLOAD: &str = "-";

/// How long a released lock stays reserved for the client whose turn it is, by default, and how
/// long other clients wait before trying themselves when that client does not take it (crashed,
/// or its waiter left). Loopback handoffs take well under a millisecond; 25 ms also covers a
/// LAN. [`Protocol::turn_grace`] changes it per client.
pub const DEFAULT_TURN_GRACE: Duration = Duration::from_millis(25);

/// One message on a lock's release channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// The lock is free (nobody was queued, or it was force-unlocked or settled).
    Free,
    /// A queued client took its turn; the new hold's lease, when the payload carries it.
    Taken(Option<Duration>),
    /// The lock is reserved for this client's turn (a client id).
    Turn(&'a str),
}

impl<'a> Message<'a> {
    /// Reads a payload. Anything that is not one of the two markers names a client.
    pub fn parse(payload: &'a str) -> Message<'a> {
        if payload == FREE_PAYLOAD {
            return Message::Free;
        }
        // Client ids are hex uuids: they never start with the marker.
        if let Some(lease) = payload.strip_prefix(TAKEN_PAYLOAD) {
            return Message::Taken(lease.parse().ok().map(Duration::from_millis));
        }
        Message::Turn(payload)
    }

    /// The payload as published.
    pub fn payload(self) -> String {
        match self {
            Message::Free => FREE_PAYLOAD.to_string(),
            Message::Taken(lease) => format!(
                "{TAKEN_PAYLOAD}{}",
                lease.map_or_else(String::new, |l| l.as_millis().to_string())
            ),
            Message::Turn(client) => client.to_string(),
        }
    }
}

/// The timing of the turn protocol. Every client of one deployment should use the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Protocol {
    /// How long a release reserves the lock for the next client's turn; see
    /// [`DEFAULT_TURN_GRACE`].
    pub turn_grace: Duration,
    /// Release messages go over sharded pub/sub (`SPUBLISH`; waiters `SSUBSCRIBE`): on Redis
    /// Cluster 7+, so that a message reaches only the nodes of the lock's shard. Otherwise
    /// `PUBLISH`, which a cluster sends to every node.
    pub sharded: bool,
    /// The scripts publish nothing: the server refuses the client's `PUBLISH` (an ACL without
    /// channel rights), and its waiters wake by timer. Every `PUBLISH` call of a script is then
    /// a no-op (`select(1, channel, message)`), so that one script text serves both.
    pub silent: bool,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            turn_grace: DEFAULT_TURN_GRACE,
            sharded: false,
            silent: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for message in [
            Message::Free,
            Message::Taken(Some(Duration::from_secs(30))),
            Message::Taken(None),
            Message::Turn("c0ffee"),
        ] {
            assert_eq!(Message::parse(&message.payload()), message);
        }
    }
}
