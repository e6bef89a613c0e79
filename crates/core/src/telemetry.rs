//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: every name in one place,
//! and one handle set per component ([`LockMetrics`], [`WatchdogMetrics`],
//! [`SubscriberMetrics`]), so the crates that measure never spell a name.
//!
//! No exporter is forced on the user. Handles are registered when a client is built, with
//! whatever recorder is installed then (install yours first); afterwards a measurement is an
//! increment on a handle, and with no recorder a branch. Without the `metrics` feature the
//! handle sets are empty and every method does nothing.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `leasehold_acquisitions_total` | counter | `kind`, `outcome` | acquire calls by how they ended: `granted`, `busy` (a `try_lock` refused), `timed_out` (a wait reached its deadline), `error` |
//! | `leasehold_wait_seconds` | histogram | `kind` | from the acquire call to its grant (one round trip for a free lock) |
//! | `leasehold_hold_seconds` | histogram | `kind` | from a guard's grant to its release (unlock, drop) |
//! | `leasehold_handoff_seconds` | histogram | `kind` | from the release message reaching a waiter's client to that waiter's grant |
//! | `leasehold_renewals_total` | counter | `outcome` | renewal verdicts: `renewed`, `lost`, `error` (Redis did not answer; retried) |
//! | `leasehold_renewal_lag_seconds` | histogram | | how late a renewal went out after its due time (due every lease/3; a lag near lease/3 loses leases) |
//! | `leasehold_leases_lost_total` | counter | | grants whose lease was lost while a guard lived (found gone, or deadline passed) |
//! | `leasehold_holds` | gauge | | grants the client holds |
//! | `leasehold_waiters` | gauge | | waiters in the client's local lines |
//! | `leasehold_subscription_reconnects_total` | counter | | reconnects of the release subscriber |
//!
//! Labels are bounded: `kind` is the lock kind ([`KINDS`]: `lock` for the reentrant and
//! non-reentrant lock, `fair`, `rwlock_read`, `rwlock_write`, `semaphore`, `latch`), `outcome`
//! one of the few listed. Lock names are unbounded and are never a label.

/// The lock kind label of the plain lock (reentrant or not).
pub const KIND_LOCK: &str = crate::LockKind::Plain.traits().label;
/// The `kind` label of every kind, in [`KindMetrics`]'s order: the plain lock (reentrant or
/// not), the fair lock, a read/write lock's read and write sides, a semaphore's permits, a
/// count-down latch's waits.
pub const KINDS: [&str; 6] = [
    KIND_LOCK,
    crate::LockKind::Fair.traits().label,
    crate::LockKind::Read.traits().label,
    crate::LockKind::Write.traits().label,
    crate::LockKind::Semaphore.traits().label,
    crate::Stored::Latch.marker(),
];

/// The metrics of every kind in one client, each under its own `kind` label ([`KINDS`]).
#[derive(Clone, Debug)]
pub struct KindMetrics {
    /// By [`KINDS`].
    kinds: [LockMetrics; 6],
}

impl KindMetrics {
    /// Registers the handles of every kind with the installed recorder.
    pub fn register() -> KindMetrics {
        KindMetrics {
            kinds: KINDS.map(LockMetrics::register),
        }
    }

    /// The metrics of the locks of `kind`.
    pub fn of(&self, kind: crate::LockKind) -> &LockMetrics {
        &self.kinds[kind.index()]
    }

    /// A count-down latch's (its waits: acquisitions are waits that saw it open).
    pub fn latch(&self) -> &LockMetrics {
        &self.kinds[crate::LockKind::ALL.len()]
    }
}

