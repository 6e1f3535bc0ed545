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
#   4. Nothing is enabled or running after installation. `systemctl start agentworks.target`:
#      every service active (Type=notify, so READY=1 was
#      received) and every socket unit listening; runnerd answers /v1/health on runnerd.sock
#      and made its state, runner/ and runner/runtimes/ (0700, agentworks-files).
#   5. agentworksctl: a user, a project, a token; `write_file` through the MCP endpoint
#      (POST /mcp on 127.0.0.1:8470 inside the container's network namespace); then an ACL
#      entry and the group survive a second write (under RestrictSUIDSGID=yes, without
#      PrivateUsers=).
#   6. `journalctl MESSAGE_ID=<write id> AGENTWORKS_REQUEST_ID=<request id>` finds the audit entry.
#      The laptop CLI the package carries is served by the hardened agentd: GET /v1/cli offers
#      this machine's architecture with the SHA-256 of the installed file, and its install line,
#      run by nobody in the container's network namespace, installs that file.
#   7. `systemctl restart agentworks-workspaced.service` slowed by a test drop-in: a request on
#      /run/agentworks/workspaced.sock (reached through /proc/<leader>/root) sent after the old
#      process exited and before the new one serves waits in the backlog and is answered by
#      the new process.
#   8. The template unit for extra gatewayd hosts: /etc/agentworks/gatewayd-gw2.toml (the
#      shipped config with its own listen port, socket and state root, and, when this host has
#      PostgreSQL's and nats-server's binaries, a [cluster]: a PostgreSQL run here as user
#      postgres whose Unix socket lies inside the root, a nats-server copied into the root and
#      run there); `systemctl start agentworks-gatewayd@gw2`: active (READY=1), both
#      listeners bound by itself, /v1/health answered on its socket, its WebSocket port
#      answering, (cluster) its row in gateway_hosts; `systemctl stop`: inactive, exit 0, its
#      runtime directory gone. The main gatewayd restarted with the shipped
#      gatewayd-cluster.conf drop-in is active with the network it grants.
#   9. `systemctl stop agentworks.target`: every unit inactive, none failed (gatewayd@gw2,
#      started again, too: PartOf=).
#  10. An edited /etc/agentworks/agentworks.toml survives reinstalling the package, which starts
#      nothing.
#  11. The user units, rootless: a lingering user starts agentworks.target with
#      `systemctl --user`, every service active, sockets in /run/user/<uid>/agentworks, an MCP
#      write_file lands under ~/.local/state owned by the user, `systemctl --user stop`; then
#      poweroff and removal of everything under the temporary directory.
#
# Run it by hand, as root, on a Debian 12 host with systemd-container, debootstrap, dpkg-dev,
# debhelper, curl and cargo (Rust >= 1.95) installed:
#
#   tests/systemd_proof.sh
#   AW_PROOF_BASE_ROOT=/tmp/aw/deb12 tests/systemd_proof.sh   # reuse a debootstrapped root
#   AW_PROOF_DEB_DIR=/path/with/debs tests/systemd_proof.sh   # reuse built agentworks_*.deb
#   AW_PROOF_KEEP=1 tests/systemd_proof.sh                    # keep the temp dir for a post-mortem
#
# PID 1 of the host need not be systemd (hence --register=no --keep-unit). .ci/run runs it after
# the test suite. A host that cannot run it (not root, no writable cgroup file system, no
# systemd-nspawn) is reported and the script exits 77 without pretending it passed.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/agentworks-proof.XXXXXX)
root=$work/root
cg=agentworks-proof-$$
nspawn_pid=
leader=
pg_pid=
pg_dir=
cli_home=
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
    # The PostgreSQL of step 8, if any (ours, by pid).
    if [ -n "$pg_pid" ]; then
        kill -TERM "$pg_pid" 2>/dev/null || true
        i=0
        while kill -0 "$pg_pid" 2>/dev/null && [ $i -lt 20 ]; do
            sleep 0.5
            i=$((i + 1))
        done
        kill -KILL "$pg_pid" 2>/dev/null || true
    fi
    [ -z "$pg_dir" ] || rm -rf "$pg_dir"
    [ -z "$cli_home" ] || rm -rf "$cli_home"
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

