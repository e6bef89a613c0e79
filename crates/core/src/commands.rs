//! One typed call per script: arguments in, a typed reply (or a classified [`LockError`]) out.
//!
//! These functions send exactly one script call or read (plus SCRIPT LOAD after NOSCRIPT, and
//! resends of a command that a cluster redirected, which did not run: [`resend_not_run`]) and
//! never wait for a lock or retry a failure: waiting, deadlines and renewal policy live in the
//! crates above.

use std::time::Duration;

use bytes_utils::Str;
use fred::prelude::Value;
use fred::types::Key;

use crate::error::from_fred;
use crate::kind::{Entries, Family, Stored, Traits};
use crate::scripts::resend_not_run;
use crate::scripts::Scripts;
use crate::{FencingToken, HoldId, Lease, LockError, LockKeys, Owner, Result};

/// How an acquire is sent (see `scripts/acquire.lua` and `scripts/line/acquire.lua`).
#[derive(Clone, Copy, Debug)]
pub enum AcquireMode {
    /// A plain try: a free lock is granted; nothing else changes.
    Try,
    /// Re-enter the grant with this token, which the client holds under the owner.
    Reenter(FencingToken),
    /// A try of a non-reentrant lock, as `Try`, except that a hold the owner already has keeps
    /// the lock busy instead of being replaced as an orphan: two acquires of one owner can
    /// never both be granted.
    NonReentrant,
    /// A waiter's try (a lock's line: `scripts/line/acquire.lua`; a read/write lock's, a
    /// semaphore's): as a try, and when not granted the owner keeps (or takes) its place in
    /// the line. A grant the line made to the owner meanwhile is taken as its own. `Try`,
    /// `Reenter` and `NonReentrant` never queue.
    Waiter {
        /// The entry's lifetime unless renewed: the watchdog's lease.
        entry_life: Lease,
        /// A non-reentrant handle: the owner's own hold keeps the lock busy (unless the line
        /// granted it).
        non_reentrant: bool,
        /// The lease is a fixed one (not renewed by the watchdog): a lock's line grants it as
        /// asked. A watched lease is granted until the waiter's entry would have lapsed.
        fixed_lease: bool,
    },
}

/// The reply of the acquire script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Granted: `hold_count` 1 for a new grant, more for a re-entry.
    Granted {
        /// The owner's hold count after this acquire.
        hold_count: u64,
        /// The fencing token of the grant this hold belongs to.
        fence: FencingToken,
    },
    /// Held by another owner (or granted to another waiter by the line).
    Held {
        /// How long the lock stays so at most without a message to this waiter: the holder's
        /// lease, or a dead waiter's entry ahead (`None`: no TTL).
        ttl: Option<Duration>,
        /// A waiter's try of a kind with a line of its own: the waiter's place (its score in
        /// the line). A settle of a later try of the waiter puts it back there.
        place: Option<i64>,
        /// Such a waiter's rank in its line: how many wait before it (0: it is the head).
        ahead: Option<u64>,
        /// A lock waiter's try: the holder's fencing token when it ran. A grant the line makes
        /// later has a larger token, so a grant message with a token at most this one is not
        /// for this wait.
        counter: Option<u64>,
    },
}

/// Where a waiter stood in its line, for a settle that takes back the grant of its try whose
/// reply never came (`scripts/keep_place.lua`): the waiter goes back there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Its score in the line, as the busy reply that queued it said.
    pub score: i64,
    /// Its entry's lifetime: the watchdog's lease.
    pub life: Lease,
}

/// What a settle of an unanswered command undoes, if that command ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// A release (or a plain call of the release script): the hold it was for.
    Release,
    /// An acquire: the grant it made. A grant the line made to the owner meanwhile (a release
    /// handed the lock to this waiter) is not the acquire's doing and stays: the waiter, still
    /// waiting, takes it, or hands it on when it leaves. `place` is where a waiter of a kind
    /// with a line of its own stood: the grant taken back, it goes back there.
    Acquire(Option<Place>),
}

