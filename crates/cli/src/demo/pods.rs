//! The demo's pods: real OS processes running this same binary (`leasehold pod ...`).
//!
//! Each pod's stdout carries [`PodEvent`] lines, read by one thread per pod into a single
//! channel, so the demo sees the events of all pods in the order they happened. Its stdin is a
//! pipe the demo keeps open: writing `go` releases a pod waiting at the starting line (a real
//! barrier, so "three pods fire at once" does not depend on process start-up times), and its
//! end-of-file tells the pod the demo is gone, so a pod never outlives an interrupted demo.
//!
//! This is not `leasehold_testkit::ChildProcess` because that one echoes every stdout line to
//! stderr (right for tests, noise for a demo) and has no stdin.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::events::PodEvent;

/// What arrived from one pod.
enum Line {
    Event(PodEvent),
    /// Not an event (a pod should print none of these; shown as-is to help debugging).
    Text(String),
    /// Its stdout closed: it exited or is about to.
    Closed,
}

struct Pod {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Said `Done`: its stdout closing next is expected.
    done: bool,
    /// Reaped by [`Pods::wait_until_stopped`]'s `waitpid`; `Child` must not wait again.
    reaped: Option<String>,
}

/// A group of pods spawned for one scenario; dropping it SIGKILLs any still running.
pub struct Pods {
    exe: PathBuf,
    url: String,
    prefix: String,
    tx: Sender<(usize, Line)>,
    rx: Receiver<(usize, Line)>,
    pods: Vec<Pod>,
}

impl Pods {
    /// Pods that run `exe` against Redis at `url` with keys under `prefix`.
    pub fn new(exe: PathBuf, url: &str, prefix: &str) -> Pods {
        let (tx, rx) = mpsc::channel();
        Pods {
            exe,
            url: url.to_string(),
            prefix: prefix.to_string(),
            tx,
            rx,
            pods: Vec::new(),
        }
    }

