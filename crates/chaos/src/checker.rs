//! The checker: reads a run's history (client event logs, the store's write log, the faults,
//! what was left in Redis) and counts violations.
//!
//! Soundness rests on three facts:
//! - every timestamp comes from one clock (`CLOCK_MONOTONIC`, system-wide), so times taken by
//!   different processes compare without skew;
//! - a belief sample's time is read *before* `is_held()`, and `is_held()` only goes from true to
//!   false, so a true sample at `t` proves the holder believed from its grant through `t` even if
//!   the process was paused in between;
//! - the store reads its time under its write lock, so store times order writes exactly.
//!
//! The history can only under-report beliefs (samples are sparse), never over-report, so every
//! counted overlap happened.
//!
//! # Two tasks in one critical section
//!
//! A critical section is identified by (client process, task), not by owner id: the task that
//! acquired, or from a `Handoff` event on, the task the guard was handed to. Two beliefs on one
//! lock that overlap are a violation when their owners differ ([`OVERLAP`]), and also under one
//! owner id when at some instant of the overlap two different tasks ran them
//! ([`OVERLAP_TWO_TASKS`]): a guard handed to a spawned task while the task that acquired it
//! asked again and re-entered the hold (ownership is the acquiring task). Only nested re-entry
//! within one task may overlap. The data-loss allowance of the overlap check applies to both,
//! and so does its soundness: both sections are proven by true belief samples.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;

use anyhow::Context;

use crate::history::{
    read_client_histories, read_faults, ClientHistory, Event, Fault, FaultKind, Kind, ReleaseHow,
};
use crate::orchestrator::{Cleanup, RunConfig};
use crate::store::{Accepted, Refused, Store};
use crate::worker::MAX_EXPLICIT_LEASE;

/// A wait may stall this long without any fault to explain it (contention alone: a few
/// seconds at most with these hold times) before it counts as a waiter that never progressed.
pub const STALL_BOUND_US: i64 = 15_000_000;
/// How long after a fault healed its effects may still hold waiters up: a partitioned or paused
/// holder's lock lives until its lease runs out, reconnects back off up to 2 s.
fn recovery_us(config: &RunConfig) -> i64 {
    2 * config.lease.max(MAX_EXPLICIT_LEASE).as_micros() as i64 + 2_000_000
}

/// Reads `dir` and checks it.
pub fn check(dir: &Path) -> anyhow::Result<Report> {
    let config: RunConfig = serde_json::from_str(
        &std::fs::read_to_string(dir.join("run.json")).context("reading run.json")?,
    )?;
    let histories = read_client_histories(dir)?;
    let faults_path = dir.join("faults.jsonl");
    let faults = if faults_path.exists() {
        read_faults(&faults_path)?
    } else {
        Vec::new()
    };
    let cleanup: Cleanup = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cleanup.json")).context("reading cleanup.json")?,
    )?;
    let store = Store::open(&dir.join("store.db"))?;
    Ok(analyze(
        &config,
        &histories,
        &faults,
        &cleanup,
        &store.accepted()?,
        &store.refused()?,
    ))
}

type OpKey = (u32, u32, u64);

#[derive(Clone, Debug)]
struct Grant {
    t: i64,
    owner: String,
    token: Option<u64>,
    hold_count: u64,
}

#[derive(Clone, Debug)]
struct Op {
    key: OpKey,
    task: u32,
    kind: Kind,
    res: u32,
    begin: i64,
    /// The hold's lease in µs (explicit, or the watchdog's).
    lease: i64,
    /// When the acquire call returned.
    ended: Option<i64>,
    granted: Option<Grant>,
    failed: Option<String>,
    checks: Vec<(i64, bool)>,
    writes: Vec<(i64, u64, bool)>,
    released: Option<(i64, ReleaseHow, String)>,
    abandoned: bool,
    /// When the guard was handed to another task, and that task's number.
    handoff: Option<(i64, u32)>,
}

impl Op {
    /// [grant, last true belief sample]: when the holder certainly believed its lease valid.
    fn belief(&self) -> Option<(i64, i64)> {
        let grant = self.granted.as_ref()?;
        let last = self
            .checks
            .iter()
            .filter(|(_, held)| *held)
            .map(|(t, _)| *t)
            .max()?;
        (last >= grant.t).then_some((grant.t, last))
    }

    /// The critical section's identity at `t`: (client, generation, task). The task is the one
    /// that acquired, or from a hand-off on the one the guard went to.
    fn task_at(&self, t: i64) -> (u32, u32, u32) {
        let (client, gen, _) = self.key;
        match self.handoff {
            Some((at, to_task)) if t >= at => (client, gen, to_task),
            _ => (client, gen, self.task),
        }
    }

    fn finished_at(&self) -> Option<i64> {
        match (&self.granted, self.released.as_ref()) {
            (Some(_), Some((t, _, _))) => Some(*t),
            (Some(_), None) => None,
            (None, _) => self.ended,
        }
    }

    fn describe(&self) -> String {
        let (client, gen, op) = self.key;
        let grant = self.granted.as_ref();
        format!(
            "client {client} gen {gen} op {op} ({}, res-{}, owner {}, token {:?})",
            self.kind.name(),
            self.res,
            grant.map_or("-", |g| g.owner.as_str()),
            grant.and_then(|g| g.token)
        )
    }
}

