//! The checker of a RedLock run (`run --redlock N`): reads the clients' `rl-events-*` files,
//! the injected faults (`rl-faults.jsonl`), the store's RedLock writes and what was left on the
//! servers (`rl-cleanup.json`), and counts violations.
//!
//! The facts its soundness rests on are the one-server checker's (`checker.rs`): one clock for
//! every process (`CLOCK_MONOTONIC`); a belief sample's time read *before* `is_held()`, which
//! only ever goes from true to false (a quorum guard's `is_held()` counts its members still
//! certainly valid, each of which only goes from true to false, and compares the round's
//! validity with the clock), so a true sample at `t` proves the holder believed from its grant
//! through `t`; the store's time read under its write lock; an acquire's commands went out
//! after its `Begin` and were answered before its `Granted` was taken. The history can only
//! under-report beliefs, so every counted overlap happened.
//!
//! # Quorum exclusion ([`Q_OVERLAP`])
//! Two ops of different owners on one RedLock whose beliefs (grant to last true sample)
//! overlap. Why it cannot happen without data loss: at an instant both believed, each had a
//! quorum of members still certainly valid (renewed or within its lease, by its own client's
//! conservative deadline), and two quorums of N share a server `s`: both owners' keys would be
//! on `s` at once, and a server's lock key has one owner. Unless `s` lost the earlier key: a
//! server killed and restarted without persistence forgets the holds it granted, and then a
//! second quorum can form with it (the Redlock paper asks for persistence or a restart delayed
//! by a lease for this). So an overlap where some server that both grants list as a member
//! lost its data between the earlier call's start and the later grant is counted apart
//! ([`Q_OVERLAP_DATA_LOSS`], shown, not a violation); any other is a violation.
//!
//! # Vector fencing
//! The store ([`Store::write_quorum`]) keeps the merged latest token per RedLock and accepts a
//! write unless its token is lower on a server both name. [`Q_FENCE_STORE`] checks what it
//! accepted, pairwise: no accepted write's token is older (`is_older_than`) than a token it
//! accepted before. [`Q_FENCE_UNKNOWN`]: every accepted token is one a grant was handed (and
//! the writer's own). [`Q_FENCE_ORDER`]: a grant whose call began after another grant of the
//! lock was returned is newer on every server the two share (they share one: two quorums): on
//! a shared server its try came after the other's grant there, and a server's fencing token
//! rises with every new grant, across restarts too (its floor is the server's clock). So no
//! later grant is older, and a late write of the earlier grant is refused once the later one
//! wrote. [`Q_FENCE_REUSED`]: no server handed one token to two grants.
//!
//! # No grant without a quorum ([`Q_NO_QUORUM_GRANT`])
//! While a majority of the servers is paused or partitioned from every client (from the
//! instant the last of them went down until the first came back), nothing sent in that time
//! is answered by a quorum before it ends: an acquire that began and returned a grant within
//! it is a violation. (Such calls must fail with `QuorumUnreachable` or come back empty.)
//!
//! # Cleanup
//! As the one-server checker's, on every server: no client crashed; once the clients drained,
//! nothing registered in them (waiters, subscriptions, holds) and no release channel still
//! subscribed; no key without a TTL; no key (but the fencing counters, kept by design) once
//! every lease could have run out.
//!
//! # Liveness, mild ([`Q_STALL`], [`Q_ABANDONED`])
//! A call that was under way for [`STALL_BOUND_US`] in a stretch with no fault in effect and
//! none healed in the last [`RECOVERY_US`] (every server up and reachable, no client paused or
//! killed) is a waiter that did not progress; contention alone (holds of 2.5 s at most) does
//! not explain that. And no waiter may still be waiting at the stop (30 s after the last fault
//! healed).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::checker::{CheckLine, Report};
use crate::history::{Kind, ReleaseHow};
use crate::redlock::{read_histories, QCleanup, QEvent, QFault, QFaultKind};
use crate::run::RunConfig;
use crate::store::{quorum_token, QuorumAccepted, Store};