/// Metric names (see the module's table).
pub mod names {
    /// Acquire calls by outcome.
    pub const ACQUISITIONS: &str = "leasehold_acquisitions_total";
    /// Acquire call to grant.
    pub const WAIT: &str = "leasehold_wait_seconds";
    /// Grant to release, per guard.
    pub const HOLD: &str = "leasehold_hold_seconds";
    /// Release message to grant.
    pub const HANDOFF: &str = "leasehold_handoff_seconds";
    /// Renewal verdicts.
    pub const RENEWALS: &str = "leasehold_renewals_total";
    /// Renewal send time past its due time.
    pub const RENEWAL_LAG: &str = "leasehold_renewal_lag_seconds";
    /// Leases lost.
    pub const LEASES_LOST: &str = "leasehold_leases_lost_total";
    /// Grants held.
    pub const HOLDS: &str = "leasehold_holds";
    /// Local waiters.
    pub const WAITERS: &str = "leasehold_waiters";
    /// Subscriber reconnects.
    pub const RECONNECTS: &str = "leasehold_subscription_reconnects_total";
}

/// How an acquire call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A guard was returned.
    Granted,
    /// `try_lock` found the lock held.
    Busy,
    /// A wait reached its deadline.
    TimedOut,
    /// The call returned an error.
    Error,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Busy => "busy",
            Outcome::TimedOut => "timed_out",
            Outcome::Error => "error",
        }
    }
}

/// A renewal verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The grant was gone.
    Lost,
    /// No answer (retried).
    Error,
}

impl Renewal {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Renewal::Renewed => "renewed",
            Renewal::Lost => "lost",
            Renewal::Error => "error",
        }
    }
}

/// The metrics of one lock kind in one client: handles registered once, when the client is
/// built, so that the hot path only increments (no key is built, nothing is allocated; with no
/// recorder installed, each call is one branch). Install the recorder before building clients:
/// handles registered earlier stay with the no-op recorder, as everywhere in `metrics`.
#[derive(Clone, Debug)]
pub struct LockMetrics {
    #[cfg(feature = "metrics")]
    inner: std::sync::Arc<LockHandles>,
}

#[cfg(feature = "metrics")]
struct LockHandles {
    /// By [`Outcome`], in its declaration order.
    acquisitions: [metrics::Counter; 4],
    wait: metrics::Histogram,
    hold: metrics::Histogram,
    handoff: metrics::Histogram,
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for LockHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockHandles").finish_non_exhaustive()
    }
}

