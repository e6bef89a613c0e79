//! How a waiter learns that what it waits for may be free: release messages over pub/sub, or a
//! timer.
//!
//! Some deployments have no pub/sub for leasehold: a proxy that refuses `SUBSCRIBE`, a managed
//! service or an ACL user without channel rights. There the same waiting engine runs woken by a
//! timer instead of a message: after each busy answer the waiter sleeps a capped exponential
//! backoff with jitter, never past the holder's remaining lease (the busy answer's bound), and
//! tries again. Everything else is as with messages: a fair lock's, a read/write lock's and a
//! semaphore's waiters keep their place in the line in Redis (a release grants the head, which
//! takes the grant at its next look), timeouts, cancel safety and the watchdog. A plain
//! lock's waiters compete at each look, as any poller's do: its per-client turns need messages.
//!
//! The cost is the wake delay: a waiter hears of a release only at its next look, up to the
//! backoff's cap later, and every look is a request to Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use leasehold_core::{LockError, Result};

/// How waiters are woken (see [`LockClientBuilder::waking`](crate::LockClientBuilder::waking)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waking {
    /// Release messages over pub/sub, and a timer where the deployment refuses pub/sub: when
    /// the server refuses leasehold's `PUBLISH` at build (an ACL without channel rights), or a
    /// waiter's `SUBSCRIBE` later (a proxy), the client logs a `warn` once and waits by timer
    /// ([`Waking::timer`]'s delays) from then on. The default.
    #[default]
    Auto,
    /// Release messages only: a refused `SUBSCRIBE` or `PUBLISH` is
    /// [`LockError::PermissionDenied`], for deployments that want a missing channel right to
    /// fail loudly.
    PubSub,
    /// A timer only: no subscriber is ever opened. After a busy answer a waiter sleeps `first`,
    /// doubling up to `max`, each delay drawn between its half and itself (jitter), and never
    /// past the holder's remaining lease. Releases still publish when the server allows it,
    /// so that clients of the same names that wait by messages are woken.
    Timer {
        /// The first delay after a busy answer.
        first: Duration,
        /// The longest delay: the worst wake delay after a release.
        max: Duration,
    },
}

impl Waking {
    /// The delays [`Waking::Auto`] falls back to: 2 ms doubling to 100 ms.
    pub const TIMER_FIRST: Duration = Duration::from_millis(2);
    /// See [`Waking::TIMER_FIRST`].
    pub const TIMER_MAX: Duration = Duration::from_millis(100);

    /// [`Waking::Timer`] with the default delays ([`Waking::TIMER_FIRST`] doubling to
    /// [`Waking::TIMER_MAX`]).
    pub fn timer() -> Waking {
        Waking::Timer {
            first: Waking::TIMER_FIRST,
            max: Waking::TIMER_MAX,
        }
    }

    /// Checks the timer's delays: `first` above zero, at most `max`, `max` at most a minute.
    pub(crate) fn validate(self) -> Result<()> {
        if let Waking::Timer { first, max } = self {
            if first.is_zero() || first > max || max > Duration::from_secs(60) {
                return Err(LockError::InvalidArgument(format!(
                    "timer waking: first delay {first:?} must be above zero and at most the \
                     longest ({max:?}), which must be at most 60 s"
                )));
            }
        }
        Ok(())
    }
}

/// A client's way of waking, as it stands: [`Waking::Auto`] turns to the timer at the first
/// refusal.
#[derive(Debug)]
pub(crate) struct WakingState {
    /// Waiters sleep on the timer, not on messages.
    timer: AtomicBool,
    /// A refusal turns the client to the timer (rather than failing the wait).
    fall_back: bool,
    first: Duration,
    max: Duration,
}

impl WakingState {
    /// `publish_refused`: the build's probe found `PUBLISH` refused (the scripts then publish
    /// nothing).
    pub(crate) fn new(waking: Waking, publish_refused: bool) -> WakingState {
        let (timer, fall_back, first, max) = match waking {
            Waking::Timer { first, max } => (true, false, first, max),
            Waking::Auto => (
                publish_refused,
                true,
                Waking::TIMER_FIRST,
                Waking::TIMER_MAX,
            ),
            Waking::PubSub => (false, false, Waking::TIMER_FIRST, Waking::TIMER_MAX),
        };
        WakingState {
            timer: AtomicBool::new(timer),
            fall_back,
            first,
            max,
        }
    }

    /// Whether waiters sleep on the timer.
    pub(crate) fn by_timer(&self) -> bool {
        self.timer.load(Ordering::Relaxed)
    }

