#!/bin/sh
# Static checks of the systemd units and packaging files, no running systemd needed:
#
#   1. `systemd-analyze verify` of every system unit (units/) against a throw-away root that
#      holds the distribution's standard units and stand-in daemon binaries, of an instance of
#      the template agentworks-gatewayd@.service (gw2, so %i is expanded), of the main gatewayd
#      with packaging/gatewayd-cluster.conf as its drop-in, and of every user unit
#      (units/user/). verify exits 0 on unknown keys and bad values, so ANY output fails.
#   2. `systemd-analyze security --offline=yes` of each service, against its exposure goal
#      (workspaced and gatewayd <= 0.5, agentd <= 1.1, the gatewayd@gw2 instance <= 1.1, and
#      the main gatewayd with the cluster drop-in <= 1.1: a cluster gatewayd has the host's
#      network and Internet sockets, IP traffic limited to localhost; runnerd <= 2.2: it runs
#      coding CLIs with the network and no IP filter, makes the sandbox's user and mount
#      namespaces with the mount system calls, keeps capset, chown and setrlimit for the
#      sandbox and the commands, JIT memory, a delegated cgroup, UMask=0027, all of /proc).
#   3. systemd-sysusers and systemd-tmpfiles applied to the throw-away root with our
#      packaging/ files: they must succeed and print nothing.
#   4. packaging/agentworks.toml with every table and key uncommented, through the daemons'
#      own loader (agentworksctl, built here when AGENTWORKSCTL does not name one).
#
# Usage: tests/systemd_units.sh   (from anywhere; needs systemd >= 252's tools on the host)
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
root=$work/root
failed=0

fail() {
    echo "FAIL: $*" >&2
    failed=1
}

# The root: the host's standard units (multi-user.target, sockets.target, network-online.target…),
# ours, and executable stand-ins for the binaries (verify checks that ExecStart= exists).
mkdir -p "$root/usr/lib/systemd/system" "$root/usr/lib/systemd/user" "$root/usr/bin" \
    "$root/etc" "$work/xdg"
chmod 0700 "$work/xdg"
for dir in /usr/lib/systemd/system /lib/systemd/system; do
    if [ -d "$dir" ]; then
        find "$dir" -maxdepth 1 \( -name '*.target' -o -name '*.service' -o -name '*.socket' \
            -o -name '*.slice' -o -name '*.mount' -o -name '*.timer' \) \
            -exec cp -Pn {} "$root/usr/lib/systemd/system/" \;
    fi
done
for bin in agentworks-workspaced agentworks-agentd agentworks-gatewayd agentworks-runnerd; do
    printf '#!/bin/sh\nexit 0\n' >"$root/usr/bin/$bin"
    chmod 0755 "$root/usr/bin/$bin"
done
cp "$repo"/units/*.service "$repo"/units/*.socket "$repo"/units/*.target \
    "$root/usr/lib/systemd/system/"
: >"$root/etc/passwd"
: >"$root/etc/group"

# 1a. System units.
out=$(systemd-analyze verify --root="$root" \
    "$root"/usr/lib/systemd/system/agentworks*.service \
    "$root"/usr/lib/systemd/system/agentworks*.socket \
    "$root"/usr/lib/systemd/system/agentworks.target 2>&1) || fail "verify (system) exited $?"
if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    fail "systemd-analyze verify (system units) printed something"
fi

# 1b. The template, as an instance (verify takes the file's name as the unit's), and the main
# gatewayd with the cluster drop-in, in a second root so the scores below stay the shipped ones.
ln -s agentworks-gatewayd@.service "$root/usr/lib/systemd/system/agentworks-gatewayd@gw2.service"
cluster_root=$work/cluster-root
cp -a "$root" "$cluster_root"
mkdir -p "$cluster_root/etc/systemd/system/agentworks-gatewayd.service.d"
cp "$repo/packaging/gatewayd-cluster.conf" \
    "$cluster_root/etc/systemd/system/agentworks-gatewayd.service.d/cluster.conf"
out=$( (systemd-analyze verify --root="$root" \
    "$root/usr/lib/systemd/system/agentworks-gatewayd@gw2.service" &&
    systemd-analyze verify --root="$cluster_root" \
        "$cluster_root/usr/lib/systemd/system/agentworks-gatewayd.service") 2>&1) ||
    fail "verify (gatewayd@gw2, gatewayd with the cluster drop-in) exited $?"
if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    fail "systemd-analyze verify (gatewayd@gw2, gatewayd with the cluster drop-in) printed something"
fi

# 1c. User units. `verify --user` does not take --root, so ExecStart= is pointed at the
# stand-ins; everything else is verified as shipped.
for unit in "$repo"/units/user/*; do
    sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$unit" \
        >"$root/usr/lib/systemd/user/$(basename "$unit")"
done
out=$(XDG_RUNTIME_DIR=$work/xdg systemd-analyze verify --user \
    "$root"/usr/lib/systemd/user/agentworks* 2>&1) || fail "verify (user) exited $?"
if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    fail "systemd-analyze verify --user (user units) printed something"
fi

# 2. Exposure scores (root:daemon:goal; "cluster" is the root with the drop-in).
for goal in shipped:workspaced:0.5 shipped:gatewayd:0.5 shipped:agentd:1.1 \
    shipped:gatewayd@gw2:1.1 cluster:gatewayd:1.1 shipped:runnerd:2.2; do
    which=${goal%%:*}
    rest=${goal#*:}
    daemon=${rest%%:*}
    max=${rest#*:}
    unit=agentworks-$daemon.service
    unit_root=$root
    label=$unit
    if [ "$which" = cluster ]; then
        unit_root=$cluster_root
        label="$unit with gatewayd-cluster.conf"
    fi
    score=$(systemd-analyze security --offline=yes --root="$unit_root" --no-pager "$unit" 2>&1 |
        sed -n "s/.*Overall exposure level for $unit: \([0-9.]*\).*/\1/p")
    if [ -z "$score" ]; then
        fail "no exposure score for $label"
        continue
    fi
    echo "$label: exposure $score (goal <= $max)"
    if ! awk -v s="$score" -v m="$max" 'BEGIN { exit !(s <= m) }'; then
        fail "$label scores $score, above $max"
    fi
