//! [`RedisServer`]: a throw-away `redis-server` process on a free loopback port.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use parking_lot::Mutex;
use tempfile::TempDir;

use crate::error::{Result, TestkitError};
use crate::resp::{self, RespValue};
use crate::spawn;

/// Environment variable naming the `redis-server` binary to run (default: `redis-server` on PATH).
pub const REDIS_SERVER_ENV: &str = "LEASEHOLD_REDIS_SERVER";

const DEFAULT_BINARY: &str = "redis-server";
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] keeps retrying when the old port is still busy.
const RESTART_BIND_RETRY: Duration = Duration::from_secs(5);
/// How many fresh ports [`RedisServer::start`] tries when the chosen one was taken meanwhile.
const START_PORT_ATTEMPTS: usize = 5;
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const LOG_FILE: &str = "redis.log";
const STDIO_FILE: &str = "redis.stdio.log";
const LOG_TAIL_BYTES: u64 = 4096;
/// The name [`RedisServer::client_list`] gives its own connection, to leave it out.
const OWN_CONNECTION_NAME: &str = "leasehold-testkit-client-list";

/// Configures and starts a [`RedisServer`]. Obtained from [`RedisServer::builder`].
#[derive(Debug, Clone)]
pub struct RedisServerBuilder {
    binary: Option<OsString>,
    args: Vec<OsString>,
    startup_timeout: Duration,
    cluster: bool,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        RedisServerBuilder {
            binary: None,
            args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            cluster: false,
        }
    }
}

impl RedisServerBuilder {
    /// Appends one extra command-line argument, e.g. `.arg("--maxclients").arg("1000")`.
    ///
    /// Extra arguments come after the kit's own, so they override them (except `--port` and
    /// `--bind`, which must not be overridden).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several extra command-line arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Runs this binary instead of `$LEASEHOLD_REDIS_SERVER` / `redis-server`.
    pub fn binary(mut self, binary: impl Into<OsString>) -> Self {
        self.binary = Some(binary.into());
        self
    }

    /// Starts a one-node Redis Cluster: `--cluster-enabled yes`, every slot assigned to this
    /// node, started once `CLUSTER INFO` says `cluster_state:ok`. Its port is below 55535, so
    /// that the cluster bus port (port + 10000) exists and is free too. Lock scripts must keep
    /// every key in one slot here, exactly as on a real cluster.
    pub fn single_node_cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// How long to wait for the server to answer `PING` (default 10 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Spawns the server on a free loopback port and waits until it answers `PING`.
    pub fn start(self) -> Result<RedisServer> {
        let binary = self
            .binary
            .or_else(|| std::env::var_os(REDIS_SERVER_ENV).filter(|v| !v.is_empty()))
            .unwrap_or_else(|| DEFAULT_BINARY.into());
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()?;
        let mut args = self.args;
        if self.cluster {
            let cluster_args: [&str; 6] = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                // Announce the address clients can reach: CLUSTER SLOTS answers with it.
                "--cluster-announce-ip",
                "127.0.0.1",
            ];
            args.splice(0..0, cluster_args.map(OsString::from));
        }
        let config = Config {
            binary,
            args,
            startup_timeout: self.startup_timeout,
        };

        let mut last_err = None;
        for attempt in 1..=START_PORT_ATTEMPTS {
            let port = if self.cluster {
                free_cluster_port()?
            } else {
                free_port()?
            };
            match launch(&config, dir.path(), port) {
                Ok(child) => {
                    tracing::debug!(port, pid = child.id(), "redis-server started");
                    let server = RedisServer {
                        port,
                        config,
                        state: Mutex::new(State {
                            pid: child.id(),
                            child: Some(child),
                            paused: false,
                        }),
                        dir,
                    };
                    if self.cluster {
                        server.own_every_slot(self.startup_timeout)?;
                    }
                    return Ok(server);
                }
                Err(Launch::AddrInUse(e)) => {
                    tracing::debug!(
                        port,
                        attempt,
                        "port taken before redis-server bound it, retrying"
                    );
                    last_err = Some(e);
                }
                Err(Launch::Fatal(e)) => return Err(e),
            }
        }
        Err(last_err.expect("at least one attempt was made"))
    }
}

#[derive(Debug)]
struct Config {
    binary: OsString,
    args: Vec<OsString>,
    startup_timeout: Duration,
}

#[derive(Debug)]
struct State {
    /// `None` once killed (and reaped).
    child: Option<Child>,
    /// Pid of the current or most recent process.
    pid: u32,
    paused: bool,
}

