//! Runs the checker over a configuration and collects what it found.

use std::time::{Duration, Instant};

use stateright::{Checker, Model};

use crate::config::Config;
use crate::model::LockModel;
use crate::trace;

/// The result of one check.
#[derive(Debug)]
pub struct Outcome {
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// Wall time.
    pub took: Duration,
    /// Each property that failed, with its counterexample rendered as a trace.
    pub counterexamples: Vec<(&'static str, String)>,
}

/// Checks every property of `config` breadth-first on `threads` threads; a counterexample
/// found is the shortest for its property. `max_states` stops early (then nothing is proven).
pub fn check(config: Config, threads: usize, max_states: Option<usize>) -> Outcome {
    let started = Instant::now();
    let model = LockModel::new(config);
    let mut builder = model.checker().threads(threads);
    if let Some(max) = max_states {
        builder = builder.target_state_count(max);
    }
    let checker = builder.spawn_bfs().join();
    let model = checker.model();
    let start = model.init_states().remove(0);
    let mut counterexamples: Vec<(&'static str, String)> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, trace::render(model, &start, &path.into_actions())))
        .collect();
    counterexamples.sort();
    Outcome {
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        took: started.elapsed(),
        counterexamples,
    }
}
