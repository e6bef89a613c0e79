//! [`ChildProcess`]: a child OS process that is SIGKILLed and reaped when dropped.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use parking_lot::Mutex;

use crate::error::{Result, TestkitError};
use crate::spawn;

/// How many recent stdout lines are kept for error messages.
const RECENT_LINES: usize = 50;

/// A child process (e.g. a test binary or an example) owned by the test.
///
/// * Its stdout is piped and read line by line on a background thread; use
///   [`wait_for_line`](Self::wait_for_line) to wait for e.g. `LOCKED token=...`. Each line is
///   also echoed to the test's stderr, prefixed with the pid. Stdin is `/dev/null`; stderr is
///   left as configured on the `Command` (inherited by default).
/// * It runs in its own process group; [`kill`](Self::kill), [`pause`](Self::pause),
///   [`resume`](Self::resume) and `Drop` signal the whole group, so a `cargo run --example x`
///   wrapper and the example it runs are both hit. (Prefer running the built binary directly,
///   e.g. `env!("CARGO_BIN_EXE_<name>")`, so the pid really is the program's.)
/// * Dropping it SIGKILLs the group and reaps the child, also when the test panics. On Linux
///   the direct child also dies if the test process is SIGKILLed (`PR_SET_PDEATHSIG`), but its
///   own children (e.g. under `cargo run`) do not.
#[derive(Debug)]
pub struct ChildProcess {
    pid: u32,
    child: Mutex<Option<Child>>,
    lines: Mutex<Receiver<String>>,
    recent: Arc<Mutex<VecDeque<String>>>,
    description: String,
}

impl ChildProcess {
    /// Spawns `cmd` (stdout piped, stdin null, in a new process group).
    pub fn spawn(mut cmd: Command) -> Result<ChildProcess> {
        use std::os::unix::process::CommandExt;
        let description = format!("{:?}", cmd);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0);
        let mut child = spawn::spawn(cmd)
            .map_err(|e| TestkitError::Process(format!("failed to spawn {description}: {e}")))?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("stdout is piped");

        let (tx, rx) = mpsc::channel();
        let recent = Arc::new(Mutex::new(VecDeque::with_capacity(RECENT_LINES)));
        let recent2 = Arc::clone(&recent);
        thread::Builder::new()
            .name(format!("testkit-child-{pid}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("[child {pid}] {line}");
                    {
                        let mut recent = recent2.lock();
                        if recent.len() == RECENT_LINES {
                            recent.pop_front();
                        }
                        recent.push_back(line.clone());
                    }
                    // The receiver may be gone (ChildProcess dropped): keep draining anyway so
                    // the child never blocks on a full pipe.
                    let _ = tx.send(line);
                }
            })
            .map_err(|e| {
                let _ = spawn::signal_group(pid, Signal::SIGKILL);
                let _ = child.kill();
                let _ = child.wait();
                TestkitError::Io(e)
            })?;

        tracing::debug!(pid, cmd = %description, "spawned child process");
        Ok(ChildProcess {
            pid,
            child: Mutex::new(Some(child)),
            lines: Mutex::new(rx),
            recent,
            description,
        })
    }

    /// The child's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the child is still alive (a paused child counts as alive).
    pub fn is_running(&self) -> bool {
        let mut child = self.child.lock();
        match child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            None | Some(Ok(Some(_))) | Some(Err(_)) => false,
        }
    }

    /// The exit status if the child has exited (without waiting); `None` while it runs.
    pub fn try_wait(&self) -> Result<Option<ExitStatus>> {
        match self.child.lock().as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Err(TestkitError::Process("child was already killed".into())),
        }
    }

    /// Waits up to `timeout` for the child to exit on its own and returns its status.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout(format!(
                    "child {} ({}) did not exit within {timeout:?}",
                    self.pid, self.description
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the child's process group and reaps the child. No-op if already killed.
    pub fn kill(&self) -> Result<()> {
        let mut child = self.child.lock();
        if let Some(mut c) = child.take() {
            tracing::debug!(pid = self.pid, "killing child process");
            // The group may already be empty (ESRCH); `Child::kill` covers the direct child.
            let _ = spawn::signal_group(self.pid, Signal::SIGKILL);
            let _ = c.kill();
            c.wait()?;
        }
        Ok(())
    }

    /// SIGSTOPs the child's process group. Returns once the child is actually stopped.
    pub fn pause(&self) -> Result<()> {
        self.signal_running(Signal::SIGSTOP)?;
        spawn::wait_stopped(self.pid, true);
        Ok(())
    }

    /// SIGCONTs the child's process group.
    pub fn resume(&self) -> Result<()> {
        self.signal_running(Signal::SIGCONT)?;
        spawn::wait_stopped(self.pid, false);
        Ok(())
    }

    fn signal_running(&self, sig: Signal) -> Result<()> {
        // Hold the lock so the child cannot be reaped (freeing its pid) in between.
        let mut child = self.child.lock();
        match child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => Ok(spawn::signal_group(self.pid, sig)?),
            _ => Err(TestkitError::Process(format!(
                "cannot send {sig} to child {}: it is not running",
                self.pid
            ))),
        }
    }

    /// Waits up to `timeout` for a stdout line matching `pred` and returns it. Lines read
    /// before it are consumed (but echoed to stderr and kept for error messages).
    ///
    /// Fails with [`TestkitError::Timeout`] on timeout and [`TestkitError::Process`] if stdout
    /// closes (the child exited) first.
    pub fn wait_for_line<F>(&self, mut pred: F, timeout: Duration) -> Result<String>
    where
        F: FnMut(&str) -> bool,
    {
        let deadline = Instant::now() + timeout;
        let lines = self.lines.lock();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(TestkitError::Timeout(format!(
                    "no matching line from child {} ({}) within {timeout:?}; recent output:\n{}",
                    self.pid,
                    self.description,
                    self.recent_output()
                )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .try_wait()
                        .ok()
                        .flatten()
                        .map_or_else(|| "unknown status".to_string(), |s| s.to_string());
                    return Err(TestkitError::Process(format!(
                        "child {} ({}) closed stdout ({status}) before printing a matching line; \
                         recent output:\n{}",
                        self.pid,
                        self.description,
                        self.recent_output()
                    )));
                }
            }
        }
    }

    /// The last (up to 50) stdout lines, newline-separated.
    pub fn recent_output(&self) -> String {
        self.recent
            .lock()
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