impl State {
    fn alive(&mut self) -> bool {
        match &mut self.child {
            None => false,
            Some(child) => match child.try_wait() {
                Ok(None) => true,
                Ok(Some(_)) | Err(_) => {
                    self.child = None;
                    self.paused = false;
                    false
                }
            },
        }
    }

    fn kill_and_reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL works on stopped (SIGSTOPped) processes too.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }
}

/// A `redis-server` process owned by the test, listening on `127.0.0.1:<free port>`.
///
/// * Runs with a fresh temporary `--dir` (deleted on drop), `--save ""`, `--appendonly no`,
///   `--protected-mode no` and its log at `<dir>/redis.log`.
/// * Dropping it SIGKILLs and reaps the process, also when a test panics. On Linux the process
///   additionally carries `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the test process even if
///   that is SIGKILLed (children are forked from a dedicated, never-exiting spawner thread,
///   because the death signal fires when the *forking thread* exits).
/// * Fault controls ([`kill`](Self::kill), [`pause`](Self::pause), [`resume`](Self::resume),
///   [`restart`](Self::restart)) take `&self`, so the server can be shared (e.g. in an `Arc`).
///
/// All methods are blocking and need no async runtime; avoid calling the slow ones
/// (`start`, `restart`) from inside an async task on a current-thread runtime.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    config: Config,
    state: Mutex<State>,
    // Dropped last (field order), after the process is gone.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server with the default configuration. Same as `RedisServer::builder().start()`.
    pub fn start() -> Result<RedisServer> {
        RedisServerBuilder::default().start()
    }

    /// Assigns every slot to this (cluster-enabled) node and waits for `cluster_state:ok`.
    fn own_every_slot(&self, within: Duration) -> Result<()> {
        self.add_slots(0, crate::CLUSTER_SLOTS - 1)?;
        let deadline = Instant::now() + within;
        loop {
            let info = self.command(&["CLUSTER", "INFO"])?;
            if info
                .as_str()
                .is_some_and(|text| text.contains("cluster_state:ok"))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::StartFailed {
                    port: self.port,
                    reason: format!("cluster_state not ok within {within:?}"),
                    log_tail: self.log_tail(LOG_TAIL_BYTES),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Assigns slots `first..=last` to this (cluster-enabled) node with `CLUSTER ADDSLOTS`,
    /// every slot named: `CLUSTER ADDSLOTSRANGE` came with Redis 7.0, and 6.2 refuses it.
    pub(crate) fn add_slots(&self, first: u16, last: u16) -> Result<()> {
        let mut args = vec!["CLUSTER".to_string(), "ADDSLOTS".to_string()];
        args.extend((first..=last).map(|slot| slot.to_string()));
        self.command(&args).map(drop)
    }

    /// A builder for extra `redis-server` arguments and options.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// `redis://127.0.0.1:PORT`. Unchanged by `kill`/`restart`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// Pid of the current process (or of the last one, after [`kill`](Self::kill)).
    pub fn pid(&self) -> u32 {
        self.state.lock().pid
    }

    /// The server's working directory (`--dir`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Whether the process is alive (a paused process counts as alive).
    pub fn is_running(&self) -> bool {
        self.state.lock().alive()
    }

    /// Whether the process is currently SIGSTOPped by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        let mut st = self.state.lock();
        st.alive() && st.paused
    }

    /// SIGKILLs the server and reaps it: it is gone, connections drop, data is lost.
    /// [`url`](Self::url) keeps returning the same URL. No-op if it is not running.
    pub fn kill(&self) -> Result<()> {
        let mut st = self.state.lock();
        tracing::debug!(port = self.port, pid = st.pid, "killing redis-server");
        st.kill_and_reap();
        Ok(())
    }

    /// SIGSTOPs the server: connections stay open but nothing is answered until
    /// [`resume`](Self::resume). Returns once the process is actually stopped.
    pub fn pause(&self) -> Result<()> {
        let mut st = self.state.lock();
        if !st.alive() {
            return Err(TestkitError::Process(
                "cannot pause: redis-server is not running".into(),
            ));
        }
        spawn::signal_pid(st.pid, Signal::SIGSTOP)?;
        spawn::wait_stopped(st.pid, true);
        st.paused = true;
        Ok(())
    }

    /// SIGCONTs a paused server. Returns once the process runs again.
    pub fn resume(&self) -> Result<()> {
        let mut st = self.state.lock();
        if !st.alive() {
            return Err(TestkitError::Process(
                "cannot resume: redis-server is not running".into(),
            ));
        }
        spawn::signal_pid(st.pid, Signal::SIGCONT)?;
        spawn::wait_stopped(st.pid, false);
        st.paused = false;
        Ok(())
    }

    /// SIGKILLs the server if it is running (or paused) and starts a new one on the same port
    /// with the same arguments, waiting until it answers `PING`.
    ///
    /// With the default arguments nothing is persisted, so all data is lost. (The `--dir` is
    /// kept, so if you passed persistence options, the new process loads what was saved.)
    /// Retries for a few seconds if the port is still busy.
    pub fn restart(&self) -> Result<()> {
        let mut st = self.state.lock();
        st.kill_and_reap();
        let deadline = Instant::now() + RESTART_BIND_RETRY;
        loop {
            match launch(&self.config, self.dir.path(), self.port) {
                Ok(child) => {
                    tracing::debug!(port = self.port, pid = child.id(), "redis-server restarted");
                    st.pid = child.id();
                    st.child = Some(child);
                    return Ok(());
                }
                Err(Launch::AddrInUse(e)) => {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                Err(Launch::Fatal(e)) => return Err(e),
            }
        }
    }

    /// Sends one command over a short-lived connection and returns the reply.
    ///
    /// A top-level error reply is returned as [`TestkitError::Redis`]. Times out after 5 s
    /// (e.g. while the server is paused).
    pub fn command<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<RespValue> {
        resp::command(self.addr(), args, COMMAND_TIMEOUT)
    }

    /// `PING`; `Ok` if the answer is `PONG`.
    pub fn ping(&self) -> Result<()> {
        expect_pong(self.command(&["PING"])?)
    }

    /// `FLUSHALL`: deletes every key in every database.
    pub fn flushall(&self) -> Result<()> {
        self.command(&["FLUSHALL"]).map(drop)
    }

    /// The text of `INFO <section>` (e.g. `"server"`, `"clients"`, `"commandstats"`).
    pub fn info(&self, section: &str) -> Result<String> {
        info_text(self.command(&["INFO", section])?)
    }

    /// How many times command `name` (case-insensitive, e.g. `"evalsha"`) has been called,
    /// from the `cmdstat_<name>:calls=N,...` line of `INFO commandstats`; 0 if absent.
    /// Counters are reset by `CONFIG RESETSTAT` and by a restart.
    pub fn command_calls(&self, name: &str) -> Result<u64> {
        Ok(parse_command_calls(&self.info("commandstats")?, name))
    }

    /// Whether the server knows command `name` (`COMMAND INFO`): e.g. `SPUBLISH` (Redis 7.0+,
    /// Valkey) or `WAITAOF` (Redis 7.2+, Valkey). A command renamed away is unknown too.
    pub fn has_command(&self, name: &str) -> Result<bool> {
        let reply = self.command(&["COMMAND", "INFO", name])?;
        Ok(reply
            .as_array()
            .and_then(|entries| entries.first())
            .is_some_and(|entry| !entry.is_nil()))
    }

    /// The `CLIENT LIST` lines (of connections of `kind`, e.g. `"pubsub"`, when given) of every
    /// connection but the one asking. That one is named first and left out by its name: its
    /// `cmd=` field says `client|list` on Redis 7 and Valkey but only `client` on 6.2, where
    /// a client that last sent `CLIENT ID` looks the same.
    pub fn client_list(&self, kind: Option<&str>) -> Result<Vec<String>> {
        let mut args = vec!["CLIENT", "LIST"];
        if let Some(kind) = kind {
            args.extend(["TYPE", kind]);
        }
        let setup = [vec!["CLIENT", "SETNAME", OWN_CONNECTION_NAME]];
        let reply = resp::command_with_setup(self.addr(), &setup, &args, COMMAND_TIMEOUT)?;
        let text = reply
            .as_str()
            .ok_or_else(|| TestkitError::Protocol(format!("CLIENT LIST replied {reply:?}")))?;
        let own = format!(" name={OWN_CONNECTION_NAME} ");
        Ok(text
            .lines()
            .filter(|line| !line.trim().is_empty() && !line.contains(&own))
            .map(str::to_string)
            .collect())
    }

    /// The last `max_bytes` of the server log (useful in assertion messages).
    pub fn log_tail(&self, max_bytes: u64) -> String {
        read_tail(&self.log_path(), 0, max_bytes)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        tracing::debug!(port = self.port, pid = st.pid, "dropping redis-server");
        st.kill_and_reap();
    }
}

pub(crate) fn expect_pong(v: RespValue) -> Result<()> {
    match v.as_str().as_deref() {
        Some("PONG") => Ok(()),
        _ => Err(TestkitError::Protocol(format!("expected PONG, got {v:?}"))),
    }
}

pub(crate) fn info_text(v: RespValue) -> Result<String> {
    v.as_str()
        .ok_or_else(|| TestkitError::Protocol(format!("expected INFO text, got {v:?}")))
}

pub(crate) fn parse_command_calls(info: &str, name: &str) -> u64 {
    let prefix = format!("cmdstat_{}:", name.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A free port below 55535 whose cluster bus port (+ 10000) is free too.
fn free_cluster_port() -> Result<u16> {
    for _ in 0..1000 {
        let port = free_port()?;
        if port < 55535 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    // Ports from the kernel's ephemeral range may all sit above 55535: pick from below it.
    for port in (20000..55535u16).step_by(7) {
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10000)).is_ok()
        {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no free port pair for a cluster node",
    )
    .into())
}

/// A free port: bind port 0, note the port, drop the listener.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

enum Launch {
    /// The server exited because the port was busy: worth retrying.
    AddrInUse(TestkitError),
    Fatal(TestkitError),
}

impl From<io::Error> for Launch {
    fn from(e: io::Error) -> Self {
        Launch::Fatal(e.into())
    }
}

/// Spawns one `redis-server` on `port` and waits for `PING`. On failure the process is killed.
fn launch(config: &Config, dir: &Path, port: u16) -> std::result::Result<Child, Launch> {
    let log = dir.join(LOG_FILE);
    let stdio_log = dir.join(STDIO_FILE);
    // Only the output of this attempt goes into an error message.
    let log_offset = file_len(&log);
    let stdio_offset = file_len(&stdio_log);
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stdio_log)?;

    let mut cmd = Command::new(&config.binary);
    cmd.arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--dir")
        .arg(dir)
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg("no")
        .arg("--daemonize")
        .arg("no")
        .arg("--protected-mode")
        .arg("no")
        .arg("--logfile")
        .arg(&log)
        .args(&config.args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio.try_clone()?)
        .stderr(stdio);

    let mut child = match spawn::spawn(cmd) {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Launch::Fatal(TestkitError::RedisNotFound {
                binary: display(&config.binary),
            }))
        }
        Err(e) => return Err(e.into()),
    };

    let failure = |child: &mut Child, reason: String| {
        let _ = child.kill();
        let _ = child.wait();
        let mut log_tail = read_tail(&log, log_offset, LOG_TAIL_BYTES);
        let stdio_tail = read_tail(&stdio_log, stdio_offset, LOG_TAIL_BYTES);
        if !stdio_tail.trim().is_empty() {
            log_tail.push_str("\n--- stdout/stderr ---\n");
            log_tail.push_str(&stdio_tail);
        }
        let addr_in_use = log_tail.contains("Address already in use");
        let err = TestkitError::StartFailed {
            port,
            reason,
            log_tail,
        };
        if addr_in_use {
            Launch::AddrInUse(err)
        } else {
            Launch::Fatal(err)
        }
    };

    let deadline = Instant::now() + config.startup_timeout;
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let reason = format!("process exited during startup ({status})");
                return Err(failure(&mut child, reason));
            }
            Ok(None) => {}
            Err(e) => return Err(failure(&mut child, format!("waiting for the process: {e}"))),
        }
        if ping_once(addr) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let reason = format!(
                "no PONG within {:?} (is {} a redis-server?)",
                config.startup_timeout,
                display(&config.binary)
            );
            return Err(failure(&mut child, reason));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// One quick `PING` attempt; `true` on `+PONG`.
