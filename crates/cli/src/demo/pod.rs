//! The pod side of the demo: `leasehold pod ROLE`, one process per pod.
//!
//! A pod connects its own [`LockClient`] (its own client id, its own connections and watchdog,
//! exactly like a pod of a real service), plays its role, reports [`PodEvent`]s on stdout and
//! exits. The roles live beside the scenario that drives them.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use leasehold::LockClient;

use super::events::PodEvent;
use super::starting_line::StartingLine;
use super::store::StoreSpec;
use super::{inventory, long_job, report};
use crate::cli::{PodArgs, PodRole, StoreArgs};

/// Runs one pod to completion; its outcome is reported as an event and as the exit code.
pub fn run(url: String, prefix: String, args: &PodArgs) -> anyhow::Result<ExitCode> {
    die_with_the_demo();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(play(url, prefix, args));
    // Outstanding background work (a release on drop, quitting connections) gets a moment.
    runtime.shutdown_timeout(Duration::from_millis(500));
    Ok(match result {
        Ok(()) => {
            PodEvent::Done.emit();
            ExitCode::SUCCESS
        }
        Err(error) => {
            PodEvent::Failed {
                message: format!("{error:#}"),
            }
            .emit();
            ExitCode::FAILURE
        }
    })
}

/// On Linux the kernel SIGKILLs the pod as soon as the demo is gone, even while the pod is
/// stopped (a stopped pod's stdin watcher cannot notice anything). The demo forks its pods from
/// its main thread, which lives as long as the demo, so the signal means "the demo ended". A
/// demo that died before this call is caught by the stdin watcher instead.
fn die_with_the_demo() {
    #[cfg(target_os = "linux")]
    {
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    }
}

async fn play(url: String, prefix: String, args: &PodArgs) -> anyhow::Result<()> {
    let gate = StartingLine::watch_stdin();
    let client = LockClient::builder(&url)
        .prefix(prefix)
        .lease(Duration::from_millis(args.lease_ms))
        .build()
        .await?;
    match &args.role {
        PodRole::Shop {
            store,
            locked,
            work_ms,
        } => {
            let work = Duration::from_millis(*work_ms);
            inventory::shop(&client, &spec(store)?, *locked, work, &gate).await
        }
        PodRole::StaleWriter { store, hold_ms } => {
            let hold = Duration::from_millis(*hold_ms);
            inventory::stale_writer(&client, &spec(store)?, hold).await
        }
        PodRole::FreshWriter { store } => inventory::fresh_writer(&client, &spec(store)?).await,
        PodRole::Report { job_ms } => {
            report::pod(&client, Duration::from_millis(*job_ms), &gate).await
        }
        PodRole::LongJob { job_ms } => {
            long_job::holder(&client, Duration::from_millis(*job_ms)).await
        }
        PodRole::LongWait => long_job::waiter(&client, &gate).await,
    }
}

fn spec(args: &StoreArgs) -> anyhow::Result<StoreSpec> {
    match (&args.sqlite, &args.pg_table) {
        (Some(path), None) => Ok(StoreSpec::Sqlite(path.clone())),
        (None, Some(table)) => Ok(StoreSpec::Postgres {
            url: std::env::var("DATABASE_URL").context("--pg-table needs DATABASE_URL")?,
            table: table.clone(),
        }),
        _ => anyhow::bail!("a shop pod needs --sqlite PATH or --pg-table TABLE"),
    }
}
