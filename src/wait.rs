//! The waiting engine: how any kind of lock waits, whatever its scripts.
//!
//! # Implementation details
//! Waiters of one client on one lock form a local FIFO queue ([`Place`]); only its head talks
//! to Redis, so a task that releases and asks again at once lines up behind its client's
//! earlier waiters. The head repeats three steps:
//!
//! 1. **Try** ([`Attempt::attempt`]). Granted: done. Otherwise the reply says how long the
//!    lock stays busy at most (the holder's remaining lease, or a turn reservation's).
//! 2. **Register interest** in the lock's release channel *before the next try*, so a release
//!    between a failed try and the wait is not missed (the `Notify::enable` rule). Interest is
//!    free when the channel is already subscribed (another waiter, or a lingering
//!    subscription): then the first try is already a waiter's try, which also queues the
//!    client for its turn. Otherwise the first try goes out alone (most locks are free) and the
//!    subscriber is opened only when there is something to wait for.
//! 3. **Sleep** until a wake-up (a release message: the lock is free or it is this client's
//!    turn; or a message may have been lost), or until the busy time from step 1 runs out (a
//!    holder that crashed publishes nothing; a reserved turn nobody takes lapses), or until the
//!    caller's deadline; then try again.
//!
//! The invariant this keeps: a head never sleeps past the moment the lock could have become
//! free without telling it, whatever message it missed, because every "busy" reply carries a
//! bound. Transient errors are retried with backoff until the deadline. At the deadline the
//! caller learns "busy" (`Ok(None)`) when a try of this wait was answered and no later try
//! failed, and the last error otherwise: the last try could not reach Redis, or nothing of this
//! wait ever did. A subscribe that fails or runs out of time after a try was answered (a slow
//! link to a far region: the subscriber's connect takes several round trips) does not make a
//! busy lock look like an unreachable Redis.
//!
//! Without pub/sub ([`crate::Waking::Timer`], or [`crate::Waking::Auto`] once the server
//! refused it) step 2 registers nothing and step 3 sleeps on a timer instead of a message: a
//! capped exponential backoff with jitter, never past the busy bound ([`crate::waking`]).
//!
//! A kind of lock plugs in by implementing [`Attempt`] with its own scripts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands::{self, Waiter};
use leasehold_core::{LockError, LockKeys, Result};
use leasehold_pubsub::Place;
use tokio::time::Instant;

use crate::client::ClientInner;

/// What one try answered.
pub(crate) enum Tried<G> {
    Granted(G),
    /// Busy for at most this long (`None`: no bound known).
    Busy(Option<Duration>),
}

/// One try of some kind of lock, as the engine drives it.
pub(crate) trait Attempt {
    type Grant;

    /// Tries once, within `budget` (connection wait included). With `waiter`, the try may take
    /// a turn reserved for this client and queues the client when busy: the caller is
    /// subscribed.
    fn attempt(
        &mut self,
        waiter: Option<Waiter<'_>>,
        budget: Duration,
    ) -> impl Future<Output = Result<Tried<Self::Grant>>> + Send;

    /// How long a grant keeps the lock at most: what the next local waiter is told.
    fn lease(&self) -> Duration;

    /// The kind's metrics ([`leasehold_core::telemetry`]).
    fn metrics(&self) -> &leasehold_core::telemetry::LockMetrics;

    /// Where this waiter's wake-ups come and what giving up must tell Redis: by default the
    /// lock's release channel, shared by the client's waiters, and its turn queue.
    fn line(&self) -> Line {
        Line::Shared
    }

    /// How many waiters stand before this one in its line in Redis, as the last busy try said
    /// (`None`: the kind has no such line). A waiter woken by a timer looks sooner the nearer
    /// the head it is.
    fn ahead(&self) -> Option<u64> {
        None
    }

