//! The local view of one grant's lease: valid until a deadline, or lost.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a hold's lease was lost, as far as this process knows (the first cause it saw).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Redis no longer had the grant, as a renewal, an extension or a later acquire found: it
    /// expired there, was force-unlocked, was taken by another owner, or Redis lost its data.
    Gone,
    /// The local validity deadline passed: an explicit lease ran out without being extended,
    /// or no renewal was confirmed in time (Redis unreachable, slow or paused, or this process
    /// stalled).
    Expired,
    /// The watchdog stopped renewing the hold once it reached the client's `max_hold`, and its
    /// last lease ran out.
    MaxHold,
}

/// The reason code of a lease that is not lost.
const HELD: u8 = 0;

impl LostReason {
    fn code(self) -> u8 {
        match self {
            LostReason::Gone => 1,
            LostReason::Expired => 2,
            LostReason::MaxHold => 3,
        }
    }

    fn from_code(code: u8) -> Option<LostReason> {
        match code {
            1 => Some(LostReason::Gone),
            2 => Some(LostReason::Expired),
            3 => Some(LostReason::MaxHold),
            _ => None,
        }
    }
}

/// Whether a hold's lease is still certainly valid, as far as this process can know.
///
/// The deadline is measured from when the acquire (or the last confirmed renewal) was *sent*,
/// not when its reply came back: Redis started the lease no earlier than the send.
///
/// Kept small (two atomics, a `Notify` and a deadline): a client may hold ten thousand of
/// these.
#[derive(Debug)]
pub struct LeaseState {
    /// [`HELD`], or the [`LostReason`] code of the first cause that ended it. Final once set.
    reason: AtomicU8,
    /// The watchdog stopped renewing it at `max_hold`: a deadline that passes is that.
    capped: AtomicBool,
    lost_notify: Notify,
    valid_until: Mutex<Instant>,
}

impl LeaseState {
    /// A lease valid until `valid_until` unless extended or marked lost.
    pub fn new(valid_until: Instant) -> LeaseState {
        LeaseState {
            reason: AtomicU8::new(HELD),
            capped: AtomicBool::new(false),
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
        if self.is_marked_lost() {
            return false;
        }
        if Instant::now() >= self.valid_until() {
            self.lapse();
            return false;
        }
        true
    }

    /// Moves the deadline forward to `valid_until` (never backwards). Returns false, and changes
    /// nothing, when the lease is already lost: a late renewal reply cannot resurrect a hold the
    /// caller has been told is gone.
    pub fn extend(&self, valid_until: Instant) -> bool {
        let mut deadline = self.valid_until.lock();
        if self.is_marked_lost() || Instant::now() >= *deadline {
            drop(deadline);
            self.lapse();
            return false;
        }
        if valid_until > *deadline {
            *deadline = valid_until;
        }
        true
    }

    /// Marks the lease lost (renewal found the grant gone, or a new grant showed Redis no
    /// longer had it). Final: nothing extends a lost lease.
    /// Its reason is [`LostReason::Gone`] unless it was lost before.
    pub fn mark_lost(&self) {
        self.end(LostReason::Gone);
    }

    /// The deadline passed: lost as [`LostReason::MaxHold`] when the watchdog had stopped
    /// renewing it at `max_hold`, otherwise as [`LostReason::Expired`].
    fn lapse(&self) {
        let reason = if self.capped.load(Ordering::Acquire) {
            LostReason::MaxHold
        } else {
            LostReason::Expired
        };
        self.end(reason);
    }

    fn end(&self, reason: LostReason) {
        if self
            .reason
            .compare_exchange(HELD, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.lost_notify.notify_waiters();
        }
    }

    /// Records that the watchdog renews this lease no more (its grant reached `max_hold`): it
    /// runs out at its current deadline, and is then lost as [`LostReason::MaxHold`].
    pub fn cap(&self) {
        self.capped.store(true, Ordering::Release);
    }

    /// Whether the watchdog stopped renewing this lease at `max_hold`.
    pub fn is_capped(&self) -> bool {
        self.capped.load(Ordering::Acquire)
    }

    /// Whether the lease was marked lost (without looking at the deadline).
    pub fn is_marked_lost(&self) -> bool {
        self.reason.load(Ordering::Acquire) != HELD
    }

    /// Why the lease was lost (looking at the deadline first); `None` while it is held.
    pub fn lost_reason(&self) -> Option<LostReason> {
        if self.is_held() {
            return None;
        }
        LostReason::from_code(self.reason.load(Ordering::Acquire))
    }

    /// Completes when the lease is lost: marked lost, or its deadline passed without extension,
    /// or `until` (a guard's own, earlier deadline) passed.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes state.
    pub async fn lost_by(&self, until: Option<Instant>) {
        self.lost_by_any(|| until).await
    }

    /// As [`LeaseState::lost_by`], with `until` read again each time the wait wakes: a guard's
    /// own deadline that moves (an extended explicit lease) is followed.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes state.
    pub async fn lost_by_any(&self, until: impl Fn() -> Option<Instant>) {
        loop {
            let until = until();
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
        assert_eq!(lease.lost_reason(), Some(LostReason::Gone));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_cause_is_the_reason() {
        let expired = LeaseState::new(Instant::now() + Duration::from_secs(1));
        assert_eq!(expired.lost_reason(), None);
        expired.lost_by(None).await;
        expired.mark_lost();
        assert_eq!(expired.lost_reason(), Some(LostReason::Expired));

        let capped = LeaseState::new(Instant::now() + Duration::from_secs(1));
        capped.cap();
        assert!(capped.is_held(), "a capped lease holds until its deadline");
        capped.lost_by(None).await;
        assert_eq!(capped.lost_reason(), Some(LostReason::MaxHold));

        let gone = LeaseState::new(Instant::now() + Duration::from_secs(1));
        gone.cap();
        gone.mark_lost();
        assert_eq!(gone.lost_reason(), Some(LostReason::Gone));
    }

    #[tokio::test(start_paused = true)]
    async fn a_moving_guard_deadline_is_followed() {
        let lease = LeaseState::new(Instant::now() + Duration::from_secs(60));
        let until = Mutex::new(Instant::now() + Duration::from_secs(1));
        let start = Instant::now();
        let wait = lease.lost_by_any(|| Some(*until.lock()));
        tokio::pin!(wait);
        tokio::select! {
            _ = &mut wait => panic!("lost before its deadline"),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        *until.lock() = start + Duration::from_secs(3);
        wait.await;
        assert!(start.elapsed() >= Duration::from_secs(3));
    }
}
