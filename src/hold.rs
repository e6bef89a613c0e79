//! [`Hold`]: the lease API every guard shares, so that generic code can hold any kind.
//!
//! A [`LockGuard`], a semaphore's [`Permit`], a [`MultiLockGuard`] and a RedLock's
//! [`QuorumGuard`] each say whether their lease is still certainly valid, until when, and when
//! it is lost; each can run work only while it holds. Their own methods stay (no import needed
//! for the common case); the trait is for code that takes "whatever the caller holds": a job
//! runner, a store that checks the lease before a write, a health report.
//!
//! Release stays with each type (`unlock`, `release`): what a release reports differs by kind
//! (a quorum's partial release, a permit's id), and dropping any guard releases it anyway.

use std::future::Future;

use leasehold_core::Result;
use tokio::time::Instant;

use crate::{LockGuard, MultiLockGuard, Permit, QuorumGuard};

/// A held lease of any kind: a lock's, a set of locks', a quorum's or a semaphore permit's.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// use leasehold::Hold;
///
/// /// Runs a step of a job under whatever the caller holds, and says how long is left.
/// async fn step<H: Hold>(hold: &H) -> leasehold::Result<std::time::Duration> {
///     hold.run_while_held(async { /* the step's writes */ }).await?;
///     Ok(hold.valid_until().saturating_duration_since(tokio::time::Instant::now()))
/// }
///
/// let client = leasehold::LockClient::connect(&url).await?;
/// let lock = client.lock("nightly-report")?;
/// let guard = lock.lock().await?;
/// step(&guard).await?;
/// let exports = client.semaphore("exports")?;
/// exports.try_set_permits(2).await?;
/// let permit = exports.acquire(1).await?;
/// step(&permit).await?;
/// permit.release().await?;
/// guard.unlock().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
pub trait Hold {
    /// Whether the lease is still certainly valid. `false` is final.
    fn is_held(&self) -> bool;

    /// The instant until which the lease is certainly valid, unless renewed further.
    fn valid_until(&self) -> Instant;

    /// Completes as soon as the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    fn lost(&self) -> impl Future<Output = ()> + Send;

    /// Runs `work` while the lease is held: its output, or [`LockError::LeaseLost`](crate::LockError::LeaseLost) as soon
    /// as the lease is lost (at once when it is lost already).
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work`.
    fn run_while_held<F: Future + Send>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<F::Output>> + Send;
}

/// Each guard's own methods, as the trait's: the four types keep their inherent API (no import
/// needed), and generic code gets the same calls.
macro_rules! hold_by_own_methods {
    ($($guard:ty),+) => {$(
        impl Hold for $guard {
            fn is_held(&self) -> bool {
                <$guard>::is_held(self)
            }

            fn valid_until(&self) -> Instant {
                <$guard>::valid_until(self)
            }

            fn lost(&self) -> impl Future<Output = ()> + Send {
                <$guard>::lost(self)
            }

            fn run_while_held<F: Future + Send>(
                &self,
                work: F,
            ) -> impl Future<Output = Result<F::Output>> + Send {
                <$guard>::run_while_held(self, work)
            }
        }
    )+};
}

hold_by_own_methods!(LockGuard<'_>, Permit, MultiLockGuard<'_>, QuorumGuard<'_>);
