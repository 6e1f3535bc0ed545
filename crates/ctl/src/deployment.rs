//! Which daemons an `agentworksctl` command administers, and the record a running quickstart
//! leaves so that a command run with no configuration finds it.
//!
//! The precedence ([`choose`]):
//!
//! 1. `--config`, `AGENTWORKS_CONFIG`, `AGENTWORKS_STATE_ROOT` or `AGENTWORKS_RUNTIME_DIR`:
//!    what they say, as the daemons read it ([`Config::load`]).
//! 2. A system install (`/etc/agentworks/agentworks.toml`, or a socket at
//!    `/run/agentworks/agentd.sock`): it, and a note naming every quickstart of this user that
//!    runs besides it, so that a quickstart never shadows it and is never silently passed over.
//! 3. A running quickstart of this user: the one in this directory
//!    (`./.agentworks-quickstart`) if it runs, else the only one; several and none here is
//!    refused with their state roots. A note on stderr says which was used.
//! 4. Nothing: the defaults (the system's paths), which `status` reports as down, with a hint.
//!
//! A quickstart records itself in `$XDG_STATE_HOME/agentworksctl/quickstarts/` (default
//! `~/.local/state`; not under `agentworks/`, which is the user units' state root and the
//! laptop CLI's state): one JSON file per state root (named by its [`root_key`]), 0600 in a
//! 0700 directory, written once its daemons answer and removed when it stops. A record counts
//! only while its agentd socket accepts a connection (a quickstart killed with SIGKILL leaves
//! one behind, and it is ignored), and only when the record and the state root it names belong
//! to the user running the command. Never: starts, stops or writes to a daemon.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use agentworks_daemon::config::{
    Config, ConfigError, DEFAULT_CONFIG_PATH, ENV_CONFIG, ENV_RUNTIME_DIR, ENV_STATE_ROOT,
};
use agentworks_daemon::layout::{LayoutError, ensure_private_dir, root_key};
use serde::{Deserialize, Serialize};

/// The state root `agentworksctl quickstart` uses by default, looked for in the current
/// directory when several quickstarts run.
pub const DEFAULT_QUICKSTART_ROOT: &str = ".agentworks-quickstart";

/// Why the configuration of a command could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "no configuration is given and {} quickstarts of yours run, none in this directory: {}; \
         choose one with AGENTWORKS_STATE_ROOT=DIR (or run this from its directory)",
        roots.len(),
        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    SeveralQuickstarts { roots: Vec<PathBuf> },
}

/// What [`choose`] settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chosen {
    /// `--config` or one of the environment variables: as given.
    Given,
    /// The system install; `quickstarts` of this user run besides it.
    System { quickstarts: Vec<PathBuf> },
    /// The quickstart running at this state root.
    Quickstart(PathBuf),
    /// No configuration, no system install, no running quickstart: the defaults.
    Nothing,
}

/// The precedence of the module doc, on what was found: `given` (a flag or variable names the
/// configuration), `system` (a system install exists), the state roots of the quickstarts
/// running, and `here`, the canonical `./.agentworks-quickstart` if it exists.
pub fn choose(
    given: bool,
    system: bool,
    mut running: Vec<PathBuf>,
    here: Option<&Path>,
) -> Result<Chosen, DeploymentError> {
    if given {
        return Ok(Chosen::Given);
    }
    if system {
        return Ok(Chosen::System {
            quickstarts: running,
        });
    }
    if let Some(here) = here
        && running.iter().any(|root| root == here)
    {
        return Ok(Chosen::Quickstart(here.to_owned()));
    }
    match running.len() {
        0 => Ok(Chosen::Nothing),
        1 => Ok(Chosen::Quickstart(running.remove(0))),
        _ => Err(DeploymentError::SeveralQuickstarts { roots: running }),
    }
}

/// The configuration a command uses, what it was chosen from, and a note for stderr saying so
/// when it was not given.
pub struct Settled {
    pub config: Config,
    pub chosen: Chosen,
    pub note: Option<String>,
}

/// Settles the configuration of a command (see the module doc) from the real environment.
pub fn settle(explicit: Option<&Path>) -> Result<Settled, DeploymentError> {
    let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let given =
        explicit.is_some() || set(ENV_CONFIG) || set(ENV_STATE_ROOT) || set(ENV_RUNTIME_DIR);
    let system =
        Path::new(DEFAULT_CONFIG_PATH).exists() || Config::default().agentd_socket().exists();
    let (running, here) = if given {
        (Vec::new(), None)
    } else {
        let here = Path::new(DEFAULT_QUICKSTART_ROOT).canonicalize().ok();
        (running_quickstarts(), here)
    };
    let chosen = choose(given, system, running, here.as_deref())?;
    let (config, note) = match &chosen {
        Chosen::Given | Chosen::Nothing => (Config::load(explicit)?, None),
        Chosen::System { quickstarts } => {
            let note = (!quickstarts.is_empty()).then(|| {
                let roots: Vec<String> = quickstarts
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect();
                format!(
                    "using the system install; a quickstart of yours also runs at {}: \
                     AGENTWORKS_STATE_ROOT={} agentworksctl … administers it",
                    roots.join(", "),
                    roots[0]
                )
            });
            (Config::load(explicit)?, note)
        }
        Chosen::Quickstart(root) => (
            crate::quickstart::daemon_config(root)?,
            Some(format!(
                "using the quickstart running at {} (no --config, AGENTWORKS_CONFIG or \
                 AGENTWORKS_STATE_ROOT, and no system install)",
                root.display()
            )),
        ),
    };
    Ok(Settled {
        config,
        chosen,
        note,
    })
}

