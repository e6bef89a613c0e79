//! # One name, one kind
//!
//! A name belongs to the kind that uses it: a lock (plain or fair: their hashes look alike,
//! and both are "lock" to the library), a read/write lock, a semaphore or a count-down latch.
//! An acquire of another kind on a name that holds one of these must be refused with
//! `LockError::WrongKind` (held as the name's kind, asked as its own), and write nothing. The
//! workload makes such foreign-kind attempts now and then (`worker::foreign_attempt`: one try
//! or a short bounded wait, from a fresh owner, of every kind against the names of every other
//! kind), most of them in the middle of a hold of the name's own kind, and the rules are:
//!
//! - [`FOREIGN_GRANTED`]: none was granted (a guard, a permit; on a latch's terms a
//!   `wait_for` that came back open);
//! - [`FOREIGN_NOT_REFUSED`]: none came back with anything but the refusal, naming the name's
//!   kind as `held_as` and its own as `asked_as`: not busy (`Ok(None)`, `false`), not another
//!   error (`WrongType`, a Redis error, `UpgradeRefused`).
//!   A `Timeout` or a `Connection` error is the fault's, not the library's answer, and is not
//!   judged;
//! - [`FOREIGN_CHANGED`]: none changed the other kind's state as far as the history shows: a
//!   semaphore's hash or a counting latch's never has a TTL (the client reads `PTTL` right
//!   after each attempt on such a name, [`Event::AfterForeign`](crate::history::Event)), and no
//!   call of a name's own kind was refused as `WrongKind` unless a foreign attempt that may
//!   have taken that name (granted, or an outcome unknown) was near. At the end, the cleanup
//!   rules look at what is left: a semaphore's hash keeps its number and only its own fields,
//!   with no TTL, and its counts add up ([`super::SEMAPHORE_LEFT`]); a latch's hash holds
//!   only its count, with no TTL ([`super::LATCH_LEFT`]).
//!
//! The first two judge only attempts made while the history proves the name's own kind there
//! all along ([`NativeThere`]): on a name that holds nothing the library cannot know whose
//! it is, and such an attempt is granted as any first use of a name is (those are left
//! unjudged, and count as holds the free-lock rule cannot see). The proof, from the start of
//! the attempt's call to its end:
//! - a lock's or a read/write lock's name: a hold of its own kind believed from before the
//!   call began to after it returned (a belief's lease is in Redis, as the overlap rules
//!   rest on), and no loss of the name's data since that hold's acquire began;
//! - a semaphore's: its number was set before the call began (`try_set_permits` returned
//!   true: the hash is there from then on, with no TTL, until Redis loses its data), and no
//!   loss of its data since;
//! - a latch's: a look that found it counting (a count-down that left a count above zero, a
//!   read of the count above zero, a `try_set_count` that found it counting or set it) ended
//!   before the call began, another began after it returned, and no `try_set_count` that may
//!   have set a new count (one that returned true, failed or never returned) was under way
//!   in between: a latch that opened in between would have been counting again at the second
//!   look only by such a set. The second look is one that found the count already there: a
//!   `try_set_count` that set it found the latch open, so it proves the latch counting only
//!   from its end on. No loss of its data in between either.

use super::*;

pub const FOREIGN_GRANTED: &str =
    "kinds: acquires of another kind granted on a name its own kind held";
pub const FOREIGN_NOT_REFUSED: &str =
    "kinds: such acquires not refused as WrongKind (busy, or another error)";
pub const FOREIGN_CHANGED: &str =
    "kinds: another kind's state changed (a TTL put on it, its own calls refused)";

/// The family of a name's own kind, as `LockError::WrongKind` names it.
pub(super) fn family(ty: LockType) -> &'static str {
    match ty {
        LockType::Plain | LockType::Fair => "lock",
        LockType::ReadWrite => "read/write lock",
        LockType::Semaphore => "semaphore",
        LockType::Latch => "count-down latch",
    }
}

