//! Test harness: temp state roots, the real `agentworks-workspaced` binary (optionally as
//! another user, with capabilities, or with a failpoint), a blocking client, test users.

use agentworks::guard::Guard;
use agentworks::ipc::client::{ClientError, UnixClient};
use agentworks::workspace::api::{Context, Principal};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private state root in a temp dir: `<root>/documents`, `<root>/run`, `<root>/files`.
pub struct StateRoot {
    pub dir: tempfile::TempDir,
}

impl StateRoot {
    pub fn new() -> StateRoot {
        let dir = tempfile::Builder::new()
            .prefix("aw-state-")
            .tempdir()
            .unwrap();
        // Readable by the unprivileged users some tests run workspaced as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(dir.path().join("documents")).unwrap();
        std::fs::write(dir.path().join("agentworks.toml"), "").unwrap();
        StateRoot { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn documents(&self) -> PathBuf {
        self.root().join("documents")
    }

    pub fn socket(&self) -> PathBuf {
        self.root().join("run/workspaced.sock")
    }

    /// Create a project folder with the given files.
    pub fn project(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.documents().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (path, content) in files {
            let full = dir.join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        dir
    }

    /// Write the config file every daemon started on this root reads.
    pub fn set_config(&self, toml: &str) {
        std::fs::write(self.root().join("agentworks.toml"), toml).unwrap();
    }
}

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
        command
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("AGENTWORKS_STATE_ROOT", state.root())
            .env("AGENTWORKS_CONFIG", state.root().join("agentworks.toml"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
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
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("workspaced exited during start: {status}");
            }
            let health: Result<serde_json::Value, _> =
                block_on(UnixClient::new(&self.socket).get("/v1/health"));
            if health.is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "workspaced did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Client {
        Client {
            inner: UnixClient::new(&self.socket),
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
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

/// Run a future on a throwaway current-thread runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
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

/// Ensure a system group exists; returns its gid.
pub fn ensure_group(name: &str) -> u32 {
    let _ = Command::new("groupadd").arg("-f").arg(name).status();
    nix::unistd::Group::from_name(name)
        .unwrap()
        .expect("group exists")
        .gid
        .as_raw()
}

/// Ensure a system user exists (no home, no login) with the given supplementary groups; returns (uid, primary gid).
pub fn ensure_user(name: &str, groups: &[&str]) -> (u32, u32) {
    if nix::unistd::User::from_name(name).unwrap().is_none() {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
            ])
            .arg(name)
            .status()
            .unwrap();
        // Another test may have created it concurrently.
        assert!(status.success() || nix::unistd::User::from_name(name).unwrap().is_some());
    }
    for group in groups {
        ensure_group(group);
        let status = Command::new("usermod")
            .args(["-a", "-G", group, name])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let user = nix::unistd::User::from_name(name).unwrap().unwrap();
    (user.uid.as_raw(), user.gid.as_raw())
}

/// Serialize tests that create users (useradd/usermod lock /etc/passwd).
pub fn users_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// List every file under `dir` (recursively), as relative paths.
pub fn all_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                out.push(
                    entry
                        .path()
                        .strip_prefix(dir)
                        .unwrap()
                        .display()
                        .to_string(),
                );
            }
        }
    }
    out.sort();
    out
}

impl StateRoot {
    /// Hand the state root (not the documents) to `uid:gid`, for a daemon running as that user.
    pub fn give_state_to(&self, uid: u32, gid: u32) {
        let owner = Some(nix::unistd::Uid::from_raw(uid));
        let group = Some(nix::unistd::Gid::from_raw(gid));
        nix::unistd::chown(self.root(), owner, group).unwrap();
        nix::unistd::chown(&self.root().join("agentworks.toml"), owner, group).unwrap();
        for sub in ["run", "files"] {
            let dir = self.root().join(sub);
            if dir.exists() {
                let status = Command::new("chown")
                    .arg("-R")
                    .arg(format!("{uid}:{gid}"))
                    .arg(&dir)
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
    }
}
