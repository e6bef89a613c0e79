//! Reading the Redis layouts of the lock kinds, the semaphore and the latch: which kind a hash
//! belongs to, its holders (a semaphore's permits, a latch's count), and the waiters' line.
//! Shared by `inspect`, `list` (and through it `watch`) and `unlock`.
//!
//! For a lock named `N` under prefix `P` (see `leasehold_core::keys`):
//!
//! * a plain or a fair lock (they share one layout and one protocol: a release grants the
//!   lock to the head of the line): hash `P:{N}` of owner id -> hold count and `~fence` -> the
//!   grant's token, plus `~granted` -> `1` while the grant is one the line made (a release, a
//!   waiter leaving or a force unlock granted the lock to the first live waiter, which wakes
//!   holding it; the mark stays until the hold ends), or `~expiring` after
//!   `unlock_after`. Its waiters are in `P:{N}:waiters` (owner id -> arrival, server
//!   microseconds) and `P:{N}:waiters:until` (owner id -> the entry's deadline, server
//!   milliseconds): one entry per waiting client for a plain lock (its first waiting task's
//!   owner), one per waiting owner for a fair lock. Nothing in Redis tells the two apart, so
//!   both are shown as kind `lock`, with their waiters in arrival order (`P:{N}:queue`, the
//!   plain lock's former turn queue, is no longer written, and not read);
//! * a read/write lock: hash `P:{N}` with `~mode` -> `r` or `w`; the writer's `~writer` ->
//!   owner id, `<owner id>` -> write hold count and `~fence` -> its token; per reader
//!   `~r:<owner id>` -> read hold count and `~rf:<owner id>` -> its token; a hold the line
//!   granted (a release handed it to a waiter) is marked `~granted` (a writer's) or
//!   `~granted:~r:<owner id>` (a reader's) until the hold ends. `P:{N}:leases` keeps each hold's deadline
//!   (the writer's owner id, or `~r:<owner id>` -> server milliseconds). Its waiters are in
//!   `P:{N}:waiters` as a lock's, scored arrival * 2 + 1 for a writer and arrival * 2 for a
//!   reader;
//! * a semaphore: hash `P:{N}` (no TTL) with `~permits` -> the number of permits and `~used`
//!   -> the permits taken now; per acquisition (its id is an owner id) `~r:<id>` -> the permits
//!   it holds and `~rf:<id>` -> its token, with `~granted:<id>` while the grant is one a
//!   release made (the line's; kept when the waiter takes it, until the permits go back). `P:{N}:leases` keeps
//!   each acquisition's deadline
//!   (`~r:<id>` -> server milliseconds; an expired one returns its permits at the semaphore's
//!   next call). Its waiters are in `P:{N}:waiters` (id -> arrival, server microseconds, as
//!   a lock's) and `P:{N}:waiters:until`, and `P:{N}:wants` (a hash) keeps how many
//!   permits each wants (and `:<ms>` after it, a fixed lease it asked for). The `~permits`/`~used` fields tell it from a read/write lock, which
//!   has `~r:` fields and leases too (see `scripts/sem/common.lua`);
//! * a count-down latch: hash `P:{N}` with `~latch` -> the count alone (no TTL; deleted at
//!   zero). Its waiters subscribe to the release channel `P:{N}:released`.
//!
//! Waiters in a line hear on channels of their own: a plain lock's on `P:{N}:released:<client
//! uuid>`, a fair lock's, a read/write lock's and a semaphore's on `P:{N}:released:<owner
//! id>`. Only a latch's waiters (and RedLock's) subscribe to `P:{N}:released` itself.

use std::collections::HashMap;

use fred::types::Value;
use leasehold_core::protocol::{
    FENCE_FIELD, GRANTED_FIELD, GRANTED_FIELD_PREFIX, KIND_FIELD, LATCH_FIELD, MODE_FIELD,
    PERMITS_FIELD, READ_FENCE_FIELD_PREFIX, READ_FIELD_PREFIX, ROUND_FIELD, USED_FIELD,
    WRITER_FIELD,
};
use serde::Serialize;

