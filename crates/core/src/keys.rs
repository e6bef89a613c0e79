//! The Redis key layout of one lock.
//!
//! For a lock named `N` under prefix `P` (default `leasehold`):
//!
//! | key / channel       | type   | what                                                  |
//! |---------------------|--------|-------------------------------------------------------|
//! | `P:{N}`             | hash   | owner id -> hold count, and `~fence` -> this grant's  |
//! |                     |        | fencing token; PEXPIRE = the lease                    |
//! | `P:{N}:released`    | channel| published when a lock becomes free with nobody in line|
//! | `P:{N}:waiters`     | zset   | the line: owner id -> arrival (server microseconds)   |
//! | `P:{N}:waiters:until` | zset | owner id -> when the entry is dead (server ms;        |
//! |                     |        | renewed by the waiter's watchdog)                     |
//! | `P:{N}:released:<c>`| channel| a plain lock's waiters of client `c`: their grants    |
//! | `P:{T}:fence`       | string | last fencing token handed out in N's Cluster slot;    |
//! |                     |        | `T` is a number chosen to hash to that slot; no TTL    |
//!
//! A fair lock ([`LockKeys::fair`]) has an entry in the line for every waiting owner, and each
//! hears its grant on `P:{N}:released:<owner>`.
//!
//! A read/write lock's hash has other fields (see `scripts/rw/common.lua`), and its holds'
//! leases are in `P:{N}:leases` (zset: the writer's owner id or `~r:<owner>` -> deadline in
//! server milliseconds). A semaphore keeps its permits and their leases the same way, and what
//! each waiter wants in `P:{N}:wants` (see `scripts/sem/common.lua`); a count-down latch is
//! its hash's `~latch` field.
//!
//! The braces are a Redis Cluster hash tag: every key and the channel of one lock live in one
//! slot, the fencing counter included, so every script runs on Cluster (and the channel can be
//! a sharded one). A name that already carries a hash tag (`{...}` with something inside) is
//! used as given, so callers can co-locate several locks on purpose.
//!
//! The fencing counter is one key per slot, not one per lock: a counter that rises for every
//! lock of a slot also rises for each of them, a lock that is released leaves nothing behind (a
//! per-name counter would stay forever, one key for every order id ever locked), and a grant
//! does not pay for creating a key (creating a key per fresh name cost a third of the acquire's
//! server time). At most 16,384 counters exist per prefix, however many names are locked.

use std::fmt;
use std::sync::Arc;

use bytes_utils::Str;

use crate::kind::{Entries, Family, Traits};
use crate::{slot, LockError, LockKind, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// The longest lock name accepted, in bytes.
///
/// Redis takes keys up to 512 MB, but every operation sends the name several times; a name
/// longer than 1 KiB is almost certainly a bug (a serialized request instead of a resource id).
pub const MAX_NAME_LEN: usize = 1024;

/// A validated key prefix: non-empty, at most 256 bytes, no braces (the hash tag must come from
/// the lock name) and no whitespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    text: Arc<str>,
}

impl Prefix {
    /// Checks and wraps a prefix.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for an empty prefix, one over 256 bytes, or one with
    /// braces or whitespace.
    pub fn new(prefix: &str) -> Result<Prefix> {
        if prefix.is_empty() || prefix.len() > 256 {
            return Err(LockError::InvalidArgument(format!(
                "key prefix must be 1 to 256 bytes, got {} bytes",
                prefix.len()
            )));
        }
        if prefix.contains(['{', '}']) || prefix.chars().any(char::is_whitespace) {
            return Err(LockError::InvalidArgument(format!(
                "key prefix {prefix:?} must not contain braces or whitespace"
            )));
        }
        Ok(Prefix::of(prefix))
    }

    fn of(prefix: &str) -> Prefix {
        Prefix {
            text: prefix.into(),
        }
    }

