//! What the checks of every test file share: run a bound on one thread (the test harness runs
//! two checks side by side on the two cores) and judge its outcome.
#![allow(dead_code)] // each test file uses some of these

use leasehold_model::check::{check, Outcome};
use leasehold_model::{Config, Kind, Variant};

/// The plain lock's base bound: two clients with one waiter each, locking twice, no faults.
pub fn plain(variant: Variant) -> Config {
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
        ..Config::small(variant)
    }
}

/// The fair lock's base bound: two clients with one waiter each, locking once, no faults.
pub fn fair(variant: Variant) -> Config {
    Config {
        cycles: 1,
        kind: Kind::Fair,
        ..plain(variant)
    }
}

/// Checks `config` and fails with every counterexample's trace; a bound that explores
/// nothing proves nothing.
pub fn holds(config: Config) -> Outcome {
    let outcome = check(config.clone(), 1, None);
    let failures: String = outcome
        .counterexamples
        .iter()
        .map(|(property, trace)| format!("\nproperty failed: {property}\n{trace}"))
        .collect();
    assert!(failures.is_empty(), "{config:?}{failures}");
    assert!(outcome.unique_states > 1000, "{outcome:?}");
    println!(
        "{config:?}: holds, {} states ({} distinct), depth {}, {:.1?}",
        outcome.states, outcome.unique_states, outcome.max_depth, outcome.took
    );
    outcome
}

/// Checks `config`, expects a counterexample for `property`, and returns its trace.
pub fn finds(config: Config, property: &str) -> String {
    let outcome = check(config.clone(), 1, None);
    let trace = outcome
        .counterexamples
        .iter()
        .find(|(p, _)| *p == property)
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| {
            panic!(
                "{config:?}: expected a counterexample for {property:?}, got {:?}",
                outcome
                    .counterexamples
                    .iter()
                    .map(|(p, _)| *p)
                    .collect::<Vec<_>>()
            )
        });
    println!(
        "{config:?}: {property:?} found, {} steps; {} states ({} distinct), depth {}, {:.1?}\n{trace}",
        trace.lines().filter(|l| l.contains(". t=")).count(),
        outcome.states,
        outcome.unique_states,
        outcome.max_depth,
        outcome.took
    );
    trace
}
