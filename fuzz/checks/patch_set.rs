//! The patch-set parser (workspaced's `/v1/patch_set`) with arbitrary diffs: it must never
//! panic, must hold to its bounds, and every file it answers must be named once, with its hunks
//! applying (or being refused) through the strict applier without a panic. The input's first
//! line is a base every file is tried against (with `\x1f` standing for newlines).

use agentworks_core::patch::{FileChange, PatchSetLimits, apply_strict, parse_patch_set};

const LIMITS: PatchSetLimits = PatchSetLimits {
    max_diff_bytes: 64 * 1024,
    max_files: 8,
    max_hunks: 64,
};

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (base, diff) = text.split_once('\n').unwrap_or((text, ""));
    let base = base.replace('\x1f', "\n");
    let Ok(files) = parse_patch_set(diff, LIMITS) else {
        return;
    };
    assert!(!files.is_empty() && files.len() <= LIMITS.max_files);
    for (i, file) in files.iter().enumerate() {
        assert!(files[..i].iter().all(|other| other.path != file.path));
        assert!(!file.path.starts_with('"'));
        let start = if file.change == FileChange::Create {
            ""
        } else {
            base.as_str()
        };
        let _ = apply_strict(start, &file.text);
    }
}
