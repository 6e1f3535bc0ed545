//! Test harness: temp state roots, the real `agentworks-workspaced` binary (optionally as
//! another user, with capabilities, or with a failpoint), a blocking client, test users, and a
//! fake laptop for the `agentworks` CLI.

use agentworks_contract::workspaced::{Context, Principal};
use agentworks_core::guard::Guard;
use agentworks_support::unix_http::{ClientError, UnixClient};
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
            .env("RUST_LOG", "warn")
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

/// A loopback TCP port reserved for one daemon of this test process: see [`reserve_ports`].
pub fn free_port() -> u16 {
    reserve_ports(1)[0]
}

/// `n` loopback TCP ports for the daemons a test starts, each handed out once per test
/// process and free when handed out.
///
/// Ports come from below the kernel's ephemeral range (`ip_local_port_range`), so no
/// outgoing connection and no port-0 bind of any process (another test's client, a daemon
/// binding port 0) can take one between this check and the daemon's own bind; a port once
/// handed out is never handed out again here, so two tests of one process never share one.
/// Each process starts at an offset of its pid, so that concurrent test processes (the suite
/// and a benchmark, say) rarely try the same ports; one that is taken is skipped.
pub fn reserve_ports(n: usize) -> Vec<u16> {
    use std::sync::Mutex;
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(12_000));
    let span = u32::from(high - low);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or_else(|| low + (std::process::id() * 16 % span) as u16);
    let mut ports = Vec::with_capacity(n);
    let mut tried = 0;
    while ports.len() < n {
        assert!(
            tried < span,
            "no free loopback port below {high} for the test daemons"
        );
        tried += 1;
        let candidate = port;
        port = if port + 1 >= high { low } else { port + 1 };
        if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            ports.push(candidate);
        }
    }
    *next = Some(port);
    ports
}

/// The arguments of `agentworksctl quickstart --json` on `state` with both of its ports given
/// (`--port`, `--gateway-port`).
pub fn quickstart_args(state: &Path, ports: [u16; 2]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "quickstart",
        "--json",
        "--port",
        &ports[0].to_string(),
        "--gateway-port",
        &ports[1].to_string(),
        "--state-root",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(state.into());
    args
}

/// A running `agentworksctl quickstart --json`: the child and its first stdout line (the JSON
/// `Started`). Its stderr goes to a file that is shown whenever its start fails.
pub struct QuickstartRun {
    pub child: Child,
    pub started: serde_json::Value,
}

impl QuickstartRun {
    /// Spawns `command` (quickstart with [`quickstart_args`]) and reads its JSON line; panics
    /// with quickstart's stderr if there is none.
    pub fn spawn(mut command: Command) -> QuickstartRun {
        use std::io::BufRead;
        let stderr = tempfile::NamedTempFile::new().unwrap();
        command
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap());
        let mut child = command.spawn().unwrap();
        let mut line = String::new();
        let read = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        match read.ok().and_then(|_| serde_json::from_str(&line).ok()) {
            Some(started) => QuickstartRun { child, started },
            None => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "quickstart printed no JSON line ({status:?}); stdout: {line:?}; stderr:\n{}",
                    std::fs::read_to_string(stderr.path()).unwrap_or_default()
                );
            }
        }
    }
}

/// workspaced + agentd on one temp state root, as the current user, agentd on a free port.
pub struct Stack {
    pub state: StateRoot,
    pub workspaced: Workspaced,
    pub agentd: Child,
    pub port: u16,
}

