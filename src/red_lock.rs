//! [`RedLock`]: one lock over several independent Redis servers, held while a majority of them
//! grants it (the Redlock algorithm), on the plain lock of each server.
//!
//! # Implementation details
//! A [`QuorumLock`] is one [`Lock`] handle per server. One **round** tries every server's lock
//! at once, each within the per-server timeout (a one-try acquire, so no server keeps a line
//! entry or a grant for us: see docs/red-lock.md for why):
//!
//! - granted on a quorum (N/2+1) with validity left (`lease - elapsed - drift`): the members
//!   that granted are the [`QuorumGuard`]. The round waits for the other servers no longer than
//!   it has taken so far, so a slow server costs at most twice the quorum's time;
//! - otherwise whatever was granted is released before the round returns (a partial grant
//!   must not block the other contenders), and the round says how long the lock stays busy at
//!   most and whether enough servers answered.
//!
//! A wait repeats rounds: each server's release channel is subscribed (through that client's
//! release notifier, as any waiter of the plain lock is), and the waiter sleeps until a release
//! message from any server, or until the shortest remaining lease among the busy servers (a
//! holder that crashed publishes nothing), when a quorum of servers answered busy (someone may
//! hold the lock). Busy on fewer than a quorum means nobody holds it: the votes split between
//! contenders, and the round sleeps a random time before the next one, so that the contenders
//! do not split again in step.
//!
//! Each member is an ordinary hold of its client: renewed by that client's watchdog, fenced by
//! that server's counter, lost when that server says so. The quorum guard is held while a
//! quorum of its members is.

use std::fmt;
use std::hash::BuildHasher;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use leasehold_core::{FencingToken, Lease, LockError, Result};
use leasehold_pubsub::Place;
use tokio::time::Instant;

use crate::wait::Tried;
use crate::{Lock, LockClient, LockGuard};

/// How long one server may take to answer one try, by default: a server that does not answer
/// by then counts as not granting. Small against the lease (the Redlock paper's advice: a few
/// milliseconds to tens of them for leases of seconds), large against a round trip. Example:
/// [`RedLock::server_timeout`]'s.
pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(100);

/// One lock over N **independent** Redis servers (no replication between them): held while a
/// majority (N/2+1) of the servers grants it, so it survives the loss of up to (N-1)/2 servers
/// (the Redlock algorithm; Redisson's `RedissonRedLock`).
///
/// Build it once from one [`LockClient`] per server, then take named locks from it:
///
/// ```no_run
/// # async fn run() -> leasehold::Result<()> {
/// use leasehold::{LockClient, RedLock};
/// let servers = RedLock::new([
///     LockClient::connect("redis://redis-a:6379").await?,
///     LockClient::connect("redis://redis-b:6379").await?,
///     LockClient::connect("redis://redis-c:6379").await?,
/// ])?;
/// let lock = servers.lock("nightly-report")?;
/// assert_eq!((lock.name(), lock.quorum(), lock.locks().len()), ("nightly-report", 2, 3));
/// if let Some(guard) = lock.try_lock().await? {
///     // ... run the report; fence its writes with guard.fencing_token() ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
///
/// (`examples/red_lock.rs` runs this on five local servers, killing two of them.)
///
/// What it guarantees, and what it does not (clock jumps, process pauses, a server restarted
/// without its data), is in `docs/red-lock.md`: with RedLock, as with any lease, the fencing
/// token ([`QuorumGuard::fencing_token`]) checked by the store is what keeps a stale holder
/// out.
#[derive(Clone)]
pub struct RedLock {
    /// In canonical order (by server name): a server's index names it in fencing tokens.
    clients: Vec<LockClient>,
    /// The servers' names, in the same order.
    names: Vec<String>,
    server_timeout: Duration,
}

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field("servers", &self.names)
            .field("quorum", &self.quorum())
            .field("server_timeout", &self.server_timeout)
            .finish()
    }
}

