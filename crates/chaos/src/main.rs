//! `leasehold-chaos`: tests leasehold the way Jepsen tests databases. Client processes take
//! locks of every kind and write to a fenced store while faults are injected (network latency
//! and partitions, paused and killed clients, Redis restarts with data loss, Redis paused,
//! killed connections); every step is recorded, and a checker looks for violations afterwards.
//!
//! Every third client (2, 5, ...) wakes its waiters by a timer (`Waking::timer()`, no
//! subscriber), the others by release messages, on the same names at once: the rules below
//! hold for both, and each one's releases must reach the other's waiters.
//!
//! ```text
//! leasehold-chaos run --duration 120s --clients 5 --seed 42   # exit 1 on any violation
//! leasehold-chaos check DIR                                    # re-check a kept history
//! ```
//!
//! Checked (each a line of the summary, with its count):
//! - fence: the store never accepted a non-increasing token; every accepted token was granted;
//!   no token was handed to two grants of names in one Redis Cluster slot (they share the
//!   slot's counter, `P:{T}:fence`; names of different slots may be handed equal tokens); a
//!   grant that began after another's reply on the same lock has the higher token, also across
//!   a Redis restart;
//! - exclusion: no two owners ever both believed (`is_held()`) they held one lock at one
//!   instant, except right after Redis lost its data (counted apart, bounded by one lease);
//!   nor did two tasks under one owner id (a guard handed to a spawned task while the first
//!   task acquired again): a critical section is a (client process, task), and only nested
//!   re-entry within one task may overlap; writes that landed after their writer's lease (a
//!   pause between check and write) are counted with how many the fence refused;
//! - release: no acquire re-entered a hold its owner had let go of (an orphaned hold);
//! - read/write locks (`--rw-percent` of the ops): no write hold overlapped another owner's
//!   hold, read or write, while both believed; a write token is above every earlier grant's
//!   on the name (as every lock's); a reader asking for the write side was refused
//!   (`UpgradeRefused`), and an owner holding the write side got the read side at once;
//! - semaphores (`--sem-percent` of the ops, `--sem-permits` each): at no instant did the
//!   permits whose holders believed them held exceed the number, except right after Redis
//!   lost its data (counted apart, bounded by one lease);
//! - fair: on the fair locks (`--fair-percent` of the ops), no acquire was granted while a
//!   waiter that was in line before it began was still in line with the same arrival (the
//!   clients read the lines on a connection of their own, straight to Redis); on the
//!   read/write locks' lines too, but between two readers; and no waiter was passed after its
//!   own grant, whose reply was lost, was rolled back (slow links past the command timeout,
//!   mostly on the client first in line, bring such replies about);
//! - kinds: now and then (`--foreign-percent`) an acquire of another kind (plain or fair lock,
//!   either side of a read/write lock, a permit, a latch's `wait_for`) on a
//!   name in use by its own kind: where the history proves that kind there all along, it must
//!   be refused with `WrongKind`, never granted nor answered otherwise, and it must leave the
//!   name's state alone (no TTL on a semaphore's or a latch's hash, the name's own calls not
//!   refused as another kind, and at the end a semaphore's hash with its number and only its
//!   own fields, a latch's with only its count);
//! - latches (`--latch-percent` of the ops, `latch-<i>`): rounds of a count set, counted down
//!   and waited for from several clients, the next round often set at once by the party that
//!   opened the latch; a wait that was waiting when the latch opened must come back true;
//! - liveness: every waiter got a lock the history proves free within 225 ms (the 25 ms turn
//!   grace + 200 ms), or within that after a fault on its client (or on all) had healed and
//!   its recovery passed; no operation stalled for 15 s with no fault nearby, none was still
//!   waiting at the stop;
//! - cleanup: after the clients stopped, no subscription, no registered waiter or hold, no key
//!   without a TTL, and no key once every TTL ran out. The slots' fencing counters
//!   (`P:{T}:fence`) are not counted: they stay by design, to keep tokens increasing; nor are the
//!   semaphores' hashes (their number of permits is configuration), where no permit may still
//!   be leased, the counts must add up, and there must be no TTL and no other kind's field;
//!   nor the latches still counting down, whose hash must hold only its count, with no TTL.
//!
//! RedLock mode (`run --redlock N`): N independent redis-servers, each client process one
//! `LockClient` per server through proxies of its own and one `RedLock` over them, every op a
//! quorum lock (`--resources` of them, `rl-<i>`) through the six acquire forms, writing to the
//! store with the grant's `QuorumToken`. Faults per server (killed and restarted with its data
//! lost, paused, partitioned or slowed for all or for one client, connections reset), a minority of
//! the servers down at once, now and then a majority, and paused or killed clients (`redlock.rs`).
//! Checked (`redlock_check.rs`):
//! - quorum exclusion: no two owners both believed (`is_held()`) they held one RedLock at one
//!   instant, except where a server both grants counted lost its data in between (a killed
//!   server forgets its holds: the Redlock algorithm's own limit, counted apart and shown);
//! - vector fencing: the store accepts a write unless its token is older (`is_older_than`)
//!   than the merged latest; it never accepted a write older than one it accepted before;
//!   every accepted token was its writer's grant's; a grant that began after another's reply
//!   is newer on every server they share; no server handed one token to two grants;
//! - no grant while a majority of the servers was down (such calls fail with
//!   `QuorumUnreachable` or come back empty);
//! - every process numbers the servers alike (`RedLock::named`), although each reaches them at
//!   addresses of its own;
//! - cleanup on every server, as above;
//! - liveness, mild: no call under way 10 s with no fault in effect or healed in the last 5 s,
//!   none still waiting at the stop; no polling: the servers' script calls per call and
//!   server stay under 25 (5.3 on a 30 s run; 52.2 when a waiter of a lock held by a bare
//!   quorum retries instead of waiting for the release).
//!
//! Cluster mode (`run --cluster`): a Redis Cluster of 3 primaries with a replica each (testkit's
//! `RedisCluster`), the same client processes connected as cluster clients
//! (`ServerConfig::new_clustered` over every node; no proxies), taking locks of every kind (the
//! fair locks' observer follows `MOVED` to the node serving a line) whose slots are put on the
//! three primaries in turn before the start. Faults (`FaultKind::CLUSTER`, the primary kill and the
//! failover first in every run): a primary SIGKILLed, its replica promoted after the node timeout,
//! the node then restarted and rejoining as a replica; `CLUSTER FAILOVER` on a replica; a node
//! paused below the node timeout; the slot of a resource in use migrated to another primary (held a
//! while half-moved: `ASK`, `TRYAGAIN`, then `MOVED`); every node's pub/sub or command connections
//! killed; clients paused past their lease or killed. Checked: everything above, on every node
//! (channels, sharded ones too, on any node; keys on the primaries). Cluster replication is
//! asynchronous, so a killed primary loses the writes its replica had not received: overlaps and
//! semaphore excesses on the resources that primary served, within a lease after the failover, are
//! counted apart ("after a failover that lost writes"), as the one-server run counts those after
//! Redis lost its data. Tokens that went backwards across such a failover have a line of their own
//! too, but still fail the run: the fencing counter's server-time floor keeps tokens rising across
//! data loss (all the nodes share one clock here). A coordinated `CLUSTER FAILOVER` loses nothing,
//! so it excuses nothing, and a paused primary counts as killed only if its replica took over
//! meanwhile.
//!
//! How a client works is in `worker.rs`, the faults in `orchestrator.rs`, and why each check
//! is sound in `checker.rs`.
#![forbid(unsafe_code)]

