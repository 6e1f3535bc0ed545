#!/bin/sh
# The proof under a real systemd (issue 6): build the .deb, install it into a minimal Debian 12
# root, boot that root with systemd-nspawn and drive agentworks as an operator would.
#
#   1. `dpkg-buildpackage -us -uc -b` on a copy of this tree (release build; CARGO_TARGET_DIR,
#      default <repo>/target, is reused so a rebuild only recompiles agentworks).
#   2. `debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,libpam-systemd,
#      libnss-systemd bookworm` (about a minute), or a copy of AW_PROOF_BASE_ROOT if set.
#   3. `dpkg -i` the agentworks .deb in the root (chroot), boot it with
#      `systemd-nspawn -b --register=no --keep-unit --private-network` in a cgroup of its own,
#      and run commands in it with `nsenter -t <container PID 1> -a`.
#   4. `systemctl start agentworks.target`: every service active (Type=notify, so READY=1 was
#      received) and every socket unit listening.
#   5. agentworksctl: a user, a project, a token; `write_file` through the MCP endpoint
#      (POST /mcp on 127.0.0.1:8470 inside the container's network namespace).
#   6. `journalctl MESSAGE_ID=<write id> AGENTWORKS_REQUEST_ID=<request id>` finds the audit entry.
#   7. `systemctl restart agentworks-workspaced.service` and, while it restarts, a request on
#      /run/agentworks/workspaced.sock (reached through /proc/<leader>/root) waits and is answered.
#   8. `systemctl stop agentworks.target`: every unit inactive, none failed; then poweroff and
#      removal of everything under the temporary directory.
#
# Run it by hand, as root, on a Debian 12 host with systemd-container, debootstrap, dpkg-dev,
# debhelper, curl and cargo (Rust >= 1.95) installed:
#
#   tests/systemd_proof.sh
#   AW_PROOF_BASE_ROOT=/tmp/aw/deb12 tests/systemd_proof.sh   # reuse a debootstrapped root
#   AW_PROOF_DEB_DIR=/path/with/debs tests/systemd_proof.sh   # reuse built agentworks_*.deb
#   AW_PROOF_KEEP=1 tests/systemd_proof.sh                    # keep the temp dir for a post-mortem
#
# PID 1 of the host need not be systemd (hence --register=no --keep-unit). Not run by .ci/run.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/agentworks-proof.XXXXXX)
root=$work/root
cg=agentworks-proof-$$
nspawn_pid=
leader=
start=$(date +%s)

log() { echo "proof: $*" >&2; }
die() {
    echo "proof: FAIL: $*" >&2
    exit 1
}

cleanup() {
    status=$?
    # A clean poweroff: SIGTERM makes nspawn ask the container to halt (SIGRTMIN+3 to its PID 1).
    if [ -n "$nspawn_pid" ]; then
        kill -TERM "$nspawn_pid" 2>/dev/null || true
        i=0
        while kill -0 "$nspawn_pid" 2>/dev/null && [ $i -lt 30 ]; do
            sleep 1
            i=$((i + 1))
        done
        kill -KILL "$nspawn_pid" 2>/dev/null || true
        wait "$nspawn_pid" 2>/dev/null || true
    fi
    # Whatever is left in our cgroup (a container that would not halt) is killed by pid, then
    # the cgroups the container's systemd made are removed, deepest first.
    for h in $(cgroup_dirs); do
        [ -d "$h/$cg" ] || continue
        for p in $(find "$h/$cg" -name cgroup.procs -exec cat {} \; 2>/dev/null); do
            kill -KILL "$p" 2>/dev/null || true
        done
    done
    sleep 0.5
    for h in $(cgroup_dirs); do
        [ -d "$h/$cg" ] && find "$h/$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    if [ -n "${AW_PROOF_KEEP:-}" ]; then
        log "kept $work"
    else
        rm -rf "$work"
    fi
    log "took $(($(date +%s) - start)) s"
    exit $status
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The cgroup hierarchies to place the container in: the unified one (pure cgroup2), or on a hybrid
# host the named systemd hierarchy and the unified one.
cgroup_dirs() {
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        echo /sys/fs/cgroup
    else
        for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
            [ -d "$h" ] && echo "$h"
        done
    fi
}

# Runs a command inside the booted container.
in_ct() { nsenter -t "$leader" -a "$@"; }

# --- 1. the .deb -------------------------------------------------------------------------------
if [ -n "${AW_PROOF_DEB_DIR:-}" ]; then
    debs=$AW_PROOF_DEB_DIR
    log "using the .debs in $debs"
else
    log "building the .deb"
    mkdir -p "$work/src/agentworks-0.1.0"
    tar -C "$repo" --exclude=./target --exclude=./.git -cf - . | tar -C "$work/src/agentworks-0.1.0" -xf -
    (
        cd "$work/src/agentworks-0.1.0"
        CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target} dpkg-buildpackage -us -uc -b
    ) >"$work/build.log" 2>&1 || {
        tail -40 "$work/build.log" >&2
        die "dpkg-buildpackage failed"
    }
    debs=$work/src
