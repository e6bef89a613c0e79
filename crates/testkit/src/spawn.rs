//! Spawning children that cannot outlive the test process, plus signal helpers.
//!
//! On Linux every child gets `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel SIGKILLs it as
//! soon as its parent goes away, even when the test process itself is SIGKILLed and no `Drop`
//! runs. The death signal is tied to the *thread* that forked the child, not the process, so
//! all children are forked from one dedicated spawner thread that lives until the process
//! exits. (Were they forked from, say, a tokio worker thread or a test's own thread, they would
//! be killed as soon as that thread ended.)
//!
//! On other Unix systems there is no such guarantee; `Drop` still kills and reaps.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::SyncSender<io::Result<Child>>,
}

/// The spawner thread's inbox; `None` if the thread could not be created.
static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

/// Spawns `cmd` from the long-lived spawner thread, with the parent-death signal set on Linux.
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    set_parent_death_signal(&mut cmd);
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("leasehold-testkit-spawner".into())
            .spawn(move || {
                // The sender lives in a static and is never dropped, so this loop (and the
                // thread) lasts as long as the process.
                for mut req in rx {
                    let _ = req.reply.send(req.cmd.spawn());
                }
            })
            .ok()
            .map(|_| tx)
    });
    match spawner {
        Some(tx) => {
            let (reply, result) = mpsc::sync_channel(1);
            tx.send(SpawnRequest { cmd, reply })
                .map_err(|_| io::Error::other("testkit spawner thread is gone"))?;
            result
                .recv()
                .map_err(|_| io::Error::other("testkit spawner thread dropped the request"))?
        }
        // Could not start the thread: fall back to forking from the caller's thread (the
        // death signal then follows this thread's lifetime).
        None => cmd.spawn(),
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // functions may be called. It calls only `prctl` and `getppid` (both plain syscalls, listed
    // as async-signal-safe), reads the already-captured `parent` integer, and builds an
    // `io::Error` from a raw errno (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then we have been re-parented
            // and the death signal will never come. Refuse to exec.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// Sends `sig` to process `pid`.
pub(crate) fn signal_pid(pid: u32, sig: Signal) -> io::Result<()> {
    signal::kill(Pid::from_raw(pid as i32), sig).map_err(io::Error::from)
}

/// Sends `sig` to process group `pgid`.
pub(crate) fn signal_group(pgid: u32, sig: Signal) -> io::Result<()> {
    signal::killpg(Pid::from_raw(pgid as i32), sig).map_err(io::Error::from)
}

/// Waits (up to 2 s) until `/proc/<pid>/stat` says the process is stopped (`stopped == true`)
/// or not stopped. Signals are delivered asynchronously; this makes `pause()`/`resume()`
/// return only once they have taken effect. No-op off Linux.
pub(crate) fn wait_stopped(pid: u32, stopped: bool) {
    #[cfg(target_os = "linux")]
    {
        use std::time::{Duration, Instant};
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match proc_state(pid) {
                // Gone or a zombie: nothing more will change.
                None | Some('Z') | Some('X') => return,
                Some(s) if (s == 'T' || s == 't') == stopped => return,
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    pid,
                    stopped,
                    "process did not reach the expected stop state in time"
                );
                return;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (pid, stopped);
    }
}

#[cfg(target_os = "linux")]
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Format: "pid (comm) S ..."; comm may contain spaces and parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}
