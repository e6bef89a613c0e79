//! Release wake-ups for leasehold waiters: one shared subscriber connection per client.
//!
//! A waiter registers [`Interest`] in a lock's release channel before its last try (so a release
//! published between the failed try and the wait is not lost: the `tokio::sync::Notify`
//! `enable()` rule), then waits for a wake-up or a timer. The [`ReleaseNotifier`]:
//!
//! - subscribes a channel when its first local waiter arrives and unsubscribes it when the last
//!   one leaves (interest is reference-counted per channel);
//! - wakes ONE local waiter per release message, so a release does not start a thundering herd
//!   of retries in one process; and when the release names whose turn it is (the lock's turn
//!   queue of clients with waiters), only that client wakes one, the others stand by for
//!   [`TURN_GRACE`] in case it does not take the lock;
//! - wakes ALL local waiters when messages may have been lost: the receiver lagged behind fred's
//!   broadcast channel, or the subscriber connection was re-established (after subscribing
//!   its channels again, retried until Redis answers);
//! - never becomes the only way to wake up: pub/sub is at-most-once, so waiters also wake when
//!   the holder's lease would end (an expired key publishes nothing).
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod notifier;

pub use notifier::{Interest, ReleaseNotifier, TURN_GRACE};
