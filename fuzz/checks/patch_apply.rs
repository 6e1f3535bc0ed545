//! The strict unified-diff applier with arbitrary diffs against arbitrary bases: it must never
//! panic. The input's first line is the base (with `\x1f` standing for newlines), the rest the
//! diff.

use agentworks_core::patch::apply_strict;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (base, diff) = text.split_once('\n').unwrap_or((text, ""));
    let base = base.replace('\x1f', "\n");
    let _ = apply_strict(&base, diff);
}
