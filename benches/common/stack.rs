//! The real stack for a benchmark: workspaced and agentd (release builds, from cargo) on a temp
//! state root, agentd's HTTP listener on a loopback port, a user `bench` with `projects`
//! workflow projects (`bench`, `bench-2`, …) and a `workflows:write` token.

use crate::daemons::Process;
use crate::ports;
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// Fields drop in order: agentd (it calls workspaced), workspaced, then the state root.
pub struct Stack {
    /// agentd's HTTP port on 127.0.0.1 (`/mcp`).
    pub port: u16,
    /// `Bearer <token>`.
    pub auth: String,
    /// The projects' workflow ids, in creation order.
    pub workflows: Vec<String>,
    pub agentd: Process,
    pub workspaced: Process,
    pub state: tempfile::TempDir,
}

/// Start the stack on a fresh state root under `base`, using `runtime` for the admin calls;
/// agentd's listener takes up to `connections` connections from 127.0.0.1 (at least its
/// default, 64).
pub fn start(
    base: &Path,
    projects: usize,
    connections: usize,
    runtime: &tokio::runtime::Runtime,
) -> Stack {
    let state_dir = tempfile::Builder::new()
        .prefix("state-")
        .tempdir_in(base)
        .unwrap();
    let state = state_dir.path();
    let port = ports::free_port();
    std::fs::write(
        state.join("agentworks.toml"),
        format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\
             max_connections_per_address = {}\n",
            connections.max(64)
        ),
    )
    .unwrap();

    let workspaced_socket = UnixClient::new(state.join("run/workspaced.sock"));
    let agentd_socket = UnixClient::new(state.join("run/agentd.sock"));
    let mut workspaced = Process::daemon(
        "agentworks-workspaced",
        env!("CARGO_BIN_EXE_agentworks-workspaced"),
        state,
    );
    runtime.block_on(workspaced.wait_ready(Duration::from_secs(30), || async {
        workspaced_socket.get::<Value>("/v1/health").await.is_ok()
    }));
    let mut agentd = Process::daemon(
        "agentworks-agentd",
        env!("CARGO_BIN_EXE_agentworks-agentd"),
        state,
    );
    runtime.block_on(agentd.wait_ready(Duration::from_secs(30), || async {
        agentd_socket
            .post::<_, Value>("/v1/admin/users/list", &json!({}))
            .await
            .is_ok()
    }));

    let (workflows, token) = runtime.block_on(async {
        let admin = |endpoint: &'static str, body: Value| {
            let agentd_socket = &agentd_socket;
            async move {
                agentd_socket
                    .post::<_, Value>(&format!("/v1/admin/{endpoint}"), &body)
                    .await
                    .unwrap_or_else(|e| panic!("admin {endpoint}: {e}"))
            }
        };
        admin("users/add", json!({"name": "bench"})).await;
        let names: Vec<String> = (1..=projects)
            .map(|k| {
                if k == 1 {
                    "bench".to_owned()
                } else {
                    format!("bench-{k}")
                }
            })
            .collect();
        for name in &names {
            admin(
                "projects/add",
                json!({"name": name, "kind": "workflow", "owner": "bench"}),
            )
            .await;
        }
        let listed = admin("projects/list", json!({})).await;
        let workflows = names
            .iter()
            .map(|name| {
                listed
                    .as_array()
                    .and_then(|ps| ps.iter().find(|p| p["name"] == name.as_str()))
                    .and_then(|p| p["id"].as_str())
                    .unwrap_or_else(|| panic!("the workflow {name} is listed"))
                    .to_owned()
            })
            .collect();
        let created = admin(
            "tokens/create",
            json!({"user": "bench", "scopes": ["workflows:write"]}),
        )
        .await;
        let token = created["token"].as_str().expect("a token").to_owned();
        (workflows, token)
    });
    Stack {
        port,
        auth: format!("Bearer {token}"),
        workflows,
        agentd,
        workspaced,
        state: state_dir,
    }
}