mod checker;
mod clock;
mod history;
mod observer;
mod orchestrator;
mod redlock;
mod redlock_check;
mod redlock_worker;
mod rng;
mod run;
mod store;
mod trace;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "leasehold-chaos",
    about = "Fault-injection checker for leasehold"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run an experiment: Redis, proxies, K client processes, faults, then the checker.
    // A later `--duration` wins, so `just chaos --duration 60s` can override the recipe's.
    #[command(args_override_self = true)]
    Run {
        /// How long to inject faults (e.g. 120s, 2m, 20s).
        #[arg(long, default_value = "120s", value_parser = parse_duration)]
        duration: Duration,
        /// Client processes.
        #[arg(long, default_value_t = 5)]
        clients: u32,
        /// Seed of the fault schedule and of the clients' choices (default: from the clock).
        #[arg(long)]
        seed: Option<u64>,
        /// Tasks (lock owners) per client process.
        #[arg(long, default_value_t = 2)]
        tasks: u32,
        /// Plain locks shared by all clients.
        #[arg(long, default_value_t = 3)]
        resources: u32,
        /// Fair locks shared by all clients (`client.fair_lock`), besides the plain ones.
        #[arg(long, default_value_t = 1)]
        fair_resources: u32,
        /// The share of operations on a fair lock, in percent.
        #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=100))]
        fair_percent: u64,
        /// Read/write locks shared by all clients (`client.rw_lock`).
        #[arg(long, default_value_t = 1)]
        rw_resources: u32,
        /// The share of operations on a read/write lock, in percent (taken after the fair
        /// locks' share: the shares past 100 % are cut).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100))]
        rw_percent: u64,
        /// Semaphores shared by all clients (`client.semaphore`).
        #[arg(long, default_value_t = 1)]
        sem_resources: u32,
        /// The share of operations on a semaphore, in percent (taken after the read/write
        /// locks' share).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100))]
        sem_percent: u64,
        /// Each semaphore's number of permits (ops take 1 or 2).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
        sem_permits: u32,
        /// Count-down latches shared by all clients (`client.latch`).
        #[arg(long, default_value_t = 1)]
        latch_resources: u32,
        /// The share of operations on a latch, in percent (taken after the semaphores' share):
        /// rounds of a count set, counted down and waited for by several clients.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=100))]
        latch_percent: u64,
        /// The share of operations that are a foreign-kind attempt, in percent: an acquire of
        /// another kind on a name in use by its own kind, which must be refused.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(0..=100))]
        foreign_percent: u64,
        /// Watchdog lease of watched holds.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        lease: Duration,
        /// Command timeout of the clients.
        #[arg(long, default_value = "500ms", value_parser = parse_duration)]
        command_timeout: Duration,
        /// Where to write the history (default: a temporary directory, kept on failure).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Keep the temporary history directory even when the run passes.
        #[arg(long)]
        keep: bool,
        /// Checker self-test: clients act as if their lease never ended (must fail).
        #[arg(long, hide = true)]
        ignore_lease: bool,
        /// Checker self-test: half the fair waiters cut in at the head of the line (must fail).
        #[arg(long, hide = true)]
        cut_in_line: bool,
        /// Count re-entries into orphaned holds without failing (a known library bug).
        #[arg(long)]
        tolerate_orphaned_reentry: bool,
        /// RedLock mode: N independent Redis servers (3 or more), every op on a quorum lock
        /// over them (`--resources` of them, `rl-<i>`); the other kinds' options are unused.
        #[arg(long, value_parser = clap::value_parser!(u32).range(3..))]
        redlock: Option<u32>,
        /// Cluster mode: a Redis Cluster (3 primaries, a replica each), the clients connected
        /// as cluster clients, faults on its nodes (primary kills, failovers, pauses, slot
        /// migrations).
        #[arg(long, conflicts_with = "redlock")]
        cluster: bool,
    },
    /// Check a recorded history again (a directory written by `run`).
    Check { dir: PathBuf },
    /// One client process (started by `run`).
    #[command(hide = true)]
    Client {
        #[arg(long)]
        url: String,
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        client: u32,
        #[arg(long)]
        gen: u32,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        tasks: u32,
        #[arg(long)]
        resources: u32,
        #[arg(long)]
        fair_resources: u32,
        #[arg(long)]
        fair_percent: u64,
        #[arg(long)]
        rw_resources: u32,
        #[arg(long)]
        rw_percent: u64,
        #[arg(long)]
        sem_resources: u32,
        #[arg(long)]
        sem_percent: u64,
        #[arg(long)]
        sem_permits: u32,
        #[arg(long)]
        latch_resources: u32,
        #[arg(long)]
        latch_percent: u64,
        #[arg(long)]
        foreign_percent: u64,
        /// Redis itself, not the client's proxy: the client's own look at the fair locks.
        #[arg(long)]
        redis_addr: std::net::SocketAddr,
        #[arg(long)]
        lease_ms: u64,
        #[arg(long)]
        command_timeout_ms: u64,
        #[arg(long)]
        ignore_lease: bool,
        #[arg(long)]
        cut_in_line: bool,
        /// Cluster mode: the nodes to discover the cluster from, `host:port` comma-separated
        /// (`--url` is then unused).
        #[arg(long)]
        cluster_seeds: Option<String>,
    },
    /// One client process of a RedLock run (started by `run --redlock`).
    #[command(hide = true)]
    RedlockClient {
        /// This client's proxy to each server, comma-separated, by server number.
        #[arg(long)]
        urls: String,
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        client: u32,
        #[arg(long)]
        gen: u32,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        tasks: u32,
        #[arg(long)]
        resources: u32,
        #[arg(long)]
        lease_ms: u64,
        #[arg(long)]
        command_timeout_ms: u64,
        #[arg(long)]
        ignore_lease: bool,
    },
}

