//! # Count-down latches
//!
//! The workload plays rounds on each latch (`worker::latch_op`): a party sets a count (2 or
//! 3) when the latch is open, parties of several clients count down, parties of several
//! clients wait (`wait_for`, up to 4 s), and the party whose count-down opened the latch
//! often sets the next round's count at once. The docs promise that every waiter goes when
//! the count reaches zero, so ([`LATCH_MISSED`]): a wait that returned `false` (its timeout)
//! although the latch opened while it waited, with time left to see it, is a violation.
//!
//! What proves a wait was waiting when the latch opened. Each waiting party reads the count
//! itself [`LATCH_READ_AFTER`](crate::worker::LATCH_READ_AFTER) after its wait began (`LatchCall::Count`), beside the wait. By
//! then the wait has looked at the latch at least once: its first look is the first thing
//! the call does, one round trip, well within 200 ms ([`LOOKED_WITHIN_US`]) away from
//! faults (the assumption the free-lock rule makes of a reply too). Then:
//! - the read found the count at 0: the latch was open after the wait's first look, and the
//!   wait must go, whatever it saw first;
//! - the read found it above 0, and a later call shows the latch open after the read ran: a
//!   call that began after the read returned and found it open (a `try_set_count` that set a
//!   count, a read of 0, a count-down that returned 0: the latch was open right after it
//!   ran). The latch opened between the two, while the wait was waiting.
//!
//! Either way the opening came by the end of the call that showed it. A wait is counted when
//! that end is at least [`SEE_OPENING_US`] before its own deadline (its begin + its timeout:
//! the client's deadline is no earlier), so that the opening message and the look after it
//! had time. A fault on the waiter's client, or on every client, from the wait's begin to its
//! end excuses it (counted apart): a paused or cut-off waiter, a lost message or a slow look
//! break the assumptions above, and a Redis restart opens every latch at once. Waits that
//! failed, or whose read failed, are not judged.

use super::*;

pub const LATCH_MISSED: &str =
    "latch: waits that came back false though the latch opened while they waited";

/// A wait has looked at the latch once within this long of its begin, away from faults.
pub const LOOKED_WITHIN_US: i64 = 200_000;
/// A wait sees an opening within this long, away from faults (the message, one look).
pub const SEE_OPENING_US: i64 = 200_000;