/// What the history shows of the names' own kinds, to prove one there over an interval.
pub(super) struct NativeThere<'a> {
    /// Beliefs of holds (locks, read/write locks, permits), by resource.
    beliefs: BTreeMap<u32, Vec<(&'a Op, i64, i64)>>,
    /// When each semaphore's number was set.
    permits_set_at: &'a [(u32, i64)],
    /// Each latch's looks that found it counting, [sent, returned], and the `try_set_count`
    /// calls that may have set a count, [began, returned or for ever].
    counting: BTreeMap<u32, Vec<Look>>,
    sets: BTreeMap<u32, Vec<(OpKey, i64, i64)>>,
    losses: &'a [&'a Fault],
}

/// A call that found a latch counting: when it was sent and returned, and whether the count it
/// found was one it set itself (a `try_set_count` that returned true found the latch open).
#[derive(Clone, Copy)]
struct Look {
    key: OpKey,
    sent: i64,
    returned: i64,
    set_it: bool,
}

impl<'a> NativeThere<'a> {
    pub(super) fn new(
        ops: &'a BTreeMap<OpKey, Op>,
        latch_ops: &'a BTreeMap<OpKey, Op>,
        permits_set_at: &'a [(u32, i64)],
        losses: &'a [&'a Fault],
    ) -> NativeThere<'a> {
        let mut beliefs: BTreeMap<u32, Vec<(&Op, i64, i64)>> = BTreeMap::new();
        for op in ops.values() {
            if let Some((from, to)) = op.belief() {
                beliefs.entry(op.res).or_default().push((op, from, to));
            }
        }
        let mut counting: BTreeMap<u32, Vec<Look>> = BTreeMap::new();
        let mut sets: BTreeMap<u32, Vec<(OpKey, i64, i64)>> = BTreeMap::new();
        for op in latch_ops.values() {
            let value = op.latch_value;
            let looked = match op.latch {
                Some(LatchCall::CountDown | LatchCall::Count { .. }) => {
                    value.is_some_and(|v| v > 0)
                }
                Some(LatchCall::Set { .. }) => value.is_some(),
                _ => false,
            };
            if let (true, Some(end)) = (looked, op.ended) {
                counting.entry(op.res).or_default().push(Look {
                    key: op.key,
                    sent: op.begin,
                    returned: end,
                    set_it: matches!(op.latch, Some(LatchCall::Set { .. })) && value == Some(1),
                });
            }
            if matches!(op.latch, Some(LatchCall::Set { .. })) && value != Some(0) {
                let end = op.ended.unwrap_or(i64::MAX);
                sets.entry(op.res)
                    .or_default()
                    .push((op.key, op.begin, end));
            }
        }
        NativeThere {
            beliefs,
            permits_set_at,
            counting,
            sets,
            losses,
        }
    }

    fn lost(&self, res: u32, from: i64, to: i64) -> bool {
        self.losses
            .iter()
            .any(|f| f.lost_data_of(res) && f.start <= to && f.end >= from)
    }

    /// How the history proves resource `res` (of kind `ty`) held by its own kind from `from`
    /// to `to`, if it does.
    pub(super) fn proof(&self, res: u32, ty: LockType, from: i64, to: i64) -> Option<&'static str> {
        let held = self
            .beliefs
            .get(&res)
            .into_iter()
            .flatten()
            .any(|(op, b_from, b_to)| {
                *b_from <= from && *b_to >= to && !self.lost(res, op.begin, to)
            });
        if held {
            return Some(if ty == LockType::Semaphore {
                "a permit held"
            } else {
                "a hold of its own kind"
            });
        }
        match ty {
            LockType::Semaphore => self
                .permits_set_at
                .iter()
                .any(|&(r, t)| r == res && t <= from && !self.lost(res, t, to))
                .then_some("its number set"),
            LockType::Latch => {
                let looks = self.counting.get(&res)?;
                let sets = self.sets.get(&res).map_or(&[][..], Vec::as_slice);
                let before = looks.iter().filter(|a| a.returned <= from);
                let after: Vec<_> = looks.iter().filter(|b| b.sent >= to && !b.set_it).collect();
                // A set that may have run between the two looks (other than either of them).
                let set_between = |a: &Look, b: &Look| {
                    sets.iter().any(|(key, s, e)| {
                        *key != a.key && *key != b.key && *s < b.returned && *e > a.sent
                    })
                };
                before
                    .flat_map(|a| after.iter().map(move |b| (a, *b)))
                    .any(|(a, b)| !set_between(a, b) && !self.lost(res, a.sent, b.returned))
                    .then_some("the latch counting before and after, no count set between")
            }
            _ => None,
        }
    }
}