impl Undo {
    fn place(self) -> Option<Place> {
        match self {
            Undo::Release => None,
            Undo::Acquire(place) => place,
        }
    }
}

/// The reply of the release and release-after scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// One hold released (or, for release-after, handed to nobody).
    Released,
    /// The owner held nothing under that token; nothing changed.
    NotHeld,
    /// Settling only: the owner's count was not the expected one; nothing changed.
    Unchanged,
}

/// What a release does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseKind {
    /// Release one hold now.
    Now,
    /// Let the last hold end this many milliseconds from now (`release_after.lua`).
    After(u64),
}

/// A fixed argument, sent without copying it (these go out on every waiter's try).
fn word(text: &'static str) -> Value {
    Value::String(Str::from_static(text))
}

/// A grant's token as a script argument, or `''` for "whichever grant". Sent as an integer:
/// Redis hands it to Lua as its decimal text, which is how the hash stores it, and the client
/// formats no string for it.
fn token_arg(token: Option<FencingToken>) -> Value {
    match token {
        Some(token) => Value::Integer(i64::from(token)),
        None => word(""),
    }
}

fn parse_error(script: &str, value: &Value) -> LockError {
    LockError::Redis(crate::error::RedisError::connection(format!(
        "unexpected reply from the {script} script: {value:?}"
    )))
}

/// An integer reply element; scripts may also answer decimal text (fencing tokens).
fn int_at(values: &[Value], i: usize) -> Option<i64> {
    let value = values.get(i)?;
    value.as_i64().or_else(|| {
        value
            .as_bytes()
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
    })
}

/// Runs the acquire script for `owner` with `lease`.
pub async fn acquire<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    owner: &Owner,
    lease: Lease,
    mode: AcquireMode,
) -> Result<Acquire> {
    acquire_permits(client, scripts, keys, owner, lease, mode, 1).await
}

/// Runs the acquire script of `keys`' kind for `owner` with `lease`; a semaphore's acquisition
/// (`owner` is its id) takes `permits` (the locks ignore it).
pub async fn acquire_permits<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    owner: &Owner,
    lease: Lease,
    mode: AcquireMode,
    permits: u32,
) -> Result<Acquire> {
    // The other kinds' calls (and a waiting plain lock's) are boxed: inline, their futures
    // would widen the plain lock's try, which every acquire builds and moves.
    if !keys.traits().fast_path || matches!(mode, AcquireMode::Waiter { .. }) {
        return Box::pin(kind_acquire(
            client, scripts, keys, owner, lease, mode, permits,
        ))
        .await;
    }
    let reply: Value = scripts
        .acquire
        .call(client, || {
            let key_list = vec![Key::from(keys.hash_str()), Key::from(keys.fence_str())];
            let mut args = Vec::with_capacity(4);
            args.push(Value::from(owner.id_str().clone()));
            args.push(Value::from(lease.millis() as i64));
            // A plain try sends only what the grant needs (see the script's header).
            match mode {
                AcquireMode::Try => {}
                AcquireMode::Reenter(token) => {
                    args.push(word("r"));
                    args.push(token_arg(Some(token)));
                }
                AcquireMode::NonReentrant => args.push(word("n")),
                AcquireMode::Waiter { .. } => unreachable!("a waiter's try is the line's"),
            }
            (key_list.into(), Value::Array(args))
        })
        .await
        .map_err(|e| from_fred(e, &[keys.hash(), keys.fence()]).naming(keys.name()))?;
    acquire_reply(reply)
}

/// The argument a family's acquire takes after the shared ones: a plain lock's waiters hear
/// on their client's channel (`c`), a read/write lock's side, a semaphore's permits.
fn kind_argument(keys: &LockKeys, permits: u32) -> Value {
    let traits = keys.traits();
    match traits.family {
        Family::Line => word(match traits.entries {
            Entries::ClientHeads => "c",
            Entries::EveryWaiter => "",
        }),
        Family::ReadWrite => side(traits),
        Family::Semaphore => Value::from(i64::from(permits)),
    }
}

