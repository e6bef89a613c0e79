//! Integration tests against a real `redis-server` (must be on PATH or named by
//! `LEASEHOLD_REDIS_SERVER`). Every test spawns its own server on a free port.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_testkit::resp::{encode_command, read_value};
use leasehold_testkit::{
    redis_for_tests, ChildProcess, Proxy, RedisServer, RespValue, TestkitError,
};

const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds or `DEADLINE` passes.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw RESP connection with a read timeout.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr, read_timeout: Duration) -> Conn {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        stream.set_read_timeout(Some(read_timeout)).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn { stream, reader }
    }

    fn send(&mut self, args: &[&str]) {
        self.stream.write_all(&encode_command(args)).unwrap();
    }

    fn read(&mut self) -> Result<RespValue, TestkitError> {
        read_value(&mut self.reader)
    }

    fn call(&mut self, args: &[&str]) -> Result<RespValue, TestkitError> {
        self.send(args);
        self.read()
    }
}

fn is_timeout(e: &TestkitError) -> bool {
    matches!(e, TestkitError::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

fn pong() -> RespValue {
    RespValue::Simple("PONG".into())
}

fn proc_gone_or_zombie(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .trim_start()
                .chars()
                .next();
            matches!(state, Some('Z') | Some('X'))
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn start_and_ping() {
    let redis = RedisServer::start().unwrap();
    assert_ne!(redis.port(), 6379);
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_eq!(redis.addr().port(), redis.port());
    assert!(redis.is_running());
    assert!(std::path::Path::new(&format!("/proc/{}", redis.pid())).exists());
    redis.ping().unwrap();
    let mut conn = Conn::open(redis.addr(), Duration::from_secs(5));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());
    // Persistence is off.
    let save = redis.command(&["CONFIG", "GET", "save"]).unwrap();
    assert_eq!(save.as_array().unwrap()[1].as_str().as_deref(), Some(""));
    assert!(redis.log_path().exists());
}

#[test]
fn builder_args_are_passed() {
    let redis = RedisServer::builder()
        .arg("--maxclients")
        .arg("1000")
        .start()
        .unwrap();
    let v = redis.command(&["CONFIG", "GET", "maxclients"]).unwrap();
    let items = v.as_array().unwrap();
    assert_eq!(items[0].as_str().as_deref(), Some("maxclients"));
    assert_eq!(items[1].as_int(), Some(1000));
}

#[test]
fn missing_binary_is_a_clear_error() {
    let err = RedisServer::builder()
        .binary("/nonexistent/redis-server-for-testkit")
        .start()
        .unwrap_err();
    assert!(matches!(err, TestkitError::RedisNotFound { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("not found on PATH"), "{msg}");
    assert!(msg.contains("apt-get install -y redis-server"), "{msg}");
    assert!(msg.contains("REDIS_URL"), "{msg}");
}

#[test]
fn bad_config_fails_with_log_tail() {
    let err = RedisServer::builder()
        .arg("--no-such-directive")
        .arg("1")
        .start()
        .unwrap_err();
    match err {
        TestkitError::StartFailed { log_tail, .. } => {
            assert!(log_tail.contains("no-such-directive"), "{log_tail}")
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
}

#[test]
fn command_errors_and_helpers() {
    let redis = RedisServer::start().unwrap();
    let err = redis.command(&["NOSUCHCOMMAND"]).unwrap_err();
    assert!(
        matches!(err, TestkitError::Redis(ref m) if m.starts_with("ERR")),
        "{err:?}"
    );

    assert_eq!(
        redis.command(&["SET", "k", "v"]).unwrap(),
        RespValue::Simple("OK".into())
    );
    redis.command(&["SET", "k2", "v"]).unwrap();
    assert_eq!(redis.command(&["INCR", "n"]).unwrap(), RespValue::Int(1));
    assert!(redis.command_calls("set").unwrap() >= 2);
    assert!(redis.command_calls("SET").unwrap() >= 2);
    assert_eq!(redis.command_calls("evalsha").unwrap(), 0);
    assert!(redis.info("server").unwrap().contains("redis_version:"));

    redis.flushall().unwrap();
    assert!(redis.command(&["GET", "k"]).unwrap().is_nil());
    assert_eq!(redis.command(&["DBSIZE"]).unwrap(), RespValue::Int(0));
}

#[test]
fn pause_and_resume() {
    let redis = RedisServer::start().unwrap();
    redis.pause().unwrap();
    assert!(redis.is_paused());
    assert!(redis.is_running());

    // The kernel still accepts the connection, but nobody answers.
    let mut conn = Conn::open(redis.addr(), Duration::from_millis(300));
    let err = conn.call(&["PING"]).unwrap_err();
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");

    redis.resume().unwrap();
    assert!(!redis.is_paused());
    // The queued PING is answered now, and new connections work.
    conn.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(conn.read().unwrap(), pong());
    redis.ping().unwrap();
}

#[test]
fn kill_stops_the_server() {
    let redis = RedisServer::start().unwrap();
    let url = redis.url();
    let pid = redis.pid();
    redis.kill().unwrap();
    assert!(!redis.is_running());
    assert_eq!(redis.url(), url);
    assert_eq!(redis.pid(), pid);
    assert!(proc_gone_or_zombie(pid));
    let err = TcpStream::connect_timeout(&redis.addr(), Duration::from_secs(2)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(redis.ping().is_err());
    // Idempotent; other controls report the state.
    redis.kill().unwrap();
    assert!(matches!(redis.pause(), Err(TestkitError::Process(_))));
}

#[test]
fn restart_keeps_port_and_loses_data() {
    let redis = RedisServer::start().unwrap();
    let (port, pid) = (redis.port(), redis.pid());
    redis.command(&["SET", "k", "v"]).unwrap();
    let mut old_conn = Conn::open(redis.addr(), Duration::from_secs(5));
    assert_eq!(old_conn.call(&["PING"]).unwrap(), pong());

    redis.restart().unwrap();
    assert_eq!(redis.port(), port);
    assert_ne!(redis.pid(), pid);
    assert!(redis.is_running());
    assert!(redis.command(&["GET", "k"]).unwrap().is_nil());
    // Old connections died with the old process.
    assert!(old_conn.call(&["PING"]).is_err());

    // Restart also works from killed and from paused.
    redis.kill().unwrap();
    redis.restart().unwrap();
    redis.ping().unwrap();
    redis.pause().unwrap();
    redis.restart().unwrap();
    assert!(!redis.is_paused());
    redis.ping().unwrap();
}

#[test]
fn drop_kills_the_process() {
    let redis = RedisServer::start().unwrap();
    let pid = redis.pid();
    let dir = redis.dir().to_path_buf();
    redis.pause().unwrap(); // a stopped process must die too
    drop(redis);
    eventually("redis process gone after drop", || proc_gone_or_zombie(pid));
    assert!(!dir.exists(), "temp dir removed");
}

#[test]
fn redis_for_tests_spawns_without_redis_url() {
    let target = redis_for_tests().unwrap();
    target.ping().unwrap();
    if std::env::var("REDIS_URL").map_or(true, |u| u.trim().is_empty()) {
        let server = target.server().expect("spawned");
        assert_eq!(target.url(), server.url());
        assert!(!target.is_external());
        target.command(&["SET", "a", "1"]).unwrap();
        target.restart().unwrap();
        assert!(target.command(&["GET", "a"]).unwrap().is_nil());
    }
}

#[test]
fn proxy_forwards() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.upstream(), redis.addr());
    assert_eq!(proxy.connections(), 0);

    let mut conn = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());
    assert_eq!(proxy.connections(), 1);
    // A large value crosses in several chunks.
    let big = "x".repeat(200_000);
    assert_eq!(
        conn.call(&["SET", "big", &big]).unwrap(),
        RespValue::Simple("OK".into())
    );
    assert_eq!(
        conn.call(&["GET", "big"]).unwrap(),
        RespValue::Bulk(big.into_bytes())
    );

    drop(conn);
    eventually("connection closed", || proxy.connections() == 0);
}

#[test]
fn proxy_partition_and_heal() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();

    let mut conn = Conn::open(proxy.addr(), Duration::from_millis(300));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());

    proxy.partition();
    assert!(proxy.is_partitioned());
    let err = conn.call(&["PING"]).unwrap_err();
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");
    // New connections are accepted but not served.
    let mut conn2 = Conn::open(proxy.addr(), Duration::from_millis(300));
    let err = conn2.call(&["PING"]).unwrap_err();
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");
    eventually("both connections held open", || proxy.connections() == 2);
    // Even an upstream crash does not cross the partition.
    redis.kill().unwrap();
    redis.restart().unwrap();
    let err = conn.read().unwrap_err();
    assert!(is_timeout(&err), "expected a read timeout, got {err:?}");

    proxy.heal();
    assert!(!proxy.is_partitioned());
    // The PING sent on conn2 was dropped, not delayed: conn2 is clean and now works. An ECHO
    // tells the two apart (a delayed PING's PONG would come back first).
    conn2
        .stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        conn2.call(&["ECHO", "after-heal"]).unwrap(),
        RespValue::Bulk(b"after-heal".to_vec())
    );
    let mut conn3 = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(conn3.call(&["PING"]).unwrap(), pong());
}

#[test]
fn proxy_close_all() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();
    let mut a = Conn::open(proxy.addr(), Duration::from_secs(5));
    let mut b = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(a.call(&["PING"]).unwrap(), pong());
    assert_eq!(b.call(&["PING"]).unwrap(), pong());
    assert_eq!(proxy.connections(), 2);

    proxy.close_all();
    for conn in [&mut a, &mut b] {
        let mut buf = [0u8; 1];
        match conn.stream.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("expected a closed connection, got {other:?}"),
        }
    }
    eventually("no connections", || proxy.connections() == 0);
    let mut c = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(c.call(&["PING"]).unwrap(), pong());
}