fn ping_once(addr: SocketAddr) -> bool {
    let attempt = || -> Result<bool> {
        let timeout = Duration::from_millis(250);
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        (&stream).write_all(&resp::encode_command(&["PING"]))?;
        let reply = resp::read_value(&mut BufReader::new(&stream))?;
        Ok(reply == RespValue::Simple("PONG".into()))
    };
    attempt().unwrap_or(false)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The last `max` bytes of `path` after byte `from`, lossily decoded, starting at a line boundary.
fn read_tail(path: &Path, from: u64, max: u64) -> String {
    let read = || -> io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let start = from.max(len.saturating_sub(max));
        f.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        let mut text = String::from_utf8_lossy(&buf).into_owned();
        if start > from {
            if let Some(nl) = text.find('\n') {
                text.drain(..=nl);
            }
        }
        Ok(text)
    };
    read().unwrap_or_else(|e| format!("<could not read {}: {e}>", path.display()))
}

fn display(s: &OsStr) -> String {
    s.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_set:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha:calls=12,usec=100,usec_per_call=8.33\r\n\
            cmdstat_config|get:calls=1,usec=5\r\n";
        assert_eq!(parse_command_calls(info, "evalsha"), 12);
        assert_eq!(parse_command_calls(info, "SET"), 3);
        assert_eq!(parse_command_calls(info, "config|get"), 1);
        assert_eq!(parse_command_calls(info, "eval"), 0);
        assert_eq!(parse_command_calls("", "get"), 0);
    }
}