/// `120s`, `2m`, `500ms`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 120s, 2m or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!(
            "unknown unit {unit:?} in {text:?} (use ms, s or m)"
        )),
    }
}

/// `host:port,host:port`.
fn parse_seeds(list: &str) -> anyhow::Result<Vec<(String, u16)>> {
    list.split(',')
        .map(|seed| {
            let (host, port) = seed
                .rsplit_once(':')
                .ok_or_else(|| anyhow::anyhow!("seed {seed:?} is not host:port"))?;
            Ok((host.to_string(), port.parse()?))
        })
        .collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Cmd::Run {
            duration,
            clients,
            seed,
            tasks,
            resources,
            fair_resources,
            fair_percent,
            rw_resources,
            rw_percent,
            sem_resources,
            sem_percent,
            sem_permits,
            latch_resources,
            latch_percent,
            foreign_percent,
            lease,
            command_timeout,
            out,
            keep,
            ignore_lease,
            cut_in_line,
            tolerate_orphaned_reentry,
            redlock,
            cluster,
        } => {
            let config = run::RunConfig {
                duration,
                clients: clients.max(1),
                seed: seed.unwrap_or_else(|| clock::now_us() as u64),
                tasks: tasks.max(1),
                resources: resources.max(1),
                fair_resources,
                fair_percent: if fair_resources == 0 { 0 } else { fair_percent },
                rw_resources,
                rw_percent: if rw_resources == 0 { 0 } else { rw_percent },
                sem_resources,
                sem_percent: if sem_resources == 0 { 0 } else { sem_percent },
                sem_permits,
                latch_resources,
                latch_percent: if latch_resources == 0 {
                    0
                } else {
                    latch_percent
                },
                foreign_percent,
                lease,
                command_timeout,
                ignore_lease,
                cut_in_line,
                tolerate_orphaned_reentry,
                redlock: redlock.unwrap_or(0),
                cluster,
            };
            orchestrator::main(config, out, keep)
        }
        Cmd::Check { dir } => checker::check(&dir).map(|report| {
            print!("{report}");
            report.passed()
        }),
        Cmd::Client {
            url,
            prefix,
            client,
            gen,
            dir,
            seed,
            tasks,
            resources,
            fair_resources,
            fair_percent,
            rw_resources,
            rw_percent,
            sem_resources,
            sem_percent,
            sem_permits,
            latch_resources,
            latch_percent,
            foreign_percent,
            redis_addr,
            lease_ms,
            command_timeout_ms,
            ignore_lease,
            cut_in_line,
            cluster_seeds,
        } => cluster_seeds
            .as_deref()
            .map(parse_seeds)
            .transpose()
            .and_then(|cluster_seeds| {
                worker::main(worker::WorkerConfig {
                    url,
                    prefix,
                    client,
                    gen,
                    dir,
                    seed,
                    tasks,
                    resources,
                    fair_resources,
                    fair_percent,
                    rw_resources,
                    rw_percent,
                    sem_resources,
                    sem_percent,
                    sem_permits,
                    latch_resources,
                    latch_percent,
                    foreign_percent,
                    redis_addr,
                    lease: Duration::from_millis(lease_ms),
                    command_timeout: Duration::from_millis(command_timeout_ms),
                    ignore_lease,
                    cut_in_line,
                    cluster_seeds,
                })
            })
            .map(|()| true),
        Cmd::RedlockClient {
            urls,
            prefix,
            client,
            gen,
            dir,
            seed,
            tasks,
            resources,
            lease_ms,
            command_timeout_ms,
            ignore_lease,
        } => redlock_worker::main(redlock_worker::QWorkerConfig {
            urls: urls.split(',').map(str::to_string).collect(),
            prefix,
            client,
            gen,
            dir,
            seed,
            tasks,
            resources,
            lease: Duration::from_millis(lease_ms),
            command_timeout: Duration::from_millis(command_timeout_ms),
            ignore_lease,
        })
        .map(|()| true),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("leasehold-chaos: {error:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
