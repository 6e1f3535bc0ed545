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
        let child = as_daemon_on(
            &mut Command::new(env!("CARGO_BIN_EXE_agentworks-gatewayd")),
            stack.state.root(),
        )
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
        let port = free_port();
        let gw_port = free_port();
        let config = format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\n\
             {agentd_extra}\n\n[gatewayd]\nlisten = \"127.0.0.1:{gw_port}\"\nallowed_users = []\n"
        );
        (Stack::start_on(port, &config), gw_port)
    }
}
