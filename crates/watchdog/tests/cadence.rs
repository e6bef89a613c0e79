//! Renewal cadence and batching under tokio's paused clock, with a renewer that records calls
//! instead of talking to Redis (timing only; lock semantics are tested against real Redis in
//! the facade's tests).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands::Renewal;
use leasehold_core::{
    ClientId, FencingToken, HoldId, Lease, LockError, LockKeys, Owner, Prefix, RedisError,
};
use leasehold_watchdog::{HoldGuard, LeaseMode, RenewFuture, Renewer, Watchdog, WatchdogConfig};
use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<(Instant, usize)>>>,
    /// Holds (by lock hash) that the "server" reports gone.
    gone: Arc<Mutex<Vec<String>>>,
    fail: Arc<Mutex<bool>>,
}

impl Renewer for Recorder {
    fn renew(&self, holds: Vec<Renewal>, _lease: Lease) -> RenewFuture {
        self.calls.lock().push((Instant::now(), holds.len()));
        let gone = self.gone.lock().clone();
        let fail = *self.fail.lock();
        Box::pin(async move {
            if fail {
                return Err(LockError::Connection(RedisError::connection("injected")));
            }
            Ok(holds
                .iter()
                .map(|r| !gone.iter().any(|g| g == r.hold.keys.hash()))
                .collect())
        })
    }
}

fn keys(name: &str) -> LockKeys {
    LockKeys::new(&Prefix::default(), name).unwrap()
}

fn config(lease_secs: u64) -> WatchdogConfig {
    WatchdogConfig {
        lease: Lease::new(Duration::from_secs(lease_secs)).unwrap(),
        batch_size: 1000,
        group_by_slot: false,
        max_hold: None,
    }
}

/// A watched grant of `owner` on `keys`, answered with `hold_count` to an acquire sent at
/// `sent_at` (token 7 for every grant unless a test says otherwise).
fn watch(
    watchdog: &Watchdog,
    keys: &LockKeys,
    owner: &Owner,
    hold_count: u64,
    sent_at: Instant,
) -> HoldGuard {
    let hold = HoldId::new(keys.clone(), owner.clone());
    let (ticket, _) = watchdog
        .begin_acquire(&hold)
        .expect("no acquire of this hold in flight");
    watchdog.grant(
        ticket,
        &hold,
        FencingToken::new(7),
        hold_count,
        LeaseMode::Watched,
        sent_at,
    )
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_lease_and_stops_on_release() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let start = Instant::now();
    let hold = watch(&watchdog, &keys("job"), &owner, 1, start);
    tokio::time::sleep(Duration::from_secs(35)).await;
    let offsets: Vec<u64> = recorder
        .calls
        .lock()
        .iter()
        .map(|(at, _)| (*at - start).as_secs())
        .collect();
    assert_eq!(offsets, vec![10, 20, 30], "renewed at lease/3 intervals");
    assert!(hold.is_held());

    drop(hold);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(recorder.calls.lock().len(), 3, "no renewal after release");
    assert_eq!(watchdog.stats().holds, 0);
}

#[tokio::test(start_paused = true)]
async fn reentrant_holds_share_one_renewal_until_the_last_is_dropped() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let outer = watch(&watchdog, &keys("nested"), &owner, 1, Instant::now());
    let inner = watch(&watchdog, &keys("nested"), &owner, 2, Instant::now());
    assert_eq!(watchdog.stats().holds, 1);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        recorder.calls.lock().as_slice()[0].1,
        1,
        "one renewal for both"
    );
    drop(inner);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        recorder.calls.lock().len(),
        2,
        "still renewed for the outer hold"
    );
    drop(outer);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(recorder.calls.lock().len(), 2);
}

/// A new grant (hold count 1) for an owner the watchdog still watches means Redis no longer
/// had the old hold: the old guard's lease is lost, not revived, and the new grant is watched
/// on its own.
#[tokio::test(start_paused = true)]
async fn a_new_grant_does_not_revive_a_hold_redis_lost() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let old = watch(&watchdog, &keys("regranted"), &owner, 1, Instant::now());
    let new = watch(&watchdog, &keys("regranted"), &owner, 1, Instant::now());
    assert!(!old.is_held(), "the old guard learns its hold is gone");
    assert!(new.is_held());
    assert_eq!(watchdog.stats().holds, 1);
    drop(old);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(recorder.calls.lock().len(), 1, "the new grant is renewed");
    assert!(new.is_held());
}

