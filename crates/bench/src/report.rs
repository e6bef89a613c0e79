//! The results: a table on stdout and the JSON shape `bars` reads.

use serde_json::{json, Value};

use crate::crash::CrashRecovery;
use crate::handoff::{Handoff, Kind, Layout};
use crate::placement::Placement;
use crate::uncontended::Uncontended;
use crate::watchdog::WatchdogRun;

#[derive(Default)]
pub(crate) struct Results {
    pub(crate) uncontended: Option<Uncontended>,
    pub(crate) uncontended_sequential: Option<Uncontended>,
    pub(crate) handoff: Option<Handoff>,
    pub(crate) handoff_polling_100ms: Option<Handoff>,
    pub(crate) handoff_polling_10ms: Option<Handoff>,
    pub(crate) handoff_fair: Option<Handoff>,
    pub(crate) handoff_timer: Option<Handoff>,
    pub(crate) handoff_fair_timer: Option<Handoff>,
    pub(crate) handoff_per_process: Option<Handoff>,
    pub(crate) handoff_per_process_fair: Option<Handoff>,
    pub(crate) handoff_per_process_timer: Option<Handoff>,
    pub(crate) handoff_per_process_fair_timer: Option<Handoff>,
    pub(crate) handoff_per_process_polling_100ms: Option<Handoff>,
    pub(crate) handoff_per_process_polling_10ms: Option<Handoff>,
    pub(crate) crash_recovery: Option<CrashRecovery>,
    pub(crate) watchdog: Option<WatchdogRun>,
    pub(crate) red_lock: Option<crate::red_lock::RedLockRun>,
    pub(crate) replica_sync: Option<crate::replica_sync::ReplicaSyncRun>,
}

impl Results {
    pub(crate) fn set_handoff(&mut self, kind: Kind, layout: Layout, run: Handoff) {
        let slot = match (layout, kind) {
            (Layout::Shared, Kind::Leasehold) => &mut self.handoff,
            (Layout::Shared, Kind::Fair) => &mut self.handoff_fair,
            (Layout::Shared, Kind::Timer) => &mut self.handoff_timer,
            (Layout::Shared, Kind::FairTimer) => &mut self.handoff_fair_timer,
            (Layout::PerProcess, Kind::Timer) => &mut self.handoff_per_process_timer,
            (Layout::PerProcess, Kind::FairTimer) => &mut self.handoff_per_process_fair_timer,
            (Layout::PerProcess, Kind::Fair) => &mut self.handoff_per_process_fair,
            (Layout::Shared, Kind::Polling(d)) if d.as_millis() >= 100 => {
                &mut self.handoff_polling_100ms
            }
            (Layout::Shared, Kind::Polling(_)) => &mut self.handoff_polling_10ms,
            (Layout::PerProcess, Kind::Leasehold) => &mut self.handoff_per_process,
            (Layout::PerProcess, Kind::Polling(d)) if d.as_millis() >= 100 => {
                &mut self.handoff_per_process_polling_100ms
            }
            (Layout::PerProcess, Kind::Polling(_)) => &mut self.handoff_per_process_polling_10ms,
        };
        *slot = Some(run);
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "uncontended": self.uncontended,
            "uncontended_sequential": self.uncontended_sequential,
            "handoff": self.handoff,
            "handoff_polling_100ms": self.handoff_polling_100ms,
            "handoff_polling_10ms": self.handoff_polling_10ms,
            "handoff_fair": self.handoff_fair,
            "handoff_timer": self.handoff_timer,
            "handoff_fair_timer": self.handoff_fair_timer,
            "handoff_per_process": self.handoff_per_process,
            "handoff_per_process_fair": self.handoff_per_process_fair,
            "handoff_per_process_timer": self.handoff_per_process_timer,
            "handoff_per_process_fair_timer": self.handoff_per_process_fair_timer,
            "handoff_per_process_polling_100ms": self.handoff_per_process_polling_100ms,
            "handoff_per_process_polling_10ms": self.handoff_per_process_polling_10ms,
            "crash_recovery": self.crash_recovery,
            "watchdog": self.watchdog,
            "red_lock": self.red_lock,
            "replica_sync": self.replica_sync,
        })
    }
}