    /// Starts pod `label` as `leasehold pod --lease-ms LEASE ROLE...`.
    pub fn spawn(&mut self, label: &str, lease_ms: u64, role: &[String]) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.exe);
        // The URL goes in the environment, not on the command line, where `ps` would show a
        // password in it. DATABASE_URL is inherited the same way.
        cmd.env("REDIS_URL", &self.url)
            .arg("--prefix")
            .arg(&self.prefix)
            .arg("pod")
            .arg("--lease-ms")
            .arg(lease_ms.to_string())
            .args(role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {label} ({})", self.exe.display()))?;
        let index = self.pods.len();
        let stdout = child.stdout.take().context("pod stdout is piped")?;
        let tx = self.tx.clone();
        let reader = thread::Builder::new()
            .name(format!("{label}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let parsed = match serde_json::from_str::<PodEvent>(&line) {
                        Ok(event) => Line::Event(event),
                        Err(_) => Line::Text(line),
                    };
                    if tx.send((index, parsed)).is_err() {
                        return;
                    }
                }
                let _ = tx.send((index, Line::Closed));
            });
        let stdin = child.stdin.take();
        let mut pod = Pod {
            label: label.to_string(),
            child,
            stdin,
            done: false,
            reaped: None,
        };
        if let Err(error) = reader {
            kill(&mut pod);
            return Err(error).context("cannot start a reader thread");
        }
        self.pods.push(pod);
        Ok(())
    }

    /// Releases every pod waiting at the starting line, as close together as three pipe
    /// writes can be.
    pub fn go_all(&mut self) -> anyhow::Result<()> {
        for pod in &mut self.pods {
            let stdin = pod.stdin.as_mut().context("pod stdin is piped")?;
            stdin
                .write_all(b"go\n")
                .and_then(|()| stdin.flush())
                .with_context(|| format!("cannot start {}", pod.label))?;
        }
        Ok(())
    }

    /// Releases pod `label` from the starting line.
    pub fn go(&mut self, label: &str) -> anyhow::Result<()> {
        let pod = self.pod_mut(label)?;
        let stdin = pod.stdin.as_mut().context("pod stdin is piped")?;
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("cannot start {label}"))
    }

    /// The next event from any pod, as `(label, event)`. `what` says what the demo is waiting
    /// for, for the error when the deadline passes or a pod dies first.
    pub fn next(&mut self, deadline: Instant, what: &str) -> anyhow::Result<(String, PodEvent)> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (index, line) = match self.rx.recv_timeout(left) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => bail!("timed out waiting for {what}"),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("lost the pods while waiting for {what}")
                }
            };
            let pod = &mut self.pods[index];
            match line {
                Line::Event(PodEvent::Failed { message }) => {
                    bail!("{} failed: {message}", pod.label)
                }
                Line::Event(event) => {
                    if event == PodEvent::Done {
                        pod.done = true;
                    }
                    return Ok((pod.label.clone(), event));
                }
                Line::Text(text) => println!("     [{}] {text}", pod.label),
                Line::Closed if pod.done => {}
                Line::Closed => {
                    let status = exit_status(pod, Duration::from_secs(2));
                    bail!(
                        "{} exited ({status}) while the demo waited for {what}",
                        pod.label
                    );
                }
            }
        }
    }

    /// Waits until every pod has said `Done` and exited with status 0.
    pub fn finish(&mut self, deadline: Instant) -> anyhow::Result<()> {
        while let Some(pod) = self.pods.iter().find(|p| !p.done) {
            let label = pod.label.clone();
            self.next(deadline, &format!("{label} to finish"))?;
        }
        for pod in &mut self.pods {
            if pod.reaped.is_some() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let status = wait_timeout(&mut pod.child, left)
                .with_context(|| format!("{} did not exit", pod.label))?;
            if !status.success() {
                bail!("{} exited with {status}", pod.label);
            }
        }
        Ok(())
    }

    /// Waits until pod `label` is stopped (it stops itself with SIGSTOP).
    pub fn wait_until_stopped(&mut self, label: &str, deadline: Instant) -> anyhow::Result<()> {
        let pod = self.pod_mut(label)?;
        let pid = Pid::from_raw(pod.child.id() as i32);
        loop {
            // WUNTRACED reports a stop without reaping; an exit found here is reaped, so it is
            // remembered and `Child` is not asked to wait for it again.
            match waitpid(pid, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Stopped(..)) => return Ok(()),
                Ok(WaitStatus::StillAlive) => {}
                Ok(status) => {
                    pod.reaped = Some(format!("{status:?}"));
                    bail!("{label} ended ({status:?}) instead of pausing");
                }
                Err(error) => bail!("cannot watch {label}: {error}"),
            }
            if Instant::now() >= deadline {
                bail!("{label} did not pause in time");
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends SIGCONT to pod `label`.
    pub fn resume(&mut self, label: &str) -> anyhow::Result<()> {
        let pod = self.pod_mut(label)?;
        let pid = Pid::from_raw(pod.child.id() as i32);
        signal::kill(pid, Signal::SIGCONT).with_context(|| format!("cannot resume {label}"))
    }

    fn pod_mut(&mut self, label: &str) -> anyhow::Result<&mut Pod> {
        self.pods
            .iter_mut()
            .find(|p| p.label == label)
            .ok_or_else(|| anyhow!("no pod named {label}"))
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for pod in &mut self.pods {
            kill(pod);
        }
    }
}

/// SIGKILLs (a stopped process dies too) and reaps a pod that is still running.
fn kill(pod: &mut Pod) {
    pod.stdin.take();
    if pod.reaped.is_some() {
        return;
    }
    if let Ok(None) = pod.child.try_wait() {
        let _ = pod.child.kill();
    }
    let _ = pod.child.wait();
}

/// The exit status of a pod whose stdout closed, waiting up to `timeout` for it.
fn exit_status(pod: &mut Pod, timeout: Duration) -> String {
    if let Some(status) = &pod.reaped {
        return status.clone();
    }
    match wait_timeout(&mut pod.child, timeout) {
        Ok(status) => status.to_string(),
        Err(_) => "still running".to_string(),
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> anyhow::Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            bail!("no exit within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}