/// The foreign attempts' windows in which they may have taken a lock's name (granted, or an
/// outcome unknown: not refused), by resource: holds the free-lock rule must count as hidden
/// (from the call's start until a lease after it returned and was let go).
pub(super) fn foreign_holds(
    foreign: &BTreeMap<OpKey, Op>,
    config: &RunConfig,
) -> BTreeMap<u32, Vec<(i64, i64)>> {
    let linger = config.lease.max(MAX_EXPLICIT_LEASE).as_micros() as i64 + LATE_DELIVERY_US;
    let mut holds: BTreeMap<u32, Vec<(i64, i64)>> = BTreeMap::new();
    for op in foreign.values() {
        // (A latch's wait writes nothing, whatever it answers.)
        let wait = matches!(op.latch, Some(LatchCall::Wait { .. }));
        let settled = op.ended.is_some() && op.failed.is_none() && !granted(op);
        if refused(op) || wait || settled {
            continue;
        }
        let end = op
            .released
            .as_ref()
            .map(|(t, _, _)| *t)
            .or(op.ended)
            .map_or(i64::MAX - linger, |t| t);
        holds
            .entry(op.res)
            .or_default()
            .push((op.begin, end + linger));
    }
    holds
}

/// Refused as it must be: `WrongKind`.
fn refused(op: &Op) -> bool {
    op.failed
        .as_deref()
        .is_some_and(|e| e.starts_with("wrong_kind"))
}

/// A `WrongKind` refusal's kinds, as the worker records them (`[held_as=..., asked_as=...]`).
fn refusal_kinds(error: &str) -> Option<(&str, &str)> {
    let kinds = error.rsplit_once("[held_as=")?.1.strip_suffix(']')?;
    kinds.split_once(", asked_as=")
}

/// A transient error: the fault's answer, not the library's.
fn transient(op: &Op) -> bool {
    op.failed
        .as_deref()
        .is_some_and(|e| e.starts_with("timeout") || e.starts_with("connection"))
}

/// Whether a foreign attempt was granted: a guard or a permit, or a latch call that set a
/// count or came back open.
fn granted(op: &Op) -> bool {
    op.granted.is_some() || (op.latch.is_some() && op.latch_value.is_some_and(|v| v > 0))
}

