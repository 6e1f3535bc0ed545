//! The [`Stack`]: workspaced and the real `agentworks-agentd` on one new [`StateRoot`], as the
//! current user, agentd's public port reserved with [`free_port`]. [`Stack::start`] returns
//! once agentd answers operator calls on its socket (an agentd that exits during its start is
//! noticed only at the 20 s deadline); both daemons' stderr is inherited, so what they said is
//! in the test's output. Dropping it SIGTERMs and reaps agentd (then workspaced is killed by
//! its own drop). Also operator calls (`admin`), `agentworksctl` runs, and test users with
//! projects and tokens.

use super::daemons::{as_daemon_on, send_signal};
use super::{StateRoot, Workspaced, block_on, free_port};
use agentworks_support::unix_http::{ClientError, UnixClient};
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// workspaced + agentd on one temp state root, as the current user, agentd on a free port.
pub struct Stack {
    pub state: StateRoot,
    pub workspaced: Workspaced,
    pub agentd: Child,
    pub port: u16,
    /// In cluster mode ([`super::cluster_mode`]), the PostgreSQL and NATS servers this stack's
    /// `[cluster]` section names; dropped with the stack.
    pub cluster: Option<(super::Postgres, super::Nats)>,
}

impl Stack {
    /// How many rows agentd's `table` holds, wherever this stack keeps it: in its PostgreSQL
    /// (namespace `agentd`) in cluster mode, else in the SQLite file `<state>/agent/<file>`.
    pub fn agentd_rows(&self, file: &str, table: &str) -> i64 {
        match &self.cluster {
            Some((postgres, _)) => postgres
                .psql(
                    "agentworks",
                    &format!("SELECT count(*) FROM agentd.{table}"),
                )
                .parse()
                .unwrap(),
            None => {
                let db =
                    rusqlite::Connection::open(self.state.root().join("agent").join(file)).unwrap();
                db.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                    .unwrap()
            }
        }
    }

    /// Where agentd keeps `needle` in clear, if anywhere: a file under `<state>/agent`, or, in
    /// cluster mode, a row of its tables in PostgreSQL (as text, or as bytes).
    pub fn agentd_state_holding(&self, needle: &str) -> Option<String> {
        let agent_dir = self.state.root().join("agent");
        let in_file = super::all_files(&agent_dir).into_iter().find(|file| {
            let bytes = std::fs::read(agent_dir.join(file)).unwrap();
            bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        });
        if in_file.is_some() {
            return in_file;
        }
        let (postgres, _) = self.cluster.as_ref()?;
        let dump = postgres.dump("agentworks", "agentd");
        (dump.contains(needle) || dump.contains(&hex::encode(needle)))
            .then(|| "a row in PostgreSQL (namespace agentd)".to_owned())
    }