# --- 0. can this host boot a container at all? -------------------------------------------------
cannot() {
    echo "proof: NOT RUN: $*" >&2
    exit 77
}
[ "$(id -u)" = 0 ] || cannot "needs root (debootstrap, systemd-nspawn, cgroups)"
for tool in systemd-nspawn debootstrap dpkg-buildpackage nsenter curl python3 setfacl getfacl; do
    command -v "$tool" >/dev/null || cannot "$tool is not installed"
done
for h in $(cgroup_dirs); do
    mkdir "$h/$cg" 2>/dev/null && rmdir "$h/$cg" || cannot "cannot create a cgroup under $h"
done
[ -n "$(cgroup_dirs)" ] || cannot "no cgroup file system under /sys/fs/cgroup"

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
# The package enabled and started nothing: that is the operator's decision.
for unit in agentworks.target agentworks-workspaced.service agentworks-agentd.service \
    agentworks-gatewayd.service agentworks-runnerd.service agentworks-workspaced.socket \
    agentworks-agentd.socket agentworks-gatewayd.socket agentworks-runnerd.socket \
    agentworks-gatewayd@gw2.service; do
    enabled=$(in_ct systemctl is-enabled "$unit" 2>/dev/null || true)
    active=$(in_ct systemctl show -P ActiveState "$unit")
    [ "$enabled" != enabled ] && [ "$active" = inactive ] ||
        die "$unit is $enabled/$active after installing the package"
done
log "after installation nothing is enabled or running"
in_ct systemctl start agentworks.target || die "systemctl start agentworks.target failed"
for svc in workspaced agentd gatewayd runnerd; do
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
    # Its ready entry says where its listeners came from: systemd, every one.
    origins=$(in_ct journalctl --no-pager -o verbose -u "$unit" |
        grep -Eo '(SOCKET|PUBLIC)_ACTIVATED=[a-z]+' | sort -u | tr '\n' ' ')
    case $origins in
    *SOCKET_ACTIVATED=true*) ;;
    *) die "$unit did not log a socket-activated listener: $origins" ;;
    esac
    case $origins in *=false*) die "$unit bound a listener itself: $origins" ;; esac
    log "$unit active (Type=notify: READY=1 received), listeners from its socket units: $origins"
done
for sock in $(in_ct systemctl list-units --plain --no-legend 'agentworks-*.socket' | awk '{print $1}'); do
    [ "$(in_ct systemctl show -P ActiveState "$sock")" = active ] || die "$sock not active"
    log "$sock listening"