/// The three rules of the module's docs, over the foreign attempts `foreign`; `ops` and
/// `latch_ops` are the calls of the names' own kinds.
#[allow(clippy::too_many_arguments)] // reason: one rule over every part of the history
pub(super) fn foreign_kind_check(
    report: &mut Report,
    config: &RunConfig,
    foreign: &BTreeMap<OpKey, Op>,
    ops: &BTreeMap<OpKey, Op>,
    latch_ops: &BTreeMap<OpKey, Op>,
    there: &NativeThere<'_>,
) {
    let (mut granted_count, mut not_refused, mut changed) = (0, 0, 0);
    let (mut judged, mut right, mut faulted) = (0, 0, 0);
    let mut by_proof: BTreeMap<&str, usize> = BTreeMap::new();
    for op in foreign.values() {
        let asked = op.foreign.expect("foreign ops only");
        let what = format!(
            "{} asked as a {} ({}) on {}, a {}'s name",
            op.describe(),
            asked.kind_name(),
            match asked {
                AskedAs::Latch => "wait_for()",
                _ => op.kind.name(),
            },
            op.lock,
            family(op.ty),
        );
        // A TTL on a semaphore's or a latch's hash: wrong whoever put it there.
        if let Some((sent, _, pttl)) = op.after_foreign.filter(|(_, _, pttl)| *pttl >= 0) {
            changed += 1;
            report.samples.push(format!(
                "{FOREIGN_CHANGED}: {what}: the hash had PTTL {pttl} ms right after (read at \
                 {sent})"
            ));
        }
        let Some(end) = op.ended else { continue };
        let Some(proof) = there.proof(op.res, op.ty, op.begin, end) else {
            continue;
        };
        if transient(op) {
            faulted += 1;
            continue;
        }
        judged += 1;
        *by_proof.entry(proof).or_default() += 1;
        if granted(op) {
            granted_count += 1;
            report.samples.push(format!(
                "{FOREIGN_GRANTED}: {what}, granted at {end} while the history shows {proof} \
                 from before {} to after it",
                op.begin
            ));
        } else if refused(op) {
            // The refusal names the name's kind and the kind asked for.
            let error = op.failed.as_deref().unwrap_or_default();
            let expected = (family(op.ty), asked.kind_name());
            if refusal_kinds(error) == Some(expected) {
                right += 1;
            } else {
                not_refused += 1;
                report.samples.push(format!(
                    "{FOREIGN_NOT_REFUSED}: {what}, refused as {error}, not as a {} asked as a {}",
                    expected.0, expected.1
                ));
            }
        } else {
            not_refused += 1;
            report.samples.push(format!(
                "{FOREIGN_NOT_REFUSED}: {what}, came back {} at {end} while the history shows \
                 {proof} all along",
                op.failed.as_deref().unwrap_or("without a hold (busy)")
            ));
        }
    }
    // A call of a name's own kind refused as another kind: something of another kind was on
    // its name, which only a foreign attempt that took it explains.
    let holds = foreign_holds(foreign, config);
    for op in ops.values().chain(latch_ops.values()) {
        let Some(error) = op.failed.as_deref().filter(|e| e.starts_with("wrong_kind")) else {
            continue;
        };
        let end = op.ended.unwrap_or(op.begin);
        let near = holds
            .get(&op.res)
            .is_some_and(|w| w.iter().any(|&(from, to)| from <= end && to >= op.begin));
        if !near {
            changed += 1;
            report.samples.push(format!(
                "{FOREIGN_CHANGED}: {} on its own kind's name was refused ({error}) with no \
                 foreign attempt near that may have taken the name",
                op.describe()
            ));
        }
    }
    let list = by_proof
        .iter()
        .map(|(k, v)| format!("{v} by {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    report.other_stats.push((
        "foreign-kind attempts".into(),
        format!(
            "{} calls, {judged} judged ({list}), {right} of them refused as WrongKind; not \
             judged: {faulted} with a timeout or connection error, {} with no proof of the \
             name's own kind there all along",
            foreign.len(),
            foreign.len() - judged - faulted,
        ),
    ));
    report
        .checks
        .push(CheckLine::must_be_zero(FOREIGN_GRANTED, granted_count));
    report
        .checks
        .push(CheckLine::must_be_zero(FOREIGN_NOT_REFUSED, not_refused));
    report
        .checks
        .push(CheckLine::must_be_zero(FOREIGN_CHANGED, changed));
}

#[cfg(test)]
pub(in crate::checker) mod tests {
    use super::super::tests::{fault, history, hold, run, sem, SEM};
    use super::*;

    /// The latch of the tests' config.
    pub(in crate::checker) const LATCH: u32 = 4;

    /// A call of the latch `res` (or, with `foreign`, a foreign attempt asked as a latch):
    /// begins at `begin`, returns `value` at `end`.
    pub(in crate::checker) fn latch_call(
        op: u64,
        res: u32,
        call: LatchCall,
        begin: i64,
        end: i64,
        value: u64,
    ) -> Vec<Event> {
        vec![
            Event::Begin {
                t: begin,
                op,
                task: 0,
                kind: Kind::TryLock,
                res,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: None,
                latch: Some(call),
                wait_ms: None,
            },
            Event::LatchReturned { t: end, op, value },
        ]
    }