done

# 3. sysusers.d and tmpfiles.d, applied to the root.
out=$(systemd-sysusers --root="$root" "$repo/packaging/sysusers.d/agentworks.conf" 2>&1) ||
    fail "systemd-sysusers exited $?"
out=$(printf '%s\n' "$out" | grep -v '^Creating ' || true)
if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    fail "systemd-sysusers printed something unexpected"
fi
for user in agentworks agentworks-files agentworks-gw; do
    grep -q "^$user:" "$root/etc/passwd" || fail "sysusers did not create user $user"
done
for group in agentworks agentworks-admin; do
    grep -q "^$group:" "$root/etc/group" || fail "sysusers did not create group $group"
done
grep -q '^agentworks:[^:]*:[^:]*:.*agentworks-files' "$root/etc/group" &&
    grep -q '^agentworks:[^:]*:[^:]*:.*agentworks-gw' "$root/etc/group" ||
    fail "agentworks-files and agentworks-gw are not members of group agentworks"
out=$(systemd-tmpfiles --root="$root" --create "$repo/packaging/tmpfiles.d/agentworks.conf" 2>&1) ||
    fail "systemd-tmpfiles exited $?"
if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    fail "systemd-tmpfiles printed something"
fi
for dir in var/lib/agentworks/agent var/lib/agentworks/files var/lib/agentworks/gateway \
    var/lib/agentworks/runner var/lib/agentworks-documents; do
    [ -d "$root/$dir" ] || fail "tmpfiles did not create /$dir"
done

# The catalog must compile.
if [ -f "$repo/packaging/agentworks.catalog" ]; then
    mkdir -p "$root/usr/lib/systemd/catalog" "$root/var/lib/systemd/catalog"
    cp "$repo/packaging/agentworks.catalog" "$root/usr/lib/systemd/catalog/"
    out=$(journalctl --root="$root" --update-catalog 2>&1) || fail "journalctl --update-catalog exited $?"
    if [ -n "$out" ]; then
        printf '%s\n' "$out" >&2
        fail "journalctl --update-catalog printed something"
    fi
fi

# 4. The default config with every table and key uncommented must pass the daemons' own strict
# loader (unknown keys are refused; a key uncommented without its table lands in the table
# above it and is refused too). The check always runs: it uses AGENTWORKSCTL if set, else
# builds agentworksctl (a no-op when the build is current). Exit 2 means a config error; 0 or 1
# is fine.
ctl=${AGENTWORKSCTL:-}
if [ -z "$ctl" ]; then
    if (cd "$repo" && cargo build --locked --quiet --bin agentworksctl); then
        ctl="${CARGO_TARGET_DIR:-$repo/target}/debug/agentworksctl"
    else
        fail "cargo build --bin agentworksctl failed: the config check cannot run"
    fi
fi
# Every "# [table]" and "# key = value" line, the form the file uses for what it ships
# commented out (prose comments never take either form).
sed -E 's/^# (\[[a-z_.]+\]|[a-z_]+ = .*)$/\1/' "$repo/packaging/agentworks.toml" \
    >"$work/agentworks.toml"
if [ -z "$ctl" ]; then
    :
elif [ ! -x "$ctl" ]; then
    fail "$ctl is not an executable: the config check cannot run"
else
    rc=0
    out=$(AGENTWORKS_RUNTIME_DIR=$work/run timeout 20 "$ctl" --config "$work/agentworks.toml" \
        status 2>&1) || rc=$?
    if [ "$rc" -eq 2 ] || [ "$rc" -gt 100 ]; then
        printf '%s\n' "$out" >&2
        fail "$ctl refuses packaging/agentworks.toml with every table and key uncommented (exit $rc)"
    else
        echo "packaging/agentworks.toml: every table and key accepted by $ctl"
    fi
fi

if [ "$failed" -ne 0 ]; then
    echo "systemd_units: FAILED" >&2
    exit 1
fi
echo "systemd_units: ok"
