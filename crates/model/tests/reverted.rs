//! With a fix reverted the checker finds the defect, with a counterexample; on the same bound
//! the shipped code passes. This is what makes a passing check mean something.

use leasehold_model::check::{check, Outcome};
use leasehold_model::properties::names;
use leasehold_model::{Config, Variant};

fn run(config: Config) -> Outcome {
    check(config, 1, None)
}

/// The failures of an outcome, for a message.
fn failures(outcome: &Outcome) -> Vec<&'static str> {
    outcome.counterexamples.iter().map(|(p, _)| *p).collect()
}

/// Defect 1's bound: two clients locking twice each, one crash.
fn f1_bound(variant: Variant) -> Config {
    Config {
        clients: 2,
        waiters: 1,
        cycles: 2,
        crashes: 1,
        losses: 0,
        cancels: 0,
        ..Config::small(variant)
    }
}

/// Defect 2's bound: one client with two waiters locking twice each, no faults.
fn f2_bound(variant: Variant) -> Config {
    Config {
        clients: 1,
        waiters: 2,
        cycles: 2,
        crashes: 0,
        losses: 0,
        cancels: 0,
        ..Config::small(variant)
    }
}

#[test]
fn without_the_f1_fix_a_waiter_sleeps_on_a_free_lock() {
    let outcome = run(f1_bound(Variant::PreF1Fix));
    let trace = outcome
        .counterexamples
        .iter()
        .find(|(p, _)| *p == names::NO_SLEEP_ON_FREE_LOCK)
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("F1 not found; failures: {:?}", failures(&outcome)));
    println!("{trace}");
    // The counterexample's shape: a reservation lapses unannounced while a waiter sleeps on
    // its own lease.
    assert!(trace.contains("~turn:"), "{trace}");
    assert!(trace.contains("lapsed free"), "{trace}");
    assert!(trace.contains("fails here"), "{trace}");
}

#[test]
fn with_the_f1_fix_the_same_bound_passes() {
    let outcome = run(f1_bound(Variant::Shipped));
    assert!(
        outcome.counterexamples.is_empty(),
        "{:?}",
        outcome.counterexamples
    );
}

#[test]
fn without_the_f2_fix_a_releaser_barges_ahead_of_its_clients_waiter() {
    let outcome = run(f2_bound(Variant::PreF2Fix));
    let trace = outcome
        .counterexamples
        .iter()
        .find(|(p, _)| *p == names::CLIENT_FIFO)
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("F2 not found; failures: {:?}", failures(&outcome)));
    println!("{trace}");
    assert!(trace.contains("ClientFifo"), "{trace}");
}

#[test]
fn with_the_f2_fix_the_same_bound_passes() {
    let outcome = run(f2_bound(Variant::Shipped));
    assert!(
        outcome.counterexamples.is_empty(),
        "{:?}",
        outcome.counterexamples
    );
}
