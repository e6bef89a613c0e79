//! The shared subscriber: its connection, channel subscriptions and the release messages.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use futures::future::{BoxFuture, FutureExt, Shared};
use leasehold_core::protocol::Message;
use leasehold_core::scripts::resend_not_run;
use leasehold_core::{LockError, RedisError};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use crate::queue::{Place, Queue};

/// How a [`ReleaseNotifier`] behaves.
#[derive(Clone, Debug)]
pub struct NotifierSettings {
    /// How long a channel stays subscribed after its last local waiter left.
    pub linger: Duration,
    /// How long connecting the subscriber may take.
    pub connect_timeout: Duration,
    /// Release channels are shard channels (`SSUBSCRIBE`; the scripts `SPUBLISH`): on Redis
    /// Cluster 7+, where a message then reaches only the nodes of the lock's shard instead of
    /// every node. The subscriber follows the channels' slots when they move (see
    /// [`SHARD_CHECK`]).
    pub sharded: bool,
}

/// How often a sharded subscriber that has subscriptions checks whether their slots moved
/// (a slot migration or a failover). Redis drops the shard subscriptions of a slot that leaves
/// a node and tells the client with a `sunsubscribe` message that fred does not pass on, so the
/// client looks: it resyncs its slot map (one `CLUSTER SLOTS`) and subscribes again where a
/// channel's owner changed, then wakes that channel's head (a release may have been missed).
/// This bounds a waiter's extra wake delay after a slot move to about this period.
pub const SHARD_CHECK: Duration = Duration::from_secs(1);

/// One channel: its local waiters and its subscription.
pub(crate) struct Channel {
    pub(crate) name: String,
    pub(crate) queue: Mutex<Queue>,
    /// Whether Redis has (or is getting) our subscription, as seen by waiters.
    subscribed: AtomicBool,
    /// Serializes SUBSCRIBE/UNSUBSCRIBE of this channel; the bool is what Redis was last told.
    redis_state: tokio::sync::Mutex<bool>,
    /// The latest grant heard on the channel: its fencing token, its lease (ms) and the owner
    /// granted. Tokens of one lock only rise, so the latest is the only one that can still be
    /// current.
    pub(crate) granted: Mutex<Option<(u64, u64, String)>>,
    /// Bumped whenever the queue empties or a waiter joins: a lingering unsubscribe proceeds
    /// only if nothing happened since it was planned.
    idle: AtomicU64,
    /// Sharded: the node the channel was last subscribed on (its slot's owner then).
    shard_owner: Mutex<Option<fred::types::config::Server>>,
}

impl Channel {
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscribed.load(Ordering::SeqCst)
    }
}

type Connecting = Shared<BoxFuture<'static, Result<(), String>>>;

pub(crate) struct Inner {
    subscriber: SubscriberClient,
    settings: NotifierSettings,
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    pub(crate) waiters: AtomicUsize,
    pub(crate) metrics: leasehold_core::telemetry::SubscriberMetrics,
    connected: AtomicBool,
    connecting: Mutex<Option<Connecting>>,
    /// Serializes what this client sends on the subscriber connection. fred answers SUBSCRIBE
    /// and UNSUBSCRIBE when they are written; Redis's error reply to one of them is then taken
    /// as the answer to the next command that waits for one (our PING): one at a time, that is
    /// the PING that follows it.
    sending: tokio::sync::Mutex<()>,
    /// Re-subscriptions after a reconnect, completed and failed (then retried).
    resyncs: AtomicU64,
    resync_failures: AtomicU64,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
        // fred does not close a client on drop: quit it, or the connection (and its unlimited
        // reconnects) would outlive us.
        let subscriber = self.subscriber.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = subscriber.quit().await;
            });
        }
    }
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