#[tokio::test(start_paused = true)]
async fn many_holds_cost_one_call_per_batch() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let mut holds = Vec::new();
    // 2,500 holds acquired over 3 s: renewed together in batches of 1,000.
    for i in 0..2500 {
        holds.push(watch(
            &watchdog,
            &keys(&format!("lock-{i}")),
            &owner,
            1,
            Instant::now(),
        ));
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(31)).await;
    let calls = recorder.calls.lock().clone();
    let renewed: usize = calls.iter().map(|(_, n)| n).sum();
    assert!(
        renewed >= 2500 * 2,
        "each hold renewed at least twice: {renewed}"
    );
    assert!(calls.iter().all(|(_, n)| *n <= 1000));
    // Three batches per tick, and ticks at most every lease/6 apart.
    assert!(
        calls.len() <= 3 * 6,
        "{} calls for 2,500 holds over 31 s",
        calls.len()
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_found_gone_is_marked_lost() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let hold = watch(&watchdog, &keys("taken"), &owner, 1, Instant::now());
    recorder.gone.lock().push("leasehold:{taken}".into());
    let start = Instant::now();
    hold.lost().await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "lost at the first renewal"
    );
    assert!(!hold.is_held());
    assert_eq!(watchdog.stats().lost, 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(recorder.calls.lock().len(), 1, "no renewal of a lost hold");
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_are_retried_and_the_deadline_declares_loss() {
    let recorder = Recorder::default();
    *recorder.fail.lock() = true;
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let start = Instant::now();
    let hold = watch(&watchdog, &keys("unreachable"), &owner, 1, start);
    hold.lost().await;
    let lost_after = start.elapsed();
    // Lost at the local deadline (lease - drift), not at the first failed renewal.
    assert!(
        lost_after >= Duration::from_secs(29) && lost_after <= Duration::from_secs(30),
        "{lost_after:?}"
    );
    let calls = recorder.calls.lock().len();
    assert!(calls >= 10, "retried after each failure: {calls} calls");
    assert!(watchdog.stats().errors >= 10);
}

#[tokio::test(start_paused = true)]
async fn a_recovered_renewal_keeps_the_hold() {
    let recorder = Recorder::default();
    *recorder.fail.lock() = true;
    let watchdog = Watchdog::start(recorder.clone(), config(30));
    let owner = ClientId::random().new_owner();
    let hold = watch(&watchdog, &keys("flaky"), &owner, 1, Instant::now());
    tokio::time::sleep(Duration::from_secs(15)).await;
    *recorder.fail.lock() = false;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(hold.is_held(), "renewals resumed before the deadline");
    assert_eq!(watchdog.stats().lost, 0);
}

/// With `max_hold`, a watched grant is renewed only while it has been held less than that:
/// the renewal that comes due later is not sent, and the grant is lost (as `MaxHold`) when the
/// lease of its last renewal ends.
#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewals_and_the_lease_lapses() {
    let recorder = Recorder::default();
    let watchdog = Watchdog::start(
        recorder.clone(),
        WatchdogConfig {
            max_hold: Some(Duration::from_secs(25)),
            ..config(30)
        },
    );
    let owner = ClientId::random().new_owner();
    let start = Instant::now();
    let hold = watch(&watchdog, &keys("capped"), &owner, 1, start);
    hold.lost().await;
    let offsets: Vec<u64> = recorder
        .calls
        .lock()
        .iter()
        .map(|(at, _)| (*at - start).as_secs())
        .collect();
    assert_eq!(offsets, vec![10, 20], "no renewal after 25 s");
    // The last renewal (sent at 20 s) was good for a lease, minus the drift.
    let lost_after = start.elapsed();
    assert!(
        lost_after > Duration::from_secs(49) && lost_after < Duration::from_secs(50),
        "{lost_after:?}"
    );
    assert_eq!(
        hold.lost_reason(),
        Some(leasehold_watchdog::LostReason::MaxHold)
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(recorder.calls.lock().len(), 2);
}

/// A fixed guard's deadline moves with a confirmed extension, never back, and never revives a
/// guard that is lost.
#[tokio::test(start_paused = true)]
async fn an_extension_moves_a_fixed_guards_deadline_forward_only() {
    let watchdog = Watchdog::start(Recorder::default(), config(30));
    let owner = ClientId::random().new_owner();
    let hold = HoldId::new(keys("fixed"), owner);
    let lease = Lease::new(Duration::from_secs(2)).unwrap();
    let (ticket, _) = watchdog.begin_acquire(&hold).unwrap();
    let guard = watchdog.grant(
        ticket,
        &hold,
        FencingToken::new(3),
        1,
        LeaseMode::Fixed(lease),
        Instant::now(),
    );
    assert!(!guard.is_watched());
    let first = guard.valid_until();
    let later = Instant::now() + Duration::from_secs(10);
    assert!(guard.extended(later));
    assert_eq!(guard.valid_until(), later);
    assert!(guard.extended(first), "an earlier deadline is no loss");
    assert_eq!(guard.valid_until(), later, "never moved back");
    // A wait started before the extension follows it.
    let start = Instant::now();
    guard.lost().await;
    assert!(start.elapsed() >= Duration::from_secs(10));
    assert_eq!(
        guard.lost_reason(),
        Some(leasehold_watchdog::LostReason::Expired)
    );
    assert!(!guard.extended(Instant::now() + Duration::from_secs(10)));
    assert!(!guard.is_held(), "false stays final");
}