/// The server a client talks to, as configured: `host:port` (no credentials).
fn address_of(client: &LockClient) -> String {
    use fred::interfaces::ClientLike;
    use fred::types::config::ServerConfig;
    match &client.redis().client_config().server {
        ServerConfig::Centralized { server } => format!("{}:{}", server.host, server.port),
        other => format!("{other:?}"),
    }
}

impl RedLock {
    /// A quorum lock over the servers of `clients`, one client per independent server, each
    /// server named by its address as configured (`host:port`).
    ///
    /// The servers are numbered by name, whatever order they are listed in, and the numbers
    /// name the servers in a [`QuorumToken`]. So every process must reach each server under
    /// the same address; where processes use different addresses for one server (different
    /// DNS names, a proxy per process), name the servers with [`RedLock::named`] instead.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for no clients, or two clients of the same server (its
    /// vote would count twice).
    pub fn new(clients: impl IntoIterator<Item = LockClient>) -> Result<RedLock> {
        RedLock::named(clients.into_iter().map(|c| (address_of(&c), c)))
    }

    /// A quorum lock over named servers: `(name, client)` pairs, one per independent server.
    /// The servers are numbered by name (the numbers name them in a [`QuorumToken`]), so every
    /// process that names the servers alike numbers them alike, whatever addresses it reaches
    /// them by.
    ///
    /// ```no_run
    /// # async fn run() -> leasehold::Result<()> {
    /// use leasehold::{LockClient, RedLock};
    /// let servers = RedLock::named([
    ///     ("a", LockClient::connect("redis://10.0.0.1:6379").await?),
    ///     ("b", LockClient::connect("redis://10.0.1.1:6379").await?),
    ///     ("c", LockClient::connect("redis://10.0.2.1:6379").await?),
    /// ])?;
    /// assert_eq!(servers.server_names(), ["a", "b", "c"]);
    /// assert_eq!(servers.quorum(), 2); // any two of the three
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for no servers, one name twice, or two clients of the
    /// same address (its vote would count twice).
    pub fn named<N: Into<String>>(
        servers: impl IntoIterator<Item = (N, LockClient)>,
    ) -> Result<RedLock> {
        let mut named: Vec<(String, LockClient)> = servers
            .into_iter()
            .map(|(name, client)| (name.into(), client))
            .collect();
        if named.is_empty() {
            return Err(LockError::InvalidArgument(
                "a RedLock needs at least one server".into(),
            ));
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = named.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(LockError::InvalidArgument(format!(
                "two servers of one RedLock are named {:?}: a RedLock needs independent \
                 servers, each named once",
                pair[0].0
            )));
        }
        let mut addresses: Vec<String> = named.iter().map(|(_, c)| address_of(c)).collect();
        addresses.sort();
        if let Some(pair) = addresses.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(LockError::InvalidArgument(format!(
                "two clients of one RedLock talk to the same server {}: its vote would count \
                 twice (a RedLock needs independent servers)",
                pair[0]
            )));
        }
        let (names, clients) = named.into_iter().unzip();
        Ok(RedLock {
            clients,
            names,
            server_timeout: DEFAULT_SERVER_TIMEOUT,
        })
    }

    /// Sets how long one server may take to answer one try (default
    /// [`DEFAULT_SERVER_TIMEOUT`]): a dead or paused server then costs a round this much at
    /// most. Keep it well under the lease.
    ///
    /// ```no_run
    /// # async fn run(servers: leasehold::RedLock) -> leasehold::Result<()> {
    /// use leasehold::DEFAULT_SERVER_TIMEOUT;
    /// // Servers in other regions, up to 150 ms away: 300 ms a try, still well under the lease.
    /// let servers = servers.server_timeout(DEFAULT_SERVER_TIMEOUT * 3)?;
    /// # let _ = servers; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for zero.
    pub fn server_timeout(mut self, timeout: Duration) -> Result<RedLock> {
        if timeout.is_zero() {
            return Err(LockError::InvalidArgument(
                "the per-server timeout must be positive".into(),
            ));
        }
        self.server_timeout = timeout;
        Ok(self)
    }

    /// How many servers must grant: N/2+1. Example: [`RedLock::named`]'s.
    pub fn quorum(&self) -> usize {
        self.clients.len() / 2 + 1
    }

    /// The servers' names, in canonical order: index `i` is server `i` of a [`QuorumToken`].
    pub fn server_names(&self) -> &[String] {
        &self.names
    }

    /// The clients, in canonical order: index `i` is server `i` of a [`QuorumToken`].
    pub fn clients(&self) -> &[LockClient] {
        &self.clients
    }

    /// A handle on the lock `name` over every server. Nothing is sent until you acquire.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a name the plain lock refuses.
    pub fn lock(&self, name: &str) -> Result<QuorumLock> {
        let locks = self
            .clients
            .iter()
            .map(|client| client.lock(name))
            .collect::<Result<Vec<Lock>>>()?;
        Ok(QuorumLock {
            name: name.to_string(),
            locks,
            server_timeout: self.server_timeout,
        })
    }
}

