//! `leasehold`: the command line of the leasehold distributed lock library.
//!
//! * `inspect NAME` shows one lock (its kind, holders, lease left, the grant's fencing token,
//!   a read/write lock's mode and readers, the queue), or a semaphore (its permits, holders
//!   and waiters) or a count-down latch (its count);
//! * `list [PATTERN]` lists the locks, semaphores and latches under the prefix, with their
//!   kind and mode;
//! * `watch [PATTERN]` refreshes that list;
//! * `unlock --force NAME` releases a lock whoever holds it (and refuses a semaphore or a
//!   latch);
//! * `demo` plays the three scenarios of the seeds with real OS processes as pods (on its own
//!   redis-server, or with `--cluster` a Redis Cluster, or with `--sentinel` a Sentinel set);
//!   `demo --failover` plays a lock through a failover, without and with replica sync.
//!
//! Exit codes: 0 success, 1 failure (one line on stderr), 2 bad usage (clap's message).
//! Errors are reported, never panicked: an operator running this against production Redis
//! must get a message, not a backtrace.

mod cli;
mod connect;
mod demo;
mod errors;
mod glob;
mod inspect;
mod layout;
mod list;
mod render;
mod unlock;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("leasehold: error: {}", errors::one_line(&error));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Inspect { name, json } => {
            block_on(inspect::run(cli.url_or_default(), &cli.prefix, name, *json))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::List { pattern, json } => {
            block_on(list::run(cli.url_or_default(), &cli.prefix, pattern, *json))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch {
            pattern,
            interval,
            once,
        } => {
            let interval = std::time::Duration::try_from_secs_f64(*interval)
                .ok()
                .filter(|i| !i.is_zero())
                .ok_or_else(|| {
                    anyhow::anyhow!("--interval must be a positive number of seconds")
                })?;
            block_on(watch::run(
                cli.url_or_default(),
                &cli.prefix,
                pattern,
                interval,
                *once,
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Unlock {
            force: _,
            yes,
            json,
            name,
        } => {
            let confirmed = unlock::confirm_up_front(name, *yes)?;
            block_on(unlock::run(
                cli.url_or_default(),
                &cli.prefix,
                name,
                confirmed,
                *json,
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        // The demo drives child processes and blocks on their output, so it runs on the main
        // thread and uses a runtime only for its own Redis and database calls.
        Command::Demo(args) => Ok(if demo::run(cli.url(), *args)? {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }),
        Command::Pod(args) => {
            let url = cli.url_or_default().to_string();
            let prefix = cli.prefix.clone();
            demo::pod::run(url, prefix, args)
        }
    }
}

/// Runs one command's future on a small runtime (the watchdog and listener tasks need one).
fn block_on<T>(future: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(future)
}
