//! Lenient path resolution: a path that may not exist yet, canonicalised as far as it exists.
//!
//! Owns: [`resolve_lenient`], used by the grants at connect (the CLI's dirs before the first
//! login, a `--block` for a file that does not exist yet, the toolchains' credential files)
//! and by the launcher's rule planning (exclusions that must match a grant whether or not they
//! exist). Must never: treat a path it could not inspect (permission denied, a symlink loop) as
//! missing, since an exclusion resolved wrongly would not match the grant it must narrow; or
//! resolve a `..` in the missing part lexically.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

/// Why a path could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve {path}: {source}")]
pub struct ResolveError {
    /// The path as given.
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Canonicalises the longest existing prefix of `path` and appends the missing rest, so that a
/// path that does not exist yet still compares equal (component by component) to what it will
/// be. A relative path is taken from the current directory. Only a missing component
/// (`ENOENT`, or `ENOTDIR` for a name under a file) counts as the missing rest; any other error
/// is returned, and so is a `..` in the missing rest.
pub fn resolve_lenient(path: &Path) -> Result<PathBuf, ResolveError> {
    let error = |source| ResolveError {
        path: path.to_owned(),
        source,
    };
    let mut existing = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir().map_err(error)?.join(path)
    };
    let mut missing: Vec<OsString> = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(mut resolved) => {
                for name in missing.iter().rev() {
                    resolved.push(name);
                }
                return Ok(resolved);
            }
            Err(source)
                if source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                // No name: the missing rest ends in `..` (or this is `/`, which always exists).
                let Some(name) = existing.file_name() else {
                    return Err(error(source));
                };
                missing.push(name.to_owned());
                existing.pop();
            }
            Err(source) => return Err(error(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_missing_tail_and_resolves_the_existing_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir(root.join("real")).expect("mkdir");
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).expect("symlink");
        assert_eq!(
            resolve_lenient(&root.join("x/y")).expect("resolve"),
            root.join("x/y")
        );
        assert_eq!(
            resolve_lenient(&root.join("link/x")).expect("resolve"),
            root.join("real/x")
        );
        // A name under a file (ENOTDIR) is missing too.
        std::fs::write(root.join("file"), "x").expect("write");
        assert_eq!(
            resolve_lenient(&root.join("file/x")).expect("resolve"),
            root.join("file/x")
        );
    }

    #[test]
    fn a_parent_dir_in_the_missing_tail_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        assert!(resolve_lenient(&root.join("missing/../x")).is_err());
        // In the existing prefix, `..` is resolved by the kernel.
        assert_eq!(
            resolve_lenient(&root.join("../x")).expect("resolve"),
            root.parent().expect("parent").join("x")
        );
    }
}