/// Suffixes of a lock's auxiliary keys: `P:{N}` followed by one of these is not a lock hash.
/// (`leasehold_core` refuses tagged names ending in them.) `:wants`, a semaphore's, is a hash:
/// without this it would read as a lock held by the waiters. `:queue` is no longer written (a
/// plain lock's waiters are in `:waiters` now), but names ending in it are still refused.
pub const AUXILIARY_SUFFIXES: [&str; 7] = [
    ":fence",
    ":released",
    ":queue",
    ":waiters",
    ":waiters:until",
    ":leases",
    ":wants",
];

/// Which kind of lock (or other primitive) a hash belongs to: the layouts the core declares
/// ([`leasehold_core::Stored`]; `leasehold_core::LockKind` is a handle's kind, with a
/// read/write lock's two sides). A plain and a fair lock share one layout, and their waiters
/// are served in arrival order alike; a semaphore and a latch are not locks (`unlock --force`
/// refuses them).
pub use leasehold_core::Stored as Kind;

/// Serializes a [`Kind`] as its label (`lock`, `rwlock`, `semaphore`, `latch`).
pub fn serialize_kind<S: serde::Serializer>(kind: &Kind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.label())
}

/// As [`serialize_kind`], for an optional kind (`null` for none).
pub fn serialize_some_kind<S: serde::Serializer>(
    kind: &Option<Kind>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match kind {
        Some(kind) => s.serialize_str(kind.label()),
        None => s.serialize_none(),
    }
}

/// A read/write lock's side: its mode, a hold's role, or what a waiter waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Shared: readers.
    Read,
    /// Exclusive: one writer.
    Write,
}

impl Mode {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }

    /// `R` or `W`, for a waiter in the queue.
    pub fn letter(self) -> &'static str {
        match self {
            Mode::Read => "R",
            Mode::Write => "W",
        }
    }
}

/// One owner's holds (or a reservation: a field starting with `~`, hold count 0), or one
/// acquisition of a semaphore's permits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// `<client uuid>:<local id>`; a reservation as its field (`~expiring`); a
    /// semaphore acquisition's id (an owner id made for it).
    pub owner: String,
    /// Nested holds of this owner (of this side, for a read/write lock); 1 for a semaphore
    /// acquisition (not reentrant: its permits are in `permits`).
    pub hold_count: u64,
    /// `write` or `read` for a read/write lock's holds; `null` for other locks' holders and for
    /// reservations.
    pub role: Option<Mode>,
    /// The fencing token the hold was granted under: the lock's `~fence` for a plain or fair
    /// lock's holder and a read/write lock's writer, the reader's own `~rf:` token for a
    /// reader and a semaphore acquisition; `null` for a reservation.
    pub token: Option<u64>,
    /// Lease left of this hold in milliseconds, for a read/write lock's holds and a
    /// semaphore's acquisitions in `inspect` (each has its own, in `P:{N}:leases`; negative:
    /// it ran out and goes at the lock's or semaphore's next call, which gives a semaphore's
    /// permits back). `null` for other locks, whose holders share the lock's `ttl_ms`, and in
    /// `list`, which does not read the leases.
    pub lease_ms: Option<i64>,
    /// The permits a semaphore acquisition holds (`~r:<id>`); `null` for a lock's holders.
    pub permits: Option<u64>,
}

/// A semaphore's permits (`~permits` and `~used`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permits {
    /// The number of permits (0 when never set; negative after `add_permits` took more away
    /// than there were).
    pub total: i64,
    /// The permits taken now (expired acquisitions included until a call gives them back).
    pub taken: i64,
}

impl Permits {
    /// The permits not taken (negative when the number was lowered below what is taken).
    pub fn available(self) -> i64 {
        self.total.saturating_sub(self.taken)
    }
}

