//! Where the processes run: redis-server on a core of its own, the benchmark on the others.
//!
//! Unpinned on a 2-core machine, redis-server, the runtime's workers and the kernel's network
//! work share both cores, so each scenario measures the scheduler as much as the lock. In
//! production Redis runs on another machine (or at least another core). When the harness starts
//! its own redis-server and may use at least two CPUs, it gives Redis the last of them and
//! keeps every other one for itself; the baselines run under the same placement, so the ratios
//! compare like with like. A server named by `REDIS_URL` is not ours to pin, and `--no-pin`
//! turns placement off (to compare).

use std::fmt;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPU placement of one run.
#[derive(Clone, Debug)]
pub(crate) enum Placement {
    /// redis-server on `redis`, the benchmark on `client`.
    Pinned { redis: usize, client: Vec<usize> },
    /// Nothing pinned, and why.
    Unpinned(&'static str),
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Pinned { redis, client } => {
                write!(
                    f,
                    "redis-server pinned to CPU {redis}, benchmark to CPUs {client:?}"
                )
            }
            Placement::Unpinned(why) => write!(f, "nothing pinned ({why})"),
        }
    }
}

/// Starts redis-server (unless `external`, from `REDIS_URL`, names one) with the placement
/// described above.
///
/// Must run before the tokio runtime is built: threads inherit the affinity of the thread that
/// creates them, and so does the redis-server child.
pub(crate) fn start_redis(
    external: bool,
    pin: bool,
) -> anyhow::Result<(Option<leasehold_testkit::RedisServer>, Placement)> {
    if external {
        return Ok((None, Placement::Unpinned("REDIS_URL names the server")));
    }
    let allowed = allowed_cpus()?;
    if !pin || allowed.len() < 2 {
        let why = if pin { "fewer than 2 CPUs" } else { "--no-pin" };
        return Ok((
            Some(leasehold_testkit::RedisServer::start()?),
            Placement::Unpinned(why),
        ));
    }
    let (client, redis) = allowed.split_at(allowed.len() - 1);
    let redis = redis[0];
    set_affinity(&[redis])?;
    let server = leasehold_testkit::RedisServer::start();
    // Back to the client's CPUs whatever happened, before anything else starts.
    set_affinity(client)?;
    Ok((
        Some(server?),
        Placement::Pinned {
            redis,
            client: client.to_vec(),
        },
    ))
}

fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Sets the calling thread's affinity (threads and processes it starts inherit it).
fn set_affinity(cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}
