//! The short chaos runs of `cargo test` (`just chaos` runs the two-minute one): the
//! orchestrator binary with a fixed seed, every fault kind, and the checker's verdict.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn chaos(args: &[&str]) -> (Output, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-chaos"))
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run leasehold-chaos");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    // Shown with --nocapture, and by the harness when an assertion below fails.
    println!("{stdout}");
    (output, stdout)
}

/// The first number in the row `name` of the printed tables.
fn row(stdout: &str, name: &str) -> usize {
    stdout
        .lines()
        .map(str::trim_start)
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().find_map(|w| w.parse().ok()))
        .unwrap_or_else(|| panic!("no row {name:?} in:\n{stdout}"))
}

/// 20 seconds of faults of every kind against 4 client processes: no violation.
#[test]
fn twenty_seconds_of_faults_without_a_violation() {
    let started = Instant::now();
    let (output, stdout) = chaos(&["--duration", "20s", "--clients", "4", "--seed", "7"]);
    assert!(
        output.status.success(),
        "the chaos run found violations or failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("result: PASS"), "{stdout}");
    // It did something: faults went in, locks were taken, the store took writes.
    assert!(row(&stdout, "total ") > 50, "calls");
    // A quarter of the ops on the fair lock, whose line the order rule judged; a fifth on the
    // read/write lock, a fifth on the semaphore, a tenth on the latch.
    assert!(row(&stdout, "fair-lock ops:") > 10, "fair calls");
    assert!(row(&stdout, "rw-lock ops:") > 10, "read/write calls");
    assert!(row(&stdout, "semaphore ops:") > 10, "semaphore calls");
    // Latch rounds, and acquires of another kind on names in use (which must be refused).
    assert!(row(&stdout, "latch calls:") > 10, "latch calls");
    assert!(
        row(&stdout, "foreign-kind attempts:") > 5,
        "foreign-kind attempts"
    );
    let faults = stdout
        .split("faults injected")
        .nth(1)
        .map(|rest| row(rest, "total"))
        .expect("faults table");
    assert!(faults >= 5, "only {faults} faults in 20 s");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
}

/// The checker is not blind: clients that keep writing after their lease ended (they ignore
/// `is_held()`) are caught as overlapping holds, on plain locks, on read/write locks (a writer
/// beside another owner's hold) and on semaphores (more permits than there are); fair-lock
/// waiters that cut in at the head of the line (as if the lock let them) as grants past the
/// waiters they jumped. Three short runs, one after the other (together about as long as the
/// twenty seconds above, which they run beside).
#[test]
fn the_checker_catches_clients_that_ignore_their_lease_or_jump_the_line() {
    // The plain and fair locks only, as before the other kinds came.
    let (output, stdout) = chaos(&[
        "--duration",
        "8s",
        "--clients",
        "3",
        "--seed",
        "3",
        "--ignore-lease",
        "--rw-percent",
        "0",
        "--sem-percent",
        "0",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("result: FAIL"), "{stdout}");
    assert!(
        row(
            &stdout,
            "exclusion: overlapping holds, both holders believed valid"
        ) > 0,
        "{stdout}"
    );

    // Every op on the read/write lock, then every op on a semaphore of 2 permits (full when a
    // holder works past its lease): one run each, so that the client paused past its lease
    // holds what the run is about (sharing one run, the pause could land on the semaphore's
    // holders only, and no write overlap came).
    let (output, stdout) = chaos(&[
        "--duration",
        "6s",
        "--clients",
        "3",
        "--seed",
        "5",
        "--ignore-lease",
        "--fair-percent",
        "0",
        "--rw-percent",
        "100",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        row(
            &stdout,
            "exclusion: write holds overlapping another owner's hold, both believed"
        ) > 0,
        "{stdout}"
    );
    let (output, stdout) = chaos(&[
        "--duration",
        "5s",
        "--clients",
        "3",
        "--seed",
        "5",
        "--ignore-lease",
        "--fair-percent",
        "0",
        "--rw-percent",
        "0",
        "--sem-percent",
        "100",
        "--sem-permits",
        "2",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        row(
            &stdout,
            "semaphore: more permits believed held at once than the semaphore has"
        ) > 0,
        "{stdout}"
    );

    // Every op on the fair lock, half the waiters cutting in whenever someone waits.
    let (output, stdout) = chaos(&[
        "--duration",
        "6s",
        "--clients",
        "3",
        "--seed",
        "5",
        "--fair-percent",
        "100",
        "--cut-in-line",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        row(
            &stdout,
            "fair: acquires granted past a waiter that was in line ahead of them all along"
        ) > 0,
        "{stdout}"
    );
}

/// RedLock mode: five servers, each killed and restarted, paused, partitioned and slowed, a
/// minority or a majority of them down at once, clients paused and killed. First the self-test:
/// clients that act as if their quorum never ended (they ignore `is_held()`) must be caught as two
/// owners believing they held one RedLock at once. Then 15 seconds with honest clients: no
/// violation. One after the other (about 30 s together).
#[test]
fn redlock_runs_catch_clients_that_ignore_their_lease_and_pass_honest_ones() {
    let started = Instant::now();
    let (output, stdout) = chaos(&[
        "--redlock",
        "5",
        "--duration",
        "8s",
        "--clients",
        "3",
        "--seed",
        "3",
        "--ignore-lease",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("result: FAIL"), "{stdout}");
    assert!(
        row(
            &stdout,
            "redlock exclusion: two owners believed they held one RedLock at once"
        ) > 0,
        "{stdout}"
    );

    let (output, stdout) = chaos(&[
        "--redlock",
        "5",
        "--duration",
        "15s",
        "--clients",
        "4",
        "--seed",
        "11",
    ]);
    assert!(
        output.status.success(),
        "the RedLock chaos run found violations or failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("result: PASS"), "{stdout}");
    assert!(row(&stdout, "total ") > 50, "calls");
    assert!(row(&stdout, "store writes:") > 20, "fenced writes");
    let faults = stdout
        .split("faults injected")
        .nth(1)
        .map(|rest| row(rest, "total"))
        .expect("faults table");
    assert!(faults >= 5, "only {faults} faults in 15 s");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
}

/// Cluster mode: a Redis Cluster of 3 primaries with a replica each, the clients connected as
/// cluster clients, locks of every kind on all three primaries; a primary killed (its replica
/// promoted, the node back as a replica), `CLUSTER FAILOVER`, nodes paused, slots migrated under
/// held and waited-on locks, clients paused and killed. First the self-test: clients that ignore
/// `is_held()` must be caught (overlaps that no failover excuses). Then 18 seconds with honest
/// clients: no violation, and the primary kill and the failover (which every cluster run injects
/// first) both happened. One after the other (about 45 s).
#[test]
fn cluster_runs_catch_clients_that_ignore_their_lease_and_pass_honest_ones() {
    let started = Instant::now();
    let (output, stdout) = chaos(&[
        "--cluster",
        "--duration",
        "8s",
        "--clients",
        "3",
        "--seed",
        "3",
        "--ignore-lease",
    ]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("result: FAIL"), "{stdout}");
    // Whichever kind the ignored leases overlapped on first: on a loaded machine 8 s may show
    // a read/write or semaphore overlap and no plain one (seen once in 5 runs).
    let overlaps = row(
        &stdout,
        "exclusion: overlapping holds, both holders believed valid",
    ) + row(
        &stdout,
        "exclusion: write holds overlapping another owner's hold, both believed",
    ) + row(
        &stdout,
        "semaphore: more permits believed held at once than the semaphore has",
    );
    assert!(overlaps > 0, "{stdout}");

    let (output, stdout) = chaos(&[
        "--cluster",
        "--duration",
        "18s",
        "--clients",
        "3",
        "--seed",
        "16",
    ]);
    assert!(
        output.status.success(),
        "the cluster chaos run found violations or failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("result: PASS"), "{stdout}");
    assert!(row(&stdout, "total ") > 50, "calls");
    // Every kind, the fair lock's line read on the node serving it.
    assert!(row(&stdout, "fair-lock ops:") > 10, "fair calls");
    assert!(row(&stdout, "rw-lock ops:") > 10, "read/write calls");
    assert!(row(&stdout, "semaphore ops:") > 10, "semaphore calls");
    assert!(
        row(&stdout, "primary SIGKILL, failover, rejoin") >= 1,
        "{stdout}"
    );
    assert!(
        row(&stdout, "CLUSTER FAILOVER (coordinated)") >= 1,
        "{stdout}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(150),
        "{:?}",
        started.elapsed()
    );
}
