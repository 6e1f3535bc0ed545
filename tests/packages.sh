#!/bin/sh
# Builds both packages from this tree and checks them (issue 6, "Packages"):
#
#   0. The sources: the files git tracks, copied from the work tree; an untracked file planted
#      for the run must reach neither the sources, the rpm's source tarball nor a package.
#   1. `dpkg-buildpackage -us -uc -b` on that copy: agentworks_*.deb and
#      agentworks-cli_*.deb; `lintian --fail-on error` on them.
#   2. `rpmbuild -bb --nodeps` of rpm/agentworks.spec from a source tarball: agentworks-*.rpm and
#      agentworks-cli-*.rpm; `rpmlint -r rpm/agentworks.rpmlintrc` on the spec and them (0 errors).
#   3. What each package holds: the daemons, agentworksctl, the units, sysusers/tmpfiles, the
#      catalog, man pages and the configuration as a conffile / %config(noreplace) in
#      agentworks, and the laptop CLI agentd serves at /v1/cli (the same bytes as
#      agentworks-cli's, answering --version with the package's version) in
#      /usr/lib/agentworks/cli/agentworks-linux-<arch>; the laptop command alone (and its man
#      page) in agentworks-cli.
#
# Both builds share CARGO_TARGET_DIR (default <repo>/target) and one source directory: the rpm
# is built in place (rpmbuild --build-in-place) where the .deb was, with the C flags and
# SOURCE_DATE_EPOCH the .deb's build had, so its cargo build finds the release build fresh and
# compiles nothing again (a second release tree cost CI ten minutes and a gigabyte). The source
# tarball is still made, from the tracked files before either build, and checked.
#
# Usage: tests/packages.sh [OUT_DIR]   the .debs and .rpms are left in OUT_DIR (for
#        AW_PROOF_DEB_DIR=OUT_DIR tests/systemd_proof.sh); without it they are removed at exit.
# Needs dpkg-dev, debhelper, lintian, rpm, rpmlint and cargo (Rust >= 1.95) on PATH.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/agentworks-packages.XXXXXX)
out=${1:-$work/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)

log() { echo "packages: $*" >&2; }
die() {
    echo "packages: FAIL: $*" >&2
    exit 1
}
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM

# The tree as a release tarball would hold it: the files git tracks, as they are in the work
# tree, and nothing else. Never the work tree whole: it may hold node_modules, build output
# and a quickstart's state (its databases hold tokens and sealed secrets).
git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
    die "$repo is not a git work tree: the package sources are the files git tracks"
# A file git does not track, named like a quickstart's database: it must reach neither the
# sources nor a package (checked after each build).
canary_dir=$repo/.untracked-canary-$$
mkdir "$canary_dir"
echo "an untracked file" >"$canary_dir/agentd.db"
trap 'rm -rf "$work" "$canary_dir"' EXIT
src=$work/src/agentworks-$version
mkdir -p "$src"
# A tracked file deleted in the work tree is still listed; it is left out (with a warning).
(cd "$repo" && git ls-files -z --cached) |
    tar -C "$repo" --null -T - --ignore-failed-read -cf - | tar -C "$src" -xf -
[ ! -e "$src/.untracked-canary-$$" ] || die "an untracked file reached the package sources"

# The rpm's Source0, of the sources as they are before any build writes into them.
top=$work/rpmbuild
mkdir -p "$top/SOURCES"
tar -C "$work/src" -czf "$top/SOURCES/agentworks-$version.tar.gz" "agentworks-$version"

# --- 1. Debian -----------------------------------------------------------------------------------
log "dpkg-buildpackage -us -uc -b"
started=$(date +%s)
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/deb.log" 2>&1 || {
    tail -40 "$work/deb.log" >&2
    die "dpkg-buildpackage failed"
}
log "built in $(($(date +%s) - started)) s ($(grep -c '^ *Compiling ' "$work/deb.log" || true) crates compiled)"
cp "$work"/src/agentworks_*.deb "$work"/src/agentworks-cli_*.deb "$out/"
server_deb=$(ls "$out"/agentworks_"$version"-*.deb)
cli_deb=$(ls "$out"/agentworks-cli_"$version"-*.deb)
lintian --fail-on error "$server_deb" "$cli_deb" \
    >"$work/lintian.log" 2>&1 || {
    cat "$work/lintian.log" >&2
    die "lintian reports errors"
}
log "lintian: $(grep -c '^E:' "$work/lintian.log" || true) errors, $(grep -c '^W:' "$work/lintian.log" || true) warnings"

