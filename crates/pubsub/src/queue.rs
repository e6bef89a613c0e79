//! One lock's local FIFO of waiters, and a waiter's [`Place`] in it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use leasehold_core::LockError;
use tokio::sync::Notify;

use crate::notifier::{Channel, Inner};

/// One waiter's wake-up cell. `notify_one` leaves a permit when the waiter is not parked, so a
/// wake-up that comes while it is trying is not lost (the `Notify` rule).
pub(crate) struct Cell {
    pub(crate) notify: Notify,
}

/// The waiters of one channel on this client, oldest first.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) cells: VecDeque<Arc<Cell>>,
}

impl Queue {
    /// Wakes the head, if any.
    pub(crate) fn wake_head(&self) {
        if let Some(head) = self.cells.front() {
            head.notify.notify_one();
        }
    }
}

/// A waiter's place in its lock's local queue. Dropping it leaves the queue; the next waiter
/// becomes head and is woken.
pub struct Place {
    pub(crate) inner: Arc<Inner>,
    pub(crate) channel: Arc<Channel>,
    pub(crate) cell: Arc<Cell>,
    left: bool,
}

impl fmt::Debug for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Place")
            .field("channel", &self.channel.name)
            .field("head", &self.is_head())
            .finish()
    }
}

impl Place {
    pub(crate) fn new(inner: Arc<Inner>, channel: Arc<Channel>) -> Place {
        let cell = Arc::new(Cell {
            notify: Notify::new(),
        });
        channel.queue.lock().cells.push_back(cell.clone());
        inner.waiters.fetch_add(1, Ordering::SeqCst);
        inner.metrics.waiters(1.0);
        Place {
            inner,
            channel,
            cell,
            left: false,
        }
    }

    /// Whether this waiter is the head of its queue: the one that talks to Redis.
    pub fn is_head(&self) -> bool {
        self.channel
            .queue
            .lock()
            .cells
            .front()
            .is_some_and(|head| Arc::ptr_eq(head, &self.cell))
    }

    /// Waits until this waiter heads its queue; false if `deadline` passes first.
    ///
    /// # Cancel safety
    /// Cancel safe: a promotion that arrives after the future was dropped stays as a permit.
    pub async fn until_head(&self, deadline: Option<tokio::time::Instant>) -> bool {
        loop {
            if self.is_head() {
                return true;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, self.woken())
                        .await
                        .is_err()
                    {
                        return self.is_head();
                    }
                }
                None => self.woken().await,
            }
        }
    }

    /// The grant this channel last heard for `owner` (its token and its lease in ms), if its
    /// token is above `seen` (the holder's token when this waiter's last try in line ran: a
    /// token at most that old is a grant of an earlier wait).
    pub fn granted(&self, owner: &str, seen: u64) -> Option<(u64, u64)> {
        self.channel
            .granted
            .lock()
            .as_ref()
            .filter(|(fence, _, to)| *fence > seen && to == owner)
            .map(|(fence, lease_ms, _)| (*fence, *lease_ms))
    }

    /// Completes on the next wake-up of this place: a message while it is head (a grant, or
    /// "look again"), promotion to head, or a possible message loss.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake-up that arrives after the future was dropped stays as a permit.
    pub async fn woken(&self) {
        self.cell.notify.notified().await
    }

    /// Whether Redis has this channel's subscription (as far as this client knows).
    pub fn is_subscribed(&self) -> bool {
        self.channel.is_subscribed()
    }

    /// Makes sure the channel is subscribed in Redis, connecting the subscriber on first use.
    /// When this returns `Ok`, any message published from now on reaches this client.
    ///
    /// # Cancel safety
    /// Cancel safe: the connection and the SUBSCRIBE run in tasks of their own, and the
    /// bookkeeping follows what Redis was told whether or not this future is still there.
    pub async fn subscribe(&self) -> Result<(), LockError> {
        crate::notifier::subscribe(&self.inner, &self.channel).await
    }

    /// Leaves the queue; the next waiter (now head) is woken. Returns true when the queue is
    /// now empty: no waiter of this client wants the lock any more.
    pub fn leave(mut self) -> bool {
        self.left = true;
        self.remove()
    }

    fn remove(&mut self) -> bool {
        self.inner.waiters.fetch_sub(1, Ordering::SeqCst);
        self.inner.metrics.waiters(-1.0);
        let empty = {
            let mut queue = self.channel.queue.lock();
            let was_head = queue
                .cells
                .front()
                .is_some_and(|head| Arc::ptr_eq(head, &self.cell));
            queue.cells.retain(|cell| !Arc::ptr_eq(cell, &self.cell));
            if was_head {
                if let Some(next) = queue.cells.front() {
                    // Promotion: the next waiter learns it is head.
                    next.notify.notify_one();
                }
            }
            queue.cells.is_empty()
        };
        if empty {
            crate::notifier::idle(&self.inner, &self.channel);
        }
        empty
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.left {
            self.remove();
        }
    }
}