/// A read/write lock's side, as its scripts name it.
fn side(traits: &Traits) -> Value {
    word(traits.side.unwrap_or_default())
}

/// The keys a kind's scripts take, in their order (`scripts/line/acquire.lua`,
/// `scripts/rw/common.lua`, `scripts/sem/common.lua`, `force_unlock.lua`): the hash; the fence
/// counter (every one of them may grant); the waiters and their deadlines; then the holds'
/// leases (a read/write lock, a semaphore) and what each waiter wants (a semaphore's permits,
/// a lock's fixed leases), as the kind's traits say.
fn script_keys(keys: &LockKeys) -> Vec<Key> {
    let traits = keys.traits();
    let mut list = Vec::with_capacity(6);
    list.push(Key::from(keys.hash_str()));
    list.push(Key::from(keys.fence_str()));
    list.push(Key::from(keys.waiters_str()));
    list.push(Key::from(keys.waiters_until_str()));
    if traits.stored.has_leases() {
        list.push(Key::from(keys.leases()));
    }
    if traits.wants {
        list.push(Key::from(keys.wants_str()));
    }
    list
}

/// A script's error, naming the key it refused by the script's key order
/// ([`script_keys`]).
fn script_error(keys: &LockKeys, error: fred::error::Error) -> LockError {
    let names: Vec<String> = script_keys(keys)
        .iter()
        .map(|k| k.as_str_lossy().into_owned())
        .collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    from_fred(error, &all)
}

/// Runs the acquire script of a kind with a line of waiters: a lock's line
/// (`scripts/line/acquire.lua`: every try of a fair lock, a waiting plain lock's), a read/write
/// lock's side (`scripts/rw/acquire.lua`) or a semaphore (`scripts/sem/acquire.lua`). Their
/// arguments share one order: owner, lease, mode ('t' a try, 'w' a waiter's try, 'r' a
/// re-entry), the re-entered token (or 'n' for a non-reentrant handle: the lock's line reads
/// it), the waiter channel prefix, the entry's lifetime, and the kind's own: a plain lock's
/// waiters hear on their client's channel, a read/write lock's side, a semaphore's permits.
async fn kind_acquire<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    owner: &Owner,
    lease: Lease,
    mode: AcquireMode,
    permits: u32,
) -> Result<Acquire> {
    let prefix = keys.waiter_channel_prefix();
    let (code, fourth, life, fixed) = match mode {
        AcquireMode::Reenter(token) => ("r", token_arg(Some(token)), 0, false),
        AcquireMode::Waiter {
            entry_life,
            non_reentrant,
            fixed_lease,
        } => (
            "w",
            word(if non_reentrant { "n" } else { "" }),
            entry_life.millis(),
            fixed_lease,
        ),
        AcquireMode::NonReentrant => ("t", word("n"), 0, false),
        AcquireMode::Try => ("t", word(""), 0, false),
    };
    let script = scripts.of(keys.traits().family).acquire;
    let seventh = kind_argument(keys, permits);
    let reply: Value = script
        .call(client, || {
            (
                script_keys(keys).into(),
                Value::Array(vec![
                    Value::from(owner.id_str().clone()),
                    Value::from(lease.millis() as i64),
                    word(code),
                    fourth.clone(),
                    Value::from(prefix.as_str()),
                    Value::from(life as i64),
                    seventh.clone(),
                    word(if fixed { "f" } else { "" }),
                ]),
            )
        })
        .await
        .map_err(|e| script_error(keys, e).naming(keys.name()))?;
    acquire_reply(reply)
}

/// What [`semaphore_set`] does. A semaphore has 0 to `u32::MAX` permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemaphoreChange {
    /// Set the number of permits only if it was never set.
    TrySet(u32),
    /// Set the number of permits.
    Set(u32),
    /// Add this many permits (negative: take them away); the result must be 0 to `u32::MAX`.
    Add(i64),
    /// Delete the semaphore.
    Delete,
}

