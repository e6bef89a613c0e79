//! `leasehold-model check`: checks the lock's waiting protocol over a bound and prints the
//! state counts and any counterexample, one line per step. Exit status 1 when a property fails.

use clap::{Parser, Subcommand};
use leasehold_model::check::check;
use leasehold_model::{Config, Kind, Variant};

#[derive(Parser)]
#[command(
    about = "Model checker of leasehold's waiting protocol over the shipped Lua scripts",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check every property within a bound.
    Check(Bound),
}

#[derive(clap::Args)]
struct Bound {
    /// Which kind of lock: the plain lock, or the fair lock (`client.fair_lock`).
    #[arg(long, value_enum, default_value = "plain")]
    kind: Kind,
    /// Which code to check: the shipped code, or a mutant.
    #[arg(long, value_enum, default_value = "shipped")]
    variant: Variant,
    /// Clients (processes).
    #[arg(long, default_value_t = 2)]
    clients: u8,
    /// Waiters (tasks) per client.
    #[arg(long, default_value_t = 2)]
    waiters: u8,
    /// Lock cycles per waiter.
    #[arg(long, default_value_t = 1)]
    cycles: u8,
    /// Lease, model milliseconds.
    #[arg(long, default_value_t = 10)]
    lease: u64,
    /// The clock stops here.
    #[arg(long, default_value_t = 40)]
    horizon: u64,
    /// Client crashes allowed.
    #[arg(long, default_value_t = 1)]
    crashes: u8,
    /// Subscriber connection drops allowed.
    #[arg(long, default_value_t = 1)]
    losses: u8,
    /// Cancelled waits allowed.
    #[arg(long, default_value_t = 1)]
    cancels: u8,
    /// Force unlocks allowed.
    #[arg(long, default_value_t = 0)]
    force_unlocks: u8,
    /// Redis data losses allowed.
    #[arg(long, default_value_t = 0)]
    data_losses: u8,
    /// Watchdog renewals per grant.
    #[arg(long, default_value_t = 0)]
    renewals: u8,
    /// Fair lock: `try_lock` calls allowed (each in place of a `lock()` cycle).
    #[arg(long, default_value_t = 0)]
    tries: u8,
    /// Stop after this many states (a partial check: for exploring a bound's size).
    #[arg(long)]
    max_states: Option<usize>,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

fn main() {
    let Command::Check(b) = Cli::parse().command;
    let config = Config {
        clients: b.clients,
        waiters: b.waiters,
        cycles: b.cycles,
        lease_ms: b.lease,
        horizon_ms: b.horizon,
        crashes: b.crashes,
        losses: b.losses,
        cancels: b.cancels,
        force_unlocks: b.force_unlocks,
        data_losses: b.data_losses,
        renewals: b.renewals,
        tries: b.tries,
        variant: b.variant,
        kind: b.kind,
    };
    println!("checking {config:?}");
    let outcome = check(config, b.threads, b.max_states);
    println!(
        "{} states ({} distinct), depth {}, in {:.1?}",
        outcome.states, outcome.unique_states, outcome.max_depth, outcome.took
    );
    if outcome.counterexamples.is_empty() {
        println!("every property holds");
        return;
    }
    for (property, trace) in &outcome.counterexamples {
        println!("\nproperty failed: {property}\n{trace}");
    }
    std::process::exit(1);
}