    /// Whether a grant excludes the next local waiter: it then waits for a release message
    /// instead of trying at once. A count-down latch's "grant" (it is open) excludes nobody.
    fn exclusive(&self) -> bool {
        true
    }
}

/// How a kind's waiters line up.
pub(crate) enum Line {
    /// One line per client on the lock's release channel: only its head talks to Redis, and
    /// the client's entry in the lock's turn queue goes with its last waiter.
    Shared,
    /// A line of one per waiter (a fair lock): every waiter has its own entry in Redis and its
    /// own channel, and leaving the wait without the lock removes the entry at once (passing
    /// on a turn reserved for it).
    Own {
        /// The waiter's channel.
        channel: String,
        /// The waiting owner.
        owner: leasehold_core::Owner,
    },
    /// Waiters of the lock's release channel that keep nothing in Redis (a count-down
    /// latch's): giving up tells Redis nothing.
    Broadcast,
}

/// Retry delay after transient errors while waiting: 10 ms doubling to 1 s.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);

    fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
        delay
    }
}

/// One waiter of one lock: its place in line, its deadline, and what it learned. Dropping it
/// (done, failed or cancelled) leaves the line.
pub(crate) struct Wait<'a> {
    client: &'a Arc<ClientInner>,
    keys: &'a LockKeys,
    deadline: Option<Instant>,
    place: Option<Place>,
    /// The waiting owner when it has an entry of its own in Redis ([`Line::Own`]).
    own_entry: Option<leasehold_core::Owner>,
    /// Giving up leaves the client's turn queue ([`Line::Shared`]).
    turn_queue: bool,
    backoff: Backoff,
    /// The error of the last try, if it failed transiently and nothing answered since (or of a
    /// subscribe, while no try of this wait has been answered).
    last_error: Option<LockError>,
    /// Whether a try of this wait was answered (busy): Redis was reachable.
    answered: bool,
    /// Set when this waiter got the lock, with the grant's lease.
    granted: Option<Duration>,
    /// When a message last woke this waiter, until its next try was answered busy: a grant
    /// after it is a handoff (`leasehold_handoff_seconds`).
    woken_at: Option<Instant>,
    /// The timer's delays, when this client waits without pub/sub.
    timer: crate::waking::TimerDelays,
}

impl Drop for Wait<'_> {
    /// Leaves the line. The last waiter of this client to give up takes the client out of the
    /// lock's turn queue, so the next release does not reserve the lock for a client that no
    /// longer wants it (everyone would wait out the grace).
    fn drop(&mut self) {
        let Some(place) = self.place.take() else {
            return;
        };
        let subscribed = place.is_subscribed();
        // The next waiter of this line gets a busy hint (sleep until a release message) only
        // where a release message will come: on the shared channel. A line of one owner's own
        // (a fair lock's) hears no message when that owner releases, and its next waiter is the
        // same owner: it tries at once (it re-enters, or waits for the hold locally). A grant
        // that excludes nobody (zero) gives no hint either.
        let hint = self
            .granted
            .filter(|lease| !lease.is_zero() && self.own_entry.is_none());
        let last = place.leave(hint);
        match self.own_entry.take() {
            // The owner's entry is shared by its waiters (joined futures of one task): the last
            // one to give up takes it out.
            Some(owner) if last && self.granted.is_none() => {
                leave_fair_line(self.client, self.keys, owner);
            }
            Some(_) => {}
            None if self.turn_queue && last && self.granted.is_none() && subscribed => {
                leave_turn_queue(self.client, self.keys);
            }
            None => {}
        }
    }
}