/// The fields a read asks for besides its own, to tell which kind a name is in use as: the
/// `~kind` marker, and the fields only a lock's hash has (every lock grant writes `~fence`; an
/// `unlock_after` tail is `~expiring` alone). A hash without any of them is no lock's.
const KIND_FIELDS: [&str; 3] = [
    crate::protocol::KIND_FIELD,
    crate::protocol::FENCE_FIELD,
    crate::protocol::EXPIRING_FIELD,
];

/// The kind a name is in use as, from one read of [`KIND_FIELDS`]: its `~kind`, or a lock when
/// a lock's own fields are there (`None`: no hash at all, or this kind's own without a marker).
fn held_as(
    kind: Option<String>,
    fence: Option<String>,
    expiring: Option<String>,
) -> Option<String> {
    kind.or_else(|| {
        (fence.is_some() || expiring.is_some()).then(|| Stored::Lock.marker().to_string())
    })
}

/// Refuses a name in use as another kind than `wanted` with [`LockError::WrongKind`].
fn check_kind(keys: &LockKeys, held: Option<&str>, wanted: Stored) -> Result<()> {
    match held {
        Some(kind) if kind != wanted.marker() => Err(LockError::WrongKind {
            name: keys.name().to_string(),
            held_as: crate::error::kind_word(kind).to_string(),
            asked_as: wanted.described().to_string(),
        }),
        _ => Ok(()),
    }
}

/// Changes a semaphore's number of permits, or deletes it (`scripts/sem/set.lua`); waiters
/// whose permits are there now are told. Returns whether it changed.
pub async fn semaphore_set<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    change: SemaphoreChange,
) -> Result<bool> {
    let prefix = keys.waiter_channel_prefix();
    let (op, n) = match change {
        SemaphoreChange::TrySet(n) => ("try", i64::from(n)),
        SemaphoreChange::Set(n) => ("set", i64::from(n)),
        // The script checks the sum; a larger step could only take it out of range (and would
        // not be exact in Lua's doubles).
        SemaphoreChange::Add(n) if n.unsigned_abs() > u64::from(u32::MAX) => {
            return Err(LockError::InvalidArgument(format!(
                "adding {n} permits: a semaphore has 0 to {} permits",
                u32::MAX
            )));
        }
        SemaphoreChange::Add(n) => ("add", n),
        SemaphoreChange::Delete => ("delete", 0),
    };
    let changed: i64 = scripts
        .sem_set
        .call(client, || {
            (
                script_keys(keys).into(),
                Value::Array(vec![word(op), Value::from(n), Value::from(prefix.as_str())]),
            )
        })
        .await
        .map_err(|e| script_error(keys, e).naming(keys.name()))?;
    Ok(changed == 1)
}

/// A semaphore's number of permits and the permits taken now (`None` when never set).
///
/// # Errors
/// [`LockError::WrongKind`] when the name is a lock's, a read/write lock's or a latch's.
pub async fn semaphore_state<C: fred::interfaces::HashesInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
) -> Result<Option<(i64, i64)>> {
    type Fields = (
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let (permits, used, kind, fence, expiring): Fields = resend_not_run(|| {
        let mut fields = vec![crate::protocol::PERMITS_FIELD, crate::protocol::USED_FIELD];
        fields.extend(KIND_FIELDS);
        client.hmget(keys.hash_str(), fields)
    })
    .await
    .map_err(|e| from_fred(e, &[keys.hash()]))?;
    check_kind(
        keys,
        held_as(kind, fence, expiring).as_deref(),
        Stored::Semaphore,
    )?;
    Ok(permits.map(|permits| (permits, used.unwrap_or(0))))
}

/// Sets a count-down latch's count if it is not counting down (`scripts/latch/set_count.lua`):
/// a new round begins.
pub async fn latch_set_count<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    count: u32,
) -> Result<bool> {
    let set: i64 = scripts
        .latch_set_count
        .call(client, || {
            (
                vec![Key::from(keys.hash_str()), Key::from(keys.fence_str())].into(),
                Value::Array(vec![Value::from(i64::from(count))]),
            )
        })
        .await
        .map_err(|e| from_fred(e, &[keys.hash(), keys.fence()]).naming(keys.name()))?;
    Ok(set == 1)
}

