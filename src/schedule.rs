//! Run-once scheduled jobs: the seed's 2 a.m. report, ShedLock's `@SchedulerLock`.

use std::future::Future;
use std::time::Duration;

use leasehold_core::{LockError, Result};
use tokio::time::Instant;

use crate::Lock;

/// How long a scheduled run keeps its lock (ShedLock's `lockAtMostFor` / `lockAtLeastFor`).
///
/// ```
/// use std::time::Duration;
/// use leasehold::schedule::RunOnceOptions;
/// let options = RunOnceOptions {
///     hold_at_most: Duration::from_secs(600),
///     hold_at_least: Duration::from_secs(30),
/// };
/// let built = RunOnceOptions::at_most(Duration::from_secs(600)).at_least(Duration::from_secs(30));
/// assert_eq!(options, built);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOnceOptions {
    /// The lock is held at most this long, even if this instance dies mid-job: the lease.
    /// Pick it well above the job's normal duration. No watchdog renews it.
    pub hold_at_most: Duration,
    /// The lock is held at least this long from the start, even if the job finishes early, so
    /// an instance whose scheduler fires a little late (clock skew) does not run it again.
    pub hold_at_least: Duration,
}

impl RunOnceOptions {
    /// Hold at most `hold_at_most`, and at least nothing extra: the lock is free as soon as
    /// the job ends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::schedule::RunOnceOptions;
    /// // The job takes about a minute: should this instance die mid-run, the lock still ends
    /// // 10 min after the start.
    /// let options = RunOnceOptions::at_most(Duration::from_secs(600));
    /// assert_eq!(options.hold_at_least, Duration::ZERO);
    /// ```
    pub fn at_most(hold_at_most: Duration) -> RunOnceOptions {
        RunOnceOptions {
            hold_at_most,
            hold_at_least: Duration::ZERO,
        }
    }

    /// Also hold at least `hold_at_least` from the start: longer than the instances' scheduler
    /// clocks differ, so a run that ends at once still keeps a late instance out.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::schedule::RunOnceOptions;
    /// // The instances' clocks differ by a few seconds: keep the slot 30 s, however short the run.
    /// let options = RunOnceOptions::at_most(Duration::from_secs(600))
    ///     .at_least(Duration::from_secs(30));
    /// assert_eq!(options.hold_at_least, Duration::from_secs(30));
    /// ```
    pub fn at_least(mut self, hold_at_least: Duration) -> RunOnceOptions {
        self.hold_at_least = hold_at_least;
        self
    }
}

/// The outcome of [`run_once`].
#[derive(Debug, PartialEq, Eq)]
pub enum RunOnce<T> {
    /// This instance ran the job.
    Ran(T),
    /// Another instance holds the lock (is running it, or ran it within `hold_at_least`).
    Skipped,
}

/// Runs `job` if no other instance is running it: tries the lock once without waiting
/// (`tryLock(0, ...)`); when taken, returns [`RunOnce::Skipped`] at once.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// use std::time::Duration;
/// use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
///
/// let client = leasehold::LockClient::connect(&url).await?;
/// let lock = client.lock("report:daily")?;
/// let options = RunOnceOptions::at_most(Duration::from_secs(600)).at_least(Duration::from_secs(30));
/// match run_once(&lock, options, async { "report sent" }).await? {
///     RunOnce::Ran(outcome) => println!("{outcome}"),
///     RunOnce::Skipped => println!("another instance is running the report; skipping"),
/// }
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] when `hold_at_least` exceeds `hold_at_most` or a duration is
/// out of range; Redis errors from the acquire. An error releasing afterwards is logged, not
/// returned: the job already ran, and the lease ends the hold.
///
/// # Cancel safety
/// Dropping the future drops the job; the hold is released in the background.
pub async fn run_once<F: Future>(
    lock: &Lock,
    options: RunOnceOptions,
    job: F,
) -> Result<RunOnce<F::Output>> {
    if options.hold_at_least > options.hold_at_most {
        return Err(LockError::InvalidArgument(format!(
            "hold_at_least {:?} exceeds hold_at_most {:?}",
            options.hold_at_least, options.hold_at_most
        )));
    }
    let started = Instant::now();
    let Some(guard) = lock.try_lock_with_lease(options.hold_at_most).await? else {
        return Ok(RunOnce::Skipped);
    };
    let output = job.await;
    let rest = options.hold_at_least.saturating_sub(started.elapsed());
    let released = if rest >= Duration::from_millis(1) {
        guard.unlock_after(rest).await
    } else {
        guard.unlock().await
    };
    if let Err(error) = released {
        tracing::warn!(lock = %lock.name(), %error, "releasing after a scheduled run failed; the lease ends the hold");
    }
    Ok(RunOnce::Ran(output))
}
