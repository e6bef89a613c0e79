//! Crash recovery: a holder process with a 2 s lease is SIGKILLed; a waiter in this process
//! waits. Reported: ms from the key's expiry to the waiter's acquisition. A crashed holder
//! publishes nothing, so this measures the waiter's timer (it sleeps until the holder's TTL).

use std::time::Duration;

use leasehold::LockClient;
use leasehold_testkit::ChildProcess;
use serde::Serialize;
use tokio::time::Instant;

use crate::redis_stats::Admin;

const LEASE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Serialize)]
pub(crate) struct CrashRecovery {
    pub(crate) lease_ms: u64,
    /// Median over the trials.
    pub(crate) delay_after_expiry_ms: f64,
}

/// The holder process: takes the lock with an explicit lease, says so, waits to be killed.
pub(crate) async fn hold(url: &str, name: &str, lease_ms: u64) -> anyhow::Result<()> {
    let client = LockClient::connect(url).await?;
    let lock = client.lock(name)?;
    let guard = lock
        .try_lock_with_lease(Duration::from_millis(lease_ms))
        .await?
        .ok_or_else(|| anyhow::anyhow!("lock {name} is busy"))?;
    println!("LOCKED token={}", guard.fencing_token());
    std::future::pending::<()>().await;
    Ok(())
}

pub(crate) async fn run(url: &str, admin: &Admin, trials: usize) -> anyhow::Result<CrashRecovery> {
    let exe = std::env::current_exe()?;
    let waiter = LockClient::connect(url).await?;
    let mut delays = Vec::new();
    for trial in 0..trials {
        let name = format!("bench:crash:{trial}");
        let mut command = std::process::Command::new(&exe);
        command.args(["hold", "--url", url, "--name", &name, "--lease-ms"]);
        command.arg(LEASE.as_millis().to_string());
        let holder = ChildProcess::spawn(command)?;
        holder.wait_for_line(|l| l.starts_with("LOCKED"), Duration::from_secs(30))?;
        let lock = waiter.lock(&name)?;
        let key = lock.keys().hash().to_string();
        let waiting = tokio::spawn(async move {
            let guard = lock.lock().await?;
            let acquired = Instant::now();
            guard.unlock().await?;
            anyhow::Ok(acquired)
        });
        // Let the waiter park, then read when the key expires (PTTL, ms resolution).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = Instant::now();
        let pttl = admin.pttl(&key).await?;
        anyhow::ensure!(pttl > 0, "holder's key has no TTL ({pttl})");
        let expires = asked + Duration::from_millis(pttl as u64);
        holder.kill()?;
        let acquired = waiting.await??;
        delays.push(acquired.saturating_duration_since(expires).as_secs_f64() * 1000.0);
    }
    delays.sort_by(f64::total_cmp);
    Ok(CrashRecovery {
        lease_ms: LEASE.as_millis() as u64,
        delay_after_expiry_ms: delays[delays.len() / 2],
    })
}