/// Counts a latch down by one (`scripts/latch/count_down.lua`); returns the count left.
pub async fn latch_count_down<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
) -> Result<u64> {
    let left: i64 = scripts
        .latch_count_down
        .call(client, || {
            (
                Key::from(keys.hash_str()).into(),
                Value::Array(vec![Value::from(keys.released_str())]),
            )
        })
        .await
        .map_err(|e| from_fred(e, &[keys.hash()]).naming(keys.name()))?;
    Ok(left.max(0) as u64)
}

/// A latch as one read sees it ([`latch_state`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatchState {
    /// The count (0: open).
    pub count: u64,
    /// The id of the round counting down (`None` while open). Ids never repeat: a waiter whose
    /// round was `r` knows it opened once the latch holds another round, or none.
    pub round: Option<String>,
}

/// A latch's count and round.
///
/// # Errors
/// [`LockError::WrongKind`] when the name is a lock's, a read/write lock's or a semaphore's.
pub async fn latch_state<C: fred::interfaces::HashesInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
) -> Result<LatchState> {
    type Fields = (
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let (count, round, kind, fence, expiring): Fields = resend_not_run(|| {
        let mut fields = vec![crate::protocol::LATCH_FIELD, crate::protocol::ROUND_FIELD];
        fields.extend(KIND_FIELDS);
        client.hmget(keys.hash_str(), fields)
    })
    .await
    .map_err(|e| from_fred(e, &[keys.hash()]))?;
    check_kind(
        keys,
        held_as(kind, fence, expiring).as_deref(),
        Stored::Latch,
    )?;
    Ok(LatchState {
        count: count.unwrap_or(0).max(0) as u64,
        round,
    })
}

/// Reads an acquire script's reply (plain and fair alike).
fn acquire_reply(reply: Value) -> Result<Acquire> {
    let values = match &reply {
        Value::Array(values) => values,
        // A new grant answers its token alone.
        scalar => {
            return match int_at(std::slice::from_ref(scalar), 0) {
                Some(fence) if fence > 0 => Ok(Acquire::Granted {
                    hold_count: 1,
                    fence: FencingToken::new(fence as u64),
                }),
                _ => Err(parse_error("acquire", &reply)),
            };
        }
    };
    match (int_at(values, 0), int_at(values, 1)) {
        (Some(0), Some(pttl)) => Ok(Acquire::Held {
            ttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
            place: int_at(values, 2),
            ahead: int_at(values, 3).and_then(|rank| u64::try_from(rank).ok()),
            counter: int_at(values, 4).and_then(|counter| u64::try_from(counter).ok()),
        }),
        (Some(count), Some(fence)) if count > 1 && fence >= 0 => Ok(Acquire::Granted {
            hold_count: count as u64,
            fence: FencingToken::new(fence as u64),
        }),
        _ => Err(parse_error("acquire", &reply)),
    }
}

/// Runs the release (or release-after) script for one hold of `hold`'s owner in the grant
/// `token` (`None`: any grant, when settling an acquire whose reply never came). With
/// `expected`, it settles an unanswered command instead: one hold is released only if the
/// owner's count is exactly `expected`.
pub async fn release<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    hold: &HoldId,
    token: Option<FencingToken>,
    kind: ReleaseKind,
    expected: Option<u64>,
) -> Result<Release> {
    settle(client, scripts, hold, token, kind, expected, Undo::Release).await
}

