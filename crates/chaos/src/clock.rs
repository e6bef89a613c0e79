//! One clock for every process of a run: `CLOCK_MONOTONIC`, in microseconds.
//!
//! `CLOCK_MONOTONIC` is system-wide on Linux, so readings taken by different processes compare
//! directly, and it keeps running while a process is SIGSTOPped. tokio's `Instant` reads the same
//! clock, so nothing in the history depends on wall time (which NTP may step).

use nix::time::{clock_gettime, ClockId};

/// Microseconds on `CLOCK_MONOTONIC`.
pub fn now_us() -> i64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always readable");
    ts.tv_sec() * 1_000_000 + ts.tv_nsec() / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_std_instant() {
        let a = now_us();
        let i = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_us();
        let elapsed = i.elapsed().as_micros() as i64;
        assert!(b - a >= 20_000, "{}", b - a);
        assert!((b - a - elapsed).abs() < 5_000, "{} vs {elapsed}", b - a);
    }
}