fi
deb=$(ls "$debs"/agentworks_*.deb | head -1)
[ -f "$deb" ] || die "no agentworks_*.deb in $debs"

# --- 2. the root -------------------------------------------------------------------------------
if [ -n "${AW_PROOF_BASE_ROOT:-}" ]; then
    log "copying $AW_PROOF_BASE_ROOT"
    cp -a "$AW_PROOF_BASE_ROOT" "$root"
    # A root from an earlier run: start from no agentworks at all.
    chroot "$root" dpkg --purge agentworks agentworks-cli >/dev/null 2>&1 || true
    rm -rf "$root/var/lib/agentworks" "$root/var/lib/agentworks-documents" "$root/etc/agentworks"
    # No lingering users: their user units would take the public ports first.
    rm -f "$root"/var/lib/systemd/linger/*
else
    log "debootstrap bookworm"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,libpam-systemd,libnss-systemd \
        bookworm "$root" >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log" >&2
        die "debootstrap failed"
    }
fi

# --- 3. install, boot --------------------------------------------------------------------------
log "installing $(basename "$deb")"
cp "$deb" "$root/tmp/agentworks.deb"
chroot "$root" dpkg -i --force-confnew /tmp/agentworks.deb >"$work/dpkg.log" 2>&1 || {
    cat "$work/dpkg.log" >&2
    die "dpkg -i failed"
}
rm -f "$root/tmp/agentworks.deb"

log "booting"
for h in $(cgroup_dirs); do mkdir -p "$h/$cg"; done
# shellcheck disable=SC2016
sh -c 'for h in '"$(cgroup_dirs | tr '\n' ' ')"'; do echo $$ >"$h/'"$cg"'/cgroup.procs"; done
       exec systemd-nspawn -q -D "$1" -b --register=no --keep-unit --private-network -M "$2"' \
    sh "$root" "agentworks-proof-$$" </dev/null >"$work/boot.log" 2>&1 &
nspawn_pid=$!

# The container's PID 1: a child of nspawn whose pid in its own namespace is 1.
i=0
while [ -z "$leader" ] && [ $i -lt 100 ]; do
    for p in $(pgrep -P "$nspawn_pid" 2>/dev/null); do
        if grep -Eq '^NSpid:.*[[:space:]]1$' "/proc/$p/status" 2>/dev/null; then leader=$p; fi
    done
    [ -n "$leader" ] || sleep 0.1
    i=$((i + 1))
done
[ -n "$leader" ] || {
    cat "$work/boot.log" >&2
    die "the container did not start"
}
# systemctl fails until PID 1 listens on its private socket, so ask again until it answers.
state=
i=0
while [ $i -lt 120 ]; do
    state=$(in_ct timeout 60 systemctl is-system-running --wait 2>/dev/null || true)
    case $state in running | degraded) break ;; esac
    sleep 0.5
    i=$((i + 1))
done
case $state in
running | degraded) log "booted ($state), leader $leader" ;;
*)
    cat "$work/boot.log" >&2
    die "the container did not boot: $state"
    ;;
esac

# --- 4. the target -----------------------------------------------------------------------------
in_ct systemctl start agentworks.target || die "systemctl start agentworks.target failed"
for svc in workspaced agentd gatewayd; do
    unit=agentworks-$svc.service
    # The target wants the services without waiting for them: give each up to 60 s.
    i=0
    while :; do
        active=$(in_ct systemctl show -P ActiveState "$unit")
        case $active in active | failed) break ;; esac
        [ $i -lt 120 ] || break
        sleep 0.5
        i=$((i + 1))
    done
    type=$(in_ct systemctl show -P Type "$unit")
    [ "$active" = active ] && [ "$type" = notify ] || {
        in_ct journalctl -u "$unit" --no-pager | tail -20 >&2
        die "$unit: $active ($type)"
    }
    log "$unit active (Type=notify: READY=1 received)"
done
for sock in $(in_ct systemctl list-units --plain --no-legend 'agentworks-*.socket' | awk '{print $1}'); do
    [ "$(in_ct systemctl show -P ActiveState "$sock")" = active ] || die "$sock not active"
    log "$sock listening"
done

# --- 5. a write through MCP --------------------------------------------------------------------
in_ct agentworksctl status >/dev/null || die "agentworksctl status failed"
in_ct agentworksctl user add alice >/dev/null || die "user add"
in_ct agentworksctl project add demo --kind code --owner alice --write-path code >/dev/null ||
    die "project add"
token=$(in_ct agentworksctl token create --user alice --scope workflows:write --project demo |
    grep -Eo 'aw[a-z]*_[A-Za-z0-9_-]{16,}' | head -1) || true
[ -n "$token" ] || token=$(in_ct agentworksctl token create --user alice --scope workflows:write \
    --project demo | tail -1 | awk '{print $NF}')
[ -n "$token" ] || die "no token from agentworksctl"
request_id=proof-$$-$(date +%s)
body='{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"workflow_id":"demo","path":"code/hello.txt","content":"hello from the proof\n","expected_revision":"missing","request_id":"'$request_id'"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
answer=$(nsenter -t "$leader" -n curl -sS -X POST http://127.0.0.1:8470/mcp \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
    -H 'Mcp-Method: tools/call' -H 'Mcp-Name: write_file' --data "$body") || die "curl failed"
case $answer in
*'"isError":true'* | *'"error"'*) die "write_file failed: $answer" ;;
esac
[ "$(cat "$root/var/lib/agentworks-documents/demo/code/hello.txt" 2>/dev/null ||
    in_ct sh -c 'cat /var/lib/agentworks-documents/*/code/hello.txt')" = "hello from the proof" ] ||
    die "the file is not on disk: $answer"