impl<'a> Wait<'a> {
    /// Takes a place at the back of the local queue of `line`.
    pub(crate) fn join(
        client: &'a Arc<ClientInner>,
        keys: &'a LockKeys,
        deadline: Option<Instant>,
        line: Line,
    ) -> Wait<'a> {
        let turn_queue = matches!(line, Line::Shared);
        let (place, own_entry) = match line {
            Line::Shared | Line::Broadcast => (client.notifier.join(keys.released()), None),
            Line::Own { channel, owner } => (client.notifier.join(&channel), Some(owner)),
        };
        Wait {
            client,
            keys,
            deadline,
            place: Some(place),
            own_entry,
            turn_queue,
            backoff: Backoff(Backoff::FIRST),
            last_error: None,
            answered: false,
            granted: None,
            woken_at: None,
            timer: client.waking.delays(),
        }
    }

    /// Whether this client's waiters sleep on a timer rather than on messages.
    fn by_timer(&self) -> bool {
        self.client.waking.by_timer()
    }

    /// Sleeps the timer's next delay after a busy answer, but never past `busy_for` (the
    /// holder's remaining lease: the lock may be free then) or the deadline. A local wake-up
    /// (another waiter of this client left the head) cuts it short.
    async fn sleep_on_timer(&mut self, busy_for: Option<Duration>) {
        let mut delay = self.timer.next();
        if let Some(bound) = busy_for {
            delay = delay.min(bound + Duration::from_millis(1));
        }
        let wake_at = self.capped(delay);
        tokio::select! {
            _ = self.place().woken() => {}
            _ = tokio::time::sleep_until(wake_at) => {}
        }
    }

    fn place(&self) -> &Place {
        self.place.as_ref().expect("a place until dropped")
    }

    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| d <= Instant::now())
    }

    /// Waits until this waiter heads the line; false at the deadline.
    pub(crate) async fn until_head(&mut self) -> bool {
        self.place().until_head(self.deadline).await
    }

    /// Registers interest (subscribes the channel). A transient failure is kept as the last
    /// error and waited out with backoff.
    pub(crate) async fn register_interest(&mut self) -> Result<()> {
        if self.by_timer() {
            return Ok(());
        }
        let subscribe = self.place().subscribe();
        let result = match self.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, subscribe)
                .await
                .unwrap_or(Err(LockError::Timeout)),
            None => subscribe.await,
        };
        match result {
            Ok(()) => Ok(()),
            Err(error) if error.is_transient() => {
                tracing::debug!(lock = %self.keys.name(), %error, "subscribe failed; retrying");
                // Once a try was answered, Redis is reachable: a subscribe that could not be
                // completed in time does not turn "busy" into an error.
                let error = (!self.answered).then_some(error);
                self.backoff_after(error).await;
                Ok(())
            }
            // A refused SUBSCRIBE turns a `Waking::Auto` client to the timer.
            Err(error) if self.client.waking.subscribe_refused(&error) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Sleeps until a wake-up, `busy_for` from now, or the deadline; true when woken.
    ///
    /// A queued client that takes its turn after message `since` (the try's epoch) announces
    /// its lease: the lock is busy at most until then, which may be before `busy_for` (a
    /// previous holder's longer lease). The timer is shortened to it, so that a new holder that
    /// crashes or holds past its lease does not leave this waiter asleep on a free lock.
    pub(crate) async fn sleep(&mut self, busy_for: Option<Duration>, since: u64) -> bool {
        // +1 ms: PTTL rounds down, and waking a hair early wastes a try. No bound known (a key
        // without TTL): look again every second.
        let busy_for = busy_for.map_or(Duration::from_secs(1), |t| t + Duration::from_millis(1));
        let mut wake_at = self.capped(busy_for);
        let place = self.place.as_ref().expect("a place until dropped");
        let woken = loop {
            // Armed before the look, so a message between the two is not missed.
            let taken = place.taken_changed();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if let Some(until) = place.taken_since(since) {
                let until = until + Duration::from_millis(1);
                wake_at = wake_at.min(self.deadline.map_or(until, |d| until.min(d)));
            }
            tokio::select! {
                _ = place.woken() => break true,
                _ = tokio::time::sleep_until(wake_at) => break false,
                _ = &mut taken => {}
            }
        };
        if woken {
            self.woken_at = Some(Instant::now());
        }
        woken
    }

    /// Sleeps after a busy reply to a try made at message `epoch`. A busy time within the
    /// grace is (usually) a turn reserved for another client. Its taker announces the turn with
    /// its lease: then this waiter sleeps on until that hold could end, without a try that would
    /// only learn the same. With no such message (the reserved client is gone), the reservation
    /// lapsed and the next try takes the lock.
    async fn sleep_while_busy(&mut self, busy_for: Option<Duration>, grace: Duration, epoch: u64) {
        let woken = self.sleep(busy_for, epoch).await;
        if woken || busy_for.is_none_or(|t| t > grace) || self.expired() {
            return;
        }
        let rest = self
            .place()
            .taken_since(epoch)
            .map(|until| until.saturating_duration_since(Instant::now()));
        if let Some(rest) = rest.filter(|r| !r.is_zero()) {
            self.sleep(Some(rest), epoch).await;
        }
    }

    async fn backoff_after(&mut self, error: Option<LockError>) {
        if error.is_some() {
            self.last_error = error;
        }
        let pause = self.backoff.next();
        tokio::time::sleep_until(self.capped(pause)).await;
    }

    /// `after` from now, but no later than the deadline.
    fn capped(&self, after: Duration) -> Instant {
        let at = Instant::now() + after;
        self.deadline.map_or(at, |deadline| at.min(deadline))
    }

    /// The waiter arguments of a try: set when subscribed (the try may then take this client's
    /// reserved turn, and queues the client).
    fn waiter(&self) -> Option<Waiter<'a>> {
        let place = self.place();
        place.is_subscribed().then(|| Waiter {
            client: self.client.id.as_str(),
            more: place.has_company(),
        })
    }
}