# has PACKAGE_LISTING PATH...: every path is in the listing.
has() {
    listing=$1
    shift
    for path in "$@"; do
        grep -qx "$path" "$listing" || die "$path is missing from $listing"
    done
}
# lacks PACKAGE_LISTING PATTERN...: no path matches.
lacks() {
    listing=$1
    shift
    for pattern in "$@"; do
        if grep -q "$pattern" "$listing"; then die "$listing holds $(grep "$pattern" "$listing")"; fi
    done
}

dpkg-deb -c "$server_deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/deb-server.list"
dpkg-deb -c "$cli_deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/deb-cli.list"
has "$work/deb-server.list" /usr/bin/agentworks-workspaced /usr/bin/agentworks-agentd \
    /usr/bin/agentworks-gatewayd /usr/bin/agentworks-runnerd /usr/bin/agentworks-mcpbridge \
    /usr/bin/agentworksctl /lib/systemd/system/agentworks-runnerd.service /lib/systemd/system/agentworks-runnerd.socket \
    /usr/lib/systemd/user/agentworks-runnerd.service /usr/share/man/man1/agentworks-runnerd.1.gz \
    /lib/systemd/system/agentworks.target /lib/systemd/system/agentworks-workspaced.service \
    /lib/systemd/system/agentworks-workspaced.socket /lib/systemd/system/agentworks-agentd-http.socket \
    /lib/systemd/system/agentworks-gatewayd-ws.socket /lib/systemd/system/agentworks-gatewayd@.service \
    /usr/share/doc/agentworks/gatewayd-cluster.conf /usr/lib/systemd/user/agentworks.target \
    /usr/lib/sysusers.d/agentworks.conf /usr/lib/tmpfiles.d/agentworks.conf \
    /usr/lib/systemd/catalog/agentworks.catalog /etc/agentworks/agentworks.toml \
    /usr/share/man/man1/agentworksctl.1.gz /usr/share/man/man1/agentworks-workspaced.1.gz \
    /usr/share/bash-completion/completions/agentworksctl
lacks "$work/deb-server.list" '^/usr/bin/agentworks$'
has "$work/deb-cli.list" /usr/bin/agentworks /usr/share/man/man1/agentworks.1.gz \
    /usr/share/bash-completion/completions/agentworks
lacks "$work/deb-cli.list" 'agentworks-workspaced' 'agentworks-runnerd' 'agentworks-mcpbridge' 'agentworksctl' '/lib/systemd/' '^/usr/lib/agentworks/'
# The laptop CLI agentd serves (/v1/cli): in agentworks, for the architecture built, the same
# bytes as agentworks-cli's /usr/bin/agentworks, and it runs.
cli_arch=$(dpkg-architecture -qDEB_HOST_GNU_CPU)
served_cli=/usr/lib/agentworks/cli/agentworks-linux-$cli_arch
has "$work/deb-server.list" "$served_cli"
mkdir "$work/deb-server" "$work/deb-cli"
dpkg-deb -x "$server_deb" "$work/deb-server"
dpkg-deb -x "$cli_deb" "$work/deb-cli"
cmp -s "$work/deb-server$served_cli" "$work/deb-cli/usr/bin/agentworks" ||
    die "$served_cli in agentworks is not agentworks-cli's /usr/bin/agentworks"
[ "$("$work/deb-server$served_cli" --version)" = "agentworks $version" ] ||
    die "$served_cli --version: $("$work/deb-server$served_cli" --version 2>&1)"
log "agentworks carries the laptop CLI agentd serves for $cli_arch only (the other architecture is not cross-built: README, \"systemd and packages\")"
dpkg-deb -f "$server_deb" Depends | grep -q systemd || die "agentworks does not depend on systemd"
mkdir "$work/control"
dpkg-deb -e "$server_deb" "$work/control"
grep -qx /etc/agentworks/agentworks.toml "$work/control/conffiles" ||
    die "/etc/agentworks/agentworks.toml is not a conffile"
# The maintainer scripts start nothing, and enable a unit only where it was enabled before (an
# upgrade keeps the operator's choice); tests/systemd_proof.sh checks the behaviour.
if grep -q 'deb-systemd-invoke \(start\|restart\)' "$work/control/postinst"; then
    die "postinst starts units: $(grep 'deb-systemd-invoke' "$work/control/postinst")"
