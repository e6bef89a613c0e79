//! The fair lock (`client.fair_lock`): the shipped scripts and the waiting engine's own lines
//! (`Line::Own`: an entry and a channel per waiter, renewed by the watchdog, left by
//! `line/leave.lua`) keep every property within the bounds `just test` checks. A cancelled
//! wait finds a counterexample on the shipped code: `tests/findings.rs`.

mod common;

use common::{fair, holds};
use leasehold_model::{Config, Variant};

/// Three clients in line and a crash: strict arrival order across clients, a dead waiter's
/// grant lapsing within its entry's life.
#[test]
fn three_clients_keep_arrival_order_through_a_crash() {
    holds(Config {
        clients: 3,
        crashes: 1,
        horizon_ms: 20,
        ..fair(Variant::Shipped)
    });
}

/// Two clients locking twice with a dropped subscriber connection: a lost grant message,
/// found by the resync's try; lingering subscriptions (and their old grants) across cycles.
#[test]
fn a_lost_grant_message_is_repaired() {
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
/// of a live earlier arrival (a try that finds the lock free grants it to the line's head).
#[test]
fn try_lock_never_queues_or_jumps_the_line() {
    holds(Config {
        clients: 3,
        tries: 1,
        horizon_ms: 20,
        ..fair(Variant::Shipped)
    });
}
