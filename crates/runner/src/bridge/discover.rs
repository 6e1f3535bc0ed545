//! Where runnerd finds `agentworks-mcpbridge` (DESIGN.md, "The bridge"): `MCP_BRIDGE_BINARY`,
//! then beside runnerd's own executable (its symlinks followed) or in that directory's `.bin/`,
//! then runnerd's `PATH` (absolute entries only). Once, at start.
//!
//! Must never: look in a CLI's working directory, a runtime, or any relative path (nothing the
//! agent controls decides which binary every turn runs); accept anything but an executable
//! regular file. The answer is canonical, so the grant and the config name the real file.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::BINARY_NAME;

/// The environment variable that names the bridge binary explicitly.
pub const OVERRIDE_ENV: &str = "MCP_BRIDGE_BINARY";

/// The bridge binary: from `override_path` (the value of [`OVERRIDE_ENV`]), else beside
/// `own_exe` or in its `.bin/`, else on `path` (a `PATH` value). An explicit override that is
/// not usable is an error, not a fallback: the operator asked for that file.
pub fn find(
    override_path: Option<&OsStr>,
    own_exe: Option<&Path>,
    path: Option<&OsStr>,
) -> Result<PathBuf, String> {
    if let Some(named) = override_path.filter(|p| !p.is_empty()) {
        let named = Path::new(named);
        if !named.is_absolute() {
            return Err(format!(
                "{OVERRIDE_ENV}={} is not an absolute path",
                named.display()
            ));
        }
        return usable(named)
            .map_err(|why| format!("{OVERRIDE_ENV}={} cannot be used: {why}", named.display()));
    }
    let mut looked = Vec::new();
    if let Some(exe) = own_exe
        && let Ok(exe) = std::fs::canonicalize(exe)
        && let Some(dir) = exe.parent()
    {
        for candidate in [dir.join(BINARY_NAME), dir.join(".bin").join(BINARY_NAME)] {
            if let Ok(found) = usable(&candidate) {
                return Ok(found);
            }
            looked.push(candidate.display().to_string());
        }
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(path).filter(|d| d.is_absolute()) {
            let candidate = dir.join(BINARY_NAME);
            if let Ok(found) = usable(&candidate) {
                return Ok(found);
            }
        }
        looked.push("runnerd's PATH".to_owned());
    }
    Err(format!(
        "{BINARY_NAME} was not found (looked at {}; set {OVERRIDE_ENV} to its path)",
        looked.join(", ")
    ))
}

/// The canonical path of `candidate` when it is an executable regular file.
fn usable(candidate: &Path) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(candidate).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(&canonical).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable".to_owned());
    }
    Ok(canonical)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn executable(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_override_then_beside_the_real_executable_then_path() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let install = root.join("install");
        executable(&install.join("agentworks-runnerd"));
        // runnerd started through a symlink elsewhere: its real directory counts.
        let links = root.join("links");
        std::fs::create_dir(&links).unwrap();
        symlink(
            install.join("agentworks-runnerd"),
            links.join("agentworks-runnerd"),
        )
        .unwrap();
        let on_path = root.join("path");
        executable(&on_path.join(BINARY_NAME));
        let path = std::env::join_paths([Path::new("relative"), &on_path]).unwrap();
        let exe = links.join("agentworks-runnerd");

        // Nothing beside runnerd: PATH.
        assert_eq!(
            find(None, Some(&exe), Some(&path)).unwrap(),
            on_path.join(BINARY_NAME)
        );
        // In the real directory's .bin/.
        executable(&install.join(".bin").join(BINARY_NAME));
        assert_eq!(
            find(None, Some(&exe), Some(&path)).unwrap(),
            install.join(".bin").join(BINARY_NAME)
        );
        // Beside it wins over .bin/.
        executable(&install.join(BINARY_NAME));
        assert_eq!(
            find(None, Some(&exe), Some(&path)).unwrap(),
            install.join(BINARY_NAME)
        );
        // The override wins over all, canonical.
        let named = root.join("named");
        executable(&named);
        symlink(&named, root.join("named-link")).unwrap();
        let link = root.join("named-link");
        assert_eq!(
            find(Some(link.as_os_str()), Some(&exe), Some(&path)).unwrap(),
            named
        );
    }

    #[test]
    fn unusable_candidates_are_refused_with_a_reason() {
        let root = tempfile::tempdir().unwrap();
        let plain = root.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let err = find(Some(plain.as_os_str()), None, None).unwrap_err();
        assert!(err.contains("not executable"), "{err}");
        let err = find(Some(root.path().as_os_str()), None, None).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let err = find(Some(OsStr::new("bin/agentworks-mcpbridge")), None, None).unwrap_err();
        assert!(err.contains("not an absolute path"), "{err}");
        // A relative PATH entry is never searched, even when it holds the binary.
        executable(&root.path().join("rel").join(BINARY_NAME));
        let cwd = std::env::current_dir().unwrap();
        let relative = pathdiff(root.path(), &cwd);
        let err = find(None, None, Some(relative.as_os_str())).unwrap_err();
        assert!(err.contains("was not found"), "{err}");
    }

    /// `dir/rel` as a path relative to `cwd` (through `..`s).
    fn pathdiff(dir: &Path, cwd: &Path) -> PathBuf {
        let ups = cwd.components().count().saturating_sub(1);
        let mut p = PathBuf::new();
        for _ in 0..ups {
            p.push("..");
        }
        p.join(dir.strip_prefix("/").unwrap()).join("rel")
    }
}
