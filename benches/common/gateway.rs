//! A stack with gatewayd and a real laptop for a benchmark: workspaced, agentd and gatewayd
//! (release builds, from cargo) on one temp state root, and `agentworks executor connect` in a
//! temp HOME sharing one write folder, logged in with a devices:connect token. Not part of
//! [`common`](super): a benchmark includes it with `#[path]` (as `gateway_roundtrip` and
//! `runnerd_laptop` do), after declaring the test harness's `daemons`, `ports` and
//! `laptop_cli` modules, which it uses. It starts processes and never asserts timings.

use crate::daemons::Process;
use crate::{laptop_cli, ports};
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// workspaced + agentd + gatewayd on one state root. Fields drop in order: gatewayd, agentd,
/// workspaced, then the state root.
pub struct Stack {
    pub gatewayd: Process,
    pub _agentd: Process,
    pub _workspaced: Process,
    pub agentd_port: u16,
    pub gateway_port: u16,
    pub agentd_socket: UnixClient,
    pub gatewayd_socket: UnixClient,
    pub state: tempfile::TempDir,
}

impl Stack {
    /// Starts the stack on a fresh state root under `base`. `gatewayd_keys` are added to
    /// `[gatewayd]`, and `sections` (whole tables: `[agentd.model]`, `[runnerd]`, …) follow it.
    pub async fn start(base: &Path, gatewayd_keys: &str, sections: &str) -> Stack {
        let state_dir = tempfile::Builder::new()
            .prefix("state-")
            .tempdir_in(base)
            .unwrap();
        let state = state_dir.path();
        let (agentd_port, gateway_port) = (ports::free_port(), ports::free_port());
        std::fs::write(
            state.join("agentworks.toml"),
            format!(
                "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{agentd_port}\"\n\n\
                 [gatewayd]\nlisten = \"127.0.0.1:{gateway_port}\"\nallowed_users = []\n\
                 {gatewayd_keys}\n\n{sections}\n"
            ),
        )
        .unwrap();
        let workspaced_socket = UnixClient::new(state.join("run/workspaced.sock"));
        let agentd_socket = UnixClient::new(state.join("run/agentd.sock"));
        let gatewayd_socket = UnixClient::new(state.join("run/gatewayd.sock"));

        let mut workspaced = Process::daemon(
            "agentworks-workspaced",
            env!("CARGO_BIN_EXE_agentworks-workspaced"),
            state,
        );
        workspaced
            .wait_ready(Duration::from_secs(30), || async {
                workspaced_socket.get::<Value>("/v1/health").await.is_ok()
            })
            .await;
        let mut agentd = Process::daemon(
            "agentworks-agentd",
            env!("CARGO_BIN_EXE_agentworks-agentd"),
            state,
        );
        agentd
            .wait_ready(Duration::from_secs(30), || async {
                agentd_socket
                    .post::<_, Value>("/v1/admin/users/list", &json!({}))
                    .await
                    .is_ok()
            })
            .await;
        let mut gatewayd = Process::daemon(
            "agentworks-gatewayd",
            env!("CARGO_BIN_EXE_agentworks-gatewayd"),
            state,
        );
        gatewayd
            .wait_ready(Duration::from_secs(30), || async {
                gatewayd_socket.get::<Value>("/v1/health").await.is_ok()
                    && tokio::net::TcpStream::connect(("127.0.0.1", gateway_port))
                        .await
                        .is_ok()
            })
            .await;
        Stack {
            gatewayd,
            _agentd: agentd,
            _workspaced: workspaced,
            agentd_port,
            gateway_port,
            agentd_socket,
            gatewayd_socket,
            state: state_dir,
        }
    }

    pub async fn admin(&self, endpoint: &str, body: Value) -> Value {
        self.agentd_socket
            .post::<_, Value>(&format!("/v1/admin/{endpoint}"), &body)
            .await
            .unwrap_or_else(|e| panic!("admin {endpoint} {body}: {e}"))
    }

    /// A new devices:connect token of `user`: (token, user id).
    pub async fn device_token(&self, user: &str) -> Result<(String, String), String> {
        let created = self
            .agentd_socket
            .post::<_, Value>(
                "/v1/admin/tokens/create",
                &json!({"user": user, "scopes": ["devices:connect"]}),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok((
            created["token"].as_str().expect("a token").to_owned(),
            created["info"]["user_id"]
                .as_str()
                .expect("the token's user id")
                .to_owned(),
        ))
    }

    pub async fn connected(&self) -> u64 {
        let health: Value = self.gatewayd_socket.get("/v1/health").await.unwrap();
        health["connected"].as_u64().unwrap_or(0)
    }
}

/// A temp laptop: `home/` (HOME, default XDG dirs) and `proj/` (the shared write folder).
pub struct Laptop {
    dir: tempfile::TempDir,
}

impl Laptop {
    pub fn new(base: &Path) -> Laptop {
        let dir = tempfile::Builder::new()
            .prefix("laptop-")
            .tempdir_in(base)
            .unwrap();
        let laptop = Laptop { dir };
        std::fs::create_dir_all(laptop.home()).unwrap();
        std::fs::create_dir_all(laptop.project()).unwrap();
        laptop
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    pub fn project(&self) -> PathBuf {
        self.root().join("proj")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks"));
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", self.home())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        command
    }
}

/// `agentworks login --with-token`, then `agentworks executor connect`.
pub fn start_executor(laptop: &Laptop, stack: &Stack, token: &str) -> Process {
    let server = format!("http://127.0.0.1:{}", stack.agentd_port);
    let gateway = format!("ws://127.0.0.1:{}", stack.gateway_port);
    laptop_cli::login_with_token(laptop.command(&[]), &server, &[&gateway], token);
    let log = std::fs::File::create(laptop.root().join("executor.stderr")).unwrap();
    let project = laptop.project();
    let child = laptop
        .command(&[
            "executor",
            "connect",
            "--name",
            "bench",
            "--write-folder",
            project.to_str().unwrap(),
            "--server",
            &server,
            "--gateway",
            &gateway,
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Process {
        name: "agentworks executor connect",
        child,
    }
}

/// The device id of the user's online device `name`, once it is listed online.
pub async fn wait_online(
    stack: &Stack,
    executor: &mut Process,
    laptop: &Laptop,
    user_id: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let devices: Value = stack
            .gatewayd_socket
            .post("/v1/devices", &json!({"user_id": user_id}))
            .await
            .unwrap();
        let online = devices.as_array().and_then(|ds| {
            ds.iter()
                .find(|d| d["name"] == "bench" && d["online"] == true)
                .and_then(|d| d["device_id"].as_str())
        });
        if let Some(id) = online {
            return id.to_owned();
        }
        if let Some(status) = executor.exited() {
            let log =
                std::fs::read_to_string(laptop.root().join("executor.stderr")).unwrap_or_default();
            panic!("the executor exited ({status}) before it was online:\n{log}");
        }
        assert!(
            Instant::now() < deadline,
            "the executor did not come online"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