log "wrote code/hello.txt through MCP (request $request_id)"

# --- 6. the audit entry ------------------------------------------------------------------------
write_id=$(sed -n 's/^pub const WRITE: &str = "\([0-9a-f]*\)";/\1/p' "$repo/src/daemon/audit.rs")
entry=
i=0
while [ -z "$entry" ] && [ $i -lt 20 ]; do
    entry=$(in_ct journalctl --no-pager -o verbose MESSAGE_ID="$write_id" \
        AGENTWORKS_REQUEST_ID="$request_id" 2>/dev/null | grep -v '^-- No entries --' || true)
    [ -n "$entry" ] || sleep 0.5
    i=$((i + 1))
done
[ -n "$entry" ] || {
    in_ct journalctl --no-pager -o verbose -t agentworks-workspaced | tail -40 >&2
    die "no journal entry MESSAGE_ID=$write_id AGENTWORKS_REQUEST_ID=$request_id"
}
printf '%s\n' "$entry" | grep -q 'AGENTWORKS_PATH=code/hello.txt' || die "audit entry: $entry"
printf '%s\n' "$entry" | grep -q 'hello from the proof' && die "file contents in the journal"
printf '%s\n' "$entry" | grep -qF "$token" && die "the token in the journal"
log "audit entry found: journalctl MESSAGE_ID=$write_id AGENTWORKS_REQUEST_ID=$request_id"

# --- 7. a restart loses no request -------------------------------------------------------------
sock=/proc/$leader/root/run/agentworks/workspaced.sock
in_ct systemctl restart --no-block agentworks-workspaced.service
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 30 --unix-socket "$sock" \
    http://localhost/v1/health) || die "a request during the restart failed (curl $?)"
case $code in
2?? | 4??) log "a request on workspaced.sock during the restart was answered (HTTP $code)" ;;
*) die "a request during the restart got HTTP $code" ;;
esac
in_ct timeout 30 sh -c 'until systemctl is-active -q agentworks-workspaced.service; do sleep 0.2; done' ||
    die "workspaced did not come back"

# --- 8. a clean stop ---------------------------------------------------------------------------
in_ct systemctl stop agentworks.target || die "systemctl stop agentworks.target failed"
for unit in $(in_ct systemctl list-unit-files --plain --no-legend 'agentworks*' | awk '{print $1}'); do
    case $unit in *@*) continue ;; esac
    active=$(in_ct systemctl show -P ActiveState "$unit")
    result=$(in_ct systemctl show -P Result "$unit")
    [ "$active" = inactive ] || die "$unit is $active after stop"
    [ -z "$result" ] || [ "$result" = success ] || die "$unit ended with $result"
done
log "agentworks.target stopped: every unit inactive, none failed"
log "PASS"