    pub fn start() -> Stack {
        let port = free_port();
        Stack::start_on(
            port,
            &format!(
                "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
    }

    /// [`Stack::start`] with `runnerd` (a `[runnerd]` section and its providers) in the config,
    /// and the real `agentworks-runnerd` started on the same state root: its socket is the
    /// default `<runtime_dir>/runnerd.sock`, the one agentd calls. Returns once both answer;
    /// dropping the [`super::Runnerd`] kills runnerd (agentd then finds it not running).
    /// In cluster mode ([`super::cluster_mode`]) agentd reaches workspaced and runnerd over a
    /// NATS server of the stack's own instead ([`runnerd_behind_nats`]).
    pub fn start_with_runnerd(runnerd: &str) -> (Stack, super::Runnerd) {
        let port = free_port();
        let servers =
            super::cluster_mode().then(|| (super::Postgres::start(), super::Nats::start()));
        let config = match &servers {
            Some((postgres, nats)) => {
                let routed = runnerd_behind_nats(runnerd);
                format!(
                    "[workspaced]\nallowed_users = []\n{}\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n{}\n\
                     {}\n{}",
                    routed.workspaced,
                    routed.agentd,
                    routed.runnerd,
                    super::cluster_section(postgres, nats, CLUSTER_HOST)
                )
            }
            None => format!(
                "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\n{runnerd}\n"
            ),
        };
        let mut stack = Stack::start_on(port, &config);
        let mut runnerd = super::Runnerd::start(&stack.state);
        if servers.is_some() {
            runnerd.only_over_nats();
        }
        stack.cluster = servers;
        (stack, runnerd)
    }

    /// workspaced + agentd on a new state root with `config`, agentd listening on `port`;
    /// returns once agentd answers on its socket.
    pub fn start_on(port: u16, config: &str) -> Stack {
        Stack::start_wrapped(port, config, &[])
    }

    /// [`Stack::start_on`] with agentd started through `wrapper` (a program and its arguments,
    /// agentd's path appended), e.g. `unshare` for a mount namespace of its own.
    pub fn start_wrapped(port: u16, config: &str, wrapper: &[&std::ffi::OsStr]) -> Stack {
        let state = StateRoot::new();
        state.set_config(config);
        let workspaced = Workspaced::start(&state);
        let agentd_bin = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_agentworks-agentd"));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(agentd_bin);
                command
            }
            None => Command::new(agentd_bin),
        };
        let agentd = as_daemon_on(&mut command, state.root()).spawn().unwrap();
        let stack = Stack {
            state,
            workspaced,
            agentd,
            port,
            cluster: None,
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

    /// Stop agentd (SIGTERM) and start it again on the same state root and config; returns
    /// once it answers on its socket.
    pub fn restart_agentd(&mut self) {
        let _ = send_signal(&self.agentd, Signal::SIGTERM);
        let _ = self.agentd.wait();
        self.agentd = as_daemon_on(
            &mut Command::new(env!("CARGO_BIN_EXE_agentworks-agentd")),
            self.state.root(),
        )
        .spawn()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.admin_raw("users/list", serde_json::json!({})).is_err() {
            assert!(
                Instant::now() < deadline,
                "agentd did not become ready again"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Another agentd on this stack's state root with the config file at `path` (a second
    /// host's: its own port and socket), its stderr to `stderr`; killed when dropped.
    pub fn spawn_agentd(
        &self,
        path: &std::path::Path,
        stderr: std::process::Stdio,
    ) -> super::KillOnDrop {
        super::KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_agentworks-agentd"))
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("AGENTWORKS_STATE_ROOT", self.state.root())
                .env("AGENTWORKS_CONFIG", path)
                .env("RUST_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap(),
        )
    }

    /// Another agentd host of this stack's cluster (the stack must be in one): its own public
    /// port, socket and `host_id`, the same database, NATS server and state root (so the same
    /// sealing key, which a cluster's hosts share). Returns once it answers `/v1/health`.
    pub fn start_agentd_host(&self, host_id: &str) -> (super::KillOnDrop, u16) {
        let root = self.state.root();
        let config = std::fs::read_to_string(root.join("agentworks.toml")).unwrap();
        assert!(
            config.contains("[cluster]"),
            "the stack is not in a cluster"
        );
        let port = free_port();
        let socket = root.join(format!("run/agentd-{host_id}.sock"));
        let listen = format!("listen = \"127.0.0.1:{}\"", self.port);
        let config = config
            .replace(
                &listen,
                &format!("listen = \"127.0.0.1:{port}\"\nsocket = {socket:?}"),
            )
            .replace("host_id = \"gw-test\"", &format!("host_id = {host_id:?}"));
        let path = root.join(format!("{host_id}.toml"));
        std::fs::write(&path, config).unwrap();
        let child = self.spawn_agentd(&path, std::process::Stdio::inherit());
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            || super::http(port, "GET", "/v1/health", &[], "").0 != 200
        {
            assert!(
                Instant::now() < deadline,
                "agentd {host_id} never answered /v1/health"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, port)
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

    /// `name` (added unless there already) and a new `devices:connect` token of theirs.
    pub fn person(&self, name: &str) -> Person {
        let _ = self.admin_raw("users/add", serde_json::json!({"name": name}));
        let created = self.admin(
            "tokens/create",
            serde_json::json!({"user": name, "scopes": ["devices:connect"]}),
        );
        Person {
            user_id: created["info"]["user_id"].as_str().unwrap().to_owned(),
            token: created["token"].as_str().unwrap().to_owned(),
            token_id: created["info"]["id"].as_str().unwrap().to_owned(),
        }
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

/// A person with a `devices:connect` token ([`Stack::person`]).
pub struct Person {
    pub user_id: String,
    pub token: String,
    pub token_id: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = send_signal(&self.agentd, Signal::SIGTERM);
        let _ = self.agentd.wait();
    }
}

/// The host id of a cluster-mode stack: one host serving every role.
pub const CLUSTER_HOST: &str = "gw-test";

/// A config's sections put so that agentd reaches runnerd (and so workspaced, which routes the
/// same way) over NATS rather than their sockets, on [`CLUSTER_HOST`]: the keys to add to
/// `[workspaced]` and `[agentd]`, and `runnerd` (its `[runnerd]` section and providers) with
/// `serve_cluster`.
pub struct RoutedOverNats {
    pub workspaced: &'static str,
    pub agentd: String,
    pub runnerd: String,
}

pub fn runnerd_behind_nats(runnerd: &str) -> RoutedOverNats {
    assert!(
        runnerd.contains("[runnerd]\n"),
        "no [runnerd] section: {runnerd}"
    );
    RoutedOverNats {
        workspaced: "serve_cluster = true\n",
        agentd: format!("workspaced_host = \"{CLUSTER_HOST}\"\n"),
        runnerd: runnerd.replacen("[runnerd]\n", "[runnerd]\nserve_cluster = true\n", 1),
    }
}
