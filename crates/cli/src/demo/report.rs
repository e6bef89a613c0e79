//! Scenario 2, the daily report: a scheduled job fires on three pods at the same moment and
//! must run once.
//!
//! Each pod does what the seed's `@Scheduled` job does with Redisson's `tryLock(0, SECONDS)`:
//! `try_lock_for(Duration::ZERO)` tries once and never waits, so exactly one pod runs the
//! report and the others skip at once (no e-mail sent three times).

use std::time::{Duration, Instant};

use anyhow::ensure;
use leasehold::LockClient;

use super::events::PodEvent;
use super::pods::Pods;
use super::starting_line::StartingLine;
use super::{expect, say, start_three_pods, Ctx, STEP_TIMEOUT};

/// The report's lock.
const LOCK: &str = "daily-report";
/// How long the report takes (queries, file, e-mail).
const JOB_MS: u64 = 1_500;

/// Plays the scenario.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    println!("2. Daily report: at 02:00 the same scheduled job fires on 3 pods at once");
    ctx.say_where(LOCK);
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut pods = ctx.pods();
    let role = ["report".to_string(), "--job-ms".into(), JOB_MS.to_string()];
    let labels = start_three_pods(&mut pods, &role, deadline, "the report pods to get ready")?;

    // All three decide within a round trip of each other. Their lines are printed once all
    // have decided, the pod that runs the report first, so the account reads like one log.
    let mut outcomes = Vec::new();
    let mut finished = Vec::new();
    while outcomes.len() < labels.len() {
        let (label, event) = next_report_event(&mut pods, deadline)?;
        match event {
            PodEvent::ReportStarted => outcomes.push((false, label)),
            PodEvent::ReportSkipped => outcomes.push((true, label)),
            // Only when a pod started so late that the first run was over: a wrong outcome,
            // reported by the check below.
            _ => finished.push((label, event)),
        }
    }
    outcomes.sort();
    for (skipped, label) in &outcomes {
        if *skipped {
            say(&format!(
                "[{label}] another instance is running the report; skipping"
            ));
        } else {
            say(&format!("[{label}] starting the daily report"));
        }
    }
    let started = outcomes.iter().filter(|(skipped, _)| !skipped).count();
    while finished.len() < started {
        finished.push(next_report_event(&mut pods, deadline)?);
    }
    for (label, event) in &finished {
        if let PodEvent::ReportDone { took_ms } = event {
            say(&format!(
                "[{label}] daily report sent ({:.1} s)",
                *took_ms as f64 / 1e3
            ));
        }
    }
    pods.finish(deadline)?;
    ensure!(
        started == 1,
        "the report ran {started} times; expected exactly once"
    );
    say("ok: the report ran exactly once");
    Ok(())
}

/// The next report event from any pod.
fn next_report_event(pods: &mut Pods, deadline: Instant) -> anyhow::Result<(String, PodEvent)> {
    expect(pods, None, deadline, "the report pods", |e| {
        matches!(
            e,
            PodEvent::ReportStarted | PodEvent::ReportSkipped | PodEvent::ReportDone { .. }
        )
        .then(|| e.clone())
    })
}

/// Pod role `report`: run the report unless another pod is running it.
pub async fn pod(client: &LockClient, job: Duration, start: &StartingLine) -> anyhow::Result<()> {
    let lock = client.lock(LOCK)?;
    start.ready_and_wait().await;
    match lock.try_lock_for(Duration::ZERO).await? {
        Some(guard) => {
            PodEvent::ReportStarted.emit();
            let began = Instant::now();
            tokio::time::sleep(job).await; // queries, the file, the e-mail
            PodEvent::ReportDone {
                took_ms: began.elapsed().as_millis() as u64,
            }
            .emit();
            guard.unlock().await?;
        }
        None => PodEvent::ReportSkipped.emit(),
    }
    Ok(())
}