/// A handle on one named lock of a [`RedLock`]: one plain [`Lock`] per server. Cheap to clone.
///
/// Re-entrant as the plain lock is (per owner on each server: by default the current task).
#[derive(Clone)]
pub struct QuorumLock {
    name: String,
    /// One per server, in the RedLock's canonical order.
    locks: Vec<Lock>,
    server_timeout: Duration,
}

impl fmt::Debug for QuorumLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuorumLock")
            .field("name", &self.name)
            .field("servers", &self.locks.len())
            .field("quorum", &self.quorum())
            .finish()
    }
}

/// What one round answered when it did not grant.
struct Refused {
    /// How long the lock stays busy at most, on the busy server that frees first.
    busy_for: Option<Duration>,
    /// The servers that answered busy.
    busy: Vec<usize>,
    /// How long the round took.
    took: Duration,
    /// How many servers answered (granted or busy).
    answered: usize,
    /// The last server error, if any.
    last_error: Option<LockError>,
}

/// Every waiter of any quorum lock joins its servers' lines under this lock, so that two
/// waiters of one name in this process stand in the same order on every server (in different
/// orders each would head one line and wait for the other's).
static JOINING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl QuorumLock {
    /// The lock name. Example: [`RedLock`]'s.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many servers must grant: N/2+1. Example: [`RedLock`]'s.
    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    /// The per-server handles, in the RedLock's canonical order. Example: [`RedLock`]'s.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// One try of every server (no waiting): the quorum guard, or `None` when the lock is
    /// held elsewhere (what some servers granted is released before this returns). Watched
    /// lease: each member is renewed by its client's watchdog.
    ///
    /// # Errors
    /// [`LockError::QuorumUnreachable`] when fewer than a quorum of servers answered within the
    /// per-server timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: tries in flight are undone and members taken are released, in the
    /// background.
    pub async fn try_lock(&self) -> Result<Option<QuorumGuard<'_>>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// As [`QuorumLock::try_lock`], with an explicit lease on every server (no renewal): the
    /// guard is valid for at most `lease` minus the round's time minus the drift allowance.
    ///
    /// # Cancel safety
    /// As [`QuorumLock::try_lock`].
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<QuorumGuard<'_>>> {
        self.acquire(Some(Duration::ZERO), Some(lease)).await
    }

    /// Waits until a quorum grants; watched lease. Woken by a release message from any server,
    /// or when the shortest lease among the busy servers could end. While fewer than a quorum
    /// of servers answer, tries again with backoff (10 ms doubling to 1 s): wrap in
    /// `tokio::time::timeout` or use [`QuorumLock::try_lock_for`] to bound the wait.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no member held (tries in flight are undone,
    /// members taken are released in the background) and no place in any line.
    pub async fn lock(&self) -> Result<QuorumGuard<'_>> {
        let guard = self.acquire(None, None).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// As [`QuorumLock::lock`], with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`QuorumLock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<QuorumGuard<'_>> {
        let guard = self.acquire(None, Some(lease)).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// Waits at most `wait`; `Ok(None)` when the lock was still held elsewhere at the end.
    ///
    /// # Errors
    /// [`LockError::QuorumUnreachable`] when the last round before the deadline could not
    /// reach a quorum of servers.
    ///
    /// # Cancel safety
    /// As [`QuorumLock::lock`].
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<QuorumGuard<'_>>> {
        self.acquire(Some(wait), None).await
    }

    /// As [`QuorumLock::try_lock_for`], with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`QuorumLock::lock`].
    pub async fn try_lock_for_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<QuorumGuard<'_>>> {
        self.acquire(Some(wait), Some(lease)).await
    }

    /// Acquires within `wait` (`None`: no limit; zero: one round) with `lease` (`None`:
    /// watched).
    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<QuorumGuard<'_>>> {
        if let Some(lease) = lease {
            Lease::new(lease)?;
        }
        let deadline = wait.map(|w| Instant::now() + w.min(leasehold_core::MAX_LEASE));
        if wait == Some(Duration::ZERO) {
            return match self.round(lease).await {
                Ok(guard) => Ok(Some(guard)),
                Err(refused) => self.refusal(refused),
            };
        }
        // A place in every server's local line: only the head of each talks to Redis, and the
        // head is the one woken by that server's release messages.
        let places: Vec<Place> = {
            let _joining = JOINING.lock();
            self.locks
                .iter()
                .map(|lock| lock.client().notifier.join(lock.keys().released()))
                .collect()
        };
        for place in &places {
            if !place.until_head(deadline).await {
                return Ok(None);
            }
        }
        let mut backoff = Duration::from_millis(10);
        // Set once a member's client wakes by timer (no pub/sub there): its delays then cap
        // the wait for a release, as a single lock's waiter's.
        let mut timer = None;
        loop {
            let last = deadline.is_some_and(|d| d <= Instant::now());
            let refused = match self.round(lease).await {
                Ok(guard) => return Ok(Some(guard)),
                Err(refused) => refused,
            };
            if last || deadline.is_some_and(|d| d <= Instant::now()) {
                return self.refusal(refused);
            }
            // Subscribed only once there is something to wait for (most locks are free). A
            // release published before a subscription reached nobody: try again at once.
            if self.subscribe(&places).await {
                continue;
            }
            let reachable = refused.answered >= self.quorum();
            // Busy on a quorum: someone may hold the lock, so wait for its release. Busy on
            // fewer: nobody holds a quorum, the votes split between contenders (or a quorum
            // came too late), and they must not meet again in step.
            let held = refused.busy.len() >= self.quorum();
            let sleep = if !reachable {
                let pause = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                pause
            } else if held {
                backoff = Duration::from_millis(10);
                // +1 ms: PTTL rounds down. No bound known: look again every second.
                let bound = refused
                    .busy_for
                    .map_or(Duration::from_secs(1), |t| t + Duration::from_millis(1));
                if timer.is_none() {
                    timer = self
                        .locks
                        .iter()
                        .find(|lock| lock.client().waking.by_timer())
                        .map(|lock| lock.client().waking.delays());
                }
                timer
                    .as_mut()
                    .map_or(bound, |timer| timer.next().min(bound))
            } else {
                jitter(refused.took)
            };
            let wake_at =
                deadline.map_or(Instant::now() + sleep, |d| d.min(Instant::now() + sleep));
            if !(reachable && held) {
                tokio::time::sleep_until(wake_at).await;
            } else {
                // Only the busy servers' messages: the others carry this waiter's own releases
                // of what it took (waking on them would retry at once, again and again).
                let woken = refused.busy.iter().map(|&i| Box::pin(places[i].woken()));
                tokio::select! {
                    _ = futures::future::select_all(woken) => {}
                    _ = tokio::time::sleep_until(wake_at) => {}
                }
            }
        }
    }

    /// What a refused last round means for the caller: busy (`None`), or the error when a
    /// quorum of servers did not answer.
    fn refusal(&self, refused: Refused) -> Result<Option<QuorumGuard<'_>>> {
        if refused.answered >= self.quorum() {
            return Ok(None);
        }
        Err(LockError::QuorumUnreachable {
            name: self.name.clone(),
            answered: refused.answered,
            needed: self.quorum(),
            servers: self.locks.len(),
            last: Box::new(refused.last_error.unwrap_or(LockError::Timeout)),
        })
    }

    /// Subscribes every server's release channel not subscribed yet, each within the
    /// per-server timeout (a server that fails is tried again after the next round; its
    /// releases are then caught by the timer). True when some channel was newly subscribed.
    async fn subscribe(&self, places: &[Place]) -> bool {
        let pending = places
            .iter()
            .zip(&self.locks)
            .filter(|(place, lock)| !place.is_subscribed() && !lock.client().waking.by_timer());
        let subscribes = pending.map(|(place, lock)| async move {
            match tokio::time::timeout(self.server_timeout, place.subscribe()).await {
                Ok(Ok(())) => true,
                Ok(Err(error)) => {
                    // A refusal turns a `Waking::Auto` client to the timer.
                    lock.client().waking.subscribe_refused(&error);
                    tracing::debug!(lock = %self.name, %error, "subscribe failed; the timer stands in");
                    false
                }
                Err(_) => false,
            }
        });
        futures::future::join_all(subscribes)
            .await
            .into_iter()
            .any(|subscribed| subscribed)
    }

    /// One try of every server at once, each within the per-server timeout. See the module
    /// docs.
    async fn round(
        &self,
        lease: Option<Duration>,
    ) -> std::result::Result<QuorumGuard<'_>, Refused> {
        let started = Instant::now();
        let quorum = self.quorum();
        let mut tries: FuturesUnordered<_> = self
            .locks
            .iter()
            .enumerate()
            .map(|(server, lock)| async move {
                // Boxed: an acquire future is large, and the set moves its futures around.
                let tried = tokio::time::timeout(
                    self.server_timeout,
                    Box::pin(lock.acquire_tried(Some(Duration::ZERO), lease)),
                )
                .await
                .unwrap_or(Err(LockError::Timeout));
                (server, tried)
            })
            .collect();
        let mut members: Vec<(usize, LockGuard<'_>)> = Vec::with_capacity(self.locks.len());
        let (mut busy, mut busy_for, mut last_error) = (Vec::new(), None::<Duration>, None);
        // Once a quorum granted: the others may answer until then.
        let mut stragglers_until = None;
        loop {
            let next = match stragglers_until {
                Some(until) => match tokio::time::timeout_at(until, tries.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => tries.next().await,
            };
            let Some((server, tried)) = next else { break };
            match tried {
                Ok(Tried::Granted(guard)) => members.push((server, guard)),
                Ok(Tried::Busy(for_at_most)) => {
                    busy.push(server);
                    if let Some(t) = for_at_most {
                        busy_for = Some(busy_for.map_or(t, |b: Duration| b.min(t)));
                    }
                }
                Err(error) => {
                    tracing::debug!(lock = %self.name, server, %error, "a server did not grant");
                    last_error = Some(error);
                }
            }
            if members.len() >= quorum && stragglers_until.is_none() {
                stragglers_until = Some(Instant::now() + started.elapsed());
            }
            if members.len() + tries.len() < quorum {
                // No quorum whatever the others answer.
                break;
            }
        }
        // Tries still in flight are undone in the background (the plain lock's cancel safety).
        drop(tries);
        let took = started.elapsed();
        let answered = members.len() + busy.len();
        if members.len() >= quorum {
            let explicit = lease.is_some();
            let lease = match lease {
                Some(lease) => Lease::new(lease).expect("checked by the caller"),
                // Watched: the shortest watchdog lease among the members' clients.
                None => members
                    .iter()
                    .map(|(server, _)| self.locks[*server].client().holds.lease())
                    .min_by_key(|lease| lease.duration())
                    .expect("a quorum is at least one member"),
            };
            let valid_until = started + lease.duration().saturating_sub(lease.drift());
            if valid_until > Instant::now() {
                members.sort_by_key(|(server, _)| *server);
                return Ok(QuorumGuard {
                    lock: self,
                    members,
                    fixed_until: explicit.then_some(valid_until),
                });
            }
            tracing::debug!(
                lock = %self.name,
                took_ms = took.as_millis() as u64,
                "a quorum granted with no validity left; releasing it"
            );
        }
        self.release(members.into_iter().map(|(_, guard)| guard))
            .await;
        Err(Refused {
            busy_for,
            busy,
            took,
            answered,
            last_error,
        })
    }

    /// Releases `members` at once, each within the per-server timeout (one that does not
    /// answer in time is released in the background when its guard drops).
    async fn release<'a>(&self, members: impl Iterator<Item = LockGuard<'a>>) -> Vec<Result<()>> {
        crate::guard::unlock_all_within(members, self.server_timeout).await
    }
}

