//! Every command any shipped script calls (every kind, not only the modelled plain lock) is
//! one the model's Redis implements: a script that starts calling another fails here, by
//! name, instead of the model silently running something else.

use leasehold_model::redis::COMMANDS;
use leasehold_model::scripts::{
    commands_called, every_shipped_script, every_shipped_sharded_script, ModelScripts,
};
use leasehold_model::Variant;

#[test]
fn every_command_a_shipped_script_calls_is_implemented() {
    let mut missing = Vec::new();
    let mut scripts = every_shipped_script();
    assert_eq!(
        scripts.len(),
        16,
        "Scripts::all() changed: check this test still sees all"
    );
    scripts.extend(every_shipped_sharded_script());
    for (i, lua) in scripts.iter().enumerate() {
        for command in commands_called(lua) {
            if !COMMANDS.contains(&command.as_str()) {
                missing.push(format!("script #{i} calls {command}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the model's Redis does not implement: {missing:?}"
    );
}

#[test]
fn the_extraction_sees_calls_and_pcalls() {
    let found = commands_called("redis.call('GET', k) redis.pcall( 'zadd', k) redis.call(name)");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["?", "GET", "ZADD"],
        "a call through a variable is reported as '?'"
    );
}

#[test]
fn the_model_runs_the_shipped_text() {
    let shipped =
        leasehold_core::scripts::Scripts::new(leasehold_core::protocol::Protocol::default());
    let model = ModelScripts::new(Variant::Shipped);
    assert_eq!(model.acquire, shipped.acquire.lua());
    assert_eq!(model.release, shipped.release.lua());
    assert_eq!(model.renew, shipped.renew.lua());
    assert_eq!(model.force_unlock, shipped.force_unlock.lua());
    assert_eq!(model.line_acquire, shipped.line_acquire.lua());
    assert_eq!(model.line_leave, shipped.line_leave.lua());
    // The hand-on is inlined in every script that grants the line's head.
    for lua in [
        &model.release,
        &model.line_acquire,
        &model.line_leave,
        &model.force_unlock,
    ] {
        assert!(lua.contains(leasehold_model::scripts::DEAD_RANGE), "{lua}");
    }
}

/// Every variant builds (its anchors are in the shipped text, or it panics), and a script
/// mutant changes only the scripts it names.
#[test]
fn every_variant_changes_only_its_scripts() {
    use clap::ValueEnum;
    let shipped = ModelScripts::new(Variant::Shipped);
    let texts = |m: &ModelScripts| {
        [
            m.acquire.clone(),
            m.release.clone(),
            m.renew.clone(),
            m.force_unlock.clone(),
            m.line_acquire.clone(),
            m.line_leave.clone(),
        ]
    };
    for &variant in Variant::value_variants() {
        let changed: Vec<usize> = texts(&ModelScripts::new(variant))
            .iter()
            .zip(texts(&shipped))
            .enumerate()
            .filter(|(_, (a, b))| **a != *b)
            .map(|(i, _)| i)
            .collect();
        let expected: &[usize] = match variant {
            Variant::Shipped | Variant::NoLocalFifo | Variant::StaleGrantTaken => &[],
            Variant::HandOnNoDeadDrop => &[1, 3, 4, 5],
            Variant::LineJumped => &[4],
            Variant::LeaveIgnoresEmptiedLine | Variant::LeaveKeepsGrant => &[5],
            Variant::ReleaseNoHandOn => &[1],
        };
        assert_eq!(changed, expected, "{variant:?}");
    }
}
