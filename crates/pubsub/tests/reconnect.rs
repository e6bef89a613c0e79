//! The subscriber connection after a reconnect, against a real redis-server.

use std::time::Duration;

use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::Builder;
use leasehold_pubsub::{NotifierSettings, ReleaseNotifier};
use leasehold_testkit::RedisServer;

/// After the subscriber connection is killed, the channels are subscribed again and confirmed
/// with a PING in one clean exchange, and a release published afterwards wakes the head.
///
/// Guards the fix for what a 120 s chaos run found (a waiter left 358 ms on a free lock, with
/// "resubscribe after reconnect failed" logged 91 times by its client): fred's
/// `resubscribe_all` also sends PSUBSCRIBE without a pattern, whose error reply was taken as
/// the confirming PING's answer, so re-subscribing "failed" and was retried, each retry leaving
/// a stray reply for a later PING (a subscription confirmed before Redis ran it). With fred's
/// call put back this test does not fail every time: whether the stray reply meets our PING
/// depends on what else fred sends after a reconnect; the chaos checker is the stronger test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_resubscribes_in_one_clean_exchange() {
    let redis = RedisServer::start().expect("cannot start redis-server for tests");
    let mut builder = Builder::from_config(Config::from_url(&redis.url()).unwrap());
    builder.set_policy(ReconnectPolicy::new_constant(0, 50));
    let notifier = ReleaseNotifier::new(
        builder.build_subscriber_client().unwrap(),
        NotifierSettings {
            linger: Duration::ZERO,
            connect_timeout: Duration::from_secs(5),
            sharded: false,
        },
    );
    let place = notifier.join("leasehold:{x}:released");
    place.subscribe().await.unwrap();
    redis
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while notifier.resyncs().0 == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(notifier.resyncs(), (1, 0), "one clean re-subscription");
    // The wake-all after the reconnect left a permit: take it, then a release must wake us.
    tokio::time::timeout(Duration::from_secs(1), place.woken())
        .await
        .expect("woken after the reconnect");
    let publisher = Builder::from_config(Config::from_url(&redis.url()).unwrap())
        .build()
        .unwrap();
    publisher.init().await.unwrap();
    let _: i64 = publisher
        .publish("leasehold:{x}:released", "me")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), place.woken())
        .await
        .expect("the turn message reached the head");
}