impl Stack {
    pub fn start() -> Stack {
        let port = free_port();
        Stack::start_on(
            port,
            &format!(
                "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
    }

    /// workspaced + agentd on a new state root with `config`, agentd listening on `port`;
    /// returns once agentd answers on its socket.
    fn start_on(port: u16, config: &str) -> Stack {
        let state = StateRoot::new();
        state.set_config(config);
        let workspaced = Workspaced::start(&state);
        let agentd = Command::new(env!("CARGO_BIN_EXE_agentworks-agentd"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("AGENTWORKS_STATE_ROOT", state.root())
            .env("AGENTWORKS_CONFIG", state.root().join("agentworks.toml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stack = Stack {
            state,
            workspaced,
            agentd,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while stack
            .admin_raw("users/list", serde_json::json!({}))
            .is_err()
        {
            assert!(Instant::now() < deadline, "agentd did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        stack
    }

    pub fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn agentd_socket(&self) -> PathBuf {
        self.state.root().join("run/agentd.sock")
    }

    pub fn admin_raw(
        &self,
        endpoint: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        block_on(
            UnixClient::new(self.agentd_socket()).post(&format!("/v1/admin/{endpoint}"), &body),
        )
    }

    /// An operator call that must succeed.
    pub fn admin(&self, endpoint: &str, body: serde_json::Value) -> serde_json::Value {
        self.admin_raw(endpoint, body.clone())
            .unwrap_or_else(|e| panic!("admin {endpoint} {body}: {e}"))
    }

    /// Run `agentworksctl` against this stack.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
            .args(args)
            .env("AGENTWORKS_STATE_ROOT", self.state.root())
            .env(
                "AGENTWORKS_CONFIG",
                self.state.root().join("agentworks.toml"),
            )
            .output()
            .unwrap()
    }

    /// A user with a project they own (folder = project name) and a token with `scopes`.
    pub fn user_with_project(
        &self,
        user: &str,
        project: &str,
        scopes: &[&str],
    ) -> (String, String) {
        let _ = self.admin_raw("users/add", serde_json::json!({"name": user}));
        let created = self.admin_raw(
            "projects/add",
            serde_json::json!({"name": project, "kind": "workflow", "owner": user}),
        );
        if let Err(e) = &created {
            assert_eq!(e.remote_code(), Some("already_exists"), "{e}");
        }
        let projects = self.admin("projects/list", serde_json::json!({}));
        let id = projects
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == project)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        (id, self.token(user, scopes, serde_json::json!({})))
    }

    /// A new token for `user` with `scopes` and extra fields (project, write_folders, …).
    pub fn token(&self, user: &str, scopes: &[&str], extra: serde_json::Value) -> String {
        let mut body = serde_json::json!({"user": user, "scopes": scopes});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        self.admin("tokens/create", body)["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.agentd.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.agentd.wait();
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`: (status, headers, body text).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::BodyExt;
    block_on(async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{port}"));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    })
}

/// A stateless (2026-07-28) `tools/call` of `tool` with `arguments`: (HTTP status, the
/// JSON-RPC response or error body).
pub fn mcp_call(
    port: u16,
    token: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": tool, "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    });
    let auth = format!("Bearer {token}");
    let (status, _, text) = http(
        port,
        "POST",
        "/mcp",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", tool),
        ],
        &body.to_string(),
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// The structured result of a successful tool call, or the tool error's `{code, …}`.
pub fn tool_result(
    port: u16,
    token: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> Result<serde_json::Value, serde_json::Value> {
    let (status, body) = mcp_call(port, token, tool, arguments);
    assert_eq!(status, 200, "{tool}: HTTP {status}: {body}");
    let result = &body["result"];
    if result["isError"] == true {
        Err(result["structuredContent"]["error"].clone())
    } else {
        Ok(result["structuredContent"].clone())
    }
}

// ----- gatewayd (appended for tests/suite/gatewayd.rs) -----

impl Stack {
    /// [`Stack::start`], then a `[gatewayd]` section (listen on a free loopback port,
    /// `allowed_users = []`) appended to the config, so the file holds both daemons' sections.
    /// Returns the stack and the gateway's port; start the daemon with [`Gatewayd::start`].
    pub fn start_with_gateway() -> (Stack, u16) {
        let stack = Stack::start();
        let port = free_port();
        let path = stack.state.root().join("agentworks.toml");
        let config = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            format!("{config}\n[gatewayd]\nlisten = \"127.0.0.1:{port}\"\nallowed_users = []\n"),
        )
        .unwrap();
        (stack, port)
    }

    pub fn gatewayd_socket(&self) -> PathBuf {
        self.state.root().join("run/gatewayd.sock")
    }
}

/// A running `agentworks-gatewayd` beside a [`Stack`].
pub struct Gatewayd {
    pub child: Child,
    pub socket: PathBuf,
    pub port: u16,
}

impl Gatewayd {
    /// Start gatewayd on the stack's state root and wait until both its socket and its
    /// WebSocket port answer.
    pub fn start(stack: &Stack, port: u16) -> Gatewayd {
        let child = Command::new(env!("CARGO_BIN_EXE_agentworks-gatewayd"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("AGENTWORKS_STATE_ROOT", stack.state.root())
            .env(
                "AGENTWORKS_CONFIG",
                stack.state.root().join("agentworks.toml"),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut daemon = Gatewayd {
            child,
            socket: stack.gatewayd_socket(),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("gatewayd exited during start: {status}");
            }
            let health: Result<serde_json::Value, _> =
                block_on(UnixClient::new(&daemon.socket).get("/v1/health"));
            if health.is_ok() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return daemon;
            }
            assert!(Instant::now() < deadline, "gatewayd did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Client {
        Client {
            inner: UnixClient::new(&self.socket),
        }
    }

    /// SIGTERM and wait for the exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Gatewayd {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = self.child.wait();
        }
    }
}

// ----- the agent (appended for tests/suite/agent.rs) -----

impl Stack {
    /// [`Stack::start_with_gateway`], with `agentd_extra` (e.g. an `[agentd.model]` table)
    /// written into the config before agentd starts. Returns the stack and the gateway's port.
    pub fn start_with_gateway_and(agentd_extra: &str) -> (Stack, u16) {
        let port = free_port();
        let gw_port = free_port();
        let config = format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\n\
             {agentd_extra}\n\n[gatewayd]\nlisten = \"127.0.0.1:{gw_port}\"\nallowed_users = []\n"
        );
        (Stack::start_on(port, &config), gw_port)
    }
}

// ----- a fake laptop (for tests/suite/laptop.rs, agent.rs and executor.rs) -----

/// A fake laptop for the `agentworks` CLI: a temp dir holding a private HOME (`<root>/home`)
/// and, unless made with [`Laptop::with_default_dirs`], XDG config and state dirs beside it.
/// Every accessor agrees with the environment [`Laptop::command`] sets.
pub struct Laptop {
    dir: tempfile::TempDir,
    /// `XDG_CONFIG_HOME` and `XDG_STATE_HOME` are set (to `<root>/xdg-config`,
    /// `<root>/xdg-state`); otherwise unset, so `agentworks` uses `~/.config` and `~/.local/state`.
    xdg: bool,
}

impl Laptop {
    /// A laptop in a temp dir named `<prefix>…`, with `files` (path under HOME, content)
    /// written, and its XDG config and state dirs created outside HOME.
    pub fn new(prefix: &str, files: &[(&str, &str)]) -> Laptop {
        let laptop = Laptop::make(prefix, files, true);
        std::fs::create_dir_all(laptop.config_home()).unwrap();
        std::fs::create_dir_all(laptop.state_home()).unwrap();
        laptop
    }

    /// As [`Laptop::new`], but no `XDG_*` variables: the default `~/.config` and
    /// `~/.local/state` are used (and left for `agentworks` to create).
    pub fn with_default_dirs(prefix: &str, files: &[(&str, &str)]) -> Laptop {
        Laptop::make(prefix, files, false)
    }

    fn make(prefix: &str, files: &[(&str, &str)], xdg: bool) -> Laptop {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let laptop = Laptop { dir, xdg };
        std::fs::create_dir_all(laptop.home()).unwrap();
        for (path, content) in files {
            let path = laptop.home().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        laptop
    }

    /// The temp dir, canonical.
    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    /// The config dir: `<root>/xdg-config`, or `~/.config` with default dirs.
    pub fn config_home(&self) -> PathBuf {
        if self.xdg {
            self.root().join("xdg-config")
        } else {
            self.home().join(".config")
        }
    }

    /// The state dir (receipts, scratch dirs below `agentworks/`): `<root>/xdg-state`, or
    /// `~/.local/state` with default dirs.
    pub fn state_home(&self) -> PathBuf {
        if self.xdg {
            self.root().join("xdg-state")
        } else {
            self.home().join(".local/state")
        }
    }

    /// Where `agentworks login` stores the credential.
    pub fn credentials(&self) -> PathBuf {
        self.config_home().join("agentworks/credentials.json")
    }

    /// A project folder: `~/src/<name>`.
    pub fn folder(&self, name: &str) -> PathBuf {
        self.home().join("src").join(name)
    }

    /// `agentworks <args>` with a cleared environment: PATH, HOME and (unless default dirs)
    /// the XDG dirs; stdin null.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks"));
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", self.home())
            .stdin(Stdio::null());
        if self.xdg {
            command
                .env("XDG_CONFIG_HOME", self.config_home())
                .env("XDG_STATE_HOME", self.state_home());
        }
        command
    }

    /// `agentworks login --server … --gateway … --with-token`, the token on stdin; asserts it
    /// succeeds and stores the credential.
    pub fn login(&self, stack: &Stack, gateway_port: u16, token: &str) {
        use std::io::Write;
        let server = format!("http://127.0.0.1:{}", stack.port);
        let gateway = format!("ws://127.0.0.1:{gateway_port}");
        let mut child = self
            .command(&[
                "login",
                "--server",
                &server,
                "--gateway",
                &gateway,
                "--with-token",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "login: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(self.credentials().exists());
    }
}

/// Every live process whose command line (arguments joined by spaces) contains `marker`, as
/// `"<pid>: <command line>"` so a failing assertion shows what is left.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

/// Polls `cond` until it holds; fails the test with `what` if it does not within `within`.
pub fn wait_until(what: &str, within: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
