//! What the runner's integration tests share: scripted model servers on loopback, and where
//! the real Codex CLI is installed. The workspace's suite (`tests/suite`) includes it too.
//!
//! Each test binary includes it with `mod support;` and uses only part of it.
#![allow(dead_code)]

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