/// As [`release`], saying what an unanswered command to settle was ([`Undo`]).
pub async fn settle<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    hold: &HoldId,
    token: Option<FencingToken>,
    kind: ReleaseKind,
    expected: Option<u64>,
    undo: Undo,
) -> Result<Release> {
    let keys = &hold.keys;
    let reply: Value = match kind {
        // The other kinds' releases are boxed: inline, their futures would widen the plain
        // lock's release, the hottest path after the acquire.
        ReleaseKind::Now if !keys.traits().fast_path => {
            Box::pin(release_of_kind(
                client, scripts, hold, token, expected, undo,
            ))
            .await
        }
        ReleaseKind::After(_) if !keys.traits().unlock_after => {
            return Err(unlock_after_refused(keys));
        }
        ReleaseKind::Now => {
            scripts
                .release
                .call(client, || {
                    let mut args = Vec::with_capacity(8);
                    args.push(Value::from(hold.owner.id_str().clone()));
                    args.push(Value::from(keys.released_str()));
                    // The common release names no grant: two arguments (see the script).
                    if token.is_some() || expected.is_some() {
                        args.push(token_arg(token));
                    }
                    if let Some(expected) = expected {
                        args.push(Value::from(expected as i64));
                        if let Undo::Acquire(place) = undo {
                            match place {
                                Some(place) => {
                                    args.push(Value::from(place.score));
                                    args.push(Value::from(place.life.millis() as i64));
                                }
                                None => args.extend([word(""), word("")]),
                            }
                            args.extend([word(""), word("a")]);
                        }
                    }
                    (script_keys(keys).into(), Value::Array(args))
                })
                .await
        }
        ReleaseKind::After(after_ms) => {
            let (waiters, prefix) = (keys.waiters(), keys.waiter_channel_prefix());
            scripts
                .release_after
                .call(client, || {
                    (
                        vec![Key::from(keys.hash_str()), Key::from(waiters.as_str())].into(),
                        Value::Array(vec![
                            Value::from(hold.owner.id_str().clone()),
                            Value::from(after_ms as i64),
                            token_arg(token),
                            expected.map_or_else(|| word(""), |e| Value::from(e as i64)),
                            Value::from(keys.released_str()),
                            Value::from(prefix.as_str()),
                            owners_channels(keys),
                        ]),
                    )
                })
                .await
        }
    }
    .map_err(|e| from_fred(e, &[keys.hash(), keys.fence()]).naming(keys.name()))?;
    match reply.as_i64() {
        Some(-1) => Ok(Release::NotHeld),
        Some(-2) => Ok(Release::Unchanged),
        Some(remaining) if remaining >= 0 => Ok(Release::Released),
        _ => Err(parse_error("release", &reply)),
    }
}

/// The release script of a fair lock, a read/write lock or a semaphore, for [`release`].
async fn release_of_kind<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    hold: &HoldId,
    token: Option<FencingToken>,
    expected: Option<u64>,
    undo: Undo,
) -> std::result::Result<Value, fred::error::Error> {
    let keys = &hold.keys;
    let place = undo.place();
    // A waiter's place, for a settle (keep_place.lua): its score and its entry's lifetime.
    let (score, life) = match place {
        Some(place) => (
            Value::from(place.score),
            Value::from(place.life.millis() as i64),
        ),
        None => (word(""), word("")),
    };
    // Settling an acquire: a grant the line made meanwhile is not that acquire's doing.
    let acquire = word(if matches!(undo, Undo::Acquire(_)) {
        "a"
    } else {
        ""
    });
    let traits = keys.traits();
    let script = scripts.of(traits.family).release;
    match traits.family {
        Family::Semaphore => {
            let prefix = keys.waiter_channel_prefix();
            script
                .call(client, || {
                    (
                        script_keys(keys).into(),
                        Value::Array(vec![
                            Value::from(hold.owner.id_str().clone()),
                            Value::from(prefix.as_str()),
                            token_arg(token),
                            expected.map_or_else(|| word(""), |e| Value::from(e as i64)),
                            score.clone(),
                            life.clone(),
                            acquire.clone(),
                        ]),
                    )
                })
                .await
        }
        Family::ReadWrite => {
            let prefix = keys.waiter_channel_prefix();
            script
                .call(client, || {
                    (
                        script_keys(keys).into(),
                        Value::Array(vec![
                            Value::from(hold.owner.id_str().clone()),
                            Value::from(prefix.as_str()),
                            token_arg(token),
                            expected.map_or_else(|| word(""), |e| Value::from(e as i64)),
                            side(traits),
                            score.clone(),
                            life.clone(),
                            acquire.clone(),
                        ]),
                    )
                })
                .await
        }
        Family::Line => {
            // A fair lock's release: the plain lock's script, its waiters heard on their
            // owners' channels.
            script
                .call(client, || {
                    (
                        script_keys(keys).into(),
                        Value::Array(vec![
                            Value::from(hold.owner.id_str().clone()),
                            Value::from(keys.released_str()),
                            token_arg(token),
                            expected.map_or_else(|| word(""), |e| Value::from(e as i64)),
                            score.clone(),
                            life.clone(),
                            owners_channels(keys),
                            acquire.clone(),
                        ]),
                    )
                })
                .await
        }
    }
}

