//! The error type shared by everything in the kit.

use std::io;

/// Everything that can go wrong while spawning or driving test infrastructure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// The `redis-server` binary (or the one named by `LEASEHOLD_REDIS_SERVER`) could not be found.
    #[error(
        "{binary} not found on PATH: install it (Debian/Ubuntu: apt-get install -y redis-server) or set REDIS_URL"
    )]
    RedisNotFound {
        /// The binary that was looked for.
        binary: String,
    },

    /// `redis-server` was spawned but did not become ready (did not answer `PING` in time or exited).
    #[error("redis-server on 127.0.0.1:{port} failed to start: {reason}\n--- redis log tail ---\n{log_tail}")]
    StartFailed {
        /// The port it was asked to listen on.
        port: u16,
        /// What went wrong.
        reason: String,
        /// The last lines of the server's log file (and of its stdout/stderr).
        log_tail: String,
    },

    /// The operation needs a server spawned by this kit (e.g. a fault control while `REDIS_URL` is set).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// The server answered a command with an error reply (`-ERR ...`).
    #[error("redis error reply: {0}")]
    Redis(String),

    /// The peer sent something that is not valid RESP2, or an unexpected reply type.
    #[error("protocol error: {0}")]
    Protocol(String),

    /// A deadline passed (e.g. waiting for a child's output line).
    #[error("timed out: {0}")]
    Timeout(String),

    /// A child process was not in the state the operation needs (not running, already exited, ...).
    #[error("process error: {0}")]
    Process(String),

    /// A URL could not be understood.
    #[error("invalid redis url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was rejected.
        reason: String,
    },

    /// An operating-system level I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// Shorthand for `Result<T, TestkitError>`.
pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

impl From<nix::Error> for TestkitError {
    fn from(e: nix::Error) -> Self {
        TestkitError::Io(io::Error::from(e))
    }
}
