//! The waiting engine: how any kind of lock waits, whatever its scripts.
//!
//! # Implementation details
//! Waiters of one client on one lock form a local FIFO queue ([`Place`]); only its head talks
//! to Redis, so a task that releases and asks again at once lines up behind its client's
//! earlier waiters. A plain lock's queue is the client's (only its head has an entry in the
//! lock's line in Redis); a fair lock's, a read/write lock's and a semaphore's are each
//! owner's (every waiter has an entry). The head repeats three steps:
//!
//! 1. **Try** ([`Attempt::attempt`]). Granted: done. Otherwise the reply says how long the
//!    lock stays busy at most (the holder's remaining lease, or a dead waiter's entry ahead),
//!    and a waiter's try took (or kept) its place in the lock's line.
//! 2. **Register interest** in the waiter's channel *before the next try*, so a message
//!    between a failed try and the wait is not missed (the `Notify::enable` rule). Interest is
//!    free when the channel is already subscribed (another waiter, or a lingering
//!    subscription). Otherwise the first try goes out alone (most locks are free) and the
//!    subscriber is opened only when there is something to wait for.
//! 3. **Sleep** until a message, or until the busy time from step 1 runs out (a holder that
//!    crashed publishes nothing), or until the caller's deadline. A release grants the lock to
//!    the first live waiter of the line and tells only it, with the grant's fencing token: that
//!    waiter wakes holding the lock ([`Attempt::heard`]), and no try follows. Any other message
//!    ("look again") leads to a new try.
//!
//! The invariant this keeps: a head never sleeps past the moment the lock could have become
//! free without telling it, whatever message it missed, because every "busy" reply carries a
//! bound. A grant whose message was lost is found by the waiter's next try, which takes it as
//! its own. Transient errors are retried with backoff until the deadline. At the deadline the
//! caller learns "busy" (`Ok(None)`) when a try of this wait was answered and no later try
//! failed, and the last error otherwise: the last try could not reach Redis, or nothing of this
//! wait ever did. A subscribe that fails or runs out of time after a try was answered (a slow
//! link to a far region: the subscriber's connect takes several round trips) does not make a
//! busy lock look like an unreachable Redis.
//!
//! Without pub/sub ([`crate::Waking::Timer`], or [`crate::Waking::Auto`] once the server
//! refused it) step 2 registers nothing and step 3 sleeps on a timer instead of a message: a
//! capped exponential backoff with jitter, never past the busy bound ([`crate::waking`]); a
//! grant made meanwhile is taken by the next try.
//!
//! A kind of lock plugs in by implementing [`Attempt`] with its own scripts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands;
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

    /// Tries once, within `budget` (connection wait included). `in_line`: a waiter's try, which
    /// takes (or keeps) the owner's place in the lock's line when the lock is busy, and takes a
    /// grant the line made to it (a kind whose every waiting try is in line ignores it).
    fn attempt(
        &mut self,
        in_line: bool,
        budget: Duration,
    ) -> impl Future<Output = Result<Tried<Self::Grant>>> + Send;

    /// A grant the line made to this waiter that its channel heard (`place`): taken as this
    /// wait's without a try. `None` when there is none, or when this attempt must confirm it
    /// with a try (which then takes it).
    fn heard(&mut self, _place: &Place) -> Option<Self::Grant> {
        None
    }

    /// The kind's metrics ([`leasehold_core::telemetry`]).
    fn metrics(&self) -> &leasehold_core::telemetry::LockMetrics;

    /// Where this waiter's messages come, and what giving up must tell Redis.
    fn line(&self) -> Line;

    /// How many waiters stand before this one in its line in Redis, as the last busy try said
    /// (`None`: the kind has no such line). A waiter woken by a timer looks sooner the nearer
    /// the head it is.
    fn ahead(&self) -> Option<u64> {
        None
    }
}

/// How a kind's waiters line up.
pub(crate) enum Line {
    /// A plain lock: the client's waiters share one local line and one channel (the client's),
    /// and only its head has an entry in the lock's line in Redis, which it takes out when it
    /// gives up after a try of its put it there.
    Client {
        /// The client's channel for this lock.
        channel: String,
        /// The waiting owner.
        owner: leasehold_core::Owner,
    },
    /// A line of one per owner (a fair lock, a read/write lock, a semaphore): every waiting
    /// owner has its own entry in Redis and its own channel, and leaving the wait without the
    /// lock removes the entry at once (the owner's last waiter does: joined futures of one task
    /// share the entry).
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
    /// The waiting owner, and whether its entry in Redis is the client's head's alone
    /// ([`Line::Client`]) rather than shared by the owner's waiters ([`Line::Own`]); `None`
    /// for a line that keeps nothing in Redis.
    entry: Option<(leasehold_core::Owner, bool)>,
    /// A try of this wait in line was sent: the owner may have an entry in Redis.
    entered: bool,
    backoff: Backoff,
    /// The error of the last try, if it failed transiently and nothing answered since (or of a
    /// subscribe, while no try of this wait has been answered).
    last_error: Option<LockError>,
    /// Whether a try of this wait was answered (busy): Redis was reachable.
    answered: bool,
    /// Set when this waiter got the lock.
    granted: bool,
    /// When a message last woke this waiter, until its next try was answered busy: a grant
    /// after it is a handoff (`leasehold_handoff_seconds`).
    woken_at: Option<Instant>,
    /// The timer's delays, when this client waits without pub/sub.
    timer: crate::waking::TimerDelays,
}

