#!/usr/bin/env bash
# The laptop CLI's live check on a Mac (issue 17). Not run in CI: the CI machines cannot run
# macOS. A person runs it on a Mac against a running agentworks server; it prints one line per
# check (PASS/FAIL and a detail) and a summary to paste into a bug report.
#
# What it does: starts `agentworks executor connect --write-folder <a temp folder>` on this Mac,
# then dispatches shell commands to it through the server's gatewayd dispatch API
# (gatewayd.sock, reached with --dispatch, e.g. over ssh), exactly as agentd does for a chat
# bound to a laptop folder: curl to the internet, git clone, npm install and npm test in the
# writable folder; then the refusals: reading an ~/.ssh key fixture outside the shared folder,
# `open -a Calculator`, `osascript` to the Finder, pbpaste/pbcopy, `security
# find-generic-password`, writing outside the folder, and reading the CLI's own state.
#
# Usage (see README, "Building for macOS"):
#   tests/macos_live.sh --server https://agentworks.example.com --user-id USER_ID \
#       --dispatch 'ssh root@agentworks.example.com' [--token-file FILE] [--gateway wss://…] \
#       [--bin target/release/agentworks]
#
#   --server      agentd's public URL (also used for `agentworks login --with-token`).
#   --user-id     the id of the person the token belongs to (`agentworksctl user list`).
#   --dispatch    a command prefix that runs its arguments on the server host as a peer
#                 gatewayd's dispatch API accepts (root, or a user in [gatewayd]
#                 allowed_users); the script runs `<prefix> curl --unix-socket …`.
#   --token-file  a devices:connect token, logged in with `agentworks login --with-token`;
#                 without it the existing login (`agentworks login`) is used.
#   --socket      gatewayd.sock's path on the server (default /run/agentworks/gatewayd.sock).
set -uo pipefail

server="" user_id="" dispatch="" token_file="" gateway="" socket=/run/agentworks/gatewayd.sock
bin="${AGENTWORKS_BIN:-}"
while [ $# -gt 0 ]; do
    case "$1" in
    --server) server="$2"; shift 2 ;;
    --user-id) user_id="$2"; shift 2 ;;
    --dispatch) dispatch="$2"; shift 2 ;;
    --token-file) token_file="$2"; shift 2 ;;
    --gateway) gateway="$2"; shift 2 ;;
    --socket) socket="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "macos_live: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$server" ] || [ -z "$user_id" ] || [ -z "$dispatch" ]; then
    echo "macos_live: --server, --user-id and --dispatch are required (see --help)" >&2
    exit 2
fi
if [ "$(uname -s)" != Darwin ]; then
    echo "macos_live: this script checks the macOS executor; run it on a Mac" >&2
    exit 2
fi
if [ -z "$bin" ]; then
    here="$(cd "$(dirname "$0")/.." && pwd)"
    for candidate in "$here/target/release/agentworks" "$here/target/debug/agentworks"; do
        [ -x "$candidate" ] && bin="$candidate" && break
    done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "macos_live: no agentworks binary: cargo build --release -p agentworks --bin agentworks, or pass --bin" >&2
    exit 2
fi
command -v python3 >/dev/null || { echo "macos_live: python3 is needed to read JSON" >&2; exit 2; }