/// `o` when a lock's waiters hear on their owners' channels (a fair lock's line), for
/// `release.lua` and `release_after.lua`; a plain lock's hear on their client's.
fn owners_channels(keys: &LockKeys) -> Value {
    word(if keys.has_own_lines() { "o" } else { "" })
}

/// Refuses `unlock_after` for a kind whose holds have leases of their own.
pub fn unlock_after_refused(keys: &LockKeys) -> LockError {
    LockError::InvalidArgument(format!(
        "unlock_after is not supported on a {}",
        keys.traits().stored.described()
    ))
}

/// One thing to renew: a grant of one owner on one lock, or a waiter's entry in a lock's line
/// (and with it a grant the line made to that waiter that it has not taken yet).
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The hold (for an entry: the lock and the waiting owner).
    pub hold: HoldId,
    /// The token of the grant it belongs to; `None` for a waiter's entry.
    pub token: Option<FencingToken>,
}

/// Runs the renew script over `holds` with `lease`. Returns, in order, whether each grant was
/// still held (and is now renewed).
///
/// On Redis Cluster every key of one call must share a slot: the caller groups by slot.
pub async fn renew<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    holds: &[Renewal],
    lease: Lease,
) -> Result<Vec<bool>> {
    if holds.is_empty() {
        return Ok(Vec::new());
    }
    let reply: Value = scripts
        .renew
        .call(client, || {
            let mut keys: Vec<Key> = Vec::with_capacity(holds.len());
            let mut args = Vec::with_capacity(2 * holds.len() + 1);
            args.push(Value::from(lease.millis() as i64));
            for r in holds {
                let lock = &r.hold.keys;
                args.push(Value::from(r.hold.owner.id_str().clone()));
                let traits = lock.traits();
                match (r.token, traits.lease_tag) {
                    (Some(token), Some(tag)) => {
                        keys.push(Key::from(lock.hash_str()));
                        keys.push(Key::from(lock.leases()));
                        args.push(Value::from(format!("{tag}{token}")));
                    }
                    (Some(_), None) => {
                        keys.push(Key::from(lock.hash_str()));
                        args.push(token_arg(r.token));
                    }
                    (None, _) => {
                        // A waiter's entry: its line's keys in the kind's scripts' order, but
                        // the fence counter (the renewal keeps a grant the line made to it).
                        keys.push(Key::from(lock.hash_str()));
                        keys.push(Key::from(lock.waiters_str()));
                        keys.push(Key::from(lock.waiters_until_str()));
                        if traits.stored.has_leases() {
                            keys.push(Key::from(lock.leases()));
                        }
                        if traits.wants {
                            keys.push(Key::from(lock.wants_str()));
                        }
                        args.push(word(match (traits.stored, traits.side) {
                            (Stored::ReadWrite, Some("read")) => "er",
                            (Stored::ReadWrite, _) => "ew",
                            (Stored::Semaphore, _) => "es",
                            (Stored::Lock | Stored::Latch, _) => "el",
                        }));
                    }
                }
            }
            (keys.into(), Value::Array(args))
        })
        .await
        .map_err(|e| from_fred(e, &[holds[0].hold.keys.hash()]))?;
    match &reply {
        Value::Array(values) if values.len() == holds.len() => {
            Ok(values.iter().map(|v| v.as_i64() == Some(1)).collect())
        }
        _ => Err(parse_error("renew", &reply)),
    }
}