impl Drop for Wait<'_> {
    /// Leaves the line: locally (the next waiter of this client becomes head), and in Redis,
    /// where the owner's entry goes at once and a grant the line made to it that it never took
    /// passes on, instead of both lapsing within a lease.
    fn drop(&mut self) {
        let Some(place) = self.place.take() else {
            return;
        };
        let last = place.leave();
        if self.granted {
            return;
        }
        match self.entry.take() {
            Some((owner, true)) if self.entered => leave_line(self.client, self.keys, owner),
            Some((owner, false)) if last => leave_line(self.client, self.keys, owner),
            _ => {}
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
        let (place, entry) = match line {
            Line::Broadcast => (client.notifier.join(keys.released()), None),
            Line::Client { channel, owner } => {
                (client.notifier.join(&channel), Some((owner, true)))
            }
            Line::Own { channel, owner } => (client.notifier.join(&channel), Some((owner, false))),
        };
        Wait {
            client,
            keys,
            deadline,
            place: Some(place),
            entry,
            entered: false,
            backoff: Backoff(Backoff::FIRST),
            last_error: None,
            answered: false,
            granted: false,
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
    pub(crate) async fn sleep(&mut self, busy_for: Option<Duration>) -> bool {
        // +1 ms: PTTL rounds down, and waking a hair early wastes a try. No bound known (a key
        // without TTL): look again every second.
        let busy_for = busy_for.map_or(Duration::from_secs(1), |t| t + Duration::from_millis(1));
        let wake_at = self.capped(busy_for);
        let woken = tokio::select! {
            _ = self.place().woken() => true,
            _ = tokio::time::sleep_until(wake_at) => false,
        };
        if woken {
            self.woken_at = Some(Instant::now());
        }
        woken
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
}

/// Sends the leave script for `owner`'s entry in the lock's line, in the background: its entry
/// goes, and a grant the line made to it that its client never took passes to the next waiter
/// at once instead of when it lapses.
///
/// It runs after the settles of the owner's hold in flight (the hold table orders them): a
/// settle of this waiter's last try leaves the grant that try took (marked as the line's), and
/// the leave must come after it to pass that grant on. The grant the client holds for the
/// owner is read then, so the leave knows which grant of the owner is not the line's untaken
/// one.
fn leave_line(client: &Arc<ClientInner>, keys: &LockKeys, owner: leasehold_core::Owner) {
    use futures::FutureExt;
    let hold = leasehold_core::HoldId::new(keys.clone(), owner.clone());
    let work = {
        let (client, hold) = (client.clone(), hold.clone());
        async move {
            let known = |hold: &leasehold_core::HoldId| {
                client.holds.prepare(hold).grant.map(|grant| grant.token)
            };
            let keys = &hold.keys;
            let other_side = keys.kind().other_side().and_then(|side| {
                known(&leasehold_core::HoldId::new(
                    keys.of_kind(side),
                    hold.owner.clone(),
                ))
            });
            let leave = commands::leave_line(
                &client.redis,
                &client.scripts,
                keys,
                &hold.owner,
                known(&hold),
                other_side,
            );
            if let Err(error) = client.call(client.command_timeout, leave).await {
                tracing::debug!(lock = %keys.name(), %error, "leaving the line failed; the entry lapses within a lease");
            }
        }
    };
    client.holds.settle(&hold, work.boxed());
}

/// Waits for the lock with `attempt`, until `deadline` (`None`: no limit). See the module
/// docs. `Ok(None)`: still busy at the deadline.
///
/// # Cancel safety
/// Cancel safe: a dropped wait leaves its place (the next waiter is woken) and its entry in the
/// lock's line (passing on a grant it never took); a try in flight is settled by the attempt
/// itself.
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
    loop {
        // A grant the line made to this waiter, heard on its channel: the waiter holds the
        // lock already, and no try follows.
        if let Some(grant) = attempt.heard(wait.place()) {
            return Ok(Some(wait.granted(attempt, grant)));
        }
        // A try that starts at or after the deadline is the last one.
        let last = wait.expired();
        // A waiter's try takes a place in the line once this waiter can hear its grant (the
        // channel is subscribed), or once it waits by timer and a try found the lock busy.
        let in_line = wait.place().is_subscribed() || (wait.answered && wait.by_timer());
        // From the moment such a try is sent the owner may have an entry in Redis (its reply
        // may never come): giving up takes it out.
        wait.entered |= in_line;
        let budget = client.budget(deadline);
        match attempt.attempt(in_line, budget).await {
            Ok(Tried::Granted(grant)) => return Ok(Some(wait.granted(attempt, grant))),
            Ok(Tried::Busy(busy_for)) => {
                wait.last_error = None;
                wait.answered = true;
                wait.woken_at = None;
                wait.backoff = Backoff(Backoff::FIRST);
                if last || wait.expired() {
                    return Ok(None);
                }
                if wait.by_timer() {
                    wait.timer.busy(attempt.ahead());
                    wait.sleep_on_timer(busy_for).await;
                } else if in_line {
                    wait.sleep(busy_for).await;
                } else {
                    // A release before the subscription reached nobody: the lock is tried
                    // again, in line, at once when the channel is subscribed.
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

impl Wait<'_> {
    /// This waiter got the lock: it leaves the line without telling Redis (the grant took its
    /// entry out), and a wake-up before the grant counts as a handoff.
    fn granted<A: Attempt>(&mut self, attempt: &A, grant: A::Grant) -> A::Grant {
        self.granted = true;
        if let Some(woken_at) = self.woken_at {
            attempt.metrics().handoff(woken_at.elapsed());
        }
        grant
    }
}