passed=0 failed=0 results=""
record() { # record PASS|FAIL name detail
    local line
    line=$(printf '%s %s: %s' "$1" "$2" "$3")
    echo "$line"
    results="$results$line"$'\n'
    if [ "$1" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

info() { # info name detail: reported in the summary, not counted
    local line
    line=$(printf 'INFO %s: %s' "$1" "$2")
    echo "$line"
    results="$results$line"$'\n'
}

# The shared folder, the fixture outside it, and the executor's log.
run_id="$(date +%s)-$$"
live="$HOME/agentworks-live-$run_id"
work="$live/work"
log="$live/executor.log"
fixture="$HOME/.ssh/agentworks_live_fixture_$run_id"
secret="agentworks-live-secret-$run_id"
mkdir -p "$work" "$HOME/.ssh"
printf -- '-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n-----END OPENSSH PRIVATE KEY-----\n' "$secret" >"$fixture"
chmod 600 "$fixture"
executor_pid=""
cleanup() {
    [ -n "$executor_pid" ] && kill "$executor_pid" 2>/dev/null && wait "$executor_pid" 2>/dev/null
    rm -f "$fixture"
    rm -rf "$live"
}
trap cleanup EXIT

if [ -n "$token_file" ]; then
    if ! "$bin" login --server "$server" --with-token <"$token_file" >"$live/login.log" 2>&1; then
        record FAIL login "$(tail -n 3 "$live/login.log" | tr '\n' ' ')"
    else
        record PASS login "$(grep -o 'stored in .*' "$live/login.log")"
    fi
fi

device_name="macos-live-$run_id"
connect_args=(executor connect --name "$device_name" --write-folder "$work")
[ -n "$gateway" ] && connect_args+=(--gateway "$gateway")
"$bin" "${connect_args[@]}" >"$log" 2>&1 &
executor_pid=$!

# One request to gatewayd's dispatch API on the server; the JSON body on stdin.
api() { # api PATH < body
    # shellcheck disable=SC2086 # the prefix is a command line, split on purpose
    $dispatch curl -s --unix-socket "$socket" -H 'content-type: application/json' \
        --data-binary @- "http://_$1"
}
json() { # json EXPRESSION < document: prints document[EXPRESSION] (a Python expression on d)
    python3 -c "import json,sys; d=json.load(sys.stdin); print($1)" 2>/dev/null
}

device_id=""
for _ in $(seq 1 60); do
    device_id=$(printf '{"user_id":"%s"}' "$user_id" | api /v1/devices |
        json "next((x['device_id'] for x in d if x.get('online') and x.get('name')=='$device_name'), '')")
    [ -n "$device_id" ] && break
    kill -0 "$executor_pid" 2>/dev/null || break
    sleep 1
done
if [ -z "$device_id" ]; then
    record FAIL connect "the device did not come online; executor log: $(tail -n 5 "$log" | tr '\n' ' ')"
else
    record PASS connect "device $device_id online, sharing $work"
fi

folder=work
n=0
# run COMMAND [TIMEOUT]: dispatches it; sets $outcome (the JSON), $code (exit code or ""),
# $status (completed, refused, …) and $output (stdout and stderr, one line, shortened).
run() {
    n=$((n + 1))
    local body
    body=$(python3 -c 'import json,sys; print(json.dumps({"user_id": sys.argv[1], "device_id": sys.argv[2], "folder": sys.argv[3], "request_id": sys.argv[4], "operation": {"kind": "execute_shell_command", "command": sys.argv[5], "timeout": int(sys.argv[6])}}))' \
        "$user_id" "$device_id" "$folder" "macos-live-$run_id-$n" "$1" "${2:-60}")
    outcome=$(printf '%s' "$body" | api /v1/dispatch)
    status=$(printf '%s' "$outcome" | json "d.get('outcome', {}).get('status') or d.get('error', {}).get('code', '')")
    code=$(printf '%s' "$outcome" | json "d.get('outcome', {}).get('exit_code')")
    output=$(printf '%s' "$outcome" | json "(d.get('outcome', {}).get('stdout', '') + ' | ' + d.get('outcome', {}).get('stderr', '')).replace(chr(10), ' ')[:160]")
}
# expect_ok NAME COMMAND [TIMEOUT] [MUST_CONTAIN]
expect_ok() {
    run "$2" "${3:-60}"
    if [ "$status" = completed ] && [ "$code" = 0 ] && { [ -z "${4:-}" ] || [[ "$output" == *"$4"* ]]; }; then
        record PASS "$1" "exit 0: $output"
    else
        record FAIL "$1" "status=$status exit=$code: $output"
    fi
}
# expect_refused NAME COMMAND [MUST_NOT_CONTAIN]: the command must fail (or be refused) and
# must not print the secret.
expect_refused() {
    run "$2"
    if [ -n "${3:-}" ] && [[ "$outcome" == *"$3"* ]]; then
        record FAIL "$1" "the output holds the secret: $output"
    elif [ "$status" = completed ] && [ "$code" = 0 ]; then
        record FAIL "$1" "it succeeded (exit 0): $output"
    else
        record PASS "$1" "refused (status=$status exit=$code): $output"
    fi
}

if [ -n "$device_id" ]; then
    # shellcheck disable=SC2016 # expanded by the command's shell on the Mac, not here
    expect_ok sandbox 'echo hello from $(uname -s)' 30 "hello from Darwin"
    expect_ok internet 'curl -sS -o /dev/null -w "%{http_code}" https://example.com/' 60 200
    expect_ok git-clone 'git clone --depth 1 https://github.com/octocat/Hello-World.git hello && ls hello' 120 README
    expect_ok npm-install 'mkdir -p app && cd app && echo "{\"name\":\"live\",\"version\":\"1.0.0\",\"scripts\":{\"test\":\"node test.js\"}}" > package.json && echo "require(\"is-number\")(1) || process.exit(1); console.log(\"npm test ok\")" > test.js && npm install --no-audit --no-fund is-number@7.0.0' 180
    expect_ok npm-test 'cd app && npm test' 120 "npm test ok"
    expect_refused ssh-key-fixture "cat '$fixture'" "$secret"
    expect_refused ssh-dir-listing 'ls ~/.ssh'
    expect_refused open-calculator 'open -a Calculator'
    expect_refused osascript-finder "osascript -e 'tell application \"Finder\" to get name of every window'"
    expect_refused pbpaste 'pbpaste'
    expect_refused pbcopy 'echo agentworks-live | pbcopy'
    expect_refused keychain 'security find-generic-password -s agentworks'
    expect_refused write-outside "touch '$live/outside-write' && ls '$live/outside-write'"
    expect_refused cli-state 'ls ~/Library/Application\ Support/agentworks'
    # A known gap, reported and not counted: Unix sockets are not restricted on macOS, so a
    # socket outside the folder whose path the command knows is reachable (README).
    sock="$live/outside.sock"
    python3 -c 'import socket,sys,time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.sendall(b"reached\n"); time.sleep(1)' "$sock" 2>/dev/null &
    listener=$!
    sleep 1
    run "nc -U '$sock' </dev/null"
    kill "$listener" 2>/dev/null
    if [[ "$output" == *reached* ]]; then
        info unix-socket-outside "reachable (known: the macOS profile does not restrict Unix sockets)"
    else
        info unix-socket-outside "not reached (status=$status exit=$code): $output"
    fi
    # Ending a command's whole tree on timeout: a background sleeper must not outlive it.
    marker="agentworks-live-sleeper-$run_id"
    run "(sh -c 'sleep 300; : $marker' &) ; sleep 300" 2
    sleep 2
    if pgrep -f "$marker" >/dev/null; then
        record FAIL timeout-kills-tree "a process of the timed-out command is still running ($(pgrep -f "$marker" | tr '\n' ' '))"
        pkill -f "$marker"
    else
        record PASS timeout-kills-tree "status=$status; nothing of the command is left"
    fi
fi

echo
echo "----- agentworks macOS live check: summary (paste into a bug report) -----"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "macOS: $(sw_vers -productVersion 2>/dev/null) ($(uname -m)); agentworks: $("$bin" --version 2>/dev/null)"
echo "server: $server; device: ${device_id:-none}"
printf '%s' "$results"
echo "passed: $passed, failed: $failed"
if [ "$failed" -gt 0 ]; then
    echo "executor log (last 20 lines):"
    tail -n 20 "$log" | sed 's/^/  /'
fi
[ "$failed" -eq 0 ]
