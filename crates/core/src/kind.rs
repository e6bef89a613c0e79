//! Each kind of lock, declared once.
//!
//! A handle's kind ([`LockKind`]: a plain lock, a fair lock, a read/write lock's read or write
//! side, a semaphore's permits) decides which scripts its calls run, which keys they take,
//! whether each of its waiters has an entry of its own in Redis's line, which field its holds
//! are counted in, and what else it must look at before it waits. All of that is a trait in
//! one table here ([`Traits`], read with [`LockKind::traits`]): the typed calls in
//! [`commands`](crate::commands), the facade's waiting engine and guards, the CLI's layout
//! decoding, the chaos checker and the model read it, instead of each matching on the kind.
//!
//! What a *name* is stored as ([`Stored`]: a lock, a read/write lock, a semaphore, a latch) is
//! the other half: the `~kind` marker its hash carries and the keys a reader finds beside it.
//! A plain and a fair lock share one layout; a read/write lock's two sides share one.
//!
//! A new kind is a new row here, its scripts (a directory under `scripts/`, or the shared
//! line's with its own arguments) and a thin handle in the facade.

use crate::protocol::READ_FIELD_PREFIX;

/// The kind of lock a [`LockKeys`](crate::LockKeys) is for: each kind has its own scripts
/// over the same hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// The plain reentrant lock (`scripts/*.lua`).
    Plain,
    /// The fair lock (`scripts/line/`, and the plain lock's `release.lua`).
    Fair,
    /// A read/write lock's read side (`scripts/rw/`).
    Read,
    /// A read/write lock's write side (`scripts/rw/`).
    Write,
    /// A semaphore's permits (`scripts/sem/`): each acquisition is a hold of its own id.
    Semaphore,
}

/// The scripts a kind runs: a directory under `scripts/` (the plain lock's free-lock fast path
/// is the top-level `acquire.lua` / `release.lua`, see [`Traits::fast_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `scripts/line/` and `release.lua`: one exclusive holder, a line of waiters.
    Line,
    /// `scripts/rw/`: readers together or one writer, one line for both sides.
    ReadWrite,
    /// `scripts/sem/`: up to N permits, each hold with its own lease.
    Semaphore,
}

/// Who stands in a name's line in Redis (`P:{N}:waiters`), and so on whose channel a grant
/// is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entries {
    /// Only the head of each client's local line: a client's waiters take their turns among
    /// themselves (a process that releases and asks again lines up behind its own earlier
    /// waiters), and hear on their client's channel.
    ClientHeads,
    /// Every waiting owner, in arrival order, each hearing on its own channel.
    EveryWaiter,
}

/// What a name is in use as in Redis: the layout a reader of the keys finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stored {
    /// A plain or a fair lock (they share one layout: the hash, the line, the fixed leases
    /// waiters asked for).
    Lock,
    /// A read/write lock: its holds' leases in `P:{N}:leases`, its mode in the hash.
    ReadWrite,
    /// A semaphore: its permits in the hash, each hold's lease in `P:{N}:leases`, each
    /// waiter's permits in `P:{N}:wants`.
    Semaphore,
    /// A count-down latch: a count and a round, no holders.
    Latch,
}

impl Stored {
    /// Every layout.
    pub const ALL: [Stored; 4] = [
        Stored::Lock,
        Stored::ReadWrite,
        Stored::Semaphore,
        Stored::Latch,
    ];

    /// The value of its hash's `~kind` field ([`KIND_FIELD`](crate::protocol::KIND_FIELD)),
    /// as the scripts write and check it; a lock's hash has none (its `~fence` or
    /// `~expiring` tells it).
    pub const fn marker(self) -> &'static str {
        match self {
            Stored::Lock => "lock",
            Stored::ReadWrite => "rw",
            Stored::Semaphore => "semaphore",
            Stored::Latch => "latch",
        }
    }

    /// The layout a `~kind` value names.
    pub fn from_marker(marker: &str) -> Option<Stored> {
        Stored::ALL.into_iter().find(|s| s.marker() == marker)
    }

    /// Its name in the CLI's output and JSON.
    pub const fn label(self) -> &'static str {
        match self {
            Stored::Lock => "lock",
            Stored::ReadWrite => "rwlock",
            Stored::Semaphore => "semaphore",
            Stored::Latch => "latch",
        }
    }

    /// Its name in a sentence (an error's "in use as a ...").
    pub const fn described(self) -> &'static str {
        match self {
            Stored::Lock => "lock",
            Stored::ReadWrite => "read/write lock",
            Stored::Semaphore => "semaphore",
            Stored::Latch => "count-down latch",
        }
    }

    /// Whether its holds' leases are in `P:{N}:leases` (one entry per hold), rather than in
    /// the hash's own TTL.
    pub const fn has_leases(self) -> bool {
        matches!(self, Stored::ReadWrite | Stored::Semaphore)
    }

    /// Whether it holds locks an operator may take away (`unlock --force`): a semaphore's
    /// permits and a latch's count are not locks.
    pub const fn is_lock(self) -> bool {
        matches!(self, Stored::Lock | Stored::ReadWrite)
    }
}