impl ReleaseNotifier {
    /// A listener on `subscriber`, which must have a reconnect policy and is connected on the
    /// first [`Place::subscribe`]: a client that never waits never opens it. After every
    /// reconnect the channels are subscribed again and then every head is woken: messages
    /// published while the connection was down are gone.
    pub fn new(subscriber: SubscriberClient, settings: NotifierSettings) -> ReleaseNotifier {
        let inner = Arc::new(Inner {
            subscriber,
            settings,
            channels: Mutex::new(HashMap::new()),
            waiters: AtomicUsize::new(0),
            metrics: leasehold_core::telemetry::SubscriberMetrics::register(),
            connected: AtomicBool::new(false),
            connecting: Mutex::new(None),
            sending: tokio::sync::Mutex::new(()),
            resyncs: AtomicU64::new(0),
            resync_failures: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
        });
        // Receivers taken now, before any connection exists, so no announcement is missed.
        let receivers = (
            inner.subscriber.message_rx(),
            inner.subscriber.reconnect_rx(),
        );
        let receive = tokio::spawn(receive_loop(Arc::downgrade(&inner), receivers));
        inner.tasks.lock().push(receive);
        if inner.settings.sharded {
            let follow = tokio::spawn(follow_slots(Arc::downgrade(&inner)));
            inner.tasks.lock().push(follow);
        }
        ReleaseNotifier { inner }
    }

    /// Takes a place at the back of `channel`'s local queue. No I/O.
    pub fn join(&self, channel: &str) -> Place {
        let channel = {
            let mut map = self.inner.channels.lock();
            map.entry(channel.to_string())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        name: channel.to_string(),
                        queue: Mutex::new(Queue::default()),
                        subscribed: AtomicBool::new(false),
                        redis_state: tokio::sync::Mutex::new(false),
                        granted: Mutex::new(None),
                        idle: AtomicU64::new(0),
                        shard_owner: Mutex::new(None),
                    })
                })
                .clone()
        };
        channel.idle.fetch_add(1, Ordering::SeqCst);
        Place::new(self.inner.clone(), channel)
    }

    /// Wakes the head of `channel`'s local line, if anyone waits there: a release this client
    /// made that its own waiters of that channel must hear, without a message (a release
    /// grants only the first waiter in Redis's line; the releasing owner's other futures wait
    /// locally). No I/O.
    pub fn wake(&self, channel: &str) {
        let channel = self.inner.channels.lock().get(channel).cloned();
        if let Some(channel) = channel {
            channel.queue.lock().wake_head();
        }
    }

    /// Waiters currently holding a [`Place`].
    pub fn waiters(&self) -> usize {
        self.inner.waiters.load(Ordering::SeqCst)
    }

    /// Channels subscribed in Redis right now, lingering ones included.
    pub fn subscribed_channels(&self) -> usize {
        self.inner
            .channels
            .lock()
            .values()
            .filter(|c| c.is_subscribed())
            .count()
    }

    /// Whether `channel` is subscribed (as far as this client knows).
    pub fn is_subscribed(&self, channel: &str) -> bool {
        self.inner
            .channels
            .lock()
            .get(channel)
            .is_some_and(|c| c.is_subscribed())
    }

    /// Re-subscriptions after a reconnect: (completed, failed and retried). For monitoring and
    /// tests: a failure that repeats means the subscriber connection cannot be trusted.
    pub fn resyncs(&self) -> (u64, u64) {
        (
            self.inner.resyncs.load(Ordering::SeqCst),
            self.inner.resync_failures.load(Ordering::SeqCst),
        )
    }
}

/// Connects the subscriber once, in a task of its own: a waiter dropped mid-connect neither
/// cancels it nor leaves a second connection behind; a failed connect is quit and tried afresh
/// by the next waiter.
async fn connected(inner: &Arc<Inner>) -> Result<(), LockError> {
    if inner.connected.load(Ordering::SeqCst) {
        return Ok(());
    }
    let connecting = inner
        .connecting
        .lock()
        .get_or_insert_with(|| {
            let subscriber = inner.subscriber.clone();
            let timeout = inner.settings.connect_timeout;
            let weak = Arc::downgrade(inner);
            let task = tokio::spawn(async move {
                let result = match tokio::time::timeout(timeout, subscriber.init()).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(_) => Err(format!("subscriber did not connect within {timeout:?}")),
                };
                let alive = weak.upgrade();
                if result.is_err() || alive.is_none() {
                    let _ = tokio::time::timeout(timeout, subscriber.quit()).await;
                }
                if let Some(inner) = alive {
                    match &result {
                        Ok(()) => inner.connected.store(true, Ordering::SeqCst),
                        Err(_) => *inner.connecting.lock() = None,
                    }
                }
                result
            });
            async move { task.await.unwrap_or_else(|e| Err(e.to_string())) }
                .boxed()
                .shared()
        })
        .clone();
    connecting
        .await
        .map_err(|e| LockError::Connection(RedisError::connection(e)))
}