pub const Q_OVERLAP: &str = "redlock exclusion: two owners believed they held one RedLock at once";
pub const Q_OVERLAP_DATA_LOSS: &str =
    "redlock exclusion: overlaps after a shared member server lost its data";
pub const Q_FENCE_STORE: &str =
    "redlock fence: store accepted a write older than one it accepted before";
pub const Q_FENCE_UNKNOWN: &str = "redlock fence: accepted writes whose token no grant handed out";
pub const Q_FENCE_ORDER: &str =
    "redlock fence: later grant not newer on a shared server (real-time order)";
pub const Q_FENCE_REUSED: &str = "redlock fence: one server's token handed to two grants";
pub const Q_SERVER_ORDER: &str = "redlock: server orders (distinct) other than the names give";
pub const Q_NO_QUORUM_GRANT: &str = "redlock: grants while a majority of servers was down";
pub const Q_CRASHED: &str = "cleanup: clients that crashed or did not drain";
pub const Q_DRAINED_LEFT: &str = "cleanup: waiters, subscriptions or holds left in drained clients";
pub const Q_CHANNELS_LEFT: &str = "cleanup: release channels still subscribed (all servers)";
pub const Q_KEYS_NO_TTL: &str = "cleanup: keys without a TTL (all servers)";
pub const Q_KEYS_LEFT: &str = "cleanup: keys left once every lease ran out (all servers)";
pub const Q_POLLING: &str =
    "liveness: waiters polling (server script calls per call and server above the bound)";
pub const Q_STALL: &str = "liveness: calls under way 10 s with every server healthy, no fault";
pub const Q_ABANDONED: &str = "liveness: waiters still waiting at the stop";

/// Script calls per call and server above which the waiters poll (see the check).
pub const POLLING_BOUND: f64 = 25.0;

/// How long a call may be under way with no fault in effect nor recently healed.
pub const STALL_BOUND_US: i64 = 10_000_000;
/// How long a fault's effects may last after it healed: a paused or partitioned holder's
/// members live out their lease (1.5 s at most), a reconnect backs off up to 2 s, a waiter
/// that could not reach a quorum backs off up to 1 s.
pub const RECOVERY_US: i64 = 5_000_000;

