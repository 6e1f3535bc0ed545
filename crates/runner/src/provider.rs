//! The providers runnerd found at start: each `[runnerd.providers.NAME]` with its driver, its
//! model, its upstream, its key file, and its executable resolved once, when runnerd starts.
//!
//! Owns resolving executables (an absolute path, or a bare name on runnerd's `PATH`) and reading
//! a provider's key file. A provider whose executable is missing is kept with the reason: status
//! shows it and a turn naming it is refused by name.
//!
//! Must never: put a key into an error, a log line or [`ProviderInfo`] (errors name the key
//! file's path, never its content), look an executable up relative to a cwd (relative `PATH`
//! entries are skipped), or resolve executables again per turn (what runs is what start found).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agentworks_contract::runnerd::ProviderInfo;
use agentworks_daemon::config::{AcpProviderConfig, ProviderConfig};

use crate::acp::{AcpAgent, AcpApi, AcpOptions};

/// The most bytes a key file may hold: a key is short; a big file is a mistake.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// The CLI dialect runnerd drives a provider with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// `codex exec --json`, its config in `CODEX_HOME`, the Responses API.
    Codex,
    /// An agent speaking the Agent Client Protocol on stdio (OpenCode), with the provider's
    /// [`AcpOptions`].
    Acp,
    /// `claude --bare -p --output-format stream-json`, its config in `CLAUDE_CONFIG_DIR`, the
    /// Messages API.
    ClaudeCode,
}

impl Driver {
    /// The driver named in the config (`driver = "codex"`).
    pub fn from_name(name: &str) -> Option<Driver> {
        match name {
            "codex" => Some(Driver::Codex),
            "acp" => Some(Driver::Acp),
            "claude" => Some(Driver::ClaudeCode),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Driver::Codex => "codex",
            Driver::Acp => "acp",
            Driver::ClaudeCode => "claude",
        }
    }
}

/// Why a provider's key could not be read. Names the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The key file could not be read.
    #[error("cannot read the key file {path} of provider {provider}: {source}")]
    ReadKey {
        provider: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The key file holds nothing but whitespace.
    #[error("the key file {path} of provider {provider} is empty")]
    EmptyKey { provider: String, path: PathBuf },
    /// The key file is bigger than any key.
    #[error(
        "the key file {path} of provider {provider} is larger than {MAX_KEY_FILE_BYTES} bytes; \
         it should hold only the key"
    )]
    KeyTooLarge { provider: String, path: PathBuf },
}

/// One configured provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub name: String,
    pub driver: Driver,
    /// The model name the CLI asks for.
    pub model: String,
    /// The upstream API's base URL the model gateway forwards to.
    pub upstream: String,
    /// The file holding the upstream's key, read by runnerd only.
    pub key_file: Option<PathBuf>,
    /// The executable found at start, or why none was.
    pub executable: Result<PathBuf, String>,
    /// [`Driver::Acp`]: how the agent is run (validated with the config).
    pub acp: Option<AcpOptions>,
}

impl Provider {
    /// Reads the key file: its content trimmed. `None` when no key file is configured (an
    /// upstream that needs no key). Empty, unreadable or oversized → an error naming the path.
    pub fn read_key(&self) -> Result<Option<String>, ProviderError> {
        let Some(path) = &self.key_file else {
            return Ok(None);
        };
        let read_error = |source| ProviderError::ReadKey {
            provider: self.name.clone(),
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mut bytes = Vec::new();
        // One byte past the limit tells "too large" from "exactly at it".
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_KEY_FILE_BYTES + 1),
            &mut bytes,
        )
        .map_err(read_error)?;
        if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
            return Err(ProviderError::KeyTooLarge {
                provider: self.name.clone(),
                path: path.clone(),
            });
        }
        // Not `from_utf8(..)?`: its error would not carry the path, and the bytes stay private.
        let Ok(text) = String::from_utf8(bytes) else {
            return Err(read_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not UTF-8 text",
            )));
        };
        let key = text.trim();
        if key.is_empty() {
            return Err(ProviderError::EmptyKey {
                provider: self.name.clone(),
                path: path.clone(),
            });
        }
        Ok(Some(key.to_owned()))
    }

    /// How agentd and status see it (never its key).
    pub fn info(&self) -> ProviderInfo {
        let (executable, unavailable) = match &self.executable {
            Ok(path) => (Some(path.display().to_string()), None),
            Err(why) => (None, Some(why.clone())),
        };
        ProviderInfo {
            name: self.name.clone(),
            driver: self.driver.as_str().to_owned(),
            model: self.model.clone(),
            executable,
            unavailable,
        }
    }
}

