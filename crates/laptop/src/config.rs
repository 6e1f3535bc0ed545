//! The CLI's private directories and its stored credential.
//!
//! Owns: where `agentworks` keeps its credential (`$XDG_CONFIG_HOME/agentworks/credentials.json`,
//! default `~/.config`) and its private state (`$XDG_STATE_HOME/agentworks/`, default
//! `~/.local/state`: the receipts database and per-request scratch dirs), and creating them
//! private: directories 0700, files 0600, written atomically.
//!
//! macOS: both directories default to `~/Library/Application Support/agentworks` (the XDG
//! variables, when set, still win), and the credential goes into the login Keychain
//! (`keychain.rs`); the 0600 file is the fallback where the Keychain cannot be used, and a
//! credential found in neither place means nobody is logged in.
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
    #[error("the credential in {store} is damaged ({source}); run `agentworks login` again")]
    DamagedItem {
        store: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot use the credential in {store}: {reason}")]
    SecretStore { store: String, reason: String },
}

/// Where a credential can be kept instead of the 0600 file: the macOS login Keychain
/// ([`crate::keychain::LoginKeychain`]); tests use a fake one. An account names one item.
pub trait SecretStore {
    /// For messages: "the login Keychain (…)".
    fn name(&self) -> String;
    /// `Ok(None)` when there is no such item.
    fn get(&self, account: &str) -> Result<Option<Vec<u8>>, String>;
    /// Creates or replaces the item.
    fn set(&self, account: &str, secret: &[u8]) -> Result<(), String>;
    /// `Ok(false)` when there was no such item.
    fn remove(&self, account: &str) -> Result<bool, String>;
}

/// The platform's store: the login Keychain on macOS, none on Linux (the file only).
fn platform_store() -> Option<&'static dyn SecretStore> {
    #[cfg(target_os = "macos")]
    return Some(&crate::keychain::LoginKeychain);
    #[cfg(not(target_os = "macos"))]
    return None;
}

/// Where [`Credentials::save`] put the credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredIn {
    /// The 0600 file (Linux, or macOS where the Keychain could not be used: `keychain_error`).
    File {
        path: PathBuf,
        keychain_error: Option<String>,
    },
    /// A secret store, e.g. the login Keychain.
    Store { name: String, account: String },
}

impl std::fmt::Display for StoredIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredIn::File {
                path,
                keychain_error: None,
            } => write!(f, "{}", path.display()),
            StoredIn::File {
                path,
                keychain_error: Some(reason),
            } => write!(
                f,
                "{} (mode 0600; the login Keychain could not be used: {reason})",
                path.display()
            ),
            StoredIn::Store { name, account } => write!(f, "{name}, account {account:?}"),
        }
    }
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

/// Where the CLI's directories go by default on macOS, under the home.
pub const MACOS_APP_SUPPORT: &str = "Library/Application Support";

impl Dirs {
    /// From `HOME`, `XDG_CONFIG_HOME` and `XDG_STATE_HOME` (relative values are ignored).
    pub fn from_env() -> Result<Dirs, ConfigError> {
        let home = absolute_env("HOME").ok_or(ConfigError::NoHome)?;
        Ok(Dirs::layout(
            home,
            absolute_env("XDG_CONFIG_HOME"),
            absolute_env("XDG_STATE_HOME"),
            cfg!(target_os = "macos"),
        ))
    }