pub(crate) async fn subscribe(inner: &Arc<Inner>, channel: &Arc<Channel>) -> Result<(), LockError> {
    if channel.is_subscribed() {
        return Ok(());
    }
    connected(inner).await?;
    let task = tokio::spawn(subscribe_task(inner.clone(), channel.clone()));
    task.await
        .map_err(|e| LockError::Connection(RedisError::connection(e.to_string())))?
}

async fn subscribe_task(inner: Arc<Inner>, channel: Arc<Channel>) -> Result<(), LockError> {
    let mut in_redis = channel.redis_state.lock().await;
    if channel.is_subscribed() {
        return Ok(()); // another waiter's subscribe ran while this one waited for the lock
    }
    // Held until the channel is marked below: a resubscribe after a reconnect, which takes
    // `sending` too, then counts this channel as wanted rather than stale.
    let _sending = inner.sending.lock().await;
    // From the moment the command is written, the subscription may be in Redis whatever the
    // answer says (a reply lost to a timeout or a dropped connection): `in_redis` says "may be",
    // so that the channel's unsubscribe, when its last waiter leaves, sends UNSUBSCRIBE for it.
    // Only a refusal proves it is not there.
    *in_redis = true;
    if inner.settings.sharded {
        // No PING needed: see shard_subscribe.
        shard_subscribe(&inner.subscriber, &channel)
            .await
            .map_err(LockError::from_redis)?;
    } else {
        // Taken before the SUBSCRIBE: a reconnect between it and the PING is seen.
        let mut reconnects = inner.subscriber.reconnect_rx();
        inner
            .subscriber
            .subscribe(channel.name.as_str())
            .await
            .map_err(LockError::from_redis)?;
        subscribed_hook(&inner.subscriber, &channel.name).await;
        // fred answers SUBSCRIBE as soon as it is written, before Redis ran it. A PING on the
        // same connection is answered only after it: from then on a release reaches us, which
        // is what the waiter's next try counts on. A refused SUBSCRIBE (ACL) must fail here.
        if let Err(error) = confirm_subscribed(&inner.subscriber, &mut reconnects).await {
            if matches!(error, LockError::PermissionDenied(_)) {
                *in_redis = false;
            }
            return Err(error);
        }
    }
    channel.subscribed.store(true, Ordering::SeqCst);
    Ok(())
}

/// Confirms with a PING that the SUBSCRIBE just written took effect.
///
/// Redis refuses a SUBSCRIBE the ACL forbids with an error reply, which fred, having answered
/// the SUBSCRIBE when it was written, hands to the next command waiting for a reply (this PING)
/// only when it arrives after the PING was queued; when it arrives before, fred drops it and the
/// PING succeeds. The reply's shape tells anyway: a connection with a subscription answers
/// PING with `["pong", message]`; one without (the refused SUBSCRIBE was its first) answers
/// the bare message. (A connection subscribed already answers with the array either way: a
/// refusal of one channel among others of the same prefix would go unnoticed, but an ACL
/// rule grants a prefix's channels together. Over RESP3 the shapes are the same, so only a
/// refusal fred passes on is seen.)
///
/// A reconnect between the SUBSCRIBE and the PING (a Sentinel failover, a dropped
/// connection) sends the PING on the new connection, not subscribed yet (the resubscribe waits
/// for this subscribe to end): a bare reply there is a transient connection error, and the
/// waiter subscribes again.
///
/// On a cluster the shape tells nothing: fred's clustered subscriber may send the PING to
/// another node than the SUBSCRIBE, whose connection has no subscription and answers the bare
/// message. There the PING still passes on an error fred hands it, but a bare reply is not
/// read as a refusal. (A refusal fred drops then goes unnoticed, as over RESP3: the waiter
/// still wakes on its timer, the holder's remaining lease.)
async fn confirm_subscribed(
    subscriber: &SubscriberClient,
    reconnects: &mut tokio::sync::broadcast::Receiver<fred::types::config::Server>,
) -> Result<(), LockError> {
    let clustered = subscriber.is_clustered();
    match subscriber
        .ping::<fred::types::Value>(Some("leasehold".into()))
        .await
    {
        Ok(fred::types::Value::Array(_)) => Ok(()),
        // (RESP3 answers PING alike with or without a subscription: nothing to tell there.)
        Ok(_) if subscriber.protocol_version() == fred::types::RespVersion::RESP3 => Ok(()),
        Ok(_) if clustered => Ok(()),
        Ok(_)
            if !matches!(
                reconnects.try_recv(),
                Err(tokio::sync::broadcast::error::TryRecvError::Empty)
            ) =>
        {
            Err(LockError::Connection(RedisError::connection(
                "the subscriber reconnected while subscribing",
            )))
        }
        Ok(_) => Err(LockError::PermissionDenied(RedisError::connection(
            "NOPERM SUBSCRIBE was refused (the connection is not subscribed to the channel): \
             check the user's channel rule (&prefix:*)",
        ))),
        Err(error) => Err(LockError::from_redis(error)),
    }
}

