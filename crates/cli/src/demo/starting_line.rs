//! The starting line of a pod process: the demo writes `go` on its stdin to start it. (Its
//! own module: the pod's roles, in the scenario modules, wait on it, and the pod runs them.)

use std::io::BufRead;
use std::sync::Arc;

use tokio::sync::Notify;

use super::events::PodEvent;

/// The starting line: the demo writes `go` on the pod's stdin to start it.
///
/// A thread reads stdin for the pod's whole life. End of input means the demo is gone (it
/// holds the pipe open until the pod exits), and a pod with nobody watching has no reason to
/// go on holding locks, so it exits at once.
#[derive(Clone)]
pub struct StartingLine {
    go: Arc<Notify>,
}

impl StartingLine {
    pub fn watch_stdin() -> StartingLine {
        let go = Arc::new(Notify::new());
        let signal = go.clone();
        let spawned = std::thread::Builder::new()
            .name("pod-stdin".into())
            .spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    match line {
                        // notify_one keeps a permit if nobody waits yet: `go` is never lost.
                        Ok(line) if line.trim() == "go" => signal.notify_one(),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                std::process::exit(0);
            });
        if spawned.is_err() {
            // Without the watcher the pod still works; it just cannot see the demo leave.
            go.notify_one();
        }
        StartingLine { go }
    }

    /// Says `ready` and waits for `go`.
    pub async fn ready_and_wait(&self) {
        PodEvent::Ready.emit();
        self.go.notified().await;
    }
}
