//! `agentworksctl quickstart`: the whole daemon set in the foreground on a private state root.
//!
//! Every daemon runs as the current user, loopback only, with its sockets under `<state>/run`;
//! a demo user, a demo workflow (with a few files) and a `workflows:write` token are created
//! through agentd's operator socket; Ctrl-C (or SIGTERM) stops every daemon with SIGTERM and
//! waits for it. Running it again reuses the state root (and mints a new token). It never
//! touches the system state root.
//!
//! Everything it makes is private to the current user, whatever umask it was started with
//! (root's is usually 022): it runs, and starts the daemons, under umask 077 (as the systemd
//! units do with `UMask=0077`), and forces the state root and the documents root to 0700
//! (a state root left by an older version is tightened too); the demo files are 0600.

use agentworks_daemon::layout::{LayoutError, ensure_private_dir};
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum QuickstartError {
    #[error("{0}")]
    Ports(&'static str),
    #[error("cannot prepare {path}: {source}")]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make the quickstart state private: {0}")]
    Private(#[from] LayoutError),
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
    #[error("setting up the demo failed: {0}")]
    Bootstrap(String),
}

/// What quickstart started, printed for people and (with --json) as the first stdout line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started {
    pub mcp_url: String,
    pub api_url: String,
    /// The executor WebSocket URL laptops dial (`agentworks executor connect --gateway`).
    pub gateway_url: Option<String>,
    pub token: String,
    pub workflow_id: String,
    pub state_root: PathBuf,
    pub documents_root: PathBuf,
    pub agentd_socket: PathBuf,
    pub workspaced_socket: PathBuf,
    /// A ready-to-paste MCP client configuration (the common `mcpServers` shape).
    pub mcp_client_config: Value,
}

const DEMO_FILES: [(&str, &str); 3] = [
    (
        "README.md",
        "# Demo workflow\n\nFiles here are served by agentworks through MCP.\n",
    ),
    ("code/task.py", "print('hello from the demo workflow')\n"),
    (
        "workflow.json",
        "{\"name\": \"demo\", \"steps\": [\"task\"]}\n",
    ),
];

/// A running daemon child, stopped with SIGTERM when dropped.
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

/// The two loopback ports quickstart's daemons listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// agentd's public listener: MCP, the device login and the chat API.
    pub http: u16,
    /// gatewayd's executor WebSocket.
    pub gateway: u16,
}

impl Ports {
    /// `http`, and `gateway` or else the port after `http`.
    pub fn new(http: u16, gateway: Option<u16>) -> Result<Ports, QuickstartError> {
        let gateway = match gateway {
            Some(port) => port,
            None => http.checked_add(1).ok_or(QuickstartError::Ports(
                "--port 65535 leaves no port after it for the executor WebSocket; give --gateway-port",
            ))?,
        };
        if gateway == http {
            return Err(QuickstartError::Ports(
                "--gateway-port must differ from --port",
            ));
        }
        Ok(Ports { http, gateway })
    }
}

fn prepare(state_root: &Path, ports: Ports) -> Result<(PathBuf, PathBuf), QuickstartError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| QuickstartError::Prepare { path, source }
    };
    let documents = state_root.join("documents");
    ensure_private_dir(&documents, 0o700)?;
    let demo = documents.join("demo");
    ensure_private_dir(&demo, 0o700)?;
    for (name, content) in DEMO_FILES {
        let path = demo.join(name);
        if !path.exists() {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(err(parent))?;
            }
            write_private(&path, content).map_err(err(&path))?;
        }
    }
    // quickstart owns this file: rewritten each run so --port and --gateway-port take effect.
    let config = state_root.join("agentworks.toml");
    write_private(
        &config,
        &format!(
            "# written by agentworksctl quickstart: every daemon as the current user, loopback only\n\
             [workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{http}\"\n\n\
             [gatewayd]\nlisten = \"127.0.0.1:{gateway}\"\nallowed_users = []\n",
            http = ports.http,
            gateway = ports.gateway
        ),
    )
    .map_err(err(&config))?;
    Ok((documents, config))
}

/// Writes `content` to `path`, creating it 0600 (an existing file keeps its mode).
fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(content.as_bytes())
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

fn start(name: &'static str, state_root: &Path, config: &Path) -> Result<Daemon, QuickstartError> {
    let binary = sibling(name)?;
    let child = Command::new(&binary)
        .env("AGENTWORKS_STATE_ROOT", state_root)
        .env("AGENTWORKS_CONFIG", config)
        .env_remove("AGENTWORKS_DOCUMENTS_ROOT")
        .env_remove("AGENTWORKS_RUNTIME_DIR")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|source| QuickstartError::Spawn {
            binary: binary.display().to_string(),
            source,
        })?;
    Ok(Daemon { name, child })
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
        let health: Result<Value, _> = UnixClient::new(socket).get("/v1/health").await;
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