    /// The directories for `home` and the (absolute) XDG variables: `~/.config/agentworks` and
    /// `~/.local/state/agentworks` on Linux, `~/Library/Application Support/agentworks` for both
    /// on macOS; a set XDG variable wins on both.
    pub fn layout(
        home: PathBuf,
        xdg_config: Option<PathBuf>,
        xdg_state: Option<PathBuf>,
        macos: bool,
    ) -> Dirs {
        let (config_default, state_default) = if macos {
            let support = home.join(MACOS_APP_SUPPORT);
            (support.clone(), support)
        } else {
            (home.join(".config"), home.join(".local/state"))
        };
        let config = xdg_config.unwrap_or(config_default);
        let state = xdg_state.unwrap_or(state_default);
        Dirs {
            config: config.join("agentworks"),
            state: state.join("agentworks"),
            home,
        }
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
#[serde(from = "StoredCredentials")]
pub struct Credentials {
    /// agentd's public URL (`http(s)://host[:port]`), used for login and logout.
    pub server: String,
    /// The gateways' WebSocket base URLs given at login, in failover order; empty when none was
    /// given (the executor then derives one from `server`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// The `devices:connect` bearer token.
    pub token: String,
    /// The account the token serves, as the server named it at login (shown before sharing);
    /// `None` for a credential stored before logins asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// The credential as it may be found stored: a login before there could be several gateways
/// kept at most one, as `gateway`; it is read as a list of one.
#[derive(Deserialize)]
struct StoredCredentials {
    server: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    gateways: Vec<String>,
    token: String,
    #[serde(default)]
    account: Option<String>,
}

impl From<StoredCredentials> for Credentials {
    fn from(stored: StoredCredentials) -> Credentials {
        let gateways = if stored.gateways.is_empty() {
            stored.gateway.into_iter().collect()
        } else {
            stored.gateways
        };
        Credentials {
            server: stored.server,
            gateways,
            token: stored.token,
            account: stored.account,
        }
    }
}

impl Credentials {
    /// `Ok(None)` when nobody is logged in. macOS: the login Keychain first, then the file.
    pub fn load(dirs: &Dirs) -> Result<Option<Credentials>, ConfigError> {
        Credentials::load_with(dirs, platform_store())
    }

    /// Stores the credential where the platform keeps it: the 0600 file on Linux ([`store`]),
    /// the login Keychain on macOS (the file where the Keychain fails, said in the answer).
    ///
    /// [`store`]: Credentials::store
    pub fn save(&self, dirs: &Dirs) -> Result<StoredIn, ConfigError> {
        self.save_with(dirs, platform_store())
    }

    /// Removes the credential from everywhere it may be; false when there was none.
    pub fn forget(dirs: &Dirs) -> Result<bool, ConfigError> {
        Credentials::forget_with(dirs, platform_store())
    }

    /// The store's item for this config directory.
    fn account(dirs: &Dirs) -> String {
        dirs.config.to_string_lossy().into_owned()
    }

    fn load_with(
        dirs: &Dirs,
        store: Option<&dyn SecretStore>,
    ) -> Result<Option<Credentials>, ConfigError> {
        let Some(store) = store else {
            return Credentials::load_file(dirs);
        };
        match store.get(&Credentials::account(dirs)) {
            Ok(Some(secret)) => serde_json::from_slice(&secret).map(Some).map_err(|source| {
                ConfigError::DamagedItem {
                    store: store.name(),
                    source,
                }
            }),
            Ok(None) => Credentials::load_file(dirs),
            // A store that cannot be read (a locked Keychain): the file may hold the credential
            // (it is where `save` put it when the store failed); if not, say why.
            Err(reason) => match Credentials::load_file(dirs)? {
                Some(creds) => Ok(Some(creds)),
                None => Err(ConfigError::SecretStore {
                    store: store.name(),
                    reason,
                }),
            },
        }
    }

    fn save_with(
        &self,
        dirs: &Dirs,
        store: Option<&dyn SecretStore>,
    ) -> Result<StoredIn, ConfigError> {
        let Some(store) = store else {
            return self.store(dirs).map(|path| StoredIn::File {
                path,
                keychain_error: None,
            });
        };
        let account = Credentials::account(dirs);
        let secret = serde_json::to_vec(self).map_err(|source| ConfigError::DamagedItem {
            store: store.name(),
            source,
        })?;
        match store.set(&account, &secret) {
            Ok(()) => {
                // An older credential in the file must not outlive this login.
                Credentials::delete(dirs)?;
                Ok(StoredIn::Store {
                    name: store.name(),
                    account,
                })
            }
            Err(reason) => self.store(dirs).map(|path| StoredIn::File {
                path,
                keychain_error: Some(reason),
            }),
        }
    }

    fn forget_with(dirs: &Dirs, store: Option<&dyn SecretStore>) -> Result<bool, ConfigError> {
        let in_store = match store {
            Some(store) => store
                .remove(&Credentials::account(dirs))
                .map_err(|reason| ConfigError::SecretStore {
                    store: store.name(),
                    reason,
                })?,
            None => false,
        };
        let in_file = Credentials::delete(dirs)?;
        Ok(in_store || in_file)
    }

    /// The credential in the 0600 file; `Ok(None)` when there is none.
    pub fn load_file(dirs: &Dirs) -> Result<Option<Credentials>, ConfigError> {
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

    /// Remove the credential file; false when there was none.
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
            gateways: Vec::new(),
            token: "t".into(),
            account: None,
        };
        let path = creds.store(&dirs).expect("store");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dirs.config), 0o700);
        assert_eq!(Credentials::load(&dirs).expect("load"), Some(creds));
        assert!(Credentials::delete(&dirs).expect("delete"));
        assert!(!Credentials::delete(&dirs).expect("delete"));
    }