    /// A foreign attempt on `res` asked as `asked` from `begin`, with `outcome` at its end.
    fn attempt(op: u64, res: u32, asked: AskedAs, begin: i64, outcome: Event) -> Vec<Event> {
        vec![
            Event::Begin {
                t: begin,
                op,
                task: 0,
                kind: Kind::TryLock,
                res,
                lease_ms: None,
                side: None,
                permits: None,
                under: None,
                foreign: Some(asked),
                latch: None,
                wait_ms: None,
            },
            outcome,
        ]
    }

    fn granted(op: u64, t: i64) -> Event {
        Event::Granted {
            t,
            op,
            owner: "f".into(),
            token: Some(99),
            hold_count: 1,
        }
    }

    fn failed(op: u64, t: i64, error: &str) -> Event {
        Event::Failed {
            t,
            op,
            error: error.into(),
        }
    }

    /// a holds res-0 from 100 µs (believed to 900); another client asks for its read side
    /// from `begin` to `begin + 100` with `outcome`.
    fn read_on_a_lock(begin: i64, outcome: impl Fn(i64) -> Event) -> Report {
        let h = [
            history(0, hold(1, "a", 10, 0, 100, 900, None, 1000)),
            history(1, attempt(1, 0, AskedAs::Read, begin, outcome(begin + 100))),
        ];
        run(&h, &[], &[])
    }

    #[test]
    fn a_foreign_acquire_on_a_held_name_must_be_refused() {
        let report = read_on_a_lock(200, |t| granted(1, t));
        assert_eq!(report.count(FOREIGN_GRANTED), 1, "{report}");
        assert!(!report.passed());
        let report = read_on_a_lock(200, |t| Event::NotGranted { t, op: 1 });
        assert_eq!(report.count(FOREIGN_NOT_REFUSED), 1, "{report}");
        let report = read_on_a_lock(200, |t| failed(1, t, "wrong_type: key holds another"));
        assert_eq!(report.count(FOREIGN_NOT_REFUSED), 1, "{report}");
        // The refusal passes; a timeout is the fault's answer.
        let refusal = "wrong_kind: \"res-0\" is a lock, not a read/write lock: nothing was \
                       changed [held_as=lock, asked_as=read/write lock]";
        let refused = read_on_a_lock(200, |t| failed(1, t, refusal));
        assert!(refused.passed(), "{refused}");
        // A refusal that names the wrong kinds is not the refusal.
        let wrong = "wrong_kind: ... [held_as=semaphore, asked_as=read/write lock]";
        let report = read_on_a_lock(200, |t| failed(1, t, wrong));
        assert_eq!(report.count(FOREIGN_NOT_REFUSED), 1, "{report}");
        assert!(read_on_a_lock(200, |t| failed(1, t, "timeout: no answer")).passed());
        // After the hold's last belief the name may be free: a grant is any first use's.
        let report = read_on_a_lock(850, |t| granted(1, t));
        assert_eq!(report.count(FOREIGN_GRANTED), 0, "{report}");
        assert!(report.passed(), "{report}");
    }