done
# runnerd (the documents' user) answers on its socket, 0660 for group agentworks, and made its
# private state: runner/ (systemd's StateDirectory=) and runner/runtimes/ (its own), both 0700.
out=$(curl -sS --max-time 10 --unix-socket "/proc/$leader/root/run/agentworks/runnerd.sock" \
    http://localhost/v1/health) || die "GET /v1/health on runnerd.sock failed"
[ "$(in_ct stat -c '%a %U %G' /run/agentworks/runnerd.sock)" = "660 agentworks-files agentworks" ] ||
    die "runnerd.sock is $(in_ct stat -c '%a %U %G' /run/agentworks/runnerd.sock)"
for dir in /var/lib/agentworks/runner /var/lib/agentworks/runner/runtimes; do
    [ "$(in_ct stat -c '%a %U' "$dir")" = "700 agentworks-files" ] ||
        die "$dir is $(in_ct stat -c '%a %U' "$dir" 2>&1)"
done
log "runnerd answers /v1/health on runnerd.sock ($out); runner/ and runner/runtimes/ are 0700 agentworks-files"

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
# write_file through the MCP endpoint (inside the container's network namespace); prints the
# JSON-RPC answer. Arguments: path, content, expected revision, request id.
mcp_write() {
    body=$(python3 -c 'import json, sys
path, content, expected, request_id = sys.argv[1:]
print(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "write_file",
    "arguments": {"workflow_id": "demo", "path": path, "content": content,
                  "expected_revision": expected, "request_id": request_id},
    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
              "io.modelcontextprotocol/clientCapabilities": {}}}}))' "$@")
    nsenter -t "$leader" -n curl -sS -X POST http://127.0.0.1:8470/mcp \
        -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
        -H 'Mcp-Method: tools/call' -H 'Mcp-Name: write_file' --data "$body"
}
# The resulting revision of a successful write_file answer; fails on an error answer.
written_revision() {
    printf '%s' "$1" | python3 -c 'import json, sys
answer = json.load(sys.stdin)
result = answer["result"]
assert not result.get("isError"), result
print(result["structuredContent"]["revision"])'
}

