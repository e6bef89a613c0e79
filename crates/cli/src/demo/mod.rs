//! `leasehold demo`: the seeds' three scenarios, played by real OS processes.
//!
//! The demo re-runs its own binary as pods (`leasehold pod ROLE`, see [`pod`]), each with its
//! own lock client, against one Redis: its own throw-away redis-server (leasehold-testkit)
//! unless `REDIS_URL` or `--url` names one. `--cluster` starts a local Redis Cluster instead (3
//! primaries with a replica each) and `--sentinel` a primary with two replicas under three
//! Sentinels; the pods then connect with a `redis-cluster://` or `redis-sentinel://` URL, as
//! any user of the library would, and the demo says which node serves each scenario's lock.
//! `--failover` plays another story on a primary and a replica of its own ([`failover`]): a
//! lock through a failover, granted twice without replica sync, kept with it.
//! It tells what happened, checks each outcome, and exits non-zero if any scenario did not
//! behave as it should.
//!
//! Nothing is left behind: the keys live under a prefix unique to the run
//! (`leasehold-demo-<random>`) and are deleted at the end, the SQLite file lives in a temp dir,
//! and a PostgreSQL table (when `DATABASE_URL` is set) is unique to the run and dropped.

mod events;
mod failover;
mod inventory;
mod long_job;
pub mod pod;
mod pods;
mod report;
mod starting_line;
mod store;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, CustomCommand, Value};
use futures::TryStreamExt;
use leasehold::LockClient;
use leasehold_testkit::{RedisCluster, RedisServer, SentinelSet};

use crate::cli::DemoArgs;
use crate::connect::{connect, redact};
use crate::glob;
use crate::list::scan_keys;
use events::PodEvent;
use pods::Pods;
use store::{Store, StoreSpec};

/// The longest any one step of a scenario may take before the demo calls it stuck.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// The pods' lease where the scenario does not choose one.
const DEFAULT_LEASE_MS: u64 = 30_000;

/// What every scenario needs.
pub struct Ctx {
    exe: PathBuf,
    url: String,
    prefix: String,
    spec: StoreSpec,
    store: Store,
    /// The demo's own client (its `redis()` tells where a lock's keys live); declared before
    /// the runtime so that it is dropped first.
    client: LockClient,
    runtime: tokio::runtime::Runtime,
}

impl Ctx {
    /// A new, empty group of pods.
    fn pods(&self) -> Pods {
        Pods::new(self.exe.clone(), &self.url, &self.prefix)
    }

    /// Runs a database or Redis call of the demo itself.
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Says which node serves lock `name` on a cluster (its slot's primary) or behind
    /// Sentinels (the primary they named); nothing on one server.
    fn say_where(&self, name: &str) {
        let placement = self
            .client
            .lock(name)
            .map_err(anyhow::Error::from)
            .and_then(|lock| self.block_on(placement(self.client.redis(), lock.keys().slot())));
        match placement {
            Ok(Some(placement)) => say(&format!("lock {name:?}: {placement}")),
            Ok(None) => {}
            // Only an account: the scenario goes on.
            Err(error) => say(&format!(
                "lock {name:?}: cannot tell which node serves it: {error:#}"
            )),
        }
    }
}

/// Where a lock whose keys are in `slot` lives: `Some` on a cluster or behind Sentinels.
async fn placement(redis: &Client, slot: u16) -> anyhow::Result<Option<String>> {
    if redis.is_clustered() {
        // Asked of the slot's own primary, as fred routes it: who serves which slots.
        let slots: Value = redis
            .custom(
                CustomCommand::new_static("CLUSTER", ClusterHash::Custom(slot), false),
                vec!["SLOTS"],
            )
            .await?;
        let owner = slot_owner(&slots, slot)
            .with_context(|| format!("CLUSTER SLOTS names no primary for slot {slot}"))?;
        return Ok(Some(format!(
            "its keys are in hash slot {slot}, served by primary {owner}"
        )));
    }
    if matches!(redis.client_config().server, ServerConfig::Sentinel { .. }) {
        let primary = redis
            .active_connections()
            .first()
            .map_or_else(|| "(not connected)".to_string(), ToString::to_string);
        return Ok(Some(format!(
            "served by primary {primary}, as the Sentinels named it"
        )));
    }
    Ok(None)
}

/// The `host:port` serving `slot` in a `CLUSTER SLOTS` reply (`[[first, last, [host, port,
/// id, ...], replicas...], ...]`).
fn slot_owner(reply: &Value, slot: u16) -> Option<String> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges.iter().find_map(|range| {
        let Value::Array(range) = range else {
            return None;
        };
        let first = range.first()?.as_u64()?;
        let last = range.get(1)?.as_u64()?;
        if !(first..=last).contains(&u64::from(slot)) {
            return None;
        }
        let Value::Array(primary) = range.get(2)? else {
            return None;
        };
        let host = primary.first()?.as_string()?;
        let port = primary.get(1)?.as_u64()?;
        Some(format!("{host}:{port}"))
    })
}