/// What a lock hash holds, read with what its auxiliary keys say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashReading {
    /// The lock's kind.
    pub kind: Kind,
    /// A read/write lock's mode (`~mode`); `None` for other kinds and a reserved one.
    pub mode: Option<Mode>,
    /// Holders, writer first, then readers, then reservations; by owner within each.
    pub holders: Vec<Holder>,
    /// The `~fence` field: the grant's token (a read/write lock's writer's).
    pub fence: Option<u64>,
    /// A semaphore's permits; `None` for other kinds.
    pub permits: Option<Permits>,
    /// A latch's count (`~latch`); `None` for other kinds.
    pub count: Option<u64>,
}

/// The kind that a lock's line of waiters (`P:{N}:waiters`) says, from its first entry's score:
/// [`Kind::ReadWrite`] or [`Kind::Lock`] (a plain or fair lock's, or a semaphore's, which its hash
/// tells); `None` when nobody waits. A read/write lock's scores are twice the arrival time
/// (plus one for a writer): about twice the server time in microseconds, where a lock's are
/// about once. `now_us` may be any clock near the server's.
pub fn kind_of_queue(head_score: Option<f64>, now_us: u64) -> Option<Kind> {
    let score = head_score?;
    // Halfway between the two: off only for a waiter that has waited for decades.
    Some(if score > now_us as f64 * 1.5 {
        Kind::ReadWrite
    } else {
        Kind::Lock
    })
}

/// Reads a lock hash: its kind (from its fields, its read/write lock's leases, or `queued`,
/// what its line of waiters says), holders and token. `leases` maps `P:{N}:leases` members to the
/// lease left in milliseconds (empty when not read). `None` when the fields are not a leasehold
/// lock's (a value that should be a count is not one), or a lock holds nothing at all. A
/// semaphore (`~permits` or `~used`: it has `~r:` fields and leases like a read/write lock)
/// and a latch (`~latch`) are read whatever they hold: they exist until deleted.
pub fn read_hash(
    fields: &HashMap<String, String>,
    queued: Option<Kind>,
    leases: &HashMap<String, i64>,
) -> Option<HashReading> {
    // The kind a name is in use as is in its `~kind` field (none: a lock, plain or fair).
    match fields.get(KIND_FIELD).map(|m| Kind::from_marker(m)) {
        Some(Some(Kind::Latch)) => return read_latch(fields),
        Some(Some(Kind::Semaphore)) => return read_semaphore(fields, leases),
        Some(Some(Kind::ReadWrite)) | None => {}
        // A lock's hash carries no marker: one that names a lock, or no kind, is not ours.
        Some(Some(Kind::Lock) | None) => return None,
    }
    if fields.contains_key(LATCH_FIELD) {
        return read_latch(fields);
    }
    if fields.contains_key(PERMITS_FIELD) || fields.contains_key(USED_FIELD) {
        return read_semaphore(fields, leases);
    }
    let rw_fields = fields.keys().any(|field| {
        field == MODE_FIELD
            || field == WRITER_FIELD
            || field.starts_with(READ_FIELD_PREFIX)
            || field.starts_with(READ_FENCE_FIELD_PREFIX)
    });
    let kind = if rw_fields || !leases.is_empty() || fields.contains_key(KIND_FIELD) {
        Kind::ReadWrite
    } else {
        queued.unwrap_or(Kind::Lock)
    };
    let fence = fields.get(FENCE_FIELD).and_then(|s| s.parse().ok());
    let (mode, mut holders) = match kind {
        Kind::ReadWrite => read_rw_fields(fields, fence, leases)?,
        // (Not reached: told by their fields above.)
        Kind::Lock | Kind::Semaphore | Kind::Latch => (None, holders_of(fields, fence)?),
    };
    if holders.is_empty() && mode.is_none() {
        return None;
    }
    holders.sort_by(|a, b| {
        let rank = |h: &Holder| match h.role {
            Some(Mode::Write) => 0,
            Some(Mode::Read) => 1,
            None => 2,
        };
        rank(a).cmp(&rank(b)).then_with(|| a.owner.cmp(&b.owner))
    });
    Some(HashReading {
        kind,
        mode,
        holders,
        fence,
        permits: None,
        count: None,
    })
}

