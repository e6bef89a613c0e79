//! `leasehold-bench --quick --json` writes exactly the shape the bars read.
//!
//! A shape check, not a performance check: the figures depend on the machine, so the only
//! assertions on values are the ones any run must satisfy (counts are positive, at most all
//! workers are served, the ratios are the formula applied to the other two fields).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

const UNCONTENDED: &[&str] = &[
    "tasks",
    "pairs_per_sec",
    "baseline_calls_per_sec",
    "ratio_to_limit",
];
const HANDOFF: &[&str] = &[
    "waiters",
    "acquisitions",
    "acq_per_sec",
    "gap_p50_us",
    "gap_p99_us",
    "round_trips_per_acquisition",
    "workers_served",
    "max_wait_ms",
    "client_cpu_us_per_acquisition",
    "handoff_p50_us",
    "hold_mean_us",
    "hold_limit_acq_per_sec",
];
const CRASH: &[&str] = &["lease_ms", "delay_after_expiry_ms"];
const RED_LOCK: &[&str] = &[
    "servers",
    "plain_pair_p50_us",
    "red_lock_pair_p50_us",
    "raw_pair_p50_us",
    "ratio_to_raw",
    "ratio_to_plain",
    "plain_contended_per_sec",
    "red_lock_contended_per_sec",
];
const REPLICA_SYNC: &[&str] = &[
    "grant_p50_us",
    "synced_grant_p50_us",
    "pair_p50_us",
    "synced_pair_p50_us",
    "raw_set_p50_us",
    "raw_set_wait_p50_us",
    "grant_ratio_to_unsynced",
    "grant_ratio_to_raw",
];
const WATCHDOG: &[&str] = &[
    "holds",
    "round_trips_per_tick",
    "cpu_ms_per_sec",
    "bytes_per_hold",
];

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect()
}

fn number(section: &Value, field: &str) -> f64 {
    section[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number: {section}"))
}

#[test]
fn quick_run_writes_the_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold-bench"))
        .args(["--quick", "--holds", "2000", "--json"])
        .arg(&json)
        .env_remove("REDIS_URL")
        .output()
        .expect("leasehold-bench runs");
    assert!(
        output.status.success(),
        "leasehold-bench failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let expected: BTreeSet<&str> = [
        "uncontended",
        "uncontended_sequential",
        "handoff",
        "handoff_polling_100ms",
        "handoff_polling_10ms",
        "handoff_fair",
        "handoff_timer",
        "handoff_fair_timer",
        "handoff_per_process",
        "handoff_per_process_fair",
        "handoff_per_process_timer",
        "handoff_per_process_fair_timer",
        "handoff_per_process_polling_100ms",
        "handoff_per_process_polling_10ms",
        "crash_recovery",
        "watchdog",
        "red_lock",
        "replica_sync",
    ]
    .into();
    assert_eq!(keys(&results), expected);
    for (section, fields) in [
        ("uncontended", UNCONTENDED),
        ("uncontended_sequential", UNCONTENDED),
        ("handoff", HANDOFF),
        ("handoff_polling_100ms", HANDOFF),
        ("handoff_polling_10ms", HANDOFF),
        ("handoff_fair", HANDOFF),
        ("handoff_timer", HANDOFF),
        ("handoff_fair_timer", HANDOFF),
        ("handoff_per_process", HANDOFF),
        ("handoff_per_process_fair", HANDOFF),
        ("handoff_per_process_timer", HANDOFF),
        ("handoff_per_process_fair_timer", HANDOFF),
        ("handoff_per_process_polling_100ms", HANDOFF),
        ("handoff_per_process_polling_10ms", HANDOFF),
        ("crash_recovery", CRASH),
        ("watchdog", WATCHDOG),
        ("red_lock", RED_LOCK),
        ("replica_sync", REPLICA_SYNC),
    ] {
        let value = &results[section];
        assert_eq!(keys(value), fields.iter().copied().collect(), "{section}");
        for field in fields {
            assert!(number(value, field) >= 0.0, "{section}.{field}: {value}");
        }
    }
    for section in ["uncontended", "uncontended_sequential"] {
        let u = &results[section];
        let ratio = 2.0 * number(u, "pairs_per_sec") / number(u, "baseline_calls_per_sec");
        assert!((number(u, "ratio_to_limit") - ratio).abs() < 1e-9, "{u}");
    }
    for section in [
        "handoff",
        "handoff_polling_100ms",
        "handoff_polling_10ms",
        "handoff_fair",
        "handoff_per_process",
        "handoff_per_process_fair",
        "handoff_per_process_polling_100ms",
        "handoff_per_process_polling_10ms",
    ] {
        let h = &results[section];
        assert!(number(h, "acquisitions") > 0.0, "{h}");
        assert!(number(h, "workers_served") <= number(h, "waiters"), "{h}");
        // The ceiling is one over the mean hold.
        let ceiling = number(h, "hold_limit_acq_per_sec") * number(h, "hold_mean_us") / 1e6;
        assert!((ceiling - 1.0).abs() < 1e-6, "{h}");
    }
    assert_eq!(number(&results["watchdog"], "holds"), 2000.0);
    let r = &results["red_lock"];
    assert_eq!(number(r, "servers"), 5.0);
    let ratio = number(r, "red_lock_pair_p50_us") / number(r, "raw_pair_p50_us");
    assert!((number(r, "ratio_to_raw") - ratio).abs() < 1e-9, "{r}");
    let s = &results["replica_sync"];
    let ratio = number(s, "synced_grant_p50_us") / number(s, "grant_p50_us");
    assert!(
        (number(s, "grant_ratio_to_unsynced") - ratio).abs() < 1e-9,
        "{s}"
    );
}
