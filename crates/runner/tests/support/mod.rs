//! What the runner's integration tests share: scripted model servers on loopback, and where
//! the real Codex CLI and OpenCode are installed. The workspace's suite (`tests/suite`)
//! includes it too.
//!
//! Each test binary includes it with `mod support;` and uses only part of it.
#![allow(dead_code)]

pub mod chat_completions;
pub mod responses;

use std::path::{Path, PathBuf};

/// The native binary in the npm install (the `bin/codex.js` wrapper only finds and execs it).
pub fn codex_binary() -> PathBuf {
    let (package, triple) = match std::env::consts::ARCH {
        "x86_64" => ("codex-linux-x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
        other => panic!("no Codex package for {other}"),
    };
    // The runner crate's tests and the workspace's suite both include this file.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repository = manifest
        .ancestors()
        .find(|dir| dir.join("tests/codex/package.json").is_file())
        .unwrap_or(manifest);
    let path = repository
        .join("tests/codex/node_modules/@openai")
        .join(package)
        .join("vendor")
        .join(triple)
        .join("bin/codex");
    assert!(
        path.is_file(),
        "the Codex CLI is not installed at {}: run `(cd tests/codex && npm ci --ignore-scripts)` \
         from the repository's root",
        path.display()
    );
    path
}

/// OpenCode's native binary, from the npm package `opencode-ai` names as its optional
/// dependency for this machine (tests/opencode pins it): `opencode-linux-x64`, or its
/// `-baseline` build where the CPU lacks AVX2 (the plain build needs it).
pub fn opencode_binary() -> PathBuf {
    let package = match std::env::consts::ARCH {
        "x86_64" if cpu_has_avx2() => "opencode-linux-x64",
        "x86_64" => "opencode-linux-x64-baseline",
        other => panic!("tests/opencode pins no OpenCode package for {other}"),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repository = manifest
        .ancestors()
        .find(|dir| dir.join("tests/opencode/package.json").is_file())
        .unwrap_or(manifest);
    let path = repository
        .join("tests/opencode/node_modules")
        .join(package)
        .join("bin/opencode");
    assert!(
        path.is_file(),
        "OpenCode is not installed at {}: run `(cd tests/opencode && npm ci --ignore-scripts)` \
         from the repository's root",
        path.display()
    );
    path
}

/// Whether the CPU has AVX2 (the `flags` of /proc/cpuinfo).
fn cpu_has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|flag| flag == "avx2"))
        })
        .unwrap_or(false)
}