/// The last local waiter of `channel` left: unsubscribe after the linger period unless a
/// waiter comes back meanwhile.
pub(crate) fn idle(inner: &Arc<Inner>, channel: &Arc<Channel>) {
    let idle = channel.idle.fetch_add(1, Ordering::SeqCst) + 1;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let linger = inner.settings.linger;
    runtime.spawn(unsubscribe(
        Arc::downgrade(inner),
        channel.clone(),
        idle,
        linger,
    ));
}

/// Unsubscribes `channel` if it stayed idle since `idle`, then forgets it.
async fn unsubscribe(inner: Weak<Inner>, channel: Arc<Channel>, idle: u64, linger: Duration) {
    if !linger.is_zero() {
        tokio::time::sleep(linger).await;
    }
    let still_idle =
        || channel.idle.load(Ordering::SeqCst) == idle && channel.queue.lock().cells.is_empty();
    if !still_idle() {
        return;
    }
    let Some(strong) = inner.upgrade() else {
        return;
    };
    let mut in_redis = channel.redis_state.lock().await;
    if !still_idle() {
        return;
    }
    channel.subscribed.store(false, Ordering::SeqCst);
    if *in_redis {
        let _sending = strong.sending.lock().await;
        let unsubscribed = if strong.settings.sharded {
            resend_not_run(|| strong.subscriber.sunsubscribe(channel.name.as_str())).await
        } else {
            strong.subscriber.unsubscribe(channel.name.as_str()).await
        };
        if let Err(error) = unsubscribed {
            // fred keeps a channel it could not unsubscribe among those it resubscribes; the
            // reconnect path (resubscribe) drops every channel this map no longer has.
            tracing::debug!(%error, channel = %channel.name, "unsubscribe failed");
        }
        *in_redis = false;
    }
    let mut map = strong.channels.lock();
    if still_idle()
        && map
            .get(&channel.name)
            .is_some_and(|c| Arc::ptr_eq(c, &channel))
    {
        map.remove(&channel.name);
    }
}

type Receivers = (
    tokio::sync::broadcast::Receiver<fred::types::Message>,
    tokio::sync::broadcast::Receiver<fred::types::config::Server>,
);