pub(crate) fn print_table(results: &Results, quick: bool, placement: &Placement) {
    println!(
        "leasehold-bench ({} run; {placement})",
        if quick { "quick" } else { "full" }
    );
    for (label, run) in [
        ("uncontended", &results.uncontended),
        ("uncontended_sequential", &results.uncontended_sequential),
    ] {
        if let Some(u) = run {
            println!(
                "{label:<24} tasks={:<3} pairs/s={:>9.0}  baseline calls/s={:>9.0}  ratio_to_limit={:.2} (target >= 0.8)",
                u.tasks, u.pairs_per_sec, u.baseline_calls_per_sec, u.ratio_to_limit
            );
            println!(
                "{:<24} client cpu/pair={:.1}us (baseline call {:.1}us)  allocations/pair={:.1} (baseline call {:.1})  redis cpu/script={:.1}us (trivial {:.1}us)",
                "",
                u.client_cpu_us_per_pair,
                u.client_cpu_us_per_call,
                u.allocs_per_pair,
                u.allocs_per_call,
                u.server_us_per_script,
                u.server_us_per_trivial
            );
        }
    }
    let handoffs = [
        ("handoff (leasehold)", &results.handoff),
        ("handoff (fair lock)", &results.handoff_fair),
        ("handoff (timer)", &results.handoff_timer),
        ("handoff (fair, timer)", &results.handoff_fair_timer),
        ("handoff_polling_100ms", &results.handoff_polling_100ms),
        ("handoff_polling_10ms", &results.handoff_polling_10ms),
        ("per_process (leasehold)", &results.handoff_per_process),
        ("per_process (fair lock)", &results.handoff_per_process_fair),
        ("per_process (timer)", &results.handoff_per_process_timer),
        (
            "per_process (fair, timer)",
            &results.handoff_per_process_fair_timer,
        ),
        (
            "per_process_polling_100ms",
            &results.handoff_per_process_polling_100ms,
        ),
        (
            "per_process_polling_10ms",
            &results.handoff_per_process_polling_10ms,
        ),
    ];
    if handoffs.iter().any(|(_, h)| h.is_some()) {
        println!(
            "{:<26} {:>7} {:>8} {:>9} {:>9} {:>9} {:>10} {:>7} {:>11} {:>9} {:>9}",
            "",
            "acq",
            "acq/s",
            "gap p50",
            "gap p99",
            "handoff",
            "rt/acq",
            "served",
            "max wait",
            "cpu/acq",
            "of limit"
        );
    }
    for (label, run) in handoffs {
        if let Some(h) = run {
            println!(
                "{label:<26} {:>7} {:>8.0} {:>7}us {:>7}us {:>7}us {:>10.2} {:>4}/{:<2} {:>9.1}ms {:>7.0}us {:>9.2}",
                h.acquisitions,
                h.acq_per_sec,
                h.gap_p50_us,
                h.gap_p99_us,
                h.handoff_p50_us,
                h.round_trips_per_acquisition,
                h.workers_served,
                h.waiters,
                h.max_wait_ms,
                h.client_cpu_us_per_acquisition,
                h.acq_per_sec / h.hold_limit_acq_per_sec
            );
        }
    }
    if let Some(c) = &results.crash_recovery {
        println!(
            "{:<24} lease={}ms  acquired {:.1} ms after the key expired (median; target < 10 ms)",
            "crash_recovery", c.lease_ms, c.delay_after_expiry_ms
        );
    }
    if let Some(w) = &results.watchdog {
        println!(
            "{:<24} holds={} lease={:?}  round trips/tick={:.1}  cpu={:.1} ms/s  memory={:.0} bytes/hold",
            "watchdog", w.holds, w.lease, w.round_trips_per_tick, w.cpu_ms_per_sec, w.bytes_per_hold
        );
    }
    if let Some(r) = &results.replica_sync {
        println!(
            "{:<24} grant p50: synced={:.0} us  unsynced={:.0} us  raw SET+WAIT={:.0} us  raw SET={:.0} us  ratio_to_unsynced={:.2}  ratio_to_raw={:.2}",
            "replica_sync", r.synced_grant_p50_us, r.grant_p50_us, r.raw_set_wait_p50_us, r.raw_set_p50_us, r.grant_ratio_to_unsynced, r.grant_ratio_to_raw
        );
        println!(
            "{:<24} lock+unlock p50: synced={:.0} us  unsynced={:.0} us",
            "replica_sync_pair", r.synced_pair_p50_us, r.pair_p50_us
        );
    }
    if let Some(r) = &results.red_lock {
        println!(
            "{:<24} servers={}  pair p50: red_lock={:.0} us  raw={:.0} us  plain={:.0} us  ratio_to_raw={:.2}  ratio_to_plain={:.2}",
            "red_lock", r.servers, r.red_lock_pair_p50_us, r.raw_pair_p50_us, r.plain_pair_p50_us, r.ratio_to_raw, r.ratio_to_plain
        );
        println!(
            "{:<24} two contenders: red_lock={:.0} acq/s  plain={:.0} acq/s",
            "red_lock_contended", r.red_lock_contended_per_sec, r.plain_contended_per_sec
        );
    }
}