    /// A credential stored by an older login, with one `gateway`, reads as a list of one; a
    /// new one keeps the whole list, in order.
    #[test]
    fn a_stored_single_gateway_reads_as_a_list_of_one() {
        let old: Credentials = serde_json::from_str(
            r#"{"server": "https://aw.example", "gateway": "wss://gw.example", "token": "t"}"#,
        )
        .expect("an old credential");
        assert_eq!(old.gateways, ["wss://gw.example"]);
        let none: Credentials =
            serde_json::from_str(r#"{"server": "https://aw.example", "token": "t"}"#)
                .expect("a credential without a gateway");
        assert!(none.gateways.is_empty());
        let several = Credentials {
            server: "https://aw.example".into(),
            gateways: vec!["wss://b.example".into(), "wss://a.example".into()],
            token: "t".into(),
            account: Some("alice".into()),
        };
        let text = serde_json::to_string(&several).expect("json");
        assert_eq!(
            serde_json::from_str::<Credentials>(&text).expect("read back"),
            several
        );
    }

    /// The default directories: XDG on Linux, Application Support on macOS; a set XDG
    /// variable wins on both.
    #[test]
    fn directories_per_platform() {
        let home = PathBuf::from("/home/ann");
        let linux = Dirs::layout(home.clone(), None, None, false);
        assert_eq!(linux.config, Path::new("/home/ann/.config/agentworks"));
        assert_eq!(linux.state, Path::new("/home/ann/.local/state/agentworks"));
        let home = PathBuf::from("/Users/ann");
        let macos = Dirs::layout(home.clone(), None, None, true);
        let support = Path::new("/Users/ann/Library/Application Support/agentworks");
        assert_eq!(
            (macos.config.as_path(), macos.state.as_path()),
            (support, support)
        );
        assert_eq!(macos.credentials_file(), support.join("credentials.json"));
        assert_eq!(macos.scratch_root(), support.join("scratch"));
        let xdg = Dirs::layout(home, Some("/x/c".into()), Some("/x/s".into()), true);
        assert_eq!(xdg.config, Path::new("/x/c/agentworks"));
        assert_eq!(xdg.state, Path::new("/x/s/agentworks"));
    }

    /// A stand-in for the login Keychain; `broken` makes every call fail as a locked one does.
    #[derive(Default)]
    struct FakeStore {
        items: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
        broken: bool,
    }

    impl SecretStore for FakeStore {
        fn name(&self) -> String {
            "the fake store".into()
        }
        fn get(&self, account: &str) -> Result<Option<Vec<u8>>, String> {
            if self.broken {
                return Err("locked".into());
            }
            Ok(self.items.lock().expect("lock").get(account).cloned())
        }
        fn set(&self, account: &str, secret: &[u8]) -> Result<(), String> {
            if self.broken {
                return Err("locked".into());
            }
            self.items
                .lock()
                .expect("lock")
                .insert(account.into(), secret.into());
            Ok(())
        }
        fn remove(&self, account: &str) -> Result<bool, String> {
            if self.broken {
                return Err("locked".into());
            }
            Ok(self.items.lock().expect("lock").remove(account).is_some())
        }
    }

    /// macOS's order, with a fake Keychain: the store when it works (and no file left behind),
    /// the 0600 file when it does not, and the file found again when the store cannot be read.
    #[test]
    fn the_keychain_first_and_the_file_as_fallback() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dirs = Dirs::layout(dir.path().to_owned(), None, None, true);
        let creds = Credentials {
            server: "https://aw.example".into(),
            gateways: Vec::new(),
            token: "t1".into(),
            account: None,
        };
        let store = FakeStore::default();
        // An older login left a file: saving into the store removes it.
        creds.store(&dirs).expect("old file");
        let stored = creds.save_with(&dirs, Some(&store)).expect("save");
        assert!(
            matches!(&stored, StoredIn::Store { account, .. } if *account == dirs.config.to_string_lossy()),
            "{stored}"
        );
        assert!(!dirs.credentials_file().exists());
        assert_eq!(
            Credentials::load_with(&dirs, Some(&store)).expect("load"),
            Some(creds.clone())
        );
        assert_eq!(Credentials::load_file(&dirs).expect("file"), None);
        assert!(Credentials::forget_with(&dirs, Some(&store)).expect("forget"));
        assert_eq!(
            Credentials::load_with(&dirs, Some(&store)).expect("load"),
            None
        );

        // A locked store: the file, 0600, and the message says why.
        let locked = FakeStore {
            broken: true,
            ..FakeStore::default()
        };
        assert!(matches!(
            Credentials::load_with(&dirs, Some(&locked)),
            Err(ConfigError::SecretStore { .. })
        ));
        let stored = creds.save_with(&dirs, Some(&locked)).expect("save");
        assert_eq!(
            stored,
            StoredIn::File {
                path: dirs.credentials_file(),
                keychain_error: Some("locked".into())
            }
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dirs.credentials_file())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            Credentials::load_with(&dirs, Some(&locked)).expect("load"),
            Some(creds.clone())
        );
        // A store that works again still finds the file's credential.
        assert_eq!(
            Credentials::load_with(&dirs, Some(&store)).expect("load"),
            Some(creds)
        );
        // Without a store (Linux): the file alone, as before.
        assert!(Credentials::forget_with(&dirs, None).expect("forget"));
        assert_eq!(Credentials::load_with(&dirs, None).expect("load"), None);
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
            gateways: Vec::new(),
            token: "t".into(),
            account: None,
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