/// One line of the checks table.
#[derive(Clone, Debug)]
pub struct CheckLine {
    pub name: &'static str,
    pub count: usize,
    /// A violation unless zero; otherwise counted and shown only.
    pub must_be_zero: bool,
    pub note: String,
}

impl CheckLine {
    /// A check whose count must be 0, with no note.
    fn must_be_zero(name: &'static str, count: usize) -> CheckLine {
        CheckLine {
            name,
            count,
            must_be_zero: true,
            note: String::new(),
        }
    }
}

/// The outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub operations: Vec<(String, [usize; 4])>,
    pub other_stats: Vec<(String, String)>,
    pub faults: Vec<(&'static str, usize)>,
    pub checks: Vec<CheckLine>,
    pub samples: Vec<String>,
}

impl Report {
    pub fn violations(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.must_be_zero)
            .map(|c| c.count)
            .sum()
    }

    pub fn passed(&self) -> bool {
        self.violations() == 0
    }

    /// The count of the check named `name`.
    #[cfg(test)]
    pub fn count(&self, name: &str) -> usize {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map_or_else(|| panic!("no check named {name:?}"), |c| c.count)
    }
}

pub const FENCE_NON_INCREASING: &str = "fence: accepted writes with a non-increasing token";
pub const FENCE_UNKNOWN_TOKEN: &str = "fence: accepted writes whose token no grant handed out";
pub const FENCE_REUSED: &str = "fence: one token handed to two grants";
pub const FENCE_ORDER: &str = "fence: token not above an earlier grant's (real-time order)";
pub const FENCE_RESTART: &str = "fence: tokens that went backwards across a Redis restart";
pub const OVERLAP: &str = "exclusion: overlapping holds, both holders believed valid";
pub const OVERLAP_TWO_TASKS: &str =
    "exclusion: two tasks' critical sections overlapping under one owner id";
pub const OVERLAP_DATA_LOSS: &str = "exclusion: overlaps after Redis lost its data";
pub const LATE_WRITES: &str = "exclusion: writes landing after the writer's lease, in another hold";
pub const ORPHANED: &str =
    "release: acquires that re-entered a hold their owner had let go of (unlock left it held)";
pub const STUCK: &str = "liveness: waiters that never progressed after faults healed";
pub const KEYS_LEFT: &str =
    "cleanup: keys left after every TTL ran out (the fencing counter excluded)";
pub const KEYS_NO_TTL: &str = "cleanup: keys without a TTL (the fencing counter excluded)";
pub const CHANNELS_LEFT: &str = "cleanup: subscriptions left after the clients drained";
pub const LOCAL_LEFT: &str =
    "cleanup: waiters, subscriptions or holds still registered in a client";
pub const CRASHED: &str = "clients: crashed or not stopped cleanly";

