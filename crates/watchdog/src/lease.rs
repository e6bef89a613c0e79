//! The local view of one grant's lease: valid until a deadline, or lost.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Whether a hold's lease is still certainly valid, as far as this process can know.
///
/// The deadline is measured from when the acquire (or the last confirmed renewal) was *sent*,
/// not when its reply came back: Redis started the lease no earlier than the send.
///
/// Kept small (an atomic, a `Notify` and a deadline): a client may hold ten thousand of these.
#[derive(Debug)]
pub struct LeaseState {
    lost: AtomicBool,
    lost_notify: Notify,
    valid_until: Mutex<Instant>,
}

impl LeaseState {
    /// A lease valid until `valid_until` unless extended or marked lost.
    pub fn new(valid_until: Instant) -> LeaseState {
        LeaseState {
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
            valid_until: Mutex::new(valid_until),
        }
    }

    /// The local validity deadline.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    /// Whether the hold is still certainly valid: not marked lost and before its deadline.
    pub fn is_held(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost();
            return false;
        }
        true
    }

    /// Moves the deadline forward to `valid_until` (never backwards). Returns false, and changes
    /// nothing, when the lease is already lost: a late renewal reply cannot resurrect a hold the
    /// caller has been told is gone.
    pub fn extend(&self, valid_until: Instant) -> bool {
        let mut deadline = self.valid_until.lock();
        if self.lost.load(Ordering::Acquire) || Instant::now() >= *deadline {
            drop(deadline);
            self.mark_lost();
            return false;
        }
        if valid_until > *deadline {
            *deadline = valid_until;
        }
        true
    }

    /// Marks the lease lost (renewal found the grant gone, or a new grant showed Redis no
    /// longer had it). Final: nothing extends a lost lease.
    pub fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            self.lost_notify.notify_waiters();
        }
    }

    /// Whether the lease was marked lost (without looking at the deadline).
    pub fn is_marked_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Completes when the lease is lost: marked lost, or its deadline passed without extension,
    /// or `until` (a guard's own, earlier deadline) passed.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes state.
    pub async fn lost_by(&self, until: Option<Instant>) {
        loop {
            // Register before checking, so a mark_lost in between is not missed.
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_held() || until.is_some_and(|u| Instant::now() >= u) {
                return;
            }
            let deadline = until.map_or(self.valid_until(), |u| u.min(self.valid_until()));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadline_passes() {
        let lease = LeaseState::new(Instant::now() + Duration::from_secs(1));
        assert!(lease.is_held());
        assert!(lease.extend(Instant::now() + Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(lease.is_held());
        lease.lost_by(None).await;
        assert!(!lease.is_held());
        assert!(!lease.extend(Instant::now() + Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn marked_lost() {
        let lease = LeaseState::new(Instant::now() + Duration::from_secs(30));
        lease.mark_lost();
        lease.lost_by(None).await;
        assert!(!lease.is_held());
    }
}
