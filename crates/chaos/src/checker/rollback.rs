//! # A lost grant must not cost a waiter its place
//!
//! A waiter of a fair or read/write lock whose grant ran in Redis but whose reply never came
//! back in time (a command timeout under a slow link) has its grant rolled back in the
//! background. It was a live waiter all along, first in line: the rollback must leave it its
//! turn, not hand the lock to the waiter behind it. The polls that watch a waiter's place
//! in line also read whether its owner holds the lock in Redis, and that grant's token
//! ([`Event::HeldInRedis`](crate::history::Event)); so [`LOST_GRANT`] counts a waiting
//! acquire `w` passed by another owner's grant `b` when:
//! - `w`'s owner had nothing at the lock before the call (its floor was clean) and no other
//!   op of that owner was under way on the lock meanwhile (a joined op, a hand-off section):
//!   the hold seen in Redis was `w`'s own call's grant;
//! - that grant, token `t`, is not what `w`'s call returned (its reply was lost: the call went
//!   on waiting);
//! - `b` is a new grant with a token above `t`, so it ran after `w`'s grant (tokens rise
//!   strictly per name), recorded while `w`'s call was still under way and before `w`'s own
//!   deadline (its begin + its wait: the client's deadline is no earlier), so `w` was still
//!   waiting, entitled to the lock, when `b` got it;
//! - on a read/write lock, not both readers (readers ahead of a writer may share).
//!
//! Excused (counted apart): a fault on `w`'s client or on every client that can stop its
//! entry's renewals or its rollback (all but added latency and killed subscriber
//! connections), in effect from the last poll before the grant until `b`'s grant (before it,
//! the waiter's entry was in line with its arrival all along: the grant took it out); a loss
//! of the lock's data meanwhile;
//! and `b`'s grant recorded a lease or more after the last poll that did not find `w`'s hold
//! (the grant ran after that poll, and nothing renews a grant its client never saw: it may
//! have ended by its own lease, as a crashed holder's does), unless the polls saw the hold
//! gone before that lease could have run out.
//! Added latency is the fault that loses the reply, and takes nothing else from the waiter:
//! its commands all reach Redis, late.

use super::*;

pub const LOST_GRANT: &str =
    "fair: waiters passed after their own grant was rolled back (a reply lost)";

