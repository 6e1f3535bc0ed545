//! Parts shared by the benchmarks (`benches/*.rs` include this directory with `mod common;`,
//! after declaring the test harness's `daemons` and `ports` modules, which these use).
//!
//! - [`stack`]: workspaced + agentd on a temp state root, with projects and a token.
//! - [`reference`]: the pinned reference MCP filesystem server (`benches/mcp-reference/`).
//! - [`floor`]: the disk's floor for a durable replace.
//!
//! `sshd.rs` here (a private sshd and `ssh localhost true` over a ControlMaster connection) is
//! not part of this module: `gateway_roundtrip` includes it on its own with `#[path]`. Nor is
//! `measure.rs` (a process's VmRSS, RLIMIT_NOFILE raised, percentiles), which needs none of
//! the harness modules: `cluster_dispatch` includes it the same way. Nor are `gateway.rs`
//! (workspaced, agentd and gatewayd, and a real laptop's executor: `gateway_roundtrip`,
//! `runnerd_laptop`) and `runnerd.rs` (runnerd and the holder CLI: `runnerd_turn`,
//! `runnerd_laptop`), each included with `#[path]` by the benchmarks that start those.

pub mod floor;
pub mod reference;
pub mod stack;

/// `SIZE` bytes of text that start with `write {i}`: the content of write `i`.
pub fn content(i: u64, size: usize) -> String {
    const LINE: &str = "agentworks MCP write benchmark line\n";
    let mut s = format!("write {i}\n");
    while s.len() < size {
        s.push_str(LINE);
    }
    s.truncate(size);
    s
}
