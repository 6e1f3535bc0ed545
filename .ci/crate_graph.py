#!/usr/bin/env python3
"""The crate graph ARCHITECTURE.md promises ("The code"), read from `cargo metadata`; exits 1 on any breach.

- No domain crate (one per process) depends on another domain crate, directly or through a
  shared crate.
- The laptop crate reaches none of the daemon plumbing: not agentworks-daemon, nor libsystemd,
  sd-notify or tracing-journald (the laptop CLI is not a daemon).
- The shared crates depend on no domain crate.
- The sandbox crate (shared by the laptop CLI and the server's runner) reaches no daemon
  plumbing either: the laptop links it.

Only normal (non-dev, non-build) dependencies count: a test may start any binary.
"""
import json
import subprocess
import sys

DOMAIN = {
    "agentworks-workspace",
    "agentworks-agent",
    "agentworks-gateway",
    "agentworks-laptop",
    "agentworks-ctl",
    "agentworks-runner",
}
SHARED = {
    "agentworks-core",
    "agentworks-fs",
    "agentworks-contract",
    "agentworks-support",
    "agentworks-daemon",
    "agentworks-sandbox",
}
NOT_ON_THE_LAPTOP = {"agentworks-daemon", "libsystemd", "sd-notify", "tracing-journald"}

metadata = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
names = {p["id"]: p["name"] for p in metadata["packages"]}
normal = {}
for node in metadata["resolve"]["nodes"]:
    normal[names[node["id"]]] = {
        names[d["pkg"]]
        for d in node["deps"]
        if any(k["kind"] is None for k in d["dep_kinds"])
    }

missing = (DOMAIN | SHARED) - normal.keys()
if missing:
    sys.exit(f"crate graph: the workspace has no {sorted(missing)}")


def reachable(start):
    seen, stack = set(), [start]
    while stack:
        for dep in normal.get(stack.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


breaches = []
for crate in sorted(DOMAIN):
    others = reachable(crate) & (DOMAIN - {crate})
    if others:
        breaches.append(f"{crate} depends on the domain crate(s) {sorted(others)}")
for crate in sorted(SHARED):
    domains = reachable(crate) & DOMAIN
    if domains:
        breaches.append(f"the shared crate {crate} depends on {sorted(domains)}")
for crate in ("agentworks-laptop", "agentworks-sandbox"):
    plumbing = reachable(crate) & NOT_ON_THE_LAPTOP
    if plumbing:
        breaches.append(f"{crate} reaches daemon plumbing: {sorted(plumbing)}")

for crate in sorted(DOMAIN | SHARED):
    inner = sorted(d for d in normal[crate] if d in DOMAIN | SHARED)
    print(f"crate graph: {crate} -> {', '.join(inner) or '(no workspace crate)'}")
if breaches:
    for breach in breaches:
        print(f"crate graph: BREACH: {breach}", file=sys.stderr)
    sys.exit(1)
print(
    "crate graph: no domain crate depends on another; the laptop and sandbox crates have no "
    "daemon plumbing"
)
