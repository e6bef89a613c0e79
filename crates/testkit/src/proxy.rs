//! [`Proxy`]: a loopback TCP proxy that injects network faults between a client and Redis.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Result;

const BUF_SIZE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, Default)]
struct Control {
    latency: Duration,
    partitioned: bool,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    control: watch::Sender<Control>,
    /// Reply chunks still to swallow.
    drop_replies: AtomicUsize,
    /// Open connection pairs, by id; cancelling a token closes that pair.
    conns: Mutex<HashMap<u64, CancellationToken>>,
    next_id: AtomicU64,
}

impl Shared {
    /// Consumes one pending dropped reply, if any.
    fn take_drop_reply(&self) -> bool {
        self.drop_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    async fn wait_healed(&self) {
        let mut rx = self.control.subscribe();
        // The sender lives in `self`, so this cannot fail.
        let _ = rx.wait_for(|c| !c.partitioned).await;
    }
}

/// A TCP proxy on `127.0.0.1:<free port>` in front of an upstream (usually a
/// [`RedisServer`](crate::RedisServer)), with fault controls.
///
/// Needs a tokio runtime with the time driver enabled (e.g. `#[tokio::test]`):
/// [`start`](Self::start) is async and spawns one task for the listener and one per connection.
/// The controls are plain `&self` methods and take effect immediately for existing and new
/// connections. Dropping the proxy closes the listener and every connection.
///
/// Faults:
/// * [`set_latency`](Self::set_latency): delay every forwarded chunk, both directions.
/// * [`partition`](Self::partition) / [`heal`](Self::heal): while partitioned no byte flows in
///   either direction; bytes read meanwhile are *dropped* (not delivered later), connections
///   stay open (even an upstream close is not passed on until healed), and new connections
///   are accepted but not connected upstream until healed. A connection that lost bytes this
///   way is usually out of sync afterwards; clients should reconnect (see
///   [`close_all`](Self::close_all)).
/// * [`close_all`](Self::close_all): close every current client and upstream connection.
/// * [`drop_replies`](Self::drop_replies): the next `n` chunks coming back from upstream are
///   swallowed, and each connection that loses one is closed right away: "the server
///   executed the command, but the reply was lost and the connection died".
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl Proxy {
    /// Starts listening on `127.0.0.1:0`, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (control, _) = watch::channel(Control::default());
        let shared = Arc::new(Shared {
            upstream,
            control,
            drop_replies: AtomicUsize::new(0),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let shutdown = CancellationToken::new();
        tokio::spawn(accept_loop(listener, Arc::clone(&shared), shutdown.clone()));
        tracing::debug!(%addr, %upstream, "proxy started");
        Ok(Proxy {
            addr,
            shared,
            shutdown,
        })
    }

    /// The proxy's own address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:PORT`: point the client under test here.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// Where connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Delays every forwarded chunk by `latency`, in both directions (`Duration::ZERO` = none).
    pub fn set_latency(&self, latency: Duration) {
        self.shared.control.send_modify(|c| c.latency = latency);
    }

    /// The current added latency.
    pub fn latency(&self) -> Duration {
        self.shared.control.borrow().latency
    }

    /// Stops all traffic: bytes are dropped, connections stay open, see the type docs.
    pub fn partition(&self) {
        tracing::debug!(addr = %self.addr, "proxy partitioned");
        self.shared.control.send_modify(|c| c.partitioned = true);
    }

    /// Ends a [`partition`](Self::partition): traffic flows again.
    pub fn heal(&self) {
        tracing::debug!(addr = %self.addr, "proxy healed");
        self.shared.control.send_modify(|c| c.partitioned = false);
    }

    /// Whether the proxy is partitioned.
    pub fn is_partitioned(&self) -> bool {
        self.shared.control.borrow().partitioned
    }

    /// Closes every current connection (both the client and the upstream side). New
    /// connections are accepted as usual.
    pub fn close_all(&self) {
        let conns = self.shared.conns.lock();
        tracing::debug!(addr = %self.addr, n = conns.len(), "proxy closing all connections");
        for token in conns.values() {
            token.cancel();
        }
    }

    /// Swallows the next `n` reply chunks from upstream, closing each connection that loses
    /// one. Replaces any previous pending count.
    pub fn drop_replies(&self, n: usize) {
        self.shared.drop_replies.store(n, Ordering::SeqCst);
    }

    /// How many reply chunks are still to be swallowed.
    pub fn pending_drop_replies(&self) -> usize {
        self.shared.drop_replies.load(Ordering::SeqCst)
    }

    /// Number of currently open client connections (each with its upstream pair).
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let client = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok((client, _)) => client,
                Err(e) => {
                    // E.g. EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let token = shutdown.child_token();
        shared.conns.lock().insert(id, token.clone());
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _guard = ConnGuard {
                id,
                shared: Arc::clone(&shared),
            };
            tokio::select! {
                _ = token.cancelled() => {}
                r = handle(client, &shared) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "proxy connection ended with an error");
                    }
                }
            }
        });
    }
}

/// Deregisters a connection when its task ends (its sockets are dropped with the task).
struct ConnGuard {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared.conns.lock().remove(&self.id);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

async fn handle(client: TcpStream, shared: &Shared) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    let (mut client_rd, client_wr) = client.into_split();
    let mut buf = vec![0u8; BUF_SIZE];

    // Accepted during a partition: hold the client, discarding what it sends, until healed.
    // Bytes that arrive once healed are kept and forwarded.
    let mut pending = 0;
    let mut control = shared.control.subscribe();
    while control.borrow_and_update().partitioned {
        pending = 0;
        tokio::select! {
            r = control.changed() => {
                if r.is_err() {
                    return Ok(());
                }
            }
            r = client_rd.read(&mut buf) => {
                let n = r?;
                if n == 0 {
                    shared.wait_healed().await;
                    return Ok(());
                }
                if !shared.control.borrow().partitioned {
                    pending = n; // healed meanwhile: forward these
                }
            }
        }
    }

    let upstream = TcpStream::connect(shared.upstream).await?;
    let _ = upstream.set_nodelay(true);
    let (up_rd, mut up_wr) = upstream.into_split();
    if pending > 0 {
        up_wr.write_all(&buf[..pending]).await?;
    }

    // Either direction ending (EOF, error, dropped reply) closes the whole pair: Redis
    // clients never half-close.
    tokio::select! {
        r = pump(client_rd, up_wr, Direction::ToUpstream, shared, buf) => r,
        r = pump(up_rd, client_wr, Direction::ToClient, shared, vec![0u8; BUF_SIZE]) => r,
    }
}

async fn pump(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    dir: Direction,
    shared: &Shared,
    mut buf: Vec<u8>,
) -> io::Result<()> {
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) => {
                // Do not let a close cross a partition.
                shared.wait_healed().await;
                return Ok(());
            }
            Ok(n) => n,
            Err(e) => {
                shared.wait_healed().await;
                return Err(e);
            }
        };
        let latency = shared.control.borrow().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if shared.control.borrow().partitioned {
            continue; // dropped on the floor
        }
        if dir == Direction::ToClient && shared.take_drop_reply() {
            tracing::debug!(
                bytes = n,
                "proxy swallowed a reply and closes the connection"
            );
            return Ok(());
        }
        dst.write_all(&buf[..n]).await?;
    }
}
