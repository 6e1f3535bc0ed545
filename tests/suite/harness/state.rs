//! A private temp state root for one test: `<root>/documents` (the project folders),
//! `<root>/agentworks.toml` (the config every daemon started on it reads), and the `run/` and
//! `files/` the daemons create. It starts nothing; the [`tempfile::TempDir`] removes it all
//! when the root is dropped. Also: listing the files a test left under a folder.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A private state root in a temp dir: `<root>/documents`, `<root>/run`, `<root>/files`.
pub struct StateRoot {
    pub dir: tempfile::TempDir,
}

impl StateRoot {
    pub fn new() -> StateRoot {
        let dir = tempfile::Builder::new()
            .prefix("aw-state-")
            .tempdir()
            .unwrap();
        // Readable by the unprivileged users some tests run workspaced as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(dir.path().join("documents")).unwrap();
        std::fs::write(dir.path().join("agentworks.toml"), "").unwrap();
        StateRoot { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn documents(&self) -> PathBuf {
        self.root().join("documents")
    }

    pub fn socket(&self) -> PathBuf {
        self.root().join("run/workspaced.sock")
    }

    /// Create a project folder with the given files.
    pub fn project(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.documents().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (path, content) in files {
            let full = dir.join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        dir
    }

    /// Write the config file every daemon started on this root reads.
    pub fn set_config(&self, toml: &str) {
        std::fs::write(self.root().join("agentworks.toml"), toml).unwrap();
    }
}

impl StateRoot {
    /// Hand the state root (not the documents) to `uid:gid`, for a daemon running as that user.
    pub fn give_state_to(&self, uid: u32, gid: u32) {
        let owner = Some(nix::unistd::Uid::from_raw(uid));
        let group = Some(nix::unistd::Gid::from_raw(gid));
        nix::unistd::chown(self.root(), owner, group).unwrap();
        nix::unistd::chown(&self.root().join("agentworks.toml"), owner, group).unwrap();
        for sub in ["run", "files"] {
            let dir = self.root().join(sub);
            if dir.exists() {
                let status = Command::new("chown")
                    .arg("-R")
                    .arg(format!("{uid}:{gid}"))
                    .arg(&dir)
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
    }
}

/// List every file under `dir` (recursively), as relative paths.
pub fn all_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                out.push(
                    entry
                        .path()
                        .strip_prefix(dir)
                        .unwrap()
                        .display()
                        .to_string(),
                );
            }
        }
    }
    out.sort();
    out
}