/// A random pause after a split vote: up to three times the round's time, plus 1 ms.
fn jitter(round: Duration) -> Duration {
    let span = (round * 3 + Duration::from_millis(1)).as_micros() as u64;
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    Duration::from_micros(random % span.max(1))
}

/// A [`QuorumLock`] held: the members that granted, at least a quorum. Dropping it releases
/// them all (in the background).
pub struct QuorumGuard<'a> {
    lock: &'a QuorumLock,
    /// By server index.
    members: Vec<(usize, LockGuard<'a>)>,
    /// For an explicit lease: the round's start + lease - drift, the Redlock validity.
    fixed_until: Option<Instant>,
}

impl fmt::Debug for QuorumGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuorumGuard")
            .field("name", &self.lock.name)
            .field("servers", &self.lock.locks.len())
            .field("quorum", &self.lock.quorum())
            .field("members", &self.members.len())
            .finish()
    }
}

impl<'a> QuorumGuard<'a> {
    /// The lock name. Example: [`members`](QuorumGuard::members)'s.
    pub fn name(&self) -> &str {
        &self.lock.name
    }

    /// The members' guards with their server's index, by index: the servers that granted,
    /// each with its own hold and fencing token.
    ///
    /// ```no_run
    /// # async fn run(servers: leasehold::RedLock) -> leasehold::Result<()> {
    /// let lock = servers.lock("nightly-report")?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.name(), "nightly-report");
    /// for (server, member) in guard.members() {
    ///     let name = &servers.server_names()[server];
    ///     println!("{name} granted, token {}", member.fencing_token());
    /// }
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn members(&self) -> impl Iterator<Item = (usize, &LockGuard<'a>)> {
        self.members.iter().map(|(server, guard)| (*server, guard))
    }