/// The folder of the quickstart records: `$XDG_STATE_HOME/agentworksctl/quickstarts`, else
/// `$HOME/.local/state/agentworksctl/quickstarts`; `None` when neither is an absolute path.
pub fn records_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let absolute = |name| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let state_home = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local/state")))?;
    Some(state_home.join("agentworksctl/quickstarts"))
}

fn real_records_dir() -> Option<PathBuf> {
    records_dir(&|name| std::env::var(name).ok())
}

/// What a running quickstart records about itself.
#[derive(Debug, Serialize, Deserialize)]
struct QuickstartRecord {
    /// The canonical state root.
    state_root: PathBuf,
    /// The `agentworksctl quickstart` process.
    pid: u32,
    /// agentd's public URL, for people reading the file.
    api_url: String,
}

/// Why a quickstart could not record itself.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("neither XDG_STATE_HOME nor HOME is an absolute path")]
    NoStateHome,
    #[error("cannot make {0}: {1}")]
    Dir(PathBuf, LayoutError),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// A running quickstart's record, removed when dropped (when the quickstart stops, however it
/// returns).
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// Records the quickstart on `state_root` (canonical) serving `api_url`.
    pub fn create(state_root: &Path, api_url: &str) -> Result<Registration, RecordError> {
        let dir = real_records_dir().ok_or(RecordError::NoStateHome)?;
        ensure_private_dir(&dir, 0o700).map_err(|e| RecordError::Dir(dir.clone(), e))?;
        let path = dir.join(format!("{}.json", root_key(state_root)));
        let record = QuickstartRecord {
            state_root: state_root.to_owned(),
            pid: std::process::id(),
            api_url: api_url.to_owned(),
        };
        let text = serde_json::to_string(&record).unwrap_or_default();
        replace_private(&path, &text).map_err(|e| RecordError::Write(path.clone(), e))?;
        Ok(Registration { path })
    }

    /// The record's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Only our own: a quickstart started on the same state root since then keeps its.
        let ours = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| serde_json::from_str::<QuickstartRecord>(&text).ok())
            .is_some_and(|record| record.pid == std::process::id());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Replaces `path` with a new 0600 file holding `content`, so that a reader sees the old file
/// or the new one, never a part.
pub fn replace_private(path: &Path, content: &str) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let staged = path.with_file_name(format!(
        ".{}.{}.new",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staged);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staged)?;
    file.write_all(content.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&staged, path)
}

/// The state roots of this user's quickstarts whose agentd answers, sorted.
pub fn running_quickstarts() -> Vec<PathBuf> {
    let Some(dir) = real_records_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let uid = rustix::process::geteuid().as_raw();
    let mut roots: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|entry| {
            // Ours only, and written by us alone: a record points this command at sockets.
            let meta = std::fs::symlink_metadata(entry.path()).ok()?;
            if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
                return None;
            }
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let record: QuickstartRecord = serde_json::from_str(&text).ok()?;
            let root = record.state_root;
            let root_meta = std::fs::metadata(&root).ok()?;
            if !root.is_absolute() || !root_meta.is_dir() || root_meta.uid() != uid {
                return None;
            }
            // Its daemons run: agentd accepts a connection (a left-over socket refuses it).
            std::os::unix::net::UnixStream::connect(root.join("run/agentd.sock")).ok()?;
            Some(root)
        })
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_records_live_in_the_state_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            records_dir(&env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")])),
            Some(PathBuf::from("/s/agentworksctl/quickstarts"))
        );
        assert_eq!(
            records_dir(&env(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.local/state/agentworksctl/quickstarts"))
        );
        assert_eq!(records_dir(&env(&[("HOME", "h")])), None);
        assert_eq!(records_dir(&env(&[])), None);
    }

    #[test]
    fn a_given_configuration_wins_then_the_system_then_a_quickstart() {
        let (a, b) = (PathBuf::from("/a/qs"), PathBuf::from("/b/qs"));
        let both = || vec![a.clone(), b.clone()];
        assert_eq!(choose(true, true, both(), None).ok(), Some(Chosen::Given));
        // A system install is used, and the quickstarts beside it are named.
        assert_eq!(
            choose(false, true, both(), Some(&a)).ok(),
            Some(Chosen::System {
                quickstarts: both()
            })
        );
        assert_eq!(
            choose(false, false, vec![b.clone()], None).ok(),
            Some(Chosen::Quickstart(b.clone()))
        );
        // Several: the one in this directory, else none is guessed.
        assert_eq!(
            choose(false, false, both(), Some(&b)).ok(),
            Some(Chosen::Quickstart(b.clone()))
        );
        let refused = choose(false, false, both(), Some(Path::new("/c/qs")))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("/a/qs, /b/qs") && refused.contains("AGENTWORKS_STATE_ROOT"),
            "{refused}"
        );
        assert_eq!(
            choose(false, false, Vec::new(), None).ok(),
            Some(Chosen::Nothing)
        );
    }
}