request_id=proof-$$-$(date +%s)
answer=$(mcp_write code/hello.txt 'hello from the proof
' missing "$request_id") || die "curl failed"
revision=$(written_revision "$answer") || die "write_file failed: $answer"
file=$(ls -d "$root"/var/lib/agentworks-documents/*/code/hello.txt "$root"/var/lib/agentworks-documents/code/hello.txt 2>/dev/null | head -1)
[ -n "$file" ] && [ "$(cat "$file")" = "hello from the proof" ] ||
    die "the file is not on disk: $answer"
log "wrote code/hello.txt through MCP (request $request_id, revision $revision)"

# Ownership and ACLs survive a replace under the hardened unit (RestrictSUIDSGID=yes, so paths
# are confined by the openat walk; no PrivateUsers=): an ACL entry for another user and the
# group are kept.
setfacl -m u:65534:r "$file" || die "setfacl on $file"
group_before=$(stat -c %g "$file")
answer=$(mcp_write code/hello.txt 'hello again
' "$revision" "$request_id-2") || die "curl failed"
written_revision "$answer" >/dev/null || die "the second write_file failed: $answer"
[ "$(cat "$file")" = "hello again" ] || die "the second write is not on disk"
getfacl -n "$file" 2>/dev/null | grep -q '^user:65534:r--' ||
    die "the ACL entry was lost: $(getfacl -n "$file" 2>&1)"
[ "$(stat -c %g "$file")" = "$group_before" ] || die "the group changed"
log "replaced code/hello.txt: its ACL entry (user:65534:r--) and group kept"

# --- 6. the audit entry ------------------------------------------------------------------------
write_id=$(sed -n 's/^pub const WRITE: &str = "\([0-9a-f]*\)";/\1/p' "$repo/crates/daemon/src/audit.rs")
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

# The laptop CLI the package carries, served by agentd under its hardened unit: the manifest
# offers this machine's architecture with the SHA-256 of the file the package installed, and
# the manifest's install line, run by a user without root (nobody, a home of its own) in the
# container's network namespace, installs that very file.
arch=$(uname -m)
packaged=$root/usr/lib/agentworks/cli/agentworks-linux-$arch
[ -f "$packaged" ] || die "the package did not install /usr/lib/agentworks/cli/agentworks-linux-$arch"
manifest=$(nsenter -t "$leader" -n curl -fsS http://127.0.0.1:8470/v1/cli) || die "GET /v1/cli failed"
line=$(printf '%s' "$manifest" | python3 -c 'import json, sys
offered = [b for b in json.load(sys.stdin)["binaries"] if b["arch"] == sys.argv[1]]
assert offered and offered[0]["sha256"] == sys.argv[2], offered
print(offered[0]["install"])' "$arch" "$(sha256sum <"$packaged" | cut -d' ' -f1)") ||
    die "the manifest does not offer the packaged CLI for $arch: $manifest"
cli_home=$(mktemp -d /var/tmp/agentworks-proof-cli.XXXXXX)
chown nobody:nogroup "$cli_home"
nsenter -t "$leader" -n setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env -i HOME="$cli_home" PATH=/usr/bin:/bin sh -c "$line" >"$work/cli-install.log" 2>&1 ||
    die "the install line failed: $(cat "$work/cli-install.log")"
cmp -s "$cli_home/.local/bin/agentworks" "$packaged" ||
    die "the install line did not install the packaged CLI: $(cat "$work/cli-install.log")"
log "agentd serves the packaged CLI (linux-$arch); its install line installed it as nobody"
rm -rf "$cli_home"
cli_home=

# --- 7. a restart loses no request -------------------------------------------------------------
# A drop-in for this test only slows the start down (ExecStartPre= sleeps), so the request below
# certainly arrives after the old process is gone and before the new one serves: it can only be
# answered by waiting in the socket's backlog.
# (In /etc: the container's /run is a tmpfs the host does not see through $root.)
unit=agentworks-workspaced.service
dropin=$root/etc/systemd/system/$unit.d
mkdir -p "$dropin"
printf '[Service]\nExecStartPre=/bin/sleep 3\n' >"$dropin/proof-slow-start.conf"
in_ct systemctl daemon-reload
old_pid=$(in_ct systemctl show -P MainPID "$unit")
[ "$old_pid" -gt 0 ] || die "no MainPID for $unit"
in_ct systemctl restart --no-block "$unit"
i=0
while in_ct test -d "/proc/$old_pid" && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
in_ct test -d "/proc/$old_pid" && die "the old workspaced ($old_pid) did not exit"
sub=$(in_ct systemctl show -P SubState "$unit")
[ "$sub" = start-pre ] || {
    in_ct systemctl cat "$unit" >&2
    die "$unit is $sub, not in its (slowed) ExecStartPre=, when the request is sent"
}
sock=/proc/$leader/root/run/agentworks/workspaced.sock
out=$(curl -sS -o /dev/null -w '%{http_code} %{time_total}' --max-time 30 --unix-socket "$sock" \
    http://localhost/v1/health) || die "a request during the restart failed (curl $?)"
new_pid=$(in_ct systemctl show -P MainPID "$unit")
[ "${out%% *}" = 200 ] || die "a request during the restart got HTTP ${out%% *}"
[ "$new_pid" -gt 0 ] && [ "$new_pid" != "$old_pid" ] || die "MainPID $new_pid after the restart"
log "a request sent while workspaced was down waited ${out#* } s and was answered by the new process ($old_pid -> $new_pid)"
rm -r "$dropin"
in_ct systemctl daemon-reload

# --- 8. an extra gatewayd host: the template unit --------------------------------------------------
# agentworks-gatewayd@gw2.service reads /etc/agentworks/gatewayd-gw2.toml and binds its own
# listeners (no socket units), beside the running gatewayd: another port, a socket in its own
# runtime directory, a state root of its own (its StateDirectory=).
gw2=agentworks-gatewayd@gw2.service
gw2_port=8481
gw2_sock=/run/agentworks/gatewayd-gw2/gatewayd.sock
gw2_config=$root/etc/agentworks/gatewayd-gw2.toml
sed -e '1i state_root = "/var/lib/agentworks/gateway-gw2"' \
    -e '/^\[gatewayd\]$/a listen = "127.0.0.1:'"$gw2_port"'"\nsocket = "'"$gw2_sock"'"' \
    "$root/etc/agentworks/agentworks.toml" >"$gw2_config"
# A cluster when this host can run one: PostgreSQL from /usr/lib/postgresql/<version>/bin, as
# user postgres, listening only on a Unix socket inside the root (the container has no network
# but its own loopback; a socket is reached through the file system), and nats-server, copied
# into the root and run there as a transient unit on the container's loopback.
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
cluster=
if [ -n "$pg_bin" ] && [ -x "$pg_bin/postgres" ] && command -v nats-server >/dev/null &&
    id postgres >/dev/null 2>&1; then
    cluster=yes
fi
if [ -n "$cluster" ]; then
    pg_dir=$(mktemp -d /var/tmp/agentworks-proof-pg.XXXXXX)
    pg_sock=/var/lib/agentworks-proof-pg
    chown postgres: "$pg_dir"
    # postgres makes its socket inside the root: it must pass through $work (0700).
    chmod 0711 "$work"
    mkdir -p "$root$pg_sock"
    chown postgres: "$root$pg_sock"
    as_postgres() { setpriv --reuid=postgres --regid=postgres --clear-groups env -i \
        PATH=/usr/bin:/bin LANG=C.UTF-8 "$@"; }
    as_postgres "$pg_bin/initdb" --pgdata "$pg_dir/data" --username agentworks --auth trust \
        --encoding UTF8 --locale C --no-sync >"$work/initdb.log" 2>&1 || {
        cat "$work/initdb.log" >&2
        die "initdb failed"
    }
    # Not through as_postgres: a function run with & is a subshell, and $! must be postgres
    # itself (setpriv and env exec it) for the cleanup to stop it.
    setpriv --reuid=postgres --regid=postgres --clear-groups env -i PATH=/usr/bin:/bin \
        LANG=C.UTF-8 "$pg_bin/postgres" -D "$pg_dir/data" -c listen_addresses= \
        -c "unix_socket_directories=$root$pg_sock" -c fsync=off </dev/null \
        >"$pg_dir/postgres.log" 2>&1 &
    pg_pid=$!
    i=0
    until "$pg_bin/pg_isready" -q -h "$root$pg_sock" -U agentworks; do
        [ $i -lt 60 ] || {
            cat "$pg_dir/postgres.log" >&2
            die "postgres did not start"
        }
        sleep 0.5
        i=$((i + 1))
    done
    "$pg_bin/psql" -q -h "$root$pg_sock" -U agentworks -d postgres \
        -c 'CREATE DATABASE agentworks' || die "CREATE DATABASE agentworks"
    cp "$(command -v nats-server)" "$root/usr/local/bin/nats-server"
    in_ct systemd-run -q --unit=proof-nats /usr/local/bin/nats-server -a 127.0.0.1 -p 4222 \
        -m 8222 || die "systemd-run nats-server"
    i=0
    until nsenter -t "$leader" -n curl -sf -o /dev/null http://127.0.0.1:8222/healthz; do
        [ $i -lt 60 ] || die "nats-server did not start"
        sleep 0.5
        i=$((i + 1))
    done
    # The shipped file has [cluster] with every key commented out.
    sed -i -e '/^\[cluster\]$/a database_url = "postgres://agentworks@'"$(printf %s "$pg_sock" |
        sed 's|/|%2F|g')"'/agentworks"\nnats_url = "nats://127.0.0.1:4222"\nhost_id = "gw2"' \
        "$gw2_config"
    log "PostgreSQL $(basename "$(dirname "$pg_bin")") on $pg_sock and nats-server on 127.0.0.1:4222 for gw2's [cluster]"
else
    log "no PostgreSQL or nats-server binaries here: gw2 runs without [cluster]"
fi
in_ct systemctl start "$gw2" || {
    in_ct journalctl -u "$gw2" --no-pager | tail -20 >&2
    die "systemctl start $gw2 failed"
}
active=$(in_ct systemctl show -P ActiveState "$gw2")
type=$(in_ct systemctl show -P Type "$gw2")
[ "$active" = active ] && [ "$type" = notify ] || die "$gw2: $active ($type)"
# (journald may file the entry a moment after READY=1 is handled.)
ready=
i=0
while [ -z "$ready" ] && [ $i -lt 20 ]; do
    ready=$(in_ct journalctl --no-pager -o verbose -u "$gw2" MESSAGE='gatewayd ready' 2>/dev/null |
        grep -v '^-- No entries --' || true)
    [ -n "$ready" ] || sleep 0.5
    i=$((i + 1))
done
[ -n "$ready" ] || die "no 'gatewayd ready' entry for $gw2"
origins=$(printf '%s\n' "$ready" | grep -Eo '(SOCKET|PUBLIC)_ACTIVATED=[a-z]+' | sort -u |
    tr '\n' ' ')
[ "$origins" = "PUBLIC_ACTIVATED=false SOCKET_ACTIVATED=false " ] ||
    die "$gw2 did not bind both listeners itself: $origins"
store=$(printf '%s\n' "$ready" | sed -n 's/^ *STORE=//p' | head -1)
if [ -n "$cluster" ]; then
    [ "$store" = postgres ] || die "$gw2 runs on store '$store', not postgres"
else
    [ "$store" = sqlite ] || die "$gw2 runs on store '$store', not sqlite"
fi
log "$gw2 active (Type=notify: READY=1 received), both listeners bound by itself, store $store"
# Its socket answers, 0660 in its own runtime directory; its port is its own.
out=$(curl -sS --max-time 10 --unix-socket "/proc/$leader/root$gw2_sock" \
    http://localhost/v1/health) || die "GET /v1/health on $gw2_sock failed"
[ "$(in_ct stat -c '%a %U' "$gw2_sock")" = "660 agentworks-gw" ] ||
    die "$gw2_sock is $(in_ct stat -c '%a %U' "$gw2_sock")"
code=$(nsenter -t "$leader" -n curl -sS -o /dev/null -w '%{http_code}' --max-time 10 \
    "http://127.0.0.1:$gw2_port/v1/executor") || die "nothing answers on 127.0.0.1:$gw2_port"
log "$gw2 answers /v1/health on $gw2_sock ($out) and HTTP $code on 127.0.0.1:$gw2_port"
if [ -n "$cluster" ]; then
    hosts=$("$pg_bin/psql" -At -h "$root$pg_sock" -U agentworks -d agentworks \
        -c 'SELECT host_id FROM gateway_hosts') || die "SELECT FROM gateway_hosts"
    [ "$hosts" = gw2 ] || die "gateway_hosts holds '$hosts', not gw2"
    # The only client of this nats-server is gw2.
    clients=$(nsenter -t "$leader" -n curl -sS --max-time 10 http://127.0.0.1:8222/connz |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["num_connections"])') ||
        die "nats-server's /connz"
    [ "$clients" = 1 ] || die "nats-server has $clients clients, not gw2 alone"
    log "gw2 has its row in PostgreSQL (gateway_hosts) and is nats-server's one client"
fi
[ "$(in_ct systemctl show -P ActiveState agentworks-gatewayd.service)" = active ] ||
    die "the main gatewayd is not active beside $gw2"
in_ct systemctl stop "$gw2" || die "systemctl stop $gw2 failed"
active=$(in_ct systemctl show -P ActiveState "$gw2")
result=$(in_ct systemctl show -P Result "$gw2")
status=$(in_ct systemctl show -P ExecMainStatus "$gw2")
[ "$active" = inactive ] && [ "$result" = success ] && [ "$status" = 0 ] ||
    die "$gw2 stopped as $active, $result, exit $status"
in_ct test -e /run/agentworks/gatewayd-gw2 && die "/run/agentworks/gatewayd-gw2 left after stop"
log "$gw2 stopped: inactive, exit 0, its runtime directory removed"
# The shipped drop-in for the main gatewayd in a cluster loads, and the unit runs with it.
main_dropin=$root/etc/systemd/system/agentworks-gatewayd.service.d
mkdir -p "$main_dropin"
cp "$root/usr/share/doc/agentworks/gatewayd-cluster.conf" "$main_dropin/cluster.conf" ||
    die "no /usr/share/doc/agentworks/gatewayd-cluster.conf in the package"
in_ct systemctl daemon-reload
in_ct systemctl restart agentworks-gatewayd.service || die "restart with gatewayd-cluster.conf"
[ "$(in_ct systemctl show -P ActiveState agentworks-gatewayd.service)" = active ] &&
    [ "$(in_ct systemctl show -P PrivateNetwork agentworks-gatewayd.service)" = no ] ||
    die "agentworks-gatewayd.service with gatewayd-cluster.conf: not active, or still no network"
log "agentworks-gatewayd.service active with gatewayd-cluster.conf (PrivateNetwork=no)"
rm -r "$main_dropin"
in_ct systemctl daemon-reload
# Started again, for step 9: stopping the target stops it too (PartOf=).
in_ct systemctl start "$gw2" || die "systemctl start $gw2 (again) failed"

# --- 9. a clean stop ---------------------------------------------------------------------------
# `systemctl stop agentworks.target` returns when the target's own job is done. The services'
# stop jobs (PartOf=) run beside it, and the target is ordered after them, so it stops first.
# A daemon may still be draining (deactivating) at that moment. Wait for every unit to settle,
# bounded by TimeoutStopSec= (30 s) plus a margin. A stop that hits the timeout ends with
# Result=timeout, which is checked below.
# settle CMD... : poll `CMD show -P ActiveState UNIT` for each unit in $settle_units.
settle() {
    started=$(date +%s)
    while :; do
        busy=
        for unit in $settle_units; do
            state=$("$@" show -P ActiveState "$unit")
            case $state in activating | deactivating | reloading) busy="$unit ($state)" ;; esac
        done
        [ -z "$busy" ] && break
        [ $(($(date +%s) - started)) -lt 40 ] || die "$busy has not settled 40 s after stop"
        sleep 0.2
    done
    log "every unit settled $(($(date +%s) - started)) s after systemctl stop returned"
}
in_ct systemctl stop agentworks.target || die "systemctl stop agentworks.target failed"
settle_units="$(in_ct systemctl list-unit-files --plain --no-legend 'agentworks*' |
    awk '$1 !~ /@/ {print $1}') $gw2"
settle in_ct systemctl
for unit in $settle_units; do
    active=$(in_ct systemctl show -P ActiveState "$unit")
    result=$(in_ct systemctl show -P Result "$unit")
    [ "$active" = inactive ] || die "$unit is $active after stop"
    [ -z "$result" ] || [ "$result" = success ] || die "$unit ended with $result"
done
log "agentworks.target stopped: every unit inactive, none failed"

# --- 10. an upgrade keeps the operator's configuration and starts nothing -------------------------
config=$root/etc/agentworks/agentworks.toml
printf '\n# edited by the operator (systemd proof)\n' >>"$config"
edited=$(sha256sum <"$config")
# (Not in /tmp: the container has its own tmpfs there.)
cp "$deb" "$root/root/agentworks.deb"
# stdin is /dev/null: a conffile prompt would fail the reinstall instead of hanging.
in_ct dpkg -i /root/agentworks.deb </dev/null >"$work/upgrade.log" 2>&1 || {
    cat "$work/upgrade.log" >&2
    die "reinstalling the package failed"
}
[ "$(sha256sum <"$config")" = "$edited" ] || die "the reinstall replaced the edited $config"
for unit in agentworks-workspaced.service agentworks-agentd.service agentworks-gatewayd.service \
    agentworks-runnerd.service; do
    [ "$(in_ct systemctl show -P ActiveState "$unit")" = inactive ] ||
        die "the reinstall started $unit"
done
log "reinstalling kept the edited agentworks.toml and started nothing"
rm -f "$root/root/agentworks.deb"

# --- 11. the same set as user units, rootless ----------------------------------------------------
# A lingering user's own systemd (user@.service) starts the user units of the package: state
# under ~/.local/state, sockets under /run/user/<uid>; the system target is stopped, so the
# public ports are free.
in_ct useradd -m -s /bin/sh carol || die "useradd carol"
carol=$(in_ct id -u carol)
in_ct loginctl enable-linger carol || die "loginctl enable-linger carol"
i=0
until [ "$(in_ct systemctl show -P ActiveState "user@$carol.service")" = active ]; do
    [ $i -lt 120 ] || die "user@$carol.service did not start"
    sleep 0.5
    i=$((i + 1))
done
as_carol() {
    in_ct setpriv --reuid=carol --regid=carol --init-groups env -i PATH=/usr/bin:/bin \
        HOME=/home/carol XDG_RUNTIME_DIR="/run/user/$carol" \
        AGENTWORKS_STATE_ROOT=/home/carol/.local/state/agentworks \
        AGENTWORKS_RUNTIME_DIR="/run/user/$carol/agentworks" "$@"
}
as_carol systemctl --user start agentworks.target || die "systemctl --user start agentworks.target"
for svc in workspaced agentd gatewayd runnerd; do
    unit=agentworks-$svc.service
    i=0
    while :; do
        active=$(as_carol systemctl --user show -P ActiveState "$unit")
        case $active in active | failed) break ;; esac
        [ $i -lt 120 ] || break
        sleep 0.5
        i=$((i + 1))
    done
    [ "$active" = active ] || {
        in_ct journalctl --no-pager _SYSTEMD_USER_UNIT="$unit" | tail -20 >&2
        die "user unit $unit: $active"
    }
    [ "$(as_carol stat -c %U "/run/user/$carol/agentworks/$svc.sock")" = carol ] ||
        die "$svc.sock is not carol's"
    log "user unit $unit active, its socket in /run/user/$carol/agentworks"
done
as_carol agentworksctl status >/dev/null || die "agentworksctl status as carol"
as_carol agentworksctl user add carol >/dev/null || die "user add (rootless)"
as_carol agentworksctl project add demo --kind code --owner carol --write-path code >/dev/null ||
    die "project add (rootless)"
token=$(as_carol agentworksctl token create --user carol --scope workflows:write --project demo |
    grep -Eo 'aw[a-z]*_[A-Za-z0-9_-]{16,}' | head -1) || true
[ -n "$token" ] || die "no token from agentworksctl (rootless)"
answer=$(mcp_write code/rootless.txt 'written by a rootless stack
' missing "proof-rootless-$$") || die "curl failed"
written_revision "$answer" >/dev/null || die "write_file (rootless) failed: $answer"
file=$(ls -d "$root"/home/carol/.local/state/agentworks-documents/*/code/rootless.txt \
    "$root"/home/carol/.local/state/agentworks-documents/code/rootless.txt 2>/dev/null | head -1)
[ "$(cat "$file" 2>/dev/null)" = "written by a rootless stack" ] ||
    die "the rootless write is not on disk: $answer"
[ "$(stat -c %u "$file")" = "$carol" ] || die "the rootless write is not owned by carol"
log "rootless: an MCP write_file landed in ~carol/.local/state/agentworks-documents, owned by carol"
as_carol systemctl --user stop agentworks.target || die "systemctl --user stop agentworks.target"
settle_units="agentworks-workspaced.service agentworks-agentd.service agentworks-gatewayd.service
    agentworks-runnerd.service"
settle as_carol systemctl --user
for svc in workspaced agentd gatewayd runnerd; do
    [ "$(as_carol systemctl --user show -P ActiveState "agentworks-$svc.service")" = inactive ] ||
        die "user unit agentworks-$svc.service still running after stop"
done
in_ct loginctl disable-linger carol
log "user units stopped"
log "PASS"