/// Sends the ZREM of `client`'s id from the lock's turn queue, in the background.
pub(crate) fn leave_turn_queue(client: &Arc<ClientInner>, keys: &LockKeys) {
    in_background(
        client,
        keys,
        "leaving the turn queue failed; the next release will skip us after the grace",
        |client, keys| async move {
            commands::leave_queue(&client.redis, &keys, client.id.as_str()).await
        },
    );
}

/// Sends the leave script for `owner`'s own entry in a line of waiters (fair, read/write,
/// semaphore), in the background: its entry goes, and a turn reserved for it passes to the
/// next waiter at once instead of when the entry lapses.
///
/// It runs after the settles of the owner's hold in flight (the hold table orders them): a
/// settle of this waiter's last try puts the waiter back in its place in line
/// (`keep_place.lua`), and the leave must come after it, or the entry would stay until it
/// lapses.
fn leave_fair_line(client: &Arc<ClientInner>, keys: &LockKeys, owner: leasehold_core::Owner) {
    use futures::FutureExt;
    let hold = leasehold_core::HoldId::new(keys.clone(), owner.clone());
    let work = {
        let (client, keys) = (client.clone(), keys.clone());
        async move {
            let leave = commands::fair_leave(&client.redis, &client.scripts, &keys, &owner);
            if let Err(error) = client.call(client.command_timeout, leave).await {
                tracing::debug!(lock = %keys.name(), %error, "leaving the line failed; the entry lapses within a lease");
            }
        }
    };
    client.holds.settle(&hold, work.boxed());
}

/// Runs a waiter's clean-up command in a task of its own (the waiter is gone, or going), within
/// the command timeout; a failure is only logged (`failed`): what it cleans up lapses anyway.
fn in_background<F, Fut>(
    client: &Arc<ClientInner>,
    keys: &LockKeys,
    failed: &'static str,
    command: F,
) where
    F: FnOnce(Arc<ClientInner>, LockKeys) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (client, keys) = (client.clone(), keys.clone());
    let name = keys.name().to_string();
    let command = command(client.clone(), keys);
    runtime.spawn(async move {
        if let Err(error) = client.call(client.command_timeout, command).await {
            tracing::debug!(lock = %name, %error, "{failed}");
        }
    });
}