/// Checks a history (pure: the unit tests feed it made-up histories).
pub fn analyze(
    config: &RunConfig,
    histories: &[ClientHistory],
    faults: &[Fault],
    cleanup: &Cleanup,
    accepted: &[Accepted],
    refused: &[Refused],
) -> Report {
    let mut report = Report::default();
    let mut ops: BTreeMap<OpKey, Op> = BTreeMap::new();
    let mut drained = HashSet::new();
    let mut local_left = 0;
    let mut torn = 0;
    for history in histories {
        torn += history.torn_lines;
        for event in &history.events {
            if let Event::Drained {
                waiters,
                channels,
                holds,
                ..
            } = event
            {
                drained.insert((history.client, history.gen));
                if waiters + channels + holds > 0 {
                    local_left += 1;
                    report.samples.push(format!(
                        "client {} gen {} drained with waiters={waiters} channels={channels} holds={holds}",
                        history.client, history.gen
                    ));
                }
            }
            let Some(op) = event.op() else { continue };
            let key = (history.client, history.gen, op);
            if let Event::Begin {
                t,
                task,
                kind,
                res,
                lease_ms,
                ..
            } = event
            {
                let lease = lease_ms.map_or(config.lease, std::time::Duration::from_millis);
                ops.insert(
                    key,
                    Op {
                        key,
                        task: *task,
                        kind: *kind,
                        res: *res,
                        begin: *t,
                        lease: lease.as_micros() as i64,
                        ended: None,
                        granted: None,
                        failed: None,
                        checks: Vec::new(),
                        writes: Vec::new(),
                        released: None,
                        abandoned: false,
                        handoff: None,
                    },
                );
                continue;
            }
            let Some(entry) = ops.get_mut(&key) else {
                continue;
            };
            match event {
                Event::Granted {
                    t,
                    owner,
                    token,
                    hold_count,
                    ..
                } => {
                    entry.ended = Some(*t);
                    entry.granted = Some(Grant {
                        t: *t,
                        owner: owner.clone(),
                        token: *token,
                        hold_count: *hold_count,
                    });
                }
                Event::NotGranted { t, .. } => entry.ended = Some(*t),
                Event::Failed { t, error, .. } => {
                    entry.ended = Some(*t);
                    entry.failed = Some(error.clone());
                }
                Event::Check { t, held, .. } => entry.checks.push((*t, *held)),
                Event::Write {
                    t, token, accepted, ..
                } => entry.writes.push((*t, *token, *accepted)),
                Event::Released {
                    t, how, outcome, ..
                } => entry.released = Some((*t, *how, outcome.clone())),
                Event::Abandoned { .. } => entry.abandoned = true,
                Event::Handoff { t, to_task, .. } => entry.handoff = Some((*t, *to_task)),
                Event::Begin { .. } | Event::Start { .. } | Event::Drained { .. } => {}
            }
        }
    }

    operations(&mut report, &ops, accepted, refused);
    for kind in FaultKind::ALL {
        report.faults.push((
            kind.name(),
            faults.iter().filter(|f| f.kind == kind).count(),
        ));
    }
    let restarts: Vec<(i64, i64)> = faults
        .iter()
        .filter(|f| f.kind == FaultKind::RedisRestart)
        .map(|f| (f.start, f.end))
        .collect();
    let restart_within = |from: i64, to: i64| restarts.iter().any(|(s, e)| *s <= to && *e >= from);

    // The end of the last restart in [from, to]: Redis lost its data before then.
    let last_restart_within = |from: i64, to: i64| {
        restarts
            .iter()
            .filter(|(s, e)| *s <= to && *e >= from)
            .map(|(_, e)| *e)
            .max()
    };
    fence_checks(&mut report, &ops, accepted, &restart_within);
    exclusion_checks(&mut report, &ops, faults, &last_restart_within);
    liveness_check(&mut report, config, &ops, faults, &drained);
    orphan_check(&mut report, config, &ops);

    report.checks.push(CheckLine {
        name: KEYS_LEFT,
        count: cleanup.keys_left.len(),
        must_be_zero: true,
        note: format!(
            "{} at exit, gone after {} ms; fencing counter kept by design: {}",
            cleanup.keys_at_exit.len(),
            cleanup.expiry_wait_ms,
            cleanup.fence_keys
        ),
    });
    report.checks.push(CheckLine::must_be_zero(
        KEYS_NO_TTL,
        cleanup.keys_without_ttl.len(),
    ));
    report.checks.push(CheckLine::must_be_zero(
        CHANNELS_LEFT,
        cleanup.channels_left.len(),
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(LOCAL_LEFT, local_left));
    report
        .checks
        .push(CheckLine::must_be_zero(CRASHED, cleanup.crashed.len()));
    for key in cleanup
        .keys_left
        .iter()
        .chain(&cleanup.keys_without_ttl)
        .chain(&cleanup.channels_left)
    {
        report.samples.push(format!("left in Redis: {key}"));
    }
    report.samples.extend(cleanup.crashed.iter().cloned());
    if torn > 0 {
        report
            .other_stats
            .push(("event lines torn by SIGKILL".into(), torn.to_string()));
    }
    report
}

fn operations(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    accepted: &[Accepted],
    refused: &[Refused],
) {
    let mut total = [0; 4];
    for kind in Kind::ALL {
        let mut row = [0; 4];
        for op in ops.values().filter(|o| o.kind == kind) {
            row[0] += 1;
            if op.granted.is_some() {
                row[1] += 1;
            } else if op.failed.is_some() {
                row[3] += 1;
            } else if op.ended.is_some() {
                row[2] += 1;
            }
        }
        for i in 0..4 {
            total[i] += row[i];
        }
        report.operations.push((kind.name().to_string(), row));
    }
    report.operations.push(("total".into(), total));

    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops.values() {
        if let Some(error) = &op.failed {
            *errors
                .entry(error.split(':').next().unwrap_or("?"))
                .or_default() += 1;
        }
    }
    let list = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !errors.is_empty() {
        report
            .other_stats
            .push(("acquire errors by kind".into(), list(&errors)));
    }
    let mut releases: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops.values() {
        if let Some((_, how, outcome)) = &op.released {
            let what = match how {
                ReleaseHow::Unlock => match outcome.split(':').next().unwrap_or("?") {
                    "ok" => "unlock ok",
                    "not_held" => "unlock not_held",
                    "timeout" => "unlock timeout",
                    "connection" => "unlock connection",
                    _ => "unlock other error",
                },
                ReleaseHow::Drop => "dropped",
                ReleaseHow::RunOnce => "run_once",
            };
            *releases.entry(what).or_default() += 1;
        }
    }
    report
        .other_stats
        .push(("releases".into(), list(&releases)));
    report.other_stats.push((
        "fenced writes".into(),
        format!("{} accepted, {} refused", accepted.len(), refused.len()),
    ));
    let lost_before_write = ops
        .values()
        .filter(|o| o.granted.is_some() && o.kind != Kind::RunOnce && o.writes.is_empty())
        .filter(|o| o.checks.iter().any(|(_, held)| !held))
        .count();
    report.other_stats.push((
        "holds that saw is_held() false before writing (no write sent)".into(),
        lost_before_write.to_string(),
    ));
    let waits: Vec<i64> = ops
        .values()
        .filter(|o| o.kind.waits())
        .filter_map(|o| o.ended.map(|e| e - o.begin))
        .collect();
    if let Some(max) = waits.iter().max() {
        report
            .other_stats
            .push(("longest acquire wait".into(), format!("{} ms", max / 1000)));
    }
}

fn fence_checks(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    accepted: &[Accepted],
    restart_within: &dyn Fn(i64, i64) -> bool,
) {
    // The store's own invariant, from its log.
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut non_increasing = 0;
    let mut unknown = 0;
    for write in accepted {
        if let Some(prev) = last.insert(write.resource, write.token) {
            if write.token <= prev {
                non_increasing += 1;
                report.samples.push(format!(
                    "store accepted token {} on res-{} after {prev}",
                    write.token, write.resource
                ));
            }
        }
        let granted = ops
            .get(&(write.client, write.gen, write.op))
            .and_then(|o| o.granted.as_ref())
            .and_then(|g| g.token);
        if granted != Some(write.token) {
            unknown += 1;
            report.samples.push(format!(
                "store accepted token {} from client {} gen {} op {}, whose grant was {granted:?}",
                write.token, write.client, write.gen, write.op
            ));
        }
    }

    // New grants (re-entries share their grant's token and are left out).
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops.values() {
        if let Some(Grant {
            token: Some(_),
            hold_count: 1,
            ..
        }) = &op.granted
        {
            by_res.entry(op.res).or_default().push(op);
        }
    }
    let mut reused = 0;
    let mut order = 0;
    let mut across_restart = 0;
    // Tokens come from one counter per prefix, so no two grants of any locks may share one
    // (a stronger check than per lock, which is what fencing needs).
    let mut seen: HashMap<u64, &Op> = HashMap::new();
    for grants in by_res.values_mut() {
        for op in grants.iter() {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            if let Some(other) = seen.insert(token, op) {
                reused += 1;
                report.samples.push(format!(
                    "token {token} granted twice: {} and {}",
                    other.describe(),
                    op.describe()
                ));
            }
        }
        // A grant whose acquire went out after another grant's reply came back ran later in
        // Redis, so its token must be higher.
        grants.sort_by_key(|o| o.granted.as_ref().map(|g| g.t));
        let mut prefix_max: Vec<(u64, usize)> = Vec::with_capacity(grants.len());
        for (i, op) in grants.iter().enumerate() {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            let best = match prefix_max.last() {
                Some(&(max, at)) if max >= token => (max, at),
                _ => (token, i),
            };
            prefix_max.push(best);
        }
        for op in grants.iter() {
            let token = op.granted.as_ref().and_then(|g| g.token).expect("filtered");
            let earlier =
                grants.partition_point(|o| o.granted.as_ref().map_or(0, |g| g.t) < op.begin);
            if earlier == 0 {
                continue;
            }
            let (max, at) = prefix_max[earlier - 1];
            if token <= max {
                let before = grants[at];
                let before_t = before.granted.as_ref().map_or(0, |g| g.t);
                if restart_within(before_t, op.begin) {
                    across_restart += 1;
                } else {
                    order += 1;
                }
                report.samples.push(format!(
                    "token {token} of {} is not above token {max} of {}, granted before it began",
                    op.describe(),
                    before.describe()
                ));
            }
        }
    }
    report.checks.push(CheckLine::must_be_zero(
        FENCE_NON_INCREASING,
        non_increasing,
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_UNKNOWN_TOKEN, unknown));
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_REUSED, reused));
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_ORDER, order));
    report
        .checks
        .push(CheckLine::must_be_zero(FENCE_RESTART, across_restart));
}

