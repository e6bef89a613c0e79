//! Scenario 3, a long job: the work outlasts the lease, and the watchdog keeps the lock.
//!
//! The pods' clients use a 1 s lease (30 s by default) so the demo is quick; the job takes 3 s.
//! Without renewal the lock would expire after 1 s and the waiting pod would walk in halfway
//! through the job. With the watchdog (no explicit lease), the holder's lease is renewed every
//! third of it, and the waiter gets the lock only when the holder releases it: woken by the
//! release message, not by polling, so the handoff takes about one round trip.

use std::time::{Duration, Instant};

use anyhow::ensure;
use leasehold::LockClient;

use super::events::{now_us, PodEvent};
use super::starting_line::StartingLine;
use super::{expect, say, Ctx, STEP_TIMEOUT};

/// The job's lock.
const LOCK: &str = "nightly-import";
/// The pods' lease.
const LEASE_MS: u64 = 1_000;
/// The job: three leases long.
const JOB_MS: u64 = 3 * LEASE_MS;

/// What the holder and the waiter reported.
#[derive(Default)]
struct Seen {
    holder_done: Option<(u64, u64, bool)>,
    holder_unlock: Option<(u64, u64)>,
    waiter_locked: Option<(u64, u64)>,
    waiter_since: Option<u64>,
}

/// Plays the scenario.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    println!(
        "3. Long job: {} s of work on a {} s lease, renewed by the watchdog",
        JOB_MS / 1_000,
        LEASE_MS / 1_000
    );
    ctx.say_where(LOCK);
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut pods = ctx.pods();
    pods.spawn(
        "pod-1",
        LEASE_MS,
        &["long-job".into(), "--job-ms".into(), JOB_MS.to_string()],
    )?;
    pods.spawn("pod-2", LEASE_MS, &["long-wait".into()])?;

    let (mut holder_token, mut waiter_ready) = (None, false);
    while holder_token.is_none() || !waiter_ready {
        let (label, event) = expect(&mut pods, None, deadline, "pod-1 to lock", |e| {
            matches!(e, PodEvent::Locked { .. } | PodEvent::Ready).then(|| e.clone())
        })?;
        match (label.as_str(), event) {
            ("pod-1", PodEvent::Locked { fence, .. }) => holder_token = Some(fence),
            ("pod-2", PodEvent::Ready) => waiter_ready = true,
            (label, event) => anyhow::bail!("unexpected {event:?} from {label}"),
        }
    }
    let holder_token = holder_token.unwrap_or_default();
    say(&format!(
        "[pod-1] locked {LOCK} (token {holder_token}) and started the job"
    ));
    pods.go("pod-2")?;

    let mut seen = Seen::default();
    while seen.holder_unlock.is_none() || seen.waiter_locked.is_none() {
        let (label, event) = expect(&mut pods, None, deadline, "the long job to finish", |e| {
            matches!(
                e,
                PodEvent::Waiting { .. }
                    | PodEvent::JobDone { .. }
                    | PodEvent::Unlocked { .. }
                    | PodEvent::Locked { .. }
            )
            .then(|| e.clone())
        })?;
        match event {
            PodEvent::Waiting { at_us } => {
                seen.waiter_since = Some(at_us);
                say(&format!("[{label}] waiting for {LOCK} with lock()"));
            }
            PodEvent::JobDone {
                took_ms,
                renewed,
                lost,
            } => {
                seen.holder_done = Some((took_ms, renewed, lost));
                say(&format!(
                    "[{label}] job done after {:.1} s; the watchdog renewed the lease {renewed} times{}",
                    took_ms as f64 / 1e3,
                    if lost { ", BUT THE LEASE WAS LOST" } else { "" }
                ));
            }
            PodEvent::Unlocked {
                called_at_us,
                returned_at_us,
                ..
            } => seen.holder_unlock = Some((called_at_us, returned_at_us)),
            PodEvent::Locked { fence, at_us } => {
                seen.waiter_locked = Some((fence, at_us));
                let waited = at_us.saturating_sub(seen.waiter_since.unwrap_or(at_us));
                say(&format!(
                    "[{label}] locked {LOCK} (token {fence}) after waiting {:.1} s",
                    waited as f64 / 1e6
                ));
            }
            _ => {}
        }
    }
    pods.finish(deadline)?;

    let (took_ms, _, lost) = seen.holder_done.unwrap_or((0, 0, true));
    let (called_us, returned_us) = seen.holder_unlock.unwrap_or_default();
    let (waiter_token, locked_us) = seen.waiter_locked.unwrap_or_default();
    if locked_us >= returned_us {
        say(&format!(
            "handoff: pod-2 held the lock {} after pod-1's unlock() returned",
            millis(locked_us - returned_us)
        ));
    } else {
        // The release script publishes before its reply reaches the holder, so the waiter can
        // be done before the holder even hears back.
        say(&format!(
            "handoff: pod-2 held the lock {} after pod-1 called unlock(), before that call had returned",
            millis(locked_us.saturating_sub(called_us))
        ));
    }
    ensure!(!lost, "pod-1 lost its lease during the job");
    ensure!(
        took_ms >= JOB_MS,
        "pod-1's job ended after {took_ms} ms, before its {JOB_MS} ms"
    );
    ensure!(
        locked_us >= called_us,
        "pod-2 got the lock {} before pod-1 released it",
        millis(called_us - locked_us)
    );
    ensure!(
        waiter_token > holder_token,
        "pod-2's token {waiter_token} is not above pod-1's {holder_token}"
    );
    say("ok: pod-2 did not get the lock while pod-1's job ran");
    Ok(())
}

fn millis(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

/// Pod role `long-job`: lock, work for longer than the lease, release.
pub async fn holder(client: &LockClient, job: Duration) -> anyhow::Result<()> {
    // No explicit lease: the watchdog renews the client's lease every third of it.
    let lock = client.lock(LOCK)?;
    let guard = lock.lock().await?;
    PodEvent::Locked {
        fence: guard.fencing_token().get(),
        at_us: now_us(),
    }
    .emit();
    let began = Instant::now();
    // The job is cancelled should the lease be lost (Redis unreachable, process stalled).
    let outcome = guard.run_while_held(tokio::time::sleep(job)).await;
    PodEvent::JobDone {
        took_ms: began.elapsed().as_millis() as u64,
        renewed: client.watchdog_stats().renewed,
        lost: outcome.is_err(),
    }
    .emit();
    let called_at_us = now_us();
    guard.unlock().await?;
    PodEvent::Unlocked {
        called_at_us,
        returned_at_us: now_us(),
        held: true,
    }
    .emit();
    Ok(())
}

/// Pod role `long-wait`: wait for the lock with `lock()`, then release it.
pub async fn waiter(client: &LockClient, start: &StartingLine) -> anyhow::Result<()> {
    let lock = client.lock(LOCK)?;
    start.ready_and_wait().await;
    PodEvent::Waiting { at_us: now_us() }.emit();
    let guard = lock.lock().await?;
    PodEvent::Locked {
        fence: guard.fencing_token().get(),
        at_us: now_us(),
    }
    .emit();
    guard.unlock().await?;
    Ok(())
}
