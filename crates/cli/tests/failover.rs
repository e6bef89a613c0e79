//! `leasehold demo --failover`: a lock through a failover of a primary and a replica the demo
//! starts itself (never the Redis on 6379, never `REDIS_URL`). Without replica sync the lock is
//! granted twice and the fencing token refuses the stale write; with `ReplicaSync::Replicas` the
//! reported grant survives and the one the replica missed fails with `NotReplicated`. The demo
//! checks each outcome itself (exit 1 otherwise); this test checks the exit status and that the
//! account says so. `--failover` is refused with a Redis of the user's or another deployment flag:
//! it kills its own primary.
//!
//! Runs wait on the process's exit with a deadline, never on a bare sleep.

use std::process::{Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const SECRET: &str = "s3cret-Pa55word";

/// `leasehold ARGS...` with `REDIS_URL` set to `redis_url` (else unset), no `DATABASE_URL`.
async fn leasehold(args: &[&str], redis_url: Option<&str>, timeout: Duration) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(url) = redis_url {
        cmd.env("REDIS_URL", url);
    }
    tokio::time::timeout(timeout, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("leasehold {args:?} did not finish within {timeout:?}"))
        .expect("run the leasehold binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The number after `label` in `line` (`A's token 123`).
fn number_after(line: &str, label: &str) -> u64 {
    let rest = &line[line
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} in {line}"))
        + label.len()..];
    rest.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("no number after {label:?} in {line}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_failover_grants_twice_without_sync_and_once_with_it() {
    let output = leasehold(&["demo", "--failover"], None, Duration::from_secs(120)).await;
    let out = text(&output.stdout);
    let err = text(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{out}\n{err}",
        output.status
    );
    let last = out.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("all scenarios behaved as expected ("),
        "{last:?}:\n{out}"
    );
    for expected in [
        "leasehold demo --failover",
        "1. Without replica sync",
        "the replication link is cut",
        "the primary is killed, the replica promoted (REPLICAOF NO ONE)",
        "granted twice: pod A still believes it holds the lock (is_held: true), pod B holds it \
         (is_held: true)",
        "pod B sold the last unit of product 42 with token",
        "0 rows updated",
        "stale write rejected by fencing token",
        "ok: granted twice without sync, and the fencing token kept pod A's write out",
        "2. With ReplicaSync::Replicas { replicas: 1, timeout: 1s }",
        "replica_sync() = Synced { replicas: 1, local_aof: false }",
        "pod B: try_lock on the promoted replica finds \"inventory:42\" held",
        "pod A's try_lock failed with LockError::NotReplicated: the grant reached 0 of the 1 \
         replica required",
        "the grant was rolled back: \"inventory:42\" is free again on the primary",
        "ok: no grant reported before a replica held it",
        "3. What the sync costs a grant",
        "without sync: ",
        "with sync: ",
        "`just bench --only replica_sync`",
    ] {
        assert!(out.contains(expected), "{expected:?} missing:\n{out}");
    }
    assert_eq!(out.matches("\n   ok: ").count(), 3, "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    // The newer owner's token is the higher one, as printed.
    let fenced = out
        .lines()
        .find(|l| l.contains("stale write rejected by fencing token"))
        .unwrap();
    assert!(
        number_after(fenced, "A's token ") < number_after(fenced, "B's token "),
        "{fenced}"
    );
}

/// Exit code 1, one line on stderr naming `--failover`, nothing started, no password shown.
fn assert_refused(output: &Output, what: &str) -> String {
    let err = text(&output.stderr);
    let out = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{what}: {out}{err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: not one line: {err}"
    );
    assert!(err.contains("--failover"), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(out.is_empty(), "{what}: the demo started: {out}");
    assert!(!err.contains(SECRET), "{what}: a password in stderr: {err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_failover_refuses_a_given_redis_and_deployment_flags() {
    let quick = Duration::from_secs(30);
    let url = format!("redis://admin:{SECRET}@127.0.0.1:1");
    let output = leasehold(&["demo", "--failover"], Some(&url), quick).await;
    let err = assert_refused(&output, "REDIS_URL");
    assert!(
        err.contains("REDIS_URL") && err.contains("admin:***@"),
        "{err}"
    );
    let output = leasehold(&["--url", &url, "demo", "--failover"], None, quick).await;
    let err = assert_refused(&output, "--url");
    assert!(err.contains("admin:***@"), "{err}");
    for flag in ["--cluster", "--sentinel"] {
        let output = leasehold(&["demo", "--failover", flag], None, quick).await;
        let err = assert_refused(&output, flag);
        assert!(err.contains(flag), "{err}");
    }
}