struct Belief<'a> {
    op: &'a Op,
    from: i64,
    to: i64,
}

fn exclusion_checks(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    last_restart_within: &dyn Fn(i64, i64) -> Option<i64>,
) {
    let mut by_res: BTreeMap<u32, Vec<Belief<'_>>> = BTreeMap::new();
    for op in ops.values() {
        if let Some((from, to)) = op.belief() {
            by_res
                .entry(op.res)
                .or_default()
                .push(Belief { op, from, to });
        }
    }
    let mut violations = 0;
    let mut two_tasks = 0;
    let mut data_loss = 0;
    for beliefs in by_res.values_mut() {
        beliefs.sort_by_key(|b| b.from);
        for (i, a) in beliefs.iter().enumerate() {
            // Sorted by start: `b` overlaps `a` when it starts before `a` ends (both ends are
            // instants at which the holder believed, so touching counts).
            for b in beliefs[i + 1..].iter().take_while(|b| b.from <= a.to) {
                let (oa, ob) = (
                    a.op.granted.as_ref().expect("belief needs a grant"),
                    b.op.granted.as_ref().expect("belief needs a grant"),
                );
                let overlap_end = a.to.min(b.to);
                // One owner id: a nested re-entry while one task runs both sections, two
                // critical sections at once when two tasks do.
                let one_owner = oa.owner == ob.owner;
                if one_owner && two_tasks_at(a.op, b.op, b.from, overlap_end).is_none() {
                    continue;
                }
                // Redis losing its data between the first acquire and the second grant lets
                // both in; the first holder cannot know until its next renewal, and believes
                // at most one lease past the loss (its deadline is a lease after the last
                // renewal it sent before). Believing longer than that is a violation.
                let why = match last_restart_within(a.op.begin, ob.t) {
                    Some(lost_by) if overlap_end <= lost_by + a.op.lease => {
                        data_loss += 1;
                        continue;
                    }
                    Some(_) => "believed past its lease after Redis lost its data: ",
                    None => "",
                };
                let what = if one_owner {
                    two_tasks += 1;
                    "two tasks under one owner id, "
                } else {
                    violations += 1;
                    ""
                };
                report.samples.push(format!(
                    "{why}{what}overlap of {} ms: {} believed [{}, {}], {} believed [{}, {}]",
                    (a.to.min(b.to) - b.from) / 1000,
                    a.op.describe(),
                    a.from,
                    a.to,
                    b.op.describe(),
                    b.from,
                    b.to
                ));
            }
        }
    }
    report
        .checks
        .push(CheckLine::must_be_zero(OVERLAP, violations));
    report
        .checks
        .push(CheckLine::must_be_zero(OVERLAP_TWO_TASKS, two_tasks));
    report.checks.push(CheckLine {
        name: OVERLAP_DATA_LOSS,
        count: data_loss,
        must_be_zero: false,
        note: "allowed: the holder cannot know before its next renewal".into(),
    });

    // Writes whose writer's belief is not known to cover the moment the store applied them
    // (it checked, then was paused or delayed) while another owner believed it held the lock.
    let mut late = 0;
    let mut late_paused = 0;
    let mut late_refused = 0;
    for op in ops.values() {
        let Some(grant) = &op.granted else { continue };
        for &(t, _, accepted) in &op.writes {
            if op.checks.iter().any(|&(c, held)| held && c >= t) {
                continue;
            }
            let others = by_res.get(&op.res).into_iter().flatten().any(|b| {
                b.from <= t
                    && t <= b.to
                    && b.op
                        .granted
                        .as_ref()
                        .is_some_and(|g| g.owner != grant.owner)
            });
            if !others {
                continue;
            }
            late += 1;
            if !accepted {
                late_refused += 1;
            }
            let since = op
                .checks
                .iter()
                .filter(|&&(c, held)| held && c < t)
                .map(|&(c, _)| c)
                .max()
                .unwrap_or(grant.t);
            let (client, gen, _) = op.key;
            if faults.iter().any(|f| {
                f.kind == FaultKind::ClientPause
                    && f.client == Some(client)
                    && f.gen == Some(gen)
                    && f.start <= t
                    && f.end >= since
            }) {
                late_paused += 1;
            }
        }
    }
    report.checks.push(CheckLine {
        name: LATE_WRITES,
        count: late,
        must_be_zero: false,
        note: format!(
            "allowed: {late_paused} paused between check and write (cannot know), {late_refused} refused by the fence"
        ),
    });
}