/// A latch hash: `~latch` -> the count, its `~kind` and `~round`, and nothing else (`None`
/// otherwise: not what the latch's scripts write).
fn read_latch(fields: &HashMap<String, String>) -> Option<HashReading> {
    if fields
        .keys()
        .any(|field| ![LATCH_FIELD, KIND_FIELD, ROUND_FIELD].contains(&field.as_str()))
    {
        return None;
    }
    let count = fields.get(LATCH_FIELD)?.parse::<u64>().ok()?;
    Some(HashReading {
        kind: Kind::Latch,
        mode: None,
        holders: Vec::new(),
        fence: None,
        permits: None,
        count: Some(count),
    })
}

/// A semaphore hash: its permits and acquisitions, by id. `None` when a field is not one the
/// semaphore's scripts write, or its value is not a number.
fn read_semaphore(
    fields: &HashMap<String, String>,
    leases: &HashMap<String, i64>,
) -> Option<HashReading> {
    let number = |field: &str| -> Option<i64> {
        fields
            .get(field)
            .map_or(Some(0), |value| value.parse::<i64>().ok())
    };
    let permits = Permits {
        total: number(PERMITS_FIELD)?,
        taken: number(USED_FIELD)?,
    };
    let mut holders = Vec::new();
    for (field, value) in fields {
        if field == PERMITS_FIELD || field == USED_FIELD || field == KIND_FIELD {
            continue;
        }
        if let Some(id) = field.strip_prefix(READ_FENCE_FIELD_PREFIX) {
            // A token with its permits; a token alone would be a half-written state.
            value.parse::<u64>().ok()?;
            if !fields.contains_key(&format!("{READ_FIELD_PREFIX}{id}")) {
                return None;
            }
            continue;
        }
        if let Some(id) = field.strip_prefix(GRANTED_FIELD_PREFIX) {
            // A grant the line made, beside its permits (the waiter wakes holding them).
            if !fields.contains_key(&format!("{READ_FIELD_PREFIX}{id}")) {
                return None;
            }
            continue;
        }
        let id = field.strip_prefix(READ_FIELD_PREFIX)?;
        let held = value.parse::<u64>().ok().filter(|&n| n > 0)?;
        holders.push(Holder {
            owner: id.to_string(),
            hold_count: 1,
            role: None,
            token: fields
                .get(&format!("{READ_FENCE_FIELD_PREFIX}{id}"))
                .and_then(|t| t.parse().ok()),
            lease_ms: leases.get(field).copied(),
            permits: Some(held),
        });
    }
    // In grant order (tokens grow), then by id.
    holders.sort_by(|a, b| a.token.cmp(&b.token).then_with(|| a.owner.cmp(&b.owner)));
    Some(HashReading {
        kind: Kind::Semaphore,
        mode: None,
        holders,
        fence: None,
        permits: Some(permits),
        count: None,
    })
}

/// A count field's value: a positive number for an owner, any number for a `~` reservation.
fn count(field: &str, value: &str) -> Option<u64> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0 || field.starts_with('~'))
}

/// The holders of a plain or fair lock hash, or `None` when a value is not a hold count (not
/// our hash). `~fence` is the grant's token and `~granted` marks a grant the line made (the
/// owner beside it holds the lock): neither is a holder. Other fields starting with `~` are
/// reservations, not owners, such as `~expiring` (a run-once job's "hold at least" tail); they
/// are listed as they are.
fn holders_of(fields: &HashMap<String, String>, fence: Option<u64>) -> Option<Vec<Holder>> {
    fields
        .iter()
        .filter(|(field, _)| ![FENCE_FIELD, GRANTED_FIELD].contains(&field.as_str()))
        .map(|(owner, value)| {
            Some(Holder {
                owner: owner.clone(),
                hold_count: count(owner, value)?,
                role: None,
                token: if owner.starts_with('~') { None } else { fence },
                lease_ms: None,
                permits: None,
            })
        })
        .collect()
}