    /// How many members are still certainly valid.
    fn held_members(&self) -> usize {
        self.members.iter().filter(|(_, g)| g.is_held()).count()
    }

    /// Whether a quorum of members is still certainly valid (and, for an explicit lease, the
    /// Redlock validity has not run out). `false` is final for this guard. Example:
    /// [`lost`](QuorumGuard::lost)'s.
    pub fn is_held(&self) -> bool {
        self.fixed_until.is_none_or(|until| Instant::now() < until)
            && self.held_members() >= self.lock.quorum()
    }

    /// The instant until which a quorum of members is certainly valid, unless renewed
    /// further: the quorum-th latest member deadline (for an explicit lease, no later than the
    /// round's start + lease - drift). Example: [`lost`](QuorumGuard::lost)'s.
    pub fn valid_until(&self) -> Instant {
        let mut untils: Vec<Instant> = self
            .members
            .iter()
            .filter(|(_, g)| g.is_held())
            .map(|(_, g)| g.valid_until())
            .collect();
        untils.sort_unstable_by(|a, b| b.cmp(a));
        let quorum_until = untils
            .get(self.lock.quorum() - 1)
            .copied()
            .unwrap_or_else(Instant::now);
        self.fixed_until
            .map_or(quorum_until, |until| until.min(quorum_until))
    }