    /// The prefix text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Default for Prefix {
    fn default() -> Self {
        Prefix::of(DEFAULT_PREFIX)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The keys and channel of one lock, derived once when the handle is made.
///
/// Cheap to clone (one reference count), and its strings are slices of one fred [`Str`], so
/// putting them into a command copies no bytes: every acquire and release sends two to four of
/// them. Equality uses the lock hash key and the [`LockKind`]; hashing the hash key alone.
#[derive(Clone, Debug)]
pub struct LockKeys(Arc<KeyStrings>);

/// One buffer, `name | hash | released | waiters | waiters:until | wants | fence`, and where
/// each part ends (the line's keys are in every release: a release builds none of them). Offsets
/// rather than five `Str`s (32 bytes each): a client may hold ten thousand locks, and a hold
/// table entry, a guard and a handle all share this one allocation.
#[derive(Debug)]
struct KeyStrings {
    all: Str,
    /// End offsets of the name, the hash, the channel and the line's keys; the fence key runs to the
    /// end. A name is at most 1 KiB and a prefix 256 bytes, so the buffer fits `u16` offsets.
    ends: [u16; 6],
    slot: u16,
    /// Which kind of lock these keys are for: its scripts differ.
    kind: LockKind,
}

impl KeyStrings {
    fn part(&self, part: usize) -> (usize, usize) {
        let start = match part {
            0 => 0,
            _ => usize::from(self.ends[part - 1]),
        };
        let end = self
            .ends
            .get(part)
            .map_or(self.all.len(), |&e| usize::from(e));
        (start, end)
    }

    fn text(&self, part: usize) -> &str {
        let (start, end) = self.part(part);
        &self.all[start..end]
    }

    fn str(&self, part: usize) -> Str {
        let (start, end) = self.part(part);
        self.all.slice(start..end)
    }
}

const NAME: usize = 0;
const HASH: usize = 1;
const RELEASED: usize = 2;
const WAITERS: usize = 3;
const WAITERS_UNTIL: usize = 4;
const WANTS: usize = 5;
const FENCE: usize = 6;

impl PartialEq for LockKeys {
    /// The same hash key and kind: a read/write lock's read and write holds of one owner are
    /// two holds.
    fn eq(&self, other: &Self) -> bool {
        self.0.kind == other.0.kind && self.hash() == other.hash()
    }
}

impl Eq for LockKeys {}

impl std::hash::Hash for LockKeys {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.hash().hash(state);
    }
}

impl LockKeys {
    /// Derives the keys of lock `name` under `prefix`.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for an empty name, one over [`MAX_NAME_LEN`] bytes, one
    /// with control characters, or one whose braces do not form a hash tag (`{` ... `}` with
    /// at least one byte between): such a name would spread one lock's keys over several
    /// Cluster slots.
    ///
    /// ```
    /// use leasehold_core::{LockKeys, Prefix};
    /// let keys = LockKeys::new(&Prefix::default(), "inventory:42").unwrap();
    /// assert_eq!(keys.hash(), "leasehold:{inventory:42}");
    /// assert_eq!(keys.released(), "leasehold:{inventory:42}:released");
    /// // The fencing counter of the lock's Cluster slot: its tag hashes to the same slot.
    /// assert!(keys.fence().starts_with("leasehold:{") && keys.fence().ends_with("}:fence"));
    /// assert_eq!(leasehold_core::slot::key_slot(keys.fence().as_bytes()), keys.slot());
    /// // A name with its own hash tag is used as given.
    /// let tagged = LockKeys::new(&Prefix::default(), "order:{42}:pay").unwrap();
    /// assert_eq!(tagged.hash(), "leasehold:order:{42}:pay");
    /// ```
    pub fn new(prefix: &Prefix, name: &str) -> Result<LockKeys> {
        if name.is_empty() {
            return Err(LockError::InvalidArgument("lock name is empty".into()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(LockError::InvalidArgument(format!(
                "lock name is {} bytes, over the limit of {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(LockError::InvalidArgument(format!(
                "lock name {name:?} contains control characters"
            )));
        }
        let tag = hash_tag(name);
        if tag.is_some() {
            if RESERVED_SUFFIXES
                .iter()
                .any(|suffix| name.ends_with(suffix))
            {
                return Err(LockError::InvalidArgument(format!(
                    "lock name {name:?} ends like one of another lock's own keys \
                     ({RESERVED_SUFFIXES:?}); pick another name"
                )));
            }
        } else if name.contains(['{', '}']) {
            return Err(LockError::InvalidArgument(format!(
                "lock name {name:?} has braces that do not form a Redis Cluster hash tag \
                 ({{tag}} with at least one character inside)"
            )));
        }
        let tagged = tag.is_some();
        let slot = slot::slot_of(tag.unwrap_or(name).as_bytes());
        // One buffer holds the name and the lock's four strings, each a slice of it: one
        // allocation per lock handle (locks on fresh names make one per operation), and no copy
        // when a slice goes into a command.
        let prefix = prefix.as_str();
        let hash_len = prefix.len() + 1 + name.len() + if tagged { 0 } else { 2 };
        let suffixes = [":released", ":waiters", ":waiters:until", ":wants"];
        let mut fence_tag = [0u8; 10];
        let fence_tag = slot::tag_text(slot, &mut fence_tag);
        let fence_len = prefix.len() + 2 + fence_tag.len() + ":fence".len() + 1;
        let suffixes_len: usize = suffixes.iter().map(|s| s.len()).sum();
        let mut all = String::with_capacity(name.len() + 5 * hash_len + suffixes_len + fence_len);
        all.push_str(name);
        let push_hash = |all: &mut String| {
            all.push_str(prefix);
            all.push(':');
            if tagged {
                all.push_str(name);
            } else {
                all.push('{');
                all.push_str(name);
                all.push('}');
            }
        };
        push_hash(&mut all);
        for suffix in suffixes {
            push_hash(&mut all);
            all.push_str(suffix);
        }
        all.push_str(prefix);
        all.push_str(":{");
        all.push_str(fence_tag);
        all.push_str("}:fence");
        let mut ends = [0u16; 6];
        let mut at = 0;
        let parts = [
            name.len(),
            hash_len,
            hash_len + suffixes[0].len(),
            hash_len + suffixes[1].len(),
            hash_len + suffixes[2].len(),
            hash_len + suffixes[3].len(),
        ];
        for (end, len) in ends.iter_mut().zip(parts) {
            at += len;
            *end = u16::try_from(at).expect("names and prefixes are short");
        }
        debug_assert_eq!(all.len(), at + fence_len);
        Ok(LockKeys(Arc::new(KeyStrings {
            all: Str::from(all),
            ends,
            slot,
            kind: LockKind::Plain,
        })))
    }

    /// The same lock's keys, for another kind: the fair form (acquires served in arrival
    /// order) or a read/write lock's sides. One name should be used as one kind (a read/write
    /// lock's two sides are one kind).
    pub fn of_kind(&self, kind: LockKind) -> LockKeys {
        LockKeys(Arc::new(KeyStrings {
            all: self.0.all.clone(),
            ends: self.0.ends,
            slot: self.0.slot,
            kind,
        }))
    }

    /// The same lock's keys, for its fair form ([`LockKind::Fair`]).
    pub fn fair(&self) -> LockKeys {
        self.of_kind(LockKind::Fair)
    }

    /// Which kind of lock these keys are for.
    pub fn kind(&self) -> LockKind {
        self.0.kind
    }

    /// Their kind's traits ([`LockKind::traits`]).
    pub fn traits(&self) -> &'static Traits {
        self.0.kind.traits()
    }

    /// Whether these are a fair lock's keys.
    pub fn is_fair(&self) -> bool {
        self.0.kind == LockKind::Fair
    }

    /// Whether these are a read/write lock's keys (either side).
    pub fn is_read_write(&self) -> bool {
        self.traits().family == Family::ReadWrite
    }

    /// Whether every waiting owner of this kind has its own entry in Redis's line
    /// (`P:{N}:waiters`) and its own channel: every kind but the plain lock, whose client's
    /// waiters share one entry (their head's) and the client's channel.
    pub fn has_own_lines(&self) -> bool {
        self.traits().entries == Entries::EveryWaiter
    }

    /// Whether these are a semaphore's keys.
    pub fn is_semaphore(&self) -> bool {
        self.traits().family == Family::Semaphore
    }

    /// `P:{N}:wants`: how many permits each of a semaphore's waiters wants.
    pub fn wants(&self) -> String {
        self.0.text(WANTS).to_string()
    }

    /// `P:{N}:leases`: a read/write lock's holds (or a semaphore's permits) and their
    /// deadlines.
    pub fn leases(&self) -> String {
        format!("{}:leases", self.hash())
    }

    /// `P:{N}:waiters`: the lock's line of waiters, in arrival order.
    pub fn waiters(&self) -> String {
        self.0.text(WAITERS).to_string()
    }

    /// `P:{N}:waiters:until`: when each waiter's entry is dead unless renewed.
    pub fn waiters_until(&self) -> String {
        self.0.text(WAITERS_UNTIL).to_string()
    }

    /// `P:{N}:released:`: a waiter hears its grant on this plus its client id (a plain lock)
    /// or its owner id (the other kinds).
    pub fn waiter_channel_prefix(&self) -> String {
        format!("{}:", self.released())
    }

    /// The lock name as the caller gave it.
    pub fn name(&self) -> &str {
        self.0.text(NAME)
    }

    /// `P:{N}`: the hash of owners and hold counts.
    pub fn hash(&self) -> &str {
        self.0.text(HASH)
    }

    /// `P:{T}:fence`: the fencing counter of this lock's Cluster slot.
    pub fn fence(&self) -> &str {
        self.0.text(FENCE)
    }

    /// `P:{N}:released`: the channel a release with nobody in line publishes on (a RedLock's
    /// and a latch's waiters listen there).
    pub fn released(&self) -> &str {
        self.0.text(RELEASED)
    }

    /// The Redis Cluster slot of every key of this lock.
    pub fn slot(&self) -> u16 {
        self.0.slot
    }

    pub(crate) fn hash_str(&self) -> Str {
        self.0.str(HASH)
    }

    pub(crate) fn fence_str(&self) -> Str {
        self.0.str(FENCE)
    }

    pub(crate) fn released_str(&self) -> Str {
        self.0.str(RELEASED)
    }

    pub(crate) fn waiters_str(&self) -> Str {
        self.0.str(WAITERS)
    }

    pub(crate) fn waiters_until_str(&self) -> Str {
        self.0.str(WAITERS_UNTIL)
    }

    pub(crate) fn wants_str(&self) -> Str {
        self.0.str(WANTS)
    }
}

/// Suffixes of a lock's own keys. A tagged name ending in one of them would collide with
/// another lock's key (`{a}:waiters` is lock `a`'s line), so such names are refused. `:fence`
/// is the per-slot fencing counters' suffix; `:queue` is kept reserved for the lock's own use.
const RESERVED_SUFFIXES: [&str; 7] = [
    ":fence",
    ":released",
    ":queue",
    ":waiters",
    ":waiters:until",
    ":leases",
    ":wants",
];

/// The tag Redis Cluster would hash `name` by: the bytes between the first `{` and the first
/// `}` after it, when at least one byte is between them.
fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let len = name[open + 1..].find('}')?;
    (len > 0).then(|| &name[open + 1..open + 1 + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let k = LockKeys::new(&Prefix::new("app").unwrap(), "report").unwrap();
        assert_eq!(k.hash(), "app:{report}");
        assert_eq!(
            k.fence(),
            format!("app:{{{}}}:fence", crate::slot::tag_of_slot(k.slot()))
        );
        assert_eq!(crate::slot::key_slot(k.hash().as_bytes()), k.slot());
        assert_eq!(crate::slot::key_slot(k.fence().as_bytes()), k.slot());
        assert_eq!(crate::slot::key_slot(k.waiters().as_bytes()), k.slot());
        assert_eq!(k.waiters(), "app:{report}:waiters");
        assert_eq!(k.waiters_until(), "app:{report}:waiters:until");
        assert_eq!(k.wants(), "app:{report}:wants");
        assert_eq!(crate::slot::key_slot(k.released().as_bytes()), k.slot());
        let tagged = LockKeys::new(&Prefix::new("app").unwrap(), "a{b}c").unwrap();
        assert_eq!(tagged.slot(), crate::slot::slot_of(b"b"));
        assert_eq!(
            crate::slot::key_slot(tagged.fence().as_bytes()),
            tagged.slot()
        );
        assert_eq!(k.released(), "app:{report}:released");
        assert_eq!(k.name(), "report");
    }

    #[test]
    fn bad_names() {
        let p = Prefix::default();
        for bad in [
            "",
            "a}b",
            "{}x",
            "x{",
            "}",
            "a\nb",
            "{a}:fence",
            "{a}:queue",
            "{a}:waiters",
            "{a}:leases",
        ] {
            assert!(
                matches!(LockKeys::new(&p, bad), Err(LockError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(LockKeys::new(&p, &"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(LockKeys::new(&p, &"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn bad_prefixes() {
        for bad in ["", "a{b", "a b", &"p".repeat(257)] {
            assert!(Prefix::new(bad).is_err(), "{bad:?}");
        }
    }
}