/// A read/write lock hash's mode and holders, or `None` when a value is not what the layout
/// keeps there.
fn read_rw_fields(
    fields: &HashMap<String, String>,
    fence: Option<u64>,
    leases: &HashMap<String, i64>,
) -> Option<(Option<Mode>, Vec<Holder>)> {
    let mode = match fields.get(MODE_FIELD).map(String::as_str) {
        None => None,
        Some("r") => Some(Mode::Read),
        Some("w") => Some(Mode::Write),
        Some(_) => return None,
    };
    let writer = fields.get(WRITER_FIELD);
    let mut holders = Vec::new();
    for (field, value) in fields {
        // (`~granted` and `~granted:~r:<owner>` mark a hold the line granted: not holders.)
        if [
            FENCE_FIELD,
            MODE_FIELD,
            WRITER_FIELD,
            KIND_FIELD,
            GRANTED_FIELD,
        ]
        .contains(&field.as_str())
            || field.starts_with(READ_FENCE_FIELD_PREFIX)
            || field.starts_with(GRANTED_FIELD_PREFIX)
        {
            continue;
        }
        let hold_count = count(field, value)?;
        let holder = if let Some(reader) = field.strip_prefix(READ_FIELD_PREFIX) {
            Holder {
                owner: reader.to_string(),
                hold_count,
                role: Some(Mode::Read),
                token: fields
                    .get(&format!("{READ_FENCE_FIELD_PREFIX}{reader}"))
                    .and_then(|t| t.parse().ok()),
                lease_ms: leases.get(field).copied(),
                permits: None,
            }
        } else if field.starts_with('~') {
            Holder {
                owner: field.clone(),
                hold_count,
                role: None,
                token: None,
                lease_ms: None,
                permits: None,
            }
        } else {
            // An owner's count field is the writer's (one that is not would be a half-written
            // state: listed without a role).
            let writing = writer == Some(field);
            Holder {
                owner: field.clone(),
                hold_count,
                role: writing.then_some(Mode::Write),
                token: if writing { fence } else { None },
                lease_ms: leases.get(field).copied(),
                permits: None,
            }
        };
        holders.push(holder);
    }
    Some((mode, holders))
}

/// The `(member, score)` pairs of a `ZRANGE ... WITHSCORES` reply, flat (RESP2) or in pairs
/// (RESP3); members that are not text are skipped.
pub fn scored(value: &Value) -> Vec<(String, f64)> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    if items.iter().all(|item| matches!(item, Value::Array(_))) {
        items
            .iter()
            .filter_map(|pair| match pair {
                Value::Array(pair) => Some((pair.first()?.as_string()?, pair.get(1)?.as_f64()?)),
                _ => None,
            })
            .collect()
    } else {
        items
            .chunks(2)
            .filter_map(|pair| Some((pair.first()?.as_string()?, pair.get(1)?.as_f64()?)))
            .collect()
    }
}

/// The server time in a `TIME` reply (`[seconds, microseconds]`), in microseconds.
pub fn time_us(value: &Value) -> Option<u64> {
    let Value::Array(parts) = value else {
        return None;
    };
    let secs = parts.first()?.as_u64()?;
    let micros = parts.get(1)?.as_u64()?;
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

/// This machine's clock in microseconds since the epoch (for [`kind_of_queue`], which needs it
/// only roughly).
pub fn local_time_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One waiter in a lock's line (plain or fair), a read/write lock's, or a semaphore's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiter {
    /// The waiting owner, `<client uuid>:<local id>`: a plain lock's waiting client's first
    /// waiting task's, a fair lock's waiting owner, a semaphore waiter's acquisition id.
    pub owner: String,
    /// `read` or `write` for a read/write lock's waiter; `null` for a plain or fair lock's and
    /// a semaphore's.
    pub wants: Option<Mode>,
    /// How long it has waited, in milliseconds (since it queued, by the server's clock).
    pub waiting_ms: u64,
    /// Entry life left in milliseconds (`P:{N}:waiters:until` against the server's clock): its
    /// client's watchdog keeps renewing it. Negative: it lapsed (the client is gone) and goes at
    /// the lock's (or semaphore's) next call. `null`: no deadline recorded.
    pub entry_ms: Option<i64>,
    /// The permits a semaphore's waiter wants (`P:{N}:wants`; 1 when it has no entry there,
    /// as the semaphore's scripts count it); `null` for a lock's waiter.
    pub permits: Option<u64>,
}

