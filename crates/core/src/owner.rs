//! Who holds a lock: owner ids.
//!
//! An owner id is `<client uuid>:<local id>`. The client uuid is a random v4 uuid made when the
//! client is built, so an owner id of one client cannot be guessed by another. The local id is
//! `t<tokio task id>` for the default per-task owner (nested `lock()` calls in one task re-enter:
//! Redisson's per-thread rule, moved to tasks), `h<thread id hash>` outside a tokio task, and
//! `o<n>` for explicit owners a caller makes to share one hold across tasks.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes_utils::Str;
use uuid::Uuid;

/// The identity of one lock client (one process usually has one).
#[derive(Clone, Debug)]
pub struct ClientId {
    uuid: Arc<str>,
    next_owner: Arc<AtomicU64>,
}

impl ClientId {
    /// A new client id from a cryptographic random v4 uuid.
    pub fn random() -> ClientId {
        ClientId {
            uuid: Uuid::new_v4().simple().to_string().into(),
            next_owner: Arc::new(AtomicU64::new(1)),
        }
    }

    /// The uuid text.
    pub fn as_str(&self) -> &str {
        &self.uuid
    }

    /// The owner of the current tokio task, or of the current thread outside any task.
    ///
    /// Called on every acquire, so the id is written into a stack buffer and copied into one
    /// exact-size allocation.
    pub fn current_owner(&self) -> Owner {
        match tokio::task::try_id() {
            Some(id) => self.owner(format_args!("t{id}")),
            None => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::thread::current().id().hash(&mut h);
                self.owner(format_args!("h{:x}", h.finish()))
            }
        }
    }

    /// A fresh explicit owner, distinct from every task owner and every other explicit owner.
    pub fn new_owner(&self) -> Owner {
        let n = self.next_owner.fetch_add(1, Ordering::Relaxed);
        self.owner(format_args!("o{n}"))
    }

    /// `<uuid>:<local>`. Local ids are a letter and a u64 (at most 21 bytes), so the id fits
    /// the buffer; a longer one would still be written whole, through a String.
    fn owner(&self, local: fmt::Arguments<'_>) -> Owner {
        use std::io::Write;
        let mut buf = [0u8; 64];
        let mut rest = &mut buf[..];
        if write!(rest, "{}:{local}", self.uuid).is_ok() {
            let len = 64 - rest.len();
            let id = Str::from_inner(bytes::Bytes::copy_from_slice(&buf[..len]))
                .expect("written from str");
            return Owner { id };
        }
        Owner {
            id: format!("{}:{local}", self.uuid).into(),
        }
    }
}

/// The owner id `<client uuid>:<local id>` under which holds are counted in Redis.
///
/// Cheap to clone. Two futures that should not re-enter each other inside one task use two
/// explicit owners; tasks that share one hold share one explicit owner.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    id: Str,
}

impl Owner {
    /// Wraps an owner id read back from Redis (for inspection tools). Owners belong to the
    /// client that made them: acquiring under another client's owner id is not supported.
    pub fn from_id(id: impl Into<String>) -> Owner {
        Owner {
            id: id.into().into(),
        }
    }

    /// The id as stored in the lock hash.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id as a shared string (no copy when put into a command).
    pub(crate) fn id_str(&self) -> &Str {
        &self.id
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({})", self.id)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// One owner's hold on one lock: the key of the client's hold table. Every grant, renewal,
/// release and repair is about one `HoldId`. Cheap to clone (two reference counts).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HoldId {
    /// The lock.
    pub keys: crate::LockKeys,
    /// Who holds it.
    pub owner: Owner,
}

impl HoldId {
    /// The hold of `owner` on the lock `keys`.
    pub fn new(keys: crate::LockKeys, owner: Owner) -> HoldId {
        HoldId { keys, owner }
    }
}
