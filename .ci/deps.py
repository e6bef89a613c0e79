#!/usr/bin/env python3
"""Offline dependency checks over `cargo metadata` (the Cargo.lock as resolved):

1. Licenses, in the spirit of `cargo deny check licenses`: every package the published
   crates depend on (normal, build and dev dependencies, any platform) must have an SPDX
   license expression that can be satisfied with the licenses in ALLOWED.
2. MSRV consistency: the workspace's declared `rust-version` must be at least every
   `rust-version` declared by a normal or build dependency of the published crates on Linux.
   (Compiling with that toolchain is the real check; this machine has one toolchain and cannot
   fetch another, so this catches the common way a declared MSRV becomes false: a dependency
   raising its own.)

Advisories (`cargo deny check advisories`) need the RustSec database from GitHub, which the
machines this project is built on cannot reach; they are not checked here.

Exit status 1 with one line per problem.
"""

import json
import re
import subprocess
import sys

PUBLISHED = {
    "leasehold",
    "leasehold-core",
    "leasehold-watchdog",
    "leasehold-pubsub",
    "leasehold-testkit",
    "leasehold-cli",
}

# Permissive licenses: nothing here asks more of a user of leasehold than keeping notices.
ALLOWED = {
    "MIT",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "0BSD",
    "Zlib",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "Unlicense",
    "BSL-1.0",
    "CC0-1.0",
}


def satisfiable(expression: str) -> bool:
    """Whether an SPDX expression (AND, OR, WITH, parentheses; the old `A/B` form as OR) can
    be met using only ALLOWED licenses."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expression.replace("/", " OR "))
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    def primary():
        if peek() == "(":
            take()
            value = disjunction()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return value
        name = take()
        if peek() == "WITH":
            take()
            name = f"{name} WITH {take()}"
        return name in ALLOWED

    def conjunction():
        value = primary()
        while peek() == "AND":
            take()
            value = primary() and value
        return value

    def disjunction():
        value = conjunction()
        while peek() == "OR":
            take()
            value = conjunction() or value
        return value

    result = disjunction()
    if position != len(tokens):
        raise ValueError(f"unexpected {tokens[position]!r}")
    return result


def version_key(version: str):
    parts = [int(part) for part in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def metadata(*args):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def reachable(meta, kinds):
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [
        p["id"] for p in meta["packages"] if p["name"] in PUBLISHED and p["source"] is None
    ]
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for dep in nodes[node]["deps"]:
            if any(k["kind"] in kinds for k in dep["dep_kinds"]):
                stack.append(dep["pkg"])
    return [packages[i] for i in seen if packages[i]["source"] is not None]


def main() -> int:
    problems = []

    every = reachable(metadata(), {None, "build", "dev"})
    for package in sorted(every, key=lambda p: (p["name"], p["version"])):
        license = package.get("license")
        who = f"{package['name']} {package['version']}"
        if not license:
            problems.append(f"{who}: no SPDX license expression (license-file only)")
            continue
        try:
            if not satisfiable(license):
                problems.append(f"{who}: license {license!r} is not in the allowed set")
        except (ValueError, IndexError) as error:
            problems.append(f"{who}: cannot read license {license!r}: {error}")

    linux = metadata("--filter-platform", "x86_64-unknown-linux-gnu")
    declared = {
        p["name"]: p.get("rust_version")
        for p in linux["packages"]
        if p["name"] in PUBLISHED and p["source"] is None
    }
    floor = min(version_key(v) for v in declared.values() if v)
    for package in reachable(linux, {None, "build"}):
        needed = package.get("rust_version")
        if needed and version_key(needed) > floor:
            problems.append(
                f"{package['name']} {package['version']} needs Rust {needed}, above the "
                f"declared rust-version {'.'.join(map(str, floor))}"
            )

    for problem in problems:
        print(f"deps: {problem}")
    print(
        f"deps: {len(every)} dependencies checked for licenses, MSRV floor "
        f"{'.'.join(map(str, floor))}: {'FAIL' if problems else 'ok'}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
