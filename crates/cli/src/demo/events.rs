//! What a pod tells the demo: one JSON object per line on its stdout.
//!
//! Pods report facts (tokens, rows updated, timestamps) and the demo does all the telling, so
//! the account reads as one story however the pods' lines interleave, and the checks run on
//! numbers rather than on parsed prose.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One thing a pod did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PodEvent {
    /// Connected (and opened its store); waiting for `go` on stdin.
    Ready,
    /// Acquired the lock.
    Locked {
        /// The fencing token of the grant.
        fence: u64,
        /// Wall-clock time, microseconds since the Unix epoch.
        at_us: u64,
    },
    /// Read the stock of the product.
    Read {
        /// The stock it saw.
        stock: i64,
    },
    /// Wrote a sale with its fencing token.
    Wrote {
        /// Rows updated: 0 means a newer token had already written.
        rows: u64,
    },
    /// A shop pod stopped selling: the product is sold out.
    Sold {
        /// Units this pod sold.
        units: u64,
    },
    /// The daily report started on this pod.
    ReportStarted,
    /// Another pod holds the report's lock; this one skipped.
    ReportSkipped,
    /// The daily report finished.
    ReportDone {
        /// How long it took.
        took_ms: u64,
    },
    /// Started waiting for a lock with `lock()`.
    Waiting {
        /// Wall-clock time, microseconds since the Unix epoch.
        at_us: u64,
    },
    /// The long job finished while holding the lock.
    JobDone {
        /// How long it took.
        took_ms: u64,
        /// Holds the watchdog renewed meanwhile.
        renewed: u64,
        /// Whether the lease was lost during the job.
        lost: bool,
    },
    /// Released the lock (or tried to).
    Unlocked {
        /// When `unlock()` was called (epoch microseconds).
        called_at_us: u64,
        /// When it returned (epoch microseconds).
        returned_at_us: u64,
        /// Whether the lock was still held (false: its lease had ended before).
        held: bool,
    },
    /// Finished its role; about to exit 0.
    Done,
    /// Something went wrong; about to exit 1.
    Failed {
        /// The error, on one line.
        message: String,
    },
}

impl PodEvent {
    /// Writes the event as one line on stdout (a pipe: `println!` flushes at the newline).
    pub fn emit(&self) {
        match serde_json::to_string(self) {
            Ok(line) => println!("{line}"),
            Err(error) => {
                println!(r#"{{"event":"failed","message":"unprintable event: {error}"}}"#)
            }
        }
    }
}

/// Wall-clock microseconds since the Unix epoch. The demo's pods all run on one machine, so
/// their clocks agree well enough to compare to the millisecond.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json_lines() {
        let event = PodEvent::Locked {
            fence: 7,
            at_us: 42,
        };
        let line = serde_json::to_string(&event).unwrap();
        assert_eq!(line, r#"{"event":"locked","fence":7,"at_us":42}"#);
        assert_eq!(serde_json::from_str::<PodEvent>(&line).unwrap(), event);
        let ready: PodEvent = serde_json::from_str(r#"{"event":"ready"}"#).unwrap();
        assert_eq!(ready, PodEvent::Ready);
    }
}