/// Everything that differs between the kinds of lock, in one row per kind.
#[derive(Debug)]
pub struct Traits {
    /// The kind this row is for.
    pub kind: LockKind,
    /// Its `kind` label in the metrics.
    pub label: &'static str,
    /// The layout its name has in Redis.
    pub stored: Stored,
    /// The scripts it runs.
    pub family: Family,
    /// Who of its waiters stands in Redis's line.
    pub entries: Entries,
    /// Whether a hold excludes every other owner (a read hold and a permit do not).
    pub exclusive: bool,
    /// Whether a guard may release after a delay (`unlock_after`): a read/write lock's and a
    /// semaphore's holds have leases of their own, which a delayed release would have to
    /// outlive.
    pub unlock_after: bool,
    /// The other side of a read/write lock, held by the same owner, that an acquire must look
    /// at first (a read hold the owner keeps refuses its write: an upgrade would wait for
    /// itself; a write it keeps makes its read a downgrade).
    pub other_side: Option<LockKind>,
    /// Whether its try on a free lock and its release without waiters run the short
    /// top-level `acquire.lua` / `release.lua` (the plain lock's hot path).
    pub fast_path: bool,
    /// The prefix of the hash field its holds are counted in, before the owner's id (a
    /// reader's count is apart from the same owner's write count).
    pub hold_field_prefix: &'static str,
    /// The letter that tags its holds in `P:{N}:leases` (`r`, `w`, `s`), for the renew
    /// script; `None` when the hash's TTL is the lease.
    pub lease_tag: Option<char>,
    /// The side a read/write lock's scripts are told (`read`, `write`).
    pub side: Option<&'static str>,
    /// Whether its waiters say what they want in `P:{N}:wants` (a fixed lease, a number of
    /// permits).
    pub wants: bool,
}

const PLAIN: Traits = Traits {
    kind: LockKind::Plain,
    label: "lock",
    stored: Stored::Lock,
    family: Family::Line,
    entries: Entries::ClientHeads,
    exclusive: true,
    unlock_after: true,
    other_side: None,
    fast_path: true,
    hold_field_prefix: "",
    lease_tag: None,
    side: None,
    wants: true,
};

const FAIR: Traits = Traits {
    kind: LockKind::Fair,
    label: "fair",
    entries: Entries::EveryWaiter,
    fast_path: false,
    ..PLAIN
};

const READ: Traits = Traits {
    kind: LockKind::Read,
    label: "rwlock_read",
    stored: Stored::ReadWrite,
    family: Family::ReadWrite,
    entries: Entries::EveryWaiter,
    exclusive: false,
    unlock_after: false,
    other_side: Some(LockKind::Write),
    fast_path: false,
    hold_field_prefix: READ_FIELD_PREFIX,
    lease_tag: Some('r'),
    side: Some("read"),
    wants: false,
};

const WRITE: Traits = Traits {
    kind: LockKind::Write,
    label: "rwlock_write",
    exclusive: true,
    other_side: Some(LockKind::Read),
    hold_field_prefix: "",
    lease_tag: Some('w'),
    side: Some("write"),
    ..READ
};

const SEMAPHORE: Traits = Traits {
    kind: LockKind::Semaphore,
    label: "semaphore",
    stored: Stored::Semaphore,
    family: Family::Semaphore,
    entries: Entries::EveryWaiter,
    exclusive: false,
    unlock_after: false,
    other_side: None,
    fast_path: false,
    hold_field_prefix: "",
    lease_tag: Some('s'),
    side: None,
    wants: true,
};

impl LockKind {
    /// Every kind, in the order of [`LockKind::index`].
    pub const ALL: [LockKind; 5] = [
        LockKind::Plain,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Semaphore,
    ];

    /// This kind's row.
    pub const fn traits(self) -> &'static Traits {
        match self {
            LockKind::Plain => &PLAIN,
            LockKind::Fair => &FAIR,
            LockKind::Read => &READ,
            LockKind::Write => &WRITE,
            LockKind::Semaphore => &SEMAPHORE,
        }
    }

    /// Its place in [`LockKind::ALL`] (for tables indexed by kind).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A read/write lock's other side; `None` for the other kinds.
    pub const fn other_side(self) -> Option<LockKind> {
        self.traits().other_side
    }

    /// The hash field that counts `owner`'s holds of this kind.
    pub fn hold_field(self, owner: &str) -> String {
        format!("{}{owner}", self.traits().hold_field_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_its_own_kinds_and_in_index_order() {
        for (i, kind) in LockKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.traits().kind, kind);
            assert_eq!(kind.index(), i);
        }
    }

    #[test]
    fn a_read_write_locks_sides_look_at_each_other_and_share_one_layout() {
        for kind in LockKind::ALL {
            if let Some(other) = kind.other_side() {
                assert_eq!(other.other_side(), Some(kind));
                assert_eq!(kind.traits().stored, other.traits().stored);
                assert_eq!(kind.traits().family, Family::ReadWrite);
            }
        }
    }

    #[test]
    fn kinds_with_lease_tags_are_the_layouts_with_a_leases_key() {
        for kind in LockKind::ALL {
            let t = kind.traits();
            assert_eq!(t.lease_tag.is_some(), t.stored.has_leases(), "{kind:?}");
            // A delayed release keeps the hash alive by its TTL: only the hash-leased kinds.
            assert_eq!(t.unlock_after, t.lease_tag.is_none(), "{kind:?}");
        }
    }

    #[test]
    fn markers_name_their_layouts() {
        for stored in Stored::ALL {
            assert_eq!(Stored::from_marker(stored.marker()), Some(stored));
        }
        assert_eq!(Stored::from_marker("queue"), None);
    }
}
