//! The fair lock (`client.fair_lock`): the shipped `fair/*.lua` scripts and the waiting
//! engine's own lines (`Line::Own`: an entry and a channel per waiter, renewed by the watchdog,
//! left by `fair/leave.lua`) keep every property within the bounds `just test` checks; and two
//! mutants of the scripts are caught, so the fair properties are not vacuous.

use leasehold_model::check::check;
use leasehold_model::properties::names;
use leasehold_model::{Config, Kind, Variant};

fn fair(variant: Variant) -> Config {
    Config {
        clients: 2,
        waiters: 1,
        cycles: 1,
        crashes: 0,
        losses: 0,
        cancels: 0,
        force_unlocks: 0,
        data_losses: 0,
        renewals: 0,
        kind: Kind::Fair,
        ..Config::small(variant)
    }
}

/// Checks `config` on one thread and fails with every counterexample's trace.
fn holds(config: Config) {
    let outcome = check(config.clone(), 1, None);
    let failures: String = outcome
        .counterexamples
        .iter()
        .map(|(property, trace)| format!("\nproperty failed: {property}\n{trace}"))
        .collect();
    assert!(failures.is_empty(), "{config:?}{failures}");
    assert!(outcome.unique_states > 1000, "{outcome:?}");
    println!(
        "{config:?}: {} distinct states, depth {}, {:.1?}",
        outcome.unique_states, outcome.max_depth, outcome.took
    );
}

/// Checks `config` and expects a counterexample for `property`.
fn finds(config: Config, property: &str) {
    let outcome = check(config.clone(), 1, None);
    assert!(
        outcome.counterexamples.iter().any(|(p, _)| *p == property),
        "{config:?}: expected a counterexample for {property:?}, got {:?}",
        outcome.counterexamples
    );
}

/// Three clients in line, one crash and one cancelled wait: strict arrival order across
/// clients, a dead waiter's turn lapsing within its entry's life, a departed waiter's turn
/// passed on by its leave script (or, when its client crashes first, lapsing as a dead one's).
#[test]
fn three_clients_keep_arrival_order_through_a_crash_and_a_cancel() {
    holds(Config {
        clients: 3,
        crashes: 1,
        cancels: 1,
        horizon_ms: 20,
        ..fair(Variant::Shipped)
    });
}

/// Two clients locking twice with a dropped subscriber connection: a lost handoff message,
/// repaired by the resync's tries; lingering subscriptions across cycles.
#[test]
fn a_lost_handoff_message_is_repaired() {
    holds(Config {
        cycles: 2,
        losses: 1,
        ..fair(Variant::Shipped)
    });
}

/// Force unlock, data loss and a watchdog renewal: exclusion among unrevoked grants, fencing
/// across data loss, a revoked grant never renewed, and entries lost with the data.
#[test]
fn force_unlock_and_data_loss_on_a_fair_lock() {
    holds(Config {
        force_unlocks: 1,
        data_losses: 1,
        renewals: 1,
        ..fair(Variant::Shipped)
    });
}

/// A `try_lock` among three clients in line: it never queues, and never takes the lock ahead
/// of a live earlier arrival (a try that finds the lock free re-reserves it for the head).
#[test]
fn try_lock_never_queues_or_jumps_the_line() {
    holds(Config {
        clients: 3,
        tries: 1,
        horizon_ms: 20,
        ..fair(Variant::Shipped)
    });
}

/// A mutant that grants a free lock to whoever tries is caught by the arrival order.
#[test]
fn a_line_jumper_is_caught() {
    finds(
        Config {
            clients: 3,
            horizon_ms: 20,
            ..fair(Variant::FairLineJumped)
        },
        names::ARRIVAL_ORDER,
    );
}

/// A mutant whose hand-on never drops dead entries is caught: a crashed waiter's turn is
/// reserved again and again.
#[test]
fn a_dead_waiter_kept_in_line_is_caught() {
    finds(
        Config {
            clients: 3,
            crashes: 1,
            horizon_ms: 20,
            ..fair(Variant::FairNoDeadSkip)
        },
        names::TURN_PASSES_ON,
    );
}