/// Every provider runnerd can name, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Providers {
    by_name: BTreeMap<String, Provider>,
}

impl Providers {
    /// From the config, each executable resolved now: an absolute path must be an executable
    /// regular file (symlinks followed: npm installs a link); a bare name is looked up on
    /// `path_var` (runnerd's `PATH`), absolute entries only, first match wins. A missing one is
    /// kept with the reason.
    ///
    /// A provider with a driver runnerd does not have is left out (with a warning): config
    /// validation refuses it before this runs, and nothing here could drive it.
    pub fn resolve(
        config: &BTreeMap<String, ProviderConfig>,
        path_var: Option<&OsStr>,
    ) -> Providers {
        let mut by_name = BTreeMap::new();
        for (name, provider) in config {
            let Some(driver) = Driver::from_name(&provider.driver) else {
                tracing::warn!(
                    provider = %name,
                    driver = %provider.driver,
                    "provider left out: runnerd has no such driver"
                );
                continue;
            };
            let acp = match (driver, &provider.acp) {
                (Driver::Acp, Some(acp)) => match acp_options(acp) {
                    Some(options) => Some(options),
                    None => {
                        tracing::warn!(provider = %name, agent = %acp.agent, "provider left out: runnerd cannot run this ACP agent");
                        continue;
                    }
                },
                (Driver::Acp, None) => {
                    tracing::warn!(provider = %name, "provider left out: driver \"acp\" without an [acp] table");
                    continue;
                }
                _ => None,
            };
            let executable = resolve_executable(&provider.executable, path_var);
            if let Err(why) = &executable {
                tracing::warn!(provider = %name, "provider unavailable: {why}");
            }
            by_name.insert(
                name.clone(),
                Provider {
                    name: name.clone(),
                    driver,
                    model: provider.model.clone(),
                    upstream: provider.upstream.clone(),
                    key_file: provider.key_file.clone(),
                    executable,
                    acp,
                },
            );
        }
        Providers { by_name }
    }

    pub fn get(&self, name: &str) -> Option<&Provider> {
        self.by_name.get(name)
    }

    /// Every provider, in name order, as agentd and status see them.
    pub fn info(&self) -> Vec<ProviderInfo> {
        self.by_name.values().map(Provider::info).collect()
    }
}

/// An `[acp]` table as the driver uses it: `None` for an agent or API runnerd does not have
/// (config validation refuses them first).
fn acp_options(acp: &AcpProviderConfig) -> Option<AcpOptions> {
    let agent = AcpAgent::from_name(&acp.agent)?;
    let api = match &acp.api {
        Some(name) => AcpApi::from_name(name).filter(|api| agent.apis().contains(api))?,
        None => *agent.apis().first()?,
    };
    Some(AcpOptions {
        args: acp.args.clone(),
        agent,
        api,
    })
}

/// Finds the executable the config names, or says why there is none.
fn resolve_executable(executable: &str, path_var: Option<&OsStr>) -> Result<PathBuf, String> {
    let given = Path::new(executable);
    if given.is_absolute() {
        return check_executable(given).map(|()| given.to_path_buf());
    }
    if executable.is_empty() || executable.contains('/') {
        return Err(format!(
            "executable {executable:?} must be an absolute path or a bare name found on PATH"
        ));
    }
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(format!(
            "{executable} cannot be looked up: runnerd has no PATH"
        ));
    };
    let mut skipped = Vec::new();
    for dir in std::env::split_paths(path_var) {
        // An empty or relative entry would depend on runnerd's cwd.
        if !dir.is_absolute() {
            continue;
        }
        let candidate = dir.join(executable);
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            // Exists but unusable: remembered, so the reason is not just "not found".
            Err(why) if std::fs::symlink_metadata(&candidate).is_ok() => skipped.push(why),
            Err(_) => {}
        }
    }
    let mut why = format!(
        "{executable} was not found on runnerd's PATH ({})",
        path_var.to_string_lossy()
    );
    if !skipped.is_empty() {
        why.push_str(&format!("; skipped: {}", skipped.join("; ")));
    }
    Err(why)
}