impl LockMetrics {
    /// Registers the handles of lock kind `kind` with the installed recorder.
    pub fn register(kind: &'static str) -> LockMetrics {
        #[cfg(feature = "metrics")]
        {
            let acquisitions = [
                Outcome::Granted,
                Outcome::Busy,
                Outcome::TimedOut,
                Outcome::Error,
            ]
            .map(
                |o| metrics::counter!(names::ACQUISITIONS, "kind" => kind, "outcome" => o.as_str()),
            );
            LockMetrics {
                inner: std::sync::Arc::new(LockHandles {
                    acquisitions,
                    wait: metrics::histogram!(names::WAIT, "kind" => kind),
                    hold: metrics::histogram!(names::HOLD, "kind" => kind),
                    handoff: metrics::histogram!(names::HANDOFF, "kind" => kind),
                }),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = kind;
            LockMetrics {}
        }
    }

    /// An acquire call ended with `outcome`; `waited`: how long until its grant.
    #[inline]
    pub fn acquisition(&self, outcome: Outcome, waited: Option<std::time::Duration>) {
        #[cfg(feature = "metrics")]
        {
            self.inner.acquisitions[outcome as usize].increment(1);
            if let Some(waited) = waited {
                self.inner.wait.record(waited.as_secs_f64());
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (outcome, waited);
    }

    /// A guard was released after being held `held`.
    #[inline]
    pub fn hold(&self, held: std::time::Duration) {
        #[cfg(feature = "metrics")]
        self.inner.hold.record(held.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = held;
    }

    /// A waiter was granted `delay` after a release message woke it.
    #[inline]
    pub fn handoff(&self, delay: std::time::Duration) {
        #[cfg(feature = "metrics")]
        self.inner.handoff.record(delay.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = delay;
    }
}

/// The hold table's and renewal service's metrics (one set per client).
#[derive(Clone, Debug)]
pub struct WatchdogMetrics {
    #[cfg(feature = "metrics")]
    inner: std::sync::Arc<WatchdogHandles>,
}

#[cfg(feature = "metrics")]
struct WatchdogHandles {
    /// By [`Renewal`], in its declaration order.
    renewals: [metrics::Counter; 3],
    renewal_lag: metrics::Histogram,
    leases_lost: metrics::Counter,
    holds: metrics::Gauge,
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for WatchdogHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchdogHandles").finish_non_exhaustive()
    }
}

impl WatchdogMetrics {
    /// Registers the handles with the installed recorder.
    pub fn register() -> WatchdogMetrics {
        #[cfg(feature = "metrics")]
        {
            let renewals = [Renewal::Renewed, Renewal::Lost, Renewal::Error]
                .map(|r| metrics::counter!(names::RENEWALS, "outcome" => r.as_str()));
            WatchdogMetrics {
                inner: std::sync::Arc::new(WatchdogHandles {
                    renewals,
                    renewal_lag: metrics::histogram!(names::RENEWAL_LAG),
                    leases_lost: metrics::counter!(names::LEASES_LOST),
                    holds: metrics::gauge!(names::HOLDS),
                }),
            }
        }
        #[cfg(not(feature = "metrics"))]
        WatchdogMetrics {}
    }

    /// A renewal's verdict.
    #[inline]
    pub fn renewal(&self, verdict: Renewal) {
        #[cfg(feature = "metrics")]
        self.inner.renewals[verdict as usize].increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = verdict;
    }

    /// A renewal went out `lag` after its due time.
    #[inline]
    pub fn renewal_lag(&self, lag: std::time::Duration) {
        #[cfg(feature = "metrics")]
        self.inner.renewal_lag.record(lag.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = lag;
    }

    /// A lease was lost.
    #[inline]
    pub fn lease_lost(&self) {
        #[cfg(feature = "metrics")]
        self.inner.leases_lost.increment(1);
    }

    /// The number of grants held changed by `change`.
    #[inline]
    pub fn holds(&self, change: f64) {
        #[cfg(feature = "metrics")]
        self.inner.holds.increment(change);
        #[cfg(not(feature = "metrics"))]
        let _ = change;
    }
}

/// The release subscriber's metrics (one set per client).
#[derive(Clone, Debug)]
pub struct SubscriberMetrics {
    #[cfg(feature = "metrics")]
    inner: std::sync::Arc<SubscriberHandles>,
}

#[cfg(feature = "metrics")]
struct SubscriberHandles {
    waiters: metrics::Gauge,
    reconnects: metrics::Counter,
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for SubscriberHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberHandles").finish_non_exhaustive()
    }
}

impl SubscriberMetrics {
    /// Registers the handles with the installed recorder.
    pub fn register() -> SubscriberMetrics {
        #[cfg(feature = "metrics")]
        {
            SubscriberMetrics {
                inner: std::sync::Arc::new(SubscriberHandles {
                    waiters: metrics::gauge!(names::WAITERS),
                    reconnects: metrics::counter!(names::RECONNECTS),
                }),
            }
        }
        #[cfg(not(feature = "metrics"))]
        SubscriberMetrics {}
    }

    /// The number of local waiters changed by `change`.
    #[inline]
    pub fn waiters(&self, change: f64) {
        #[cfg(feature = "metrics")]
        self.inner.waiters.increment(change);
        #[cfg(not(feature = "metrics"))]
        let _ = change;
    }

    /// The subscriber reconnected.
    #[inline]
    pub fn reconnect(&self) {
        #[cfg(feature = "metrics")]
        self.inner.reconnects.increment(1);
    }
}