#[derive(Clone, Debug)]
struct Grant {
    t: i64,
    tokens: Vec<Option<u64>>,
    members: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
struct Op {
    client: u32,
    gen: u32,
    op: u64,
    task: u32,
    kind: Option<Kind>,
    res: u32,
    begin: i64,
    /// When the call returned (or was recorded abandoned).
    end: Option<i64>,
    granted: Option<Grant>,
    not_granted: bool,
    failed: Option<(bool, String)>,
    last_held: Option<i64>,
    lost: Option<i64>,
    write: Option<(i64, bool)>,
    released: Option<(ReleaseHow, String)>,
    abandoned: bool,
}

impl Op {
    fn who(&self) -> String {
        format!(
            "c{}g{} op {} (task {})",
            self.client, self.gen, self.op, self.task
        )
    }
    fn owner(&self) -> (u32, u32, u32) {
        (self.client, self.gen, self.task)
    }
}

pub fn check(dir: &Path) -> anyhow::Result<Report> {
    let config: RunConfig = serde_json::from_str(
        &std::fs::read_to_string(dir.join("run.json")).context("reading run.json")?,
    )?;
    let histories = read_histories(dir)?;
    let faults_path = dir.join("rl-faults.jsonl");
    let faults: Vec<QFault> = if faults_path.exists() {
        std::fs::read_to_string(&faults_path)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let cleanup: QCleanup = serde_json::from_str(
        &std::fs::read_to_string(dir.join("rl-cleanup.json")).context("reading rl-cleanup.json")?,
    )?;
    let store = Store::open(&dir.join("store.db"))?;
    let accepted = store.quorum_accepted()?;
    let refused = store.quorum_refused()?;

    let mut ops: BTreeMap<(u32, u32, u64), Op> = BTreeMap::new();
    let mut drained_left = Vec::new();
    let mut torn = 0;
    let mut orders: Vec<Vec<u32>> = Vec::new();
    for h in &histories {
        torn += h.torn_lines;
        for event in &h.events {
            let key = |op: u64| (h.client, h.gen, op);
            match event {
                QEvent::Begin {
                    t,
                    op,
                    task,
                    kind,
                    res,
                    ..
                } => {
                    ops.insert(
                        key(*op),
                        Op {
                            client: h.client,
                            gen: h.gen,
                            op: *op,
                            task: *task,
                            kind: Some(*kind),
                            res: *res,
                            begin: *t,
                            ..Op::default()
                        },
                    );
                }
                QEvent::Granted {
                    t,
                    op,
                    tokens,
                    members,
                } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.end = Some(*t);
                        o.granted = Some(Grant {
                            t: *t,
                            tokens: tokens.clone(),
                            members: members.clone(),
                        });
                    }
                }
                QEvent::NotGranted { t, op } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.end = Some(*t);
                        o.not_granted = true;
                    }
                }
                QEvent::Failed {
                    t,
                    op,
                    unreachable,
                    error,
                } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.end = Some(*t);
                        o.failed = Some((*unreachable, error.clone()));
                    }
                }
                QEvent::Check { t, op, held } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        if *held {
                            o.last_held = Some(o.last_held.map_or(*t, |l| l.max(*t)));
                        }
                    }
                }
                QEvent::Lost { t, op } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.lost = Some(*t);
                    }
                }
                QEvent::Write { t, op, accepted } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.write = Some((*t, *accepted));
                    }
                }
                QEvent::Released {
                    op, how, outcome, ..
                } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.released = Some((*how, outcome.clone()));
                    }
                }
                QEvent::Abandoned { t, op } => {
                    if let Some(o) = ops.get_mut(&key(*op)) {
                        o.abandoned = true;
                        o.end.get_or_insert(*t);
                    }
                }
                QEvent::Drained {
                    waiters,
                    channels,
                    holds,
                    ..
                } => {
                    if waiters + channels + holds > 0 {
                        drained_left.push(format!(
                            "c{}g{}: {waiters} waiters, {channels} channels, {holds} holds left",
                            h.client, h.gen
                        ));
                    }
                }
                QEvent::Start { canonical, .. } => {
                    if !canonical.is_empty() && !orders.contains(canonical) {
                        orders.push(canonical.clone());
                    }
                }
            }
        }
    }
    let ops: Vec<Op> = ops.into_values().collect();
    let mut report = Report {
        operations: Vec::new(),
        other_stats: Vec::new(),
        faults: Vec::new(),
        checks: Vec::new(),
        samples: Vec::new(),
    };

    // Operations.
    let mut rows: BTreeMap<Kind, [usize; 4]> = BTreeMap::new();
    for o in &ops {
        let Some(kind) = o.kind else { continue };
        let row = rows.entry(kind).or_default();
        row[0] += 1;
        if o.granted.is_some() {
            row[1] += 1;
        } else if o.not_granted {
            row[2] += 1;
        } else if o.failed.is_some() {
            row[3] += 1;
        }
    }
    let mut total = [0; 4];
    for (kind, row) in &rows {
        report.operations.push((kind.name().to_string(), *row));
        for i in 0..4 {
            total[i] += row[i];
        }
    }
    report.operations.push(("total".into(), total));
    let unreachable = ops
        .iter()
        .filter(|o| matches!(o.failed, Some((true, _))))
        .count();
    let other_errors: BTreeMap<String, usize> = ops
        .iter()
        .filter_map(|o| match &o.failed {
            Some((false, e)) => Some(e.split(':').next().unwrap_or_default().to_string()),
            _ => None,
        })
        .fold(BTreeMap::new(), |mut m, e| {
            *m.entry(e).or_default() += 1;
            m
        });
    let stat = |report: &mut Report, name: &str, value: String| {
        report.other_stats.push((name.to_string(), value));
    };
    stat(
        &mut report,
        "servers",
        format!("{} (quorum {})", config.redlock, config.redlock / 2 + 1),
    );
    stat(
        &mut report,
        "QuorumUnreachable errors",
        unreachable.to_string(),
    );
    stat(&mut report, "other errors", format!("{other_errors:?}"));
    let lost = ops.iter().filter(|o| o.lost.is_some()).count();
    stat(
        &mut report,
        "holds lost (lost() completed)",
        lost.to_string(),
    );
    let unlock_failed = ops
        .iter()
        .filter(|o| matches!(&o.released, Some((ReleaseHow::Unlock, out)) if out != "ok"))
        .count();
    stat(
        &mut report,
        "unlocks that failed",
        unlock_failed.to_string(),
    );
    stat(
        &mut report,
        "store writes",
        format!("{} accepted, {refused} refused (stale)", accepted.len()),
    );
    let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
    for o in &ops {
        if let Some(g) = &o.granted {
            *sizes.entry(g.members.len()).or_default() += 1;
        }
    }
    stat(
        &mut report,
        "grants by number of members",
        format!("{sizes:?}"),
    );
    // Each process reaches the servers at addresses of its own (its proxies) and names them
    // by the orchestrator's numbers (RedLock::named): every process must number them alike,
    // the orchestrator's way, or its tokens would name other servers than another's.
    let misordered = orders
        .iter()
        .filter(|order| order.iter().enumerate().any(|(i, s)| *s as usize != i))
        .count();
    report
        .checks
        .push(CheckLine::must_be_zero(Q_SERVER_ORDER, misordered));
    if torn > 0 {
        stat(
            &mut report,
            "torn history lines (SIGKILL)",
            torn.to_string(),
        );
    }

    // Faults.
    let mut by_kind: BTreeMap<QFaultKind, usize> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(f.kind).or_default() += 1;
    }
    for kind in QFaultKind::ALL {
        report
            .faults
            .push((kind.name(), by_kind.get(&kind).copied().unwrap_or(0)));
    }
    let data_lost: Vec<(u32, i64)> = faults.iter().flat_map(|f| f.data_lost.clone()).collect();

    // (1) Quorum exclusion.
    let mut samples = Vec::new();
    let (overlaps, excused) = exclusion(&ops, &data_lost, &mut samples);
    report
        .checks
        .push(CheckLine::must_be_zero(Q_OVERLAP, overlaps));
    report.checks.push(CheckLine {
        name: Q_OVERLAP_DATA_LOSS,
        count: excused,
        must_be_zero: false,
        note: "the Redlock algorithm's own limit: a restarted server forgets its holds \
               (persistence or a restart delayed by a lease closes it); the fence must refuse \
               the stale writes"
            .into(),
    });

    // (2) Vector fencing.
    let (store_older, unknown) = store_fence(&ops, &accepted, &mut samples);
    report
        .checks
        .push(CheckLine::must_be_zero(Q_FENCE_STORE, store_older));
    report
        .checks
        .push(CheckLine::must_be_zero(Q_FENCE_UNKNOWN, unknown));
    let (order, reused) = grant_order(&ops, &mut samples);
    report
        .checks
        .push(CheckLine::must_be_zero(Q_FENCE_ORDER, order));
    report
        .checks
        .push(CheckLine::must_be_zero(Q_FENCE_REUSED, reused));

    // No grant without a quorum.
    let mut windows = 0;
    let mut in_window = [0usize; 3];
    let mut no_quorum_grants = 0;
    for f in &faults {
        let Some((from, until)) = f.no_quorum else {
            continue;
        };
        windows += 1;
        for o in &ops {
            let Some(end) = o.end else { continue };
            if o.begin < from || end > until {
                continue;
            }
            if o.granted.is_some() {
                no_quorum_grants += 1;
                samples.push(format!(
                    "{Q_NO_QUORUM_GRANT}: {} granted in [{}, {}] while servers {:?} were down \
                     ({from}..{until})",
                    o.who(),
                    o.begin,
                    end,
                    f.servers
                ));
            } else if matches!(o.failed, Some((true, _))) {
                in_window[0] += 1;
            } else if o.not_granted {
                in_window[1] += 1;
            } else {
                in_window[2] += 1;
            }
        }
    }
    report
        .checks
        .push(CheckLine::must_be_zero(Q_NO_QUORUM_GRANT, no_quorum_grants));
    stat(
        &mut report,
        "calls within a majority outage",
        format!(
            "{} outages: {} QuorumUnreachable, {} not granted (wait ran out), {} other errors",
            windows, in_window[0], in_window[1], in_window[2]
        ),
    );

    // (3) Cleanup.
    report
        .checks
        .push(CheckLine::must_be_zero(Q_CRASHED, cleanup.crashed.len()));
    report
        .checks
        .push(CheckLine::must_be_zero(Q_DRAINED_LEFT, drained_left.len()));
    report.checks.push(CheckLine::must_be_zero(
        Q_CHANNELS_LEFT,
        cleanup.channels_left.len(),
    ));
    report.checks.push(CheckLine::must_be_zero(
        Q_KEYS_NO_TTL,
        cleanup.keys_without_ttl.len(),
    ));
    report.checks.push(CheckLine::must_be_zero(
        Q_KEYS_LEFT,
        cleanup.keys_left.len(),
    ));
    for line in cleanup
        .crashed
        .iter()
        .chain(&drained_left)
        .chain(&cleanup.channels_left)
        .chain(&cleanup.keys_without_ttl)
        .chain(&cleanup.keys_left)
    {
        samples.push(format!("cleanup: {line}"));
    }
    stat(
        &mut report,
        "keys at exit",
        format!(
            "{} (fencing counters kept: {}), all gone after {} ms",
            cleanup.keys_at_exit.len(),
            cleanup.fence_keys,
            cleanup.expiry_wait_ms
        ),
    );

    // (4) Liveness.
    // No polling: a waiter tries again on a release message, when a busy server's lease could
    // end, after a split vote's random pause, or with backoff while no quorum answers; each is
    // a handful of rounds per call. A waiter that polls (retries every round trip while the
    // lock is held) makes hundreds of rounds per call. Every round is one script call on each
    // server; renewals add a few per held member and lease. The bound is loose on purpose: it
    // separates the two classes, not two good implementations. Counted on the servers
    // (restarts reset their counts, so the figure is a lower bound).
    let script_calls: u64 = cleanup.server_script_calls.iter().sum();
    let per_call = script_calls as f64 / (total[0].max(1) as f64 * f64::from(config.redlock));
    stat(
        &mut report,
        "server script calls per call and server",
        format!("{per_call:.1} (bound {POLLING_BOUND})"),
    );
    report.checks.push(CheckLine::must_be_zero(
        Q_POLLING,
        usize::from(per_call > POLLING_BOUND),
    ));
    let (stalls, longest) = stalls(&ops, &faults, &mut samples);
    report.checks.push(CheckLine::must_be_zero(Q_STALL, stalls));
    let abandoned: Vec<&Op> = ops.iter().filter(|o| o.abandoned).collect();
    for o in &abandoned {
        samples.push(format!("{Q_ABANDONED}: {} began at {}", o.who(), o.begin));
    }
    report
        .checks
        .push(CheckLine::must_be_zero(Q_ABANDONED, abandoned.len()));
    let longest_call = ops
        .iter()
        .filter_map(|o| Some(o.end? - o.begin))
        .max()
        .unwrap_or(0);
    stat(
        &mut report,
        "longest call; longest stretch of one with no fault near",
        format!("{} ms; {} ms", longest_call / 1000, longest / 1000),
    );

    report.samples = samples;
    Ok(report)
}

