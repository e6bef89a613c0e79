//! Replica sync: how many copies a grant, renewal or release must reach before it counts.
//!
//! Redis replicates asynchronously. A primary that grants a lock and fails (Sentinel or
//! Cluster promotes a replica) before the grant reached a replica loses the grant: the promoted
//! replica grants the lock again, and two owners hold it. `WAIT n timeout` after a state change
//! makes the client wait until `n` replicas have acknowledged every write of its connection
//! (`WAITAOF` also waits for the append-only file). The grant is reported only then; a grant
//! that did not reach the replicas in time is rolled back and reported as
//! [`LockError::NotReplicated`]. A change that cannot be rolled back (a latch's count, a
//! semaphore's number of permits) is waited for alike, and a shortfall reported as
//! [`LockError::AppliedNotReplicated`]: it stands on the primary.
//!
//! It narrows the window, it does not close it: a replica that acknowledged may still not be
//! the one promoted, and `WAIT` does not make Redis a consensus system (see
//! docs/deployments.md). Fencing tokens keep a stale holder's writes out either way.

use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::prelude::Value;
use fred::types::{ClusterHash, CustomCommand};

use crate::error::from_fred;
use crate::{LockError, LockKeys, Result};

/// A client's replica sync policy ([`None`](ReplicaSync::None) by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaSync {
    /// No waiting: a state change counts once the primary ran it.
    #[default]
    None,
    /// `WAIT replicas timeout` after each grant, renewal and release, and each change of a
    /// latch's count or a semaphore's number of permits.
    Replicas {
        /// How many replicas must acknowledge (at least 1).
        replicas: u32,
        /// How long the primary waits for them (above zero: `WAIT 0` would wait for ever).
        timeout: Duration,
    },
    /// `WAITAOF local replicas timeout` (Redis 7.2 and later) after each grant, renewal,
    /// release and change of a latch's count or a semaphore's number: the change is in the append-only file of the primary (`local`) and of
    /// `replicas` replicas.
    Aof {
        /// Whether the primary's own AOF must have it (needs `appendonly yes` there).
        local: bool,
        /// How many replicas' AOFs must have it.
        replicas: u32,
        /// How long the primary waits for them (above zero).
        timeout: Duration,
    },
}

/// What a state change reached, as the primary reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synced {
    /// Replicas that acknowledged it (for [`ReplicaSync::Aof`]: have it in their AOF).
    pub replicas: u32,
    /// For [`ReplicaSync::Aof`]: whether the primary's own AOF has it.
    pub local_aof: bool,
}

impl ReplicaSync {
    /// Whether the policy waits for anything.
    pub fn is_none(&self) -> bool {
        matches!(self, ReplicaSync::None)
    }

    /// Checks the settings: at least one copy asked for, and a timeout above zero and below
    /// `command_timeout` (the client must hear the answer before it gives up on it).
    pub fn validate(&self, command_timeout: Duration) -> Result<()> {
        let (copies, timeout) = match *self {
            ReplicaSync::None => return Ok(()),
            ReplicaSync::Replicas { replicas, timeout } => (replicas, timeout),
            ReplicaSync::Aof {
                local,
                replicas,
                timeout,
            } => (replicas + u32::from(local), timeout),
        };
        if copies == 0 {
            return Err(LockError::InvalidArgument(
                "replica sync asks for no copy: use ReplicaSync::None".into(),
            ));
        }
        if timeout.is_zero() || timeout >= command_timeout {
            return Err(LockError::InvalidArgument(format!(
                "replica sync timeout {timeout:?} must be above zero and below the command \
                 timeout {command_timeout:?}"
            )));
        }
        Ok(())
    }

    /// Whether `synced` meets the policy.
    fn met_by(&self, synced: Synced) -> bool {
        match *self {
            ReplicaSync::None => true,
            ReplicaSync::Replicas { replicas, .. } => synced.replicas >= replicas,
            ReplicaSync::Aof {
                local, replicas, ..
            } => synced.replicas >= replicas && (synced.local_aof || !local),
        }
    }

    /// How many replicas the policy asks for.
    pub fn replicas(&self) -> u32 {
        match *self {
            ReplicaSync::None => 0,
            ReplicaSync::Replicas { replicas, .. } | ReplicaSync::Aof { replicas, .. } => replicas,
        }
    }

    /// Waits until a state change of `keys` reached the replicas the policy asks for: sends
    /// `WAIT` (or `WAITAOF`) to the primary of `keys`' slot, which answers once the writes this
    /// client's connection to that primary made so far reached the replicas, or when the timeout
    /// ran out. `Ok(None)` for [`ReplicaSync::None`] (nothing is sent); what was reached, or
    /// [`LockError::NotReplicated`] when fewer replicas acknowledged in time.
    ///
    /// The command must follow the state change on the same connection (it waits for that
    /// connection's writes): fred keeps one connection per server, and routes this one by the
    /// lock's slot, as the script was. While it waits, the connection's later commands queue
    /// behind it: a replica that does not answer delays this client by up to the timeout.
    pub async fn require<C: ClientLike + Send + Sync>(
        &self,
        client: &C,
        keys: &LockKeys,
    ) -> Result<Option<Synced>> {
        match self.wait(client, keys).await? {
            Some(synced) if !self.met_by(synced) => Err(LockError::NotReplicated {
                name: keys.name().to_string(),
                replicas: synced.replicas,
                required: self.replicas(),
            }),
            synced => Ok(synced),
        }
    }

    /// `WAIT` or `WAITAOF`, and what the primary answered.
    async fn wait<C: ClientLike + Send + Sync>(
        &self,
        client: &C,
        keys: &LockKeys,
    ) -> Result<Option<Synced>> {
        let hash = ClusterHash::Custom(keys.slot());
        let (command, args): (_, Vec<Value>) = match *self {
            ReplicaSync::None => return Ok(None),
            ReplicaSync::Replicas { replicas, timeout } => (
                CustomCommand::new_static("WAIT", hash, false),
                vec![replicas.into(), millis(timeout).into()],
            ),
            ReplicaSync::Aof {
                local,
                replicas,
                timeout,
            } => (
                CustomCommand::new_static("WAITAOF", hash, false),
                vec![
                    i64::from(local).into(),
                    replicas.into(),
                    millis(timeout).into(),
                ],
            ),
        };
        let reply: Value = client
            .custom(command, args)
            .await
            .map_err(|e| from_fred(e, &[keys.hash()]))?;
        let count = |v: &Value| {
            v.as_i64()
                .map_or(0, |n| n.clamp(0, i64::from(u32::MAX)) as u32)
        };
        let synced = match (self, &reply) {
            (ReplicaSync::Aof { .. }, Value::Array(values)) if values.len() == 2 => Synced {
                local_aof: count(&values[0]) > 0,
                replicas: count(&values[1]),
            },
            (ReplicaSync::Replicas { .. }, value) if value.as_i64().is_some() => Synced {
                replicas: count(value),
                local_aof: false,
            },
            _ => {
                return Err(LockError::Redis(crate::RedisError::connection(format!(
                    "unexpected reply to WAIT: {reply:?}"
                ))))
            }
        };
        Ok(Some(synced))
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}
