#!/usr/bin/env bash
# CI's fuzzing stage: every cargo-fuzz target in fuzz/ for a bounded time on the nightly
# toolchain. Fails on any crash, timeout (an input taking longer than AW_FUZZ_TIMEOUT seconds)
# or out-of-memory, and copies each failing input into fuzz/regressions/<target>/ in this work
# tree, where a person commits it with the fix: tests/suite/fuzz_regressions.rs then replays it
# on stable in every `cargo test`.
#
# The committed seed corpus (fuzz/corpus/<target>/) is only read: each run starts from a copy in
# a temp dir, so CI never dirties the tree except with a failing input.
#
# A target with a dictionary of its format's words (fuzz/dicts/<target>.dict) gets it.
#
# Prints the executions per target, from libFuzzer's closing `Done N runs in S second(s)`.
#
# Environment: AW_FUZZ_SECONDS (per target, default 30), AW_FUZZ_TIMEOUT (per input, default
# 10), AW_FUZZ_JOBS (targets at once, default the number of CPUs), AW_FUZZ_TARGETS (a
# space-separated subset, default all).
#
# Built without a sanitizer (`--sanitizer none`): the code under test is safe Rust, where
# AddressSanitizer finds nothing a panic would not, and it would halve the executions in the
# same time. Debug assertions and overflow checks stay on (cargo-fuzz's default), so an
# arithmetic overflow is a crash.
set -euo pipefail
cd "$(dirname "$0")"

# Pinned: cargo-fuzz 0.13.2 (builds on stable, drives libFuzzer through libfuzzer-sys 0.4).
CARGO_FUZZ_VERSION=0.13.2
seconds=${AW_FUZZ_SECONDS:-30}
timeout=${AW_FUZZ_TIMEOUT:-10}
jobs=${AW_FUZZ_JOBS:-$(nproc)}
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')

if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

# fuzz/Cargo.lock is tracked: a build that would have to change it (cargo fuzz rewrites it
# without asking) is refused here, so a run never dirties the tree.
if ! cargo metadata --locked --format-version 1 >/dev/null; then
    echo "fuzz: fuzz/Cargo.lock is out of date: run 'cargo metadata --manifest-path fuzz/Cargo.toml' and commit the lock" >&2
    exit 1
fi

targets=${AW_FUZZ_TARGETS:-$(cargo +nightly fuzz list)}
build_started=$(date +%s)
# `cargo fuzz build` takes one target, or none for all of them.
if [ -n "${AW_FUZZ_TARGETS:-}" ]; then
    for target in $targets; do
        cargo +nightly fuzz build --sanitizer none "$target"
    done
else
    cargo +nightly fuzz build --sanitizer none
fi
echo "fuzz: built $(echo $targets | wc -w) targets in $(($(date +%s) - build_started)) s" >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One target: fuzz from a copy of its corpus; the status is libFuzzer's (non-zero: a crash,
# a timeout or an out-of-memory, its input saved under $work/<target>/artifacts/).
fuzz_one() {
    local target=$1 dir=$work/$1
    mkdir -p "$dir/corpus" "$dir/artifacts"
    if [ -d "corpus/$target" ]; then
        cp -R "corpus/$target/." "$dir/corpus/"
    fi
    local dict=()
    if [ -f "dicts/$target.dict" ]; then
        dict=(-dict="dicts/$target.dict")
    fi
    "target/$triple/release/$target" "$dir/corpus" "${dict[@]}" \
        -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
        -artifact_prefix="$dir/artifacts/" -print_final_stats=1 >"$dir/log" 2>&1
}

# At most $jobs targets at once; each one's status is kept in $work/<target>/status.
running=0
for target in $targets; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "fuzz: $target for ${seconds} s" >&2
    (
        status=0
        fuzz_one "$target" || status=$?
        echo "$status" >"$work/$target/status"
    ) &
    running=$((running + 1))
done
wait

failed=()
total_runs=0
for target in $targets; do
    dir=$work/$target
    status=$(cat "$dir/status" 2>/dev/null || echo 1)
    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$dir/log" | tail -1 || true)
    runs=$(echo "$done_line" | sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p')
    secs=$(echo "$done_line" | sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p')
    if [ -z "$runs" ]; then
        # A crash ends the run without the Done line; the final stats still count the runs.
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
        secs="?"
    fi
    runs=${runs:-0}
    total_runs=$((total_runs + runs))
    if [ "$status" = 0 ]; then
        rate=$([ "$secs" != "?" ] && [ "$secs" -gt 0 ] && echo "$((runs / secs))/s" || echo "-")
        printf 'fuzz: %-16s %10s runs in %3s s (%s)\n' "$target" "$runs" "$secs" "$rate"
        continue
    fi
    failed+=("$target")
    printf 'fuzz: %-16s FAILED (libFuzzer exit %s) after %s runs\n' "$target" "$status" "$runs"
    # What libFuzzer said about it: the panic or the timeout, and the input's name.
    grep -E -A30 "panicked at|ERROR: libFuzzer|==[0-9]+== ERROR|deadly signal|Test unit written" \
        "$dir/log" | head -60 | sed 's/^/    /'
    mkdir -p "regressions/$target"
    for artifact in "$dir"/artifacts/*; do
        [ -e "$artifact" ] || continue
        cp "$artifact" "regressions/$target/"
        echo "    kept as fuzz/regressions/$target/$(basename "$artifact"): fix the bug, then commit it" >&2
    done
done
echo "fuzz: $total_runs runs in all" >&2
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