    /// Completes as soon as fewer than a quorum of members is valid (or an explicit lease's
    /// validity ran out).
    ///
    /// ```no_run
    /// # async fn run(servers: leasehold::RedLock) -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// let lock = servers.lock("nightly-report")?;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// assert!(guard.is_held());
    /// let left = guard.valid_until().saturating_duration_since(Instant::now());
    /// println!("certainly held {left:?} more");
    /// guard.lost().await; // the validity ran out, or a quorum of members was lost
    /// assert!(!guard.is_held());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        let validity = async {
            match self.fixed_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        let members = async {
            loop {
                let held: Vec<_> = self
                    .members
                    .iter()
                    .filter(|(_, g)| g.is_held())
                    .map(|(_, g)| Box::pin(g.lost()))
                    .collect();
                if held.len() < self.lock.quorum() {
                    return;
                }
                futures::future::select_all(held).await;
            }
        };
        tokio::select! {
            _ = validity => {}
            _ = members => {}
        }
    }

    /// Runs `work` while the quorum is held: its output, or [`LockError::LeaseLost`] as soon
    /// as the quorum is lost.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work`.
    pub async fn run_while_held<F: std::future::Future>(&self, work: F) -> Result<F::Output> {
        let lost = || LockError::LeaseLost {
            name: self.lock.name.clone(),
        };
        if !self.is_held() {
            return Err(lost());
        }
        tokio::select! {
            biased;
            _ = self.lost() => Err(lost()),
            output = work => Ok(output),
        }
    }

    /// The grant's fencing token: each member server's own token. See [`QuorumToken`] for how
    /// a store uses it.
    pub fn fencing_token(&self) -> QuorumToken {
        let mut tokens = vec![None; self.lock.locks.len()];
        for (server, guard) in &self.members {
            tokens[*server] = Some(guard.fencing_token());
        }
        QuorumToken { tokens }
    }

    /// Releases every member at once, each within the per-server timeout. `Ok` when a quorum
    /// of them was released; otherwise the first error (e.g. [`LockError::NotHeld`] when the
    /// quorum's leases had ended, [`LockError::Timeout`] for a server that did not answer: its
    /// member is released in the background, or ends with its lease).
    ///
    /// # Cancel safety
    /// Cancel safe: the releases not answered yet happen in the background when their guards
    /// drop.
    pub async fn unlock(self) -> Result<()> {
        let lock = self.lock;
        let results = lock
            .release(self.members.into_iter().map(|(_, guard)| guard))
            .await;
        let released = results.iter().filter(|r| r.is_ok()).count();
        if released >= lock.quorum() {
            return Ok(());
        }
        let first_error = results.into_iter().find_map(Result::err);
        Err(first_error.unwrap_or(LockError::LeaseLost {
            name: lock.name.clone(),
        }))
    }
}

