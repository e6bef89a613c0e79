//! [`redis_for_tests`]: use `$REDIS_URL` if set, otherwise spawn a private [`RedisServer`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::error::{Result, TestkitError};
use crate::resp::{self, RespValue};
use crate::server::{self, RedisServer};

/// Environment variable that points tests at an existing Redis instead of spawning one.
pub const REDIS_URL_ENV: &str = "REDIS_URL";

const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// The Redis a test should talk to: an external one named by `REDIS_URL`, or a
/// [`RedisServer`] spawned for this test (killed when this value is dropped).
///
/// Fault controls ([`kill`](Self::kill), [`pause`](Self::pause), [`resume`](Self::resume),
/// [`restart`](Self::restart)) need a spawned server and return
/// [`TestkitError::Unsupported`] for an external one; tests that inject faults should use
/// [`RedisServer::start`] directly.
#[derive(Debug)]
pub struct TestRedis {
    inner: Inner,
}

/// Alias of [`TestRedis`].
pub type RedisTarget = TestRedis;

#[derive(Debug)]
enum Inner {
    External(String),
    Spawned(RedisServer),
}

/// `REDIS_URL` if it is set and non-empty (no process is spawned; the data there is *not*
/// flushed), otherwise a freshly spawned [`RedisServer`].
pub fn redis_for_tests() -> Result<TestRedis> {
    match std::env::var(REDIS_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => {
            tracing::debug!(%url, "using external redis from REDIS_URL");
            Ok(TestRedis::external(url.trim()))
        }
        _ => Ok(TestRedis::from(RedisServer::start()?)),
    }
}

impl From<RedisServer> for TestRedis {
    fn from(server: RedisServer) -> Self {
        TestRedis {
            inner: Inner::Spawned(server),
        }
    }
}

impl TestRedis {
    /// An external Redis at `url` (not validated until [`command`](Self::command) is used).
    pub fn external(url: impl Into<String>) -> TestRedis {
        TestRedis {
            inner: Inner::External(url.into()),
        }
    }

    /// The URL to hand to the client under test.
    pub fn url(&self) -> String {
        match &self.inner {
            Inner::External(url) => url.clone(),
            Inner::Spawned(s) => s.url(),
        }
    }

    /// The spawned server, or `None` when using `REDIS_URL`.
    pub fn server(&self) -> Option<&RedisServer> {
        match &self.inner {
            Inner::External(_) => None,
            Inner::Spawned(s) => Some(s),
        }
    }

    /// `true` when using `REDIS_URL`.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External(_))
    }

    fn spawned(&self, what: &str) -> Result<&RedisServer> {
        self.server().ok_or_else(|| {
            TestkitError::Unsupported(format!(
                "{what} needs a testkit-spawned server, but REDIS_URL points at an external one \
                 (unset REDIS_URL or use RedisServer::start())"
            ))
        })
    }

    /// [`RedisServer::kill`]; `Unsupported` for an external Redis.
    pub fn kill(&self) -> Result<()> {
        self.spawned("kill()")?.kill()
    }

    /// [`RedisServer::pause`]; `Unsupported` for an external Redis.
    pub fn pause(&self) -> Result<()> {
        self.spawned("pause()")?.pause()
    }

    /// [`RedisServer::resume`]; `Unsupported` for an external Redis.
    pub fn resume(&self) -> Result<()> {
        self.spawned("resume()")?.resume()
    }

    /// [`RedisServer::restart`]; `Unsupported` for an external Redis.
    pub fn restart(&self) -> Result<()> {
        self.spawned("restart()")?.restart()
    }

    /// Sends one command over a short-lived connection (for an external Redis: with `AUTH`
    /// and `SELECT` from the URL; `redis://` URLs only). A top-level error reply becomes
    /// [`TestkitError::Redis`].
    pub fn command<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<RespValue> {
        match &self.inner {
            Inner::Spawned(s) => s.command(args),
            Inner::External(url) => {
                let target = parse_url(url)?;
                resp::command_with_setup(target.addr, &target.setup, args, COMMAND_TIMEOUT)
            }
        }
    }

    /// `PING`; `Ok` if the answer is `PONG`.
    pub fn ping(&self) -> Result<()> {
        server::expect_pong(self.command(&["PING"])?)
    }

    /// `FLUSHALL`. Careful with an external Redis: this deletes everything in it.
    pub fn flushall(&self) -> Result<()> {
        self.command(&["FLUSHALL"]).map(drop)
    }

    /// The text of `INFO <section>`.
    pub fn info(&self, section: &str) -> Result<String> {
        server::info_text(self.command(&["INFO", section])?)
    }

    /// See [`RedisServer::command_calls`].
    pub fn command_calls(&self, name: &str) -> Result<u64> {
        Ok(server::parse_command_calls(
            &self.info("commandstats")?,
            name,
        ))
    }
}

