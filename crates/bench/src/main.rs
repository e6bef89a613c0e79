//! `leasehold-bench`: the benchmark harness (`just bench`).
//!
//! Every scenario runs against a baseline in the same run, so machine noise cancels in the
//! ratios: raw fred EVALSHA calls for the uncontended path, and two polling locks (SET NX PX
//! plus a fixed sleep, as redis-py and redis-semaphore do) for the contended handoff. It starts
//! its own redis-server (testkit) unless `REDIS_URL` is set.

mod crash;
mod handoff;
mod placement;
mod plot;
mod red_lock;
mod redis_stats;
mod replica_sync;
mod report;
mod uncontended;
mod watchdog;

use std::alloc::System;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

/// Counts heap allocations, for the watchdog's bytes-per-hold figure.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Parser, Debug)]
#[command(
    name = "leasehold-bench",
    about = "leasehold benchmarks against the round-trip limit and polling locks"
)]
struct Args {
    /// Short run (under 60 s on a 2-core machine).
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the handoff-gap plot (SVG) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Concurrent tasks in the uncontended scenario.
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// Waiters in the handoff scenarios (spread over 4 clients; one client each per process).
    #[arg(long, default_value_t = 16)]
    waiters: usize,
    /// Holds kept by one client in the watchdog scenario.
    #[arg(long, default_value_t = 10_000)]
    holds: usize,
    /// Do not pin redis-server and the benchmark to separate CPUs (see placement.rs).
    #[arg(long)]
    no_pin: bool,
    /// Run only these scenarios (comma-separated: uncontended, handoff, handoff_per_process,
    /// crash, watchdog, red_lock, replica_sync).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// (internal) Hold a lock with an explicit lease and wait to be killed: the crash scenario's
    /// holder process.
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        url: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        lease_ms: u64,
    },
}

/// Scenario durations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) uncontended: Duration,
    pub(crate) handoff: Duration,
    pub(crate) crash_trials: usize,
    pub(crate) watchdog_lease: Duration,
    pub(crate) watchdog_ticks: u32,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                uncontended: Duration::from_secs(2),
                handoff: Duration::from_secs(3),
                crash_trials: 2,
                // 10x the default renewal rate, so a quick run still sees several ticks.
                watchdog_lease: Duration::from_secs(3),
                watchdog_ticks: 4,
            }
        } else {
            Plan {
                uncontended: Duration::from_secs(10),
                handoff: Duration::from_secs(15),
                crash_trials: 7,
                // The default lease: CPU per second of holding as users run it.
                watchdog_lease: leasehold::DEFAULT_LEASE,
                watchdog_ticks: 3,
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    if let Some(Command::Hold {
        url,
        name,
        lease_ms,
    }) = args.command
    {
        return runtime()?.block_on(crash::hold(&url, &name, lease_ms));
    }
    let plan = Plan::new(args.quick);
    // Before the runtime: its threads inherit the placement.
    // An empty REDIS_URL counts as unset, as in the testkit and the CLI.
    let external = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty());
    let (server, placement) = placement::start_redis(external.is_some(), !args.no_pin)?;
    let runtime = runtime()?;
    let url = match (external, &server) {
        (Some(url), _) => url,
        (None, Some(server)) => server.url(),
        (None, None) => unreachable!("start_redis starts a server when none is named"),
    };
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut results = report::Results::default();
    runtime.block_on(async {
        let admin = redis_stats::Admin::connect(&url).await?;
        if wanted("uncontended") {
            admin.flush().await?;
            results.uncontended =
                Some(uncontended::run(&url, args.tasks, plan.uncontended, GLOBAL, &admin).await?);
            admin.flush().await?;
            results.uncontended_sequential =
                Some(uncontended::run(&url, 1, plan.uncontended, GLOBAL, &admin).await?);
        }
        for (scenario, layout) in [
            ("handoff", handoff::Layout::Shared),
            ("handoff_per_process", handoff::Layout::PerProcess),
        ] {
            if !wanted(scenario) {
                continue;
            }
            for kind in [
                handoff::Kind::Leasehold,
                handoff::Kind::Fair,
                handoff::Kind::Timer,
                handoff::Kind::FairTimer,
                handoff::Kind::Polling(Duration::from_millis(100)),
                handoff::Kind::Polling(Duration::from_millis(10)),
            ] {
                admin.flush().await?;
                let run =
                    handoff::run(&url, &admin, kind, layout, args.waiters, plan.handoff).await?;
                results.set_handoff(kind, layout, run);
            }
        }
        if wanted("crash") {
            admin.flush().await?;
            results.crash_recovery = Some(crash::run(&url, &admin, plan.crash_trials).await?);
        }
        if wanted("watchdog") {
            admin.flush().await?;
            results.watchdog = Some(
                watchdog::run(
                    &url,
                    args.holds,
                    plan.watchdog_lease,
                    plan.watchdog_ticks,
                    GLOBAL,
                )
                .await?,
            );
        }
        if wanted("red_lock") {
            // Five servers of its own: a quorum needs independent servers.
            results.red_lock = Some(red_lock::run(plan.uncontended / 2).await?);
        }
        if wanted("replica_sync") {
            // A primary and a replica of its own.
            results.replica_sync = Some(replica_sync::run(plan.uncontended / 4).await?);
        }
        admin.flush().await?;
        anyhow::Ok(())
    })?;
    report::print_table(&results, args.quick, &placement);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results.to_json())?)?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        let path = plot::handoff_gaps(&results, dir)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
