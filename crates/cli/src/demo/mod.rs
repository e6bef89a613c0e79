//! `leasehold demo`: the seeds' three scenarios, played by real OS processes.
//!
//! The demo re-runs its own binary as pods (`leasehold pod ROLE`, see [`pod`]), each with its
//! own lock client, against one Redis: its own throw-away redis-server (leasehold-testkit)
//! unless `REDIS_URL` or `--url` names one. It tells what happened, checks each outcome, and
//! exits non-zero if any scenario did not behave as it should.
//!
//! Nothing is left behind: the keys live under a prefix unique to the run
//! (`leasehold-demo-<random>`) and are deleted at the end, the SQLite file lives in a temp dir,
//! and a PostgreSQL table (when `DATABASE_URL` is set) is unique to the run and dropped.

mod events;
mod inventory;
mod long_job;
pub mod pod;
mod pods;
mod report;
mod starting_line;
mod store;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fred::clients::Client;
use fred::interfaces::KeysInterface;
use futures::TryStreamExt;
use leasehold_testkit::RedisServer;

use crate::connect::{connect, redact};
use crate::glob;
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
}

/// A scenario: prints its own account, `Err` when it did not behave as expected.
type Scenario = fn(&Ctx) -> anyhow::Result<()>;

/// Plays the demo; `Ok(false)` when a scenario did not behave as expected.
pub fn run(url: Option<&str>) -> anyhow::Result<bool> {
    let began = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    println!("leasehold demo: three pods (real OS processes) share one Redis");

    // Kept alive until the end of the demo; dropping it stops the server.
    let mut _server = None;
    let url = match url {
        Some(url) => {
            say(&format!("redis: {} (from REDIS_URL or --url)", redact(url)));
            url.to_string()
        }
        None => {
            let server = RedisServer::start()
                .context("cannot start a redis-server for the demo (or set REDIS_URL)")?;
            say(&format!(
                "redis: started redis-server on 127.0.0.1:{} (set REDIS_URL to use yours)",
                server.port()
            ));
            let url = server.url();
            _server = Some(server);
            url
        }
    };
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let prefix = format!("leasehold-demo-{run_id}");
    // Connect once up front: a wrong URL is reported before any pod starts.
    let client = runtime.block_on(connect(&url, &prefix))?;

    let _dir;
    let spec = match std::env::var("DATABASE_URL") {
        Ok(db) if !db.trim().is_empty() => StoreSpec::Postgres {
            url: db,
            table: format!("leasehold_demo_{run_id}"),
        },
        _ => {
            let dir = tempfile::Builder::new()
                .prefix("leasehold-demo-")
                .tempdir()
                .context("cannot create a temp dir for the SQLite file")?;
            let path = store::sqlite_path(dir.path());
            _dir = dir;
            StoreSpec::Sqlite(path)
        }
    };
    let store = runtime.block_on(Store::open(&spec))?;
    runtime.block_on(store.create())?;
    say(&format!("store: {}", spec.describe()));

    let ctx = Ctx {
        exe: std::env::current_exe().context("cannot find this program to run the pods")?,
        url,
        prefix,
        spec,
        store,
        runtime,
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
    match ctx.block_on(delete_keys(client.redis(), &ctx.prefix)) {
        Ok(_) => {}
        Err(error) => eprintln!(
            "leasehold: warning: could not delete the demo's keys under {}: {error:#}",
            ctx.prefix
        ),
    }
    if let Err(error) = ctx.block_on(ctx.store.drop_table()) {
        eprintln!("leasehold: warning: {error:#}");
    }
    drop(client);

    println!();
    let took = began.elapsed().as_secs_f64();
    if failed.is_empty() {
        println!("all scenarios behaved as expected ({took:.1} s)");
        Ok(true)
    } else {
        println!(
            "{} of 3 scenarios did not behave as expected: {} ({took:.1} s)",
            failed.len(),
            failed.join(", ")
        );
        Ok(false)
    }
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

/// Deletes every key under `prefix` (SCAN + UNLINK, never KEYS). Returns how many.
async fn delete_keys(redis: &Client, prefix: &str) -> anyhow::Result<usize> {
    let keys: Vec<String> = redis
        .scan_buffered(format!("{}:*", glob::escape(prefix)), Some(500), None)
        .try_filter_map(|key| async move { Ok(key.as_str().map(str::to_string)) })
        .try_collect()
        .await?;
    for batch in keys.chunks(500) {
        let _: i64 = redis.unlink(batch.to_vec()).await?;
    }
    Ok(keys.len())
}