/// The fencing token of a [`QuorumGuard`]: one token per server that granted (`None` where a
/// server did not).
///
/// No single number is safe to fence with: the servers count independently, so the largest
/// token of a later grant can be smaller than an earlier grant's. But any two quorums share a
/// server, and on a shared server the later grant's token is the larger. So a store keeps the
/// latest token it accepted per server ([`QuorumToken::merged`]) and refuses a write whose
/// token is lower on any server both name ([`QuorumToken::is_older_than`]): once a write of a
/// grant was accepted, every write of an earlier grant is refused. docs/red-lock.md shows the
/// check in SQL.
///
/// ```
/// use leasehold::{FencingToken, QuorumToken};
/// let t = |v: &[Option<u64>]| QuorumToken::from_tokens(v.iter().map(|x| x.map(FencingToken::new)));
/// let earlier = t(&[Some(7), Some(900), Some(3), None, None]);
/// let later = t(&[Some(8), None, None, Some(40), Some(5)]); // shares server 0 with `earlier`
/// assert!(earlier.is_older_than(&later));
/// assert!(!later.is_older_than(&earlier));
/// let stored = earlier.merged(&later);
/// assert!(earlier.is_older_than(&stored));
/// assert!(!later.is_older_than(&stored));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QuorumToken {
    tokens: Vec<Option<FencingToken>>,
}

