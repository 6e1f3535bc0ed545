//! Test harness: the real binaries started on temp state roots, and what the tests use to talk
//! to them and look at them; one file each.
//!
//! - [`state`]: the temp state root (documents, config) every daemon of a test shares;
//! - [`workspaced`]: `agentworks-workspaced` (as another user, with capabilities, a failpoint
//!   or another socket) and the blocking socket [`Client`];
//! - [`agentd`]: the [`Stack`], workspaced + `agentworks-agentd`, and operator calls;
//! - [`gatewayd`]: `agentworks-gatewayd` beside a [`Stack`];
//! - [`laptop`]: a fake laptop for the `agentworks` CLI, and its `executor connect` process;
//! - [`executor_gateway`]: an in-test WebSocket gateway for `agentworks executor connect`;
//! - [`runnerd`]: `agentworks-runnerd` and a turn's event stream read from its socket;
//! - [`quickstart`]: `agentworksctl quickstart --json` with its stderr kept;
//! - [`mcp`]: HTTP requests and MCP tool calls to a daemon's port;
//! - [`users`]: real system users and groups;
//! - [`cluster`]: a private PostgreSQL server and `nats-server` for the cluster-mode tests;
//! - [`daemons`] (`tests/common/daemons.rs`, shared with the benchmarks): a daemon's cleared
//!   environment, the readiness wait that fails as soon as the daemon exits, signals;
//! - [`ports`] (`tests/common/ports.rs`, shared with the benchmarks): the loopback ports every
//!   daemon listens on, each reserved once;
//! - [`laptop_cli`] (`tests/common/laptop_cli.rs`, shared with the benchmarks): laptop CLI
//!   steps such as the token login;
//! - [`probes`]: processes left running, conditions polled;
//! - [`powercut_fs`]: the FUSE filesystem that keeps only what was synced when its power is
//!   cut, for the power-loss suite.
//!
//! What holds for all of them: a daemon is started only on a temp state root; a start returns
//! once the daemon answers and fails the test (with the daemon's stderr, which is inherited or
//! kept) when it does not; every TCP port a daemon of a test listens on is reserved with
//! [`reserve_ports`] (a listener a test binds itself holds its port-0 port from the bind on);
//! a dropped handle stops and reaps its process. The tests `use super::harness::*`; everything
//! is re-exported here under its old name.

mod agentd;
mod cluster;
// Shared with the benchmarks, which use other parts of it (the `Process` guard).
#[allow(dead_code)]
#[path = "../../common/daemons.rs"]
mod daemons;
mod executor_gateway;
mod fake_executor;
mod gatewayd;
mod laptop;
#[path = "../../common/laptop_cli.rs"]
mod laptop_cli;
mod mcp;
#[path = "../../common/ports.rs"]
mod ports;
mod powercut_fs;
mod probes;
mod quickstart;
mod runnerd;
mod state;
mod users;
mod workspaced;

pub use agentd::*;
pub use cluster::*;
pub use executor_gateway::*;
pub use fake_executor::*;
pub use gatewayd::*;
pub use laptop::*;
pub use mcp::*;
pub use ports::*;
pub use powercut_fs::*;
pub use probes::*;
pub use quickstart::*;
pub use runnerd::*;
pub use state::*;
pub use users::*;
pub use workspaced::*;

/// A child process killed and reaped on drop (also when the test fails).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the suite runs in cluster mode (`AGENTWORKS_TEST_CLUSTER=1`): every stack with a
/// gateway then keeps gatewayd's state in a PostgreSQL of its own and joins a NATS server of its
/// own ([`Stack::start_with_gateway`]), so the same tests check the cluster back end.
pub fn cluster_mode() -> bool {
    std::env::var_os("AGENTWORKS_TEST_CLUSTER").is_some_and(|v| v == "1")
}

/// Run a future on a throwaway current-thread runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}