#[test]
fn proxy_latency() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();
    let mut conn = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());

    proxy.set_latency(Duration::from_millis(150));
    assert_eq!(proxy.latency(), Duration::from_millis(150));
    let t = Instant::now();
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());
    // Request and reply are each delayed.
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );

    proxy.set_latency(Duration::ZERO);
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());
}

#[test]
fn proxy_drop_replies_applies_command_but_kills_connection() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();
    let mut conn = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());

    proxy.drop_replies(1);
    assert_eq!(proxy.pending_drop_replies(), 1);
    let err = conn.call(&["SET", "k", "v"]).unwrap_err();
    match &err {
        TestkitError::Io(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) => {}
        other => panic!("expected a closed connection, got {other:?}"),
    }
    assert_eq!(proxy.pending_drop_replies(), 0);
    // The server did execute it.
    assert_eq!(
        redis.command(&["GET", "k"]).unwrap(),
        RespValue::Bulk(b"v".to_vec())
    );
    // Later connections are unaffected.
    let mut conn2 = Conn::open(proxy.addr(), Duration::from_secs(5));
    assert_eq!(
        conn2.call(&["GET", "k"]).unwrap(),
        RespValue::Bulk(b"v".to_vec())
    );
}

#[test]
fn proxy_drop_stops_everything() {
    let rt = runtime();
    let redis = RedisServer::start().unwrap();
    let proxy = rt.block_on(Proxy::start(redis.addr())).unwrap();
    let addr = proxy.addr();
    let mut conn = Conn::open(addr, Duration::from_secs(5));
    assert_eq!(conn.call(&["PING"]).unwrap(), pong());
    drop(proxy);
    let mut buf = [0u8; 1];
    // Closed or reset by the proxy, not merely silent (a read timeout would not count).
    let read = conn.stream.read(&mut buf);
    assert!(
        matches!(&read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    eventually("listener closed", || TcpStream::connect(addr).is_err());
}

#[test]
fn child_process_lines_signals_and_kill() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo starting; echo 'LOCKED token=abc'; while true; do sleep 0.05; done");
    let child = ChildProcess::spawn(cmd).unwrap();
    let pid = child.pid();
    let line = child
        .wait_for_line(|l| l.starts_with("LOCKED token="), DEADLINE)
        .unwrap();
    assert_eq!(line, "LOCKED token=abc");
    assert!(child.is_running());

    child.pause().unwrap();
    child.resume().unwrap();
    let err = child
        .wait_for_line(|l| l == "never", Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(err, TestkitError::Timeout(_)), "{err:?}");

    child.kill().unwrap();
    assert!(!child.is_running());
    assert!(proc_gone_or_zombie(pid));
    assert!(matches!(child.pause(), Err(TestkitError::Process(_))));
}

#[test]
fn child_process_exit_is_reported() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg("echo only-line; exit 3");
    let child = ChildProcess::spawn(cmd).unwrap();
    let err = child.wait_for_line(|l| l == "never", DEADLINE).unwrap_err();
    match err {
        TestkitError::Process(msg) => assert!(msg.contains("only-line"), "{msg}"),
        other => panic!("expected Process error, got {other:?}"),
    }
    assert_eq!(child.wait_timeout(DEADLINE).unwrap().code(), Some(3));
}