/// Waits for the lock with `attempt`, until `deadline` (`None`: no limit). See the module
/// docs. `Ok(None)`: still busy at the deadline.
///
/// # Cancel safety
/// Cancel safe: a dropped wait leaves its place (the next waiter is woken), and the turn queue
/// when it was its client's last waiter; a try in flight is settled by the attempt itself.
pub(crate) async fn acquire<A: Attempt>(
    client: &Arc<ClientInner>,
    keys: &LockKeys,
    attempt: &mut A,
    deadline: Option<Instant>,
) -> Result<Option<A::Grant>> {
    // The waiting engine is off the hot path (boxed by its callers): its span costs nothing
    // when DEBUG is off, and shows each wait's tries when on.
    let span = tracing::debug_span!("leasehold.wait", lock = %keys.name());
    tracing::Instrument::instrument(wait_for(client, keys, attempt, deadline), span).await
}

async fn wait_for<A: Attempt>(
    client: &Arc<ClientInner>,
    keys: &LockKeys,
    attempt: &mut A,
    deadline: Option<Instant>,
) -> Result<Option<A::Grant>> {
    let mut wait = Wait::join(client, keys, deadline, attempt.line());
    if !wait.until_head().await {
        return Ok(None);
    }
    if let Some(busy_for) = wait.place().take_busy_hint() {
        // The waiter before us just got the lock: no try can succeed now. Subscribed, wait
        // for its release; otherwise subscribe, and the first try queues this client.
        if wait.place().is_subscribed() {
            let since = wait.place().epoch();
            let _woken = wait.sleep(Some(busy_for), since).await;
        } else if wait.by_timer() {
            wait.sleep_on_timer(Some(busy_for)).await;
        } else {
            wait.register_interest().await?;
        }
    }
    let grace = client.scripts.protocol.turn_grace;
    loop {
        // A try that starts at or after the deadline is the last one.
        let last = wait.expired();
        let waiter = wait.waiter();
        // Messages received from here on are news to this try.
        let epoch = wait.place().epoch();
        let budget = client.budget(deadline);
        match attempt.attempt(waiter, budget).await {
            Ok(Tried::Granted(grant)) => {
                // A grant that excludes nobody lets the next local waiter try at once.
                wait.granted = Some(if attempt.exclusive() {
                    attempt.lease()
                } else {
                    Duration::ZERO
                });
                if let Some(woken_at) = wait.woken_at {
                    attempt.metrics().handoff(woken_at.elapsed());
                }
                return Ok(Some(grant));
            }
            Ok(Tried::Busy(busy_for)) => {
                wait.last_error = None;
                wait.answered = true;
                wait.woken_at = None;
                wait.backoff = Backoff(Backoff::FIRST);
                if last || wait.expired() {
                    return Ok(None);
                }
                if waiter.is_some() {
                    wait.sleep_while_busy(busy_for, grace, epoch).await;
                } else if wait.by_timer() {
                    wait.timer.busy(attempt.ahead());
                    wait.sleep_on_timer(busy_for).await;
                } else {
                    // A release published before the subscription reached nobody, so the lock
                    // is tried again (as a waiter) at once when it is active.
                    wait.register_interest().await?;
                }
            }
            Err(error) if error.is_transient() => {
                tracing::debug!(lock = %keys.name(), %error, "try failed while waiting; retrying");
                if last || wait.expired() {
                    return Err(error);
                }
                wait.backoff_after(Some(error)).await;
            }
            Err(error) => return Err(error),
        }
        if wait.expired() {
            if let Some(error) = wait.last_error.take() {
                // The last try could not reach Redis (or nothing of this wait ever did): say so
                // rather than "busy".
                return Err(error);
            }
        }
    }
}
