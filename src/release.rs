//! Releasing a hold, and settling state changes whose reply never came.
//!
//! A command sent once may be lost with its reply (a timeout, a broken connection, a future
//! dropped while it was in flight): the client cannot know whether Redis ran it. Resending it
//! blindly could release twice or count a hold twice. Instead the client *settles* it: it sends
//! the release script with the hold count the owner has if the command ran (an acquire) or did
//! not run (a release), and Redis releases one hold only if the count is exactly that. This
//! compare-and-set is safe to resend, so it is retried until Redis answers, or until the hold
//! has ended with its lease anyway. Every later acquire and release of the same hold waits for
//! pending settles first ([`Watchdog::settled`](leasehold_watchdog::Watchdog::settled)), so a
//! late settle can never take back a fresh change.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use leasehold_core::commands::{self, ReleaseKind};
use leasehold_core::{DropGuard, FencingToken, HoldId, LockError, Result};
use leasehold_watchdog::ReleaseTicket;
use tokio::time::Instant;

use crate::client::{within, ClientInner};

/// One release on its way: everything it needs, detached from the guard so that a dropped
/// guard can send it from a spawned task.
pub(crate) struct Release {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) hold: HoldId,
    /// The grant the hold belongs to (`None`: whichever the owner has, for `Lock::unlock`).
    pub(crate) token: Option<FencingToken>,
    /// Whether the release must name that token: a later grant of the same owner may exist
    /// (the hold table no longer has this grant as the current one). Otherwise the script
    /// skips the check (one read less on the hottest path).
    pub(crate) checked: bool,
    pub(crate) kind: ReleaseKind,
    /// How long until the hold ends by itself if the release does not run.
    pub(crate) ends_within: Duration,
    /// Keeps the owner's next acquire of this hold from overtaking this release.
    pub(crate) _ticket: ReleaseTicket,
}

impl Release {
    /// Sends the release once. If the reply never comes (or this future is dropped while it
    /// is in flight), it is settled in the background.
    ///
    /// # Cancel safety
    /// Cancel safe: see above.
    pub(crate) async fn send(self) -> Result<()> {
        // A span only when its level is on (see `Lock::acquire`).
        let span = tracing::info_span!(
            "leasehold.release",
            lock = %self.hold.keys.name(),
            owner = %self.hold.owner,
            token = self.token.map(FencingToken::get),
        );
        if span.is_disabled() {
            self.send_untraced().await
        } else {
            Box::pin(tracing::Instrument::instrument(self.send_untraced(), span)).await
        }
    }

    async fn send_untraced(self) -> Result<()> {
        let client = &self.client;
        // Armed from the start: dropped before the release was sent (waiting for an earlier
        // settle or for the connection), the release is still owed, so it is settled too.
        let pending = DropGuard::new(|| self.settle_later());
        let mut budget = client.command_timeout;
        // An earlier unanswered command of this hold is settled first, within the same budget.
        // (Boxed: in the common case, nothing in flight, this future is never built.)
        if !client.holds.is_quiet(false) {
            let started = Instant::now();
            if !Box::pin(client.holds.repaired(&self.hold, budget)).await {
                return Err(LockError::Timeout); // `pending` settles this release later
            }
            budget = budget
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
        }
        let budget = client.start(budget).await;
        let reply = within!(
            budget,
            commands::release(
                &client.redis,
                &client.scripts,
                &self.hold,
                self.token.filter(|_| self.checked),
                self.kind,
                None,
            )
        );
        match reply {
            Ok(commands::Release::Released) => {
                pending.disarm();
                self.wake_own_line();
                if !client.replica_sync.is_none() {
                    Box::pin(self.replicate()).await;
                }
                Ok(())
            }
            Ok(commands::Release::NotHeld | commands::Release::Unchanged) => {
                pending.disarm();
                Err(self.not_held())
            }
            // The outcome is unknown: `pending` settles it when dropped here.
            Err(error) if error.is_transient() => Err(error),
            Err(error) => {
                pending.disarm();
                Err(error)
            }
        }
    }

    /// Replica sync of a release: waits for the replicas as the policy says, but never fails
    /// the release for lack of them (it ran on the primary; a failover that loses it leaves
    /// the lock held until its lease ends, which delays the next owner, never doubles one).
    async fn replicate(&self) {
        let keys = &self.hold.keys;
        match self
            .client
            .replica_sync
            .require(&self.client.redis, keys)
            .await
        {
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(lock = %keys.name(), %error, "release not synced to replicas")
            }
        }
    }

    /// A kind whose waiters each have a line of their own (fair, read/write, semaphore) tells
    /// only the first waiter in Redis's line: the releasing owner's own waiting futures (joined
    /// in its task) are woken here, in the client, on the owner's channel they wait on. (A plain
    /// lock's waiters share the client's channel with other owners' waiters: one waiting for its
    /// own owner's hold waits on the hold table instead, `LockAttempt::attempt`.)
    fn wake_own_line(&self) {
        let keys = &self.hold.keys;
        if keys.has_own_lines() {
            let mut channel = keys.waiter_channel_prefix();
            channel.push_str(self.hold.owner.id());
            self.client.notifier.wake(&channel);
        }
    }

    fn not_held(&self) -> LockError {
        LockError::NotHeld {
            name: self.hold.keys.name().to_string(),
            owner: self.hold.owner.to_string(),
        }
    }

    /// Settles this release in the background: "if the owner still has the holds it had before
    /// this release, release one".
    fn settle_later(&self) {
        let holds_before = self.client.holds.guards_in(&self.hold, self.token) + 1;
        settle(
            &self.client,
            &self.hold,
            self.token,
            self.kind,
            holds_before,
            self.ends_within,
            commands::Undo::Release,
        );
    }
}

/// Settles an unanswered state change of `hold` in the background: releases one hold (or
/// hands the last one to nobody, for `ReleaseKind::After`) if the owner's count is `expected`.
/// Resent until Redis answers, or until `give_up_after`, when the hold has ended by itself.
///
/// `undo` says what the unanswered command was ([`commands::Undo`]): an acquire's settle leaves
/// a grant marked as the line's (every grant a waiter's try or a release makes to a waiter is:
/// the waiter, still waiting, takes it, or hands it on when it leaves), so a settle never costs
/// a live waiter its turn. (A waiter's place is sent too, for an unmarked grant of its try;
/// the scripts make none now.)
pub(crate) fn settle(
    client: &Arc<ClientInner>,
    hold: &HoldId,
    token: Option<FencingToken>,
    kind: ReleaseKind,
    expected: u64,
    give_up_after: Duration,
    undo: commands::Undo,
) {
    let work = {
        let (client, hold) = (client.clone(), hold.clone());
        async move {
            let give_up_at = Instant::now() + give_up_after;
            let mut delay = Duration::from_millis(10);
            loop {
                let settle = commands::settle(
                    &client.redis,
                    &client.scripts,
                    &hold,
                    token,
                    kind,
                    Some(expected),
                    undo,
                );
                match client.call(client.command_timeout, settle).await {
                    Ok(outcome) => {
                        tracing::debug!(lock = %hold.keys.name(), ?outcome, "unanswered command settled");
                        return;
                    }
                    Err(error) if error.is_transient() && Instant::now() + delay < give_up_at => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                    Err(error) => {
                        tracing::warn!(lock = %hold.keys.name(), %error, "could not settle an unanswered command; the lease will end the hold");
                        return;
                    }
                }
            }
        }
    };
    client.holds.settle(hold, work.boxed());
}
