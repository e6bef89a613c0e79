//! The shared subscriber and its per-channel interest counts.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{EventInterface, PubsubInterface};
use fred::prelude::Error as FredError;
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// One channel's waiters.
struct Channel {
    name: String,
    /// Woken once per release message, or all at once after possible message loss.
    notify: Notify,
    /// Whether Redis has (or is getting) our subscription, as seen by new waiters. Read and
    /// written under the channel-map lock so "last waiter left" and "new waiter came" serialize.
    subscribed: AtomicBool,
    /// Serializes SUBSCRIBE/UNSUBSCRIBE of this channel; the bool is what Redis was last told.
    redis_state: tokio::sync::Mutex<bool>,
    /// Bumped by every message; a fallback wake-up fires only if no message came after it.
    epoch: AtomicU64,
}

struct Slot {
    channel: Arc<Channel>,
    refs: usize,
}

struct Inner {
    subscriber: SubscriberClient,
    /// This client's id: release messages addressed to it wake a local waiter.
    client_id: String,
    channels: Mutex<HashMap<String, Slot>>,
    waiters: AtomicUsize,
    wake_alls: AtomicUsize,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// The per-client release listener. Cheap to clone.
#[derive(Clone)]
pub struct ReleaseNotifier {
    inner: Arc<Inner>,
}

impl fmt::Debug for ReleaseNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseNotifier")
            .field("channels", &self.subscribed_channels())
            .field("waiters", &self.waiters())
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

impl ReleaseNotifier {
    /// Starts listening on `subscriber`, which must be connected (or connecting) with a
    /// reconnect policy. After every reconnect the tracked channels are subscribed again and
    /// then all local waiters are woken: messages published while the connection was down are
    /// gone.
    pub fn start(subscriber: SubscriberClient, client_id: impl Into<String>) -> ReleaseNotifier {
        let inner = Arc::new(Inner {
            subscriber,
            client_id: client_id.into(),
            channels: Mutex::new(HashMap::new()),
            waiters: AtomicUsize::new(0),
            wake_alls: AtomicUsize::new(0),
            tasks: Mutex::new(Vec::new()),
        });
        let receive = tokio::spawn(receive_loop(Arc::downgrade(&inner)));
        inner.tasks.lock().push(receive);
        ReleaseNotifier { inner }
    }

    /// The subscriber connection.
    pub fn subscriber(&self) -> &SubscriberClient {
        &self.inner.subscriber
    }

    /// Waiters currently between [`ReleaseNotifier::interest`] and dropping their [`Interest`].
    pub fn waiters(&self) -> usize {
        self.inner.waiters.load(Ordering::SeqCst)
    }

    /// Channels with at least one local waiter.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.channels.lock().len()
    }

    /// How many times every waiter was woken because messages may have been lost.
    pub fn wake_alls(&self) -> usize {
        self.inner.wake_alls.load(Ordering::Relaxed)
    }

    /// Local waiters on `channel` (registered [`Interest`]s).
    pub fn waiters_on(&self, channel: &str) -> usize {
        self.inner
            .channels
            .lock()
            .get(channel)
            .map_or(0, |slot| slot.refs)
    }

    /// Whether interest in `channel` can be had without a round trip (someone here already
    /// waits on it). Waiters use it to register interest before their first try.
    pub fn is_subscribed(&self, channel: &str) -> bool {
        self.inner
            .channels
            .lock()
            .get(channel)
            .is_some_and(|slot| slot.channel.subscribed.load(Ordering::SeqCst))
    }

    /// Registers interest in `channel`, subscribing it when this is the first local waiter.
    /// When this returns, the subscription is active in Redis: any release published from now
    /// on reaches [`Interest::notified`].
    ///
    /// # Cancel safety
    /// Cancel safe. The SUBSCRIBE runs in its own task, so a caller dropped mid-way cannot leave
    /// Redis subscribed without our bookkeeping knowing; the dropped [`Interest`] then
    /// unsubscribes if it was the last one.
    pub async fn interest(&self, channel: &str) -> Result<Interest, FredError> {
        let (channel, subscribed) = {
            let mut map = self.inner.channels.lock();
            let slot = map.entry(channel.to_string()).or_insert_with(|| Slot {
                channel: Arc::new(Channel {
                    name: channel.to_string(),
                    notify: Notify::new(),
                    subscribed: AtomicBool::new(false),
                    redis_state: tokio::sync::Mutex::new(false),
                    epoch: AtomicU64::new(0),
                }),
                refs: 0,
            });
            slot.refs += 1;
            (
                slot.channel.clone(),
                slot.channel.subscribed.load(Ordering::SeqCst),
            )
        };
        self.inner.waiters.fetch_add(1, Ordering::SeqCst);
        let interest = Interest {
            inner: self.inner.clone(),
            channel,
        };
        if !subscribed {
            let task = tokio::spawn(subscribe(self.inner.clone(), interest.channel.clone()));
            task.await
                .map_err(|e| FredError::new(fred::error::ErrorKind::Canceled, e.to_string()))??;
        }
        Ok(interest)
    }
}

async fn subscribe(inner: Arc<Inner>, channel: Arc<Channel>) -> Result<(), FredError> {
    let mut in_redis = channel.redis_state.lock().await;
    if !*in_redis {
        inner.subscriber.subscribe(channel.name.as_str()).await?;
        *in_redis = true;
    }
    channel.subscribed.store(true, Ordering::SeqCst);
    Ok(())
}

