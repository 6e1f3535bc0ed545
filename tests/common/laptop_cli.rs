//! Steps of the laptop CLI (`agentworks`) that the integration suite (`tests/suite/harness/`)
//! and the benchmarks (`benches/*.rs`) both take, included with `#[path]` like `ports.rs`.
//! Each takes a `Command` for the `agentworks` binary with the caller's environment (its
//! HOME, XDG dirs and PATH) already set.

use std::io::Write;
use std::process::{Command, Stdio};

/// `agentworks login --server <server> --gateway <gateway>… --with-token` (one `--gateway` per
/// URL, in order), the token on stdin; panics with the CLI's stderr unless it succeeds.
pub fn login_with_token(mut agentworks: Command, server: &str, gateways: &[&str], token: &str) {
    agentworks.args(["login", "--server", server]);
    for gateway in gateways {
        agentworks.args(["--gateway", gateway]);
    }
    let mut child = agentworks
        .arg("--with-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentworks login");
    let mut stdin = child.stdin.take().expect("login's stdin is piped");
    writeln!(stdin, "{token}").expect("write the token to agentworks login");
    drop(stdin);
    let out = child.wait_with_output().expect("wait for agentworks login");
    assert!(
        out.status.success(),
        "agentworks login failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