/// An executable regular file (after following links) that runnerd's user may execute.
fn check_executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{} does not exist", path.display()),
        _ => format!("{} cannot be examined: {e}", path.display()),
    })?;
    if meta.is_dir() {
        return Err(format!("{} is a directory", path.display()));
    }
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    // The mode bits say whether anyone may; access(2) says whether runnerd's user may (and
    // catches a noexec mount). Root passes access(X_OK) for any file with one x bit.
    if meta.permissions().mode() & 0o111 == 0
        || rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_err()
    {
        return Err(format!("{} is not executable", path.display()));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn config(executable: &str, key_file: Option<PathBuf>) -> ProviderConfig {
        ProviderConfig {
            driver: "codex".into(),
            executable: executable.into(),
            model: "gpt-test".into(),
            upstream: "https://api.example/v1".into(),
            key_file,
            acp: None,
        }
    }

    fn write_executable(path: &Path, mode: u32) {
        std::fs::write(path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn resolve_one(executable: &str, path_var: Option<&OsStr>) -> Result<PathBuf, String> {
        let providers = Providers::resolve(
            &BTreeMap::from([("p".to_owned(), config(executable, None))]),
            path_var,
        );
        providers.get("p").unwrap().executable.clone()
    }

    #[test]
    fn absolute_executables_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = tmp.path().join("codex");
        write_executable(&exe, 0o755);
        let exe_str = exe.to_str().unwrap();
        assert_eq!(resolve_one(exe_str, None).unwrap(), exe);

        // A link, as npm installs it: followed to check, kept as given.
        let link = tmp.path().join("bin-codex");
        symlink(&exe, &link).unwrap();
        assert_eq!(resolve_one(link.to_str().unwrap(), None).unwrap(), link);

        let missing = tmp.path().join("nope");
        let why = resolve_one(missing.to_str().unwrap(), None).unwrap_err();
        assert!(
            why.contains("does not exist") && why.contains("nope"),
            "{why}"
        );

        let dangling = tmp.path().join("dangling");
        symlink(&missing, &dangling).unwrap();
        assert!(resolve_one(dangling.to_str().unwrap(), None).is_err());

        let plain = tmp.path().join("plain");
        write_executable(&plain, 0o644);
        let why = resolve_one(plain.to_str().unwrap(), None).unwrap_err();
        assert!(why.contains("not executable"), "{why}");

        let why = resolve_one(tmp.path().to_str().unwrap(), None).unwrap_err();
        assert!(why.contains("is a directory"), "{why}");
    }

    #[test]
    fn bare_names_are_looked_up_on_path() {
        let tmp = tempfile::tempdir().unwrap();
        let (first, second, dir_entry) = (
            tmp.path().join("first"),
            tmp.path().join("second"),
            tmp.path().join("third"),
        );
        for dir in [&first, &second, &dir_entry] {
            std::fs::create_dir(dir).unwrap();
        }
        // Not executable in the first, a directory in the third, the real one in the second.
        write_executable(&first.join("codex"), 0o644);
        write_executable(&second.join("codex"), 0o755);
        std::fs::create_dir(dir_entry.join("codex")).unwrap();
        let path_var = std::env::join_paths([&first, &dir_entry, &second]).unwrap();
        assert_eq!(
            resolve_one("codex", Some(&path_var)).unwrap(),
            second.join("codex")
        );

        // Only unusable ones: not found, with the reasons.
        let path_var = std::env::join_paths([&first, &dir_entry]).unwrap();
        let why = resolve_one("codex", Some(&path_var)).unwrap_err();
        assert!(why.contains("not found on runnerd's PATH"), "{why}");
        assert!(
            why.contains("not executable") && why.contains("is a directory"),
            "{why}"
        );

        // Missing everywhere, no PATH, a relative entry (cwd-dependent) never used.
        let why = resolve_one("nope", Some(&path_var)).unwrap_err();
        assert!(why.contains("not found"), "{why}");
        assert!(resolve_one("codex", None).unwrap_err().contains("no PATH"));
        let relative = std::env::join_paths([Path::new("."), Path::new("")]).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert!(resolve_one(cwd.file_name().unwrap().to_str().unwrap(), Some(&relative)).is_err());
        // A relative path with a slash is neither absolute nor a bare name.
        assert!(
            resolve_one("bin/codex", Some(&path_var))
                .unwrap_err()
                .contains("bare name")
        );
    }

    #[test]
    fn info_shows_found_and_missing_and_unknown_drivers_are_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = tmp.path().join("codex");
        write_executable(&exe, 0o755);
        let mut unknown = config("codex", None);
        unknown.driver = "other".into();
        let providers = Providers::resolve(
            &BTreeMap::from([
                ("b-found".to_owned(), config(exe.to_str().unwrap(), None)),
                ("a-missing".to_owned(), config("/nonexistent/codex", None)),
                ("c-unknown".to_owned(), unknown),
            ]),
            None,
        );
        assert!(providers.get("c-unknown").is_none());
        let info = providers.info();
        assert_eq!(info.len(), 2);
        assert_eq!(info[0].name, "a-missing");
        assert_eq!(info[0].executable, None);
        assert!(
            info[0]
                .unavailable
                .as_deref()
                .unwrap()
                .contains("/nonexistent/codex")
        );
        assert_eq!(info[1].name, "b-found");
        assert_eq!(info[1].driver, "codex");
        assert_eq!(info[1].model, "gpt-test");
        assert_eq!(info[1].executable.as_deref(), exe.to_str());
        assert_eq!(info[1].unavailable, None);
    }

    #[test]
    fn read_key_trims_and_names_the_path_never_the_content() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = |key_file: Option<PathBuf>| {
            let providers = Providers::resolve(
                &BTreeMap::from([("p".to_owned(), config("/bin/sh", key_file))]),
                None,
            );
            providers.get("p").unwrap().clone()
        };
        assert_eq!(provider(None).read_key().unwrap(), None);

        let key = tmp.path().join("key");
        std::fs::write(&key, "  sk-secret-123\n").unwrap();
        assert_eq!(
            provider(Some(key.clone())).read_key().unwrap().as_deref(),
            Some("sk-secret-123")
        );

        let empty = tmp.path().join("empty");
        std::fs::write(&empty, " \n\t\n").unwrap();
        let err = provider(Some(empty.clone())).read_key().unwrap_err();
        assert!(matches!(err, ProviderError::EmptyKey { .. }), "{err}");
        assert!(err.to_string().contains(empty.to_str().unwrap()));

        let missing = tmp.path().join("missing");
        let err = provider(Some(missing.clone())).read_key().unwrap_err();
        assert!(matches!(err, ProviderError::ReadKey { .. }), "{err}");
        assert!(err.to_string().contains(missing.to_str().unwrap()));

        // Unreadable: mode 000, read in a thread without the capabilities that let root
        // bypass it (capabilities are per thread).
        let unreadable = tmp.path().join("unreadable");
        std::fs::write(&unreadable, "sk-secret-456").unwrap();
        std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o000)).unwrap();
        let unreadable_provider = provider(Some(unreadable.clone()));
        let err = std::thread::spawn(move || {
            for cap in [
                caps::Capability::CAP_DAC_OVERRIDE,
                caps::Capability::CAP_DAC_READ_SEARCH,
            ] {
                caps::drop(None, caps::CapSet::Effective, cap).unwrap();
            }
            unreadable_provider.read_key()
        })
        .join()
        .unwrap()
        .unwrap_err();
        assert!(matches!(err, ProviderError::ReadKey { .. }), "{err}");
        assert!(err.to_string().contains(unreadable.to_str().unwrap()));
        assert!(!format!("{err} {err:?}").contains("sk-secret"));

        let large = tmp.path().join("large");
        std::fs::write(&large, "sk-secret-".repeat(10_000)).unwrap();
        let err = provider(Some(large)).read_key().unwrap_err();
        assert!(matches!(err, ProviderError::KeyTooLarge { .. }), "{err}");
        assert!(!format!("{err} {err:?}").contains("sk-secret"));

        let binary = tmp.path().join("binary");
        std::fs::write(&binary, b"sk-secret-\xff").unwrap();
        let err = provider(Some(binary)).read_key().unwrap_err();
        assert!(!format!("{err} {err:?}").contains("sk-secret"), "{err:?}");
    }
}
