//! Counterexamples the model finds on the shipped code, pinned so that they stay visible: when
//! the shipped code changes so that one is gone, its test here fails, and the bound belongs in
//! `tests/shipped.rs` or `tests/fair.rs` (as "holds") instead. `docs/model.md` ("Findings")
//! reads each trace.

mod common;

use common::{fair, finds, holds, plain};
use leasehold_model::properties::names;
use leasehold_model::{Config, Variant};

/// A waiter that gives up while a release grants it the lock, when it was the last in line:
/// the release's hand-on took its entry out, which emptied the line, so both line keys are gone
/// when its `line/leave.lua` runs. The script first shipped with a check ("keys of another type
/// are left alone") that returned 0 for absent keys too, before it looked at the grant: the
/// lock stayed granted to the departed waiter until its entry's deadline. Found by this model;
/// the shipped script reads absent line keys as an empty line, and the first shipped check is
/// kept as a mutant that must still be caught.
#[test]
fn a_leave_after_a_grant_that_emptied_the_line_passes_the_grant_on() {
    let cancel = |variant| Config {
        cycles: 1,
        cancels: 1,
        ..plain(variant)
    };
    let trace = finds(
        cancel(Variant::LeaveIgnoresEmptiedLine),
        names::GRANT_PASSES_ON,
    );
    assert!(trace.contains("~granted=1"), "{trace}");
    assert!(trace.contains("waiters gone"), "{trace}");
    assert!(trace.contains("line/leave.lua -> 0"), "{trace}");
    let three = |variant| Config {
        clients: 3,
        cancels: 1,
        horizon_ms: 20,
        ..fair(variant)
    };
    finds(
        three(Variant::LeaveIgnoresEmptiedLine),
        names::GRANT_PASSES_ON,
    );
    holds(Config {
        crashes: 1,
        losses: 1,
        cancels: 1,
        ..plain(Variant::Shipped)
    });
    holds(Config {
        crashes: 1,
        ..three(Variant::Shipped)
    });
}

/// A waiter woken by a grant message takes the grant without a try; when Redis loses its data
/// (or an operator force-unlocks the lock) between the message and the take, another client
/// meanwhile gets (and releases) a grant with a higher token, and the waiter's guard then
/// begins with a lower token than a guard before it, on a grant Redis no longer has. A store
/// that keeps the highest token refuses it; the guard learns it lost the lock at its first
/// renewal.
#[test]
fn a_grant_heard_before_it_ended_is_taken_after_it() {
    let trace = finds(
        Config {
            data_losses: 1,
            ..plain(Variant::Shipped)
        },
        names::FENCING,
    );
    assert!(trace.contains("DataLoss"), "{trace}");
    assert!(trace.contains("it heard"), "{trace}");
    assert!(trace.contains("FenceRegressed"), "{trace}");
    // The same with a force unlock between the message and the take: the operator's unlock
    // grants the next in line, who takes and releases it; then the first waiter takes the
    // grant that force unlock ended, and holds a lock Redis has free.
    let trace = finds(
        Config {
            clients: 3,
            cycles: 1,
            force_unlocks: 1,
            ..plain(Variant::Shipped)
        },
        names::FENCING,
    );
    assert!(trace.contains("ForceUnlock"), "{trace}");
    assert!(trace.contains("it heard"), "{trace}");
    assert!(trace.contains("FenceRegressed"), "{trace}");
}