/// The line of a lock (plain or fair), a read/write lock or a semaphore in order, from its
/// `:waiters` and `:waiters:until` zsets (and a semaphore's `:wants`, id -> permits), at
/// server time `now_us`.
pub fn queue(
    kind: Kind,
    waiters: &[(String, f64)],
    until: &[(String, f64)],
    wanted: &HashMap<String, u64>,
    now_us: u64,
) -> Vec<Waiter> {
    let until: HashMap<&str, f64> = until.iter().map(|(m, s)| (m.as_str(), *s)).collect();
    let now_ms = (now_us / 1_000) as i64;
    let mut entries: Vec<(f64, Waiter)> = waiters
        .iter()
        .map(|(owner, score)| {
            // Scores below 2^53 are exact in a double.
            let score_int = *score as u64;
            let (arrival_us, wants) = match kind {
                Kind::ReadWrite => (
                    score_int / 2,
                    Some(if score_int % 2 == 1 {
                        Mode::Write
                    } else {
                        Mode::Read
                    }),
                ),
                Kind::Lock | Kind::Semaphore | Kind::Latch => (score_int, None),
            };
            let waiter = Waiter {
                owner: owner.clone(),
                wants,
                waiting_ms: now_us.saturating_sub(arrival_us) / 1_000,
                entry_ms: until.get(owner.as_str()).map(|&ms| ms as i64 - now_ms),
                permits: (kind == Kind::Semaphore).then(|| wanted.get(owner).copied().unwrap_or(1)),
            };
            (*score, waiter)
        })
        .collect();
    // ZRANGE's order already; sorted again so the order never rests on the reply's shape.
    entries.sort_by(|a, b| a.0.total_cmp(&b.0));
    entries.into_iter().map(|(_, w)| w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn plain_hashes() {
        let reading = read_hash(
            &map(&[("b:t1", "2"), ("~fence", "17")]),
            None,
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(reading.kind, Kind::Lock);
        assert_eq!(reading.fence, Some(17));
        assert_eq!(
            reading.holders,
            [Holder {
                owner: "b:t1".into(),
                hold_count: 2,
                role: None,
                token: Some(17),
                lease_ms: None,
                permits: None,
            }]
        );
        // `unlock_after`'s tail: a reservation, listed as it is, with no token.
        let tail = read_hash(
            &map(&[("~expiring", "0"), ("~fence", "18")]),
            None,
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(tail.holders.len(), 1);
        assert_eq!(tail.holders[0].owner, "~expiring");
        assert_eq!(tail.holders[0].token, None);
        assert_eq!(
            read_hash(&map(&[("field", "hello")]), None, &HashMap::new()),
            None
        );
        assert_eq!(
            read_hash(&map(&[("x:t1", "0")]), None, &HashMap::new()),
            None
        );
        assert_eq!(read_hash(&HashMap::new(), None, &HashMap::new()), None);
        // A fair lock with waiters reads as a plain one: the same layout, the same line.
        let now_us = 1_764_600_000_000_000;
        let queued = kind_of_queue(Some(now_us as f64 - 5e6), now_us);
        let fair = read_hash(
            &map(&[("b:t1", "1"), ("~fence", "3")]),
            queued,
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(fair.kind, Kind::Lock);
    }

    #[test]
    fn a_grant_the_line_made_lists_only_its_owner() {
        // A release (or a force unlock) granted the lock to the first live waiter in place:
        // `~granted` marks it until the hold ends; it is no holder.
        let fields = map(&[("w:t7", "1"), ("~fence", "21"), ("~granted", "1")]);
        for queued in [None, Some(Kind::Lock)] {
            let reading = read_hash(&fields, queued, &HashMap::new()).unwrap();
            assert_eq!(reading.kind, Kind::Lock);
            assert_eq!(reading.fence, Some(21));
            assert_eq!(
                reading.holders,
                [Holder {
                    owner: "w:t7".into(),
                    hold_count: 1,
                    role: None,
                    token: Some(21),
                    lease_ms: None,
                    permits: None,
                }]
            );
        }
        // The mark alone holds nothing: not a lock.
        assert_eq!(
            read_hash(&map(&[("~granted", "1")]), None, &HashMap::new()),
            None
        );
    }

    #[test]
    fn read_write_hashes() {
        let fields = map(&[
            ("~mode", "w"),
            ("~writer", "w:t1"),
            ("w:t1", "2"),
            ("~fence", "40"),
            ("~r:w:t1", "1"),
            ("~rf:w:t1", "41"),
            ("~r:a:t2", "3"),
            ("~rf:a:t2", "39"),
        ]);
        let leases = HashMap::from([
            ("w:t1".to_string(), 1_000),
            ("~r:w:t1".to_string(), 2_000),
            ("~r:a:t2".to_string(), -5),
        ]);
        let reading = read_hash(&fields, None, &leases).unwrap();
        assert_eq!(reading.kind, Kind::ReadWrite);
        assert_eq!(reading.mode, Some(Mode::Write));
        let summary: Vec<_> = reading
            .holders
            .iter()
            .map(|h| (h.owner.as_str(), h.hold_count, h.role, h.token, h.lease_ms))
            .collect();
        assert_eq!(
            summary,
            [
                ("w:t1", 2, Some(Mode::Write), Some(40), Some(1_000)),
                ("a:t2", 3, Some(Mode::Read), Some(39), Some(-5)),
                ("w:t1", 1, Some(Mode::Read), Some(41), Some(2_000)),
            ]
        );
        // Reserved for a waiting writer: told apart from a lock by its line's scores.
        let reserved = read_hash(
            &map(&[("~turn:w:t1", "0")]),
            Some(Kind::ReadWrite),
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!((reserved.kind, reserved.mode), (Kind::ReadWrite, None));
        assert_eq!(
            read_hash(&map(&[("~mode", "x")]), None, &HashMap::new()),
            None
        );
        assert_eq!(
            read_hash(
                &map(&[("~mode", "r"), ("~r:a", "many")]),
                None,
                &HashMap::new()
            ),
            None
        );
    }

    #[test]
    fn queue_kinds_and_order() {
        let now_us = 1_764_600_000_000_000;
        assert_eq!(kind_of_queue(None, now_us), None);
        assert_eq!(
            kind_of_queue(Some(now_us as f64 - 5e6), now_us),
            Some(Kind::Lock)
        );
        assert_eq!(
            kind_of_queue(Some((2 * (now_us - 5_000_000) + 1) as f64), now_us),
            Some(Kind::ReadWrite)
        );
        let arrival = now_us - 2_000_000;
        let waiters = [
            ("r:t2".to_string(), (2 * arrival + 2) as f64),
            ("w:t1".to_string(), (2 * arrival + 1) as f64),
        ];
        let until = [("w:t1".to_string(), (now_us / 1_000 + 500) as f64)];
        let q = queue(Kind::ReadWrite, &waiters, &until, &HashMap::new(), now_us);
        assert_eq!(q[0].owner, "w:t1");
        assert_eq!(q[0].wants, Some(Mode::Write));
        assert_eq!(q[0].waiting_ms, 2_000);
        assert_eq!(q[0].entry_ms, Some(500));
        assert_eq!(q[1].wants, Some(Mode::Read));
        assert_eq!(q[1].entry_ms, None);
        assert_eq!(q[1].permits, None);

        // A semaphore's: scored by arrival as a lock's, with the permits each wants.
        let waiters = [
            ("s:o2".to_string(), (arrival + 1) as f64),
            ("s:o1".to_string(), arrival as f64),
        ];
        let wanted = HashMap::from([("s:o1".to_string(), 3)]);
        let q = queue(Kind::Semaphore, &waiters, &until, &wanted, now_us);
        let summary: Vec<_> = q
            .iter()
            .map(|w| (w.owner.as_str(), w.wants, w.permits, w.waiting_ms))
            .collect();
        assert_eq!(
            summary,
            [
                ("s:o1", None, Some(3), 2_000),
                ("s:o2", None, Some(1), 1_999)
            ]
        );
        let q = queue(Kind::Lock, &waiters, &until, &wanted, now_us);
        assert_eq!(q[0].permits, None);
        assert_eq!(q[0].wants, None);
    }

    #[test]
    fn semaphore_hashes() {
        // Both have `~r:` fields and leases: the `~permits`/`~used` fields tell a semaphore.
        let fields = map(&[
            ("~permits", "5"),
            ("~used", "3"),
            ("~r:a:o1", "2"),
            ("~rf:a:o1", "12"),
            ("~r:b:o4", "1"),
            ("~rf:b:o4", "9"),
            // A grant the line made: its mark is not a holder.
            ("~granted:b:o4", "1"),
        ]);
        let leases = HashMap::from([("~r:a:o1".to_string(), 4_000), ("~r:b:o4".to_string(), -30)]);
        let reading = read_hash(&fields, Some(Kind::ReadWrite), &leases).unwrap();
        assert_eq!(reading.kind, Kind::Semaphore);
        assert_eq!(
            (reading.mode, reading.fence, reading.count),
            (None, None, None)
        );
        let permits = reading.permits.unwrap();
        assert_eq!(
            (permits.total, permits.taken, permits.available()),
            (5, 3, 2)
        );
        let summary: Vec<_> = reading
            .holders
            .iter()
            .map(|h| {
                (
                    h.owner.as_str(),
                    h.hold_count,
                    h.permits,
                    h.token,
                    h.lease_ms,
                    h.role,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("b:o4", 1, Some(1), Some(9), Some(-30), None),
                ("a:o1", 1, Some(2), Some(12), Some(4_000), None),
            ]
        );
        // Nothing taken: still a semaphore (it keeps its number until deleted).
        let idle = read_hash(&map(&[("~permits", "2"), ("~used", "0")]), None, &leases).unwrap();
        assert_eq!(idle.kind, Kind::Semaphore);
        assert!(idle.holders.is_empty());
        // Lowered below what is taken.
        let over = read_hash(
            &map(&[("~permits", "-1"), ("~used", "2"), ("~r:a", "2")]),
            None,
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(over.permits.unwrap().available(), -3);
        for bad in [
            &[("~permits", "x")][..],
            &[("~permits", "2"), ("owner:t1", "1")],
            &[("~permits", "2"), ("~r:a", "0")],
            &[("~permits", "2"), ("~rf:a", "3")],
            &[("~permits", "2"), ("~granted:a", "1")],
            &[("~used", "1"), ("~mode", "r")],
        ] {
            assert_eq!(read_hash(&map(bad), None, &HashMap::new()), None, "{bad:?}");
        }
    }

    #[test]
    fn latch_hashes() {
        let latch = read_hash(&map(&[("~latch", "2")]), None, &HashMap::new()).unwrap();
        assert_eq!((latch.kind, latch.count), (Kind::Latch, Some(2)));
        assert!(latch.holders.is_empty());
        assert_eq!(latch.permits, None);
        assert_eq!(
            read_hash(&map(&[("~latch", "two")]), None, &HashMap::new()),
            None
        );
        assert_eq!(
            read_hash(
                &map(&[("~latch", "2"), ("a:t1", "1")]),
                None,
                &HashMap::new()
            ),
            None
        );
    }

    #[test]
    fn zset_replies() {
        let flat = Value::Array(vec![
            Value::from("a"),
            Value::from("1.5"),
            Value::from("b"),
            Value::from(2_i64),
        ]);
        assert_eq!(scored(&flat), [("a".into(), 1.5), ("b".into(), 2.0)]);
        let pairs = Value::Array(vec![Value::Array(vec![
            Value::from("a"),
            Value::Double(3.0),
        ])]);
        assert_eq!(scored(&pairs), [("a".into(), 3.0)]);
        assert_eq!(scored(&Value::Null), []);
        let time = Value::Array(vec![Value::from("1764600000"), Value::from("42")]);
        assert_eq!(time_us(&time), Some(1_764_600_000_000_042));
    }
}
