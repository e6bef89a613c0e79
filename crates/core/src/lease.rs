//! [`Lease`]: how long a hold lasts without renewal, checked once and carried as a value.

use std::time::Duration;

use tokio::time::Instant;

use crate::{LockError, Result};

/// The longest lease leasehold accepts: 100 years.
///
/// PEXPIRE itself takes up to about 292 million years, but leases also become tokio deadlines
/// (`Instant + lease`), which must not overflow. A century is far beyond any real job.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A checked lease: between 1 ms and [`MAX_LEASE`], with its whole milliseconds (what PEXPIRE
/// takes) computed once.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::Lease;
/// let lease = Lease::new(Duration::from_secs(30)).unwrap();
/// assert_eq!(lease.millis(), 30_000);
/// assert_eq!(lease.drift(), Duration::from_millis(302));
/// assert!(Lease::new(Duration::ZERO).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    duration: Duration,
    millis: u64,
}

impl Lease {
    /// Checks `duration` as a lease.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a lease under one millisecond (Redis would expire the
    /// key at once) or over [`MAX_LEASE`].
    pub fn new(duration: Duration) -> Result<Lease> {
        if duration < Duration::from_millis(1) {
            return Err(LockError::InvalidArgument(format!(
                "lease {duration:?} is under one millisecond: a lock needs a lease of at least 1 ms"
            )));
        }
        if duration > MAX_LEASE {
            return Err(LockError::InvalidArgument(format!(
                "lease {duration:?} is over the maximum of {MAX_LEASE:?}"
            )));
        }
        Ok(Lease {
            duration,
            millis: duration.as_millis() as u64,
        })
    }

    /// The lease as given.
    pub fn duration(self) -> Duration {
        self.duration
    }

    /// The lease in whole milliseconds, as PEXPIRE takes it.
    pub fn millis(self) -> u64 {
        self.millis
    }

    /// The drift allowance subtracted from the lease when computing a local validity deadline:
    /// 1% of the lease plus 2 ms, for clock rate differences and scheduling delay (the Redlock
    /// rule).
    pub fn drift(self) -> Duration {
        self.duration / 100 + Duration::from_millis(2)
    }

    /// Until when a lease granted (or renewed) by a command sent at `sent_at` is certainly valid
    /// here: the lease minus its [drift](Lease::drift), measured from the send. Redis cannot have
    /// started the lease before the command was sent, so this falls before the real expiry.
    pub fn valid_until(self, sent_at: Instant) -> Instant {
        sent_at + self.duration.saturating_sub(self.drift())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(Lease::new(Duration::ZERO).is_err());
        assert!(Lease::new(Duration::from_micros(999)).is_err());
        assert_eq!(Lease::new(Duration::from_millis(1)).unwrap().millis(), 1);
        assert_eq!(
            Lease::new(MAX_LEASE).unwrap().millis(),
            MAX_LEASE.as_millis() as u64
        );
        assert!(Lease::new(MAX_LEASE + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn validity_is_lease_minus_drift_from_the_send() {
        let lease = Lease::new(Duration::from_secs(30)).unwrap();
        let sent = Instant::now();
        assert_eq!(
            lease.valid_until(sent),
            sent + Duration::from_millis(29_698)
        );
        let tiny = Lease::new(Duration::from_millis(1)).unwrap();
        assert_eq!(tiny.valid_until(sent), sent, "never before the send");
    }
}