/// [`LATCH_MISSED`] over the latch calls of the names' own kind.
pub(super) fn latch_check(report: &mut Report, latch_ops: &BTreeMap<OpKey, Op>, faults: &[Fault]) {
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in latch_ops.values() {
        by_res.entry(op.res).or_default().push(op);
    }
    let (mut missed, mut excused, mut judged, mut opened) = (0, 0, 0, 0);
    let (mut rounds, mut openings) = (0, 0);
    for calls in by_res.values() {
        rounds += calls
            .iter()
            .filter(|o| matches!(o.latch, Some(LatchCall::Set { .. })) && o.latch_value == Some(1))
            .count();
        openings += calls
            .iter()
            .filter(|o| o.latch == Some(LatchCall::CountDown) && o.latch_value == Some(0))
            .count();
        for wait in calls {
            let Some(LatchCall::Wait { timeout_ms }) = wait.latch else {
                continue;
            };
            let Some(outcome) = wait.latch_value else {
                continue;
            };
            let (client, gen, number) = wait.key;
            let Some(read) = latch_ops.get(&read_of(calls, (client, gen, number))) else {
                continue;
            };
            let (Some(count), Some(read_end)) = (read.latch_value, read.ended) else {
                continue;
            };
            if read.begin < wait.begin + LOOKED_WITHIN_US {
                continue;
            }
            let open_by = if count == 0 {
                Some((
                    read_end,
                    format!("its own read of the count found 0 at {read_end}"),
                ))
            } else {
                calls
                    .iter()
                    .filter(|o| o.begin > read_end && shows_open(o))
                    .filter_map(|o| Some((o.ended?, o)))
                    .min_by_key(|(end, _)| *end)
                    .map(|(end, o)| {
                        (
                            end,
                            format!(
                                "its read found {count} at {read_end}, then {} showed it open by \
                                 {end}",
                                o.describe()
                            ),
                        )
                    })
            };
            let Some((open_by, how)) = open_by else {
                continue;
            };
            let deadline = wait.begin + timeout_ms as i64 * 1000;
            if open_by + SEE_OPENING_US > deadline {
                continue;
            }
            judged += 1;
            if outcome == 1 {
                opened += 1;
                continue;
            }
            let end = wait.ended.unwrap_or(deadline);
            if faults
                .iter()
                .any(|f| hits(f, client, gen) && f.start <= end && f.end >= wait.begin)
            {
                excused += 1;
                continue;
            }
            missed += 1;
            report.samples.push(format!(
                "{LATCH_MISSED}: {} waiting from {} for {timeout_ms} ms came back false at {end}: \
                 {how}",
                wait.describe(),
                wait.begin
            ));
        }
    }
    report.other_stats.push((
        "latch calls".into(),
        format!(
            "{} calls; {rounds} counts set, {openings} count-downs that returned 0; {judged} \
             waits judged (the latch opened while they waited), {opened} of them came back open",
            latch_ops.len()
        ),
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(LATCH_MISSED, missed));
    report.checks.push(CheckLine {
        name: "latch: such waits with a fault on the waiter's client (allowed)",
        count: excused,
        must_be_zero: false,
        note: String::new(),
    });
}

/// The op of the read of the count made beside the wait `wait` (same client process).
fn read_of(calls: &[&Op], wait: OpKey) -> OpKey {
    let (client, gen, number) = wait;
    calls
        .iter()
        .find(|o| {
            let (c, g, _) = o.key;
            c == client && g == gen && o.latch == Some(LatchCall::Count { of: number })
        })
        .map_or((u32::MAX, 0, 0), |o| o.key)
}

/// A call that found the latch open when it ran: a `try_set_count` that set a count (open just
/// before it), a read of 0, a count-down that returned 0 (open just after it).
fn shows_open(op: &Op) -> bool {
    match op.latch {
        Some(LatchCall::Set { .. }) => op.latch_value == Some(1),
        Some(LatchCall::Count { .. } | LatchCall::CountDown) => op.latch_value == Some(0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::foreign::tests::{latch_call, LATCH};
    use super::super::tests::{fault, history, run};
    use super::*;

    /// A wait from 0 for 2 s that came back `outcome` at `end`, its read of the count at
    /// 300 ms finding `count`; and, from another client, `then`.
    fn wait(outcome: u64, end: i64, count: u64, then: Vec<Event>) -> Vec<ClientHistory> {
        let mut w = latch_call(
            1,
            LATCH,
            LatchCall::Wait { timeout_ms: 2000 },
            0,
            end,
            outcome,
        );
        w.extend(latch_call(
            2,
            LATCH,
            LatchCall::Count { of: 1 },
            300_000,
            301_000,
            count,
        ));
        vec![history(0, w), history(1, then)]
    }

    #[test]
    fn a_wait_that_misses_the_opening_fails() {
        // The opener counted down to 0 at 500 ms and set the next round at once: the wait
        // sat through it and came back false at its timeout.
        let opened = [
            latch_call(1, LATCH, LatchCall::CountDown, 500_000, 501_000, 0),
            latch_call(2, LATCH, LatchCall::Set { count: 2 }, 501_500, 502_000, 1),
        ]
        .concat();
        let report = run(&wait(0, 2_000_100, 1, opened.clone()), &[], &[]);
        assert_eq!(report.count(LATCH_MISSED), 1, "{report}");
        assert!(!report.passed());
        // Come back open: passes.
        assert!(run(&wait(1, 600_000, 1, opened.clone()), &[], &[]).passed());
        // A fault on the waiter's client excuses it.
        let cut = fault(FaultKind::ProxyPartition, Some(0), 400_000, 450_000);
        assert!(run(&wait(0, 2_000_100, 1, opened.clone()), &[cut], &[]).passed());
        // The opening too close to the wait's deadline is not judged.
        let late = latch_call(1, LATCH, LatchCall::CountDown, 1_900_000, 1_901_000, 0);
        assert!(run(&wait(0, 2_000_100, 1, late), &[], &[]).passed());
        // Nothing shows the latch open after the read: not judged.
        let counting = latch_call(1, LATCH, LatchCall::CountDown, 500_000, 501_000, 1);
        assert!(run(&wait(0, 2_000_100, 1, counting), &[], &[]).passed());
        // Its own read found it open.
        let report = run(&wait(0, 2_000_100, 0, Vec::new()), &[], &[]);
        assert_eq!(report.count(LATCH_MISSED), 1, "{report}");
    }
}