/// An instant in [from, to] at which `a` and `b` (holds of one owner id) ran their critical
/// sections in two different tasks, if there is one. Each op's task changes at most once (at
/// its hand-off), so the pair of tasks is constant between those instants: looking at the ends
/// and at the hand-offs inside [from, to] covers every stretch.
fn two_tasks_at(a: &Op, b: &Op, from: i64, to: i64) -> Option<i64> {
    let handoffs = [a.handoff, b.handoff].into_iter().flatten().map(|(t, _)| t);
    [from, to]
        .into_iter()
        .chain(handoffs.filter(|t| (from..=to).contains(t)))
        .find(|&t| a.task_at(t) != b.task_at(t))
}

/// A task holds one guard at a time, so a grant with a hold count above 1 re-entered a hold
/// that outlived its owner's guards. After a dropped guard that is the background release not
/// having run yet (a benign race); after anything else the hold was orphaned in Redis: an
/// acquire that got no reply and whose rollback did not run, or a release that got no reply.
/// Its owner's next `unlock()` then returns Ok yet leaves the lock held, for another lease, or
/// for as long as the owner keeps re-acquiring it. A re-entry of a hold that a hand-off section
/// (same owner id, another task) was still working under is not an orphan: it is counted by the
/// two-task rule when the sections overlap.
fn orphan_check(report: &mut Report, config: &RunConfig, ops: &BTreeMap<OpKey, Op>) {
    let mut by_owner: BTreeMap<(u32, u32, u32, u32), Vec<&Op>> = BTreeMap::new();
    for op in ops.values() {
        let (client, gen, _) = op.key;
        by_owner
            .entry((client, gen, op.task, op.res))
            .or_default()
            .push(op);
    }
    let (mut orphaned, mut racing_drop, mut handed_off) = (0, 0, 0);
    let (mut after_no_hold, mut after_release, mut after_unlock) = (0, 0, 0);
    for sequence in by_owner.values_mut() {
        sequence.sort_by_key(|o| o.begin);
        for (i, pair) in sequence.windows(2).enumerate() {
            let (previous, op) = (pair[0], pair[1]);
            let Some(grant) = op.granted.as_ref().filter(|g| g.hold_count > 1) else {
                continue;
            };
            let section_alive = |p: &&Op| {
                p.handoff.is_some()
                    && p.granted.is_some()
                    && p.released.as_ref().is_none_or(|(t, _, _)| *t >= grant.t)
            };
            if sequence[..=i].iter().any(section_alive) {
                handed_off += 1;
                continue;
            }
            match &previous.released {
                Some((_, ReleaseHow::Drop, _)) => {
                    racing_drop += 1;
                    continue;
                }
                Some((_, ReleaseHow::Unlock, outcome)) if outcome != "ok" => after_release += 1,
                Some(_) => after_unlock += 1,
                None => after_no_hold += 1,
            }
            orphaned += 1;
            report.samples.push(format!(
                "re-entered an orphaned hold (hold count {}): {}; the owner's previous op: {}",
                op.granted.as_ref().map_or(0, |g| g.hold_count),
                op.describe(),
                previous.describe()
            ));
        }
    }
    report.checks.push(CheckLine {
        name: ORPHANED,
        count: orphaned,
        must_be_zero: !config.tolerate_orphaned_reentry,
        note: format!(
            "{after_no_hold} after an op without a hold, {after_release} after an unanswered \
             release, {after_unlock} after a clean unlock (a retry within the call, or a chain); \
             not counted: {racing_drop} racing a dropped guard's background release, \
             {handed_off} re-entering a hold a hand-off section still used{}",
            if config.tolerate_orphaned_reentry {
                " (tolerated: known library bug)"
            } else {
                ""
            }
        ),
    });
}

