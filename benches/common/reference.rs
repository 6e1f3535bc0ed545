//! The reference MCP filesystem server, `@modelcontextprotocol/server-filesystem`, pinned by
//! `benches/mcp-reference/package.json` and `package-lock.json` and installed from the npm
//! registry with `npm ci` into `target/bench-mcp-node` (once per lockfile). Over stdio it runs
//! as published (`node <entry> DIR`); with `node --import <register> <entry> DIR` and `PORT`
//! set, the same code serves the TypeScript SDK's streamable HTTP transport instead (see
//! `benches/mcp-reference/http-transport.mjs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const PACKAGE: &str = "@modelcontextprotocol/server-filesystem";

/// Files copied from `benches/mcp-reference/` into the install folder.
const FILES: [&str; 5] = [
    "package.json",
    "package-lock.json",
    "register.mjs",
    "hooks.mjs",
    "http-transport.mjs",
];

pub struct Installed {
    /// The server's entry point (`dist/index.js`).
    pub entry: PathBuf,
    /// The `--import` module that swaps stdio for streamable HTTP when `PORT` is set.
    pub register: PathBuf,
    /// The installed server's version.
    pub version: String,
}

/// Install the pinned reference server into `cache` unless that lockfile is installed there.
pub fn install(cache: &Path) -> Result<Installed, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/mcp-reference");
    std::fs::create_dir_all(cache)
        .map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    for file in FILES {
        std::fs::copy(source.join(file), cache.join(file))
            .map_err(|e| format!("cannot copy {file} into {}: {e}", cache.display()))?;
    }
    let lock = std::fs::read(source.join("package-lock.json")).map_err(|e| e.to_string())?;
    let stamp = cache.join(".installed-lock");
    let package_dir = cache.join("node_modules").join(PACKAGE);
    let entry = package_dir.join("dist/index.js");
    if std::fs::read(&stamp).ok().as_deref() != Some(&lock[..]) || !entry.is_file() {
        eprintln!(
            "installing {PACKAGE} (pinned by benches/mcp-reference/package-lock.json) into {}",
            cache.display()
        );
        let output = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(cache)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run npm (is Node.js installed?): {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "npm ci failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        if !entry.is_file() {
            return Err(format!(
                "npm ci succeeded but {} is missing",
                entry.display()
            ));
        }
        std::fs::write(&stamp, &lock).map_err(|e| e.to_string())?;
    }
    let version = std::fs::read_to_string(package_dir.join("package.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|manifest| manifest["version"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("{PACKAGE} has no readable version"))?;
    Ok(Installed {
        entry,
        register: cache.join("register.mjs"),
        version,
    })
}