async fn receive_loop(inner: Weak<Inner>, (mut messages, mut reconnects): Receivers) {
    // fred announces every connection, the first one too; only later ones may have lost
    // messages (and subscriptions).
    let mut first_connection = true;
    loop {
        tokio::select! {
            message = messages.recv() => {
                let Some(inner) = inner.upgrade() else { return };
                match message {
                    Ok(message) => {
                        let channel = inner.channels.lock().get(&*message.channel).cloned();
                        if let Some(channel) = channel {
                            let payload = message.value.as_str();
                            let payload = payload.as_deref().unwrap_or(leasehold_core::protocol::FREE_PAYLOAD);
                            on_message(&channel, Message::parse(payload));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "release listener lagged: waking every head");
                        wake_all(&inner);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
            reconnect = reconnects.recv() => {
                let Some(inner) = inner.upgrade() else { return };
                match reconnect {
                    Ok(_) if std::mem::take(&mut first_connection) => {}
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        inner.metrics.reconnect();
                        // Resubscribe first, then wake: a head that retries and fails must
                        // find its channel subscribed again, or the next release is lost.
                        let task = tokio::spawn(resubscribe(Arc::downgrade(&inner)));
                        inner.tasks.lock().push(task);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}

/// After a reconnect: drops the channels fred still tracks but this client no longer wants (an
/// UNSUBSCRIBE that failed leaves them tracked), subscribes the others again, then wakes every
/// head so it reads the lock state afresh. Retried with backoff until Redis answers: until then
/// a release would reach nobody, and heads would only wake on their timers.
async fn resubscribe(inner: Weak<Inner>) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let subscriber = strong.subscriber.clone();
        // Under `sending`: a SUBSCRIBE of ours in flight has finished (and marked its channel)
        // before the lists below are made.
        let sending = strong.sending.lock().await;
        let sharded = strong.settings.sharded;
        let (stale, wanted): (Vec<String>, Vec<String>) = {
            let map = strong.channels.lock();
            let tracked = if sharded {
                subscriber.tracked_shard_channels()
            } else {
                subscriber.tracked_channels()
            };
            let stale = tracked
                .into_iter()
                .filter(|channel| !map.get(&**channel).is_some_and(|c| c.is_subscribed()))
                .map(|channel| channel.to_string())
                .collect();
            let wanted = map
                .values()
                .filter(|c| c.is_subscribed())
                .map(|c| c.name.clone())
                .collect();
            (stale, wanted)
        };
        let result = async {
            if sharded {
                // One channel per command: a shard command's channels must share a slot.
                for channel in &stale {
                    resend_not_run(|| subscriber.sunsubscribe(channel.as_str())).await?;
                }
                for name in &wanted {
                    let channel = strong.channels.lock().get(name).cloned();
                    if let Some(channel) = channel {
                        shard_subscribe(&subscriber, &channel).await?;
                    }
                }
                return Ok(());
            }
            if !stale.is_empty() {
                subscriber.unsubscribe(stale).await?;
            }
            // Our channels only, not fred's resubscribe_all: that also sends PSUBSCRIBE (and
            // SSUBSCRIBE) without arguments, an error reply that would be taken as the PING's
            // answer. SUBSCRIBE without a channel is an error too: nothing to send then.
            if !wanted.is_empty() {
                subscriber.subscribe(wanted).await?;
            }
            // Answered only after the SUBSCRIBEs ran (see subscribe_task).
            subscriber
                .ping::<fred::types::Value>(None)
                .await
                .map(|_| ())
        }
        .await;
        drop(sending);
        wake_all(&strong);
        match result {
            Ok(()) => {
                strong.resyncs.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                strong.resync_failures.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(%error, "resubscribe after reconnect failed; retrying");
            }
        }
        drop(strong);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// One message on a channel: a grant is kept for the waiter it names (the latest one: a
/// lock's tokens only rise); either way the head of the channel's local line wakes and looks.
fn on_message(channel: &Arc<Channel>, message: Message<'_>) {
    if let Message::Granted {
        fence,
        lease_ms,
        owner,
    } = message
    {
        let mut granted = channel.granted.lock();
        if granted
            .as_ref()
            .is_none_or(|(latest, _, _)| *latest < fence)
        {
            *granted = Some((fence, lease_ms, owner.to_string()));
        }
    }
    channel.queue.lock().wake_head();
}

/// `SSUBSCRIBE`s `channel` (sent again while the cluster redirects it) and records the node
/// the subscription was made on: the slot's owner in the subscriber's slot map when the
/// command went out, which is where fred routed it. fred answers `SSUBSCRIBE` with Redis's own
/// reply, so once this returns the subscription is in place there.
///
/// The owner is read before each send, not after the reply: if the slot moved in between (the
/// old owner dropping the subscription) and the map was resynced meanwhile (by
/// [`follow_slots`], or a `MOVED` of another command), an owner read after the reply would be
/// the new one, [`follow_slots`] would find nothing to follow, and the channel would stay deaf
/// until its waiter's timer. Read before, the old owner is recorded and the follower
/// subscribes again at the new one. Recorded only on success: a failed subscribe keeps the
/// owner recorded before, so that the follower tries again.
async fn shard_subscribe(
    subscriber: &SubscriberClient,
    channel: &Channel,
) -> Result<(), fred::error::Error> {
    let sent_to = Mutex::new(None);
    resend_not_run(|| {
        *sent_to.lock() = shard_owner(subscriber, &channel.name);
        subscriber.ssubscribe(channel.name.as_str())
    })
    .await?;
    subscribed_hook(subscriber, &channel.name).await;
    *channel.shard_owner.lock() = sent_to.into_inner();
    Ok(())
}

/// A test's pause between a subscription's reply and what the subscriber does next (see
/// [`set_subscribed_hook`]).
#[doc(hidden)]
pub type SubscribedHook =
    Arc<dyn Fn(&SubscriberClient, &str) -> BoxFuture<'static, ()> + Send + Sync>;

static SUBSCRIBED_HOOK: Mutex<Option<SubscribedHook>> = Mutex::new(None);

/// For tests, not part of the API: `hook` runs (with the subscriber and the channel) right
/// after every `SSUBSCRIBE` reply, before [`shard_subscribe`] goes on, and after every
/// `SUBSCRIBE` reply, before the confirming PING, in every client of the process; `None`
/// removes it. Without it those windows last as long as the task takes to be polled after fred
/// hands over the reply, and no fault from outside the client lands there on purpose: a test
/// that moves the channel's slot there checks that the slot follower still subscribes again at
/// the new owner; one that pauses the server there checks what an unanswered PING leaves.
#[doc(hidden)]
pub fn set_subscribed_hook(hook: Option<SubscribedHook>) {
    *SUBSCRIBED_HOOK.lock() = hook;
}

async fn subscribed_hook(subscriber: &SubscriberClient, channel: &str) {
    let hook = SUBSCRIBED_HOOK.lock().clone();
    if let Some(hook) = hook {
        hook(subscriber, channel).await;
    }
}

/// The node that owns `channel`'s slot, as the subscriber's slot map says.
fn shard_owner(
    subscriber: &SubscriberClient,
    channel: &str,
) -> Option<fred::types::config::Server> {
    let slot = fred::util::redis_keyslot(channel.as_bytes());
    subscriber
        .cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
}

/// Follows the slots of a sharded subscriber's channels (see [`SHARD_CHECK`]): while any
/// channel is subscribed, resyncs the slot map every period and subscribes again each channel
/// whose slot has another owner now, then wakes its head.
async fn follow_slots(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(SHARD_CHECK).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let subscribed: Vec<Arc<Channel>> = strong
            .channels
            .lock()
            .values()
            .filter(|c| c.is_subscribed())
            .cloned()
            .collect();
        if subscribed.is_empty() || !strong.connected.load(Ordering::SeqCst) {
            continue;
        }
        let timeout = strong.settings.connect_timeout;
        match tokio::time::timeout(timeout, strong.subscriber.sync_cluster()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "slot map resync failed; trying again next period");
                continue;
            }
            Err(_) => continue,
        }
        for channel in subscribed {
            let owner = shard_owner(&strong.subscriber, &channel.name);
            if owner.is_none() || *channel.shard_owner.lock() == owner {
                continue;
            }
            let in_redis = channel.redis_state.lock().await;
            if !*in_redis {
                continue; // unsubscribed meanwhile
            }
            let _sending = strong.sending.lock().await;
            tracing::debug!(channel = %channel.name, ?owner, "shard channel's slot moved: subscribing again");
            match shard_subscribe(&strong.subscriber, &channel).await {
                Ok(()) => {
                    strong.resyncs.fetch_add(1, Ordering::SeqCst);
                }
                Err(error) => {
                    // Tried again next period; meanwhile the head's timer still runs.
                    strong.resync_failures.fetch_add(1, Ordering::SeqCst);
                    tracing::debug!(%error, channel = %channel.name, "subscribing again failed");
                }
            }
            drop(in_redis);
            channel.queue.lock().wake_head();
        }
    }
}

fn wake_all(inner: &Inner) {
    for channel in inner.channels.lock().values() {
        channel.queue.lock().wake_head();
    }
}
