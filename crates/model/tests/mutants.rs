//! Mutants of the shipped scripts and engine: each yields a counterexample for the property it
//! breaks, and on the same bound the code it was made from passes. This is what makes a passing
//! check mean something.

mod common;

use common::{fair, finds, holds, plain};
use leasehold_model::properties::names;
use leasehold_model::{Config, Variant};

/// One client with two waiters locking twice each, no faults.
fn one_client_two_waiters(variant: Variant) -> Config {
    Config {
        clients: 1,
        waiters: 2,
        ..plain(variant)
    }
}

/// Without the local FIFO a waiter that released and locks again takes a free lock ahead of
/// its client's waiter that asked first.
#[test]
fn without_the_local_fifo_a_releaser_barges_ahead_of_its_clients_waiter() {
    let trace = finds(
        one_client_two_waiters(Variant::NoLocalFifo),
        names::CLIENT_FIFO,
    );
    assert!(trace.contains("ClientFifo"), "{trace}");
    holds(one_client_two_waiters(Variant::Shipped));
}

/// A grant heard in an earlier wait of the same owner, taken without comparing its token with
/// the counter of this wait's busy try, is no grant of Redis's.
#[test]
fn a_stale_grant_taken_from_the_channel_is_caught() {
    let trace = finds(plain(Variant::StaleGrantTaken), names::HEARD_GRANT_HELD);
    assert!(trace.contains("it heard"), "{trace}");
    holds(plain(Variant::Shipped));
}

/// A release that never grants the line's head deletes the lock while its waiters sleep on
/// their busy bounds, told nothing (the release channel has no listener here).
#[test]
fn a_release_that_skips_the_line_leaves_waiters_asleep_on_a_free_lock() {
    finds(
        plain(Variant::ReleaseNoHandOn),
        names::NO_SLEEP_ON_FREE_LOCK,
    );
    finds(
        Config {
            clients: 3,
            horizon_ms: 20,
            ..fair(Variant::ReleaseNoHandOn)
        },
        names::NO_SLEEP_ON_FREE_LOCK,
    );
}

/// A line/acquire.lua that lets a try take a free lock whoever is first in line breaks the
/// arrival order, for the plain lock's tries in line and the fair lock's.
#[test]
fn a_line_jumper_is_caught() {
    finds(plain(Variant::LineJumped), names::ARRIVAL_ORDER);
    let three = |variant| Config {
        clients: 3,
        horizon_ms: 20,
        ..fair(variant)
    };
    finds(three(Variant::LineJumped), names::ARRIVAL_ORDER);
    holds(three(Variant::Shipped));
}

/// A hand-on that never drops dead entries grants the lock to a crashed waiter after its
/// entry's deadline: the grant outlives the entry.
#[test]
fn a_dead_waiter_kept_in_line_is_caught() {
    let crash = |variant| Config {
        crashes: 1,
        ..plain(variant)
    };
    finds(crash(Variant::HandOnNoDeadDrop), names::GRANT_PASSES_ON);
    holds(crash(Variant::Shipped));
    finds(
        Config {
            clients: 3,
            crashes: 1,
            horizon_ms: 20,
            ..fair(Variant::HandOnNoDeadDrop)
        },
        names::GRANT_PASSES_ON,
    );
}

/// A leave that forgets to pass on a grant the line made to the leaving waiter leaves the
/// lock granted to a waiter nobody is.
#[test]
fn a_leave_that_keeps_an_untaken_grant_is_caught() {
    let cancel = |variant| Config {
        cancels: 1,
        ..plain(variant)
    };
    finds(cancel(Variant::LeaveKeepsGrant), names::GRANT_PASSES_ON);
    holds(cancel(Variant::Shipped));
    let three = |variant| Config {
        clients: 3,
        cancels: 1,
        horizon_ms: 20,
        ..fair(variant)
    };
    finds(three(Variant::LeaveKeepsGrant), names::GRANT_PASSES_ON);
    holds(three(Variant::Shipped));
}