/// A waiter gives up: its entry leaves the line, and a grant the line made to it that its
/// client never took (`known`: the token of the owner's grant the client holds, if any) passes
/// on (`scripts/line/leave.lua`; a read/write lock's and a semaphore's own leave scripts). A
/// read/write lock's owner has one entry for both sides: `other_side_known` is the token of
/// its grant on the other side, which must not pass on either (a grant taken stays marked as
/// the line's).
pub async fn leave_line<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
    owner: &Owner,
    known: Option<FencingToken>,
    other_side_known: Option<FencingToken>,
) -> Result<()> {
    let prefix = keys.waiter_channel_prefix();
    let traits = keys.traits();
    let mut args = vec![
        Value::from(owner.id_str().clone()),
        Value::from(prefix.as_str()),
    ];
    match traits.family {
        // A lock's line also asks on whose channel its waiters hear.
        Family::Line => args.extend([token_arg(known), kind_argument(keys, 1)]),
        Family::Semaphore => args.push(token_arg(known)),
        // The read side's grant, then the write side's.
        Family::ReadWrite if traits.side == Some("read") => {
            args.extend([token_arg(known), token_arg(other_side_known)])
        }
        Family::ReadWrite => args.extend([token_arg(other_side_known), token_arg(known)]),
    }
    let list = script_keys(keys);
    let _: i64 = scripts
        .of(traits.family)
        .leave
        .call(client, || (list.clone().into(), Value::Array(args.clone())))
        .await
        .map_err(|e| script_error(keys, e))?;
    Ok(())
}

/// Runs the force-unlock script: removes the lock whoever holds it and publishes the release
/// (a lock's first live waiter is granted it, as by a release). Returns whether there was a
/// lock.
pub async fn force_unlock<C: crate::connection::ScriptConnection>(
    client: &C,
    scripts: &Scripts,
    keys: &LockKeys,
) -> Result<bool> {
    let prefix = keys.waiter_channel_prefix();
    let removed: i64 = scripts
        .force_unlock
        .call(client, || {
            (
                script_keys(keys).into(),
                Value::Array(vec![
                    Value::from(keys.released_str()),
                    Value::from(prefix.as_str()),
                    // A plain handle tells a waiter on both channels: a plain and a fair lock
                    // keep the same keys, and an operator's tool may not know which it is.
                    if keys.is_read_write() {
                        word(Stored::ReadWrite.marker())
                    } else {
                        owners_channels(keys)
                    },
                ]),
            )
        })
        .await
        .map_err(|e| from_fred(e, &[keys.hash()]).naming(keys.name()))?;
    Ok(removed == 1)
}

/// Whether any owner holds the lock (or was granted it by the line and has not taken it yet).
pub async fn is_locked<C: fred::interfaces::KeysInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
) -> Result<bool> {
    let n: i64 = resend_not_run(|| client.exists(keys.hash_str()))
        .await
        .map_err(|e| from_fred(e, &[keys.hash()]))?;
    Ok(n == 1)
}

/// The hold count of `owner` on the lock (0 if it holds nothing).
pub async fn hold_count<C: fred::interfaces::HashesInterface + Send + Sync>(
    client: &C,
    keys: &LockKeys,
    owner: &Owner,
) -> Result<u64> {
    let field = keys.kind().hold_field(owner.id());
    let count: Option<u64> = resend_not_run(|| client.hget(keys.hash_str(), field.as_str()))
        .await
        .map_err(|e| from_fred(e, &[keys.hash()]))?;
    Ok(count.unwrap_or(0))
}