fn liveness_check(
    report: &mut Report,
    config: &RunConfig,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    drained: &HashSet<(u32, u32)>,
) {
    let recovery = recovery_us(config);
    let mut windows: Vec<(i64, i64)> = faults.iter().map(|f| (f.start, f.end + recovery)).collect();
    windows.sort();
    let mut stuck = 0;
    let mut longest_unexplained = 0;
    for op in ops.values() {
        let (client, gen, _) = op.key;
        let end = match op.finished_at() {
            Some(end) => end,
            None if op.abandoned => {
                stuck += 1;
                report.samples.push(format!(
                    "still waiting at the drain deadline: {}",
                    op.describe()
                ));
                continue;
            }
            // Cut short by SIGKILL: nothing to say.
            None if !drained.contains(&(client, gen)) => continue,
            None => {
                stuck += 1;
                report.samples.push(format!(
                    "never finished, yet its client drained: {}",
                    op.describe()
                ));
                continue;
            }
        };
        // The longest stretch of this operation with no fault (or its recovery) around.
        let mut cursor = op.begin;
        let mut gap = 0;
        for &(s, e) in &windows {
            if e < cursor {
                continue;
            }
            if s > end {
                break;
            }
            gap = gap.max(s - cursor);
            cursor = cursor.max(e);
        }
        gap = gap.max(end - cursor);
        longest_unexplained = longest_unexplained.max(gap);
        if gap > STALL_BOUND_US {
            stuck += 1;
            report.samples.push(format!(
                "no progress for {} ms with no fault around: {}",
                gap / 1000,
                op.describe()
            ));
        }
    }
    report.checks.push(CheckLine {
        name: STUCK,
        count: stuck,
        must_be_zero: true,
        note: format!(
            "longest operation stretch without a fault nearby: {} ms (bound {} ms)",
            longest_unexplained / 1000,
            STALL_BOUND_US / 1000
        ),
    });
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\noperations")?;
        writeln!(
            f,
            "  {:<28} {:>8} {:>8} {:>12} {:>8}",
            "kind", "calls", "granted", "not granted", "errors"
        )?;
        for (name, row) in &self.operations {
            writeln!(
                f,
                "  {:<28} {:>8} {:>8} {:>12} {:>8}",
                name, row[0], row[1], row[2], row[3]
            )?;
        }
        for (name, value) in &self.other_stats {
            writeln!(f, "  {name}: {value}")?;
        }
        writeln!(f, "\nfaults injected")?;
        for (name, count) in &self.faults {
            writeln!(f, "  {name:<40} {count:>6}")?;
        }
        writeln!(
            f,
            "  {:<40} {:>6}",
            "total",
            self.faults.iter().map(|(_, c)| c).sum::<usize>()
        )?;
        writeln!(f, "\nchecks")?;
        for check in &self.checks {
            let verdict = match (check.must_be_zero, check.count) {
                (true, 0) => "ok",
                (true, _) => "VIOLATION",
                (false, _) => "counted",
            };
            writeln!(f, "  {:<72} {:>6}  {verdict}", check.name, check.count)?;
            if !check.note.is_empty() {
                writeln!(f, "      {}", check.note)?;
            }
        }
        if !self.samples.is_empty() {
            writeln!(f, "\nfindings (first 30)")?;
            for sample in self.samples.iter().take(30) {
                writeln!(f, "  {sample}")?;
            }
        }
        let violations = self.violations();
        if violations == 0 {
            writeln!(f, "\nresult: PASS (0 violations)")
        } else {
            writeln!(f, "\nresult: FAIL ({violations} violations)")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> RunConfig {
        RunConfig {
            duration: Duration::from_secs(10),
            clients: 2,
            seed: 1,
            tasks: 1,
            resources: 1,
            lease: Duration::from_secs(1),
            command_timeout: Duration::from_millis(500),
            ignore_lease: false,
            tolerate_orphaned_reentry: false,
        }
    }

    /// A hold of `owner` on res-0: begins at `begin`, granted at `granted`, believed until
    /// `held_until`, a false check at `lost` (if any), released at `released`.
    #[allow(clippy::too_many_arguments)] // reason: a test fixture that spells out one hold
    fn hold(
        op: u64,
        owner: &str,
        token: u64,
        begin: i64,
        granted: i64,
        held_until: i64,
        lost: Option<i64>,
        released: i64,
    ) -> Vec<Event> {
        let mut events = vec![
            Event::Begin {
                t: begin,
                op,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
            },
            Event::Granted {
                t: granted,
                op,
                owner: owner.into(),
                token: Some(token),
                hold_count: 1,
            },
            Event::Check {
                t: held_until,
                op,
                held: true,
                derived: false,
            },
        ];
        if let Some(t) = lost {
            events.push(Event::Check {
                t,
                op,
                held: false,
                derived: false,
            });
        }
        events.push(Event::Released {
            t: released,
            op,
            how: ReleaseHow::Unlock,
            outcome: "ok".into(),
        });
        events
    }

    fn history(client: u32, events: Vec<Event>) -> ClientHistory {
        let mut all = events;
        all.push(Event::Drained {
            t: 1_000_000_000,
            waiters: 0,
            channels: 0,
            holds: 0,
        });
        ClientHistory {
            client,
            gen: 0,
            events: all,
            torn_lines: 0,
        }
    }

    fn run(histories: &[ClientHistory], faults: &[Fault], accepted: &[Accepted]) -> Report {
        analyze(
            &config(),
            histories,
            faults,
            &Cleanup::default(),
            accepted,
            &[],
        )
    }

    #[test]
    fn disjoint_holds_pass() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 1100, 1500, None, 1600)),
        ];
        let report = run(&h, &[], &[]);
        assert!(report.passed(), "{report}");
    }

    #[test]
    fn overlapping_beliefs_are_a_violation() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP), 1, "{report}");
        assert!(!report.passed());
    }

    #[test]
    fn belief_ends_at_the_last_true_sample() {
        // a believed until 400, was told false at 900: b's hold from 600 does not overlap.
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 400, Some(900), 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        assert!(run(&h, &[], &[]).passed());
    }

    #[test]
    fn overlap_after_a_restart_is_counted_apart() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, hold(1, "b", 11, 500, 600, 700, None, 800)),
        ];
        let restart = Fault {
            kind: FaultKind::RedisRestart,
            client: None,
            gen: None,
            start: 300,
            end: 450,
            detail: String::new(),
        };
        let report = run(&h, std::slice::from_ref(&restart), &[]);
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(OVERLAP_DATA_LOSS), 1);
        assert!(report.passed());
        // Still believing more than a lease (1 s here) after the loss is not excused.
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 2_000_000, None, 2_000_100)),
            history(1, hold(1, "b", 11, 500, 600, 1_900_000, None, 1_900_100)),
        ];
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(OVERLAP), 1, "{report}");
    }

    #[test]
    fn same_owner_is_not_an_overlap() {
        let h = [history(
            0,
            [
                hold(1, "a", 10, 0, 100, 900, None, 1000),
                hold(2, "a", 10, 500, 600, 700, None, 800),
            ]
            .concat(),
        )];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP), 0);
    }

    #[test]
    fn tokens_must_follow_real_time() {
        let h = [
            history(0, hold(1, "a", 20, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FENCE_ORDER), 1, "{report}");
        // Concurrent acquires may be ordered either way.
        let h = [
            history(0, hold(1, "a", 20, 0, 450, 460, None, 470)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        assert_eq!(run(&h, &[], &[]).count(FENCE_ORDER), 0);
    }

    #[test]
    fn tokens_backwards_across_a_restart() {
        let h = [
            history(0, hold(1, "a", 20, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 15, 400, 500, 600, None, 700)),
        ];
        let restart = Fault {
            kind: FaultKind::RedisRestart,
            client: None,
            gen: None,
            start: 320,
            end: 350,
            detail: String::new(),
        };
        let report = run(&h, &[restart], &[]);
        assert_eq!(report.count(FENCE_RESTART), 1, "{report}");
        assert_eq!(report.count(FENCE_ORDER), 0);
    }

    #[test]
    fn store_log_checks() {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 200, None, 300)),
            history(1, hold(1, "b", 11, 400, 500, 600, None, 700)),
        ];
        let write = |client, token, t| Accepted {
            seq: t,
            resource: 0,
            token,
            client,
            gen: 0,
            op: 1,
            t,
        };
        assert!(run(&h, &[], &[write(0, 10, 150), write(1, 11, 550)]).passed());
        let report = run(&h, &[], &[write(1, 11, 150), write(0, 10, 550)]);
        assert_eq!(report.count(FENCE_NON_INCREASING), 1);
        let report = run(&h, &[], &[write(0, 12, 150)]);
        assert_eq!(report.count(FENCE_UNKNOWN_TOKEN), 1);
    }

    #[test]
    fn late_writes_are_counted_not_failed() {
        // a checked at 200, was paused, its write landed at 1500 during b's hold.
        let mut a = hold(1, "a", 10, 0, 100, 200, Some(1600), 1700);
        a.insert(
            3,
            Event::Write {
                t: 1500,
                op: 1,
                token: 10,
                accepted: false,
            },
        );
        let h = [
            history(0, a),
            history(1, hold(1, "b", 11, 1100, 1200, 1800, None, 1900)),
        ];
        let pause = Fault {
            kind: FaultKind::ClientPause,
            client: Some(0),
            gen: Some(0),
            start: 250,
            end: 1400,
            detail: String::new(),
        };
        let report = run(&h, &[pause], &[]);
        assert_eq!(report.count(LATE_WRITES), 1, "{report}");
        assert!(report.passed());
        let late = report
            .checks
            .iter()
            .find(|c| c.name == LATE_WRITES)
            .unwrap();
        assert!(late.note.contains("1 paused"), "{}", late.note);
        assert!(late.note.contains("1 refused"), "{}", late.note);
    }

    #[test]
    fn abandoned_and_stalled_waiters_fail() {
        let mut h = history(
            0,
            vec![Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
            }],
        );
        h.events.insert(
            1,
            Event::Abandoned {
                t: 40_000_000,
                op: 1,
            },
        );
        assert_eq!(run(&[h], &[], &[]).count(STUCK), 1);

        let slow = vec![
            Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::Lock,
                res: 0,
                lease_ms: None,
            },
            Event::NotGranted {
                t: STALL_BOUND_US + 30_000_000,
                op: 1,
            },
        ];
        let h = [history(0, slow.clone())];
        assert_eq!(run(&h, &[], &[]).count(STUCK), 1);
        // The same wait with faults all along is explained.
        let faults: Vec<Fault> = (0..10)
            .map(|i| Fault {
                kind: FaultKind::ProxyPartition,
                client: Some(0),
                gen: Some(0),
                start: i * 5_000_000,
                end: i * 5_000_000 + 1_000_000,
                detail: String::new(),
            })
            .collect();
        assert_eq!(run(&h, &faults, &[]).count(STUCK), 0);
    }

    #[test]
    fn reentering_an_orphaned_hold_is_a_violation() {
        let mut reentered = hold(2, "a", 10, 500, 600, 700, None, 800);
        if let Event::Granted { hold_count, .. } = &mut reentered[1] {
            *hold_count = 2;
        }
        let failed = vec![
            Event::Begin {
                t: 0,
                op: 1,
                task: 0,
                kind: Kind::TryLock,
                res: 0,
                lease_ms: None,
            },
            Event::Failed {
                t: 400,
                op: 1,
                error: "timeout: no reply".into(),
            },
        ];
        let h = [history(0, [failed, reentered.clone()].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(ORPHANED), 1, "{report}");
        let tolerant = RunConfig {
            tolerate_orphaned_reentry: true,
            ..config()
        };
        assert!(analyze(&tolerant, &h, &[], &Cleanup::default(), &[], &[]).passed());
        // After a dropped guard it is the background release racing: not counted.
        let mut dropped = hold(1, "a", 10, 0, 100, 200, None, 300);
        if let Some(Event::Released { how, .. }) = dropped.last_mut() {
            *how = ReleaseHow::Drop;
        }
        let h = [history(0, [dropped, reentered].concat())];
        assert_eq!(run(&h, &[], &[]).count(ORPHANED), 0);
    }

    fn set_hold_count(events: &mut [Event], count: u64) {
        for event in events {
            if let Event::Granted { hold_count, .. } = event {
                *hold_count = count;
            }
        }
    }

    #[test]
    fn two_tasks_of_one_owner_overlapping_fail() {
        // Op 1's guard goes to task 7 at 150; task 0 goes on and re-enters (op 2, hold count 2)
        // at 210 while task 7 still works under the hold (believed until 900).
        let mut handed = hold(1, "a", 10, 0, 100, 900, None, 1_000);
        handed.insert(
            2,
            Event::Handoff {
                t: 150,
                op: 1,
                to_task: 7,
            },
        );
        let mut reentered = hold(2, "a", 10, 200, 210, 700, None, 800);
        set_hold_count(&mut reentered, 2);
        let h = [history(0, [handed.clone(), reentered.clone()].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 1, "{report}");
        assert_eq!(report.count(OVERLAP), 0);
        assert_eq!(report.count(ORPHANED), 0, "a hand-off is no orphan");
        assert!(!report.passed());
        // Two task loops under one owner id overlap just the same.
        let mut other_task = hold(2, "a", 10, 200, 210, 700, None, 800);
        if let Event::Begin { task, .. } = &mut other_task[0] {
            *task = 1;
        }
        let h = [history(
            0,
            [hold(1, "a", 10, 0, 100, 900, None, 1_000), other_task].concat(),
        )];
        assert_eq!(run(&h, &[], &[]).count(OVERLAP_TWO_TASKS), 1);
    }

    #[test]
    fn nested_reentry_within_one_task_passes() {
        // Op 2 re-enters op 1's hold in the same task and is done (believed until 700) before
        // op 1 is handed off at 750: one task at a time ran the critical section.
        let mut outer = hold(1, "a", 10, 0, 100, 900, None, 1_000);
        outer.insert(
            2,
            Event::Handoff {
                t: 750,
                op: 1,
                to_task: 7,
            },
        );
        let mut inner = hold(2, "a", 10, 500, 600, 700, None, 720);
        set_hold_count(&mut inner, 2);
        let h = [history(0, [outer, inner].concat())];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(OVERLAP_TWO_TASKS), 0, "{report}");
        assert!(report.passed(), "{report}");
    }
}
