# leasehold tasks. `just demo` and `just test` are the README's contract: both work on a fresh
# Debian/Ubuntu machine with Rust, installing redis-server when it is missing.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Install redis-server when it is not on PATH (Debian/Ubuntu, apt-get; sudo when not root).
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    if command -v redis-server >/dev/null 2>&1; then exit 0; fi
    echo "redis-server not found: installing it with apt-get" >&2
    SUDO=""; if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    # The package may start a system service on 6379; our tests never use it.
    command -v redis-server >/dev/null

# Play the seeds' scenarios (starts its own redis-server unless REDIS_URL is set).
# `just demo --cluster`: on a local Redis Cluster (3 primaries, a replica each) it starts itself,
# the pods connecting with a redis-cluster:// URL; `just demo --sentinel`: behind Sentinels;
# `just demo --failover`: a lock through a failover of a primary of its own, without and with
# replica sync.
demo *ARGS: setup
    cargo run --quiet --release -p leasehold-cli -- demo {{ARGS}}

# Everything CI checks: formatting, clippy and rustdoc with -D warnings, every test in the
# workspace (the facade's also without its default features: no metrics, no TLS), and every
# example run to completion.
test: setup
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
    just deps
    cargo clippy -p leasehold --no-default-features --all-targets -- -D warnings
    just examples
    cargo test --workspace --all-targets
    cargo test -p leasehold --no-default-features --tests
    cargo test --workspace --doc

# Licenses of every dependency, and the declared MSRV against the dependencies' own (offline).
deps:
    python3 .ci/deps.py

# Build and verify the package of every published crate, as `cargo publish` would (bench and
# chaos are not published). Several minutes: each package is built from its packaged sources.
package:
    cargo package --workspace --exclude leasehold-bench --exclude leasehold-chaos

# Run every example in examples/ (each starts its own redis-server unless REDIS_URL is set).
examples:
    #!/usr/bin/env bash
    set -euo pipefail
    for example in examples/*.rs; do
        name=$(basename "$example" .rs)
        echo "== cargo run --example $name"
        cargo run --quiet --example "$name"
    done

# Formatting and clippy only.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# The chaos checker (~2 min): client processes, injected faults, a recorded history and a
# checker; exit 1 on any violation. Pass e.g. `--seed 42` to replay a schedule, `--keep` to keep
# the history. `just test` runs a 20-second version (crates/chaos/tests/chaos.rs).
# `just chaos --redlock 5`: the RedLock mode (five servers, per-server faults; docs/red-lock.md).
# `just chaos --cluster`: the Redis Cluster mode (3 primaries with a replica each; primary kills,
# CLUSTER FAILOVER, node pauses, slot migrations; losses of a killed primary counted apart;
# docs/guide.md, crates/chaos/src/orchestrator.rs).
chaos *ARGS: setup
    cargo run --quiet --release -p leasehold-chaos -- run --duration 120s {{ARGS}}

# The model checker of the waiting protocol over the shipped scripts, on a larger bound than
# `just test`'s (crates/model, docs/model.md): three clients, crashes, lost messages, cancels,
# force unlock, data loss and a renewal (~5 min, 2 GB). Exit 1 with a counterexample trace when
# a property fails. Pass e.g. `--variant pre-f1-fix` to see a reverted fix caught, or other
# bounds (`--help`; a flag given again overrides the recipe's).
model *ARGS:
    cargo run --quiet --release -p leasehold-model -- check --clients 3 --waiters 1 --cycles 1 --crashes 1 --losses 1 --cancels 1 --force-unlocks 1 --data-losses 1 --renewals 1 {{ARGS}}

# The model checker on the fair lock (three clients, crash, lost message, cancel, a try_lock).
model-fair *ARGS:
    cargo run --quiet --release -p leasehold-model -- check --kind fair --clients 3 --waiters 1 --cycles 1 --crashes 1 --losses 1 --cancels 1 --tries 1 --horizon 30 {{ARGS}}

# The benchmark harness (pass --quick for the short run, --json PATH, --plot DIR).
bench *ARGS: setup
    cargo run --quiet --release -p leasehold-bench -- {{ARGS}}