/// Create (or find) the demo user and workflow and mint a token, through agentd's socket.
async fn bootstrap(agentd: &UnixClient) -> Result<(String, String), QuickstartError> {
    let admin = |endpoint: &'static str, body: Value| async move {
        agentd
            .post::<_, Value>(&format!("/v1/admin/{endpoint}"), &body)
            .await
    };
    let exists =
        |e: &agentworks_support::unix_http::ClientError| e.remote_code() == Some("already_exists");
    let fail =
        |e: agentworks_support::unix_http::ClientError| QuickstartError::Bootstrap(e.to_string());
    if let Err(e) = admin("users/add", json!({"name": "demo"})).await
        && !exists(&e)
    {
        return Err(fail(e));
    }
    if let Err(e) = admin(
        "projects/add",
        json!({"name": "demo", "kind": "workflow", "owner": "demo", "folder": "demo"}),
    )
    .await
        && !exists(&e)
    {
        return Err(fail(e));
    }
    let projects = admin("projects/list", json!({})).await.map_err(fail)?;
    let workflow_id = projects
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "demo"))
        .and_then(|p| p["id"].as_str())
        .ok_or_else(|| {
            QuickstartError::Bootstrap("the demo project is missing after creating it".into())
        })?
        .to_owned();
    let created = admin(
        "tokens/create",
        json!({"user": "demo", "scopes": ["workflows:write"], "label": "quickstart"}),
    )
    .await
    .map_err(fail)?;
    let token = created["token"]
        .as_str()
        .ok_or_else(|| QuickstartError::Bootstrap("agentd returned no token".into()))?
        .to_owned();
    Ok((workflow_id, token))
}

/// Start everything, call `ready` once all daemons answer and the demo exists, then wait for
/// `shutdown` (or a daemon dying) and stop them all.
pub async fn run(
    state_root: &Path,
    ports: Ports,
    shutdown: tokio_util::sync::CancellationToken,
    ready: impl FnOnce(&Started),
) -> Result<(), QuickstartError> {
    // First, before anything is created: what quickstart and its daemons create is private
    // (0700 directories, 0600 files), whatever umask we were started with. Process-wide on
    // purpose: agentworksctl quickstart is this process's only job, and the children
    // inherit it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
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
    // An existing root (an older quickstart's, made under a permissive umask) is tightened.
    ensure_private_dir(&state_root, 0o700)?;
    let (documents, config) = prepare(&state_root, ports)?;
    let workspaced_socket = state_root.join("run/workspaced.sock");
    let agentd_socket = state_root.join("run/agentd.sock");
    let mut workspaced = start("agentworks-workspaced", &state_root, &config)?;
    wait_healthy(&mut workspaced, &workspaced_socket).await?;
    let mut agentd = start("agentworks-agentd", &state_root, &config)?;
    wait_healthy(&mut agentd, &agentd_socket).await?;
    let gatewayd_socket = state_root.join("run/gatewayd.sock");
    let mut gatewayd = start("agentworks-gatewayd", &state_root, &config)?;
    wait_healthy(&mut gatewayd, &gatewayd_socket).await?;
    let (workflow_id, token) = bootstrap(&UnixClient::new(&agentd_socket)).await?;
    let api_url = format!("http://127.0.0.1:{}", ports.http);
    let mcp_url = format!("{api_url}/mcp");
    let mcp_client_config = json!({
        "mcpServers": {
            "agentworks": {
                "type": "http",
                "url": mcp_url,
                "headers": { "Authorization": format!("Bearer {token}") }
            }
        }
    });
    ready(&Started {
        mcp_url,
        api_url,
        gateway_url: Some(format!("ws://127.0.0.1:{}", ports.gateway)),
        token,
        workflow_id,
        state_root: state_root.clone(),
        documents_root: documents,
        agentd_socket,
        workspaced_socket,
        mcp_client_config,
    });
    let mut daemons = [gatewayd, agentd, workspaced];
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                for daemon in daemons.iter_mut() {
                    if let Ok(Some(status)) = daemon.child.try_wait() {
                        return Err(QuickstartError::Died { daemon: daemon.name.into(), status });
                    }
                }
            }
        }
    }
    // gatewayd first, then agentd (it calls workspaced), then workspaced; each waits for its
    // in-flight work.
    drop(daemons);
    Ok(())
}

/// The human-readable banner.
pub fn print_human(started: &Started) {
    println!("agentworks quickstart is running (Ctrl-C stops it)");
    println!("  MCP endpoint:    {}", started.mcp_url);
    println!("  token:           {}", started.token);
    println!("  demo workflow:   {}", started.workflow_id);
    println!("  state root:      {}", started.state_root.display());
    println!("  documents root:  {}", started.documents_root.display());
    println!();
    println!("MCP client configuration (paste into your client's settings):");
    println!(
        "{}",
        serde_json::to_string_pretty(&started.mcp_client_config).unwrap_or_default()
    );
    println!();
    println!("Try it:");
    println!(
        "  curl -s {} -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/list' -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"_meta\":{{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{{}}}}}}}}'",
        started.mcp_url, started.token
    );
    println!();
    if let Some(gateway) = &started.gateway_url {
        println!("Share a laptop folder with the server-side agent:");
        println!(
            "  agentworks login --server {}          # then approve: agentworksctl login approve CODE --user demo",
            started.api_url
        );
        println!("  agentworks executor connect --gateway {gateway} --write-folder ~/src/project");
        println!();
    }
    println!(
        "Administer it from another shell: AGENTWORKS_STATE_ROOT={} agentworksctl status",
        started.state_root.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_port_defaults_to_the_next_and_can_be_given() {
        assert_eq!(
            Ports::new(8470, None).ok(),
            Some(Ports {
                http: 8470,
                gateway: 8471
            })
        );
        assert_eq!(
            Ports::new(8470, Some(9000)).ok(),
            Some(Ports {
                http: 8470,
                gateway: 9000
            })
        );
        assert!(Ports::new(65535, None).is_err());
        assert!(Ports::new(8470, Some(8470)).is_err());
    }
}
