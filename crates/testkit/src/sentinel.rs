//! [`SentinelSet`]: a primary with replicas, watched by Redis Sentinels that fail it over.
//!
//! A client configured with the Sentinels (`fred`'s `ServerConfig::Sentinel`) asks them where
//! the primary is and reconnects to the new one after a failover. Testing that takes real
//! Sentinels: this module starts a primary, two replicas (`--replicaof`) and three Sentinels
//! (`redis-server <conf> --sentinel`, quorum 2, `down-after-milliseconds` 1000,
//! `failover-timeout` 5000), so a killed primary is replaced within a few seconds.

use std::fs::{self, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tempfile::TempDir;

use crate::cluster::role_of;
use crate::error::{Result, TestkitError};
use crate::resp::{self, RespValue};
use crate::server::RedisServer;
use crate::spawn;

/// The service name the Sentinels monitor (`sentinel monitor mymaster ...`).
pub const SENTINEL_SERVICE: &str = "mymaster";

const SENTINELS: usize = 3;
const REPLICAS: usize = 2;
const QUORUM: usize = 2;
const DOWN_AFTER_MS: u64 = 1000;
const FAILOVER_TIMEOUT_MS: u64 = 5000;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the Sentinels may take to discover the replicas and each other.
const DISCOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failover may take, from the kill to a new primary everyone agrees on.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const START_ATTEMPTS: usize = 5;
const POLL: Duration = Duration::from_millis(20);

/// One `redis-server --sentinel` process on a free loopback port, SIGKILLed on drop.
#[derive(Debug)]
pub struct Sentinel {
    port: u16,
    child: Mutex<Option<Child>>,
    // Dropped after the process (field order): holds the config the Sentinel rewrites.
    dir: TempDir,
}

impl Sentinel {
    fn start(primary_port: u16) -> Result<Sentinel> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-sentinel-")
            .tempdir()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            match launch_sentinel(dir.path(), port, primary_port) {
                Ok(child) => {
                    return Ok(Sentinel {
                        port,
                        child: Mutex::new(Some(child)),
                        dir,
                    })
                }
                Err((e, true)) => last_err = Some(e),
                Err((e, false)) => return Err(e),
            }
        }
        Err(last_err.expect("at least one attempt was made"))
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// Sends one command (e.g. `SENTINEL ...`) over a short-lived connection.
    pub fn command<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<RespValue> {
        resp::command(self.addr(), args, COMMAND_TIMEOUT)
    }

    /// SIGKILLs the Sentinel and reaps it. No-op if it is not running.
    pub fn kill(&self) -> Result<()> {
        if let Some(mut child) = self.child.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Whether the process is alive.
    pub fn is_running(&self) -> bool {
        let mut child = self.child.lock();
        match child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                *child = None;
                false
            }
            None => false,
        }
    }

    /// The last bytes of the Sentinel's log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = text.len().saturating_sub(1500);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }

    /// `SENTINEL get-master-addr-by-name mymaster`: the port of the primary it names.
    pub fn primary_port(&self) -> Result<u16> {
        let reply = self.command(&["SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE])?;
        reply
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(RespValue::as_str)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| {
                TestkitError::Protocol(format!("get-master-addr-by-name replied {reply:?}"))
            })
    }

    /// `SENTINEL <what> mymaster` (`replicas` or `sentinels`) as one field map per entry.
    fn entries(&self, what: &str) -> Result<Vec<Vec<(String, String)>>> {
        let reply = self.command(&["SENTINEL", what, SENTINEL_SERVICE])?;
        let list = reply
            .as_array()
            .ok_or_else(|| TestkitError::Protocol(format!("SENTINEL {what} replied {reply:?}")))?;
        Ok(list
            .iter()
            .map(|entry| {
                let fields: Vec<String> = entry
                    .as_array()
                    .unwrap_or_default()
                    .iter()
                    .map(|f| f.as_str().unwrap_or_default())
                    .collect();
                fields
                    .chunks(2)
                    .filter(|kv| kv.len() == 2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect()
            })
            .collect())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.get_mut().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A Sentinel-managed deployment: a primary, two replicas and three Sentinels (quorum 2)
/// monitoring it as [`SENTINEL_SERVICE`] (`mymaster`).
///
/// * [`start`](Self::start) returns once every Sentinel names the primary, sees both replicas
///   (not down) and knows the two other Sentinels, so a failover can be authorised.
/// * [`kill_primary_and_wait`](Self::kill_primary_and_wait) SIGKILLs the current primary and
///   waits until every running Sentinel names a new one and that one says `role:master`.
/// * [`sentinel_hosts`](Self::sentinel_hosts) are the addresses for `fred`'s
///   `ServerConfig::new_sentinel(hosts, "mymaster")`.
///
/// The data nodes are [`RedisServer`]s (no persistence), indexed in
/// [`servers`](Self::servers): 0 starts as the primary. Everything is SIGKILLed on drop.
/// All methods block.
#[derive(Debug)]
pub struct SentinelSet {
    // Sentinels first: dropped before the data nodes, so none starts a failover on the way out.
    sentinels: Vec<Sentinel>,
    servers: Vec<RedisServer>,
}

impl SentinelSet {
    /// Starts the primary, two replicas and three Sentinels, and waits until the Sentinels
    /// see the replicas and each other.
    pub fn start() -> Result<SentinelSet> {
        // Replicas sync at once instead of after the default 5 s wait for more replicas to
        // share one diskless transfer.
        let primary = RedisServer::builder()
            .args(["--repl-diskless-sync-delay", "0"])
            .start()?;
        let primary_port = primary.port().to_string();
        let mut servers = vec![primary];
        for _ in 0..REPLICAS {
            servers.push(
                RedisServer::builder()
                    .args(["--replicaof", "127.0.0.1", &primary_port])
                    .args(["--repl-diskless-sync-delay", "0"])
                    .start()?,
            );
        }
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(Sentinel::start(servers[0].port())?);
        }
        let set = SentinelSet { sentinels, servers };
        set.wait_until(
            "the Sentinels to see the replicas and each other",
            DISCOVER_TIMEOUT,
            || {
                for replica in &set.servers[1..] {
                    if !replica
                        .info("replication")?
                        .contains("master_link_status:up")
                    {
                        return Ok(Err(format!("replica {} is not synced", replica.port())));
                    }
                }
                for s in &set.sentinels {
                    let replicas = s.entries("replicas")?;
                    let up = replicas
                        .iter()
                        .filter(|r| {
                            field(r, "flags").is_some_and(|f| f == "slave")
                                && field(r, "master-link-status") == Some("ok")
                        })
                        .count();
                    let others = s.entries("sentinels")?.len();
                    if up < REPLICAS || others < SENTINELS - 1 {
                        return Ok(Err(format!(
                            "sentinel {} sees {up} replicas up and {others} other sentinels",
                            s.port()
                        )));
                    }
                }
                Ok(Ok(()))
            },
        )?;
        Ok(set)
    }

    /// The data nodes: index 0 started as the primary, 1 and 2 as its replicas.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The Sentinels.
    pub fn sentinels(&self) -> &[Sentinel] {
        &self.sentinels
    }

    /// `("127.0.0.1", port)` of every Sentinel, for `fred`'s `ServerConfig::new_sentinel`.
    pub fn sentinel_hosts(&self) -> Vec<(String, u16)> {
        self.sentinels
            .iter()
            .map(|s| ("127.0.0.1".to_string(), s.port()))
            .collect()
    }

    /// The set as a URL for `fred`'s `Config::from_url` (and `LockClient::connect`):
    /// `redis-sentinel://127.0.0.1:SENTINEL?sentinelServiceName=mymaster&node=127.0.0.1:...`,
    /// every Sentinel named.
    pub fn url(&self) -> String {
        let mut hosts = self.sentinel_hosts().into_iter();
        let mut url = match hosts.next() {
            Some((host, port)) => format!("redis-sentinel://{host}:{port}"),
            None => return "redis-sentinel://".to_string(),
        };
        url.push_str(&format!("?sentinelServiceName={SENTINEL_SERVICE}"));
        for (host, port) in hosts {
            url.push_str(&format!("&node={host}:{port}"));
        }
        url
    }

    /// The index in [`servers`](Self::servers) of the primary a running Sentinel names.
    pub fn primary(&self) -> Result<usize> {
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.is_running())
            .ok_or_else(|| TestkitError::Process("no Sentinel is running".into()))?;
        let port = sentinel.primary_port()?;
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .ok_or_else(|| TestkitError::Protocol(format!("Sentinels name unknown port {port}")))
    }

    /// SIGKILLs the current primary and waits until every running Sentinel names another one
    /// (`SENTINEL get-master-addr-by-name`) that says `role:master`. Returns its index.
    ///
    /// The Sentinels need `down-after-milliseconds` (1 s) to agree the primary is down, then
    /// elect a leader and promote a replica: a few seconds in all.
    pub fn kill_primary_and_wait(&self) -> Result<usize> {
        let old = self.primary()?;
        self.servers[old].kill()?;
        let old_port = self.servers[old].port();
        let mut new = None;
        self.wait_until(
            &format!("the Sentinels to replace primary {old_port}"),
            FAILOVER_WAIT,
            || {
                let mut named = None;
                for s in self.sentinels.iter().filter(|s| s.is_running()) {
                    let port = s.primary_port()?;
                    if port == old_port {
                        return Ok(Err(format!("sentinel {} still names {old_port}", s.port())));
                    }
                    if named.is_some_and(|p| p != port) {
                        return Ok(Err("the Sentinels name different primaries".into()));
                    }
                    named = Some(port);
                }
                let Some(index) =
                    named.and_then(|p| self.servers.iter().position(|s| s.port() == p))
                else {
                    return Ok(Err("no running Sentinel names a known primary".into()));
                };
                if role_of(&self.servers[index])? != "master" {
                    return Ok(Err(format!(
                        "{} is named but does not say role:master",
                        self.servers[index].port()
                    )));
                }
                new = Some(index);
                Ok(Ok(()))
            },
        )?;
        Ok(new.expect("set on success"))
    }

    fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut() -> Result<std::result::Result<(), String>>,
    ) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let last = match check() {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(why)) => why,
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                let tails: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("--- sentinel {} ---\n{}", s.port(), s.log_tail()))
                    .collect();
                return Err(TestkitError::Timeout(format!(
                    "waiting {within:?} for {what}; last seen: {last}\n{}",
                    tails.join("\n")
                )));
            }
            thread::sleep(POLL);
        }
    }
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Writes the Sentinel's config (it must be a file: Sentinel rewrites it) and starts
/// `redis-server <conf> --sentinel`, waiting for `PING`. On failure, the error and whether the
/// port was taken (worth another port).
fn launch_sentinel(
    dir: &Path,
    port: u16,
    primary_port: u16,
) -> std::result::Result<Child, (TestkitError, bool)> {
    let fatal = |e: io::Error| (TestkitError::from(e), false);
    let conf = dir.join("sentinel.conf");
    let log = dir.join("sentinel.log");
    let _ = fs::remove_file(&log);
    let text = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         protected-mode no\n\
         daemonize no\n\
         dir {dir}\n\
         logfile {log}\n\
         sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary_port} {QUORUM}\n\
         sentinel down-after-milliseconds {SENTINEL_SERVICE} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {SENTINEL_SERVICE} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {SENTINEL_SERVICE} 1\n",
        dir = dir.display(),
        log = log.display(),
    );
    fs::write(&conf, text).map_err(fatal)?;
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sentinel.stdio.log"))
        .map_err(fatal)?;
    let binary = std::env::var_os(crate::server::REDIS_SERVER_ENV)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "redis-server".into());
    let mut cmd = Command::new(&binary);
    // The config file must be the first argument: Sentinel refuses to run without one.
    cmd.arg(&conf)
        .arg("--sentinel")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio.try_clone().map_err(fatal)?)
        .stderr(stdio);
    let mut child = match spawn::spawn(cmd) {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err((
                TestkitError::RedisNotFound {
                    binary: binary.to_string_lossy().into_owned(),
                },
                false,
            ))
        }
        Err(e) => return Err(fatal(e)),
    };
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        let exited = !matches!(child.try_wait(), Ok(None));
        let ready = !exited
            && resp::command(addr, &["PING"], Duration::from_millis(250))
                .is_ok_and(|v| v.as_str().as_deref() == Some("PONG"));
        if ready {
            return Ok(child);
        }
        if exited || Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log_tail = fs::read_to_string(&log).unwrap_or_default();
            let in_use = log_tail.contains("Address already in use");
            return Err((
                TestkitError::StartFailed {
                    port,
                    reason: if exited {
                        "sentinel exited during startup".into()
                    } else {
                        format!("sentinel gave no PONG within {STARTUP_TIMEOUT:?}")
                    },
                    log_tail,
                },
                in_use,
            ));
        }
        thread::sleep(POLL);
    }
}
