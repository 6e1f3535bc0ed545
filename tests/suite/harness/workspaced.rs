//! The real `agentworks-workspaced` on a [`StateRoot`]: as the current user or (through
//! `setpriv`) another uid with chosen groups and capabilities, on another socket, or with a
//! failpoint. [`Workspaced::start_with`] returns only once the health endpoint answers (after
//! recovery) and panics if the daemon exits first; its stderr is inherited, so what it said
//! is in the test's output. Dropping it SIGKILLs and reaps it. Also the blocking [`Client`]
//! for a daemon socket and the request contexts and revisions the tests compare against.

use super::daemons::{as_daemon_on, send_signal, wait_ready};
use super::{StateRoot, block_on};
use agentworks_contract::workspaced::{Context, Principal};
use agentworks_core::guard::Guard;
use agentworks_support::unix_http::{ClientError, UnixClient};
use nix::sys::signal::Signal;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// How to start workspaced.
#[derive(Default, Clone)]
pub struct Options {
    /// `AGENTWORKS_FAILPOINT` (debug builds only).
    pub failpoint: Option<String>,
    /// Run as this uid/gid with these supplementary groups (via `setpriv`).
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// Capabilities to keep when running as `user`, e.g. `["chown"]`.
    pub caps: Vec<&'static str>,
    /// A different socket (two daemons on one state root).
    pub socket: Option<PathBuf>,
}

/// A running `agentworks-workspaced`.
pub struct Workspaced {
    pub child: Child,
    pub socket: PathBuf,
}

pub fn workspaced_bin() -> &'static str {
    env!("CARGO_BIN_EXE_agentworks-workspaced")
}

impl Workspaced {
    pub fn start(state: &StateRoot) -> Workspaced {
        Workspaced::start_with(state, Options::default())
    }

    /// Start and wait until its health endpoint answers (it answers only after recovery).
    pub fn start_with(state: &StateRoot, options: Options) -> Workspaced {
        let child = Workspaced::spawn(state, &options);
        let socket = options.socket.clone().unwrap_or_else(|| state.socket());
        let mut daemon = Workspaced { child, socket };
        daemon.wait_ready();
        daemon
    }

    /// Spawn without waiting (for failpoints that kill it during start).
    pub fn spawn(state: &StateRoot, options: &Options) -> Child {
        let mut command = match &options.user {
            None => Command::new(workspaced_bin()),
            Some((uid, gid, groups)) => {
                let mut c = Command::new("setpriv");
                let groups = if groups.is_empty() {
                    "--clear-groups".to_string()
                } else {
                    format!(
                        "--groups={}",
                        groups
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                };
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg(groups);
                if options.caps.is_empty() {
                    c.arg("--inh-caps=-all").arg("--bounding-set=-all");
                } else {
                    let list = options
                        .caps
                        .iter()
                        .map(|c| format!("+{c}"))
                        .collect::<Vec<_>>()
                        .join(",");
                    c.arg(format!("--inh-caps=-all,{list}"))
                        .arg(format!("--ambient-caps={list}"));
                }
                c.arg(workspaced_bin());
                c
            }
        };
        as_daemon_on(&mut command, state.root());
        if let Some(socket) = &options.socket {
            let config = std::fs::read_to_string(state.root().join("agentworks.toml")).unwrap();
            assert!(
                !config.contains("[workspaced]"),
                "pass a socket through Options only with an empty config"
            );
            let alt = state.root().join(format!(
                "agentworks-{}.toml",
                socket.file_name().unwrap().to_string_lossy()
            ));
            std::fs::write(
                &alt,
                format!(
                    "{config}\n[workspaced]\nsocket = {:?}\n",
                    socket.display().to_string()
                ),
            )
            .unwrap();
            command.env("AGENTWORKS_CONFIG", alt);
        }
        if let Some(fp) = &options.failpoint {
            command.env("AGENTWORKS_FAILPOINT", fp);
        }
        command.spawn().expect("spawn workspaced")
    }

    fn wait_ready(&mut self) {
        let client = UnixClient::new(&self.socket);
        block_on(wait_ready(
            &mut self.child,
            "workspaced",
            Duration::from_secs(20),
            || async { client.get::<serde_json::Value>("/v1/health").await.is_ok() },
        ));
    }

    pub fn client(&self) -> Client {
        Client {
            inner: UnixClient::new(&self.socket),
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = send_signal(&self.child, Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        send_signal(&self.child, Signal::SIGTERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Workspaced {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// A blocking client for one socket.
#[derive(Clone)]
pub struct Client {
    pub inner: UnixClient,
}

impl Client {
    pub fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        block_on(self.inner.post(path, body))
    }

    /// POST returning raw JSON, or the error code on failure.
    pub fn json(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, (String, serde_json::Value)> {
        match self.post::<_, serde_json::Value>(path, &body) {
            Ok(v) => Ok(v),
            Err(ClientError::Remote { body, .. }) => {
                let details = serde_json::to_value(&body).unwrap();
                Err((body.code, details))
            }
            Err(e) => panic!("transport error calling {path}: {e}"),
        }
    }

    pub fn read(
        &self,
        ctx: &Context,
        path: &str,
    ) -> Result<serde_json::Value, (String, serde_json::Value)> {
        self.json(
            "/v1/read",
            serde_json::json!({"context": ctx, "path": path}),
        )
    }

    pub fn write(
        &self,
        ctx: &Context,
        path: &str,
        content: &str,
        expected: &str,
        request_id: &str,
    ) -> Result<serde_json::Value, (String, serde_json::Value)> {
        self.json(
            "/v1/write",
            serde_json::json!({"context": ctx, "path": path, "content": content,
                "expected_revision": expected, "request_id": request_id}),
        )
    }

    pub fn receipt(
        &self,
        ctx: &Context,
        request_id: &str,
    ) -> Result<serde_json::Value, (String, serde_json::Value)> {
        self.json(
            "/v1/receipt",
            serde_json::json!({"context": ctx, "request_id": request_id}),
        )
    }
}

/// A context for `project` as user `user` that may write the whole project.
pub fn ctx(project: &str, user: &str) -> Context {
    ctx_with_guard(
        project,
        user,
        Guard {
            write_paths: vec![".".into()],
            ..Guard::default()
        },
    )
}

pub fn ctx_with_guard(project: &str, user: &str, guard: Guard) -> Context {
    Context {
        project: project.into(),
        principal: Principal {
            user_id: format!("id-{user}"),
            user_name: user.into(),
            connection_id: Some("conn-test".into()),
            source: "test".into(),
        },
        guard,
    }
}

/// `sha256:<hex>` of `content`, computed independently of the daemon.
pub fn revision(content: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(content.as_bytes()))
    )
}