/// A belief: the op's grant through its last true `is_held()` sample.
fn beliefs(ops: &[Op]) -> Vec<(&Op, i64, i64)> {
    let mut out: Vec<(&Op, i64, i64)> = ops
        .iter()
        .filter_map(|o| {
            let g = o.granted.as_ref()?;
            let last = o.last_held?;
            (last > g.t).then_some((o, g.t, last))
        })
        .collect();
    out.sort_by_key(|(o, start, _)| (o.res, *start));
    out
}

/// Overlapping beliefs of different owners on one RedLock: (violations, excused by a shared
/// member server's data loss).
fn exclusion(ops: &[Op], data_lost: &[(u32, i64)], samples: &mut Vec<String>) -> (usize, usize) {
    let beliefs = beliefs(ops);
    let (mut overlaps, mut excused) = (0, 0);
    for (i, (a, a_start, a_end)) in beliefs.iter().enumerate() {
        for (b, b_start, b_end) in &beliefs[i + 1..] {
            if b.res != a.res || b_start >= a_end {
                break;
            }
            if a.owner() == b.owner() {
                continue;
            }
            let (ga, gb) = (a.granted.as_ref().unwrap(), b.granted.as_ref().unwrap());
            let from = a.begin.min(b.begin);
            let until = ga.t.max(gb.t);
            let loss = data_lost.iter().find(|(s, t)| {
                ga.members.contains(s) && gb.members.contains(s) && *t >= from && *t <= until
            });
            let mut line = format!(
                "rl-{}: {} believed [{a_start}, {a_end}] members {:?} tokens {}; {} believed \
                 [{b_start}, {b_end}] members {:?} tokens {}; overlap {} ms",
                a.res,
                a.who(),
                ga.members,
                tokens_text(&ga.tokens),
                b.who(),
                gb.members,
                tokens_text(&gb.tokens),
                ((*a_end).min(*b_end) - b_start) / 1000
            );
            match loss {
                Some((s, t)) => {
                    excused += 1;
                    let _ = write!(line, " (server {s} lost its data at {t})");
                    samples.push(format!("{Q_OVERLAP_DATA_LOSS}: {line}"));
                }
                None => {
                    overlaps += 1;
                    samples.push(format!("{Q_OVERLAP}: {line}"));
                }
            }
        }
    }
    (overlaps, excused)
}