/// Unsubscribes `channel` if nobody took interest again meanwhile, then forgets it.
async fn unsubscribe(inner: Arc<Inner>, channel: Arc<Channel>) {
    let mut in_redis = channel.redis_state.lock().await;
    let proceed = {
        let map = inner.channels.lock();
        match map.get(&channel.name) {
            Some(slot) if Arc::ptr_eq(&slot.channel, &channel) && slot.refs == 0 => {
                channel.subscribed.store(false, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    };
    if !proceed {
        return;
    }
    if *in_redis {
        if let Err(error) = inner.subscriber.unsubscribe(channel.name.as_str()).await {
            // fred keeps a channel it could not unsubscribe among those it resubscribes; the
            // reconnect path (resubscribe) drops every channel this map no longer has.
            tracing::debug!(%error, channel = %channel.name, "unsubscribe failed");
        }
        *in_redis = false;
    }
    let mut map = inner.channels.lock();
    if let Some(slot) = map.get(&channel.name) {
        if Arc::ptr_eq(&slot.channel, &channel) && slot.refs == 0 {
            map.remove(&channel.name);
        }
    }
}

async fn receive_loop(inner: std::sync::Weak<Inner>) {
    let (mut messages, mut reconnects) = match inner.upgrade() {
        Some(inner) => (
            inner.subscriber.message_rx(),
            inner.subscriber.reconnect_rx(),
        ),
        None => return,
    };
    loop {
        tokio::select! {
            message = messages.recv() => {
                let Some(inner) = inner.upgrade() else { return };
                match message {
                    Ok(message) => {
                        let channel = inner.channels.lock().get(&*message.channel).map(|s| s.channel.clone());
                        if let Some(channel) = channel {
                            on_message(&inner, &channel, message.value.as_str().as_deref().unwrap_or("*"));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "release listener lagged: waking every waiter");
                        wake_all(&inner);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
            reconnect = reconnects.recv() => {
                let Some(inner) = inner.upgrade() else { return };
                match reconnect {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        // Resubscribe first, then wake: a waiter that retries and fails must
                        // find its channel subscribed again, or the next release is lost.
                        tokio::spawn(resubscribe(Arc::downgrade(&inner)));
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}

/// After a reconnect: drops the channels fred still tracks but no waiter wants (an UNSUBSCRIBE
/// that failed leaves them tracked), subscribes the others again, then wakes every waiter so
/// it reads the lock state afresh. Retried with backoff until Redis answers: until then a
/// release would reach nobody, and waiters would only wake on their timers.
async fn resubscribe(inner: std::sync::Weak<Inner>) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let stale: Vec<String> = {
            let map = strong.channels.lock();
            strong
                .subscriber
                .tracked_channels()
                .into_iter()
                .filter(|channel| !map.contains_key(&**channel))
                .map(|channel| channel.to_string())
                .collect()
        };
        let subscriber = strong.subscriber.clone();
        let result = async {
            if !stale.is_empty() {
                subscriber.unsubscribe(stale).await?;
            }
            subscriber.resubscribe_all().await
        }
        .await;
        wake_all(&strong);
        match result {
            Ok(()) => return,
            Err(error) => tracing::warn!(%error, "resubscribe after reconnect failed; retrying"),
        }
        drop(strong);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// How long other clients wait for the addressed client to take its turn before trying
/// themselves (the release reserves the lock for that long): covers an addressee that crashed
/// or whose waiter just left.
pub const TURN_GRACE: Duration = leasehold_core::commands::TURN_GRACE;

/// One release-channel message. The payload says whose turn it is:
/// - this client's id, or `*` (nobody queued; also force unlock, rollback): wake one waiter;
/// - `-`: a waiter took the lock; cancel any pending fallback;
/// - another client's id: that client should take the lock; wake one waiter here only if no
///   further message arrives within [`TURN_GRACE`].
fn on_message(inner: &Inner, channel: &Arc<Channel>, payload: &str) {
    let epoch = channel.epoch.fetch_add(1, Ordering::SeqCst) + 1;
    if payload == "-" {
        return;
    }
    if payload == "*" || payload == inner.client_id {
        channel.notify.notify_one();
        return;
    }
    let channel = channel.clone();
    tokio::spawn(async move {
        // A hair past the reservation, so the try finds it expired.
        tokio::time::sleep(TURN_GRACE + Duration::from_millis(2)).await;
        if channel.epoch.load(Ordering::SeqCst) == epoch {
            channel.notify.notify_one();
        }
    });
}

fn wake_all(inner: &Inner) {
    inner.wake_alls.fetch_add(1, Ordering::Relaxed);
    for slot in inner.channels.lock().values() {
        slot.channel.notify.notify_waiters();
    }
}

/// One waiter's interest in one release channel. Dropping it lets the channel be unsubscribed
/// when it was the last.
pub struct Interest {
    inner: Arc<Inner>,
    channel: Arc<Channel>,
}

impl fmt::Debug for Interest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interest")
            .field("channel", &self.channel.name)
            .finish()
    }
}

impl Interest {
    /// A future that completes on the next wake-up for this channel. Call
    /// [`Notified::enable`] on it (pinned) BEFORE the try whose failure leads to waiting, so a
    /// release in between is not missed.
    pub fn notified(&self) -> Notified<'_> {
        self.channel.notify.notified()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        self.inner.waiters.fetch_sub(1, Ordering::SeqCst);
        let last = {
            let mut map = self.inner.channels.lock();
            match map.get_mut(&self.channel.name) {
                Some(slot) if Arc::ptr_eq(&slot.channel, &self.channel) => {
                    slot.refs -= 1;
                    slot.refs == 0
                }
                _ => false,
            }
        };
        if last {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(unsubscribe(self.inner.clone(), self.channel.clone()));
            }
        }
    }
}
