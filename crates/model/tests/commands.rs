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
        17,
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
    let shipped = leasehold_core::scripts::Scripts::new(leasehold_core::protocol::Protocol {
        turn_grace: std::time::Duration::from_millis(2),
        ..Default::default()
    });
    let model = ModelScripts::new(2, Variant::Shipped);
    assert_eq!(model.acquire, shipped.acquire.lua());
    assert_eq!(model.release, shipped.release.lua());
    assert_eq!(model.renew, shipped.renew.lua());
    assert_eq!(model.force_unlock, shipped.force_unlock.lua());
    assert_eq!(model.fair_acquire, shipped.fair_acquire.lua());
    assert_eq!(model.fair_release, shipped.fair_release.lua());
    assert_eq!(model.fair_leave, shipped.fair_leave.lua());
    // The reverted variant differs from the shipped text only by the fixture's branch.
    let reverted = ModelScripts::new(2, Variant::PreF1Fix);
    assert_eq!(
        reverted
            .acquire
            .replace(leasehold_model::scripts::PRE_F1_RESERVED_BUSY, ""),
        model.acquire
    );
}