impl QuorumToken {
    /// A token from each server's (`None`: that server did not grant), by server index: for a
    /// store that kept one and reads it back.
    ///
    /// ```
    /// use leasehold::{FencingToken, QuorumToken};
    /// let t = FencingToken::new;
    /// // Read back from the store's columns, one per server (NULL: that server did not grant).
    /// let stored = QuorumToken::from_tokens([Some(t(7)), None, Some(t(3))]);
    /// assert_eq!(stored.get(0), Some(t(7)));
    /// assert_eq!(stored.get(1), None);
    /// assert_eq!(stored.tokens().len(), 3);
    /// ```
    pub fn from_tokens(tokens: impl IntoIterator<Item = Option<FencingToken>>) -> QuorumToken {
        QuorumToken {
            tokens: tokens.into_iter().collect(),
        }
    }

    /// Server `server`'s token, if it granted. Example:
    /// [`from_tokens`](QuorumToken::from_tokens)'s.
    pub fn get(&self, server: usize) -> Option<FencingToken> {
        self.tokens.get(server).copied().flatten()
    }

    /// Every server's token, by index (`None`: did not grant). Example:
    /// [`from_tokens`](QuorumToken::from_tokens)'s.
    pub fn tokens(&self) -> &[Option<FencingToken>] {
        &self.tokens
    }

    /// Whether a write fenced with this token must be refused by a store whose latest accepted
    /// token is `latest`: on some server that both name, this token is lower.
    ///
    /// ```
    /// use leasehold::{FencingToken, QuorumToken};
    /// let t = |v: [Option<u64>; 3]| QuorumToken::from_tokens(v.map(|x| x.map(FencingToken::new)));
    /// let latest = t([Some(8), Some(40), None]); // the store accepted a write of this grant
    /// assert!(t([Some(7), None, Some(900)]).is_older_than(&latest)); // lower on server 0: stale
    /// assert!(!t([None, Some(41), Some(5)]).is_older_than(&latest)); // a later grant
    /// ```
    pub fn is_older_than(&self, latest: &QuorumToken) -> bool {
        self.tokens
            .iter()
            .zip(&latest.tokens)
            .any(|(mine, theirs)| matches!((mine, theirs), (Some(m), Some(t)) if m < t))
    }

    /// The per-server maximum of the two: what a store keeps after accepting a write, so that
    /// it refuses the writes of every grant before either.
    ///
    /// ```
    /// use leasehold::{FencingToken, QuorumToken};
    /// let t = |v: [Option<u64>; 3]| QuorumToken::from_tokens(v.map(|x| x.map(FencingToken::new)));
    /// let stored = t([Some(8), Some(40), None]);
    /// let accepted = t([None, Some(41), Some(5)]); // a write fenced with this one went in
    /// assert_eq!(stored.merged(&accepted), t([Some(8), Some(41), Some(5)]));
    /// ```
    pub fn merged(&self, other: &QuorumToken) -> QuorumToken {
        let len = self.tokens.len().max(other.tokens.len());
        let tokens = (0..len)
            .map(|i| match (self.get(i), other.get(i)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            })
            .collect();
        QuorumToken { tokens }
    }
}