/// A scenario: prints its own account, `Err` when it did not behave as expected.
type Scenario = fn(&Ctx) -> anyhow::Result<()>;

/// The Redis the demo plays on; dropping it stops the processes the demo started.
#[allow(dead_code)] // Held only to be dropped at the end of the demo.
enum Deployment {
    /// Named by `--url` or `REDIS_URL`.
    Given,
    Server(RedisServer),
    Cluster(RedisCluster),
    Sentinel(SentinelSet),
}

/// Plays the demo; `Ok(false)` when a scenario did not behave as expected.
pub fn run(url: Option<&str>, args: DemoArgs) -> anyhow::Result<bool> {
    let began = Instant::now();
    if let (Some(url), true) = (url, args.cluster || args.sentinel) {
        bail!(
            "--{} starts its own deployment and does not use --url or REDIS_URL (set to {}): \
             unset it, or drop the flag to play on that Redis",
            if args.cluster { "cluster" } else { "sentinel" },
            redact(url)
        );
    }
    if args.failover {
        if args.cluster || args.sentinel {
            bail!(
                "--failover plays on a primary and a replica of its own (it kills the primary) \
                 and cannot be combined with --{}: drop one of the flags",
                if args.cluster { "cluster" } else { "sentinel" }
            );
        }
        if let Some(url) = url {
            bail!(
                "--failover starts its own primary and replica (it kills the primary) and does \
                 not use --url or REDIS_URL (set to {}): unset it to play the failover",
                redact(url)
            );
        }
        return failover::run(began);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    println!("leasehold demo: three pods (real OS processes) share one Redis");

    // Kept alive until the end of the demo.
    let (url, _deployment) = match url {
        Some(url) => {
            say(&format!("redis: {} (from REDIS_URL or --url)", redact(url)));
            (url.to_string(), Deployment::Given)
        }
        None if args.cluster => {
            let cluster = RedisCluster::start()
                .context("cannot start a Redis Cluster for the demo (or set REDIS_URL)")?;
            let ports = |indices: std::ops::Range<usize>| {
                indices
                    .map(|i| cluster.node(i).port().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let count = cluster.nodes().len();
            say(&format!(
                "redis: started a Redis Cluster on 127.0.0.1: primaries {} (slots split in \
                 three), a replica each ({})",
                ports(0..count / 2),
                ports(count / 2..count)
            ));
            let url = cluster.url();
            say(&format!("pods connect with {url}"));
            (url, Deployment::Cluster(cluster))
        }
        None if args.sentinel => {
            let set = SentinelSet::start()
                .context("cannot start a Sentinel set for the demo (or set REDIS_URL)")?;
            let servers = set.servers();
            say(&format!(
                "redis: started a primary on 127.0.0.1:{} with replicas {}, watched by \
                 Sentinels on {}",
                servers[0].port(),
                servers[1..]
                    .iter()
                    .map(|s| s.port().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                set.sentinels()
                    .iter()
                    .map(|s| s.port().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            let url = set.url();
            say(&format!("pods connect with {url}"));
            (url, Deployment::Sentinel(set))
        }
        None => {
            let server = RedisServer::start()
                .context("cannot start a redis-server for the demo (or set REDIS_URL)")?;
            say(&format!(
                "redis: started redis-server on 127.0.0.1:{} (set REDIS_URL to use yours)",
                server.port()
            ));
            (server.url(), Deployment::Server(server))
        }
    };
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let prefix = format!("leasehold-demo-{run_id}");
    // Connect once up front: a wrong URL is reported before any pod starts.
    let client = runtime.block_on(connect(&url, &prefix))?;

    let (spec, store, _dir) = runtime.block_on(open_store(&run_id))?;
    say(&format!("store: {}", spec.describe()));

    let ctx = Ctx {
        exe: std::env::current_exe().context("cannot find this program to run the pods")?,
        url,
        prefix,
        spec,
        store,
        runtime,
        client,
    };
    let scenarios: [(&str, Scenario); 3] = [
        ("inventory", inventory::run),
        ("daily report", report::run),
        ("long job", long_job::run),
    ];
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        println!();
        if let Err(error) = scenario(&ctx) {
            say(&format!("FAILED: {error:#}"));
            failed.push(name);
        }
    }

    // Clean up whatever happened above.
    match ctx.block_on(delete_keys(ctx.client.redis(), &ctx.prefix)) {
        Ok(_) => {}
        Err(error) => eprintln!(
            "leasehold: warning: could not delete the demo's keys under {}: {error:#}",
            ctx.prefix
        ),
    }
    if let Err(error) = ctx.block_on(ctx.store.drop_table()) {
        eprintln!("leasehold: warning: {error:#}");
    }
    drop(ctx);

    Ok(summarize(&failed, began))
}

/// The last line of a demo: whether every scenario behaved as expected (`failed` names those
/// that did not).
fn summarize(failed: &[&str], began: Instant) -> bool {
    println!();
    let took = began.elapsed().as_secs_f64();
    if failed.is_empty() {
        println!("all scenarios behaved as expected ({took:.1} s)");
    } else {
        println!(
            "{} of 3 scenarios did not behave as expected: {} ({took:.1} s)",
            failed.len(),
            failed.join(", ")
        );
    }
    failed.is_empty()
}

/// The inventory, created: in PostgreSQL (a table unique to the run) when `DATABASE_URL` is
/// set, else in a SQLite file in a temp dir, returned to be kept until the end.
async fn open_store(run_id: &str) -> anyhow::Result<(StoreSpec, Store, Option<tempfile::TempDir>)> {
    let (spec, dir) = match std::env::var("DATABASE_URL") {
        Ok(db) if !db.trim().is_empty() => (
            StoreSpec::Postgres {
                url: db,
                table: format!("leasehold_demo_{run_id}"),
            },
            None,
        ),
        _ => {
            let dir = tempfile::Builder::new()
                .prefix("leasehold-demo-")
                .tempdir()
                .context("cannot create a temp dir for the SQLite file")?;
            (StoreSpec::Sqlite(store::sqlite_path(dir.path())), Some(dir))
        }
    };
    let store = Store::open(&spec).await?;
    store.create().await?;
    Ok((spec, store, dir))
}

/// Prints one line of the account, indented under the scenario's title.
fn say(line: &str) {
    println!("   {line}");
}

/// Waits for the next event accepted by `pick`, from pod `from` (or any pod when `None`).
///
/// `Done` is skipped (pods say it last, the group tracks it). Any other event is a protocol
/// error: the scenarios wait for events in the order they must happen, so an event out of
/// place means the story went wrong and is reported rather than ignored.
fn expect<T>(
    pods: &mut Pods,
    from: Option<&str>,
    deadline: Instant,
    what: &str,
    mut pick: impl FnMut(&PodEvent) -> Option<T>,
) -> anyhow::Result<(String, T)> {
    loop {
        let (label, event) = pods.next(deadline, what)?;
        if event == PodEvent::Done {
            continue;
        }
        if from.is_none_or(|f| f == label) {
            if let Some(value) = pick(&event) {
                return Ok((label, value));
            }
        }
        bail!("unexpected {event:?} from {label} while waiting for {what}");
    }
}

/// The three pods of a scenario: spawns them with `role`, waits until each says it is ready,
/// then lets them all go at once (the seeds' "3 pods at the same moment").
const POD_LABELS: [&str; 3] = ["pod-1", "pod-2", "pod-3"];

fn start_three_pods(
    pods: &mut Pods,
    role: &[String],
    deadline: Instant,
    what: &str,
) -> anyhow::Result<[&'static str; 3]> {
    for label in POD_LABELS {
        pods.spawn(label, DEFAULT_LEASE_MS, role)?;
    }
    for _ in POD_LABELS {
        expect(pods, None, deadline, what, |e| {
            (*e == PodEvent::Ready).then_some(())
        })?;
    }
    pods.go_all()?;
    Ok(POD_LABELS)
}

/// Deletes every key under `prefix` (SCAN + UNLINK, never KEYS; every primary of a cluster).
/// Returns how many. One UNLINK per key, pipelined: on a cluster the keys of one UNLINK would
/// have to share a slot.
async fn delete_keys(redis: &Client, prefix: &str) -> anyhow::Result<usize> {
    let keys: BTreeSet<String> = scan_keys(redis, format!("{}:*", glob::escape(prefix)), None)
        .try_filter_map(|key| async move { Ok(key.as_str().map(str::to_string)) })
        .try_collect()
        .await?;
    let keys: Vec<String> = keys.into_iter().collect();
    for batch in keys.chunks(500) {
        let pipeline = redis.pipeline();
        for key in batch {
            let _: () = pipeline.unlink(key.as_str()).await?;
        }
        let _: Vec<i64> = pipeline.all().await?;
    }
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use fred::types::Value;

    use super::slot_owner;

    #[test]
    fn slot_owner_reads_cluster_slots() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::from("127.0.0.1"),
                Value::Integer(port),
                Value::from("id"),
            ])
        };
        let range = |first: i64, last: i64, port: i64, replica: i64| {
            Value::Array(vec![
                Value::Integer(first),
                Value::Integer(last),
                node(port),
                node(replica),
            ])
        };
        let reply = Value::Array(vec![
            range(5461, 10922, 7001, 7004),
            range(0, 5460, 7000, 7003),
            range(10923, 16383, 7002, 7005),
        ]);
        assert_eq!(slot_owner(&reply, 0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(slot_owner(&reply, 5461).as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(slot_owner(&reply, 16383).as_deref(), Some("127.0.0.1:7002"));
        assert_eq!(slot_owner(&Value::Array(vec![]), 1), None);
        assert_eq!(slot_owner(&Value::Null, 1), None);
    }
}