    #[test]
    fn a_semaphore_is_there_from_its_number_on() {
        let set = Event::PermitsSet {
            t: 50,
            res: SEM,
            op: None,
        };
        let lock_on_it = |outcome: Event, after: Option<i64>| {
            let mut events = vec![set.clone()];
            events.extend(attempt(1, SEM, AskedAs::FairLock, 200, outcome));
            if let Some(pttl) = after {
                events.push(Event::AfterForeign {
                    t: 310,
                    op: 1,
                    answered: 320,
                    pttl,
                });
            }
            vec![history(0, events)]
        };
        let h = lock_on_it(Event::NotGranted { t: 300, op: 1 }, Some(-1));
        assert_eq!(run(&h, &[], &[]).count(FOREIGN_NOT_REFUSED), 1);
        // A Redis restart in between: the number may be gone, and the name free.
        let restart = fault(FaultKind::RedisRestart, None, 100, 150);
        assert!(run(&h, &[restart], &[]).passed());
        // A TTL on the semaphore's hash right after: a change, refused or not.
        let refusal = "wrong_kind: ... [held_as=semaphore, asked_as=lock]";
        let h = lock_on_it(failed(1, 300, refusal), Some(900));
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FOREIGN_CHANGED), 1, "{report}");
        let h = lock_on_it(failed(1, 300, refusal), Some(-1));
        assert!(run(&h, &[], &[]).passed());
        // A permit held all along proves it too.
        let h = [
            history(0, sem(1, hold(1, "a", 10, 0, 100, 900, None, 1000))),
            history(1, attempt(1, SEM, AskedAs::Write, 200, granted(1, 300))),
        ];
        assert_eq!(run(&h, &[], &[]).count(FOREIGN_GRANTED), 1);
    }

    #[test]
    fn a_latch_is_there_between_two_looks_with_no_count_set_between() {
        let looks = [
            latch_call(1, LATCH, LatchCall::CountDown, 100, 110, 1),
            latch_call(2, LATCH, LatchCall::Count { of: 1 }, 400, 410, 2),
        ]
        .concat();
        let foreign = attempt(
            1,
            LATCH,
            AskedAs::Semaphore,
            200,
            Event::NotGranted { t: 300, op: 1 },
        );
        let h = [history(0, looks.clone()), history(1, foreign.clone())];
        assert_eq!(run(&h, &[], &[]).count(FOREIGN_NOT_REFUSED), 1);
        // A count set between the looks: the latch may have opened and counted again.
        let set = latch_call(1, LATCH, LatchCall::Set { count: 2 }, 250, 260, 1);
        let h = [
            history(0, looks.clone()),
            history(1, foreign.clone()),
            history(2, set),
        ];
        assert!(run(&h, &[], &[]).passed());
    }

    /// The latch opened during the attempt, the name was free and taken, and the next look
    /// was the `try_set_count` that set a new count: that look found the latch open, so it
    /// proves nothing about the time before it.
    #[test]
    fn a_count_set_by_the_second_look_does_not_prove_the_latch_counting_before_it() {
        let before = latch_call(1, LATCH, LatchCall::CountDown, 100, 110, 1);
        let lock_on_it = attempt(1, LATCH, AskedAs::Lock, 200, granted(1, 300));
        let set_after = latch_call(2, LATCH, LatchCall::Set { count: 2 }, 400, 410, 1);
        let h = [
            history(0, [before.clone(), set_after].concat()),
            history(1, lock_on_it.clone()),
        ];
        let report = run(&h, &[], &[]);
        assert_eq!(report.count(FOREIGN_GRANTED), 0, "{report}");
        // A try_set_count that found the latch counting (it returned false) does prove it.
        let found = latch_call(2, LATCH, LatchCall::Set { count: 2 }, 400, 410, 0);
        let h = [history(0, [before, found].concat()), history(1, lock_on_it)];
        assert_eq!(run(&h, &[], &[]).count(FOREIGN_GRANTED), 1);
    }

    #[test]
    fn a_call_of_its_own_kind_refused_as_another_kind_is_a_change() {
        let mut own = hold(1, "a", 10, 0, 100, 900, None, 1000);
        own.truncate(1);
        own.push(failed(1, 150, "wrong_kind: held as a read/write lock"));
        let report = run(&[history(0, own.clone())], &[], &[]);
        assert_eq!(report.count(FOREIGN_CHANGED), 1, "{report}");
        // Unless a foreign attempt that took the name was near (the name was free for it).
        let took = attempt(1, 0, AskedAs::Write, 50, granted(1, 60));
        let report = run(&[history(0, own), history(1, took)], &[], &[]);
        assert_eq!(report.count(FOREIGN_CHANGED), 0, "{report}");
    }
}
