//! Release wake-ups for leasehold waiters: one shared subscriber connection per client, and one
//! local FIFO of waiters per lock.
//!
//! A waiter takes a [`Place`] in its lock's local queue ([`ReleaseNotifier::join`]) before
//! anything else. Only the queue's head talks to Redis; the others wait their turn, so a task
//! that releases and asks again at once lines up behind its client's earlier waiters instead of
//! barging past them. The [`ReleaseNotifier`]:
//!
//! - subscribes a channel when its head first needs to wait ([`Place::subscribe`]) and
//!   unsubscribes it once nobody has waited on it for the linger period (a process that locks
//!   the same name again soon keeps its subscription and pays no SUBSCRIBE/UNSUBSCRIBE);
//! - wakes the head of a channel's queue on every message: a grant (`=<token>:<owner>`, kept
//!   for the waiter it names: [`Place::granted`]) or "look again" (`*`);
//! - wakes every head when messages may have been lost: the receiver lagged behind fred's
//!   broadcast channel, or the subscriber connection was re-established (after subscribing its
//!   channels again, retried until Redis answers);
//! - is never the only way to wake up: pub/sub is at-most-once, so the head also sleeps no
//!   longer than the holder's remaining lease, which the acquire reply carries.
#![deny(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod notifier;
mod queue;

#[doc(hidden)]
pub use notifier::{set_subscribed_hook, SubscribedHook};
pub use notifier::{NotifierSettings, ReleaseNotifier, SHARD_CHECK};
pub use queue::Place;