fn tokens_text(tokens: &[Option<u64>]) -> String {
    let parts: Vec<String> = tokens
        .iter()
        .map(|t| t.map_or("-".to_string(), |t| t.to_string()))
        .collect();
    format!("[{}]", parts.join(" "))
}

/// The store's accepted writes, pairwise per RedLock: (a write older than an earlier accepted
/// one, an accepted token that is not its writer's grant's).
fn store_fence(
    ops: &[Op],
    accepted: &[QuorumAccepted],
    samples: &mut Vec<String>,
) -> (usize, usize) {
    let grants: HashMap<(u32, u32, u64), &Grant> = ops
        .iter()
        .filter_map(|o| Some(((o.client, o.gen, o.op), o.granted.as_ref()?)))
        .collect();
    let mut unknown = 0;
    for w in accepted {
        match grants.get(&(w.client, w.gen, w.op)) {
            Some(g) if g.tokens == w.tokens => {}
            // A writer SIGKILLed before its Granted line was written: its token is unknown to
            // the history, but the store still names the op; only a mismatch is counted.
            None => {}
            Some(g) => {
                unknown += 1;
                samples.push(format!(
                    "{Q_FENCE_UNKNOWN}: c{}g{} op {} wrote {} but was granted {}",
                    w.client,
                    w.gen,
                    w.op,
                    tokens_text(&w.tokens),
                    tokens_text(&g.tokens)
                ));
            }
        }
    }
    let mut older = 0;
    let mut by_res: BTreeMap<u32, Vec<&QuorumAccepted>> = BTreeMap::new();
    for w in accepted {
        by_res.entry(w.resource).or_default().push(w);
    }
    for writes in by_res.values() {
        for (j, later) in writes.iter().enumerate() {
            let token = quorum_token(&later.tokens);
            if let Some(earlier) = writes[..j]
                .iter()
                .find(|e| token.is_older_than(&quorum_token(&e.tokens)))
            {
                older += 1;
                samples.push(format!(
                    "{Q_FENCE_STORE}: rl-{}: c{}g{} op {} {} accepted at {} after c{}g{} op {} \
                     {} at {}",
                    later.resource,
                    later.client,
                    later.gen,
                    later.op,
                    tokens_text(&later.tokens),
                    later.t,
                    earlier.client,
                    earlier.gen,
                    earlier.op,
                    tokens_text(&earlier.tokens),
                    earlier.t
                ));
            }
        }
    }
    (older, unknown)
}

