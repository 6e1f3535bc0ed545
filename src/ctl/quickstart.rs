//! `agentworksctl quickstart`: the whole daemon set in the foreground on a private state root.
//!
//! Every daemon runs as the current user with its sockets under `<state>/run`; a demo project
//! is created once; Ctrl-C (or SIGTERM) stops every daemon with SIGTERM and waits for it.
//! Running it again reuses the state root. It never touches the system state root.

use crate::ipc::client::UnixClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum QuickstartError {
    #[error("cannot prepare {path}: {source}")]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{binary} was not found next to agentworksctl ({dir}); build every binary first: cargo build --bins"
    )]
    MissingBinary { binary: String, dir: PathBuf },
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("{daemon} exited during start ({status}); its log is above")]
    DiedAtStart {
        daemon: String,
        status: std::process::ExitStatus,
    },
    #[error("{daemon} did not become ready within {seconds} s")]
    NotReady { daemon: String, seconds: u64 },
    #[error("{daemon} stopped unexpectedly ({status})")]
    Died {
        daemon: String,
        status: std::process::ExitStatus,
    },
}

/// What quickstart started, printed for people and (with --json) for scripts.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started {
    pub state_root: PathBuf,
    pub documents_root: PathBuf,
    pub workspaced_socket: PathBuf,
    pub project: String,
}

const DEMO_FILES: [(&str, &str); 3] = [
    (
        "README.md",
        "# Demo workflow\n\nFiles here are served by agentworks-workspaced.\n",
    ),
    ("code/task.py", "print('hello from the demo workflow')\n"),
    (
        "workflow.json",
        "{\"name\": \"demo\", \"steps\": [\"task\"]}\n",
    ),
];

/// A running daemon child.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }
}

fn prepare(state_root: &Path) -> Result<(PathBuf, PathBuf), QuickstartError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| QuickstartError::Prepare { path, source }
    };
    let documents = state_root.join("documents");
    let demo = documents.join("demo");
    std::fs::create_dir_all(&demo).map_err(err(&demo))?;
    for (name, content) in DEMO_FILES {
        let path = demo.join(name);
        if !path.exists() {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(err(parent))?;
            }
            std::fs::write(&path, content).map_err(err(&path))?;
        }
    }
    let config = state_root.join("agentworks.toml");
    if !config.exists() {
        std::fs::write(
            &config,
            "# quickstart: every daemon as the current user, sockets under ./run\n",
        )
        .map_err(err(&config))?;
    }
    Ok((documents, config))
}

fn sibling(binary: &str) -> Result<PathBuf, QuickstartError> {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let path = dir.join(binary);
    if path.is_file() {
        Ok(path)
    } else {
        Err(QuickstartError::MissingBinary {
            binary: binary.into(),
            dir,
        })
    }
}

async fn wait_healthy(daemon: &mut Daemon, socket: &Path) -> Result<(), QuickstartError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            return Err(QuickstartError::DiedAtStart {
                daemon: daemon.name.into(),
                status,
            });
        }
        let health: Result<serde_json::Value, _> = UnixClient::new(socket).get("/v1/health").await;
        if health.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(QuickstartError::NotReady {
                daemon: daemon.name.into(),
                seconds: 30,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start everything, call `ready` once all daemons answer, then wait for `shutdown` and stop.
pub async fn run(
    state_root: &Path,
    shutdown: tokio_util::sync::CancellationToken,
    ready: impl FnOnce(&Started),
) -> Result<(), QuickstartError> {
    std::fs::create_dir_all(state_root).map_err(|source| QuickstartError::Prepare {
        path: state_root.to_owned(),
        source,
    })?;
    let state_root = state_root
        .canonicalize()
        .map_err(|source| QuickstartError::Prepare {
            path: state_root.to_owned(),
            source,
        })?;
    let (documents, config) = prepare(&state_root)?;
    let binary = sibling("agentworks-workspaced")?;
    let child = Command::new(&binary)
        .env("AGENTWORKS_STATE_ROOT", &state_root)
        .env("AGENTWORKS_CONFIG", &config)
        .env_remove("AGENTWORKS_DOCUMENTS_ROOT")
        .env_remove("AGENTWORKS_RUNTIME_DIR")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|source| QuickstartError::Spawn {
            binary: binary.display().to_string(),
            source,
        })?;
    let mut workspaced = Daemon {
        name: "agentworks-workspaced",
        child,
    };
    let socket = state_root.join("run/workspaced.sock");
    wait_healthy(&mut workspaced, &socket).await?;
    ready(&Started {
        state_root: state_root.clone(),
        documents_root: documents,
        workspaced_socket: socket,
        project: "demo".into(),
    });
    // Wait for Ctrl-C, or for a daemon to die on its own.
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                if let Ok(Some(status)) = workspaced.child.try_wait() {
                    return Err(QuickstartError::Died { daemon: workspaced.name.into(), status });
                }
            }
        }
    }
    drop(workspaced);
    Ok(())
}