fi
awk '/was-enabled/ { guarded = 1; next }
     /deb-systemd-helper .*enable / && !guarded { print; bad = 1 }
     $0 !~ /^[[:space:]]*(#.*)?$/ { guarded = 0 }
     END { exit bad }' "$work/control/postinst" >"$work/unguarded" ||
    die "postinst enables units unconditionally: $(cat "$work/unguarded")"
lacks "$work/deb-server.list" "untracked-canary"
lacks "$work/deb-cli.list" "untracked-canary"
log "agentworks.deb and agentworks-cli.deb hold what they should; the config is a conffile"

# --- 2. RPM --------------------------------------------------------------------------------------
log "rpmbuild -bb"
started=$(date +%s)
# In the .deb's source directory, with the environment its build's cargo saw: debhelper's build
# flags (dpkg-buildflags, run there: its -ffile-prefix-map names the directory) and the
# changelog's SOURCE_DATE_EPOCH, which the C crates' build scripts read (cc-rs reruns when
# CFLAGS or SOURCE_DATE_EPOCH change). Debian's rpm sets neither.
(
    cd "$src"
    eval "$(dpkg-buildflags --export=sh)"
    SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -STimestamp)
    export SOURCE_DATE_EPOCH
    rpmbuild -bb --nodeps --build-in-place --define "_topdir $top" "$repo/rpm/agentworks.spec"
) >"$work/rpm.log" 2>&1 || {
    tail -40 "$work/rpm.log" >&2
    die "rpmbuild failed"
}
log "built in $(($(date +%s) - started)) s ($(grep -c '^ *Compiling ' "$work/rpm.log" || true) crates compiled)"
cp "$top"/RPMS/*/agentworks-*.rpm "$out/"
server_rpm=$(ls "$out"/agentworks-"$version"-*.rpm)
cli_rpm=$(ls "$out"/agentworks-cli-"$version"-*.rpm)
# The spec and both packages in one run: the rc file's filters cover all three together.
rpmlint -r "$repo/rpm/agentworks.rpmlintrc" "$repo/rpm/agentworks.spec" "$server_rpm" "$cli_rpm" \
    >"$work/rpmlint.log" 2>&1 || {
    cat "$work/rpmlint.log" >&2
    die "rpmlint reports errors"
}
log "rpmlint: $(tail -1 "$work/rpmlint.log" | sed 's/.*checked; //; s/, [0-9]* badness.*//')"
rpm -qpl "$server_rpm" 2>/dev/null >"$work/rpm-server.list"
rpm -qpl "$cli_rpm" 2>/dev/null >"$work/rpm-cli.list"
has "$work/rpm-server.list" /usr/bin/agentworks-workspaced /usr/bin/agentworks-agentd \
    /usr/bin/agentworks-gatewayd /usr/bin/agentworks-runnerd /usr/bin/agentworks-mcpbridge \
    /usr/bin/agentworksctl /usr/lib/systemd/system/agentworks.target /usr/lib/systemd/system/agentworks-runnerd.service \
    /usr/lib/systemd/system/agentworks-runnerd.socket /usr/lib/systemd/user/agentworks-runnerd.service \
    /usr/lib/systemd/system/agentworks-workspaced.socket /usr/lib/systemd/system/agentworks-gatewayd@.service \
    /usr/share/doc/agentworks/gatewayd-cluster.conf /usr/lib/systemd/user/agentworks.target \
    /usr/lib/sysusers.d/agentworks.conf /usr/lib/tmpfiles.d/agentworks.conf \
    /usr/lib/systemd/catalog/agentworks.catalog /etc/agentworks/agentworks.toml
lacks "$work/rpm-server.list" '^/usr/bin/agentworks$'
has "$work/rpm-cli.list" /usr/bin/agentworks
lacks "$work/rpm-cli.list" 'agentworks-workspaced' 'agentworks-runnerd' 'agentworks-mcpbridge' 'agentworksctl' '/lib/systemd/' '^/usr/lib/agentworks/'
has "$work/rpm-server.list" "/usr/lib/agentworks/cli/agentworks-linux-$(rpm --eval '%{_arch}')"
rpm -qpc "$server_rpm" 2>/dev/null | grep -qx /etc/agentworks/agentworks.toml ||
    die "/etc/agentworks/agentworks.toml is not %config in the rpm"
lacks "$work/rpm-server.list" "untracked-canary"
lacks "$work/rpm-cli.list" "untracked-canary"
tar -tzf "$top/SOURCES/agentworks-$version.tar.gz" >"$work/tarball.list"
lacks "$work/tarball.list" "untracked-canary" "node_modules/"
# It holds the tracked files, the ones both packages were built from (the rpm in place).
(cd "$repo" && git ls-files --cached | while IFS= read -r f; do [ -e "$f" ] && echo "agentworks-$version/$f"; done | sort) >"$work/tracked.list"
grep -v '/$' "$work/tarball.list" | sort | cmp -s - "$work/tracked.list" ||
    die "the source tarball does not hold exactly the tracked files: $(grep -v '/$' "$work/tarball.list" | sort | diff - "$work/tracked.list" | head -5)"
log "agentworks.rpm and agentworks-cli.rpm hold what they should; the config is %config"
log "PASS: $(cd "$out" && ls | tr '\n' ' ')"