/// Grants in real-time order: (a grant that began after another's was returned and is not
/// above it on some server both name, a server token handed to two grants).
fn grant_order(ops: &[Op], samples: &mut Vec<String>) -> (usize, usize) {
    let mut grants: Vec<&Op> = ops.iter().filter(|o| o.granted.is_some()).collect();
    grants.sort_by_key(|o| (o.res, o.granted.as_ref().unwrap().t));
    let (mut order, mut reused) = (0, 0);
    for (i, a) in grants.iter().enumerate() {
        let ga = a.granted.as_ref().unwrap();
        for b in &grants[i + 1..] {
            if b.res != a.res {
                break;
            }
            let gb = b.granted.as_ref().unwrap();
            let shared: Vec<usize> = (0..ga.tokens.len().min(gb.tokens.len()))
                .filter(|&s| ga.tokens[s].is_some() && gb.tokens[s].is_some())
                .collect();
            let same = shared.iter().find(|&&s| ga.tokens[s] == gb.tokens[s]);
            if let Some(&s) = same {
                reused += 1;
                samples.push(format!(
                    "{Q_FENCE_REUSED}: rl-{}: server {s} token {} to {} (granted {}) and {} \
                     (began {}, granted {})",
                    a.res,
                    ga.tokens[s].unwrap(),
                    a.who(),
                    ga.t,
                    b.who(),
                    b.begin,
                    gb.t
                ));
                continue;
            }
            if b.begin <= ga.t {
                continue; // concurrent calls: no order to judge
            }
            let bad = shared.iter().find(|&&s| gb.tokens[s] <= ga.tokens[s]);
            if shared.is_empty() || bad.is_some() {
                order += 1;
                samples.push(format!(
                    "{Q_FENCE_ORDER}: rl-{}: {} granted {} at {}; {} began {} and got {}",
                    a.res,
                    a.who(),
                    tokens_text(&ga.tokens),
                    ga.t,
                    b.who(),
                    b.begin,
                    tokens_text(&gb.tokens)
                ));
            }
        }
    }
    (order, reused)
}