/// [`LOST_GRANT`] over the fair and read/write locks' waiting ops.
pub(super) fn lost_grant_check(
    report: &mut Report,
    ops: &BTreeMap<OpKey, Op>,
    faults: &[Fault],
    losses: &[&Fault],
) {
    let mut by_res: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops
        .values()
        .filter(|o| o.fair || o.ty == LockType::ReadWrite)
    {
        by_res.entry(op.res).or_default().push(op);
    }
    let (mut passed, mut excused, mut seen) = (0, 0, 0);
    for lock in by_res.values() {
        for w in lock.iter().filter(|w| w.kind.waits()) {
            if w.held_in_redis.is_empty() || !w.floor.is_some_and(|f| f.clean()) {
                continue;
            }
            let Some(w_end) = w.call_end() else { continue };
            let busy = lock.iter().any(|o| {
                o.key != w.key
                    && o.owner_key() == w.owner_key()
                    && o.begin <= w_end
                    && o.over_at().is_none_or(|end| end >= w.begin)
            });
            if busy {
                continue;
            }
            let returned = w.granted.as_ref().and_then(|g| g.token);
            let deadline = w.wait.map_or(i64::MAX, |wait| w.begin + wait);
            for &(since, sent, token, gone) in &w.held_in_redis {
                if returned == Some(token) {
                    continue;
                }
                seen += 1;
                let b = lock
                    .iter()
                    .filter(|b| b.owner_key() != w.owner_key())
                    .filter(|b| !(w.side == Some(Side::Read) && b.side == Some(Side::Read)))
                    .filter_map(|b| Some((b, b.granted.as_ref()?)))
                    .filter(|(_, g)| g.hold_count == 1 && g.token.is_some_and(|t| t > token))
                    .filter(|(_, g)| g.t < w_end && g.t <= deadline)
                    .min_by_key(|(_, g)| g.t);
                let Some((b, grant)) = b else { continue };
                let (client, gen, _) = w.key;
                // Only from the grant on: until then the waiter's entry was in line with its
                // arrival (the grant took it out), so no fault before had cost it its place.
                let fault = faults.iter().any(|f| {
                    !matches!(
                        f.kind,
                        FaultKind::ProxyLatency | FaultKind::KillPubsubConnections
                    ) && hits(f, client, gen)
                        && f.start - LATE_DELIVERY_US <= grant.t
                        && f.end + LATE_DELIVERY_US >= since
                });
                let lost = losses
                    .iter()
                    .any(|f| f.lost_data_of(w.res) && f.start <= grant.t && f.end >= w.begin);
                // The grant ran after `since`; nothing renews a grant its client never saw, so
                // it may have ended by its lease before `b`'s, unless the polls saw it gone
                // before its lease could have run out (then something ended it: a rollback).
                let lease_end = since + w.lease;
                let lapsed = grant.t >= lease_end && gone.is_none_or(|g| g >= lease_end);
                if fault || lost || lapsed {
                    excused += 1;
                    continue;
                }
                passed += 1;
                report.samples.push(format!(
                    "{LOST_GRANT}: {} held the lock in Redis with token {token} (seen at {sent}) \
                     while its call was still waiting, then {} was granted (token {:?}) at {} \
                     while it still waited (its call returned at {w_end})",
                    w.describe(),
                    b.describe(),
                    grant.token,
                    grant.t
                ));
                break;
            }
        }
    }
    report.checks.push(CheckLine {
        name: LOST_GRANT,
        count: passed,
        must_be_zero: true,
        note: format!(
            "{seen} grants of a waiter seen in Redis that its call did not return; {excused} \
             passed with a fault that can cost a waiter its place (allowed)"
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::{clean_floor, fault, history, on, run, waiter, FAIR};
    use super::*;

    /// w waits on the fair lock from 0; its grant (token 20) is seen in Redis at 100 ms, after
    /// a poll at 99 ms that found none, and seen gone by 500 ms, but its call goes on and
    /// returns token `w_token` at 900 ms; b, which began at 50 ms, is granted token 21 at
    /// `b_granted`.
    fn rolled_back(w_token: u64, b_granted: i64) -> Vec<ClientHistory> {
        rolled_back_gone(w_token, b_granted, Some(500_000))
    }

    /// The same, the grant seen gone at `gone_at`.
    fn rolled_back_gone(w_token: u64, b_granted: i64, gone_at: Option<i64>) -> Vec<ClientHistory> {
        let mut w = on(FAIR, waiter(1, "w", w_token, 0, 900_000));
        w.insert(1, clean_floor(1, -100));
        w.insert(
            2,
            Event::HeldInRedis {
                t: 100_000,
                op: 1,
                answered: 100_200,
                since: 99_000,
                token: 20,
                gone: gone_at,
            },
        );
        let mut b = on(FAIR, waiter(1, "b", 21, 50_000, b_granted));
        b.insert(1, clean_floor(1, 49_900));
        vec![history(0, w), history(1, b)]
    }

    #[test]
    fn a_waiter_passed_after_its_grant_was_rolled_back_fails() {
        let report = run(&rolled_back(22, 600_000), &[], &[]);
        assert_eq!(report.count(LOST_GRANT), 1, "{report}");
        assert!(!report.passed());
        // The slow link that lost the reply excuses nothing.
        let slow = fault(FaultKind::ProxyLatency, Some(0), 50_000, 800_000);
        assert_eq!(
            run(&rolled_back(22, 600_000), &[slow], &[]).count(LOST_GRANT),
            1
        );
        // Nor does a fault that was over before the grant: the entry was in line until then.
        let before = fault(
            FaultKind::KillCommandConnections,
            None,
            -1_500_000,
            -1_400_000,
        );
        assert_eq!(
            run(&rolled_back(22, 600_000), &[before], &[]).count(LOST_GRANT),
            1
        );
        // A partition of w's client may have let its entry lapse.
        let cut = fault(FaultKind::ProxyPartition, Some(0), 150_000, 500_000);
        let report = run(&rolled_back(22, 600_000), &[cut], &[]);
        assert_eq!(report.count(LOST_GRANT), 0, "{report}");
        // w's call returned the grant seen: no reply was lost.
        assert_eq!(
            run(&rolled_back(20, 950_000), &[], &[]).count(LOST_GRANT),
            0
        );
        // b granted after w's call returned: not while w waited.
        assert_eq!(
            run(&rolled_back(22, 950_000), &[], &[]).count(LOST_GRANT),
            0
        );
        // b granted a lease (1 s) after the grant could have run: it may have lapsed...
        let late = |gone| {
            let mut h = rolled_back_gone(22, 1_200_000, gone);
            if let Some(Event::Granted { t, .. }) = h[0].events.get_mut(3) {
                *t = 1_300_000; // w still waiting
            }
            run(&h, &[], &[]).count(LOST_GRANT)
        };
        assert_eq!(late(None), 0);
        // ... unless the polls saw it gone before its lease could have run out.
        assert_eq!(late(Some(600_000)), 1);
    }
}
