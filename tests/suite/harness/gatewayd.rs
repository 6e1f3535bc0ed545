//! The real `agentworks-gatewayd` beside a [`Stack`]: the `[gatewayd]` config section (its
//! WebSocket port reserved with [`free_port`]) and the daemon. [`Gatewayd::start`] returns only
//! once both `gatewayd.sock` and the WebSocket port answer, and panics if the daemon exits
//! first; its stderr is inherited, so what it said is in the test's output. Dropping it
//! SIGKILLs and reaps it.

use super::daemons::{as_daemon_on, send_signal, wait_ready};
use super::{Client, Stack, block_on, free_port};
use agentworks_support::unix_http::UnixClient;
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

impl Stack {
    /// workspaced, agentd and a `[gatewayd]` section (listen on a free loopback port,
    /// `allowed_users = []`) in the config, so the file holds both daemons' sections; in
    /// cluster mode ([`super::cluster_mode`]) also a `[cluster]` section on a PostgreSQL and a
    /// NATS server of the stack's own (host `gw-test`), and, when the config has a `[runnerd]`
    /// section, runnerd and workspaced reached over NATS ([`super::runnerd_behind_nats`]). Returns the stack and the gateway's
    /// port; start the daemon with [`Gatewayd::start`].
    pub fn start_with_gateway() -> (Stack, u16) {
        Stack::start_with_gateway_and("")
    }

    /// [`Stack::start_with_gateway`], never in cluster mode: for the tests that write a
    /// `[cluster]` section of their own.
    pub fn start_with_embedded_gateway() -> (Stack, u16) {
        Stack::start_with_embedded_gateway_and("")
    }

    /// [`Stack::start_with_gateway_and`], never in cluster mode.
    pub fn start_with_embedded_gateway_and(agentd_extra: &str) -> (Stack, u16) {
        Stack::gateway_stack(agentd_extra, false)
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
        Gatewayd::start_with_env(stack, port, &[])
    }

    /// [`Gatewayd::start`] with `env` added to its environment (`AGENTWORKS_FAILPOINT`).
    pub fn start_with_env(stack: &Stack, port: u16, env: &[(&str, &str)]) -> Gatewayd {
        let child = as_daemon_on(
            &mut Command::new(env!("CARGO_BIN_EXE_agentworks-gatewayd")),
            stack.state.root(),
        )
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
        let mut daemon = Gatewayd {
            child,
            socket: stack.gatewayd_socket(),
            port,
        };
        let client = UnixClient::new(&daemon.socket);
        block_on(wait_ready(
            &mut daemon.child,
            "gatewayd",
            Duration::from_secs(20),
            || async {
                client.get::<serde_json::Value>("/v1/health").await.is_ok()
                    && tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .is_ok()
            },
        ));
        daemon
    }

    pub fn client(&self) -> Client {
        Client {
            inner: UnixClient::new(&self.socket),
        }
    }

    /// How many executors it holds now (its health answer).
    pub fn connected(&self) -> u64 {
        let health: serde_json::Value =
            block_on(UnixClient::new(&self.socket).get("/v1/health")).unwrap();
        health["connected"].as_u64().unwrap()
    }

    /// SIGTERM and wait for the exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        send_signal(&self.child, Signal::SIGTERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Gatewayd {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = send_signal(&self.child, Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

impl Stack {
    /// [`Stack::start_with_gateway`], with `agentd_extra` (e.g. an `[agentd.model]` table)
    /// written into the config before agentd starts. Returns the stack and the gateway's port.
    pub fn start_with_gateway_and(agentd_extra: &str) -> (Stack, u16) {
        Stack::gateway_stack(agentd_extra, super::cluster_mode())
    }

    /// [`Stack::start_with_gateway_and`] always in a cluster (a PostgreSQL and a NATS server of
    /// its own), whatever the mode the suite runs in.
    pub fn start_in_cluster_with_gateway_and(agentd_extra: &str) -> (Stack, u16) {
        Stack::gateway_stack(agentd_extra, true)
    }

    fn gateway_stack(agentd_extra: &str, cluster: bool) -> (Stack, u16) {
        let port = free_port();
        let gw_port = free_port();
        // The `[cluster]` section before `[gatewayd]`, which stays last: tests append keys to it.
        let servers = cluster.then(|| (super::Postgres::start(), super::Nats::start()));
        let cluster_section = match &servers {
            Some((postgres, nats)) => {
                format!(
                    "{}\n",
                    super::cluster_section(postgres, nats, super::CLUSTER_HOST)
                )
            }
            None => String::new(),
        };
        // In a cluster, a stack with runnerd reaches it (and workspaced) over NATS.
        let routed = (servers.is_some() && agentd_extra.contains("[runnerd]\n"))
            .then(|| super::runnerd_behind_nats(agentd_extra));
        let (workspaced_keys, agentd_keys, agentd_extra) = match &routed {
            Some(routed) => (
                routed.workspaced,
                routed.agentd.as_str(),
                routed.runnerd.as_str(),
            ),
            None => ("", "", agentd_extra),
        };
        let config = format!(
            "[workspaced]\nallowed_users = []\n{workspaced_keys}\n[agentd]\n\
             listen = \"127.0.0.1:{port}\"\n{agentd_keys}\n\
             {agentd_extra}\n\n{cluster_section}[gatewayd]\nlisten = \"127.0.0.1:{gw_port}\"\n\
             allowed_users = []\n"
        );
        let mut stack = Stack::start_on(port, &config);
        stack.cluster = servers;
        (stack, gw_port)
    }
}
