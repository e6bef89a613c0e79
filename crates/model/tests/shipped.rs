//! The shipped scripts and waiting engine of the plain lock keep every property within the
//! bounds `just test` checks. Each bound spends the state space on one group of faults: all of
//! them at once is `just model`'s job (minutes, release build). Bounds with a cancelled wait or
//! with data loss between two cycles find counterexamples on the shipped code:
//! `tests/findings.rs`.

mod common;

use common::{holds, plain};
use leasehold_model::{Config, Variant};

/// Two clients that each lock twice, with a crash and a dropped subscriber connection: grants
/// of the line, their messages lost (and found by the resync's try), a dead head's grant
/// lapsing with its entry.
#[test]
fn waiting_survives_crashes_and_lost_messages() {
    holds(Config {
        crashes: 1,
        losses: 1,
        ..plain(Variant::Shipped)
    });
}

/// Two clients with two waiters each and a crash: the local FIFO, the line's head changing
/// within a client, and what a crashed client leaves in Redis.
#[test]
fn a_clients_waiters_keep_their_order_and_a_crash_leaves_nothing_forever() {
    holds(Config {
        waiters: 2,
        cycles: 1,
        crashes: 1,
        horizon_ms: 15,
        ..plain(Variant::Shipped)
    });
}

/// Redis loses its data while a client waits, with a crash and a dropped connection: fencing
/// tokens keep rising (the server clock floor), and waiters of the lost line are woken by the
/// reconnect.
#[test]
fn fencing_tokens_rise_across_data_loss() {
    holds(Config {
        cycles: 1,
        crashes: 1,
        losses: 1,
        data_losses: 1,
        ..plain(Variant::Shipped)
    });
}

/// Force unlock, data loss and a watchdog renewal around one grant per client: a guard whose
/// grant ended is never renewed again, exclusion holds among unrevoked grants, and a force
/// unlock grants the line's head.
#[test]
fn a_revoked_grant_is_never_renewed() {
    holds(Config {
        cycles: 1,
        force_unlocks: 1,
        data_losses: 1,
        renewals: 1,
        ..plain(Variant::Shipped)
    });
}
