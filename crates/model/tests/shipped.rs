//! The shipped scripts and waiting engine keep every property within the bounds `just test`
//! checks. Each bound spends the state space on one group of faults: all of them at once is
//! `just model`'s job (minutes, release build).

use leasehold_model::check::check;
use leasehold_model::{Config, Variant};

/// Checks `config` on one thread (the test harness runs two checks side by side) and fails
/// with every counterexample's trace.
fn holds(config: Config) {
    let outcome = check(config.clone(), 1, None);
    let failures: String = outcome
        .counterexamples
        .iter()
        .map(|(property, trace)| format!("\nproperty failed: {property}\n{trace}"))
        .collect();
    assert!(failures.is_empty(), "{config:?}{failures}");
    // A bound that explores nothing proves nothing.
    assert!(outcome.unique_states > 1000, "{outcome:?}");
    println!(
        "{config:?}: {} distinct states, depth {}, {:.1?}",
        outcome.unique_states, outcome.max_depth, outcome.took
    );
}

fn base() -> Config {
    Config {
        clients: 2,
        waiters: 1,
        cycles: 2,
        crashes: 0,
        losses: 0,
        cancels: 0,
        force_unlocks: 0,
        data_losses: 0,
        renewals: 0,
        ..Config::small(Variant::Shipped)
    }
}

/// Two clients that each lock twice, with a crash, a dropped subscriber connection and a
/// cancelled wait: handoffs, lapsed reservations and lost messages (F1's ground).
#[test]
fn waiting_survives_crashes_lost_messages_and_cancels() {
    holds(Config {
        crashes: 1,
        losses: 1,
        cancels: 1,
        ..base()
    });
}

/// Two clients with two waiters each and a crash: the local FIFO (F2's ground), a client at
/// the back of the turn queue, and what a crashed client leaves in Redis.
#[test]
fn a_clients_waiters_keep_their_order_and_a_crash_leaves_nothing_forever() {
    holds(Config {
        waiters: 2,
        cycles: 1,
        crashes: 1,
        horizon_ms: 20,
        ..base()
    });
}

/// Redis loses its data between grants: fencing tokens keep rising (the server clock floor),
/// and waiters sleeping on the lost lock are woken by the reconnect.
#[test]
fn fencing_tokens_rise_across_data_loss() {
    holds(Config {
        data_losses: 1,
        ..base()
    });
}

/// Force unlock, data loss and a watchdog renewal around one grant per client: a guard whose
/// grant ended is never renewed again (F3), and exclusion holds among unrevoked grants.
#[test]
fn a_revoked_grant_is_never_renewed() {
    holds(Config {
        cycles: 1,
        force_unlocks: 1,
        data_losses: 1,
        renewals: 1,
        ..base()
    });
}
