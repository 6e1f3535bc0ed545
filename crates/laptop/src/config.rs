//! The CLI's private directories and its stored credential.
//!
//! Owns: where `agentworks` keeps its credential (`$XDG_CONFIG_HOME/agentworks/credentials.json`,
//! default `~/.config`) and its private state (`$XDG_STATE_HOME/agentworks/`, default
//! `~/.local/state`: the receipts database and per-request scratch dirs), and creating them
//! private: directories 0700, files 0600, written atomically.
//!
//! Must never: write the credential with wider permissions, even briefly (the temp file is
//! created 0600); follow a relative XDG variable (the XDG spec says to ignore them); follow a
//! symlink planted as one of its directories.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use agentworks_fs::private_dir::{self, MissingParents, PrivateDirError};
use serde::{Deserialize, Serialize};

/// Why the CLI's private files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("HOME is not set (or not absolute), so the CLI cannot find its private directories")]
    NoHome,
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A private directory could not be made (or a symlink or file is in its place).
    #[error(transparent)]
    PrivateDir(#[from] PrivateDirError),
    #[error("the credential file {path} is damaged ({source}); run `agentworks login` again")]
    Damaged {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ConfigError {
    let path = path.to_owned();
    move |source| ConfigError::Io { what, path, source }
}

/// The person's home and the CLI's two private directories (as configured, not canonical).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME/agentworks`: the credential.
    pub config: PathBuf,
    /// `$XDG_STATE_HOME/agentworks`: receipts and scratch dirs.
    pub state: PathBuf,
}

fn absolute_env(name: &str) -> Option<PathBuf> {
    let value = std::env::var_os(name)?;
    let path = PathBuf::from(value);
    path.is_absolute().then_some(path)
}

impl Dirs {
    /// From `HOME`, `XDG_CONFIG_HOME` and `XDG_STATE_HOME` (relative values are ignored).
    pub fn from_env() -> Result<Dirs, ConfigError> {
        let home = absolute_env("HOME").ok_or(ConfigError::NoHome)?;
        let config = absolute_env("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
        let state = absolute_env("XDG_STATE_HOME").unwrap_or_else(|| home.join(".local/state"));
        Ok(Dirs {
            config: config.join("agentworks"),
            state: state.join("agentworks"),
            home,
        })
    }

    pub fn credentials_file(&self) -> PathBuf {
        self.config.join("credentials.json")
    }

    pub fn receipts_file(&self) -> PathBuf {
        self.state.join("receipts.db")
    }

    /// Where per-request scratch dirs are made.
    pub fn scratch_root(&self) -> PathBuf {
        self.state.join("scratch")
    }
}

/// Create `dir` (and missing parents, 0700 as the XDG spec asks) and make `dir` itself 0700
/// through a descriptor; a symlink (or a file) in its place is refused, not followed.
pub fn ensure_private_dir(dir: &Path) -> Result<(), ConfigError> {
    Ok(private_dir::ensure_private_dir(
        dir,
        0o700,
        MissingParents::SameMode,
    )?)
}

/// What `agentworks login` stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// agentd's public URL (`http(s)://host[:port]`), used for login and logout.
    pub server: String,
    /// The gateway's WebSocket base URL, if one was given at login.
    #[serde(default)]
    pub gateway: Option<String>,
    /// The `devices:connect` bearer token.
    pub token: String,
}

impl Credentials {
    /// `Ok(None)` when nobody is logged in.
    pub fn load(dirs: &Dirs) -> Result<Option<Credentials>, ConfigError> {
        let path = dirs.credentials_file();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", &path)(e)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| ConfigError::Damaged { path, source })
    }

    /// Write the credential 0600 (temp file, fsync, rename) into a 0700 directory.
    pub fn store(&self, dirs: &Dirs) -> Result<PathBuf, ConfigError> {
        ensure_private_dir(&dirs.config)?;
        let path = dirs.credentials_file();
        let tmp = dirs.config.join(".credentials.json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_error("create", &tmp))?;
        let text = serde_json::to_vec_pretty(self).map_err(|source| ConfigError::Damaged {
            path: path.clone(),
            source,
        })?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(io_error("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_error("replace", &path))?;
        if let Ok(dir) = std::fs::File::open(&dirs.config) {
            let _ = dir.sync_all();
        }
        Ok(path)
    }

    /// Remove the stored credential; false when there was none.
    pub fn delete(dirs: &Dirs) -> Result<bool, ConfigError> {
        let path = dirs.credentials_file();
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error("delete", &path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn credentials_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dirs = Dirs {
            home: dir.path().to_owned(),
            config: dir.path().join("c/agentworks"),
            state: dir.path().join("s/agentworks"),
        };
        assert_eq!(Credentials::load(&dirs).expect("load"), None);
        let creds = Credentials {
            server: "http://127.0.0.1:1".into(),
            gateway: None,
            token: "t".into(),
        };
        let path = creds.store(&dirs).expect("store");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dirs.config), 0o700);
        assert_eq!(Credentials::load(&dirs).expect("load"), Some(creds));
        assert!(Credentials::delete(&dirs).expect("delete"));
        assert!(!Credentials::delete(&dirs).expect("delete"));
    }

    /// A symlink planted as the config directory is refused, not followed: the credential
    /// would otherwise land wherever it points.
    #[test]
    fn a_symlinked_config_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::create_dir(dir.path().join("c")).expect("mkdir");
        let dirs = Dirs {
            home: dir.path().to_owned(),
            config: dir.path().join("c/agentworks"),
            state: dir.path().join("s/agentworks"),
        };
        std::os::unix::fs::symlink(&elsewhere, &dirs.config).expect("symlink");
        let creds = Credentials {
            server: "http://127.0.0.1:1".into(),
            gateway: None,
            token: "t".into(),
        };
        let err = creds.store(&dirs).expect_err("a symlinked config dir");
        assert!(
            matches!(
                err,
                ConfigError::PrivateDir(PrivateDirError::Symlink { .. })
            ),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).expect("ls").count(), 0);
    }
}
