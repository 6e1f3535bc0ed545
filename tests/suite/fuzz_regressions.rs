//! The fuzz targets' committed inputs, replayed on stable: every file under
//! `fuzz/corpus/<target>/` (the seed corpus) and `fuzz/regressions/<target>/` (inputs that once
//! crashed a target, kept after the fix) goes through that target's own body,
//! `fuzz/checks/<target>.rs`, included here exactly as the libFuzzer binaries include it. A bug
//! a fuzzer found therefore fails `cargo test` again if it comes back, without nightly or
//! cargo-fuzz. `fuzz/run.sh` (CI's fuzzing stage) is what finds new ones.

use std::path::{Path, PathBuf};

#[path = "../../fuzz/checks/mod.rs"]
mod checks;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files in `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_fuzz_target_has_a_check_and_a_seed_corpus() {
    let mut binaries: Vec<String> = inputs(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    binaries.sort();
    let mut checked: Vec<String> = checks::TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    checked.sort();
    assert_eq!(
        binaries, checked,
        "fuzz/fuzz_targets and fuzz/checks disagree"
    );
    for (target, _) in checks::TARGETS {
        let seeds = inputs(&fuzz_dir().join("corpus").join(target));
        assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seed input");
    }
}

#[test]
fn every_committed_fuzz_input_still_passes_its_target() {
    let mut failed = Vec::new();
    let mut replayed = 0;
    for (target, run) in checks::TARGETS {
        let mut files = inputs(&fuzz_dir().join("corpus").join(target));
        files.extend(inputs(&fuzz_dir().join("regressions").join(target)));
        for file in files {
            let data = std::fs::read(&file).unwrap();
            replayed += 1;
            // Each input on its own, so one failure names its file and the rest still run.
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                failed.push(file.display().to_string());
            }
        }
    }
    assert!(replayed > 0);
    assert!(
        failed.is_empty(),
        "{} of {replayed} committed fuzz inputs fail their target (the panics are above): {failed:#?}",
        failed.len()
    );
}
