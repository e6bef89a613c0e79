//! [`ReplicaPair`]: a primary and one replica of it, replicating through a [`Proxy`] that can cut
//! the link, for showing what a failover loses and what `WAIT` keeps.
//!
//! The link goes through a proxy because pausing the replica (SIGSTOP) is not enough: its
//! socket still buffers what the primary sends, and the replica reads it once resumed. A cut
//! proxy drops the bytes. The failover is done by hand ([`ReplicaPair::fail_over`]: the primary
//! killed, the replica promoted with `REPLICAOF NO ONE`), as Sentinel or Cluster would do it
//! without the election's seconds.

use std::time::Duration;

use tokio::time::Instant;

use crate::{Proxy, RedisServer, Result, TestkitError};

/// How long [`ReplicaPair::until_synced`] waits.
const SYNC_DEADLINE: Duration = Duration::from_secs(20);

/// A primary and a replica of it; dropping it stops both. Needs a tokio runtime (the proxy).
#[derive(Debug)]
pub struct ReplicaPair {
    primary: RedisServer,
    replica: RedisServer,
    /// The proxy the replica replicates through; `None` when it connects to the primary itself
    /// ([`start_direct`](ReplicaPair::start_direct)).
    link: Option<Proxy>,
}

impl ReplicaPair {
    /// Starts both on free ports and waits until they are in sync ([`until_synced`]).
    ///
    /// [`until_synced`]: ReplicaPair::until_synced
    pub async fn start() -> Result<ReplicaPair> {
        ReplicaPair::start_linked(true).await
    }

    /// As [`start`](ReplicaPair::start), with the replica connected to the primary itself: no
    /// proxy hop on the replication path, for measuring what `WAIT` costs. The link cannot be
    /// cut ([`cut`](ReplicaPair::cut) says so).
    pub async fn start_direct() -> Result<ReplicaPair> {
        ReplicaPair::start_linked(false).await
    }

    async fn start_linked(through_proxy: bool) -> Result<ReplicaPair> {
        // A full sync at once, not after the 5 s Redis 7 waits for more replicas to share a
        // diskless transfer.
        let primary = RedisServer::builder()
            .args(["--repl-diskless-sync-delay", "0"])
            .start()?;
        let link = match through_proxy {
            true => Some(Proxy::start(primary.addr()).await?),
            false => None,
        };
        let port = link.as_ref().map_or(primary.port(), Proxy::port);
        let replica = RedisServer::builder()
            .args(["--replicaof", "127.0.0.1", &port.to_string()])
            .start()?;
        let pair = ReplicaPair {
            primary,
            replica,
            link,
        };
        pair.until_synced().await?;
        Ok(pair)
    }

    /// The primary (until [`fail_over`](ReplicaPair::fail_over) kills it).
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The replica (the primary after [`fail_over`](ReplicaPair::fail_over)).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Waits until the replica's link is up and the primary has seen it acknowledge everything
    /// written so far, a marker write included: what `WAIT` counts. Equal offsets alone are not
    /// enough: right after a full sync Redis holds the stream back until the replica's first
    /// acknowledgement, and a `WAIT` then counts no replica (seen about 3 runs in 100).
    pub async fn until_synced(&self) -> Result<()> {
        self.until_synced_by(Instant::now() + SYNC_DEADLINE).await
    }

    /// As [`until_synced`](Self::until_synced), failing at `deadline`.
    async fn until_synced_by(&self, deadline: Instant) -> Result<()> {
        self.primary
            .command(&["SET", "leasehold-testkit:replicated", "1", "PX", "60000"])?;
        loop {
            let replica = self.replica.info("replication")?;
            let primary = self.primary.info("replication")?;
            let written: Option<u64> =
                field(&primary, "master_repl_offset:").and_then(|v| v.parse().ok());
            // slave0:ip=127.0.0.1,port=P,state=online,offset=N,lag=0
            let acked: Option<u64> = field(&primary, "slave0:").and_then(|v| {
                let offset = v
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("offset="))
                    .and_then(|o| o.parse().ok());
                offset.filter(|_| v.contains("state=online"))
            });
            if replica.contains("master_link_status:up") && written.is_some() && acked >= written {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout(format!(
                    "the replica did not sync within {SYNC_DEADLINE:?}: {replica}\n{primary}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Cuts the replication link: what the primary writes from now on never reaches the
    /// replica (dropped, not buffered).
    pub fn cut(&self) -> Result<()> {
        self.link()?.partition();
        Ok(())
    }

    fn link(&self) -> Result<&Proxy> {
        self.link.as_ref().ok_or_else(|| {
            TestkitError::Unsupported("the pair was started direct: its link cannot be cut".into())
        })
    }

    /// Restores the link; the replica reconnects and catches up from the primary's backlog.
    /// Returns once they are in sync again.
    pub async fn restore(&self) -> Result<()> {
        let link = self.link()?;
        link.heal();
        // Bytes were dropped: the stream is out of step until the replica reconnects. A
        // replication connection can stay out of step after that too (seen on a loaded
        // machine: the replica reading the primary's stream without applying it, and never
        // acknowledging), and a replica does not give up on it before its `repl-timeout`: each
        // round that does not catch up within a few seconds closes the connections again.
        let deadline = Instant::now() + SYNC_DEADLINE;
        loop {
            link.close_all();
            let round = (Instant::now() + Duration::from_secs(4)).min(deadline);
            match self.until_synced_by(round).await {
                Err(_) if Instant::now() < deadline => continue,
                done => return done,
            }
        }
    }

    /// Kills the primary and promotes the replica, as a failover would.
    pub fn fail_over(&self) -> Result<()> {
        self.primary.kill()?;
        self.replica.command(&["REPLICAOF", "NO", "ONE"])?;
        Ok(())
    }
}

/// The value of `field` (a `name:` prefix) in an `INFO` text.
fn field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
}