/// Calls under way through a stretch of [`STALL_BOUND_US`] with no fault in effect nor healed
/// within [`RECOVERY_US`]: (how many, the longest such stretch of any call).
fn stalls(ops: &[Op], faults: &[QFault], samples: &mut Vec<String>) -> (usize, i64) {
    let mut shadows: Vec<(i64, i64)> = faults
        .iter()
        .map(|f| (f.start, f.end + RECOVERY_US))
        .collect();
    shadows.sort_unstable();
    let (mut count, mut longest) = (0, 0);
    for o in ops {
        let Some(end) = o.end else { continue };
        // The longest part of [begin, end] outside every shadow.
        let mut cursor = o.begin;
        let mut free = 0;
        for &(s, e) in &shadows {
            if e <= cursor {
                continue;
            }
            if s >= end {
                break;
            }
            free = free.max(s - cursor);
            cursor = cursor.max(e);
        }
        free = free.max(end - cursor);
        longest = longest.max(free);
        if free >= STALL_BOUND_US {
            count += 1;
            samples.push(format!(
                "{Q_STALL}: {} {:?} on rl-{} under way [{}, {end}], {} ms of it with no fault",
                o.who(),
                o.kind.map(Kind::name),
                o.res,
                o.begin,
                free / 1000
            ));
        }
    }
    (count, longest)
}