    /// A waiter's `SUBSCRIBE` failed with `error`: when that is a refusal (not a transient
    /// error: an ACL's `NOPERM`, a proxy's or a renamed command's "unknown command"), a
    /// [`Waking::Auto`] client waits by timer from now on (true, a `warn` logged once);
    /// otherwise the error stands.
    pub(crate) fn subscribe_refused(&self, error: &LockError) -> bool {
        if !self.fall_back || error.is_transient() {
            return false;
        }
        if !self.timer.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %error,
                "the server refused SUBSCRIBE: waiters are woken by a timer from now on \
                 (a release is noticed up to {:?} late); grant the channel rights, or choose \
                 Waking::Timer to say so",
                self.max
            );
        }
        true
    }

    /// The timer's delays for one wait.
    pub(crate) fn delays(&self) -> TimerDelays {
        TimerDelays {
            first: self.first,
            max: self.max,
            next: self.first,
            rank: None,
            per_place: None,
        }
    }
}

/// One wait's timer delays: doubling from the first to the cap, each drawn in its upper half.
///
/// A waiter in a line of its own in Redis (fair lock, read/write lock, semaphore) also knows
/// how many wait before it. Each time that number drops the line moved: the doubling starts
/// over (the head, or a waiter about to be it, looks soon again: a release grants the head,
/// which takes the grant only at its next look), and the time the line takes to move
/// one place is learnt. A waiter further back need not look before the line could have
/// reached it: its delay is at least half its rank times that time, never above the cap.
#[derive(Debug)]
pub(crate) struct TimerDelays {
    first: Duration,
    max: Duration,
    next: Duration,
    /// The last rank a busy answer gave, and when it first gave it.
    rank: Option<(u64, Instant)>,
    /// How long the line took to move one place, as learnt so far.
    per_place: Option<Duration>,
}

impl TimerDelays {
    /// Takes in a busy answer's rank in the line (`None`: no line of its own).
    pub(crate) fn busy(&mut self, ahead: Option<u64>) {
        let Some(rank) = ahead else { return };
        let now = Instant::now();
        match self.rank {
            Some((last, since)) if rank < last => {
                let moved = u32::try_from(last - rank).unwrap_or(u32::MAX);
                let per = now.saturating_duration_since(since) / moved;
                self.per_place = Some(self.per_place.map_or(per, |p| (p + per) / 2));
                self.next = self.first;
                self.rank = Some((rank, now));
            }
            Some((last, _)) if rank == last => {}
            _ => self.rank = Some((rank, now)),
        }
    }

    /// The next delay, jittered: waiters that woke together do not look together again.
    pub(crate) fn next(&mut self) -> Duration {
        let mut delay = self.next;
        self.next = (self.next * 2).min(self.max);
        if let (Some((rank, _)), Some(per)) = (self.rank, self.per_place) {
            let places = u32::try_from(rank).unwrap_or(u32::MAX);
            delay = delay.max((per.saturating_mul(places) / 2).min(self.max));
        }
        let half = delay / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_delays_double_to_the_cap_with_jitter_in_their_upper_half() {
        let state = WakingState::new(Waking::timer(), false);
        let mut delays = state.delays();
        let mut nominal = Waking::TIMER_FIRST;
        for _ in 0..10 {
            let delay = delays.next();
            assert!(
                delay >= nominal / 2 && delay <= nominal,
                "{delay:?} of {nominal:?}"
            );
            nominal = (nominal * 2).min(Waking::TIMER_MAX);
        }
        assert_eq!(nominal, Waking::TIMER_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_nearer_the_head_of_a_moving_line_looks_sooner() {
        let state = WakingState::new(Waking::timer(), false);
        let mut delays = state.delays();
        delays.busy(Some(10));
        for _ in 0..6 {
            delays.next(); // backed off to the cap
        }
        // The line moves 5 places in 10 ms: 2 ms a place.
        tokio::time::advance(Duration::from_millis(10)).await;
        delays.busy(Some(5));
        // Five places back: at least 5 ms (half of 5 x 2 ms), the doubling started over.
        let delay = delays.next();
        assert!(delay >= Duration::from_micros(2_500) && delay <= Duration::from_millis(5));
        // At the head: the first delay.
        tokio::time::advance(Duration::from_millis(10)).await;
        delays.busy(Some(0));
        let delay = delays.next();
        assert!(delay <= Waking::TIMER_FIRST, "{delay:?}");
    }

    #[test]
    fn timer_delays_are_checked() {
        assert!(Waking::timer().validate().is_ok());
        for (first, max) in [(0, 10), (20, 10), (10, 61_000)] {
            let waking = Waking::Timer {
                first: Duration::from_millis(first),
                max: Duration::from_millis(max),
            };
            assert!(matches!(
                waking.validate(),
                Err(LockError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn auto_turns_to_the_timer_on_a_refusal_and_pubsub_does_not() {
        let refused = LockError::PermissionDenied(leasehold_core::RedisError::connection("NOPERM"));
        let auto = WakingState::new(Waking::Auto, false);
        assert!(!auto.by_timer());
        assert!(!auto.subscribe_refused(&LockError::Timeout));
        assert!(auto.subscribe_refused(&refused));
        assert!(auto.by_timer());
        let strict = WakingState::new(Waking::PubSub, false);
        assert!(!strict.subscribe_refused(&refused));
        assert!(!strict.by_timer());
        assert!(WakingState::new(Waking::Auto, true).by_timer());
    }
}