#[derive(Debug)]
struct UrlTarget {
    addr: SocketAddr,
    setup: Vec<Vec<String>>,
}

/// Parses `redis://[[user]:password@]host[:port][/db][?...]`. No percent-decoding.
fn parse_url(url: &str) -> Result<UrlTarget> {
    let bad = |reason: &str| TestkitError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| bad("only redis:// URLs are supported by the testkit's own client"))?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let end = v6
            .find(']')
            .ok_or_else(|| bad("unterminated IPv6 address"))?;
        let port = v6[end + 1..].strip_prefix(':');
        (&v6[..end], port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    let port: u16 = match port {
        None | Some("") => 6379,
        Some(p) => p.parse().map_err(|_| bad("bad port"))?,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(&format!("cannot resolve host: {e}")))?
        .next()
        .ok_or_else(|| bad("host resolves to no address"))?;

    let mut setup = Vec::new();
    if let Some(userinfo) = userinfo {
        let (user, pass) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        match (user, pass) {
            (_, None) | (_, Some("")) => {}
            ("", Some(p)) => setup.push(vec!["AUTH".to_string(), p.to_string()]),
            (u, Some(p)) => setup.push(vec!["AUTH".to_string(), u.to_string(), p.to_string()]),
        }
    }
    if !path.is_empty() {
        let db: u32 = path.parse().map_err(|_| bad("bad database number"))?;
        if db != 0 {
            setup.push(vec!["SELECT".to_string(), db.to_string()]);
        }
    }
    Ok(UrlTarget { addr, setup })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = parse_url("redis://127.0.0.1:7000").unwrap();
        assert_eq!(t.addr, "127.0.0.1:7000".parse().unwrap());
        assert!(t.setup.is_empty());

        let t = parse_url("redis://:secret@127.0.0.1:7001/3").unwrap();
        assert_eq!(t.addr.port(), 7001);
        assert_eq!(t.setup, vec![vec!["AUTH", "secret"], vec!["SELECT", "3"]]);

        let t = parse_url("redis://alice:pw@[::1]:7002/0?protocol=resp2").unwrap();
        assert_eq!(t.addr, "[::1]:7002".parse().unwrap());
        assert_eq!(t.setup, vec![vec!["AUTH", "alice", "pw"]]);

        assert_eq!(parse_url("redis://127.0.0.1").unwrap().addr.port(), 6379);
        assert!(parse_url("rediss://127.0.0.1:1").is_err());
        assert!(parse_url("redis://127.0.0.1:notaport").is_err());
        assert!(parse_url("redis:///0").is_err());
    }

    #[test]
    fn external_has_no_fault_controls() {
        // Port 1 is never contacted: fault controls fail before any I/O.
        let t = TestRedis::external("redis://127.0.0.1:1");
        assert!(t.is_external());
        assert!(t.server().is_none());
        assert_eq!(t.url(), "redis://127.0.0.1:1");
        for r in [t.kill(), t.pause(), t.resume(), t.restart()] {
            match r {
                Err(TestkitError::Unsupported(msg)) => {
                    assert!(msg.contains("needs a testkit-spawned server"), "{msg}")
                }
                other => panic!("expected Unsupported, got {other:?}"),
            }
        }
    }
}
