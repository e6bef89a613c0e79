//! Lease durations: what Redis's PEXPIRE can take, checked before anything is sent.

use std::time::Duration;

use crate::{LockError, Result};

/// The longest lease leasehold accepts: 100 years.
///
/// PEXPIRE itself takes up to about 292 million years, but leases also become tokio deadlines
/// (`Instant + lease`), which must not overflow. A century is far beyond any real job.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A lease in whole milliseconds, as PEXPIRE takes it.
///
/// # Errors
/// [`LockError::InvalidArgument`] for a lease under one millisecond (Redis would expire the key
/// at once) or over [`MAX_LEASE`].
pub fn lease_millis(lease: Duration) -> Result<u64> {
    if lease < Duration::from_millis(1) {
        return Err(LockError::InvalidArgument(format!(
            "lease {lease:?} is under one millisecond: a lock needs a lease of at least 1 ms"
        )));
    }
    if lease > MAX_LEASE {
        return Err(LockError::InvalidArgument(format!(
            "lease {lease:?} is over the maximum of {MAX_LEASE:?}"
        )));
    }
    Ok(lease.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(lease_millis(Duration::ZERO).is_err());
        assert!(lease_millis(Duration::from_micros(999)).is_err());
        assert_eq!(lease_millis(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(
            lease_millis(MAX_LEASE).unwrap(),
            MAX_LEASE.as_millis() as u64
        );
        assert!(lease_millis(MAX_LEASE + Duration::from_millis(1)).is_err());
    }
}