#[test]
fn child_process_drop_kills() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo up; while true; do sleep 0.05; done");
    let child = ChildProcess::spawn(cmd).unwrap();
    let pid = child.pid();
    child.wait_for_line(|l| l == "up", DEADLINE).unwrap();
    drop(child);
    eventually("child gone after drop", || proc_gone_or_zombie(pid));
}

const HELPER_ENV: &str = "LEASEHOLD_TESTKIT_ORPHAN_HELPER";

/// Entry point of the child of `redis_dies_with_a_sigkilled_test_process`; a no-op as a
/// plain test (it acts only when the parent sets the variable).
#[test]
fn orphan_helper() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let redis = RedisServer::start().unwrap();
    println!("REDIS pid={}", redis.pid());
    // Wait to be SIGKILLed (bounded, in case the parent is gone).
    std::thread::sleep(Duration::from_secs(60));
}

#[cfg(target_os = "linux")]
#[test]
fn redis_dies_with_a_sigkilled_test_process() {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "orphan_helper",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(HELPER_ENV, "1");
    let helper = ChildProcess::spawn(cmd).unwrap();
    let line = helper
        .wait_for_line(|l| l.contains("REDIS pid="), DEADLINE)
        .unwrap();
    // The harness may print "test orphan_helper ... " on the same line.
    let redis_pid: u32 = line
        .split("REDIS pid=")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!proc_gone_or_zombie(redis_pid));

    // SIGKILL only the helper process (not its group): no Drop runs in it.
    let status = Command::new("kill")
        .args(["-KILL", &helper.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("redis killed by PDEATHSIG", || {
        proc_gone_or_zombie(redis_pid)
    });
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<RedisServer>();
    check::<Proxy>();
    check::<ChildProcess>();
}
